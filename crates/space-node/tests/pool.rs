//! Warm pools on real guests: a create from the pool behaves like any create (files,
//! processes, its own identity), concurrent creates never share a VM, the pool refills after
//! takes, an empty pool falls back to a restore, and pools follow the newest template build and
//! go away with the node.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use space_node::{Node, NodeConfig, Origin, PoolConfig, SandboxOptions, State};

fn pool_of(size: usize, tick: Option<Duration>) -> impl FnOnce(&mut NodeConfig) {
    move |c| c.pools = PoolConfig::fixed(BTreeMap::from([("minimal".parse().unwrap(), size)]), tick)
}

/// (ready, hits, misses) of the pool of `minimal:version`.
fn stats(node: &Node, version: &str) -> Option<(usize, u64, u64)> {
    node.pool_stats()
        .into_iter()
        .find(|s| s.template.name.as_str() == "minimal" && s.template.version.as_str() == version)
        .map(|s| (s.ready, s.hits, s.misses))
}

fn sandbox_dirs(node: &Node) -> HashSet<PathBuf> {
    std::fs::read_dir(node.layout().sandboxes())
        .map(|e| e.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default()
}

/// Sandbox directories that belong to no listed sandbox: the pool's members.
async fn member_dirs(node: &Node) -> HashSet<PathBuf> {
    let listed: HashSet<PathBuf> = node
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|r| node.layout().sandbox_dir(r.id.as_str()).unwrap())
        .collect();
    sandbox_dirs(node).difference(&listed).cloned().collect()
}

