//! A sandbox restored lazily from the object store (`docs/archive.md`, *Lazy restore*): its
//! VM runs on mounts over its RAM file and disk while their chunks arrive. The driver keeps
//! the filling here; it ends with the VM.
//!
//! - A snapshot (and so a suspend, a fork, a template) waits until the files are whole, then
//!   clones the local files behind the mounts after the VM's own are synced
//!   ([`space_runtime::Vm::set_backing`]): it is the VM's state, whatever arrived when.
//! - If the filling fails (the store failed or stalled past its bound, or a chunk was
//!   corrupt), the VM is killed and its files removed, and the sandbox is Suspended again on
//!   the snapshot it was restoring, which is still in the store.
//! - Once the files are whole, the slots from the store the VM touched while it started (until
//!   the background's release), in the order it first touched them, are kept in the record:
//!   the next upload lists them for the next restore to fetch before its VM runs.
//! - Then the node leaves the VM's data path ([`Sandbox::hand_over`]): once what the filling
//!   wrote is written back (while the guest runs), the guest moves to a new VMM on the
//!   local files, the way a local restore starts, and the mounts go. The
//!   host's streams to the guest (exec, files, the egress gateway's) go through a splice
//!   ([`space_runtime::splice`]) that keeps them across the change. From then on the VM is a
//!   VM like any other: a node that stops or dies leaves it running for its next start to
//!   adopt. If the guest does not take what was sent to it within
//!   [`space_runtime::splice::HOLD_TIMEOUT`], or its state cannot be saved, nothing is
//!   changed and the move is tried again after [`HANDOVER_RETRY`].

use space_archive::lazy::LazyReport;
use tokio::sync::watch;

/// How long after a move that did not happen it is tried again.
pub(super) const HANDOVER_RETRY: Duration = Duration::from_secs(5);
/// How often a move waiting for the local files' write-back looks again.
const WRITEBACK_POLL: Duration = Duration::from_millis(50);
/// The directory (inside the lazy restore's own) the VM's state is saved into for the move.
const HANDOVER_DIR: &str = "handover";
/// What the lazy restore's directory is renamed to once the VM moved, until it is removed
/// (in the background; whoever clears the sandbox's VM files next removes a leftover).
pub(crate) const HANDED_OVER_DIR: &str = ".lazy-handed-over";

use crate::archive::LazyRestore;
use crate::record::{RecoveryAction, RecoveryEvent};
use space_runtime::Splice;

use super::*;

/// The outcome of filling the files in, once known.
type Outcome = Option<std::result::Result<LazyReport, String>>;

/// A lazy restore's files being filled in under a running VM.
pub(super) struct Filling {
    restore: Option<LazyRestore>,
    done: watch::Receiver<Outcome>,
    task: tokio::task::JoinHandle<()>,
    /// Whether the outcome was acted on.
    seen: bool,
    /// Writes back what the filling wrote to the local files, once they are whole, while the
    /// guest still runs: the move to them then does not stop the guest for it.
    writeback: Option<tokio::task::JoinHandle<()>>,
}

impl Filling {
    /// Starts filling `restore`'s files in.
    pub(super) fn start(restore: LazyRestore) -> Filling {
        let (tx, done) = watch::channel(None);
        let files = restore.files.clone();
        let task = tokio::spawn(async move {
            let r = files.hydrate().await.map_err(|e| e.to_string());
            let _ = tx.send(Some(r));
        });
        Filling {
            restore: Some(restore),
            done,
            task,
            seen: false,
            writeback: None,
        }
    }

    /// Lets the background reads begin after `grace` (the VM has started and answered).
    pub(super) fn release_background_after(&self, grace: Duration) {
        if let Some(r) = &self.restore {
            let files = r.files.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                files.release_background();
            });
        }
    }

    /// Why the filling failed, if it did.
    pub(super) fn failed(&self) -> Option<String> {
        self.restore.as_ref().and_then(|r| r.files.failed())
    }

    /// What to wait on for the outcome, while it has not been acted on.
    pub(super) fn pending(&self) -> Option<watch::Receiver<Outcome>> {
        (!self.seen).then(|| self.done.clone())
    }
}

impl Drop for Filling {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(r) = self.restore.take() {
            r.end("the VM is gone");
        }
    }
}

