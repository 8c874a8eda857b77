//! The node's state machine and recovery on the fake runtime (`space_runtime::fake`): each
//! "VM" is a real `space-guestd` process on the host, so a lifecycle that takes minutes on
//! QEMU under TCG takes milliseconds here, and failures can be injected where a real VMM
//! would need luck to fail. What is checked is the node's side: states, records, snapshots
//! listed and on disk, intents cleared, processes started, killed or adopted.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use common::*;
use space_node::record::{Intent, Pending};
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{
    Node, NodeConfig, Origin, RecoveryAction, SandboxId, SandboxOptions, SandboxRecord, SnapshotId,
    SnapshotKind, State, TemplateRef, TemplateSpec,
};
use space_runtime::fake::{FakeOp, FakeRuntime};

/// The node configuration the tests open (twice for the ones that restart the node).
fn config(data: &Path) -> NodeConfig {
    let mut cfg = NodeConfig::new(data);
    cfg.storage = StorageOptions {
        driver: Some(DriverKind::Copy),
        loop_image_size: 0,
        loop_image: false,
    };
    cfg.ready_timeout = Duration::from_secs(10);
    cfg.pools = space_node::PoolConfig::disabled();
    cfg.rolling.enabled = false;
    cfg
}

fn runtime() -> Arc<FakeRuntime> {
    Arc::new(FakeRuntime::new(env_path("SPACE_GUESTD")))
}

/// Runs `test` with a node on a fresh data directory and the fake runtime it drives.
fn with_fake<F, Fut>(tune: impl FnOnce(&mut NodeConfig), test: F)
where
    F: FnOnce(Node, Arc<FakeRuntime>, PathBuf) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let fake = runtime();
    let opened = fake.clone();
    with_node_opened(
        Disk::Copy,
        |cfg| {
            *cfg = config(&cfg.data_dir);
            tune(cfg)
        },
        move |cfg| async move { Node::open_with(cfg, opened).await },
        |node| async move {
            let data = node.layout().root().to_owned();
            build(&node, &data).await;
            test(node, fake, data).await
        },
    );
}

/// Builds template `minimal` from a made-up kernel and root image (the fake reads neither).
async fn build(node: &Node, data: &Path) {
    let inputs = data.join("inputs");
    std::fs::create_dir_all(&inputs).unwrap();
    let (kernel, rootfs) = (inputs.join("vmlinux"), inputs.join("rootfs.ext4"));
    std::fs::write(&kernel, b"a kernel the fake runtime hashes and never runs").unwrap();
    std::fs::File::create(&rootfs)
        .and_then(|f| f.set_len(4 << 20))
        .unwrap();
    node.build_template(TemplateSpec {
        template: TemplateRef::new("minimal", "1").unwrap(),
        kernel,
        rootfs,
        vcpus: 1,
        memory_mib: 64,
        kernel_cmdline: None,
        ready_timeout: Duration::from_secs(10),
        guest: Default::default(),
        start: None,
        source: String::new(),
    })
    .await
    .expect("building the template on the fake runtime");
}

