//! The structured error every failing request carries: a machine-readable [`ErrorKind`] and a
//! human-readable message (which names the path or command involved). It owns the mapping from
//! OS errors to kinds and from kinds to HTTP status codes, so both ends classify alike.

use std::fmt;
use std::io;

use serde::{Deserialize, Serialize};

/// What went wrong, coarse enough for a caller to branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    InvalidArgument,
    PermissionDenied,
    ReadOnly,
    NotADirectory,
    IsADirectory,
    NotEmpty,
    TooLarge,
    NoSpace,
    Busy,
    SpawnFailed,
    Timeout,
    Closed,
    Protocol,
    Unsupported,
    /// A connection inside the guest was refused or could not be made (`POST /v1/tcp`).
    Unreachable,
    Internal,
    /// A kind this build does not know; newer daemons may add kinds.
    #[serde(other)]
    Unknown,
}

impl ErrorKind {
    /// The HTTP status the daemon answers with for this kind.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorKind::NotFound => 404,
            ErrorKind::AlreadyExists => 409,
            ErrorKind::InvalidArgument => 400,
            ErrorKind::PermissionDenied | ErrorKind::ReadOnly => 403,
            ErrorKind::NotADirectory | ErrorKind::IsADirectory | ErrorKind::NotEmpty => 409,
            ErrorKind::TooLarge => 413,
            ErrorKind::NoSpace => 507,
            ErrorKind::Busy => 503,
            ErrorKind::SpawnFailed => 422,
            ErrorKind::Timeout => 504,
            ErrorKind::Closed => 410,
            ErrorKind::Protocol => 400,
            ErrorKind::Unsupported => 501,
            ErrorKind::Unreachable => 502,
            ErrorKind::Internal | ErrorKind::Unknown => 500,
        }
    }

    /// Best guess at a kind from a bare HTTP status, for answers without a JSON error body.
    pub fn from_http_status(status: u16) -> ErrorKind {
        match status {
            400 => ErrorKind::InvalidArgument,
            403 => ErrorKind::PermissionDenied,
            404 | 405 => ErrorKind::NotFound,
            409 => ErrorKind::AlreadyExists,
            410 => ErrorKind::Closed,
            413 => ErrorKind::TooLarge,
            422 => ErrorKind::SpawnFailed,
            501 => ErrorKind::Unsupported,
            502 => ErrorKind::Unreachable,
            503 => ErrorKind::Busy,
            504 => ErrorKind::Timeout,
            507 => ErrorKind::NoSpace,
            _ => ErrorKind::Internal,
        }
    }

    /// Classifies a raw errno value.
    pub fn from_errno(errno: i32) -> ErrorKind {
        match errno {
            libc_errno::ENOENT | libc_errno::ESRCH => ErrorKind::NotFound,
            libc_errno::EEXIST => ErrorKind::AlreadyExists,
            libc_errno::EINVAL | libc_errno::ENAMETOOLONG | libc_errno::ELOOP => {
                ErrorKind::InvalidArgument
            }
            libc_errno::EACCES | libc_errno::EPERM => ErrorKind::PermissionDenied,
            libc_errno::EROFS | libc_errno::ETXTBSY => ErrorKind::ReadOnly,
            libc_errno::ENOTDIR => ErrorKind::NotADirectory,
            libc_errno::EISDIR => ErrorKind::IsADirectory,
            libc_errno::ENOTEMPTY => ErrorKind::NotEmpty,
            libc_errno::EFBIG | libc_errno::E2BIG => ErrorKind::TooLarge,
            libc_errno::ENOSPC | libc_errno::EDQUOT => ErrorKind::NoSpace,
            libc_errno::EBUSY | libc_errno::EAGAIN | libc_errno::EMFILE | libc_errno::ENFILE => {
                ErrorKind::Busy
            }
            libc_errno::ETIMEDOUT => ErrorKind::Timeout,
            libc_errno::ECONNREFUSED | libc_errno::EHOSTUNREACH | libc_errno::ENETUNREACH => {
                ErrorKind::Unreachable
            }
            libc_errno::EPIPE | libc_errno::ECONNRESET => ErrorKind::Closed,
            libc_errno::ENOSYS | libc_errno::EOPNOTSUPP => ErrorKind::Unsupported,
            _ => ErrorKind::Internal,
        }
    }

    /// Classifies an I/O error, preferring its errno when it has one.
    pub fn from_io(err: &io::Error) -> ErrorKind {
        if let Some(errno) = err.raw_os_error() {
            return ErrorKind::from_errno(errno);
        }
        match err.kind() {
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => ErrorKind::InvalidArgument,
            io::ErrorKind::TimedOut => ErrorKind::Timeout,
            io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof => ErrorKind::Closed,
            io::ErrorKind::Unsupported => ErrorKind::Unsupported,
            io::ErrorKind::ConnectionRefused => ErrorKind::Unreachable,
            _ => ErrorKind::Internal,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::ReadOnly => "read_only",
            ErrorKind::NotADirectory => "not_a_directory",
            ErrorKind::IsADirectory => "is_a_directory",
            ErrorKind::NotEmpty => "not_empty",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::NoSpace => "no_space",
            ErrorKind::Busy => "busy",
            ErrorKind::SpawnFailed => "spawn_failed",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Closed => "closed",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::Internal => "internal",
            ErrorKind::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The JSON error body: `{"kind": "...", "message": "..."}`. Also sent as an `Error` frame when
/// a streamed response fails after its headers went out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct ProtoError {
    pub kind: ErrorKind,
    pub message: String,
}

impl ProtoError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ProtoError {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ProtoError::new(ErrorKind::InvalidArgument, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ProtoError::new(ErrorKind::Internal, message)
    }

    /// An I/O failure with context (usually `"<operation> <path>"`) in front of the OS text.
    pub fn io(context: impl fmt::Display, err: &io::Error) -> Self {
        ProtoError::new(ErrorKind::from_io(err), format!("{context}: {err}"))
    }
}

/// The errno values used above. Spelled out here because this crate has no `libc` dependency
/// and these numbers are fixed by the Linux ABI on every architecture the guest runs on.
mod libc_errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const ESRCH: i32 = 3;
    pub const E2BIG: i32 = 7;
    pub const EAGAIN: i32 = 11;
    pub const EACCES: i32 = 13;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
    pub const ENOTDIR: i32 = 20;
    pub const EISDIR: i32 = 21;
    pub const EINVAL: i32 = 22;
    pub const ENFILE: i32 = 23;
    pub const EMFILE: i32 = 24;
    pub const ETXTBSY: i32 = 26;
    pub const EFBIG: i32 = 27;
    pub const ENOSPC: i32 = 28;
    pub const EROFS: i32 = 30;
    pub const EPIPE: i32 = 32;
    pub const ENAMETOOLONG: i32 = 36;
    pub const ENOSYS: i32 = 38;
    pub const ENOTEMPTY: i32 = 39;
    pub const ELOOP: i32 = 40;
    pub const EOPNOTSUPP: i32 = 95;
    pub const ECONNRESET: i32 = 104;
    pub const ENETUNREACH: i32 = 101;
    pub const ETIMEDOUT: i32 = 110;
    pub const ECONNREFUSED: i32 = 111;
    pub const EHOSTUNREACH: i32 = 113;
    pub const EDQUOT: i32 = 122;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_map_to_kinds() {
        let e = io::Error::from_raw_os_error(2);
        assert_eq!(ErrorKind::from_io(&e), ErrorKind::NotFound);
        let e = io::Error::from_raw_os_error(30);
        assert_eq!(ErrorKind::from_io(&e), ErrorKind::ReadOnly);
        let e = io::Error::from_raw_os_error(39);
        assert_eq!(ErrorKind::from_io(&e), ErrorKind::NotEmpty);
        let e = io::Error::from_raw_os_error(111);
        assert_eq!(ErrorKind::from_io(&e), ErrorKind::Unreachable);
        assert_eq!(ErrorKind::from_http_status(502), ErrorKind::Unreachable);
        let e = io::Error::new(io::ErrorKind::PermissionDenied, "x");
        assert_eq!(ErrorKind::from_io(&e), ErrorKind::PermissionDenied);
        assert_eq!(
            ErrorKind::from_io(&io::Error::other("x")),
            ErrorKind::Internal
        );
    }

    #[test]
    fn error_json_shape_is_stable() {
        let e = ProtoError::new(ErrorKind::NotADirectory, "/a/b");
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(json, r#"{"kind":"not_a_directory","message":"/a/b"}"#);
        let back: ProtoError = serde_json::from_str(&json).unwrap();
        assert_eq!(back, e);
        let unknown: ProtoError =
            serde_json::from_str(r#"{"kind":"from_the_future","message":"m"}"#).unwrap();
        assert_eq!(unknown.kind, ErrorKind::Unknown);
    }

    #[test]
    fn every_kind_serializes_as_its_name() {
        for kind in [
            ErrorKind::NotFound,
            ErrorKind::AlreadyExists,
            ErrorKind::InvalidArgument,
            ErrorKind::PermissionDenied,
            ErrorKind::ReadOnly,
            ErrorKind::NotADirectory,
            ErrorKind::IsADirectory,
            ErrorKind::NotEmpty,
            ErrorKind::TooLarge,
            ErrorKind::NoSpace,
            ErrorKind::Busy,
            ErrorKind::SpawnFailed,
            ErrorKind::Timeout,
            ErrorKind::Closed,
            ErrorKind::Protocol,
            ErrorKind::Unsupported,
            ErrorKind::Unreachable,
            ErrorKind::Internal,
        ] {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert!(kind.http_status() >= 400);
        }
    }
}
