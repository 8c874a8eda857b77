//! A throwaway PostgreSQL server for tests: `initdb` into a temporary directory as the
//! `postgres` user, listening on a Unix socket in that directory only, one fresh database per
//! caller. It is made on first use, shared by the tests of one process, and removed when the
//! process ends however it ends: a small shell holds the read end of a pipe whose write end
//! only this process has, stops the server when the pipe closes and deletes the directory.
//!
//! Shared by the library's unit tests and the integration tests (`#[path]`), so it uses only
//! std, `postgres` and `tempfile`.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Where Debian puts the server binaries; `SPACE_PG_BIN` overrides.
const DEFAULT_BIN: &str = "/usr/lib/postgresql/15/bin";

struct Server {
    socket_dir: PathBuf,
    admin: Mutex<postgres::Client>,
    next: AtomicU32,
    // Kept open for the life of the process; its close stops the server.
    _lifeline: ChildStdin,
    _watchdog: Child,
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

fn start() -> Result<Server, String> {
    let bin = PathBuf::from(std::env::var("SPACE_PG_BIN").unwrap_or_else(|_| DEFAULT_BIN.into()));
    if !bin.join("postgres").exists() {
        return Err(format!(
            "no PostgreSQL server in {} (scripts/tools.sh installs postgresql-15; set \
             SPACE_PG_BIN for another place)",
            bin.display()
        ));
    }
    let root = tempfile::Builder::new()
        .prefix("space-pg-")
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))?
        .keep();
    let data = root.join("data");
    run(
        Command::new("chown").arg("postgres:postgres").arg(&root),
        "chown",
    )?;
    run(
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("initdb"))
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "-D",
            ])
            .arg(&data),
        "initdb",
    )?;
    let script = r#"
        "$1" -u postgres -- "$2/postgres" -D "$3" -k "$4" -c listen_addresses= \
            -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
            -c max_connections=300 >"$4/server.log" 2>&1 &
        read _ignored
        pid=$(head -n 1 "$3/postmaster.pid" 2>/dev/null)
        [ -n "$pid" ] && kill -INT "$pid"
        wait
        rm -rf "$4"
    "#;
    let mut watchdog = Command::new("sh")
        .args(["-c", script, "sh", "runuser"])
        .arg(&bin)
        .arg(&data)
        .arg(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting postgres: {e}"))?;
    let lifeline = watchdog.stdin.take().expect("piped stdin");
    let deadline = Instant::now() + Duration::from_secs(60);
    let admin = loop {
        match connect(&root, "postgres") {
            Ok(c) => break c,
            Err(e) if Instant::now() > deadline => {
                let log = std::fs::read_to_string(root.join("server.log")).unwrap_or_default();
                return Err(format!("postgres did not come up: {e}\n{log}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    Ok(Server {
        socket_dir: root,
        admin: Mutex::new(admin),
        next: AtomicU32::new(0),
        _lifeline: lifeline,
        _watchdog: watchdog,
    })
}

fn connect(socket_dir: &Path, db: &str) -> Result<postgres::Client, postgres::Error> {
    postgres::Config::new()
        .host_path(socket_dir)
        .user("postgres")
        .dbname(db)
        .connect(postgres::NoTls)
}

/// The URL of a new, empty database on the shared test server. Panics with the reason when
/// the server cannot run here. Works from async code: the blocking client runs on a thread of
/// its own.
pub fn database() -> String {
    std::thread::spawn(new_database)
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn new_database() -> String {
    let server = SERVER
        .get_or_init(start)
        .as_ref()
        .unwrap_or_else(|e| panic!("a PostgreSQL server for tests: {e}"));
    let n = server.next.fetch_add(1, Ordering::Relaxed);
    let name = format!("t{}_{n}", std::process::id());
    server
        .admin
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .unwrap_or_else(|e| panic!("creating database {name}: {e}"));
    format!(
        "postgres://postgres@/{name}?host={}",
        server.socket_dir.display()
    )
}
