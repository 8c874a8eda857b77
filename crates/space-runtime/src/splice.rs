//! The host's ends of a VM's guest channels (`space.ctl`, `space.egress`), kept while one
//! VMM process gives way to another with the same guest.
//!
//! A channel is a byte stream between a host client and a virtio-serial port; QEMU serves the
//! port on a Unix socket in the sandbox directory, so a client's connection ends with the QEMU
//! process. When a running guest moves to a new QEMU process (its device state saved by the
//! old one and loaded by the new one, as a lazy restore does once its files are local), a
//! [`Splice`] keeps every client's stream: the client holds one end of a socket pair and the
//! splice copies between the other end and QEMU's socket, so it can change QEMU's socket under
//! the client without a byte lost, repeated or reordered:
//!
//! 1. [`Splice::hold`] stops copying from the clients to QEMU and waits until the old QEMU has
//!    read everything already written to it. QEMU reads from a port's socket only what fits
//!    in the buffers the guest gave it, and copies what it reads into them at once, so what
//!    it read is in guest memory, which the saved state carries. Bytes the guest writes keep
//!    flowing to the clients.
//! 2. The caller stops the VM, saves its device state (bytes the guest wrote that the old QEMU
//!    could not pass on yet are part of it) and ends the old QEMU.
//! 3. [`Splice::switch`], called by the runtime once the new QEMU runs and before its state
//!    loads: each stream reads the old QEMU's socket to its end, then connects to the new
//!    QEMU's. The port is then connected when the saved state loads, as it was when it was
//!    saved, so the guest sees no disconnect.
//! 4. [`Splice::release`] lets the clients' bytes flow to the new QEMU.
//!
//! A stream whose client closes its end is closed towards QEMU (the guest sees the host go,
//! as with a direct connection); a stream whose QEMU ends while not held is closed towards
//! the client. Everything read here comes from a VMM the guest may have taken over: it is
//! only copied, never parsed.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch, OwnedMutexGuard};

use crate::{Error, Result};

/// How long [`Splice::hold`] waits for the old QEMU to read what was written to it.
pub const HOLD_TIMEOUT: Duration = Duration::from_secs(2);
/// How long [`Splice::switch`] reads an old QEMU's socket for what it wrote before it ended.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Bytes copied at a time.
const COPY_BUF: usize = 64 * 1024;

/// One client stream: the writer towards QEMU (locked while held), and how the stream's
/// reader task gets the next QEMU's socket.
struct Link {
    name: String,
    to_vmm: Arc<tokio::sync::Mutex<Option<OwnedWriteHalf>>>,
    next_reader: mpsc::UnboundedSender<OwnedReadHalf>,
    held: watch::Sender<bool>,
    /// Set when the stream ended (either side closed): it takes no part in a switch.
    ended: Arc<std::sync::atomic::AtomicBool>,
}

/// A held stream: no client byte goes to QEMU while its writer is locked here.
type HeldLink = (Arc<Link>, OwnedMutexGuard<Option<OwnedWriteHalf>>);

struct State {
    links: Vec<Arc<Link>>,
    /// The writers of the held streams, while held.
    held: Option<Vec<HeldLink>>,
}

/// The channels of one sandbox directory's VM, through whichever QEMU serves them. Cheap to
/// clone: clones share the streams.
#[derive(Clone)]
pub struct Splice {
    dir: PathBuf,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for Splice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Splice")
            .field("dir", &self.dir)
            .field("streams", &s.links.len())
            .field("held", &s.held.is_some())
            .finish()
    }
}

impl Splice {
    /// A splice for the VM of sandbox directory `dir` (no stream yet).
    pub fn new(dir: &Path) -> Splice {
        Splice {
            dir: dir.to_owned(),
            state: Arc::new(Mutex::new(State {
                links: Vec::new(),
                held: None,
            })),
        }
    }

