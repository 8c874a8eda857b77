//! Tenant quotas: how many sandboxes, vCPUs and MiB of memory a tenant may hold.
//!
//! `max_sandboxes` counts the tenant's sandboxes that are not terminated (a suspended one
//! still holds disk); `max_vcpus` and `max_memory_mib` count those with a VM (creating,
//! running, paused). A create, fork or restore takes the tenant's lock ([`QuotaLocks`]),
//! counts ([`usage`]), checks ([`check`]), starts the VM and, for a new sandbox, writes the
//! ownership row before letting go of the lock, so two concurrent creates cannot both pass
//! a quota that has room for one. Replicas of a cluster hold the tenant's claim in the
//! database as well ([`QuotaLocks::shared`]), so the same holds across replicas.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use space_node_api::{NodeApi, State};
use tokio::sync::OwnedMutexGuard;

use crate::error::{ApiError, ApiResult};
use crate::store::{Quotas, Store, TenantName};

/// How long a replica may hold a tenant's quota claim (a replica that dies holding it
/// blocks the tenant's creates this long at most).
const CLAIM_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// One async lock per tenant, held across a quota check and the start it admits.
#[derive(Debug, Default)]
pub struct QuotaLocks {
    locks: Mutex<HashMap<TenantName, Arc<tokio::sync::Mutex<()>>>>,
    shared: Option<(Arc<Store>, String)>,
}

/// A tenant's quota lock, held: released when dropped.
#[derive(Debug)]
pub struct QuotaGuard {
    _local: OwnedMutexGuard<()>,
    claim: Option<(Arc<Store>, String, String)>,
}

impl Drop for QuotaGuard {
    fn drop(&mut self) {
        if let Some((store, name, holder)) = self.claim.take() {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = store.release_claim(&name, &holder).await;
                });
            }
        }
    }
}

impl QuotaLocks {
    /// No locks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Locks that also hold a claim in `store` as `holder`, for replicas sharing one
    /// database.
    pub fn shared(store: Arc<Store>, holder: String) -> Self {
        QuotaLocks {
            locks: Mutex::default(),
            shared: Some((store, holder)),
        }
    }

