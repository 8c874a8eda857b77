//! Template builds from what users bring: an OCI image (a registry's, or an archive file's),
//! a Dockerfile with its build context, or one of the node's stock images; and the log a
//! build writes while it runs.
//!
//! - [`import`]: an image's layers made into a root image, its config into defaults.
//! - [`dockerfile`]: a Dockerfile's steps run in a builder VM, each step cached.
//! - [`cache`]: the step cache; `copy`: what a `COPY` or `ADD` writes.
//! - [`log`]: a build's log, read from an offset.
//!
//! Every source ends in [`crate::template::build`]: the root image booted, the start command
//! started and checked, the snapshot taken. A build works in `<data>/builds/<id>/` and
//! removes it when it ends; a node that dies during a build leaves the directory for its
//! next start to remove.

pub mod cache;
mod copy;
pub(crate) mod dockerfile;
pub mod import;
pub mod log;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use log::BuildLog;
pub use space_node_api::template::LogChunk;

use space_gateway::EgressPolicy;

use crate::error::{NodeError, Result};
use crate::ids::TemplateRef;
use crate::sandbox::Ctx;
use crate::template::{self, blocking, GuestDefaults, StartSpec, Template, TemplateSpec};

/// Memory of a Dockerfile's builder VM at least (package managers need room).
pub const BUILDER_MIN_MEMORY_MIB: u64 = 1024;
/// Disk of a Dockerfile's builder VM (and so of the template) unless the build asks more.
pub const BUILDER_DISK_MIB: u64 = 2048;

pub use space_node_api::template::{BuildInput, Credentials, TemplateSource};

/// A build as the node runs it.
#[derive(Debug, Clone)]
pub struct BuildPlan {
    pub template: TemplateRef,
    pub source: TemplateSource,
    pub kernel: PathBuf,
    /// The `space-guestd` put into images (needed for image sources).
    pub guestd: Option<PathBuf>,
    /// The stock images, by name.
    pub stock: BTreeMap<String, PathBuf>,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// The template's disk, at least.
    pub disk_mib: Option<u64>,
    pub start: Option<StartSpec>,
    pub ready_timeout: Duration,
    /// What a Dockerfile's builder may reach.
    pub egress: EgressPolicy,
}

/// Where builds work.
pub fn builds_dir(root: &Path) -> PathBuf {
    root.join("builds")
}

/// Where the step cache is.
pub fn cache_dir(root: &Path) -> PathBuf {
    root.join("build-cache")
}

/// Runs a build (see the module docs). Leaves no template on failure.
pub(crate) async fn run(ctx: &Arc<Ctx>, plan: BuildPlan, log: &BuildLog) -> Result<Template> {
    let root = builds_dir(ctx.layout.root());
    std::fs::create_dir_all(&root).map_err(NodeError::io("creating", &root))?;
    let work = tempfile::Builder::new()
        .prefix("build-")
        .tempdir_in(&root)
        .map_err(NodeError::io("creating a directory in", &root))?;
    let result = run_in(ctx, &plan, work.path(), log).await;
    let w = work.keep();
    let _ = blocking(move || {
        let _ = std::fs::remove_dir_all(&w);
        Ok(())
    })
    .await;
    result
}

