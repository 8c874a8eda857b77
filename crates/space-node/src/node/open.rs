//! Opening a node: its data directory, storage, records and egress gateway, the VMs a fenced
//! node left stopped, crash recovery, and the background passes; then, once, its object
//! store.

use super::background::{handles_of, reconcile, reconcile_every, rolling_pass};
use super::*;

impl Node {
    /// Prepares the data directory (mounting a loop-backed btrfs image when needed), probes
    /// QEMU, recovers the sandboxes an earlier node process left ([`crate::recovery`]: live
    /// VMs adopted, lost ones restored, cut-short transitions finished or undone, orphans
    /// removed), and starts the timeout reconciler.
    pub async fn open(config: NodeConfig) -> Result<Node> {
        let runtime = QemuRuntime::new(config.qemu.clone()).await?;
        Node::open_with(config, Arc::new(runtime)).await
    }

    /// [`Node::open`] on a runtime of the caller's ([`NodeConfig::qemu`] is not used).
    pub async fn open_with(config: NodeConfig, runtime: Arc<dyn NodeRuntime>) -> Result<Node> {
        let (data, opts) = (config.data_dir.clone(), config.storage.clone());
        let (storage, layout): (Arc<dyn Storage>, Layout) =
            blocking(move || Ok(storage::open(&data, &opts)?)).await?;
        let records = RecordStore::open(layout.root().join("state").join("sandboxes"))?;
        let (ca_dir, gw) = (
            layout.root().join("state").join("ca"),
            config.gateway.clone(),
        );
        let gateway = blocking(move || {
            Gateway::open(&ca_dir, gw)
                .map_err(|e| NodeError::internal(format!("egress gateway: {e}")))
        })
        .await?;
        let (layout_volumes, storage_for_volumes) = (layout.volumes(), storage.clone());
        let ctx = Arc::new(Ctx {
            runtime,
            storage,
            layout,
            records,
            ready_timeout: config.ready_timeout,
            auto_restore: config.auto_restore,
            gateway,
            archive: std::sync::OnceLock::new(),
            archive_lock: tokio::sync::Mutex::new(()),
            restore_mode: 0.into(),
            fenced: false.into(),
            discarding: Default::default(),
            disk_reserve_mib: config.admission.disk_reserve_mib,
            volumes: crate::volumes::VolumeStore::new(layout_volumes, storage_for_volumes),
        });
        let node = Node {
            inner: Arc::new(Inner {
                pools: Pools::new(ctx.clone(), config.pools.clone()),
                ctx,
                admission: Admission::new(config.admission.clone()),
                rolling: config.rolling,
                max_disk_mib: config.max_disk_mib,
                sandboxes: Mutex::default(),
                shutting_down: false.into(),
                adopted: Mutex::default(),
                last_gc_ms: now_ms().into(),
                preparing: Mutex::default(),
                metrics: Default::default(),
            }),
        };
        // A node process that died while fenced left its guests stopped (crate::fence):
        // recovery adopts them, so they continue; a member fences them again at its start.
        for pid in node.vm_pids() {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if stat
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
            {
                tracing::warn!(pid, "continuing a VM a fence stopped");
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
        }
        node.recover_pass(true).await?;
        if let Some(cfg) = config.archive.clone() {
            node.attach_archive(cfg, true).await?;
        }
        if let Some(tick) = config.timeout_tick {
            tokio::spawn(reconcile_every(
                Arc::downgrade(&node.inner),
                tick,
                |inner| async move {
                    reconcile(&inner).await;
                },
            ));
        }
        if let Some(tick) = config.metrics_tick {
            tokio::spawn(reconcile_every(
                Arc::downgrade(&node.inner),
                tick,
                |inner| async move {
                    inner.metrics.sample(handles_of(&inner)).await;
                },
            ));
        }
        if config.rolling.enabled {
            tokio::spawn(reconcile_every(
                Arc::downgrade(&node.inner),
                config.rolling.tick,
                |inner| async move {
                    rolling_pass(&inner).await;
                },
            ));
        }
        // After recovery, which removes sandbox directories no record names.
        node.inner.pools.spawn_loop();
        Ok(node)
    }

    /// Gives the node its object store, once: when `adopt`, every sandbox the store holds
    /// that this node has no record of comes back as a Suspended record (a single host that
    /// lost its disk; see [`Node::take_adopted`]); a node of a cluster adopts only the
    /// sandboxes the control plane moves to it ([`Node::adopt`]). Then the archive pass
    /// starts. A store that cannot be reached or listed does not keep the node's own
    /// sandboxes down: it is logged, and uploads retry on every pass.
    pub async fn attach_archive(&self, cfg: ArchiveConfig, adopt: bool) -> Result<()> {
        if self.inner.ctx.archive.set(cfg).is_err() {
            return Err(NodeError::Invalid(
                "this node already has an object store".into(),
            ));
        }
        let cfg = self.inner.ctx.archive.get().expect("just set");
        let checked = cfg.archive.check().await;
        if let Err(e) = &checked {
            tracing::error!(error = %e, "object store");
        }
        if adopt {
            let found = match checked {
                Ok(()) => crate::archive::adopt_archived(&self.inner.ctx, cfg).await,
                Err(e) => Err(NodeError::Archive(e.to_string())),
            };
            match found {
                Ok(found) => {
                    for r in found {
                        let h = Sandbox::spawn(self.inner.ctx.clone(), r.clone(), None)?;
                        self.lock_sandboxes().insert(r.id.clone(), h);
                        self.inner
                            .adopted
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(r);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "object store: archived sandboxes not listed")
                }
            }
        }
        if let Some(every) = cfg.volume_copy_interval {
            let cfg = cfg.clone();
            tokio::spawn(reconcile_every(
                Arc::downgrade(&self.inner),
                every,
                move |inner| {
                    let cfg = cfg.clone();
                    async move {
                        if !Node::is_fenced(&inner) {
                            super::volumes::sync_all(&inner.ctx, &cfg).await;
                        }
                    }
                },
            ));
        }
        tokio::spawn(reconcile_every(
            Arc::downgrade(&self.inner),
            crate::archive::ARCHIVE_TICK,
            |inner| async move {
                if !Node::is_fenced(&inner) {
                    crate::archive::pass(&inner.ctx, handles_of(&inner), &inner.last_gc_ms).await;
                }
            },
        ));
        Ok(())
    }
}
