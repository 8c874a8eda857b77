//! The restore group (`space-bench restore`): a suspended sandbox restored from its local
//! copy and from the object store, to the first exec answered, for guests of several sizes
//! holding fresh data, and where the time of a restore from the store goes
//! (`docs/benchmarks/restore.md`).
//!
//! One node (a loop-mounted btrfs image) with a real S3 server (Garage, on loopback) as its
//! store unless `--store` names another. For each guest size a template of that size; for
//! each kind of data a sandbox that writes `--fresh-pct` of its RAM size as a file on its disk
//! (random bytes, which no compression shrinks, or hex text, which zstd halves), so the data
//! is in its RAM (the page cache) and on its disk. It is suspended once (the upload is shown,
//! not compared). Then, each run, on the same snapshot state: a restore from the local copy;
//! from the store fetching everything first (eager, as before lazy restores); from the store
//! lazily without a prefetch list (which records what the VM waited for); lazily with that
//! list (uploaded with the suspend in between); each to the first exec answered, with the
//! local copy evicted before each restore from the store and the files whole and the cache
//! copy fetched again after each, before the next.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use space_node::{
    CreateRequest, Node, RestoreMode, RestoreReport, SandboxId, TemplateRef, TemplateSpec,
    VersionReq,
};
use space_runtime::accel;

use crate::archive::{node_config, store_for};
use crate::bench::progress;
use crate::host;
use crate::node::DataDir;
use crate::stats::{Samples, Summary, Table, Targets};

const READY_TIMEOUT: Duration = Duration::from_secs(300);
const EXEC_TIMEOUT: Duration = Duration::from_secs(600);
const MIB: f64 = 1_048_576.0;
/// Restore from the store over a restore from local disk, to the first exec.
const STORE_OVER_LOCAL: f64 = 1.3;
/// A restore from the store of the largest guest over that of the smallest.
const LARGEST_OVER_SMALLEST: f64 = 1.5;

/// The data a guest holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Random bytes: incompressible.
    Random,
    /// Hex text of random bytes: zstd about halves it.
    Text,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Random => "random",
            Kind::Text => "text",
        }
    }

    /// A shell line writing `mib` MiB of this kind to `path` and syncing it.
    fn write_line(self, mib: u64, path: &str) -> String {
        match self {
            Kind::Random => {
                format!("dd if=/dev/urandom of={path} bs=1M count={mib} 2>/dev/null && sync")
            }
            // Two hex digits per byte, 60 to a line: half as many random bytes.
            Kind::Text => format!(
                "head -c {} /dev/urandom | xxd -p > {path} && sync",
                (mib << 20) / 2 * 60 / 61
            ),
        }
    }
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "random" => Ok(Kind::Random),
            "text" => Ok(Kind::Text),
            _ => Err(format!("`{s}`: the kinds of data are random and text")),
        }
    }
}

/// What a restore run measures.
pub struct RestorePlan {
    pub runs: usize,
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    pub rootfs: PathBuf,
    /// Guest RAM sizes (MiB).
    pub sizes_mib: Vec<u64>,
    /// Fresh data, as a percentage of the RAM size.
    pub fresh_pct: u64,
    pub kinds: Vec<Kind>,
    /// The store (`None`: a Garage on loopback).
    pub store: Option<String>,
}

