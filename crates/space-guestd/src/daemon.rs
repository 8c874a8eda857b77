//! The daemon's shared state and its top-level run loop: options, start time, identity, the
//! process table, counters that bound concurrent work, and the shutdown signal.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use space_proto::limits::{MAX_ENV_BYTES, MAX_ENV_VARS};
use space_proto::{ErrorKind, ProtoError};
use tokio::sync::watch;

pub use crate::processes::ProcessTable;
use crate::ratelimit::RateLimiter;
use crate::reaper::{Reaper, ReaperError};

/// Environment every process starts from, before identity and request environment.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Destinations that bypass the egress proxy.
const NO_PROXY: &str = "localhost,127.0.0.1,::1";

/// Errors that stop the daemon from starting.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("reaper")]
    Reaper(#[from] ReaperError),
    #[error("transport")]
    Transport(#[from] crate::transport::TransportError),
}

/// Command-line options.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Serve on this Unix socket instead of the virtio-serial port.
    pub listen: Option<PathBuf>,
    /// Name of the virtio-serial port to serve.
    pub port_name: String,
    /// Serve on this character device instead of looking the port up by name.
    pub device: Option<PathBuf>,
    /// Apply identity to the system (clock, hostname, RNG, CA) even when not PID 1.
    pub system: bool,
    /// Use this Unix socket as the egress channel instead of the `space.egress` port (a
    /// host-side stand-in connects nothing: the daemon connects to it).
    pub egress_socket: Option<PathBuf>,
    /// Use this character device as the egress port instead of looking it up by name.
    pub egress_device: Option<PathBuf>,
    /// Where the egress proxy listens (`127.0.0.1:3128` by default).
    pub egress_listen: Option<SocketAddr>,
}

impl Options {
    pub const USAGE: &'static str = "usage: space-guestd [--listen SOCKET | --port NAME | \
        --device PATH] [--system] [--egress-socket SOCKET | --egress-device PATH] \
        [--egress-listen ADDR]";

    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
        let mut opts = Options {
            port_name: "space.ctl".into(),
            ..Options::default()
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
            match arg.as_str() {
                "--listen" => opts.listen = Some(value("--listen")?.into()),
                "--port" => opts.port_name = value("--port")?,
                "--device" => opts.device = Some(value("--device")?.into()),
                "--system" => opts.system = true,
                "--egress-socket" => opts.egress_socket = Some(value("--egress-socket")?.into()),
                "--egress-device" => opts.egress_device = Some(value("--egress-device")?.into()),
                "--egress-listen" => {
                    let v = value("--egress-listen")?;
                    let addr = v
                        .parse()
                        .map_err(|_| format!("--egress-listen: {v:?} is not an address"))?;
                    opts.egress_listen = Some(addr);
                }
                "-h" | "--help" => return Err(Options::USAGE.into()),
                other => return Err(format!("unknown argument {other:?}\n{}", Options::USAGE)),
            }
        }
        Ok(opts)
    }

    /// Where the egress channel comes from, if the daemon runs one: the socket or device it
    /// was told, or the `space.egress` port in a VM (not with `--listen` or `--device`, which
    /// are runs outside a VM).
    pub fn egress_source(&self) -> Option<crate::egress::Source> {
        use crate::egress::Source;
        if let Some(p) = &self.egress_socket {
            Some(Source::Unix(p.clone()))
        } else if let Some(p) = &self.egress_device {
            Some(Source::Device(p.clone()))
        } else if self.listen.is_none() && self.device.is_none() {
            Some(Source::PortName(crate::egress::PORT_NAME.to_string()))
        } else {
            None
        }
    }
}

/// What the host told this guest it is.
#[derive(Debug, Default, Clone)]
pub struct IdentityState {
    pub sandbox_id: Option<String>,
    pub hostname: Option<String>,
    pub env: BTreeMap<String, String>,
    /// Default account (`user`, `uid`, `user:group` or `uid:gid`) of execs naming none.
    pub user: Option<String>,
    /// Default working directory of execs naming none.
    pub workdir: Option<String>,
}

