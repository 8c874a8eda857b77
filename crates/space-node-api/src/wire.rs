//! The node API's own types: what crosses between the control plane and a node, in process
//! or over the network. They are made from the node's records but are not those records, so
//! the on-disk format can change without the wire changing (and the other way round).

use serde::{Deserialize, Serialize};

use crate::ids::{SandboxId, SnapshotId, TemplateRef};
use crate::sandbox::{RemoteCopy, SandboxOptions, SnapshotKind, SnapshotReason, State};

/// A sandbox as the node reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    /// Its id.
    pub id: SandboxId,
    /// The tenant that owns it (the node's copy; the control plane's database decides).
    pub tenant: String,
    /// The exact template build it came from.
    pub template: TemplateRef,
    /// As created (shape asked for, environment, metadata, timeouts, egress, secrets).
    pub options: SandboxOptions,
    /// vCPUs in use.
    pub vcpus: u32,
    /// Guest RAM in MiB in use.
    pub memory_mib: u64,
    /// Root disk size in MiB.
    pub disk_mib: u64,
    /// Its state.
    pub state: State,
    /// When suspended: the full snapshot a restore starts from.
    pub restore_point: Option<SnapshotId>,
    /// The parent and snapshot it was forked from.
    pub forked_from: Option<(SandboxId, SnapshotId)>,
    /// Its snapshots, oldest first.
    pub snapshots: Vec<Snapshot>,
    /// Why the VM stopped when it stopped on its own.
    pub failure: Option<String>,
    /// Created, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// Entered its current state.
    pub state_since_unix_ms: u64,
    /// Its VM last started.
    pub started_unix_ms: u64,
    /// Last request through the node.
    pub last_activity_unix_ms: u64,
    /// The cluster node that holds it, as the control plane placed it (`None` from the node
    /// itself, and on `space up`, whose one node is the server's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl Sandbox {
    /// One of its snapshots.
    pub fn snapshot(&self, id: &SnapshotId) -> Option<&Snapshot> {
        self.snapshots.iter().find(|s| &s.id == id)
    }
}

/// A snapshot of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its id.
    pub id: SnapshotId,
    /// Disk only or full.
    pub kind: SnapshotKind,
    /// Why it was taken.
    pub reason: SnapshotReason,
    /// When, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// Apparent size of its files in bytes.
    pub size_bytes: u64,
    /// How long the guest's vCPUs were stopped to take it, in microseconds.
    pub paused_for_us: u64,
    /// Whether its files are on the node's disk.
    pub local: bool,
    /// Its copy in the object store, once uploaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteCopy>,
}

impl Snapshot {
    /// Where it lives: `local`, `local+remote`, `remote` (or `lost`).
    pub fn location(&self) -> &'static str {
        location(self.local, self.remote.is_some())
    }
}

/// Where a snapshot lives, from whether its files are on the node and whether the object
/// store has a copy: `local`, `local+remote`, `remote` (or `lost`).
pub fn location(local: bool, remote: bool) -> &'static str {
    match (local, remote) {
        (true, false) => "local",
        (true, true) => "local+remote",
        (false, true) => "remote",
        (false, false) => "lost",
    }
}

/// A complete template build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateInfo {
    /// Name and version.
    pub template: TemplateRef,
    /// vCPUs of its snapshot (a sandbox's default).
    pub vcpus: u32,
    /// Guest RAM of its snapshot in MiB (a sandbox's default).
    pub memory_mib: u64,
    /// Its root image's size in bytes.
    pub disk_bytes: u64,
    /// The node's name of the root image it was built from (or the file's stem).
    pub image: String,
    /// When it was built, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// The accelerator its snapshot was taken on.
    pub accelerator: String,
    /// The QEMU build that took its snapshot.
    pub qemu: String,
    /// Where its root image came from.
    #[serde(default)]
    pub source: String,
    /// Its sandboxes' defaults (from an image's config).
    #[serde(default)]
    pub guest: crate::template::GuestDefaults,
    /// The process its snapshot holds.
    #[serde(default)]
    pub start: Option<crate::template::StartSpec>,
}

impl TemplateInfo {
    /// The root image's size in MiB, rounded up.
    pub fn image_mib(&self) -> u64 {
        self.disk_bytes.div_ceil(1 << 20)
    }
}

/// What a sandbox holds of the node right now (quotas count these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// The sandbox.
    pub id: SandboxId,
    /// Its state.
    pub state: State,
    /// vCPUs of its VM.
    pub vcpus: u32,
    /// Guest RAM of its VM in MiB.
    pub memory_mib: u64,
    /// The ownership epoch the node holds it under (0: its first owner).
    #[serde(default)]
    pub epoch: u64,
}

/// A template pool's numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    /// The template build.
    pub template: TemplateRef,
    /// Members it keeps now (it follows demand).
    pub target: usize,
    /// The least it keeps.
    #[serde(default)]
    pub floor: usize,
    /// Members ready now.
    pub ready: usize,
    /// Members being made.
    #[serde(default)]
    pub making: usize,
    /// Creates served from it.
    pub hits: u64,
    /// Of the hits, creates that waited for a member being made.
    #[serde(default)]
    pub waits: u64,
    /// Creates that found it empty.
    pub misses: u64,
}

