//! Taking over the live VM of a Running or Paused sandbox: brought to the state its record
//! says (or the record to the VM's, after a pause or resume cut short), its guest reconnected;
//! a VM that cannot be taken over is killed and the sandbox started again.

use std::path::Path;
use std::sync::Arc;

use space_runtime::NodeVm;

use crate::error::Result;
use crate::record::{RecoveryAction, SandboxRecord, State};
use crate::sandbox::{Ctx, Live};

use super::orphans::kill_vmm_in;
use super::{chain, event, set_state, Next, RecoveryReport};

/// Adopts the VM of a Running or Paused sandbox, or says it must be started again.
pub(super) async fn adopt(
    ctx: &Arc<Ctx>,
    mut r: SandboxRecord,
    dir: &Path,
    trust_vm: bool,
    report: &mut RecoveryReport,
) -> Result<Next> {
    if dir.join(crate::archive::LAZY_DIR).exists() {
        // Its RAM file and disk were served by the node process that stopped (a restore
        // from the object store): what it left running cannot go on without them. The
        // snapshot it was restored from is in the store: Suspended on it again.
        kill_vmm_in(ctx, dir, report).await;
        crate::sandbox::clear_vm_files(dir)?;
        let why = "its memory and disk were served by the node process that stopped (a \
                   restore from the object store)";
        let point = match &r.origin {
            crate::record::Origin::Snapshot { snapshot, .. } => r
                .snapshot(snapshot)
                .filter(|s| s.remote.is_some())
                .map(|s| s.id.clone()),
            _ => None,
        };
        let Some(point) = point else {
            return Ok(Next::Relaunch(r, why.into()));
        };
        r.restore_point = Some(point.clone());
        r.pending = None;
        set_state(&mut r, State::Suspended);
        r.push_recovery(event(
            RecoveryAction::RestoreFailed,
            Some(point),
            why.into(),
        ));
        ctx.records.write(&r)?;
        return Ok(Next::Spawn(r, None));
    }
    let vm = match ctx.runtime.adopt(dir).await {
        Ok(vm) => vm,
        Err(e) => {
            // Not ours or gone: make sure nothing runs there before a new VM starts.
            kill_vmm_in(ctx, dir, report).await;
            return Ok(Next::Relaunch(
                r,
                format!("the VM was gone at start ({})", chain(&e)),
            ));
        }
    };
    match take_over(ctx, &mut r, vm, trust_vm).await {
        Ok(live) => {
            r.failure = None;
            r.push_recovery(event(
                RecoveryAction::Adopted,
                None,
                format!("VM (pid {}) taken over, {}", live.vm.pid(), r.state),
            ));
            ctx.records.write(&r)?;
            report.adopted.push(r.id.clone());
            Ok(Next::Spawn(r, Some(live)))
        }
        Err(e) => {
            kill_vmm_in(ctx, dir, report).await;
            Ok(Next::Relaunch(
                r,
                format!(
                    "the VM left running could not be taken over ({})",
                    chain(&e)
                ),
            ))
        }
    }
}

/// Brings an adopted VM to the record's state (or, `trust_vm`, the record to the VM's) and
/// reconnects the guest when it runs. Dropping the VM on failure kills it.
async fn take_over(
    ctx: &Ctx,
    r: &mut SandboxRecord,
    vm: Box<dyn NodeVm>,
    trust_vm: bool,
) -> Result<Live> {
    let status = vm.status().await?;
    if trust_vm {
        set_state(
            r,
            if status.running {
                State::Running
            } else {
                State::Paused
            },
        );
    } else if r.state == State::Running && !status.running {
        // Stopped mid-snapshot when the node died.
        vm.resume().await?;
    } else if r.state == State::Paused && status.running {
        vm.pause().await?;
    }
    let client = if r.state == State::Running {
        Some(vm.wait_ready(ctx.ready_timeout).await?)
    } else {
        None
    };
    Ok(Live {
        vm,
        client,
        started: std::time::Duration::ZERO,
        prefetch: None,
    })
}
