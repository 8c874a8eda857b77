//! The guest end of egress and ingress, end to end on the host: the real daemon binary with
//! its egress channel pointed at a Unix socket that this test serves as the host would (the
//! synchronisation line, then an HTTP/2 server implementing `/v1/egress/connect` and
//! `/v1/egress/forward` by plain splicing to real TCP servers on 127.0.0.1), and clients that
//! speak HTTP proxy to the daemon's proxy port. Also `POST /v1/tcp` through the real client.

mod common;

use std::convert::Infallible;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use space_proto::{ErrorKind, ExecSpec, GuestClient};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinHandle;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What the host stand-in saw.
#[derive(Default)]
struct HostLog {
    /// Connections that completed the synchronisation.
    synced: AtomicUsize,
    /// `(path, space-host, space-port)` of every request.
    requests: Mutex<Vec<(String, String, String)>>,
    /// Serving tasks of the connections, to drop them on demand.
    conns: Mutex<Vec<JoinHandle<()>>>,
}

impl HostLog {
    fn drop_connections(&self) {
        for task in self.conns.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

/// Serves the host side of the egress channel on `listener`.
async fn serve_host(listener: UnixListener, log: Arc<HostLog>) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            return;
        };
        let task = tokio::spawn(serve_conn(sock, log.clone()));
        log.conns.lock().unwrap().push(task);
    }
}

/// Serves one connection of the host side: the synchronisation, then HTTP/2.
async fn serve_conn<S>(mut sock: S, log2: Arc<HostLog>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // The guest's line: `SPACE-EGRESS/1 <32 hex>\n`.
    let mut line = Vec::new();
    loop {
        let mut b = [0u8; 1];
        if sock.read_exact(&mut b).await.is_err() {
            return;
        }
        line.push(b[0]);
        if b[0] == b'\n' || line.len() > 100 {
            break;
        }
    }
    let text = String::from_utf8_lossy(&line).to_string();
    let token = text
        .strip_prefix("SPACE-EGRESS/1 ")
        .and_then(|t| t.strip_suffix('\n'))
        .expect("a synchronisation line");
    assert_eq!(token.len(), 32);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    // Stale bytes first, as a port may hold them: junk, another token's line, half
    // an HTTP/2 frame. The guest must skip all of it.
    let mut noise = b"\x00\x00\x12\x04\x00stale bytes\n".to_vec();
    noise.extend_from_slice(b"SPACE-EGRESS/1 00000000000000000000000000000000\n");
    noise.extend_from_slice(&line[..line.len() - 1]);
    noise.extend_from_slice(b"\r\n");
    sock.write_all(&noise).await.unwrap();
    sock.write_all(&line).await.unwrap();
    log2.synced.fetch_add(1, Ordering::SeqCst);
    let log3 = log2.clone();
    let service = service_fn(move |req| {
        let log = log3.clone();
        async move { Ok::<_, Infallible>(handle(req, &log).await) }
    });
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(sock), service)
        .await;
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed_unsync());
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", "text/plain".parse().unwrap());
    r
}

/// The gateway stand-in: policy "deny `*.denied.example`", everything else is spliced.
async fn handle(req: Request<Incoming>, log: &HostLog) -> Response<Body> {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let (host, port) = (header("space-host"), header("space-port"));
    log.requests
        .lock()
        .unwrap()
        .push((req.uri().path().to_string(), host.clone(), port.clone()));
    if !matches!(
        req.uri().path(),
        "/v1/egress/connect" | "/v1/egress/forward"
    ) {
        return text(StatusCode::NOT_FOUND, "no such route");
    }
    if host.ends_with(".denied.example") {
        return text(
            StatusCode::FORBIDDEN,
            &format!("{host}:{port} denied by rule *.denied.example"),
        );
    }
    let upstream = match TcpStream::connect(format!("{host}:{port}")).await {
        Ok(s) => s,
        Err(e) => return text(StatusCode::BAD_GATEWAY, &format!("upstream: {e}")),
    };
    let (rd, mut wr) = upstream.into_split();
    let mut body = req.into_body();
    tokio::spawn(async move {
        while let Some(Ok(frame)) = body.frame().await {
            if let Ok(data) = frame.into_data() {
                if wr.write_all(&data).await.is_err() {
                    return;
                }
            }
        }
        let _ = wr.shutdown().await;
    });
    let stream = futures::stream::unfold(rd, |mut rd| async move {
        let mut buf = vec![0u8; 32 * 1024];
        match rd.read(&mut buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, Infallible>(Frame::data(Bytes::from(buf))), rd))
            }
        }
    });
    Response::new(StreamBody::new(stream).boxed_unsync())
}

