//! The node group (`space-bench node`): the sandbox lifecycle measured through the real
//! [`Node`] rather than the runtime underneath it.
//!
//! A run makes a fresh directory under `/var/tmp`, opens a node on it (the node's storage
//! setup loop-mounts a sparse btrfs image over the data directory), builds the `minimal`
//! template once, and then measures, each `--runs` times: create without a warm pool to the
//! first exec (alternating with a bare QEMU restore of the template's own snapshot, the
//! reference), pause and resume, disk and full snapshots, suspend and restore, fork, kill, and
//! the host memory of idle sandboxes. The node is then reopened on the same data directory with
//! a warm pool for `minimal`, and creates from the pool are measured, with the pool refilling
//! between takes. At the end (also on an error or a signal) every sandbox is killed, the node
//! shut down, the image unmounted and the directory removed.

use std::future::Future;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use space_node::storage::{loopback, DriverKind, StorageOptions};
use space_node::{
    CreateRequest, Node, NodeConfig, PoolConfig, SandboxId, SnapshotKind, SnapshotReason, Template,
    TemplateName, TemplateRef, TemplateSpec,
};
use space_proto::ExecSpec;
use space_runtime::accel::{self, Accel};

use crate::bare::Bare;
use crate::bench::{failed, progress};
use crate::host;
use crate::procmem::{self, ProcMem};
use crate::scratch;
use crate::stats::{Samples, Summary, Table, Targets};

mod memory;
mod metrics;
mod pool;
mod volumes;

/// The template every sandbox of the run comes from.
const TEMPLATE: &str = "minimal";
/// The version the run builds it as.
const TEMPLATE_VERSION: &str = "bench";
/// Apparent size of the sparse btrfs image (only what the run writes takes space).
const LOOP_IMAGE_SIZE: u64 = 8 << 30;
/// Where the run's directory goes.
const PARENT: &str = "/var/tmp";
/// How long a started VM may take until its guest answers (cold boots under TCG).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Bound on one guest exec (a restored guest that never answers must not hang the run).
const EXEC_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on waiting for the warm pool to be full.
const POOL_WAIT: Duration = Duration::from_secs(180);
/// How often the pool's fill level is looked at while waiting.
const POOL_POLL: Duration = Duration::from_millis(1);
/// How long idle sandboxes sit before their memory is read.
const SETTLE: Duration = Duration::from_secs(5);

/// Create from the pool, p50 and p90 (ms).
const POOL_TARGET: (f64, f64) = (25.0, 40.0);
/// Perplexity's reported sandbox creation, p50 and p90 (ms), for reference.
const PERPLEXITY: (f64, f64) = (60.0, 89.0);
/// Pause and resume (ms).
const PAUSE_TARGET: f64 = 5.0;
/// vCPU pause of a disk snapshot (ms).
const DISK_PAUSE_TARGET: f64 = 10.0;
/// Create without a pool over a bare restore, both to the first exec.
const CREATE_RATIO_TARGET: f64 = 1.2;

/// The node groups `node --only` selects from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeGroup {
    /// Create without a pool to the first exec, a bare QEMU restore of the same snapshot
    /// alternating with it, and the kill of each created sandbox.
    Create,
    /// Create from a warm pool to the first exec, the refill wait, and the kill.
    Pool,
    /// Pause and resume of a running sandbox.
    Pause,
    /// Disk and full snapshots of a running sandbox.
    Snapshot,
    /// Suspend, and restore to the first exec.
    Suspend,
    /// Fork to the child's first exec.
    Fork,
    /// Host memory of idle sandboxes (RSS, PSS) and the node's total.
    Memory,
    /// What sampling idle sandboxes' metrics costs them and the node.
    Metrics,
    /// A mounted volume against the sandbox's own disk.
    Volumes,
}