impl Sandbox {
    /// Acts on the outcome of the filling, once it is known: records what the VM touched as
    /// it started, or, if it failed, stops the VM and suspends the sandbox again.
    pub(super) async fn filling_changed(&mut self) {
        let Some(f) = self.lazy.as_mut() else {
            return;
        };
        if f.seen {
            return;
        }
        let outcome = f.done.borrow().clone();
        let Some(outcome) = outcome else {
            return;
        };
        f.seen = true;
        match outcome {
            Ok(report) => {
                let touched = f
                    .restore
                    .as_ref()
                    .map(|r| r.files.take_touched())
                    .unwrap_or_default();
                tracing::info!(
                    id = %self.record.id,
                    hydrated_in = ?report.hydrated_in,
                    urgent = report.urgent_chunks,
                    prefetched = report.prefetched_chunks,
                    background = report.background_chunks,
                    waits = report.waits,
                    waited = ?report.waited,
                    touched = touched.len(),
                    "lazy restore: the VM's files are whole"
                );
                {
                    let mut last = self
                        .status
                        .last_restore
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    if let Some(r) = last.as_mut() {
                        r.lazy = Some(report);
                    }
                }
                let mut touched = touched;
                touched.truncate(space_archive::manifest::MAX_PREFETCH);
                self.record.prefetch = touched;
                if let Err(e) = self.write() {
                    tracing::error!(id = %self.record.id, error = %e, "writing a sandbox record");
                }
                if self.vm.as_ref().is_some_and(|vm| vm.splice().is_some()) {
                    let behind = self.dir.join(crate::archive::LAZY_DIR);
                    if let Some(f) = self.lazy.as_mut() {
                        f.writeback = Some(tokio::task::spawn_blocking(move || {
                            for name in [
                                space_runtime::cmdline::MEM_FILE,
                                space_runtime::cmdline::DISK_FILE,
                            ] {
                                let p = behind.join(name);
                                if let Err(e) = std::fs::File::open(&p).and_then(|f| f.sync_data())
                                {
                                    tracing::warn!(path = %p.display(), error = %e, "writing a lazy restore's file back");
                                }
                            }
                        }));
                    }
                    self.handover_at = Some(tokio::time::Instant::now());
                }
            }
            Err(why) => self.filling_failed(why).await,
        }
    }

    /// The filling failed: the VM goes, and the sandbox is Suspended on the snapshot it was
    /// restored from (in the store, so it restores again).
    async fn filling_failed(&mut self, why: String) {
        tracing::error!(id = %self.record.id, error = %why, "lazy restore failed: stopping the VM");
        let point = match &self.record.origin {
            Origin::Snapshot { snapshot, .. } => Some(snapshot.clone()),
            _ => None,
        };
        self.stop_vm().await;
        self.record.restore_point = point.clone();
        self.record.push_recovery(RecoveryEvent {
            at_unix_ms: now_ms(),
            action: RecoveryAction::RestoreFailed,
            snapshot: point,
            detail: format!("the restore from the object store failed: {why}"),
        });
        if let Err(e) = self.finish(Suspended) {
            tracing::error!(id = %self.record.id, error = %e, "writing a sandbox record");
        }
    }

    /// Waits until the VM's files are whole (at once when it runs on plain files). A failed
    /// filling is an error here, and is acted on by the driver's next step.
    pub(super) async fn wait_filled(&mut self) -> Result<()> {
        let Some(f) = self.lazy.as_ref() else {
            return Ok(());
        };
        let mut done = f.done.clone();
        let outcome = done
            .wait_for(|o| o.is_some())
            .await
            .map(|o| o.clone())
            .map_err(|_| NodeError::internal("the lazy restore's task went away"))?;
        match outcome {
            Some(Ok(_)) => {
                // Recorded now, not at the driver's next step: whoever waited sees it.
                self.filling_changed().await;
                Ok(())
            }
            Some(Err(why)) => Err(NodeError::Archive(format!(
                "the restore from the object store failed: {why}"
            ))),
            None => Err(NodeError::internal(
                "the lazy restore ended without an outcome",
            )),
        }
    }

    /// Ends the filling (the VM is gone or going): waiters get an error, the mounts go.
    pub(super) fn end_filling(&mut self) {
        self.handover_at = None;
        drop(self.lazy.take());
    }

