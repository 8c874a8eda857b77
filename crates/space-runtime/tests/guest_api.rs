//! The guest API end to end: each test boots its own microVM from a stock image (the real
//! kernel, the real `space-guestd` as init) through the QEMU runtime and drives the daemon over
//! `space.ctl` with `GuestClient`, or with hand-written HTTP/2 where the point is to send what
//! a well-behaved client never would.
//!
//! Needs SPACE_KERNEL, SPACE_ROOTFS_MINIMAL and SPACE_ROOTFS_BASE (set by `make test`).
//! Every VM is killed and every sandbox directory removed when its test ends, pass or fail:
//! [`Guest`] owns both and drops the VM before the directory.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use space_proto::{
    ErrorKind, ExecSpec, FileType, FrameDecoder, FrameKind, ProtoError, PtySpec, WatchEventKind,
    WriteOptions,
};
use space_runtime::{
    BootSpec, ClientError, GuestClient, QemuRuntime, QemuRuntimeConfig, QemuVm, Runtime, Vm,
};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// Bound for a cold boot under TCG on a loaded machine (a hang guard, not a measurement).
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound for any single step that should finish; only reached when something hangs.
const HANG_GUARD: Duration = Duration::from_secs(180);

// ---------------------------------------------------------------------------------------------
// Booting and cleanup
// ---------------------------------------------------------------------------------------------

/// A path from the environment, or a panic that says how to get it set.
fn artifact(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => {
            let path = PathBuf::from(v);
            assert!(
                path.is_file(),
                "{var}={} does not exist; rebuild the artifacts with `make test`",
                path.display()
            );
            path
        }
        _ => panic!(
            "{var} is not set: these tests boot real guests under QEMU; run them with \
             `make test`, which builds the kernel and images and sets SPACE_KERNEL, \
             SPACE_ROOTFS_MINIMAL and SPACE_ROOTFS_BASE"
        ),
    }
}

/// A booted guest whose daemon answered. Field order is drop order: the client goes first,
/// then the VM (dropping it kills QEMU), then the sandbox directory.
struct Guest {
    client: GuestClient,
    vm: QemuVm,
    _dir: TempDir,
}

async fn boot(image_var: &str, memory_mib: u64) -> Guest {
    let kernel = artifact("SPACE_KERNEL");
    let rootfs = artifact(image_var);
    let dir = tempfile::Builder::new()
        .prefix("space-guest-api-")
        .tempdir()
        .expect("creating the sandbox directory");
    let runtime = QemuRuntime::new(QemuRuntimeConfig::default())
        .await
        .unwrap_or_else(|e| panic!("QEMU runtime: {e}"));
    let spec = BootSpec {
        dir: dir.path().to_owned(),
        kernel,
        rootfs,
        vcpus: 1,
        memory_mib,
        kernel_cmdline: None,
    };
    // Declared after `dir`, so a panic below drops (kills) the VM before removing its files.
    let vm = runtime
        .boot(spec)
        .await
        .unwrap_or_else(|e| panic!("booting {image_var}: {e}"));
    let client = vm
        .wait_ready(BOOT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("guest daemon of {image_var} never got ready: {e}"));
    Guest {
        client,
        vm,
        _dir: dir,
    }
}

async fn boot_minimal() -> Guest {
    boot("SPACE_ROOTFS_MINIMAL", 256).await
}

