//! Resource samples of a real guest: a sampling of a running sandbox holds what its guest and
//! its VMM use; a guest that spins and holds memory shows it in the next samples; a paused
//! sandbox is not sampled and keeps its series, and a killed one loses it.

mod common;

use std::time::Duration;

use common::*;
use space_node::{NodeError, SandboxOptions};

#[test]
fn samples_rise_while_the_guest_spins_and_holds_memory() {
    with_node(
        Disk::Btrfs,
        |c| c.metrics_tick = None,
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;

            // The first sampling only sets the base; the second makes a sample.
            node.sample_metrics().await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            assert_eq!(node.sample_metrics().await, 1);
            let idle = node.metrics(&id, 0, u64::MAX).await.unwrap();
            assert_eq!(idle.len(), 1, "{idle:?}");
            let idle = idle[0].clone();
            assert_eq!(idle.cpu_count, 1);
            assert!(idle.span_ms >= 1500, "{idle:?}");
            assert!(
                idle.mem_total_bytes > 150 << 20 && idle.mem_total_bytes <= 256 << 20,
                "{idle:?}"
            );
            assert!(idle.mem_used_bytes < idle.mem_total_bytes, "{idle:?}");
            assert!(idle.disk_total_bytes > 0, "{idle:?}");
            assert!(idle.host_mem_bytes > 0, "{idle:?}");
            assert!(idle.cpu_used_pct < 50.0, "an idle guest: {idle:?}");

            // Spin one vCPU and put 96 MiB in a tmpfs (memory the guest cannot reclaim).
            let client = node.guest(&id).await.unwrap();
            sh(
                &client,
                "dd if=/dev/zero of=/dev/shm/hold bs=1M count=96 2>/dev/null; \
                 (while :; do :; done) >/dev/null 2>&1 &",
            )
            .await;
            node.sample_metrics().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            node.sample_metrics().await;
            let all = node.metrics(&id, 0, u64::MAX).await.unwrap();
            let busy = all.last().unwrap().clone();
            assert!(busy.cpu_used_pct > 80.0, "a spinning guest: {busy:?}");
            assert!(busy.host_cpu_pct > 30.0, "its VMM works too: {busy:?}");
            assert!(
                busy.mem_used_bytes >= idle.mem_used_bytes + (80 << 20),
                "96 MiB held: {idle:?} then {busy:?}"
            );
            assert!(busy.mem_cache_bytes >= 90 << 20, "tmpfs is cache: {busy:?}");
            let ts: Vec<u64> = all.iter().map(|s| s.timestamp_unix_ms).collect();
            assert!(ts.windows(2).all(|w| w[0] < w[1]), "{ts:?}");
            // The range bounds the end of each span.
            let last = busy.timestamp_unix_ms;
            assert_eq!(node.metrics(&id, last, last).await.unwrap().len(), 1);
            assert!(node.metrics(&id, 0, ts[0] - 1).await.unwrap().is_empty());

            // Paused: no sample, the series stays.
            node.pause(&id).await.unwrap();
            assert_eq!(node.sample_metrics().await, 0);
            assert_eq!(
                node.metrics(&id, 0, u64::MAX).await.unwrap().len(),
                all.len()
            );
            node.resume(&id).await.unwrap();

            // Killed: its series goes with the next sampling; an unknown id is not found.
            node.kill(&id).await.unwrap();
            node.sample_metrics().await;
            assert!(node.metrics(&id, 0, u64::MAX).await.unwrap().is_empty());
            let other: space_node::SandboxId = "sbx-nosuchsandbox".parse().unwrap();
            assert!(matches!(
                node.metrics(&other, 0, u64::MAX).await,
                Err(NodeError::NotFound(_))
            ));
        },
    );
}
