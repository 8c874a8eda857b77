//! Lazy restores against a local directory and against Garage (real S3): reads and writes
//! before the chunks have arrived, whole chunks and page deltas, the background filling
//! every slot, the prefetch list, the first-touch record, a corrupt chunk (refused, never
//! installed) and a store that goes away (a bounded wait, then an error for every waiter).

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use space_archive::crypto::LineageKeys;
use space_archive::lazy::{LazyError, LazyFiles, LazyOptions};
use space_archive::manifest::DeltaOn;
use space_archive::upload::{upload, Known, Previous, DEFAULT_CHUNK_SIZE};
use space_archive::{Archive, Manifest, StoreConfig};

const CHUNK: u64 = DEFAULT_CHUNK_SIZE as u64;

/// Two snapshots of one sandbox in `store`: the second has page deltas (on the base and on
/// a chunk stored whole) besides whole chunks. Answers the archive, the keys, the second
/// manifest, its directory and the base's.
async fn two_snapshots(
    config: StoreConfig,
    w: &Path,
) -> (Archive, Arc<LineageKeys>, Manifest, std::path::PathBuf) {
    let archive = Archive::open(&config).await.unwrap();
    let (keyring, _) = keyring(&archive, w);
    let keys = keyring
        .lineage_keys("alice", "lin-1", true, false)
        .await
        .unwrap();
    let (base, snap1) = (w.join("base"), w.join("snap1"));
    make_snapshot(&snap1, &base, 7);
    let s1 = spec("sbx-1", "s1", "lin-1", &snap1, &base, &archive);
    let (m1, _) = upload(&archive, keys.clone(), s1, &Known::default())
        .await
        .unwrap();
    // A page in a chunk equal to the base's (a delta on the base), one in a chunk stored
    // whole (a delta on it), and a whole new chunk of disk.
    let snap2 = w.join("snap2");
    std::fs::create_dir_all(&snap2).unwrap();
    for n in ["mem", "rootfs.ext4", "state"] {
        std::fs::copy(snap1.join(n), snap2.join(n)).unwrap();
    }
    let page = noise(500, 4096);
    let fresh = noise(501, CHUNK as usize);
    for (n, off, bytes) in [
        ("mem", 2 * MIB + 8192, &page[..]),
        ("mem", 3 * 4096, &page[..]),
        ("rootfs.ext4", 10 * MIB, &fresh[..]),
    ] {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(snap2.join(n))
            .unwrap();
        f.write_all_at(bytes, off).unwrap();
    }
    let mut s2 = spec("sbx-1", "s2", "lin-1", &snap2, &base, &archive);
    s2.previous = Some(Previous {
        manifest: Arc::new(m1.clone()),
        dir: snap1.clone(),
    });
    let mut known = Known::default();
    known.add_manifest(&m1);
    let (m2, _) = upload(&archive, keys.clone(), s2, &known).await.unwrap();
    let kinds: Vec<bool> = m2
        .chunks
        .iter()
        .filter_map(|c| c.delta.as_ref())
        .map(|d| matches!(d.on, DeltaOn::Base { .. }))
        .collect();
    assert!(kinds.contains(&true) && kinds.contains(&false), "{kinds:?}");
    (archive, keys, m2, snap2)
}

async fn open(
    archive: &Archive,
    keys: Arc<LineageKeys>,
    m: &Manifest,
    base: &Path,
    out: &Path,
    opts: LazyOptions,
) -> LazyFiles {
    LazyFiles::open(archive, keys, m, out, Some(base), copy_clone(), opts)
        .await
        .unwrap()
}

fn read_file(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// Reads `len` bytes at `off` of lazy file `name` on a blocking thread.
async fn read_lazy(lazy: &LazyFiles, name: &str, off: u64, len: usize) -> Result<Vec<u8>, String> {
    let l = lazy.clone();
    let fi = lazy.lazy_file(name).unwrap();
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; len];
        l.read_at(fi, off, &mut buf)
            .map(|_| buf)
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap()
}

/// A lazy restore of the second of [`two_snapshots`] in a directory store, into `out`.
struct Restore {
    _dir: tempfile::TempDir,
    lazy: LazyFiles,
    snap: std::path::PathBuf,
    out: std::path::PathBuf,
}

