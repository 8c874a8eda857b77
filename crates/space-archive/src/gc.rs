//! Garbage collection: packs that no manifest references go, and everything of a lineage whose
//! key was destroyed (crypto-shredded) goes after it.
//!
//! A pack is garbage when no manifest of its lineage names it and it is older than a grace
//! period (an upload in progress writes its packs before its manifest). Manifests are sealed,
//! so finding what they reference needs the lineage's key: a lineage whose manifests do not
//! all open is left alone (nothing is deleted on a guess). A lineage without a key object was
//! shredded: its packs, manifests and heads are unreadable by anyone and are deleted.
//! Template lineages (`tpl.*`) are not collected. A volume's lineage (its id) is referred to
//! by its copies' manifests, which its head leads to (`crate::volumes`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use object_store::path::Path as ObjPath;

use crate::keys::Keyring;
use crate::manifest::{Manifest, MAX_MANIFEST_BYTES};
use crate::store::{Archive, StoreError};

/// How often a deployment collects garbage, and the grace a pack gets before it counts as
/// garbage: an upload older than this has written its manifest or failed.
pub const GC_EVERY: Duration = Duration::from_secs(3600);

/// Collects the store's garbage older than [`GC_EVERY`], and build uploads past their
/// [`UPLOAD_TTL`](crate::uploads::UPLOAD_TTL), and logs what went (a node's hourly pass; a
/// cluster's replicas run it for the shared store).
pub async fn collect_and_log(archive: &Archive, keyring: &Keyring) {
    match collect(archive, keyring, GC_EVERY).await {
        Ok(r) => tracing::info!(
            packs = r.packs_deleted,
            bytes = r.bytes_deleted,
            shredded = r.shredded_removed.len(),
            skipped = r.skipped.len(),
            "object store garbage collected"
        ),
        Err(e) => tracing::warn!(error = %e, "object store garbage collection"),
    }
    match crate::uploads::expire(archive, crate::uploads::UPLOAD_TTL).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(uploads = n, "expired build uploads removed"),
        Err(e) => tracing::warn!(error = %e, "removing expired build uploads"),
    }
}

/// A sandbox or volume whose manifests name a lineage's packs.
#[derive(Clone)]
struct Member {
    name: String,
    tenant: String,
    volume: bool,
}

impl Member {
    fn manifests(&self, archive: &Archive) -> Result<ObjPath, StoreError> {
        if self.volume {
            archive.volume_manifests_prefix(&self.name)
        } else {
            Ok(ObjPath::from(format!(
                "sandboxes/{}/manifests",
                crate::store::component(&self.name)?
            )))
        }
    }
}

/// What one collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Lineages looked at.
    pub lineages: usize,
    /// Unreferenced packs deleted.
    pub packs_deleted: usize,
    /// Their bytes.
    pub bytes_deleted: u64,
    /// Lineages left alone because a manifest did not open.
    pub skipped: Vec<String>,
    /// Shredded lineages whose objects were removed.
    pub shredded_removed: Vec<String>,
}

/// Collects garbage in `archive`.
pub async fn collect(
    archive: &Archive,
    keyring: &Keyring,
    grace: Duration,
) -> Result<GcReport, StoreError> {
    let mut report = GcReport::default();
    let heads = archive.heads().await?;
    // What refers to each lineage's packs, with its tenant: sandboxes, and a volume (whose
    // lineage is its id).
    let mut members: BTreeMap<String, Vec<Member>> = BTreeMap::new();
    for h in &heads {
        members.entry(h.lineage.clone()).or_default().push(Member {
            name: h.sandbox.clone(),
            tenant: h.tenant.clone(),
            volume: false,
        });
    }
    for h in archive.volume_heads().await? {
        members.entry(h.volume.clone()).or_default().push(Member {
            name: h.volume.clone(),
            tenant: h.tenant.clone(),
            volume: true,
        });
    }
    // Packs and key objects per lineage.
    let mut packs: BTreeMap<String, Vec<(ObjPath, u64, Duration)>> = BTreeMap::new();
    let mut keyed: BTreeSet<String> = BTreeSet::new();
    for (p, size, age) in archive.list_with_age(&ObjPath::from("lineages")).await? {
        let parts: Vec<&str> = p.as_ref().split('/').collect();
        match parts.as_slice() {
            ["lineages", l, "key"] => {
                keyed.insert((*l).to_owned());
            }
            ["lineages", l, "packs", _] => {
                packs
                    .entry((*l).to_owned())
                    .or_default()
                    .push((p.clone(), size, age))
            }
            _ => {}
        }
    }
    let lineages: BTreeSet<String> = packs.keys().chain(members.keys()).cloned().collect();
    for lineage in lineages {
        if lineage.starts_with("tpl.") {
            continue;
        }
        report.lineages += 1;
        let sandboxes = members.get(&lineage).cloned().unwrap_or_default();
        if !keyed.contains(&lineage) {
            // Shredded: nothing of it can be opened again.
            for (p, size, _) in packs.get(&lineage).into_iter().flatten() {
                archive.delete(p).await?;
                report.packs_deleted += 1;
                report.bytes_deleted += size;
            }
            for m in &sandboxes {
                if m.volume {
                    archive.delete_volume_copies(&m.name).await?;
                    continue;
                }
                for (p, _) in archive.list(&m.manifests(archive)?).await? {
                    archive.delete(&p).await?;
                }
                archive.delete(&archive.head_path(&m.name)?).await?;
            }
            report.shredded_removed.push(lineage);
            continue;
        }
        // Live: the packs every manifest of the lineage names.
        let mut referenced: BTreeSet<String> = BTreeSet::new();
        let mut complete = true;
        'members: for m in &sandboxes {
            let (sandbox, tenant) = (&m.name, &m.tenant);
            let keys = match keyring.lineage_keys(tenant, &lineage, false, false).await {
                Ok(k) => k,
                Err(e) => {
                    tracing::warn!(%lineage, error = %e, "gc: lineage key does not open; skipped");
                    complete = false;
                    break;
                }
            };
            for (p, _) in archive.list(&m.manifests(archive)?).await? {
                let Some(snapshot) = p.filename() else {
                    continue;
                };
                let Some(object) = archive.get_bounded(&p, MAX_MANIFEST_BYTES as u64).await? else {
                    continue;
                };
                match Manifest::decode(&object, None, &keys, sandbox, snapshot) {
                    Ok(m) => referenced.extend(m.packs),
                    Err(e) => {
                        tracing::warn!(%lineage, manifest = %p, error = %e, "gc: manifest does not open; lineage skipped");
                        complete = false;
                        break 'members;
                    }
                }
            }
        }
        if !complete {
            report.skipped.push(lineage);
            continue;
        }
        for (p, size, age) in packs.get(&lineage).into_iter().flatten() {
            let name = p.filename().unwrap_or_default();
            if referenced.contains(name) || *age < grace {
                continue;
            }
            archive.delete(p).await?;
            report.packs_deleted += 1;
            report.bytes_deleted += size;
        }
    }
    Ok(report)
}
