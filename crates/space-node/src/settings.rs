//! What a node of a cluster gets from the control plane rather than from its own disk
//! (`docs/cluster.md`): the object store and its credentials, the deployment's master key,
//! which tenants hold their own KMS key, and how archiving is paced. They arrive over the
//! node API's mutual TLS ((`configure`)), are kept in memory only, and
//! come again after a restart. Key events (every unwrap, generate, rotate) wait here until a
//! heartbeat carries them to the control plane's audit log.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use space_archive::keys::LocalMaster;
use space_archive::kms::{KmsConfig, KmsMaster, ID_PREFIX};
use space_archive::{
    Archive, BoxFuture, KeyAudit, KeyError, KeyEvent, Keyring, MasterDescription, MasterKey,
    MasterResolver, StoreConfig,
};
use space_node_api::secrets::StoredSecret;

use crate::archive::ArchiveConfig;
pub use space_node_api::settings::{
    AwsCredentials, KeyEventReport, KmsKey, NodeSettings, SecretMap, SecretsWanted, StoreSettings,
};

/// The object store the settings name, as the archive opens it.
pub fn store_config(settings: &NodeSettings) -> Result<Option<StoreConfig>, String> {
    let Some(s) = &settings.store else {
        return Ok(None);
    };
    let mut config = StoreConfig::parse(&s.url).map_err(|e| e.to_string())?;
    if let StoreConfig::S3(c) = &mut config {
        c.endpoint = s.endpoint.clone();
        c.region = s.region.clone();
        c.access_key_id = s.access_key_id.clone();
        c.secret_access_key = s.secret_access_key.clone();
    }
    Ok(Some(config))
}

/// Key events kept for the next heartbeats at most (older ones are dropped, and counted).
const MAX_KEY_EVENTS: usize = 10_000;
/// How long unwrapped tenant keys are cached.
const KEY_CACHE: Duration = Duration::from_secs(300);

/// The master keys settings name, changed in place when new settings come.
#[derive(Default)]
struct Masters {
    deployment: RwLock<Option<Arc<LocalMaster>>>,
    aws: RwLock<Option<AwsCredentials>>,
    tenants: RwLock<BTreeMap<String, KmsKey>>,
}

fn read<T: Clone>(l: &RwLock<T>) -> T {
    l.read().unwrap_or_else(|e| e.into_inner()).clone()
}

impl Masters {
    fn deployment(&self) -> Result<Arc<LocalMaster>, KeyError> {
        read(&self.deployment).ok_or_else(|| KeyError::Master {
            key: "local".into(),
            tenant: String::new(),
            detail: "the control plane has not sent this node its settings yet".into(),
        })
    }

    fn kms(
        &self,
        key_id: &str,
        region: &str,
        endpoint: Option<String>,
    ) -> Result<Arc<dyn MasterKey>, KeyError> {
        let Some(c) = read(&self.aws) else {
            return Err(KeyError::Master {
                key: format!("{ID_PREFIX}{key_id}"),
                tenant: String::new(),
                detail: "the control plane has no AWS credentials for KMS".into(),
            });
        };
        Ok(Arc::new(KmsMaster::new(KmsConfig {
            key_id: key_id.to_owned(),
            region: region.to_owned(),
            endpoint,
            access_key_id: c.access_key_id,
            secret_access_key: c.secret_access_key,
            session_token: c.session_token,
        })?))
    }
}

