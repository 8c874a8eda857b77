//! The host-side client: HTTP/2 over any byte stream to `space-guestd`.
//!
//! [`GuestClient::connect`] runs the HTTP/2 handshake and spawns the task that drives the
//! connection; the client is cheap to clone and every clone multiplexes requests over the same
//! connection. When the connection dies, every pending call and open stream fails with
//! [`ClientError::Closed`] or [`ClientError::Transport`] instead of hanging.
//!
//! A fresh connection to a guest that was just restored from a snapshot may be refused (the
//! guest can still be serving the connection of the old host); callers should bound their
//! first request with a timeout and reconnect the byte stream on failure. See
//! `docs/protocol.md`.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited, StreamBody};
use hyper::body::{Body, Frame as BodyFrame, Incoming};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use crate::error::{ErrorKind, ProtoError};
use crate::frame::{encode_chunked, Frame, FrameDecoder, FrameError, FrameKind};
use crate::limits::{MAX_JSON_BODY, MAX_XATTRS};
use crate::query::{encode_component, validate_path, validate_xattr};
use crate::routes;
use crate::types::*;

mod files;
mod processes;
mod watchers;

pub use files::{FileReader, WatchStream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of a request to the guest.
pub type GuestBody = UnsyncBoxBody<Bytes, BoxError>;
type ReqBody = GuestBody;

/// Where requests go on a direct connection: the authority is required by HTTP/2 but means
/// nothing here, the stream is the address.
const DIRECT_BASE: &str = "http://guest";

/// Every way a call can fail.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The guest answered with its structured error.
    #[error("guest refused the request: {0}")]
    Guest(ProtoError),
    /// The connection is gone (closed by either end, or its driver stopped).
    #[error("connection to the guest closed")]
    Closed,
    /// HTTP/2 failed underneath the call.
    #[error("transport failure")]
    Transport(#[source] hyper::Error),
    /// The guest sent something that does not follow the protocol.
    #[error("protocol violation by the guest: {0}")]
    Protocol(String),
    /// The request was refused locally before anything was sent.
    #[error("invalid request: {0}")]
    Invalid(ProtoError),
}

impl ClientError {
    /// The guest's (or local validation's) error kind, if this is such an error.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            ClientError::Guest(e) | ClientError::Invalid(e) => Some(e.kind),
            _ => None,
        }
    }

    /// The structured error, if this is one.
    pub fn proto(&self) -> Option<&ProtoError> {
        match self {
            ClientError::Guest(e) | ClientError::Invalid(e) => Some(e),
            _ => None,
        }
    }

    fn from_hyper(e: hyper::Error) -> ClientError {
        if e.is_closed() || e.is_canceled() {
            ClientError::Closed
        } else {
            ClientError::Transport(e)
        }
    }

    fn from_frame(e: FrameError) -> ClientError {
        ClientError::Protocol(e.to_string())
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Connection tuning. The defaults suit a virtio-serial port.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Send HTTP/2 PINGs this often and drop the connection if one goes unanswered for as
    /// long. Off by default: a paused VM cannot answer, and pausing must not kill the link.
    pub keep_alive: Option<Duration>,
    /// Per-stream receive window; bigger windows mean fewer round trips for file downloads
    /// and exec output.
    pub stream_window: u32,
    /// Whole-connection receive window.
    pub connection_window: u32,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            keep_alive: None,
            stream_window: 1024 * 1024,
            connection_window: 8 * 1024 * 1024,
        }
    }
}

/// A handle on one guest connection. Clone it freely.
#[derive(Clone)]
pub struct GuestClient {
    sender: SendRequest<ReqBody>,
    /// Scheme, authority and path prefix of every request: [`DIRECT_BASE`] on a connection
    /// to the guest itself, a node's prefix for the sandbox when its requests go through a
    /// node (`GuestClient::over`).
    base: std::sync::Arc<str>,
}

impl std::fmt::Debug for GuestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestClient")
            .field("closed", &self.sender.is_closed())
            .finish()
    }
}

/// Output of [`GuestClient::run`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub stdout: Bytes,
    pub stderr: Bytes,
    pub status: ExitStatus,
}

/// A chunk of a process's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecOutput {
    Stdout(Bytes),
    Stderr(Bytes),
}

