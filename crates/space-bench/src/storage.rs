//! The storage drivers of the node (`space_node::storage`), without VMs: what a snapshot, a
//! delete and a clone of a volume holding one disk-sized file cost with each driver, on the
//! filesystem it is meant for.
//!
//! - **btrfs**: subvolume snapshots on a loop-mounted btrfs image (the [`Scratch`] image);
//! - **reflink**: directory trees of reflinked files, on the same btrfs image;
//! - **copy**: directory trees of sparse copies, in a plain directory under `/var/tmp` (the
//!   root filesystem, ext4 on these hosts).
//!
//! Each run snapshots the volume (alternating writable and read-only), measures the same
//! snapshot made durable (`syncfs`), and deletes it; then `create_volume` + `clone_file`, the
//! create path's other shape. Nothing is asserted; the numbers are for reading.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use space_node::storage::Storage;
use space_node::storage::{btrfs::BtrfsStorage, copy::CopyStorage, reflink::ReflinkStorage};

use crate::bench::progress;
use crate::scratch::Scratch;
use crate::stats::{Samples, Table};

/// What the storage group runs.
pub struct StoragePlan {
    /// Snapshots (and creates) per driver.
    pub runs: usize,
    /// Size of the file the volume holds, in MiB.
    pub mib: u64,
}

/// Runs every driver on its filesystem and prints one table each; the scratch areas are
/// removed afterwards, also after an error.
pub fn run(plan: &StoragePlan) -> Result<()> {
    let mut btrfs = Scratch::btrfs().context("setting up the btrfs scratch image")?;
    let measured = (|| {
        measure(
            plan,
            "btrfs (loop image)",
            &BtrfsStorage::new(),
            btrfs.root(),
        )?;
        let dir = btrfs.root().join("reflink");
        std::fs::create_dir(&dir)?;
        measure(plan, "reflink (on btrfs)", &ReflinkStorage::new(), &dir)
    })();
    let cleaned = btrfs.cleanup();
    measured?;
    cleaned?;
    let mut plain = Scratch::plain(Some(Path::new("/var/tmp")))?;
    let measured = measure(
        plan,
        "copy (root filesystem)",
        &CopyStorage::new(plain.root()),
        plain.root(),
    );
    let cleaned = plain.cleanup();
    measured?;
    cleaned
}

fn time<T>(f: impl FnOnce() -> Result<T>) -> Result<Duration> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed())
}

/// Writes `mib` MiB of non-zero bytes (so nothing is sparse) and makes them durable.
fn fill(path: &Path, mib: u64) -> Result<()> {
    let mut f = std::fs::File::create(path)?;
    let chunk: Vec<u8> = (0..(1u32 << 20)).map(|i| (i * 13 % 253) as u8).collect();
    for _ in 0..mib {
        f.write_all(&chunk)?;
    }
    f.sync_all()?;
    Ok(())
}

/// `syncfs` on the filesystem holding `root`.
fn sync(root: &Path) -> Result<()> {
    let d = std::fs::File::open(root)?;
    nix::unistd::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d))?;
    Ok(())
}

fn measure(plan: &StoragePlan, name: &str, storage: &dyn Storage, root: &Path) -> Result<()> {
    progress(&format!("{name}: writing a {} MiB file", plan.mib));
    let vol = root.join("vol");
    let disk = vol.join("rootfs.ext4");
    storage.create_volume(&vol)?;
    fill(&disk, plan.mib)?;
    sync(root)?;
    let mut rows: [Samples; 5] = Default::default();
    let [snap, durable, delete, clone, fresh] = &mut rows;
    for i in 0..plan.runs {
        let dst = root.join(format!("snap{i}"));
        let took = time(|| Ok(storage.snapshot_volume(&vol, &dst, i % 2 == 1)?))?;
        snap.push_duration(took);
        durable.push_duration(took + time(|| sync(root))?);
        delete.push_duration(time(|| Ok(storage.delete_volume(&dst)?))?);
        sync(root)?;
        let copy = root.join(format!("clone{i}"));
        clone.push_duration(time(|| Ok(storage.clone_file(&disk, &copy)?))?);
        std::fs::remove_file(&copy)?;
        let dst = root.join(format!("fresh{i}"));
        fresh.push_duration(time(|| {
            storage.create_volume(&dst)?;
            Ok(storage.clone_file(&disk, &dst.join("rootfs.ext4"))?)
        })?);
        storage.delete_volume(&dst)?;
        sync(root)?;
    }
    storage.delete_volume(&vol)?;
    let mut t = Table::new(format!(
        "{name}: a volume holding one {} MiB file, {} runs (snapshots alternate writable and \
         read-only)",
        plan.mib, plan.runs
    ));
    let [snap, durable, delete, clone, fresh] = rows;
    t.add("snapshot_volume", "ms", snap);
    t.add("snapshot_volume + syncfs", "ms", durable);
    t.add("delete_volume (of the snapshot)", "ms", delete);
    t.add("clone_file (the disk file)", "ms", clone);
    t.add("create_volume + clone_file", "ms", fresh);
    print!("{}", t.render());
    Ok(())
}
