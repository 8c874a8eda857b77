//! Build inputs a cluster keeps in the object store: a Dockerfile's context or an image
//! archive uploaded to one control replica (`POST /v1/template-uploads`) and read by the node
//! that builds from it, which shares no disk with that replica.
//!
//! Upload `<id>` is the objects `uploads/<id>/part-<n>` (8 MiB of the upload each) and
//! `uploads/<id>/meta` (its size, part count, owner and SHA-256), each sealed under the key of
//! lineage `upload.<id>`, which the owning tenant's key wraps like any lineage key. The meta
//! object is written last: an upload that broke off has none and is never read. Only the
//! tenant that uploaded it can open it (a build naming another tenant's upload finds nothing),
//! every part is checked (AES-GCM, then the whole upload's SHA-256) before the file it makes
//! is used, and an upload goes after [`UPLOAD_TTL`] (a garbage collection pass, [`expire`]).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::crypto::LineageKeys;
use crate::keys::{KeyError, Keyring};
use crate::store::{component, Archive, StoreError};

/// The bytes of an upload in one part object.
pub const PART_BYTES: usize = 8 << 20;
/// How long an upload is kept after it was made.
pub const UPLOAD_TTL: Duration = Duration::from_secs(24 * 3600);
/// The largest meta object read.
const MAX_META_BYTES: u64 = 64 << 10;