impl NodeGroup {
    /// Every group, in the order a run measures them.
    pub const ALL: [NodeGroup; 9] = [
        NodeGroup::Create,
        NodeGroup::Pause,
        NodeGroup::Snapshot,
        NodeGroup::Suspend,
        NodeGroup::Fork,
        NodeGroup::Memory,
        NodeGroup::Metrics,
        NodeGroup::Volumes,
        NodeGroup::Pool,
    ];
}

/// What a node run measures and with what.
pub struct NodePlan {
    pub runs: usize,
    pub groups: Vec<NodeGroup>,
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    pub rootfs: PathBuf,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// Members of the `minimal` pool in the pool group.
    pub pool_size: usize,
    /// Idle sandboxes for the memory group.
    pub idle: usize,
    /// Admission's memory overcommit, in percent.
    pub overcommit_percent: u64,
}

impl NodePlan {
    fn wants(&self, g: NodeGroup) -> bool {
        self.groups.contains(&g)
    }
}

/// When the warm pool refills after a take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refill {
    /// As a node does by default: the take wakes the pool's background loop, so the refill
    /// (a restore and a warm-up exec) runs while the caller's first exec does.
    Background,
    /// The pool has no loop; the bench refills it (`reconcile_pools`) once the first exec has
    /// been answered, so the create and its exec have the host to themselves.
    AfterExec,
}

/// Runs the node groups; `interrupted` ends the run early (with everything cleaned up) when it
/// resolves, with the name of what interrupted it.
pub async fn run(plan: &NodePlan, interrupted: impl Future<Output = &'static str>) -> Result<()> {
    let mut dir = DataDir::new()?;
    let mut slot: Option<Node> = None;
    let result = {
        let measured = measure(plan, &dir, &mut slot);
        tokio::select! {
            r = measured => r,
            s = interrupted => Err(anyhow!("interrupted by {s}")),
        }
    };
    if let Some(node) = slot.take() {
        progress("shutting the node down (every VM killed)");
        if tokio::time::timeout(Duration::from_secs(120), node.shutdown())
            .await
            .is_err()
        {
            eprintln!("space-bench: the node did not shut down within 2 minutes");
        }
    }
    let cleaned = tokio::task::block_in_place(|| dir.cleanup());
    crate::bench::with_cleanup(result, cleaned)
}

/// Opens a node on `data`: btrfs forced (a loop image if needed), VMs that die with this
/// process, no rolling snapshots (they would land in the measurements), and a warm pool of
/// `pool` members for the template refilled as it says, or none.
async fn open_node(
    plan: &NodePlan,
    data: &Path,
    accel: Accel,
    pool: Option<(usize, Refill)>,
) -> Result<Node> {
    let mut cfg = NodeConfig::new(data);
    cfg.storage = StorageOptions {
        driver: Some(DriverKind::Btrfs),
        loop_image_size: LOOP_IMAGE_SIZE,
        loop_image: true,
    };
    cfg.qemu.qemu = plan.qemu.clone();
    cfg.qemu.accel = Some(accel);
    cfg.qemu.detached = false;
    cfg.ready_timeout = READY_TIMEOUT;
    cfg.rolling.enabled = false;
    // The metrics group runs the sampler itself; elsewhere it would land in the measurements.
    cfg.metrics_tick = None;
    cfg.admission.overcommit_percent = plan.overcommit_percent;
    cfg.pools = match pool {
        None => PoolConfig::disabled(),
        Some((n, refill)) => {
            let mut p = PoolConfig::default();
            p.sizes.insert(template_name(), n);
            // A fixed size: each take finds the pool full, whatever the demand before it.
            p.ceiling = 0;
            if refill == Refill::AfterExec {
                p.tick = None;
            }
            p
        }
    };
    Node::open(cfg)
        .await
        .context("opening the node (needs root for the loop-mounted btrfs image)")
}

fn template_name() -> TemplateName {
    TEMPLATE.parse().expect("the template name is valid")
}

