//! The node's templates: builds from every source, saves of running sandboxes, lookups and
//! deletion.

use std::path::Path;

use space_runtime::manifest::Manifest;

use super::Node;
use crate::build::{self, BuildLog, BuildPlan};
use crate::error::{NodeError, Result};
use crate::ids::{SandboxId, TemplateName, TemplateRef, VersionReq};
use crate::record::{now_ms, State};
use crate::sandbox::{ForkPoint, Request};
use crate::template::{
    self, blocking, SourceFile, Template, TemplateManifest, TemplateSpec, KERNEL_FILE, ROOTFS_FILE,
    SNAPSHOT_DIR, TEMPLATE_FORMAT, TEMPLATE_MANIFEST,
};

impl Node {
    /// Builds a template version (see [`crate::template`]).
    pub async fn build_template(&self, spec: TemplateSpec) -> Result<Template> {
        let ctx = &self.inner.ctx;
        let built = template::build(&*ctx.runtime, &ctx.storage, &ctx.layout, spec).await;
        // A new version replaces the pool of the previous one.
        self.inner.pools.templates_changed();
        built
    }

    /// A complete template build; `latest` resolves to the newest.
    pub fn template(&self, name: &TemplateName, version: &VersionReq) -> Result<Template> {
        match template::resolve(&self.inner.ctx.layout, name, version) {
            Err(NodeError::TemplateNotFound(what)) => match self.preparation(name.as_str()) {
                Some(p) => Err(NodeError::TemplateNotReady(p.describe(name.as_str()))),
                None => Err(NodeError::TemplateNotFound(what)),
            },
            other => other,
        }
    }

    /// Every complete template build.
    pub fn templates(&self) -> Result<Vec<Template>> {
        template::list(&self.inner.ctx.layout)
    }

    /// Deletes a template build. Refused ([`NodeError::TemplateInUse`]) while a sandbox that
    /// is not terminated was made from it: a cold boot or a crash recovery may still need its
    /// kernel and image. Its warm pool goes with the next pool pass.
    pub async fn delete_template(&self, template: &TemplateRef) -> Result<()> {
        self.check_open()?;
        let ctx = &self.inner.ctx;
        let version = VersionReq::Exact(template.version.clone());
        let t = template::resolve(&ctx.layout, &template.name, &version)?;
        let users: Vec<SandboxId> = blocking({
            let records = ctx.records.clone();
            move || Ok(records.list()?)
        })
        .await?
        .into_iter()
        .filter(|r| &r.template == template && r.state != State::Terminated && !r.is_pooled())
        .map(|r| r.id)
        .collect();
        if let Some(first) = users.first() {
            return Err(NodeError::TemplateInUse {
                template: template.clone(),
                sandbox: first.clone(),
                count: users.len(),
            });
        }
        let (s, d) = (ctx.storage.clone(), t.dir.clone());
        blocking(move || Ok(s.delete_volume(&d)?)).await?;
        if let Some(parent) = t.dir.parent() {
            // Only succeeds once the name has no versions left.
            let _ = std::fs::remove_dir(parent);
        }
        self.inner.pools.templates_changed();
        tracing::info!(template = %template, "template deleted");
        Ok(())
    }

    /// Builds a template from any source ([`crate::build`]), writing progress to `log`.
    pub async fn build(&self, plan: BuildPlan, log: &BuildLog) -> Result<Template> {
        self.check_open()?;
        let t = &plan.template;
        let dir = self
            .inner
            .ctx
            .layout
            .template_dir(t.name.as_str(), t.version.as_str())?;
        if dir.exists() {
            return Err(NodeError::TemplateExists(t.clone()));
        }
        let built = build::run(&self.inner.ctx, plan, log).await;
        self.inner.pools.templates_changed();
        built
    }

    /// Makes template `template` of a Running or Paused sandbox: a full snapshot of it (listed
    /// among its snapshots, reason `fork`) cloned into a new template, so every sandbox made
    /// from the template starts where this one was, its processes included. The template's
    /// defaults are the sandbox's (its template's, and the environment it was created with).
    ///
    /// Without `memory`, only the disk is kept: the guest's file systems are synced, the disk
    /// of the snapshot is booted afresh as a template build (its template's start command
    /// run again), so sandboxes made from it start from a cold boot of that disk, without the
    /// processes and memory of this one.
    pub async fn save_template(
        &self,
        id: &SandboxId,
        template: &TemplateRef,
        memory: bool,
    ) -> Result<Template> {
        self.check_open()?;
        if !memory {
            return self.save_disk_template(id, template).await;
        }
        let ctx = self.inner.ctx.clone();
        let started = std::time::Instant::now();
        let (dir, point, from) = self.save_point(id, template, false).await?;
        let parent = point.parent;
        let parent_dir = dir
            .parent()
            .expect("template dirs have a parent")
            .to_owned();
        std::fs::create_dir_all(&parent_dir).map_err(NodeError::io("creating", &parent_dir))?;
        let (s, d) = (ctx.storage.clone(), dir.clone());
        blocking(move || Ok(s.create_volume(&d)?)).await?;
        let made = {
            let (s, d, snap, kernel) = (
                ctx.storage.clone(),
                dir.clone(),
                point.dir.clone(),
                from.kernel(),
            );
            blocking(move || copy_snapshot(&*s, &snap, &kernel, &d)).await
        };
        let result = made.and_then(|disk_bytes| {
            let mut guest = parent.guest.clone();
            guest.env.extend(parent.options.env.clone());
            let m = &from.manifest;
            let manifest = TemplateManifest {
                format: TEMPLATE_FORMAT,
                template: template.clone(),
                qemu: m.qemu.clone(),
                accel: m.accel,
                kernel: m.kernel.clone(),
                rootfs: SourceFile {
                    path: point.dir.join(ROOTFS_FILE),
                    size: disk_bytes,
                    sha256: None,
                },
                vcpus: parent.vcpus,
                memory_mib: parent.memory_mib,
                kernel_cmdline: m.kernel_cmdline.clone(),
                disk_bytes,
                created_unix_ms: now_ms(),
                build_ms: started.elapsed().as_millis() as u64,
                guest,
                start: None,
                source: space_node_api::template::saved_source(id, &parent.template, true),
            };
            let bytes = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
            let path = dir.join(TEMPLATE_MANIFEST);
            space_fs::write_atomic(&path, &bytes, 0o600)
                .map_err(|e| NodeError::io(e.op, e.path)(e.source))?;
            ctx.storage.set_readonly(&dir)?;
            Ok(Template {
                dir: dir.clone(),
                manifest,
            })
        });
        if result.is_err() {
            let (s, d) = (ctx.storage.clone(), dir.clone());
            let _ = blocking(move || Ok(s.delete_volume(&d)?)).await;
            let _ = std::fs::remove_dir(&parent_dir);
        } else {
            self.inner.pools.templates_changed();
            tracing::info!(template = %template, sandbox = %id, "template saved from a sandbox");
        }
        result
    }

