//! The key hierarchy: a key per lineage, wrapped by its tenant's key, wrapped in turn by the
//! tenant's master key.
//!
//! ```text
//! master key (key file on the host, or a KMS key)  ── never leaves its provider
//!   └─ tenant key       tenants/<tenant>/key      wrapped by the master key
//!        └─ lineage key lineages/<lineage>/key    sealed under the tenant key, bound to both ids
//!             └─ chunk-id and data keys, derived (crate::crypto::LineageKeys)
//! ```
//!
//! Rotating a master key rewraps the tenant key (one object); no chunk is rewritten. Deleting a
//! lineage's key object makes everything of that lineage unreadable (crypto-shredding): the
//! packs may stay in the bucket until garbage collection, sealed under a key nobody has. Every
//! unwrap of a tenant key goes to [`KeyAudit`]; keys are never logged.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::crypto::{self, Key, LineageKeys};
use crate::store::{Archive, StoreError};

/// The tenant whose keys seal template archives (templates are the deployment's, not a
/// tenant's).
pub const TEMPLATE_TENANT: &str = "_templates";

/// A boxed future, for the provider traits.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Errors of the key hierarchy.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The master key provider refused or failed (a disabled or deleted KMS key, an
    /// unreachable KMS, a wrong key file).
    #[error("master key {key} for tenant {tenant}: {detail}")]
    Master {
        /// The master key's id.
        key: String,
        /// The tenant.
        tenant: String,
        /// What the provider said.
        detail: String,
    },
    /// A key object that should exist does not.
    #[error("{what} does not exist in the object store{hint}")]
    Missing {
        /// Which key.
        what: String,
        /// What that means.
        hint: &'static str,
    },
    /// A key object did not open (the wrong tenant, a changed object).
    #[error("{what} does not open under {under}: {source}")]
    Open {
        /// Which key.
        what: String,
        /// The key it was tried under.
        under: String,
        /// Why.
        source: crypto::CryptoError,
    },
    /// A key object is malformed or names something else.
    #[error("{what} is malformed: {detail}")]
    Malformed {
        /// Which key.
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// Reading or writing a key file.
    #[error("key file {path}: {detail}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
}

/// A master key: wraps and unwraps tenant keys. Implementations: [`LocalMaster`] (a key file)
/// and `crate::kms::KmsMaster` (the AWS KMS API).
pub trait MasterKey: Send + Sync {
    /// A stable, non-secret id (`local:<fingerprint>`, `kms:<key arn or id>`).
    fn id(&self) -> String;
    /// What a tenant key object records about its master (never a secret): the id, and where
    /// a KMS key is, so any node can find it from the store alone.
    fn describe(&self) -> MasterDescription {
        MasterDescription {
            id: self.id(),
            region: None,
            endpoint: None,
        }
    }
    /// A fresh tenant key and its wrapped form.
    fn generate<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<(Key, Vec<u8>), KeyError>>;
    /// Wraps an existing tenant key (rotation onto this master).
    fn wrap<'a>(
        &'a self,
        tenant: &'a str,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Vec<u8>, KeyError>>;
    /// Unwraps a tenant key this master wrapped for `tenant`.
    fn unwrap<'a>(
        &'a self,
        tenant: &'a str,
        wrapped: &'a [u8],
    ) -> BoxFuture<'a, Result<Key, KeyError>>;
}

/// A master key as a tenant key object names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MasterDescription {
    /// [`MasterKey::id`].
    pub id: String,
    /// A KMS key's region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// A KMS key's endpoint, when not the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// Which master key a tenant uses (the control plane's configuration, which may sit in a
/// database across the network, hence async).
pub trait MasterResolver: Send + Sync {
    /// The master key new tenant keys of `tenant` are wrapped with.
    fn master<'a>(&'a self, tenant: &'a str)
        -> BoxFuture<'a, Result<Arc<dyn MasterKey>, KeyError>>;

    /// The master key that wrapped an existing tenant key, as its object describes it. By
    /// default the tenant's current one, if it is that key.
    fn master_for<'a>(
        &'a self,
        tenant: &'a str,
        described: &'a MasterDescription,
    ) -> BoxFuture<'a, Result<Arc<dyn MasterKey>, KeyError>> {
        Box::pin(async move {
            let m = self.master(tenant).await?;
            if m.id() == described.id {
                Ok(m)
            } else {
                Err(KeyError::Master {
                    key: m.id(),
                    tenant: tenant.to_owned(),
                    detail: format!(
                        "the tenant key is wrapped by {}, not by this master key; rotate from {} \
                         to this one first",
                        described.id, described.id
                    ),
                })
            }
        })
    }
}