async fn measure(plan: &NodePlan, dir: &DataDir, slot: &mut Option<Node>) -> Result<()> {
    let decision = accel::detect()?;
    progress("opening the node");
    let node = open_node(plan, &dir.data, decision.accel, None).await?;
    *slot = Some(node.clone());
    progress("building the template");
    let t = Instant::now();
    let template = node
        .build_template(TemplateSpec {
            template: TemplateRef::new(TEMPLATE, TEMPLATE_VERSION)?,
            kernel: plan.kernel.clone(),
            rootfs: plan.rootfs.clone(),
            vcpus: plan.vcpus,
            memory_mib: plan.memory_mib,
            kernel_cmdline: None,
            ready_timeout: READY_TIMEOUT,
            guest: Default::default(),
            start: None,
            source: String::new(),
        })
        .await
        .context("building the template")?;
    let built = t.elapsed();

    let image_size = std::fs::metadata(&plan.rootfs)?.len();
    let root = node.layout().root().to_owned();
    let image = loopback::image_path(&root)?;
    let device = scratch::loop_device(&image).unwrap_or_else(|| "a loop device".into());
    host::print_run_start("space-bench node", &decision, node.runtime().version());
    println!(
        "guest:       {} vCPU, {} MiB RAM; kernel {} ({})",
        plan.vcpus,
        plan.memory_mib,
        plan.kernel.display(),
        host::kernel_version(&plan.kernel).unwrap_or_else(|| "version string not found".into())
    );
    println!(
        "root image:  {} ({} MiB)",
        plan.rootfs.display(),
        image_size >> 20
    );
    println!("host:        {}", host::host_summary());
    println!(
        "data dir:    {} (driver {:?}), {} GiB sparse image {} on {device}",
        root.display(),
        node.storage().kind(),
        LOOP_IMAGE_SIZE >> 30,
        image.display()
    );
    println!(
        "template:    {} built in {:.1} s (cold boot to ready, then a full snapshot)",
        template.template_ref(),
        built.as_secs_f64()
    );
    println!(
        "node:        QEMU {}; rolling snapshots off; pools off except in the pool group, \
         where the node is reopened twice with {} members for {TEMPLATE} (refill in the \
         background, then refill after the first exec)",
        if NodeConfig::new(&dir.data).qemu.jail.is_some() {
            "jailed"
        } else {
            "not jailed"
        },
        plan.pool_size
    );
    println!(
        "runs:        {} (idle sandboxes for memory: {})",
        plan.runs, plan.idle
    );
    println!();

    let bare_root = root.join("bench-bare");
    std::fs::create_dir_all(&bare_root)?;
    let mut b = NodeBench {
        plan,
        node,
        template,
        bare_root,
        next_dir: 0,
        alive: Vec::new(),
        summary: Summary::new(),
        targets: Targets::new(),
        kept: Kept::default(),
    };
    let result = b.groups(slot, decision.accel, &dir.data).await;
    b.kill_leftovers().await;
    let _ = std::fs::remove_dir_all(&b.bare_root);
    result?;
    b.conclude();
    println!("load average at the end: {}", host::load_average());
    Ok(())
}

/// Samples later tables and the targets need.
#[derive(Default)]
struct Kept {
    bare_health: Option<Samples>,
    bare_exec: Option<Samples>,
    create_exec: Option<Samples>,
    /// Create returned and first exec answered, per refill mode measured.
    pool: Vec<(Refill, Samples, Samples)>,
    pause: Option<Samples>,
    resume: Option<Samples>,
    disk_pause: Option<Samples>,
}

struct NodeBench<'a> {
    plan: &'a NodePlan,
    node: Node,
    template: Template,
    /// Where the bare restores put their files (inside the btrfs data directory, so they
    /// clone with reflinks like the node does).
    bare_root: PathBuf,
    next_dir: usize,
    /// Sandboxes this run created and has not killed yet.
    alive: Vec<SandboxId>,
    summary: Summary,
    targets: Targets,
    kept: Kept,
}

