//! Shared pieces of the node's integration tests: a node on a fresh data directory (a
//! loop-mounted btrfs image, or plain ext4 with the copy driver) that is torn down even when
//! the test fails, the `minimal` template, and shortcuts for talking to the guest.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use space_node::storage::{DriverKind, Layout, Storage, StorageOptions};
use space_node::{
    CreateRequest, Node, NodeConfig, SandboxId, SandboxOptions, TemplateRef, TemplateSpec,
};
use space_proto::{ExecSpec, WriteOptions};
use space_runtime::GuestClient;

/// A path from the environment, or a panic that says how to get it set.
pub fn env_path(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => {
            let p = PathBuf::from(v);
            assert!(p.exists(), "{var}={} does not exist", p.display());
            p
        }
        _ => panic!(
            "{var} is not set: these tests boot real guests; run them with `make test` (or \
             `source target/space/env.sh` first), which sets SPACE_KERNEL and \
             SPACE_ROOTFS_MINIMAL"
        ),
    }
}

/// The number in environment variable `var`, or `default` when it is unset or empty; a
/// value that is not a number stops the test with a message naming it.
pub fn env_number(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{var}={v:?} is not a number: {e}")),
        _ => default,
    }
}

/// Which storage a test node runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disk {
    /// A loop-mounted btrfs image over the data directory (made by `storage::open`).
    Btrfs,
    /// The data directory as it is (ext4 here), with the copying driver.
    Copy,
}

/// Runs `test` against a fresh node on its own tokio runtime, then tears everything down in
/// an order that works even after a panic: the runtime goes first (its tasks own the VMs;
/// dropping a VM handle kills QEMU and waits for it), then the loop mount, then the
/// temporary directory with the image.
pub fn with_node<F, Fut>(disk: Disk, config: impl FnOnce(&mut NodeConfig), test: F)
where
    F: FnOnce(Node) -> Fut,
    Fut: Future<Output = ()>,
{
    with_node_opened(disk, config, Node::open, test)
}

/// [`with_node`] with the node opened by `open` (on a runtime of the test's, say).
pub fn with_node_opened<O, OFut, F, Fut>(
    disk: Disk,
    config: impl FnOnce(&mut NodeConfig),
    open: O,
    test: F,
) where
    O: FnOnce(NodeConfig) -> OFut,
    OFut: Future<Output = space_node::Result<Node>>,
    F: FnOnce(Node) -> Fut,
    Fut: Future<Output = ()>,
{
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG")
                .unwrap_or_else(|_| "space_node=info,space_runtime=warn".into()),
        )
        .with_test_writer()
        .try_init();
    let tmp = tempfile::Builder::new()
        .prefix("space-node-test")
        .tempdir_in("/var/tmp")
        .unwrap();
    let data = tmp.path().join("data");
    let mut cfg = NodeConfig::new(&data);
    cfg.storage = match disk {
        Disk::Btrfs => StorageOptions {
            driver: Some(DriverKind::Btrfs),
            loop_image_size: 8 << 30,
            loop_image: true,
        },
        Disk::Copy => StorageOptions {
            driver: Some(DriverKind::Copy),
            loop_image_size: 0,
            loop_image: false,
        },
    };
    cfg.ready_timeout = Duration::from_secs(120);
    // Background VMs and snapshots only where a test asks for them (tests/pool.rs,
    // tests/rolling.rs): elsewhere they would change what a test counts and load the host.
    cfg.pools = space_node::PoolConfig::disabled();
    cfg.rolling.enabled = false;
    config(&mut cfg);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut storage = None;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(async {
            let node = open(cfg).await.expect("opening the node");
            storage = Some((node.storage().clone(), node.layout().clone()));
            test(node.clone()).await;
            node.shutdown().await;
        })
    }));
    drop(rt);
    if let Some((storage, layout)) = storage {
        if storage.kind() != DriverKind::Btrfs {
            // Read-only volumes of the other drivers are immutable files: only the driver
            // removes them.
            delete_volumes(&*storage, &layout);
        }
    }
    unmount(&data);
    drop(tmp);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn delete_volumes(storage: &dyn Storage, layout: &Layout) {
    let children = |d: PathBuf| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|e| e.filter_map(|e| Some(e.ok()?.path())).collect())
            .unwrap_or_default()
    };
    for parent in children(layout.templates())
        .into_iter()
        .chain(children(layout.snapshots()))
    {
        for volume in children(parent) {
            storage.delete_volume(&volume).unwrap();
        }
    }
    for volume in children(layout.sandboxes()) {
        storage.delete_volume(&volume).unwrap();
    }
}

