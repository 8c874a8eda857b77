//! The persisted record of a sandbox: one small JSON file per sandbox at
//! `<data>/state/sandboxes/<id>.json`, replaced atomically (temporary file, fsync, rename,
//! fsync of the directory) on every transition.
//!
//! The record is what a restarted node will recover from, so it is written twice per
//! transition: first with [`SandboxRecord::pending`] naming the transition about to start
//! (the *intent*), then with the outcome and `pending` cleared. A record found with `pending`
//! set tells recovery that the node stopped in the middle of that transition and which files
//! may be half made. Refused requests never write it.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::ids::{SandboxId, SnapshotId, TemplateRef};
pub use space_node_api::sandbox::{
    now_ms, RemoteCopy, SandboxOptions, SnapshotKind, SnapshotReason, State, TimeoutAction,
    TimeoutPolicy, DEFAULT_IDLE_TIMEOUT, DEFAULT_TENANT,
};

/// Bumped on incompatible changes of [`SandboxRecord`].
pub const RECORD_FORMAT: u32 = 1;

/// Records are a few KiB; anything far larger is not ours.
const MAX_RECORD: u64 = 4 << 20;

/// One snapshot of a sandbox, as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// Its id (also its directory name).
    pub id: SnapshotId,
    /// Disk only or full.
    pub kind: SnapshotKind,
    /// Why it was taken.
    pub reason: SnapshotReason,
    /// When, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Apparent size of its files in bytes (shared CoW extents counted in full).
    pub size_bytes: u64,
    /// How long the guest's vCPUs were stopped to take it, in microseconds (zero when it was
    /// already paused).
    pub paused_for_us: u64,
    /// Whether its files are on this node's disk (false once evicted, or for a snapshot known
    /// only from the object store). Absent in older records: yes.
    #[serde(default = "yes")]
    pub local: bool,
    /// Its copy in the object store, once uploaded (`docs/archive.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteCopy>,
}

impl SnapshotRecord {
    /// Where the snapshot lives: `local`, `local+remote`, `remote`.
    pub fn location(&self) -> &'static str {
        space_node_api::wire::location(self.local, self.remote.is_some())
    }
}

/// How the current (or last) VM of a sandbox was started: what crash recovery would redo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "snake_case")]
pub enum Origin {
    /// Restored from the template's snapshot.
    Template,
    /// Cold-booted on a clone of the template's root image (shape differs from the snapshot).
    TemplateColdBoot,
    /// Restored from a full snapshot, of this or (fork) another sandbox.
    Snapshot {
        /// Whose snapshot.
        sandbox: SandboxId,
        /// Which.
        snapshot: SnapshotId,
    },
    /// Cold-booted on a clone of a disk snapshot of this sandbox.
    DiskSnapshot {
        /// Which.
        snapshot: SnapshotId,
    },
}

/// Which transition a [`Pending`] intent is: what recovery finishes or undoes after a crash
/// (`docs/lifecycle.md`, *Crash recovery*). On disk it is the lowercase name (`"create"`, ...); a
/// name this build does not know reads as [`Intent::Unknown`], which recovery undoes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Intent {
    /// A new sandbox is being made.
    Create,
    /// A sandbox is being made from another's snapshot.
    Fork,
    /// A warm-pool member, made ahead of a create ([`SandboxRecord::is_pooled`]).
    Pool,
    /// The VM is being paused.
    Pause,
    /// The VM is being resumed.
    Resume,
    /// A snapshot is being taken (the sandbox stays as it was).
    Snapshot,
    /// A full snapshot is being taken and the VM let go.
    Suspend,
    /// A VM is being started from the restore point.
    Restore,
    /// The sandbox is going back to a snapshot.
    Rollback,
    /// A failed sandbox is being restored from its newest snapshot.
    Recover,
    /// The sandbox is being terminated.
    Kill,
    /// A name written by another version of the node.
    Unknown,
}

impl Intent {
    const ALL: [Intent; 11] = [
        Intent::Create,
        Intent::Fork,
        Intent::Pool,
        Intent::Pause,
        Intent::Resume,
        Intent::Snapshot,
        Intent::Suspend,
        Intent::Restore,
        Intent::Rollback,
        Intent::Recover,
        Intent::Kill,
    ];

