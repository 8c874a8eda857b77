//! The per-sandbox log files QEMU writes: the guest's serial console (`console.log`) and QEMU's
//! own stderr (`qemu.log`).
//!
//! Both are fed by the guest (a console is the guest's to write; QEMU prints warnings the guest
//! can provoke), so both are bounded: once a file passes its cap, its last bytes move to
//! `<name>.1` and the file restarts empty. QEMU opens both in append mode, so its writes land at
//! the new end after a truncation. Reading a tail is bounded too, and the text is sanitized
//! before it goes into an error message or a log line: no terminal escapes from the guest.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Size at which a log file is rotated.
pub const LOG_CAP: u64 = 4 << 20;

/// Bytes kept from a log file when it rotates, and the largest tail [`tail`] returns.
pub const MAX_TAIL: usize = 64 << 10;

/// The rotated copy of `path`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// The last `max` bytes of the log at `path` (continuing into its rotated copy when the
/// current file is shorter), sanitized for display. A missing or unreadable file reads as
/// empty: this feeds error messages, and must not itself fail.
pub fn tail(path: &Path, max: usize) -> String {
    sanitize(&raw_tail(path, max.min(MAX_TAIL)).unwrap_or_default())
}

/// The last `max` bytes of the log at `path` as written (the guest's bytes, not sanitized),
/// continuing into its rotated copy when the current file is shorter: right after a rotation
/// the current file holds little. A missing file reads as empty; other errors are answered.
pub fn raw_tail(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    let mut bytes = read_tail(path, max)?;
    if bytes.len() < max {
        let mut older = read_tail(&rotated(path), max - bytes.len())?;
        older.extend_from_slice(&bytes);
        bytes = older;
    }
    Ok(bytes)
}

/// The last `max` bytes of one file; a missing one reads as empty.
fn read_tail(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len();
    let start = len.saturating_sub(max as u64);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    f.take(max as u64).read_to_end(&mut buf)?;
    Ok(buf)
}

/// Makes guest bytes safe to print: invalid UTF-8 and control characters other than newline
/// and tab become U+FFFD, carriage returns disappear.
pub fn sanitize(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .filter(|&c| c != '\r')
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect()
}

/// Rotates `path` when it is larger than `cap`. Returns whether it did.
pub fn rotate_if_large(path: &Path, cap: u64) -> std::io::Result<bool> {
    let len = match std::fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= cap {
        return Ok(false);
    }
    let keep = read_tail(path, MAX_TAIL)?;
    let old = rotated(path);
    let mut tmp = old.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, &keep)?;
    std::fs::rename(&tmp, &old)?;
    // Whatever QEMU wrote between the read and this truncation is lost; the cap matters more.
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .set_len(0)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn sanitizes_escapes_and_bad_utf8() {
        assert_eq!(
            sanitize(b"ok\r\n\x1b[31mred\xff\tx"),
            "ok\n\u{fffd}[31mred\u{fffd}\tx"
        );
    }

    #[test]
    fn tail_is_bounded_and_spans_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("console.log");
        assert_eq!(tail(&log, 100), "");

        std::fs::write(&log, "0123456789").unwrap();
        assert_eq!(tail(&log, 4), "6789");
        assert_eq!(tail(&log, usize::MAX), "0123456789");

        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(&vec![b'a'; 5000]).unwrap();
        assert!(!rotate_if_large(&log, 10_000).unwrap());
        assert!(rotate_if_large(&log, 1000).unwrap());
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
        // An append-mode writer keeps writing at the new end.
        f.write_all(b"new").unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"new");
        assert_eq!(tail(&log, 6), "aaanew");
        assert_eq!(tail(&log, 100_000).len(), 5013);
        assert!(!rotate_if_large(&dir.path().join("missing"), 1).unwrap());
        // The raw tail is the bytes as written, not capped at MAX_TAIL.
        assert_eq!(raw_tail(&log, 6).unwrap(), b"aaanew");
        std::fs::write(&log, vec![0x1bu8; MAX_TAIL + 10]).unwrap();
        assert_eq!(raw_tail(&log, MAX_TAIL + 5).unwrap().len(), MAX_TAIL + 5);
        assert_eq!(raw_tail(&dir.path().join("missing"), 10).unwrap(), b"");
        assert!(
            raw_tail(dir.path(), 10).is_err(),
            "a directory is not a log"
        );
    }
}