async fn restore_from_directory(opts: LazyOptions) -> Restore {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path();
    let (archive, keys, m, snap) = two_snapshots(StoreConfig::Local(w.join("objects")), w).await;
    let out = w.join("out");
    let lazy = open(&archive, keys, &m, &w.join("base"), &out, opts).await;
    Restore {
        _dir: dir,
        lazy,
        snap,
        out,
    }
}

/// Every file of `out` is the snapshot's in `snap`.
fn assert_whole(out: &Path, snap: &Path) {
    for n in ["mem", "rootfs.ext4", "state"] {
        assert_eq!(sha(&out.join(n)), sha(&snap.join(n)), "{n}");
    }
}

/// Only what is touched arrives (no background), every read matches the snapshot, the
/// first-touch record is in order, and once everything has been touched the files are whole.
async fn touched_first(config: StoreConfig) {
    let w = tempfile::tempdir().unwrap();
    let (archive, keys, m, snap) = two_snapshots(config, w.path()).await;
    let out = w.path().join("out");
    let opts = LazyOptions {
        parallel: 0,
        ..Default::default()
    };
    let lazy = open(&archive, keys, &m, &w.path().join("base"), &out, opts).await;
    // The device state came whole with `open`.
    assert_eq!(sha(&out.join("state")), sha(&snap.join("state")));
    assert!(!lazy.complete());
    let hydrate = {
        let l = lazy.clone();
        tokio::spawn(async move { l.hydrate().await })
    };
    let want = read_file(&snap.join("mem"));
    // A page delta on a whole chunk, a delta on the base, a read across two slots.
    for (off, len) in [(3 * 4096, 4096), (2 * MIB + 8000, 300), (CHUNK - 100, 200)] {
        let got = read_lazy(&lazy, "mem", off, len).await.unwrap();
        assert_eq!(got, want[off as usize..off as usize + len]);
    }
    let report = lazy.report();
    assert!(report.urgent_chunks >= 3, "{report:?}");
    assert!(report.waits >= 1, "{report:?}");
    assert_eq!(report.background_chunks, 0, "{report:?}");
    assert!(!lazy.complete());
    let touched = lazy.take_touched();
    assert_eq!(
        touched.first(),
        Some(&("mem".to_string(), 0)),
        "{touched:?}"
    );
    assert!(touched.contains(&("mem".to_string(), 1)), "{touched:?}");

    // Everything, by touching it.
    for name in ["mem", "rootfs.ext4"] {
        let size = std::fs::metadata(snap.join(name)).unwrap().len();
        let want = read_file(&snap.join(name));
        let mut off = 0;
        while off < size {
            let n = (size - off).min(MIB) as usize;
            let got = read_lazy(&lazy, name, off, n).await.unwrap();
            assert!(
                got == want[off as usize..off as usize + n],
                "{name} at {off}"
            );
            off += n as u64;
        }
    }
    let report = tokio::time::timeout(Duration::from_secs(30), hydrate)
        .await
        .expect("hydrate ends once every slot is present")
        .unwrap()
        .unwrap();
    assert!(lazy.complete());
    assert_eq!(report.background_chunks, 0, "{report:?}");
    assert_whole(&out, &snap);
}

