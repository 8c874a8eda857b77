//! Moving sandboxes between nodes through the object store (`docs/cluster.md`): failover of
//! a lost node's running sandboxes, wake on access of the sleeping ones, and drain.
//!
//! A move of sandbox S from node A (at epoch e) to node B happens once. The mover first
//! claims the move of S at epoch e in the database (`move:<S>@<e>`); a replica that does not
//! get the claim never asks any node to adopt S, and waits for the move to land instead. The
//! holder has B adopt S from the store under epoch e+1 (its newest archived snapshot becomes
//! its restore point there), then the database gives S to B only if it still belongs to A at
//! epoch e (a node that rejoined in between keeps it; B then discards its copy, which no
//! other mover can have made). Only then is S restored on B, if it is to run and its restore
//! point is not the snapshot of an acknowledged suspend: a suspend that was answered stays a
//! suspend, whatever the lost node last reported (a drain's own suspend excepted). From then
//! on A can commit nothing for S: its commits to the store are refused against the newer
//! epoch of B's head, and its next heartbeat names S as foreign.

use std::sync::Arc;
use std::time::Duration;

use space_node_api::{Fault, FaultCode, NodeApi, Sandbox};
use space_node_api::{SandboxId, SnapshotReason, State};

use super::{report_of, Cluster, RESERVATION};
use crate::store::{NewAuditEvent, NodeRow, NodeState, StoreError, TenantName};

/// How long one replica keeps the failover of one lost node to itself before another may
/// take it over (and how long a failed attempt waits to be tried again).
pub const FAILOVER_CLAIM: Duration = Duration::from_secs(30);
/// How long a drain pass holds its node.
pub const DRAIN_CLAIM: Duration = Duration::from_secs(60);

fn internal(e: StoreError) -> Fault {
    Fault::new(FaultCode::Internal, format!("state store: {e}"))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why a sandbox moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// Its node was lost while it ran.
    Failover,
    /// It was accessed while its node is lost.
    Wake,
    /// Its node is being drained.
    Drain,
}

impl Why {
    fn operation(self) -> &'static str {
        match self {
            Why::Failover => "sandbox.failover",
            Why::Wake => "sandbox.relocate",
            Why::Drain => "sandbox.move",
        }
    }
}

/// A sandbox that moved.
#[derive(Debug, Clone)]
pub struct Moved {
    /// Its node now.
    pub node: NodeRow,
    /// Its epoch now.
    pub epoch: i64,
    /// As the new node has it (Suspended on the snapshot it came back from).
    pub sandbox: Sandbox,
}

/// Moves sandbox `id`, owned by node `from` at `epoch`, to the live active node with the
/// most free memory that adopts it; audited with the snapshot it came back from and its
/// age. With `run`, it is restored there.
pub async fn relocate(
    cluster: &Arc<Cluster>,
    id: &SandboxId,
    from_node: &NodeRow,
    epoch: i64,
    memory_mib: u64,
    run: bool,
    why: Why,
) -> Result<Moved, Fault> {
    let store = cluster.store();
    // One move per sandbox and epoch, decided here before any node adopts.
    let claim = move_claim(id, epoch);
    if !store
        .claim(&claim, cluster.holder(), ms(MOVE_CLAIM))
        .await
        .map_err(internal)?
    {
        return Err(being_moved(id));
    }
    let result = relocate_claimed(cluster, id, from_node, epoch, memory_mib, run, why).await;
    let _ = store.release_claim(&claim, cluster.holder()).await;
    result
}

/// The claim of moving `id` away from ownership `epoch`.
fn move_claim(id: &SandboxId, epoch: i64) -> String {
    format!("move:{id}@{epoch}")
}

/// How long a mover holds the move of one sandbox at most (an adopt and a restore).
pub const MOVE_CLAIM: Duration = Duration::from_secs(120);

