//! Test support: snapshot-like files, stores (a local directory, and Garage, a real S3 server,
//! started on loopback from the binary `scripts/garage.sh` installs).

#![allow(dead_code)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use space_archive::keys::NoAudit;
pub use space_archive::testing::{noise, Garage};
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
