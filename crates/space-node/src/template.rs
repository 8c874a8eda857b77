//! Templates: a root image plus the full snapshot of a VM that booted it and reported ready.
//! Creating a sandbox restores that snapshot instead of booting.
//!
//! A build lives in its own volume, `<data>/templates/<name>/<version>/`:
//!
//! ```text
//! vmlinux           the kernel, cloned in so the template never depends on a path outside it
//! rootfs.ext4       the pristine root image (cold boots with another shape start from it)
//! snapshot/         the runtime's full snapshot: mem, rootfs.ext4, state, manifest.json
//! template.json     this module's manifest, written last: its presence marks a complete build
//! ```
//!
//! and is made read-only once complete. Versions are immutable and coexist; `latest` resolves
//! to the newest complete build (by creation time). A build that fails removes everything it
//! made, the volume included.
//!
//! Staleness: the runtime refuses to restore a snapshot written by another QEMU build or
//! accelerator (and checks the kernel's hash and the file sizes). The node checks the template
//! manifest against the runtime before a create and maps a refusal to
//! [`NodeError::TemplateStale`], which tells the caller to build a new version. It does not
//! rebuild on its own: a template's sources may have changed or gone since, and a silent rebuild
//! would hand out sandboxes that differ from what the version promised.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use space_runtime::manifest::ManifestError;
use space_runtime::qmp::QemuVersion;
use space_runtime::{Accel, BootSpec, NodeRuntime};

use crate::error::{NodeError, Result};
use crate::ids::{SandboxId, TemplateName, TemplateRef, TemplateVersion, VersionReq};
use crate::record::now_ms;
use crate::storage::{Layout, Storage};

/// Bumped on incompatible changes of the template layout or manifest.
pub const TEMPLATE_FORMAT: u32 = 1;
/// The template manifest's file name.
pub const TEMPLATE_MANIFEST: &str = "template.json";
/// The kernel inside a template.
pub const KERNEL_FILE: &str = "vmlinux";
/// The pristine root image inside a template.
pub const ROOTFS_FILE: &str = "rootfs.ext4";
/// The snapshot directory inside a template.
pub const SNAPSHOT_DIR: &str = "snapshot";

/// What to build.
#[derive(Debug, Clone)]
pub struct TemplateSpec {
    /// Name and version of the build; the version must not exist yet.
    pub template: TemplateRef,
    /// Uncompressed PVH kernel.
    pub kernel: PathBuf,
    /// Root image (raw ext4) with `space-guestd` as init.
    pub rootfs: PathBuf,
    /// vCPUs of the snapshot (and of every sandbox restored from it).
    pub vcpus: u32,
    /// Guest RAM of the snapshot in MiB.
    pub memory_mib: u64,
    /// Kernel command line; `None` for the runtime's default.
    pub kernel_cmdline: Option<String>,
    /// How long the build VM may take to report ready.
    pub ready_timeout: Duration,
    /// What its sandboxes' commands start with (an image's config).
    pub guest: GuestDefaults,
    /// A process started before the snapshot, and when it counts as up.
    pub start: Option<StartSpec>,
    /// Where the root image came from, for people (`stock base`, an image reference with its
    /// digest, a Dockerfile build).
    pub source: String,
}

pub use space_node_api::template::{GuestDefaults, ReadyCheck, StartSpec, DEFAULT_START_TIMEOUT};

/// Identity of a file a template was built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256, hex (for the kernel; the runtime's hash).
    pub sha256: Option<String>,
}