    /// The name on disk and in recovery reports.
    pub fn as_str(self) -> &'static str {
        match self {
            Intent::Create => "create",
            Intent::Fork => "fork",
            Intent::Pool => "pool",
            Intent::Pause => "pause",
            Intent::Resume => "resume",
            Intent::Snapshot => "snapshot",
            Intent::Suspend => "suspend",
            Intent::Restore => "restore",
            Intent::Rollback => "rollback",
            Intent::Recover => "recover",
            Intent::Kill => "kill",
            Intent::Unknown => "unknown",
        }
    }

    /// The intent named `name`; [`Intent::Unknown`] for any other.
    pub fn from_name(name: &str) -> Intent {
        Intent::ALL
            .into_iter()
            .find(|i| i.as_str() == name)
            .unwrap_or(Intent::Unknown)
    }
}

impl std::fmt::Display for Intent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Intent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Intent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Intent::from_name(&name))
    }
}

/// A transition that was started and not yet recorded as finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// Which transition.
    pub request: Intent,
    /// The state the sandbox is going to if it succeeds.
    pub target: State,
    /// The snapshot it writes or reads, if any.
    pub snapshot: Option<SnapshotId>,
    /// When it started, milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
}

/// Everything the node knows about one sandbox that must survive the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// [`RECORD_FORMAT`].
    pub format: u32,
    /// The sandbox.
    pub id: SandboxId,
    /// The template build it came from (a fork inherits its parent's).
    pub template: TemplateRef,
    /// As created.
    pub options: SandboxOptions,
    /// vCPUs and memory actually in use (options resolved against the template).
    pub vcpus: u32,
    /// Guest RAM in MiB in use.
    pub memory_mib: u64,
    /// Root disk size in MiB (the template image's, or the larger size asked for; 0 in
    /// records written before the size was kept).
    #[serde(default)]
    pub disk_mib: u64,
    /// Current state (the last one reached).
    pub state: State,
    /// The transition in flight, if the node is in (or died in) the middle of one.
    pub pending: Option<Pending>,
    /// How the current VM was started.
    pub origin: Origin,
    /// When suspended: the full snapshot a restore starts from.
    pub restore_point: Option<SnapshotId>,
    /// The parent and snapshot this sandbox was forked from.
    pub forked_from: Option<(SandboxId, SnapshotId)>,
    /// Snapshots of this sandbox, oldest first.
    pub snapshots: Vec<SnapshotRecord>,
    /// Why the VM stopped when it stopped on its own ([`State::Failed`]).
    pub failure: Option<String>,
    /// Created, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Entered the current state.
    pub state_since_unix_ms: u64,
    /// The VM last started (create, restore, rollback): max lifetime counts from here.
    pub started_unix_ms: u64,
    /// Last request through the node, as of the last write (the live value is in memory).
    pub last_activity_unix_ms: u64,
    /// What crash recovery and the VM monitor did to this sandbox, oldest first (the last
    /// [`MAX_RECOVERY_EVENTS`]). Absent from the file while empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recoveries: Vec<RecoveryEvent>,
    /// The tenant that owns the sandbox (set by the control plane at create; a fork inherits
    /// it). Absent in older records: `default`.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// The lineage the sandbox's archived chunks and key belong to: its own id, or its fork
    /// parent's lineage. Absent in older records: its own id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<String>,
    /// When the lineage's key was destroyed, after the sandbox and every other one of its
    /// lineage had been terminated for the retention's maximum age (crypto-shredding; its
    /// archive can never be opened again, and its local snapshots are gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shredded_unix_ms: Option<u64>,
    /// Which ownership of the sandbox this node holds: 0 for its first owner, the epoch the
    /// control plane gave when it moved the sandbox here (failover, drain). The object store
    /// refuses the commits of an older epoch than its head's (`docs/cluster.md`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
    /// The defaults its commands start with, from its template (a fork inherits them).
    #[serde(
        default,
        skip_serializing_if = "crate::template::GuestDefaults::is_empty"
    )]
    pub guest: crate::template::GuestDefaults,
    /// What the last restore from the store touched first (file, chunk index), in order:
    /// the next upload lists it for restores to fetch first (`docs/archive.md`, *Lazy
    /// restore*). Absent from the file while empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefetch: Vec<(String, u64)>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn default_tenant() -> String {
    DEFAULT_TENANT.to_owned()
}

impl SandboxRecord {
    /// The lineage (its own id when the record names none).
    pub fn lineage(&self) -> &str {
        self.lineage.as_deref().unwrap_or(self.id.as_str())
    }
}

/// How many recovery events a record keeps.
pub const MAX_RECOVERY_EVENTS: usize = 32;

