//! The virtio-serial code path (`--device`), exercised on a pseudo-terminal in raw mode: like
//! a port, it is one descriptor that several host connections use one after another without
//! the guest seeing a disconnect.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{raw_pty, PortBridge};
use space_proto::{ExecSpec, GuestClient};

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_host_connection_takes_over_the_port() {
    let pty = raw_pty();
    let _daemon = Guard(
        Command::new(env!("CARGO_BIN_EXE_space-guestd"))
            .arg("--device")
            .arg(&pty.slave_path)
            .env(
                "SPACE_GUESTD_LOG",
                std::env::var("PORT_TEST_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let host = PortBridge::new(pty.master);
    let connect = || async { GuestClient::connect(host.connect()).await.unwrap() };

    // Stale bytes on the port before the first preface are skipped.
    host.write_raw(b"stale bytes from a previous life\x00\xff");

    let first = connect().await;
    let h = tokio::time::timeout(Duration::from_secs(10), first.health())
        .await
        .expect("first connection did not answer")
        .unwrap();
    assert!(h.ready);
    let out = first.run(ExecSpec::argv(["echo", "one"])).await.unwrap();
    assert_eq!(&out.stdout[..], b"one\n");

    // The host goes away and a new one connects without the guest seeing a disconnect (a
    // snapshot restore, where the old VMM is gone): the new preface arrives inside the first
    // connection's byte stream. Should a frame the old connection still had in flight reach
    // the new host anyway, the protocol's contract is that the host reconnects when its first
    // request fails (docs/protocol.md), so each round allows a few attempts and must end with
    // a connection that answers.
    for round in 0..3 {
        host.disconnect();
        // The old host is away for a moment, as between a snapshot and its restore.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut attempts = 0;
        let next = loop {
            attempts += 1;
            let next = connect().await;
            match tokio::time::timeout(Duration::from_secs(5), next.health()).await {
                Ok(Ok(h)) => {
                    assert!(h.ready);
                    break next;
                }
                Ok(Err(e)) if attempts < 4 => eprintln!("round {round}: reconnecting after {e}"),
                Ok(Err(e)) => panic!("connection {round} failed {attempts} times: {e}"),
                Err(_) => panic!("connection {round} did not answer"),
            }
        };
        let out = next.run(ExecSpec::shell("echo two")).await.unwrap();
        assert_eq!(&out.stdout[..], b"two\n");
    }
    drop(pty.slave);
}
