//! The guest daemon must answer every new `space.ctl` connection, however the previous host
//! left: after clean disconnects, after hosts that give up mid-request, and on every restore of
//! a snapshot taken while a host was connected and busy. A port whose host is gone reports a
//! hang-up; the daemon must go on waiting for the next host properly, not treat the hang-up as
//! the end of the port (which left it deaf for the life of the VM).
//! Needs SPACE_KERNEL and SPACE_ROOTFS_MINIMAL (set by `make test`).

mod common;

use std::time::{Duration, Instant};

use common::*;
use space_proto::{ExecSpec, WriteOptions};
use space_runtime::{GuestClient, QemuRuntime, QemuVm, RestoreSpec, Runtime, Vm};

/// Bound on one "connect and get a ready health check" (several attempts by `wait_ready`).
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the host stays away between connections, so the guest sees the hang-up.
const AWAY: Duration = Duration::from_millis(60);

async fn boot_minimal(rt: &QemuRuntime, tmp: &tempfile::TempDir) -> (QemuVm, GuestClient) {
    let image = env_path("SPACE_ROOTFS_MINIMAL");
    let dir = tmp.path().join("sandbox");
    std::fs::create_dir(&dir).unwrap();
    let vm = rt.boot(boot_spec(&dir, &image)).await.unwrap();
    let client = vm.wait_ready(BOOT_TIMEOUT).await.unwrap();
    (vm, client)
}

/// A ready client within [`READY_TIMEOUT`] and a working exec on it, or a panic with what the
/// console said.
async fn answers(vm: &QemuVm, what: &str) -> GuestClient {
    let t = Instant::now();
    let client = match vm.wait_ready(READY_TIMEOUT).await {
        Ok(c) => c,
        Err(e) => panic!("{what}: no answer after {:?}: {e}", t.elapsed()),
    };
    let out = client.run(ExecSpec::argv(["true"])).await;
    assert!(
        matches!(&out, Ok(o) if o.status.success()),
        "{what}: exec after ready failed: {out:?}\n--- console ---\n{}",
        vm.console_tail(4000)
    );
    client
}

#[tokio::test]
async fn answers_after_hosts_come_and_go() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime().await;
    let (vm, client) = boot_minimal(&rt, &tmp).await;
    drop(client);
    for i in 0..15 {
        tokio::time::sleep(AWAY).await;
        drop(answers(&vm, &format!("clean reconnect {i}")).await);
    }
    // Hosts that give up at once, with a request sent or not, then one that waits.
    for i in 0..5 {
        for budget_ms in [0u64, 1, 3, 10] {
            let _ = tokio::time::timeout(Duration::from_millis(budget_ms), async {
                let c = vm.guest().await?;
                c.health().await.map_err(space_runtime::Error::from)
            })
            .await;
        }
        tokio::time::sleep(AWAY).await;
        drop(answers(&vm, &format!("reconnect after abandoned hosts {i}")).await);
    }
}

#[tokio::test]
async fn every_restore_of_a_busy_snapshot_answers() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime().await;
    let (vm, client) = boot_minimal(&rt, &tmp).await;
    // Traffic in flight on the host's connection while the snapshot is taken.
    let mut load = Vec::new();
    for k in 0..3 {
        let c = client.clone();
        load.push(tokio::spawn(async move {
            for i in 0u32.. {
                let _ = match k {
                    0 => c.health().await.map(drop),
                    1 => c.run(ExecSpec::shell("seq 1 300")).await.map(drop),
                    _ => c
                        .write_file(
                            "/tmp/load",
                            vec![i as u8; 48 * 1024],
                            WriteOptions::default(),
                        )
                        .await
                        .map(drop),
                };
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let snap = tmp.path().join("snap");
    vm.snapshot(&snap).await.unwrap();
    for task in &load {
        task.abort();
    }
    drop(client);
    drop(vm);

    let started = Instant::now();
    for i in 0..30 {
        let dir = tmp.path().join(format!("restore{i}"));
        std::fs::create_dir(&dir).unwrap();
        // Even restores connect at once, like `space` does; odd ones start paused and the host
        // connects only after the guest has run for a while and seen its old host gone.
        let delayed = i % 2 == 1;
        let spec = RestoreSpec {
            snapshot: snap.clone(),
            dir: dir.clone(),
            paused: delayed,
            kernel: None,
            files_in_place: false,
            priority: Default::default(),
            splice: None,
        };
        let restored = rt.restore(spec).await.unwrap();
        if delayed {
            restored.resume().await.unwrap();
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let what = format!("restore {i} (delayed host: {delayed})");
        drop(answers(&restored, &what).await);
        drop(restored);
        std::fs::remove_dir_all(&dir).unwrap();
    }
    eprintln!("30 restores answered in {:?}", started.elapsed());
}