    /// Waits for and takes the lock of `tenant`.
    pub async fn lock(&self, tenant: &TenantName) -> ApiResult<QuotaGuard> {
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(tenant.clone())
            .or_default()
            .clone();
        let local = lock.lock_owned().await;
        let Some((store, holder)) = &self.shared else {
            return Ok(QuotaGuard {
                _local: local,
                claim: None,
            });
        };
        let name = format!("quota:{tenant}");
        // Each hold is its own holder: a release still on its way must not drop the next
        // hold of this replica.
        let holder = format!("{holder}/{}", crate::store::cluster::random_alnum(8));
        let holder = &holder;
        let until = std::time::Instant::now() + CLAIM_TTL;
        while !store
            .claim(&name, holder, CLAIM_TTL.as_millis() as u64)
            .await?
        {
            if std::time::Instant::now() > until {
                return Err(ApiError::new(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "quota_busy",
                    format!(
                        "another replica has held tenant {tenant}'s quota for {}s",
                        CLAIM_TTL.as_secs()
                    ),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Ok(QuotaGuard {
            _local: local,
            claim: Some((store.clone(), name, holder.clone())),
        })
    }
}

/// What a tenant holds now, or what a request would add.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Sandboxes not terminated.
    pub sandboxes: u32,
    /// vCPUs of sandboxes with a VM.
    pub vcpus: u32,
    /// Memory of sandboxes with a VM, in MiB.
    pub memory_mib: u64,
}

impl Usage {
    /// Adds one sandbox in `state` with this shape.
    pub fn add(&mut self, state: State, vcpus: u32, memory_mib: u64) {
        if state != State::Terminated {
            self.sandboxes = self.sandboxes.saturating_add(1);
        }
        if matches!(state, State::Creating | State::Running | State::Paused) {
            self.vcpus = self.vcpus.saturating_add(vcpus);
            self.memory_mib = self.memory_mib.saturating_add(memory_mib);
        }
    }
}

/// Counts what `tenant`'s sandboxes hold: the node's live view of its sandboxes that are not
/// terminated, restricted to the ones the tenant owns (terminated ones cost nothing to skip,
/// however many a tenant has made).
pub async fn usage(node: &dyn NodeApi, store: &Store, tenant: &TenantName) -> ApiResult<Usage> {
    let owned: HashSet<String> = store.sandboxes_of(tenant).await?.into_iter().collect();
    let mut usage = Usage::default();
    for u in node.usage().await? {
        if owned.contains(u.id.as_str()) {
            usage.add(u.state, u.vcpus, u.memory_mib);
        }
    }
    Ok(usage)
}

/// Refuses with `429 quota_exceeded` when `used + need` passes one of `quotas`; the message
/// names the quota and the numbers.
pub fn check(tenant: &TenantName, quotas: &Quotas, used: &Usage, need: &Usage) -> ApiResult<()> {
    let over = |what: &str, limit: u64, used: u64, need: u64| {
        ApiError::quota(format!(
            "quota {what} of tenant {tenant} is {limit}; it holds {used} and this needs {need} \
             more"
        ))
    };
    if need.sandboxes > 0
        && u64::from(used.sandboxes) + u64::from(need.sandboxes) > u64::from(quotas.max_sandboxes)
    {
        return Err(over(
            "max_sandboxes",
            quotas.max_sandboxes.into(),
            used.sandboxes.into(),
            need.sandboxes.into(),
        ));
    }
    if need.vcpus > 0 && u64::from(used.vcpus) + u64::from(need.vcpus) > u64::from(quotas.max_vcpus)
    {
        return Err(over(
            "max_vcpus",
            quotas.max_vcpus.into(),
            used.vcpus.into(),
            need.vcpus.into(),
        ));
    }
    if need.memory_mib > 0
        && used.memory_mib.saturating_add(need.memory_mib) > quotas.max_memory_mib
    {
        return Err(over(
            "max_memory_mib",
            quotas.max_memory_mib,
            used.memory_mib,
            need.memory_mib,
        ));
    }
    Ok(())
}

/// Takes `tenant`'s lock and checks that `need` fits; the guard must be held until the new
/// VM runs and (for a new sandbox) its ownership is recorded.
pub async fn admit(
    locks: &QuotaLocks,
    node: &dyn NodeApi,
    store: &Store,
    tenant: &TenantName,
    need: Usage,
) -> ApiResult<QuotaGuard> {
    let guard = locks.lock(tenant).await?;
    let quotas = store
        .tenant(tenant)
        .await?
        .map(|t| t.quotas)
        .unwrap_or_default();
    let used = usage(node, store, tenant).await?;
    check(tenant, &quotas, &used, &need)?;
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas() -> Quotas {
        Quotas {
            max_sandboxes: 2,
            max_vcpus: 4,
            max_memory_mib: 1024,
            max_suspended_ms: None,
            max_volume_mib: 0,
        }
    }

    #[test]
    fn states_count_as_documented() {
        let mut u = Usage::default();
        u.add(State::Running, 1, 256);
        u.add(State::Paused, 2, 256);
        u.add(State::Suspended, 4, 512);
        u.add(State::Failed, 4, 512);
        u.add(State::Terminated, 8, 4096);
        assert_eq!(
            u,
            Usage {
                sandboxes: 4,
                vcpus: 3,
                memory_mib: 512
            }
        );
    }

    #[test]
    fn each_quota_refuses_with_its_numbers() {
        let t: TenantName = "acme".parse().unwrap();
        let new = Usage {
            sandboxes: 1,
            vcpus: 1,
            memory_mib: 256,
        };
        let used = Usage {
            sandboxes: 1,
            vcpus: 1,
            memory_mib: 256,
        };
        assert!(check(&t, &quotas(), &used, &new).is_ok());
        let full = Usage {
            sandboxes: 2,
            ..used
        };
        let e = check(&t, &quotas(), &full, &new).unwrap_err();
        assert_eq!((e.status.as_u16(), e.code), (429, "quota_exceeded"));
        assert!(e.message.contains("max_sandboxes"), "{}", e.message);
        assert!(e.message.contains("is 2; it holds 2"), "{}", e.message);
        let e = check(&t, &quotas(), &Usage { vcpus: 4, ..used }, &new).unwrap_err();
        assert!(e.message.contains("max_vcpus"), "{}", e.message);
        let e = check(
            &t,
            &quotas(),
            &Usage {
                memory_mib: 900,
                ..used
            },
            &new,
        )
        .unwrap_err();
        assert!(e.message.contains("max_memory_mib"), "{}", e.message);
        // A restore adds no sandbox: a full sandbox count does not refuse it.
        let restore = Usage {
            sandboxes: 0,
            ..new
        };
        assert!(check(&t, &quotas(), &full, &restore).is_ok());
    }
}