fn path_query(route: &str, path: &str, extra: &[(&str, String)]) -> Result<String> {
    validate_path(path).map_err(ClientError::Invalid)?;
    let mut s = format!("{route}?path={}", encode_component(path));
    for (k, v) in extra {
        s.push('&');
        s.push_str(&encode_component(k));
        s.push('=');
        s.push_str(&encode_component(v));
    }
    Ok(s)
}

fn empty_body() -> ReqBody {
    Empty::<Bytes>::new()
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn full_body(bytes: Bytes) -> ReqBody {
    Full::new(bytes)
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// A request body fed from a channel: stdin and PTY input. Dropping every sender ends it.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, BoxError>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|b| Ok(BodyFrame::data(b))))
    }
}

/// Reads records out of a response body.
struct FrameReader {
    body: Incoming,
    decoder: FrameDecoder,
    done: bool,
}

impl FrameReader {
    fn new(body: Incoming) -> FrameReader {
        FrameReader {
            body,
            decoder: FrameDecoder::new(),
            done: false,
        }
    }

    async fn next(&mut self) -> Result<Option<Frame>> {
        loop {
            if let Some(f) = self.decoder.next_frame().map_err(ClientError::from_frame)? {
                return Ok(Some(f));
            }
            if self.done {
                return Ok(None);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
                Some(Err(e)) => return Err(ClientError::from_hyper(e)),
                None => {
                    self.done = true;
                    self.decoder.finish().map_err(ClientError::from_frame)?;
                }
            }
        }
    }
}

/// The guest's error from an `Error` record.
fn error_frame(frame: &Frame) -> ClientError {
    match frame.parse::<ProtoError>() {
        Ok(e) => ClientError::Guest(e),
        Err(e) => ClientError::from_frame(e),
    }
}

