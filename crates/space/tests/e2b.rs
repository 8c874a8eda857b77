//! The official E2B SDKs, unmodified and at pinned versions (`compat/e2b`), against a real
//! `space up` with real guests: the Python SDK's suite (sync and async) and the JavaScript
//! SDK's under Node. `scripts/e2b-env.sh` (run by `make test`) installs them; a missing
//! install fails this test, never skips it.

mod common;

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ok, TestServer};

/// How long one suite may take (it boots guests under TCG).
const SUITE_TIMEOUT: Duration = Duration::from_secs(1200);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// Runs `program args` in `dir` with the SDK's environment pointed at `server`; returns
/// its output, or panics with it when it failed or did not finish.
fn run_suite(
    program: &Path,
    args: &[&str],
    dir: &Path,
    server: &TestServer,
    other_key: &str,
) -> String {
    let out_dir = tempfile::tempdir().expect("a temporary directory");
    let log_path = out_dir.path().join("suite.log");
    let log = File::create(&log_path).expect("creating the log");
    let mut child = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("E2B_API_URL", &server.url)
        .env("E2B_SANDBOX_URL", &server.url)
        .env("E2B_API_KEY", &server.admin_key)
        .env("SPACE_OTHER_KEY", other_key)
        .env("SPACE_TEMPLATE", "base")
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("cloning the log handle"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
    let deadline = Instant::now() + SUITE_TIMEOUT;
    let status = loop {
        match child.try_wait().expect("waiting for the suite") {
            Some(s) => break Some(s),
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
        .expect("reading the suite's output");
    println!("{output}");
    let Some(status) = status else {
        panic!(
            "{} did not finish within {SUITE_TIMEOUT:?}:\n{output}",
            program.display()
        );
    };
    assert!(status.success(), "the suite failed ({status}):\n{output}");
    output
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
    ]);
    let other_key = ok(&server.cli(["tenant", "create", "e2b-other"]))
        .trim()
        .to_owned();
    let output = run_suite(
        &python,
        &["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "."],
        &root.join("compat/e2b/python"),
        &server,
        &other_key,
    );
    let summary = output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(
        summary.contains(" passed") && !summary.contains("skipped") && !summary.contains("failed"),
        "unexpected pytest summary: {summary}"
    );

    let js = root.join("compat/e2b/js");
    assert!(
        js.join("node_modules/e2b/package.json").exists(),
        "{}/node_modules has no e2b: run scripts/e2b-env.sh (make test does)",
        js.display()
    );
    let output = run_suite(
        Path::new("node"),
        &["--test", "--test-concurrency=1", "--test-timeout=600000"],
        &js,
        &server,
        &other_key,
    );
    // node's runner (TAP when not on a terminal) ends with its counts: all passed, none
    // skipped.
    let count = |what: &str| {
        output
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(&format!("# {what} "))
                    .map(str::to_owned)
            })
            .and_then(|n| n.trim().parse::<u32>().ok())
    };
    assert!(
        count("pass").is_some_and(|n| n > 0)
            && count("fail") == Some(0)
            && count("skipped") == Some(0),
        "unexpected node test summary:\n{output}"
    );
}