/// The fault of a move another replica is making: nothing was done here.
pub fn being_moved(id: &SandboxId) -> Fault {
    Fault::new(
        FaultCode::Unavailable,
        format!("sandbox {id} is being moved to another node by another replica; try again"),
    )
}

/// Whether `f` is [`being_moved`]'s.
pub fn is_being_moved(f: &Fault) -> bool {
    f.code == FaultCode::Unavailable && f.message.contains("is being moved to another node")
}

/// Whether the snapshot `sb` restores from was taken by a suspend (one that was answered:
/// a suspend whose upload failed is refused, and its snapshot stays an ordinary one).
fn suspended(sb: &Sandbox) -> bool {
    sb.restore_point
        .as_ref()
        .and_then(|p| sb.snapshot(p))
        .is_some_and(|s| s.reason == SnapshotReason::Suspend)
}

/// [`relocate`] once its caller holds the move's claim.
async fn relocate_claimed(
    cluster: &Arc<Cluster>,
    id: &SandboxId,
    from_node: &NodeRow,
    epoch: i64,
    memory_mib: u64,
    run: bool,
    why: Why,
) -> Result<Moved, Fault> {
    let store = cluster.store();
    let from = from_node.id.as_str();
    let tenant = store
        .sandbox_tenant(id.as_str())
        .await
        .map_err(internal)?
        .ok_or_else(|| Fault::new(FaultCode::NotFound, format!("no sandbox {id}")))?;
    let reserved = store.reserved().await.map_err(internal)?;
    let mut candidates: Vec<(u64, NodeRow)> = cluster
        .live_nodes()
        .await
        .map_err(internal)?
        .into_iter()
        .filter(|r| r.state == NodeState::Active && r.id != from)
        .map(|r| {
            let free = report_of(&r)
                .memory_free_mib
                .saturating_sub(reserved.get(&r.id).copied().unwrap_or(0));
            (free, r)
        })
        .collect();
    candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
    let new_epoch = u64::try_from(epoch + 1).unwrap_or(0);
    let mut last = Fault::new(
        FaultCode::Capacity,
        format!("no other live node can take sandbox {id} (memory {memory_mib} MiB)"),
    );
    for (_, row) in candidates {
        let Some(reservation) = store
            .reserve(&row.id, memory_mib, ms(RESERVATION))
            .await
            .map_err(internal)?
        else {
            continue;
        };
        let client = cluster
            .client(&row)
            .map_err(|e| Fault::new(FaultCode::Internal, e.to_string()))?;
        let adopted = match client.adopt(id, tenant.as_str(), new_epoch).await {
            Ok(sb) => sb,
            Err(f) => {
                let _ = store.release(&reservation).await;
                tracing::warn!(%id, node = %row.id, error = %f, "a node did not adopt a sandbox");
                // Not in the store (never archived, or killed): no node can take it.
                if matches!(f.code, FaultCode::NotFound | FaultCode::Key) {
                    return Err(f);
                }
                last = f;
                continue;
            }
        };
        // From a lost node only while it is still lost: a rejoin in between keeps it there.
        let moved = if from_node.state == NodeState::Lost {
            store
                .move_from_lost(id.as_str(), (from, epoch), from_node.incarnation, &row.id)
                .await
        } else {
            store
                .move_sandbox(id.as_str(), Some((from, epoch)), &row.id)
                .await
        };
        match moved {
            Ok(Some(e)) => {
                audit(cluster, &tenant, id, from, &row.id, e, &adopted, why).await;
                if from_node.state == NodeState::Lost {
                    super::volumes::follow(cluster, &adopted, from, &row).await;
                }
                // A drain suspended it itself to move it; any other suspend was a client's.
                let stay = why != Why::Drain && suspended(&adopted);
                if run && stay {
                    tracing::info!(%id, "its newest snapshot is a suspend's: it stays suspended");
                }
                if run && !stay {
                    if let Err(f) = client.restore(id).await {
                        let _ = store.release(&reservation).await;
                        return Err(f);
                    }
                }
                return Ok(Moved {
                    node: row,
                    epoch: e,
                    sandbox: adopted,
                });
            }
            Ok(None) => {
                // Its node came back first (the move claim keeps other movers out). What
                // the database gives to this node is never discarded here.
                let owner = store.sandbox_node(id.as_str()).await.map_err(internal)?;
                if owner.is_some_and(|(n, _)| n != row.id) {
                    let _ = client.discard(id).await;
                }
                let _ = store.release(&reservation).await;
                return Err(Fault::new(
                    FaultCode::IllegalState,
                    format!("sandbox {id} was moved by another replica, or its node rejoined"),
                ));
            }
            Err(e) => {
                // Whether the move was recorded is unknown: the copy is discarded only when
                // the database says it is another node's (otherwise this node's heartbeats
                // sort it out).
                if let Ok(Some((n, _))) = store.sandbox_node(id.as_str()).await {
                    if n != row.id {
                        let _ = client.discard(id).await;
                    }
                }
                let _ = store.release(&reservation).await;
                return Err(internal(e));
            }
        }
    }
    Err(last)
}