#[tokio::test(flavor = "multi_thread")]
async fn touched_first_local_directory() {
    let d = tempfile::tempdir().unwrap();
    touched_first(StoreConfig::Local(d.path().join("objects"))).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn touched_first_garage() {
    let garage = tokio::task::spawn_blocking(Garage::start).await.unwrap();
    touched_first(garage.config("lazy")).await;
}

/// A write into a slot that has not arrived waits for it (so the rest of the chunk is the
/// snapshot's), and the background never writes over it.
#[tokio::test(flavor = "multi_thread")]
async fn writes_land_on_the_chunk_and_stay() {
    let Restore {
        _dir,
        lazy,
        snap,
        out,
    } = restore_from_directory(LazyOptions {
        parallel: 0,
        ..Default::default()
    })
    .await;
    let hydrate = {
        let l = lazy.clone();
        tokio::spawn(async move { l.hydrate().await })
    };
    let fi = lazy.lazy_file("rootfs.ext4").unwrap();
    let mine = b"written by the guest".to_vec();
    let at = 10 * MIB + 1000;
    {
        let (l, mine) = (lazy.clone(), mine.clone());
        tokio::task::spawn_blocking(move || l.write_at(fi, at, &mine))
            .await
            .unwrap()
            .unwrap();
    }
    // Now the background: everything else arrives, and the write stays.
    let mut rest = read_file(&snap.join("rootfs.ext4"));
    rest[at as usize..at as usize + mine.len()].copy_from_slice(&mine);
    let size = rest.len() as u64;
    let mut off = 0;
    while off < size {
        let n = (size - off).min(4 * MIB) as usize;
        let got = read_lazy(&lazy, "rootfs.ext4", off, n).await.unwrap();
        assert!(got == rest[off as usize..off as usize + n], "at {off}");
        off += n as u64;
    }
    let mem_size = std::fs::metadata(snap.join("mem")).unwrap().len();
    read_lazy(&lazy, "mem", 0, mem_size as usize).await.unwrap();
    hydrate.await.unwrap().unwrap();
    assert_eq!(read_file(&out.join("rootfs.ext4")), rest);
    assert_eq!(sha(&out.join("mem")), sha(&snap.join("mem")));
}

/// The background alone fills every slot, the prefetch list first; out-of-range reads are
/// refused.
#[tokio::test(flavor = "multi_thread")]
async fn background_and_prefetch_fill_everything() {
    let prefetch = vec![("rootfs.ext4".to_string(), 40), ("mem".to_string(), 0)];
    let Restore {
        _dir,
        lazy,
        snap,
        out,
    } = restore_from_directory(LazyOptions {
        parallel: 1,
        prefetch,
        ..Default::default()
    })
    .await;
    let fi = lazy.lazy_file("mem").unwrap();
    let mut buf = [0u8; 16];
    assert!(matches!(
        lazy.read_at(fi, lazy.size(fi) - 8, &mut buf),
        Err(LazyError::OutOfRange { .. })
    ));
    let report = lazy.hydrate().await.unwrap();
    assert!(lazy.complete());
    assert_eq!(report.prefetched_chunks, 2, "{report:?}");
    assert!(report.background_chunks > 0, "{report:?}");
    assert_eq!(report.urgent_chunks, 0, "{report:?}");
    assert_whole(&out, &snap);
}

/// A held background reads the prefetch list and what readers ask for, nothing else, until
/// it is released; then everything arrives. The reads served are counted.
#[tokio::test(flavor = "multi_thread")]
async fn a_held_background_waits_for_its_release() {
    let prefetch = vec![("rootfs.ext4".to_string(), 40)];
    let Restore {
        _dir,
        lazy,
        snap,
        out,
    } = restore_from_directory(LazyOptions {
        prefetch,
        hold_background: Some(Duration::from_secs(600)),
        ..Default::default()
    })
    .await;
    let filling = {
        let l = lazy.clone();
        tokio::spawn(async move { l.hydrate().await })
    };
    // A read of a chunk stored whole (the delta's own chunk is at 2 MiB of mem).
    let got = read_lazy(&lazy, "mem", 2 * MIB, 4096).await.unwrap();
    assert_eq!(
        got,
        read_file(&snap.join("mem"))[2 * MIB as usize..][..4096]
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = lazy.report();
    assert!(r.urgent_chunks >= 1, "{r:?}");
    assert_eq!(
        r.background_chunks, 0,
        "held, yet read in the background: {r:?}"
    );
    assert!(!lazy.complete());
    assert_eq!((r.served_reads, r.served_read_bytes), (1, 4096), "{r:?}");
    // The prefetch list's chunk is here (read from the list, or as the neighbour of the
    // chunk read first, whichever came first).
    let root = lazy.lazy_file("rootfs.ext4").unwrap();
    let mut b = vec![0u8; 4096];
    assert!(
        matches!(lazy.try_read_at(root, 40 * CHUNK, &mut b), Some(Ok(()))),
        "the prefetch list's chunk did not arrive while the background was held: {r:?}"
    );
    assert_eq!(
        b,
        read_file(&snap.join("rootfs.ext4"))[40 * CHUNK as usize..][..4096]
    );
    assert_eq!(r.prefetched_chunks + r.urgent_chunks, 2, "{r:?}");
    lazy.release_background();
    let report = tokio::time::timeout(Duration::from_secs(60), filling)
        .await
        .expect("the background never ran after its release")
        .unwrap()
        .unwrap();
    assert!(report.background_chunks > 0, "{report:?}");
    assert!(lazy.complete());
    assert_whole(&out, &snap);
    // What is here is served without waiting, and counted.
    let fi = lazy.lazy_file("mem").unwrap();
    let mut buf = vec![0u8; 8192];
    lazy.try_read_at(fi, 0, &mut buf).unwrap().unwrap();
    assert_eq!(buf, read_file(&snap.join("mem"))[..8192]);
    assert_eq!(lazy.report().served_reads, 3);
}

/// A chunk whose sealed bytes were changed in the store is refused: the reader gets an
/// error naming the pack, the restore fails, and the slot keeps what it had (nothing of the
/// corrupt chunk is installed).
#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_chunk_is_never_installed() {
    let d = tempfile::tempdir().unwrap();
    let w = d.path();
    let objects = w.join("objects");
    let (archive, keys, m, _snap) = two_snapshots(StoreConfig::Local(objects.clone()), w).await;
    // The disk's new chunk at 10 MiB: flip a byte of it in its pack.
    let fi = m
        .files
        .iter()
        .position(|f| f.name == "rootfs.ext4")
        .unwrap();
    let slot = (10 * MIB / CHUNK) as usize;
    let mut index = 0u64;
    let mut chunk = None;
    for r in &m.files[fi].runs {
        match r {
            space_archive::manifest::Run::Zero(n) | space_archive::manifest::Run::Base(n) => {
                index += n
            }
            space_archive::manifest::Run::Chunks(c) => {
                for &ci in c {
                    if index == slot as u64 {
                        chunk = Some(ci);
                    }
                    index += 1;
                }
            }
        }
    }
    let loc = &m.chunks[chunk.expect("a stored chunk at 10 MiB") as usize];
    let pack = files_under(&objects)
        .into_iter()
        .find(|p| p.ends_with(&m.packs[loc.pack as usize]))
        .unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pack)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, loc.offset + 40).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], loc.offset + 40).unwrap();

    let out = w.join("out");
    let lazy = open(
        &archive,
        keys,
        &m,
        &w.join("base"),
        &out,
        LazyOptions {
            parallel: 0,
            ..Default::default()
        },
    )
    .await;
    let before = read_file(&out.join("rootfs.ext4"));
    let hydrate = {
        let l = lazy.clone();
        tokio::spawn(async move { l.hydrate().await })
    };
    let err = read_lazy(&lazy, "rootfs.ext4", 10 * MIB, 4096)
        .await
        .unwrap_err();
    assert!(err.contains("restore failed"), "{err}");
    let herr = hydrate.await.unwrap().unwrap_err().to_string();
    assert!(herr.contains(&m.packs[loc.pack as usize]), "{herr}");
    assert!(lazy.failed().is_some());
    assert_eq!(read_file(&out.join("rootfs.ext4")), before);
    // Every later read fails at once.
    let err = read_lazy(&lazy, "mem", 0, 10).await.unwrap_err();
    assert!(err.contains("restore failed"), "{err}");
}

