//! Logging in without the password entering the VM, end to end: the real `space up` with the
//! `base` and `desktop` templates, a real HTTPS login site on this host (Python, in
//! `compat/logins`; its certificate from a CA made here and given to the deployment as an
//! operator CA), `curl` in a real guest and Chromium in another, driven by Playwright over
//! CDP. The suite checks what the site received, what the guest saw, the audit, and the
//! bytes of the deployment's files after a suspend.
//! `scripts/browser-env.sh` (run by `make test`) installs Playwright, pytest and pyotp; the
//! images come from `scripts/artifacts.sh` (`SPACE_ROOTFS_BASE`, `SPACE_ROOTFS_DESKTOP`).

mod common;
mod kit;

use std::process::Command;
use std::time::Duration;

use common::{assert_pytest_passed, env_path, repo_root, run_suite, TestServer};

/// How long the suite may take (two guests, Chromium under TCG, a suspend and a wake).
const SUITE_TIMEOUT: Duration = Duration::from_secs(2400);

/// This host's address on its default route: Chromium sends loopback names to its own
/// loopback, never through a proxy, so the site listens where the gateway reaches it.
fn host_address() -> std::net::IpAddr {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    // No packet is sent: connecting only picks the route.
    s.connect("192.0.2.1:9").expect("a route");
    s.local_addr().expect("a local address").ip()
}

#[test]
fn logins_keep_the_password_out_of_the_vm() {
    let root = repo_root();
    let python = root.join("target/space/venv-browser/bin/python");
    assert!(
        python.exists(),
        "{} does not exist: run scripts/browser-env.sh (make test does)",
        python.display()
    );
    let base = env_path("SPACE_ROOTFS_BASE");
    let desktop = env_path("SPACE_ROOTFS_DESKTOP");
    let tmp = tempfile::tempdir().unwrap();
    let addr = host_address();
    let pki = kit::pki::test_pki(
        "space login-site test CA",
        &[&addr.to_string(), "127.0.0.1"],
    );
    let cas = tmp.path().join("host-cas");
    std::fs::create_dir_all(&cas).unwrap();
    std::fs::write(cas.join("login-site.crt"), &pki.ca_pem).unwrap();
    std::fs::write(tmp.path().join("leaf.pem"), &pki.leaf_pem).unwrap();
    std::fs::write(tmp.path().join("key.pem"), &pki.key_pem).unwrap();
    let server = TestServer::start_with_env(
        vec![
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
        ],
        vec![("SPACE_HOST_CA_DIR".into(), cas.display().to_string())],
    );
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "."])
        .current_dir(root.join("compat/logins"))
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.admin_key)
        .env("SPACE_DATA_DIR", &server.data_dir)
        .env("SITE_ADDR", addr.to_string())
        .env("SITE_CERT", tmp.path().join("leaf.pem"))
        .env("SITE_KEY", tmp.path().join("key.pem"));
    let output = run_suite(cmd, SUITE_TIMEOUT);
    assert_pytest_passed(&output);
}