impl NodeBench<'_> {
    async fn groups(&mut self, slot: &mut Option<Node>, accel: Accel, data: &Path) -> Result<()> {
        let p = self.plan;
        if p.wants(NodeGroup::Create) {
            self.create().await?;
        }
        if p.wants(NodeGroup::Pause) {
            self.pause_resume().await?;
        }
        if p.wants(NodeGroup::Snapshot) {
            self.snapshots().await?;
        }
        if p.wants(NodeGroup::Suspend) {
            self.suspend_restore().await?;
        }
        if p.wants(NodeGroup::Fork) {
            self.fork().await?;
        }
        if p.wants(NodeGroup::Memory) {
            self.memory().await?;
        }
        if p.wants(NodeGroup::Metrics) {
            self.metrics().await?;
        }
        if p.wants(NodeGroup::Volumes) {
            self.volumes().await?;
        }
        if p.wants(NodeGroup::Pool) {
            for refill in [Refill::Background, Refill::AfterExec] {
                self.kill_leftovers().await;
                progress(&format!("reopening the node with a warm pool ({refill:?})"));
                self.node.shutdown().await;
                *slot = None;
                let node = open_node(p, data, accel, Some((p.pool_size, refill))).await?;
                *slot = Some(node.clone());
                self.node = node;
                self.pool(refill).await?;
            }
        }
        Ok(())
    }

    fn request(&self) -> CreateRequest {
        CreateRequest::new(template_name())
    }

    /// Creates a sandbox and waits for its first exec; returns its id and the times (from the
    /// call) when create returned, `guest` returned and the exec was answered.
    async fn create_to_exec(&mut self) -> Result<(SandboxId, [Duration; 3])> {
        let t = Instant::now();
        let info = self.node.create(self.request()).await.context("create")?;
        let created = t.elapsed();
        self.alive.push(info.id.clone());
        let (guest, exec) = self.first_exec(&info.id, t).await?;
        Ok((info.id, [created, guest, exec]))
    }

    /// `guest(id)` and then `run true` answered, each as the time since `t`.
    async fn first_exec(&self, id: &SandboxId, t: Instant) -> Result<(Duration, Duration)> {
        let client = self.node.guest(id).await.context("guest")?;
        let got = t.elapsed();
        let out = tokio::time::timeout(EXEC_TIMEOUT, client.run(ExecSpec::argv(["true"])))
            .await
            .with_context(|| format!("no answer to an exec within {EXEC_TIMEOUT:?}"))?
            .context("exec")?;
        let done = t.elapsed();
        if !out.status.success() {
            bail!("`true` failed in sandbox {id}: {:?}", out.status);
        }
        Ok((got, done))
    }

    async fn kill(&mut self, id: &SandboxId) -> Result<Duration> {
        let t = Instant::now();
        self.node.kill(id).await.context("kill")?;
        let took = t.elapsed();
        self.alive.retain(|a| a != id);
        Ok(took)
    }

    /// Kills every sandbox this run still has; errors are only reported.
    async fn kill_leftovers(&mut self) {
        for id in std::mem::take(&mut self.alive) {
            if let Err(e) = self.node.kill(&id).await {
                eprintln!("space-bench: killing sandbox {id}: {e}");
            }
        }
    }

    /// A new sandbox for a group to work on, answered one exec already (not measured).
    async fn subject(&mut self) -> Result<SandboxId> {
        let (id, _) = self.create_to_exec().await?;
        Ok(id)
    }

    /// A new empty directory for a bare restore.
    fn bare_dir(&mut self) -> Result<PathBuf> {
        self.next_dir += 1;
        let dir = self.bare_root.join(format!("{:03}", self.next_dir));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(dir)
    }

    fn max_failures(&self) -> usize {
        (self.plan.runs / 4).max(2)
    }

    /// Alternates a bare QEMU restore of the template's snapshot and a node create without a
    /// pool, so drift on the host affects both alike; one uncounted pair warms caches first.
    async fn create(&mut self) -> Result<()> {
        let n = self.plan.runs;
        let bare = Bare::new(&self.plan.qemu, &self.template.snapshot())?;
        let (mut b_clone, mut b_qmp, mut b_running, mut b_answer, mut b_exec) = (
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
        );
        let (mut c_create, mut c_guest, mut c_exec, mut kill) = (
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
        );
        let mut failures = Vec::new();
        for i in 0..=n {
            let counted = i > 0;
            if counted {
                progress(&format!("create {i}/{n} (bare restore, then node create)"));
            }
            let dir = self.bare_dir()?;
            let times = bare.restore(&dir).await;
            let _ = std::fs::remove_dir_all(&dir);
            match times {
                Ok(t) if counted => {
                    b_clone.push_duration(t.clone);
                    b_qmp.push_duration(t.qmp);
                    b_running.push_duration(t.running);
                    b_answer.push_duration(t.answered);
                    b_exec.push_duration(t.first_exec);
                }
                Ok(_) => {}
                Err(e) => failures.push(failed(i, "bare restore", &e)),
            }
            match self.create_to_exec().await {
                Ok((id, t)) => {
                    let k = self.kill(&id).await?;
                    if counted {
                        c_create.push_duration(t[0]);
                        c_guest.push_duration(t[1]);
                        c_exec.push_duration(t[2]);
                        kill.push_duration(k);
                    }
                }
                Err(e) => {
                    failures.push(failed(i, "node create", &e));
                    self.kill_leftovers().await;
                }
            }
            if failures.len() > self.max_failures() {
                bail!("{} creates or restores failed; giving up", failures.len());
            }
        }
        let mut t = Table::new(
            "Bare QEMU restore of the template's snapshot (reference: same QEMU arguments, own \
             QMP, one health answer; times from QEMU spawn)",
        );
        t.add(
            "clone RAM + disk (before spawn, not counted)",
            "ms",
            b_clone,
        );
        t.add("QMP greeting + capabilities", "ms", b_qmp);
        t.add("state loaded, cont answered", "ms", b_running);
        t.add("bare: health answered", "ms", b_answer.clone());
        t.add("bare: then run true answered", "ms", b_exec.clone());
        println!("{}", t.render());

        let mut t = Table::new(
            "Create without a pool to first exec (node.create -> guest(id) -> run true; \
             cumulative)",
        );
        t.add("node.create returned (Running)", "ms", c_create);
        t.add("guest(id) returned", "ms", c_guest);
        t.add("first exec answered", "ms", c_exec.clone());
        t.add("then node.kill (by itself)", "ms", kill);
        print!("{}", t.render());
        print_failures("failed runs", &failures);

        self.summary.add(
            "create without pool (first exec) / bare (health)",
            &c_exec,
            &b_answer,
            "create adds identity and an exec to the bare path",
        );
        self.kept.bare_health = Some(b_answer);
        self.kept.bare_exec = Some(b_exec);
        self.kept.create_exec = Some(c_exec);
        Ok(())
    }

    async fn pause_resume(&mut self) -> Result<()> {
        let n = self.plan.runs;
        progress(&format!("pause/resume x{n}"));
        let id = self.subject().await?;
        let (mut pause, mut resume) = (Samples::new(), Samples::new());
        for _ in 0..n {
            let t = Instant::now();
            self.node.pause(&id).await.context("pause")?;
            pause.push_duration(t.elapsed());
            let t = Instant::now();
            self.node.resume(&id).await.context("resume")?;
            resume.push_duration(t.elapsed());
            // The guest runs a little between rounds.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.first_exec(&id, Instant::now())
            .await
            .context("exec after the pauses")?;
        self.kill(&id).await?;
        // What a node transition pays for durability: every pause and resume writes the
        // sandbox's record twice (intent, then outcome) this way.
        let mut durable = Samples::new();
        let probe = vec![b'x'; 2048];
        for _ in 0..n {
            let t = Instant::now();
            tokio::task::block_in_place(|| durable_replace(&self.bare_root, &probe))
                .context("durable file replace")?;
            durable.push_duration(t.elapsed());
        }
        let mut t = Table::new("Pause and resume of a running sandbox (node.pause / node.resume)");
        t.add("node.pause", "ms", pause.clone());
        t.add("node.resume", "ms", resume.clone());
        t.add(
            "reference: 2 KiB durable replace (fsync, rename, fsync dir)",
            "ms",
            durable,
        );
        println!("{}", t.render());
        self.kept.pause = Some(pause);
        self.kept.resume = Some(resume);
        Ok(())
    }

    async fn snapshots(&mut self) -> Result<()> {
        let n = self.plan.runs;
        let id = self.subject().await?;
        let mut t = Table::new(
            "Snapshots of a running sandbox (node.snapshot; vCPUs stopped as the snapshot \
             record reports it)",
        );
        for kind in [SnapshotKind::Disk, SnapshotKind::Full] {
            progress(&format!("{} snapshot x{n}", kind.as_str()));
            let (mut call, mut paused) = (Samples::new(), Samples::new());
            for _ in 0..n {
                let t = Instant::now();
                let rec = self
                    .node
                    .snapshot(&id, kind)
                    .await
                    .with_context(|| format!("{} snapshot", kind.as_str()))?;
                call.push_duration(t.elapsed());
                paused.push(rec.paused_for_us as f64 / 1e3);
                // Let the guest run between snapshots, as it would between real ones.
                self.first_exec(&id, Instant::now())
                    .await
                    .context("exec between snapshots")?;
            }
            let k = kind.as_str();
            t.add(format!("{k}: node.snapshot call"), "ms", call.clone());
            t.add(format!("{k}: vCPUs stopped"), "ms", paused.clone());
            self.summary.add(
                format!("{k} snapshot: vCPU pause / whole call"),
                &paused,
                &call,
                "share of the call the guest is stopped",
            );
            if kind == SnapshotKind::Disk {
                self.kept.disk_pause = Some(paused);
            }
        }
        self.kill(&id).await?;
        println!("{}", t.render());
        Ok(())
    }

    async fn suspend_restore(&mut self) -> Result<()> {
        let n = self.plan.runs;
        progress(&format!("suspend/restore x{n}"));
        let mut id = self.subject().await?;
        let (mut suspend, mut restored, mut guest, mut exec) = (
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
        );
        let mut failures = Vec::new();
        for i in 1..=n {
            let round = async {
                let t = Instant::now();
                self.node.suspend(&id).await.context("suspend")?;
                let s = t.elapsed();
                let t = Instant::now();
                self.node.restore(&id).await.context("restore")?;
                let r = t.elapsed();
                let (g, e) = self.first_exec(&id, t).await?;
                anyhow::Ok([s, r, g, e])
            }
            .await;
            match round {
                Ok([s, r, g, e]) => {
                    suspend.push_duration(s);
                    restored.push_duration(r);
                    guest.push_duration(g);
                    exec.push_duration(e);
                }
                Err(e) => {
                    failures.push(failed(i, "suspend/restore", &e));
                    if failures.len() > self.max_failures() {
                        bail!(
                            "{} suspend/restore rounds failed; giving up",
                            failures.len()
                        );
                    }
                    // Go on with a new sandbox; the old one is in whatever state it failed in.
                    self.kill_leftovers().await;
                    id = self.subject().await?;
                }
            }
        }
        self.kill(&id).await?;
        let mut t = Table::new(
            "Suspend, then restore to first exec (node.suspend; node.restore -> guest(id) -> \
             run true, cumulative from the restore)",
        );
        t.add("node.suspend (full snapshot, VM stopped)", "ms", suspend);
        t.add("node.restore returned (Running)", "ms", restored);
        t.add("guest(id) returned", "ms", guest);
        t.add("first exec answered", "ms", exec);
        print!("{}", t.render());
        print_failures("failed rounds", &failures);
        Ok(())
    }

    async fn fork(&mut self) -> Result<()> {
        let n = self.plan.runs;
        progress(&format!("fork x{n}"));
        let parent = self.subject().await?;
        let (mut forked, mut guest, mut exec, mut paused) = (
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
        );
        let mut failures = Vec::new();
        for i in 1..=n {
            let t = Instant::now();
            let child = match self.node.fork(&parent).await {
                Ok(c) => c,
                Err(e) => {
                    failures.push(failed(i, "fork", &anyhow::Error::new(e)));
                    if failures.len() > self.max_failures() {
                        bail!("{} forks failed; giving up", failures.len());
                    }
                    continue;
                }
            };
            let f = t.elapsed();
            self.alive.push(child.id.clone());
            match self.first_exec(&child.id, t).await {
                Ok((g, e)) => {
                    forked.push_duration(f);
                    guest.push_duration(g);
                    exec.push_duration(e);
                }
                Err(e) => failures.push(failed(i, "child's first exec", &e)),
            }
            let snaps = self.node.snapshots(&parent).await?;
            if let Some(s) = snaps
                .iter()
                .rev()
                .find(|s| s.reason == SnapshotReason::Fork)
            {
                paused.push(s.paused_for_us as f64 / 1e3);
            }
            self.kill(&child.id).await?;
            if failures.len() > self.max_failures() {
                bail!("{} forks failed; giving up", failures.len());
            }
        }
        self.kill(&parent).await?;
        let mut t = Table::new(
            "Fork to the child's first exec (node.fork -> guest(child) -> run true; cumulative)",
        );
        t.add("node.fork returned (child Running)", "ms", forked);
        t.add("guest(child) returned", "ms", guest);
        t.add("child's first exec answered", "ms", exec);
        t.add("parent's vCPUs stopped (fork snapshot)", "ms", paused);
        print!("{}", t.render());
        print_failures("failed forks", &failures);
        Ok(())
    }

    /// Prints the ratios and the targets of what was measured.
    fn conclude(&mut self) {
        let k = &self.kept;
        let background = k.pool.iter().find(|p| p.0 == Refill::Background);
        if let (Some((_, _, pool)), Some(cold)) = (background, &k.create_exec) {
            self.summary.add(
                "create from pool / without pool, both to first exec",
                pool,
                cold,
                "what the warm pool saves (background refill)",
            );
        }
        if let (Some(cold), Some(bare)) = (&k.create_exec, &k.bare_exec) {
            self.targets.ratio(
                "create without pool / bare restore, both to first exec",
                cold,
                bare,
                CREATE_RATIO_TARGET,
            );
        }
        for (refill, create, exec) in &k.pool {
            let how = match refill {
                Refill::Background => "refill in background",
                Refill::AfterExec => "refill after exec",
            };
            self.targets.time(
                format!("pool create ({how}): node.create returned"),
                create,
                POOL_TARGET.0,
                POOL_TARGET.1,
            );
            self.targets.time(
                format!("pool create ({how}): to first exec"),
                exec,
                POOL_TARGET.0,
                POOL_TARGET.1,
            );
        }
        if let Some((_, _, exec)) = background {
            self.targets.reference(
                "pool create (refill in background): to first exec",
                exec,
                "Perplexity (reported)",
                PERPLEXITY.0,
                PERPLEXITY.1,
            );
        }
        if let Some(s) = &k.pause {
            self.targets
                .time("node.pause", s, PAUSE_TARGET, PAUSE_TARGET);
        }
        if let Some(s) = &k.resume {
            self.targets
                .time("node.resume", s, PAUSE_TARGET, PAUSE_TARGET);
        }
        if let Some(s) = &k.disk_pause {
            self.targets.time(
                "disk snapshot: vCPUs stopped",
                s,
                DISK_PAUSE_TARGET,
                DISK_PAUSE_TARGET,
            );
        }
        if !self.summary.is_empty() {
            println!("{}", self.summary.render());
        }
        if !self.targets.is_empty() {
            println!("{}", self.targets.render());
        }
    }
}