/// An upstream TCP server that echoes every connection.
async fn echo_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    port
}

/// An upstream HTTP/1.1 server that answers one request per connection with the request head
/// it received as the body.
async fn http_server() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if s.read_exact(&mut b).await.is_err() {
                        return;
                    }
                    head.push(b[0]);
                }
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    head.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.write_all(&head).await;
                let _ = s.shutdown().await;
            });
        }
    });
    port
}

/// The daemon, killed on drop.
struct Guest {
    child: Child,
    ctl: PathBuf,
    proxy: String,
    log: Arc<HostLog>,
    _dir: tempfile::TempDir,
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log.drop_connections();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

impl Guest {
    async fn start() -> Guest {
        let dir = tempfile::tempdir().unwrap();
        let ctl = dir.path().join("ctl.sock");
        let egress = dir.path().join("egress.sock");
        let log = Arc::new(HostLog::default());
        tokio::spawn(serve_host(
            UnixListener::bind(&egress).unwrap(),
            log.clone(),
        ));
        let proxy = format!("127.0.0.1:{}", free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_space-guestd"))
            .arg("--listen")
            .arg(&ctl)
            .arg("--egress-socket")
            .arg(&egress)
            .arg("--egress-listen")
            .arg(&proxy)
            .env("SPACE_GUESTD_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let g = Guest {
            child,
            ctl,
            proxy,
            log,
            _dir: dir,
        };
        wait_for("the control socket", || {
            std::os::unix::net::UnixStream::connect(&g.ctl).is_ok()
        })
        .await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&g.proxy).await.is_err() {
            assert!(Instant::now() < deadline, "the proxy did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        g
    }

    async fn client(&self) -> GuestClient {
        GuestClient::connect(UnixStream::connect(&self.ctl).await.unwrap())
            .await
            .unwrap()
    }

    async fn proxy_conn(&self) -> TcpStream {
        TcpStream::connect(&self.proxy).await.unwrap()
    }

    fn synced(&self) -> usize {
        self.log.synced.load(Ordering::SeqCst)
    }
}

async fn read_to_end(mut r: impl AsyncRead + Unpin) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), r.read_to_end(&mut out))
        .await
        .expect("the connection did not end")
        .unwrap();
    out
}

/// Reads exactly `n` bytes.
async fn read_n(r: &mut (impl AsyncRead + Unpin), n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(20), r.read_exact(&mut out))
        .await
        .expect("timed out reading")
        .unwrap();
    out
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
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

