//! The control plane's side of the object store: which store and master key the deployment
//! uses, the audit of every key unwrap, and ownership of the sandboxes a node found in the
//! store (`docs/archive.md`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context as _;
use space_archive::{Archive, FileMaster, KeyAudit, KeyEvent, Keyring, MasterKey, StoreConfig};
use space_node_api::SandboxId;

use crate::masters::TenantMasters;
use crate::store::{NewAuditEvent, Quotas, Store, TenantName};

/// The master key file's name in `<data>/state/` when none is given.
pub const MASTER_KEY_FILE: &str = "master.key";
/// Key events kept while the store is not open yet (the node unwraps keys when it opens).
const MAX_PENDING_EVENTS: usize = 10_000;

/// How a deployment uses the object store.
#[derive(Debug, Clone)]
pub struct ArchiveSettings {
    /// The store: a directory (`space up`'s default, `<data>/objects`) or `s3://bucket/prefix`.
    pub store: StoreConfig,
    /// The deployment's master key file; `None`: `<data>/state/master.key`, made on first use.
    pub master_key_file: Option<PathBuf>,
    /// Local copies of archived snapshots of suspended sandboxes are evicted past this many
    /// bytes (`None`: only when the disk runs low).
    pub cache_max_bytes: Option<u64>,
    /// How often the newest full snapshot of each running sandbox goes up (`None`: only on
    /// suspend and request).
    pub upload_interval: Option<Duration>,
}

impl ArchiveSettings {
    /// A store with the defaults for everything else.
    pub fn new(store: StoreConfig) -> ArchiveSettings {
        ArchiveSettings {
            store,
            master_key_file: None,
            cache_max_bytes: None,
            upload_interval: Some(Duration::from_secs(60)),
        }
    }

    /// The store client, a keyring whose unwraps go to `audit`, and the deployment's master
    /// key (made on first use) behind each tenant's.
    pub fn open(
        &self,
        data_dir: &std::path::Path,
        audit: Arc<KeyAuditSink>,
    ) -> anyhow::Result<(Archive, Arc<Keyring>, Arc<TenantMasters>)> {
        let archive = Archive::new(&self.store).context("the object store")?;
        let key_file = self
            .master_key_file
            .clone()
            .unwrap_or_else(|| data_dir.join("state").join(MASTER_KEY_FILE));
        // Read on first use: the file may be under the data directory, which the node mounts
        // when it opens.
        let master: Arc<dyn MasterKey> = Arc::new(FileMaster::new(key_file, |path| {
            eprintln!(
                "[up] made a new master key in {} (back it up away from the object store: \
                 archived sandboxes do not open without it)",
                path.display()
            );
        }));
        let masters = Arc::new(TenantMasters::new(master));
        let keyring = Arc::new(Keyring::new(
            archive.clone(),
            masters.clone(),
            audit,
            Duration::from_secs(300),
        ));
        Ok((archive, keyring, masters))
    }
}

/// Key events into the audit log. Events before the store is connected are held (bounded)
/// and written when it is.
#[derive(Default)]
pub struct KeyAuditSink {
    store: OnceLock<Arc<Store>>,
    pending: Mutex<Vec<KeyEvent>>,
}

impl KeyAuditSink {
    /// Connects the store and writes what was held.
    pub fn connect(&self, store: Arc<Store>) {
        let _ = self.store.set(store);
        let held = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        for e in held {
            self.write(e);
        }
    }

    fn write(&self, e: KeyEvent) {
        let Some(store) = self.store.get() else {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() < MAX_PENDING_EVENTS {
                p.push(e);
            }
            return;
        };
        let event = key_audit_event(&space_node_api::settings::KeyEventReport {
            tenant: e.tenant,
            lineage: e.lineage,
            master: e.master,
            operation: e.operation.to_owned(),
            ok: e.ok,
            detail: e.detail,
        });
        // Key events come from inside async archive code and must not wait for the database.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let store = store.clone();
                rt.spawn(async move {
                    if let Err(err) = store.record(event).await {
                        tracing::error!(error = %err, "recording a key event");
                    }
                });
            }
            Err(_) => {
                if let Err(err) = store.record_blocking(event) {
                    tracing::error!(error = %err, "recording a key event");
                }
            }
        }
    }
}

/// The audit event of a key event (here or on a node).
pub fn key_audit_event(e: &space_node_api::settings::KeyEventReport) -> NewAuditEvent {
    let what = match &e.lineage {
        Some(l) => format!("lineage {l}, master key {}", e.master),
        None => format!("master key {}", e.master),
    };
    NewAuditEvent {
        tenant: e.tenant.parse::<TenantName>().ok(),
        key_id: None,
        sandbox: None,
        operation: format!("key.{}", e.operation),
        result: if e.ok { "ok" } else { "key_unavailable" }.into(),
        detail: Some(match &e.detail {
            Some(d) => format!("{what} (tenant {}): {d}", e.tenant),
            None => format!("{what} (tenant {})", e.tenant),
        }),
    }
}

impl KeyAudit for KeyAuditSink {
    fn record(&self, event: KeyEvent) {
        self.write(event);
    }
}

/// Records who owns the sandboxes the node found in the object store (`(id, tenant)`, the
/// tenant from their sealed record); a tenant the database does not have yet is made, without
/// keys.
pub async fn own_adopted(adopted: Vec<(SandboxId, String)>, store: &Store) -> anyhow::Result<()> {
    for (id, tenant) in adopted {
        let tenant: TenantName = match tenant.parse() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(%id, %tenant, error = %e, "an archived sandbox names an invalid tenant");
                continue;
            }
        };
        if store.tenant(&tenant).await?.is_none() {
            store.create_tenant(&tenant, Quotas::default()).await?;
            eprintln!("[up] tenant {tenant} made again from the object store (it has no API keys)");
        }
        if store.sandbox_tenant(id.as_str()).await?.is_none() {
            store.add_sandbox(id.as_str(), &tenant).await?;
        }
        eprintln!("[up] found suspended sandbox {id} of tenant {tenant} in the object store");
    }
    Ok(())
}