/// `template.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateManifest {
    /// [`TEMPLATE_FORMAT`].
    pub format: u32,
    /// Name and version.
    pub template: TemplateRef,
    /// QEMU that wrote the snapshot; restores need the same build.
    pub qemu: QemuVersion,
    /// Accelerator of the snapshot.
    pub accel: Accel,
    /// Kernel the template was built from (a copy is in the template as `vmlinux`).
    pub kernel: SourceFile,
    /// Root image it was built from (a copy is in the template as `rootfs.ext4`).
    pub rootfs: SourceFile,
    /// vCPUs of the snapshot.
    pub vcpus: u32,
    /// Guest RAM of the snapshot in MiB.
    pub memory_mib: u64,
    /// Kernel command line the snapshot booted with.
    pub kernel_cmdline: String,
    /// Size of the root disk in bytes.
    pub disk_bytes: u64,
    /// Created, milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// How long the build took, milliseconds.
    pub build_ms: u64,
    /// Defaults of its sandboxes' commands.
    #[serde(default, skip_serializing_if = "GuestDefaults::is_empty")]
    pub guest: GuestDefaults,
    /// The process its snapshot holds, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartSpec>,
    /// Where its root image came from.
    #[serde(default)]
    pub source: String,
}

/// A complete template build on this node.
#[derive(Debug, Clone)]
pub struct Template {
    /// Its directory.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: TemplateManifest,
}

impl Template {
    /// The root image's size in MiB, rounded up.
    pub fn image_mib(&self) -> u64 {
        self.manifest.disk_bytes.div_ceil(1 << 20)
    }

    /// Name and version.
    pub fn template_ref(&self) -> &TemplateRef {
        &self.manifest.template
    }

    /// The kernel inside the template.
    pub fn kernel(&self) -> PathBuf {
        self.dir.join(KERNEL_FILE)
    }

    /// The pristine root image.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join(ROOTFS_FILE)
    }

    /// The full snapshot sandboxes are restored from.
    pub fn snapshot(&self) -> PathBuf {
        self.dir.join(SNAPSHOT_DIR)
    }

    /// Refuses a template this runtime cannot restore, with the reason.
    pub fn check_runtime(&self, runtime: &dyn NodeRuntime) -> Result<()> {
        let m = &self.manifest;
        let reason = if &m.qemu != runtime.version() {
            format!(
                "it was built with QEMU {} ({}), this node runs QEMU {} ({})",
                m.qemu,
                m.qemu.package,
                runtime.version(),
                runtime.version().package
            )
        } else if m.accel != runtime.accel() {
            format!(
                "it was built under {}, this node runs guests under {}",
                m.accel,
                runtime.accel()
            )
        } else {
            return Ok(());
        };
        Err(NodeError::TemplateStale {
            template: m.template.clone(),
            reason,
        })
    }
}

/// Maps a runtime error of a restore from `template` to [`NodeError::TemplateStale`] when the
/// runtime refused the snapshot itself (format, QEMU, accelerator, kernel, sizes).
pub fn stale_or(template: &TemplateRef, e: space_runtime::Error) -> NodeError {
    match e {
        space_runtime::Error::Manifest(
            m @ (ManifestError::Format { .. }
            | ManifestError::QemuVersion { .. }
            | ManifestError::Accel { .. }
            | ManifestError::Kernel { .. }
            | ManifestError::Size { .. }),
        ) => NodeError::TemplateStale {
            template: template.clone(),
            reason: m.to_string(),
        },
        other => NodeError::Runtime(other),
    }
}

/// The identity a build VM takes before its start command: the template's defaults.
pub(crate) fn build_identity(guest: &GuestDefaults) -> space_proto::Identity {
    space_proto::Identity {
        sandbox_id: "template-build".to_owned(),
        env: guest.env.clone(),
        user: guest.user.clone(),
        workdir: guest.workdir.clone(),
        ..Default::default()
    }
}

/// How often a ready check is tried.
const READY_POLL: Duration = Duration::from_millis(250);