impl GuestClient {
    /// Handshakes over `io` with default settings.
    pub async fn connect<IO>(io: IO) -> Result<GuestClient>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        GuestClient::connect_with(io, ClientConfig::default()).await
    }

    /// Handshakes over `io` and spawns the connection driver on the current tokio runtime.
    pub async fn connect_with<IO>(io: IO, config: ClientConfig) -> Result<GuestClient>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .initial_stream_window_size(config.stream_window)
            .initial_connection_window_size(config.connection_window)
            .max_frame_size(256 * 1024)
            .max_header_list_size(64 * 1024);
        if let Some(interval) = config.keep_alive {
            builder
                .keep_alive_interval(interval)
                .keep_alive_timeout(interval)
                .keep_alive_while_idle(true);
        }
        let (sender, conn) = builder
            .handshake(TokioIo::new(io))
            .await
            .map_err(ClientError::from_hyper)?;
        tokio::spawn(async move {
            // The end of the connection reaches callers through their pending requests; there
            // is nobody else to tell.
            let _ = conn.await;
        });
        Ok(GuestClient {
            sender,
            base: DIRECT_BASE.into(),
        })
    }

    /// A client whose requests go over `sender`, an HTTP/2 connection made elsewhere, under
    /// `base` (scheme, authority and path prefix): a node that serves the guest protocol on a
    /// sandbox's behalf.
    pub fn over(sender: SendRequest<GuestBody>, base: impl Into<std::sync::Arc<str>>) -> Self {
        GuestClient {
            sender,
            base: base.into(),
        }
    }

    fn uri(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.base)
    }

    /// Sends a request as it is (its URI's path and query are the guest's) and returns the
    /// guest's answer as it is, errors included: how a node serves the guest protocol for a
    /// sandbox.
    pub async fn forward(&self, req: Request<GuestBody>) -> Result<Response<Incoming>> {
        let (mut parts, body) = req.into_parts();
        let pq = parts
            .uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned();
        parts.uri = self
            .uri(&pq)
            .parse()
            .map_err(|e: http::uri::InvalidUri| ClientError::Protocol(e.to_string()))?;
        let mut sender = self.sender.clone();
        sender.ready().await.map_err(ClientError::from_hyper)?;
        sender
            .send_request(Request::from_parts(parts, body))
            .await
            .map_err(ClientError::from_hyper)
    }

    /// True once the connection is known to be gone.
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    async fn send(&self, req: Request<ReqBody>) -> Result<Response<Incoming>> {
        let mut sender = self.sender.clone();
        sender.ready().await.map_err(ClientError::from_hyper)?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(ClientError::from_hyper)?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(error_response(resp).await)
    }

    async fn request_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path_and_query: &str,
        body: ReqBody,
    ) -> Result<T> {
        let req = Request::builder()
            .method(method)
            .uri(self.uri(path_and_query))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        let bytes = read_limited(resp.into_body(), MAX_JSON_BODY).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("invalid JSON answer: {e}")))
    }

    async fn get_json<T: DeserializeOwned>(&self, path_and_query: &str) -> Result<T> {
        self.request_json(Method::GET, path_and_query, empty_body())
            .await
    }

    async fn post_json<T: DeserializeOwned, B: Serialize>(
        &self,
        path_and_query: &str,
        body: &B,
    ) -> Result<T> {
        let json = serde_json::to_vec(body)
            .map_err(|e| ClientError::Invalid(ProtoError::invalid(e.to_string())))?;
        if json.len() > MAX_JSON_BODY {
            return Err(ClientError::Invalid(ProtoError::new(
                ErrorKind::TooLarge,
                format!("request of {} bytes exceeds {MAX_JSON_BODY}", json.len()),
            )));
        }
        self.request_json(Method::POST, path_and_query, full_body(json.into()))
            .await
    }

    /// Liveness and identity of the daemon.
    pub async fn health(&self) -> Result<Health> {
        self.get_json(routes::HEALTH).await
    }

    /// The guest's CPU counters, memory and root filesystem.
    pub async fn stats(&self) -> Result<crate::GuestStats> {
        self.get_json(routes::STATS).await
    }

    /// Starts a process. Returns once it runs (or with the reason it could not start).
    pub async fn exec(&self, spec: ExecSpec) -> Result<ExecHandle> {
        let (input, frames, pid) = self
            .start_streamed(routes::EXEC, Frame::json(FrameKind::Spec, &spec))
            .await?;
        Ok(ExecHandle {
            pid,
            stdin: Some(ExecStdin { tx: input }),
            frames,
            status: None,
        })
    }

    /// Runs a process to completion with empty stdin and collects its output.
    pub async fn run(&self, spec: ExecSpec) -> Result<Output> {
        let mut handle = self.exec(spec).await?;
        drop(handle.take_stdin());
        handle.output().await
    }

    /// Starts a terminal session.
    pub async fn pty(&self, spec: PtySpec) -> Result<PtyHandle> {
        let (input, frames, pid) = self
            .start_streamed(routes::PTY, Frame::json(FrameKind::Spec, &spec))
            .await?;
        Ok(PtyHandle {
            pid,
            input: PtyInput { tx: input },
            frames,
            status: None,
        })
    }

    async fn start_streamed(
        &self,
        route: &str,
        spec: Frame,
    ) -> Result<(mpsc::Sender<Bytes>, FrameReader, u32)> {
        let (tx, rx) = mpsc::channel::<Bytes>(16);
        // Cannot fail: the channel is new and has room.
        let _ = tx.try_send(spec.encode());
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.uri(route))
            .header(http::header::CONTENT_TYPE, "application/x-space-frames")
            .body(ChannelBody { rx }.boxed_unsync())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let (frames, pid) = self.started(req).await?;
        Ok((tx, frames, pid))
    }

    /// Sends a request whose answer is a stream of process records, and reads its `Started`.
    async fn started(&self, req: Request<ReqBody>) -> Result<(FrameReader, u32)> {
        let resp = self.send(req).await?;
        let mut frames = FrameReader::new(resp.into_body());
        match frames.next().await? {
            Some(f) if f.kind == FrameKind::Started => {
                let started: Started = f.parse().map_err(ClientError::from_frame)?;
                Ok((frames, started.pid))
            }
            Some(f) if f.kind == FrameKind::Error => Err(error_frame(&f)),
            Some(f) => Err(ClientError::Protocol(format!(
                "expected a Started record, got {:?}",
                f.kind
            ))),
            None => Err(ClientError::Protocol(
                "stream ended before the process started".into(),
            )),
        }
    }

    /// Sends a signal to the process group of a process the daemon started.
    pub async fn signal(&self, pid: u32, signal: i32) -> Result<()> {
        let _: serde_json::Value = self
            .post_json(&routes::signal_path(pid), &SignalRequest { signal })
            .await?;
        Ok(())
    }

    /// Running and recently finished processes.
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>> {
        let list: ProcessList = self.get_json(routes::PROCESSES).await?;
        Ok(list.processes)
    }

    /// Tells the guest who it is now (after boot or restore).
    pub async fn identity(&self, identity: &Identity) -> Result<IdentityApplied> {
        self.post_json(routes::IDENTITY, identity).await
    }

    /// Mounts a volume of the sandbox in the guest (`docs/volumes.md`); one mounted there
    /// already is left as it is.
    pub async fn mount_volume(
        &self,
        req: &crate::volume::MountRequest,
    ) -> Result<crate::volume::VolumesState> {
        self.post_json(routes::VOLUMES_MOUNT, req).await
    }

    /// Holds the guest's volume requests (`hold`: answers once none is under way, or after a
    /// few seconds) or lets them go.
    pub async fn quiesce_volumes(&self, hold: bool) -> Result<crate::volume::VolumesState> {
        self.post_json(
            routes::VOLUMES_QUIESCE,
            &crate::volume::QuiesceRequest { hold },
        )
        .await
    }

    /// Grows the filesystem mounted at `path` to fill its block device, online. With
    /// `device_bytes`, the guest first waits (bounded) until its kernel sees a device of at
    /// least that size (right after the host grew the disk, the guest may not have yet).
    pub async fn grow_fs(&self, path: &str, device_bytes: Option<u64>) -> Result<GrowFsResult> {
        validate_path(path).map_err(ClientError::Invalid)?;
        let req = GrowFsRequest {
            path: path.into(),
            device_bytes,
        };
        self.post_json(routes::FS_GROW, &req).await
    }

    /// Opens a full-duplex byte stream to `127.0.0.1:port` inside the guest. Fails with the
    /// guest's `unreachable` error when nothing listens there. Writing to the tunnel sends to
    /// the guest socket, `shutdown` half-closes it, and reading returns what the guest socket
    /// sends until it closes.
    pub async fn tcp(&self, port: u16) -> Result<TcpTunnel> {
        if port == 0 {
            return Err(ClientError::Invalid(ProtoError::invalid(
                "port 0 is not a port",
            )));
        }
        let (tx, rx) = futures::channel::mpsc::channel::<Bytes>(TUNNEL_QUEUE);
        let body = StreamBody::new(rx.map(|b| Ok::<_, BoxError>(BodyFrame::data(b))));
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.uri(&routes::tcp_path(port)))
            .body(BodyExt::boxed_unsync(body))
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let resp = self.send(req).await?;
        Ok(TcpTunnel {
            tx: Some(tx),
            body: resp.into_body(),
            buf: Bytes::new(),
            eof: false,
        })
    }

    /// Writes every file system's dirty data out in the guest (`sync(2)` by the daemon, so it
    /// works in an image without a `sync` command).
    pub async fn sync(&self) -> Result<()> {
        let _: serde_json::Value = self.post_json(routes::SYNC, &serde_json::json!({})).await?;
        Ok(())
    }

    /// Asks the guest to power off (as PID 1) or the daemon to exit (outside a VM). The answer
    /// arrives before it happens.
    pub async fn shutdown(&self) -> Result<()> {
        let _: serde_json::Value = self
            .post_json(routes::SHUTDOWN, &serde_json::json!({}))
            .await?;
        Ok(())
    }
}