/// Replaces a small file in `dir` the way the node writes a record: a temporary file written
/// and fsynced, renamed over the old one, and the directory fsynced.
fn durable_replace(dir: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let (tmp, dst) = (dir.join(".probe.json.tmp"), dir.join("probe.json"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, &dst)?;
    std::fs::File::open(dir)?.sync_all()
}

fn print_failures(what: &str, failures: &[String]) {
    if failures.is_empty() {
        println!("{what}: none\n");
    } else {
        println!("{what} (not in the table above):");
        for f in failures {
            println!("- {f}");
        }
        println!();
    }
}

/// The run's directory under `/var/tmp`: `data/` (the node's data directory, with the loop
/// image the node mounts over it) and `data.btrfs.img` beside it. [`DataDir::cleanup`]
/// unmounts and removes it; `Drop` does the same as a last resort.
pub(crate) struct DataDir {
    base: PathBuf,
    data: PathBuf,
    done: bool,
}

impl DataDir {
    fn new() -> Result<DataDir> {
        Self::with_prefix("space-bench-node-")
    }

    /// A fresh directory under `/var/tmp` named `prefix...`.
    pub(crate) fn with_prefix(prefix: &str) -> Result<DataDir> {
        let base = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(PARENT)
            .with_context(|| format!("creating a directory in {PARENT}"))?
            .keep();
        let data = base.join("data");
        Ok(DataDir {
            base,
            data,
            done: false,
        })
    }

    /// The node's data directory.
    pub(crate) fn data(&self) -> &Path {
        &self.data
    }

    /// Whether something is mounted on the data directory.
    fn is_mounted(&self) -> bool {
        match (std::fs::metadata(&self.data), std::fs::metadata(&self.base)) {
            (Ok(d), Ok(b)) => d.dev() != b.dev(),
            _ => false,
        }
    }

    /// Unmounts the image (retrying while the last QEMU processes let go of their files),
    /// detaches its loop device if the unmount did not, and removes the directory with the
    /// image. Safe to call twice.
    pub(crate) fn cleanup(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.done, true) {
            return Ok(());
        }
        let mut problems = Vec::new();
        if self.is_mounted() {
            let mut last = None;
            for _ in 0..50 {
                match loopback::unmount(&self.data) {
                    Ok(()) => {
                        last = None;
                        break;
                    }
                    Err(e) => last = Some(e),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if let Some(e) = last {
                // Still busy after five seconds: detach it now; the kernel lets go of it once
                // the last user is gone.
                eprintln!("space-bench: {e}; detaching the mount lazily");
                if let Err(d) = nix::mount::umount2(&self.data, nix::mount::MntFlags::MNT_DETACH) {
                    problems.push(format!("unmounting {}: {e}; {d}", self.data.display()));
                }
            }
        }
        if let Ok(image) = loopback::image_path(&self.data) {
            if let Some(dev) = scratch::loop_device(&image) {
                if let Err(e) = scratch::run(Command::new("losetup").arg("-d").arg(&dev)) {
                    problems.push(format!("detaching {dev}: {e:#}"));
                }
            }
        }
        if self.is_mounted() {
            // Never delete under a mount point that is still there.
            problems.push(format!("left {} in place", self.base.display()));
        } else if let Err(e) = std::fs::remove_dir_all(&self.base) {
            problems.push(format!("removing {}: {e}", self.base.display()));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!(
                "cleaning up the node's data directory: {}",
                problems.join("; ")
            )
        }
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            eprintln!("space-bench: {e:#}");
        }
    }
}
