//! The egress gateway through its real wire protocol: a stream pair with the sync line and an
//! HTTP/2 client on the guest's end, real upstream servers on 127.0.0.1 (plain HTTP, and
//! HTTPS with a certificate from a CA made here), real TLS on both sides of an interception.

mod common;

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use space_node::gateway::{Gateway, SandboxGateway};
use space_node::{
    EgressAudit, EgressDefault, EgressEvent, EgressPolicy, GatewayConfig, SandboxId, SecretBinding,
    SecretSource, SecretValue,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

// ---- upstream servers -------------------------------------------------------------------

/// What an upstream received: each request's head and body.
#[derive(Default)]
struct Seen(Mutex<Vec<(String, Vec<u8>)>>);

impl Seen {
    fn heads(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(h, _)| h.clone())
            .collect()
    }
}

/// Reads one request (head and Content-Length body), records it, answers and closes.
async fn answer_one<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, seen: Arc<Seen>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_len, path, body_len) = loop {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut fields);
        if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
            let cl = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| std::str::from_utf8(h.value).ok()?.parse::<usize>().ok())
                .unwrap_or(0);
            break (n, req.path.unwrap_or("").to_owned(), cl);
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    while buf.len() < head_len + body_len {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let head = String::from_utf8_lossy(&buf[..head_len]).into_owned();
    let body = buf[head_len..head_len + body_len].to_vec();
    let reply = format!("upstream saw {path} with {} body bytes", body.len());
    seen.0.lock().unwrap().push((head, body));
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}",
        reply.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
    let _ = s.shutdown().await;
}

/// A plain HTTP server on 127.0.0.1; answers its port.
async fn http_upstream(seen: Arc<Seen>) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(answer_one(s, seen.clone()));
        }
    });
    port
}

/// A test CA and an HTTPS server on 127.0.0.1 with a certificate it signed for `localhost`;
/// answers the port and the CA's PEM.
async fn https_upstream(seen: Arc<Seen>) -> (u16, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gateway test upstream CA");
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    answer_one(tls, seen).await;
                }
            });
        }
    });
    (port, ca.pem())
}

// ---- control-plane stand-ins ------------------------------------------------------------

#[derive(Default)]
struct Audit(Mutex<Vec<EgressEvent>>);

impl EgressAudit for Audit {
    fn record(&self, event: EgressEvent) {
        self.0.lock().unwrap().push(event);
    }
}

impl Audit {
    fn ops(&self) -> Vec<(String, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|e| (e.operation.to_owned(), e.detail.clone()))
            .collect()
    }

    /// Waits until an event with `operation` whose detail contains `needle` arrives.
    async fn wait_for(&self, operation: &str, needle: &str) -> String {
        for _ in 0..200 {
            if let Some((_, d)) = self
                .ops()
                .into_iter()
                .find(|(o, d)| o == operation && d.contains(needle))
            {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("no {operation} event with {needle:?}; got {:?}", self.ops());
    }
}

struct Vault(HashMap<String, String>);

impl SecretSource for Vault {
    fn value<'a>(
        &'a self,
        _sandbox: &'a SandboxId,
        name: &'a str,
    ) -> Pin<Box<dyn std::future::Future<Output = Option<SecretValue>> + Send + 'a>> {
        Box::pin(async move { self.0.get(name).map(|v| SecretValue::from(v.clone())) })
    }
}

const SECRET: &str = "ghp_the-real-value-0123456789";

// ---- the guest's end --------------------------------------------------------------------

/// A request body fed from a channel.
struct ChanBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

/// The guest side of one gateway: an HTTP/2 client after the sync line.
struct Guest {
    send: hyper::client::conn::http2::SendRequest<ChanBody>,
}

