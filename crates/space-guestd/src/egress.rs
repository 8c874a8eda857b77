//! The guest end of the egress channel: an HTTP/2 client over the `space.egress` port (or,
//! outside a VM, a Unix socket), which the in-guest proxy ([`crate::proxy`]) uses for one
//! request per client connection. The host serves; see `docs/egress.md`.
//!
//! The port keeps bytes across host reconnects, snapshots and restores, so each new HTTP/2
//! connection starts with a synchronisation line: the guest writes `SPACE-EGRESS/1 <token>\n`
//! with a fresh random token, the host answers with the same line, and the guest discards
//! whatever it reads before that answer (bounded). The connection is made lazily on first use
//! and made again after every identity step ([`Egress::reset`]: after a restore the old one is
//! dead) and after any connection failure.
//!
//! On the port, the descriptor is opened once and kept; each HTTP/2 connection reads and writes
//! it under a generation number, and starting a new connection (or a reset) bumps the
//! generation, so an old connection that is still being torn down can neither take the new
//! connection's bytes nor write into it.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::UnixStream;
use tokio::task::JoinHandle;

use space_proto::sync::{sync_line, SyncScanner};

use crate::daemon::Daemon;
use crate::sys::{raw_read, raw_write};
use crate::transport::{find_port, Port};

/// Name of the egress virtio-serial port.
pub const PORT_NAME: &str = "space.egress";
/// Where the in-guest proxy listens by default (IPv4 loopback only).
pub const DEFAULT_PROXY_ADDR: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 3128));
/// Longest a new connection may take: waiting for the host, the line, the HTTP/2 start.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a port without a host is re-checked while a connection waits for one.
const HOST_POLL: Duration = Duration::from_millis(20);

/// Request body type of the egress client.
pub type ReqBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Why no egress connection could be had.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error("cannot reach the egress channel: {0}")]
    Io(#[from] io::Error),
    #[error("the host did not answer the synchronisation line within {0:?}")]
    Timeout(Duration),
    #[error("waiting for the host's synchronisation line: {0}")]
    TooMuchNoise(#[from] space_proto::sync::TooMuchNoise),
    #[error("the egress channel closed during synchronisation")]
    ClosedDuringHandshake,
    #[error("HTTP/2 to the egress gateway failed: {0}")]
    Http(#[from] hyper::Error),
}

/// Writes the line for a fresh token and reads until the host echoes it; returns the bytes
/// that followed the echo (the start of the host's HTTP/2 stream).
pub async fn synchronise<IO>(io: &mut IO) -> Result<BytesMut, EgressError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let token: [u8; 16] = rand::random();
    let line = sync_line(&token);
    io.write_all(&line).await?;
    io.flush().await?;
    let mut scanner = SyncScanner::exact(line);
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = io.read(&mut buf).await?;
        if n == 0 {
            return Err(EgressError::ClosedDuringHandshake);
        }
        if let Some((_, rest)) = scanner.push(&buf[..n])? {
            return Ok(rest);
        }
    }
}

/// The open egress port, shared by the connections made over it one after the other.
pub struct PortLink {
    port: Port,
    /// The generation allowed to read and write; see the module documentation.
    generation: Mutex<u64>,
}