/// The pid of the sandbox's fake VM, from the record the fake keeps in its directory.
fn vm_pid(node: &Node, id: &SandboxId) -> Option<u32> {
    let dir = node.layout().sandbox_dir(id.as_str()).unwrap();
    let bytes = std::fs::read(dir.join("fake-vm.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    Some(v["pid"].as_u64().unwrap() as u32)
}

/// The state letter of process `pid` (`S`, `T`, ...), `None` once it is gone or a zombie.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let state = stat[stat.rfind(')')? + 1..].trim_start().chars().next()?;
    (!matches!(state, 'Z' | 'X')).then_some(state)
}

fn on_disk(node: &Node, id: &SandboxId) -> SandboxRecord {
    serde_json::from_slice(&record_bytes(node, id)).unwrap()
}

async fn state(node: &Node, id: &SandboxId) -> State {
    node.info(id).await.unwrap().state
}

#[test]
fn every_transition_leaves_the_state_record_and_process_it_names() {
    with_fake(
        |_| {},
        |node, _fake, _data| async move {
            let id = create(&node, SandboxOptions::default()).await;
            let info = node.info(&id).await.unwrap();
            assert_eq!(
                (info.state, &info.origin),
                (State::Running, &Origin::Template)
            );
            let g = node.guest(&id).await.unwrap();
            assert_eq!(
                g.health().await.unwrap().sandbox_id.as_deref(),
                Some(id.as_str()),
                "the identity step reached the daemon"
            );
            assert_eq!(sh(&g, "echo $((6 * 7))").await.trim(), "42");
            let first = vm_pid(&node, &id).unwrap();

            node.pause(&id).await.unwrap();
            assert_eq!(state(&node, &id).await, State::Paused);
            assert_eq!(proc_state(first), Some('T'), "a paused VM is stopped");
            assert!(node.guest(&id).await.is_err());
            node.resume(&id).await.unwrap();
            assert_eq!(state(&node, &id).await, State::Running);
            assert_ne!(proc_state(first), Some('T'));

            let disk = node.snapshot(&id, SnapshotKind::Disk).await.unwrap();
            let full = node.snapshot(&id, SnapshotKind::Full).await.unwrap();
            let listed: Vec<SnapshotId> = node
                .snapshots(&id)
                .await
                .unwrap()
                .into_iter()
                .map(|s| s.id)
                .collect();
            assert_eq!(listed, [disk.id.clone(), full.id.clone()]);
            let full_dir = node
                .layout()
                .snapshot_dir(id.as_str(), full.id.as_str())
                .unwrap();
            for f in ["mem", "rootfs.ext4", "state", "manifest.json"] {
                assert!(
                    full_dir.join(f).is_file(),
                    "{f} missing from the full snapshot"
                );
            }
            assert_eq!(vm_pid(&node, &id), Some(first), "a snapshot keeps the VM");

            let suspended = node.suspend(&id).await.unwrap();
            let dir = node.layout().sandbox_dir(id.as_str()).unwrap();
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Suspended);
            assert_eq!(info.restore_point.as_ref(), Some(&suspended.id));
            assert!(!dir.join("mem").exists(), "RAM file kept after suspend");
            assert_eq!(proc_state(first), None, "suspend ends the VM");
            assert_eq!(on_disk(&node, &id).state, State::Suspended);

            node.restore(&id).await.unwrap();
            let restored = vm_pid(&node, &id).unwrap();
            assert_ne!(restored, first);
            let g = node.guest(&id).await.unwrap();
            assert_eq!(
                g.health().await.unwrap().sandbox_id.as_deref(),
                Some(id.as_str())
            );

            node.rollback(&id, &disk.id).await.unwrap();
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Running);
            assert_eq!(info.origin, Origin::DiskSnapshot { snapshot: disk.id });
            assert_eq!(proc_state(restored), None, "rollback replaces the VM");
            node.rollback(&id, &full.id).await.unwrap();
            assert_eq!(
                node.info(&id).await.unwrap().origin,
                Origin::Snapshot {
                    sandbox: id.clone(),
                    snapshot: full.id.clone()
                }
            );

            let child = node.fork(&id).await.unwrap();
            assert_eq!(child.state, State::Running);
            let (parent, snap) = child.forked_from.clone().expect("a fork names its parent");
            assert_eq!(parent, id);
            assert!(node
                .snapshots(&id)
                .await
                .unwrap()
                .iter()
                .any(|s| s.id == snap));
            let child_pid = vm_pid(&node, &child.id).unwrap();
            assert_ne!(Some(child_pid), vm_pid(&node, &id));
            let g = node.guest(&child.id).await.unwrap();
            assert_eq!(
                g.health().await.unwrap().sandbox_id.as_deref(),
                Some(child.id.as_str()),
                "a fork gets its own identity"
            );

            node.kill(&child.id).await.unwrap();
            assert_eq!(state(&node, &child.id).await, State::Terminated);
            assert_eq!(proc_state(child_pid), None);
            assert_eq!(
                state(&node, &id).await,
                State::Running,
                "the parent runs on"
            );
        },
    );
}