#[allow(clippy::too_many_arguments)]
async fn audit(
    cluster: &Cluster,
    tenant: &TenantName,
    id: &SandboxId,
    from: &str,
    to: &str,
    epoch: i64,
    sb: &Sandbox,
    why: Why,
) {
    let now = space_node_api::sandbox::now_ms();
    let point = sb
        .restore_point
        .as_ref()
        .and_then(|p| sb.snapshots.iter().find(|s| &s.id == p));
    let what = match point {
        Some(s) => {
            let taken = now.saturating_sub(s.created_unix_ms);
            let uploaded = s
                .remote
                .as_ref()
                .map(|r| now.saturating_sub(r.uploaded_unix_ms));
            format!(
                "from snapshot {} taken {:.1} s before{}",
                s.id,
                taken as f64 / 1000.0,
                uploaded
                    .map(|u| format!(" (uploaded {:.1} s before)", u as f64 / 1000.0))
                    .unwrap_or_default()
            )
        }
        None => "from its newest archived snapshot".into(),
    };
    let detail = format!("moved from node {from} to node {to} (epoch {epoch}) {what}");
    tracing::warn!(%id, from, to, epoch, "{detail}");
    let event = NewAuditEvent {
        tenant: Some(tenant.clone()),
        key_id: None,
        sandbox: Some(id.to_string()),
        operation: why.operation().into(),
        result: "ok".into(),
        detail: Some(detail),
    };
    if let Err(e) = cluster.store().record(event).await {
        tracing::error!(error = %e, "recording a move");
    }
}

/// One failover pass: the running sandboxes of every lost node come back on other nodes,
/// each node's under a claim so that one replica does it (and another takes over when
/// that one dies). Sleeping ones stay where they are until accessed ([`Why::Wake`]).
pub async fn failover_pass(cluster: &Arc<Cluster>) {
    let store = cluster.store();
    let nodes = match store.nodes().await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "failover: listing nodes");
            return;
        }
    };
    for node in nodes.iter().filter(|n| n.state == NodeState::Lost) {
        let report = report_of(node);
        let owned = match store.sandboxes_on(&node.id).await {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!(error = %e, "failover: listing a lost node's sandboxes");
                continue;
            }
        };
        let to_move: Vec<_> = owned
            .into_iter()
            .filter_map(|(id, epoch)| {
                let u = report.sandboxes.iter().find(|u| u.id.as_str() == id)?;
                matches!(u.state, State::Running | State::Paused).then(|| (u.clone(), epoch))
            })
            .collect();
        if to_move.is_empty() {
            continue;
        }
        let claim = format!("failover:{}", node.id);
        match store
            .claim(&claim, cluster.holder(), ms(FAILOVER_CLAIM))
            .await
        {
            Ok(true) => {}
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "failover: claiming");
                continue;
            }
        }
        let mut failed = 0;
        for (u, epoch) in to_move {
            match relocate(
                cluster,
                &u.id,
                node,
                epoch,
                u.memory_mib,
                true,
                Why::Failover,
            )
            .await
            {
                Ok(m) => tracing::info!(id = %u.id, to = %m.node.id, "failed over"),
                Err(f) if f.code == FaultCode::IllegalState || is_being_moved(&f) => {}
                Err(f) => {
                    failed += 1;
                    tracing::error!(id = %u.id, node = %node.id, error = %f, "failover of a sandbox");
                    let event = NewAuditEvent {
                        tenant: None,
                        key_id: None,
                        sandbox: Some(u.id.to_string()),
                        operation: Why::Failover.operation().into(),
                        result: serde_json::to_value(f.code)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_else(|| "failed".into()),
                        detail: Some(format!(
                            "sandbox {} of lost node {} could not come back elsewhere: {}",
                            u.id, node.id, f.message
                        )),
                    };
                    let _ = store.record(event).await;
                }
            }
        }
        // A pass with failures keeps the claim, so the next try waits for it to run out.
        if failed == 0 {
            let _ = store.release_claim(&claim, cluster.holder()).await;
        }
    }
}