/// Applies the template's defaults in the build VM, starts its start command and waits for
/// its ready check. A check that does not pass in time fails the build with the command's
/// output so far.
async fn start(client: &space_proto::GuestClient, spec: &TemplateSpec) -> Result<()> {
    let guest = |what: &'static str| move |source| NodeError::Guest { what, source };
    client
        .identity(&build_identity(&spec.guest))
        .await
        .map_err(guest("template defaults"))?;
    let Some(start) = &spec.start else {
        return Ok(());
    };
    let mut exec = space_proto::ExecSpec::shell(start.command.clone());
    exec.tag = Some("template-start".to_owned());
    let mut handle = client.exec(exec).await.map_err(guest("start command"))?;
    let deadline = Instant::now() + Duration::from_millis(start.timeout_ms);
    let mut output = Vec::new();
    let failed = |why: String, output: &[u8]| {
        let tail = String::from_utf8_lossy(&output[output.len().saturating_sub(2048)..]);
        NodeError::Invalid(format!(
            "start command {:?} {why}; its output: {}",
            start.command,
            if tail.trim().is_empty() {
                "(none)"
            } else {
                tail.trim()
            }
        ))
    };
    loop {
        // Drain what the process wrote meanwhile (it also tells whether it exited).
        while let Ok(next) =
            tokio::time::timeout(Duration::from_millis(10), handle.next_output()).await
        {
            match next.map_err(guest("start command"))? {
                Some(space_proto::ExecOutput::Stdout(b) | space_proto::ExecOutput::Stderr(b)) => {
                    output.extend_from_slice(&b);
                    if output.len() > 64 << 10 {
                        output.drain(..output.len() - (32 << 10));
                    }
                }
                None => {
                    let code = handle
                        .status()
                        .and_then(|s| s.exit_code)
                        .map_or("no exit code".to_owned(), |c| format!("exit code {c}"));
                    return Err(failed(
                        format!("exited ({code}) before it was ready"),
                        &output,
                    ));
                }
            }
        }
        let ready = match &start.ready {
            None => true,
            Some(ReadyCheck::Port(port)) => match client.tcp(*port).await {
                Ok(tunnel) => {
                    drop(tunnel);
                    true
                }
                Err(_) => false,
            },
            Some(ReadyCheck::Command(c)) => client
                .run(space_proto::ExecSpec::shell(c.clone()))
                .await
                .is_ok_and(|o| o.status.success()),
        };
        if ready {
            break;
        }
        if Instant::now() >= deadline {
            return Err(failed(
                format!("was not ready within {} s", start.timeout_ms / 1000),
                &output,
            ));
        }
        tokio::time::sleep(READY_POLL).await;
    }
    // The process keeps running without its output stream; close the stream well before
    // the snapshot so the close is not half-delivered in it.
    drop(handle);
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

/// Runs blocking filesystem work off the async threads. A panic in `f` is answered as an
/// internal fault of the caller's request, not carried on into the caller's task.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => {
            let why = if e.is_panic() {
                format!("it panicked: {}", panic_message(e.into_panic().as_ref()))
            } else {
                "it was cancelled".to_owned()
            };
            tracing::error!(%why, "blocking filesystem task failed");
            Err(NodeError::internal(format!(
                "blocking filesystem task failed: {why}"
            )))
        }
    }
}

/// The text of a panic's payload (`panic!` with a literal or a formatted message).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

/// Reads `template.json` of the build in `dir`; `None` if the build is incomplete or absent.
fn read_manifest(dir: &Path) -> Result<Option<TemplateManifest>> {
    let path = dir.join(TEMPLATE_MANIFEST);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(NodeError::io("reading", &path)(e)),
    };
    let m: TemplateManifest = serde_json::from_slice(&bytes)
        .map_err(|e| NodeError::internal(format!("{}: {e}", path.display())))?;
    if m.format != TEMPLATE_FORMAT {
        return Err(NodeError::TemplateStale {
            template: m.template,
            reason: format!(
                "template format {} (this node reads {TEMPLATE_FORMAT})",
                m.format
            ),
        });
    }
    Ok(Some(m))
}

/// Finds a complete build.
pub fn resolve(layout: &Layout, name: &TemplateName, version: &VersionReq) -> Result<Template> {
    let not_found = || NodeError::TemplateNotFound(format!("{name}:{version}"));
    match version {
        VersionReq::Exact(v) => {
            let dir = layout.template_dir(name.as_str(), v.as_str())?;
            let manifest = read_manifest(&dir)?.ok_or_else(not_found)?;
            Ok(Template { dir, manifest })
        }
        VersionReq::Latest => list(layout)?
            .into_iter()
            .filter(|t| &t.manifest.template.name == name)
            .max_by_key(|t| {
                (
                    t.manifest.created_unix_ms,
                    t.manifest.template.version.clone(),
                )
            })
            .ok_or_else(not_found),
    }
}

