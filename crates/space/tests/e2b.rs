//! The official E2B SDKs, unmodified and at pinned versions (`compat/e2b`), against a real
//! `space up` with real guests: the Python SDK's suite (sync and async) and the JavaScript
//! SDK's under Node. `scripts/e2b-env.sh` (run by `make test`) installs them; a missing
//! install fails this test, never skips it.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{
    assert_node_tests_passed, assert_pytest_passed, e2b_sdk_command, ok, repo_root, run_suite,
    TestServer,
};

/// How long one suite may take (it boots guests under TCG).
const SUITE_TIMEOUT: Duration = Duration::from_secs(1200);

/// `program args` in `dir` with the SDK's environment pointed at `server`.
fn suite(
    program: &Path,
    args: &[&str],
    dir: &Path,
    server: &TestServer,
    other_key: &str,
) -> Command {
    e2b_sdk_command(
        program,
        args,
        dir,
        server,
        &[("SPACE_OTHER_KEY", other_key), ("SPACE_TEMPLATE", "base")],
    )
}

#[test]
fn the_e2b_sdks_drive_space() {
    let root = repo_root();
    let python = root.join("target/space/venv-e2b/bin/python");
    assert!(
        python.exists(),
        "{} does not exist: run scripts/e2b-env.sh (make test does)",
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
    let other_key = ok(&server.cli(["tenant", "create", "e2b-other"]))
        .trim()
        .to_owned();
    // `SPACE_E2B_ONLY=test_file.py[::test]` runs that part of the Python suite alone, and not
    // the JavaScript one; `SPACE_E2B_ONLY=js` the JavaScript suite alone (for working on one
    // area).
    let only = std::env::var("SPACE_E2B_ONLY").ok();
    let js_only = only.as_deref() == Some("js");
    if !js_only {
        let output = run_suite(
            suite(
                &python,
                &[
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "-x",
                    only.as_deref().unwrap_or("."),
                ],
                &root.join("compat/e2b/python"),
                &server,
                &other_key,
            ),
            SUITE_TIMEOUT,
        );
        assert_pytest_passed(&output);
    }
    if only.is_some() && !js_only {
        return;
    }

    let js = root.join("compat/e2b/js");
    assert!(
        js.join("node_modules/e2b/package.json").exists(),
        "{}/node_modules has no e2b: run scripts/e2b-env.sh (make test does)",
        js.display()
    );
    let output = run_suite(
        suite(
            Path::new("node"),
            &["--test", "--test-concurrency=1", "--test-timeout=600000"],
            &js,
            &server,
            &other_key,
        ),
        SUITE_TIMEOUT,
    );
    assert_node_tests_passed(&output);
}
