//! Starting a sandbox's VM (a restore or a cold boot) and bringing its guest to ready.

use super::*;

/// How to start a sandbox's VM.
pub(crate) enum Launch {
    /// Restore a full snapshot.
    Restore { snapshot: PathBuf },
    /// Restore a full snapshot with the VMM at background CPU priority (a VM made ahead of
    /// demand; whoever hands it out raises it with [`Vm::set_priority`]).
    RestoreInBackground { snapshot: PathBuf },
    /// Restore a full snapshot whose RAM file and disk are already in the sandbox directory
    /// (`snapshot` holds its device state and manifest): fetched there, or mounted there by a
    /// lazy restore. With `prefetch`, the VM loads its device state and then waits, paused,
    /// until that lazy restore's prefetch list is here (at most [`PREFETCH_GATE`]).
    RestoreInPlace {
        snapshot: PathBuf,
        prefetch: Option<space_archive::lazy::LazyFiles>,
        /// The guest channels' splice of a lazy restore, which keeps the host's streams when
        /// the VM moves to a new VMM on its local files (`lazy.rs`).
        splice: Option<space_runtime::Splice>,
    },
    /// Cold boot on a clone of `rootfs`.
    Boot {
        kernel: PathBuf,
        rootfs: PathBuf,
        vcpus: u32,
        memory_mib: u64,
        kernel_cmdline: Option<String>,
    },
}

/// The identity a guest takes after every start: fresh entropy from the host's RNG, the wall
/// clock, hostname and sandbox id, the sandbox's environment (with each bound credential's
/// placeholder under its name), the deployment CA.
pub(crate) fn identity(ctx: &Ctx, record: &SandboxRecord) -> Identity {
    let mut entropy = vec![0u8; 64];
    rand::rngs::OsRng.fill_bytes(&mut entropy);
    let mut env = record.guest.env.clone();
    env.extend(record.options.env.clone());
    for b in &record.options.secrets {
        env.insert(b.name.clone(), b.placeholder.clone());
    }
    Identity {
        sandbox_id: record.id.to_string(),
        entropy,
        time_unix_ns: Some(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        ),
        hostname: Some(record.id.to_string()),
        env,
        ca_pem: Some(ctx.gateway.ca_pem()),
        user: record.guest.user.clone(),
        workdir: record.guest.workdir.clone(),
    }
}

/// Files a VM leaves in its sandbox directory that must go before another VM starts there
/// (the logs stay).
const VM_FILES: &[&str] = &["mem", "rootfs.ext4", "qmp.sock", "ctl.sock", "egress.sock"];

pub(crate) fn clear_vm_files(dir: &Path) -> Result<()> {
    // A lazy restore's files are mounts over the RAM file and disk, and its local files are
    // in their own directory: both go (a mount point that is none answers EINVAL).
    for name in ["mem", "rootfs.ext4"] {
        let _ = crate::archive::detach(&dir.join(name));
    }
    for name in [crate::archive::LAZY_DIR, super::lazy::HANDED_OVER_DIR] {
        let lazy = dir.join(name);
        match std::fs::remove_dir_all(&lazy) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(NodeError::io("removing", lazy)(e)),
        }
    }
    for name in VM_FILES {
        let p = dir.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(NodeError::io("removing", p)(e)),
        }
    }
    Ok(())
}

/// The longest a lazily restored VM waits, loaded and paused, for its prefetch list before it
/// runs anyway (what is still missing then is fetched as it touches it).
pub(crate) const PREFETCH_GATE: Duration = Duration::from_secs(3);

/// How often the identity step is tried on a fresh connection when the connection drops.
const IDENTITY_ATTEMPTS: u32 = 4;