/// What recovery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryAction {
    /// A VM that outlived the node process was taken over as it was.
    Adopted,
    /// The VM was gone; a new one was restored from a full snapshot.
    Restored,
    /// The VM was gone and there was no full snapshot; one was cold-booted on a disk snapshot.
    ColdBooted,
    /// A transition cut short by the node's death was completed.
    FinishedPending,
    /// A transition cut short by the node's death was undone.
    RolledBackPending,
    /// The VM was gone and could not be brought back: the sandbox is Failed.
    Lost,
    /// A lazy restore's fetching failed (the store failed or stalled past its bound, or a
    /// chunk was corrupt): the VM was stopped and the sandbox is Suspended again on the
    /// snapshot it was restoring.
    RestoreFailed,
}

/// One thing recovery did to a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryEvent {
    /// When, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// What.
    pub action: RecoveryAction,
    /// The snapshot it restored from, if any.
    pub snapshot: Option<SnapshotId>,
    /// Why, in words (the exit that was noticed, the transition that was cut short, ...).
    pub detail: String,
}

impl SandboxRecord {
    /// The snapshot `id` of this sandbox.
    pub fn snapshot(&self, id: &SnapshotId) -> Option<&SnapshotRecord> {
        self.snapshots.iter().find(|s| &s.id == id)
    }

    /// Appends a recovery event, keeping the last [`MAX_RECOVERY_EVENTS`].
    pub fn push_recovery(&mut self, event: RecoveryEvent) {
        self.recoveries.push(event);
        let excess = self.recoveries.len().saturating_sub(MAX_RECOVERY_EVENTS);
        self.recoveries.drain(..excess);
    }

    /// A warm-pool member (`crate::pool`): a VM made ahead of a create, not yet handed out.
    /// Recorded as `creating` with the intent [`Intent::Pool`], so whatever cleans up half-made
    /// creates after a crash removes it the same way.
    pub fn is_pooled(&self) -> bool {
        self.state == State::Creating
            && self
                .pending
                .as_ref()
                .is_some_and(|p| p.request == Intent::Pool)
    }
}

/// Errors reading or writing records.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A filesystem call failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not a record this code can read.
    #[error("parsing {path}")]
    Parse {
        /// The file involved.
        path: PathBuf,
        /// The parser's complaint.
        source: serde_json::Error,
    },
    /// Too large or the wrong format.
    #[error("{path}: {why}")]
    Invalid {
        /// The file involved.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

/// The directory of sandbox records.
#[derive(Debug, Clone)]
pub struct RecordStore {
    dir: PathBuf,
}

impl RecordStore {
    /// Records under `dir` (created if missing).
    pub fn open(dir: PathBuf) -> Result<Self, RecordError> {
        std::fs::create_dir_all(&dir).map_err(|source| RecordError::Io {
            op: "creating",
            path: dir.clone(),
            source,
        })?;
        Ok(RecordStore { dir })
    }

    /// The file of sandbox `id`.
    pub fn path(&self, id: &SandboxId) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Replaces the record atomically and durably.
    pub fn write(&self, record: &SandboxRecord) -> Result<(), RecordError> {
        let path = self.path(&record.id);
        let bytes = serde_json::to_vec_pretty(record).expect("records serialize");
        space_fs::write_atomic(&path, &bytes, 0o600).map_err(|e| RecordError::Io {
            op: e.op,
            path: e.path,
            source: e.source,
        })
    }

    /// Reads the record of `id`; `None` if there is none.
    pub fn read(&self, id: &SandboxId) -> Result<Option<SandboxRecord>, RecordError> {
        read_record(&self.path(id))
    }

    /// Removes the record of `id` (a create that failed leaves no record).
    pub fn remove(&self, id: &SandboxId) -> Result<(), RecordError> {
        let path = self.path(id);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(RecordError::Io {
                op: "removing",
                path,
                source,
            }),
        }
    }

    /// Every record in the directory (temporary files skipped).
    pub fn list(&self) -> Result<Vec<SandboxRecord>, RecordError> {
        let io = |source| RecordError::Io {
            op: "listing",
            path: self.dir.clone(),
            source,
        };
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            if let Some(r) = read_record(&entry.path())? {
                out.push(r);
            }
        }
        out.sort_by_key(|a| a.created_unix_ms);
        Ok(out)
    }
}

fn read_record(path: &Path) -> Result<Option<SandboxRecord>, RecordError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(RecordError::Io {
                op: "reading",
                path: path.to_owned(),
                source,
            })
        }
    };
    if bytes.len() as u64 > MAX_RECORD {
        return Err(RecordError::Invalid {
            path: path.to_owned(),
            why: format!("larger than {MAX_RECORD} bytes"),
        });
    }
    let record: SandboxRecord =
        serde_json::from_slice(&bytes).map_err(|source| RecordError::Parse {
            path: path.to_owned(),
            source,
        })?;
    if record.format != RECORD_FORMAT {
        return Err(RecordError::Invalid {
            path: path.to_owned(),
            why: format!(
                "record format {} (this node reads {RECORD_FORMAT})",
                record.format
            ),
        });
    }
    Ok(Some(record))
}