/// One master key for every tenant.
impl MasterResolver for Arc<dyn MasterKey> {
    fn master<'a>(
        &'a self,
        _tenant: &'a str,
    ) -> BoxFuture<'a, Result<Arc<dyn MasterKey>, KeyError>> {
        Box::pin(async move { Ok(self.clone()) })
    }
}

/// An unwrap of a tenant key, for the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyEvent {
    /// The tenant.
    pub tenant: String,
    /// The lineage whose key was wanted, if any.
    pub lineage: Option<String>,
    /// The master key's id.
    pub master: String,
    /// `unwrap`, `generate`, `rotate` or `shred`.
    pub operation: &'static str,
    /// Whether it worked.
    pub ok: bool,
    /// The error, when it did not.
    pub detail: Option<String>,
}

/// Where key events go.
pub trait KeyAudit: Send + Sync {
    /// Records one event. Must not block.
    fn record(&self, event: KeyEvent);
}

/// Drops events (tests, tools).
pub struct NoAudit;

impl KeyAudit for NoAudit {
    fn record(&self, _event: KeyEvent) {}
}

const KEY_OBJECT_FORMAT: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
struct TenantKeyObject {
    format: u32,
    tenant: String,
    master: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    endpoint: Option<String>,
    wrapped: String,
    updated_unix_ms: u64,
}

impl TenantKeyObject {
    fn new(tenant: &str, master: &dyn MasterKey, wrapped: &[u8]) -> TenantKeyObject {
        let d = master.describe();
        TenantKeyObject {
            format: KEY_OBJECT_FORMAT,
            tenant: tenant.to_owned(),
            master: d.id,
            region: d.region,
            endpoint: d.endpoint,
            wrapped: b64().encode(wrapped),
            updated_unix_ms: now_ms(),
        }
    }

    /// Parses the object of `tenant`'s key, refusing another format or another tenant's.
    fn parse(bytes: &[u8], tenant: &str) -> Result<TenantKeyObject, KeyError> {
        let what = || format!("the key of tenant {tenant}");
        let obj: TenantKeyObject =
            serde_json::from_slice(bytes).map_err(|e| KeyError::Malformed {
                what: what(),
                detail: e.to_string(),
            })?;
        if obj.tenant != tenant || obj.format != KEY_OBJECT_FORMAT {
            return Err(KeyError::Malformed {
                what: what(),
                detail: format!("names tenant {} (format {})", obj.tenant, obj.format),
            });
        }
        Ok(obj)
    }

    /// The wrapped tenant key's bytes.
    fn wrapped(&self) -> Result<Vec<u8>, KeyError> {
        b64()
            .decode(&self.wrapped)
            .map_err(|e| KeyError::Malformed {
                what: format!("the key of tenant {}", self.tenant),
                detail: e.to_string(),
            })
    }