#[test]
fn a_failed_runtime_operation_changes_nothing_and_leaves_no_intent() {
    with_fake(
        |_| {},
        |node, fake, _data| async move {
            let id = create(&node, SandboxOptions::default()).await;
            let pid = vm_pid(&node, &id).unwrap();
            let before = node.snapshots(&id).await.unwrap();

            fake.fail_next(FakeOp::Snapshot, 1);
            let e = node.snapshot(&id, SnapshotKind::Full).await.unwrap_err();
            let text = chain(&e);
            assert!(text.contains("injected"), "{text}");
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Running);
            assert!(info.pending.is_none(), "{info:?}");
            assert_eq!(node.snapshots(&id).await.unwrap(), before);
            assert!(on_disk(&node, &id).pending.is_none());
            let snaps = node.layout().snapshots().join(id.as_str());
            let left = std::fs::read_dir(&snaps).map(|d| d.count()).unwrap_or(0);
            assert_eq!(left, 0, "a failed snapshot left a directory in {snaps:?}");

            fake.fail_next(FakeOp::Snapshot, 1);
            node.suspend(&id).await.unwrap_err();
            assert_eq!(state(&node, &id).await, State::Running);
            assert_eq!(
                vm_pid(&node, &id),
                Some(pid),
                "a failed suspend keeps the VM"
            );
            assert!(proc_state(pid).is_some());

            fake.fail_next(FakeOp::Pause, 1);
            node.pause(&id).await.unwrap_err();
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Running);
            assert!(info.pending.is_none());
            node.guest(&id).await.unwrap().health().await.unwrap();

            // The same requests succeed once the runtime does.
            let full = node.snapshot(&id, SnapshotKind::Full).await.unwrap();
            node.suspend(&id).await.unwrap();
            fake.fail_next(FakeOp::Restore, 1);
            node.restore(&id).await.unwrap_err();
            let info = node.info(&id).await.unwrap();
            assert_eq!(info.state, State::Suspended, "{info:?}");
            assert!(info.pending.is_none());
            node.restore(&id).await.unwrap();
            assert_eq!(state(&node, &id).await, State::Running);
            assert!(node
                .snapshots(&id)
                .await
                .unwrap()
                .iter()
                .any(|s| s.id == full.id));

            fake.fail_next(FakeOp::Restore, 1);
            let e = node.fork(&id).await.unwrap_err();
            let text = chain(&e);
            assert!(text.contains("injected"), "{text}");
            let all = node.list().await.unwrap();
            assert!(
                all.iter()
                    .all(|s| s.id == id || s.state == State::Terminated),
                "a failed fork left a sandbox: {all:?}"
            );
        },
    );
}

