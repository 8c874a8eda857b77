//! The archive format end to end against a local directory and against Garage (real S3):
//! upload, incremental upload, fork dedup, restore with verification, corruption, truncation,
//! the wrong tenant, a store that goes away mid-upload, and no plaintext in the store.

mod common;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use space_archive::fetch::{materialize, FetchError, DEFAULT_PARALLEL_READS};
use space_archive::manifest::DeltaOn;
use space_archive::upload::{upload, Known, Previous, DEFAULT_CHUNK_SIZE};
use space_archive::{Archive, Manifest, ManifestError, StoreConfig};

const CHUNK: u64 = DEFAULT_CHUNK_SIZE as u64;

/// `dst` as a copy of snapshot directory `src`, with `writes` (file, offset, bytes) applied.
fn copy_with(src: &Path, dst: &Path, writes: &[(&str, u64, &[u8])]) {
    std::fs::create_dir_all(dst).unwrap();
    for n in ["mem", "rootfs.ext4", "state"] {
        std::fs::copy(src.join(n), dst.join(n)).unwrap();
    }
    for (n, off, bytes) in writes {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(dst.join(n))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, bytes, *off).unwrap();
    }
}

async fn restore_and_compare(
    archive: &Archive,
    keys: Arc<space_archive::crypto::LineageKeys>,
    m: &Manifest,
    src: &Path,
    base: &Path,
    out: &Path,
) {
    let report = materialize(
        archive,
        keys,
        m,
        out,
        Some(base),
        copy_clone(),
        DEFAULT_PARALLEL_READS,
    )
    .await
    .unwrap();
    assert!(report.chunks > 0);
    for n in ["mem", "rootfs.ext4", "state"] {
        assert_eq!(
            sha(&src.join(n)),
            sha(&out.join(n)),
            "{n} differs after restore"
        );
    }
}