    fn description(&self) -> MasterDescription {
        MasterDescription {
            id: self.master.clone(),
            region: self.region.clone(),
            endpoint: self.endpoint.clone(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct LineageKeyObject {
    format: u32,
    lineage: String,
    tenant: String,
    sealed: String,
    created_unix_ms: u64,
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn lineage_aad(tenant: &str, lineage: &str) -> Vec<u8> {
    [
        b"lineage-key\0".as_slice(),
        tenant.as_bytes(),
        b"\0",
        lineage.as_bytes(),
    ]
    .concat()
}

/// Lineage keys for the node: unwrapped on demand through the tenant's master key, cached for
/// a short while for uploads.
pub struct Keyring {
    archive: Archive,
    masters: Arc<dyn MasterResolver>,
    audit: Arc<dyn KeyAudit>,
    cache: Mutex<HashMap<String, (Arc<LineageKeys>, Instant)>>,
    ttl: Duration,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Keyring({})", self.archive.name())
    }
}

impl Keyring {
    /// A keyring over `archive`. Unwrapped lineage keys are kept in memory for `ttl` for
    /// writes; reads that restore a sandbox always unwrap again (so a disabled master key
    /// stops restores at once).
    pub fn new(
        archive: Archive,
        masters: Arc<dyn MasterResolver>,
        audit: Arc<dyn KeyAudit>,
        ttl: Duration,
    ) -> Keyring {
        Keyring {
            archive,
            masters,
            audit,
            cache: Mutex::default(),
            ttl,
        }
    }

    /// The archive the keys live in.
    pub fn archive(&self) -> &Archive {
        &self.archive
    }

    fn event(
        &self,
        tenant: &str,
        lineage: Option<&str>,
        master: &str,
        op: &'static str,
        r: &Result<(), String>,
    ) {
        self.audit.record(KeyEvent {
            tenant: tenant.to_owned(),
            lineage: lineage.map(str::to_owned),
            master: master.to_owned(),
            operation: op,
            ok: r.is_ok(),
            detail: r.as_ref().err().cloned(),
        });
    }

    /// The tenant's key, made (and wrapped by its master) if `create` and there is none.
    async fn tenant_key(
        &self,
        tenant: &str,
        lineage: Option<&str>,
        create: bool,
    ) -> Result<Key, KeyError> {
        let path = self.archive.tenant_key_path(tenant)?;
        let what = || format!("the key of tenant {tenant}");
        for _ in 0..3 {
            match self.archive.get_small(&path).await? {
                Some(bytes) => {
                    let obj = TenantKeyObject::parse(&bytes, tenant)?;
                    let described = obj.description();
                    let master = match self.masters.master_for(tenant, &described).await {
                        Ok(m) => m,
                        Err(e) => {
                            let r = Err(e.to_string());
                            self.event(tenant, lineage, &obj.master, "unwrap", &r);
                            return Err(e);
                        }
                    };
                    let wrapped = obj.wrapped()?;
                    let r = master.unwrap(tenant, &wrapped).await;
                    self.event(
                        tenant,
                        lineage,
                        &obj.master,
                        "unwrap",
                        &r.as_ref().map(|_| ()).map_err(|e| e.to_string()),
                    );
                    return r;
                }
                None if !create => {
                    return Err(KeyError::Missing {
                        what: what(),
                        hint: " (nothing of this tenant was ever archived here)",
                    })
                }
                None => {
                    let master = self.masters.master(tenant).await?;
                    let r = master.generate(tenant).await;
                    self.event(
                        tenant,
                        lineage,
                        &master.id(),
                        "generate",
                        &r.as_ref().map(|_| ()).map_err(|e| e.to_string()),
                    );
                    let (key, wrapped) = r?;
                    let obj = TenantKeyObject::new(tenant, master.as_ref(), &wrapped);
                    let bytes = serde_json::to_vec_pretty(&obj).expect("serializes");
                    if self.archive.put_new(&path, bytes.into()).await? {
                        return Ok(key);
                    }
                    // Someone else made it first: use theirs.
                }
            }
        }
        Err(KeyError::Malformed {
            what: what(),
            detail: "changed three times while being read".into(),
        })
    }

    /// Makes `tenant`'s key in the store if it has none (wrapped by the tenant's master).
    pub async fn ensure_tenant_key(&self, tenant: &str) -> Result<(), KeyError> {
        self.tenant_key(tenant, None, true).await.map(|_| ())
    }

    /// The working keys of `lineage`, owned by `tenant`. With `create`, a lineage without a
    /// key gets a new one (the first upload of a new sandbox). With `fresh`, the cache is not
    /// used (restores: the master key is asked every time).
    pub async fn lineage_keys(
        &self,
        tenant: &str,
        lineage: &str,
        create: bool,
        fresh: bool,
    ) -> Result<Arc<LineageKeys>, KeyError> {
        if !fresh {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((k, at)) = cache.get(lineage) {
                if at.elapsed() < self.ttl {
                    return Ok(k.clone());
                }
            }
        }
        let path = self.archive.lineage_key_path(lineage)?;
        let what = || format!("the key of lineage {lineage}");
        let keys = loop {
            match self.archive.get_small(&path).await? {
                Some(bytes) => {
                    let obj: LineageKeyObject =
                        serde_json::from_slice(&bytes).map_err(|e| KeyError::Malformed {
                            what: what(),
                            detail: e.to_string(),
                        })?;
                    if obj.lineage != lineage || obj.format != KEY_OBJECT_FORMAT {
                        return Err(KeyError::Malformed {
                            what: what(),
                            detail: format!("names lineage {}", obj.lineage),
                        });
                    }
                    let sealed = b64().decode(&obj.sealed).map_err(|e| KeyError::Malformed {
                        what: what(),
                        detail: e.to_string(),
                    })?;
                    // The tenant asked for, not the one the object names: another tenant's
                    // key never opens it.
                    let tk = self.tenant_key(tenant, Some(lineage), false).await?;
                    let plain = crypto::open(&tk, &lineage_aad(tenant, lineage), &sealed).map_err(
                        |source| KeyError::Open {
                            what: what(),
                            under: format!("the key of tenant {tenant}"),
                            source,
                        },
                    )?;
                    let lk = Key::from_slice(&plain).map_err(|e| KeyError::Malformed {
                        what: what(),
                        detail: e.to_string(),
                    })?;
                    break LineageKeys::derive(lineage, &lk);
                }
                None if !create => {
                    return Err(KeyError::Missing {
                        what: what(),
                        hint: " (it was destroyed: the lineage's data cannot be read anymore)",
                    })
                }
                None => {
                    let tk = self.tenant_key(tenant, Some(lineage), true).await?;
                    let lk = Key::random();
                    let obj = LineageKeyObject {
                        format: KEY_OBJECT_FORMAT,
                        lineage: lineage.to_owned(),
                        tenant: tenant.to_owned(),
                        sealed: b64().encode(crypto::seal(
                            &tk,
                            &lineage_aad(tenant, lineage),
                            lk.as_bytes(),
                        )),
                        created_unix_ms: now_ms(),
                    };
                    let bytes = serde_json::to_vec_pretty(&obj).expect("serializes");
                    if self.archive.put_new(&path, Bytes::from(bytes)).await? {
                        break LineageKeys::derive(lineage, &lk);
                    }
                }
            }
        };
        let keys = Arc::new(keys);
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lineage.to_owned(), (keys.clone(), Instant::now()));
        Ok(keys)
    }

    /// Destroys a lineage's key: everything sealed under it stays in the store and can never
    /// be opened again.
    pub async fn shred(&self, tenant: &str, lineage: &str) -> Result<(), KeyError> {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(lineage);
        let r = self
            .archive
            .delete(&self.archive.lineage_key_path(lineage)?)
            .await;
        self.event(
            tenant,
            Some(lineage),
            "-",
            "shred",
            &r.as_ref().map(|_| ()).map_err(|e| e.to_string()),
        );
        Ok(r?)
    }

    /// Forgets every cached lineage key (after a master key change).
    pub fn forget(&self) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Rewraps the tenant's key from master `from` onto master `to`. The tenant key, and so
    /// every lineage key and chunk, stays as it is.
    pub async fn rotate(
        &self,
        tenant: &str,
        from: &dyn MasterKey,
        to: &dyn MasterKey,
    ) -> Result<(), KeyError> {
        let path = self.archive.tenant_key_path(tenant)?;
        let Some(bytes) = self.archive.get_small(&path).await? else {
            // Nothing archived yet: the next upload wraps under the new master.
            return Ok(());
        };
        let obj = TenantKeyObject::parse(&bytes, tenant)?;
        if obj.master != from.id() {
            return Err(KeyError::Master {
                key: from.id(),
                tenant: tenant.to_owned(),
                detail: format!(
                    "the tenant key is wrapped by {}, not by this key",
                    obj.master
                ),
            });
        }
        let wrapped = obj.wrapped()?;
        let r = async {
            let key = from.unwrap(tenant, &wrapped).await?;
            to.wrap(tenant, &key).await
        }
        .await;
        self.event(
            tenant,
            None,
            &to.id(),
            "rotate",
            &r.as_ref().map(|_| ()).map_err(|e| e.to_string()),
        );
        let new = TenantKeyObject::new(tenant, to, &r?);
        self.archive
            .put(
                &path,
                serde_json::to_vec_pretty(&new).expect("serializes").into(),
            )
            .await?;
        self.forget();
        Ok(())
    }
}

/// The deployment's own master key: 32 random bytes in a file on the host (mode 0600), made
/// on first use. Whoever has the file and the store can read the archive, so it belongs in the
/// operator's backup, away from the bucket.
pub struct LocalMaster {
    key: Key,
    id: String,
}

impl LocalMaster {
    /// Reads the key file, or makes it when it does not exist.
    pub fn open_or_create(path: &Path) -> Result<LocalMaster, KeyError> {
        let err = |detail: String| KeyError::File {
            path: path.to_owned(),
            detail,
        };
        match std::fs::read_to_string(path) {
            Ok(s) => {
                let bytes = hex::decode(s.trim()).map_err(|e| err(format!("not hex: {e}")))?;
                let key = Key::from_slice(&bytes).map_err(|e| err(e.to_string()))?;
                Ok(LocalMaster::from_key(key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                if let Some(dir) = path.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| err(e.to_string()))?;
                }
                let key = Key::random();
                let tmp = path.with_extension("tmp");
                let mut f = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(|e| err(e.to_string()))?;
                f.write_all(format!("{}\n", hex::encode(key.as_bytes())).as_bytes())
                    .and_then(|_| f.sync_all())
                    .map_err(|e| err(e.to_string()))?;
                // Never replace a key someone else just wrote.
                std::fs::hard_link(&tmp, path).or_else(|e| {
                    if e.kind() == std::io::ErrorKind::AlreadyExists {
                        Ok(())
                    } else {
                        Err(err(e.to_string()))
                    }
                })?;
                let _ = std::fs::remove_file(&tmp);
                LocalMaster::open_or_create(path)
            }
            Err(e) => Err(err(e.to_string())),
        }
    }

    /// A master from a key in memory.
    pub fn from_key(key: Key) -> LocalMaster {
        let fp = blake3::derive_key("space-archive v1 key fingerprint", key.as_bytes());
        LocalMaster {
            id: format!("local:{}", &hex::encode(fp)[..16]),
            key,
        }
    }

    fn aad(tenant: &str) -> Vec<u8> {
        [b"tenant-key\0".as_slice(), tenant.as_bytes()].concat()
    }
}

impl MasterKey for LocalMaster {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn generate<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<(Key, Vec<u8>), KeyError>> {
        Box::pin(async move {
            let key = Key::random();
            let wrapped = crypto::seal(&self.key, &Self::aad(tenant), key.as_bytes());
            Ok((key, wrapped))
        })
    }

    fn wrap<'a>(
        &'a self,
        tenant: &'a str,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Vec<u8>, KeyError>> {
        Box::pin(async move { Ok(crypto::seal(&self.key, &Self::aad(tenant), key.as_bytes())) })
    }

    fn unwrap<'a>(
        &'a self,
        tenant: &'a str,
        wrapped: &'a [u8],
    ) -> BoxFuture<'a, Result<Key, KeyError>> {
        Box::pin(async move {
            let plain = crypto::open(&self.key, &Self::aad(tenant), wrapped).map_err(|e| {
                KeyError::Master {
                    key: self.id(),
                    tenant: tenant.to_owned(),
                    detail: e.to_string(),
                }
            })?;
            Key::from_slice(&plain).map_err(|e| KeyError::Master {
                key: self.id(),
                tenant: tenant.to_owned(),
                detail: e.to_string(),
            })
        })
    }
}