impl Guest {
    /// Opens a stream pair, hands one end to `gateway::serve`, syncs on the other (with stale
    /// bytes before the line, as a restored guest would leave).
    async fn connect(sb: Arc<SandboxGateway>) -> Guest {
        let (host_end, mut guest_end) = tokio::net::UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let _ = space_node::gateway::serve(host_end, sb).await;
        });
        let line = b"SPACE-EGRESS/1 00112233445566778899aabbccddeeff\n";
        guest_end.write_all(b"stale \x00\xff bytes").await.unwrap();
        guest_end.write_all(line).await.unwrap();
        let mut echo = vec![0u8; line.len()];
        guest_end.read_exact(&mut echo).await.unwrap();
        assert_eq!(&echo, line);
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(guest_end))
                .await
                .unwrap();
        tokio::spawn(conn);
        Guest { send }
    }

    /// Sends one request; answers the response and the sender of the request body.
    async fn request(
        &mut self,
        path: &str,
        host: &str,
        port: &str,
    ) -> (http::Response<Incoming>, mpsc::Sender<Bytes>) {
        let (tx, rx) = mpsc::channel(16);
        let req = http::Request::post(format!("http://gateway{path}"))
            .header("space-host", host)
            .header("space-port", port)
            .body(ChanBody(rx))
            .unwrap();
        let resp = self.send.send_request(req).await.unwrap();
        (resp, tx)
    }

    /// A plain-HTTP forward of `raw`; answers the status and the body.
    async fn forward(&mut self, host: &str, port: u16, raw: &[u8]) -> (u16, String) {
        let (tx, rx) = mpsc::channel(16);
        tx.send(Bytes::copy_from_slice(raw)).await.unwrap();
        let req = http::Request::post("http://gateway/v1/egress/forward")
            .header("space-host", host)
            .header("space-port", port.to_string())
            .body(ChanBody(rx))
            .unwrap();
        let resp = self.send.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        drop(tx);
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// A CONNECT; on 200 answers a byte stream through the tunnel.
    async fn connect_tunnel(
        &mut self,
        host: &str,
        port: u16,
    ) -> Result<tokio::io::DuplexStream, (u16, String)> {
        let (resp, tx) = self
            .request("/v1/egress/connect", host, &port.to_string())
            .await;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            return Err((status, String::from_utf8_lossy(&body).into_owned()));
        }
        let (mine, theirs) = tokio::io::duplex(64 * 1024);
        let (mut r, mut w) = tokio::io::split(theirs);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match r.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(Bytes::copy_from_slice(&buf[..n])).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        tokio::spawn(async move {
            let mut body = resp.into_body();
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(d) = frame.into_data() {
                    if w.write_all(&d).await.is_err() {
                        break;
                    }
                }
            }
            let _ = w.shutdown().await;
        });
        Ok(mine)
    }
}

/// TLS client config trusting `ca_pem`.
fn tls_client(ca_pem: &str) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// An HTTPS request through a tunnel; answers the whole response text.
async fn https_get(
    tunnel: tokio::io::DuplexStream,
    trust: &str,
    sni: &str,
    request: &str,
) -> io::Result<String> {
    let name = rustls::pki_types::ServerName::try_from(sni.to_owned()).unwrap();
    let mut tls = tls_client(trust).connect(name, tunnel).await?;
    tls.write_all(request.as_bytes()).await?;
    let mut out = Vec::new();
    match tls.read_to_end(&mut out).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !out.is_empty() => {}
        Err(e) => return Err(e),
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

struct Setup {
    _dir: tempfile::TempDir,
    gateway: Arc<Gateway>,
    audit: Arc<Audit>,
    http_seen: Arc<Seen>,
    https_seen: Arc<Seen>,
    http_port: u16,
    https_port: u16,
}

async fn setup(tune: impl FnOnce(&mut GatewayConfig)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (http_seen, https_seen) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
    let http_port = http_upstream(http_seen.clone()).await;
    let (https_port, upstream_ca) = https_upstream(https_seen.clone()).await;
    let ca_file = dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, upstream_ca).unwrap();
    let audit = Arc::new(Audit::default());
    let mut config = GatewayConfig {
        extra_roots: vec![ca_file],
        audit: Some(audit.clone()),
        secrets: Some(Arc::new(Vault(HashMap::from([(
            "GITHUB_TOKEN".to_owned(),
            SECRET.to_owned(),
        )])))),
        ..GatewayConfig::default()
    };
    tune(&mut config);
    let gateway = Gateway::open(&dir.path().join("ca"), config).unwrap();
    Setup {
        _dir: dir,
        gateway,
        audit,
        http_seen,
        https_seen,
        http_port,
        https_port,
    }
}

