//! Template builds in the object store: each build is archived once (its own lineage,
//! sealed under the deployment's template keys) so that any node can fetch it as the base of
//! the snapshots made from it.

use serde::{Deserialize, Serialize};
use space_archive::BaseRef;

use super::*;
use crate::ids::{TemplateName, TemplateRef};
use crate::template::{self, Template};

#[derive(Debug, Serialize, Deserialize)]
struct TemplateArchived {
    manifest_hash: String,
}

fn template_lineage(t: &TemplateRef) -> String {
    format!("tpl.{}.{}", t.name, t.version)
}

fn template_record_path(ctx: &Ctx, t: &TemplateRef) -> PathBuf {
    ctx.layout
        .root()
        .join("state")
        .join("archive")
        .join("templates")
        .join(format!("{}@{}.json", t.name, t.version))
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let dir = path.parent().expect("state paths have a parent");
    std::fs::create_dir_all(dir).map_err(NodeError::io("creating", dir))?;
    let tmp = path.with_extension("tmp");
    let bytes = serde_json::to_vec_pretty(value).expect("serializes");
    std::fs::write(&tmp, bytes).map_err(NodeError::io("writing", &tmp))?;
    std::fs::rename(&tmp, path).map_err(NodeError::io("renaming", path))
}

/// The template build as a base: its archive's manifest hash, uploading it first when the
/// store does not have it yet (once per build; later sandboxes of the template reuse it).
pub(crate) async fn template_base(ctx: &Ctx, cfg: &ArchiveConfig, t: &Template) -> Result<BaseRef> {
    let tref = t.template_ref();
    let local = template_record_path(ctx, tref);
    let _guard = ctx.archive_lock.lock().await;
    if let Ok(bytes) = std::fs::read(&local) {
        if let Ok(rec) = serde_json::from_slice::<TemplateArchived>(&bytes) {
            return Ok(BaseRef {
                name: tref.name.to_string(),
                version: tref.version.to_string(),
                manifest_hash: rec.manifest_hash,
            });
        }
    }
    let a = &cfg.archive;
    let (name, version) = (tref.name.as_str(), tref.version.as_str());
    let head_path = a
        .template_path(name, version, "head")
        .map_err(archive_error("template head"))?;
    let hash = match a
        .get_small(&head_path)
        .await
        .map_err(|e| NodeError::Archive(e.to_string()))?
    {
        // This node did not put it there (it would have recorded so): another node's build
        // of the same name and version, which this node's is not.
        Some(_) => {
            return Err(NodeError::Archive(format!(
                "template {tref} in the object store is another build than this node's; \
                 fetch the published one instead of building it here"
            )))
        }
        None => {
            let lineage = template_lineage(tref);
            let keys = cfg
                .keyring
                .lineage_keys(TEMPLATE_TENANT, &lineage, true, false)
                .await
                .map_err(key_error)?;
            let spec = UploadSpec {
                tenant: TEMPLATE_TENANT.into(),
                lineage,
                sandbox: format!("{name}@{version}"),
                snapshot: "build".into(),
                manifest_path: a
                    .template_path(name, version, "manifest")
                    .map_err(archive_error("template manifest"))?,
                chunk_size: cfg.chunk_size,
                pack_target: cfg.pack_target,
                base: None,
                host: Some(host_info(ctx)),
                record: serde_json::to_value(&t.manifest).expect("serializes"),
                files: TEMPLATE_FILES
                    .iter()
                    .map(|f| SourceFile {
                        name: (*f).into(),
                        path: t.dir.join(f),
                        base: None,
                        unchanged: None,
                    })
                    .collect(),
                previous: None,
                prefetch: Vec::new(),
            };
            let (_, report) = space_archive::upload(a, keys, spec, &Known::default())
                .await
                .map_err(|e| NodeError::Archive(format!("uploading template {tref}: {e}")))?;
            tracing::info!(
                template = %tref, bytes = report.uploaded_bytes, chunks = report.new_chunks,
                took = ?report.elapsed, "template archived"
            );
            let head = TemplateArchived {
                manifest_hash: report.manifest_hash.clone(),
            };
            a.put(
                &head_path,
                serde_json::to_vec(&head).expect("serializes").into(),
            )
            .await
            .map_err(|e| NodeError::Archive(e.to_string()))?;
            report.manifest_hash
        }
    };
    write_json(
        &local,
        &TemplateArchived {
            manifest_hash: hash.clone(),
        },
    )?;
    Ok(BaseRef {
        name: name.into(),
        version: version.into(),
        manifest_hash: hash,
    })
}