async fn suite(config: StoreConfig, raw_dir: Option<&Path>, garage: Option<&Garage>) {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let archive = Archive::open(&config).await.unwrap();
    let (ring, _) = keyring(&archive, w);
    let (snap, base) = (w.join("snap1"), w.join("base"));
    make_snapshot(&snap, &base, 7);
    let keys = ring
        .lineage_keys("alice", "lin-1", true, false)
        .await
        .unwrap();

    // 1. First upload: zero and base chunks are flags, the rest is stored.
    let (m1, r1) = upload(
        &archive,
        keys.clone(),
        spec("sbx-1", "s1", "lin-1", &snap, &base, &archive),
        &Known::default(),
    )
    .await
    .unwrap();
    let mem_chunks = 8 * MIB / CHUNK;
    let disk_chunks = 32 * MIB / CHUNK;
    assert_eq!(r1.chunks, mem_chunks + disk_chunks + 1);
    // mem: 8 noise, 16 base, 8 zero; disk: 4 noise + 2 text chunks (500,000 bytes from 20 MiB), rest zero.
    assert_eq!(r1.base, 16, "{r1:?}");
    assert_eq!(r1.new_chunks, 8 + 4 + 2 + 1, "{r1:?}");
    assert_eq!(r1.zero, r1.chunks - r1.base - r1.new_chunks - r1.reused);
    // The text chunks compress; the noise does not: uploaded bytes are about the noise.
    let noise_bytes = 2 * MIB + MIB + 60_000;
    assert!(r1.uploaded_bytes < noise_bytes + 200_000, "{r1:?}");
    assert!(r1.uploaded_bytes > noise_bytes, "{r1:?}");

    let out1 = w.join("out1");
    restore_and_compare(
        &archive,
        ring.lineage_keys("alice", "lin-1", false, true)
            .await
            .unwrap(),
        &m1,
        &snap,
        &base,
        &out1,
    )
    .await;

    // 2. 1 MiB written: the next upload stores 4 chunks and reuses the rest.
    let snap2 = w.join("snap2");
    std::fs::create_dir_all(&snap2).unwrap();
    for n in ["mem", "rootfs.ext4", "state"] {
        std::fs::copy(snap.join(n), snap2.join(n)).unwrap();
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(snap2.join("rootfs.ext4"))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &noise(99, MIB as usize), 10 * MIB).unwrap();
    drop(f);
    let mut known = Known::default();
    known.add_manifest(&m1);
    let (m2, r2) = upload(
        &archive,
        keys.clone(),
        spec("sbx-1", "s2", "lin-1", &snap2, &base, &archive),
        &known,
    )
    .await
    .unwrap();
    assert_eq!(r2.new_chunks, 4, "{r2:?}");
    assert_eq!(r2.reused, r1.new_chunks, "{r2:?}");
    assert!(r2.uploaded_bytes < MIB + 64 * 1024, "{r2:?}");
    // Flat: the second manifest lists every chunk it needs, old packs included.
    assert_eq!(m2.chunks.len() as u64, r1.new_chunks + 4);
    let out2 = w.join("out2");
    restore_and_compare(&archive, keys.clone(), &m2, &snap2, &base, &out2).await;

    // 2b. Page deltas: a page changed in a chunk equal to the base's, one in a chunk stored
    // whole (the previous snapshot's files are here) and one in the device state each cost
    // about a page.
    let page = noise(500, 4096);
    let snap3 = w.join("snap3");
    copy_with(
        &snap2,
        &snap3,
        &[
            ("mem", 2 * MIB + 8192, &page),
            ("mem", 3 * 4096, &page),
            ("state", 100, &page[..50]),
        ],
    );
    let mut s3 = spec("sbx-1", "s3", "lin-1", &snap3, &base, &archive);
    s3.previous = Some(Previous {
        manifest: Arc::new(m2.clone()),
        dir: snap2.clone(),
    });
    let mut known2 = Known::default();
    known2.add_manifest(&m2);
    let (m3, r3) = upload(&archive, keys.clone(), s3, &known2).await.unwrap();
    assert_eq!((r3.new_chunks, r3.delta_chunks), (3, 3), "{r3:?}");
    assert!(
        r3.uploaded_bytes - r3.manifest_bytes < 3 * 4096 + 1024,
        "{r3:?}"
    );
    let on_base = m3
        .chunks
        .iter()
        .filter(|c| matches!(&c.delta, Some(d) if matches!(d.on, DeltaOn::Base { .. })))
        .count();
    assert_eq!(on_base, 1);
    restore_and_compare(
        &archive,
        keys.clone(),
        &m3,
        &snap3,
        &base,
        &w.join("out-d3"),
    )
    .await;

    // 2c. Another page in the same chunk: a delta on a delta becomes one delta, with both
    // pages, on the chunk stored whole; and a previous file that no longer holds what its
    // manifest says is not used (that chunk is stored whole instead).
    let snap4 = w.join("snap4");
    copy_with(
        &snap3,
        &snap4,
        &[("mem", 5 * 4096, &page), ("rootfs.ext4", MIB + 4096, &page)],
    );
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(snap3.join("rootfs.ext4"))
            .unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"tampered", MIB + 100).unwrap();
    }
    let mut s4 = spec("sbx-1", "s4", "lin-1", &snap4, &base, &archive);
    s4.previous = Some(Previous {
        manifest: Arc::new(m3.clone()),
        dir: snap3.clone(),
    });
    let mut known3 = Known::default();
    known3.add_manifest(&m3);
    let (m4, r4) = upload(&archive, keys.clone(), s4, &known3).await.unwrap();
    assert_eq!((r4.new_chunks, r4.delta_chunks), (2, 1), "{r4:?}");
    let d = m4.chunks.iter().find_map(|c| c.delta.as_ref()).unwrap();
    assert_eq!(d.pages.iter().map(|w| w.count_ones()).sum::<u32>(), 2);
    let DeltaOn::Chunk(on) = d.on else {
        panic!("{d:?}")
    };
    assert!(m4.chunks[on as usize].delta.is_none());
    restore_and_compare(
        &archive,
        keys.clone(),
        &m4,
        &snap4,
        &base,
        &w.join("out-d4"),
    )
    .await;
    // Older manifests restore as they did.
    restore_and_compare(
        &archive,
        keys.clone(),
        &m2,
        &snap2,
        &base,
        &w.join("out-d2"),
    )
    .await;

    // 3. A fork in the same lineage shares every chunk it did not change.
    let (_, r3) = upload(
        &archive,
        keys.clone(),
        spec("sbx-2", "f1", "lin-1", &snap, &base, &archive),
        &known,
    )
    .await
    .unwrap();
    assert_eq!(r3.new_chunks, 0, "{r3:?}");
    assert_eq!(r3.reused, r1.new_chunks);

    // 4. Manifests: the hash is checked, a truncated object refused clearly.
    let mpath = archive.manifest_path("sbx-1", "s2").unwrap();
    let obj = archive
        .get_bounded(&mpath, 64 << 20)
        .await
        .unwrap()
        .unwrap();
    let h = Manifest::hash(&obj);
    Manifest::decode(&obj, Some(&h), &keys, "sbx-1", "s2").unwrap();
    archive
        .put(&mpath, obj.slice(..obj.len() / 2))
        .await
        .unwrap();
    let cut = archive
        .get_bounded(&mpath, 64 << 20)
        .await
        .unwrap()
        .unwrap();
    let err = Manifest::decode(&cut, Some(&h), &keys, "sbx-1", "s2").unwrap_err();
    assert!(matches!(err, ManifestError::Hash { .. }), "{err}");
    assert!(err.to_string().contains(&h));
    let err = Manifest::decode(&cut, None, &keys, "sbx-1", "s2").unwrap_err();
    assert!(matches!(err, ManifestError::Crypto(_)), "{err}");
    archive.put(&mpath, obj.clone()).await.unwrap();

    // 5. Another tenant's key does not open this lineage.
    ring.lineage_keys("bob", "lin-bob", true, false)
        .await
        .unwrap();
    let err = ring
        .lineage_keys("bob", "lin-1", false, true)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("tenant bob"), "{err}");

    // 6. A corrupted pack: the restore fails naming the pack and the chunk; the pack is put
    // back and the same manifest restores.
    let pack = archive.pack_path("lin-1", &m2.packs[0]).unwrap();
    let good = archive.get_bounded(&pack, 64 << 20).await.unwrap().unwrap();
    let mut bad = good.to_vec();
    let mid = bad.len() / 3;
    bad[mid] ^= 0x55;
    archive.put(&pack, Bytes::from(bad)).await.unwrap();
    let out3 = w.join("out3");
    let err = materialize(
        &archive,
        keys.clone(),
        &m2,
        &out3,
        Some(&base),
        copy_clone(),
        4,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, FetchError::Chunk { .. }), "{err}");
    assert!(err.to_string().contains(&m2.packs[0]), "{err}");
    // A truncated pack is "shorter than its manifest says".
    archive
        .put(&pack, good.slice(..good.len() / 2))
        .await
        .unwrap();
    let err = materialize(
        &archive,
        keys.clone(),
        &m2,
        &w.join("out4"),
        Some(&base),
        copy_clone(),
        4,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, FetchError::Short { .. } | FetchError::Store(_)),
        "{err}"
    );
    archive.put(&pack, good).await.unwrap();
    restore_and_compare(&archive, keys.clone(), &m2, &snap2, &base, &w.join("out5")).await;

    // 7. A missing base is a clear error, not a half restore.
    let err = materialize(
        &archive,
        keys.clone(),
        &m2,
        &w.join("out6"),
        None,
        copy_clone(),
        4,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, FetchError::NoBase { .. }), "{err}");

    // 8. Garbage collection: a pack nothing references goes (past the grace period); every
    // referenced one stays and the newest manifest still restores.
    for (sandbox, snapshot) in [("sbx-1", "s2"), ("sbx-2", "f1")] {
        let obj = archive
            .get_bounded(&archive.manifest_path(sandbox, snapshot).unwrap(), 64 << 20)
            .await
            .unwrap()
            .unwrap();
        archive
            .put_head(&space_archive::Head {
                format: 1,
                sandbox: sandbox.into(),
                tenant: "alice".into(),
                lineage: "lin-1".into(),
                snapshot: snapshot.into(),
                manifest_hash: Manifest::hash(&obj),
                updated_unix_ms: 1,
                terminated: false,
                epoch: 0,
            })
            .await
            .unwrap();
    }
    let orphan = archive.pack_path("lin-1", "0123456789abcdef").unwrap();
    archive
        .put(&orphan, Bytes::from(vec![1u8; 1000]))
        .await
        .unwrap();
    let kept = space_archive::gc::collect(&archive, &ring, std::time::Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(kept.packs_deleted, 0, "within the grace period: {kept:?}");
    let gc = space_archive::gc::collect(&archive, &ring, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(gc.packs_deleted, 1, "{gc:?}");
    assert!(archive.get_small(&orphan).await.unwrap().is_none());
    restore_and_compare(&archive, keys.clone(), &m2, &snap2, &base, &w.join("out7")).await;

    // 9. Crypto-shredding: the objects stay, nothing opens; garbage collection then removes
    // the lineage's packs, manifests and heads.
    ring.shred("alice", "lin-1").await.unwrap();
    let err = ring
        .lineage_keys("alice", "lin-1", false, true)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("destroyed"), "{err}");
    assert!(archive
        .get_bounded(&pack, 64 << 20)
        .await
        .unwrap()
        .is_some());
    let gc = space_archive::gc::collect(&archive, &ring, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(gc.shredded_removed, ["lin-1"], "{gc:?}");
    assert!(archive
        .get_bounded(&pack, 64 << 20)
        .await
        .unwrap()
        .is_none());
    assert!(archive.head("sbx-1").await.unwrap().is_none());

    // 10. No plaintext anywhere in the store's files; a plain object put as a control is found,
    // so the scan does read what the store keeps.
    if let Some(dir) = raw_dir
        .map(Path::to_owned)
        .or_else(|| garage.map(|g| g.data_dir()))
    {
        let needle = &noise(7, 2 * MIB as usize)[1000..1064];
        assert_eq!(
            any_file_contains(&dir, needle),
            None,
            "plaintext of mem found in the store"
        );
        assert_eq!(
            any_file_contains(&dir, &noise(99, MIB as usize)[5000..5064]),
            None
        );
        assert_eq!(any_file_contains(&dir, b"hello diskhello disk"), None);
        let control = noise(4242, 4096);
        archive
            .put(
                &archive.pack_path("control", "plain").unwrap(),
                Bytes::from(control.clone()),
            )
            .await
            .unwrap();
        assert!(
            any_file_contains(&dir, &control[100..164]).is_some(),
            "the scan reads nothing"
        );
    }
}

#[tokio::test]
async fn local_directory_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    suite(StoreConfig::Local(store.clone()), Some(&store), None).await;
}

