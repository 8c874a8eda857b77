//! Test support: a real S3 server (Garage) on loopback, for the tests of this crate and of
//! the crates that use it. Built with the `testing` feature only.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::store::{S3Config, StoreConfig};

/// Deterministic pseudo-random bytes (xorshift), so tests need no RNG crate.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
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

/// A single-node Garage on loopback with one bucket and one key, its data in a temporary
/// directory. Killed on drop.
pub struct Garage {
    child: Option<Child>,
    /// Its configuration, data and log.
    pub dir: tempfile::TempDir,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The access key id.
    pub key_id: String,
    /// The secret key.
    pub secret: String,
    /// The bucket.
    pub bucket: String,
    config: PathBuf,
    bin: PathBuf,
    s3_port: u16,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The Garage binary (`SPACE_GARAGE`, set by `make test` from `scripts/tools.sh`).
pub fn garage_bin() -> PathBuf {
    match std::env::var_os("SPACE_GARAGE") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "SPACE_GARAGE is not set: the S3 tests run against a real Garage; `make test` \
             installs it with scripts/garage.sh and sets SPACE_GARAGE in target/space/env.sh"
        ),
    }
}

impl Garage {
    /// Starts a server, lays out its one node, makes the bucket and the key.
    pub fn start() -> Garage {
        let bin = garage_bin();
        let dir = tempfile::tempdir().unwrap();
        let (s3, rpc, admin) = (free_port(), free_port(), free_port());
        let secret = hex::encode(noise(rpc as u64, 32));
        let config = dir.path().join("garage.toml");
        let mut f = std::fs::File::create(&config).unwrap();
        write!(
            f,
            r#"metadata_dir = "{d}/meta"
data_dir = "{d}/data"
db_engine = "sqlite"
replication_factor = 1
compression_level = "none"
rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{secret}"

[s3_api]
s3_region = "garage"
api_bind_addr = "127.0.0.1:{s3}"
root_domain = ".s3.garage.localhost"

[admin]
api_bind_addr = "127.0.0.1:{admin}"
admin_token = "{secret}"
"#,
            d = dir.path().display()
        )
        .unwrap();
        let mut g = Garage {
            child: None,
            endpoint: format!("http://127.0.0.1:{s3}"),
            key_id: String::new(),
            secret: String::new(),
            bucket: "space-test".into(),
            config,
            bin,
            s3_port: s3,
            dir,
        };
        g.spawn();
        // Layout: this node, one zone, then a bucket and a key that may use it.
        let deadline = Instant::now() + Duration::from_secs(60);
        // `node id` reads the key on disk and answers before the server listens; `status`
        // goes through the server's RPC port, so it answering means the server is up.
        let node_id = loop {
            let status = g.cli(&["status"]);
            let out = g.cli(&["node", "id", "-q"]);
            if status.status.success() && out.status.success() {
                let s = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                break s.split('@').next().unwrap().to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "garage did not come up: {}{}",
                String::from_utf8_lossy(&status.stderr),
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        g.ok(&["layout", "assign", "-z", "dc1", "-c", "1G", &node_id]);
        g.ok(&["layout", "apply", "--version", "1"]);
        g.ok(&["bucket", "create", &g.bucket.clone()]);
        let key_id = format!("GK{}", hex::encode(noise(s3 as u64, 12)));
        let key_secret = hex::encode(noise(admin as u64, 32));
        g.ok(&[
            "key",
            "import",
            "--yes",
            "-n",
            "space-test",
            &key_id,
            &key_secret,
        ]);
        g.ok(&[
            "bucket",
            "allow",
            "--read",
            "--write",
            "--owner",
            &g.bucket.clone(),
            "--key",
            &key_id,
        ]);
        g.key_id = key_id;
        g.secret = key_secret;
        g.wait_s3();
        g
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("garage.log")).unwrap();
        let child = Command::new(&self.bin)
            .args(["-c"])
            .arg(&self.config)
            .arg("server")
            .env("RUST_LOG", "garage=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    fn wait_s3(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.s3_port)).is_err() {
            assert!(Instant::now() < deadline, "garage's S3 port did not open");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.bin)
            .arg("-c")
            .arg(&self.config)
            .args(args)
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "garage {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Stops the server (SIGKILL), keeping its data.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same data and ports.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
        self.wait_s3();
    }

    /// A store configuration for the bucket under `prefix`.
    pub fn config(&self, prefix: &str) -> StoreConfig {
        StoreConfig::S3(S3Config {
            bucket: self.bucket.clone(),
            prefix: prefix.into(),
            endpoint: Some(self.endpoint.clone()),
            region: Some("garage".into()),
            access_key_id: Some(self.key_id.clone()),
            secret_access_key: Some(self.secret.clone()),
        })
    }

    /// Every byte Garage keeps on disk for its objects (its data directory).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        self.stop();
    }
}