/// Garage stopped while a restore runs: a waiting reader is released with an error within the bound
/// the options set, the restore fails, and a new lazy restore after Garage is back works.
#[tokio::test(flavor = "multi_thread")]
async fn the_store_going_away_fails_the_restore_in_bounded_time() {
    let mut garage = tokio::task::spawn_blocking(Garage::start).await.unwrap();
    let d = tempfile::tempdir().unwrap();
    let w = d.path();
    let (archive, keys, m, snap) = two_snapshots(garage.config("gone"), w).await;
    let opts = LazyOptions {
        parallel: 0,
        read_timeout: Duration::from_secs(2),
        attempts: 2,
        ..Default::default()
    };
    let limit = opts.stall_limit();
    let lazy = open(
        &archive,
        keys.clone(),
        &m,
        &w.join("base"),
        &w.join("out"),
        opts.clone(),
    )
    .await;
    let hydrate = {
        let l = lazy.clone();
        tokio::spawn(async move { l.hydrate().await })
    };
    // The store goes before anything was read.
    tokio::task::block_in_place(|| garage.stop());
    let t = Instant::now();
    let Err(err) = read_lazy(&lazy, "rootfs.ext4", 10 * MIB, 4096).await else {
        panic!("a read succeeded with the store gone");
    };
    let waited = t.elapsed();
    assert!(err.contains("restore failed"), "{err}");
    assert!(
        waited <= limit + Duration::from_secs(15),
        "{waited:?} > {limit:?}"
    );
    assert!(hydrate.await.unwrap().is_err());

    tokio::task::block_in_place(|| garage.restart());
    let again = open(&archive, keys, &m, &w.join("base"), &w.join("out2"), opts).await;
    let want = read_file(&snap.join("rootfs.ext4"));
    let hydrate = {
        let l = again.clone();
        tokio::spawn(async move { l.hydrate().await })
    };
    let got = read_lazy(&again, "rootfs.ext4", 10 * MIB, 4096)
        .await
        .unwrap();
    assert_eq!(got, want[10 * MIB as usize..10 * MIB as usize + 4096]);
    again.fail("done with it");
    assert!(hydrate.await.unwrap().is_err());
}

