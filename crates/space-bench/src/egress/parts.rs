//! The egress group's parts: TLS, the HTTPS upstream, and the guest's end of the egress
//! stream.

use super::*;

pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS client trusting only the certificates in `ca_pem`, without session resumption.
pub(super) fn tls_client(ca_pem: &str) -> Result<TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut ca_pem.as_bytes()) {
        roots.add(cert.context("parsing a CA certificate")?)?;
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.resumption = rustls::client::Resumption::disabled();
    Ok(TlsConnector::from(Arc::new(cfg)))
}

/// The run's CA and the upstream's leaf for `localhost`.
pub(super) struct BenchCa {
    pub(super) pem: String,
    pub(super) leaf: rustls::pki_types::CertificateDer<'static>,
    pub(super) leaf_key: rustls::pki_types::PrivateKeyDer<'static>,
}

impl BenchCa {
    pub(super) fn new() -> Result<BenchCa> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "space-bench upstream CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(params, ca_key)?;
        let leaf_key = rcgen::KeyPair::generate()?;
        let leaf = rcgen::CertificateParams::new(vec![UPSTREAM_HOST.to_owned()])?
            .signed_by(&leaf_key, &ca)?;
        Ok(BenchCa {
            pem: ca.pem(),
            leaf: leaf.der().clone(),
            leaf_key: rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        })
    }
}

/// How a response's body is framed.
enum Framing {
    /// `Content-Length`: this many bytes.
    Length(u64),
    /// Chunked (what the gateway sends when it scrubs a response): decoded as it comes.
    Chunked(space_gateway::chunked::Decoder),
}

/// TLS over `io` to [`UPSTREAM_HOST`], writes `request`, reads the response to the end of the
/// connection; answers the number of body bytes after checking the status and the length
/// (or the chunked framing's end).
pub(super) async fn fetch<S>(io: S, tls: &TlsConnector, request: &[u8]) -> Result<u64>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = rustls::pki_types::ServerName::try_from(UPSTREAM_HOST)?.to_owned();
    let mut s = tls.connect(name, io).await.context("TLS handshake")?;
    s.write_all(request).await?;
    s.flush().await?;
    let mut buf = vec![0u8; READ_CHUNK];
    let mut head = Vec::new();
    let mut framing: Option<Framing> = None;
    let mut body = 0u64;
    let mut decoded = Vec::new();
    let complete = |framing: &Option<Framing>, body: u64| match framing {
        Some(Framing::Length(x)) => *x == body,
        Some(Framing::Chunked(d)) => d.done(),
        None => false,
    };
    loop {
        let n = match s.read(&mut buf).await {
            Ok(n) => n,
            // A peer that closes without close_notify after a complete response.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && complete(&framing, body) => 0,
            Err(e) => return Err(e).context("reading the response"),
        };
        if n == 0 {
            break;
        }
        let mut take = |bytes: &[u8], framing: &mut Option<Framing>| -> Result<()> {
            match framing {
                Some(Framing::Length(_)) => body += bytes.len() as u64,
                Some(Framing::Chunked(d)) => {
                    d.feed(bytes, &mut decoded)
                        .map_err(|e| anyhow!("chunked body: {e}"))?;
                    body += decoded.len() as u64;
                    decoded.clear();
                }
                None => {}
            }
            Ok(())
        };
        if framing.is_some() {
            take(&buf[..n], &mut framing)?;
            continue;
        }
        head.extend_from_slice(&buf[..n]);
        let mut fields = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut fields);
        match resp.parse(&head).context("parsing the response head")? {
            httparse::Status::Partial if head.len() > MAX_HEAD => {
                bail!("a response head larger than {MAX_HEAD} bytes")
            }
            httparse::Status::Partial => {}
            httparse::Status::Complete(len) => {
                let status = resp.code.unwrap_or(0);
                if status != 200 {
                    let text = String::from_utf8_lossy(&head);
                    bail!(
                        "status {status}: {}",
                        text.chars().take(400).collect::<String>()
                    );
                }
                let header = |name: &str| {
                    resp.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case(name))
                        .and_then(|h| std::str::from_utf8(h.value).ok())
                        .map(str::trim)
                };
                let f = if header("transfer-encoding")
                    .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
                {
                    Framing::Chunked(space_gateway::chunked::Decoder::new())
                } else {
                    let length = header("content-length")
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| anyhow!("a response without Content-Length or chunks"))?;
                    Framing::Length(length)
                };
                let rest = head[len..].to_vec();
                framing = Some(f);
                take(&rest, &mut framing)?;
            }
        }
    }
    match framing {
        Some(Framing::Length(x)) if x == body => Ok(body),
        Some(Framing::Length(x)) => bail!("{body} of {x} body bytes arrived"),
        Some(Framing::Chunked(d)) if d.done() => Ok(body),
        Some(Framing::Chunked(_)) => bail!("the chunked body ended early ({body} bytes)"),
        None => bail!("the connection ended before a response head"),
    }
}