fn policy(json: &str) -> EgressPolicy {
    serde_json::from_str(json).unwrap()
}

fn sandbox_id() -> SandboxId {
    "sbx-gatewaytest".parse().unwrap()
}

// ---- tests ------------------------------------------------------------------------------

#[tokio::test]
async fn forward_policy_private_addresses_and_live_policy_changes() {
    let s = setup(|_| {}).await;
    let sb = s.gateway.sandbox(
        sandbox_id(),
        policy(r#"{"allow": ["127.0.0.1"], "deny": ["*.blocked.example"]}"#),
        vec![],
    );
    let mut g = Guest::connect(sb.clone()).await;
    let raw = format!(
        "POST http://127.0.0.1:{}/hello?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\nContent-Length: 4\r\n\r\nabcdEXTRA",
        s.http_port
    );
    let (status, body) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(
        body.ends_with("upstream saw /hello?x=1 with 4 body bytes"),
        "{body}"
    );
    let heads = s.http_seen.heads();
    assert!(
        heads[0].starts_with("POST /hello?x=1 HTTP/1.1\r\n"),
        "{heads:?}"
    );
    assert!(heads[0].contains("Connection: close\r\n"));
    assert!(!heads[0].contains("keep-alive"));
    let d = s.audit.wait_for("egress.allow", "kind=forward").await;
    assert!(
        d.contains("rule=127.0.0.1") && d.contains(&format!("127.0.0.1:{}", s.http_port)),
        "{d}"
    );

    // Denied by rule: 403 with the reason, audited.
    let (status, body) = g
        .forward(
            "x.blocked.example",
            80,
            b"GET http://x.blocked.example/ HTTP/1.1\r\n\r\n",
        )
        .await;
    assert_eq!(status, 403);
    assert!(body.contains("rule *.blocked.example"), "{body}");
    s.audit.wait_for("egress.deny", "reason=policy").await;

    // A name resolving to loopback, allowed only through the default: private, refused.
    let err = g
        .connect_tunnel("localhost", s.https_port)
        .await
        .unwrap_err();
    assert_eq!(err.0, 403, "{err:?}");
    assert!(err.1.contains("loopback"), "{err:?}");
    s.audit
        .wait_for("egress.deny", "reason=private_address")
        .await;

    // The request line must name what space-host says.
    let (status, body) = g
        .forward(
            "127.0.0.1",
            s.http_port,
            b"GET http://10.9.9.9/ HTTP/1.1\r\n\r\n",
        )
        .await;
    assert_eq!(status, 400, "{body}");

    // Bad headers.
    let (resp, _tx) = g.request("/v1/egress/connect", "bad_host!", "443").await;
    assert_eq!(resp.status(), 400);
    let (resp, _tx) = g.request("/v1/egress/connect", "a.example", "0").await;
    assert_eq!(resp.status(), 400);
    let (resp, _tx) = g.request("/v1/other", "a.example", "1").await;
    assert_eq!(resp.status(), 404);

    // A new policy applies to the next connection on the same stream.
    sb.set_policy(policy(r#"{"default": "deny"}"#));
    let raw = format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n\r\n", s.http_port);
    let (status, body) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 403);
    assert!(body.contains("default"), "{body}");
    sb.set_policy(policy(r#"{"allow": ["127.0.0.1:*"]}"#));
    let (status, _) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 200);
    // A wildcard does not open private addresses.
    sb.set_policy(policy(r#"{"default": "deny", "allow": ["*"]}"#));
    let (status, body) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("loopback"), "{body}");
}

#[tokio::test]
async fn tunnels_check_sni_and_splice() {
    let s = setup(|_| {}).await;
    let sb = s
        .gateway
        .sandbox(sandbox_id(), policy(r#"{"allow": ["localhost"]}"#), vec![]);
    let mut g = Guest::connect(sb).await;
    let upstream_ca = std::fs::read_to_string(s._dir.path().join("upstream-ca.pem")).unwrap();

    // Without bindings the upstream's own certificate comes through (no interception).
    let t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let resp = https_get(
        t,
        &upstream_ca,
        "localhost",
        "GET /spliced HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(
        resp.ends_with("upstream saw /spliced with 0 body bytes"),
        "{resp}"
    );
    let d = s.audit.wait_for("egress.allow", "kind=tunnel").await;
    assert!(d.contains("up=") && !d.contains("up=0 "), "{d}");

    // SNI naming another host: cut.
    let t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let r = https_get(t, &upstream_ca, "example.com", "GET / HTTP/1.1\r\n\r\n").await;
    assert!(r.is_err(), "{r:?}");
    s.audit.wait_for("egress.deny", "reason=sni_mismatch").await;

    // Not TLS at all: cut.
    let mut t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    t.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = t.read_to_end(&mut out).await;
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    s.audit.wait_for("egress.deny", "reason=not_tls").await;
    assert_eq!(s.https_seen.heads().len(), 1);

    // Nothing listens: 502.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let err = g.connect_tunnel("localhost", dead_port).await.unwrap_err();
    assert_eq!(err.0, 502, "{err:?}");
}

#[tokio::test]
async fn connection_limit_answers_429() {
    let s = setup(|c| c.max_connections = 1).await;
    let sb = s
        .gateway
        .sandbox(sandbox_id(), policy(r#"{"allow": ["localhost"]}"#), vec![]);
    let mut g = Guest::connect(sb).await;
    let held = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let err = g
        .connect_tunnel("localhost", s.https_port)
        .await
        .unwrap_err();
    assert_eq!(err.0, 429, "{err:?}");
    s.audit.wait_for("egress.deny", "reason=limit").await;
    // Closing the first frees its slot.
    drop(held);
    let mut ok = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        match g.connect_tunnel("localhost", s.https_port).await {
            Ok(_) => {
                ok = true;
                break;
            }
            Err((429, _)) => continue,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(ok, "the slot was never freed");
}

#[tokio::test]
async fn interception_puts_the_secret_in_and_refuses_exfiltration() {
    let s = setup(|_| {}).await;
    let bound = SecretBinding::new("GITHUB_TOKEN", vec!["localhost".parse().unwrap()]);
    let elsewhere = SecretBinding::new("GITHUB_TOKEN_2", vec!["api.github.com".parse().unwrap()]);
    let sb = s.gateway.sandbox(
        sandbox_id(),
        policy(r#"{"allow": ["localhost", "127.0.0.1"]}"#),
        vec![bound.clone(), elsewhere.clone()],
    );
    let mut g = Guest::connect(sb).await;
    let ca = s.gateway.ca_pem();

    // The guest trusts the deployment CA; the gateway verifies the upstream against the test
    // CA (extra_roots) and puts the value where the placeholder was.
    let t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let req = format!(
        "POST /api?key={p} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {p}\r\nContent-Length: 3\r\n\r\nxyz",
        p = bound.placeholder
    );
    let resp = https_get(t, &ca, "localhost", &req).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    assert!(resp.ends_with("with 3 body bytes"), "{resp}");
    let (head, body) = s.https_seen.0.lock().unwrap()[0].clone();
    assert!(
        head.contains(&format!("Authorization: Bearer {SECRET}\r\n")),
        "{head}"
    );
    assert!(
        head.starts_with(&format!("POST /api?key={SECRET} HTTP/1.1")),
        "{head}"
    );
    assert!(!head.contains(&bound.placeholder));
    assert_eq!(body, b"xyz");
    let d = s
        .audit
        .wait_for("credential.use", "secret=GITHUB_TOKEN ")
        .await;
    assert_eq!(d, "secret=GITHUB_TOKEN host=localhost");
    s.audit.wait_for("egress.allow", "kind=intercept").await;

    // A placeholder of a secret bound elsewhere: 403 inside the tunnel, nothing sent on.
    let t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let req = format!(
        "GET / HTTP/1.1\r\nHost: localhost\r\nX-Token: {}\r\n\r\n",
        elsewhere.placeholder
    );
    let resp = https_get(t, &ca, "localhost", &req).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 403 Forbidden"), "{resp}");
    assert!(resp.contains("X-Space-Egress: refused"), "{resp}");
    assert!(
        resp.ends_with("credential GITHUB_TOKEN_2 may not be sent to localhost"),
        "{resp}"
    );
    let d = s
        .audit
        .wait_for("credential.exfiltration", "GITHUB_TOKEN_2")
        .await;
    assert_eq!(d, "secret=GITHUB_TOKEN_2 host=localhost");
    assert_eq!(s.https_seen.heads().len(), 1);

    // Plain HTTP gets the same treatment.
    let raw = format!(
        "GET http://127.0.0.1:{}/p HTTP/1.1\r\nX-Token: {}\r\n\r\n",
        s.http_port, bound.placeholder
    );
    let (status, body) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body, "credential GITHUB_TOKEN may not be sent to 127.0.0.1");
    assert!(s.http_seen.heads().is_empty());

    // No event anywhere carries the value.
    for (op, detail) in s.audit.ops() {
        assert!(!detail.contains(SECRET), "{op}: {detail}");
    }
}

#[tokio::test]
async fn the_ca_persists_and_bad_roots_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = Gateway::open(&dir.path().join("ca"), GatewayConfig::default()).unwrap();
    let b = Gateway::open(&dir.path().join("ca"), GatewayConfig::default()).unwrap();
    assert_eq!(a.ca_pem(), b.ca_pem());
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let err = Gateway::open(
        &dir.path().join("ca"),
        GatewayConfig {
            extra_roots: vec![junk],
            ..GatewayConfig::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("no PEM certificate"), "{err}");
    let _ = EgressDefault::Deny;
}

/// The node's side on a real guest: the CA made at first start (key 0600) and sent with the
/// identity, the placeholder (never a value) in the guest's environment, an environment that
/// would hide the placeholder refused, the policy changed live, kept in the record and copied
/// by fork.
#[test]
fn node_sends_placeholders_and_keeps_the_policy() {
    common::with_node(
        common::Disk::Btrfs,
        |_| {},
        |node| async move {
            common::build_minimal(&node, "1").await;
            let ca_dir = node.layout().root().join("state").join("ca");
            let key_mode = std::fs::metadata(ca_dir.join("ca.key"))
                .unwrap()
                .permissions();
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&key_mode) & 0o777,
                0o600
            );
            assert_eq!(
                std::fs::read_to_string(ca_dir.join("ca.pem")).unwrap(),
                node.ca_pem()
            );
            let binding =
                SecretBinding::new("GITHUB_TOKEN", vec!["api.github.com".parse().unwrap()]);
            let mut options = space_node::SandboxOptions {
                egress: policy(r#"{"default": "deny", "allow": ["pypi.org"]}"#),
                secrets: vec![binding.clone()],
                ..Default::default()
            };
            options.env.insert("GITHUB_TOKEN".into(), "mine".into());
            let mut req = common::minimal();
            req.options = options.clone();
            let err = node.create(req).await.unwrap_err();
            assert!(err.to_string().contains("GITHUB_TOKEN"), "{err}");
            options.env.clear();
            let id = common::create(&node, options).await;
            let g = node.guest(&id).await.unwrap();
            assert_eq!(
                common::sh(&g, "echo $GITHUB_TOKEN").await.trim(),
                binding.placeholder
            );
            let info = node
                .set_egress(&id, policy(r#"{"allow": ["*.example.org:443"]}"#))
                .await
                .unwrap();
            assert_eq!(
                info.options.egress.allow[0].to_string(),
                "*.example.org:443"
            );
            let on_disk: serde_json::Value =
                serde_json::from_slice(&std::fs::read(node.record_path(&id)).unwrap()).unwrap();
            assert_eq!(
                on_disk["options"]["egress"]["allow"][0],
                "*.example.org:443"
            );
            assert_eq!(on_disk["options"]["secrets"][0]["name"], "GITHUB_TOKEN");
            let bad = serde_json::from_str::<EgressPolicy>(r#"{"allow": ["a b"]}"#);
            assert!(bad.is_err());
            let child = node.fork(&id).await.unwrap();
            assert_eq!(child.options.egress, info.options.egress);
            assert_eq!(child.options.secrets, vec![binding.clone()]);
            let cg = node.guest(&child.id).await.unwrap();
            assert_eq!(
                common::sh(&cg, "echo $GITHUB_TOKEN").await.trim(),
                binding.placeholder
            );
            node.kill(&child.id).await.unwrap();
            node.kill(&id).await.unwrap();
        },
    );
}

/// A DNS server played in the test: fixed answers per name, and one name whose answer
/// changes on every question (public first, then loopback).
struct Dns {
    fixed: HashMap<&'static str, Vec<std::net::IpAddr>>,
    rebinding: &'static str,
    questions: Mutex<Vec<String>>,
    loopback_port: u16,
}

impl space_node::gateway::resolve::Resolve for Dns {
    fn resolve<'a>(
        &'a self,
        name: &'a str,
        port: u16,
    ) -> space_node::gateway::resolve::Resolution<'a> {
        Box::pin(async move {
            let asked = {
                let mut q = self.questions.lock().unwrap();
                q.push(name.to_owned());
                q.iter().filter(|n| *n == name).count()
            };
            if name == self.rebinding {
                let ip: std::net::IpAddr = if asked % 2 == 1 {
                    "192.88.99.1".parse().unwrap()
                } else {
                    "127.0.0.1".parse().unwrap()
                };
                let port = if asked % 2 == 1 {
                    port
                } else {
                    self.loopback_port
                };
                return Ok(vec![std::net::SocketAddr::new(ip, port)]);
            }
            match self.fixed.get(name) {
                Some(ips) => Ok(ips
                    .iter()
                    .map(|ip| std::net::SocketAddr::new(*ip, self.loopback_port))
                    .collect()),
                None => Err(io::Error::new(io::ErrorKind::NotFound, "no such name")),
            }
        })
    }
}

#[tokio::test]
async fn every_way_to_the_host_and_private_networks_is_refused() {
    // A listener on loopback that counts who reaches it: nothing below may.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let loopback_port = listener.local_addr().unwrap().port();
    let reached = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = reached.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(s);
        }
    });
    let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    let dns = Arc::new(Dns {
        fixed: HashMap::from([
            ("localhost", vec![ip("127.0.0.1"), ip("::1")]),
            ("loopback.test", vec![ip("127.0.0.1")]),
            ("metadata.test", vec![ip("169.254.169.254")]),
            ("v6-loopback.test", vec![ip("::1")]),
            ("mapped.test", vec![ip("::ffff:127.0.0.1")]),
            ("private.test", vec![ip("10.0.0.7"), ip("fd00::7")]),
        ]),
        rebinding: "rebind.test",
        questions: Mutex::new(Vec::new()),
        loopback_port,
    });
    let resolver = dns.clone();
    let s = setup(move |c| {
        c.resolver = resolver;
        c.connect_timeout = Duration::from_secs(2);
    })
    .await;
    // Everything allowed by the default and by a wildcard: only the private-address rule
    // stands between the guest and the host.
    let sb = s
        .gateway
        .sandbox(sandbox_id(), policy(r#"{"allow": ["*"]}"#), vec![]);
    let mut g = Guest::connect(sb).await;

    let literals = [
        "127.0.0.1",
        "127.1",
        "127.0.1",
        "2130706433",
        "0x7f000001",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "017700000001",
        "127.0.0.1.",
        "127.254.0.9",
        "0.0.0.0",
        "0",
        "::1",
        "::",
        "::ffff:127.0.0.1",
        "::ffff:7f00:1",
        "::ffff:0:7f00:1",
        "::127.0.0.1",
        "64:ff9b::7f00:1",
        "2002:7f00:1::1",
        "169.254.169.254",
        "0251.0376.0251.0376",
        "2852039166",
        "::ffff:169.254.169.254",
        "fd00:ec2::254",
        "100.100.100.200",
        "169.254.1.1",
        "fe80::1",
        "10.0.0.1",
        "172.16.0.1",
        "192.168.0.1",
        "100.64.0.1",
        "fc00::1",
    ];
    let names = [
        "localhost",
        "loopback.test",
        "metadata.test",
        "v6-loopback.test",
        "mapped.test",
        "private.test",
    ];
    for host in literals.iter().chain(names.iter()) {
        let err = g.connect_tunnel(host, loopback_port).await.unwrap_err();
        assert_eq!(err.0, 403, "CONNECT {host}: {err:?}");
        assert!(err.1.contains("address"), "CONNECT {host}: {err:?}");
        let raw = format!("GET http://{host}:{loopback_port}/ HTTP/1.1\r\nHost: {host}\r\n\r\n");
        let (status, body) = g.forward(host, loopback_port, raw.as_bytes()).await;
        assert!(
            status == 403 || status == 400,
            "forward {host}: {status} {body}"
        );
    }
    s.audit
        .wait_for("egress.deny", "reason=private_address")
        .await;
    // Numbers no resolver reads as one address are refused as hosts, not looked up.
    for bad in [
        "1.2.3.4.5",
        "256.0.0.1",
        "4294967296",
        "127.0.0.1%lo",
        "[::1]",
    ] {
        let (resp, _tx) = g.request("/v1/egress/connect", bad, "80").await;
        assert_eq!(resp.status(), 400, "{bad}");
    }

    // A name whose answer changes between questions: the gateway asks once per connection
    // and connects to the address it checked. The first answer is public (and unroutable
    // here, so the connection fails); the loopback answer that follows is never used for it.
    let err = g
        .connect_tunnel("rebind.test", loopback_port)
        .await
        .unwrap_err();
    assert!(matches!(err.0, 502 | 504), "{err:?}");
    let asked = |name: &str| {
        dns.questions
            .lock()
            .unwrap()
            .iter()
            .filter(|n| *n == name)
            .count()
    };
    assert_eq!(asked("rebind.test"), 1, "one connection, one question");
    // The next connection gets the loopback answer, and is refused for it.
    let err = g
        .connect_tunnel("rebind.test", loopback_port)
        .await
        .unwrap_err();
    assert_eq!(err.0, 403, "{err:?}");
    assert!(err.1.contains("loopback"), "{err:?}");
    assert_eq!(asked("rebind.test"), 2);

    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "something reached the host's loopback"
    );
}

#[tokio::test]
async fn a_hostile_guest_end_is_bounded_and_the_others_are_served() {
    let s = setup(|c| c.max_connections = 8).await;
    let hostile_sb = s
        .gateway
        .sandbox(sandbox_id(), policy(r#"{"allow": ["localhost"]}"#), vec![]);
    let other_sb = s.gateway.sandbox(
        "sbx-gatewayother".parse().unwrap(),
        policy(r#"{"allow": ["localhost"]}"#),
        vec![],
    );

    // Thousands of streams at once: the first few get tunnels, the rest 429 (or the HTTP/2
    // stream limit), and nothing hangs.
    let g = Guest::connect(hostile_sb.clone()).await;
    let mut asks = Vec::new();
    for _ in 0..2000 {
        let mut send = g.send.clone();
        let port = s.https_port;
        asks.push(tokio::spawn(async move {
            let (tx, rx) = mpsc::channel::<Bytes>(1);
            let req = http::Request::post("http://gateway/v1/egress/connect")
                .header("space-host", "localhost")
                .header("space-port", port.to_string())
                .body(ChanBody(rx))
                .unwrap();
            let status = match send.send_request(req).await {
                Ok(resp) => resp.status().as_u16(),
                Err(_) => 0,
            };
            // Hold a granted tunnel open until every stream has been answered.
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(tx);
            status
        }));
    }
    let mut granted = 0;
    let mut limited = 0;
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        for a in asks {
            match a.await.unwrap() {
                200 => granted += 1,
                429 | 0 => limited += 1,
                other => panic!("stream answered {other}"),
            }
        }
    })
    .await;
    assert!(all.is_ok(), "the streams were not all answered within 60 s");
    assert!(granted <= 8, "{granted} tunnels past a limit of 8");
    assert!(limited >= 1992, "{limited} refused");
    s.audit.wait_for("egress.deny", "reason=limit").await;

    // Garbage after the sync line: the connection ends; a new one is served.
    let (host_end, mut guest_end) = tokio::net::UnixStream::pair().unwrap();
    let served = tokio::spawn(space_node::gateway::serve(host_end, hostile_sb.clone()));
    let line = b"SPACE-EGRESS/1 00112233445566778899aabbccddeeff\n";
    guest_end.write_all(line).await.unwrap();
    let mut echo = vec![0u8; line.len()];
    guest_end.read_exact(&mut echo).await.unwrap();
    let junk: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 + 3) as u8).collect();
    let _ = guest_end.write_all(&junk).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), served).await;
    assert!(ended.is_ok(), "a connection of garbage was not ended");
    drop(guest_end);

    // A preface and then frames that break the protocol: the same.
    let (host_end, mut guest_end) = tokio::net::UnixStream::pair().unwrap();
    let served = tokio::spawn(space_node::gateway::serve(host_end, hostile_sb.clone()));
    guest_end.write_all(line).await.unwrap();
    guest_end.read_exact(&mut echo).await.unwrap();
    guest_end
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // A SETTINGS frame claiming 16 MiB, then a HEADERS frame on stream 0.
    let _ = guest_end
        .write_all(&[0xff, 0xff, 0xff, 0x04, 0, 0, 0, 0, 0])
        .await;
    let _ = guest_end
        .write_all(&[0, 0, 4, 0x01, 0x04, 0, 0, 0, 0, 1, 2, 3, 4])
        .await;
    let ended = tokio::time::timeout(Duration::from_secs(10), served).await;
    assert!(ended.is_ok(), "a connection breaking HTTP/2 was not ended");

    // The other sandbox was served all along, and the hostile one again once it behaves.
    let mut other = Guest::connect(other_sb).await;
    let t = other.connect_tunnel("localhost", s.https_port).await;
    assert!(t.is_ok(), "{:?}", t.err());
    drop(g);
    let mut again = Guest::connect(hostile_sb).await;
    let mut ok = false;
    for _ in 0..100 {
        match again.connect_tunnel("localhost", s.https_port).await {
            Ok(_) => {
                ok = true;
                break;
            }
            Err((429, _)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(ok, "the hostile sandbox's slots were never freed");
}
