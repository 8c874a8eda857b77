//! The lifecycle soak: mixed operations (writes, read-backs, pause, resume, suspend, restore,
//! full and disk snapshots, rollback, fork, kill) on 10 sandboxes at once, each chosen at
//! random for a sandbox whose state allows it, with a ledger of the SHA-256 of every file
//! written. The ledger follows the sandboxes: a snapshot keeps a copy of its sandbox's
//! entries, a rollback brings that copy back, a fork inherits its parent's, a kill drops
//! them. Every read-back and a final pass over every file of every sandbox must match:
//! 0 bytes lost.
//!
//! `SPACE_SOAK_OPS` sets the number of operations (default 120, as `make test` runs it;
//! `make soak` runs 1,000) and `SPACE_SOAK_SEED` the seed (printed, so a failure can be run
//! again).

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use space_node::{Node, SandboxId, SandboxOptions, SnapshotId, SnapshotKind, State};
use space_proto::WriteOptions;

/// Sandboxes kept alive at once.
const SANDBOXES: usize = 10;

/// Path → SHA-256 and length of what a sandbox holds.
type Files = BTreeMap<String, (String, usize)>;

/// One sandbox as the soak knows it.
struct Tracked {
    id: SandboxId,
    state: State,
    files: Files,
    /// Its snapshots, with the files each one holds.
    snapshots: Vec<(SnapshotId, Files)>,
}

#[derive(Default)]
struct Counts {
    ops: BTreeMap<&'static str, u64>,
    bytes_written: u64,
    bytes_verified: u64,
    files_verified: u64,
}

impl Counts {
    fn count(&mut self, op: &'static str) {
        *self.ops.entry(op).or_default() += 1;
    }
}

async fn new_sandbox(node: &Node) -> Tracked {
    Tracked {
        id: create(node, SandboxOptions::default()).await,
        state: State::Running,
        files: Files::new(),
        snapshots: Vec::new(),
    }
}

/// Checks `path` of a Running sandbox against the ledger.
async fn verify(node: &Node, t: &Tracked, path: &str, counts: &mut Counts) {
    let (sum, len) = &t.files[path];
    let g = node.guest(&t.id).await.unwrap();
    let got = guest_sha(&g, path).await;
    assert_eq!(
        &got, sum,
        "{}: {path} ({len} bytes) does not read back",
        t.id
    );
    counts.bytes_verified += *len as u64;
    counts.files_verified += 1;
}

