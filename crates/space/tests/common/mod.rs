//! End-to-end harness: the real `space` binary running `space up` on a fresh data directory
//! and port, torn down (server, QEMU processes, loop mount, temporary directory) when the
//! [`TestServer`] drops, also when a test panics.
//!
//! The server needs the guest artifacts in the environment (`SPACE_KERNEL`,
//! `SPACE_ROOTFS_MINIMAL`, optionally `SPACE_ROOTFS_BASE`); `make test` sets them, by hand
//! `source target/space/env.sh` does.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long the server may take to answer its health check (a cold template build under TCG
/// takes seconds, but the host may be loaded by other tests).
const START_TIMEOUT: Duration = Duration::from_secs(300);
/// How long one CLI invocation may run before the test gives up on it.
const CLI_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a graceful stop may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// The number in environment variable `var`, or `default` when it is unset or empty; a
/// value that is not a number stops the test with a message naming it.
pub fn env_number(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{var}={v:?} is not a number: {e}")),
        _ => default,
    }
}

/// A `space up` server on a temporary data directory, run from the real binary.
pub struct TestServer {
    /// The API base URL, `http://127.0.0.1:PORT`.
    pub url: String,
    /// The admin key of tenant `default`, read from the config file `space up` wrote.
    pub admin_key: String,
    /// The server's data directory (a loop-mounted btrfs image once the server started).
    pub data_dir: PathBuf,
    /// The CLI config file the server wrote (`SPACE_CONFIG`).
    pub config_path: PathBuf,
    /// The server's stdout and stderr, appended over restarts.
    pub log_path: PathBuf,
    /// The listen address.
    pub addr: SocketAddr,
    /// Arguments of `space up` besides the data directory and the address.
    up_args: Vec<String>,
    /// Started without the artifact paths in its environment (it finds them as an installed
    /// binary does, in the artifacts record of the cache).
    bare: bool,
    /// Variables set for `space up` besides the inherited ones.
    env: Vec<(String, String)>,
    child: Option<Child>,
    tmp: Option<tempfile::TempDir>,
}

/// A path from the environment, or a panic that says how to get it set.
pub fn env_path(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => {
            let p = PathBuf::from(v);
            assert!(p.exists(), "{var}={} does not exist", p.display());
            p
        }
        _ => panic!(
            "{var} is not set: these tests boot real guests; run them with `make test` (or \
             `source target/space/env.sh` first)"
        ),
    }
}

/// The `space` binary under test.
pub fn space_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_space"))
}

impl TestServer {
    /// Starts `space up` on a free port and a fresh data directory and waits until it answers
    /// and has written the admin key.
    pub fn start() -> TestServer {
        // Pools of exactly one member: the suites here test other things than demand.
        Self::start_with(
            [
                "--templates",
                "minimal",
                "--pool-size",
                "1",
                "--pool-max",
                "0",
            ]
            .map(String::from)
            .to_vec(),
        )
    }

    /// Like [`TestServer::start`], with `up_args` as the arguments of `space up` besides the
    /// data directory and the listen address.
    pub fn start_with(up_args: Vec<String>) -> TestServer {
        env_path("SPACE_KERNEL");
        env_path("SPACE_ROOTFS_MINIMAL");
        Self::launch(up_args, false, Vec::new())
    }

    /// Like [`TestServer::start_with`], with `env` set for `space up`.
    pub fn start_with_env(up_args: Vec<String>, env: Vec<(String, String)>) -> TestServer {
        env_path("SPACE_KERNEL");
        env_path("SPACE_ROOTFS_MINIMAL");
        Self::launch(up_args, false, env)
    }

    /// `space up` with only `--data-dir`, `--listen` and `up_args`, and none of the artifact
    /// variables (`SPACE_KERNEL`, `SPACE_ROOTFS_*`, `SPACE_GUESTD`) in its environment.
    pub fn start_bare(up_args: Vec<String>) -> TestServer {
        Self::launch(up_args, true, Vec::new())
    }

    /// Like [`TestServer::start_bare`], with `env` set for `space up`.
    pub fn start_bare_with_env(up_args: Vec<String>, env: Vec<(String, String)>) -> TestServer {
        Self::launch(up_args, true, env)
    }

    fn launch(up_args: Vec<String>, bare: bool, env: Vec<(String, String)>) -> TestServer {
        let tmp = tempfile::Builder::new()
            .prefix("space-e2e")
            .tempdir_in("/var/tmp")
            .expect("creating a temporary directory");
        let data_dir = tmp.path().join("data");
        let addr = free_port();
        let mut server = TestServer {
            url: format!("http://{addr}"),
            admin_key: String::new(),
            config_path: tmp.path().join("config.json"),
            log_path: tmp.path().join("server.log"),
            data_dir,
            addr,
            up_args,
            bare,
            env,
            child: None,
            tmp: Some(tmp),
        };
        server.spawn();
        server.wait_ready();
        server.admin_key = server.read_key();
        server
    }

