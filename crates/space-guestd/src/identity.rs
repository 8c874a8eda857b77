//! `POST /v1/identity`: who the guest is after a boot or a restore.
//!
//! Every clone of a snapshot wakes up with the same RNG state, the clock of the moment the
//! snapshot was taken and the template's hostname. The host fixes all three here before any
//! user code runs: the entropy is mixed into the kernel pool, credited, and the CRNG is told to
//! reseed now rather than at its next scheduled reseed; the clock is set; the hostname is set.
//! The sandbox id and default environment are recorded for health and later execs. The
//! deployment's CA certificate, when sent, joins the trust store ([`crate::ca`]). Last, the
//! egress connection is dropped so that the next proxied request synchronises with the
//! (possibly new) host: after a restore, the old connection is dead.
//!
//! Outside a VM (not PID 1, no `--system`) the daemon only records the identity: a test must
//! never change the host's clock, hostname or trust store.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use http::Request;
use hyper::body::Incoming;
use nix::sys::time::TimeSpec;
use nix::time::{clock_settime, ClockId};
use space_proto::limits::{MAX_ENTROPY, MAX_HOSTNAME};
use space_proto::{ErrorKind, Identity, IdentityApplied, ProtoError};

use crate::body::{ok_json, read_json, HandlerResult};
use crate::daemon::{validate_env, Daemon};

