//! Guests that attack what they can reach from inside: their console, their disk, their
//! process table and their memory. Each attack runs in one sandbox while another keeps
//! answering execs; the host side stays bounded (the console log under its cap, the disk
//! under its size) and the attacked sandbox either comes back once the attack ends or can
//! still be killed. How much the other sandbox's exec latency moves is measured by
//! `space-bench hostile`, not here.

mod common;

use std::time::{Duration, Instant};

use common::*;
use space_node::{SandboxOptions, State};
use space_proto::ExecSpec;
use space_runtime::GuestClient;

/// Execs in the quiet sandbox while an attack runs: each must succeed.
async fn quiet_keeps_answering(quiet: &GuestClient, what: &str, for_how_long: Duration) -> usize {
    let t0 = Instant::now();
    let mut n = 0;
    while t0.elapsed() < for_how_long {
        let out = quiet
            .run(ExecSpec::shell("echo ok"))
            .await
            .unwrap_or_else(|e| panic!("quiet exec during {what}: {e}"));
        assert_eq!(out.stdout.as_ref(), b"ok\n", "during {what}");
        n += 1;
    }
    n
}

/// The attacked guest answers again within `limit` (its attack over).
async fn answers_again(g: &GuestClient, what: &str, limit: Duration) {
    let t0 = Instant::now();
    loop {
        match g.run(ExecSpec::shell("echo back")).await {
            Ok(out) if out.stdout.as_ref() == b"back\n" => return,
            other => {
                assert!(
                    t0.elapsed() < limit,
                    "the guest never answered again after {what}: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

#[test]
fn hostile_guests_are_contained_and_the_others_keep_working() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            build_minimal(&node, "1").await;
            let quiet_id = create(&node, SandboxOptions::default()).await;
            let hostile_id = create(
                &node,
                SandboxOptions {
                    disk_mib: Some(512),
                    ..Default::default()
                },
            )
            .await;
            let quiet = node.guest(&quiet_id).await.unwrap();
            let hostile = node.guest(&hostile_id).await.unwrap();
            let dir = node.layout().sandbox_dir(hostile_id.as_str()).unwrap();

            // The console: as fast as the guest can write it, for 20 s.
            hostile
                .exec(ExecSpec::shell(
                    "timeout 20 sh -c 'yes hostile-console-line > /dev/ttyS0'",
                ))
                .await
                .unwrap();
            let n = quiet_keeps_answering(&quiet, "a console flood", Duration::from_secs(20)).await;
            assert!(n > 0);
            answers_again(&hostile, "a console flood", Duration::from_secs(60)).await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let console = std::fs::metadata(dir.join("console.log"))
                .map(|m| m.len())
                .unwrap_or(0);
            assert!(
                console <= space_runtime::console::LOG_CAP + (16 << 20),
                "console.log grew to {console} bytes"
            );
            let tail = node.console_tail(&hostile_id, 4096).await.unwrap();
            assert!(
                String::from_utf8_lossy(&tail).contains("hostile-console-line"),
                "the console kept nothing of the flood"
            );

            // The disk: written until it is full, then freed.
            let out = hostile
                .run(ExecSpec::shell(
                    "dd if=/dev/zero of=/root/fill bs=1M 2>&1; sync; df -m / | tail -n1",
                ))
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                text.contains("No space left"),
                "dd stopped for another reason: {text}"
            );
            quiet_keeps_answering(&quiet, "a full disk", Duration::from_secs(2)).await;
            // On the host: the disk file holds at most its size, the RAM file at most the
            // guest's memory, whatever the guest wrote.
            for (file, bound) in [("rootfs.ext4", 512u64 << 20), ("mem", 256 << 20)] {
                let (apparent, allocated) = sizes(&dir.join(file));
                assert!(
                    apparent <= bound && allocated <= bound + (1 << 20),
                    "{file}: {apparent} bytes long, {allocated} allocated, bound {bound}"
                );
            }
            assert_eq!(sh(&hostile, "rm /root/fill && echo freed").await, "freed\n");

            // The process table: forks until nothing more can be made, for 20 s. The guest
            // runs out of memory before it runs out of pids, so its OOM killer picks among the
            // flood's processes; `timeout` is kept off its list (and the loop put back on), or
            // a killed `timeout` would leave the loop forking for ever.
            hostile
                .exec(ExecSpec::shell(
                    "echo -1000 > /proc/self/oom_score_adj; exec timeout -s KILL 20 \
                     sh -c 'echo 0 > /proc/self/oom_score_adj; while :; do sleep 25 & done' \
                     >/dev/null 2>&1",
                ))
                .await
                .unwrap();
            quiet_keeps_answering(&quiet, "a fork flood", Duration::from_secs(20)).await;
            answers_again(&hostile, "a fork flood", Duration::from_secs(120)).await;

            // Memory: one process takes everything it can; the guest kernel kills it. The
            // shell that reports on it is out of the OOM killer's reach (it was once picked
            // too, and nothing was left to say how tail ended).
            let out = hostile
                .run(ExecSpec::shell(
                    "echo -1000 > /proc/self/oom_score_adj; \
                     sh -c 'echo 0 > /proc/self/oom_score_adj; exec tail /dev/zero'; \
                     echo status=$?",
                ))
                .await;
            quiet_keeps_answering(&quiet, "memory exhaustion", Duration::from_secs(2)).await;
            answers_again(&hostile, "memory exhaustion", Duration::from_secs(120)).await;
            if let Ok(out) = out {
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                assert!(text.contains("status="), "{text}");
            }

            // Still a sandbox like any other: running, and killed like one.
            let info = node.info(&hostile_id).await.unwrap();
            assert_eq!(info.state, State::Running, "{info:?}");
            node.kill(&hostile_id).await.unwrap();
            assert_eq!(sh(&quiet, "echo still").await, "still\n");
        },
    );
}

/// A file's length and the bytes the host's filesystem gives it.
fn sizes(path: &std::path::Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.len(), m.blocks() * 512)
}