/// CONNECTs through the proxy and checks the tunnel carries `len` bytes there and back
/// unchanged.
async fn tunnel_round_trip(g: &Guest, upstream: u16, len: usize, seed: u64) {
    let mut c = g.proxy_conn().await;
    c.write_all(format!("CONNECT 127.0.0.1:{upstream} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    assert_eq!(read_n(&mut c, established.len()).await, established);
    let data = random_bytes(len, seed);
    let (r, mut w) = c.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let back = read_to_end(r).await;
    writer.await.unwrap();
    assert_eq!(back.len(), data.len());
    assert_eq!(Sha256::digest(&back), Sha256::digest(&data));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_tunnel_is_spliced_byte_exactly() {
    let g = Guest::start().await;
    let upstream = echo_server().await;
    assert_eq!(g.synced(), 0, "the channel is opened lazily");
    tunnel_round_trip(&g, upstream, 3 * 1024 * 1024 + 17, 7).await;
    // Several at once share one connection.
    let mut tasks = Vec::new();
    let g = Arc::new(g);
    for i in 0..8 {
        let g = g.clone();
        tasks.push(tokio::spawn(async move {
            tunnel_round_trip(&g, upstream, 200_000 + i, i as u64).await
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(g.synced(), 1);
    let requests = g.log.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 9);
    for (path, host, port) in requests {
        assert_eq!(path, "/v1/egress/connect");
        assert_eq!(host, "127.0.0.1");
        assert_eq!(port, upstream.to_string());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_bad_requests() {
    let g = Guest::start().await;
    let mut c = g.proxy_conn().await;
    c.write_all(b"CONNECT api.denied.example:443 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let answer = String::from_utf8(read_to_end(c).await).unwrap();
    let reason = "api.denied.example:443 denied by rule *.denied.example";
    assert_eq!(
        answer,
        format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nX-Space-Egress: refused\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{reason}",
            reason.len()
        )
    );
    // Upstream unreachable: the gateway's 502 is passed on.
    let closed = free_port();
    let mut c = g.proxy_conn().await;
    c.write_all(format!("CONNECT 127.0.0.1:{closed} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let answer = String::from_utf8(read_to_end(c).await).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
        "{answer}"
    );
    assert!(answer.contains("upstream: "), "{answer}");
    // Local refusals never reach the host.
    let before = g.log.requests.lock().unwrap().len();
    for (req, status) in [
        (b"GET /relative HTTP/1.1\r\n\r\n".to_vec(), "400"),
        (b"\x16\x03\x01\x02\x00garbage\r\n\r\n".to_vec(), "400"),
        (b"CONNECT no-port.example HTTP/1.1\r\n\r\n".to_vec(), "400"),
        (
            {
                let mut v = b"GET http://a.example/ HTTP/1.1\r\nX: ".to_vec();
                v.resize(70 * 1024, b'a');
                v
            },
            "431",
        ),
    ] {
        let mut c = g.proxy_conn().await;
        // The proxy may answer and close before all of an oversized head is written.
        let _ = c.write_all(&req).await;
        let answer = String::from_utf8(read_to_end(c).await).unwrap();
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{answer}"
        );
        assert!(answer.contains("X-Space-Egress: refused"));
    }
    assert_eq!(g.log.requests.lock().unwrap().len(), before);
    // A client that connects and leaves does not disturb anything.
    drop(g.proxy_conn().await);
    tunnel_round_trip(&g, echo_server().await, 1000, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_round_trip() {
    let g = Guest::start().await;
    let upstream = http_server().await;
    let mut c = g.proxy_conn().await;
    let head = format!(
        "GET http://127.0.0.1:{upstream}/some/path?q=1 HTTP/1.1\r\nHost: 127.0.0.1:{upstream}\r\n\
         User-Agent: test\r\n\r\n"
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let answer = read_to_end(c).await;
    // The upstream got the client's bytes unchanged (the stand-in does not rewrite), and the
    // client got the upstream's response unchanged, then the end of the connection.
    let expected = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{head}",
        head.len()
    );
    assert_eq!(String::from_utf8(answer).unwrap(), expected);
    let requests = g.log.requests.lock().unwrap().clone();
    assert_eq!(
        requests,
        vec![(
            "/v1/egress/forward".to_string(),
            "127.0.0.1".to_string(),
            upstream.to_string()
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_host_drops_and_after_identity() {
    let g = Guest::start().await;
    let upstream = echo_server().await;
    tunnel_round_trip(&g, upstream, 1000, 1).await;
    assert_eq!(g.synced(), 1);

    // The host drops the connection: the next request synchronises again.
    g.log.drop_connections();
    tokio::time::sleep(Duration::from_millis(100)).await;
    tunnel_round_trip(&g, upstream, 1000, 2).await;
    assert_eq!(g.synced(), 2);

    // A tunnel open while the host drops is cut, not hung.
    let mut c = g.proxy_conn().await;
    c.write_all(format!("CONNECT 127.0.0.1:{upstream} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    read_n(&mut c, 39).await;
    c.write_all(b"ping").await.unwrap();
    assert_eq!(read_n(&mut c, 4).await, b"ping");
    g.log.drop_connections();
    let rest = read_to_end(c).await;
    assert!(rest.is_empty());

    // An identity step restarts the channel even though the host did not drop it.
    tunnel_round_trip(&g, upstream, 1000, 3).await;
    let synced = g.synced();
    let client = g.client().await;
    client
        .identity(&space_proto::Identity {
            sandbox_id: "sb-egress".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    tunnel_round_trip(&g, upstream, 1000, 4).await;
    assert_eq!(g.synced(), synced + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_get_the_proxy_environment() {
    let g = Guest::start().await;
    let c = g.client().await;
    // The daemon sets its egress up asynchronously; the proxy answering means it is up.
    let out = c.run(ExecSpec::argv(["env"])).await.unwrap();
    let env = String::from_utf8(out.stdout.to_vec()).unwrap();
    let url = format!("http://{}", g.proxy);
    for key in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        assert!(env.contains(&format!("{key}={url}\n")), "{key} in {env}");
    }
    assert!(env.contains("NO_PROXY=localhost,127.0.0.1,::1\n"), "{env}");
    // Not a VM: the CA was never installed, so no CA variables.
    assert!(!env.contains("SSL_CERT_FILE="), "{env}");
    // The request's environment wins, and so does the identity's.
    let out = c
        .run(ExecSpec::argv(["env"]).env("HTTPS_PROXY", "http://elsewhere:1"))
        .await
        .unwrap();
    let env = String::from_utf8(out.stdout.to_vec()).unwrap();
    assert!(env.contains("HTTPS_PROXY=http://elsewhere:1\n"), "{env}");
    assert!(env.contains(&format!("HTTP_PROXY={url}\n")), "{env}");
    let mut identity = space_proto::Identity {
        sandbox_id: "sb-env".into(),
        ..Default::default()
    };
    identity.env.insert("no_proxy".into(), "*".into());
    c.identity(&identity).await.unwrap();
    let out = c.run(ExecSpec::argv(["env"])).await.unwrap();
    let env = String::from_utf8(out.stdout.to_vec()).unwrap();
    assert!(env.contains("no_proxy=*\n"), "{env}");
    assert!(env.contains("NO_PROXY=localhost,127.0.0.1,::1\n"), "{env}");
    // An invalid CA is refused and changes nothing.
    identity.ca_pem = Some("-----BEGIN CERTIFICATE-----\nnot base64!\n".into());
    let err = c.identity(&identity).await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::InvalidArgument), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_route_is_full_duplex() {
    let g = Guest::start().await;
    let c = g.client().await;
    // Raw bytes both ways, with a half-close.
    let echo = echo_server().await;
    let tunnel = c.tcp(echo).await.unwrap();
    let (r, mut w) = tokio::io::split(tunnel);
    let data = random_bytes(2 * 1024 * 1024 + 5, 11);
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let back = read_to_end(r).await;
    writer.await.unwrap();
    assert_eq!(Sha256::digest(&back), Sha256::digest(&data));

    // HTTP/1.1 over the tunnel with hyper's client.
    let web = http_server().await;
    let tunnel = c.tcp(web).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tunnel))
        .await
        .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            Request::get("/hello")
                .header("host", "sandbox")
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"GET /hello HTTP/1.1\r\n"), "{body:?}");

    // Nothing listening: the structured error the host maps to 502.
    let err = c.tcp(free_port()).await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Unreachable), "{err}");
    assert_eq!(ErrorKind::Unreachable.http_status(), 502);
}

/// The egress port code path (`--egress-device`), on a pseudo-terminal in raw mode: one
/// descriptor that host connections use one after another, as a virtio-serial port is.
/// Bytes from the guest go to the newest host connection only; older ones are cut off.
mod port {
    use super::common::{raw_pty, PortBridge};
    use super::*;

    /// A new host connection on the bridge, served like the real gateway's loop would.
    fn connect(bridge: &PortBridge, log: &Arc<HostLog>) {
        let task = tokio::spawn(serve_conn(bridge.connect(), log.clone()));
        log.conns.lock().unwrap().push(task);
    }

    /// The host goes away without the guest noticing (as across a restore).
    fn disconnect(bridge: &PortBridge, log: &HostLog) {
        bridge.disconnect();
        log.drop_connections();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tunnels_over_a_port_across_a_host_change() {
        let pty = raw_pty();
        let dir = tempfile::tempdir().unwrap();
        let ctl = dir.path().join("ctl.sock");
        let proxy = format!("127.0.0.1:{}", free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_space-guestd"))
            .arg("--listen")
            .arg(&ctl)
            .arg("--egress-device")
            .arg(&pty.slave_path)
            .arg("--egress-listen")
            .arg(&proxy)
            .env("SPACE_GUESTD_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let log = Arc::new(HostLog::default());
        let g = Guest {
            child,
            ctl,
            proxy,
            log: log.clone(),
            _dir: dir,
        };
        let bridge = PortBridge::new(pty.master);
        connect(&bridge, &log);
        wait_for("the control socket", || {
            std::os::unix::net::UnixStream::connect(&g.ctl).is_ok()
        })
        .await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(&g.proxy).await.is_err() {
            assert!(Instant::now() < deadline, "the proxy did not start");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let upstream = echo_server().await;
        tunnel_round_trip(&g, upstream, 1024 * 1024 + 3, 21).await;
        assert_eq!(g.synced(), 1);

        // A new host takes over the port (the guest saw no disconnect) and sends the identity
        // step, as after a restore: the next tunnel runs on a freshly synchronised connection.
        disconnect(&bridge, &log);
        connect(&bridge, &log);
        let c = GuestClient::connect(UnixStream::connect(&g.ctl).await.unwrap())
            .await
            .unwrap();
        c.identity(&space_proto::Identity {
            sandbox_id: "sb-port".into(),
            ..Default::default()
        })
        .await
        .unwrap();
        tunnel_round_trip(&g, upstream, 300_000, 22).await;
        assert_eq!(g.synced(), 2);
        drop(pty.slave);
    }
}