    /// Moves the VM of a filled lazy restore to a new VMM on the local files, and ends the
    /// filling (the mounts go): the node is out of its data path.
    pub(super) async fn hand_over(&mut self) {
        self.handover_at = None;
        let filled = self
            .lazy
            .as_ref()
            .is_some_and(|f| f.seen && f.failed().is_none());
        let splice = self.vm.as_ref().and_then(|vm| vm.splice());
        let (true, Some(splice), Running | Paused) = (filled, splice, self.record.state) else {
            return;
        };
        if let Some(f) = self.lazy.as_ref() {
            if f.writeback.as_ref().is_some_and(|w| !w.is_finished()) {
                self.handover_at = Some(tokio::time::Instant::now() + WRITEBACK_POLL);
                return;
            }
        }
        let t0 = Instant::now();
        if let Err(e) = splice.hold().await {
            tracing::info!(id = %self.record.id, error = %e, retry_in = ?HANDOVER_RETRY, "moving a restored VM to its local files: not now");
            self.handover_at = Some(tokio::time::Instant::now() + HANDOVER_RETRY);
            return;
        }
        let held = t0.elapsed();
        let saved = match self.save_for_handover().await {
            Ok(dest) => dest,
            Err(e) => {
                splice.release();
                tracing::warn!(id = %self.record.id, error = %e, retry_in = ?HANDOVER_RETRY, "moving a restored VM to its local files: its state was not saved");
                self.handover_at = Some(tokio::time::Instant::now() + HANDOVER_RETRY);
                return;
            }
        };
        let t_saved = t0.elapsed();
        let paused = self.record.state == Paused;
        // From here the old VMM is gone: the saved state is the VM.
        if let Some(vm) = self.vm.take() {
            let _ = vm.kill().await;
        }
        self.end_filling();
        let t_gone = t0.elapsed();
        let moved = self.start_handed_over(&saved, paused, &splice).await;
        splice.release();
        let vm = match moved {
            Ok(vm) => {
                if let Some(l) = self.egress_loop.as_mut() {
                    // The loop's stream went over with the guest.
                    l.pid = vm.pid();
                }
                vm
            }
            Err(e) => {
                // Its state is saved: a VMM without the streams, which the host makes anew
                // (the egress loop starts again for the new VMM).
                tracing::warn!(id = %self.record.id, error = %e, "moving a restored VM to its local files: starting again without its open streams");
                drop(self.client.take());
                match self
                    .start_handed_over(&saved, paused, &Splice::new(&self.dir))
                    .await
                {
                    Ok(vm) => vm,
                    Err(e) => {
                        return self
                            .filling_failed(format!(
                                "the VM could not start again on its local files: {e}"
                            ))
                            .await
                    }
                }
            }
        };
        self.vm = Some(vm);
        // The lazy restore's directory going is what makes the node's next start adopt the
        // VM rather than suspend it: renamed at once, removed behind.
        let (lazy, gone) = (
            self.dir.join(crate::archive::LAZY_DIR),
            self.dir.join(HANDED_OVER_DIR),
        );
        match std::fs::rename(&lazy, &gone) {
            Ok(()) => {
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = std::fs::remove_dir_all(&gone) {
                        tracing::warn!(path = %gone.display(), error = %e, "removing a lazy restore's old files");
                    }
                });
            }
            Err(e) => {
                tracing::error!(id = %self.record.id, error = %e, "removing a lazy restore's files")
            }
        }
        if let Some(r) = self
            .status
            .last_restore
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            r.handed_over = Some(t0.elapsed());
        }
        tracing::info!(
            id = %self.record.id, took = ?t0.elapsed(), ?held, saved = ?t_saved,
            old_gone = ?t_gone, "restored VM moved to its local files"
        );
    }

    /// Stops the VM and saves its device state into the lazy restore's directory, its RAM
    /// file and disk synced to the local files there. On an error the VM runs as before.
    async fn save_for_handover(&mut self) -> Result<PathBuf> {
        let vm = self.vm()?;
        let dest = self.dir.join(crate::archive::LAZY_DIR).join(HANDOVER_DIR);
        if dest.exists() {
            let d = dest.clone();
            blocking(move || std::fs::remove_dir_all(&d).map_err(NodeError::io("removing", d)))
                .await?;
        }
        vm.save_state(&dest).await?;
        Ok(dest)
    }

    /// Starts a VMM on the state saved in `saved` with the lazy restore's local files as the
    /// sandbox's RAM file and disk (hard links: a start that fails removes its files, not the
    /// local ones).
    async fn start_handed_over(
        &mut self,
        saved: &Path,
        paused: bool,
        splice: &Splice,
    ) -> Result<Box<dyn NodeVm>> {
        let (dir, from) = (self.dir.clone(), self.dir.join(crate::archive::LAZY_DIR));
        blocking(move || {
            for name in [
                space_runtime::cmdline::MEM_FILE,
                space_runtime::cmdline::DISK_FILE,
            ] {
                let (src, dst) = (from.join(name), dir.join(name));
                let _ = crate::archive::detach(&dst);
                match std::fs::remove_file(&dst) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(NodeError::io("removing", dst)(e)),
                }
                std::fs::hard_link(&src, &dst).map_err(NodeError::io("linking", dst))?;
            }
            Ok(())
        })
        .await?;
        let vm = self
            .ctx
            .runtime
            .restore(RestoreSpec {
                snapshot: saved.to_owned(),
                dir: self.dir.clone(),
                paused,
                kernel: None,
                files_in_place: true,
                priority: Priority::Normal,
                splice: Some(splice.clone()),
            })
            .await?;
        Ok(vm)
    }
}