#[test]
fn a_vm_that_dies_comes_back_from_its_newest_full_snapshot() {
    with_fake(
        |_| {},
        |node, _fake, _data| async move {
            let id = create(&node, SandboxOptions::default()).await;
            node.snapshot(&id, SnapshotKind::Full).await.unwrap();
            let newest = node.snapshot(&id, SnapshotKind::Full).await.unwrap();
            let dead = vm_pid(&node, &id).unwrap();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(dead as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let info = node.info(&id).await.unwrap();
                let back = vm_pid(&node, &id).is_some_and(|p| p != dead);
                if info.state == State::Running && back && info.pending.is_none() {
                    assert_eq!(
                        info.origin,
                        Origin::Snapshot {
                            sandbox: id.clone(),
                            snapshot: newest.id.clone()
                        }
                    );
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "never restored: {info:?}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let g = node.guest(&id).await.unwrap();
            assert_eq!(
                g.health().await.unwrap().sandbox_id.as_deref(),
                Some(id.as_str())
            );
        },
    );
}

#[test]
fn a_restarted_node_adopts_the_vms_and_settles_what_was_cut_short() {
    with_fake(
        |_| {},
        |node, _fake, data| async move {
            let running = create(&node, SandboxOptions::default()).await;
            let paused = create(&node, SandboxOptions::default()).await;
            node.pause(&paused).await.unwrap();
            let cut = create(&node, SandboxOptions::default()).await;
            let done = create(&node, SandboxOptions::default()).await;
            let done_full = node.snapshot(&done, SnapshotKind::Full).await.unwrap();
            let pids: Vec<u32> = [&running, &paused, &cut, &done]
                .into_iter()
                .map(|id| vm_pid(&node, id).unwrap())
                .collect();
            let layout = node.layout().clone();
            let record_of = |id: &SandboxId| node.record_path(id);
            let (cut_record, done_record) = (record_of(&cut), record_of(&done));
            node.shutdown_detach().await;
            drop(node);
            for pid in &pids {
                assert!(proc_state(*pid).is_some(), "a detached VM died");
            }

            // As if the node had died in two suspends: one before its snapshot was complete
            // (a partial directory), one after.
            let unix_ms = 1_800_000_000_000;
            let pend = |path: &Path, snapshot: &SnapshotId| {
                let mut r: SandboxRecord =
                    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
                r.pending = Some(Pending {
                    request: Intent::Suspend,
                    target: State::Suspended,
                    snapshot: Some(snapshot.clone()),
                    started_unix_ms: unix_ms,
                });
                std::fs::write(path, serde_json::to_vec(&r).unwrap()).unwrap();
            };
            let partial = SnapshotId::generate(unix_ms, "full");
            let partial_dir = layout.snapshot_dir(cut.as_str(), partial.as_str()).unwrap();
            std::fs::create_dir_all(&partial_dir).unwrap();
            std::fs::write(partial_dir.join("mem"), b"half").unwrap();
            pend(&cut_record, &partial);
            let complete = SnapshotId::generate(unix_ms, "full");
            let complete_dir = layout
                .snapshot_dir(done.as_str(), complete.as_str())
                .unwrap();
            copy_dir(
                &layout
                    .snapshot_dir(done.as_str(), done_full.id.as_str())
                    .unwrap(),
                &complete_dir,
            );
            pend(&done_record, &complete);

            let node = Node::open_with(config(&data), runtime()).await.unwrap();
            for (id, pid, want) in [
                (&running, pids[0], State::Running),
                (&paused, pids[1], State::Paused),
                (&cut, pids[2], State::Running),
            ] {
                let info = node.info(id).await.unwrap();
                assert_eq!(info.state, want, "{info:?}");
                assert!(info.pending.is_none(), "{info:?}");
                assert_eq!(vm_pid(&node, id), Some(pid), "{id} was not adopted");
            }
            assert_eq!(
                proc_state(pids[1]),
                Some('T'),
                "adoption resumed a paused VM"
            );
            assert!(!partial_dir.exists(), "the partial snapshot was kept");
            let actions = |info: &SandboxRecord| -> Vec<RecoveryAction> {
                info.recoveries.iter().map(|e| e.action).collect()
            };
            let info = node.info(&cut).await.unwrap();
            assert!(
                actions(&info).contains(&RecoveryAction::RolledBackPending),
                "{info:?}"
            );
            let g = node.guest(&running).await.unwrap();
            assert_eq!(
                g.health().await.unwrap().sandbox_id.as_deref(),
                Some(running.as_str())
            );

            let info = node.info(&done).await.unwrap();
            assert_eq!(info.state, State::Suspended, "{info:?}");
            assert_eq!(info.restore_point.as_ref(), Some(&complete));
            assert!(
                actions(&info).contains(&RecoveryAction::FinishedPending),
                "{info:?}"
            );
            assert!(info.pending.is_none());
            assert_eq!(proc_state(pids[3]), None, "a finished suspend leaves no VM");
            node.restore(&done).await.unwrap();
            assert_eq!(state(&node, &done).await, State::Running);

            let again = node.recover().await.unwrap();
            assert!(again.is_empty(), "a second pass changed things: {again:?}");
            node.shutdown().await;
            for pid in pids.iter().take(3) {
                assert_eq!(proc_state(*pid), None, "shutdown left pid {pid}");
            }
        },
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// An error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        text = format!("{text}: {s}");
        next = s.source();
    }
    text
}

/// What a sandbox should be after the requests so far, by the rules of `docs/lifecycle.md`.
#[derive(Debug, Clone)]
struct Expected {
    state: State,
    snapshots: Vec<SnapshotId>,
}

/// Random requests (some of them illegal in the state they meet, some failed by the runtime)
/// on a handful of sandboxes, each answer checked against a model of the state machine, and
/// after each one the invariants every sandbox keeps: the record on disk says what `info`
/// says with no intent left, a Running sandbox's daemon answers with its id, a Paused one's
/// process is stopped, a Suspended or Terminated one has none, every listed snapshot is on
/// disk. `SPACE_FAKE_OPS` (300) requests from `SPACE_FAKE_SEED` (time-based, printed).
#[test]
fn random_requests_keep_the_state_machine_and_its_invariants() {
    let ops = env_number("SPACE_FAKE_OPS", 300);
    let seed = env_number(
        "SPACE_FAKE_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    );
    println!("SPACE_FAKE_SEED={seed}");
    with_fake(
        |_| {},
        move |node, fake, _data| async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut model: Vec<(SandboxId, Expected)> = Vec::new();
            for step in 0..ops {
                let live = model
                    .iter()
                    .filter(|(_, e)| e.state != State::Terminated)
                    .count();
                // Past MAX_LIVE forks become kills and nothing is created, so a long run
                // stays within what the node admits.
                let crowded = live >= MAX_LIVE;
                if live < 2 || (!crowded && rng.gen_range(0..20) == 0) {
                    let id = create(&node, SandboxOptions::default()).await;
                    model.push((
                        id,
                        Expected {
                            state: State::Running,
                            snapshots: Vec::new(),
                        },
                    ));
                    continue;
                }
                let i = rng.gen_range(0..model.len());
                let (id, want) = model[i].clone();
                let before = want.state;
                let alive = matches!(before, State::Running | State::Paused);
                // One request in eight meets a runtime that fails it.
                let fault = (rng.gen_range(0..8) == 0).then_some(match rng.gen_range(0..4) {
                    0 => FakeOp::Snapshot,
                    1 => FakeOp::Pause,
                    2 => FakeOp::Resume,
                    _ => FakeOp::Restore,
                });
                // 0 pause, 1 resume, 2 disk snapshot, 3 full snapshot, 4 suspend, 5 restore,
                // 6 rollback, 7 fork, 8 kill (rarer), 9 guest access.
                let op = match rng.gen_range(0..9) {
                    6 if want.snapshots.is_empty() => 9,
                    7 if crowded => 8,
                    8 if !crowded && rng.gen_range(0..4) != 0 => 9,
                    op => op,
                };
                let what = format!("step {step} (seed {seed}): request {op} on {id} in {before:?}");
                let mut next = want.clone();
                let mut forked = None;
                let res: Result<(), space_node::NodeError> = {
                    if let Some(f) = fault {
                        fake.fail_next(f, 1);
                    }
                    match op {
                        0 => node.pause(&id).await,
                        1 => node.resume(&id).await,
                        2 | 3 => {
                            let kind = if op == 2 {
                                SnapshotKind::Disk
                            } else {
                                SnapshotKind::Full
                            };
                            node.snapshot(&id, kind).await.map(drop)
                        }
                        4 => node.suspend(&id).await.map(drop),
                        5 => node.restore(&id).await,
                        6 => {
                            let k = rng.gen_range(0..want.snapshots.len());
                            node.rollback(&id, &want.snapshots[k]).await
                        }
                        7 => node.fork(&id).await.map(|c| {
                            forked = Some(c.id);
                        }),
                        8 => node.kill(&id).await,
                        _ => node.guest(&id).await.map(|_| ()),
                    }
                };
                // Whether the runtime failed an operation of this request.
                let injected = fault.is_some_and(|f| fake.clear(f) == 0);
                // What the model says the answer should have been.
                let (legal, target) = match op {
                    0 => (before == State::Running, State::Paused),
                    1 => (before == State::Paused, State::Running),
                    2..=3 | 7 => (alive, before),
                    4 => (alive, State::Suspended),
                    5 => (before == State::Suspended, State::Running),
                    6 => (before != State::Terminated, State::Running),
                    8 => (before != State::Terminated, State::Terminated),
                    _ => (before == State::Running, before),
                };
                let info = node.info(&id).await.unwrap();
                match &res {
                    Err(space_node::NodeError::IllegalState { .. }) => {
                        assert!(!legal, "{what}: refused as illegal");
                    }
                    Err(e) => {
                        let text = chain(e);
                        assert!(legal && injected, "{what}: {text}");
                        assert!(text.contains("injected"), "{what}: {text}");
                        // A rollback that failed after the VM was stopped falls back to
                        // Suspended on its undo point (Failed without one); anything else is
                        // as before.
                        let states: &[State] = if op == 6 {
                            &[before, State::Suspended, State::Failed]
                        } else {
                            &[before]
                        };
                        assert!(states.contains(&info.state), "{what}: {info:?}");
                        next.state = info.state;
                    }
                    Ok(()) => {
                        assert!(legal, "{what}: accepted");
                        next.state = target;
                    }
                }
                // A snapshot taken on the way (a fork's, one of a request that failed later)
                // is listed after the ones before.
                let listed: Vec<SnapshotId> = info.snapshots.iter().map(|s| s.id.clone()).collect();
                if next.state != State::Terminated {
                    assert!(
                        listed.starts_with(&want.snapshots),
                        "{what}: snapshots {listed:?} after {:?}",
                        want.snapshots
                    );
                    if res.is_ok() {
                        // A rollback of a VM takes an undo point first.
                        let takes = usize::from(matches!(op, 2..=4 | 7) || (op == 6 && alive));
                        assert_eq!(
                            listed.len(),
                            want.snapshots.len() + takes,
                            "{what}: snapshots {listed:?}"
                        );
                    }
                    next.snapshots = listed;
                }
                model[i].1 = next;
                if let Some(child) = forked {
                    model.push((
                        child,
                        Expected {
                            state: State::Running,
                            snapshots: Vec::new(),
                        },
                    ));
                }
                for (id, want) in &model {
                    check(&node, id, want, &what).await;
                }
            }
            let states: Vec<State> = model.iter().map(|(_, e)| e.state).collect();
            println!("{} sandboxes, ended as {states:?}", model.len());
        },
    );
}

/// How many sandboxes that are not terminated the random requests keep at most.
const MAX_LIVE: usize = 12;

async fn check(node: &Node, id: &SandboxId, want: &Expected, what: &str) {
    let info = node.info(id).await.unwrap();
    assert_eq!(info.state, want.state, "{what}: {id} is {info:?}");
    assert!(
        info.pending.is_none(),
        "{what}: an intent was left: {info:?}"
    );
    let record = on_disk(node, id);
    assert_eq!(
        record.state, info.state,
        "{what}: the record on disk differs"
    );
    if want.state == State::Terminated {
        assert!(vm_pid(node, id).and_then(proc_state).is_none(), "{what}");
        return;
    }
    let listed: Vec<SnapshotId> = info.snapshots.iter().map(|s| s.id.clone()).collect();
    assert_eq!(listed, want.snapshots, "{what}: snapshots of {id}");
    for s in &info.snapshots {
        let dir = node
            .layout()
            .snapshot_dir(id.as_str(), s.id.as_str())
            .unwrap();
        assert!(
            dir.join("rootfs.ext4").is_file(),
            "{what}: {dir:?} has no disk"
        );
        if s.kind == SnapshotKind::Full {
            assert!(
                dir.join("manifest.json").is_file(),
                "{what}: {dir:?} has no manifest"
            );
        }
    }
    let pid = vm_pid(node, id);
    match want.state {
        State::Running => {
            let g = node.guest(id).await.unwrap();
            let health = g.health().await.unwrap();
            assert_eq!(health.sandbox_id.as_deref(), Some(id.as_str()), "{what}");
            assert!(proc_state(pid.unwrap()).is_some_and(|s| s != 'T'), "{what}");
        }
        State::Paused => {
            assert_eq!(
                proc_state(pid.unwrap()),
                Some('T'),
                "{what}: {id} is not stopped"
            );
        }
        _ => {
            let running = pid.and_then(proc_state);
            assert!(
                running.is_none(),
                "{what}: {id} still has a process ({running:?})"
            );
        }
    }
}