/// `_IOW('R', 0x03, int[2])`: add entropy to the input pool and credit it.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
/// `_IO('R', 0x07)`: reseed the CRNG from the input pool now.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Errors of applying an identity to the system.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("write /dev/urandom")]
    Urandom(#[source] io::Error),
    #[error("RNDADDENTROPY")]
    AddEntropy(#[source] io::Error),
    #[error("RNDRESEEDCRNG")]
    Reseed(#[source] io::Error),
    #[error("clock_settime")]
    Clock(#[source] nix::Error),
    #[error("sethostname")]
    Hostname(#[source] nix::Error),
    #[error("install the CA certificate")]
    Ca(#[source] io::Error),
}

/// `struct rand_pool_info` with room for the largest entropy we accept.
#[repr(C)]
struct RandPoolInfo {
    entropy_count: libc::c_int,
    buf_size: libc::c_int,
    buf: [u8; MAX_ENTROPY],
}

/// Mixes `entropy` into the kernel pool, credits it, and reseeds the CRNG.
pub fn reseed(entropy: &[u8]) -> Result<(), IdentityError> {
    let mut f = OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map_err(IdentityError::Urandom)?;
    f.write_all(entropy).map_err(IdentityError::Urandom)?;
    let mut info = Box::new(RandPoolInfo {
        entropy_count: (entropy.len() * 8) as libc::c_int,
        buf_size: entropy.len() as libc::c_int,
        buf: [0; MAX_ENTROPY],
    });
    info.buf[..entropy.len()].copy_from_slice(entropy);
    // SAFETY: RNDADDENTROPY reads a `rand_pool_info` header and then `buf_size` bytes; the
    // struct is #[repr(C)] with that layout and `buf_size` is at most the array's length
    // (the caller bounds `entropy` by MAX_ENTROPY). The fd is open for the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), RNDADDENTROPY, &*info as *const RandPoolInfo) };
    if r < 0 {
        return Err(IdentityError::AddEntropy(io::Error::last_os_error()));
    }
    // SAFETY: RNDRESEEDCRNG takes no argument; the fd is open for the call.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), RNDRESEEDCRNG) };
    if r < 0 {
        return Err(IdentityError::Reseed(io::Error::last_os_error()));
    }
    Ok(())
}

fn validate_hostname(name: &str) -> Result<(), ProtoError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_HOSTNAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !name.starts_with(['-', '.']);
    if ok {
        Ok(())
    } else {
        Err(ProtoError::invalid(format!(
            "{name:?} is not a valid hostname"
        )))
    }
}

fn validate(id: &Identity) -> Result<(), ProtoError> {
    if id.sandbox_id.is_empty() || id.sandbox_id.len() > 256 || id.sandbox_id.contains('\0') {
        return Err(ProtoError::invalid("sandbox_id must be 1 to 256 bytes"));
    }
    if id.entropy.len() > MAX_ENTROPY {
        return Err(ProtoError::new(
            ErrorKind::TooLarge,
            format!(
                "{} entropy bytes; the limit is {MAX_ENTROPY}",
                id.entropy.len()
            ),
        ));
    }
    if let Some(h) = &id.hostname {
        validate_hostname(h)?;
    }
    validate_env(&id.env)?;
    if let Some(u) = &id.user {
        if u.is_empty() || u.len() > 256 || u.contains(['\0', '/']) {
            return Err(ProtoError::invalid(
                "user must be 1 to 256 bytes without NUL or /",
            ));
        }
    }
    if let Some(w) = &id.workdir {
        space_proto::query::validate_path(w)?;
    }
    if let Some(pem) = &id.ca_pem {
        crate::ca::validate(pem)?;
    }
    Ok(())
}

fn apply(id: &Identity) -> Result<bool, IdentityError> {
    let mut reseeded = false;
    if !id.entropy.is_empty() {
        reseed(&id.entropy)?;
        reseeded = true;
    }
    if let Some(ns) = id.time_unix_ns {
        let ts = TimeSpec::new(
            (ns / 1_000_000_000) as libc::time_t,
            (ns % 1_000_000_000) as libc::c_long,
        );
        clock_settime(ClockId::CLOCK_REALTIME, ts).map_err(IdentityError::Clock)?;
    }
    if let Some(h) = &id.hostname {
        nix::unistd::sethostname(h).map_err(IdentityError::Hostname)?;
    }
    if let Some(pem) = &id.ca_pem {
        // Validated before; normalised here.
        if let Ok(pem) = crate::ca::validate(pem) {
            crate::ca::install(std::path::Path::new("/"), &pem).map_err(IdentityError::Ca)?;
        }
    }
    Ok(reseeded)
}

pub async fn identity(d: Arc<Daemon>, req: Request<Incoming>) -> HandlerResult {
    let id: Identity = read_json(req.into_body()).await?;
    validate(&id)?;
    let mut reseeded = false;
    if d.system {
        let id2 = id.clone();
        reseeded = tokio::task::spawn_blocking(move || apply(&id2))
            .await
            .map_err(|e| ProtoError::internal(format!("identity task failed: {e}")))?
            .map_err(|e| {
                let errno = match &e {
                    IdentityError::Urandom(io)
                    | IdentityError::AddEntropy(io)
                    | IdentityError::Reseed(io)
                    | IdentityError::Ca(io) => io.raw_os_error(),
                    IdentityError::Clock(n) | IdentityError::Hostname(n) => Some(*n as i32),
                };
                let source = std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default();
                ProtoError::new(
                    errno
                        .map(ErrorKind::from_errno)
                        .unwrap_or(ErrorKind::Internal),
                    format!("{e}: {source}"),
                )
            })?;
    } else {
        tracing::info!(
            sandbox_id = %id.sandbox_id,
            "identity recorded; clock, hostname and RNG left alone (not PID 1)"
        );
    }
    if d.system && id.ca_pem.is_some() {
        d.ca_installed
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }
    {
        let mut state = d.identity();
        state.sandbox_id = Some(id.sandbox_id.clone());
        state.hostname = id.hostname.clone();
        state.env = id.env.clone();
        state.user = id.user.clone();
        state.workdir = id.workdir.clone();
    }
    if let Some(egress) = d.egress.get() {
        egress.reset().await;
    }
    // A restored or forked guest: whoever held its volume requests is gone.
    d.volumes.release();
    ok_json(&IdentityApplied {
        system_changed: d.system,
        reseeded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_encoding() {
        // _IOC(dir, type, nr, size) = dir << 30 | size << 16 | type << 8 | nr
        let ioc = |dir: libc::c_ulong, ty: u8, nr: u8, size: libc::c_ulong| {
            (dir << 30) | (size << 16) | (libc::c_ulong::from(ty) << 8) | libc::c_ulong::from(nr)
        };
        assert_eq!(RNDADDENTROPY, ioc(1, b'R', 3, 8));
        assert_eq!(RNDRESEEDCRNG, ioc(0, b'R', 7, 0));
    }

    #[test]
    fn hostnames() {
        assert!(validate_hostname("sandbox-1.example").is_ok());
        assert!(validate_hostname("").is_err());
        assert!(validate_hostname("-x").is_err());
        assert!(validate_hostname("a b").is_err());
        assert!(validate_hostname(&"a".repeat(65)).is_err());
    }
}
