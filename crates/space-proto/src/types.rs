//! JSON message types of every route. Field names are the wire format; optional fields may be
//! omitted by the sender, and unknown fields are ignored so either end can grow.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub daemon_version: String,
    pub proto_version: u32,
    /// True once the daemon serves requests; a host waits for this before the first exec.
    pub ready: bool,
    pub uptime_ms: u64,
    /// Set by the last identity call; `None` for a guest that was never given one.
    pub sandbox_id: Option<String>,
}

/// What to run: an argv (no shell involved) or a line for `/bin/sh -c`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    Argv(Vec<String>),
    Shell(String),
}

impl Command {
    /// The argv the daemon executes.
    pub fn to_argv(&self) -> Vec<String> {
        match self {
            Command::Argv(v) => v.clone(),
            Command::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
        }
    }
}

/// First record (`Spec`) of `POST /v1/exec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    pub command: Command,
    /// Merged over the daemon's default environment and the identity's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory; `/` when absent.
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    /// Defaults to `uid` when only a uid is given.
    #[serde(default)]
    pub gid: Option<u32>,
    /// After this long the process group gets SIGKILL and the exit reports `timed_out`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Run as this account of the guest's `/etc/passwd` (see [`Account`]): its uid and gid,
    /// `HOME`, `USER`, `LOGNAME` and `SHELL`, and its home as the default working directory.
    /// `uid`/`gid`, when also given, win.
    #[serde(default)]
    pub username: Option<String>,
    /// A label to find the process by in the process list.
    #[serde(default)]
    pub tag: Option<String>,
    /// Stdin stays open when the request body ends: it is fed and closed through
    /// `POST /v1/processes/{pid}/stdin`, or closes when the process exits.
    #[serde(default)]
    pub keep_stdin: bool,
}

impl ExecSpec {
    pub fn argv<I, S>(argv: I) -> ExecSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecSpec::from_command(Command::Argv(argv.into_iter().map(Into::into).collect()))
    }

    pub fn shell(line: impl Into<String>) -> ExecSpec {
        ExecSpec::from_command(Command::Shell(line.into()))
    }

    pub fn from_command(command: Command) -> ExecSpec {
        ExecSpec {
            command,
            env: BTreeMap::new(),
            cwd: None,
            uid: None,
            gid: None,
            timeout_ms: None,
            username: None,
            tag: None,
            keep_stdin: false,
        }
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.uid = Some(uid);
        self.gid = Some(gid);
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some(timeout.as_millis().min(u64::MAX as u128) as u64);
        self
    }
}

/// First record of an exec or PTY response: the process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Started {
    pub pid: u32,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExitStatus {
    /// The exit code; for a death by signal, 128 + the signal number (the shell convention).
    pub exit_code: Option<i32>,
    /// The signal that killed the process, if one did.
    pub signal: Option<i32>,
    /// The daemon killed it because its timeout expired.
    #[serde(default)]
    pub timed_out: bool,
}

impl ExitStatus {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && self.signal.is_none() && !self.timed_out
    }
}

/// First record (`Spec`) of `POST /v1/pty`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySpec {
    /// What to run on the terminal; `/bin/sh` when absent.
    #[serde(default)]
    pub command: Option<Command>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
    pub rows: u16,
    pub cols: u16,
    /// As in [`ExecSpec::username`].
    #[serde(default)]
    pub username: Option<String>,
    /// As in [`ExecSpec::tag`].
    #[serde(default)]
    pub tag: Option<String>,
    /// `TERM` for the session; `xterm-256color` when absent.
    #[serde(default)]
    pub term: Option<String>,
}

impl PtySpec {
    pub fn new(rows: u16, cols: u16) -> PtySpec {
        PtySpec {
            command: None,
            env: BTreeMap::new(),
            cwd: None,
            uid: None,
            gid: None,
            rows,
            cols,
            username: None,
            tag: None,
            term: None,
        }
    }

    pub fn command(mut self, command: Command) -> Self {
        self.command = Some(command);
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }
}

/// `Resize` record payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resize {
    pub rows: u16,
    pub cols: u16,
}

/// Body of `POST /v1/processes/{pid}/signal`, and `Signal` record payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalRequest {
    pub signal: i32,
}