/// A [`LocalMaster`] read from (or made in) its file on first use, so the file can live in a
/// directory that is only mounted later. `made` is called once if the file was made.
pub struct FileMaster {
    path: PathBuf,
    loaded: std::sync::OnceLock<LocalMaster>,
    made: Box<dyn Fn(&Path) + Send + Sync>,
}

impl FileMaster {
    /// A master key in `path`; `made` runs once when the file had to be made.
    pub fn new(path: PathBuf, made: impl Fn(&Path) + Send + Sync + 'static) -> FileMaster {
        FileMaster {
            path,
            loaded: std::sync::OnceLock::new(),
            made: Box::new(made),
        }
    }

    fn get(&self) -> Result<&LocalMaster, KeyError> {
        if let Some(m) = self.loaded.get() {
            return Ok(m);
        }
        let existed = self.path.exists();
        let m = LocalMaster::open_or_create(&self.path)?;
        if !existed {
            (self.made)(&self.path);
        }
        Ok(self.loaded.get_or_init(|| m))
    }
}

impl MasterKey for FileMaster {
    fn id(&self) -> String {
        match self.get() {
            Ok(m) => m.id(),
            Err(_) => format!("local:{}", self.path.display()),
        }
    }

    fn generate<'a>(&'a self, tenant: &'a str) -> BoxFuture<'a, Result<(Key, Vec<u8>), KeyError>> {
        Box::pin(async move { self.get()?.generate(tenant).await })
    }

