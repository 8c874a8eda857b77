//! The step cache of Dockerfile builds: for each step a build ran, the root image it left and
//! the configuration in effect after it, under a key made of the parent's key and the step
//! (for `COPY` and `ADD`, the files' names, modes and contents too). A rebuild walks its
//! steps from the top and starts from the last one whose key is here.
//!
//! `<data>/build-cache/<key>/{rootfs.ext4, state.json}`, written into a temporary directory
//! and renamed into place, so an entry is whole or absent. Root images are clones (CoW where
//! the storage has it). The newest [`MAX_ENTRIES`] entries are kept.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{NodeError, Result};
use crate::storage::Storage;

/// Entries kept; the least recently used go first.
pub const MAX_ENTRIES: usize = 256;

/// The configuration a step leaves for the next (what the image config will say).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepState {
    pub env: BTreeMap<String, String>,
    pub user: Option<String>,
    pub workdir: Option<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub ports: Vec<u16>,
}

/// A cache key: hex SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key(pub String);

impl Key {
    /// The key of a build's base.
    pub fn base(what: &str) -> Key {
        Key::of(&["space-build-1", what])
    }

    /// The key of the step `step` on top of `self`.
    pub fn then(&self, step: &str) -> Key {
        Key::of(&[&self.0, step])
    }

    fn of(parts: &[&str]) -> Key {
        let mut h = Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p.as_bytes());
        }
        Key(hex::encode(h.finalize()))
    }
}

/// The cache of one node.
#[derive(Clone)]
pub struct StepCache {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
}

/// A cached step's result.
#[derive(Debug, Clone)]
pub struct Entry {
    pub rootfs: PathBuf,
    pub state: StepState,
}

const STATE: &str = "state.json";
const ROOTFS: &str = "rootfs.ext4";

impl StepCache {
    pub fn new(dir: PathBuf, storage: Arc<dyn Storage>) -> StepCache {
        StepCache { dir, storage }
    }

    /// The entry of `key`, if one is complete (and marks it used).
    pub fn get(&self, key: &Key) -> Option<Entry> {
        let dir = self.dir.join(&key.0);
        let bytes = std::fs::read(dir.join(STATE)).ok()?;
        let state: StepState = serde_json::from_slice(&bytes).ok()?;
        let rootfs = dir.join(ROOTFS);
        if !rootfs.is_file() {
            return None;
        }
        let _ = filetime_now(&dir.join(STATE));
        Some(Entry { rootfs, state })
    }

    /// Keeps a clone of `rootfs` and `state` under `key` (an entry already there stays).
    pub fn put(&self, key: &Key, rootfs: &Path, state: &StepState) -> Result<Entry> {
        std::fs::create_dir_all(&self.dir).map_err(NodeError::io("creating", &self.dir))?;
        let done = self.dir.join(&key.0);
        if let Some(e) = self.get(key) {
            return Ok(e);
        }
        let tmp = tempfile::Builder::new()
            .prefix(".entry-")
            .tempdir_in(&self.dir)
            .map_err(NodeError::io("creating a directory in", &self.dir))?;
        self.storage.clone_file(rootfs, &tmp.path().join(ROOTFS))?;
        let json = serde_json::to_vec(state).expect("step states serialize");
        let p = tmp.path().join(STATE);
        std::fs::write(&p, json).map_err(NodeError::io("writing", &p))?;
        let kept = tmp.keep();
        if let Err(e) = std::fs::rename(&kept, &done) {
            let _ = std::fs::remove_dir_all(&kept);
            if !done.is_dir() {
                return Err(NodeError::io("renaming", &done)(e));
            }
        }
        Ok(Entry {
            rootfs: done.join(ROOTFS),
            state: state.clone(),
        })
    }

    /// Removes the least recently used entries beyond [`MAX_ENTRIES`], and leftovers of
    /// writes that did not finish.
    pub fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut all = Vec::new();
        for e in entries.flatten() {
            let path = e.path();
            if e.file_name().to_string_lossy().starts_with('.') {
                let _ = std::fs::remove_dir_all(&path);
                continue;
            }
            let used = std::fs::metadata(path.join(STATE))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            all.push((used, path));
        }
        all.sort();
        let excess = all.len().saturating_sub(MAX_ENTRIES);
        for (_, path) in all.into_iter().take(excess) {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

fn filetime_now(path: &Path) -> std::io::Result<()> {
    let f = std::fs::OpenOptions::new().append(true).open(path)?;
    f.set_modified(std::time::SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_chain_and_entries_round_trip() {
        let base = Key::base("stock base");
        let a = base.then("RUN echo a");
        assert_ne!(a, base.then("RUN echo b"));
        assert_eq!(a, Key::base("stock base").then("RUN echo a"));
        // Parts are length-prefixed: moving a byte between them changes the key.
        assert_ne!(Key::of(&["ab", "c"]), Key::of(&["a", "bc"]));

        let dir = tempfile::tempdir().unwrap();
        let storage: Arc<dyn Storage> =
            Arc::new(crate::storage::copy::CopyStorage::new(dir.path()));
        let cache = StepCache::new(dir.path().join("cache"), storage);
        assert!(cache.get(&a).is_none());
        let img = dir.path().join("img");
        std::fs::write(&img, b"ext4").unwrap();
        let state = StepState {
            user: Some("app".into()),
            ..Default::default()
        };
        let e = cache.put(&a, &img, &state).unwrap();
        assert_eq!(std::fs::read(&e.rootfs).unwrap(), b"ext4");
        let back = cache.get(&a).unwrap();
        assert_eq!(back.state, state);
        cache.prune();
        assert!(cache.get(&a).is_some());
    }
}