/// Runs the group; `interrupted` ends it early (cleaned up) with the reason.
pub async fn run(
    plan: &RestorePlan,
    interrupted: impl Future<Output = &'static str>,
) -> Result<()> {
    if plan.sizes_mib.is_empty() || plan.kinds.is_empty() {
        bail!("give at least one size and one kind of data");
    }
    if !(1..=50).contains(&plan.fresh_pct) {
        bail!("--fresh-pct must be 1..=50");
    }
    let garage = match plan.store {
        Some(_) => None,
        None => {
            if std::env::var_os("SPACE_GARAGE").is_none() {
                bail!(
                    "SPACE_GARAGE is not set: source target/space/tools.sh (scripts/tools.sh \
                     installs Garage), or give --store"
                );
            }
            progress("starting Garage");
            Some(tokio::task::block_in_place(
                space_archive::testing::Garage::start,
            ))
        }
    };
    let store = match (&plan.store, &garage) {
        (Some(s), _) => s.clone(),
        (None, Some(g)) => {
            // The node's store client reads its credentials and endpoint from these.
            std::env::set_var("AWS_ACCESS_KEY_ID", &g.key_id);
            std::env::set_var("AWS_SECRET_ACCESS_KEY", &g.secret);
            std::env::set_var("AWS_REGION", "garage");
            std::env::set_var("AWS_ENDPOINT_URL", &g.endpoint);
            format!("s3://{}/bench", g.bucket)
        }
        (None, None) => unreachable!(),
    };
    let r = tokio::select! {
        r = measure(plan, &store) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    drop(garage);
    r
}

/// One size and kind of data: what its runs measured.
#[derive(Default)]
struct Case {
    size_mib: u64,
    kind: Option<Kind>,
    write_ms: f64,
    suspend_ms: f64,
    uploaded_mib: f64,
    local: Samples,
    store: Samples,
    lazy: Samples,
    lazy_pf: Samples,
    lazy_opened: Samples,
    lazy_vm_started: Samples,
    lazy_guest_ready: Samples,
    lazy_first_exec: Samples,
    lazy_waited: Samples,
    lazy_urgent: Samples,
    lazy_filled: Samples,
    lazy_reads: Samples,
    lazy_read_mib: Samples,
    lazy_writes: Samples,
    lazy_moved: Samples,
    pf_waited: Samples,
    pf_vm_started: Samples,
    pf_gate: Samples,
    pf_list: Samples,
    pf_guest_ready: Samples,
    pf_urgent: Samples,
    pf_prefetched: Samples,
    pf_filled: Samples,
    pf_moved: Samples,
    prepared: Samples,
    fetch: Samples,
    getting: Samples,
    opening: Samples,
    writing: Samples,
    fetched_mib: Samples,
    vm_started: Samples,
    guest_ready: Samples,
    first_exec: Samples,
}

impl Case {
    fn label(&self) -> String {
        format!(
            "{} MiB, {}",
            self.size_mib,
            self.kind.map(Kind::name).unwrap_or("")
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

struct Setup {
    node: Node,
    dir: DataDir,
    _store_dir: tempfile::TempDir,
}

impl Setup {
    async fn open(plan: &RestorePlan, store: &str) -> Result<Setup> {
        let dir = DataDir::with_prefix("space-bench-restore-")?;
        let (mut a, store_dir) = store_for(Some(store))?;
        a.upload_interval = None;
        a.cache_max_bytes = None;
        let mut cfg = node_config(&dir, a);
        cfg.storage.loop_image_size = 48 << 30;
        cfg.qemu.qemu = plan.qemu.clone();
        cfg.qemu.detached = false;
        cfg.ready_timeout = READY_TIMEOUT;
        let node = Node::open(cfg)
            .await
            .context("opening the node (needs root for the loop-mounted btrfs image)")?;
        Ok(Setup {
            node,
            dir,
            _store_dir: store_dir,
        })
    }

    async fn template(&self, plan: &RestorePlan, size_mib: u64) -> Result<TemplateRef> {
        let t = TemplateRef::new("minimal", &format!("r{size_mib}"))?;
        self.node
            .build_template(TemplateSpec {
                template: t.clone(),
                kernel: plan.kernel.clone(),
                rootfs: plan.rootfs.clone(),
                vcpus: 1,
                memory_mib: size_mib,
                kernel_cmdline: None,
                ready_timeout: READY_TIMEOUT,
                guest: Default::default(),
                start: None,
                source: String::new(),
            })
            .await
            .with_context(|| format!("building the {size_mib} MiB template"))?;
        Ok(t)
    }

    async fn exec(&self, id: &SandboxId, line: &str) -> Result<String> {
        crate::archive::shell(&self.node, id, line, EXEC_TIMEOUT).await
    }

    /// Restore, then the first exec answered: the whole time and the node's report.
    async fn restore_to_exec(&self, id: &SandboxId) -> Result<(Duration, RestoreReport)> {
        let t = Instant::now();
        self.node.restore(id).await.context("restore")?;
        self.exec(id, "true").await?;
        let took = t.elapsed();
        let report = self
            .node
            .last_restore(id)
            .ok_or_else(|| anyhow!("the node kept no report of the restore"))?;
        Ok((took, report))
    }

    /// Suspends `id`; the snapshot it suspended on.
    async fn suspend(&self, id: &SandboxId) -> Result<(Duration, space_node::SnapshotRecord)> {
        let t = Instant::now();
        let s = self.node.suspend(id).await.context("suspend")?;
        Ok((t.elapsed(), s))
    }

    /// Suspends `id` (running), drops its local copy, and restores it from the store to the
    /// first exec.
    async fn store_restore(&self, id: &SandboxId) -> Result<(Duration, RestoreReport)> {
        let (_, snap) = self.suspend(id).await?;
        if !self.node.evict_local(id, &snap.id).await? {
            bail!("the local copy of {} was not evicted", snap.id);
        }
        self.evict_all(id).await?;
        let (took, r) = self.restore_to_exec(id).await?;
        if !r.from_store {
            bail!("the restore did not come from the store");
        }
        Ok((took, r))
    }

    /// Drops the local copies of every archived snapshot of suspended sandbox `id` (the
    /// runs would fill the disk with them otherwise).
    async fn evict_all(&self, id: &SandboxId) -> Result<()> {
        for s in self.node.snapshots(id).await? {
            if s.local && s.remote.is_some() {
                self.node.evict_local(id, &s.id).await?;
            }
        }
        Ok(())
    }

    /// Waits until the last restore's files are whole (a lazy one) and the node has its cache
    /// copy of the snapshot again, so the next measurement does not share the host with
    /// either; answers the restore's report, complete.
    async fn settle(&self, id: &SandboxId) -> Result<RestoreReport> {
        let deadline = Instant::now() + Duration::from_secs(900);
        while Instant::now() < deadline {
            self.node.reconcile_archive().await;
            let info = self.node.info(id).await?;
            let report = self.node.last_restore(id);
            // A lazy one's VM has also moved to its local files.
            let filled = report.as_ref().is_some_and(|r| {
                r.fetch.is_some() || (r.lazy.is_some() && r.handed_over.is_some())
            });
            let cached = match &info.origin {
                space_node::Origin::Snapshot { snapshot, .. } => {
                    info.snapshot(snapshot).is_some_and(|s| s.local)
                }
                _ => true,
            };
            if filled && cached {
                return report.ok_or_else(|| anyhow!("no restore report"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the restore of {id} did not settle (files whole, cache copy fetched)")
    }

    async fn close(mut self) -> Result<()> {
        if tokio::time::timeout(Duration::from_secs(120), self.node.shutdown())
            .await
            .is_err()
        {
            eprintln!("space-bench: the node did not shut down within 2 minutes");
        }
        tokio::task::block_in_place(|| self.dir.cleanup())
    }
}

async fn measure(plan: &RestorePlan, store: &str) -> Result<()> {
    let decision = accel::detect()?;
    progress("opening a node with a store");
    let s = Setup::open(plan, store).await?;
    host::print_run_start("space-bench restore", &decision, s.node.runtime().version());
    println!("host:        {}", host::host_summary());
    println!(
        "store:       {} (chunks of 256 KiB); node on a loop-mounted btrfs image",
        s.node
            .archive()
            .map(|a| a.archive.name().to_owned())
            .unwrap_or_default()
    );
    println!(
        "guests:      1 vCPU, {} MiB RAM, template minimal, each holding {}% of its RAM size as \
         fresh data ({}), in its page cache and on its disk",
        plan.sizes_mib
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        plan.fresh_pct,
        plan.kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", "),
    );
    println!("runs:        {} per size and kind", plan.runs);
    println!();
    // What one read of the store costs by size, through the node's client and object_store's
    // own: the small reads of a restore (manifest, device state, compressed chunks).
    if let (Some(a), Some((bucket, prefix))) = (
        s.node.archive(),
        store
            .strip_prefix("s3://")
            .and_then(|rest| rest.split_once('/')),
    ) {
        progress("reading objects of several sizes");
        let (table, summary) =
            crate::store_latency::measure(&a.archive, bucket, prefix.trim_end_matches('/')).await?;
        println!("{}", table.render());
        println!("{}", summary.render());
    }
    let mut cases: Vec<Case> = Vec::new();
    let result: Result<()> = async {
        for &size in &plan.sizes_mib {
            progress(&format!("{size} MiB: building the template"));
            let t = s.template(plan, size).await?;
            // The template goes up with the first suspend of a sandbox of it: outside the
            // measurements.
            let mut warm = CreateRequest::new(t.name.clone());
            warm.version = VersionReq::Exact(t.version.clone());
            let warm = s.node.create(warm).await.context("create")?.id;
            s.suspend(&warm).await?;
            s.evict_all(&warm).await?;
            s.node.kill(&warm).await?;
            for &kind in &plan.kinds {
                let mut c = Case {
                    size_mib: size,
                    kind: Some(kind),
                    ..Default::default()
                };
                one_case(plan, &s, &t, &mut c).await?;
                cases.push(c);
            }
        }
        Ok(())
    }
    .await;
    s.close().await?;
    // What was measured is shown even when a later case failed.
    report(plan, &cases);
    result?;
    println!("load average at the end: {}", host::load_average());
    Ok(())
}

async fn one_case(plan: &RestorePlan, s: &Setup, t: &TemplateRef, c: &mut Case) -> Result<()> {
    let kind = c.kind.unwrap_or(Kind::Random);
    let fresh = c.size_mib * plan.fresh_pct / 100;
    let mut req = CreateRequest::new(t.name.clone());
    req.version = VersionReq::Exact(t.version.clone());
    req.options.disk_mib = Some(fresh + 1024);
    let id = s.node.create(req).await.context("create")?.id;
    progress(&format!("{}: writing {fresh} MiB", c.label()));
    let t0 = Instant::now();
    s.exec(&id, &kind.write_line(fresh, "/root/fresh")).await?;
    c.write_ms = ms(t0.elapsed());
    let sum = s.exec(&id, "sha256sum /root/fresh").await?;
    progress(&format!("{}: the first suspend", c.label()));
    let (took, snap) = s.suspend(&id).await?;
    c.suspend_ms = ms(took);
    c.uploaded_mib = snap
        .remote
        .as_ref()
        .map(|r| r.uploaded_bytes as f64 / MIB)
        .unwrap_or(0.0);
    for run in 0..plan.runs {
        progress(&format!("{}: run {}/{}", c.label(), run + 1, plan.runs));
        // From local disk.
        let (local, _) = s.restore_to_exec(&id).await?;
        c.local.push(ms(local));
        // From the store, everything fetched first (as before lazy restores).
        s.node.set_restore_mode(RestoreMode::Eager);
        let (store, r) = s.store_restore(&id).await?;
        c.store.push(ms(store));
        c.prepared.push(ms(r.prepared));
        if let Some(f) = &r.fetch {
            c.fetch.push(ms(f.elapsed));
            c.getting.push(ms(f.getting));
            c.opening.push(ms(f.opening));
            c.writing.push(ms(f.writing));
            c.fetched_mib.push(f.fetched_bytes as f64 / MIB);
        }
        c.vm_started.push(ms(r.vm_started));
        c.guest_ready.push(ms(r.guest_ready));
        c.first_exec.push(ms(store.saturating_sub(r.total)));
        if run == 0 && s.exec(&id, "sha256sum /root/fresh").await? != sum {
            bail!("the data read back after an eager restore from the store differs");
        }
        s.settle(&id).await?;
        // Lazily, without a prefetch list: what it waits for is recorded.
        s.node.set_restore_mode(RestoreMode::LazyUnordered);
        let (lazy, _) = s.store_restore(&id).await?;
        c.lazy.push(ms(lazy));
        let r = s.settle(&id).await?;
        c.lazy_opened.push(ms(r.opened));
        c.lazy_vm_started.push(ms(r.vm_started));
        c.lazy_guest_ready.push(ms(r.guest_ready));
        c.lazy_first_exec.push(ms(lazy.saturating_sub(r.total)));
        if let Some(l) = &r.lazy {
            c.lazy_waited.push(ms(l.waited));
            c.lazy_urgent.push(l.urgent_chunks as f64);
            c.lazy_filled.push(ms(l.hydrated_in));
            c.lazy_reads.push(l.served_reads as f64);
            c.lazy_read_mib.push(l.served_read_bytes as f64 / MIB);
            c.lazy_writes.push(l.served_writes as f64);
        }
        if let Some(m) = r.handed_over {
            c.lazy_moved.push(ms(m));
        }
        // Lazily, with the list the last one recorded (uploaded with this suspend).
        s.node.set_restore_mode(RestoreMode::Lazy);
        let (lazy_pf, _) = s.store_restore(&id).await?;
        c.lazy_pf.push(ms(lazy_pf));
        // The data is checked while the files fill in, in the last run: reading it all is
        // recorded as touched, and a list recorded so would be the next restore's.
        if run + 1 == plan.runs && s.exec(&id, "sha256sum /root/fresh").await? != sum {
            bail!("the data read back while a lazy restore fills in differs");
        }
        let r = s.settle(&id).await?;
        c.pf_vm_started.push(ms(r.vm_started));
        c.pf_guest_ready.push(ms(r.guest_ready));
        if let Some((chunks, waited)) = r.prefetch {
            c.pf_list.push(chunks as f64);
            c.pf_gate.push(ms(waited));
        }
        if let Some(l) = &r.lazy {
            c.pf_waited.push(ms(l.waited));
            c.pf_urgent.push(l.urgent_chunks as f64);
            c.pf_prefetched.push(l.prefetched_chunks as f64);
            c.pf_filled.push(ms(l.hydrated_in));
        }
        if let Some(m) = r.handed_over {
            c.pf_moved.push(ms(m));
        }
        s.node.set_restore_mode(RestoreMode::AsConfigured);
        s.suspend(&id).await?;
    }
    s.evict_all(&id).await?;
    s.node.kill(&id).await?;
    Ok(())
}

fn report(plan: &RestorePlan, cases: &[Case]) {
    let mut setup = Table::new("Each guest once: writing its data and the first suspend");
    let mut time = Table::new("Restore to the first exec (ms)");
    let mut parts = Table::new(
        "Where a restore from the store goes (ms; sums add up the times of threads that \
         overlap)",
    );
    for c in cases {
        let l = c.label();
        setup.add(
            format!("{l}: writing the data"),
            "ms",
            Samples::from_values([c.write_ms]),
        );
        setup.add(
            format!("{l}: suspend to committed"),
            "ms",
            Samples::from_values([c.suspend_ms]),
        );
        setup.add(
            format!("{l}: uploaded"),
            "MiB",
            Samples::from_values([c.uploaded_mib]),
        );
        time.add(format!("{l}: from local disk"), "ms", c.local.clone());
        time.add(format!("{l}: from the store, eager"), "ms", c.store.clone());
        time.add(format!("{l}: from the store, lazy"), "ms", c.lazy.clone());
        time.add(
            format!("{l}: from the store, lazy + prefetch"),
            "ms",
            c.lazy_pf.clone(),
        );
        for (what, unit, v) in [
            ("eager: keys, manifest, template", "ms", &c.prepared),
            ("eager: fetch (wall)", "ms", &c.fetch),
            ("eager:   ranged reads, summed", "ms", &c.getting),
            ("eager:   opening chunks, summed", "ms", &c.opening),
            ("eager:   writing chunks, summed", "ms", &c.writing),
            ("eager:   fetched", "MiB", &c.fetched_mib),
            ("eager: VM started, state loaded", "ms", &c.vm_started),
            ("eager: guest ready (identity)", "ms", &c.guest_ready),
            ("eager: first exec", "ms", &c.first_exec),
            (
                "lazy: files laid out, state fetched, mounted",
                "ms",
                &c.lazy_opened,
            ),
            ("lazy: VM started, state loaded", "ms", &c.lazy_vm_started),
            ("lazy: guest ready (identity)", "ms", &c.lazy_guest_ready),
            ("lazy: first exec", "ms", &c.lazy_first_exec),
            (
                "lazy: the VM waiting for chunks, summed",
                "ms",
                &c.lazy_waited,
            ),
            ("lazy: chunks it waited for", "n", &c.lazy_urgent),
            ("lazy: until the files were whole", "ms", &c.lazy_filled),
            ("lazy: reads served until then", "n", &c.lazy_reads),
            ("lazy:   their bytes", "MiB", &c.lazy_read_mib),
            ("lazy: writes served until then", "n", &c.lazy_writes),
            (
                "lazy: VM moved to the local files (guest stopped)",
                "ms",
                &c.lazy_moved,
            ),
            ("lazy + prefetch: chunks in the list", "n", &c.pf_list),
            (
                "lazy + prefetch: VM started, state loaded",
                "ms",
                &c.pf_vm_started,
            ),
            (
                "lazy + prefetch:   of which paused for the list",
                "ms",
                &c.pf_gate,
            ),
            (
                "lazy + prefetch: guest ready (identity)",
                "ms",
                &c.pf_guest_ready,
            ),
            (
                "lazy + prefetch: the VM waiting, summed",
                "ms",
                &c.pf_waited,
            ),
            ("lazy + prefetch: chunks it waited for", "n", &c.pf_urgent),
            ("lazy + prefetch: chunks prefetched", "n", &c.pf_prefetched),
            (
                "lazy + prefetch: until the files were whole",
                "ms",
                &c.pf_filled,
            ),
            (
                "lazy + prefetch: VM moved to the local files",
                "ms",
                &c.pf_moved,
            ),
        ] {
            parts.add(format!("{l}: {what}"), unit, v.clone());
        }
    }
    for t in [&setup, &time, &parts] {
        println!("{}", t.render());
    }
    let mut summary = Summary::new();
    let mut targets = Targets::new();
    for c in cases {
        let l = c.label();
        summary.add(
            format!("{l}: eager from the store / local"),
            &c.store,
            &c.local,
            "today's restore, same run",
        );
        summary.add(
            format!("{l}: lazy / local"),
            &c.lazy,
            &c.local,
            "same snapshot, same run",
        );
        summary.add(
            format!("{l}: lazy + prefetch / local"),
            &c.lazy_pf,
            &c.local,
            "same snapshot, same run",
        );
        summary.add(
            format!("{l}: lazy + prefetch / lazy"),
            &c.lazy_pf,
            &c.lazy,
            "what the prefetch list saves",
        );
        summary.add(
            format!("{l}: lazy + prefetch / eager"),
            &c.lazy_pf,
            &c.store,
            "against today's",
        );
        targets.ratio(
            format!("{l}: store (lazy + prefetch) / local"),
            &c.lazy_pf,
            &c.local,
            STORE_OVER_LOCAL,
        );
    }
    let (small, large) = (
        plan.sizes_mib.iter().min().copied().unwrap_or(0),
        plan.sizes_mib.iter().max().copied().unwrap_or(0),
    );
    if small != large {
        for &kind in &plan.kinds {
            let find = |size| {
                cases
                    .iter()
                    .find(|c| c.size_mib == size && c.kind == Some(kind))
            };
            if let (Some(a), Some(b)) = (find(small), find(large)) {
                summary.add(
                    format!("{}: eager, {large} MiB / {small} MiB", kind.name()),
                    &b.store,
                    &a.store,
                    "today's",
                );
                summary.add(
                    format!(
                        "{}: lazy + prefetch, {large} MiB / {small} MiB",
                        kind.name()
                    ),
                    &b.lazy_pf,
                    &a.lazy_pf,
                    "flat in size: 1x",
                );
                targets.ratio(
                    format!(
                        "{}: store (lazy + prefetch), {large} / {small} MiB",
                        kind.name()
                    ),
                    &b.lazy_pf,
                    &a.lazy_pf,
                    LARGEST_OVER_SMALLEST,
                );
            }
        }
    }
    println!("{}", summary.render());
    println!("{}", targets.render());
}