/// moto's server on loopback, for the AWS KMS API. Killed on drop.
pub struct Moto {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

impl Moto {
    /// Starts `$SPACE_MOTO` (set by `make test` from `scripts/tools.sh`) and waits for its port.
    pub fn start() -> Moto {
        let bin = match std::env::var_os("SPACE_MOTO") {
            Some(p) => PathBuf::from(p),
            None => panic!(
                "SPACE_MOTO is not set: the KMS tests run against moto's server; `make test` \
                 installs it with scripts/tools.sh and sets SPACE_MOTO in target/space/tools.sh"
            ),
        };
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("moto.log")).unwrap();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "moto's server did not open its port"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    /// A KMS configuration for `key_id` on this server (moto takes any credentials).
    pub fn kms(&self, key_id: &str) -> crate::kms::KmsConfig {
        crate::kms::KmsConfig {
            key_id: key_id.into(),
            region: "us-east-1".into(),
            endpoint: Some(self.endpoint.clone()),
            access_key_id: "AKIDSPACETEST".into(),
            secret_access_key: "space-test-secret".into(),
            session_token: None,
        }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy on loopback in front of a server (Garage's S3 port), that can cut the
/// connection midway: once armed with a byte budget, the bytes sent towards the server are
/// counted, and when the budget is spent every connection is closed and new ones are closed
/// as soon as they are accepted, until [`CutProxy::heal`]. A store that fails in the middle
/// of an upload, the way a dying server or a broken network makes it fail.
pub struct CutProxy {
    /// `http://127.0.0.1:PORT`, to use in place of the server's endpoint.
    pub endpoint: String,
    state: std::sync::Arc<CutState>,
}

struct CutState {
    /// Bytes still allowed towards the server (`u64::MAX`: no limit).
    budget: std::sync::atomic::AtomicU64,
    cut: std::sync::atomic::AtomicBool,
    stop: std::sync::atomic::AtomicBool,
}

impl CutProxy {
    /// A proxy to `upstream` (`host:port`), passing everything until armed.
    pub fn start(upstream: &str) -> CutProxy {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let state = std::sync::Arc::new(CutState {
            budget: AtomicU64::new(u64::MAX),
            cut: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let (s, upstream) = (state.clone(), upstream.to_owned());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = conn else { continue };
                if s.cut.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                let (c2, s2) = match (client.try_clone(), server.try_clone()) {
                    (Ok(c), Ok(s)) => (c, s),
                    _ => continue,
                };
                let (up, down) = (s.clone(), s.clone());
                std::thread::spawn(move || pump(client, server, &up, true));
                std::thread::spawn(move || pump(s2, c2, &down, false));
            }
        });
        CutProxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            state,
        }
    }

    /// From now on, cuts everything once `bytes` more bytes went towards the server.
    pub fn arm(&self, bytes: u64) {
        self.state
            .budget
            .store(bytes, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the budget ran out and the connections were cut.
    pub fn was_cut(&self) -> bool {
        self.state.cut.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Passes everything again.
    pub fn heal(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.state.budget.store(u64::MAX, SeqCst);
        self.state.cut.store(false, SeqCst);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering::SeqCst;
        self.state.stop.store(true, SeqCst);
        self.state.cut.store(true, SeqCst);
        // Wakes the accept loop so it sees `stop`.
        let _ = std::net::TcpStream::connect(self.endpoint.trim_start_matches("http://"));
    }
}

/// Copies `from` to `to` until either side closes or the proxy cuts; bytes towards the
/// server (`upstream`) are taken from the budget.
fn pump(
    mut from: std::net::TcpStream,
    mut to: std::net::TcpStream,
    state: &CutState,
    upstream: bool,
) {
    use std::io::Read;
    use std::sync::atomic::Ordering::SeqCst;
    let _ = from.set_read_timeout(Some(Duration::from_millis(50)));
    let mut buf = vec![0u8; 16 << 10];
    loop {
        if state.cut.load(SeqCst) {
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => break,
        };
        if upstream {
            let n = n as u64;
            let spent = state.budget.fetch_update(SeqCst, SeqCst, |left| {
                (left != u64::MAX).then(|| left.saturating_sub(n))
            });
            if matches!(spent, Ok(left) if left <= n) {
                state.cut.store(true, SeqCst);
                break;
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}
