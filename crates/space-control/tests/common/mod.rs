//! The test server's configuration and a data directory torn down in the right order even
//! after a panic, shared by the API's integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use space_control::ServerConfig;
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{Node, NodeConfig};

/// Uploads above this are refused by the test server.
pub const MAX_UPLOAD: u64 = 2 << 20;

pub fn env_path(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => panic!(
            "{var} is not set: these tests boot real guests; `source target/space/env.sh` first \
             (or run `make test`)"
        ),
    }
}

pub fn server_config(data: &Path) -> ServerConfig {
    let mut node = NodeConfig::new(data);
    node.storage = StorageOptions {
        driver: Some(DriverKind::Btrfs),
        loop_image_size: 8 << 30,
        loop_image: true,
    };
    node.ready_timeout = Duration::from_secs(120);
    node.pools = space_node::PoolConfig::disabled();
    node.rolling.enabled = false;
    let mut cfg = ServerConfig::new(node, env_path("SPACE_KERNEL"));
    cfg.listen = "127.0.0.1:0".parse().unwrap();
    cfg.images = BTreeMap::from([("minimal".to_string(), env_path("SPACE_ROOTFS_MINIMAL"))]);
    cfg.stock_templates = vec!["minimal".into()];
    cfg.max_upload_bytes = MAX_UPLOAD;
    // Suspended sandboxes go to a directory store, and their local copies are evicted at once:
    // every restore below comes from the store.
    let mut archive = space_control::archive::ArchiveSettings::new(
        space_archive::StoreConfig::Local(data.with_extension("objects")),
    );
    archive.cache_max_bytes = Some(0);
    archive.upload_interval = None;
    cfg.archive = Some(archive);
    cfg
}

/// Runs `test` on its own runtime, then tears down in an order that works after a panic
/// too: the runtime (its tasks own the VMs a driver still holds), then a fresh node on the
/// data directory that adopts and kills whatever VMs were left detached, then the loop
/// mount and the temp dir.
pub fn with_data_dir<F, Fut>(test: F)
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: Future<Output = ()>,
{
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG")
                .unwrap_or_else(|_| "space_control=info,space_node=warn".into()),
        )
        .with_test_writer()
        .try_init();
    let tmp = tempfile::Builder::new()
        .prefix("space-control-test")
        .tempdir_in("/var/tmp")
        .unwrap();
    let data = tmp.path().join("data");
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let runtime = rt();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(test(data.clone()))
    }));
    drop(runtime);
    if data.join("state").exists() {
        let mut cfg = server_config(&data).node;
        cfg.auto_restore = false;
        cfg.timeout_tick = None;
        rt().block_on(async {
            match Node::open(cfg).await {
                Ok(node) => node.shutdown().await,
                Err(e) => eprintln!("reopening the node to clean up: {e}"),
            }
        });
    }
    unmount(&data);
    drop(tmp);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

pub fn unmount(data: &Path) {
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
        nix::mount::umount2(data, nix::mount::MntFlags::MNT_DETACH).expect("unmounting");
    }
}
