//! Many suspend/restore cycles of one sandbox lose nothing: a file that grows every cycle is
//! compared by SHA-256 with the host's copy after each restore, and a process started before
//! the first cycle is still running after the last. `SPACE_CYCLES` overrides the count.

mod common;

use std::time::{Duration, Instant};

use common::*;
use space_node::{SandboxOptions, State};
use space_proto::WriteOptions;

#[test]
fn suspend_restore_cycles_lose_nothing() {
    let cycles = env_number("SPACE_CYCLES", 50) as usize;
    with_node(
        Disk::Btrfs,
        |_| {},
        move |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;
            let g = node.guest(&id).await.unwrap();
            let pid = start_sleeper(&g).await;
            let mut expected: Vec<u8> = Vec::new();
            let (mut suspend_total, mut restore_total) = (Duration::ZERO, Duration::ZERO);
            let t0 = Instant::now();
            for cycle in 0..cycles {
                let g = node.guest(&id).await.unwrap();
                let chunk: Vec<u8> = (0..4096).map(|_| rand::random::<u8>()).collect();
                expected.extend_from_slice(&chunk);
                // Append in the guest: read, extend, write back (the daemon writes whole files).
                let mut current = g
                    .read_file_bytes("/root/grow.bin")
                    .await
                    .map(|b| b.to_vec())
                    .unwrap_or_default();
                current.extend_from_slice(&chunk);
                g.write_file("/root/grow.bin", current, WriteOptions::default())
                    .await
                    .unwrap();
                drop(g);

                let t = Instant::now();
                node.suspend(&id).await.unwrap();
                suspend_total += t.elapsed();
                assert_eq!(node.info(&id).await.unwrap().state, State::Suspended);
                let t = Instant::now();
                node.restore(&id).await.unwrap();
                restore_total += t.elapsed();

                let g = node.guest(&id).await.unwrap();
                assert_eq!(
                    guest_sha(&g, "/root/grow.bin").await,
                    sha256(&expected),
                    "file differs after cycle {cycle}"
                );
            }
            let g = node.guest(&id).await.unwrap();
            assert!(alive(&g, pid).await, "process lost over {cycles} cycles");
            let snaps = node.snapshots(&id).await.unwrap();
            assert_eq!(snaps.len(), cycles);
            let n = cycles.max(1) as u32;
            println!(
                "{cycles} suspend/restore cycles in {:?}: suspend avg {:?}, restore (to guest \
                 ready + identity) avg {:?}",
                t0.elapsed(),
                suspend_total / n,
                restore_total / n
            );
        },
    );
}