/// Every complete build, sorted by name then creation time.
pub fn list(layout: &Layout) -> Result<Vec<Template>> {
    let root = layout.templates();
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(&root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(NodeError::io("listing", &root)(e)),
    };
    for name in entries {
        let name = name.map_err(NodeError::io("listing", &root))?;
        let Ok(tname) = name.file_name().to_string_lossy().parse::<TemplateName>() else {
            continue;
        };
        let versions =
            std::fs::read_dir(name.path()).map_err(NodeError::io("listing", name.path()))?;
        for v in versions {
            let v = v.map_err(NodeError::io("listing", name.path()))?;
            let Ok(version) = v.file_name().to_string_lossy().parse::<TemplateVersion>() else {
                continue;
            };
            let dir = layout.template_dir(tname.as_str(), version.as_str())?;
            if let Some(manifest) = read_manifest(&dir)? {
                out.push(Template { dir, manifest });
            }
        }
    }
    out.sort_by(|a, b| {
        (&a.manifest.template.name, a.manifest.created_unix_ms)
            .cmp(&(&b.manifest.template.name, b.manifest.created_unix_ms))
    });
    Ok(out)
}

/// Builds a template (see the module docs). Leaves nothing behind on failure.
pub async fn build(
    runtime: &dyn NodeRuntime,
    storage: &Arc<dyn Storage>,
    layout: &Layout,
    spec: TemplateSpec,
) -> Result<Template> {
    let t = &spec.template;
    let dir = layout.template_dir(t.name.as_str(), t.version.as_str())?;
    for (what, p) in [("kernel", &spec.kernel), ("root image", &spec.rootfs)] {
        if !p.is_file() {
            return Err(NodeError::Invalid(format!(
                "{what} {} is not a file",
                p.display()
            )));
        }
    }
    if spec.vcpus == 0 || spec.memory_mib < 64 {
        return Err(NodeError::Invalid(format!(
            "a template needs at least 1 vCPU and 64 MiB (asked for {} vCPUs, {} MiB)",
            spec.vcpus, spec.memory_mib
        )));
    }
    if dir.exists() {
        return Err(NodeError::TemplateExists(t.clone()));
    }
    let parent = dir
        .parent()
        .expect("template dirs have a parent")
        .to_owned();
    std::fs::create_dir_all(&parent).map_err(NodeError::io("creating", &parent))?;
    {
        let (s, d) = (storage.clone(), dir.clone());
        match blocking(move || Ok(s.create_volume(&d)?)).await {
            Ok(()) => {}
            // Another build of the same version won the race.
            Err(_) if dir.exists() => return Err(NodeError::TemplateExists(t.clone())),
            Err(e) => return Err(e),
        }
    }
    let build_id = SandboxId::generate();
    let build_dir = layout.sandbox_dir(build_id.as_str())?;
    let result = build_inner(runtime, storage, &spec, &dir, &build_dir).await;
    // The build VM is gone by now (killed or dropped inside); remove its directory either way.
    let (s, d) = (storage.clone(), build_dir.clone());
    let removed = blocking(move || Ok(s.delete_volume(&d)?)).await;
    match result {
        Ok(manifest) => {
            removed?;
            Ok(Template { dir, manifest })
        }
        Err(e) => {
            let (s, d) = (storage.clone(), dir.clone());
            if let Err(cleanup) = blocking(move || Ok(s.delete_volume(&d)?)).await {
                tracing::error!(error = %cleanup, dir = %dir.display(), "removing a failed template build");
            }
            if let Err(cleanup) = removed {
                tracing::error!(error = %cleanup, dir = %build_dir.display(), "removing a template build VM's directory");
            }
            // Leave no empty `templates/<name>/` behind either (fails harmlessly if not empty).
            let _ = std::fs::remove_dir(&parent);
            Err(e)
        }
    }
}