// ---- the upstream ------------------------------------------------------------------------

/// The HTTPS server: `/small`, `/big`; remembers the last `Authorization` it saw.
pub(super) struct Upstream {
    pub(super) port: u16,
    pub(super) last: Arc<Mutex<LastRequest>>,
    pub(super) task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    pub(super) async fn start(ca: &BenchCa, big_bytes: u64) -> Result<Upstream> {
        let cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![ca.leaf.clone()], ca.leaf_key.clone_key())?;
        let acceptor = TlsAcceptor::from(Arc::new(cfg));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let last = Arc::new(Mutex::new(LastRequest::default()));
        let seen = last.clone();
        let big = Bytes::from(pattern(BIG_CHUNK));
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = tcp.set_nodelay(true);
                let (acceptor, seen, big) = (acceptor.clone(), seen.clone(), big.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        let _ = answer(tls, &seen, &big, big_bytes).await;
                    }
                });
            }
        });
        Ok(Upstream { port, last, task })
    }

    pub(super) fn last_auth(&self) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .auth
            .clone()
    }

    /// The body of the last request.
    pub(super) fn last_body(&self) -> Vec<u8> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .body
            .clone()
    }
}

/// Bytes that do not compress to nothing, the same every run.
pub(super) fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// What the upstream remembers of the last request.
#[derive(Default)]
pub(super) struct LastRequest {
    /// Its `Authorization`.
    pub(super) auth: Option<String>,
    /// Its body (at most 64 KiB).
    pub(super) body: Vec<u8>,
}

/// Reads one request (head, and a body of at most 64 KiB), answers it and closes the
/// connection. `/small` and `/login` answer 200 bytes, `/big` the large body.
pub(super) async fn answer<S>(
    mut s: S,
    seen: &Mutex<LastRequest>,
    big: &Bytes,
    big_bytes: u64,
) -> Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (path, auth, head_len, body_len) = loop {
        let parsed = {
            let mut fields = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut fields);
            match req.parse(&buf)? {
                httparse::Status::Complete(n) => {
                    let header = |name: &str| {
                        req.headers
                            .iter()
                            .find(|h| h.name.eq_ignore_ascii_case(name))
                            .map(|h| String::from_utf8_lossy(h.value).into_owned())
                    };
                    let length: usize = header("content-length")
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    Some((
                        req.path.unwrap_or_default().to_owned(),
                        header("authorization"),
                        n,
                        length.min(MAX_HEAD),
                    ))
                }
                httparse::Status::Partial => None,
            }
        };
        if let Some(p) = parsed {
            break p;
        }
        if buf.len() > MAX_HEAD {
            bail!("a request head larger than {MAX_HEAD} bytes");
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    while buf.len() < head_len + body_len {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            bail!("the request body ended early");
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    {
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.auth = auth;
        seen.body = buf[head_len..head_len + body_len].to_vec();
    }
    match path.as_str() {
        "/small" | "/login" => {
            let mut body = b"space-bench small response ".to_vec();
            body.resize(SMALL_BODY - 1, b'.');
            body.push(b'\n');
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n",
                body.len()
            );
            let mut out = head.into_bytes();
            out.extend_from_slice(&body);
            s.write_all(&out).await?;
        }
        "/big" | "/one-mib" => {
            let big_bytes = if path == "/big" { big_bytes } else { 1 << 20 };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n\
                 Content-Length: {big_bytes}\r\nConnection: close\r\n\r\n"
            );
            s.write_all(head.as_bytes()).await?;
            let mut left = big_bytes;
            while left > 0 {
                let n = left.min(big.len() as u64) as usize;
                s.write_all(&big[..n]).await?;
                left -= n as u64;
            }
        }
        _ => {
            s.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await?;
        }
    }
    s.shutdown().await?;
    Ok(())
}