/// What went wrong with an upload.
#[derive(Debug, thiserror::Error)]
pub enum UploadsError {
    /// No such upload for this tenant (never made, broken off, expired, or another's).
    #[error("no upload {0}")]
    Missing(String),
    /// An upload id that is not one.
    #[error("{0:?} is not an upload id")]
    BadId(String),
    /// Stored data that does not open or does not match its meta.
    #[error("upload {id}: {detail}")]
    Corrupt {
        /// The upload.
        id: String,
        /// What did not match.
        detail: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A key did not open for a reason other than the tenant (the master key provider).
    #[error(transparent)]
    Key(KeyError),
    /// The local file.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

/// What `uploads/<id>/meta` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    id: String,
    tenant: String,
    bytes: u64,
    parts: u32,
    sha256: String,
    created_unix_ms: u64,
}

/// Whether `id` has the form upload ids have (`upl-` and hex, as the API makes them).
pub fn valid_id(id: &str) -> bool {
    id.len() <= 64
        && id.starts_with("upl-")
        && id.len() > 4
        && id[4..].bytes().all(|b| b.is_ascii_hexdigit())
}

fn checked(id: &str) -> Result<&str, UploadsError> {
    if valid_id(id) {
        Ok(id)
    } else {
        Err(UploadsError::BadId(id.chars().take(70).collect()))
    }
}

fn lineage(id: &str) -> String {
    format!("upload.{id}")
}

fn object(id: &str, leaf: &str) -> Result<ObjPath, UploadsError> {
    Ok(ObjPath::from(format!(
        "uploads/{}/{}",
        component(id)?,
        component(leaf)?
    )))
}

fn part_leaf(n: u32) -> String {
    format!("part-{n:06}")
}

/// The keys of `tenant`'s upload `id`. Asked fresh every time: the cache is keyed by lineage
/// alone, and an upload's lineage must open under the tenant that names it.
async fn keys(
    keyring: &Keyring,
    tenant: &str,
    id: &str,
    create: bool,
) -> Result<Arc<LineageKeys>, UploadsError> {
    match keyring
        .lineage_keys(tenant, &lineage(id), create, true)
        .await
    {
        Ok(k) => Ok(k),
        // Another tenant's key, or none: to this tenant there is no such upload.
        Err(KeyError::Open { .. } | KeyError::Missing { .. }) => {
            Err(UploadsError::Missing(id.to_owned()))
        }
        Err(KeyError::Store(e)) => Err(UploadsError::Store(e)),
        Err(e) => Err(UploadsError::Key(e)),
    }
}

/// An upload being written: [`UploadWriter::write`] as the bytes arrive, then
/// [`UploadWriter::finish`]. Dropped unfinished, it leaves parts no meta names, which
/// [`expire`] removes.
pub struct UploadWriter {
    archive: Archive,
    keys: Arc<LineageKeys>,
    tenant: String,
    id: String,
    buf: Vec<u8>,
    parts: u32,
    bytes: u64,
    sha: Sha256,
}

impl std::fmt::Debug for UploadWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadWriter")
            .field("id", &self.id)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl UploadWriter {
    /// Starts upload `id` of `tenant` (its key is made now).
    pub async fn start(
        keyring: &Keyring,
        tenant: &str,
        id: &str,
    ) -> Result<UploadWriter, UploadsError> {
        checked(id)?;
        let keys = keys(keyring, tenant, id, true).await?;
        Ok(UploadWriter {
            archive: keyring.archive().clone(),
            keys,
            tenant: tenant.to_owned(),
            id: id.to_owned(),
            buf: Vec::with_capacity(PART_BYTES),
            parts: 0,
            bytes: 0,
            sha: Sha256::new(),
        })
    }

    /// The bytes taken so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes the next bytes of the upload; a full part goes to the store.
    pub async fn write(&mut self, mut data: &[u8]) -> Result<(), UploadsError> {
        self.sha.update(data);
        self.bytes += data.len() as u64;
        while !data.is_empty() {
            let room = PART_BYTES - self.buf.len();
            let n = room.min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.buf.len() == PART_BYTES {
                self.put_part().await?;
            }
        }
        Ok(())
    }

    async fn put_part(&mut self) -> Result<(), UploadsError> {
        let leaf = part_leaf(self.parts);
        let sealed = self.keys.seal_object(&leaf, &self.buf);
        self.archive
            .put(&object(&self.id, &leaf)?, Bytes::from(sealed))
            .await?;
        self.buf.clear();
        self.parts += 1;
        Ok(())
    }

    /// Stores the last part and the meta object: from now on the upload can be read.
    /// Answers its size.
    pub async fn finish(mut self) -> Result<u64, UploadsError> {
        if !self.buf.is_empty() || self.parts == 0 {
            self.put_part().await?;
        }
        let meta = Meta {
            id: self.id.clone(),
            tenant: self.tenant.clone(),
            bytes: self.bytes,
            parts: self.parts,
            sha256: hex::encode(self.sha.clone().finalize()),
            created_unix_ms: now_ms(),
        };
        let plain = serde_json::to_vec(&meta).expect("serializes");
        let sealed = self.keys.seal_object("meta", &plain);
        self.archive
            .put(&object(&self.id, "meta")?, Bytes::from(sealed))
            .await?;
        Ok(self.bytes)
    }
}

async fn meta(
    archive: &Archive,
    keys: &LineageKeys,
    tenant: &str,
    id: &str,
) -> Result<Meta, UploadsError> {
    let Some(sealed) = archive
        .get_bounded(&object(id, "meta")?, MAX_META_BYTES)
        .await?
    else {
        return Err(UploadsError::Missing(id.to_owned()));
    };
    let corrupt = |detail: String| UploadsError::Corrupt {
        id: id.to_owned(),
        detail,
    };
    let plain = keys
        .open_object("meta", &sealed)
        .map_err(|e| corrupt(format!("meta: {e}")))?;
    let m: Meta = serde_json::from_slice(&plain).map_err(|e| corrupt(format!("meta: {e}")))?;
    if m.id != id || m.tenant != tenant {
        return Err(UploadsError::Missing(id.to_owned()));
    }
    Ok(m)
}

/// The size of `tenant`'s complete upload `id`.
pub async fn size(keyring: &Keyring, tenant: &str, id: &str) -> Result<u64, UploadsError> {
    checked(id)?;
    let keys = keys(keyring, tenant, id, false).await?;
    Ok(meta(keyring.archive(), &keys, tenant, id).await?.bytes)
}

/// Writes `tenant`'s upload `id` to the new file `dest`, every part opened and the whole
/// checked against its SHA-256 before this answers; a failure leaves no file.
pub async fn fetch(
    keyring: &Keyring,
    tenant: &str,
    id: &str,
    dest: &Path,
) -> Result<u64, UploadsError> {
    checked(id)?;
    let keys = keys(keyring, tenant, id, false).await?;
    let archive = keyring.archive();
    let m = meta(archive, &keys, tenant, id).await?;
    let io = |what: &str| {
        let what = format!("{what} {}", dest.display());
        move |source| UploadsError::Io { what, source }
    };
    let result = async {
        let mut f = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(dest)
            .await
            .map_err(io("creating"))?;
        let mut sha = Sha256::new();
        let mut bytes = 0u64;
        for n in 0..m.parts {
            let leaf = part_leaf(n);
            let sealed = archive
                .get_bounded(&object(id, &leaf)?, (PART_BYTES + 64) as u64)
                .await?
                .ok_or_else(|| UploadsError::Corrupt {
                    id: id.to_owned(),
                    detail: format!("{leaf} is missing"),
                })?;
            let plain = keys
                .open_object(&leaf, &sealed)
                .map_err(|e| UploadsError::Corrupt {
                    id: id.to_owned(),
                    detail: format!("{leaf}: {e}"),
                })?;
            sha.update(&plain);
            bytes += plain.len() as u64;
            f.write_all(&plain).await.map_err(io("writing"))?;
        }
        f.flush().await.map_err(io("writing"))?;
        let got = hex::encode(sha.finalize());
        if bytes != m.bytes || got != m.sha256 {
            return Err(UploadsError::Corrupt {
                id: id.to_owned(),
                detail: format!(
                    "{bytes} bytes with SHA-256 {got}, not the {} uploaded",
                    m.bytes
                ),
            });
        }
        Ok(bytes)
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(dest).await;
    }
    result
}

/// Removes every upload (complete or broken off) older than `ttl`, and its key. Answers how
/// many went.
pub async fn expire(archive: &Archive, ttl: Duration) -> Result<usize, StoreError> {
    let mut by_id: std::collections::BTreeMap<String, (Vec<ObjPath>, Duration)> =
        Default::default();
    for (p, _, age) in archive.list_with_age(&ObjPath::from("uploads")).await? {
        let parts: Vec<&str> = p.as_ref().split('/').collect();
        if let ["uploads", id, _] = parts.as_slice() {
            let e = by_id.entry((*id).to_owned()).or_default();
            e.0.push(p.clone());
            // The upload's age is its newest object's: one still being written is young.
            e.1 = if e.0.len() == 1 { age } else { e.1.min(age) };
        }
    }
    let mut gone = 0;
    for (id, (objects, age)) in by_id {
        if age < ttl {
            continue;
        }
        for p in &objects {
            archive.delete(p).await?;
        }
        archive
            .delete(&archive.lineage_key_path(&lineage(&id))?)
            .await?;
        gone += 1;
    }
    Ok(gone)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{LocalMaster, MasterKey, NoAudit};
    use crate::store::StoreConfig;

    async fn keyring(dir: &Path) -> Keyring {
        let archive = Archive::open(&StoreConfig::Local(dir.join("store")))
            .await
            .unwrap();
        let master: Arc<dyn MasterKey> =
            Arc::new(LocalMaster::from_key(crate::crypto::Key::random()));
        Keyring::new(
            archive,
            Arc::new(master),
            Arc::new(NoAudit),
            Duration::from_secs(60),
        )
    }

    #[tokio::test]
    async fn an_upload_reads_back_whole_for_its_tenant_only() {
        let dir = tempfile::tempdir().unwrap();
        let kr = keyring(dir.path()).await;
        let data = crate::testing::noise(3, PART_BYTES + 1234);
        let mut w = UploadWriter::start(&kr, "acme", "upl-00aa").await.unwrap();
        // Not readable before it is finished.
        for chunk in data.chunks(100_000) {
            w.write(chunk).await.unwrap();
        }
        assert!(matches!(
            size(&kr, "acme", "upl-00aa").await,
            Err(UploadsError::Missing(_))
        ));
        assert_eq!(w.finish().await.unwrap(), data.len() as u64);
        assert_eq!(
            size(&kr, "acme", "upl-00aa").await.unwrap(),
            data.len() as u64
        );
        let out = dir.path().join("out");
        fetch(&kr, "acme", "upl-00aa", &out).await.unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), data);
        // Another tenant names it: there is no such upload, and no file is made.
        kr.ensure_tenant_key("other").await.unwrap();
        let theirs = dir.path().join("theirs");
        assert!(matches!(
            fetch(&kr, "other", "upl-00aa", &theirs).await,
            Err(UploadsError::Missing(_))
        ));
        assert!(!theirs.exists());
        assert!(matches!(
            size(&kr, "acme", "../etc").await,
            Err(UploadsError::BadId(_))
        ));
    }

    #[tokio::test]
    async fn a_changed_part_is_refused_and_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let kr = keyring(dir.path()).await;
        let mut w = UploadWriter::start(&kr, "acme", "upl-01").await.unwrap();
        w.write(b"FROM minimal\n").await.unwrap();
        w.finish().await.unwrap();
        let p = object("upl-01", &part_leaf(0)).unwrap();
        let mut sealed = kr.archive().get_small(&p).await.unwrap().unwrap().to_vec();
        let last = sealed.len() - 1;
        sealed[last] ^= 1;
        kr.archive().put(&p, Bytes::from(sealed)).await.unwrap();
        let out = dir.path().join("out");
        let e = fetch(&kr, "acme", "upl-01", &out).await.unwrap_err();
        assert!(matches!(e, UploadsError::Corrupt { .. }), "{e}");
        assert!(!out.exists());
    }

    #[tokio::test]
    async fn expire_removes_old_uploads_and_their_keys() {
        let dir = tempfile::tempdir().unwrap();
        let kr = keyring(dir.path()).await;
        let mut w = UploadWriter::start(&kr, "acme", "upl-02").await.unwrap();
        w.write(b"x").await.unwrap();
        w.finish().await.unwrap();
        assert_eq!(expire(kr.archive(), UPLOAD_TTL).await.unwrap(), 0);
        assert_eq!(expire(kr.archive(), Duration::ZERO).await.unwrap(), 1);
        assert!(matches!(
            size(&kr, "acme", "upl-02").await,
            Err(UploadsError::Missing(_))
        ));
        let key = kr.archive().lineage_key_path("upload.upl-02").unwrap();
        assert!(kr.archive().get_small(&key).await.unwrap().is_none());
    }
}
