//! Growing a running guest's root disk: `QemuVm::resize_disk` (QMP `block_resize`) and the
//! guest daemon's online ext4 grow, on a real microVM booted from the minimal image (256 MiB).
//!
//! Needs SPACE_KERNEL and SPACE_ROOTFS_MINIMAL (set by `make test`).

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use space_proto::{ErrorKind, ExecSpec};
use space_runtime::{
    BootSpec, ClientError, Error, GuestClient, QemuRuntime, QemuRuntimeConfig, QemuVm, Runtime, Vm,
};
use tempfile::TempDir;

const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
const HANG_GUARD: Duration = Duration::from_secs(180);
const MIB: u64 = 1 << 20;

fn artifact(var: &str) -> PathBuf {
    let path = PathBuf::from(std::env::var_os(var).unwrap_or_else(|| {
        panic!("{var} is not set: run these tests with `make test` (it builds the artifacts)")
    }));
    assert!(path.is_file(), "{var}={} does not exist", path.display());
    path
}

/// Field order is drop order: client, then VM (killed), then the directory.
struct Guest {
    client: GuestClient,
    vm: QemuVm,
    _dir: TempDir,
}

async fn boot_minimal() -> Guest {
    let dir = tempfile::Builder::new()
        .prefix("space-disk-grow-")
        .tempdir()
        .expect("creating the sandbox directory");
    let runtime = QemuRuntime::new(QemuRuntimeConfig::default())
        .await
        .unwrap_or_else(|e| panic!("QEMU runtime: {e}"));
    let vm = runtime
        .boot(BootSpec {
            dir: dir.path().to_owned(),
            kernel: artifact("SPACE_KERNEL"),
            rootfs: artifact("SPACE_ROOTFS_MINIMAL"),
            vcpus: 1,
            memory_mib: 256,
            kernel_cmdline: None,
        })
        .await
        .unwrap_or_else(|e| panic!("booting: {e}"));
    let client = vm
        .wait_ready(BOOT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("guest daemon never got ready: {e}"));
    Guest {
        client,
        vm,
        _dir: dir,
    }
}

async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(HANG_GUARD, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing after {HANG_GUARD:?}"))
}

async fn sh(client: &GuestClient, line: &str) -> String {
    let out = bounded(line, client.run(ExecSpec::shell(line)))
        .await
        .unwrap_or_else(|e| panic!("`{line}`: {e}"));
    assert!(
        out.status.success(),
        "`{line}` ended with {:?}; stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.to_vec()).expect("stdout is UTF-8")
}

/// `(size, available)` of `/` in bytes, from `df -B1 /` in the guest.
async fn df_root(client: &GuestClient) -> (u64, u64) {
    let out = sh(client, "df -B1 / | tail -n1").await;
    let cols: Vec<&str> = out.split_whitespace().collect();
    assert!(cols.len() >= 4, "unexpected df output {out:?}");
    let n = |i: usize| -> u64 {
        cols[i]
            .parse()
            .unwrap_or_else(|_| panic!("df column {i} of {out:?}"))
    };
    (n(1), n(3))
}

#[tokio::test]
async fn grown_disk_gives_the_guest_a_larger_root_filesystem() {
    let g = boot_minimal().await;
    let image = g.vm.disk_bytes().await.unwrap();
    assert_eq!(image, 256 * MIB);
    let (size0, avail0) = df_root(&g.client).await;
    assert!(size0 <= 256 * MIB, "df size {size0} before growing");

    // Neither a smaller size nor an unaligned one; the same size changes nothing.
    for bad in [128 * MIB, 300 * MIB + 1] {
        let err = g.vm.resize_disk(bad).await.unwrap_err();
        assert!(matches!(err, Error::Invalid(_)), "{bad}: {err}");
    }
    g.vm.resize_disk(image).await.unwrap();
    assert_eq!(g.vm.disk_bytes().await.unwrap(), image);

    let target = 1024 * MIB;
    g.vm.resize_disk(target).await.unwrap();
    assert_eq!(g.vm.disk_bytes().await.unwrap(), target);
    let grown = bounded("grow_fs", g.client.grow_fs("/", Some(target)))
        .await
        .unwrap_or_else(|e| panic!("grow_fs: {e}"));
    assert_eq!(grown.device_bytes, target);
    assert_eq!(grown.block_size, 4096);
    assert!(grown.old_bytes <= 256 * MIB, "{grown:?}");
    assert!(grown.new_bytes > 900 * MIB, "{grown:?}");
    let sectors: u64 = sh(&g.client, "cat /sys/block/vda/size")
        .await
        .trim()
        .parse()
        .unwrap();
    assert_eq!(sectors * 512, target);

    let (size1, avail1) = df_root(&g.client).await;
    assert_eq!(size1, grown.new_bytes);
    assert!(size1 > 900 * MIB, "df size {size1} after growing to 1 GiB");
    assert!(
        avail1 > avail0 + 600 * MIB,
        "available {avail0} -> {avail1}"
    );

    // A file larger than all the space there was before.
    let mib = avail0 / MIB + 64;
    sh(
        &g.client,
        &format!("dd if=/dev/zero of=/big bs=1M count={mib} conv=fsync 2>/dev/null && sync"),
    )
    .await;
    let len: u64 = sh(&g.client, "wc -c < /big").await.trim().parse().unwrap();
    assert_eq!(len, mib * MIB);
    sh(&g.client, "rm /big").await;

    // Growing again to the same size is a no-op.
    let again = g.client.grow_fs("/", Some(target)).await.unwrap();
    assert_eq!(again.new_bytes, grown.new_bytes);
}

#[tokio::test]
async fn grow_fs_refusals_are_structured() {
    let g = boot_minimal().await;
    // Not ext4.
    let err = g.client.grow_fs("/proc", None).await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Unsupported), "{err}");
    assert!(err.to_string().contains("not ext4"), "{err}");
    // No such path.
    let err = g.client.grow_fs("/no/such/dir", None).await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::NotFound), "{err}");
    // The host never grew the device: bounded wait, then a timeout naming the problem.
    let t0 = std::time::Instant::now();
    let err = g.client.grow_fs("/", Some(2048 * MIB)).await.unwrap_err();
    assert!(matches!(err, ClientError::Guest(_)), "{err}");
    assert_eq!(err.kind(), Some(ErrorKind::Timeout), "{err}");
    assert!(err.to_string().contains("did not grow"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(30));
    // Nothing changed.
    let (size, _) = df_root(&g.client).await;
    assert!(size <= 256 * MIB);
    // A paused guest's disk grows too; the guest sees it once it runs again.
    g.vm.pause().await.unwrap();
    g.vm.resize_disk(512 * MIB).await.unwrap();
    g.vm.resume().await.unwrap();
    let grown = g.client.grow_fs("/", Some(512 * MIB)).await.unwrap();
    assert!(grown.new_bytes > 450 * MIB, "{grown:?}");
}
