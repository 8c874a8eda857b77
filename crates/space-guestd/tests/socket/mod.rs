//! The daemon under test, on a Unix socket, and what its tests share.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use space_proto::{ClientError, ErrorKind, GuestClient};
use tokio::net::UnixStream;

/// The daemon under test; killed when dropped, even if the test panics.
pub struct Daemon {
    pub child: Child,
    pub sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    pub fn start() -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("guestd.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_space-guestd"))
            .arg("--listen")
            .arg(&sock)
            .env("SPACE_GUESTD_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        // The socket file appears at `bind`, a moment before the daemon listens on it: wait
        // until a connection is accepted (that probe connection is dropped at once).
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(Instant::now() < deadline, "daemon did not start listening");
            std::thread::sleep(Duration::from_millis(5));
        }
        Daemon {
            child,
            sock,
            _dir: dir,
        }
    }

    pub async fn client(&self) -> GuestClient {
        let stream = UnixStream::connect(&self.sock).await.unwrap();
        GuestClient::connect(stream).await.unwrap()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Deterministic pseudo-random bytes.
pub fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn sha(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

pub fn guest_kind(r: Result<impl std::fmt::Debug, ClientError>) -> (ErrorKind, String) {
    match r {
        Err(ClientError::Guest(e)) => (e.kind, e.message),
        other => panic!("expected a guest error, got {other:?}"),
    }
}

/// A raw HTTP/2 client, to send what the real client never would.
pub async fn raw_h2(
    sock: &std::path::Path,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let stream = UnixStream::connect(sock).await.unwrap();
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    sender
}