/// Shared state of the daemon, one per process.
pub struct Daemon {
    pub started: Instant,
    /// Running as PID 1 inside a VM.
    pub pid1: bool,
    /// Identity may change the clock, hostname and RNG (PID 1, or `--system`).
    pub system: bool,
    pub identity: Mutex<IdentityState>,
    pub reaper: Arc<Reaper>,
    pub processes: ProcessTable,
    /// Watch streams open now.
    pub watches: AtomicUsize,
    /// Errors the host can provoke are logged through this.
    pub log_limit: RateLimiter,
    /// Set to true to make the daemon stop (exit, or power off as PID 1).
    pub shutdown: watch::Sender<bool>,
    /// The egress client, once the egress channel and proxy are up.
    pub egress: OnceLock<Arc<crate::egress::Egress>>,
    /// The deployment CA was installed in the trust store (by an identity step).
    pub ca_installed: AtomicBool,
    /// Buffered watches.
    pub watchers: crate::watchers::Watchers,
    /// Mounted volumes and the gate before their host ([`crate::volumes`]).
    pub volumes: crate::volumes::Volumes,
}

pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Daemon {
    pub fn new(pid1: bool, system: bool, reaper: Arc<Reaper>) -> Arc<Daemon> {
        Arc::new(Daemon {
            started: Instant::now(),
            pid1,
            system: pid1 || system,
            identity: Mutex::new(IdentityState::default()),
            reaper,
            processes: ProcessTable::default(),
            watches: AtomicUsize::new(0),
            log_limit: RateLimiter::new(20, Duration::from_secs(10)),
            shutdown: watch::channel(false).0,
            egress: OnceLock::new(),
            ca_installed: AtomicBool::new(false),
            watchers: Default::default(),
            volumes: Default::default(),
        })
    }

    pub fn identity(&self) -> MutexGuard<'_, IdentityState> {
        self.identity.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The environment of a new process: defaults (with the egress proxy and CA settings),
    /// then identity, then the request's.
    pub fn environment(
        &self,
        request: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, ProtoError> {
        let mut env = BTreeMap::new();
        env.insert("PATH".to_string(), DEFAULT_PATH.to_string());
        env.insert("HOME".to_string(), "/root".to_string());
        if let Some(egress) = self.egress.get() {
            let url = egress.proxy_url();
            for key in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.insert(key.to_string(), url.clone());
            }
            for key in ["NO_PROXY", "no_proxy"] {
                env.insert(key.to_string(), NO_PROXY.to_string());
            }
        }
        if self.ca_installed.load(Ordering::SeqCst) {
            use crate::ca::{BUNDLE_PATH, CA_PATH};
            for (k, v) in [
                ("SSL_CERT_FILE", BUNDLE_PATH),
                ("CURL_CA_BUNDLE", BUNDLE_PATH),
                ("REQUESTS_CA_BUNDLE", BUNDLE_PATH),
                ("GIT_SSL_CAINFO", BUNDLE_PATH),
                ("NODE_EXTRA_CA_CERTS", CA_PATH),
            ] {
                env.insert(k.to_string(), v.to_string());
            }
        }
        for (k, v) in &self.identity().env {
            env.insert(k.clone(), v.clone());
        }
        for (k, v) in request {
            env.insert(k.clone(), v.clone());
        }
        validate_env(&env)?;
        Ok(env)
    }

    /// Logs a host-triggerable warning, rate-limited.
    pub fn warn_limited(&self, what: &str, err: &dyn std::fmt::Display) {
        if let Some(dropped) = self.log_limit.check() {
            if dropped > 0 {
                tracing::warn!("{what}: {err} ({dropped} similar lines suppressed)");
            } else {
                tracing::warn!("{what}: {err}");
            }
        }
    }

    /// Counts an open watch stream; `None` when the limit is reached.
    pub fn try_add_watch(self: &Arc<Self>) -> Option<WatchSlot> {
        let prev = self.watches.fetch_add(1, Ordering::SeqCst);
        if prev >= space_proto::limits::MAX_WATCH_STREAMS {
            self.watches.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(WatchSlot {
            daemon: self.clone(),
        })
    }
}

/// One open watch stream; released on drop.
pub struct WatchSlot {
    daemon: Arc<Daemon>,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.daemon.watches.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Environment keys and values as execve accepts them, within the size limits.
pub fn validate_env(env: &BTreeMap<String, String>) -> Result<(), ProtoError> {
    if env.len() > MAX_ENV_VARS {
        return Err(ProtoError::new(
            ErrorKind::TooLarge,
            format!(
                "{} environment variables; the limit is {MAX_ENV_VARS}",
                env.len()
            ),
        ));
    }
    let mut total = 0;
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(ProtoError::invalid(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        if v.contains('\0') {
            return Err(ProtoError::invalid(format!(
                "environment variable {k} contains a NUL byte"
            )));
        }
        total += k.len() + v.len() + 2;
    }
    if total > MAX_ENV_BYTES {
        return Err(ProtoError::new(
            ErrorKind::TooLarge,
            format!("environment is {total} bytes; the limit is {MAX_ENV_BYTES}"),
        ));
    }
    Ok(())
}

/// Runs the daemon until shutdown. Called inside the tokio runtime, after PID-1 setup.
pub async fn run(opts: Options, pid1: bool) -> Result<(), DaemonError> {
    let reaper = Reaper::start()?;
    let daemon = Daemon::new(pid1, opts.system, reaper);
    if pid1 {
        crate::init::spawn_signal_handlers(daemon.clone());
    }
    if !daemon.system {
        tracing::info!("not PID 1: identity will be recorded without changing the system");
    }
    if let Some(source) = opts.egress_source() {
        let addr = opts
            .egress_listen
            .unwrap_or(crate::egress::DEFAULT_PROXY_ADDR);
        tokio::spawn(crate::egress::start(daemon.clone(), source, addr));
    }
    let mut stop = daemon.shutdown.subscribe();
    let serve = async {
        match &opts.listen {
            Some(path) => crate::transport::serve_unix(path, daemon.clone()).await,
            None => {
                crate::transport::serve_port(&opts.port_name, opts.device.clone(), daemon.clone())
                    .await
            }
        }
    };
    tokio::select! {
        r = serve => r?,
        _ = stop.wait_for(|s| *s) => {}
    }
    if let Some(path) = &opts.listen {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse() {
        let o = Options::parse(["--listen".into(), "/tmp/s".into(), "--system".into()]).unwrap();
        assert_eq!(o.listen.as_deref(), Some(std::path::Path::new("/tmp/s")));
        assert!(o.system);
        assert_eq!(o.port_name, "space.ctl");
        assert!(Options::parse(["--bogus".into()]).is_err());
        assert!(Options::parse(["--listen".into()]).is_err());
        assert!(o.egress_source().is_none());
        let o = Options::parse(
            [
                "--listen",
                "/s",
                "--egress-socket",
                "/e",
                "--egress-listen",
                "127.0.0.1:9",
            ]
            .map(String::from),
        )
        .unwrap();
        assert!(matches!(
            o.egress_source(),
            Some(crate::egress::Source::Unix(_))
        ));
        assert_eq!(o.egress_listen, Some("127.0.0.1:9".parse().unwrap()));
        assert!(Options::parse(["--egress-listen".into(), "nope".into()]).is_err());
        assert!(matches!(
            Options::parse([]).unwrap().egress_source(),
            Some(crate::egress::Source::PortName(_))
        ));
    }

    #[test]
    fn env_validation() {
        let mut env = BTreeMap::new();
        env.insert("A".to_string(), "1".to_string());
        assert!(validate_env(&env).is_ok());
        env.insert("B=C".to_string(), "1".to_string());
        assert_eq!(
            validate_env(&env).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        let mut big = BTreeMap::new();
        big.insert("X".to_string(), "y".repeat(MAX_ENV_BYTES));
        assert_eq!(validate_env(&big).unwrap_err().kind, ErrorKind::TooLarge);
    }
}
