//! One member of a pool: its record, its VM restored at background priority and warmed (the
//! code paths a create hits, so their translation is cached) then paused; and its removal.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use space_proto::ExecSpec;
use space_runtime::Priority;

use crate::error::{NodeError, Result};
use crate::ids::SandboxId;
use crate::record::{now_ms, Intent, Origin, SandboxOptions, SandboxRecord};
use crate::sandbox::{clear_vm_files, launch, Ctx, Launch, Live};
use crate::scheduler::chain;
use crate::template::{blocking, Template};

use super::{Member, Pools};

impl Pools {
    /// Restores, warms and pauses one member of `t`'s pool, with `record` in `dir`, at
    /// background priority until `claimed` is set. Leaves nothing behind on failure.
    pub(super) async fn make(
        &self,
        t: &Template,
        record: SandboxRecord,
        dir: PathBuf,
        claimed: Arc<AtomicBool>,
    ) -> Result<Member> {
        let ctx = &self.ctx;
        let t0 = Instant::now();
        ctx.records.write(&record)?;
        let made = async {
            let (s, d) = (ctx.storage.clone(), dir.clone());
            blocking(move || Ok(s.create_volume(&d)?)).await?;
            let live = launch(
                ctx,
                &dir,
                Launch::RestoreInBackground {
                    snapshot: t.snapshot(),
                },
                &record,
            )
            .await?;
            let member = Member {
                record: record.clone(),
                dir: dir.clone(),
                live,
            };
            let warmed = async {
                if claimed.load(Ordering::SeqCst) {
                    // Claimed while QEMU was starting: raised here for sure.
                    member.live.vm.set_priority(Priority::Normal)?;
                }
                warm(&member.live).await
            };
            match warmed.await {
                Ok(()) => Ok(member),
                Err(e) => {
                    destroy(ctx, member).await;
                    Err(e)
                }
            }
        }
        .await;
        match made {
            Ok(m) => {
                tracing::debug!(id = %m.record.id, template = %t.template_ref(), took = ?t0.elapsed(), "warm-pool member ready");
                Ok(m)
            }
            Err(e) => {
                // `launch` removed its VM's files; the volume and the record are ours to remove.
                let (s, d) = (ctx.storage.clone(), dir.clone());
                let _ = blocking(move || {
                    if d.exists() {
                        s.delete_volume(&d)?;
                    }
                    Ok(())
                })
                .await
                .map_err(
                    |c| tracing::error!(error = %chain(&c), "removing a failed warm-pool member"),
                );
                let _ = ctx.records.remove(&record.id);
                Err(e)
            }
        }
    }
}

/// Runs the code paths a create from the pool hits (the identity step already ran in
/// `launch`), so their translation is cached, then stops the vCPUs.
async fn warm(live: &Live) -> Result<()> {
    let guest = |what| move |source| NodeError::Guest { what, source };
    let client = live
        .client
        .as_ref()
        .ok_or_else(|| NodeError::internal("a new VM without a guest connection"))?;
    let out = client
        .run(ExecSpec::shell("true"))
        .await
        .map_err(guest("warm-up exec"))?;
    if !out.status.success() {
        return Err(NodeError::internal(format!(
            "warm-up exec in a pooled VM failed: {:?}",
            out.status
        )));
    }
    client.health().await.map_err(guest("warm-up health"))?;
    live.vm.pause().await?;
    Ok(())
}

/// The record of a new member: `creating`, pending `pool`, default options. A take replaces
/// everything but the id with the create's record.
pub(super) fn pooled_record(t: &Template) -> SandboxRecord {
    let m = &t.manifest;
    let mut r = crate::node::new_record(
        SandboxId::generate(),
        m.template.clone(),
        SandboxOptions::default(),
        crate::node::MachineShape {
            vcpus: m.vcpus,
            memory_mib: m.memory_mib,
            disk_mib: t.image_mib(),
        },
        Origin::Template,
        None,
        crate::node::Owner {
            tenant: crate::record::DEFAULT_TENANT.to_owned(),
            lineage: None,
        },
    );
    r.guest = m.guest.clone();
    if let Some(p) = r.pending.as_mut() {
        p.request = Intent::Pool;
        p.started_unix_ms = now_ms();
    }
    r
}

/// Kills a member's VM and removes its directory and record.
pub(super) async fn destroy(ctx: &Ctx, m: Member) {
    let Member { record, dir, live } = m;
    drop(live.client);
    let _ = live.vm.kill().await;
    drop(live.vm);
    let (s, d) = (ctx.storage.clone(), dir);
    if let Err(e) = blocking(move || {
        clear_vm_files(&d)?;
        Ok(s.delete_volume(&d)?)
    })
    .await
    {
        tracing::error!(id = %record.id, error = %chain(&e), "removing a warm-pool member's directory");
    }
    if let Err(e) = ctx.records.remove(&record.id) {
        tracing::error!(id = %record.id, error = %chain(&e), "removing a warm-pool member's record");
    }
}