    /// Where template `template` goes (refused when it exists), a full snapshot of sandbox
    /// `id` to make it of (the guest's file systems synced first with `sync`), and the
    /// template the sandbox was made from.
    async fn save_point(
        &self,
        id: &SandboxId,
        template: &TemplateRef,
        sync: bool,
    ) -> Result<(std::path::PathBuf, ForkPoint, Template)> {
        let ctx = &self.inner.ctx;
        let dir = ctx
            .layout
            .template_dir(template.name.as_str(), template.version.as_str())?;
        if dir.exists() {
            return Err(NodeError::TemplateExists(template.clone()));
        }
        // What the guest wrote and still holds in its page cache goes to the disk first; a
        // Paused sandbox wrote nothing since it was last running, and its disk is what the
        // snapshot takes.
        if sync {
            if let Ok(client) = self.guest(id).await {
                client.sync().await.map_err(|e| {
                    NodeError::Invalid(format!("syncing the guest's file systems: {e}"))
                })?;
            }
        }
        let point: ForkPoint = self.call(id, Request::Fork).await?;
        let from = template::resolve(
            &ctx.layout,
            &point.parent.template.name,
            &VersionReq::Exact(point.parent.template.version.clone()),
        )?;
        Ok((dir, point, from))
    }

    /// [`Node::save_template`] without memory.
    async fn save_disk_template(&self, id: &SandboxId, template: &TemplateRef) -> Result<Template> {
        let ctx = self.inner.ctx.clone();
        let (_, point, from) = self.save_point(id, template, true).await?;
        let parent = point.parent;
        let mut guest = parent.guest.clone();
        guest.env.extend(parent.options.env.clone());
        let spec = TemplateSpec {
            template: template.clone(),
            kernel: from.kernel(),
            rootfs: point.dir.join(ROOTFS_FILE),
            vcpus: parent.vcpus,
            memory_mib: parent.memory_mib,
            kernel_cmdline: Some(from.manifest.kernel_cmdline.clone()),
            ready_timeout: ctx.ready_timeout,
            guest,
            start: from.manifest.start.clone(),
            source: space_node_api::template::saved_source(id, &parent.template, false),
        };
        let built = template::build(&*ctx.runtime, &ctx.storage, &ctx.layout, spec).await;
        self.inner.pools.templates_changed();
        if built.is_ok() {
            tracing::info!(template = %template, sandbox = %id, "template saved from a sandbox's disk");
        }
        built
    }
}

/// Clones a sandbox's full snapshot `snap` into template directory `dir`: the kernel, the
/// disk as the template's root image, the snapshot (its manifest pointed at the template's
/// own kernel). Answers the disk's size.
fn copy_snapshot(
    s: &dyn crate::storage::Storage,
    snap: &Path,
    kernel: &Path,
    dir: &Path,
) -> Result<u64> {
    s.clone_file(kernel, &dir.join(KERNEL_FILE))?;
    s.clone_file(&snap.join(ROOTFS_FILE), &dir.join(ROOTFS_FILE))?;
    let out = dir.join(SNAPSHOT_DIR);
    std::fs::create_dir_all(&out).map_err(NodeError::io("creating", &out))?;
    for e in std::fs::read_dir(snap).map_err(NodeError::io("listing", snap))? {
        let e = e.map_err(NodeError::io("listing", snap))?;
        if e.file_type()
            .map_err(NodeError::io("reading", e.path()))?
            .is_file()
        {
            s.clone_file(&e.path(), &out.join(e.file_name()))?;
        }
    }
    let path = out.join(space_runtime::cmdline::MANIFEST_FILE);
    let mut m = Manifest::read(&path).map_err(space_runtime::Error::from)?;
    m.kernel.path = dir.join(KERNEL_FILE);
    m.write(&path).map_err(space_runtime::Error::from)?;
    let disk = dir.join(ROOTFS_FILE);
    Ok(std::fs::metadata(&disk)
        .map_err(NodeError::io("reading", &disk))?
        .len())
}
