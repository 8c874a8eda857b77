//! Creating a sandbox, from a template or as a fork of another: admission, the new record,
//! the VM (a warm-pool member when there is one), and the driver that takes it from there.

use super::*;

impl Node {
    /// Creates a sandbox from a template and returns it Running (guest ready, identity set).
    ///
    /// With the template's vCPUs and memory (the default) this restores the template's
    /// snapshot into a CoW clone; with another shape it cold-boots the template's kernel on a
    /// clone of its root image (seconds under TCG; build a template variant with that shape
    /// for the fast path). A disk size larger than the image's grows the disk and the root
    /// filesystem once the guest runs (a smaller one, or one over
    /// [`NodeConfig::max_disk_mib`], is refused). A create that fails
    /// leaves nothing behind (no directory, no record).
    pub async fn create(&self, req: CreateRequest) -> Result<SandboxInfo> {
        self.check_open()?;
        let ctx = &self.inner.ctx;
        let t = template::resolve(&ctx.layout, &req.template, &req.version)?;
        t.check_runtime(&*ctx.runtime)?;
        let opts = req.options;
        validate_options(&opts, &t, self.inner.max_disk_mib)?;
        for m in &opts.volumes {
            ctx.volumes.open(&m.volume)?;
        }
        let vcpus = opts.vcpus.unwrap_or(t.manifest.vcpus);
        let memory_mib = opts.memory_mib.unwrap_or(t.manifest.memory_mib);
        let disk_mib = opts.disk_mib.unwrap_or(t.image_mib());
        let ticket = self.admit(vcpus, memory_mib)?;
        let (how, origin) = if vcpus == t.manifest.vcpus && memory_mib == t.manifest.memory_mib {
            (
                Launch::Restore {
                    snapshot: t.snapshot(),
                },
                Origin::Template,
            )
        } else {
            (
                Launch::Boot {
                    kernel: t.kernel(),
                    rootfs: t.rootfs(),
                    vcpus,
                    memory_mib,
                    kernel_cmdline: Some(t.manifest.kernel_cmdline.clone()),
                },
                Origin::TemplateColdBoot,
            )
        };
        let mut record = new_record(
            SandboxId::generate(),
            t.template_ref().clone(),
            opts,
            MachineShape {
                vcpus,
                memory_mib,
                disk_mib,
            },
            origin,
            None,
            Owner {
                tenant: req.tenant.clone(),
                lineage: None,
            },
        );
        record.guest = t.manifest.guest.clone();
        if let Launch::Restore { .. } = how {
            // A warm-pool member if there is one (`crate::pool`), else the restore below.
            if let Some(live) = self.inner.pools.take(t.template_ref(), &mut record).await {
                return self.register(record, live);
            }
            let t0 = Instant::now();
            let info = self.start(record, how, ticket).await?;
            self.inner.pools.restored(t.template_ref(), t0.elapsed());
            return Ok(info);
        }
        self.start(record, how, ticket).await
    }

    /// Forks a Running or Paused sandbox: a full snapshot of the parent (listed among its
    /// snapshots, reason `fork`) restored into a new sandbox with its own id, hostname and
    /// entropy. The child is Running; the parent stays as it was.
    pub async fn fork(&self, id: &SandboxId) -> Result<SandboxInfo> {
        self.check_open()?;
        let shape = self.info(id).await?;
        let ticket = self.admit(shape.vcpus, shape.memory_mib)?;
        let point: ForkPoint = self.call(id, Request::Fork).await?;
        let parent = point.parent;
        let mut record = new_record(
            SandboxId::generate(),
            parent.template.clone(),
            parent.options.clone(),
            MachineShape {
                vcpus: parent.vcpus,
                memory_mib: parent.memory_mib,
                disk_mib: parent.disk_mib,
            },
            Origin::Snapshot {
                sandbox: parent.id.clone(),
                snapshot: point.snapshot.clone(),
            },
            Some((parent.id.clone(), point.snapshot.clone())),
            Owner {
                tenant: parent.tenant.clone(),
                lineage: Some(parent.lineage().to_owned()),
            },
        );
        record.guest = parent.guest.clone();
        self.start(
            record,
            Launch::Restore {
                snapshot: point.dir,
            },
            ticket,
        )
        .await
    }

    /// Makes the sandbox directory, starts the VM, records the outcome and spawns the driver.
    /// `_ticket` (admission) is held until the driver is registered and counts the VM.
    async fn start(
        &self,
        record: SandboxRecord,
        how: Launch,
        _ticket: Ticket,
    ) -> Result<SandboxInfo> {
        let ctx = self.inner.ctx.clone();
        let id = record.id.clone();
        let dir = ctx.layout.sandbox_dir(id.as_str())?;
        ctx.records.write(&record)?;
        let made = async {
            let (s, d) = (ctx.storage.clone(), dir.clone());
            blocking(move || Ok(s.create_volume(&d)?)).await?;
            launch(&ctx, &dir, how, &record).await
        }
        .await;
        let live = match made {
            Ok(live) => live,
            Err(e) => {
                let (s, d) = (ctx.storage.clone(), dir.clone());
                let _ = blocking(move || {
                    let _ = clear_vm_files(&d);
                    Ok(s.delete_volume(&d)?)
                })
                .await
                .map_err(|cleanup| tracing::error!(error = %cleanup, "removing a failed sandbox"));
                let _ = ctx.records.remove(&id);
                return Err(e);
            }
        };
        self.register(record, live)
    }

    /// Records a sandbox whose VM is ready (`live`) as Running and spawns its driver.
    fn register(&self, mut record: SandboxRecord, live: Live) -> Result<SandboxInfo> {
        let ctx = self.inner.ctx.clone();
        let id = record.id.clone();
        let dir = ctx.layout.sandbox_dir(id.as_str())?;
        let now = now_ms();
        record.state = State::Running;
        record.pending = None;
        record.state_since_unix_ms = now;
        record.started_unix_ms = now;
        record.last_activity_unix_ms = now;
        if let Err(e) = ctx.records.write(&record) {
            drop(live);
            let _ = ctx.storage.delete_volume(&dir);
            let _ = ctx.records.remove(&id);
            return Err(e.into());
        }
        let handle = Sandbox::spawn(ctx, record.clone(), Some(live))?;
        self.inner
            .sandboxes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, handle);
        Ok(record)
    }
}
