//! The object store under an archive, and where each kind of object lives in it.
//!
//! ```text
//! <prefix>/format                                    "space-archive 1"
//! <prefix>/tenants/<tenant>/key                      the tenant key, wrapped by its master key
//! <prefix>/lineages/<lineage>/key                    the lineage key, wrapped by the tenant key
//! <prefix>/lineages/<lineage>/packs/<pack>           packed sealed chunks
//! <prefix>/sandboxes/<sandbox>/manifests/<snapshot>  one sealed manifest per archived snapshot
//! <prefix>/sandboxes/<sandbox>/head                  the newest archived snapshot, in clear
//! <prefix>/templates/<name>/<version>/manifest       a template's archive (lineage `tpl.<name>.<version>`)
//! <prefix>/templates/<name>/<version>/head           its manifest hash
//! ```
//!
//! What is in clear: ids (tenant, lineage, sandbox, snapshot, template) and sizes. Everything a
//! sandbox holds, its record included, is sealed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use crate::manifest::safe_component;

const FORMAT_OBJECT: &str = "format";
const FORMAT_TEXT: &str = "space-archive 1\n";
/// Small objects (keys, heads, the format marker) are read whole up to this size.
const MAX_SMALL_OBJECT: u64 = 1 << 20;

/// Errors of the store layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The object store failed or is unreachable.
    #[error("object store {store}: {op} {path}: {source}")]
    Backend {
        /// The store, as configured.
        store: String,
        /// What was being done.
        op: &'static str,
        /// The object.
        path: String,
        /// The backend's error.
        source: Box<object_store::Error>,
    },
    /// An object that must exist does not.
    #[error("object store {store}: {path} does not exist")]
    Missing {
        /// The store.
        store: String,
        /// The object.
        path: String,
    },
    /// An object that must be small is not.
    #[error(
        "object store {store}: {path} is {size} bytes, more than an object of its kind can be"
    )]
    TooLarge {
        /// The store.
        store: String,
        /// The object.
        path: String,
        /// Its size.
        size: u64,
    },
    /// A name that cannot be part of an object path.
    #[error("{0:?} cannot name an object")]
    Name(String),
    /// A configuration error.
    #[error("object store configuration: {0}")]
    Config(String),
    /// The store holds another format.
    #[error("object store {store}: {detail}")]
    Format {
        /// The store.
        store: String,
        /// What is wrong.
        detail: String,
    },
}

/// How to reach the object store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// A directory on this host.
    Local(std::path::PathBuf),
    /// An S3 bucket.
    S3(S3Config),
}

/// S3 settings. Unset fields come from the usual `AWS_*` environment variables.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct S3Config {
    /// The bucket.
    pub bucket: String,
    /// A prefix inside it (no leading or trailing `/`), or empty.
    pub prefix: String,
    /// Endpoint URL for a self-hosted server (`http://127.0.0.1:3900`); path-style requests
    /// are used when one is set.
    pub endpoint: Option<String>,
    /// Region (`AWS_REGION`; many self-hosted servers use `garage` or `us-east-1`).
    pub region: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| ".."),
            )
            .finish()
    }
}

impl StoreConfig {
    /// Parses `s3://bucket[/prefix]`, `file:///path` or a plain path. S3 credentials, region
    /// and endpoint come from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_REGION`, `AWS_ENDPOINT_URL`) unless set on the result.
    pub fn parse(s: &str) -> Result<StoreConfig, StoreError> {
        if let Some(rest) = s.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(StoreError::Config(format!("{s}: no bucket")));
            }
            let prefix = prefix.trim_matches('/').to_owned();
            if !prefix.is_empty() && !crate::manifest::safe_relative_path(&prefix) {
                return Err(StoreError::Config(format!("{s}: prefix {prefix:?}")));
            }
            let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
            return Ok(StoreConfig::S3(S3Config {
                bucket: bucket.to_owned(),
                prefix,
                endpoint: env("AWS_ENDPOINT_URL_S3").or_else(|| env("AWS_ENDPOINT_URL")),
                region: env("AWS_REGION").or_else(|| env("AWS_DEFAULT_REGION")),
                access_key_id: env("AWS_ACCESS_KEY_ID"),
                secret_access_key: env("AWS_SECRET_ACCESS_KEY"),
            }));
        }
        let path = s.strip_prefix("file://").unwrap_or(s);
        if path.is_empty() || s.contains("://") && !s.starts_with("file://") {
            return Err(StoreError::Config(format!(
                "{s}: expected s3://bucket/prefix, file:///path or a directory"
            )));
        }
        Ok(StoreConfig::Local(path.into()))
    }
}

