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
//! Then credentials in bodies (`bodies`): a form POST whose body gets the value, and a 1 MiB
//! response scrubbed of it, against the same requests through an interception with nothing
//! to do for that host.
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

mod bodies;
mod in_guest;
mod parts;

use parts::*;

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
    let bodies = bench.bodies(plan.runs).await?;
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
    bodies.summarize(&mut summary);
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
    /// Intercepted too, its credential bound to another host: nothing to put in or scrub
    /// for the upstream.
    elsewhere: GuestEnd,
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
        let other = SecretBinding::new(
            SECRET_NAME,
            vec!["elsewhere.invalid"
                .parse()
                .map_err(|e| anyhow!("the binding's rule: {e}"))?],
        );
        let plain = gateway.sandbox(SandboxId::generate(), policy.clone(), vec![]);
        let elsewhere = gateway.sandbox(SandboxId::generate(), policy.clone(), vec![other]);
        let bound = gateway.sandbox(SandboxId::generate(), policy, vec![binding]);
        Ok(Setup {
            upstream_tls: tls_client(&ca.pem)?,
            gateway_tls: tls_client(&gateway.ca_pem())?,
            tunnel: GuestEnd::open(plain).await?,
            intercepted: GuestEnd::open(bound).await?,
            elsewhere: GuestEnd::open(elsewhere).await?,
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
                let got = fetch(tcp, &self.upstream_tls, request.as_bytes()).await?;
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
                (
                    Some(answered),
                    fetch(tunnel, tls, request.as_bytes()).await?,
                )
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // Credentials in bodies: the check inside makes sure the form got the value only on
        // the substituted path.
        bench.bodies(2).await.unwrap();
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