fn qemu_pid(dir: &Path) -> i32 {
    std::fs::read_to_string(dir.join("qemu.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_create_from_the_pool_is_a_create() {
    with_node(Disk::Btrfs, pool_of(2, None), |node| async move {
        build_minimal(&node, "1").await;
        assert_eq!(node.reconcile_pools().await, 2);
        assert_eq!(stats(&node, "1"), Some((2, 0, 0)));
        // Idempotent: nothing to do now.
        assert_eq!(node.reconcile_pools().await, 0);
        let members = member_dirs(&node).await;
        assert_eq!(members.len(), 2, "{members:?}");
        // Members are not sandboxes anyone can see.
        assert!(node.list().await.unwrap().is_empty());

        let mut opts = SandboxOptions::default();
        opts.env.insert("GREETING".into(), "from-the-pool".into());
        let t0 = Instant::now();
        let a = node.create(minimal_with(opts.clone())).await.unwrap();
        println!("create from the pool: {:?}", t0.elapsed());
        assert_eq!(stats(&node, "1"), Some((1, 1, 0)));
        assert_eq!(a.state, State::Running);
        assert_eq!(a.origin, Origin::Template);
        assert_eq!(a.options, opts);
        let a_dir = node.layout().sandbox_dir(a.id.as_str()).unwrap();
        assert!(members.contains(&a_dir), "not one of the pool's VMs");
        let saved = node.info(&a.id).await.unwrap();
        assert_eq!(saved.state, State::Running);
        assert!(saved.pending.is_none());

        // Identity: its own hostname and entropy, the create's environment.
        let g = node.guest(&a.id).await.unwrap();
        assert_eq!(sh(&g, "hostname").await.trim(), a.id.as_str());
        assert_eq!(sh(&g, "echo $GREETING").await.trim(), "from-the-pool");
        let date: u64 = sh(&g, "date +%s").await.trim().parse().unwrap();
        let host = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(date.abs_diff(host) < 60, "guest clock {date}, host {host}");

        // Files and processes, and they survive suspend/restore like any sandbox's.
        let sum = write_random(&g, "/root/data.bin", 50_000).await;
        let pid = start_sleeper(&g).await;
        assert!(alive(&g, pid).await);
        node.suspend(&a.id).await.unwrap();
        node.restore(&a.id).await.unwrap();
        let g = node.guest(&a.id).await.unwrap();
        assert_eq!(guest_sha(&g, "/root/data.bin").await, sum);
        assert!(alive(&g, pid).await);

        // The second member: another VM with another identity.
        let t0 = Instant::now();
        let b = node.create(minimal()).await.unwrap();
        println!("create from the pool: {:?}", t0.elapsed());
        assert_eq!(stats(&node, "1"), Some((0, 2, 0)));
        let gb = node.guest(&b.id).await.unwrap();
        assert_eq!(sh(&gb, "hostname").await.trim(), b.id.as_str());
        assert_ne!(
            sh(&gb, "cat /proc/sys/kernel/random/uuid").await,
            sh(&g, "cat /proc/sys/kernel/random/uuid").await
        );
        assert!(!exists(&gb, "/root/data.bin").await);
        assert_eq!(sh(&gb, "echo ${GREETING:-unset}").await.trim(), "unset");

        // Empty pool: a create restores the normal way and counts a miss.
        let t0 = Instant::now();
        let c = node.create(minimal()).await.unwrap();
        println!("create with an empty pool: {:?}", t0.elapsed());
        assert_eq!(stats(&node, "1"), Some((0, 2, 1)));
        assert!(!members.contains(&node.layout().sandbox_dir(c.id.as_str()).unwrap()));
        let gc = node.guest(&c.id).await.unwrap();
        assert_eq!(sh(&gc, "hostname").await.trim(), c.id.as_str());

        // Another shape is a cold boot and leaves the pool alone.
        assert_eq!(node.reconcile_pools().await, 2);
        let mut big = minimal();
        big.options.memory_mib = Some(320);
        let d = node.create(big).await.unwrap();
        assert_eq!(d.origin, Origin::TemplateColdBoot);
        assert_eq!(stats(&node, "1"), Some((2, 2, 1)));

        // Killed sandboxes from the pool go like any other.
        node.kill(&a.id).await.unwrap();
        assert!(!a_dir.exists());
    });
}

fn minimal_with(options: SandboxOptions) -> space_node::CreateRequest {
    let mut r = minimal();
    r.options = options;
    r
}

#[test]
fn concurrent_creates_never_share_a_vm() {
    with_node(Disk::Btrfs, pool_of(2, None), |node| async move {
        build_minimal(&node, "1").await;
        assert_eq!(node.reconcile_pools().await, 2);
        let members = member_dirs(&node).await;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let node = node.clone();
            tasks.spawn(async move { node.create(minimal()).await.unwrap() });
        }
        let mut created = Vec::new();
        while let Some(r) = tasks.join_next().await {
            created.push(r.unwrap());
        }
        // Two from the pool, two restored; no VM handed out twice.
        assert_eq!(stats(&node, "1"), Some((0, 2, 2)));
        let dirs: HashSet<PathBuf> = created
            .iter()
            .map(|r| node.layout().sandbox_dir(r.id.as_str()).unwrap())
            .collect();
        assert_eq!(dirs.len(), 4);
        assert_eq!(dirs.intersection(&members).count(), 2);
        let pids: HashSet<i32> = dirs.iter().map(|d| qemu_pid(d)).collect();
        assert_eq!(pids.len(), 4, "{pids:?}");
        // Each guest is its own: it sees its own marker only, and its own random id.
        let mut uuids = HashSet::new();
        for r in &created {
            let g = node.guest(&r.id).await.unwrap();
            assert_eq!(sh(&g, "hostname").await.trim(), r.id.as_str());
            sh(&g, &format!("echo {} > /root/me", r.id)).await;
            uuids.insert(sh(&g, "cat /proc/sys/kernel/random/uuid").await);
        }
        assert_eq!(uuids.len(), 4);
        for r in &created {
            let g = node.guest(&r.id).await.unwrap();
            assert_eq!(sh(&g, "cat /root/me").await.trim(), r.id.as_str());
        }
    });
}

#[test]
fn the_pool_refills_follows_the_newest_build_and_goes_with_the_node() {
    with_node(
        Disk::Btrfs,
        pool_of(2, Some(Duration::from_millis(500))),
        |node| async move {
            build_minimal(&node, "1").await;
            // The background reconciler fills the pool and refills it after takes.
            wait_for(&node, "1", 2).await;
            let a = node.create(minimal()).await.unwrap();
            let b = node.create(minimal()).await.unwrap();
            assert_eq!(stats(&node, "1").unwrap().1, 2);
            wait_for(&node, "1", 2).await;
            assert_eq!(member_dirs(&node).await.len(), 2);

            // A member whose VM died is dropped, never handed out; the pool makes another.
            let dead = member_dirs(&node).await.into_iter().next().unwrap();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(qemu_pid(&dead)),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
            let c = node.create(minimal()).await.unwrap();
            let d = node.create(minimal()).await.unwrap();
            for s in [&c, &d] {
                assert_ne!(node.layout().sandbox_dir(s.id.as_str()).unwrap(), dead);
                let g = node.guest(&s.id).await.unwrap();
                assert_eq!(sh(&g, "hostname").await.trim(), s.id.as_str());
            }
            wait_for(&node, "1", 2).await;
            // The take that met it set it aside; the reconciler run after it removes it.
            wait_until(
                "the dead member's directory is still there",
                Duration::from_secs(60),
                || !dead.exists(),
            )
            .await;

            // A new version replaces the pool: the old members go, new ones come.
            let old = member_dirs(&node).await;
            build_minimal(&node, "2").await;
            wait_for(&node, "2", 2).await;
            assert!(stats(&node, "1").is_none());
            assert!(old.iter().all(|d| !d.exists()), "old members left behind");
            let e = node.create(minimal()).await.unwrap();
            assert_eq!(e.template.version.as_str(), "2");
            assert_eq!(stats(&node, "2").unwrap().1, 1);

            // Sandboxes made from the pool are untouched by all this.
            for s in [&a, &b, &c, &d, &e] {
                assert_eq!(node.info(&s.id).await.unwrap().state, State::Running);
            }

            // Shutdown removes the members: VMs, directories, records.
            assert!(!member_dirs(&node).await.is_empty());
            node.shutdown().await;
            assert!(member_dirs(&node).await.is_empty(), "members left behind");
            let records = node.record_path(&a.id).parent().unwrap().to_owned();
            for f in std::fs::read_dir(records).unwrap() {
                let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
                assert!(
                    !text.contains("\"creating\""),
                    "a member's record is left: {text}"
                );
            }
            assert!(node.pool_stats().is_empty());
        },
    );
}

/// Waits until the pool of `minimal:version` has `n` members ready (the reconciler runs in
/// the background; a bound only against hanging forever).
async fn wait_for(node: &Node, version: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if stats(node, version).is_some_and(|s| s.0 == n) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the pool of minimal:{version} did not reach {n}: {:?}",
            node.pool_stats()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The file that weighs process `pid`'s CPU cgroup against its siblings: `cpu.shares` of the
/// v1 `cpu` hierarchy, else `cpu.weight` of the v2 one.
fn cpu_weight_file(pid: u32) -> Option<PathBuf> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mut v2 = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "cpu") {
            return Some(
                Path::new("/sys/fs/cgroup")
                    .join(controllers)
                    .join(path)
                    .join("cpu.shares"),
            );
        }
        if controllers.is_empty() {
            v2 = Some(Path::new("/sys/fs/cgroup").join(path).join("cpu.weight"));
        }
    }
    v2
}