impl std::fmt::Display for StoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreConfig::Local(p) => write!(f, "file://{}", p.display()),
            StoreConfig::S3(c) if c.prefix.is_empty() => write!(f, "s3://{}", c.bucket),
            StoreConfig::S3(c) => write!(f, "s3://{}/{}", c.bucket, c.prefix),
        }
    }
}

/// An archive: an object store and the object paths of the format. Cheap to clone.
#[derive(Clone)]
pub struct Archive {
    store: Arc<dyn ObjectStore>,
    name: Arc<str>,
    /// The directory of a local store, made by [`Archive::check`].
    local: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Archive({})", self.name)
    }
}

/// What the head object of an archived sandbox says, in clear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Head {
    /// Format of this object (1).
    pub format: u32,
    /// The sandbox.
    pub sandbox: String,
    /// Its tenant.
    pub tenant: String,
    /// Its lineage.
    pub lineage: String,
    /// The newest archived snapshot.
    pub snapshot: String,
    /// That snapshot's manifest hash.
    pub manifest_hash: String,
    /// When the head was written, ms since the Unix epoch.
    pub updated_unix_ms: u64,
    /// The sandbox was killed: a node that finds the head does not bring it back (its
    /// manifests stay until retention or shredding removes them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub terminated: bool,
    /// The ownership epoch of the node that wrote it (0: the sandbox's first owner). A node
    /// never replaces a head of a newer epoch than its own: the sandbox moved away from it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Checks that `s` can be one path component.
pub fn component(s: &str) -> Result<&str, StoreError> {
    if safe_component(s) {
        Ok(s)
    } else {
        Err(StoreError::Name(s.to_owned()))
    }
}

impl Archive {
    /// Opens the store and checks (or, in an empty store, writes) the format marker.
    pub async fn open(config: &StoreConfig) -> Result<Archive, StoreError> {
        let archive = Archive::new(config)?;
        archive.check_format().await?;
        Ok(archive)
    }

    /// Builds the client without talking to the store (the first use finds out whether it
    /// is reachable); [`Archive::check`] checks the format marker.
    pub fn new(config: &StoreConfig) -> Result<Archive, StoreError> {
        let mut local = None;
        let store: Arc<dyn ObjectStore> = match config {
            StoreConfig::Local(dir) => {
                // The directory need not exist yet (it may be under a data directory that is
                // mounted later); `check` makes it. Files are synced before a put returns.
                let abs = if dir.is_absolute() {
                    dir.clone()
                } else {
                    std::env::current_dir()
                        .map_err(|e| StoreError::Config(format!("{}: {e}", dir.display())))?
                        .join(dir)
                };
                let rel = abs.to_string_lossy().trim_start_matches('/').to_owned();
                let prefix = ObjPath::parse(&rel)
                    .map_err(|e| StoreError::Config(format!("{}: {e}", abs.display())))?;
                let fs = object_store::local::LocalFileSystem::new()
                    .with_automatic_cleanup(true)
                    .with_fsync(true);
                local = Some(abs);
                Arc::new(object_store::prefix::PrefixStore::new(fs, prefix))
            }
            StoreConfig::S3(c) => {
                let mut b = object_store::aws::AmazonS3Builder::new()
                    .with_bucket_name(&c.bucket)
                    .with_retry(object_store::RetryConfig {
                        max_retries: 3,
                        retry_timeout: Duration::from_secs(10),
                        ..Default::default()
                    })
                    .with_client_options(
                        object_store::ClientOptions::new()
                            .with_connect_timeout(Duration::from_secs(5))
                            .with_timeout(Duration::from_secs(120)),
                    );
                if let Some(e) = &c.endpoint {
                    let plain = e.starts_with("http://");
                    b = b
                        .with_endpoint(e)
                        .with_virtual_hosted_style_request(false)
                        .with_allow_http(plain);
                    if plain {
                        b = b.with_http_connector(crate::http_client::QuickAckConnector);
                    }
                }
                b = b.with_region(c.region.as_deref().unwrap_or("us-east-1"));
                if let Some(k) = &c.access_key_id {
                    b = b.with_access_key_id(k);
                }
                if let Some(k) = &c.secret_access_key {
                    b = b.with_secret_access_key(k);
                }
                let s3 = b
                    .build()
                    .map_err(|e| StoreError::Config(format!("{config}: {e}")))?;
                if c.prefix.is_empty() {
                    Arc::new(s3)
                } else {
                    Arc::new(object_store::prefix::PrefixStore::new(
                        s3,
                        c.prefix.as_str(),
                    ))
                }
            }
        };
        Ok(Archive {
            store,
            name: config.to_string().into(),
            local,
        })
    }