/// `prefetched` resolves once the prefetch list's chunks are here, with the background held
/// and nobody reading: the files are not whole, only the list arrived. The record of what was
/// touched names slots that had arrived when read too, and ends with the background's release.
#[tokio::test(flavor = "multi_thread")]
async fn the_prefetch_list_arrives_before_anyone_reads_it() {
    let prefetch = vec![("rootfs.ext4".to_string(), 40), ("mem".to_string(), 8)];
    let Restore {
        _dir,
        lazy,
        snap,
        out,
    } = restore_from_directory(LazyOptions {
        prefetch,
        hold_background: Some(Duration::from_secs(600)),
        ..Default::default()
    })
    .await;
    assert_eq!(lazy.prefetch_len(), 2);
    let filling = {
        let l = lazy.clone();
        tokio::spawn(async move { l.hydrate().await })
    };
    tokio::time::timeout(Duration::from_secs(60), lazy.prefetched())
        .await
        .expect("the prefetch list never arrived");
    let r = lazy.report();
    assert_eq!(r.prefetched_chunks, 2, "{r:?}");
    assert_eq!((r.urgent_chunks, r.background_chunks), (0, 0), "{r:?}");
    assert!(!lazy.complete());
    // Both slots are served without waiting, and they are the snapshot's.
    for (name, slot) in [("rootfs.ext4", 40u64), ("mem", 8)] {
        let fi = lazy.lazy_file(name).unwrap();
        let mut b = vec![0u8; 4096];
        assert!(
            matches!(lazy.try_read_at(fi, slot * CHUNK, &mut b), Some(Ok(()))),
            "{name} slot {slot} is not here after the prefetch list arrived"
        );
        assert_eq!(
            b,
            read_file(&snap.join(name))[(slot * CHUNK) as usize..][..4096]
        );
    }
    // Once released, nothing more is recorded.
    lazy.release_background();
    read_lazy(&lazy, "mem", 3 * 4096, 4096).await.unwrap();
    let touched = lazy.take_touched();
    assert_eq!(
        touched,
        vec![("rootfs.ext4".to_string(), 40), ("mem".to_string(), 8)],
        "the record names what was read, arrived or not, until the release"
    );
    tokio::time::timeout(Duration::from_secs(60), filling)
        .await
        .expect("the background never ran after its release")
        .unwrap()
        .unwrap();
    assert!(lazy.complete());
    assert_whole(&out, &snap);
}

/// Without a prefetch list `prefetched` resolves at once; after a failure it resolves too.
#[tokio::test(flavor = "multi_thread")]
async fn prefetched_never_hangs() {
    let d = tempfile::tempdir().unwrap();
    let w = d.path();
    let (archive, keys, m, _snap) = two_snapshots(StoreConfig::Local(w.join("objects")), w).await;
    let none = open(
        &archive,
        keys.clone(),
        &m,
        &w.join("base"),
        &w.join("out-none"),
        LazyOptions::default(),
    )
    .await;
    assert_eq!(none.prefetch_len(), 0);
    tokio::time::timeout(Duration::from_secs(5), none.prefetched())
        .await
        .expect("no list, yet prefetched waited");
    // A list, and no hydrate to fetch it: only the failure lets it go.
    let listed = open(
        &archive,
        keys,
        &m,
        &w.join("base"),
        &w.join("out-listed"),
        LazyOptions {
            prefetch: vec![("mem".to_string(), 8)],
            ..Default::default()
        },
    )
    .await;
    let waiting = {
        let l = listed.clone();
        tokio::spawn(async move { l.prefetched().await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiting.is_finished(), "resolved before the list arrived");
    listed.fail("the VM is gone");
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("a failed restore left prefetched waiting")
        .unwrap();
}