async fn run_in(ctx: &Arc<Ctx>, plan: &BuildPlan, work: &Path, log: &BuildLog) -> Result<Template> {
    let min_bytes = plan.disk_mib.unwrap_or(0) << 20;
    let guestd = || {
        plan.guestd.as_deref().ok_or_else(|| {
            NodeError::internal(
                "this node has no space-guestd binary to put into images (SPACE_GUESTD)",
            )
        })
    };
    let (rootfs, guest, source): (PathBuf, GuestDefaults, String) = match &plan.source {
        TemplateSource::Stock { image } => {
            let Some(path) = plan.stock.get(image) else {
                let known: Vec<&str> = plan.stock.keys().map(String::as_str).collect();
                return Err(NodeError::Invalid(format!(
                    "no image {image:?} on this node (it has: {})",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                )));
            };
            (
                path.clone(),
                GuestDefaults::default(),
                format!("stock {image}"),
            )
        }
        TemplateSource::Image {
            reference,
            credentials,
            plain_http,
        } => {
            let src = import::ImageSource::Registry {
                reference: reference.clone(),
                credentials: credentials.clone(),
                plain_http: *plain_http,
            };
            let blobs = ctx.layout.root().join("images");
            let fetched = import::fetch(&src, &blobs, log).await?;
            let i = import::make_rootfs(fetched, guestd()?, work, min_bytes, log).await?;
            (i.rootfs, i.guest, i.source)
        }
        TemplateSource::Archive { archive, tag } => {
            let src = import::ImageSource::Archive {
                path: input(ctx, archive, work, "archive", log).await?,
                tag: tag.clone(),
            };
            let fetched = import::fetch(&src, work, log).await?;
            let i = import::make_rootfs(fetched, guestd()?, work, min_bytes, log).await?;
            (i.rootfs, i.guest, i.source)
        }
        TemplateSource::Dockerfile {
            dockerfile,
            context,
            build_args,
            credentials,
            plain_http,
        } => {
            let context = match context {
                None => None,
                Some(i) => match input(ctx, i, work, "context.tar", log).await? {
                    p if p.is_dir() => Some(p),
                    p => Some(unpack_context(&p, work).await?),
                },
            };
            let cache = cache::StepCache::new(cache_dir(ctx.layout.root()), ctx.storage.clone());
            let env = dockerfile::Env {
                ctx,
                kernel: &plan.kernel,
                guestd: plan.guestd.as_deref(),
                stock: &plan.stock,
                cache: &cache,
                work,
                egress: plan.egress.clone(),
                vcpus: plan.vcpus,
                memory_mib: plan.memory_mib.max(BUILDER_MIN_MEMORY_MIB),
                disk_mib: plan.disk_mib.unwrap_or(BUILDER_DISK_MIB),
                credentials: credentials.clone(),
                plain_http: *plain_http,
            };
            let req = dockerfile::Request {
                dockerfile,
                context: context.as_deref(),
                build_args,
            };
            let built = dockerfile::build(&env, &req, log).await;
            cache.prune();
            let built = built?;
            log.line(format!(
                "{} steps, {} from the cache",
                built.steps, built.cached
            ));
            let source = format!(
                "Dockerfile from {} ({} steps, {} cached)",
                built.base, built.steps, built.cached
            );
            (built.rootfs, built.guest, source)
        }
    };
    log.line(format!("booting the template {}", plan.template));
    let spec = TemplateSpec {
        template: plan.template.clone(),
        kernel: plan.kernel.clone(),
        rootfs,
        vcpus: plan.vcpus,
        memory_mib: plan.memory_mib,
        kernel_cmdline: None,
        ready_timeout: plan.ready_timeout,
        guest,
        start: plan.start.clone(),
        source,
    };
    if let Some(s) = &spec.start {
        log.line(format!("start command: {}", s.command));
    }
    let t = template::build(&*ctx.runtime, &ctx.storage, &ctx.layout, spec).await?;
    log.line(format!(
        "template {} ready ({:.1} s)",
        t.manifest.template,
        t.manifest.build_ms as f64 / 1000.0
    ));
    Ok(t)
}

/// Where the build reads `input` from: its path, or for an upload in the object store, the
/// file `work/<name>` it is fetched into (checked whole before this answers).
async fn input(
    ctx: &Arc<Ctx>,
    input: &BuildInput,
    work: &Path,
    name: &str,
    log: &BuildLog,
) -> Result<PathBuf> {
    match input {
        BuildInput::Path(p) => Ok(p.clone()),
        BuildInput::Stored { tenant, upload } => {
            let Some(cfg) = ctx.archive.get() else {
                return Err(NodeError::Invalid(format!(
                    "upload {upload} is in the object store, and this node has none configured"
                )));
            };
            let dest = work.join(name);
            log.line(format!("fetching upload {upload} from the object store"));
            let bytes = space_archive::uploads::fetch(&cfg.keyring, tenant, upload, &dest)
                .await
                .map_err(|e| match e {
                    space_archive::uploads::UploadsError::Missing(_)
                    | space_archive::uploads::UploadsError::BadId(_) => {
                        NodeError::Invalid(e.to_string())
                    }
                    e => NodeError::Archive(e.to_string()),
                })?;
            log.line(format!("fetched upload {upload}: {bytes} bytes"));
            Ok(dest)
        }
    }
}

/// A build context sent as a tar file (plain or compressed), unpacked into `work/context`.
async fn unpack_context(tar: &Path, work: &Path) -> Result<PathBuf> {
    let dir = work.join("context");
    let (t, d) = (tar.to_owned(), dir.clone());
    blocking(move || copy::unpack_tar(&t, &d, "the build context")).await?;
    Ok(dir)
}