    /// The body of `GET path` on the API with the admin key (a bare HTTP/1.0 exchange, so
    /// the body is never chunked). Panics unless the answer is 200.
    pub fn get(&self, path: &str) -> String {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5))
            .expect("connecting to the API");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = format!(
            "GET {path} HTTP/1.0\r\nHost: {}\r\nAuthorization: Bearer {}\r\n\r\n",
            self.addr, self.admin_key
        );
        s.write_all(req.as_bytes()).expect("sending a request");
        let mut buf = Vec::new();
        Read::by_ref(&mut s)
            .take(16 << 20)
            .read_to_end(&mut buf)
            .expect("reading an answer");
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        assert!(
            head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
            "GET {path}: {head}"
        );
        body.to_owned()
    }

    /// Stops the server gracefully (SIGINT, wait for exit) and starts it again on the same
    /// data directory and port. Sandboxes keep running across the restart.
    ///
    /// Panics when the server did not exit 0 on SIGINT in time.
    pub fn restart(&mut self) {
        let status = self.stop();
        assert!(
            status.is_some_and(|s| s.success()),
            "`space up` did not stop cleanly on SIGINT ({status:?}); its log:\n{}",
            self.log_tail()
        );
        self.spawn();
        self.wait_ready();
    }

    /// Kills the server with SIGKILL: no chance to stop anything or write anything. Its VMs
    /// go on running; [`TestServer::start_again`] brings it back.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same data directory and port (after
    /// [`TestServer::crash`] or [`TestServer::stop`]) and waits until it answers.
    pub fn start_again(&mut self) {
        self.spawn();
        self.wait_ready();
    }

    /// Runs the CLI with `args` as the admin of tenant `default`.
    pub fn cli<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cli_as(&self.admin_key.clone(), args)
    }

    /// Runs the CLI with `args` and the API key `key`.
    pub fn cli_as<I, S>(&self, key: &str, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(Some(key));
        cmd.args(args);
        run(cmd, None)
    }

    /// Runs the CLI with `args` as the admin, writing `stdin` to its standard input.
    pub fn cli_stdin<I, S>(&self, stdin: &[u8], args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.command(Some(&self.admin_key));
        cmd.args(args);
        run(cmd, Some(stdin))
    }

    /// A command for the CLI binary with this server's URL and, when given, `key` in the
    /// environment (`SPACE_CONFIG` points at the server's config file; nothing is inherited
    /// from the caller's own configuration).
    pub fn command(&self, key: Option<&str>) -> Command {
        let mut cmd = Command::new(space_bin());
        cmd.env_remove("SPACE_API_KEY")
            .env("SPACE_URL", &self.url)
            .env("SPACE_CONFIG", &self.config_path);
        if let Some(key) = key {
            cmd.env("SPACE_API_KEY", key);
        }
        cmd
    }

    /// The temporary directory everything of this server lives in.
    pub fn tmp_dir(&self) -> &Path {
        self.tmp.as_ref().expect("the temporary directory").path()
    }

    /// The end of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read(&self.log_path).unwrap_or_default();
        let start = text.len().saturating_sub(8 * 1024);
        String::from_utf8_lossy(&text[start..]).into_owned()
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .expect("opening the server log");
        let mut cmd = Command::new(space_bin());
        if self.bare {
            for var in [
                "SPACE_KERNEL",
                "SPACE_ROOTFS_MINIMAL",
                "SPACE_ROOTFS_BASE",
                "SPACE_ROOTFS_DESKTOP",
                "SPACE_GUESTD",
            ] {
                cmd.env_remove(var);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = cmd
            .arg("up")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--listen")
            .arg(self.addr.to_string())
            .args(&self.up_args)
            .env("SPACE_CONFIG", &self.config_path)
            .env_remove("SPACE_URL")
            .env_remove("SPACE_API_KEY")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cloning the log handle"))
            .stderr(log)
            .spawn()
            .expect("starting `space up`");
        self.child = Some(child);
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    panic!(
                        "`space up` exited with {status} before answering; its log:\n{}",
                        self.log_tail()
                    );
                }
            }
            if health_ok(self.addr) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "`space up` did not answer GET /v1/health within {START_TIMEOUT:?}; its log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The admin key from the config file; `space up` writes it on the first start, right
    /// after it starts serving.
    fn read_key(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&self.config_path) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
                    // The current profile's key (`space up` saves a deployment as a profile).
                    let profile = match v.get("current").and_then(|c| c.as_str()) {
                        Some(name) => &v["profiles"][name],
                        None => &v,
                    };
                    if let Some(key) = profile.get("api_key").and_then(|k| k.as_str()) {
                        return key.to_owned();
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "`space up` wrote no api_key to {}; its log:\n{}",
                self.config_path.display(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGINT, then SIGKILL when the server does not exit in time. Returns the exit status
    /// of a server that stopped on SIGINT, `None` when it had to be killed or was not running.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGINT);
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return None;
                }
            }
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- space up log (end) ----\n{}", self.log_tail());
        }
        self.stop();
        kill_qemus_under(&self.data_dir);
        unmount(&self.data_dir);
        if let Some(tmp) = self.tmp.take() {
            let path = tmp.path().to_owned();
            if tmp.close().is_err() {
                let _ = std::fs::remove_dir_all(path);
            }
        }
    }
}

