//! The archive group (`space-bench archive`): sandboxes through the object store
//! (`docs/archive.md`), measured on real guests through the node.
//!
//! For a guest that has written 0, 16 and 64 MiB (random, so incompressible) since its create:
//! suspend to committed (time, bytes uploaded, and the ratio to zstd of exactly the pages that
//! differ from the template), restore from the local copy and from the store to the first
//! exec, in the same run, alternating; an idle second suspend; the dedup of a fork; and the
//! wake on access (first exec on a suspended or paused sandbox against one on a running
//! sandbox). Then the chunk sizes against each other, one node per size. The store is a
//! directory under `/var/tmp`, or `--store s3://...` (with the `AWS_*` variables).

use std::future::Future;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use space_archive::keys::NoAudit;
use space_archive::{Archive, Keyring, LocalMaster, MasterKey, StoreConfig};
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{
    ArchiveConfig, CreateRequest, Node, NodeConfig, PoolConfig, RemoteCopy, SandboxId,
    SnapshotRecord, Template, TemplateRef, TemplateSpec,
};
use space_proto::ExecSpec;
use space_runtime::accel;

use crate::bench::progress;
use crate::host;
use crate::node::DataDir;
use crate::stats::{Samples, Summary, Table, Targets};

const TEMPLATE_VERSION: &str = "bench";
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const EXEC_TIMEOUT: Duration = Duration::from_secs(120);
const MIB: f64 = 1_048_576.0;
/// Bytes uploaded over zstd of the changed pages.
const BYTES_TARGET: f64 = 1.2;
/// Restore from the store over a local restore, with 64 MiB written.
const RESTORE_TARGET: f64 = 2.0;
/// The gap between the periodic full snapshots of an idle running guest.
const PERIODIC_GAP: Duration = Duration::from_secs(10);
/// An idle second suspend uploads less than this.
const IDLE_TARGET_BYTES: f64 = MIB;

/// What an archive run measures.
pub struct ArchivePlan {
    pub runs: usize,
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    pub rootfs: PathBuf,
    pub memory_mib: u64,
    /// MiB written into the guest before each measured suspend.
    pub dirty_mib: Vec<u64>,
    /// Chunk sizes (KiB) for the comparison; the main measurements use the first.
    pub chunk_kib: Vec<u32>,
    /// The store (`None`: a fresh directory per node).
    pub store: Option<String>,
}

/// Runs the group; `interrupted` ends it early (cleaned up) with the reason.
pub async fn run(
    plan: &ArchivePlan,
    interrupted: impl Future<Output = &'static str>,
) -> Result<()> {
    let measured = measure(plan);
    tokio::select! {
        r = measured => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    }
}

/// The object store `store` (a fresh directory under /var/tmp when `None`) under a new master
/// key, as a node uses it; the directory (the key, and the objects when it is the store)
/// goes when the handle is dropped.
pub(crate) fn store_for(store: Option<&str>) -> Result<(ArchiveConfig, tempfile::TempDir)> {
    let store_dir = tempfile::Builder::new()
        .prefix("space-bench-objects-")
        .tempdir_in("/var/tmp")?;
    let store = match store {
        Some(s) => StoreConfig::parse(s)?,
        None => StoreConfig::Local(store_dir.path().join("objects")),
    };
    let archive = Archive::new(&store)?;
    let master: Arc<dyn MasterKey> = Arc::new(LocalMaster::open_or_create(
        &store_dir.path().join("master.key"),
    )?);
    let keyring = Arc::new(Keyring::new(
        archive.clone(),
        Arc::new(master),
        Arc::new(NoAudit),
        Duration::from_secs(300),
    ));
    Ok((ArchiveConfig::new(archive, keyring), store_dir))
}

/// A node on a loop-mounted btrfs image in `dir` with the store `archive`, no rolling
/// snapshots and no pools: what the groups that measure the store run.
pub(crate) fn node_config(dir: &DataDir, archive: ArchiveConfig) -> NodeConfig {
    let mut cfg = NodeConfig::new(dir.data());
    cfg.storage = StorageOptions {
        driver: Some(DriverKind::Btrfs),
        loop_image_size: 16 << 30,
        loop_image: true,
    };
    cfg.rolling.enabled = false;
    cfg.pools = PoolConfig::disabled();
    cfg.archive = Some(archive);
    cfg
}

