//! The MCP server driven by the official MCP Python SDK (`compat/mcp/python`, pinned), over
//! stdio (`space mcp`) and over Streamable HTTP (`/mcp`), against a real `space up` with real
//! guests. `scripts/mcp-env.sh` (run by `make test`) installs the SDK; a missing install fails
//! this test, never skips it.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{assert_pytest_passed, ok, repo_root, run_suite, space_bin, TestServer};

/// How long the suite may take (it boots guests under TCG).
const SUITE_TIMEOUT: Duration = Duration::from_secs(1200);

#[test]
fn the_mcp_sdk_drives_space_over_stdio_and_http() {
    let root = repo_root();
    let python = root.join("target/space/venv-mcp/bin/python");
    assert!(
        python.exists(),
        "{} does not exist: run scripts/mcp-env.sh (make test does)",
        python.display()
    );
    let server = TestServer::start_with(vec![
        "--templates".into(),
        "base".into(),
        "--pool-size".into(),
        "1".into(),
        "--pool-max".into(),
        "0".into(),
    ]);
    let other_key = ok(&server.cli(["tenant", "create", "mcp-other"]))
        .trim()
        .to_owned();
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "."])
        .current_dir(root.join("compat/mcp/python"))
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.admin_key)
        .env("SPACE_OTHER_KEY", &other_key)
        .env("SPACE_CONFIG", &server.config_path)
        .env("SPACE_BIN", space_bin())
        .env("SPACE_TEMPLATE", "base");
    let output = run_suite(cmd, SUITE_TIMEOUT);
    assert_pytest_passed(&output);
}