/// A port nobody listens on right now.
fn free_port() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding a free port");
    l.local_addr().expect("local address")
}

/// Whether `GET /v1/health` answers 200 (a bare HTTP/1.1 exchange, so the harness needs no
/// HTTP client).
fn health_ok(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let req = format!("GET /v1/health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = Vec::new();
    let _ = Read::by_ref(&mut s).take(64 * 1024).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.starts_with("HTTP/1.1 200") && text.contains("\"ok\"")
}

/// Runs `cmd` to completion with piped output, feeding `stdin` when given (else stdin is
/// empty); kills it and panics after [`CLI_TIMEOUT`].
pub fn run(mut cmd: Command, stdin: Option<&[u8]>) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("starting the space CLI");
    let mut input = child.stdin.take().expect("piped stdin");
    let data = stdin.map(<[u8]>::to_vec).unwrap_or_default();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let err_reader = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let deadline = Instant::now() + CLI_TIMEOUT;
    let status = loop {
        match child.try_wait().expect("waiting for the CLI") {
            Some(status) => break status,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{cmd:?} did not finish within {CLI_TIMEOUT:?}");
            }
        }
    };
    let _ = writer.join();
    Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// The repository's root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

/// Runs a test suite (`cmd`, its stdin empty, its output to a log) to its end; answers the
/// output, or panics with it when the suite failed or ran past `timeout` (then it is killed).
pub fn run_suite(cmd: Command, timeout: Duration) -> String {
    let what = format!("{:?}", cmd.get_program());
    let (status, output) = run_suite_unchecked(cmd, timeout);
    println!("{output}");
    let Some(status) = status else {
        panic!("{what} did not finish within {timeout:?}:\n{output}");
    };
    assert!(status.success(), "{what} failed ({status}):\n{output}");
    output
}

/// Runs a suite like [`run_suite`] and hands back its exit status (`None`: it was killed at
/// `timeout`) and everything it printed, for a caller that reports a failure its own way.
pub fn run_suite_unchecked(
    mut cmd: Command,
    timeout: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let out_dir = tempfile::tempdir().expect("a temporary directory");
    let log_path = out_dir.path().join("suite.log");
    let log = std::fs::File::create(&log_path).expect("creating the log");
    let what = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("cloning the log handle"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    let deadline = Instant::now() + timeout;
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
    let output = std::fs::read_to_string(&log_path).expect("reading the suite's output");
    (status, output)
}

/// Panics unless pytest's last line says tests passed and none was skipped or failed.
pub fn assert_pytest_passed(output: &str) {
    let summary = output
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(
        summary.contains(" passed") && !summary.contains("skipped") && !summary.contains("failed"),
        "unexpected pytest summary: {summary}"
    );
}

/// `program args` in `dir` with an E2B SDK's environment pointed at `server` (its admin key)
/// and `env` besides; the caller's own E2B settings are dropped.
pub fn e2b_sdk_command(
    program: &Path,
    args: &[&str],
    dir: &Path,
    server: &TestServer,
    env: &[(&str, &str)],
) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .env("E2B_API_URL", &server.url)
        .env("E2B_SANDBOX_URL", &server.url)
        .env("E2B_VOLUME_API_URL", &server.url)
        .env("E2B_API_KEY", &server.admin_key)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_DEBUG")
        .envs(env.iter().copied());
    cmd
}

/// Panics unless `output` (node's test runner, TAP when not on a terminal) ends with counts
/// that say everything passed and nothing was skipped.
pub fn assert_node_tests_passed(output: &str) {
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

/// Kills live QEMU processes that belong to the data directory `data` (by command line, or
/// by a root or working directory under it, which is how a jailed QEMU shows) and waits for
/// them to go.
pub fn kill_qemus_under(data: &Path) {
    for _ in 0..100 {
        let pids = space_node::teardown::vms_of(data);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Unmounts the loop-mounted btrfs image over `data` (`<data>.btrfs.img`, which the temporary
/// directory removal then deletes), detaching lazily when something still holds it.
pub fn unmount(data: &Path) {
    use std::os::unix::fs::MetadataExt;
    let (Ok(a), Some(Ok(b))) = (
        std::fs::metadata(data),
        data.parent().map(std::fs::metadata),
    ) else {
        return;
    };
    if a.dev() != b.dev() && nix::mount::umount2(data, nix::mount::MntFlags::empty()).is_err() {
        let _ = nix::mount::umount2(data, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The stdout of `out` as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The stderr of `out` as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Panics with the command's output unless it exited 0; returns stdout.
pub fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

/// The stdout of a successful `--json` command, parsed.
pub fn json(out: &Output) -> serde_json::Value {
    let text = ok(out);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}