    /// Checks (or, in an empty store, writes) the format marker.
    pub async fn check(&self) -> Result<(), StoreError> {
        self.check_format().await
    }

    /// Wraps an object store someone else built (tests, other backends).
    pub async fn from_store(
        store: Arc<dyn ObjectStore>,
        name: &str,
    ) -> Result<Archive, StoreError> {
        let a = Archive {
            store,
            name: name.into(),
            local: None,
        };
        a.check_format().await?;
        Ok(a)
    }

    async fn check_format(&self) -> Result<(), StoreError> {
        if let Some(dir) = &self.local {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Config(format!("creating {}: {e}", dir.display())))?;
        }
        let p = ObjPath::from(FORMAT_OBJECT);
        match self.get_small(&p).await? {
            Some(b) if b.as_ref() == FORMAT_TEXT.as_bytes() => Ok(()),
            Some(b) => Err(StoreError::Format {
                store: self.name.to_string(),
                detail: format!(
                    "holds {:?}, this build reads {:?}",
                    String::from_utf8_lossy(&b[..b.len().min(64)]),
                    FORMAT_TEXT.trim()
                ),
            }),
            None => {
                // Create-only: two nodes starting on an empty store write the same bytes.
                match self
                    .store
                    .put_opts(
                        &p,
                        Bytes::from_static(FORMAT_TEXT.as_bytes()).into(),
                        PutMode::Create.into(),
                    )
                    .await
                {
                    Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
                    Err(object_store::Error::NotImplemented { .. }) => {
                        self.put(&p, Bytes::from_static(FORMAT_TEXT.as_bytes()))
                            .await
                    }
                    Err(source) => Err(self.backend("writing", &p, source)),
                }
            }
        }
    }

    /// The store as configured, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn backend(&self, op: &'static str, p: &ObjPath, source: object_store::Error) -> StoreError {
        StoreError::Backend {
            store: self.name.to_string(),
            op,
            path: p.to_string(),
            source: Box::new(source),
        }
    }

    // ---- paths -------------------------------------------------------------------------

    /// `tenants/<tenant>/key`.
    pub fn tenant_key_path(&self, tenant: &str) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!("tenants/{}/key", component(tenant)?)))
    }

    /// `lineages/<lineage>/key`.
    pub fn lineage_key_path(&self, lineage: &str) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!(
            "lineages/{}/key",
            component(lineage)?
        )))
    }

    /// `lineages/<lineage>/packs/<pack>`.
    pub fn pack_path(&self, lineage: &str, pack: &str) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!(
            "lineages/{}/packs/{}",
            component(lineage)?,
            component(pack)?
        )))
    }

    /// `lineages/<lineage>/packs/`.
    pub fn packs_prefix(&self, lineage: &str) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!(
            "lineages/{}/packs",
            component(lineage)?
        )))
    }

    /// `sandboxes/<sandbox>/manifests/<snapshot>`.
    pub fn manifest_path(&self, sandbox: &str, snapshot: &str) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!(
            "sandboxes/{}/manifests/{}",
            component(sandbox)?,
            component(snapshot)?
        )))
    }

    /// `sandboxes/<sandbox>/head`.
    pub fn head_path(&self, sandbox: &str) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!(
            "sandboxes/{}/head",
            component(sandbox)?
        )))
    }

    /// `templates/<name>/<version>/<leaf>`.
    pub fn template_path(
        &self,
        name: &str,
        version: &str,
        leaf: &str,
    ) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!(
            "templates/{}/{}/{}",
            component(name)?,
            component(version)?,
            component(leaf)?
        )))
    }

    // ---- objects -----------------------------------------------------------------------

    /// Writes an object whole (atomic: readers see the old object or the new one).
    pub async fn put(&self, p: &ObjPath, bytes: Bytes) -> Result<(), StoreError> {
        self.store
            .put(p, PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|e| self.backend("writing", p, e))
    }

    /// Writes an object only if none exists; `Ok(false)` when one does.
    pub async fn put_new(&self, p: &ObjPath, bytes: Bytes) -> Result<bool, StoreError> {
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self.store.put_opts(p, bytes.clone().into(), opts).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            // A server without conditional writes: check, then write (racy but the callers
            // write keys from one place per lineage).
            Err(object_store::Error::NotImplemented { .. }) => {
                if self.get_small(p).await?.is_some() {
                    return Ok(false);
                }
                self.put(p, bytes).await.map(|_| true)
            }
            Err(e) => Err(self.backend("writing", p, e)),
        }
    }

    /// Reads a small object whole, or `None` if it does not exist.
    pub async fn get_small(&self, p: &ObjPath) -> Result<Option<Bytes>, StoreError> {
        self.get_bounded(p, MAX_SMALL_OBJECT).await
    }

    /// Reads an object whole if it is at most `max` bytes; `None` if it does not exist.
    pub async fn get_bounded(&self, p: &ObjPath, max: u64) -> Result<Option<Bytes>, StoreError> {
        let r = match self.store.get(p).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.backend("reading", p, e)),
        };
        if r.meta.size > max {
            return Err(StoreError::TooLarge {
                store: self.name.to_string(),
                path: p.to_string(),
                size: r.meta.size,
            });
        }
        r.bytes()
            .await
            .map(Some)
            .map_err(|e| self.backend("reading", p, e))
    }

    /// Reads byte ranges of one object (adjacent ranges are merged into one request).
    pub async fn get_ranges(
        &self,
        p: &ObjPath,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Vec<Bytes>, StoreError> {
        self.store.get_ranges(p, ranges).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => StoreError::Missing {
                store: self.name.to_string(),
                path: p.to_string(),
            },
            e => self.backend("reading", p, e),
        })
    }

    /// Reads one byte range of an object.
    pub async fn get_range(
        &self,
        p: &ObjPath,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes, StoreError> {
        let mut v = self.get_ranges(p, std::slice::from_ref(&range)).await?;
        Ok(v.pop().unwrap_or_default())
    }

    /// Deletes an object; a missing one is not an error.
    pub async fn delete(&self, p: &ObjPath) -> Result<(), StoreError> {
        match self.store.delete(p).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.backend("deleting", p, e)),
        }
    }

    /// Every object under `prefix`, with its size.
    pub async fn list(&self, prefix: &ObjPath) -> Result<Vec<(ObjPath, u64)>, StoreError> {
        let mut out = Vec::new();
        let mut s = self.store.list(Some(prefix));
        while let Some(item) = s.next().await {
            let meta = item.map_err(|e| self.backend("listing", prefix, e))?;
            out.push((meta.location, meta.size));
        }
        Ok(out)
    }

    /// Every object under `prefix`, with its size and how long ago it was written.
    pub async fn list_with_age(
        &self,
        prefix: &ObjPath,
    ) -> Result<Vec<(ObjPath, u64, Duration)>, StoreError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        let mut out = Vec::new();
        let mut s = self.store.list(Some(prefix));
        while let Some(item) = s.next().await {
            let meta = item.map_err(|e| self.backend("listing", prefix, e))?;
            let age = now
                .saturating_sub(meta.last_modified.timestamp_millis())
                .max(0) as u64;
            out.push((meta.location, meta.size, Duration::from_millis(age)));
        }
        Ok(out)
    }

    /// The heads of every archived sandbox.
    pub async fn heads(&self) -> Result<Vec<Head>, StoreError> {
        let mut heads = Vec::new();
        for (p, _) in self.list(&ObjPath::from("sandboxes")).await? {
            if p.filename() != Some("head") {
                continue;
            }
            let Some(bytes) = self.get_small(&p).await? else {
                continue;
            };
            match serde_json::from_slice::<Head>(&bytes) {
                Ok(h)
                    if safe_component(&h.sandbox)
                        && p.as_ref() == format!("sandboxes/{}/head", h.sandbox) =>
                {
                    heads.push(h)
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(object = %p, "ignoring a head object that does not parse or names another sandbox");
                }
            }
        }
        heads.sort_by(|a, b| a.sandbox.cmp(&b.sandbox));
        Ok(heads)
    }

    /// The head of one sandbox.
    pub async fn head(&self, sandbox: &str) -> Result<Option<Head>, StoreError> {
        let p = self.head_path(sandbox)?;
        let Some(bytes) = self.get_small(&p).await? else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StoreError::Format {
                store: self.name.to_string(),
                detail: format!("{p}: {e}"),
            })
    }

    /// Writes a sandbox's head.
    pub async fn put_head(&self, head: &Head) -> Result<(), StoreError> {
        let p = self.head_path(&head.sandbox)?;
        let bytes = serde_json::to_vec_pretty(head).expect("a head serializes");
        self.put(&p, bytes.into()).await
    }

    /// The raw object store (tests, garbage collection).
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_configs() {
        assert_eq!(
            StoreConfig::parse("/var/lib/x").unwrap(),
            StoreConfig::Local("/var/lib/x".into())
        );
        assert_eq!(
            StoreConfig::parse("file:///srv/a").unwrap(),
            StoreConfig::Local("/srv/a".into())
        );
        match StoreConfig::parse("s3://bucket/some/prefix/").unwrap() {
            StoreConfig::S3(c) => {
                assert_eq!(c.bucket, "bucket");
                assert_eq!(c.prefix, "some/prefix");
            }
            other => panic!("{other:?}"),
        }
        assert!(StoreConfig::parse("s3://").is_err());
        assert!(StoreConfig::parse("gs://b").is_err());
        assert!(StoreConfig::parse("s3://b/../x").is_err());
        let c = S3Config {
            secret_access_key: Some("hunter2".into()),
            ..Default::default()
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[tokio::test]
    async fn local_store_objects_and_format() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig::Local(dir.path().join("store"));
        let a = Archive::open(&cfg).await.unwrap();
        // Reopening finds the marker.
        let a2 = Archive::open(&cfg).await.unwrap();
        let p = a.head_path("sbx-1").unwrap();
        assert_eq!(a.get_small(&p).await.unwrap(), None);
        assert!(a.put_new(&p, Bytes::from_static(b"1")).await.unwrap());
        assert!(!a2.put_new(&p, Bytes::from_static(b"2")).await.unwrap());
        assert_eq!(a.get_small(&p).await.unwrap().unwrap().as_ref(), b"1");
        let big = a.pack_path("lin", "p1").unwrap();
        a.put(&big, Bytes::from(vec![7u8; 3000])).await.unwrap();
        assert!(matches!(
            a.get_bounded(&big, 100).await,
            Err(StoreError::TooLarge { size: 3000, .. })
        ));
        let parts = a.get_ranges(&big, &[0..2, 2..5, 100..101]).await.unwrap();
        assert_eq!(parts.iter().map(|b| b.len()).collect::<Vec<_>>(), [2, 3, 1]);
        assert!(matches!(
            a.get_range(&a.pack_path("lin", "nope").unwrap(), 0..1)
                .await,
            Err(StoreError::Missing { .. })
        ));
        assert!(a.pack_path("lin", "../x").is_err());
        a.delete(&big).await.unwrap();
        a.delete(&big).await.unwrap();

        // Another format in the same place is refused.
        std::fs::write(dir.path().join("store/format"), "something else").unwrap();
        let err = Archive::open(&cfg).await.unwrap_err();
        assert!(err.to_string().contains("something else"), "{err}");
    }
}