async fn build_inner(
    runtime: &dyn NodeRuntime,
    storage: &Arc<dyn Storage>,
    spec: &TemplateSpec,
    dir: &Path,
    build_dir: &Path,
) -> Result<TemplateManifest> {
    let started = Instant::now();
    let kernel = dir.join(KERNEL_FILE);
    let rootfs = dir.join(ROOTFS_FILE);
    {
        let s = storage.clone();
        let (k_src, k_dst) = (spec.kernel.clone(), kernel.clone());
        let (r_src, r_dst) = (spec.rootfs.clone(), rootfs.clone());
        let b = build_dir.to_owned();
        blocking(move || {
            s.clone_file(&k_src, &k_dst)?;
            s.clone_file(&r_src, &r_dst)?;
            s.create_volume(&b)?;
            Ok(())
        })
        .await?;
    }
    let disk_bytes = std::fs::metadata(&rootfs)
        .map_err(NodeError::io("reading", &rootfs))?
        .len();
    let rootfs_size = std::fs::metadata(&spec.rootfs)
        .map_err(NodeError::io("reading", &spec.rootfs))?
        .len();

    let vm = runtime
        .boot(BootSpec {
            dir: build_dir.to_owned(),
            kernel: kernel.clone(),
            rootfs: rootfs.clone(),
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            kernel_cmdline: spec.kernel_cmdline.clone(),
        })
        .await?;
    let snapshot = async {
        let client = vm.wait_ready(spec.ready_timeout).await?;
        if spec.start.is_some() || !spec.guest.is_empty() {
            start(&client, spec).await?;
        }
        // The snapshot is taken with this connection open and idle, and it is dropped only
        // afterwards: a connection closing while the VM is stopped for the snapshot can leave
        // restored guests with a half-delivered close on their port, which they do not recover
        // from. An idle connection is what the daemon expects to find stale after a restore
        // (docs/protocol.md, "Transport and reconnection").
        let info = vm.snapshot(&dir.join(SNAPSHOT_DIR)).await;
        drop(client);
        Ok::<_, NodeError>(info?)
    }
    .await;
    // The build VM is no longer needed whatever happened.
    let _ = vm.kill().await;
    drop(vm);
    let info = snapshot?;

    let manifest = TemplateManifest {
        format: TEMPLATE_FORMAT,
        template: spec.template.clone(),
        qemu: info.manifest.qemu.clone(),
        accel: info.manifest.accel,
        kernel: SourceFile {
            path: spec.kernel.clone(),
            size: info.manifest.kernel.size,
            sha256: Some(info.manifest.kernel.sha256.clone()),
        },
        rootfs: SourceFile {
            path: spec.rootfs.clone(),
            size: rootfs_size,
            sha256: None,
        },
        vcpus: info.manifest.vcpus,
        memory_mib: info.manifest.memory_mib,
        kernel_cmdline: info.manifest.kernel_cmdline.clone(),
        disk_bytes,
        created_unix_ms: now_ms(),
        build_ms: started.elapsed().as_millis() as u64,
        guest: spec.guest.clone(),
        start: spec.start.clone(),
        source: spec.source.clone(),
    };
    let bytes = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
    let path = dir.join(TEMPLATE_MANIFEST);
    space_fs::write_atomic(&path, &bytes, 0o600)
        .map_err(|e| NodeError::io(e.op, e.path)(e.source))?;
    let (s, d) = (storage.clone(), dir.to_owned());
    blocking(move || Ok(s.set_readonly(&d)?)).await?;
    tracing::info!(
        template = %manifest.template,
        build_ms = manifest.build_ms,
        "template built"
    );
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_in_blocking_work_is_an_internal_fault() {
        let r: Result<()> = blocking(|| panic!("the disk is on fire")).await;
        match r {
            Err(NodeError::Internal(m)) => assert!(m.contains("the disk is on fire"), "{m}"),
            other => panic!("{other:?}"),
        }
        let r: Result<u32> = blocking(|| Ok(7)).await;
        assert_eq!(r.unwrap(), 7);
    }
}