    /// A new stream to the port QEMU serves on socket `name` in the directory. Refused while
    /// held (a new connection would reach the QEMU that is ending).
    pub async fn connect(&self, name: &str) -> Result<UnixStream> {
        if self.lock().held.is_some() {
            return Err(Error::Invalid(format!(
                "{name}: the VM is moving to a new VMM process; connect again shortly"
            )));
        }
        let vmm = crate::qemu::connect_in_dir(&self.dir, name).await?;
        let (client, ours) = UnixStream::pair().map_err(|source| Error::Io {
            op: "making a socket pair for",
            path: self.dir.join(name),
            source,
        })?;
        let (vmm_r, vmm_w) = vmm.into_split();
        let (ours_r, ours_w) = ours.into_split();
        let (next_tx, next_rx) = mpsc::unbounded_channel();
        let (held_tx, held_rx) = watch::channel(false);
        let link = Arc::new(Link {
            name: name.to_owned(),
            to_vmm: Arc::new(tokio::sync::Mutex::new(Some(vmm_w))),
            next_reader: next_tx,
            held: held_tx,
            ended: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        });
        tokio::spawn(client_to_vmm(
            ours_r,
            link.to_vmm.clone(),
            link.ended.clone(),
        ));
        tokio::spawn(vmm_to_client(
            vmm_r,
            ours_w,
            next_rx,
            held_rx,
            link.ended.clone(),
        ));
        let mut s = self.lock();
        s.links
            .retain(|l| !l.ended.load(std::sync::atomic::Ordering::Acquire));
        s.links.push(link);
        Ok(client)
    }

    /// Open streams.
    #[cfg(test)]
    fn streams(&self) -> usize {
        self.lock()
            .links
            .iter()
            .filter(|l| !l.ended.load(std::sync::atomic::Ordering::Acquire))
            .count()
    }

    /// Stops the clients' bytes towards QEMU and waits until QEMU has read all it was sent
    /// (at most [`HOLD_TIMEOUT`]; the guest must be running to take them). On an error the
    /// streams flow again.
    pub async fn hold(&self) -> Result<()> {
        let links: Vec<Arc<Link>> = {
            let mut s = self.lock();
            if s.held.is_some() {
                return Err(Error::Invalid("the channels are already held".into()));
            }
            s.links
                .retain(|l| !l.ended.load(std::sync::atomic::Ordering::Acquire));
            s.links.clone()
        };
        let deadline = Instant::now() + HOLD_TIMEOUT;
        let mut guards = Vec::new();
        let mut result = Ok(());
        for link in links {
            link.held.send_replace(true);
            // Waits for a write under way to finish (the VMM must read it); none starts after.
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, link.to_vmm.clone().lock_owned()).await {
                Ok(guard) => guards.push((link, guard)),
                Err(_) => {
                    link.held.send_replace(false);
                    result = Err(Error::Timeout(format!(
                        "waiting for the VM to take what was written to its {} channel",
                        link.name
                    )));
                    break;
                }
            }
        }
        for (link, guard) in &guards {
            if result.is_err() {
                break;
            }
            let Some(w) = guard.as_ref() else { continue };
            let fd = w.as_ref().as_raw_fd();
            loop {
                match unread(fd) {
                    Ok(0) => break,
                    Ok(n) if Instant::now() >= deadline => {
                        result = Err(Error::Timeout(format!(
                            "waiting for the VM to take {n} bytes of its {} channel",
                            link.name
                        )));
                        break;
                    }
                    Ok(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    // The VMM's end is gone: nothing more can be taken.
                    Err(_) => break,
                }
            }
        }
        self.lock().held = Some(guards);
        if result.is_err() {
            self.release();
        }
        result
    }