/// Chunks a tunnel may queue towards the guest before writes wait (each at most one write).
const TUNNEL_QUEUE: usize = 16;
/// Largest chunk one tunnel write sends.
const TUNNEL_CHUNK: usize = 64 * 1024;

/// A byte stream to a TCP port inside the guest ([`GuestClient::tcp`]). It implements tokio's
/// `AsyncRead` and `AsyncWrite`, so `hyper_util::rt::TokioIo` can wrap it for an HTTP/1.1
/// client, or `tokio::io::copy_bidirectional` can splice it to a socket.
pub struct TcpTunnel {
    tx: Option<futures::channel::mpsc::Sender<Bytes>>,
    body: Incoming,
    buf: Bytes,
    eof: bool,
}

impl std::fmt::Debug for TcpTunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTunnel")
            .field("write_open", &self.tx.is_some())
            .field("eof", &self.eof)
            .finish()
    }
}

impl AsyncRead for TcpTunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.buf.is_empty() {
                let n = self.buf.len().min(out.remaining());
                out.put_slice(&self.buf.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if self.eof {
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => self.eof = true,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf = data;
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionReset, e)))
                }
            }
        }
    }
}

impl AsyncWrite for TcpTunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let Some(tx) = self.tx.as_mut() else {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        };
        if data.is_empty() {
            return Poll::Ready(Ok(0));
        }
        match tx.poll_ready(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(_)) => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
            Poll::Ready(Ok(())) => {
                let n = data.len().min(TUNNEL_CHUNK);
                match tx.start_send(Bytes::copy_from_slice(&data[..n])) {
                    Ok(()) => Poll::Ready(Ok(n)),
                    Err(_) => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
                }
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Queued chunks go out as the HTTP/2 stream's flow control allows; there is nothing
        // to push.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Dropping the sender ends the request body: the guest half-closes its socket.
        self.tx = None;
        Poll::Ready(Ok(()))
    }
}

