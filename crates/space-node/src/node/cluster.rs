//! What a node does as a member of a cluster: it adopts sandboxes the control plane moves to
//! it, discards the ones that moved away, fences (no commits, no background passes), names
//! its VMs for the fence watchdog and its secret bindings for the heartbeat, and publishes
//! or fetches template builds through the object store (`docs/cluster.md`).

use super::*;

impl Node {
    /// Takes sandbox `id` of `tenant` from the object store as this node's, under ownership
    /// `epoch`: it is Suspended here on its newest archived snapshot, and a restore (or a
    /// wake on access) fetches it. The control plane calls this when it moved the sandbox
    /// here from a lost or draining node. Adopting a sandbox this node already holds under
    /// the same epoch answers it as it is.
    pub async fn adopt(&self, id: &SandboxId, tenant: &str, epoch: u64) -> Result<SandboxInfo> {
        let cfg = self
            .archive()
            .ok_or_else(|| NodeError::Invalid("this node has no object store".into()))?
            .clone();
        if let Ok(r) = self.info(id).await {
            if r.epoch == epoch && r.tenant == tenant {
                return Ok(r);
            }
            // An older stay here: what this node has of it is stale.
            self.discard(id).await?;
        }
        let r = crate::archive::adopt_moved(&self.inner.ctx, &cfg, id, tenant, epoch).await?;
        let h = Sandbox::spawn(self.inner.ctx.clone(), r.clone(), None)?;
        self.lock_sandboxes().insert(r.id.clone(), h);
        Ok(r)
    }

    /// Forgets sandbox `id`, which belongs to another node now: its VM is killed, its
    /// directory, local snapshots and record removed, and nothing is written to the object
    /// store (the new owner's). Unknown ids are not an error.
    pub async fn discard(&self, id: &SandboxId) -> Result<()> {
        // The VM goes first, at once: its driver may be waiting on it (a snapshot cut short
        // by a fence), and must not be waited for while the VM could still run.
        self.kill_vm_now(id);
        match self.call(id, Request::Discard).await {
            Ok(()) | Err(NodeError::NotFound(_)) => {}
            // A record without a driver (terminated here): only files to remove.
            Err(NodeError::IllegalState { .. }) => {
                let ctx = &self.inner.ctx;
                for dir in [
                    ctx.layout.sandbox_dir(id.as_str())?,
                    ctx.layout.snapshots_of(id.as_str())?,
                ] {
                    if dir.exists() {
                        let _ = std::fs::remove_dir_all(&dir);
                    }
                }
                ctx.records.remove(id)?;
            }
            Err(e) => return Err(e),
        }
        self.lock_sandboxes().remove(id);
        Ok(())
    }

    /// Publishes template build `t` to the object store (once per build; the first upload
    /// of a snapshot made from it would do it anyway), so that every node can fetch it.
    pub async fn publish_template(&self, t: &TemplateRef) -> Result<()> {
        let cfg = self
            .archive()
            .ok_or_else(|| NodeError::Invalid("this node has no object store".into()))?;
        let built = self.template(&t.name, &VersionReq::Exact(t.version.clone()))?;
        crate::archive::template_base(&self.inner.ctx, cfg, &built).await?;
        Ok(())
    }

    /// Template build `t` from the object store, fetched when this node does not have it;
    /// `None` when the store has no published build of it.
    pub async fn fetch_template(&self, t: &TemplateRef) -> Result<Option<Template>> {
        let cfg = self
            .archive()
            .ok_or_else(|| NodeError::Invalid("this node has no object store".into()))?;
        let Some(base) = crate::archive::published(cfg, t).await? else {
            return Ok(None);
        };
        crate::archive::local_template(&self.inner.ctx, cfg, &base)
            .await
            .map(Some)
    }

    /// The secret names each live sandbox is bound to (sandboxes bound to none are left out).
    pub fn secret_bindings(&self) -> Vec<(SandboxId, Vec<String>)> {
        self.lock_sandboxes()
            .iter()
            .filter(|(_, h)| h.status.state() != State::Terminated)
            .filter(|(_, h)| !h.status.egress.bindings().is_empty())
            .map(|(id, h)| {
                let names = h.status.egress.bindings().iter().map(|b| b.name.clone());
                (id.clone(), names.collect())
            })
            .collect()
    }

    /// Kills the QEMU process of sandbox `id`, if it has one, without waiting for its
    /// driver (which notices the VM's end as it would a crash).
    pub fn kill_vm_now(&self, id: &SandboxId) {
        self.inner
            .ctx
            .discarding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id.clone());
        let Ok(dir) = self.inner.ctx.layout.sandbox_dir(id.as_str()) else {
            return;
        };
        let pid = std::fs::read_to_string(dir.join(space_runtime::cmdline::PID_FILE))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        let Some(pid) = pid else { return };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.starts_with("qemu") {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// The pids of the QEMU processes of this node's VMs now (sandboxes and warm pools), from
    /// the pidfiles in their directories, each checked to be a live QEMU process.
    pub fn vm_pids(&self) -> Vec<u32> {
        let Ok(dirs) = std::fs::read_dir(self.inner.ctx.layout.sandboxes()) else {
            return Vec::new();
        };
        dirs.filter_map(|e| {
            let dir = e.ok()?.path();
            let pid: u32 = std::fs::read_to_string(dir.join(space_runtime::cmdline::PID_FILE))
                .ok()?
                .trim()
                .parse()
                .ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            comm.starts_with("qemu").then_some(pid)
        })
        .collect()
    }

    /// Fences the node (a member that could not renew its lease) or lifts the fence: while
    /// fenced, no commit reaches the object store and the background passes (timeouts,
    /// rolling snapshots, uploads) do nothing.
    pub fn set_fenced(&self, fenced: bool) {
        self.inner
            .ctx
            .fenced
            .store(fenced, std::sync::atomic::Ordering::SeqCst);
    }

    pub(super) fn is_fenced(inner: &Inner) -> bool {
        inner.ctx.fenced.load(std::sync::atomic::Ordering::SeqCst)
    }
}
