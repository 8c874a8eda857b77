//! The in-guest HTTP proxy on `127.0.0.1:3128`: the only way out of a sandbox.
//!
//! Each client connection is one request over the egress channel ([`crate::egress`]):
//! `CONNECT host:port` becomes `POST /v1/egress/connect` and, once the gateway answers `200`,
//! a spliced tunnel; a plain-HTTP request in absolute form (`GET http://host/path`) becomes
//! `POST /v1/egress/forward` whose body is the client's raw bytes from the request line on.
//! Anything else, and every refusal, is answered with a short `text/plain` response and the
//! connection is closed. Processes in the guest are as untrusted as the guest: the head is
//! bounded, validated, and nothing a client sends can stop the proxy.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Limited};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

use crate::egress::{Egress, ReqBody};

/// Largest request head the proxy reads; larger ones get `431`.
pub const MAX_HEAD: usize = 64 * 1024;
/// Client connections served at once; more wait in the listen backlog.
pub const MAX_CLIENTS: usize = 256;
/// Headers in one request head.
const MAX_HEADERS: usize = 128;
/// Longest a client may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest the gateway may take to answer a request (its upstream connect timeout is 10 s).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest refusal body passed on to the client.
const MAX_REASON: usize = 4096;
/// How long a tunnel whose upstream side ended waits for the client to close its side.
const LINGER: Duration = Duration::from_secs(30);
/// Path of the connect route on the egress channel.
pub const CONNECT_PATH: &str = "/v1/egress/connect";
/// Path of the forward route on the egress channel.
pub const FORWARD_PATH: &str = "/v1/egress/forward";

/// What a client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `CONNECT host:port`: a tunnel.
    Connect,
    /// A plain-HTTP request in absolute form.
    Forward,
}

/// The destination of a client's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: Kind,
    /// DNS name or IP literal (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// Length of the request head, up to and including its blank line.
    pub head_len: usize,
}

/// A response the proxy makes up itself: a refusal or an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: String,
}

impl Refusal {
    fn new(status: u16, reason: impl Into<String>) -> Refusal {
        Refusal {
            status,
            reason: reason.into(),
        }
    }

    fn bad(reason: impl Into<String>) -> Refusal {
        Refusal::new(400, reason)
    }

    /// The whole HTTP/1.1 response.
    pub fn to_bytes(&self) -> Vec<u8> {
        refusal_bytes(self.status, self.reason.as_bytes())
    }
}

/// `HTTP/1.1 <status> <phrase>` with the documented headers and `body`.
pub fn refusal_bytes(status: u16, body: &[u8]) -> Vec<u8> {
    let phrase = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let mut out = format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\nX-Space-Egress: refused\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// A host as the gateway accepts it: an IP literal, or at most 253 bytes of `[A-Za-z0-9.-]`.
pub fn valid_host(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match s.parse::<u16>() {
        Ok(0) | Err(_) => None,
        Ok(p) => Some(p),
    }
}

/// Splits `host[:port]` or `[v6][:port]`; `default` when there is no port.
fn split_authority(auth: &str, default: Option<u16>) -> Result<(String, u16), Refusal> {
    let bad = || Refusal::bad(format!("invalid host or port in {auth:?}"));
    let (host, port) = if let Some(rest) = auth.strip_prefix('[') {
        let (v6, after) = rest.split_once(']').ok_or_else(bad)?;
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad());
        }
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or_else(bad)?),
        };
        (v6, port)
    } else {
        match auth.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (auth, None),
        }
    };
    let port = match port {
        Some("") | None => default.ok_or_else(|| Refusal::bad(format!("{auth:?} has no port")))?,
        Some(p) => parse_port(p).ok_or_else(bad)?,
    };
    // A bare IPv6 literal must be bracketed; with brackets it was checked above.
    if !auth.starts_with('[') && host.contains(':') {
        return Err(bad());
    }
    if !valid_host(host) {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

/// The destination of an absolute-form `http://` target.
fn parse_absolute(target: &str) -> Result<(String, u16), Refusal> {
    let lower = target.get(..8).unwrap_or(target).to_ascii_lowercase();
    let rest = if lower.starts_with("http://") {
        &target[7..]
    } else if lower.starts_with("https://") {
        return Err(Refusal::bad(
            "https:// targets go through CONNECT; this proxy does not speak TLS to clients",
        ));
    } else if target.starts_with('/') {
        return Err(Refusal::bad(
            "this is a proxy: requests need an absolute http:// target or CONNECT",
        ));
    } else {
        return Err(Refusal::bad(format!(
            "unsupported request target {target:?}"
        )));
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..end];
    // Userinfo is part of the request the gateway sees, not of the destination.
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    split_authority(hostport, Some(80))
}

/// Parses the request head at the start of `buf`: `Ok(None)` while it is incomplete.
pub fn parse_head(buf: &[u8]) -> Result<Option<Target>, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            if buf.len() >= MAX_HEAD {
                return Err(Refusal::new(
                    431,
                    format!("request head exceeds {MAX_HEAD} bytes"),
                ));
            }
            return Ok(None);
        }
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal::new(
                431,
                format!("more than {MAX_HEADERS} header lines"),
            ))
        }
        Err(e) => return Err(Refusal::bad(format!("malformed request: {e}"))),
    };
    if head_len > MAX_HEAD {
        return Err(Refusal::new(
            431,
            format!("request head exceeds {MAX_HEAD} bytes"),
        ));
    }
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let (kind, (host, port)) = if method.eq_ignore_ascii_case("CONNECT") {
        (Kind::Connect, split_authority(target, None)?)
    } else {
        (Kind::Forward, parse_absolute(target)?)
    };
    Ok(Some(Target {
        kind,
        host,
        port,
        head_len,
    }))
}

