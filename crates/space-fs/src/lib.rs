//! Durable replacement of small files: sandbox and VM records, manifests, the guest's CA
//! bundle.
//!
//! [`write_atomic`] writes the new content to a temporary file in the same directory, syncs
//! it, renames it over the target and syncs the directory. A reader sees the old content or
//! the new one, never a mix; once it returns, a crash or power loss keeps the new one. The
//! temporary file is named `.<name>.<unique>.tmp`, so writers of the same file never share
//! one, and a crash mid-write leaves only a dot file ending in `.tmp` for recovery to sweep.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A failed step of [`write_atomic`].
#[derive(Debug)]
pub struct WriteError {
    /// What was being done: `creating`, `writing`, `syncing`, `renaming`, `syncing directory`.
    pub op: &'static str,
    /// The file (or directory) involved.
    pub path: PathBuf,
    /// The underlying error.
    pub source: io::Error,
}

impl fmt::Display for WriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.op, self.path.display())
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl From<WriteError> for io::Error {
    fn from(e: WriteError) -> io::Error {
        io::Error::new(e.source.kind(), format!("{e}: {}", e.source))
    }
}

/// Whether `name` is a temporary file [`write_atomic`] may have left behind.
pub fn is_leftover(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

/// Replaces `path` with `bytes` durably (see the crate docs); a new file gets `mode`. The
/// directory must exist. On error `path` keeps its old content and no temporary file stays.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<(), WriteError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.{}-{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let fail = |op: &'static str, p: &Path| {
        let path = p.to_owned();
        move |source| WriteError { op, path, source }
    };
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(fail("creating", &tmp))?;
        f.write_all(bytes).map_err(fail("writing", &tmp))?;
        f.sync_all().map_err(fail("syncing", &tmp))?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(fail("renaming", &tmp))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail("syncing directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn replaces_the_content_with_the_mode_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record.json");
        write_atomic(&path, b"one", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"one");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        write_atomic(&path, b"two, longer", 0o600).unwrap();
        write_atomic(&path, b"3", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"3");
        assert_eq!(entries(dir.path()), ["record.json"]);
    }

    #[test]
    fn a_failed_write_keeps_the_old_content_and_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("target");
        write_atomic(&path, b"old", 0o644).unwrap();
        // A directory in the way of the rename: the write fails at the rename.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("inside"), b"x").unwrap();
        let e = write_atomic(&blocked, b"new", 0o644).unwrap_err();
        assert_eq!(e.op, "renaming", "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(entries(dir.path()), ["blocked", "target"]);
        // A missing directory fails at the creation and says where.
        let e = write_atomic(&dir.path().join("no/such/file"), b"x", 0o644).unwrap_err();
        assert_eq!(e.op, "creating");
        assert!(e.path.starts_with(dir.path().join("no/such")), "{e}");
    }

    #[test]
    fn concurrent_writers_of_one_file_never_share_a_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shared");
        std::thread::scope(|s| {
            for i in 0..8u8 {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..50 {
                        write_atomic(path, &[i; 4096], 0o600).unwrap();
                    }
                });
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4096);
        assert!(bytes.iter().all(|b| *b == bytes[0]), "a mix of writers");
        assert_eq!(entries(dir.path()), ["shared"]);
    }

    #[test]
    fn leftovers_are_recognised() {
        assert!(is_leftover(".record.json.12-3.tmp"));
        assert!(!is_leftover("record.json"));
        assert!(!is_leftover(".hidden"));
    }
}
