//! The tenants' volumes kept on this node (`docs/volumes.md`): each is a storage volume (a
//! btrfs subvolume, or a directory) at `<data>/volumes/<id>` with its size in `<id>.json`,
//! opened once as a [`Tree`] that every sandbox mounting it and the file API share, so their
//! byte counts agree. [`copies`] keeps each volume's copy in the object store.

pub(crate) mod copies;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use space_node_api::sandbox::valid_volume_id;
use space_node_api::VolumeInfo;
use space_volume::Tree;

use crate::error::{NodeError, Result};
use crate::storage::Storage;

/// What is kept beside a volume's tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Meta {
    pub size_bytes: u64,
    /// The tenant whose keys seal its copies (absent in volumes made before copies).
    #[serde(default)]
    pub tenant: String,
    /// The placement epoch this node holds the volume under: it came here from the store
    /// when the volume moved; copies of a newer epoch are another node's.
    #[serde(default)]
    pub epoch: u64,
}

/// The volumes of this node.
pub(crate) struct VolumeStore {
    pub dir: PathBuf,
    storage: Arc<dyn Storage>,
    open: Mutex<HashMap<String, Arc<Tree>>>,
    copies: Mutex<HashMap<String, copies::CopyState>>,
    /// One copy or restore at a time.
    pub copy_lock: tokio::sync::Mutex<()>,
}

fn check_id(id: &str) -> Result<()> {
    if valid_volume_id(id) {
        Ok(())
    } else {
        Err(NodeError::Invalid(format!(
            "{id:?} is not a volume id (vol- and 16 hex digits)"
        )))
    }
}

impl VolumeStore {
    pub fn new(dir: PathBuf, storage: Arc<dyn Storage>) -> VolumeStore {
        VolumeStore {
            dir,
            storage,
            open: Mutex::new(HashMap::new()),
            copies: Mutex::new(HashMap::new()),
            copy_lock: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Tree>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn meta_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Makes volume `id` of `tenant` of `size_bytes`, or gives an existing one the new size
    /// (it keeps its placement epoch; a new one is of epoch 0).
    pub fn create(&self, id: &str, tenant: &str, size_bytes: u64) -> Result<VolumeInfo> {
        check_id(id)?;
        std::fs::create_dir_all(&self.dir).map_err(NodeError::io("making", self.dir.clone()))?;
        let root = self.dir.join(id);
        if !root.exists() {
            self.storage.create_volume(&root)?;
            // Anyone in the guest may make files at the top; what is below keeps its owners.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777))
                .map_err(NodeError::io("setting the mode of", root.clone()))?;
        }
        let old = self.meta(id).ok();
        let meta = Meta {
            size_bytes,
            tenant: if tenant.is_empty() {
                old.as_ref().map(|m| m.tenant.clone()).unwrap_or_default()
            } else {
                tenant.to_owned()
            },
            epoch: old.as_ref().map_or(0, |m| m.epoch),
        };
        self.write_meta(id, &meta)?;
        let tree = self.open(id)?;
        tree.set_size(size_bytes);
        Ok(self.info(id, &tree))
    }

    fn write_meta(&self, id: &str, meta: &Meta) -> Result<()> {
        let bytes = serde_json::to_vec(meta).expect("meta serializes");
        space_fs::write_atomic(&self.meta_path(id), &bytes, 0o600)
            .map_err(|e| NodeError::io("writing", self.meta_path(id))(e.source))
    }

    /// What is kept beside volume `id`.
    pub fn meta(&self, id: &str) -> Result<Meta> {
        check_id(id)?;
        match std::fs::read(self.meta_path(id)) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| NodeError::internal(format!("{}: {e}", self.meta_path(id).display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(NodeError::VolumeNotFound(id.to_owned()))
            }
            Err(e) => Err(NodeError::io("reading", self.meta_path(id))(e)),
        }
    }

    /// Drops the open tree of volume `id` and what is known of its copies.
    fn forget(&self, id: &str) {
        self.lock().remove(id);
        self.copies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    /// Runs `f` on what is known of volume `id`'s copies.
    pub fn with_copy<T>(&self, id: &str, f: impl FnOnce(&mut copies::CopyState) -> T) -> T {
        let mut all = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        f(all.entry(id.to_owned()).or_default())
    }

    /// Puts the volume brought from the store at `staged` in place of volume `id` (whatever
    /// was here of it goes), held under `epoch`.
    pub fn install(&self, id: &str, staged: &Path, meta: &Meta) -> Result<VolumeInfo> {
        check_id(id)?;
        self.forget(id);
        let root = self.dir.join(id);
        self.storage.delete_volume(&root)?;
        std::fs::rename(staged, &root).map_err(NodeError::io("moving into place", root.clone()))?;
        self.write_meta(id, meta)?;
        let tree = self.open(id)?;
        // What came down is the newest copy: nothing to send up until it changes.
        let changes = tree.changes();
        self.with_copy(id, |c| c.copied_changes = Some(changes));
        Ok(self.info(id, &tree))
    }

    /// The open tree of volume `id`.
    pub fn open(&self, id: &str) -> Result<Arc<Tree>> {
        check_id(id)?;
        if let Some(t) = self.lock().get(id) {
            return Ok(t.clone());
        }
        let meta = self.meta(id)?;
        let root = self.dir.join(id);
        let tree = Arc::new(
            Tree::open(&root, meta.size_bytes)
                .map_err(NodeError::io("opening the volume", root.clone()))?,
        );
        Ok(self.lock().entry(id.to_owned()).or_insert(tree).clone())
    }

    /// Deletes volume `id` (whoever calls made sure nothing mounts it).
    pub fn delete(&self, id: &str) -> Result<()> {
        check_id(id)?;
        self.forget(id);
        self.storage.delete_volume(&self.dir.join(id))?;
        match std::fs::remove_file(self.meta_path(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(NodeError::io("removing", self.meta_path(id))(e)),
        }
    }

    fn info(&self, id: &str, tree: &Tree) -> VolumeInfo {
        let st = tree.stat_fs();
        let (synced_unix_ms, copy_error) =
            self.with_copy(id, |c| (c.synced_unix_ms, c.error.clone()));
        VolumeInfo {
            id: id.to_owned(),
            size_bytes: st.size_bytes,
            used_bytes: st.used_bytes,
            entries: st.entries,
            synced_unix_ms,
            copy_error,
        }
    }

    /// The volume's use, and its copies.
    pub fn info_of(&self, id: &str) -> Result<VolumeInfo> {
        let tree = self.open(id)?;
        Ok(self.info(id, &tree))
    }

    /// The volumes whose trees are open (every one that can have changed).
    pub fn open_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.lock().keys().cloned().collect();
        ids.sort();
        ids
    }

    /// Every volume here.
    pub fn list(&self) -> Result<Vec<VolumeInfo>> {
        let names = match std::fs::read_dir(&self.dir) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(NodeError::io("listing", self.dir.clone())(e)),
        };
        let mut out = Vec::new();
        for e in names.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".json").filter(|i| valid_volume_id(i)) {
                out.push(self.info(id, &*self.open(id)?));
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}
