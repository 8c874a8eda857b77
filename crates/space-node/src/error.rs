//! Errors of node operations.
//!
//! Refusals (unknown id, a request that is not legal in the sandbox's state, a snapshot that is
//! not this sandbox's, options the node cannot honour) are separate variants from failures of
//! the machinery (runtime, storage, guest, records), so callers can map the former to 4xx
//! answers and the latter to 5xx. A refusal is always decided before anything is touched.

use std::path::PathBuf;

use crate::ids::{IdError, SandboxId, SnapshotId, TemplateRef};
use crate::record::{RecordError, State};

/// Errors of [`crate::Node`] and [`crate::template`] operations.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No sandbox with that id on this node.
    #[error("no sandbox {0} on this node")]
    NotFound(SandboxId),
    /// The request is not legal in the sandbox's current state.
    #[error(
        "{request} refused: sandbox {id} is {state} ({request} is legal only when {})",
        legal_list(legal)
    )]
    IllegalState {
        /// The sandbox.
        id: SandboxId,
        /// The refused request.
        request: &'static str,
        /// The state it is in.
        state: State,
        /// The states where the request is legal.
        legal: &'static [State],
    },
    /// The snapshot is not one of this sandbox's.
    #[error("sandbox {sandbox} has no snapshot {snapshot}{}", owner_note(owner))]
    SnapshotNotFound {
        /// The sandbox asked about.
        sandbox: SandboxId,
        /// The snapshot asked for.
        snapshot: SnapshotId,
        /// The sandbox it belongs to, when it is another one's.
        owner: Option<SandboxId>,
    },
    /// No such volume on this node.
    #[error("no volume {0}")]
    VolumeNotFound(String),
    /// A sandbox mounts the volume.
    #[error("volume {volume} is mounted by sandbox {sandbox}")]
    VolumeInUse {
        /// The volume.
        volume: String,
        /// A sandbox that mounts it.
        sandbox: SandboxId,
    },
    /// No such template (or no complete build of it).
    #[error("no template {0}")]
    TemplateNotFound(String),
    /// The template is being prepared on this node (its image built); the message says how
    /// far it is.
    #[error("{0}")]
    TemplateNotReady(String),
    /// A build of that name and version exists already; versions are immutable.
    #[error("template {0} already exists; build a new version instead")]
    TemplateExists(TemplateRef),
    /// Sandboxes made from the template build still exist.
    #[error(
        "template {template} is in use by {count} sandbox(es), e.g. {sandbox}; kill them first"
    )]
    TemplateInUse {
        /// The template build.
        template: TemplateRef,
        /// One of the sandboxes.
        sandbox: SandboxId,
        /// How many.
        count: usize,
    },
    /// The template's snapshot cannot be restored by this host's runtime any more.
    #[error("template {template} cannot be restored on this node ({reason}); rebuild it as a new version")]
    TemplateStale {
        /// The template build.
        template: TemplateRef,
        /// What does not match.
        reason: String,
    },
    /// A malformed id or name.
    #[error(transparent)]
    InvalidId(#[from] IdError),
    /// Options or arguments the node cannot honour: the caller's to fix.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The node broke one of its own rules: a record or file it made is not what it should
    /// be, a state it cannot be in, or a sandbox's state driver that failed. Not the caller's
    /// fault (the same request may well succeed later); the cause is in the message and the
    /// node's log.
    #[error("internal error: {0}")]
    Internal(String),
    /// The node is shutting down; its sandboxes take no more requests.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// The node has no room for another VM (memory, vCPUs or sandbox count); see
    /// [`crate::admission`]. Nothing was started.
    #[error("{0}")]
    Capacity(String),
    /// The data disk has less free space than the node keeps for its VMs
    /// ([`crate::AdmissionConfig::disk_reserve_mib`]). Nothing was started or written.
    #[error("the node's disk is full: {0}")]
    DiskFull(String),
    /// The object store failed, or what it holds is corrupt or missing (`docs/archive.md`).
    #[error("{0}")]
    Archive(String),
    /// A key needed to read or write the archive is not available: the tenant's master key
    /// refused (disabled, deleted, unreachable), or the lineage's key was destroyed.
    #[error("{0}")]
    Key(String),
    /// The VM runtime failed.
    #[error("runtime")]
    Runtime(#[from] space_runtime::Error),
    /// The storage driver failed.
    #[error("storage")]
    Storage(#[from] crate::storage::StorageError),
    /// The guest daemon failed a request the node made.
    #[error("guest daemon: {what}")]
    Guest {
        /// The step that failed.
        what: &'static str,
        /// The client's error.
        source: space_runtime::ClientError,
    },
    /// Reading or writing a sandbox record failed.
    #[error("sandbox record")]
    Record(#[from] RecordError),
    /// A filesystem call of the node's own failed.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl NodeError {
    /// True for refusals: the request was wrong for the sandbox or the node, nothing changed.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            NodeError::NotFound(_)
                | NodeError::IllegalState { .. }
                | NodeError::SnapshotNotFound { .. }
                | NodeError::TemplateNotFound(_)
                | NodeError::VolumeNotFound(_)
                | NodeError::VolumeInUse { .. }
                | NodeError::TemplateExists(_)
                | NodeError::TemplateInUse { .. }
                | NodeError::TemplateStale { .. }
                | NodeError::InvalidId(_)
                | NodeError::Invalid(_)
                | NodeError::ShuttingDown
                | NodeError::Capacity(_)
                | NodeError::DiskFull(_)
        )
    }

    /// True when the failure comes from the node's disk being full (`ENOSPC` anywhere in
    /// its chain of causes, or QEMU reporting it): not the caller's fault and not a broken
    /// rule of the node, but a resource the operator has to free; nothing was half-done (a
    /// failed snapshot or build removes what it wrote).
    pub fn is_disk_full(&self) -> bool {
        if matches!(self, NodeError::DiskFull(_)) {
            return true;
        }
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if io.raw_os_error() == Some(libc::ENOSPC)
                    || io.kind() == std::io::ErrorKind::StorageFull
                {
                    return true;
                }
            }
            if e.to_string().contains("No space left on device") {
                return true;
            }
            cur = e.source();
        }
        false
    }

    /// An internal fault with `message`.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        NodeError::Internal(message.into())
    }

    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| NodeError::Io { op, path, source }
    }
}