/// One process the daemon started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub argv: Vec<String>,
    pub started_at_unix_ms: u64,
    pub running: bool,
    /// Started by `POST /v1/pty` rather than exec.
    pub pty: bool,
    /// Set once it ended.
    pub exit: Option<ExitStatus>,
    /// The spec's tag.
    #[serde(default)]
    pub tag: Option<String>,
    /// The environment the spec added (not the defaults).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory.
    #[serde(default)]
    pub cwd: Option<String>,
}

/// Body of `POST /v1/watchers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatcherRequest {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

/// Answer of `POST /v1/watchers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatcherCreated {
    pub id: String,
}

/// Answer of `GET /v1/watchers/{id}`: the events since the last call, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatcherEvents {
    pub events: Vec<WatchEvent>,
}

/// An account of the guest (`GET /v1/user?name=N`, from `/etc/passwd`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

/// `GET /v1/processes`: running processes and the most recently finished ones.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessList {
    pub processes: Vec<ProcessInfo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileType {
    File,
    Dir,
    Symlink,
    Other,
}

/// `GET /v1/stat` (of the path itself: symlinks are not followed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    pub path: String,
    pub file_type: FileType,
    pub size: u64,
    /// Permission bits (`0o7777` mask).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime_unix_ns: i64,
    pub symlink_target: Option<String>,
    /// Extended attributes in the `user.` namespace whose values are UTF-8, by name (at most
    /// `MAX_XATTRS`; larger or binary values are left out).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xattrs: BTreeMap<String, String>,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub stat: FileStat,
}

/// `GET /v1/list`: entries sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirListing {
    pub entries: Vec<DirEntry>,
}

/// `POST /v1/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MkdirRequest {
    pub path: String,
    /// Create missing parents, and succeed if the directory exists (like `mkdir -p`).
    #[serde(default)]
    pub parents: bool,
    /// Permission bits; 0o755 when absent.
    #[serde(default)]
    pub mode: Option<u32>,
    /// Owner of the directories this creates (uid, gid); the daemon's when absent.
    #[serde(default)]
    pub owner: Option<(u32, u32)>,
}

/// `POST /v1/remove`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveRequest {
    pub path: String,
    /// Remove a non-empty directory with its contents; without it that is `not_empty`.
    #[serde(default)]
    pub recursive: bool,
}

/// `POST /v1/rename`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameRequest {
    pub from: String,
    pub to: String,
}

/// `POST /v1/chmod`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChmodRequest {
    pub path: String,
    pub mode: u32,
}

/// Options of `PUT /v1/files`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteOptions {
    /// Permission bits of the file; an existing file keeps its mode, a new one gets 0o644.
    pub mode: Option<u32>,
    /// Create missing parent directories.
    pub create_parents: bool,
    /// Owner (uid, gid) of the file and of the directories the write creates; without it a
    /// file that existed keeps its owner and a new one is the daemon's.
    pub owner: Option<(u32, u32)>,
    /// Extended attributes (`user.` names) set on the file; a file that existed keeps its
    /// others (but those under `clear_xattrs`).
    #[serde(default)]
    pub xattrs: BTreeMap<String, String>,
    /// Write the file in place (truncate, then write) rather than to a temporary file renamed
    /// over it: a watch sees writes to the file, and a cut-off write leaves it partly written.
    #[serde(default)]
    pub in_place: bool,
    /// A prefix (`user.` and more) of attributes a file that existed drops.
    #[serde(default)]
    pub clear_xattrs: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WatchEventKind {
    Created,
    Modified,
    /// A file opened for writing was closed: its content is complete.
    ClosedWrite,
    Removed,
    MovedFrom,
    MovedTo,
    Attrib,
    /// The kernel dropped events; the watcher should rescan.
    Overflow,
    /// A newer daemon's kind.
    #[serde(other)]
    Unknown,
}

/// `Event` record payload of `GET /v1/watch`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    pub path: String,
    pub kind: WatchEventKind,
    pub is_dir: bool,
}

/// `POST /v1/identity`: who this guest is now. Sent by the host after every boot or restore.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub sandbox_id: String,
    /// Fresh random bytes to reseed the kernel's RNG; base64 in JSON.
    #[serde(with = "b64", default)]
    pub entropy: Vec<u8>,
    /// Wall clock to set, nanoseconds since the Unix epoch.
    #[serde(default)]
    pub time_unix_ns: Option<u64>,
    #[serde(default)]
    pub hostname: Option<String>,
    /// Default environment of later execs and PTYs (replaces the previous identity's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The deployment's CA certificate (PEM, at most [`crate::limits::MAX_CA_PEM`] bytes): the
    /// guest adds it to its trust store so the egress gateway can intercept TLS.
    #[serde(default)]
    pub ca_pem: Option<String>,
    /// Who later execs and PTYs run as when they name nobody: an account name, a uid, or
    /// `user:group` / `uid:gid` (a template's `USER`). `None`: root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Their working directory when they name none (a template's `WORKDIR`); an absolute
    /// path. `None`: the account's home, else `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
}