/// Awaits `fut`, failing the test if it has not finished within [`HANG_GUARD`].
async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(HANG_GUARD, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: nothing after {HANG_GUARD:?}; the guest seems stuck"),
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// Runs `line` with `/bin/sh -c`, insists on exit code 0 and returns stdout.
async fn sh(client: &GuestClient, line: &str) -> String {
    let out = bounded(line, client.run(ExecSpec::shell(line)))
        .await
        .unwrap_or_else(|e| panic!("`{line}`: {e}"));
    assert!(
        out.status.success(),
        "`{line}` ended with {:?}; stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.to_vec()).expect("stdout is UTF-8")
}

fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The hash printed by `sha256sum PATH` in the guest.
async fn guest_sha256(client: &GuestClient, path: &str) -> String {
    let out = sh(client, &format!("sha256sum {path}")).await;
    out.split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("sha256sum printed nothing for {path}"))
        .to_owned()
}

/// Deterministic, incompressible bytes (xorshift64).
fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The structured error of a failed call (panics if the call did not fail that way).
fn guest_error<T>(what: &str, result: Result<T, ClientError>) -> ProtoError {
    match result {
        Err(ClientError::Guest(e)) => e,
        Err(other) => panic!("{what}: expected a structured error from the guest, got {other:?}"),
        Ok(_) => panic!("{what}: succeeded, but it should have failed"),
    }
}

/// The daemon still answers health and runs a command.
async fn assert_still_serving(client: &GuestClient) {
    let health = bounded("health", client.health())
        .await
        .expect("health after an error");
    assert!(health.ready);
    assert_eq!(sh(client, "echo still here").await, "still here\n");
}

// ---------------------------------------------------------------------------------------------
// Exec
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn exec_echo_and_exit_codes() {
    let g = boot_minimal().await;

    let out = g
        .client
        .run(ExecSpec::argv(["echo", "hello", "guest"]))
        .await
        .unwrap();
    assert_eq!(&out.stdout[..], b"hello guest\n");
    assert!(out.stderr.is_empty(), "{out:?}");
    assert_eq!(out.status.exit_code, Some(0));
    assert_eq!(out.status.signal, None);
    assert!(out.status.success());

    let out = g.client.run(ExecSpec::shell("exit 1")).await.unwrap();
    assert_eq!(out.status.exit_code, Some(1));
    assert_eq!(out.status.signal, None);
    assert!(!out.status.success());

    let sleeper = g
        .client
        .exec(ExecSpec::argv(["sleep", "1000"]))
        .await
        .unwrap();
    let pid = sleeper.pid();
    assert!(pid > 1, "pid {pid}");
    let listed = g.client.processes().await.unwrap();
    assert!(
        listed.iter().any(|p| p.pid == pid && p.running),
        "{listed:?}"
    );
    g.client.signal(pid, 9).await.unwrap();
    let status = bounded("sleep after SIGKILL", sleeper.wait())
        .await
        .unwrap();
    assert_eq!(status.exit_code, Some(137));
    assert_eq!(status.signal, Some(9));
    assert!(!status.timed_out);
    let listed = g.client.processes().await.unwrap();
    let entry = listed
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} missing from {listed:?}"));
    assert!(!entry.running);
    assert_eq!(entry.exit.and_then(|e| e.signal), Some(9));

    // A process that is gone cannot be signalled.
    let err = guest_error("signal a finished process", g.client.signal(pid, 9).await);
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
}

#[tokio::test]
async fn stderr_is_kept_apart_from_stdout() {
    let g = boot_minimal().await;
    let out = g
        .client
        .run(ExecSpec::shell(
            "echo out-1; echo err-1 >&2; echo out-2; echo err-2 >&2; exit 3",
        ))
        .await
        .unwrap();
    assert_eq!(&out.stdout[..], b"out-1\nout-2\n");
    assert_eq!(&out.stderr[..], b"err-1\nerr-2\n");
    assert_eq!(out.status.exit_code, Some(3));
}

#[tokio::test]
async fn stdin_round_trips_through_cat() {
    let g = boot_minimal().await;
    // Every byte value, and more than a pipe buffer holds, so input and output overlap.
    let input: Vec<u8> = (0..300 * 1024).map(|i| (i % 251) as u8).collect();
    let mut cat = g.client.exec(ExecSpec::argv(["cat"])).await.unwrap();
    let stdin = cat.take_stdin().expect("stdin writer");
    let to_send = input.clone();
    let writer = tokio::spawn(async move {
        for chunk in to_send.chunks(32 * 1024) {
            stdin.write(chunk).await?;
        }
        stdin.close().await
    });
    let out = bounded("cat output", cat.output()).await.unwrap();
    writer.await.unwrap().unwrap();
    assert_eq!(out.status.exit_code, Some(0), "{:?}", out.status);
    assert_eq!(out.stdout.len(), input.len());
    assert!(out.stdout[..] == input[..], "cat echoed different bytes");
    assert!(out.stderr.is_empty());
}

#[tokio::test]
async fn ten_megabytes_of_output_arrive_intact() {
    let g = boot_minimal().await;
    const LEN: usize = 10 * 1024 * 1024;
    let out = bounded(
        "10 MB of output",
        g.client.run(ExecSpec::shell(format!(
            "head -c {LEN} /dev/urandom | tee /tmp/produced.bin"
        ))),
    )
    .await
    .unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(out.stdout.len(), LEN);
    assert_eq!(
        sha256_hex(&out.stdout),
        guest_sha256(&g.client, "/tmp/produced.bin").await
    );
}

#[tokio::test]
async fn twenty_concurrent_execs_keep_their_own_output() {
    let g = boot_minimal().await;
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let client = g.client.clone();
            tokio::spawn(async move {
                let line = format!(
                    "echo begin-{i}; sleep 1; for n in 1 2 3; do echo task-{i}-$n; done; \
                     echo problem-{i} >&2; exit {i}"
                );
                (i, client.run(ExecSpec::shell(line)).await)
            })
        })
        .collect();
    for task in tasks {
        let (i, out) = bounded("concurrent exec", task).await.unwrap();
        let out = out.unwrap_or_else(|e| panic!("exec {i}: {e}"));
        let expected = format!("begin-{i}\ntask-{i}-1\ntask-{i}-2\ntask-{i}-3\n");
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected, "exec {i}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("problem-{i}\n"),
            "exec {i}"
        );
        assert_eq!(out.status.exit_code, Some(i), "exec {i}");
    }
}

