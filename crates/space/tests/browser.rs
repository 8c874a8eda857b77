//! A sandbox's browser through its DevTools URL, driven by Playwright and Puppeteer
//! (unmodified, pinned in `compat/browser`) against a real `space up` with the `desktop`
//! template (real Chromium in a real guest under TCG, headful on the desktop's display): the
//! live view opens in the host's Chromium and shows the screen, a login's cookie survives a
//! suspend (woken through the DevTools URL) and a fork, the URL outlives a Chromium restart,
//! another tenant opens nothing, a template without Chromium is refused.
//! `scripts/browser-env.sh` (run by `make test`) installs Playwright and Puppeteer,
//! `scripts/deps.sh` the host's Chromium; the desktop image comes from
//! `scripts/artifacts.sh desktop` (`SPACE_ROOTFS_DESKTOP`). A missing one fails this test,
//! never skips it.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{assert_pytest_passed, env_path, ok, repo_root, run_suite, TestServer};

/// The host's Chromium, which opens the live view.
const CHROMIUM: &str = "/usr/bin/chromium";

/// How long the suite may take (Chromium under TCG, a suspend, a fork).
const SUITE_TIMEOUT: Duration = Duration::from_secs(2400);

#[test]
fn playwright_drives_the_sandbox_browser_over_cdp() {
    let root = repo_root();
    let python = root.join("target/space/venv-browser/bin/python");
    assert!(
        python.exists(),
        "{} does not exist: run scripts/browser-env.sh (make test does)",
        python.display()
    );
    assert!(
        root.join("compat/browser/js/node_modules/puppeteer-core/package.json")
            .exists(),
        "compat/browser/js has no puppeteer-core: run scripts/browser-env.sh (make test does)"
    );
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "{CHROMIUM} does not exist: run scripts/deps.sh (make test does)"
    );
    let base = env_path("SPACE_ROOTFS_BASE");
    let desktop = env_path("SPACE_ROOTFS_DESKTOP");
    let server = TestServer::start_with(vec![
        "--image".into(),
        format!("base={}", base.display()),
        "--image".into(),
        format!("desktop={}", desktop.display()),
        "--templates".into(),
        "base,desktop".into(),
        "--pool-size".into(),
        "0".into(),
        "--pool-max".into(),
        "0".into(),
    ]);
    let other_key = ok(&server.cli(["tenant", "create", "browser-other"]))
        .trim()
        .to_owned();
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "."])
        .current_dir(root.join("compat/browser"))
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.admin_key)
        .env("SPACE_OTHER_KEY", &other_key)
        .env("SPACE_CHROMIUM", CHROMIUM);
    let output = run_suite(cmd, SUITE_TIMEOUT);
    assert_pytest_passed(&output);
}