fn legal_list(states: &[State]) -> String {
    match states {
        [] => "never".to_owned(),
        [one] => one.as_str().to_owned(),
        [init @ .., last] => format!(
            "{} or {}",
            init.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            last.as_str()
        ),
    }
}

fn owner_note(owner: &Option<SandboxId>) -> String {
    match owner {
        Some(o) => format!(
            " (it is a snapshot of sandbox {o}; rollback only goes to the sandbox's own snapshots)"
        ),
        None => String::new(),
    }
}

/// Shorthand for node results.
pub type Result<T, E = NodeError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_and_why() {
        let e = NodeError::IllegalState {
            id: "sbx-1".parse().unwrap(),
            request: "pause",
            state: State::Suspended,
            legal: &[State::Running],
        };
        assert_eq!(
            e.to_string(),
            "pause refused: sandbox sbx-1 is suspended (pause is legal only when running)"
        );
        let e = NodeError::IllegalState {
            id: "sbx-1".parse().unwrap(),
            request: "kill",
            state: State::Terminated,
            legal: &[State::Running, State::Paused, State::Suspended],
        };
        assert!(e
            .to_string()
            .ends_with("legal only when running, paused or suspended)"));
        assert!(e.is_refusal());
    }

    #[test]
    fn internal_faults_are_not_refusals() {
        let e = NodeError::internal("a suspended sandbox without a restore point");
        assert!(!e.is_refusal());
        assert_eq!(
            e.to_string(),
            "internal error: a suspended sandbox without a restore point"
        );
        assert!(NodeError::Invalid("vcpus".into()).is_refusal());
    }
}