/// Starts a VM in `dir` and brings its guest to ready with `record`'s identity. On failure
/// the VM is killed and its files removed from `dir`.
pub(crate) async fn launch(
    ctx: &Ctx,
    dir: &Path,
    how: Launch,
    record: &SandboxRecord,
) -> Result<Live> {
    let t0 = Instant::now();
    let in_place = matches!(how, Launch::RestoreInPlace { .. });
    let priority = match how {
        Launch::RestoreInBackground { .. } => Priority::Background,
        _ => Priority::Normal,
    };
    let prefetch = match &how {
        Launch::RestoreInPlace {
            prefetch: Some(f), ..
        } if f.prefetch_len() > 0 => Some(f.clone()),
        _ => None,
    };
    let splice = match &how {
        Launch::RestoreInPlace { splice, .. } => splice.clone(),
        _ => None,
    };
    let vm = match how {
        Launch::Restore { snapshot }
        | Launch::RestoreInPlace { snapshot, .. }
        | Launch::RestoreInBackground { snapshot } => {
            ctx.runtime
                .restore(RestoreSpec {
                    snapshot,
                    dir: dir.to_owned(),
                    paused: prefetch.is_some(),
                    kernel: None,
                    files_in_place: in_place,
                    priority,
                    splice,
                })
                .await
        }
        Launch::Boot {
            kernel,
            rootfs,
            vcpus,
            memory_mib,
            kernel_cmdline,
        } => {
            ctx.runtime
                .boot(BootSpec {
                    dir: dir.to_owned(),
                    kernel,
                    rootfs,
                    vcpus,
                    memory_mib,
                    kernel_cmdline,
                })
                .await
        }
    }
    .map_err(|e| template::stale_or(&record.template, e))?;
    let mut gated = None;
    if let Some(files) = prefetch {
        let t_gate = Instant::now();
        let complete = tokio::time::timeout(PREFETCH_GATE, files.prefetched())
            .await
            .is_ok();
        let waited = t_gate.elapsed();
        tracing::debug!(id = %record.id, chunks = files.prefetch_len(), complete, ?waited, "prefetch list before the VM runs");
        gated = Some((files.prefetch_len(), waited));
        // The store failed while the VM waited: it never runs (the caller says why).
        if let Some(why) = files.failed() {
            abandon(vm, dir).await;
            return Err(NodeError::Archive(format!(
                "the restore from the object store failed: {why}"
            )));
        }
        if let Err(e) = vm.resume().await {
            abandon(vm, dir).await;
            return Err(e.into());
        }
    }
    let started = t0.elapsed();
    let ready = async {
        // The daemon may drop a connection that answered (a stale connection's close from an
        // earlier attempt reaching it late); the identity step is idempotent, so a lost
        // connection is retried on a fresh one, a few times.
        let mut attempt = 1;
        let client = loop {
            let client = vm.wait_ready(ctx.ready_timeout).await?;
            match client.identity(&identity(ctx, record)).await {
                Ok(_) => break client,
                Err(e @ (ClientError::Closed | ClientError::Transport(_)))
                    if attempt < IDENTITY_ATTEMPTS =>
                {
                    tracing::debug!(id = %record.id, attempt, error = %e, "identity step: reconnecting");
                    attempt += 1;
                }
                Err(source) => {
                    return Err(NodeError::Guest {
                        what: "identity",
                        source,
                    })
                }
            }
        };
        ensure_disk(&*vm, &client, record).await?;
        mount_volumes(&client, record).await?;
        Ok::<_, NodeError>(client)
    }
    .await;
    match ready {
        Ok(client) => {
            tracing::debug!(id = %record.id, ?started, ready = ?t0.elapsed(), "sandbox VM ready");
            Ok(Live {
                vm,
                client: Some(client),
                started,
                prefetch: gated,
            })
        }
        Err(e) => {
            abandon(vm, dir).await;
            Err(e)
        }
    }
}

/// Kills a VM that failed to start and removes its files from `dir`.
async fn abandon(vm: Box<dyn NodeVm>, dir: &Path) {
    let _ = vm.kill().await;
    drop(vm);
    if let Err(cleanup) = clear_vm_files(dir) {
        tracing::error!(error = %cleanup, "cleaning up after a failed start");
    }
}

/// Grows the root disk and filesystem of a running guest to the size the sandbox was created
/// with, when its disk is smaller (a VM from the template's snapshot or image; a fork, restore
/// or rollback starts from a disk that already has the size, and this does nothing).
pub(crate) async fn ensure_disk(
    vm: &dyn NodeVm,
    client: &GuestClient,
    record: &SandboxRecord,
) -> Result<()> {
    let Some(mib) = record.options.disk_mib else {
        return Ok(());
    };
    let want = mib << 20;
    let have = vm.disk_bytes().await?;
    if have >= want {
        return Ok(());
    }
    let t0 = Instant::now();
    vm.resize_disk(want).await?;
    let grown = client
        .grow_fs("/", Some(want))
        .await
        .map_err(|source| NodeError::Guest {
            what: "growing the root filesystem",
            source,
        })?;
    tracing::debug!(
        id = %record.id, from = have, to = want, fs_bytes = grown.new_bytes,
        took = ?t0.elapsed(), "root disk grown"
    );
    Ok(())
}

/// Mounts `record`'s volumes in the guest (one mounted already, as in a restored or forked
/// guest, is left as it is). Right after a cold boot the guest's uplink may not be up yet:
/// the mount is tried again for a few seconds.
pub(crate) async fn mount_volumes(client: &GuestClient, record: &SandboxRecord) -> Result<()> {
    for (index, m) in record.options.volumes.iter().enumerate() {
        let req = space_proto::volume::MountRequest {
            index: index as u32,
            path: m.path.clone(),
            read_only: m.read_only,
            name: m.name.clone(),
        };
        let mut attempt = 0;
        loop {
            match client.mount_volume(&req).await {
                Ok(_) => break,
                Err(ClientError::Guest(e))
                    if e.kind == space_proto::ErrorKind::Busy && attempt < 50 =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(source) => {
                    return Err(NodeError::Guest {
                        what: "mounting a volume",
                        source,
                    })
                }
            }
        }
    }
    Ok(())
}

/// Apparent size of the files in a snapshot directory.
pub(crate) fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}