#[tokio::test]
async fn timeout_kills_a_long_command() {
    let g = boot_minimal().await;
    let out = bounded(
        "sleep with a timeout",
        g.client
            .run(ExecSpec::argv(["sleep", "1000"]).timeout(Duration::from_millis(300))),
    )
    .await
    .unwrap();
    assert!(out.status.timed_out, "{:?}", out.status);
    assert_eq!(out.status.signal, Some(9));
    assert_eq!(out.status.exit_code, Some(137));

    // A command that finishes well within its timeout is not flagged.
    let out = g
        .client
        .run(ExecSpec::shell("echo quick").timeout(Duration::from_secs(600)))
        .await
        .unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(!out.status.timed_out);
    assert_eq!(&out.stdout[..], b"quick\n");
}

#[tokio::test]
async fn exec_as_an_unprivileged_user() {
    let g = boot_minimal().await;
    let out = g
        .client
        .run(ExecSpec::shell("id -u; id -g; id -G").user(65534, 65534))
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "65534\n65534\n65534\n"
    );

    // Without a gid the process takes the group of the same number, never root's.
    let mut spec = ExecSpec::shell("id -u; id -g");
    spec.uid = Some(65534);
    let out = g.client.run(spec).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "65534\n65534\n");

    // The unprivileged process really lacks root's rights.
    let out = g
        .client
        .run(ExecSpec::shell("touch /root/nobody-was-here").user(65534, 65534))
        .await
        .unwrap();
    assert_ne!(out.status.exit_code, Some(0), "{out:?}");
    assert_eq!(sh(&g.client, "id -u").await, "0\n");
}

// ---------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn fifty_megabyte_file_round_trips() {
    let g = boot_minimal().await;
    const LEN: usize = 50 * 1024 * 1024;
    let data = pseudo_random(LEN, 0x5eed_f00d);
    let sent_hash = sha256_hex(&data);

    let stat = bounded(
        "50 MB upload",
        g.client
            .write_file("/root/big.bin", data, WriteOptions::default()),
    )
    .await
    .unwrap();
    assert_eq!(stat.size, LEN as u64);
    assert_eq!(stat.file_type, FileType::File);
    assert_eq!(guest_sha256(&g.client, "/root/big.bin").await, sent_hash);

    let back = bounded("50 MB download", g.client.read_file_bytes("/root/big.bin"))
        .await
        .unwrap();
    assert_eq!(back.len(), LEN);
    assert_eq!(sha256_hex(&back), sent_hash);
    // No temporary upload file was left next to the target.
    let names: Vec<String> = g
        .client
        .list("/root")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["big.bin"]);
}

#[tokio::test]
async fn list_stat_mkdir_rename_remove_chmod() {
    let g = boot_minimal().await;
    let c = &g.client;

    let made = c.mkdir("/root/tree/a/b", true).await.unwrap();
    assert_eq!(made.file_type, FileType::Dir);
    assert_eq!(made.path, "/root/tree/a/b");
    // `mkdir -p` semantics: existing directories are fine.
    c.mkdir("/root/tree/a/b", true).await.unwrap();
    let err = guest_error("mkdir existing", c.mkdir("/root/tree", false).await);
    assert_eq!(err.kind, ErrorKind::AlreadyExists, "{err}");
    let err = guest_error("mkdir missing parent", c.mkdir("/root/x/y", false).await);
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    assert_eq!(sh(c, "test -d /root/tree/a/b && echo dir").await, "dir\n");

    c.write_file(
        "/root/tree/a/b/leaf.txt",
        &b"leaf"[..],
        WriteOptions::default(),
    )
    .await
    .unwrap();
    c.write_file("/root/tree/top.txt", &b"top!"[..], WriteOptions::default())
        .await
        .unwrap();

    let listing = c.list("/root/tree").await.unwrap();
    let summary: Vec<(&str, FileType, u64)> = listing
        .iter()
        .map(|e| (e.name.as_str(), e.stat.file_type, e.stat.size))
        .collect();
    assert_eq!(summary[0].0, "a");
    assert_eq!(summary[0].1, FileType::Dir);
    assert_eq!(summary[1..], [("top.txt", FileType::File, 4)]);
    assert_eq!(listing[1].stat.path, "/root/tree/top.txt");

    let stat = c.stat("/root/tree/top.txt").await.unwrap();
    assert_eq!(stat.size, 4);
    assert_eq!(stat.mode, 0o644);
    assert_eq!((stat.uid, stat.gid), (0, 0));

    let moved = c
        .rename("/root/tree/top.txt", "/root/tree/a/moved.txt")
        .await
        .unwrap();
    assert_eq!(moved.path, "/root/tree/a/moved.txt");
    assert_eq!(moved.size, 4);
    let err = guest_error("stat after rename", c.stat("/root/tree/top.txt").await);
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    assert_eq!(
        &c.read_file_bytes("/root/tree/a/moved.txt").await.unwrap()[..],
        b"top!"
    );

    let changed = c.chmod("/root/tree/a/moved.txt", 0o600).await.unwrap();
    assert_eq!(changed.mode, 0o600);
    assert_eq!(c.stat("/root/tree/a/moved.txt").await.unwrap().mode, 0o600);
    let ls = sh(c, "ls -l /root/tree/a/moved.txt").await;
    assert!(ls.starts_with("-rw------- "), "{ls}");

    let err = guest_error("remove non-empty", c.remove("/root/tree", false).await);
    assert_eq!(err.kind, ErrorKind::NotEmpty, "{err}");
    assert!(c.stat("/root/tree/a/b/leaf.txt").await.is_ok());
    c.remove("/root/tree", true).await.unwrap();
    let err = guest_error("stat after remove", c.stat("/root/tree").await);
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    assert_eq!(
        sh(c, "test -e /root/tree && echo present || echo gone").await,
        "gone\n"
    );
}