    /// Moves every held stream to the QEMU now serving the directory: reads what the old one
    /// wrote to its end, then connects to the new one's socket. Does nothing when not held.
    /// The streams stay held until [`Splice::release`].
    pub async fn switch(&self) -> Result<()> {
        let Some(mut held) = self.lock().held.take() else {
            return Ok(());
        };
        let mut result = Ok(());
        for (link, guard) in held.iter_mut() {
            if link.ended.load(std::sync::atomic::Ordering::Acquire) {
                continue;
            }
            match crate::qemu::connect_in_dir(&self.dir, &link.name).await {
                Ok(stream) => {
                    let (r, w) = stream.into_split();
                    **guard = Some(w);
                    // The reader task reads the old socket to its end before it takes this.
                    let _ = link.next_reader.send(r);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.lock().held = Some(held);
        result
    }

    /// Lets the clients' bytes flow again. A stream not moved by a switch whose QEMU ended is
    /// closed towards its client.
    pub fn release(&self) {
        let held = self.lock().held.take();
        for (link, guard) in held.into_iter().flatten() {
            drop(guard);
            link.held.send_replace(false);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Bytes written on `fd` (a Unix stream socket) that its peer has not read yet.
fn unread(fd: std::os::fd::RawFd) -> std::io::Result<i32> {
    let mut n: libc::c_int = 0;
    // SAFETY: `fd` is an open socket owned by the caller for the duration of the call, and
    // TIOCOUTQ (SIOCOUTQ) writes one int through the pointer, which points at `n`.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    if r == 0 {
        Ok(n)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Copies the client's bytes to the current QEMU; on the client's end, closes QEMU's side.
async fn client_to_vmm(
    mut from: OwnedReadHalf,
    to: Arc<tokio::sync::Mutex<Option<OwnedWriteHalf>>>,
    ended: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let mut w = to.lock().await;
        let Some(vmm) = w.as_mut() else { break };
        if vmm.write_all(&buf[..n]).await.is_err() {
            // QEMU's end is gone; the other direction sees it too and ends the stream.
            break;
        }
    }
    ended.store(true, std::sync::atomic::Ordering::Release);
    if let Some(mut w) = to.lock().await.take() {
        let _ = w.shutdown().await;
    }
}

/// Copies QEMU's bytes to the client. When QEMU's end closes while the stream is held, waits
/// for the next QEMU's socket; otherwise closes the client's side.
async fn vmm_to_client(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut next: mpsc::UnboundedReceiver<OwnedReadHalf>,
    mut held: watch::Receiver<bool>,
    ended: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut buf = vec![0u8; COPY_BUF];
    'stream: loop {
        let read = tokio::select! {
            r = from.read(&mut buf) => r,
            // A switch sent the next socket while the old one has not shown its end yet:
            // read the old one to its end first.
            Some(r) = next.recv() => {
                let old = std::mem::replace(&mut from, r);
                if !drain(old, &mut to, &mut buf).await {
                    break 'stream;
                }
                continue 'stream;
            }
        };
        match read {
            Ok(n) if n > 0 => {
                if to.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            _ => {
                // QEMU's end closed. Held: the next QEMU's socket comes from a switch.
                let next_reader = loop {
                    if let Ok(r) = next.try_recv() {
                        break Some(r);
                    }
                    if !*held.borrow_and_update() {
                        break None;
                    }
                    tokio::select! {
                        r = next.recv() => break r,
                        c = held.changed() => if c.is_err() { break None },
                    }
                };
                match next_reader {
                    Some(r) => from = r,
                    None => break,
                }
            }
        }
    }
    ended.store(true, std::sync::atomic::Ordering::Release);
    let _ = to.shutdown().await;
}

/// Reads `old` to its end (bounded by [`DRAIN_TIMEOUT`]) into `to`; false if the client went.
async fn drain(mut old: OwnedReadHalf, to: &mut OwnedWriteHalf, buf: &mut [u8]) -> bool {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, old.read(buf)).await {
            Ok(Ok(n)) if n > 0 => {
                if to.write_all(&buf[..n]).await.is_err() {
                    return false;
                }
            }
            _ => return true,
        }
    }
}

#[cfg(test)]
mod tests;
