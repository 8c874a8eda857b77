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

use space_archive::lazy::LazyReport;
use tokio::sync::watch;

use crate::archive::LazyRestore;
use crate::record::{RecoveryAction, RecoveryEvent};

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
        drop(self.lazy.take());
    }
}