impl MasterResolver for Masters {
    fn master<'a>(
        &'a self,
        tenant: &'a str,
    ) -> BoxFuture<'a, Result<Arc<dyn MasterKey>, KeyError>> {
        Box::pin(async move {
            let own = self
                .tenants
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(tenant)
                .cloned();
            match own {
                Some(k) => self.kms(&k.key_id, &k.region, k.endpoint),
                None => Ok(self.deployment()? as Arc<dyn MasterKey>),
            }
        })
    }

    fn master_for<'a>(
        &'a self,
        tenant: &'a str,
        described: &'a MasterDescription,
    ) -> BoxFuture<'a, Result<Arc<dyn MasterKey>, KeyError>> {
        Box::pin(async move {
            let deployment = self.deployment()?;
            if described.id == deployment.id() {
                return Ok(deployment as Arc<dyn MasterKey>);
            }
            if let Some(key_id) = described.id.strip_prefix(ID_PREFIX) {
                let own = self
                    .tenants
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(tenant)
                    .cloned();
                let (region, endpoint) = match (&described.region, own) {
                    (Some(r), _) => (r.clone(), described.endpoint.clone()),
                    (None, Some(k)) => (k.region, k.endpoint),
                    (None, None) => {
                        return Err(KeyError::Master {
                            key: described.id.clone(),
                            tenant: tenant.to_owned(),
                            detail: "the tenant key names a KMS key without a region".into(),
                        })
                    }
                };
                return self.kms(key_id, &region, endpoint);
            }
            Err(KeyError::Master {
                key: described.id.clone(),
                tenant: tenant.to_owned(),
                detail: format!(
                    "the tenant key is wrapped by {}, which this deployment does not have (its \
                     master key is {})",
                    described.id,
                    deployment.id()
                ),
            })
        })
    }
}

/// Key events waiting for a heartbeat.
#[derive(Default)]
struct KeyEvents {
    queue: Mutex<VecDeque<KeyEventReport>>,
}

impl KeyAudit for KeyEvents {
    fn record(&self, e: KeyEvent) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_KEY_EVENTS {
            q.pop_front();
            tracing::warn!(
                "key events were not carried to the control plane in time: the oldest is dropped"
            );
        }
        q.push_back(KeyEventReport {
            tenant: e.tenant,
            lineage: e.lineage,
            master: e.master,
            operation: e.operation.to_owned(),
            ok: e.ok,
            detail: e.detail,
        });
    }
}

/// A node's settings as applied, shared by its API handles.
#[derive(Default)]
pub struct Applied {
    digest: Mutex<Option<String>>,
    store: Mutex<Option<StoreConfig>>,
    masters: Arc<Masters>,
    events: Arc<KeyEvents>,
}

impl std::fmt::Debug for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Applied")
            .field("digest", &self.digest())
            .finish_non_exhaustive()
    }
}

impl Applied {
    /// The digest of the settings applied last (`None`: none came yet).
    pub fn digest(&self) -> Option<String> {
        self.digest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Up to `max` of the oldest key events not yet carried.
    pub fn key_events(&self, max: usize) -> Vec<KeyEventReport> {
        let q = self.events.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.iter().take(max).cloned().collect()
    }

    /// The oldest `n` key events were carried.
    pub fn key_events_carried(&self, n: usize) {
        let mut q = self.events.queue.lock().unwrap_or_else(|e| e.into_inner());
        let n = n.min(q.len());
        q.drain(..n);
    }

    /// Applies `s`: the master keys at once; the store the first time one is named (the
    /// archive configuration to attach is returned). Another store than the one attached
    /// needs a restart of the node and is refused.
    pub fn apply(&self, s: &NodeSettings) -> Result<Option<ArchiveConfig>, String> {
        let deployment = match &s.master_key {
            Some(hex_key) => {
                let bytes = hex::decode(hex_key.trim()).map_err(|e| format!("master key: {e}"))?;
                let key = space_archive::crypto::Key::from_slice(&bytes)
                    .map_err(|e| format!("master key: {e}"))?;
                Some(Arc::new(LocalMaster::from_key(key)))
            }
            None => None,
        };
        let store = store_config(s)?;
        let mut attached = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let attach = match (&*attached, &store) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!(
                    "this node archives to {a}; it must be restarted to use {b}"
                ))
            }
            (None, Some(_)) => true,
            _ => false,
        };
        *self
            .masters
            .deployment
            .write()
            .unwrap_or_else(|e| e.into_inner()) = deployment;
        *self.masters.aws.write().unwrap_or_else(|e| e.into_inner()) = s.aws.clone();
        *self
            .masters
            .tenants
            .write()
            .unwrap_or_else(|e| e.into_inner()) = s.tenant_kms.clone();
        let cfg = match (attach, &store) {
            (true, Some(config)) => {
                let archive = Archive::new(config).map_err(|e| format!("the object store: {e}"))?;
                let keyring = Arc::new(Keyring::new(
                    archive.clone(),
                    self.masters.clone(),
                    self.events.clone(),
                    KEY_CACHE,
                ));
                let mut cfg = ArchiveConfig::new(archive, keyring);
                cfg.upload_interval = s.upload_interval_ms.map(Duration::from_millis);
                cfg.cache_max_bytes = s.cache_max_bytes;
                // The shared store's garbage is the control plane's to collect, once.
                cfg.collect_garbage = false;
                *attached = store.clone();
                Some(cfg)
            }
            _ => None,
        };
        *self.digest.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.digest());
        Ok(cfg)
    }
}

