//! The volume-copies group (`space-bench volume-copies`): a volume's copies in the object
//! store (`docs/volumes.md`, *Copies in the object store*), through a node on a loop-mounted
//! btrfs image, written through the node's file API (the same tree the guests' mounts use).
//!
//! - A copy's time and upload by what changed since the last one: `--mib` of new random data,
//!   one 4 KiB change beside it, 1,000 new small files, nothing;
//! - a restore of the whole volume from the store (what a move to another node costs), against
//!   a local read of the same bytes;
//! - **the exposure of an acknowledged write**: with copies at the default interval, a 1 MiB
//!   write at a random moment, then the time until the volume's `synced_unix_ms` passes the
//!   moment it was acknowledged. That is how long a write can be lost with its node.

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, Context as _, Result};
use space_archive::Archive;
use space_node::Node;
use space_proto::volume::{VolumeReply, VolumeRequest};

use crate::bench::progress;
use crate::host;
use crate::node::DataDir;
use crate::stats::{Samples, Summary, Table};

const VOLUME: &str = "vol-00000000000c0b1e";
const MIB: f64 = 1_048_576.0;

/// What a volume-copies run measures.
pub struct VolumeCopiesPlan {
    pub runs: usize,
    /// MiB of new data before the first measured copy.
    pub mib: u64,
    /// Writes whose exposure is measured.
    pub writes: usize,
    /// The object store (`None`: a fresh directory under /var/tmp).
    pub store: Option<String>,
}

/// Runs the group; `interrupted` ends it early with the reason.
pub async fn run(
    plan: &VolumeCopiesPlan,
    interrupted: impl Future<Output = &'static str>,
) -> Result<()> {
    tokio::select! {
        r = measure(plan) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    }
}

struct Setup {
    node: Node,
    dir: DataDir,
    _store_dir: tempfile::TempDir,
}

async fn open(plan: &VolumeCopiesPlan, interval: Option<Duration>) -> Result<Setup> {
    let dir = DataDir::with_prefix("space-bench-volcopy-")?;
    let (mut a, store_dir) = crate::archive::store_for(plan.store.as_deref())?;
    a.upload_interval = None;
    a.volume_copy_interval = interval;
    let cfg = crate::archive::node_config(&dir, a);
    let node = Node::open(cfg)
        .await
        .context("opening the node (needs root for the loop-mounted btrfs image)")?;
    node.create_volume(VOLUME, "bench", 16 << 30).await?;
    Ok(Setup {
        node,
        dir,
        _store_dir: store_dir,
    })
}

impl Setup {
    async fn close(mut self) -> Result<()> {
        let _ = tokio::time::timeout(Duration::from_secs(60), self.node.shutdown()).await;
        tokio::task::block_in_place(|| self.dir.cleanup())
    }

    async fn call(&self, req: VolumeRequest, data: Vec<u8>) -> Result<(VolumeReply, Vec<u8>)> {
        let a = self.node.volume_call(VOLUME, req, data).await?;
        match a.reply {
            VolumeReply::Errno(e) => Err(anyhow!("the volume answered errno {e}")),
            r => Ok((r, a.data.0)),
        }
    }

    /// Writes `data` as file `path` (made or emptied first), 1 MiB a call.
    async fn write(&self, path: &str, data: &[u8]) -> Result<()> {
        self.call(
            VolumeRequest::Create {
                path: path.into(),
                mode: 0o644,
                uid: 0,
                gid: 0,
                exclusive: false,
                truncate: true,
            },
            Vec::new(),
        )
        .await?;
        for (i, part) in data.chunks(1 << 20).enumerate() {
            self.call(
                VolumeRequest::Write {
                    path: path.into(),
                    offset: (i as u64) << 20,
                },
                part.to_vec(),
            )
            .await?;
        }
        Ok(())
    }

    async fn read_all(&self, path: &str) -> Result<u64> {
        let mut at = 0u64;
        loop {
            let (r, bytes) = self
                .call(
                    VolumeRequest::Read {
                        path: path.into(),
                        offset: at,
                        size: 1 << 20,
                    },
                    Vec::new(),
                )
                .await?;
            match r {
                VolumeReply::Data(0) => return Ok(at),
                VolumeReply::Data(_) => at += bytes.len() as u64,
                other => return Err(anyhow!("read: {other:?}")),
            }
        }
    }

    /// A copy on request: its time and the bytes it sent (packs and manifest, from the
    /// store's listing).
    async fn copy(&self) -> Result<(Duration, u64)> {
        let archive = self.node.archive().context("no store")?.archive.clone();
        let before = listed(&archive).await?;
        let t = Instant::now();
        self.node.sync_volume(VOLUME).await?;
        let took = t.elapsed();
        let after = listed(&archive).await?;
        Ok((took, after.saturating_sub(before)))
    }
}

