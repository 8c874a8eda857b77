//! How the host reaches the daemon: HTTP/2 server connections over a Unix socket (tests, runs
//! outside a VM) or over the `space.ctl` virtio-serial port (in a VM).
//!
//! A virtio-serial port is not a socket. The guest holds one descriptor for the life of the
//! VM while host-side connections come and go: on every snapshot restore a brand-new host
//! client connects to the same guest descriptor. The port reads end-of-file while no host is
//! connected and starts delivering bytes when one connects. So the port loop is:
//!
//! 1. wait, without spinning, until bytes arrive: a read of 0 means no host; the daemon then
//!    sleeps until SIGIO (the driver signals connects and data when `O_ASYNC` is set) or a
//!    20 ms fallback tick, whichever comes first (see [`Port`] for why a hang-up must never
//!    be waited on through the reactor);
//! 2. discard bytes until the HTTP/2 client preface, so stale bytes from a previous host
//!    cannot poison the new connection;
//! 3. serve one HTTP/2 connection, replaying the preface to hyper;
//! 4. when that connection ends (host gone, protocol error, GOAWAY), go back to 1.
//!
//! A restored guest may not notice that its old host went away before the new one connects,
//! so the new host's preface can arrive inside the old connection's byte stream. The
//! connection wrapper tracks HTTP/2 frame boundaries and recognises a frame header that is
//! really the start of a preface (its length field, 0x505249, exceeds any frame size we allow,
//! so no legitimate frame looks like that). It then ends the old connection — reads return
//! end-of-file, writes fail so the old connection's GOAWAY never reaches the new host — and
//! hands the preface and what follows to the next connection. Bytes the old connection wrote
//! after the new host connected but before the preface was seen can still reach the new host;
//! the host side handles that by reconnecting when its first request fails (see
//! `docs/protocol.md`).

use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::daemon::Daemon;
use crate::sys::{raw_read, raw_write};

/// The HTTP/2 client connection preface.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Largest HTTP/2 frame the daemon accepts. Must stay below 0x505249, the length a frame
/// header would have if it were the start of a preface.
const MAX_FRAME_SIZE: u32 = 256 * 1024;
/// How often a disconnected port is re-checked when no signal arrives.
const DISCONNECTED_POLL: Duration = Duration::from_millis(20);
/// Longest a started HTTP/2 frame may stay incomplete while nothing more can be read. A host
/// writes each frame whole, so a frame still incomplete after this long was cut off: its host
/// went away mid-frame (or the guest was restored from a snapshot taken mid-frame). A host
/// that reconnects at once is not seen to leave (the port never reads end-of-file), and
/// without this bound its preface would be taken for the rest of the dead host's frame.
const FRAME_DEADLINE: Duration = Duration::from_secs(3);

/// Transport failures that stop serving.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("cannot listen on {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot install the SIGIO handler")]
    Signal(#[source] io::Error),
}

/// Serves one HTTP/2 connection over `io` until it ends.
pub async fn serve_io<IO>(io: IO, daemon: Arc<Daemon>) -> Result<(), hyper::Error>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .max_concurrent_streams(2048)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_header_list_size(64 * 1024)
        .initial_stream_window_size(1024 * 1024)
        .initial_connection_window_size(8 * 1024 * 1024)
        .max_send_buf_size(256 * 1024);
    let service = service_fn(move |req| {
        let d = daemon.clone();
        async move { Ok::<_, std::convert::Infallible>(crate::server::handle(d, req).await) }
    });
    builder.serve_connection(TokioIo::new(io), service).await
}