/// Serves the proxy on `listener` forever.
pub async fn serve(listener: TcpListener, egress: Arc<Egress>) {
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                let egress = egress.clone();
                tokio::spawn(async move {
                    serve_client(stream, &egress).await;
                    drop(permit);
                });
            }
            Err(e) => {
                tracing::warn!("egress proxy accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Binds the proxy's listening socket, retrying while the address is taken.
pub async fn bind(addr: SocketAddr) -> TcpListener {
    let mut complained = false;
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => {
                tracing::info!("egress proxy listening on {addr}");
                return l;
            }
            Err(e) => {
                if !complained {
                    tracing::warn!("cannot listen on {addr}: {e}; retrying every second");
                    complained = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// A request body fed by the task that reads the client socket.
struct ClientBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|b| Ok(Frame::data(b))))
    }
}

async fn refuse(wr: &mut OwnedWriteHalf, refusal: &Refusal) {
    let _ = wr.write_all(&refusal.to_bytes()).await;
    let _ = wr.shutdown().await;
}

async fn serve_client(stream: TcpStream, egress: &Egress) {
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = BytesMut::with_capacity(4096);
    let mut scratch = vec![0u8; 8192];
    let target = loop {
        match parse_head(&buf) {
            Ok(Some(t)) => break t,
            Ok(None) => {}
            Err(r) => return refuse(&mut wr, &r).await,
        }
        let room = (MAX_HEAD - buf.len()).min(scratch.len());
        let read = rd.read(&mut scratch[..room]);
        match tokio::time::timeout(HEAD_TIMEOUT, read).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => buf.extend_from_slice(&scratch[..n]),
            Err(_) => {
                let r = Refusal::new(408, "no complete request head within 30 s");
                return refuse(&mut wr, &r).await;
            }
        }
    };
    let (path, first) = match target.kind {
        Kind::Connect => (CONNECT_PATH, buf.split_off(target.head_len).freeze()),
        Kind::Forward => (FORWARD_PATH, buf.freeze()),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(8);
    if !first.is_empty() {
        let _ = tx.try_send(first);
    }
    let pump = tokio::spawn(async move {
        loop {
            let mut chunk = BytesMut::with_capacity(32 * 1024);
            match rd.read_buf(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if tx.send(chunk.freeze()).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    let _abort_pump = AbortOnDrop(pump.abort_handle());
    let req = Request::post(format!("http://space.egress{path}"))
        .header("space-host", target.host.as_str())
        .header("space-port", target.port.to_string())
        .body(ReqBody::new(ClientBody { rx }));
    let req = match req {
        Ok(r) => r,
        Err(e) => return refuse(&mut wr, &Refusal::bad(e.to_string())).await,
    };
    let resp = match tokio::time::timeout(ANSWER_TIMEOUT, egress.send(req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            let r = Refusal::new(502, format!("egress gateway unavailable: {e}"));
            return refuse(&mut wr, &r).await;
        }
        Err(_) => {
            egress.abandon_current();
            let r = Refusal::new(504, "the egress gateway did not answer within 30 s");
            return refuse(&mut wr, &r).await;
        }
    };
    let status = resp.status().as_u16();
    if status != 200 {
        let body = Limited::new(resp.into_body(), MAX_REASON).collect();
        let reason = match tokio::time::timeout(Duration::from_secs(10), body).await {
            Ok(Ok(b)) => b.to_bytes(),
            _ => Bytes::from_static(b"refused by the egress gateway"),
        };
        let _ = wr.write_all(&refusal_bytes(status, &reason)).await;
        let _ = wr.shutdown().await;
        return;
    }
    if target.kind == Kind::Connect
        && wr
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .is_err()
    {
        return;
    }
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(data) = f.into_data() {
                    if wr.write_all(&data).await.is_err() {
                        return;
                    }
                }
            }
            // The stream was reset or the channel died: cut the client off (no clean end, so
            // it cannot mistake a truncated answer for a whole one).
            Err(_) => return,
        }
    }
    let _ = shutdown(&mut wr).await;
    if target.kind == Kind::Connect {
        // Let the client finish its side (its bytes still go upstream), within bounds.
        let _ = tokio::time::timeout(LINGER, pump).await;
    }
}

async fn shutdown<W: AsyncWrite + Unpin>(w: &mut W) -> std::io::Result<()> {
    w.flush().await?;
    w.shutdown().await
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(head: &str) -> Target {
        parse_head(head.as_bytes()).unwrap().unwrap()
    }

    fn err(head: &[u8]) -> Refusal {
        parse_head(head).unwrap_err()
    }

    #[test]
    fn connect_lines() {
        let t = ok("CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org:443\r\n\r\n");
        assert_eq!(
            (t.kind, t.host.as_str(), t.port),
            (Kind::Connect, "pypi.org", 443)
        );
        assert_eq!(t.head_len, 53);
        let t = ok("CONNECT [2001:db8::1]:8443 HTTP/1.1\r\n\r\n");
        assert_eq!((t.host.as_str(), t.port), ("2001:db8::1", 8443));
        let t = ok("CONNECT 10.0.0.1:22 HTTP/1.0\r\n\r\n");
        assert_eq!((t.host.as_str(), t.port), ("10.0.0.1", 22));
        // Bytes after the head (an early ClientHello) are not part of it.
        let t = ok("CONNECT a.b:1 HTTP/1.1\r\n\r\n\x16\x03\x01");
        assert_eq!(t.head_len, 26);
    }

    #[test]
    fn bad_connect_lines() {
        for head in [
            "CONNECT pypi.org HTTP/1.1\r\n\r\n",
            "CONNECT pypi.org:0 HTTP/1.1\r\n\r\n",
            "CONNECT pypi.org:65536 HTTP/1.1\r\n\r\n",
            "CONNECT pypi.org:+443 HTTP/1.1\r\n\r\n",
            "CONNECT 2001:db8::1:443 HTTP/1.1\r\n\r\n",
            "CONNECT [not-v6]:443 HTTP/1.1\r\n\r\n",
            "CONNECT [::1]443 HTTP/1.1\r\n\r\n",
            "CONNECT evil_host:443 HTTP/1.1\r\n\r\n",
            "CONNECT :443 HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(err(head.as_bytes()).status, 400, "{head:?}");
        }
        let long = format!("CONNECT {}:443 HTTP/1.1\r\n\r\n", "a".repeat(254));
        assert_eq!(err(long.as_bytes()).status, 400);
    }

    #[test]
    fn absolute_form() {
        let t = ok("GET http://example.com/path?q=1 HTTP/1.1\r\nHost: example.com\r\n\r\n");
        assert_eq!(
            (t.kind, t.host.as_str(), t.port),
            (Kind::Forward, "example.com", 80)
        );
        let t = ok("POST HTTP://User:pw@Example.com:8080 HTTP/1.1\r\n\r\n");
        assert_eq!((t.host.as_str(), t.port), ("Example.com", 8080));
        let t = ok("GET http://[::1]:9000/x HTTP/1.1\r\n\r\n");
        assert_eq!((t.host.as_str(), t.port), ("::1", 9000));
        let t = ok("GET http://example.com:/ HTTP/1.1\r\n\r\n");
        assert_eq!(t.port, 80);
        for head in [
            "GET / HTTP/1.1\r\nHost: example.com\r\n\r\n",
            "GET https://example.com/ HTTP/1.1\r\n\r\n",
            "GET ftp://example.com/ HTTP/1.1\r\n\r\n",
            "GET http:///path HTTP/1.1\r\n\r\n",
            "GET http://exa mple.com/ HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(err(head.as_bytes()).status, 400, "{head:?}");
        }
    }

    #[test]
    fn malformed_and_incomplete() {
        assert_eq!(parse_head(b"").unwrap(), None);
        assert_eq!(parse_head(b"CONNECT a.b:443 HTTP/1.1\r\n").unwrap(), None);
        assert_eq!(err(b"\x00\x01\x02 garbage\r\n\r\n").status, 400);
        assert_eq!(err(b"GET http://a/ HTTP/9.9\r\n\r\n").status, 400);
        assert_eq!(
            err(b"CONNECT a.b:443 HTTP/1.1\r\nBad Header\r\n\r\n").status,
            400
        );
    }

    #[test]
    fn oversize_heads() {
        let mut head = b"GET http://a.example/ HTTP/1.1\r\n".to_vec();
        while head.len() < MAX_HEAD {
            head.extend_from_slice(
                b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n",
            );
        }
        head.truncate(MAX_HEAD);
        // Too many header lines, or a head that does not end within the limit: 431.
        assert_eq!(err(&head).status, 431);
        let mut one = b"GET http://a.example/ HTTP/1.1\r\nX-Big: ".to_vec();
        one.resize(MAX_HEAD, b'a');
        assert_eq!(err(&one).status, 431);
    }

    #[test]
    fn refusal_format() {
        let bytes = Refusal::new(403, "denied by rule *.example.com").to_bytes();
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{text}");
        assert!(text.contains("\r\nX-Space-Egress: refused\r\n"));
        assert!(text.contains("\r\nContent-Type: text/plain\r\n"));
        assert!(text.contains("\r\nConnection: close\r\n"));
        assert!(text.ends_with(
            "\r\nContent-Length: 28\r\nConnection: close\r\n\r\ndenied by rule *.example.com"
        ));
    }
}