// ---- the guest's end of the egress stream --------------------------------------------------

/// The guest side of one sandbox's egress stream: an HTTP/2 client after the sync line.
pub(super) struct GuestEnd {
    pub(super) send: hyper::client::conn::http2::SendRequest<ChanBody>,
    pub(super) serve: tokio::task::JoinHandle<()>,
    pub(super) conn: tokio::task::JoinHandle<()>,
}

impl Drop for GuestEnd {
    fn drop(&mut self) {
        self.conn.abort();
        self.serve.abort();
    }
}

impl GuestEnd {
    /// A stream pair whose host end the gateway serves for `sb`; syncs and starts HTTP/2 with
    /// the guest daemon's settings.
    pub(super) async fn open(sb: Arc<SandboxGateway>) -> Result<GuestEnd> {
        let (host_end, mut guest_end) = UnixStream::pair()?;
        let serve = tokio::spawn(async move {
            if let Err(e) = space_gateway::serve(host_end, sb).await {
                eprintln!("space-bench: the gateway's egress stream ended: {e}");
            }
        });
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let line = format!("SPACE-EGRESS/1 {:032x}\n", nanos);
        guest_end.write_all(line.as_bytes()).await?;
        let mut echo = vec![0u8; line.len()];
        tokio::time::timeout(SMALL_TIMEOUT, guest_end.read_exact(&mut echo))
            .await
            .map_err(|_| anyhow!("the gateway did not echo the sync line"))??;
        if echo != line.as_bytes() {
            bail!(
                "the gateway echoed {:?} instead of the sync line",
                String::from_utf8_lossy(&echo)
            );
        }
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .initial_stream_window_size(1024 * 1024)
            .initial_connection_window_size(8 * 1024 * 1024)
            .max_frame_size(256 * 1024);
        let (send, conn) = builder
            .handshake(TokioIo::new(guest_end))
            .await
            .context("HTTP/2 handshake on the egress stream")?;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(GuestEnd { send, serve, conn })
    }

    /// `POST /v1/egress/connect`; on `200` answers the byte stream through the tunnel.
    pub(super) async fn connect(&self, host: &str, port: u16) -> Result<Tunnel> {
        let (tx, rx) = mpsc::channel(16);
        let req = http::Request::post("http://gateway/v1/egress/connect")
            .header("space-host", host)
            .header("space-port", port.to_string())
            .body(ChanBody(rx))?;
        let mut send = self.send.clone();
        send.ready().await.context("the egress stream")?;
        let resp = send
            .send_request(req)
            .await
            .context("POST /v1/egress/connect")?;
        let status = resp.status();
        if status != http::StatusCode::OK {
            let body = resp.into_body().collect().await?.to_bytes();
            bail!(
                "CONNECT {host}:{port} answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        Ok(Tunnel {
            tx: PollSender::new(tx),
            rx: resp.into_body(),
            pending: Bytes::new(),
        })
    }
}

/// A request body fed from a channel.
pub(super) struct ChanBody(pub(super) mpsc::Receiver<Bytes>);

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

/// The bytes of one CONNECT: writes go into the request body, reads come from the response
/// body.
pub(super) struct Tunnel {
    pub(super) tx: PollSender<Bytes>,
    pub(super) rx: Incoming,
    pub(super) pending: Bytes,
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while self.pending.is_empty() {
            match ready!(Pin::new(&mut self.rx).poll_frame(cx)) {
                None => return Poll::Ready(Ok(())),
                Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.pending = data;
                    }
                }
            }
        }
        let n = self.pending.len().min(buf.remaining());
        let data = self.pending.split_to(n);
        buf.put_slice(&data);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let closed = || io::Error::new(io::ErrorKind::BrokenPipe, "the tunnel is closed");
        if ready!(self.tx.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(closed()));
        }
        if self.tx.send_item(Bytes::copy_from_slice(buf)).is_err() {
            return Poll::Ready(Err(closed()));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tx.close();
        Poll::Ready(Ok(()))
    }
}