/// Serves every connection accepted on a Unix socket (no PID-1 or port specifics).
pub async fn serve_unix(path: &Path, daemon: Arc<Daemon>) -> Result<(), TransportError> {
    if std::fs::symlink_metadata(path).is_ok() {
        let _ = std::fs::remove_file(path);
    }
    let listener = UnixListener::bind(path).map_err(|source| TransportError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    tracing::info!("listening on {}", path.display());
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let d = daemon.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_io(stream, d.clone()).await {
                        d.warn_limited("connection ended", &e);
                    }
                });
            }
            Err(e) => {
                // Out of descriptors or similar: back off instead of spinning.
                daemon.warn_limited("accept", &e);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Finds the device of the virtio-serial port called `name`.
pub fn find_port(name: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir("/sys/class/virtio-ports").ok()?;
    for entry in entries.flatten() {
        let Ok(port_name) = std::fs::read_to_string(entry.path().join("name")) else {
            continue;
        };
        if port_name.trim_end() == name {
            return Some(Path::new("/dev").join(entry.file_name()));
        }
    }
    None
}

/// The open port.
///
/// The descriptor itself is never registered with the reactor. Tokio takes a hang-up
/// (`EPOLLHUP`) as final: once its reactor has seen one, the registration reports the
/// descriptor readable and writable forever, and readiness can no longer be waited for. A
/// port reports a hang-up whenever no host is connected — after every disconnect, and on
/// every snapshot restore until the new host connects — and then carries on with the next
/// host. So each wait uses a registration of its own (a duplicate of the descriptor) and a
/// registration that reported a hang-up is replaced once the host is back, never reused.
pub struct Port {
    fd: OwnedFd,
}

impl Port {
    pub fn open(path: &Path) -> io::Result<Port> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)?;
        let fd = OwnedFd::from(file);
        // Deliver SIGIO to this process on host connect/disconnect and on data.
        // SAFETY: F_SETOWN takes a plain pid argument; the descriptor is open.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETOWN, libc::getpid()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Port { fd })
    }

    /// A new reactor registration of the port, with readiness as it is now.
    pub(crate) fn register(&self) -> io::Result<AsyncFd<OwnedFd>> {
        crate::sys::register(self.fd.try_clone()?)
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn set_async(&self, on: bool) {
        let raw = self.raw();
        if let Ok(flags) = fcntl(raw, FcntlArg::F_GETFL) {
            let mut flags = OFlag::from_bits_truncate(flags);
            flags.set(OFlag::O_ASYNC, on);
            let _ = fcntl(raw, FcntlArg::F_SETFL(flags));
        }
    }

    /// Whether the host side is gone (POLLHUP), checked without blocking.
    pub(crate) fn hung_up(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.raw(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd that lives across the call; a zero timeout makes
        // the call non-blocking.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0 && pfd.revents & libc::POLLHUP != 0
    }
}

/// Waits for something to change: SIGIO, an edge on `reg` (if any), or the fallback tick.
/// Returns true if `reg` reported a hang-up, which makes it useless for further waits.
async fn wait_event(
    sigio: &mut Signal,
    reg: Option<&AsyncFd<OwnedFd>>,
    fallback: Duration,
) -> bool {
    let readable = async {
        match reg {
            Some(reg) => match reg.readable().await {
                Ok(mut guard) => {
                    let hung_up = guard.ready().is_read_closed();
                    guard.clear_ready();
                    hung_up
                }
                Err(_) => true,
            },
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        hung_up = readable => hung_up,
        _ = sigio.recv() => false,
        _ = tokio::time::sleep(fallback) => false,
    }
}

/// Serves the virtio-serial port forever: finds it, opens it, serves connection after
/// connection, and starts over if the device fails (e.g. hot-unplug).
pub async fn serve_port(
    name: &str,
    device: Option<PathBuf>,
    daemon: Arc<Daemon>,
) -> Result<(), TransportError> {
    // Installed before O_ASYNC is ever set: SIGIO's default action would kill the daemon.
    let mut sigio = signal(SignalKind::io()).map_err(TransportError::Signal)?;
    let mut complained = false;
    loop {
        let Some(path) = device.clone().or_else(|| find_port(name)) else {
            if !complained {
                tracing::warn!("no virtio-serial port named {name}; retrying every second");
                complained = true;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        match Port::open(&path) {
            Ok(port) => {
                tracing::info!("serving on {}", path.display());
                complained = false;
                let e = serve_port_fd(Arc::new(port), &mut sigio, &daemon).await;
                tracing::warn!("port {} failed: {e}; reopening", path.display());
            }
            Err(e) => {
                if !complained {
                    tracing::warn!("cannot open {}: {e}; retrying every second", path.display());
                    complained = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn serve_port_fd(port: Arc<Port>, sigio: &mut Signal, daemon: &Arc<Daemon>) -> io::Error {
    let mut carry = BytesMut::new();
    let mut number = 0u64;
    loop {
        port.set_async(true);
        let leftover = match wait_for_preface(&port, carry, sigio).await {
            Ok(b) => b,
            Err(e) => return e,
        };
        port.set_async(false);
        number += 1;
        let conn = match PortConn::new(port.clone(), leftover) {
            Ok(c) => c,
            Err(e) => return e,
        };
        let carry_slot = conn.carry.clone();
        if let Err(e) = serve_io(conn, daemon.clone()).await {
            daemon.warn_limited(
                &format!("control connection {number} ended"),
                &ErrorChain(&e),
            );
        }
        carry = std::mem::take(&mut *carry_slot.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

/// Displays an error followed by its sources (hyper's own text is often just "connection
/// error").
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

/// Position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Reads until a complete preface; returns the bytes after it.
async fn wait_for_preface(
    port: &Port,
    mut window: BytesMut,
    sigio: &mut Signal,
) -> io::Result<BytesMut> {
    let mut buf = vec![0u8; 16 * 1024];
    // Only while a host is connected (a registration made while none is would report a
    // hang-up from the start); dropped when it reports one.
    let mut reg: Option<AsyncFd<OwnedFd>> = None;
    loop {
        if let Some(pos) = find(&window, PREFACE) {
            return Ok(window.split_off(pos + PREFACE.len()));
        }
        // Only a tail shorter than the preface can still be the start of one.
        if window.len() >= PREFACE.len() {
            window.advance(window.len() - (PREFACE.len() - 1));
        }
        match raw_read(port.raw(), &mut buf) {
            Ok(0) => {
                // No host connected: SIGIO announces the next one.
                window.clear();
                reg = None;
                wait_event(sigio, None, DISCONNECTED_POLL).await;
            }
            Ok(n) => window.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // A host is connected and has sent nothing more yet.
                let current = match reg.take() {
                    Some(r) => r,
                    None => port.register()?,
                };
                if !wait_event(sigio, Some(&current), Duration::from_secs(1)).await {
                    reg = Some(current);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Follows HTTP/2 frame boundaries in the bytes a connection receives, to spot a new client's
/// preface where a frame header should be.
#[derive(Debug)]
pub struct FrameTracker {
    header: [u8; 9],
    have: usize,
    payload_left: usize,
    /// Frames whose first header byte was seen.
    started: u64,
}

/// Result of scanning a chunk.
#[derive(Debug, PartialEq, Eq)]
pub enum Scan {
    /// All bytes belong to the current connection.
    Clean,
    /// A new client's preface starts in this chunk (or straddles into it). `deliver` bytes
    /// still belong to the current connection; the new connection starts with the first nine
    /// preface bytes followed by the chunk from `rest` on.
    NewClient { deliver: usize, rest: usize },
}

impl Default for FrameTracker {
    fn default() -> Self {
        FrameTracker::new()
    }
}

impl FrameTracker {
    /// A tracker positioned just after the preface, at the first frame header.
    pub fn new() -> FrameTracker {
        FrameTracker {
            header: [0; 9],
            have: 0,
            payload_left: 0,
            started: 0,
        }
    }

    /// Whether the bytes scanned so far end inside a frame (its header or its payload).
    pub fn mid_frame(&self) -> bool {
        self.have > 0 || self.payload_left > 0
    }

    /// How many frames have started so far.
    pub fn started(&self) -> u64 {
        self.started
    }

    pub fn scan(&mut self, data: &[u8]) -> Scan {
        let mut i = 0;
        while i < data.len() {
            if self.payload_left > 0 {
                let take = self.payload_left.min(data.len() - i);
                self.payload_left -= take;
                i += take;
                continue;
            }
            let started_here = self.have == 0;
            if started_here {
                self.started += 1;
            }
            let start = i;
            let take = (9 - self.have).min(data.len() - i);
            self.header[self.have..self.have + take].copy_from_slice(&data[i..i + take]);
            self.have += take;
            i += take;
            if self.have < 9 {
                continue;
            }
            self.have = 0;
            if self.header == PREFACE[..9] {
                return Scan::NewClient {
                    deliver: if started_here { start } else { 0 },
                    rest: i,
                };
            }
            self.payload_left =
                u32::from_be_bytes([0, self.header[0], self.header[1], self.header[2]]) as usize;
        }
        Scan::Clean
    }
}

/// One HTTP/2 connection's view of the port.
struct PortConn {
    port: Arc<Port>,
    /// This connection's reactor registration of the port.
    io: AsyncFd<OwnedFd>,
    /// How much of the preface has been replayed to hyper.
    preface_sent: usize,
    /// Bytes read from the port not yet given to hyper.
    pending: BytesMut,
    tracker: FrameTracker,
    scratch: Box<[u8]>,
    /// End-of-file was (or is to be) reported: the host left or a new one arrived.
    ended: bool,
    /// A new host's bytes, for the next connection.
    carry: Arc<Mutex<BytesMut>>,
    /// Runs while the bytes delivered so far end inside a frame; restarted by every new frame.
    frame_timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl PortConn {
    fn new(port: Arc<Port>, leftover: BytesMut) -> io::Result<PortConn> {
        Ok(PortConn {
            io: port.register()?,
            port,
            preface_sent: 0,
            pending: leftover,
            tracker: FrameTracker::new(),
            scratch: vec![0u8; 64 * 1024].into_boxed_slice(),
            ended: false,
            carry: Arc::new(Mutex::new(BytesMut::new())),
            frame_timer: None,
        })
    }

    /// Handles a read or write that would block although the registration called the port
    /// ready. If the registration has seen a hang-up it reports readiness forever (see
    /// [`Port`]); as the host is back (the call would block rather than fail or read
    /// end-of-file), a fresh registration replaces it. The task is woken so that it polls
    /// both directions against the new registration: wakers left on the old one are lost.
    fn after_would_block(&mut self, hung_up: bool, cx: &mut Context<'_>) -> io::Result<()> {
        if hung_up {
            self.io = self.port.register()?;
            cx.waker().wake_by_ref();
        }
        Ok(())
    }

    /// Starts, restarts or stops the frame timer after a scan that began with `started_before`
    /// frames started.
    fn track_frame_progress(&mut self, started_before: u64) {
        if !self.tracker.mid_frame() {
            self.frame_timer = None;
        } else if self.frame_timer.is_none() || self.tracker.started() != started_before {
            self.frame_timer = Some(Box::pin(tokio::time::sleep(FRAME_DEADLINE)));
        }
    }
}

impl AsyncRead for PortConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(Ok(()));
        }
        if this.preface_sent < PREFACE.len() {
            let n = (PREFACE.len() - this.preface_sent).min(buf.remaining());
            buf.put_slice(&PREFACE[this.preface_sent..this.preface_sent + n]);
            this.preface_sent += n;
            return Poll::Ready(Ok(()));
        }
        if this.pending.is_empty() {
            loop {
                let mut guard = match this.io.poll_read_ready(cx) {
                    Poll::Ready(r) => r?,
                    Poll::Pending => {
                        let expired = match this.frame_timer.as_mut() {
                            Some(timer) => timer.as_mut().poll(cx).is_ready(),
                            None => false,
                        };
                        if expired {
                            // The frame in progress will never complete: end the connection
                            // so the next host is looked for from its preface on.
                            this.ended = true;
                            return Poll::Ready(Ok(()));
                        }
                        return Poll::Pending;
                    }
                };
                let hung_up = guard.ready().is_read_closed();
                let scratch = &mut this.scratch;
                match guard.try_io(|fd| raw_read(fd.as_raw_fd(), scratch)) {
                    Ok(Ok(0)) => {
                        // The host disconnected.
                        this.ended = true;
                        return Poll::Ready(Ok(()));
                    }
                    Ok(Ok(n)) => {
                        this.pending.extend_from_slice(&this.scratch[..n]);
                        break;
                    }
                    Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                    Ok(Err(e)) => return Poll::Ready(Err(e)),
                    Err(_would_block) => this.after_would_block(hung_up, cx)?,
                }
            }
        }
        let n = this.pending.len().min(buf.remaining());
        let started_before = this.tracker.started();
        match this.tracker.scan(&this.pending[..n]) {
            Scan::Clean => {
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                this.track_frame_progress(started_before);
            }
            Scan::NewClient { deliver, rest } => {
                buf.put_slice(&this.pending[..deliver]);
                let mut carry = BytesMut::with_capacity(9 + this.pending.len() - rest);
                carry.extend_from_slice(&PREFACE[..9]);
                carry.extend_from_slice(&this.pending[rest..]);
                *this.carry.lock().unwrap_or_else(|p| p.into_inner()) = carry;
                this.pending.clear();
                this.ended = true;
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for PortConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.ended {
            // Whatever is on the other end now is not this connection's host.
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        loop {
            let mut guard = ready!(this.io.poll_write_ready(cx))?;
            let hung_up = guard.ready().is_write_closed();
            match guard.try_io(|fd| raw_write(fd.as_raw_fd(), data)) {
                Ok(Ok(n)) => return Poll::Ready(Ok(n)),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {
                    // Writes block while no host is connected; fail them instead, the
                    // connection is over.
                    if this.port.hung_up() {
                        this.ended = true;
                        return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
                    }
                    this.after_would_block(hung_up, cx)?;
                }
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // A port cannot be half-closed; the host sees the connection end when we stop.
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize, ty: u8) -> Vec<u8> {
        let mut f = vec![
            (len >> 16) as u8,
            (len >> 8) as u8,
            len as u8,
            ty,
            0,
            0,
            0,
            0,
            1,
        ];
        f.extend(std::iter::repeat_n(0xAB, len));
        f
    }

    #[test]
    fn tracker_passes_ordinary_frames() {
        let mut t = FrameTracker::new();
        let mut bytes = frame(6, 4);
        bytes.extend(frame(0, 4));
        // A payload that contains preface text must not trigger.
        let mut data = frame(PREFACE.len(), 0);
        data[9..].copy_from_slice(PREFACE);
        bytes.extend(data);
        for chunk in bytes.chunks(5) {
            assert_eq!(t.scan(chunk), Scan::Clean);
        }
    }

    #[test]
    fn tracker_spots_a_new_preface_at_a_frame_boundary() {
        let mut bytes = frame(3, 0);
        let boundary = bytes.len();
        bytes.extend_from_slice(PREFACE);
        bytes.extend(frame(0, 4));
        // Whole chunk.
        let mut t = FrameTracker::new();
        assert_eq!(
            t.scan(&bytes),
            Scan::NewClient {
                deliver: boundary,
                rest: boundary + 9
            }
        );
        // Split inside the preface's first nine bytes.
        for split in boundary + 1..boundary + 9 {
            let mut t = FrameTracker::new();
            assert_eq!(t.scan(&bytes[..split]), Scan::Clean);
            assert_eq!(
                t.scan(&bytes[split..]),
                Scan::NewClient {
                    deliver: 0,
                    rest: boundary + 9 - split
                }
            );
        }
    }

    #[test]
    fn tracker_knows_when_it_is_inside_a_frame() {
        let mut t = FrameTracker::new();
        assert!(!t.mid_frame());
        let bytes = frame(10, 0);
        assert_eq!(t.scan(&bytes[..4]), Scan::Clean);
        assert!(t.mid_frame());
        assert_eq!(t.scan(&bytes[4..12]), Scan::Clean);
        assert!(t.mid_frame());
        assert_eq!(t.started(), 1);
        assert_eq!(t.scan(&bytes[12..]), Scan::Clean);
        assert!(!t.mid_frame());
        assert_eq!(t.scan(&frame(0, 4)), Scan::Clean);
        assert!(!t.mid_frame());
        assert_eq!(t.started(), 2);
    }

    #[test]
    fn preface_length_exceeds_our_frame_limit() {
        let len = u32::from_be_bytes([0, PREFACE[0], PREFACE[1], PREFACE[2]]);
        assert!(len > MAX_FRAME_SIZE);
    }

    #[test]
    fn find_locates_preface_after_garbage() {
        let mut hay = b"garbage\x00\xff".to_vec();
        hay.extend_from_slice(PREFACE);
        assert_eq!(find(&hay, PREFACE), Some(9));
        assert_eq!(find(b"PRI * HTTP", PREFACE), None);
    }
}
