//! The egress group (`space-bench egress`): what the egress gateway (`space_gateway`,
//! `docs/egress.md`) adds to an HTTPS request, measured in one process without a VM.
//!
//! The run starts a real HTTPS upstream on 127.0.0.1 (tokio-rustls, a certificate for
//! `localhost` from a CA made for the run) that answers `GET /small` with 200 bytes and
//! `GET /big` with `--big-mib` MiB streamed from one buffer, then opens a real
//! [`Gateway`] in a temporary directory trusting that CA, and two sandboxes whose policy
//! allows `localhost` exactly (it resolves to a loopback address, which only an exact allow
//! rule reaches):
//!
//! - **tunnel**: no credentials bound, so a CONNECT is spliced after the SNI check;
//! - **intercepted**: one credential bound to `localhost`, so every TLS tunnel is terminated
//!   with a leaf minted from the gateway's CA, the placeholder in `Authorization` is replaced
//!   by the real value, and the request goes on over a second TLS connection.
//!
//! Each sandbox is driven through the guest's wire protocol: a Unix stream pair whose host end
//! is served by [`space_gateway::serve`], the sync line, an HTTP/2 client with the
//! guest daemon's window settings, `POST /v1/egress/connect`, and TLS through the stream. The
//! reference (**direct**) is the same request made straight to the upstream: a new TCP
//! connection, TLS, the request. Every request is a new connection (`Connection: close`,
//! client-side TLS resumption off, as a fresh `curl` would be), read to the end of the
//! connection.
//!
//! Before anything is timed, one request per path checks that it works: the upstream must see
//! the placeholder through the tunnel and the real value through the interception.
//!
//! Nothing is asserted about timing; the numbers are for reading.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::{Body as _, Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use space_gateway::{Gateway, SandboxGateway};
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{
    CreateRequest, GatewayConfig, Node, NodeConfig, PoolConfig, SandboxId, SecretBinding,
    SecretSource, SecretValue, TemplateRef, TemplateSpec,
};
use space_proto::ExecSpec;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::mpsc;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::PollSender;

use crate::bench::progress;
use crate::host::{host_summary, kernel_version, load_average, utc_timestamp};
use crate::node::DataDir;
use crate::stats::{fmt_value, mb_per_s, Samples, Summary, Table};

/// The name the upstream's certificate carries and every request connects to.
const UPSTREAM_HOST: &str = "localhost";
/// Size of the small response's body.
const SMALL_BODY: usize = 200;
/// Uncounted rounds before the small requests are timed.
const WARMUP: usize = 10;
/// Bound on one small request.
const SMALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on one large download.
const BIG_TIMEOUT: Duration = Duration::from_secs(600);
/// The bound credential's name.
const SECRET_NAME: &str = "BENCH_TOKEN";
/// The value the gateway puts in place of the placeholder.
const SECRET_VALUE: &str = "bench-real-credential-4f1c2a9e7d3b";
/// Bytes the upstream writes per call while streaming `/big`.
const BIG_CHUNK: usize = 256 * 1024;
/// Bytes the client reads per call.
const READ_CHUNK: usize = 256 * 1024;
/// Most bytes of a request or response head either side reads.
const MAX_HEAD: usize = 64 * 1024;

/// What the egress benchmark runs.
#[derive(Debug, Clone)]
pub struct EgressPlan {
    /// Counted small requests per path.
    pub runs: usize,
    /// Counted large downloads per path.
    pub big_runs: usize,
    /// Size of the large download in MiB.
    pub big_mib: u64,
    /// The in-guest group, when asked for.
    pub guest: Option<GuestPlan>,
}

/// The in-guest group: `curl` inside real guests through the node's gateway.
#[derive(Debug, Clone)]
pub struct GuestPlan {
    /// Counted `curl` runs per path.
    pub runs: usize,
    /// Guest kernel.
    pub kernel: PathBuf,
    /// A root image with `curl` (the `base` image).
    pub rootfs: PathBuf,
    /// QEMU binary.
    pub qemu: PathBuf,
}

/// The three ways a request goes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// Straight to the upstream from the host.
    Direct,
    /// Through the gateway of a sandbox without credentials: spliced.
    Tunnel,
    /// Through the gateway of a sandbox with a credential bound: intercepted.
    Intercepted,
}