#[tokio::test]
async fn garage_s3_store() {
    let garage = tokio::task::spawn_blocking(Garage::start).await.unwrap();
    suite(garage.config("archive"), None, Some(&garage)).await;
}

#[tokio::test]
async fn store_gone_mid_upload_loses_nothing() {
    let mut garage = tokio::task::spawn_blocking(Garage::start).await.unwrap();
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    let archive = Archive::open(&garage.config("")).await.unwrap();
    let (ring, _) = keyring(&archive, w);
    let keys = ring
        .lineage_keys("alice", "lin-1", true, false)
        .await
        .unwrap();
    let (snap, base) = (w.join("snap1"), w.join("base"));
    make_snapshot(&snap, &base, 7);
    let (m1, _) = upload(
        &archive,
        keys.clone(),
        spec("sbx-1", "s1", "lin-1", &snap, &base, &archive),
        &Known::default(),
    )
    .await
    .unwrap();
    archive
        .put_head(&space_archive::Head {
            format: 1,
            sandbox: "sbx-1".into(),
            tenant: "alice".into(),
            lineage: "lin-1".into(),
            snapshot: "s1".into(),
            manifest_hash: "h".into(),
            updated_unix_ms: 1,
            terminated: false,
            epoch: 0,
        })
        .await
        .unwrap();

    // A big second snapshot, with the server killed while its packs go up.
    let big = w.join("snap2");
    std::fs::create_dir_all(&big).unwrap();
    write_file(
        &big.join("mem"),
        8 * MIB,
        &[(0, &noise(5, 8 * MIB as usize))],
    );
    write_file(
        &big.join("rootfs.ext4"),
        64 * MIB,
        &[(0, &noise(6, 48 * MIB as usize))],
    );
    write_file(&big.join("state"), 10, &[(0, b"0123456789")]);
    let mut known = Known::default();
    known.add_manifest(&m1);
    let mut s = spec("sbx-1", "s2", "lin-1", &big, &base, &archive);
    s.pack_target = 2 << 20;
    let a2 = archive.clone();
    let k2 = keys.clone();
    let packs = archive.packs_prefix("lin-1").unwrap();
    let before = archive.list(&packs).await.unwrap().len();
    let task = tokio::spawn(async move { upload(&a2, k2, s, &known).await });
    // Killed as the first of the second snapshot's packs lands (of about 28): a fixed sleep
    // lost the race once uploads got fast enough to finish within it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while archive.list(&packs).await.unwrap().len() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "no pack of the second snapshot was written"
        );
        assert!(
            !task.is_finished(),
            "the upload ended before any pack landed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    garage.stop();
    let err = task.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("object store"), "{err}");

    // Back up: the head still names the first snapshot, which restores whole; the second
    // manifest was never written.
    let garage = tokio::task::spawn_blocking(move || {
        garage.restart();
        garage
    })
    .await
    .unwrap();
    let head = archive.head("sbx-1").await.unwrap().unwrap();
    assert_eq!(head.snapshot, "s1");
    assert!(archive
        .get_small(&archive.manifest_path("sbx-1", "s2").unwrap())
        .await
        .unwrap()
        .is_none());
    restore_and_compare(&archive, keys, &m1, &snap, &base, &w.join("out")).await;
    drop(garage);
}