async fn read_limited(body: Incoming, limit: usize) -> Result<Bytes> {
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => match e.downcast::<hyper::Error>() {
            Ok(h) => Err(ClientError::from_hyper(*h)),
            Err(other) => Err(ClientError::Protocol(format!("answer body: {other}"))),
        },
    }
}

async fn error_response(resp: Response<Incoming>) -> ClientError {
    let status = resp.status();
    match read_limited(resp.into_body(), MAX_JSON_BODY).await {
        Ok(bytes) => match serde_json::from_slice::<ProtoError>(&bytes) {
            Ok(e) => ClientError::Guest(e),
            Err(_) => ClientError::Guest(ProtoError::new(
                ErrorKind::from_http_status(status.as_u16()),
                format!(
                    "HTTP {}: {}",
                    status.as_u16(),
                    String::from_utf8_lossy(&bytes[..bytes.len().min(512)])
                ),
            )),
        },
        Err(e) => e,
    }
}

/// Writes to a process's stdin. Dropping it (or [`close`](ExecStdin::close)) gives the process
/// end-of-file.
#[derive(Clone)]
pub struct ExecStdin {
    tx: mpsc::Sender<Bytes>,
}

impl ExecStdin {
    /// Sends bytes; waits while the guest applies backpressure.
    pub async fn write(&self, data: impl AsRef<[u8]>) -> Result<()> {
        let mut out = BytesMut::new();
        encode_chunked(FrameKind::Stdin, data.as_ref(), &mut out);
        self.tx
            .send(out.freeze())
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Closes stdin (even if clones of this writer are still alive).
    pub async fn close(self) -> Result<()> {
        self.tx
            .send(Frame::new(FrameKind::StdinEof, Bytes::new()).encode())
            .await
            .map_err(|_| ClientError::Closed)
    }
}

/// A running process started by [`GuestClient::exec`].
pub struct ExecHandle {
    pid: u32,
    stdin: Option<ExecStdin>,
    frames: FrameReader,
    status: Option<ExitStatus>,
}

impl ExecHandle {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The stdin writer (kept by the handle until taken).
    pub fn stdin(&self) -> Option<&ExecStdin> {
        self.stdin.as_ref()
    }

    /// Takes the stdin writer; dropping it closes the process's stdin.
    pub fn take_stdin(&mut self) -> Option<ExecStdin> {
        self.stdin.take()
    }

    /// The next chunk of output, `None` after the process exited and all output arrived.
    pub async fn next_output(&mut self) -> Result<Option<ExecOutput>> {
        if self.status.is_some() {
            return Ok(None);
        }
        let Some(frame) = self.frames.next().await? else {
            return Err(ClientError::Protocol(
                "stream ended without an exit status".into(),
            ));
        };
        match frame.kind {
            FrameKind::Stdout => Ok(Some(ExecOutput::Stdout(frame.payload))),
            FrameKind::Stderr => Ok(Some(ExecOutput::Stderr(frame.payload))),
            FrameKind::Exit => {
                self.status = Some(frame.parse().map_err(ClientError::from_frame)?);
                self.stdin = None;
                Ok(None)
            }
            FrameKind::Error => Err(error_frame(&frame)),
            other => Err(ClientError::Protocol(format!(
                "unexpected {other:?} record in exec output"
            ))),
        }
    }

