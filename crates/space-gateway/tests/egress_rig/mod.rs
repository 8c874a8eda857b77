//! What the egress gateway tests share: upstream servers (plain HTTP, and HTTPS with a
//! certificate from a CA made here), an audit and a secret source to look at, the guest's end
//! of the wire protocol, and a gateway set up with them.
#![allow(dead_code)]

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
use space_gateway::{
    EgressAudit, EgressEvent, EgressPolicy, Gateway, GatewayConfig, SandboxGateway, SecretSource,
    SecretValue,
};
use space_node_api::ids::SandboxId;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

// ---- upstream servers -------------------------------------------------------------------

/// What an upstream received: each request's head and body.
#[derive(Default)]
pub struct Seen(pub Mutex<Vec<(String, Vec<u8>)>>);

impl Seen {
    pub fn heads(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(h, _)| h.clone())
            .collect()
    }
}

/// Reads one request (head and Content-Length body), records it, answers and closes.
pub async fn answer_one<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, seen: Arc<Seen>) {
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
    seen.0.lock().unwrap().push((head.clone(), body.clone()));
    let _ = s.write_all(&reply(&path, &head, &body)).await;
    let _ = s.shutdown().await;
}

/// The upstream's answer: `/echo...` paths send the request body back (`-gzip`: compressed,
/// `-chunked`: chunked, `-header`: in a header too, `-br`: labelled as brotli, `-head`: the
/// request's head instead of its body), `/big?n=N`
/// sends N bytes (`/zeros-gzip?n=N`: N zeros, gzip-compressed), anything else says what it saw.
fn reply(path: &str, head: &str, body: &[u8]) -> Vec<u8> {
    let text = |status: &str, extra: &str, payload: &[u8]| {
        let mut out = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n{extra}Content-Length: {}\r\n\
             Connection: close\r\n\r\n",
            payload.len()
        )
        .into_bytes();
        if !head.starts_with("HEAD ") {
            out.extend_from_slice(payload);
        }
        out
    };
    let mut echoed = b"you sent: ".to_vec();
    echoed.extend_from_slice(body);
    match path {
        "/echo" => text("200 OK", "", &echoed),
        "/echo-gzip" => {
            use std::io::Write as _;
            let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            z.write_all(&echoed).unwrap();
            text("200 OK", "Content-Encoding: gzip\r\n", &z.finish().unwrap())
        }
        "/echo-br" => text("200 OK", "Content-Encoding: br\r\n", &echoed),
        "/echo-head" => text("200 OK", "", head.as_bytes()),
        "/echo-header" => {
            let v = String::from_utf8_lossy(body).replace(['\r', '\n'], "");
            text(
                "302 Found",
                &format!("Location: /login?was={v}\r\n"),
                &echoed,
            )
        }
        "/echo-chunked" => {
            let mut out =
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                    .to_vec();
            // Cut the echo into one-byte chunks so every value straddles chunk boundaries.
            for b in &echoed {
                out.extend_from_slice(format!("1\r\n{}\r\n", *b as char).as_bytes());
            }
            out.extend_from_slice(b"0\r\n\r\n");
            out
        }
        p if p.starts_with("/zeros-gzip?n=") => {
            use std::io::Write as _;
            let n: usize = p["/zeros-gzip?n=".len()..].parse().unwrap();
            let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            z.write_all(&vec![0u8; n]).unwrap();
            text("200 OK", "Content-Encoding: gzip\r\n", &z.finish().unwrap())
        }
        p if p.starts_with("/big?n=") => {
            let n: usize = p["/big?n=".len()..].parse().unwrap();
            text("200 OK", "", &vec![b'x'; n])
        }
        _ => text(
            "200 OK",
            "",
            format!("upstream saw {path} with {} body bytes", body.len()).as_bytes(),
        ),
    }
}

/// The body of an HTTP/1.1 response text: after the head, de-chunked when it is chunked.
pub fn response_body(resp: &[u8]) -> Vec<u8> {
    let at = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head")
        + 4;
    let head = String::from_utf8_lossy(&resp[..at]).to_ascii_lowercase();
    if !head.contains("transfer-encoding: chunked") {
        return resp[at..].to_vec();
    }
    let mut d = space_gateway::chunked::Decoder::new();
    let mut out = Vec::new();
    d.feed(&resp[at..], &mut out).unwrap();
    assert!(d.done(), "the chunked body is complete");
    out
}

/// A plain HTTP server on 127.0.0.1; answers its port.
pub async fn http_upstream(seen: Arc<Seen>) -> u16 {
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
pub async fn https_upstream(seen: Arc<Seen>) -> (u16, String) {
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
pub struct Audit(pub Mutex<Vec<EgressEvent>>);

impl EgressAudit for Audit {
    fn record(&self, event: EgressEvent) {
        self.0.lock().unwrap().push(event);
    }
}

impl Audit {
    pub fn ops(&self) -> Vec<(String, String)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|e| (e.operation.to_owned(), e.detail.clone()))
            .collect()
    }

    /// Waits until an event with `operation` whose detail contains `needle` arrives.
    pub async fn wait_for(&self, operation: &str, needle: &str) -> String {
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

pub struct Vault(pub HashMap<String, String>);

impl SecretSource for Vault {
    fn value<'a>(
        &'a self,
        _sandbox: &'a SandboxId,
        name: &'a str,
    ) -> Pin<Box<dyn std::future::Future<Output = Option<SecretValue>> + Send + 'a>> {
        Box::pin(async move { self.0.get(name).map(|v| SecretValue::from(v.clone())) })
    }
}

pub const SECRET: &str = "ghp_the-real-value-0123456789";
/// A password with characters every body encoding changes.
pub const PASSWORD: &str = "p@ss \"wörd\" &+/<x>'=%";

// ---- the guest's end --------------------------------------------------------------------

/// A request body fed from a channel.
pub struct ChanBody(pub mpsc::Receiver<Bytes>);

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
pub struct Guest {
    pub send: hyper::client::conn::http2::SendRequest<ChanBody>,
}

impl Guest {
    /// Opens a stream pair, hands one end to `gateway::serve`, syncs on the other (with stale
    /// bytes before the line, as a restored guest would leave).
    pub async fn connect(sb: Arc<SandboxGateway>) -> Guest {
        let (host_end, mut guest_end) = tokio::net::UnixStream::pair().unwrap();
        tokio::spawn(async move {
            let _ = space_gateway::serve(host_end, sb).await;
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
    pub async fn request(
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
    pub async fn forward(&mut self, host: &str, port: u16, raw: &[u8]) -> (u16, String) {
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
    pub async fn connect_tunnel(
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
pub fn tls_client(ca_pem: &str) -> tokio_rustls::TlsConnector {
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
pub async fn https_get(
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

pub struct Setup {
    pub _dir: tempfile::TempDir,
    pub gateway: Arc<Gateway>,
    pub audit: Arc<Audit>,
    pub http_seen: Arc<Seen>,
    pub https_seen: Arc<Seen>,
    pub http_port: u16,
    pub https_port: u16,
}

pub async fn setup(tune: impl FnOnce(&mut GatewayConfig)) -> Setup {
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
        secrets: Some(Arc::new(Vault(HashMap::from([
            ("GITHUB_TOKEN".to_owned(), SECRET.to_owned()),
            ("PASSWORD".to_owned(), PASSWORD.to_owned()),
        ])))),
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

pub fn policy(json: &str) -> EgressPolicy {
    serde_json::from_str(json).unwrap()
}

pub fn sandbox_id() -> SandboxId {
    "sbx-gatewaytest".parse().unwrap()
}

// ---- tests ------------------------------------------------------------------------------
