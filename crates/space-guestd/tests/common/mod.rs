//! A stand-in for a virtio-serial port, shared by the tests that run the daemon on its
//! `--device` / `--egress-device` code path: a pseudo-terminal in raw mode is the port (one
//! descriptor the daemon keeps open), and [`PortBridge`] plays QEMU, forwarding it to whichever
//! host connection is current.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::pty::openpty;
use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};

/// A pseudo-terminal in raw mode: the daemon opens `slave_path`, the bridge holds `master`.
pub struct RawPty {
    pub master: OwnedFd,
    /// Kept open for the test's lifetime so the terminal does not hang up.
    pub slave: OwnedFd,
    pub slave_path: PathBuf,
}

/// Opens a pseudo-terminal and puts it in raw mode (no echo, no line editing), so bytes pass
/// as they would through a port.
pub fn raw_pty() -> RawPty {
    let pty = openpty(None, None).unwrap();
    let mut t = tcgetattr(&pty.slave).unwrap();
    cfmakeraw(&mut t);
    tcsetattr(&pty.slave, SetArg::TCSANOW, &t).unwrap();
    let slave_path =
        std::fs::read_link(format!("/proc/self/fd/{}", pty.slave.as_raw_fd())).unwrap();
    RawPty {
        master: pty.master,
        slave: pty.slave,
        slave_path,
    }
}

/// Forwards the "port" to whichever host connection is current, as QEMU forwards a
/// virtio-serial port to the one socket client connected now: bytes flow only between the
/// port and the newest connection; older ones are cut off (as after a restore, where the old
/// host belongs to a VMM that no longer exists).
pub struct PortBridge {
    master: Arc<std::fs::File>,
    current: Arc<Mutex<Option<StdUnixStream>>>,
    generation: Arc<AtomicU64>,
}

impl PortBridge {
    /// Starts forwarding what the guest writes on `master` to the current connection.
    pub fn new(master: OwnedFd) -> PortBridge {
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
        PortBridge {
            master,
            current,
            generation: Default::default(),
        }
    }

    /// Writes straight onto the port, as bytes of an earlier connection would be.
    pub fn write_raw(&self, bytes: &[u8]) {
        (&*self.master).write_all(bytes).unwrap();
    }

    /// A new host connection: the host's end of it, which from now on is the only one that
    /// exchanges bytes with the port.
    pub fn connect(&self) -> tokio::net::UnixStream {
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
        tokio::net::UnixStream::from_std(ours).unwrap()
    }

    /// The current host goes away (its VMM is gone): until the next one connects, what the
    /// guest writes is dropped, as QEMU drops a port's output while no client is connected.
    pub fn disconnect(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        *self.current.lock().unwrap() = None;
    }
}
