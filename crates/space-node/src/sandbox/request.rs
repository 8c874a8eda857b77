//! The requests a sandbox's actor takes, and in which states each is legal.

use super::*;

/// Every request a sandbox's state driver takes. The node turns its public calls into these.
pub(crate) enum Request {
    /// The record as of now (live activity time).
    Info(Reply<SandboxRecord>),
    /// Stop the vCPUs.
    Pause(Reply<()>),
    /// Restart the vCPUs.
    Resume(Reply<()>),
    /// Full snapshot, VM exits, RAM file freed.
    Suspend(Reply<SnapshotRecord>),
    /// Back to Running from the restore point.
    Restore(Reply<()>),
    /// Take a snapshot now.
    Snapshot(SnapshotKind, Reply<SnapshotRecord>),
    /// Replace the VM with one started from a snapshot of this sandbox.
    Rollback(SnapshotId, Reply<()>),
    /// Take the full snapshot a child is restored from.
    Fork(Reply<ForkPoint>),
    /// A guest client (Running only).
    Guest(Reply<GuestClient>),
    /// Counts as activity, changes nothing.
    Touch(Reply<()>),
    /// From the metrics sampler: the guest connection and the VMM's use of the host
    /// (Running only; not activity).
    Probe(Reply<crate::metrics::Probe>),
    /// VM and sandbox directory gone; record and snapshots stay.
    Kill(Reply<()>),
    /// The sandbox is another node's now: VM, directory and record gone from this node,
    /// nothing written to the object store.
    Discard(Reply<()>),
    /// From the reconciler: act if the timeout is (still) expired. Answers whether it acted.
    Timeout(TimeoutKind, Reply<bool>),
    /// From the snapshot scheduler: the due rolling snapshot (Running only), then retention.
    Rolling(RollingJob, Reply<RollingOutcome>),
    /// Replace the idle timeout, maximum lifetime and action; answers the new record.
    SetTimeouts(TimeoutPolicy, Reply<SandboxRecord>),
    /// Replace the egress policy (new connections use it at once); answers the new record.
    SetEgress(EgressPolicy, Reply<SandboxRecord>),
    /// Node shutdown: the VM is killed (`false`) or left running for the next node process
    /// to adopt (`true`); the record stays as it is (recovery picks it up).
    Shutdown(bool, Reply<()>),
    /// From the archive pass: the snapshot that should go to the object store next, if any
    /// (a running sandbox's newest state at most every interval, snapshotted for it when
    /// nothing newer than the last upload exists).
    UploadJob(Option<Duration>, Reply<Option<crate::archive::UploadJob>>),
    /// From the archive pass: a snapshot is in the store now.
    Uploaded(SnapshotId, crate::record::RemoteCopy, Reply<()>),
    /// Drop the local copy of an archived snapshot (Suspended only). Answers whether it did.
    Evict(SnapshotId, Reply<bool>),
    /// Tests of panic isolation only: the driver writes a transition's intent and panics.
    #[cfg(any(test, feature = "test-hooks"))]
    Panic(Reply<()>),
}

const ALL: &[State] = &[Running, Paused, Suspended, Failed, Terminated];
const LIVE: &[State] = &[Running, Paused];
const ALIVE_OR_SUSPENDED: &[State] = &[Running, Paused, Suspended, Failed];

impl Request {
    /// The request's name in messages.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Info(_) => "inspect",
            Request::Pause(_) => "pause",
            Request::Resume(_) => "resume",
            Request::Suspend(_) => "suspend",
            Request::Restore(_) => "restore",
            Request::Snapshot(..) => "snapshot",
            Request::Rollback(..) => "rollback",
            Request::Fork(_) => "fork",
            Request::Guest(_) => "guest access",
            Request::Touch(_) => "touch",
            Request::Probe(_) => "metrics",
            Request::Kill(_) => "kill",
            Request::Discard(_) => "discard",
            Request::Rolling(..) => "rolling snapshot",
            Request::Timeout(..) => "timeout",
            Request::SetTimeouts(..) => "set timeouts",
            Request::SetEgress(..) => "set egress",
            Request::Shutdown(..) => "shutdown",
            Request::UploadJob(..) => "upload",
            Request::Uploaded(..) => "record upload",
            Request::Evict(..) => "evict",
            #[cfg(any(test, feature = "test-hooks"))]
            Request::Panic(_) => "panic",
        }
    }

    /// The states in which the request is legal.
    pub fn legal(&self) -> &'static [State] {
        match self {
            Request::Info(_) | Request::Shutdown(..) | Request::Discard(_) => ALL,
            Request::SetTimeouts(..) | Request::SetEgress(..) => ALIVE_OR_SUSPENDED,
            Request::Pause(_) | Request::Guest(_) | Request::Probe(_) => &[Running],
            Request::Resume(_) => &[Paused],
            Request::Suspend(_) | Request::Snapshot(..) | Request::Fork(_) => LIVE,
            Request::Restore(_) => &[Suspended],
            Request::Rollback(..) | Request::Kill(_) => ALIVE_OR_SUSPENDED,
            Request::Touch(_) => &[Running, Paused, Suspended],
            Request::Timeout(..) => LIVE,
            Request::Rolling(..) => ALIVE_OR_SUSPENDED,
            Request::UploadJob(..) | Request::Uploaded(..) => ALIVE_OR_SUSPENDED,
            Request::Evict(..) => &[Suspended],
            #[cfg(any(test, feature = "test-hooks"))]
            Request::Panic(_) => ALL,
        }
    }

    /// Whether the request counts as activity for the idle timeout.
    pub(super) fn is_activity(&self) -> bool {
        !matches!(
            self,
            Request::Info(_)
                | Request::Timeout(..)
                | Request::Shutdown(..)
                | Request::Kill(_)
                | Request::Discard(_)
                | Request::Rolling(..)
                | Request::UploadJob(..)
                | Request::Uploaded(..)
                | Request::Evict(..)
                | Request::Probe(_)
        )
    }

    /// Answers the request with `err` (a refusal).
    pub(super) fn refuse(self, err: NodeError) {
        match self {
            Request::Info(r) => drop(r.send(Err(err))),
            Request::Pause(r)
            | Request::Resume(r)
            | Request::Restore(r)
            | Request::Rollback(_, r)
            | Request::Touch(r)
            | Request::Kill(r)
            | Request::Discard(r)
            | Request::Shutdown(_, r) => drop(r.send(Err(err))),
            Request::SetTimeouts(_, r) | Request::SetEgress(_, r) => drop(r.send(Err(err))),
            Request::Suspend(r) | Request::Snapshot(_, r) => drop(r.send(Err(err))),
            Request::Fork(r) => drop(r.send(Err(err))),
            Request::Guest(r) => drop(r.send(Err(err))),
            Request::Probe(r) => drop(r.send(Err(err))),
            Request::Timeout(_, r) => drop(r.send(Ok(false))),
            Request::Rolling(_, r) => drop(r.send(Err(err))),
            Request::UploadJob(_, r) => drop(r.send(Ok(None))),
            Request::Uploaded(_, _, r) => drop(r.send(Err(err))),
            Request::Evict(_, r) => drop(r.send(Ok(false))),
            #[cfg(any(test, feature = "test-hooks"))]
            Request::Panic(r) => drop(r.send(Err(err))),
        }
    }
}