    fn wrap<'a>(
        &'a self,
        tenant: &'a str,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Vec<u8>, KeyError>> {
        Box::pin(async move { self.get()?.wrap(tenant, key).await })
    }

    fn unwrap<'a>(
        &'a self,
        tenant: &'a str,
        wrapped: &'a [u8],
    ) -> BoxFuture<'a, Result<Key, KeyError>> {
        Box::pin(async move { self.get()?.unwrap(tenant, wrapped).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreConfig;

    struct Events(Mutex<Vec<KeyEvent>>);
    impl KeyAudit for Events {
        fn record(&self, e: KeyEvent) {
            self.0.lock().unwrap().push(e);
        }
    }

    async fn ring(dir: &Path, master: Arc<dyn MasterKey>) -> (Keyring, Arc<Events>) {
        let a = Archive::open(&StoreConfig::Local(dir.join("store")))
            .await
            .unwrap();
        let ev = Arc::new(Events(Mutex::default()));
        (
            Keyring::new(a, Arc::new(master), ev.clone(), Duration::from_secs(60)),
            ev,
        )
    }

    #[tokio::test]
    async fn hierarchy_round_trip_isolation_rotation_and_shredding() {
        let dir = tempfile::tempdir().unwrap();
        let m1: Arc<dyn MasterKey> =
            Arc::new(LocalMaster::open_or_create(&dir.path().join("k1")).unwrap());
        let (ring1, events) = ring(dir.path(), m1.clone()).await;

        let a = ring1
            .lineage_keys("alice", "lin-a", true, false)
            .await
            .unwrap();
        let id = a.chunk_id(b"x");
        // A second keyring (another node) on the same store and master gets the same keys.
        let (ring2, _) = ring(dir.path(), m1.clone()).await;
        let a2 = ring2
            .lineage_keys("alice", "lin-a", false, true)
            .await
            .unwrap();
        assert_eq!(a2.chunk_id(b"x"), id);
        assert!(events
            .0
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.operation == "generate" && e.ok));

        // Bob's tenant key cannot open alice's lineage.
        ring1
            .lineage_keys("bob", "lin-b", true, false)
            .await
            .unwrap();
        let err = ring2
            .lineage_keys("bob", "lin-a", false, true)
            .await
            .unwrap_err();
        assert!(matches!(err, KeyError::Open { .. }), "{err}");

        // Another master cannot unwrap, and says which key it is.
        let m_other: Arc<dyn MasterKey> = Arc::new(LocalMaster::from_key(Key::random()));
        let (ring3, ev3) = ring(dir.path(), m_other.clone()).await;
        let err = ring3
            .lineage_keys("alice", "lin-a", false, true)
            .await
            .unwrap_err();
        assert!(err.to_string().contains(&m1.id()), "{err}");
        assert!(ev3.0.lock().unwrap().iter().any(|e| !e.ok));

        // Rotation onto the other master: same lineage keys, old master refused.
        ring1
            .rotate("alice", m1.as_ref(), m_other.as_ref())
            .await
            .unwrap();
        let a3 = ring3
            .lineage_keys("alice", "lin-a", false, true)
            .await
            .unwrap();
        assert_eq!(a3.chunk_id(b"x"), id);
        assert!(ring2
            .lineage_keys("alice", "lin-a", false, true)
            .await
            .is_err());

        // Shredding: the key object is gone, reads fail with a clear error.
        ring3.shred("alice", "lin-a").await.unwrap();
        let err = ring3
            .lineage_keys("alice", "lin-a", false, true)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("destroyed"), "{err}");
        // No event carries key bytes: they only hold ids and messages.
        for e in events.0.lock().unwrap().iter() {
            assert!(!format!("{e:?}").contains(&hex::encode(a.chunk_id(b"").0)));
        }
    }

    #[test]
    fn key_file_is_made_once_private_and_reread() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/master.key");
        let a = LocalMaster::open_or_create(&p).unwrap();
        let b = LocalMaster::open_or_create(&p).unwrap();
        assert_eq!(a.id(), b.id());
        assert!(a.id().starts_with("local:"));
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(&p, "zz").unwrap();
        assert!(LocalMaster::open_or_create(&p).is_err());
    }
}