    /// Waits for the exit, discarding output not yet read.
    pub async fn wait(mut self) -> Result<ExitStatus> {
        drop(self.stdin.take());
        while self.next_output().await?.is_some() {}
        self.status
            .ok_or_else(|| ClientError::Protocol("no exit status".into()))
    }

    /// Waits for the exit, collecting all output.
    pub async fn output(mut self) -> Result<Output> {
        let mut stdout = BytesMut::new();
        let mut stderr = BytesMut::new();
        while let Some(o) = self.next_output().await? {
            match o {
                ExecOutput::Stdout(b) => stdout.extend_from_slice(&b),
                ExecOutput::Stderr(b) => stderr.extend_from_slice(&b),
            }
        }
        let status = self
            .status
            .ok_or_else(|| ClientError::Protocol("no exit status".into()))?;
        Ok(Output {
            stdout: stdout.freeze(),
            stderr: stderr.freeze(),
            status,
        })
    }

    /// The exit status, once [`next_output`](ExecHandle::next_output) returned `None`.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }
}

/// Input side of a PTY session; cloneable so one task can type while another reads.
#[derive(Clone)]
pub struct PtyInput {
    tx: mpsc::Sender<Bytes>,
}

impl PtyInput {
    pub async fn write(&self, data: impl AsRef<[u8]>) -> Result<()> {
        let mut out = BytesMut::new();
        encode_chunked(FrameKind::Stdin, data.as_ref(), &mut out);
        self.tx
            .send(out.freeze())
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Changes the terminal size; the session's foreground process gets SIGWINCH.
    pub async fn resize(&self, rows: u16, cols: u16) -> Result<()> {
        let frame = Frame::json(FrameKind::Resize, &Resize { rows, cols });
        self.tx
            .send(frame.encode())
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Sends a signal to the session's process group.
    pub async fn signal(&self, signal: i32) -> Result<()> {
        let frame = Frame::json(FrameKind::Signal, &SignalRequest { signal });
        self.tx
            .send(frame.encode())
            .await
            .map_err(|_| ClientError::Closed)
    }
}

/// A terminal session started by [`GuestClient::pty`].
pub struct PtyHandle {
    pid: u32,
    input: PtyInput,
    frames: FrameReader,
    status: Option<ExitStatus>,
}

impl PtyHandle {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    pub fn input(&self) -> PtyInput {
        self.input.clone()
    }

    pub async fn write(&self, data: impl AsRef<[u8]>) -> Result<()> {
        self.input.write(data).await
    }

    pub async fn resize(&self, rows: u16, cols: u16) -> Result<()> {
        self.input.resize(rows, cols).await
    }

    /// The next chunk of terminal output, `None` after the session ended.
    pub async fn next_output(&mut self) -> Result<Option<Bytes>> {
        if self.status.is_some() {
            return Ok(None);
        }
        let Some(frame) = self.frames.next().await? else {
            return Err(ClientError::Protocol(
                "stream ended without an exit status".into(),
            ));
        };
        match frame.kind {
            FrameKind::Stdout | FrameKind::Stderr => Ok(Some(frame.payload)),
            FrameKind::Exit => {
                self.status = Some(frame.parse().map_err(ClientError::from_frame)?);
                Ok(None)
            }
            FrameKind::Error => Err(error_frame(&frame)),
            other => Err(ClientError::Protocol(format!(
                "unexpected {other:?} record in PTY output"
            ))),
        }
    }

    /// Waits for the session to end, discarding output not yet read.
    pub async fn wait(mut self) -> Result<ExitStatus> {
        while self.next_output().await?.is_some() {}
        self.status
            .ok_or_else(|| ClientError::Protocol("no exit status".into()))
    }

    /// The exit status, once [`next_output`](PtyHandle::next_output) returned `None`.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }
}