/// One node with a store, and everything to clean up after it.
struct Setup {
    node: Node,
    template: Template,
    dir: DataDir,
    _store_dir: tempfile::TempDir,
}

impl Setup {
    async fn open(plan: &ArchivePlan, chunk_kib: u32) -> Result<Setup> {
        let dir = DataDir::with_prefix("space-bench-archive-")?;
        let (mut a, store_dir) = store_for(plan.store.as_deref())?;
        a.chunk_size = chunk_kib << 10;
        a.upload_interval = None;
        a.cache_max_bytes = None;
        let mut cfg = node_config(&dir, a);
        cfg.qemu.qemu = plan.qemu.clone();
        cfg.qemu.detached = false;
        cfg.ready_timeout = READY_TIMEOUT;
        let node = Node::open(cfg)
            .await
            .context("opening the node (needs root for the loop-mounted btrfs image)")?;
        let template = node
            .build_template(TemplateSpec {
                template: TemplateRef::new("minimal", TEMPLATE_VERSION)?,
                kernel: plan.kernel.clone(),
                rootfs: plan.rootfs.clone(),
                vcpus: 1,
                memory_mib: plan.memory_mib,
                kernel_cmdline: None,
                ready_timeout: READY_TIMEOUT,
                guest: Default::default(),
                start: None,
                source: String::new(),
            })
            .await
            .context("building the template")?;
        Ok(Setup {
            node,
            template,
            dir,
            _store_dir: store_dir,
        })
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

    async fn create(&self) -> Result<SandboxId> {
        let req = CreateRequest::new("minimal".parse()?);
        let id = self.node.create(req).await.context("create")?.id;
        self.exec(&id, "true").await?;
        Ok(id)
    }

    /// Runs a shell line (waking the sandbox if it sleeps).
    async fn exec(&self, id: &SandboxId, line: &str) -> Result<()> {
        shell(&self.node, id, line, EXEC_TIMEOUT).await.map(drop)
    }

    async fn dirty(&self, id: &SandboxId, mib: u64, name: &str) -> Result<()> {
        if mib > 0 {
            self.exec(
                id,
                &format!(
                    "dd if=/dev/urandom of=/root/{name} bs=1M count={mib} 2>/dev/null && sync"
                ),
            )
            .await?;
        }
        Ok(())
    }

    async fn suspend(&self, id: &SandboxId) -> Result<(Duration, SnapshotRecord, RemoteCopy)> {
        let t = Instant::now();
        let s = self.node.suspend(id).await.context("suspend")?;
        let took = t.elapsed();
        let r = s
            .remote
            .clone()
            .ok_or_else(|| anyhow!("suspend did not upload"))?;
        Ok((took, s, r))
    }

    /// Restore, then the first exec answered.
    async fn restore_to_exec(&self, id: &SandboxId) -> Result<Duration> {
        let t = Instant::now();
        self.node.restore(id).await.context("restore")?;
        self.exec(id, "true").await?;
        Ok(t.elapsed())
    }

    /// Waits until the node has fetched its cache copy of `snap` (a restore from the store
    /// fetched it straight into the sandbox), so the next measurement does not share the host
    /// with that.
    async fn settle(&self, id: &SandboxId, snap: &space_node::SnapshotId) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            self.node.reconcile_archive().await;
            let info = self.node.info(id).await?;
            if info.snapshot(snap).is_some_and(|s| s.local) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("the cache copy of snapshot {snap} of {id} did not appear")
    }

    /// zstd (level 1, as the uploader) of the 4 KiB pages of the snapshot's RAM and disk that
    /// differ from the template's, plus the device state: what an ideal incremental upload
    /// of the changes since create would send.
    fn zstd_of_changes(&self, snap_dir: &Path) -> Result<u64> {
        let base = self.template.dir.join("snapshot");
        let mut changed = Vec::new();
        for name in ["mem", "rootfs.ext4"] {
            pages_differing(&snap_dir.join(name), &base.join(name), &mut changed)?;
        }
        changed.extend(std::fs::read(snap_dir.join("state"))?);
        Ok(zstd::bulk::compress(&changed, 1)?.len() as u64)
    }
}