#[tokio::test]
async fn watch_sees_a_file_created_by_exec() {
    let g = boot_minimal().await;
    g.client.mkdir("/root/watched", false).await.unwrap();
    let mut watch = g.client.watch("/root/watched", false).await.unwrap();
    sh(&g.client, "echo hello > /root/watched/made-by-exec.txt").await;

    let mut kinds = Vec::new();
    bounded("watch events", async {
        loop {
            let event = watch
                .next()
                .await
                .expect("watch stream")
                .expect("watch ended early");
            if !event.path.ends_with("/made-by-exec.txt") {
                continue;
            }
            assert!(!event.is_dir, "{event:?}");
            kinds.push(event.kind);
            if event.kind == WatchEventKind::ClosedWrite {
                break;
            }
        }
    })
    .await;
    assert_eq!(kinds.first(), Some(&WatchEventKind::Created), "{kinds:?}");
}

// ---------------------------------------------------------------------------------------------
// PTY
// ---------------------------------------------------------------------------------------------

/// Reads terminal output until `needle` appears; drops everything up to and including it.
async fn read_until(pty: &mut space_proto::PtyHandle, seen: &mut String, needle: &str) {
    bounded(needle, async {
        while !seen.contains(needle) {
            match pty.next_output().await {
                Ok(Some(chunk)) => seen.push_str(&String::from_utf8_lossy(&chunk)),
                Ok(None) => panic!("terminal closed before {needle:?}; output: {seen:?}"),
                Err(e) => panic!("terminal failed before {needle:?}: {e}; output: {seen:?}"),
            }
        }
    })
    .await;
    let end = seen.find(needle).unwrap() + needle.len();
    seen.drain(..end);
}

#[tokio::test]
async fn pty_runs_a_shell_and_follows_resizes() {
    let g = boot_minimal().await;
    let mut pty = g.client.pty(PtySpec::new(24, 80)).await.unwrap();
    let mut seen = String::new();

    pty.write("echo $((6*7))\n").await.unwrap();
    // The typed line is echoed as `echo $((6*7))`; only the shell's answer is `42`.
    read_until(&mut pty, &mut seen, "\n42\r\n").await;

    pty.write("stty size\n").await.unwrap();
    read_until(&mut pty, &mut seen, "\n24 80\r\n").await;

    pty.resize(33, 111).await.unwrap();
    pty.write("stty size\n").await.unwrap();
    read_until(&mut pty, &mut seen, "\n33 111\r\n").await;

    pty.write("exit 5\n").await.unwrap();
    let status = bounded("shell exit", pty.wait()).await.unwrap();
    assert_eq!(status.exit_code, Some(5));
}