fn yes() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_gateway::EgressPolicy;
    use std::time::Duration;

    #[test]
    fn an_intent_is_its_name_on_disk_and_an_unknown_name_is_undone() {
        for intent in Intent::ALL {
            let json = serde_json::to_string(&intent).unwrap();
            assert_eq!(json, format!("\"{}\"", intent.as_str()));
            assert_eq!(serde_json::from_str::<Intent>(&json).unwrap(), intent);
        }
        // What older nodes wrote reads as the same intent.
        let p: Pending = serde_json::from_str(
            r#"{"request":"rollback","target":"running","snapshot":null,"started_unix_ms":5}"#,
        )
        .unwrap();
        assert_eq!(p.request, Intent::Rollback);
        assert_eq!(
            serde_json::from_str::<Intent>("\"migrate\"").unwrap(),
            Intent::Unknown
        );
        assert!(serde_json::from_str::<Intent>("7").is_err());
    }

    fn record() -> SandboxRecord {
        SandboxRecord {
            format: RECORD_FORMAT,
            id: "sbx-0123".parse().unwrap(),
            template: TemplateRef::new("minimal", "1").unwrap(),
            options: SandboxOptions::default(),
            vcpus: 1,
            memory_mib: 256,
            disk_mib: 256,
            state: State::Running,
            pending: None,
            origin: Origin::Template,
            restore_point: None,
            forked_from: None,
            snapshots: vec![SnapshotRecord {
                id: SnapshotId::generate(1, "disk"),
                kind: SnapshotKind::Disk,
                reason: SnapshotReason::Request,
                created_unix_ms: 1,
                size_bytes: 2,
                paused_for_us: 3,
                local: true,
                remote: None,
            }],
            failure: None,
            created_unix_ms: 10,
            state_since_unix_ms: 11,
            started_unix_ms: 12,
            last_activity_unix_ms: 13,
            prefetch: Vec::new(),
            recoveries: Vec::new(),
            tenant: DEFAULT_TENANT.into(),
            lineage: None,
            shredded_unix_ms: None,
            guest: Default::default(),
            epoch: 0,
        }
    }

    #[test]
    fn round_trip_and_atomic_replace() {
        let tmp = tempfile::tempdir().unwrap();
        let store = RecordStore::open(tmp.path().join("records")).unwrap();
        let mut r = record();
        store.write(&r).unwrap();
        assert_eq!(store.read(&r.id).unwrap().unwrap(), r);
        r.state = State::Paused;
        store.write(&r).unwrap();
        assert_eq!(store.read(&r.id).unwrap().unwrap().state, State::Paused);
        assert_eq!(store.list().unwrap().len(), 1);
        let leftovers: Vec<_> = std::fs::read_dir(tmp.path().join("records"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "{leftovers:?}");
        store.remove(&r.id).unwrap();
        assert!(store.read(&r.id).unwrap().is_none());
        store.remove(&r.id).unwrap();
    }

    #[test]
    fn foreign_files_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = RecordStore::open(tmp.path().to_owned()).unwrap();
        let id: SandboxId = "sbx-1".parse().unwrap();
        std::fs::write(store.path(&id), b"{\"format\": 1}").unwrap();
        assert!(matches!(store.read(&id), Err(RecordError::Parse { .. })));
        let mut r = record();
        r.format = 99;
        std::fs::write(store.path(&r.id), serde_json::to_vec(&r).unwrap()).unwrap();
        assert!(matches!(
            store.read(&r.id),
            Err(RecordError::Invalid { .. })
        ));
    }

    #[test]
    fn records_without_egress_fields_still_read() {
        let mut json = serde_json::to_value(record()).unwrap();
        let opts = json["options"].as_object_mut().unwrap();
        assert!(opts.remove("egress").is_some());
        assert!(opts.remove("secrets").is_some());
        let r: SandboxRecord = serde_json::from_value(json).unwrap();
        assert_eq!(r.options.egress, EgressPolicy::default());
        assert!(r.options.secrets.is_empty());
    }

    #[test]
    fn timeouts_serialize_as_milliseconds() {
        let p = TimeoutPolicy {
            idle: Some(Duration::from_millis(1500)),
            max_lifetime: None,
            action: TimeoutAction::Kill,
        };
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(json, r#"{"idle":1500,"max_lifetime":null,"action":"kill"}"#);
        assert_eq!(serde_json::from_str::<TimeoutPolicy>(&json).unwrap(), p);
    }
}
