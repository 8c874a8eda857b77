//! Test support: snapshot-like files, stores (a local directory, and Garage, a real S3 server,
//! started on loopback from the binary `scripts/garage.sh` installs).

#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use space_archive::keys::NoAudit;
use space_archive::{Archive, Keyring, LocalMaster, MasterKey, S3Config, StoreConfig};

pub const MIB: u64 = 1 << 20;

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

/// A sparse file of `size` with `(offset, bytes)` written into it.
pub fn write_file(path: &Path, size: u64, parts: &[(u64, &[u8])]) {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .unwrap();
    f.set_len(size).unwrap();
    for (off, bytes) in parts {
        f.write_all_at(bytes, *off).unwrap();
    }
    f.sync_all().unwrap();
}

pub fn sha(path: &Path) -> String {
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().to_hex().to_string()
}

/// A keyring over `archive` with one local master key in `dir`.
pub fn keyring(archive: &Archive, dir: &Path) -> (Keyring, Arc<dyn MasterKey>) {
    let m: Arc<dyn MasterKey> =
        Arc::new(LocalMaster::open_or_create(&dir.join("master.key")).unwrap());
    (
        Keyring::new(
            archive.clone(),
            Arc::new(m.clone()),
            Arc::new(NoAudit),
            Duration::from_secs(60),
        ),
        m,
    )
}

/// A single-node Garage on loopback with one bucket and one key. Killed on drop.
pub struct Garage {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub endpoint: String,
    pub key_id: String,
    pub secret: String,
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
        let node_id = loop {
            let out = g.cli(&["node", "id", "-q"]);
            if out.status.success() {
                let s = String::from_utf8_lossy(&out.stdout).trim().to_owned();
                break s.split('@').next().unwrap().to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "garage did not come up: {}",
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

/// Every regular file under `dir`.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.is_file() {
                out.push(p);
            }
        }
    }
    out
}

/// Whether any file under `dir` contains `needle`.
pub fn any_file_contains(dir: &Path, needle: &[u8]) -> Option<PathBuf> {
    files_under(dir).into_iter().find(|p| {
        std::fs::read(p)
            .map(|b| b.windows(needle.len()).any(|w| w == needle))
            .unwrap_or(false)
    })
}
