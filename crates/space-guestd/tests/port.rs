//! The virtio-serial code path (`--device`), exercised on a pseudo-terminal in raw mode: like
//! a port, it is one descriptor that several host connections use one after another without
//! the guest seeing a disconnect.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::pty::openpty;
use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
use space_proto::{ExecSpec, GuestClient};

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Forwards the "port" to whichever host connection is current, like QEMU forwarding a
/// virtio-serial port to the one socket client connected now: bytes flow only between the
/// port and the newest connection; older ones are cut off (as after a restore, where the old
/// host belongs to a VMM that no longer exists).
struct Host {
    master: Arc<std::fs::File>,
    current: Arc<Mutex<Option<StdUnixStream>>>,
    generation: Arc<std::sync::atomic::AtomicU64>,
}

impl Host {
    fn new(master: OwnedFd) -> Host {
        let master = Arc::new(std::fs::File::from(master));
        let current: Arc<Mutex<Option<StdUnixStream>>> = Arc::new(Mutex::new(None));
        let (m, cur) = (master.clone(), current.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            loop {
                let n = match (&*m).read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if let Some(s) = cur.lock().unwrap().as_mut() {
                    let _ = s.write_all(&buf[..n]);
                }
            }
        });
        Host {
            master,
            current,
            generation: Default::default(),
        }
    }

    /// The current host goes away (its VMM is gone): until the next one connects, what the
    /// guest writes is dropped, as QEMU drops a port's output while no client is connected.
    fn disconnect(&self) {
        use std::sync::atomic::Ordering;
        self.generation.fetch_add(1, Ordering::SeqCst);
        *self.current.lock().unwrap() = None;
    }

    /// A new host connection; bytes from the guest go only to the newest one.
    async fn connect(&self) -> GuestClient {
        use std::sync::atomic::Ordering;
        let (ours, theirs) = StdUnixStream::pair().unwrap();
        let mut reader = theirs.try_clone().unwrap();
        let me = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        *self.current.lock().unwrap() = Some(theirs);
        let (m, generation) = (self.master.clone(), self.generation.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            loop {
                let n = match reader.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                if generation.load(Ordering::SeqCst) != me {
                    return;
                }
                if (&*m).write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        });
        ours.set_nonblocking(true).unwrap();
        let stream = tokio::net::UnixStream::from_std(ours).unwrap();
        GuestClient::connect(stream).await.unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_host_connection_takes_over_the_port() {
    let pty = openpty(None, None).unwrap();
    let mut t = tcgetattr(&pty.slave).unwrap();
    cfmakeraw(&mut t);
    tcsetattr(&pty.slave, SetArg::TCSANOW, &t).unwrap();
    let slave_path =
        std::fs::read_link(format!("/proc/self/fd/{}", pty.slave.as_raw_fd())).unwrap();
    let _daemon = Guard(
        Command::new(env!("CARGO_BIN_EXE_space-guestd"))
            .arg("--device")
            .arg(&slave_path)
            .env(
                "SPACE_GUESTD_LOG",
                std::env::var("PORT_TEST_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let host = Host::new(pty.master);

    // Stale bytes on the port before the first preface are skipped.
    (&*host.master)
        .write_all(b"stale bytes from a previous life\x00\xff")
        .unwrap();

    let first = host.connect().await;
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
            let next = host.connect().await;
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