/// One drain pass over node `row`: every running or paused sandbox is suspended there (its
/// snapshot goes to the store) and restored on another node; every suspended one whose
/// restore point is in the store is given to another node as it is. Answers how many
/// sandboxes the node still holds (0: drained).
pub async fn drain_pass(cluster: &Arc<Cluster>, row: &NodeRow) -> Result<usize, Fault> {
    let store = cluster.store();
    let claim = format!("drain:{}", row.id);
    if !store
        .claim(&claim, cluster.holder(), ms(DRAIN_CLAIM))
        .await
        .map_err(internal)?
    {
        return Ok(usize::MAX);
    }
    let client = cluster
        .client(row)
        .map_err(|e| Fault::new(FaultCode::Internal, e.to_string()))?;
    let owned = store.sandboxes_on(&row.id).await.map_err(internal)?;
    let mut left = 0;
    for (id, epoch) in owned {
        let Ok(id) = id.parse::<SandboxId>() else {
            continue;
        };
        let sb = match client.info(&id).await {
            Ok(sb) => sb,
            Err(f) if f.code == FaultCode::NotFound => continue,
            Err(f) => {
                left += 1;
                tracing::warn!(%id, error = %f, "drain: inspecting");
                continue;
            }
        };
        let run = match sb.state {
            State::Running | State::Paused => match client.suspend(&id).await {
                Ok(snap) if snap.remote.is_some() => true,
                Ok(_) => {
                    // Suspended here but not archived: it waits for the archive pass.
                    left += 1;
                    continue;
                }
                Err(f) => {
                    left += 1;
                    tracing::warn!(%id, error = %f, "drain: suspending");
                    continue;
                }
            },
            State::Suspended => {
                let archived = sb
                    .restore_point
                    .as_ref()
                    .and_then(|p| sb.snapshots.iter().find(|s| &s.id == p))
                    .is_some_and(|s| s.remote.is_some());
                if !archived {
                    // Its newest state is only here yet; the archive pass uploads it.
                    left += 1;
                    continue;
                }
                false
            }
            _ => continue,
        };
        match relocate(cluster, &id, row, epoch, sb.memory_mib, run, Why::Drain).await {
            Ok(m) => {
                // Its local copy here is the old owner's: gone.
                let _ = client.discard(&id).await;
                tracing::info!(%id, to = %m.node.id, "drained");
            }
            Err(f) => {
                left += 1;
                tracing::warn!(%id, error = %f, "drain: moving");
                if run {
                    // It stays here: running again, as it was.
                    let _ = client.restore(&id).await;
                }
            }
        }
    }
    let _ = store.release_claim(&claim, cluster.holder()).await;
    Ok(left)
}
