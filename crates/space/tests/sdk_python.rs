//! The Python SDK's test suite (`sdk/python/tests`) against a real `space up` server.
//!
//! The suite runs in the venv `scripts/python-env.sh` makes (`target/space/venv`; `make test`
//! runs the script first), or in the Python named by `SPACE_PYTHON`. A missing venv fails this
//! test: it never passes without having run the suite.

mod common;

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::TestServer;

/// How long the whole Python suite may take (it boots a few guests under TCG).
const SUITE_TIMEOUT: Duration = Duration::from_secs(900);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

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

    let out_dir = tempfile::tempdir().expect("a temporary directory for pytest's output");
    let log_path = out_dir.path().join("pytest.log");
    let log = File::create(&log_path).expect("creating the pytest log");
    let mut child = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(root.join("sdk/python"))
        .env("SPACE_URL", &server.url)
        .env("SPACE_API_KEY", &server.admin_key)
        // Nothing of the caller's own configuration may leak into the suite.
        .env("SPACE_CONFIG", out_dir.path().join("no-config.json"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("cloning the log handle"))
        .stderr(log)
        .spawn()
        .expect("starting pytest");

    let deadline = Instant::now() + SUITE_TIMEOUT;
    let status = loop {
        match child.try_wait().expect("waiting for pytest") {
            Some(status) => break Some(status),
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };

    let mut output = String::new();
    File::open(&log_path)
        .and_then(|mut f| f.read_to_string(&mut output))
        .expect("reading pytest's output");
    println!("{output}");
    let Some(status) = status else {
        panic!("the Python SDK suite did not finish within {SUITE_TIMEOUT:?}:\n{output}");
    };
    assert!(
        status.success(),
        "the Python SDK suite failed ({status}):\n{output}"
    );
    // pytest exits 0 only when tests ran and passed; check its summary says so.
    let summary = output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(
        summary.contains(" passed") && !summary.contains("skipped"),
        "unexpected pytest summary: {summary}"
    );
}
