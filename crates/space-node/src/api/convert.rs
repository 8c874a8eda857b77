//! The node API's types made from the node's own: records, usage, pool numbers, wakes and
//! errors. The wire types live in `space-node-api`; these conversions are the node's.

use space_node_api::{Fault, FaultCode, Pool, Sandbox, Snapshot, Usage, Woke};

use crate::error::NodeError;
use crate::node::{SandboxUsage, Wake};
use crate::pool::PoolStats;
use crate::record::{SandboxRecord, SnapshotRecord};

impl From<&SandboxRecord> for Sandbox {
    fn from(r: &SandboxRecord) -> Self {
        Sandbox {
            id: r.id.clone(),
            tenant: r.tenant.clone(),
            template: r.template.clone(),
            options: r.options.clone(),
            vcpus: r.vcpus,
            memory_mib: r.memory_mib,
            disk_mib: r.disk_mib,
            state: r.state,
            restore_point: r.restore_point.clone(),
            forked_from: r.forked_from.clone(),
            snapshots: r.snapshots.iter().map(Snapshot::from).collect(),
            failure: r.failure.clone(),
            created_unix_ms: r.created_unix_ms,
            state_since_unix_ms: r.state_since_unix_ms,
            started_unix_ms: r.started_unix_ms,
            last_activity_unix_ms: r.last_activity_unix_ms,
            node: None,
        }
    }
}

impl From<SandboxRecord> for Sandbox {
    fn from(r: SandboxRecord) -> Self {
        Sandbox::from(&r)
    }
}

impl From<&SnapshotRecord> for Snapshot {
    fn from(s: &SnapshotRecord) -> Self {
        Snapshot {
            id: s.id.clone(),
            kind: s.kind,
            reason: s.reason,
            created_unix_ms: s.created_unix_ms,
            size_bytes: s.size_bytes,
            paused_for_us: s.paused_for_us,
            local: s.local,
            remote: s.remote.clone(),
        }
    }
}

impl From<SnapshotRecord> for Snapshot {
    fn from(s: SnapshotRecord) -> Self {
        Snapshot::from(&s)
    }
}

impl From<SandboxUsage> for Usage {
    fn from(u: SandboxUsage) -> Self {
        Usage {
            id: u.id,
            state: u.state,
            vcpus: u.vcpus,
            memory_mib: u.memory_mib,
            epoch: u.epoch,
        }
    }
}

impl From<PoolStats> for Pool {
    fn from(p: PoolStats) -> Self {
        Pool {
            template: p.template,
            target: p.target,
            floor: p.floor,
            ready: p.ready,
            making: p.making,
            hits: p.hits,
            waits: p.waits,
            misses: p.misses,
        }
    }
}

impl From<Wake> for Woke {
    fn from(w: Wake) -> Self {
        match w {
            Wake::Resumed => Woke::Resume,
            Wake::Restored => Woke::Restore,
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = c.to_string();
        if !s.contains(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

impl From<NodeError> for Fault {
    fn from(e: NodeError) -> Self {
        let code = match &e {
            _ if e.is_disk_full() => FaultCode::DiskFull,
            NodeError::NotFound(_) => FaultCode::NotFound,
            NodeError::IllegalState { .. } => FaultCode::IllegalState,
            NodeError::SnapshotNotFound { .. } => FaultCode::SnapshotNotFound,
            NodeError::TemplateNotFound(_) => FaultCode::TemplateNotFound,
            NodeError::VolumeNotFound(_) => FaultCode::VolumeNotFound,
            NodeError::VolumeInUse { .. } => FaultCode::VolumeInUse,
            NodeError::TemplateNotReady(_) => FaultCode::TemplateNotReady,
            NodeError::TemplateExists(_) => FaultCode::TemplateExists,
            NodeError::TemplateInUse { .. } => FaultCode::TemplateInUse,
            NodeError::TemplateStale { .. } => FaultCode::TemplateStale,
            NodeError::InvalidId(_) => FaultCode::InvalidId,
            NodeError::Invalid(_) => FaultCode::Invalid,
            NodeError::ShuttingDown => FaultCode::ShuttingDown,
            NodeError::Capacity(_) => FaultCode::Capacity,
            NodeError::Archive(_) => FaultCode::Archive,
            NodeError::Key(_) => FaultCode::Key,
            NodeError::Guest { .. } => FaultCode::Guest,
            NodeError::Internal(_) => FaultCode::Internal,
            _ => FaultCode::Internal,
        };
        let message = match &e {
            NodeError::DiskFull(_) => e.to_string(),
            _ if e.is_disk_full() => format!("the node's disk is full: {}", chain(&e)),
            NodeError::Invalid(m) | NodeError::Capacity(m) | NodeError::Archive(m) => m.clone(),
            NodeError::Key(m) | NodeError::Internal(m) | NodeError::TemplateNotReady(m) => {
                m.clone()
            }
            // Never the note naming the snapshot's real owner: it may be another tenant's.
            NodeError::SnapshotNotFound {
                sandbox, snapshot, ..
            } => format!("sandbox {sandbox} has no snapshot {snapshot}"),
            _ => chain(&e),
        };
        let mut f = Fault::new(code, message);
        match e {
            NodeError::NotFound(id) => f.sandbox = Some(id),
            NodeError::SnapshotNotFound {
                sandbox, snapshot, ..
            } => {
                f.sandbox = Some(sandbox);
                f.snapshot = Some(snapshot);
            }
            _ => {}
        }
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a remote node's caller decodes from the wire.
    fn over_the_wire(e: NodeError) -> Fault {
        let json = serde_json::to_vec(&space_node_api::calls::FaultBody {
            fault: Fault::from(e),
        })
        .unwrap();
        serde_json::from_slice::<space_node_api::calls::FaultBody>(&json)
            .unwrap()
            .fault
    }

    #[test]
    fn internal_faults_cross_the_wire_as_internal() {
        let f = over_the_wire(NodeError::internal("a rollback without a target snapshot"));
        assert_eq!(f.code, FaultCode::Internal);
        assert_eq!(f.message, "a rollback without a target snapshot");
        assert!(!f.is_refusal());
        assert_eq!(space_node_api::calls::status_of(&f), 500);
        let f = over_the_wire(NodeError::Invalid("vcpus must be 1..=16, not 0".into()));
        assert_eq!(f.code, FaultCode::Invalid);
        assert!(f.is_refusal());
        assert_eq!(space_node_api::calls::status_of(&f), 400);
    }
}