impl PortLink {
    /// Wraps an opened port.
    pub fn new(port: Port) -> PortLink {
        PortLink {
            port,
            generation: Mutex::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.generation.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends whatever connection uses the port now.
    fn invalidate(&self) {
        *self.lock() += 1;
    }

    /// Waits until a host is connected, then starts a new generation on the port.
    async fn open(self: &Arc<Self>) -> io::Result<PortStream> {
        while self.port.hung_up() {
            tokio::time::sleep(HOST_POLL).await;
        }
        let generation = {
            let mut g = self.lock();
            *g += 1;
            *g
        };
        Ok(PortStream {
            io: self.port.register()?,
            link: self.clone(),
            generation,
        })
    }
}

/// One connection's view of the egress port. Reads end (end-of-file) when the host goes away
/// or a newer generation starts; writes then fail.
struct PortStream {
    link: Arc<PortLink>,
    io: AsyncFd<OwnedFd>,
    generation: u64,
}

impl PortStream {
    /// See `PortConn::after_would_block` in the transport: a registration that saw a hang-up
    /// reports readiness forever and is replaced once the host is back.
    fn after_would_block(&mut self, hung_up: bool, cx: &mut Context<'_>) -> io::Result<()> {
        if hung_up {
            self.io = self.link.port.register()?;
            cx.waker().wake_by_ref();
        }
        Ok(())
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let link = this.link.clone();
        loop {
            let mut guard = ready!(this.io.poll_read_ready(cx))?;
            let hung_up = guard.ready().is_read_closed();
            let result = {
                let current = link.lock();
                if *current != this.generation {
                    return Poll::Ready(Ok(()));
                }
                let dst = buf.initialize_unfilled();
                guard.try_io(|fd| raw_read(fd.as_raw_fd(), dst))
            };
            match result {
                Ok(Ok(n)) => {
                    // Zero means the host went away: end-of-file for this connection.
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => this.after_would_block(hung_up, cx)?,
            }
        }
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let link = this.link.clone();
        loop {
            let mut guard = ready!(this.io.poll_write_ready(cx))?;
            let hung_up = guard.ready().is_write_closed();
            let result = {
                let current = link.lock();
                if *current != this.generation {
                    return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
                }
                guard.try_io(|fd| raw_write(fd.as_raw_fd(), data))
            };
            match result {
                Ok(Ok(n)) => return Poll::Ready(Ok(n)),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {
                    // Writes block while no host is connected: this connection is over.
                    if link.port.hung_up() {
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
        Poll::Ready(Ok(()))
    }
}

/// Where the daemon finds its egress channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The virtio-serial port of this name (in a VM).
    PortName(String),
    /// This character device.
    Device(PathBuf),
    /// This Unix socket (outside a VM).
    Unix(PathBuf),
}

/// Brings egress up: waits for the channel (a port that does not exist yet is looked for
/// every second), then serves the proxy on `addr` for good. Processes get the proxy settings
/// from then on.
pub async fn start(daemon: Arc<Daemon>, source: Source, addr: SocketAddr) {
    let uplink = match source {
        Source::Unix(path) => Uplink::Unix(path),
        Source::PortName(_) | Source::Device(_) => {
            let mut complained = false;
            loop {
                let path = match &source {
                    Source::Device(p) => Some(p.clone()),
                    Source::PortName(name) => find_port(name),
                    Source::Unix(_) => None,
                };
                let opened = path.as_deref().map(Port::open);
                match opened {
                    Some(Ok(port)) => {
                        tracing::info!("egress channel on {}", path.unwrap_or_default().display());
                        break Uplink::Port(Arc::new(PortLink::new(port)));
                    }
                    Some(Err(e)) if !complained => {
                        tracing::warn!("cannot open the egress port: {e}; retrying every second");
                        complained = true;
                    }
                    _ => {}
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    // Processes learn about the proxy from now on; it listens a moment later.
    let egress = Arc::new(Egress::new(uplink, addr));
    let _ = daemon.egress.set(egress.clone());
    let listener = crate::proxy::bind(addr).await;
    crate::proxy::serve(listener, egress).await;
}

/// A byte stream that first replays bytes read ahead of it.
struct Prefixed<IO> {
    prefix: BytesMut,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A byte stream of any kind.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// Where the egress channel goes.
pub enum Uplink {
    /// The `space.egress` port of a VM.
    Port(Arc<PortLink>),
    /// A Unix socket served by a host-side stand-in (tests, runs outside a VM): every
    /// connection is a new socket connection.
    Unix(PathBuf),
}

struct Conn {
    sender: SendRequest<ReqBody>,
    epoch: u64,
    driver: JoinHandle<()>,
}

/// The egress client: hands out the current HTTP/2 connection, making a new one as needed.
pub struct Egress {
    uplink: Uplink,
    /// Where the in-guest proxy listens (for the environment of processes).
    pub proxy_addr: SocketAddr,
    conn: tokio::sync::Mutex<Option<Conn>>,
    /// Bumped by every reset; a connection of an older epoch is not used again.
    epoch: AtomicU64,
}

impl Egress {
    /// An egress client over `uplink`; nothing is connected until first use.
    pub fn new(uplink: Uplink, proxy_addr: SocketAddr) -> Egress {
        Egress {
            uplink,
            proxy_addr,
            conn: tokio::sync::Mutex::new(None),
            epoch: AtomicU64::new(0),
        }
    }

    /// The proxy URL processes are given.
    pub fn proxy_url(&self) -> String {
        format!("http://{}", self.proxy_addr)
    }

    /// Drops the current connection (its streams fail) so the next use synchronises anew.
    /// Called after every identity step: after a restore, the old connection is dead.
    pub async fn reset(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if let Uplink::Port(link) = &self.uplink {
            link.invalidate();
        }
        if let Some(conn) = self.conn.lock().await.take() {
            conn.driver.abort();
        }
    }

    /// Marks the connection of `epoch` as failed, unless a newer one already replaced it.
    fn fail_epoch(&self, epoch: u64) {
        let _ = self
            .epoch
            .compare_exchange(epoch, epoch + 1, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// A sender on a live connection, and the epoch it belongs to.
    async fn sender(&self) -> Result<(SendRequest<ReqBody>, u64), EgressError> {
        let mut slot = self.conn.lock().await;
        let epoch = self.epoch.load(Ordering::SeqCst);
        if let Some(c) = slot.as_ref() {
            if c.epoch == epoch && !c.sender.is_closed() {
                return Ok((c.sender.clone(), epoch));
            }
        }
        if let Some(old) = slot.take() {
            old.driver.abort();
        }
        let conn = match tokio::time::timeout(CONNECT_TIMEOUT, self.connect(epoch)).await {
            Ok(r) => r?,
            Err(_) => return Err(EgressError::Timeout(CONNECT_TIMEOUT)),
        };
        let sender = conn.sender.clone();
        *slot = Some(conn);
        Ok((sender, epoch))
    }

    async fn connect(&self, epoch: u64) -> Result<Conn, EgressError> {
        let mut io: Box<dyn Stream> = match &self.uplink {
            Uplink::Unix(path) => Box::new(UnixStream::connect(path).await?),
            Uplink::Port(link) => Box::new(link.open().await?),
        };
        let rest = synchronise(&mut io).await?;
        let io = Prefixed { prefix: rest, io };
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .initial_stream_window_size(1024 * 1024)
            .initial_connection_window_size(8 * 1024 * 1024)
            .max_frame_size(256 * 1024)
            .max_header_list_size(64 * 1024)
            .max_send_buf_size(256 * 1024);
        let (sender, conn) = builder.handshake(TokioIo::new(io)).await?;
        let driver = tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("egress connection ended: {e}");
            }
        });
        tracing::debug!("egress connection {epoch} synchronised");
        Ok(Conn {
            sender,
            epoch,
            driver,
        })
    }

    /// Sends one request. A request that never left because the connection had died is sent
    /// once more on a fresh connection.
    pub async fn send(&self, req: Request<ReqBody>) -> Result<Response<Incoming>, EgressError> {
        let mut req = req;
        let mut retried = false;
        loop {
            let (mut sender, epoch) = self.sender().await?;
            if sender.ready().await.is_err() {
                self.fail_epoch(epoch);
                if retried {
                    return Err(EgressError::ClosedDuringHandshake);
                }
                retried = true;
                continue;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => {
                    let unsent = e.take_message();
                    let err = e.into_error();
                    match unsent {
                        Some(r) if !retried => {
                            self.fail_epoch(epoch);
                            retried = true;
                            req = r;
                        }
                        _ => {
                            if sender.is_closed() {
                                self.fail_epoch(epoch);
                            }
                            return Err(EgressError::Http(err));
                        }
                    }
                }
            }
        }
    }

    /// Gives up on the current connection, so the next request synchronises anew. Used when a
    /// request went unanswered for too long: a host that reconnected without the guest
    /// noticing discards everything until it sees a new synchronisation line.
    pub fn abandon_current(&self) {
        let epoch = self.epoch.load(Ordering::SeqCst);
        self.fail_epoch(epoch);
        if let Uplink::Port(link) = &self.uplink {
            link.invalidate();
        }
    }
}