impl Path {
    const ALL: [Path; 3] = [Path::Direct, Path::Tunnel, Path::Intercepted];

    fn name(self) -> &'static str {
        match self {
            Path::Direct => "direct",
            Path::Tunnel => "tunnel",
            Path::Intercepted => "intercepted",
        }
    }
}

/// Runs the egress group; `interrupted` ends the run early (the temporary directory and every
/// task go with it).
pub async fn run(plan: &EgressPlan, interrupted: impl Future<Output = &'static str>) -> Result<()> {
    let mut dir = match plan.guest {
        Some(_) => Some(DataDir::with_prefix("space-bench-egress-")?),
        None => None,
    };
    let mut slot: Option<Node> = None;
    let result = tokio::select! {
        r = measure(plan, dir.as_ref(), &mut slot) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    if let Some(node) = slot.take() {
        progress("shutting the node down (every VM killed)");
        if let Ok(list) = node.list().await {
            for s in list {
                if s.state != space_node::State::Terminated {
                    let _ = node.kill(&s.id).await;
                }
            }
        }
        if tokio::time::timeout(Duration::from_secs(120), node.shutdown())
            .await
            .is_err()
        {
            eprintln!("space-bench: the node did not shut down within 2 minutes");
        }
    }
    let cleaned = match dir.as_mut() {
        Some(d) => tokio::task::block_in_place(|| d.cleanup()),
        None => Ok(()),
    };
    crate::bench::with_cleanup(result, cleaned)
}

async fn measure(plan: &EgressPlan, dir: Option<&DataDir>, slot: &mut Option<Node>) -> Result<()> {
    let bench = Setup::start(plan.big_mib << 20).await?;
    println!("space-bench egress {}", utc_timestamp(SystemTime::now()));
    println!("host:        {}", host_summary());
    println!(
        "setup:       one process: HTTPS upstream on 127.0.0.1:{} (rustls, ring), the gateway, \
         and a client per path; every request a new connection (TLS resumption off in the \
         client), `Connection: close`, read to the end",
        bench.upstream.port
    );
    println!(
        "paths:       direct = TCP + TLS to {UPSTREAM_HOST}; tunnel / intercepted = \
         POST /v1/egress/connect on the sandbox's HTTP/2 egress stream, then TLS through it \
         (sandbox without / with a credential bound)"
    );
    println!(
        "runs:        {} small requests per path after {WARMUP} uncounted rounds; {} downloads \
         of {} MiB per path after 1 uncounted round; paths alternate, each round starting \
         with the next one",
        plan.runs, plan.big_runs, plan.big_mib
    );
    println!();
    bench.check().await?;
    let small = bench.small(plan.runs).await?;
    let big = bench.big(plan.big_runs, plan.big_mib).await?;
    if let (Some(gp), Some(dir)) = (&plan.guest, dir) {
        bench.in_guest(gp, dir, slot).await?;
    }

    let mut summary = Summary::new();
    summary.add(
        "tunnel / direct, small request",
        &small.total[1],
        &small.total[0],
        "latency",
    );
    summary.add(
        "intercepted / direct, small request",
        &small.total[2],
        &small.total[0],
        "latency",
    );
    if plan.big_runs > 0 {
        summary.add(
            format!("tunnel / direct, {} MiB download", plan.big_mib),
            &big[1],
            &big[0],
            "throughput",
        );
        summary.add(
            format!("intercepted / direct, {} MiB download", plan.big_mib),
            &big[2],
            &big[0],
            "throughput",
        );
    }
    print!("{}", summary.render());
    let direct = small.total[0].percentile(50.0);
    for (i, path) in [(1, Path::Tunnel), (2, Path::Intercepted)] {
        if let (Some(p), Some(d)) = (small.total[i].percentile(50.0), direct) {
            println!(
                "{} adds {} ms at p50 to a small HTTPS request",
                path.name(),
                fmt_value(Some(p - d))
            );
        }
    }
    println!("\nload average at the end: {}", load_average());
    Ok(())
}

/// The small-request samples: the whole request per path, in [`Path::ALL`] order.
struct SmallSamples {
    total: [Samples; 3],
}

// ---- the run's pieces --------------------------------------------------------------------

/// Everything a run uses: the upstream, the gateway and one guest end per sandbox.
struct Setup {
    dir: tempfile::TempDir,
    /// The upstream's CA certificate, PEM, and the file holding it.
    upstream_ca: (String, PathBuf),
    upstream: Upstream,
    /// Trusts the upstream's CA only.
    upstream_tls: TlsConnector,
    /// Trusts the gateway's CA only.
    gateway_tls: TlsConnector,
    tunnel: GuestEnd,
    intercepted: GuestEnd,
    placeholder: String,
}

impl Setup {
    async fn start(big_bytes: u64) -> Result<Setup> {
        let dir = tempfile::Builder::new()
            .prefix("space-bench-egress-")
            .tempdir()
            .context("making a temporary directory")?;
        let ca = BenchCa::new()?;
        let upstream = Upstream::start(&ca, big_bytes).await?;
        let ca_file = dir.path().join("upstream-ca.pem");
        std::fs::write(&ca_file, &ca.pem).context("writing the upstream CA")?;
        let config = GatewayConfig {
            extra_roots: vec![ca_file.clone()],
            secrets: Some(Arc::new(FixedSecret)),
            ..GatewayConfig::default()
        };
        let gateway = Gateway::open(&dir.path().join("ca"), config)
            .map_err(|e| anyhow!("opening the gateway: {e}"))?;
        let policy: space_node::EgressPolicy = serde_json::from_value(serde_json::json!({
            "default": "deny",
            "allow": [UPSTREAM_HOST],
        }))
        .context("the bench policy")?;
        let binding = SecretBinding::new(
            SECRET_NAME,
            vec![UPSTREAM_HOST
                .parse()
                .map_err(|e| anyhow!("the binding's rule: {e}"))?],
        );
        let placeholder = binding.placeholder.clone();
        let plain = gateway.sandbox(SandboxId::generate(), policy.clone(), vec![]);
        let bound = gateway.sandbox(SandboxId::generate(), policy, vec![binding]);
        Ok(Setup {
            upstream_tls: tls_client(&ca.pem)?,
            gateway_tls: tls_client(&gateway.ca_pem())?,
            tunnel: GuestEnd::open(plain).await?,
            intercepted: GuestEnd::open(bound).await?,
            upstream,
            placeholder,
            upstream_ca: (ca.pem.clone(), ca_file),
            dir,
        })
    }

    /// One request on `path` for `target`; answers its timing.
    async fn request(&self, path: Path, target: &str) -> Result<Timed> {
        let auth = match path {
            Path::Direct => SECRET_VALUE,
            Path::Tunnel | Path::Intercepted => &self.placeholder,
        };
        let request = format!(
            "GET {target} HTTP/1.1\r\nHost: {UPSTREAM_HOST}:{}\r\nUser-Agent: space-bench\r\n\
             Accept: */*\r\nAuthorization: Bearer {auth}\r\nConnection: close\r\n\r\n",
            self.upstream.port
        );
        let start = Instant::now();
        let (answered, fetched) = match path {
            Path::Direct => {
                let tcp = TcpStream::connect((UPSTREAM_HOST, self.upstream.port))
                    .await
                    .context("connecting to the upstream")?;
                tcp.set_nodelay(true)?;
                let got = fetch(tcp, &self.upstream_tls, &request).await?;
                (None, got)
            }
            Path::Tunnel | Path::Intercepted => {
                let (guest, tls) = if path == Path::Tunnel {
                    (&self.tunnel, &self.upstream_tls)
                } else {
                    (&self.intercepted, &self.gateway_tls)
                };
                let tunnel = guest.connect(UPSTREAM_HOST, self.upstream.port).await?;
                let answered = start.elapsed();
                (Some(answered), fetch(tunnel, tls, &request).await?)
            }
        };
        Ok(Timed {
            total: start.elapsed(),
            connect_answered: answered,
            body: fetched,
        })
    }

    /// One request per path outside the timing: each must work, the upstream must see the
    /// placeholder through the tunnel and the real value through the interception.
    async fn check(&self) -> Result<()> {
        progress("checking each path once");
        for path in Path::ALL {
            let got = tokio::time::timeout(SMALL_TIMEOUT, self.request(path, "/small"))
                .await
                .map_err(|_| anyhow!("{}: no answer within {SMALL_TIMEOUT:?}", path.name()))?
                .with_context(|| format!("the {} path", path.name()))?;
            if got.body != SMALL_BODY as u64 {
                bail!(
                    "{}: a {}-byte body instead of {SMALL_BODY}",
                    path.name(),
                    got.body
                );
            }
            let seen = self.upstream.last_auth().unwrap_or_default();
            let want = match path {
                Path::Direct | Path::Intercepted => format!("Bearer {SECRET_VALUE}"),
                Path::Tunnel => format!("Bearer {}", self.placeholder),
            };
            if seen != want {
                bail!(
                    "{}: the upstream saw `Authorization: {seen}`, expected `{want}`",
                    path.name()
                );
            }
        }
        Ok(())
    }

    /// `runs` rounds of one small request per path (after the warm-up rounds); prints the
    /// table.
    async fn small(&self, runs: usize) -> Result<SmallSamples> {
        let mut total: [Samples; 3] = Default::default();
        let mut answered: [Samples; 3] = Default::default();
        for round in 0..WARMUP + runs {
            let counted = round >= WARMUP;
            if counted && (round - WARMUP + 1).is_multiple_of(50) {
                progress(&format!("small requests {}/{runs}", round - WARMUP + 1));
            }
            for k in 0..Path::ALL.len() {
                let i = (round + k) % Path::ALL.len();
                let path = Path::ALL[i];
                let got = tokio::time::timeout(SMALL_TIMEOUT, self.request(path, "/small"))
                    .await
                    .map_err(|_| anyhow!("{}: no answer within {SMALL_TIMEOUT:?}", path.name()))?
                    .with_context(|| format!("a small request on the {} path", path.name()))?;
                if got.body != SMALL_BODY as u64 {
                    bail!("{}: a {}-byte body", path.name(), got.body);
                }
                if counted {
                    total[i].push_duration(got.total);
                    if let Some(a) = got.connect_answered {
                        answered[i].push_duration(a);
                    }
                }
            }
        }
        let mut t = Table::new(format!(
            "Small HTTPS request (GET /small, {SMALL_BODY}-byte body), new connection each: \
             direct against through the gateway ({runs} rounds)"
        ));
        t.add(
            "direct: TCP + TLS + GET, response read",
            "ms",
            total[0].clone(),
        );
        t.add("tunnel: CONNECT answered 200", "ms", answered[1].clone());
        t.add(
            "tunnel: CONNECT + TLS + GET, response read",
            "ms",
            total[1].clone(),
        );
        t.add(
            "intercepted: CONNECT answered 200",
            "ms",
            answered[2].clone(),
        );
        t.add(
            "intercepted: CONNECT + TLS + GET, response read",
            "ms",
            total[2].clone(),
        );
        print!("{}", t.render());
        println!();
        Ok(SmallSamples { total })
    }

    /// `runs` rounds of one download per path (after one uncounted round); prints the table
    /// and answers MB/s per path.
    async fn big(&self, runs: usize, mib: u64) -> Result<[Samples; 3]> {
        let mut rates: [Samples; 3] = Default::default();
        let mut times: [Samples; 3] = Default::default();
        if runs == 0 {
            return Ok(rates);
        }
        let bytes = mib << 20;
        for round in 0..=runs {
            for k in 0..Path::ALL.len() {
                let i = (round + k) % Path::ALL.len();
                let path = Path::ALL[i];
                if round > 0 {
                    progress(&format!(
                        "{mib} MiB download {round}/{runs}, {}",
                        path.name()
                    ));
                }
                let got = tokio::time::timeout(BIG_TIMEOUT, self.request(path, "/big"))
                    .await
                    .map_err(|_| anyhow!("{}: no download within {BIG_TIMEOUT:?}", path.name()))?
                    .with_context(|| format!("a download on the {} path", path.name()))?;
                if got.body != bytes {
                    bail!("{}: {} of {bytes} bytes arrived", path.name(), got.body);
                }
                if round > 0 {
                    rates[i].push(mb_per_s(bytes, got.total));
                    times[i].push_duration(got.total);
                }
            }
        }
        let mut t = Table::new(format!(
            "Download of {mib} MiB (GET /big), new connection each, from the request to the \
             last byte ({runs} rounds)"
        ));
        for (i, path) in Path::ALL.iter().enumerate() {
            t.add(
                format!("{}: throughput", path.name()),
                "MB/s",
                rates[i].clone(),
            );
        }
        for (i, path) in Path::ALL.iter().enumerate() {
            t.add(format!("{}: time", path.name()), "ms", times[i].clone());
        }
        print!("{}", t.render());
        println!();
        Ok(rates)
    }
}

/// One request's outcome.
struct Timed {
    /// From the start (connect or CONNECT) to the end of the connection.
    total: Duration,
    /// For the gateway paths: until the gateway answered `200`.
    connect_answered: Option<Duration>,
    /// Body bytes received.
    body: u64,
}

/// The secret source of the run: one fixed value for [`SECRET_NAME`].
struct FixedSecret;

impl SecretSource for FixedSecret {
    fn value<'a>(
        &'a self,
        _sandbox: &'a SandboxId,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Option<SecretValue>> + Send + 'a>> {
        let value = (name == SECRET_NAME).then(|| SecretValue::from(SECRET_VALUE.to_owned()));
        Box::pin(async move { value })
    }
}

// ---- TLS ---------------------------------------------------------------------------------

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A TLS client trusting only the certificates in `ca_pem`, without session resumption.
fn tls_client(ca_pem: &str) -> Result<TlsConnector> {
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
struct BenchCa {
    pem: String,
    leaf: rustls::pki_types::CertificateDer<'static>,
    leaf_key: rustls::pki_types::PrivateKeyDer<'static>,
}

impl BenchCa {
    fn new() -> Result<BenchCa> {
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

/// TLS over `io` to [`UPSTREAM_HOST`], writes `request`, reads the response to the end of the
/// connection; answers the number of body bytes after checking the status and the length.
async fn fetch<S>(io: S, tls: &TlsConnector, request: &str) -> Result<u64>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = rustls::pki_types::ServerName::try_from(UPSTREAM_HOST)?.to_owned();
    let mut s = tls.connect(name, io).await.context("TLS handshake")?;
    s.write_all(request.as_bytes()).await?;
    s.flush().await?;
    let mut buf = vec![0u8; READ_CHUNK];
    let mut head = Vec::new();
    let mut expected: Option<u64> = None;
    let mut body = 0u64;
    loop {
        let n = match s.read(&mut buf).await {
            Ok(n) => n,
            // A peer that closes without close_notify after a complete response.
            Err(e)
                if e.kind() == io::ErrorKind::UnexpectedEof
                    && expected.is_some_and(|x| x == body) =>
            {
                0
            }
            Err(e) => return Err(e).context("reading the response"),
        };
        if n == 0 {
            break;
        }
        if expected.is_some() {
            body += n as u64;
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
                let length = resp
                    .headers
                    .iter()
                    .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                    .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok())
                    .ok_or_else(|| anyhow!("a response without Content-Length"))?;
                expected = Some(length);
                body = (head.len() - len) as u64;
            }
        }
    }
    match expected {
        Some(x) if x == body => Ok(body),
        Some(x) => bail!("{body} of {x} body bytes arrived"),
        None => bail!("the connection ended before a response head"),
    }
}

// ---- the upstream ------------------------------------------------------------------------

/// The HTTPS server: `/small`, `/big`; remembers the last `Authorization` it saw.
struct Upstream {
    port: u16,
    last_auth: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    async fn start(ca: &BenchCa, big_bytes: u64) -> Result<Upstream> {
        let cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![ca.leaf.clone()], ca.leaf_key.clone_key())?;
        let acceptor = TlsAcceptor::from(Arc::new(cfg));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let last_auth = Arc::new(Mutex::new(None));
        let seen = last_auth.clone();
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
        Ok(Upstream {
            port,
            last_auth,
            task,
        })
    }

    fn last_auth(&self) -> Option<String> {
        self.last_auth
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Bytes that do not compress to nothing, the same every run.
fn pattern(len: usize) -> Vec<u8> {
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

/// Reads one request head, answers it and closes the connection.
async fn answer<S>(
    mut s: S,
    seen: &Mutex<Option<String>>,
    big: &Bytes,
    big_bytes: u64,
) -> Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (path, auth) = loop {
        let parsed = {
            let mut fields = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut fields);
            match req.parse(&buf)? {
                httparse::Status::Complete(_) => Some((
                    req.path.unwrap_or_default().to_owned(),
                    req.headers
                        .iter()
                        .find(|h| h.name.eq_ignore_ascii_case("authorization"))
                        .map(|h| String::from_utf8_lossy(h.value).into_owned()),
                )),
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
    *seen.lock().unwrap_or_else(|e| e.into_inner()) = auth;
    match path.as_str() {
        "/small" => {
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
        "/big" => {
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
struct GuestEnd {
    send: hyper::client::conn::http2::SendRequest<ChanBody>,
    serve: tokio::task::JoinHandle<()>,
    conn: tokio::task::JoinHandle<()>,
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
    async fn open(sb: Arc<SandboxGateway>) -> Result<GuestEnd> {
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
    async fn connect(&self, host: &str, port: u16) -> Result<Tunnel> {
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

/// The bytes of one CONNECT: writes go into the request body, reads come from the response
/// body.
struct Tunnel {
    tx: PollSender<Bytes>,
    rx: Incoming,
    pending: Bytes,
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

// ---- curl inside real guests -------------------------------------------------------------

/// The template the in-guest group builds (its image has `curl`).
const GUEST_TEMPLATE: &str = "base";
/// Uncounted `curl` runs before the counted ones, per path.
const GUEST_WARMUP: usize = 3;
/// Apparent size of the node's sparse btrfs image.
const GUEST_LOOP_IMAGE: u64 = 8 << 30;
/// How long a cold boot may take to report ready (TCG).
const GUEST_READY: Duration = Duration::from_secs(180);
/// Where the upstream's CA goes in the tunnel sandbox.
const GUEST_CA: &str = "/tmp/bench-upstream-ca.pem";

/// Where the guest daemon writes the deployment CA.
const DEPLOYMENT_CA: &str = "/usr/local/share/ca-certificates/space-ca.crt";

/// Runs `script` in the guest (bounded by `limit`) and parses its `curl -w` lines.
async fn guest_curl(
    guest: &space_proto::client::GuestClient,
    script: String,
    what: &str,
    limit: Duration,
) -> Result<CurlTimes> {
    progress(&format!("curl in the guest: {what}"));
    let mut spec = ExecSpec::shell(script);
    spec.timeout_ms = Some(limit.as_millis() as u64);
    let out = tokio::time::timeout(limit, guest.run(spec))
        .await
        .map_err(|_| anyhow!("curl in the guest ({what}) took over {limit:?}"))??;
    curl_times(&String::from_utf8_lossy(&out.stdout), what)
        .with_context(|| format!("stderr: {}", String::from_utf8_lossy(&out.stderr)))
}

/// Timings `curl -w` reports, in ms.
#[derive(Default)]
struct CurlTimes {
    /// TLS with the server done (`time_appconnect`): through the proxy's CONNECT.
    tls: Samples,
    /// Response read (`time_total`).
    total: Samples,
}

/// The shell loop that runs `curl` `n` times against `url`, one line of `-w` output each.
fn curl_loop(n: usize, url: &str, cacert: Option<&str>, proxy: bool) -> String {
    let ca = cacert.map(|c| format!("--cacert {c} ")).unwrap_or_default();
    let proxy = if proxy {
        "--noproxy '' --proxy http://127.0.0.1:3128 "
    } else {
        ""
    };
    format!(
        "i=0; while [ $i -lt {n} ]; do i=$((i+1)); \
         curl -sS -m 30 -o /dev/null {proxy}{ca}-H \"Authorization: Bearer ${{{SECRET_NAME}:-none}}\" \
         -w '%{{http_code}} %{{time_appconnect}} %{{time_total}}\\n' {url} || echo failed; done"
    )
}

/// Parses the `curl -w` lines, drops the warm-up ones.
fn curl_times(out: &str, what: &str) -> Result<CurlTimes> {
    let mut times = CurlTimes::default();
    for (i, line) in out.lines().enumerate() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let parsed = match f.as_slice() {
            ["200", tls, total] => tls.parse::<f64>().ok().zip(total.parse::<f64>().ok()),
            _ => None,
        };
        let Some((tls, total)) = parsed else {
            bail!("{what}: curl reported {line:?}");
        };
        if i >= GUEST_WARMUP {
            times.tls.push(tls * 1e3);
            times.total.push(total * 1e3);
        }
    }
    Ok(times)
}

impl Setup {
    /// Boots `base` guests on a node whose gateway trusts the upstream's CA and knows the
    /// secret, and runs `curl` in them: a sandbox without credentials (tunnel) and one with
    /// the credential bound (intercepted); host `curl` straight to the upstream as reference.
    async fn in_guest(&self, gp: &GuestPlan, dir: &DataDir, slot: &mut Option<Node>) -> Result<()> {
        let decision = space_runtime::accel::detect()?;
        let mut cfg = NodeConfig::new(dir.data());
        cfg.storage = StorageOptions {
            driver: Some(DriverKind::Btrfs),
            loop_image_size: GUEST_LOOP_IMAGE,
            loop_image: true,
        };
        cfg.qemu.qemu = gp.qemu.clone();
        cfg.qemu.accel = Some(decision.accel);
        cfg.qemu.detached = false;
        cfg.ready_timeout = GUEST_READY;
        cfg.rolling.enabled = false;
        cfg.pools = PoolConfig::disabled();
        cfg.gateway = GatewayConfig {
            extra_roots: vec![self.upstream_ca.1.clone()],
            secrets: Some(Arc::new(FixedSecret)),
            ..GatewayConfig::default()
        };
        progress("opening a node for the in-guest group");
        let node = Node::open(cfg)
            .await
            .context("opening the node (needs root for the loop-mounted btrfs image)")?;
        *slot = Some(node.clone());
        progress("building the base template");
        let t = Instant::now();
        node.build_template(TemplateSpec {
            template: TemplateRef::new(GUEST_TEMPLATE, "bench")?,
            kernel: gp.kernel.clone(),
            rootfs: gp.rootfs.clone(),
            vcpus: 1,
            memory_mib: 256,
            kernel_cmdline: None,
            ready_timeout: GUEST_READY,
            guest: Default::default(),
            start: None,
            source: String::new(),
        })
        .await
        .context("building the base template")?;
        let built = t.elapsed();
        let policy: space_node::EgressPolicy = serde_json::from_value(serde_json::json!({
            "default": "deny",
            "allow": [UPSTREAM_HOST],
        }))?;
        let mut plain = CreateRequest::new(GUEST_TEMPLATE.parse()?);
        plain.options.egress = policy.clone();
        let mut bound = CreateRequest::new(GUEST_TEMPLATE.parse()?);
        bound.options.egress = policy;
        bound.options.secrets = vec![SecretBinding::new(
            SECRET_NAME,
            vec![UPSTREAM_HOST
                .parse()
                .map_err(|e| anyhow!("the binding's rule: {e}"))?],
        )];
        let plain = node
            .create(plain)
            .await
            .context("creating the tunnel sandbox")?;
        let bound = node
            .create(bound)
            .await
            .context("creating the intercepted sandbox")?;
        let plain_guest = node.guest(&plain.id).await?;
        let bound_guest = node.guest(&bound.id).await?;
        let put_ca = format!("cat > {GUEST_CA} <<'EOF'\n{}EOF\n", self.upstream_ca.0);
        let out = plain_guest.run(ExecSpec::shell(put_ca)).await?;
        if !out.status.success() {
            bail!("writing the CA in the guest: {:?}", out.status);
        }
        println!(
            "in-guest:    {} ({}), kernel {}; template {GUEST_TEMPLATE} ({}) built in {:.1} s; \
             curl in the guest through its proxy (127.0.0.1:3128, space.egress) to \
             https://{UPSTREAM_HOST}:{}/small",
            decision.accel.as_str().to_uppercase(),
            decision.reason,
            kernel_version(&gp.kernel).unwrap_or_else(|| "version string not found".into()),
            gp.rootfs.display(),
            built.as_secs_f64(),
            self.upstream.port
        );
        let url = format!("https://{UPSTREAM_HOST}:{}/small", self.upstream.port);
        let n = GUEST_WARMUP + gp.runs;
        let limit = Duration::from_secs(60) + Duration::from_secs(10) * n as u32;
        let tunnel = guest_curl(
            &plain_guest,
            curl_loop(n, &url, Some(GUEST_CA), true),
            "tunnel",
            limit,
        )
        .await?;
        let intercepted = guest_curl(
            &bound_guest,
            curl_loop(n, &url, Some(DEPLOYMENT_CA), true),
            "intercepted",
            limit,
        )
        .await?;
        let bundle = guest_curl(
            &bound_guest,
            curl_loop(n, &url, None, true),
            "intercepted, system bundle",
            limit,
        )
        .await?;
        if self.upstream.last_auth().as_deref() != Some(&format!("Bearer {SECRET_VALUE}")) {
            bail!(
                "the upstream saw `Authorization: {}` from the intercepted sandbox",
                self.upstream.last_auth().unwrap_or_default()
            );
        }
        progress(&format!("{n} curl runs on the host"));
        let host_ca = self.dir.path().join("host-ca.pem");
        std::fs::write(&host_ca, &self.upstream_ca.0)?;
        let out = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(curl_loop(n, &url, host_ca.to_str(), false))
            .env(SECRET_NAME, SECRET_VALUE)
            .output()
            .await
            .context("running curl on the host")?;
        let host = curl_times(&String::from_utf8_lossy(&out.stdout), "host")
            .with_context(|| format!("stderr: {}", String::from_utf8_lossy(&out.stderr)))?;
        let mut t = Table::new(format!(
            "curl for GET /small inside a real guest ({}: the guest CPU, and with it TLS in \
             the guest, is emulated) against host curl straight to the upstream ({} runs each \
             after {GUEST_WARMUP} uncounted; curl's own -w timings, process start excluded; \
             --cacert with the one CA that signs what the guest sees, or the guest's system \
             bundle as processes get it)",
            decision.accel.as_str().to_uppercase(),
            gp.runs
        ));
        t.add("host curl, direct: TLS done", "ms", host.tls);
        t.add("host curl, direct: response read", "ms", host.total);
        t.add("guest curl, tunnel: TLS done", "ms", tunnel.tls);
        t.add(
            "guest curl, tunnel: response read",
            "ms",
            tunnel.total.clone(),
        );
        t.add("guest curl, intercepted: TLS done", "ms", intercepted.tls);
        t.add(
            "guest curl, intercepted: response read",
            "ms",
            intercepted.total.clone(),
        );
        t.add(
            "guest curl, intercepted, system bundle: TLS done",
            "ms",
            bundle.tls,
        );
        t.add(
            "guest curl, intercepted, system bundle: response read",
            "ms",
            bundle.total,
        );
        print!("{}", t.render());
        if let (Some(a), Some(b)) = (
            intercepted.total.percentile(50.0),
            tunnel.total.percentile(50.0),
        ) {
            println!(
                "in the guest, interception adds {} ms at p50",
                fmt_value(Some(a - b))
            );
        }
        println!();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curl_lines_parse() {
        let out = "200 0.010 0.020\n".repeat(GUEST_WARMUP) + "200 0.001500 0.002500\n";
        let t = curl_times(&out, "x").unwrap();
        assert_eq!(t.tls.len(), 1);
        assert_eq!(t.tls.percentile(50.0), Some(1.5));
        assert_eq!(t.total.percentile(50.0), Some(2.5));
        assert!(curl_times("failed\n", "x").is_err());
        assert!(curl_times("403 0.0 0.1\n", "x").is_err());
        let script = curl_loop(3, "https://localhost:1/small", Some("/ca.pem"), true);
        assert!(script.contains("--cacert /ca.pem "), "{script}");
        assert!(script.contains("${BENCH_TOKEN:-none}"), "{script}");
        assert!(script.contains("%{time_appconnect}"), "{script}");
    }

    #[test]
    fn pattern_is_deterministic_and_varied() {
        let p = pattern(4096);
        assert_eq!(p, pattern(4096));
        let distinct = p.iter().collect::<std::collections::BTreeSet<_>>().len();
        assert!(distinct > 200, "{distinct} distinct bytes");
    }

    /// The whole group at a small size: every path works (the check includes the credential
    /// reaching the upstream only through the interception) and the tables fill.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_path_answers() {
        let bench = Setup::start(3 << 20).await.unwrap();
        bench.check().await.unwrap();
        let small = bench.small(2).await.unwrap();
        assert!(small.total.iter().all(|s| s.len() == 2));
        let big = bench.big(1, 3).await.unwrap();
        assert!(big.iter().all(|s| s.len() == 1));
        // A destination the policy does not name is refused by the gateway.
        let err = bench
            .tunnel
            .connect("127.0.0.2", bench.upstream.port)
            .await
            .err()
            .expect("the policy refuses 127.0.0.2");
        assert!(err.to_string().contains("403"), "{err:#}");
    }
}
