//! Route paths shared by the daemon's router and the client, so the two cannot drift apart.
//!
//! Query parameters are percent-encoded with [`crate::query`]; every path parameter is an
//! absolute guest path.

pub const HEALTH: &str = "/v1/health";
pub const EXEC: &str = "/v1/exec";
pub const PROCESSES: &str = "/v1/processes";
/// Prefix of `POST /v1/processes/{pid}/signal`.
pub const PROCESSES_PREFIX: &str = "/v1/processes/";
pub const SIGNAL_SUFFIX: &str = "/signal";
pub const PTY: &str = "/v1/pty";
pub const FILES: &str = "/v1/files";
pub const STAT: &str = "/v1/stat";
pub const LIST: &str = "/v1/list";
pub const MKDIR: &str = "/v1/mkdir";
pub const REMOVE: &str = "/v1/remove";
pub const RENAME: &str = "/v1/rename";
pub const CHMOD: &str = "/v1/chmod";
pub const WATCH: &str = "/v1/watch";
pub const IDENTITY: &str = "/v1/identity";
pub const FS_GROW: &str = "/v1/fs/grow";
pub const SHUTDOWN: &str = "/v1/shutdown";
/// `POST /v1/tcp?port=N`: a full-duplex byte stream to `127.0.0.1:N` inside the guest.
pub const TCP: &str = "/v1/tcp";

/// Path and query of the TCP route for one guest port.
pub fn tcp_path(port: u16) -> String {
    format!("{TCP}?port={port}")
}

/// Path of the signal route for one process.
pub fn signal_path(pid: u32) -> String {
    format!("{PROCESSES_PREFIX}{pid}{SIGNAL_SUFFIX}")
}

/// Parses the pid out of a `/v1/processes/{pid}/signal` path; `None` if it is not one.
pub fn parse_signal_path(path: &str) -> Option<u32> {
    let rest = path.strip_prefix(PROCESSES_PREFIX)?;
    let pid = rest.strip_suffix(SIGNAL_SUFFIX)?;
    if pid.is_empty() || pid.len() > 10 || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_path_round_trips() {
        assert_eq!(parse_signal_path(&signal_path(42)), Some(42));
        assert_eq!(parse_signal_path("/v1/processes//signal"), None);
        assert_eq!(parse_signal_path("/v1/processes/+4/signal"), None);
        assert_eq!(parse_signal_path("/v1/processes/99999999999/signal"), None);
        assert_eq!(parse_signal_path("/v1/processes/4/kill"), None);
    }
}
