//! Route paths shared by the daemon's router and the client, so the two cannot drift apart.
//!
//! Query parameters are percent-encoded with [`crate::query`]; every path parameter is an
//! absolute guest path.

pub const HEALTH: &str = "/v1/health";
pub const EXEC: &str = "/v1/exec";
pub const PROCESSES: &str = "/v1/processes";
/// Prefix of the routes of one process, `/v1/processes/{pid}/{action}`.
pub const PROCESSES_PREFIX: &str = "/v1/processes/";
pub const SIGNAL_SUFFIX: &str = "/signal";
/// `GET /v1/user?name=N`: one account of `/etc/passwd`.
pub const USER: &str = "/v1/user";
/// `POST /v1/watchers` makes a buffered watch; `GET /v1/watchers/{id}` takes its events,
/// `DELETE /v1/watchers/{id}` ends it.
pub const WATCHERS: &str = "/v1/watchers";
/// Prefix of the routes of one buffered watch.
pub const WATCHERS_PREFIX: &str = "/v1/watchers/";
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
/// `POST`: writes every file system's dirty data out (`sync(2)`), whatever the image holds.
pub const SYNC: &str = "/v1/sync";
/// `POST /v1/volumes/mount`: mount a volume of the sandbox ([`crate::volume::MountRequest`]).
pub const VOLUMES_MOUNT: &str = "/v1/volumes/mount";
/// `POST /v1/volumes/quiesce`: hold or let go the guest's volume requests
/// ([`crate::volume::QuiesceRequest`]).
pub const VOLUMES_QUIESCE: &str = "/v1/volumes/quiesce";
/// `GET /v1/stats`: the guest's CPU counters, memory and root filesystem ([`crate::GuestStats`]).
pub const STATS: &str = "/v1/stats";
/// `POST /v1/tcp?port=N`: a full-duplex byte stream to `127.0.0.1:N` inside the guest.
pub const TCP: &str = "/v1/tcp";

/// Path and query of the TCP route for one guest port.
pub fn tcp_path(port: u16) -> String {
    format!("{TCP}?port={port}")
}

/// What a route of one process does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessAction {
    /// `POST .../signal` with `{"signal": n}`.
    Signal,
    /// `GET .../attach`: the process's output from now on, as the records of an exec
    /// response (`Started` first, `Exit` last).
    Attach,
    /// `POST .../stdin[?eof=true]`: the body's bytes go to its stdin (its terminal, for a
    /// PTY); with `eof=true` stdin is closed after them.
    Stdin,
    /// `POST .../resize` with `{"rows", "cols"}` (a PTY).
    Resize,
}

impl ProcessAction {
    const ALL: [ProcessAction; 4] = [
        ProcessAction::Signal,
        ProcessAction::Attach,
        ProcessAction::Stdin,
        ProcessAction::Resize,
    ];

    fn suffix(self) -> &'static str {
        match self {
            ProcessAction::Signal => SIGNAL_SUFFIX,
            ProcessAction::Attach => "/attach",
            ProcessAction::Stdin => "/stdin",
            ProcessAction::Resize => "/resize",
        }
    }
}

/// Path of a route of one process.
pub fn process_path(pid: u32, action: ProcessAction) -> String {
    format!("{PROCESSES_PREFIX}{pid}{}", action.suffix())
}

/// Path of the signal route for one process.
pub fn signal_path(pid: u32) -> String {
    process_path(pid, ProcessAction::Signal)
}

/// Parses `/v1/processes/{pid}/{action}`; `None` if it is not one.
pub fn parse_process_path(path: &str) -> Option<(u32, ProcessAction)> {
    let rest = path.strip_prefix(PROCESSES_PREFIX)?;
    let (pid, action) = ProcessAction::ALL
        .iter()
        .find_map(|a| rest.strip_suffix(a.suffix()).map(|p| (p, *a)))?;
    if pid.is_empty() || pid.len() > 10 || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((pid.parse().ok()?, action))
}

/// Parses the pid out of a `/v1/processes/{pid}/signal` path; `None` if it is not one.
pub fn parse_signal_path(path: &str) -> Option<u32> {
    match parse_process_path(path)? {
        (pid, ProcessAction::Signal) => Some(pid),
        _ => None,
    }
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
        for a in ProcessAction::ALL {
            assert_eq!(parse_process_path(&process_path(7, a)), Some((7, a)));
        }
        assert_eq!(parse_process_path("/v1/processes/7/stdin/x"), None);
        assert_eq!(
            parse_signal_path(&process_path(7, ProcessAction::Stdin)),
            None
        );
    }
}