/// How process `pid` is scheduled against other VMs: its CPU cgroup's weight when it has a
/// cgroup of its own (a jailed VMM), else the nice values of its threads.
fn cpu_priority(pid: i32) -> String {
    let its = cpu_weight_file(pid as u32);
    if let Some(file) = its.filter(|f| Some(f) != cpu_weight_file(std::process::id()).as_ref()) {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        return format!("{name} {}", std::fs::read_to_string(&file).unwrap().trim());
    }
    let mut nices: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| {
            let tid: u32 = t.unwrap().file_name().to_str()?.parse().ok()?;
            space_runtime::priority::thread_nice(pid as u32, tid)
        })
        .collect();
    nices.dedup();
    format!("nice {nices:?}")
}

/// Full numbers of the pool of `minimal:1`.
fn full_stats(node: &Node) -> space_node::PoolStats {
    node.pool_stats()
        .into_iter()
        .find(|s| s.template.name.as_str() == "minimal")
        .unwrap()
}

#[test]
fn the_pool_follows_demand_and_members_are_made_in_the_background() {
    let window = Duration::from_secs(8);
    with_node(
        Disk::Btrfs,
        move |c| {
            c.pools = PoolConfig {
                ceiling: 5,
                window,
                refills: 2,
                ..PoolConfig::fixed(
                    BTreeMap::from([("minimal".parse().unwrap(), 1)]),
                    Some(Duration::from_millis(200)),
                )
            }
        },
        |node| async move {
            build_minimal(&node, "1").await;
            wait_for(&node, "1", 1).await;
            let s = full_stats(&node);
            assert_eq!((s.floor, s.target), (1, 1), "{s:?}");

            // A member runs at background priority until a create takes it.
            let member = member_dirs(&node).await.into_iter().next().unwrap();
            let pid = qemu_pid(&member);
            let p = cpu_priority(pid);
            assert!(
                ["cpu.weight 10", "cpu.shares 102", "nice [10]"].contains(&p.as_str()),
                "a member: {p}"
            );
            let a = node.create(minimal()).await.unwrap();
            assert_eq!(node.layout().sandbox_dir(a.id.as_str()).unwrap(), member);
            let p = cpu_priority(pid);
            assert!(
                ["cpu.weight 100", "cpu.shares 1024", "nice [0]"].contains(&p.as_str()),
                "a taken member: {p}"
            );

            // A burst: the pool grows to what it would have needed, up to its ceiling.
            let burst_start = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..6 {
                let node = node.clone();
                tasks.spawn(async move { node.create(minimal()).await.unwrap() });
            }
            let mut burst = Vec::new();
            while let Some(r) = tasks.join_next().await {
                burst.push(r.unwrap());
            }
            let s = full_stats(&node);
            assert_eq!(s.hits + s.misses, 7, "{s:?}");
            wait_until(
                "the pool did not grow to 5",
                Duration::from_secs(60),
                || full_stats(&node).target == 5,
            )
            .await;
            wait_for(&node, "1", 5).await;
            let s = full_stats(&node);
            println!("after the burst: {s:?}");
            for r in &burst {
                let g = node.guest(&r.id).await.unwrap();
                assert_eq!(sh(&g, "hostname").await.trim(), r.id.as_str());
            }

            // Nobody creates for a window: back to the floor, the extra members gone.
            wait_for(&node, "1", 1).await;
            assert!(
                burst_start.elapsed() >= window,
                "shrank before the window passed"
            );
            assert_eq!(full_stats(&node).target, 1);
            let deadline = Instant::now() + Duration::from_secs(60);
            while member_dirs(&node).await.len() != 1 {
                assert!(Instant::now() < deadline, "extra members left behind");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }

            // A create that finds the pool empty while a member is being made waits for it
            // rather than restoring another from scratch.
            let b = node.create(minimal()).await.unwrap();
            wait_until(
                "the pool started no new member",
                Duration::from_secs(60),
                || full_stats(&node).making > 0,
            )
            .await;
            let before = full_stats(&node);
            let c = node.create(minimal()).await.unwrap();
            let after = full_stats(&node);
            assert_eq!(after.waits, before.waits + 1, "{before:?} -> {after:?}");
            assert_eq!(after.misses, before.misses, "{before:?} -> {after:?}");
            for r in [&b, &c] {
                let g = node.guest(&r.id).await.unwrap();
                assert_eq!(sh(&g, "hostname").await.trim(), r.id.as_str());
            }
        },
    );
}