/// The secret values of the sandboxes a node of a cluster holds, in memory only: the control
/// plane sends each sandbox the values of the secrets it is bound to
/// ([`crate::api::NodeApi::set_secrets`]) when the node's heartbeat says it lacks them (after
/// a create, a move here, a restart of the node, or a change of a value). This is the
/// node's [`space_gateway::SecretSource`].
#[derive(Default)]
pub struct SecretValues {
    values:
        RwLock<std::collections::HashMap<crate::ids::SandboxId, BTreeMap<String, StoredSecret>>>,
}

impl std::fmt::Debug for SecretValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.values.read().map(|v| v.len()).unwrap_or(0);
        f.debug_struct("SecretValues")
            .field("sandboxes", &n)
            .finish_non_exhaustive()
    }
}

impl SecretValues {
    /// Replaces what sandbox `id` has (the values of the secrets it is bound to that
    /// exist; a secret deleted from the vault is absent).
    pub fn set(&self, id: &crate::ids::SandboxId, values: BTreeMap<String, StoredSecret>) {
        let mut all = self.values.write().unwrap_or_else(|e| e.into_inner());
        // Values are wiped as they drop.
        all.insert(id.clone(), values);
    }

    /// Forgets sandbox `id`'s values.
    pub fn forget(&self, id: &crate::ids::SandboxId) {
        let old = self
            .values
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
        drop(old);
    }

    /// Forgets the values of every sandbox that has secret `name` (its value changed), so
    /// that the next heartbeat asks for them again.
    pub fn forget_name(&self, name: &str) {
        let mut all = self.values.write().unwrap_or_else(|e| e.into_inner());
        let stale: Vec<_> = all
            .iter()
            .filter(|(_, v)| v.contains_key(name))
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            all.remove(&id);
        }
    }

    /// Whether sandbox `id` was sent its values.
    pub fn has(&self, id: &crate::ids::SandboxId) -> bool {
        self.values
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(id)
    }

    /// What sandbox `id` holds of secret `name`, if anything (tests look with this).
    pub fn get(&self, id: &crate::ids::SandboxId, name: &str) -> Option<Vec<u8>> {
        self.values
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .and_then(|v| v.get(name).map(|s| s.held.as_bytes().to_vec()))
    }

    /// What goes in place of `name`'s placeholder for sandbox `id` now.
    fn current(
        &self,
        id: &crate::ids::SandboxId,
        name: &str,
    ) -> Option<space_gateway::SecretValue> {
        self.values
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(id)
            .and_then(|v| v.get(name))
            .and_then(StoredSecret::current)
    }
}

impl space_gateway::SecretSource for SecretValues {
    fn value<'a>(
        &'a self,
        sandbox: &'a crate::ids::SandboxId,
        name: &'a str,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Option<space_gateway::SecretValue>> + Send + 'a>,
    > {
        let v = self.current(sandbox, name);
        Box::pin(async move { v })
    }
}