/// What a node is and runs on (the inputs of placement's hard filters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// `kvm` or `tcg`.
    pub accelerator: String,
    /// The QEMU build snapshots are taken with.
    pub qemu: String,
}

/// What a node tells the control plane on every heartbeat: what placement needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    /// `kvm` or `tcg`.
    pub accelerator: String,
    /// The QEMU build.
    pub qemu: String,
    /// Memory the host has in all, MiB.
    pub memory_total_mib: u64,
    /// Memory still free for guests, MiB (what admission would still let in).
    pub memory_free_mib: u64,
    /// Host CPUs.
    pub cpus: u32,
    /// The template builds it has.
    pub templates: Vec<TemplateInfo>,
    /// Its warm pools.
    pub pools: Vec<Pool>,
    /// The sandboxes it holds now.
    pub sandboxes: Vec<Usage>,
    /// The digest of the settings it applied last ([`crate::settings::NodeSettings::digest`];
    /// `None`: it has none yet).
    #[serde(default)]
    pub settings: Option<String>,
    /// Key events not yet carried to the audit log, oldest first.
    #[serde(default)]
    pub key_events: Vec<crate::settings::KeyEventReport>,
    /// Sandboxes bound to secrets whose values the node has not been sent.
    #[serde(default)]
    pub secrets_wanted: Vec<crate::settings::SecretsWanted>,
}

/// Bytes that cross as a base64 string (a console's tail).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Blob(pub Vec<u8>);

impl Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&crate::calls::encode_bytes(&self.0))
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        crate::calls::decode_bytes(&text)
            .map(Blob)
            .map_err(serde::de::Error::custom)
    }
}

/// Why a sandbox was woken on access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Woke {
    /// It was paused and was resumed.
    Resume,
    /// It was suspended and was restored.
    Restore,
}

impl Woke {
    /// `resume` or `restore`.
    pub fn as_str(self) -> &'static str {
        match self {
            Woke::Resume => "resume",
            Woke::Restore => "restore",
        }
    }
}

/// The kinds of [`Fault`]. Every kind but `Internal` and `Unavailable` is a refusal: the
/// node understood the request and declined it, and nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultCode {
    /// No such sandbox on the node.
    NotFound,
    /// Not legal in the sandbox's state.
    IllegalState,
    /// Not one of the sandbox's snapshots.
    SnapshotNotFound,
    /// No such template build.
    TemplateNotFound,
    /// No such volume on the node.
    VolumeNotFound,
    /// A sandbox mounts the volume.
    VolumeInUse,
    /// The template build exists already.
    TemplateExists,
    /// The template build is in use.
    TemplateInUse,
    /// The template is being prepared (its image built): ask again shortly.
    TemplateNotReady,
    /// The template cannot be restored on this node any more.
    TemplateStale,
    /// A malformed id or name.
    InvalidId,
    /// Options or arguments the node cannot honour.
    Invalid,
    /// The node is shutting down.
    ShuttingDown,
    /// No room on the node.
    Capacity,
    /// The object store failed or holds something corrupt.
    Archive,
    /// A key needed for the archive is unavailable.
    Key,
    /// The node's disk is full (see the node's disk-full check).
    DiskFull,
    /// The guest failed to answer.
    Guest,
    /// The node could not be reached, or stopped answering mid-request.
    Unavailable,
    /// Anything else: the node failed.
    Internal,
}

/// A failed node API call, serializable so it crosses the network with its kind intact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Fault {
    /// What kind of failure.
    pub code: FaultCode,
    /// What happened, for people (the node's error with its causes).
    pub message: String,
    /// For `not_found` and `snapshot_not_found`: the sandbox asked about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxId>,
    /// For `snapshot_not_found`: the snapshot asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotId>,
}

impl Fault {
    /// A fault of `code` with `message`.
    pub fn new(code: FaultCode, message: impl Into<String>) -> Fault {
        Fault {
            code,
            message: message.into(),
            sandbox: None,
            snapshot: None,
        }
    }

    /// Whether the node declined the request (as opposed to failing or being unreachable).
    pub fn is_refusal(&self) -> bool {
        !matches!(self.code, FaultCode::Internal | FaultCode::Unavailable)
    }
}

/// A volume as its node holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    /// Its id.
    pub id: String,
    /// Its size, bytes: writes past it are refused.
    pub size_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Files, directories and links in it.
    pub entries: u64,
    /// Every write acknowledged before this moment (ms since the Unix epoch) is in the
    /// volume's copy in the object store; `None`: no copy was made since the node started.
    #[serde(default)]
    pub synced_unix_ms: Option<u64>,
    /// Why the last copy failed, when it did.
    #[serde(default)]
    pub copy_error: Option<String>,
}

/// The answer to a [`crate::NodeApi::volume_call`]: the volume's reply and a read's bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeAnswer {
    /// What the volume said.
    pub reply: space_proto::volume::VolumeReply,
    /// A read's bytes.
    pub data: Blob,
}
