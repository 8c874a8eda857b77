//! Panic isolation: a panic in one sandbox's state driver is caught; its request is
//! answered, the VM is let go and the sandbox is recovered from its record on disk, as at
//! start (after [`MAX_PANICS`] in [`PANIC_WINDOW`] the driver stops trying and serves only
//! kill).

use super::*;

/// How many panics within [`PANIC_WINDOW`] a driver recovers its sandbox from; after that it
/// stops (a sandbox whose record or VM makes the driver panic every time would loop).
pub(crate) const MAX_PANICS: usize = 3;
/// See [`MAX_PANICS`].
pub(crate) const PANIC_WINDOW: Duration = Duration::from_secs(600);

/// What the events recorded by a recovery after a panic name as the cause.
const DRIVER_FAILED: &str = "the sandbox's state driver failed";

impl Sandbox {
    /// After a panic in the driver (the request it was handling is answered already, see
    /// [`Reply`]): lets go of the VM without killing it and recovers the sandbox from its
    /// record on disk, as crash recovery does at start. True when the driver should stop
    /// (nothing left to drive).
    pub(super) async fn panicked(&mut self, panic: String) -> bool {
        let id = self.record.id.clone();
        tracing::error!(%id, %panic, "the sandbox's state driver panicked");
        // What the driver holds may be half-changed. The VM runs on: the guest keeps all it
        // acknowledged, and recovery takes it over as it is.
        drop(self.egress_loop.take());
        drop(self.client.take());
        if let Some(vm) = self.vm.take() {
            vm.detach();
        }
        self.disk_mark = None;
        let now = Instant::now();
        self.panics
            .retain(|t| now.duration_since(*t) < PANIC_WINDOW);
        self.panics.push(now);
        if self.panics.len() > MAX_PANICS {
            return self.fault(format!(
                "its state driver panicked {} times within {} minutes (the last: {panic})",
                self.panics.len(),
                PANIC_WINDOW.as_secs() / 60
            ));
        }
        let record = match self.ctx.records.read(&id) {
            Ok(Some(r)) => r,
            Ok(None) => {
                tracing::warn!(%id, "no record left after a panic of its driver");
                return true;
            }
            Err(e) => {
                return self.fault(format!(
                    "its state driver panicked ({panic}) and its record cannot be read: {e}"
                ))
            }
        };
        let recovered = std::panic::AssertUnwindSafe(crate::recovery::recover_one(
            &self.ctx,
            record,
            DRIVER_FAILED,
        ))
        .catch_unwind()
        .await;
        match recovered {
            Ok(Ok(Some((record, live)))) => {
                self.go_on_with(record, live);
                false
            }
            Ok(Ok(None)) => {
                if let Ok(Some(r)) = self.ctx.records.read(&id) {
                    self.record = r;
                }
                self.status.set_state(self.record.state);
                true
            }
            Ok(Err(e)) => self.fault(format!(
                "its state driver panicked ({panic}) and recovering it failed: {e}"
            )),
            Err(again) => self.fault(format!(
                "its state driver panicked ({panic}) and recovering it panicked too ({})",
                panic_message(again.as_ref())
            )),
        }
    }

    /// Takes over what recovery brought back.
    pub(super) fn go_on_with(&mut self, record: SandboxRecord, live: Option<Live>) {
        let (vm, client) = match live {
            Some(l) => (Some(l.vm), l.client),
            None => (None, None),
        };
        self.vm = vm;
        self.client = client;
        self.status.set_state(record.state);
        self.status
            .started_ms
            .store(record.started_unix_ms, Ordering::Relaxed);
        *self
            .status
            .timeouts
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = record.options.timeouts;
        self.status.egress.set_policy(record.options.egress.clone());
        self.record = record;
    }

    /// Stops recovering the sandbox: from now on its requests are answered with an internal
    /// error (kill and shutdown excepted), and its VM, if one still runs, is left for the
    /// node's next start. Answers false: the driver goes on answering.
    pub(super) fn fault(&mut self, why: String) -> bool {
        tracing::error!(
            id = %self.record.id,
            %why,
            "sandbox left as it is: requests to it fail until it is killed or the node restarts"
        );
        self.status.set_fault(why.clone());
        self.faulted = Some(why);
        false
    }

    /// A request to a sandbox whose driver stopped recovering it; true when the driver
    /// should stop.
    pub(super) async fn handle_faulted(&mut self, req: Request, why: String) -> bool {
        match req {
            Request::Kill(r) => {
                let res = self.kill_faulted().await;
                let done = res.is_ok();
                let _ = r.send(res);
                done
            }
            Request::Shutdown(detach, r) => {
                if !detach {
                    crate::recovery::kill_vmm(&self.ctx, &self.dir).await;
                }
                let _ = r.send(Ok(()));
                true
            }
            other => {
                other.refuse(NodeError::internal(format!(
                    "sandbox {}: {why}",
                    self.record.id
                )));
                false
            }
        }
    }

    /// Kill, done the way recovery finishes a kill cut short: from the record on disk, so
    /// nothing of the driver's own state is trusted.
    pub(super) async fn kill_faulted(&mut self) -> Result<()> {
        let id = self.record.id.clone();
        let mut record = self
            .ctx
            .records
            .read(&id)?
            .ok_or_else(|| NodeError::NotFound(id.clone()))?;
        record.pending = Some(Pending {
            request: Intent::Kill,
            target: Terminated,
            snapshot: None,
            started_unix_ms: now_ms(),
        });
        self.ctx.records.write(&record)?;
        crate::recovery::recover_one(&self.ctx, record, "killed after its state driver failed")
            .await?;
        if let Some(r) = self.ctx.records.read(&id)? {
            self.record = r;
        }
        self.status.set_state(self.record.state);
        crate::archive::mark_terminated(&self.ctx, &self.record).await;
        Ok(())
    }
}