// ---------------------------------------------------------------------------------------------
// Errors and robustness
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn failures_are_structured_and_the_daemon_keeps_serving() {
    let g = boot_minimal().await;
    let c = &g.client;

    let err = guest_error(
        "exec a missing command",
        c.exec(ExecSpec::argv(["no-such-command-here"])).await,
    );
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    assert!(err.message.contains("no-such-command-here"), "{err}");
    assert_still_serving(c).await;

    let err = guest_error(
        "exec a missing path",
        c.exec(ExecSpec::argv(["/no/such/binary"])).await,
    );
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    assert_still_serving(c).await;

    let err = guest_error(
        "read a missing file",
        c.read_file_bytes("/root/no-such-file").await,
    );
    assert_eq!(err.kind, ErrorKind::NotFound, "{err}");
    assert!(err.message.contains("/root/no-such-file"), "{err}");
    assert_still_serving(c).await;

    let err = guest_error(
        "write /proc/version",
        c.write_file("/proc/version", &b"nope"[..], WriteOptions::default())
            .await,
    );
    assert_eq!(err.kind, ErrorKind::ReadOnly, "{err}");
    assert!(err.message.contains("/proc/version"), "{err}");
    assert_still_serving(c).await;

    let err = guest_error(
        "write under /proc/sys",
        c.write_file(
            "/proc/sys/kernel/osrelease",
            &b"nope"[..],
            WriteOptions::default(),
        )
        .await,
    );
    assert!(
        matches!(err.kind, ErrorKind::ReadOnly | ErrorKind::PermissionDenied),
        "{err}"
    );
    assert_still_serving(c).await;

    let err = guest_error(
        "cwd that is a file",
        c.run(ExecSpec::shell("pwd").cwd("/proc/version")).await,
    );
    assert_eq!(err.kind, ErrorKind::NotADirectory, "{err}");

    // Nothing above disturbed the guest.
    assert_eq!(
        sh(c, "cat /proc/version").await.split_whitespace().next(),
        Some("Linux")
    );
    assert_still_serving(c).await;
}