/// Bytes of the volume's packs and manifests in the store.
async fn listed(archive: &Archive) -> Result<u64> {
    let mut n = 0;
    for prefix in [
        archive.packs_prefix(VOLUME)?,
        archive.volume_manifests_prefix(VOLUME)?,
    ] {
        for (_, size) in archive.list(&prefix).await? {
            n += size;
        }
    }
    Ok(n)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

async fn measure(plan: &VolumeCopiesPlan) -> Result<()> {
    println!(
        "space-bench volume-copies {}",
        host::utc_timestamp(SystemTime::now())
    );
    println!("host:        {}", host::host_summary());
    println!(
        "volume:      written through the node's file API; {} MiB of random data, then small changes; {} runs",
        plan.mib, plan.runs
    );
    println!();
    let mib = plan.mib as usize;
    let mut seed = 1u64;
    let mut new_data = Samples::new();
    let mut new_sent = Samples::new();
    let mut small = Samples::new();
    let mut small_sent = Samples::new();
    let mut files = Samples::new();
    let mut files_sent = Samples::new();
    let mut nothing = Samples::new();
    let mut restore = Samples::new();
    let mut local_read = Samples::new();
    for run in 0..plan.runs {
        progress(&format!("copies: run {} of {}", run + 1, plan.runs));
        let s = open(plan, None).await?;
        let result = async {
            seed += 1;
            let big = space_archive::testing::noise(seed, mib << 20);
            s.write("big", &big).await?;
            let (t, sent) = s.copy().await?;
            new_data.push_duration(t);
            new_sent.push(sent as f64 / MIB);
            // One 4 KiB write into a file beside the big one.
            s.write("note", &space_archive::testing::noise(seed + 100, 4096))
                .await?;
            let (t, sent) = s.copy().await?;
            small.push_duration(t);
            small_sent.push(sent as f64 / MIB);
            s.call(
                VolumeRequest::MkDir {
                    path: "many".into(),
                    mode: 0o755,
                    uid: 0,
                    gid: 0,
                },
                Vec::new(),
            )
            .await?;
            for i in 0..1000 {
                s.write(&format!("many/f{i}"), format!("file {i}\n").as_bytes())
                    .await?;
            }
            let (t, sent) = s.copy().await?;
            files.push_duration(t);
            files_sent.push(sent as f64 / MIB);
            let (t, _) = s.copy().await?;
            nothing.push_duration(t);
            // The whole volume back from the store, against reading it here.
            let t = Instant::now();
            s.read_all("big").await?;
            local_read.push_duration(t.elapsed());
            let t = Instant::now();
            s.node
                .restore_volume(VOLUME, "bench", 16 << 30, run as u64 + 1)
                .await?;
            restore.push_duration(t.elapsed());
            Ok::<_, anyhow::Error>(())
        }
        .await;
        s.close().await?;
        result?;
    }
    let mut t = Table::new(format!(
        "A copy of a volume to the object store, by what changed since the last copy ({} runs)",
        plan.runs
    ));
    t.add(
        format!("{mib} MiB of new random data: copy"),
        "ms",
        new_data.clone(),
    );
    t.add(
        format!("{mib} MiB of new random data: sent"),
        "MiB",
        new_sent,
    );
    t.add("one 4 KiB file beside it: copy", "ms", small);
    t.add("one 4 KiB file beside it: sent", "MiB", small_sent);
    t.add("1,000 new small files: copy", "ms", files);
    t.add("1,000 new small files: sent", "MiB", files_sent);
    t.add("nothing changed: copy", "ms", nothing);
    t.add(
        format!("restore of the volume ({mib} MiB + 1,001 files) from the store"),
        "ms",
        restore.clone(),
    );
    t.add(
        format!("read {mib} MiB here (file API)"),
        "ms",
        local_read.clone(),
    );
    println!("{}", t.render());

    // The exposure of an acknowledged write, with the node's own copy loop.
    progress("exposure: copies at the default interval");
    let s = open(plan, Some(space_node::DEFAULT_VOLUME_COPY_INTERVAL)).await?;
    let mut exposure = Samples::new();
    let result = async {
        for i in 0..plan.writes {
            progress(&format!("exposure: write {} of {}", i + 1, plan.writes));
            // A moment anywhere between two of the loop's ticks.
            let every = space_node::DEFAULT_VOLUME_COPY_INTERVAL.as_millis() as u64;
            let r = space_archive::testing::noise(i as u64 + 7, 2);
            let pause = u64::from(u16::from_le_bytes([r[0], r[1]])) % every;
            tokio::time::sleep(Duration::from_millis(pause)).await;
            s.write(
                &format!("w{i}"),
                &space_archive::testing::noise(i as u64, 1 << 20),
            )
            .await?;
            let acked = now_ms();
            let t = Instant::now();
            let until = t + Duration::from_secs(120);
            loop {
                let info = s.node.volume_info(VOLUME).await?;
                if info.synced_unix_ms.is_some_and(|m| m > acked) {
                    exposure.push_duration(t.elapsed());
                    break;
                }
                if Instant::now() > until {
                    return Err(anyhow!("no copy within 2 minutes of a write"));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }
    .await;
    s.close().await?;
    result?;
    let mut t = Table::new(format!(
        "How long an acknowledged 1 MiB write waits for a copy that holds it, copies every {} s \
         ({} writes at random moments): the most a node's loss costs",
        space_node::DEFAULT_VOLUME_COPY_INTERVAL.as_secs(),
        plan.writes
    ));
    t.add("acknowledged to in a copy", "ms", exposure);
    println!("{}", t.render());
    let mut summary = Summary::new();
    summary.add(
        "restore from the store / the first copy",
        &restore,
        &new_data,
        "the volume down against its big file up",
    );
    summary.add(
        "restore from the store / read here",
        &restore,
        &local_read,
        "the whole volume against its big file read on this node",
    );
    println!("{}", summary.render());
    Ok(())
}
