//! Thin wrappers over the few system calls the daemon makes on raw descriptors (ports, PTY
//! masters), where std and tokio have no safe equivalent.

use std::io;
use std::os::fd::{OwnedFd, RawFd};

use tokio::io::unix::AsyncFd;

/// `read(2)` into `buf`.
pub fn raw_read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid, writable slice of `buf.len()` bytes for the whole call; an
    // invalid `fd` makes the call fail with EBADF, nothing worse.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `write(2)` from `buf`.
pub fn raw_write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is a valid, readable slice of `buf.len()` bytes for the whole call; an
    // invalid `fd` makes the call fail with EBADF, nothing worse.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Registers an owned (non-blocking) descriptor with the tokio reactor.
pub fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an `OwnedFd` is open for as long as it lives, it lives exactly as long as the
    // `AsyncFd` that owns it, and its `as_raw_fd` always returns the same descriptor.
    unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)
}