/// The template build `t`, fetched from the store when this node does not have it. A local
/// build is used as a base only if it is the archived one (same manifest hash).
pub(crate) async fn local_template(
    ctx: &Ctx,
    cfg: &ArchiveConfig,
    base: &BaseRef,
) -> Result<Template> {
    let name: TemplateName = base.name.parse()?;
    let tref = TemplateRef::new(&base.name, &base.version)?;
    if let Ok(t) = template::resolve(&ctx.layout, &name, &VersionReq::Exact(tref.version.clone())) {
        let ours = std::fs::read(template_record_path(ctx, &tref))
            .ok()
            .and_then(|b| serde_json::from_slice::<TemplateArchived>(&b).ok());
        return match ours {
            Some(r) if r.manifest_hash == base.manifest_hash => Ok(t),
            // Built here and never archived, or archived by another node: not the base.
            _ => Err(NodeError::Archive(format!(
                "template {tref} on this node is not the build the snapshot was based on"
            ))),
        };
    }
    let _guard = ctx.archive_lock.lock().await;
    let a = &cfg.archive;
    let lineage = template_lineage(&tref);
    let keys = cfg
        .keyring
        .lineage_keys(TEMPLATE_TENANT, &lineage, false, true)
        .await
        .map_err(key_error)?;
    let mpath = a
        .template_path(&base.name, &base.version, "manifest")
        .map_err(archive_error("template manifest"))?;
    let object = a
        .get_bounded(&mpath, space_archive::manifest::MAX_MANIFEST_BYTES as u64)
        .await
        .map_err(|e| NodeError::Archive(e.to_string()))?
        .ok_or_else(|| {
            NodeError::Archive(format!(
                "template {tref} is neither on this node nor in the object store"
            ))
        })?;
    let sandbox = format!("{}@{}", base.name, base.version);
    let m = Manifest::decode(&object, Some(&base.manifest_hash), &keys, &sandbox, "build")
        .map_err(|e| NodeError::Archive(format!("template {tref}: {e}")))?;
    check_host(ctx, &m)?;
    let final_dir = ctx.layout.template_dir(&base.name, &base.version)?;
    let parent = final_dir
        .parent()
        .expect("template dirs have a parent")
        .to_owned();
    std::fs::create_dir_all(&parent).map_err(NodeError::io("creating", &parent))?;
    let tmp = parent.join(format!(".fetch-{}-{}", base.version, std::process::id()));
    let t0 = std::time::Instant::now();
    materialize_into(ctx, cfg, keys, &m, &tmp, None).await?;
    let fixed = fix_kernel_path(
        &tmp.join("snapshot/manifest.json"),
        &final_dir.join("vmlinux"),
    );
    let placed = fixed.and_then(|_| {
        std::fs::rename(&tmp, &final_dir).map_err(NodeError::io("placing", &final_dir))
    });
    if let Err(e) = placed {
        let _ = ctx.storage.delete_volume(&tmp);
        return Err(e);
    }
    ctx.storage.set_readonly(&final_dir)?;
    write_json(
        &template_record_path(ctx, &tref),
        &TemplateArchived {
            manifest_hash: base.manifest_hash.clone(),
        },
    )?;
    tracing::info!(template = %tref, took = ?t0.elapsed(), "template fetched from the object store");
    template::resolve(&ctx.layout, &name, &VersionReq::Exact(tref.version))
}

/// The build of `t` published in the store, if any.
pub(crate) async fn published(cfg: &ArchiveConfig, t: &TemplateRef) -> Result<Option<BaseRef>> {
    let head_path = cfg
        .archive
        .template_path(t.name.as_str(), t.version.as_str(), "head")
        .map_err(archive_error("template head"))?;
    let Some(bytes) = cfg
        .archive
        .get_small(&head_path)
        .await
        .map_err(|e| NodeError::Archive(e.to_string()))?
    else {
        return Ok(None);
    };
    let head: TemplateArchived =
        serde_json::from_slice(&bytes).map_err(archive_error("template head"))?;
    Ok(Some(BaseRef {
        name: t.name.to_string(),
        version: t.version.to_string(),
        manifest_hash: head.manifest_hash,
    }))
}
