//! Boots the `minimal` image with the real `space-guestd` as init and drives it through the
//! runtime: exec, snapshot -> kill -> restore, and restores that take on new identities.
//! Needs SPACE_KERNEL and SPACE_ROOTFS_MINIMAL (set by `make test`).

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::*;
use space_proto::{ExecSpec, Identity, WriteOptions};
use space_runtime::{GuestClient, QemuRuntime, QemuVm, RestoreSpec, Runtime, Vm};

async fn boot_minimal(rt: &QemuRuntime, tmp: &tempfile::TempDir) -> (QemuVm, GuestClient) {
    let image = env_path("SPACE_ROOTFS_MINIMAL");
    let dir = tmp.path().join("sandbox");
    std::fs::create_dir(&dir).unwrap();
    let vm = rt.boot(boot_spec(&dir, &image)).await.unwrap();
    let client = vm.wait_ready(BOOT_TIMEOUT).await.unwrap();
    (vm, client)
}

async fn restore(
    rt: &QemuRuntime,
    tmp: &tempfile::TempDir,
    snap: &str,
    name: &str,
) -> (QemuVm, GuestClient) {
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    let spec = RestoreSpec {
        snapshot: tmp.path().join(snap),
        dir,
        paused: false,
        kernel: None,
        files_in_place: false,
        priority: Default::default(),
        splice: None,
    };
    let vm = rt.restore(spec).await.unwrap();
    let client = vm.wait_ready(BOOT_TIMEOUT).await.unwrap();
    (vm, client)
}

async fn sh(client: &GuestClient, line: &str) -> String {
    let out = client.run(ExecSpec::shell(line)).await.unwrap();
    assert!(
        out.status.success(),
        "`{line}` failed: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.to_vec()).unwrap()
}

#[tokio::test]
async fn exec_echo() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime().await;
    let (_vm, client) = boot_minimal(&rt, &tmp).await;
    let out = client
        .run(ExecSpec::argv(["echo", "hello", "guest"]))
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(&out.stdout[..], b"hello guest\n");
    let health = client.health().await.unwrap();
    assert!(health.ready);
}

#[tokio::test]
async fn snapshot_kill_restore_keeps_a_file_and_a_process() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime().await;
    let (vm, client) = boot_minimal(&rt, &tmp).await;
    client
        .write_file(
            "/root/kept.txt",
            &b"from before the snapshot"[..],
            WriteOptions::default(),
        )
        .await
        .unwrap();
    let sleeper = client
        .exec(ExecSpec::argv(["sleep", "100000"]))
        .await
        .unwrap();
    let pid = sleeper.pid();

    let info = vm.snapshot(&tmp.path().join("snap")).await.unwrap();
    assert!(info.state_bytes > 0);
    vm.kill().await.unwrap();
    drop(client);
    drop(vm);

    let (_restored, client) = restore(&rt, &tmp, "snap", "restored").await;
    assert_eq!(
        &client.read_file_bytes("/root/kept.txt").await.unwrap()[..],
        b"from before the snapshot"
    );
    sh(&client, &format!("kill -0 {pid}")).await;
    let procs = client.processes().await.unwrap();
    assert!(procs.iter().any(|p| p.pid == pid && p.running), "{procs:?}");
}

#[tokio::test]
async fn restores_take_distinct_identities() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime().await;
    let (vm, client) = boot_minimal(&rt, &tmp).await;
    vm.snapshot(&tmp.path().join("snap")).await.unwrap();
    drop(client);
    drop(vm);

    let mut seen = Vec::new();
    let mut vms = Vec::new();
    for name in ["alpha", "beta"] {
        let (vm, client) = restore(&rt, &tmp, "snap", name).await;
        let identity = Identity {
            sandbox_id: format!("sbx-{name}"),
            entropy: rand::random::<[u8; 32]>().to_vec(),
            time_unix_ns: Some(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64,
            ),
            hostname: Some(name.to_owned()),
            ..Default::default()
        };
        client.identity(&identity).await.unwrap();
        assert_eq!(sh(&client, "hostname").await.trim(), name);
        assert_eq!(
            client.health().await.unwrap().sandbox_id.as_deref(),
            Some(identity.sandbox_id.as_str())
        );
        let uuid = sh(&client, "cat /proc/sys/kernel/random/uuid").await;
        assert_eq!(uuid.trim().len(), 36, "{uuid}");
        seen.push(uuid);
        vms.push((vm, client));
    }
    assert_ne!(seen[0], seen[1]);
}

#[tokio::test]
async fn base_image_boots_with_its_userland() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = runtime().await;
    let image = env_path("SPACE_ROOTFS_BASE");
    let dir = tmp.path().join("sandbox");
    std::fs::create_dir(&dir).unwrap();
    let vm = rt.boot(boot_spec(&dir, &image)).await.unwrap();
    let client = vm.wait_ready(BOOT_TIMEOUT).await.unwrap();
    let out = sh(&client, "python3 -c 'print(6 * 7)'").await;
    assert_eq!(out, "42\n");
}