fn unmount(data: &Path) {
    use std::os::unix::fs::MetadataExt;
    let (Ok(a), Ok(b)) = (
        std::fs::metadata(data),
        std::fs::metadata(data.parent().unwrap()),
    ) else {
        return;
    };
    if a.dev() == b.dev() {
        return;
    }
    if nix::mount::umount2(data, nix::mount::MntFlags::empty()).is_err() {
        // Something still holds a file open: detach now, the kernel finishes later.
        nix::mount::umount2(data, nix::mount::MntFlags::MNT_DETACH).expect("unmounting");
    }
}

/// Builds the `minimal` template as version `version`.
pub async fn build_minimal(node: &Node, version: &str) -> TemplateRef {
    let template = TemplateRef::new("minimal", version).unwrap();
    node.build_template(TemplateSpec {
        template: template.clone(),
        kernel: env_path("SPACE_KERNEL"),
        rootfs: env_path("SPACE_ROOTFS_MINIMAL"),
        vcpus: 1,
        memory_mib: 256,
        kernel_cmdline: None,
        ready_timeout: Duration::from_secs(120),
        guest: Default::default(),
        start: None,
        source: String::new(),
    })
    .await
    .expect("building the minimal template");
    template
}

/// A create request for the newest `minimal` build.
pub fn minimal() -> CreateRequest {
    CreateRequest::new("minimal".parse().unwrap())
}

/// Creates a sandbox from `minimal` with `options`.
pub async fn create(node: &Node, options: SandboxOptions) -> SandboxId {
    let mut req = minimal();
    req.options = options;
    node.create(req).await.expect("create").id
}

/// Runs a shell line in the guest and insists on success; returns stdout.
pub async fn sh(client: &GuestClient, line: &str) -> String {
    sh_within(client, line, None).await
}

/// [`sh`] with a deadline of its own (`None`: the default).
pub async fn sh_within(client: &GuestClient, line: &str, timeout_ms: Option<u64>) -> String {
    let mut spec = ExecSpec::shell(line);
    if timeout_ms.is_some() {
        spec.timeout_ms = timeout_ms;
    }
    let out = client.run(spec).await.unwrap();
    assert!(
        out.status.success(),
        "`{line}` failed: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.to_vec()).unwrap()
}

/// Writes `len` random bytes to `path` in the guest; returns their SHA-256.
pub async fn write_random(client: &GuestClient, path: &str, len: usize) -> String {
    let data: Vec<u8> = (0..len).map(|_| rand::random::<u8>()).collect();
    client
        .write_file(path, data.clone(), WriteOptions::default())
        .await
        .unwrap();
    sha256(&data)
}

/// SHA-256 of a guest file as the host reads it.
pub async fn guest_sha(client: &GuestClient, path: &str) -> String {
    sha256(&client.read_file_bytes(path).await.unwrap())
}

/// Whether a guest file exists.
pub async fn exists(client: &GuestClient, path: &str) -> bool {
    client.stat(path).await.is_ok()
}

pub fn sha256(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Starts `sleep 100000` in the guest and returns its pid (the process outlives the request).
pub async fn start_sleeper(client: &GuestClient) -> u32 {
    let h = client
        .exec(ExecSpec::argv(["sleep", "100000"]))
        .await
        .unwrap();
    h.pid()
}

/// Whether the sleeper `pid` runs in the guest (by its command line, so a reused pid does
/// not count).
pub async fn alive(client: &GuestClient, pid: u32) -> bool {
    let out = client
        .run(ExecSpec::shell(format!("cat /proc/{pid}/cmdline")))
        .await
        .unwrap();
    out.status.success() && out.stdout.as_ref() == b"sleep\x00100000\x00"
}

/// The bytes of a sandbox's record file.
pub fn record_bytes(node: &Node, id: &SandboxId) -> Vec<u8> {
    std::fs::read(node.record_path(id)).unwrap()
}

/// Waits until `done()` holds, looking every 50 ms; panics with `what` after `limit` (a bound
/// only against hanging forever: background work decides when it happens).
pub async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The node's use of `store` under the master key at `key` (made if missing), with no
/// periodic uploads: tests upload when they mean to.
pub fn archive_over(store: &space_archive::StoreConfig, key: &Path) -> space_node::ArchiveConfig {
    use std::sync::Arc;
    let archive = space_archive::Archive::new(store).unwrap();
    let master: Arc<dyn space_archive::MasterKey> =
        Arc::new(space_archive::LocalMaster::open_or_create(key).unwrap());
    let keyring = Arc::new(space_archive::Keyring::new(
        archive.clone(),
        Arc::new(master),
        Arc::new(space_archive::keys::NoAudit),
        Duration::from_secs(60),
    ));
    let mut cfg = space_node::ArchiveConfig::new(archive, keyring);
    cfg.upload_interval = None;
    cfg
}
