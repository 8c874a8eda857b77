//! The official e2b-desktop SDKs, unmodified and at pinned versions (`compat/e2b-desktop`),
//! against a real `space up` with the `desktop` template: real Xvfb, Xfce, xdotool, x11vnc and
//! noVNC in a real guest under TCG. The Python suite opens the SDK's https stream URL in the
//! host's Chromium (Playwright, the deployment CA in Chromium's own certificate store) and
//! reads the remote screen off noVNC's canvas; the JavaScript suite runs under Node.
//! `scripts/e2b-env.sh` (run by `make test`) installs the SDKs, `scripts/deps.sh` the host's
//! Chromium and certutil, `scripts/artifacts.sh desktop` the image. A missing one fails this
//! test, never skips it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{
    assert_node_tests_passed, assert_pytest_passed, e2b_sdk_command, env_path, ok, repo_root,
    run_suite, TestServer,
};

/// How long one suite may take (two desktops boot and start Xfce under TCG).
const SUITE_TIMEOUT: Duration = Duration::from_secs(2400);

/// The host's Chromium, which opens the live view.
const CHROMIUM: &str = "/usr/bin/chromium";

#[test]
fn the_e2b_desktop_sdks_drive_a_space_desktop() {
    let root = repo_root();
    let python = root.join("target/space/venv-e2b-desktop/bin/python");
    assert!(
        python.exists(),
        "{} does not exist: run scripts/e2b-env.sh (make test does)",
        python.display()
    );
    let js = root.join("compat/e2b-desktop/js");
    assert!(
        js.join("node_modules/@e2b/desktop/package.json").exists(),
        "{}/node_modules has no @e2b/desktop: run scripts/e2b-env.sh (make test does)",
        js.display()
    );
    assert!(
        Path::new(CHROMIUM).exists(),
        "{CHROMIUM} does not exist: run scripts/deps.sh (make test does)"
    );
    let desktop = env_path("SPACE_ROOTFS_DESKTOP");
    let server = TestServer::start_with(vec![
        "--image".into(),
        format!("desktop={}", desktop.display()),
        "--templates".into(),
        "desktop".into(),
        "--pool-size".into(),
        "0".into(),
        "--pool-max".into(),
        "0".into(),
    ]);
    let other_key = ok(&server.cli(["tenant", "create", "desktop-other"]))
        .trim()
        .to_owned();
    let ca = server.data_dir.join("e2b-desktop-ca.pem");
    std::fs::write(&ca, server.get("/v1/tls/ca.pem")).expect("writing the CA's certificate");
    let ca = ca.to_str().expect("a UTF-8 path");
    let env = [
        ("SPACE_OTHER_KEY", other_key.as_str()),
        ("SPACE_CA", ca),
        ("SPACE_CHROMIUM", CHROMIUM),
    ];

    let output = run_suite(
        e2b_sdk_command(
            &python,
            &["-m", "pytest", "-q", "-x", "."],
            &root.join("compat/e2b-desktop/python"),
            &server,
            &env,
        ),
        SUITE_TIMEOUT,
    );
    assert_pytest_passed(&output);

    let output = run_suite(
        e2b_sdk_command(
            Path::new("node"),
            &["--test", "--test-concurrency=1", "--test-timeout=900000"],
            &js,
            &server,
            &env,
        ),
        SUITE_TIMEOUT,
    );
    assert_node_tests_passed(&output);
}
