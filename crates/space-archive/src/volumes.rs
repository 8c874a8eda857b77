//! Copies of volumes in the store (`docs/volumes.md`, *Copies in the object store*).
//!
//! A volume is its own lineage, named by the volume's id (`vol-` and 16 hex digits), under its
//! tenant's key. Each copy is a manifest like a snapshot's, one file per regular file of the
//! volume (named by number; the tree itself, with directories, links and modes, is the
//! manifest's record), at `volumes/<id>/manifests/<seq>`, where `seq` grows by one per copy.
//! The head at `volumes/<id>/head` names the newest copy; it is written after the manifest, so
//! a head always names a complete copy.

use bytes::Bytes;
use object_store::path::Path as ObjPath;
use serde::{Deserialize, Serialize};

use crate::manifest::safe_component;
use crate::store::{component, Archive, StoreError};

/// Whether `lineage` is a volume's.
pub fn is_volume_lineage(lineage: &str) -> bool {
    lineage.strip_prefix("vol-").is_some_and(|h| {
        h.len() == 16
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// What the head object of a volume's copies says, in clear.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeHead {
    /// Format of this object (1).
    pub format: u32,
    /// The volume (and its lineage).
    pub volume: String,
    /// Its tenant.
    pub tenant: String,
    /// The newest copy.
    pub seq: u64,
    /// Its manifest's hash.
    pub manifest_hash: String,
    /// Every write the volume acknowledged before this moment (ms since the Unix epoch) is in
    /// the copy.
    pub synced_unix_ms: u64,
    /// When the head was written.
    pub updated_unix_ms: u64,
    /// The placement epoch of the node that wrote it: a node never replaces the head of a
    /// newer epoch than its own (the volume moved away from it).
    #[serde(default)]
    pub epoch: u64,
    /// The node that wrote it, for messages.
    #[serde(default)]
    pub node: String,
}

/// The name of copy `seq` (fixed width, so names sort by number).
pub fn copy_name(seq: u64) -> String {
    format!("{seq:020}")
}

impl Archive {
    /// `volumes/<id>/head`.
    pub fn volume_head_path(&self, volume: &str) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!(
            "volumes/{}/head",
            component(volume)?
        )))
    }

    /// `volumes/<id>/manifests`.
    pub fn volume_manifests_prefix(&self, volume: &str) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!(
            "volumes/{}/manifests",
            component(volume)?
        )))
    }

    /// `volumes/<id>/manifests/<seq>`.
    pub fn volume_manifest_path(&self, volume: &str, seq: u64) -> Result<ObjPath, StoreError> {
        Ok(ObjPath::from(format!(
            "volumes/{}/manifests/{}",
            component(volume)?,
            copy_name(seq)
        )))
    }

    /// The head of volume `volume`'s copies, if it has any.
    pub async fn volume_head(&self, volume: &str) -> Result<Option<VolumeHead>, StoreError> {
        let p = self.volume_head_path(volume)?;
        let Some(bytes) = self.get_small(&p).await? else {
            return Ok(None);
        };
        match serde_json::from_slice::<VolumeHead>(&bytes) {
            Ok(h) if h.volume == volume => Ok(Some(h)),
            Ok(h) => Err(StoreError::Format {
                store: self.name().to_owned(),
                detail: format!("{p} names volume {}", h.volume),
            }),
            Err(e) => Err(StoreError::Format {
                store: self.name().to_owned(),
                detail: format!("{p}: {e}"),
            }),
        }
    }

    /// Writes a volume's head.
    pub async fn put_volume_head(&self, head: &VolumeHead) -> Result<(), StoreError> {
        let p = self.volume_head_path(&head.volume)?;
        let bytes = serde_json::to_vec_pretty(head).expect("a head serializes");
        self.put(&p, Bytes::from(bytes)).await
    }

    /// The heads of every volume with copies.
    pub async fn volume_heads(&self) -> Result<Vec<VolumeHead>, StoreError> {
        let mut heads = Vec::new();
        for (p, _) in self.list(&ObjPath::from("volumes")).await? {
            let parts: Vec<&str> = p.as_ref().split('/').collect();
            let ["volumes", id, "head"] = parts.as_slice() else {
                continue;
            };
            if !safe_component(id) {
                continue;
            }
            match self.volume_head(id).await {
                Ok(Some(h)) => heads.push(h),
                Ok(None) => {}
                Err(e) => tracing::warn!(object = %p, error = %e, "ignoring a volume head"),
            }
        }
        heads.sort_by(|a, b| a.volume.cmp(&b.volume));
        Ok(heads)
    }

    /// The copies of `volume` in the store, by number.
    pub async fn volume_copies(&self, volume: &str) -> Result<Vec<(u64, ObjPath)>, StoreError> {
        let mut out = Vec::new();
        for (p, _) in self.list(&self.volume_manifests_prefix(volume)?).await? {
            if let Some(seq) = p.filename().and_then(|f| f.parse::<u64>().ok()) {
                out.push((seq, p));
            }
        }
        out.sort_by_key(|(s, _)| *s);
        Ok(out)
    }

    /// Removes a volume's manifests and head (its packs go with its key: garbage collection
    /// removes the packs of a lineage without a key).
    pub async fn delete_volume_copies(&self, volume: &str) -> Result<(), StoreError> {
        self.delete(&self.volume_head_path(volume)?).await?;
        for (_, p) in self.volume_copies(volume).await? {
            self.delete(&p).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_lineages_are_told_apart() {
        assert!(is_volume_lineage("vol-0123456789abcdef"));
        assert!(!is_volume_lineage("vol-0123456789ABCDEF"));
        assert!(!is_volume_lineage("vol-0123"));
        assert!(!is_volume_lineage("sbx-0123456789abcdef"));
        assert_eq!(copy_name(12), "00000000000000000012");
    }
}
