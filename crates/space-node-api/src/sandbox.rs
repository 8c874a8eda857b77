//! A sandbox's vocabulary as the node API speaks it: its states, the options it is created
//! with, its timeouts, the kinds of its snapshots, and the create request.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::ids::{TemplateName, VersionReq};
use crate::policy::EgressPolicy;
use crate::secrets::SecretBinding;

/// The tenant of requests and records that name none.
pub const DEFAULT_TENANT: &str = "default";

/// Where a sandbox is in its lifecycle. See `docs/lifecycle.md` for the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Being made; only ever seen in a record (with `pending`) if the node stopped mid-create.
    Creating,
    /// The VM runs; the guest answers.
    Running,
    /// The VM exists with its vCPUs stopped; memory stays.
    Paused,
    /// No VM; a full snapshot ([`SandboxRecord::restore_point`]) holds memory and disk.
    Suspended,
    /// The VM exited without being asked to (QEMU or the guest kernel died). Only kill and
    /// rollback are accepted; recovering automatically is crash recovery's job.
    Failed,
    /// Killed. The record and the snapshots stay; nothing else is accepted.
    Terminated,
}

impl State {
    /// Lowercase name, as in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Paused => "paused",
            State::Suspended => "suspended",
            State::Failed => "failed",
            State::Terminated => "terminated",
        }
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happens when a timeout fires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeoutAction {
    /// Full snapshot, VM exits; a later restore continues where it stopped.
    #[default]
    Suspend,
    /// VM and sandbox directory gone (snapshots kept).
    Kill,
}

/// When the node stops a sandbox on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeoutPolicy {
    /// Fires when no request reached the sandbox through the node for this long while it was
    /// running or paused. `None`: never.
    #[serde(with = "opt_ms")]
    pub idle: Option<Duration>,
    /// Fires when the VM has been up this long since it last started (create, restore,
    /// rollback), whatever the activity. `None`: never.
    #[serde(with = "opt_ms")]
    pub max_lifetime: Option<Duration>,
    /// What both do.
    pub action: TimeoutAction,
}

/// Default idle timeout: long enough for an agent thinking between steps, short enough that an
/// abandoned sandbox does not hold RAM for long.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

impl Default for TimeoutPolicy {
    fn default() -> Self {
        TimeoutPolicy {
            idle: Some(DEFAULT_IDLE_TIMEOUT),
            max_lifetime: None,
            action: TimeoutAction::Suspend,
        }
    }
}

mod opt_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&(d.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

/// The shape and environment a sandbox was created with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxOptions {
    /// vCPUs; `None`: the template's.
    pub vcpus: Option<u32>,
    /// Guest RAM in MiB; `None`: the template's.
    pub memory_mib: Option<u64>,
    /// Root disk size in MiB; `None` (or the image's own size): the template's image.
    pub disk_mib: Option<u64>,
    /// Default environment of every exec in the guest (sent with each identity step).
    pub env: BTreeMap<String, String>,
    /// Free-form labels for the caller; the node only stores them.
    pub metadata: BTreeMap<String, String>,
    /// Idle timeout, maximum lifetime and what they do.
    pub timeouts: TimeoutPolicy,
    /// Where the sandbox may connect out through the gateway (`docs/egress.md`); changed by
    /// the node API's `set_egress`. Absent in older records: allow all.
    #[serde(default)]
    pub egress: EgressPolicy,
    /// Credentials bound to the sandbox (name, placeholder, hosts; never a value). Absent in
    /// older records: none.
    #[serde(default)]
    pub secrets: Vec<SecretBinding>,
    /// Whether guest access (exec, files, terminals, ports) to a Paused sandbox resumes it and
    /// to a Suspended one restores it (the node API's `guest`). Absent in older
    /// records: on.
    #[serde(default = "yes")]
    pub auto_resume: bool,
    /// Volumes mounted in the guest (`docs/volumes.md`). Absent in older records: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMount>,
}

/// One volume mounted in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The volume's id (`vol-` and 16 hex digits).
    pub volume: String,
    /// Its name in the tenant (shown in the guest's mount table and in answers).
    pub name: String,
    /// Where it is mounted in the guest (absolute).
    pub path: String,
    /// Whether the guest may change it.
    #[serde(default)]
    pub read_only: bool,
}

/// The most volumes one sandbox mounts.
pub const MAX_MOUNTS: usize = 8;

/// Whether `id` is a volume id: `vol-` and 16 lowercase hex digits.
pub fn valid_volume_id(id: &str) -> bool {
    id.strip_prefix("vol-").is_some_and(|h| {
        h.len() == 16
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn yes() -> bool {
    true
}

impl Default for SandboxOptions {
    fn default() -> Self {
        SandboxOptions {
            vcpus: None,
            memory_mib: None,
            disk_mib: None,
            env: BTreeMap::new(),
            metadata: BTreeMap::new(),
            timeouts: TimeoutPolicy::default(),
            egress: EgressPolicy::default(),
            secrets: Vec::new(),
            auto_resume: true,
            volumes: Vec::new(),
        }
    }
}

/// What a snapshot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// The root disk only (crash-consistent after a guest `sync`); rollback cold-boots on it.
    Disk,
    /// Memory, device state and disk; rollback and restore continue the very instant.
    Full,
}

impl SnapshotKind {
    /// Lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Disk => "disk",
            SnapshotKind::Full => "full",
        }
    }
}

/// Why a snapshot was taken (it decides nothing; retention and users read it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotReason {
    /// Asked for.
    Request,
    /// Taken by suspend; the restore point of a suspended sandbox.
    Suspend,
    /// Taken to fork a child.
    Fork,
    /// Taken just before a rollback replaced the running VM (undo point).
    PreRollback,
    /// Taken by the rolling snapshot scheduler (on the node): thinned by retention.
    Rolling,
}

impl SnapshotReason {
    /// Lowercase name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotReason::Request => "request",
            SnapshotReason::Suspend => "suspend",
            SnapshotReason::Fork => "fork",
            SnapshotReason::PreRollback => "pre_rollback",
            SnapshotReason::Rolling => "rolling",
        }
    }
}

/// A snapshot's copy in the object store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteCopy {
    /// BLAKE3 of the manifest object: checked before the manifest is used.
    pub manifest_hash: String,
    /// When the manifest was committed, ms since the Unix epoch.
    pub uploaded_unix_ms: u64,
    /// Bytes the upload wrote (new chunks and the manifest).
    pub uploaded_bytes: u64,
    /// Chunks the upload stored (the rest were zero, the template's, or already stored).
    #[serde(default)]
    pub new_chunks: u64,
    /// Bytes the manifest references in the store (every chunk it uses, shared or not).
    pub stored_bytes: u64,
}
/// What a node's `create` asks for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CreateRequest {
    /// Template name.
    pub template: TemplateName,
    /// Which build (`latest` by default).
    pub version: VersionReq,
    /// Shape, environment, metadata, timeouts.
    pub options: SandboxOptions,
    /// The owning tenant (its keys seal the sandbox's archive).
    pub tenant: String,
}

impl CreateRequest {
    /// The newest build of `template`, default options.
    pub fn new(template: TemplateName) -> Self {
        CreateRequest {
            template,
            version: VersionReq::Latest,
            options: Default::default(),
            tenant: DEFAULT_TENANT.to_owned(),
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
