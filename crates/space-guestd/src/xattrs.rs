//! Extended attributes in the `user.` namespace: read for a stat, set by a write.
//!
//! Only names under `user.` are read or written, and only values that are UTF-8; at most
//! `MAX_XATTRS` are reported, each at most `MAX_XATTR_VALUE` bytes, so a file that carries a
//! great many (or large binary ones) cannot make a stat large.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use space_proto::limits::{MAX_XATTRS, MAX_XATTR_VALUE};

/// Largest name list read (the kernel's own limit is 64 KiB).
const MAX_LIST: usize = 64 * 1024;

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The `user.` names that `list` writes into a buffer (none where the file system keeps no
/// extended attributes).
fn names(list: impl Fn(&mut [u8]) -> isize) -> io::Result<Vec<Vec<u8>>> {
    let mut buf = vec![0u8; 1024];
    loop {
        let n = list(&mut buf);
        if n >= 0 {
            buf.truncate(n as usize);
            break;
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ERANGE) if buf.len() < MAX_LIST => buf.resize(MAX_LIST, 0),
            Some(libc::ENOTSUP) => return Ok(Vec::new()),
            _ => return Err(e),
        }
    }
    Ok(buf
        .split(|&b| b == 0)
        .filter(|n| n.starts_with(b"user.") && n.len() > 5)
        .map(<[u8]>::to_vec)
        .collect())
}

/// The `user.` attributes of `path` itself (a final symlink is not followed) whose values
/// fit in `max_value` bytes, as bytes.
fn raw(path: &Path, max_value: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Ok(c) = c_path(path) else {
        return Vec::new();
    };
    let listed = names(|buf| {
        // SAFETY: `c` is a NUL-terminated path and `buf` is valid for `buf.len()` bytes.
        unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }
    });
    let mut out = Vec::new();
    let mut value = vec![0u8; max_value];
    for name in listed.unwrap_or_default() {
        let Ok(cname) = CString::new(name.clone()) else {
            continue;
        };
        // SAFETY: both strings are NUL-terminated and `value` is valid for its length.
        let n = unsafe {
            libc::lgetxattr(
                c.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if n >= 0 {
            out.push((name, value[..n as usize].to_vec()));
        }
    }
    out
}

/// The `user.` attributes of `path` itself that a stat reports: UTF-8 values of at most
/// `MAX_XATTR_VALUE` bytes, the first `MAX_XATTRS` by name.
pub fn read(path: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, value) in raw(path, MAX_XATTR_VALUE) {
        if let (Ok(name), Ok(value)) = (String::from_utf8(name), String::from_utf8(value)) {
            out.insert(name, value);
        }
    }
    while out.len() > MAX_XATTRS {
        out.pop_last();
    }
    out
}

/// Sets `name` to `value` on an open file.
pub fn set(file: &File, name: &[u8], value: &[u8]) -> io::Result<()> {
    let cname = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: the descriptor is open for the call, `cname` is NUL-terminated and `value` is
    // valid for its length.
    let rc = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            cname.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Copies every `user.` attribute of `from` (values of any size the kernel allows) onto `to`,
/// but those whose names start with `except`: what a file keeps when a write replaces it.
pub fn copy(from: &Path, to: &File, except: Option<&str>) -> io::Result<()> {
    for (name, value) in raw(from, MAX_LIST) {
        if except.is_some_and(|p| name.starts_with(p.as_bytes())) {
            continue;
        }
        set(to, &name, &value)?;
    }
    Ok(())
}

/// Removes the `user.` attributes of an open file whose names start with `prefix`.
pub fn remove_prefixed(file: &File, prefix: &str) -> io::Result<()> {
    let fd = file.as_raw_fd();
    let listed = names(|buf| {
        // SAFETY: `fd` is open for the call and `buf` is valid for `buf.len()` bytes.
        unsafe { libc::flistxattr(fd, buf.as_mut_ptr().cast(), buf.len()) }
    })?;
    for name in listed.iter().filter(|n| n.starts_with(prefix.as_bytes())) {
        let cname =
            CString::new(name.clone()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: `fd` is open for the call and `cname` is NUL-terminated.
        if unsafe { libc::fremovexattr(fd, cname.as_ptr()) } < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENODATA) {
                return Err(e);
            }
        }
    }
    Ok(())
}