fn pages_differing(file: &Path, base: &Path, out: &mut Vec<u8>) -> Result<()> {
    const PAGE: usize = 4096;
    let mut f = std::fs::File::open(file).with_context(|| format!("{}", file.display()))?;
    let mut b = std::fs::File::open(base).with_context(|| format!("{}", base.display()))?;
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = read_full(&mut f, &mut x)?;
        if n == 0 {
            return Ok(());
        }
        let m = read_full(&mut b, &mut y[..n])?;
        y[m..n].fill(0);
        for (p, q) in x[..n].chunks(PAGE).zip(y[..n].chunks(PAGE)) {
            if p != q {
                out.extend_from_slice(p);
            }
        }
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let k = f.read(&mut buf[n..])?;
        if k == 0 {
            break;
        }
        n += k;
    }
    Ok(n)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[derive(Default)]
struct PerDirty {
    suspend: Samples,
    uploaded: Samples,
    chunks: Samples,
    ideal: Samples,
    ratio: Samples,
    local: Samples,
    remote: Samples,
    idle: Samples,
    fork_dedup: Samples,
    fork_uploaded: Samples,
}

/// Runs shell line `line` in sandbox `id` of `node` (waking it if it sleeps), within
/// `timeout`; its standard output, or why it failed.
pub(crate) async fn shell(
    node: &Node,
    id: &SandboxId,
    line: &str,
    timeout: Duration,
) -> Result<String> {
    let (client, _) = node.guest_waking(id).await.context("guest")?;
    let out = tokio::time::timeout(timeout, client.run(ExecSpec::shell(line)))
        .await
        .with_context(|| format!("no answer to `{line}` within {timeout:?}"))?
        .context("exec")?;
    if !out.status.success() {
        bail!(
            "`{line}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn measure(plan: &ArchivePlan) -> Result<()> {
    let decision = accel::detect()?;
    let main_chunk = *plan.chunk_kib.first().unwrap_or(&256);
    progress("opening a node with a store, building the template");
    let s = Setup::open(plan, main_chunk).await?;
    host::print_run_start("space-bench archive", &decision, s.node.runtime().version());
    println!(
        "guest:       1 vCPU, {} MiB RAM, template minimal",
        plan.memory_mib
    );
    println!("host:        {}", host::host_summary());
    println!(
        "store:       {} (chunks of {main_chunk} KiB, packs of 32 MiB); node on a loop-mounted btrfs image",
        s.node.archive().map(|a| a.archive.name().to_owned()).unwrap_or_default()
    );
    println!(
        "runs:        {} per size written ({} MiB), random data",
        plan.runs,
        plan.dirty_mib
            .iter()
            .map(|d| d.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!();
    // The template goes up with the first suspend: do that outside the measurements.
    let warm = s.create().await?;
    s.suspend(&warm).await?;
    s.node.kill(&warm).await?;

    let mut per: Vec<(u64, PerDirty)> = plan
        .dirty_mib
        .iter()
        .map(|&d| (d, PerDirty::default()))
        .collect();
    let mut wake_running = Samples::new();
    let mut wake_paused = Samples::new();
    let mut wake_local = Samples::new();
    let mut wake_remote = Samples::new();
    let result: Result<()> = async {
        for run in 0..plan.runs {
            for (dirty, p) in per.iter_mut() {
                progress(&format!(
                    "run {}/{}: {dirty} MiB written",
                    run + 1,
                    plan.runs
                ));
                let id = s.create().await?;
                s.dirty(&id, *dirty, "dirty").await?;
                let (took, snap, remote) = s.suspend(&id).await?;
                p.suspend.push(ms(took));
                p.uploaded.push(remote.uploaded_bytes as f64 / MIB);
                p.chunks.push(remote.new_chunks as f64);
                let snap_dir = s
                    .node
                    .layout()
                    .snapshot_dir(id.as_str(), snap.id.as_str())?;
                let ideal = tokio::task::block_in_place(|| s.zstd_of_changes(&snap_dir))?;
                p.ideal.push(ideal as f64 / MIB);
                p.ratio
                    .push(remote.uploaded_bytes as f64 / ideal.max(1) as f64);

                // Local and remote restores of the same snapshot, in turn.
                p.local.push(ms(s.restore_to_exec(&id).await?));
                let (_, snap2, idle) = s.suspend(&id).await?;
                p.idle.push(idle.uploaded_bytes as f64);
                s.node.evict_local(&id, &snap2.id).await?;
                p.remote.push(ms(s.restore_to_exec(&id).await?));
                s.settle(&id, &snap2.id).await?;

                // A fork of it shares its chunks.
                let child = s.node.fork(&id).await.context("fork")?.id;
                let (_, _, rc) = s.suspend(&child).await?;
                p.fork_uploaded.push(rc.uploaded_bytes as f64 / MIB);
                p.fork_dedup
                    .push(rc.stored_bytes as f64 / rc.uploaded_bytes.max(1) as f64);
                s.node.kill(&child).await?;

                if *dirty == 0 {
                    // Wake on access: first exec on a running, a paused, a suspended (local
                    // copy) and a suspended (store only) sandbox.
                    let t = Instant::now();
                    s.exec(&id, "true").await?;
                    wake_running.push(ms(t.elapsed()));
                    s.node.pause(&id).await?;
                    let t = Instant::now();
                    s.exec(&id, "true").await?;
                    wake_paused.push(ms(t.elapsed()));
                    s.suspend(&id).await?;
                    let t = Instant::now();
                    s.exec(&id, "true").await?;
                    wake_local.push(ms(t.elapsed()));
                    let (_, sn, _) = s.suspend(&id).await?;
                    s.node.evict_local(&id, &sn.id).await?;
                    let t = Instant::now();
                    s.exec(&id, "true").await?;
                    wake_remote.push(ms(t.elapsed()));
                    s.settle(&id, &sn.id).await?;
                }
                s.node.kill(&id).await?;
            }
        }
        Ok(())
    }
    .await;
    // A running idle guest, a full snapshot every PERIODIC_GAP: how long its vCPUs stop, and
    // what the incremental upload of each costs (the archive pass uploads snapshots taken on
    // request at once).
    let mut periodic_pause = Samples::new();
    let mut periodic_bytes = Samples::new();
    let result = match result {
        Ok(()) => {
            async {
                progress("an idle running guest, full snapshots uploaded periodically");
                let id = s.create().await?;
                let mut first = true;
                for _ in 0..plan.runs + 1 {
                    tokio::time::sleep(PERIODIC_GAP).await;
                    let snap = s.node.snapshot(&id, space_node::SnapshotKind::Full).await?;
                    s.node.reconcile_archive().await;
                    let info = s.node.info(&id).await?;
                    let up = info
                        .snapshot(&snap.id)
                        .and_then(|x| x.remote.clone())
                        .ok_or_else(|| anyhow!("the periodic snapshot was not uploaded"))?;
                    if !first {
                        periodic_pause.push(snap.paused_for_us as f64 / 1000.0);
                        periodic_bytes.push(up.uploaded_bytes as f64 / MIB);
                    }
                    first = false;
                }
                s.node.kill(&id).await?;
                Ok(())
            }
            .await
        }
        e => e,
    };
    s.close().await?;
    result?;

    let mut time = Table::new("Suspend and restore through the store (ms)");
    let mut bytes = Table::new("What a suspend uploads");
    let mut fork = Table::new("A fork's first upload");
    for (d, p) in &per {
        time.add(
            format!("{d} MiB written: suspend to committed"),
            "ms",
            p.suspend.clone(),
        );
        time.add(
            format!("{d} MiB written: restore from local disk to first exec"),
            "ms",
            p.local.clone(),
        );
        time.add(
            format!("{d} MiB written: restore from the store to first exec"),
            "ms",
            p.remote.clone(),
        );
        bytes.add(
            format!("{d} MiB written: uploaded"),
            "MiB",
            p.uploaded.clone(),
        );
        bytes.add(
            format!("{d} MiB written: new chunks"),
            "n",
            p.chunks.clone(),
        );
        bytes.add(
            format!("{d} MiB written: zstd of the changed pages"),
            "MiB",
            p.ideal.clone(),
        );
        bytes.add(
            format!("{d} MiB written: uploaded / zstd of changes"),
            "x",
            p.ratio.clone(),
        );
        bytes.add(
            format!("{d} MiB written: idle second suspend"),
            "bytes",
            p.idle.clone(),
        );
        fork.add(
            format!("{d} MiB written: child's upload"),
            "MiB",
            p.fork_uploaded.clone(),
        );
        fork.add(
            format!("{d} MiB written: referenced / uploaded"),
            "x",
            p.fork_dedup.clone(),
        );
    }
    let mut wake = Table::new("Wake on access: first exec (ms)");
    wake.add("running (reference)", "ms", wake_running.clone());
    wake.add("paused: resumed on access", "ms", wake_paused.clone());
    wake.add(
        "suspended, local copy: restored on access",
        "ms",
        wake_local.clone(),
    );
    wake.add(
        "suspended, store only: restored on access",
        "ms",
        wake_remote.clone(),
    );
    let mut periodic = Table::new(format!(
        "An idle running guest: a full snapshot every {} s, uploaded",
        PERIODIC_GAP.as_secs()
    ));
    periodic.add("vCPUs stopped for the snapshot", "ms", periodic_pause);
    periodic.add("incremental upload", "MiB", periodic_bytes);
    for t in [&time, &bytes, &fork, &wake, &periodic] {
        println!("{}", t.render());
    }

    let mut summary = Summary::new();
    let mut targets = Targets::new();
    for (d, p) in &per {
        summary.add(
            format!("{d} MiB: restore from the store / from local disk"),
            &p.remote,
            &p.local,
            "same snapshot, same run",
        );
        let ones = Samples::from_values(std::iter::repeat_n(1.0, p.ratio.len()));
        targets.ratio(
            format!("{d} MiB: bytes uploaded / zstd of changes"),
            &p.ratio,
            &ones,
            BYTES_TARGET,
        );
        let idle_ref = Samples::from_values(std::iter::repeat_n(IDLE_TARGET_BYTES, p.idle.len()));
        targets.ratio(
            format!("{d} MiB: idle second suspend / 1 MiB"),
            &p.idle,
            &idle_ref,
            1.0,
        );
        if *d == *plan.dirty_mib.iter().max().unwrap_or(&0) {
            targets.ratio(
                format!("{d} MiB: restore from store / local"),
                &p.remote,
                &p.local,
                RESTORE_TARGET,
            );
        }
    }
    summary.add(
        "wake from paused / running",
        &wake_paused,
        &wake_running,
        "first exec",
    );
    summary.add(
        "wake from suspended (local) / running",
        &wake_local,
        &wake_running,
        "first exec",
    );
    summary.add(
        "wake from suspended (store) / running",
        &wake_remote,
        &wake_running,
        "first exec",
    );
    println!("{}", summary.render());
    println!("{}", targets.render());

    chunk_sizes(plan).await?;
    println!("load average at the end: {}", host::load_average());
    Ok(())
}

/// One node per chunk size: a 16 MiB write then the first suspend, a restore, 1 MiB more and
/// the second suspend.
async fn chunk_sizes(plan: &ArchivePlan) -> Result<()> {
    if plan.chunk_kib.len() < 2 {
        return Ok(());
    }
    let runs = plan.runs.clamp(1, 3);
    let mut table = Table::new("Chunk size: bytes uploaded (MiB) and time");
    for &kib in &plan.chunk_kib {
        progress(&format!("chunk size {kib} KiB"));
        let s = Setup::open(plan, kib).await?;
        let warm = s.create().await?;
        s.suspend(&warm).await?;
        s.node.kill(&warm).await?;
        let (mut first, mut second, mut chunks, mut took) = (
            Samples::new(),
            Samples::new(),
            Samples::new(),
            Samples::new(),
        );
        let r: Result<()> = async {
            for _ in 0..runs {
                let id = s.create().await?;
                s.dirty(&id, 16, "a").await?;
                let (_, _, r1) = s.suspend(&id).await?;
                first.push(r1.uploaded_bytes as f64 / MIB);
                s.restore_to_exec(&id).await?;
                s.dirty(&id, 1, "b").await?;
                let (t, _, r2) = s.suspend(&id).await?;
                second.push(r2.uploaded_bytes as f64 / MIB);
                chunks.push(r2.new_chunks as f64);
                took.push(ms(t));
                s.node.kill(&id).await?;
            }
            Ok(())
        }
        .await;
        s.close().await?;
        r?;
        table.add(
            format!("{kib} KiB: first suspend after 16 MiB"),
            "MiB",
            first,
        );
        table.add(
            format!("{kib} KiB: second suspend after 1 MiB more"),
            "MiB",
            second,
        );
        table.add(format!("{kib} KiB: its new chunks"), "n", chunks);
        table.add(format!("{kib} KiB: its time to committed"), "ms", took);
    }
    println!("{}", table.render());
    Ok(())
}
