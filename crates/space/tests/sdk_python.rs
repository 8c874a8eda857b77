//! The Python SDK's test suite (`sdk/python/tests`) against a real `space up` server.
//!
//! The suite runs in the venv `scripts/python-env.sh` makes (`target/space/venv`; `make test`
//! runs the script first), or in the Python named by `SPACE_PYTHON`. A missing venv fails this
//! test: it never passes without having run the suite. `SPACE_SDK_PYTEST_ARGS` (pytest's
//! arguments, split at whitespace, such as `tests/test_network.py -k proxy`) runs a part of
//! it instead of all of `tests`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{assert_pytest_passed, repo_root, run_suite, TestServer};

/// How long the whole Python suite may take (it boots a few guests under TCG).
const SUITE_TIMEOUT: Duration = Duration::from_secs(900);

/// The Python interpreter with the SDK and pytest installed, or a panic that says how to make
/// one.
fn python(root: &Path) -> PathBuf {
    let python = match std::env::var_os("SPACE_PYTHON") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => root.join("target/space/venv/bin/python"),
    };
    assert!(
        python.exists(),
        "{} does not exist: run scripts/python-env.sh (make test does) to make the venv the \
         Python SDK's tests run in, or set SPACE_PYTHON",
        python.display()
    );
    let probe = Command::new(&python)
        .args(["-c", "import space_sdk, pytest, pytest_asyncio"])
        .output()
        .expect("running the venv's python");
    assert!(
        probe.status.success(),
        "{} cannot import space_sdk, pytest and pytest_asyncio (run scripts/python-env.sh): {}",
        python.display(),
        String::from_utf8_lossy(&probe.stderr)
    );
    python
}

#[test]
fn python_sdk_suite_passes_against_a_live_server() {
    let root = repo_root();
    let python = python(&root);
    let server = TestServer::start();

    let config_dir = tempfile::tempdir().expect("a temporary directory");
    let selection: Vec<String> = match std::env::var("SPACE_SDK_PYTEST_ARGS") {
        Ok(args) if !args.trim().is_empty() => args.split_whitespace().map(str::to_owned).collect(),
        _ => vec!["tests".to_owned()],
    };
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(&selection)
        .current_dir(root.join("sdk/python"))
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.admin_key)
        // Nothing of the caller's own configuration may leak into the suite.
        .env("SPACE_CONFIG", config_dir.path().join("no-config.json"));
    let output = run_suite(cmd, SUITE_TIMEOUT);
    assert_pytest_passed(&output);
}