#[test]
fn mixed_lifecycle_operations_lose_no_byte() {
    let ops = env_number("SPACE_SOAK_OPS", 120);
    let seed = env_number("SPACE_SOAK_SEED", 0x50a4_1e55);
    println!("soak: {ops} operations on {SANDBOXES} sandboxes, SPACE_SOAK_SEED={seed}");
    with_node(
        Disk::Btrfs,
        |c| c.storage.loop_image_size = 16 << 30,
        move |node| async move {
            build_minimal(&node, "1").await;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut counts = Counts::default();
            let mut boxes = Vec::new();
            for _ in 0..SANDBOXES {
                boxes.push(new_sandbox(&node).await);
            }
            let mut serial = 0u64;
            let t0 = Instant::now();
            // Until `ops` operations were done (a roll the sandbox's state does not allow
            // is rolled again).
            while counts.ops.values().sum::<u64>() < ops {
                let i = rng.gen_range(0..boxes.len());
                let roll = rng.gen_range(0..100u32);
                let t = &mut boxes[i];
                match (t.state, roll) {
                    (State::Running, 0..=29) => {
                        serial += 1;
                        let path = format!("/root/soak-{serial}");
                        let len = rng.gen_range(1..=128usize << 10);
                        let mut data = vec![0u8; len];
                        rng.fill_bytes(&mut data);
                        let g = node.guest(&t.id).await.unwrap();
                        g.write_file(&path, data.clone(), WriteOptions::default())
                            .await
                            .unwrap();
                        t.files.insert(path, (sha256(&data), len));
                        counts.bytes_written += len as u64;
                        counts.count("write");
                    }
                    (State::Running, 30..=44) => {
                        if t.files.is_empty() {
                            continue;
                        }
                        let k = rng.gen_range(0..t.files.len());
                        let path = t.files.keys().nth(k).unwrap().clone();
                        verify(&node, t, &path, &mut counts).await;
                        counts.count("read back");
                    }
                    (State::Running, 45..=54) => {
                        node.pause(&t.id).await.unwrap();
                        t.state = State::Paused;
                        counts.count("pause");
                    }
                    (State::Running, 55..=64) => {
                        node.suspend(&t.id).await.unwrap();
                        t.state = State::Suspended;
                        counts.count("suspend");
                    }
                    (State::Running | State::Paused, 65..=79) => {
                        // A disk snapshot syncs the guest's disk first, which a paused guest
                        // cannot do.
                        let kind = if roll % 2 == 0 || t.state == State::Paused {
                            SnapshotKind::Full
                        } else {
                            SnapshotKind::Disk
                        };
                        let s = node.snapshot(&t.id, kind).await.unwrap();
                        t.snapshots.push((s.id, t.files.clone()));
                        counts.count(match kind {
                            SnapshotKind::Full => "full snapshot",
                            SnapshotKind::Disk => "disk snapshot",
                        });
                    }
                    (_, 80..=87) if !t.snapshots.is_empty() => {
                        // Only the snapshots the node still lists (retention may have
                        // thinned them).
                        let listed = node.info(&t.id).await.unwrap().snapshots;
                        t.snapshots
                            .retain(|(id, _)| listed.iter().any(|s| s.id == *id));
                        if t.snapshots.is_empty() {
                            continue;
                        }
                        let k = rng.gen_range(0..t.snapshots.len());
                        let (snap, files) = t.snapshots[k].clone();
                        node.rollback(&t.id, &snap).await.unwrap();
                        t.files = files;
                        t.state = State::Running;
                        counts.count("rollback");
                    }
                    (State::Running | State::Paused, 88..=93) => {
                        let child = node.fork(&t.id).await.unwrap();
                        let files = t.files.clone();
                        let child = Tracked {
                            id: child.id,
                            state: State::Running,
                            files,
                            snapshots: Vec::new(),
                        };
                        // The child holds the parent's files; it takes a random slot.
                        if let Some(path) = child.files.keys().next().cloned() {
                            verify(&node, &child, &path, &mut counts).await;
                        }
                        let slot = rng.gen_range(0..boxes.len());
                        let gone = std::mem::replace(&mut boxes[slot], child);
                        node.kill(&gone.id).await.unwrap();
                        counts.count("fork");
                    }
                    (_, 94..=99) => {
                        node.kill(&t.id).await.unwrap();
                        boxes[i] = new_sandbox(&node).await;
                        counts.count("kill and create");
                    }
                    (State::Paused, _) => {
                        node.resume(&t.id).await.unwrap();
                        t.state = State::Running;
                        counts.count("resume");
                    }
                    (State::Suspended, _) => {
                        node.restore(&t.id).await.unwrap();
                        t.state = State::Running;
                        counts.count("restore");
                    }
                    _ => continue,
                }
                let t = &boxes[i];
                let info = node.info(&t.id).await.unwrap();
                assert_eq!(info.state, t.state, "{}: {info:?}", t.id);
                assert!(info.pending.is_none(), "{}: {:?}", t.id, info.pending);
            }
            // Every file of every sandbox, each brought back to Running first.
            for t in &mut boxes {
                match t.state {
                    State::Paused => node.resume(&t.id).await.unwrap(),
                    State::Suspended => node.restore(&t.id).await.unwrap(),
                    _ => {}
                }
                t.state = State::Running;
                let paths: Vec<String> = t.files.keys().cloned().collect();
                for path in paths {
                    verify(&node, t, &path, &mut counts).await;
                }
            }
            let took = t0.elapsed();
            println!(
                "soak: {} operations in {:.0?} ({:.0?} each): {:?}",
                counts.ops.values().sum::<u64>(),
                took,
                took / ops.max(1) as u32,
                counts.ops
            );
            println!(
                "soak: {} bytes written, {} bytes in {} files read back by SHA-256, 0 lost",
                counts.bytes_written, counts.bytes_verified, counts.files_verified
            );
            for t in boxes {
                node.kill(&t.id).await.unwrap();
            }
        },
    );
}
