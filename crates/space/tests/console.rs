//! The web console end to end: `compat/console`'s Playwright suite drives the host's Chromium
//! against a real `space up` with real guests. Screenshots of each page are kept in
//! `target/space/artifacts/console/`.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{assert_pytest_passed, ok, repo_root, run_suite, space_bin, TestServer};

const SUITE_TIMEOUT: Duration = Duration::from_secs(1800);

#[test]
fn the_console_drives_sandboxes_in_a_browser() {
    let root = repo_root();
    let python = root.join("target/space/venv-browser/bin/python");
    assert!(
        python.exists(),
        "{} does not exist: run scripts/browser-env.sh (make test does)",
        python.display()
    );
    let server = TestServer::start_with(vec![
        "--templates".into(),
        "base".into(),
        "--pool-size".into(),
        "0".into(),
        "--pool-max".into(),
        "0".into(),
    ]);
    let tenant = ok(&server.cli(["tenant", "create", "console-acme"]))
        .trim()
        .to_owned();
    let other = ok(&server.cli(["tenant", "create", "console-other"]))
        .trim()
        .to_owned();
    let artifacts = root.join("target/space/artifacts/console");
    let _ = std::fs::remove_dir_all(&artifacts);
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "."])
        .current_dir(root.join("compat/console"))
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.admin_key)
        .env("SPACE_TENANT_KEY", &tenant)
        .env("SPACE_OTHER_KEY", &other)
        .env("SPACE_BIN", space_bin())
        .env("SPACE_TEMPLATE", "base")
        .env("SPACE_ARTIFACTS", &artifacts);
    let output = run_suite(cmd, SUITE_TIMEOUT);
    assert_pytest_passed(&output);
}