/// `POST /v1/fs/grow`: grow the filesystem mounted at `path` to fill its block device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowFsRequest {
    /// A path on the filesystem to grow (usually its mount point, `/`).
    pub path: String,
    /// The device size in bytes the host just set: the daemon waits (a few seconds at most)
    /// until the guest kernel sees at least this capacity before growing. `None`: grow to the
    /// capacity visible now.
    #[serde(default)]
    pub device_bytes: Option<u64>,
}

/// Answer of `POST /v1/fs/grow`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrowFsResult {
    /// The block device's capacity in bytes as the guest sees it.
    pub device_bytes: u64,
    /// The filesystem's size in bytes before the request (its block count times block size).
    pub old_bytes: u64,
    /// Its size in bytes now.
    pub new_bytes: u64,
    /// Its block size in bytes.
    pub block_size: u64,
}

/// Answer of `GET /v1/stats`: what the guest kernel counts, as of the request. CPU time is
/// cumulative since the guest booted (a rate is the difference of two answers).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestStats {
    /// Online CPUs.
    pub cpu_count: u32,
    /// Clock ticks all CPUs spent busy (user, nice, system, irq, softirq, steal).
    pub cpu_busy_ticks: u64,
    /// Clock ticks all CPUs spent in all, idle and iowait included.
    pub cpu_total_ticks: u64,
    /// `MemTotal` of `/proc/meminfo`, bytes.
    pub mem_total_bytes: u64,
    /// `MemAvailable`, bytes.
    pub mem_available_bytes: u64,
    /// Page cache and buffers (`Cached` + `Buffers`), bytes.
    pub mem_cache_bytes: u64,
    /// Size of the root filesystem, bytes.
    pub disk_total_bytes: u64,
    /// Bytes of it in use (blocks not free).
    pub disk_used_bytes: u64,
}

/// Answer of `POST /v1/identity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityApplied {
    /// False when the daemon only recorded the identity (not PID 1 and not `--system`).
    pub system_changed: bool,
    /// True when the kernel RNG was credited and asked to reseed.
    pub reseeded: bool,
}

mod b64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        STANDARD
            .decode(s.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_forms() {
        let spec = ExecSpec::shell("echo hi").env("A", "1");
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["command"]["shell"], "echo hi");
        assert_eq!(
            spec.command.to_argv(),
            vec!["/bin/sh".to_string(), "-c".into(), "echo hi".into()]
        );
        let parsed: ExecSpec = serde_json::from_str(r#"{"command":{"argv":["ls","-l"]}}"#).unwrap();
        assert_eq!(
            parsed.command,
            Command::Argv(vec!["ls".into(), "-l".into()])
        );
        assert!(parsed.env.is_empty() && parsed.timeout_ms.is_none());
    }

    #[test]
    fn identity_entropy_is_base64() {
        let id = Identity {
            sandbox_id: "sb".into(),
            entropy: vec![0, 1, 2, 254, 255],
            time_unix_ns: Some(5),
            hostname: None,
            env: BTreeMap::new(),
            ca_pem: Some("-----BEGIN CERTIFICATE-----".into()),
            user: Some("1000:1000".into()),
            workdir: Some("/app".into()),
        };
        let json = serde_json::to_value(&id).unwrap();
        assert_eq!(json["entropy"], "AAEC/v8=");
        let back: Identity = serde_json::from_value(json).unwrap();
        assert_eq!(back, id);
        assert!(serde_json::from_str::<Identity>(r#"{"sandbox_id":"x","entropy":"!!"}"#).is_err());
        let old: Identity = serde_json::from_str(r#"{"sandbox_id":"x"}"#).unwrap();
        assert_eq!(old.ca_pem, None);
    }

    #[test]
    fn exit_status_success() {
        let ok = ExitStatus {
            exit_code: Some(0),
            signal: None,
            timed_out: false,
        };
        assert!(ok.success());
        let killed = ExitStatus {
            exit_code: Some(137),
            signal: Some(9),
            timed_out: false,
        };
        assert!(!killed.success());
    }
}
