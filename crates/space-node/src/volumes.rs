//! The tenants' volumes kept on this node (`docs/volumes.md`): each is a storage volume (a
//! btrfs subvolume, or a directory) at `<data>/volumes/<id>` with its size in `<id>.json`,
//! opened once as a [`Tree`] that every sandbox mounting it and the file API share, so their
//! byte counts agree.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use space_node_api::sandbox::valid_volume_id;
use space_node_api::VolumeInfo;
use space_volume::Tree;

use crate::error::{NodeError, Result};
use crate::storage::Storage;

/// What is kept beside a volume's tree.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    size_bytes: u64,
}

/// The volumes of this node.
pub(crate) struct VolumeStore {
    dir: PathBuf,
    storage: Arc<dyn Storage>,
    open: Mutex<HashMap<String, Arc<Tree>>>,
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
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Tree>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn meta_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Makes volume `id` of `size_bytes` (an existing one takes the new size).
    pub fn create(&self, id: &str, size_bytes: u64) -> Result<VolumeInfo> {
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
        let meta = serde_json::to_vec(&Meta { size_bytes }).expect("meta serializes");
        space_fs::write_atomic(&self.meta_path(id), &meta, 0o600)
            .map_err(|e| NodeError::io("writing", self.meta_path(id))(e.source))?;
        let tree = self.open(id)?;
        tree.set_size(size_bytes);
        Ok(info(id, &tree))
    }

    /// The open tree of volume `id`.
    pub fn open(&self, id: &str) -> Result<Arc<Tree>> {
        check_id(id)?;
        if let Some(t) = self.lock().get(id) {
            return Ok(t.clone());
        }
        let meta: Meta = match std::fs::read(self.meta_path(id)) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                NodeError::internal(format!("{}: {e}", self.meta_path(id).display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(NodeError::VolumeNotFound(id.to_owned()))
            }
            Err(e) => return Err(NodeError::io("reading", self.meta_path(id))(e)),
        };
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
        self.lock().remove(id);
        self.storage.delete_volume(&self.dir.join(id))?;
        match std::fs::remove_file(self.meta_path(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(NodeError::io("removing", self.meta_path(id))(e)),
        }
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
                out.push(info(id, &*self.open(id)?));
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}

fn info(id: &str, tree: &Tree) -> VolumeInfo {
    let st = tree.stat_fs();
    VolumeInfo {
        id: id.to_owned(),
        size_bytes: st.size_bytes,
        used_bytes: st.used_bytes,
        entries: st.entries,
    }
}
