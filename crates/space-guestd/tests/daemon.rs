//! End-to-end tests: the real daemon binary on a Unix socket, driven by the real client:
//! processes, terminals, identity, hostile input and shutdown (files and watches are in
//! `files.rs`).

mod socket;

use std::time::{Duration, Instant};

use bytes::Bytes;
use space_proto::{
    ClientError, ErrorKind, ExecOutput, ExecSpec, GuestClient, Identity, PtySpec, WriteOptions,
};
use tokio::net::UnixStream;

use socket::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_exit_codes() {
    let d = Daemon::start();
    let c = d.client().await;
    let h = c.health().await.unwrap();
    assert!(h.ready);
    assert_eq!(h.proto_version, space_proto::PROTO_VERSION);
    assert_eq!(h.sandbox_id, None);

    let out = c.run(ExecSpec::argv(["echo", "hello"])).await.unwrap();
    assert_eq!(out.stdout, Bytes::from_static(b"hello\n"));
    assert_eq!(out.status.exit_code, Some(0));
    assert!(out.status.success());

    let out = c.run(ExecSpec::shell("exit 1")).await.unwrap();
    assert_eq!(out.status.exit_code, Some(1));
    assert_eq!(out.status.signal, None);

    let handle = c.exec(ExecSpec::argv(["sleep", "30"])).await.unwrap();
    let pid = handle.pid();
    let listed = c.processes().await.unwrap();
    assert!(listed
        .iter()
        .any(|p| p.pid == pid && p.running && p.argv[0] == "sleep"));
    c.signal(pid, 9).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), handle.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.signal, Some(9));
    assert_eq!(status.exit_code, Some(137));
    assert!(!status.timed_out);
    let listed = c.processes().await.unwrap();
    let p = listed.iter().find(|p| p.pid == pid).unwrap();
    assert!(!p.running);
    assert_eq!(p.exit.unwrap().signal, Some(9));
    // Signalling a finished process is refused.
    let (kind, _) = guest_kind(c.signal(pid, 15).await);
    assert_eq!(kind, ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_and_stderr_stay_apart_and_env_cwd_apply() {
    let d = Daemon::start();
    let c = d.client().await;
    let out = c
        .run(
            ExecSpec::shell("echo out-$FOO; echo err >&2; pwd; echo $PATH")
                .env("FOO", "bar")
                .cwd("/tmp"),
        )
        .await
        .unwrap();
    let stdout = String::from_utf8(out.stdout.to_vec()).unwrap();
    assert_eq!(
        stdout,
        "out-bar\n/tmp\n/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
    );
    assert_eq!(out.stderr, Bytes::from_static(b"err\n"));

    // Output arrives as it is produced, not only at exit.
    let mut h = c
        .exec(ExecSpec::shell("echo first; sleep 5; echo second"))
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(3), h.next_output())
        .await
        .expect("output must stream before the process exits")
        .unwrap();
    assert_eq!(
        first,
        Some(ExecOutput::Stdout(Bytes::from_static(b"first\n")))
    );
    c.signal(h.pid(), 9).await.unwrap();
    assert_eq!(h.wait().await.unwrap().signal, Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_round_trip() {
    let d = Daemon::start();
    let c = d.client().await;
    let mut h = c.exec(ExecSpec::argv(["cat"])).await.unwrap();
    let stdin = h.take_stdin().unwrap();
    let data = random_bytes(3 * 1024 * 1024 + 17, 7);
    let writer = {
        let data = data.clone();
        tokio::spawn(async move {
            for chunk in data.chunks(100_000) {
                stdin.write(chunk).await.unwrap();
            }
            stdin.close().await.unwrap();
        })
    };
    let out = h.output().await.unwrap();
    writer.await.unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), data.len());
    assert_eq!(sha(&out.stdout), sha(&data));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_megabytes_of_output_arrive_intact() {
    let d = Daemon::start();
    let c = d.client().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    let data = random_bytes(10 * 1024 * 1024, 11);
    std::fs::write(&path, &data).unwrap();
    let out = c
        .run(ExecSpec::argv(["cat", path.to_str().unwrap()]))
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), data.len());
    assert_eq!(sha(&out.stdout), sha(&data));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_errors() {
    let d = Daemon::start();
    let c = d.client().await;

    let (kind, msg) = guest_kind(
        c.exec(ExecSpec::argv(["no-such-command-xyz"]))
            .await
            .map(|_| ()),
    );
    assert_eq!(kind, ErrorKind::NotFound);
    assert!(msg.contains("no-such-command-xyz"), "{msg}");

    let (kind, msg) = guest_kind(c.read_file_bytes("/nonexistent/file.txt").await);
    assert_eq!(kind, ErrorKind::NotFound);
    assert!(msg.contains("/nonexistent/file.txt"), "{msg}");

    let (kind, msg) = guest_kind(
        c.write_file("/proc/space-test-file", "x", WriteOptions::default())
            .await,
    );
    assert!(
        matches!(kind, ErrorKind::ReadOnly | ErrorKind::PermissionDenied),
        "{kind:?}"
    );
    assert!(msg.contains("/proc/space-test-file"), "{msg}");

    let (kind, _) = guest_kind(
        c.exec(ExecSpec::argv(["true"]).cwd("/nonexistent-dir"))
            .await
            .map(|_| ()),
    );
    assert_eq!(kind, ErrorKind::NotFound);

    let (kind, _) = guest_kind(c.signal(999_999, 9).await);
    assert_eq!(kind, ErrorKind::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_process_group() {
    let d = Daemon::start();
    let c = d.client().await;
    let started = Instant::now();
    // The background sleep is in the same process group and dies too.
    let out = c
        .run(ExecSpec::shell("sleep 30 & sleep 30").timeout(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(out.status.timed_out);
    assert_eq!(out.status.signal, Some(9));
    assert_eq!(out.status.exit_code, Some(137));
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_as_another_user() {
    let d = Daemon::start();
    let c = d.client().await;
    let out = c
        .run(ExecSpec::shell("id -u; id -g; id -G").user(65534, 65534))
        .await
        .unwrap();
    assert!(out.status.success(), "{:?}", out);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "65534\n65534\n65534\n"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_execs() {
    let d = Daemon::start();
    let c = d.client().await;
    let mut tasks = Vec::new();
    for i in 0..24 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let out = c
                .run(ExecSpec::shell(format!(
                    "sleep 0.2; echo task-{i}; exit {}",
                    i % 3
                )))
                .await
                .unwrap();
            (i, out)
        }));
    }
    let started = Instant::now();
    for t in tasks {
        let (i, out) = t.await.unwrap();
        assert_eq!(out.stdout, Bytes::from(format!("task-{i}\n")));
        assert_eq!(out.status.exit_code, Some(i % 3));
    }
    // They ran concurrently, not one after another (24 × 0.2 s).
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pty_session_with_resize() {
    let d = Daemon::start();
    let c = d.client().await;
    let mut pty = c
        .pty(PtySpec::new(24, 80).command(space_proto::Command::Argv(vec!["/bin/sh".into()])))
        .await
        .unwrap();
    let mut seen = String::new();
    async fn expect(pty: &mut space_proto::PtyHandle, seen: &mut String, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !seen.contains(needle) {
            let chunk = tokio::time::timeout_at(deadline.into(), pty.next_output())
                .await
                .unwrap_or_else(|_| panic!("{needle:?} not seen in {seen:?}"))
                .unwrap()
                .expect("session ended early");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
    pty.write("echo tty-$((40+2)) $TERM\n").await.unwrap();
    expect(&mut pty, &mut seen, "tty-42 xterm-256color").await;
    pty.write("stty size\n").await.unwrap();
    expect(&mut pty, &mut seen, "24 80").await;
    pty.resize(30, 100).await.unwrap();
    pty.write("stty size\n").await.unwrap();
    expect(&mut pty, &mut seen, "30 100").await;
    pty.write("exit 3\n").await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), pty.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.exit_code, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_outside_a_vm_changes_nothing_on_the_host() {
    let d = Daemon::start();
    let c = d.client().await;
    let before = nix::unistd::gethostname().unwrap();
    let applied = c
        .identity(&Identity {
            sandbox_id: "sb-123".into(),
            entropy: random_bytes(64, 5),
            time_unix_ns: Some(1_000_000_000),
            hostname: Some("space-test-host".into()),
            env: [("IDENTITY_VAR".to_string(), "from-identity".to_string())]
                .into_iter()
                .collect(),
            ca_pem: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!applied.system_changed);
    assert!(!applied.reseeded);
    assert_eq!(nix::unistd::gethostname().unwrap(), before);
    // The clock was not set back to 1970.
    assert!(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            > Duration::from_secs(1_600_000_000)
    );
    assert_eq!(
        c.health().await.unwrap().sandbox_id.as_deref(),
        Some("sb-123")
    );
    let out = c.run(ExecSpec::shell("echo $IDENTITY_VAR")).await.unwrap();
    assert_eq!(out.stdout, Bytes::from_static(b"from-identity\n"));
    // Invalid identities are refused.
    let (kind, _) = guest_kind(
        c.identity(&Identity {
            sandbox_id: "x".into(),
            entropy: vec![0; 5000],
            time_unix_ns: None,
            hostname: None,
            env: Default::default(),
            ca_pem: None,
            ..Default::default()
        })
        .await,
    );
    assert_eq!(kind, ErrorKind::TooLarge);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_a_filesystem_outside_a_vm_is_refused() {
    let d = Daemon::start();
    let c = d.client().await;
    // The host's filesystems are not the daemon's to resize.
    let (kind, msg) = guest_kind(c.grow_fs("/", None).await);
    assert_eq!(kind, ErrorKind::Unsupported, "{msg}");
    assert!(msg.contains("PID 1"), "{msg}");
    // Bad paths are refused before anything else.
    match c.grow_fs("relative", None).await {
        Err(ClientError::Invalid(e)) => assert_eq!(e.kind, ErrorKind::InvalidArgument),
        other => panic!("expected a refused path, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_is_refused_and_the_daemon_keeps_serving() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let d = Daemon::start();

    // Garbage instead of an HTTP/2 preface: the daemon closes that connection.
    let mut raw = UnixStream::connect(&d.sock).await.unwrap();
    raw.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\xfe garbage garbage garbage")
        .await
        .unwrap();
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "daemon kept a garbage connection open");

    // A valid preface followed by an oversized HTTP/2 frame.
    let mut raw = UnixStream::connect(&d.sock).await.unwrap();
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS
    bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 1]); // 16 MiB DATA header
    raw.write_all(&bytes).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut sink)).await;
    assert!(
        closed.is_ok(),
        "daemon kept a connection with a bad frame open"
    );

    // An oversized record as the first record of an exec: refused before its payload arrives.
    let mut h2 = raw_h2(&d.sock).await;
    let mut record = vec![1u8];
    record.extend_from_slice(&((space_proto::MAX_FRAME_PAYLOAD as u32) + 1).to_be_bytes());
    let req = http::Request::post("http://guest/v1/exec")
        .body(http_body_util::Full::new(Bytes::from(record)))
        .unwrap();
    h2.ready().await.unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), h2.send_request(req))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let err: space_proto::ProtoError = serde_json::from_slice(&body).unwrap();
    assert_eq!(err.kind, ErrorKind::Protocol);

    // An unknown record kind mid-stream ends that exec with an error.
    let spec = space_proto::Frame::json(
        space_proto::FrameKind::Spec,
        &ExecSpec::argv(["sleep", "30"]),
    )
    .encode();
    let mut body = spec.to_vec();
    body.extend_from_slice(&[0xEE, 0, 0, 0, 0]);
    let req = http::Request::post("http://guest/v1/exec")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap();
    h2.ready().await.unwrap();
    let resp = h2.send_request(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body = tokio::time::timeout(
        Duration::from_secs(5),
        http_body_util::BodyExt::collect(resp.into_body()),
    )
    .await
    .unwrap()
    .unwrap()
    .to_bytes();
    let mut dec = space_proto::FrameDecoder::new();
    dec.push(&body);
    let mut kinds = Vec::new();
    while let Some(f) = dec.next_frame().unwrap() {
        kinds.push(f.kind);
    }
    assert_eq!(
        kinds,
        vec![
            space_proto::FrameKind::Started,
            space_proto::FrameKind::Error,
            space_proto::FrameKind::Exit
        ]
    );

    // Unknown route, oversized JSON body.
    let req = http::Request::get("http://guest/v1/nope")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    h2.ready().await.unwrap();
    assert_eq!(h2.send_request(req).await.unwrap().status().as_u16(), 404);
    let req = http::Request::post("http://guest/v1/mkdir")
        .body(http_body_util::Full::new(Bytes::from(vec![
            b' ';
            2 * 1024 * 1024
        ])))
        .unwrap();
    h2.ready().await.unwrap();
    assert_eq!(h2.send_request(req).await.unwrap().status().as_u16(), 413);

    // Still serving.
    let c = d.client().await;
    assert!(c.health().await.unwrap().ready);
    let out = c.run(ExecSpec::argv(["echo", "alive"])).await.unwrap();
    assert_eq!(out.stdout, Bytes::from_static(b"alive\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_connection_fails_calls_promptly() {
    let d = Daemon::start();
    // The client talks through a relay that the test can cut.
    let (client_end, relay_end) = tokio::io::duplex(64 * 1024);
    let upstream = UnixStream::connect(&d.sock).await.unwrap();
    let relay = tokio::spawn(async move {
        let mut a = relay_end;
        let mut b = upstream;
        let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
    });
    let c = GuestClient::connect(client_end).await.unwrap();
    let mut h = c
        .exec(ExecSpec::shell("echo started; sleep 3"))
        .await
        .unwrap();
    assert_eq!(
        h.next_output().await.unwrap(),
        Some(ExecOutput::Stdout(Bytes::from_static(b"started\n")))
    );
    relay.abort();
    let started = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(2), h.wait())
        .await
        .expect("a call on a dead connection hung");
    assert!(r.is_err());
    let r = tokio::time::timeout(Duration::from_secs(2), c.health())
        .await
        .expect("a new call on a dead connection hung");
    assert!(r.is_err());
    assert!(started.elapsed() < Duration::from_secs(2));

    // The daemon itself is fine.
    let c2 = d.client().await;
    assert!(c2.health().await.unwrap().ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_daemon_outside_a_vm() {
    let mut d = Daemon::start();
    let c = d.client().await;
    c.shutdown().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = d.child.try_wait().unwrap() {
            assert!(status.success());
            break;
        }
        assert!(Instant::now() < deadline, "daemon did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads an exec handle's stdout until it contains `needle` (5 s at most).
async fn stdout_until(h: &mut space_proto::ExecHandle, needle: &str) -> String {
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !seen.contains(needle) {
        let next = tokio::time::timeout_at(deadline.into(), h.next_output())
            .await
            .unwrap_or_else(|_| panic!("{needle:?} not seen in {seen:?}"))
            .unwrap();
        match next {
            Some(ExecOutput::Stdout(b)) => seen.push_str(&String::from_utf8_lossy(&b)),
            Some(ExecOutput::Stderr(_)) => {}
            None => panic!("the process ended before {needle:?}: {seen:?}"),
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_is_fed_and_read_from_other_connections() {
    let d = Daemon::start();
    let c = d.client().await;
    let mut spec = ExecSpec::argv(["cat"]).env("MARK", "m1");
    spec.tag = Some("reader".into());
    spec.keep_stdin = true;
    let mut first = c.exec(spec).await.unwrap();
    let pid = first.pid();
    // The starting request's own stdin ends: with keep_stdin the process's stays open.
    drop(first.take_stdin());

    let other = d.client().await;
    let listed = other.processes().await.unwrap();
    let me = listed.iter().find(|p| p.pid == pid).expect("listed");
    assert_eq!(
        (
            me.tag.as_deref(),
            me.env.get("MARK").map(String::as_str),
            me.cwd.as_deref()
        ),
        (Some("reader"), Some("m1"), Some("/"))
    );
    let mut attached = other.attach(pid).await.unwrap();
    assert_eq!(attached.pid(), pid);
    other
        .send_stdin(pid, Bytes::from_static(b"hello from afar\n"), false)
        .await
        .unwrap();
    stdout_until(&mut attached, "hello from afar").await;
    stdout_until(&mut first, "hello from afar").await;
    other.send_stdin(pid, Bytes::new(), true).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), attached.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(first.wait().await.unwrap().success());
    // Gone: every route of the process says so.
    for r in [
        guest_kind(other.attach(pid).await.map(|h| h.pid())),
        guest_kind(other.send_stdin(pid, Bytes::from_static(b"x"), false).await),
        guest_kind(other.resize(pid, 10, 10).await),
    ] {
        assert_eq!(r.0, ErrorKind::NotFound, "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_whose_stream_was_dropped_can_be_attached_and_ended() {
    let d = Daemon::start();
    let c = d.client().await;
    let h = c
        .exec(ExecSpec::shell(
            "while true; do echo tick; sleep 0.05; done",
        ))
        .await
        .unwrap();
    let pid = h.pid();
    drop(h);
    drop(c);
    let other = d.client().await;
    let mut attached = other.attach(pid).await.unwrap();
    stdout_until(&mut attached, "tick\ntick").await;
    // Not a terminal: no resize.
    assert_eq!(
        guest_kind(other.resize(pid, 10, 10).await).0,
        ErrorKind::InvalidArgument
    );
    other.signal(pid, 9).await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(5), attached.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.signal, Some(9));
    assert_eq!(
        guest_kind(other.attach(999_999_999).await.map(|h| h.pid())).0,
        ErrorKind::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_is_resized_and_typed_into_by_pid() {
    let d = Daemon::start();
    let c = d.client().await;
    let mut pty = c.pty(PtySpec::new(24, 80)).await.unwrap();
    let pid = pty.pid();
    let other = d.client().await;
    other.resize(pid, 33, 111).await.unwrap();
    other
        .send_stdin(pid, Bytes::from_static(b"stty size\n"), false)
        .await
        .unwrap();
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !seen.contains("33 111") {
        let chunk = tokio::time::timeout_at(deadline.into(), pty.next_output())
            .await
            .unwrap_or_else(|_| panic!("no new size in {seen:?}"))
            .unwrap()
            .expect("session ended early");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_eq!(
        guest_kind(other.resize(pid, 0, 10).await).0,
        ErrorKind::InvalidArgument
    );
    other.signal(pid, 9).await.unwrap();
    assert_eq!(pty.wait().await.unwrap().signal, Some(9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_and_running_as_one_by_name() {
    let d = Daemon::start();
    let c = d.client().await;
    let root = c.account("root").await.unwrap();
    assert_eq!((root.uid, root.gid, root.home.as_str()), (0, 0, "/root"));
    assert_eq!(
        guest_kind(c.account("no-such-account").await).0,
        ErrorKind::NotFound
    );
    assert_eq!(
        guest_kind(c.account("a:b").await).0,
        ErrorKind::InvalidArgument
    );
    let nobody = c.account("nobody").await.unwrap();
    let mut spec = ExecSpec::shell("id -u; echo $USER $LOGNAME $HOME; pwd");
    spec.username = Some("nobody".into());
    let out = c.run(spec).await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let home_dir = std::path::Path::new(&nobody.home).is_dir();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!(
            "{}\nnobody nobody {}\n{}\n",
            nobody.uid,
            nobody.home,
            if home_dir { nobody.home.as_str() } else { "/" }
        )
    );
    // The spec's own variables and working directory win.
    let mut spec = ExecSpec::shell("echo $HOME; pwd")
        .env("HOME", "/tmp")
        .cwd("/tmp");
    spec.username = Some("root".into());
    let out = c.run(spec).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "/tmp\n/tmp\n");
    let mut spec = ExecSpec::shell("true");
    spec.username = Some("no-such-account".into());
    assert_eq!(guest_kind(c.run(spec).await).0, ErrorKind::NotFound);
}
