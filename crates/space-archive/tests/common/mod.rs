//! Test support: snapshot-like files, stores (a local directory, and Garage, a real S3 server,
//! started on loopback from the binary `scripts/garage.sh` installs).

#![allow(dead_code)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use space_archive::fetch::CloneFile;
use space_archive::keys::NoAudit;
use space_archive::manifest::BaseRef;
pub use space_archive::testing::{noise, Garage};
use space_archive::upload::{SourceFile, UploadSpec, DEFAULT_CHUNK_SIZE};
use space_archive::{Archive, Keyring, LocalMaster, MasterKey};

pub const MIB: u64 = 1 << 20;

/// A sparse file of `size` with `(offset, bytes)` written into it.
pub fn write_file(path: &Path, size: u64, parts: &[(u64, &[u8])]) {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .unwrap();
    f.set_len(size).unwrap();
    for (off, bytes) in parts {
        f.write_all_at(bytes, *off).unwrap();
    }
    f.sync_all().unwrap();
}

pub fn sha(path: &Path) -> String {
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().to_hex().to_string()
}

/// A keyring over `archive` with one local master key in `dir`.
pub fn keyring(archive: &Archive, dir: &Path) -> (Keyring, Arc<dyn MasterKey>) {
    let m: Arc<dyn MasterKey> =
        Arc::new(LocalMaster::open_or_create(&dir.join("master.key")).unwrap());
    (
        Keyring::new(
            archive.clone(),
            Arc::new(m.clone()),
            Arc::new(NoAudit),
            Duration::from_secs(60),
        ),
        m,
    )
}

/// Every regular file under `dir`.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.is_file() {
                out.push(p);
            }
        }
    }
    out
}

/// Whether any file under `dir` contains `needle`.
pub fn any_file_contains(dir: &Path, needle: &[u8]) -> Option<PathBuf> {
    files_under(dir).into_iter().find(|p| {
        std::fs::read(p)
            .map(|b| b.windows(needle.len()).any(|w| w == needle))
            .unwrap_or(false)
    })
}

pub fn copy_clone() -> CloneFile {
    Arc::new(|src: &Path, dst: &Path| std::fs::copy(src, dst).map(|_| ()))
}

/// A snapshot directory: `mem` (8 MiB: 2 MiB of noise, then the base's bytes, then zeros),
/// `rootfs.ext4` (32 MiB sparse, two written regions), `state` (small).
pub fn make_snapshot(dir: &Path, base: &Path, seed: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::create_dir_all(base).unwrap();
    let base_part = noise(1000, 4 * MIB as usize);
    write_file(&base.join("mem"), 8 * MIB, &[(2 * MIB, &base_part)]);
    write_file(&base.join("rootfs.ext4"), 32 * MIB, &[]);
    let mine = noise(seed, 2 * MIB as usize);
    write_file(
        &dir.join("mem"),
        8 * MIB,
        &[(0, &mine), (2 * MIB, &base_part)],
    );
    let d1 = noise(seed + 1, MIB as usize);
    let d2 = b"hello disk".repeat(50_000);
    write_file(
        &dir.join("rootfs.ext4"),
        32 * MIB,
        &[(MIB, &d1), (20 * MIB, &d2)],
    );
    write_file(&dir.join("state"), 60_000, &[(0, &noise(seed + 2, 60_000))]);
}

pub fn spec(
    sandbox: &str,
    snapshot: &str,
    lineage: &str,
    dir: &Path,
    base: &Path,
    archive: &Archive,
) -> UploadSpec {
    UploadSpec {
        tenant: "alice".into(),
        lineage: lineage.into(),
        sandbox: sandbox.into(),
        snapshot: snapshot.into(),
        manifest_path: archive.manifest_path(sandbox, snapshot).unwrap(),
        chunk_size: DEFAULT_CHUNK_SIZE,
        pack_target: 4 << 20,
        base: Some(BaseRef {
            name: "tpl".into(),
            version: "v1".into(),
            manifest_hash: "none".into(),
        }),
        host: None,
        record: serde_json::json!({"id": sandbox}),
        files: ["mem", "rootfs.ext4", "state"]
            .iter()
            .map(|n| SourceFile {
                name: n.to_string(),
                path: dir.join(n),
                base: (*n != "state").then(|| (n.to_string(), base.join(n))),
                unchanged: None,
            })
            .collect(),
        previous: None,
        prefetch: Vec::new(),
    }
}
