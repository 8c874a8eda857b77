//! Copy-on-write file clones for the RAM file and the disk of a sandbox.
//!
//! Snapshots and restores copy multi-hundred-MiB files that are mostly unchanged or mostly
//! holes. On btrfs or XFS a reflink (`FICLONE`) shares every extent and costs milliseconds;
//! elsewhere this falls back to a sparse-aware copy that walks data extents with
//! `SEEK_DATA`/`SEEK_HOLE` and moves them with `copy_file_range`, so holes stay holes. The
//! destination is always a new file: nothing here overwrites.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::unistd::{lseek, Whence};

/// How a file was cloned, so callers can report whether the fast path was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneMethod {
    /// Extents shared with the source (`FICLONE`).
    Reflink,
    /// Data extents copied, holes preserved.
    SparseCopy,
    /// Not cloned: the file was already where it is used.
    InPlace,
}

/// Errors of file cloning.
#[derive(Debug, thiserror::Error)]
pub enum CowError {
    /// Opening, creating, reading or writing `path` failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> CowError + 'a {
    move |source| CowError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

nix::ioctl_write_int!(ficlone, 0x94, 9);

/// Clones `src` into the new file `dst` (which must not exist), preferring a reflink. On
/// failure the partial destination is removed.
pub fn clone_file(src: &Path, dst: &Path) -> Result<CloneMethod, CowError> {
    let source = File::open(src).map_err(io("opening", src))?;
    let target = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)
        .map_err(io("creating", dst))?;
    let result = clone_open(&source, &target, src, dst);
    if result.is_err() {
        let _ = std::fs::remove_file(dst);
    }
    result
}

fn clone_open(
    source: &File,
    target: &File,
    src: &Path,
    dst: &Path,
) -> Result<CloneMethod, CowError> {
    // SAFETY: both descriptors are open for the duration of the call (borrowed from live
    // `File`s), and FICLONE takes the source descriptor by value as its integer argument.
    match unsafe { ficlone(target.as_raw_fd(), source.as_raw_fd() as _) } {
        Ok(_) => return Ok(CloneMethod::Reflink),
        // Filesystems without reflinks, or source and destination on different filesystems.
        Err(Errno::EOPNOTSUPP | Errno::EXDEV | Errno::EINVAL | Errno::ENOTTY | Errno::ENOSYS) => {}
        Err(e) => return Err(io("cloning", src)(e.into())),
    }
    sparse_copy(source, target, src, dst)?;
    Ok(CloneMethod::SparseCopy)
}

/// Copies the data extents of `source` into `target` at the same offsets and sets the length,
/// leaving holes where the source has them.
fn sparse_copy(source: &File, target: &File, src: &Path, dst: &Path) -> Result<(), CowError> {
    let len = source.metadata().map_err(io("stat", src))?.len();
    let len =
        i64::try_from(len).map_err(|_| io("stat", src)(std::io::ErrorKind::InvalidData.into()))?;
    target.set_len(len as u64).map_err(io("sizing", dst))?;
    let mut offset: i64 = 0;
    while offset < len {
        let start = match lseek(source.as_raw_fd(), offset, Whence::SeekData) {
            Ok(o) => o,
            Err(Errno::ENXIO) => break, // only a hole remains
            // Filesystems without SEEK_DATA treat the whole file as data.
            Err(Errno::EINVAL) => offset,
            Err(e) => return Err(io("seeking", src)(e.into())),
        };
        let end = match lseek(source.as_raw_fd(), start, Whence::SeekHole) {
            Ok(o) => o.min(len),
            Err(Errno::EINVAL) => len,
            Err(e) => return Err(io("seeking", src)(e.into())),
        };
        copy_range(source, target, start, end, src, dst)?;
        offset = end;
    }
    Ok(())
}

fn copy_range(
    source: &File,
    target: &File,
    start: i64,
    end: i64,
    src: &Path,
    dst: &Path,
) -> Result<(), CowError> {
    let mut off_in = start;
    let mut off_out = start;
    while off_in < end {
        let chunk = usize::try_from(end - off_in)
            .unwrap_or(usize::MAX)
            .min(1 << 30);
        // SAFETY: both descriptors belong to live `File`s; the offset pointers point to local
        // i64s that outlive the call, which the kernel reads and advances.
        let n = unsafe {
            libc::copy_file_range(
                source.as_raw_fd(),
                &mut off_in,
                target.as_raw_fd(),
                &mut off_out,
                chunk,
                0,
            )
        };
        match if n < 0 { Err(Errno::last()) } else { Ok(n) } {
            Ok(0) => return Ok(()), // the source shrank under us; what exists is copied
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(Errno::EXDEV | Errno::ENOSYS | Errno::EOPNOTSUPP | Errno::EINVAL) => {
                return copy_range_slow(source, target, off_in, end, src, dst);
            }
            Err(e) => return Err(io("copying", src)(e.into())),
        }
    }
    Ok(())
}

/// Plain read/write for the rare kernels or filesystems where `copy_file_range` refuses.
fn copy_range_slow(
    mut source: &File,
    mut target: &File,
    start: i64,
    end: i64,
    src: &Path,
    dst: &Path,
) -> Result<(), CowError> {
    source
        .seek(SeekFrom::Start(start as u64))
        .map_err(io("seeking", src))?;
    target
        .seek(SeekFrom::Start(start as u64))
        .map_err(io("seeking", dst))?;
    let mut remaining = (end - start) as u64;
    let mut buf = vec![0u8; 1 << 20];
    while remaining > 0 {
        let want = buf.len().min(remaining as usize);
        let n = source.read(&mut buf[..want]).map_err(io("reading", src))?;
        if n == 0 {
            break;
        }
        target.write_all(&buf[..n]).map_err(io("writing", dst))?;
        remaining -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{FileExt, MetadataExt};

    #[test]
    fn sparse_file_keeps_data_and_holes() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let f = File::create(&src).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(&[7u8; 10000], 20 << 20).unwrap();
        f.write_all_at(b"tail", (64 << 20) - 4).unwrap();
        f.sync_all().unwrap();
        drop(f);

        let dst = dir.path().join("dst");
        let method = clone_file(&src, &dst).unwrap();
        let a = std::fs::read(&src).unwrap();
        let b = std::fs::read(&dst).unwrap();
        assert_eq!(a.len(), b.len());
        assert!(a == b, "contents differ");
        let meta = std::fs::metadata(&dst).unwrap();
        // 64 MiB apparent, a few blocks allocated: holes survived (or extents are shared).
        assert!(
            meta.blocks() * 512 < 8 << 20,
            "{method:?} allocated {} blocks",
            meta.blocks()
        );
    }

    #[test]
    fn empty_and_fully_dense_files() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty");
        File::create(&empty).unwrap();
        clone_file(&empty, &dir.path().join("empty2")).unwrap();
        assert_eq!(
            std::fs::metadata(dir.path().join("empty2")).unwrap().len(),
            0
        );

        let dense = dir.path().join("dense");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&dense, &data).unwrap();
        clone_file(&dense, &dir.path().join("dense2")).unwrap();
        assert!(std::fs::read(dir.path().join("dense2")).unwrap() == data);
    }

    #[test]
    fn never_overwrites_and_reports_missing_source() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        assert!(clone_file(&a, &b).is_err());
        assert_eq!(std::fs::read(&b).unwrap(), b"b");
        let err = clone_file(&dir.path().join("missing"), &dir.path().join("c")).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        assert!(!dir.path().join("c").exists());
    }
}