#[tokio::test]
async fn health_reports_daemon_and_protocol_versions() {
    let g = boot_minimal().await;
    let first = g.client.health().await.unwrap();
    assert!(first.ready);
    assert_eq!(first.proto_version, space_proto::PROTO_VERSION);
    assert_eq!(first.proto_version, 1);
    // The daemon and this crate share the workspace version.
    assert_eq!(first.daemon_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(first.sandbox_id, None);
    sh(&g.client, "true").await;
    let second = g.client.health().await.unwrap();
    assert!(second.uptime_ms >= first.uptime_ms, "{first:?} {second:?}");
}

#[tokio::test]
async fn shutdown_makes_qemu_exit() {
    let g = boot_minimal().await;
    // Data written before the power-off is synced; the request is answered first.
    sh(&g.client, "echo before > /root/marker").await;
    g.client.shutdown().await.unwrap();
    let exit = match tokio::time::timeout(Duration::from_secs(120), g.vm.wait()).await {
        Ok(exit) => exit,
        Err(_) => panic!(
            "QEMU still runs 120 s after shutdown; console:\n{}",
            g.vm.console_tail(4096)
        ),
    };
    assert_eq!(exit.code, Some(0), "QEMU ended with {exit}");
    assert!(g.vm.check_alive().is_err());
    assert!(
        bounded("health after power-off", g.client.health())
            .await
            .is_err(),
        "a powered-off guest answered"
    );
}

// ---------------------------------------------------------------------------------------------
// Raw HTTP/2: what no well-behaved client sends
// ---------------------------------------------------------------------------------------------

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const H2_DATA: u8 = 0x0;
const H2_HEADERS: u8 = 0x1;
const H2_RST_STREAM: u8 = 0x3;
const H2_SETTINGS: u8 = 0x4;
const H2_PING: u8 = 0x6;
const H2_GOAWAY: u8 = 0x7;
const H2_END_STREAM: u8 = 0x1;
const H2_ACK: u8 = 0x1;
const H2_END_HEADERS: u8 = 0x4;
const H2_PADDED: u8 = 0x8;
const H2_PRIORITY: u8 = 0x20;
const H2_FRAME_SIZE_ERROR: u32 = 0x6;

fn h2_frame(ty: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 1 << 24);
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(ty);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK header block for a request: `:method` (`0x82` GET, `0x83` POST from the static
/// table), `:scheme http`, and `:path`, `:authority` and optionally `content-type` as literals
/// without indexing that name static-table entries.
fn h2_request_headers(method: u8, path: &str, content_type: Option<&str>) -> Vec<u8> {
    fn literal(out: &mut Vec<u8>, name: &[u8], value: &str) {
        assert!(value.len() < 127);
        out.extend_from_slice(name);
        out.push(value.len() as u8);
        out.extend_from_slice(value.as_bytes());
    }
    let mut block = vec![method, 0x86];
    literal(&mut block, &[0x04], path);
    literal(&mut block, &[0x01], "guest");
    if let Some(ct) = content_type {
        // Static index 31 does not fit the 4-bit prefix: 15, then 16.
        literal(&mut block, &[0x0f, 0x10], ct);
    }
    block
}

/// `:status` of a response header block when it is a static-table entry (every status the
/// daemon's answers here use), else `None`.
fn h2_status(block: &[u8]) -> Option<u16> {
    let mut i = 0;
    // Dynamic table size updates may come first.
    while block
        .get(i)
        .is_some_and(|b| b & 0xe0 == 0x20 && b & 0x1f != 0x1f)
    {
        i += 1;
    }
    match block.get(i)? {
        0x88 => Some(200),
        0x89 => Some(204),
        0x8a => Some(206),
        0x8b => Some(304),
        0x8c => Some(400),
        0x8d => Some(404),
        0x8e => Some(500),
        _ => None,
    }
}

struct H2Frame {
    ty: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl H2Frame {
    /// The payload without padding and priority fields.
    fn content(&self) -> &[u8] {
        let mut p = &self.payload[..];
        let mut pad = 0;
        if self.flags & H2_PADDED != 0 && (self.ty == H2_DATA || self.ty == H2_HEADERS) {
            pad = p[0] as usize;
            p = &p[1..];
        }
        if self.ty == H2_HEADERS && self.flags & H2_PRIORITY != 0 {
            p = &p[5..];
        }
        &p[..p.len() - pad]
    }
}

enum H2Event {
    Headers { status: Option<u16>, end: bool },
    Data { bytes: Vec<u8>, end: bool },
    Reset(u32),
}

/// A hand-driven HTTP/2 client connection on the control port.
struct RawH2 {
    stream: UnixStream,
}

impl RawH2 {
    /// Connects and handshakes: sends the preface and SETTINGS and waits for the daemon's
    /// SETTINGS. Like any host, it reconnects when the first answer does not come or is not
    /// the start of a connection (bytes of an earlier connection may arrive first).
    async fn connect(vm: &QemuVm) -> RawH2 {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        let mut patience = Duration::from_millis(500);
        loop {
            if let Err(e) = vm.check_alive() {
                panic!("{e}");
            }
            assert!(
                Instant::now() < deadline,
                "no HTTP/2 handshake with the daemon in {BOOT_TIMEOUT:?}; console:\n{}",
                vm.console_tail(4096)
            );
            if let Ok(stream) = vm.connect_ctl().await {
                let mut conn = RawH2 { stream };
                let mut hello = H2_PREFACE.to_vec();
                hello.extend(h2_frame(H2_SETTINGS, 0, 0, &[]));
                if conn.stream.write_all(&hello).await.is_ok() {
                    if let Ok(Ok(f)) = tokio::time::timeout(patience, conn.read_frame()).await {
                        if f.ty == H2_SETTINGS && f.flags & H2_ACK == 0 && f.stream == 0 {
                            conn.send(&h2_frame(H2_SETTINGS, H2_ACK, 0, &[])).await;
                            return conn;
                        }
                    }
                }
            }
            patience = (patience * 2).min(Duration::from_secs(4));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .await
            .expect("writing to the control socket");
    }

    async fn read_frame(&mut self) -> std::io::Result<H2Frame> {
        let mut header = [0u8; 9];
        self.stream.read_exact(&mut header).await?;
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        // We announced the default maximum frame size (16 KiB).
        if len > 16 * 1024 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("frame of {len} bytes"),
            ));
        }
        let mut payload = vec![0u8; len];
        self.stream.read_exact(&mut payload).await?;
        Ok(H2Frame {
            ty: header[3],
            flags: header[4],
            stream: u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff,
            payload,
        })
    }

    /// The next frame that is not connection housekeeping (SETTINGS and PING are acknowledged).
    async fn next_frame(&mut self) -> H2Frame {
        loop {
            let f = self.read_frame().await.expect("reading from the daemon");
            match f.ty {
                H2_SETTINGS if f.flags & H2_ACK == 0 => {
                    self.send(&h2_frame(H2_SETTINGS, H2_ACK, 0, &[])).await
                }
                H2_PING if f.flags & H2_ACK == 0 => {
                    self.send(&h2_frame(H2_PING, H2_ACK, 0, &f.payload)).await
                }
                _ => return f,
            }
        }
    }

    /// The next event of one stream; a GOAWAY fails the test.
    async fn next_event(&mut self, stream: u32) -> H2Event {
        loop {
            let f = self.next_frame().await;
            if f.ty == H2_GOAWAY {
                panic!(
                    "the daemon closed the connection: GOAWAY {:?}",
                    String::from_utf8_lossy(&f.payload)
                );
            }
            if f.stream != stream {
                continue;
            }
            let end = f.flags & H2_END_STREAM != 0;
            match f.ty {
                H2_HEADERS => {
                    return H2Event::Headers {
                        status: h2_status(f.content()),
                        end,
                    }
                }
                H2_DATA => {
                    return H2Event::Data {
                        bytes: f.content().to_vec(),
                        end,
                    }
                }
                H2_RST_STREAM => {
                    let code = u32::from_be_bytes(f.payload[..4].try_into().unwrap());
                    return H2Event::Reset(code);
                }
                _ => {}
            }
        }
    }

    /// Reads one stream's response to its end: status and body.
    async fn response(&mut self, stream: u32) -> (Option<u16>, Vec<u8>) {
        let mut status = None;
        let mut body = Vec::new();
        loop {
            match self.next_event(stream).await {
                H2Event::Headers { status: s, end } => {
                    status = status.or(s);
                    if end {
                        return (status, body);
                    }
                }
                H2Event::Data { bytes, end } => {
                    body.extend_from_slice(&bytes);
                    if end {
                        return (status, body);
                    }
                }
                H2Event::Reset(code) => panic!("stream {stream} was reset with code {code}"),
            }
        }
    }
}

/// Splits a streamed body into records.
fn records(body: &[u8]) -> Vec<space_proto::Frame> {
    let mut decoder = FrameDecoder::new();
    decoder.push(body);
    let mut out = Vec::new();
    while let Some(f) = decoder
        .next_frame()
        .expect("well-formed records from the daemon")
    {
        out.push(f);
    }
    decoder.finish().expect("no partial record at the end");
    out
}

#[tokio::test]
async fn malformed_bytes_on_the_control_port_do_not_stop_the_daemon() {
    let g = boot_minimal().await;
    assert!(g.client.health().await.unwrap().ready);
    // The port carries one connection at a time. (The VM and its directory stay in `g`, which
    // drops them in that order.)
    drop(g.client);
    let vm = &g.vm;

    // A valid preface and SETTINGS, then a frame header announcing 16 MiB of payload, far over
    // the daemon's limit: it must answer with GOAWAY(FRAME_SIZE_ERROR), not allocate or hang.
    let mut raw = bounded("raw handshake", RawH2::connect(vm)).await;
    let mut absurd = vec![0xff, 0xff, 0xff, H2_DATA, 0, 0, 0, 0, 1];
    absurd.extend_from_slice(&pseudo_random(1000, 7));
    raw.send(&absurd).await;
    let goaway = bounded("GOAWAY", async {
        loop {
            let f = raw.next_frame().await;
            if f.ty == H2_GOAWAY {
                return f;
            }
        }
    })
    .await;
    let code = u32::from_be_bytes(goaway.payload[4..8].try_into().unwrap());
    assert_eq!(code, H2_FRAME_SIZE_ERROR);
    drop(raw);

    // Garbage with no preface at all, then the connection vanishes.
    let mut junk = vm.connect_ctl().await.unwrap();
    let mut garbage = b"GET / HTTP/1.1\r\nHost: guest\r\n\r\n".to_vec();
    garbage.extend_from_slice(&pseudo_random(64 * 1024, 99));
    garbage.extend_from_slice(&H2_PREFACE[..10]);
    junk.write_all(&garbage).await.unwrap();
    drop(junk);

    // A fresh client is served normally.
    let client = vm.wait_ready(BOOT_TIMEOUT).await.unwrap();
    assert_eq!(sh(&client, "echo alive").await, "alive\n");
    let health = client.health().await.unwrap();
    assert!(health.ready);
}

#[tokio::test]
async fn a_host_that_vanishes_mid_frame_does_not_wedge_the_next_one() {
    let g = boot_minimal().await;
    drop(g.client);
    let vm = &g.vm;
    // A well-formed frame header announcing 60000 bytes (within the daemon's frame limit), of
    // which only a few arrive before this host disappears. The next host reconnects at once,
    // maybe before the guest noticed that the first one left: its bytes must not be taken
    // for the rest of the dead host's frame for good.
    let mut raw = bounded("raw handshake", RawH2::connect(vm)).await;
    let mut partial = h2_frame(H2_DATA, 0, 1, &pseudo_random(60_000, 3));
    partial.truncate(9 + 10);
    raw.send(&partial).await;
    drop(raw);

    let client = vm.wait_ready(BOOT_TIMEOUT).await.unwrap();
    assert_eq!(sh(&client, "echo alive").await, "alive\n");
}

#[tokio::test]
async fn oversized_records_in_an_exec_request_are_refused() {
    let g = boot_minimal().await;
    drop(g.client);
    let vm = &g.vm;
    let mut raw = bounded("raw handshake", RawH2::connect(vm)).await;
    let exec_headers = h2_request_headers(0x83, "/v1/exec", Some("application/x-space-frames"));

    // Stream 1: the very first record claims 2 MiB + 1 (the limit is 1 MiB). The daemon refuses
    // the request from the header alone, without waiting for the payload.
    raw.send(&h2_frame(H2_HEADERS, H2_END_HEADERS, 1, &exec_headers))
        .await;
    let mut oversized = vec![FrameKind::Spec as u8];
    oversized.extend_from_slice(&(2 * 1024 * 1024 + 1u32).to_be_bytes());
    oversized.extend_from_slice(b"{\"command\":");
    raw.send(&h2_frame(H2_DATA, 0, 1, &oversized)).await;
    let (status, body) = bounded("refusal of an oversized Spec", raw.response(1)).await;
    assert_eq!(status, Some(400));
    let err: ProtoError = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&body)));
    assert_eq!(err.kind, ErrorKind::Protocol, "{err}");
    assert!(err.message.contains("exceeds"), "{err}");

    // Stream 3: a valid Spec starts `cat`; then a Stdin record claiming 4 GiB breaks the
    // framing. The daemon kills the process and reports the error before the exit.
    raw.send(&h2_frame(H2_HEADERS, H2_END_HEADERS, 3, &exec_headers))
        .await;
    let spec = space_proto::Frame::json(FrameKind::Spec, &ExecSpec::argv(["cat"])).encode();
    raw.send(&h2_frame(H2_DATA, 0, 3, &spec)).await;
    let mut body = Vec::new();
    let pid = bounded("exec start", async {
        loop {
            match raw.next_event(3).await {
                H2Event::Headers { status, end } => {
                    assert_eq!(status, Some(200));
                    assert!(!end);
                }
                H2Event::Data { bytes, end } => {
                    assert!(!end, "exec ended early");
                    body.extend_from_slice(&bytes);
                    let mut decoder = FrameDecoder::new();
                    decoder.push(&body);
                    if let Some(f) = decoder.next_frame().unwrap() {
                        assert_eq!(f.kind, FrameKind::Started);
                        return f.parse::<space_proto::Started>().unwrap().pid;
                    }
                }
                H2Event::Reset(code) => panic!("exec stream reset with {code}"),
            }
        }
    })
    .await;
    raw.send(&h2_frame(
        H2_DATA,
        0,
        3,
        &[FrameKind::Stdin as u8, 0xff, 0xff, 0xff, 0xff],
    ))
    .await;
    let (_, rest) = bounded("exec end", raw.response(3)).await;
    body.extend_from_slice(&rest);
    let recs = records(&body);
    let kinds: Vec<FrameKind> = recs.iter().map(|r| r.kind).collect();
    assert_eq!(
        kinds,
        [FrameKind::Started, FrameKind::Error, FrameKind::Exit],
        "records of the exec stream"
    );
    let err: ProtoError = recs[1].parse().unwrap();
    assert_eq!(err.kind, ErrorKind::Protocol, "{err}");
    let exit: space_proto::ExitStatus = recs[2].parse().unwrap();
    assert_eq!(exit.signal, Some(9), "{exit:?}");

    // Stream 5: the same connection still serves.
    raw.send(&h2_frame(
        H2_HEADERS,
        H2_END_HEADERS | H2_END_STREAM,
        5,
        &h2_request_headers(0x82, "/v1/health", None),
    ))
    .await;
    let (status, body) = bounded("health on the raw connection", raw.response(5)).await;
    assert_eq!(status, Some(200));
    let health: space_proto::Health = serde_json::from_slice(&body).unwrap();
    assert!(health.ready);
    drop(raw);

    // And a fresh client finds the killed process and a working daemon.
    let client = vm.wait_ready(BOOT_TIMEOUT).await.unwrap();
    let listed = client.processes().await.unwrap();
    let cat = listed
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} missing from {listed:?}"));
    assert!(!cat.running);
    assert_eq!(cat.argv, ["cat"]);
    assert_eq!(sh(&client, "echo alive").await, "alive\n");
}

// ---------------------------------------------------------------------------------------------
// The base image
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn base_image_runs_python_bash_and_git() {
    let g = boot("SPACE_ROOTFS_BASE", 512).await;
    let py = sh(
        &g.client,
        "python3 -c 'import sys; print(sys.version_info[0] * 7)'",
    )
    .await;
    assert_eq!(py, "21\n");
    let out = g
        .client
        .run(ExecSpec::argv([
            "bash",
            "-c",
            "words=(one two three); echo ${#words[@]} ${words[2]}; echo $BASH_VERSION",
        ]))
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("3 three"));
    assert!(
        lines.next().is_some_and(|v| v.starts_with('5')),
        "bash version: {text}"
    );
    let git = sh(&g.client, "git --version").await;
    assert!(git.starts_with("git version 2."), "{git}");
}
