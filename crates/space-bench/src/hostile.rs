//! The hostile group (`space-bench hostile`): what one sandbox attacking its own guest costs
//! the others. A quiet sandbox runs `echo` execs back to back, first with nothing else going
//! on (the baseline), then while a second sandbox floods its console, fills its disk, forks
//! without end or takes all its memory; each row is the quiet sandbox's exec latency during
//! one attack, with its ratio to the baseline measured in the same run.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{
    CreateRequest, Node, NodeConfig, PoolConfig, SandboxOptions, TemplateRef, TemplateSpec,
};
use space_proto::ExecSpec;
use space_runtime::GuestClient;

use crate::bench::progress;
use crate::node::DataDir;
use crate::stats::{fmt_ratio, ratio, Samples, Table};

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// What a hostile run measures.
pub struct HostilePlan {
    /// Seconds each attack (and the baseline) runs.
    pub seconds: u64,
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    pub rootfs: PathBuf,
}

/// The attacks, as shell lines run in the hostile guest for `secs` seconds.
fn attacks(secs: u64) -> Vec<(&'static str, String)> {
    vec![
        (
            "console flood (yes > ttyS0)",
            format!("timeout {secs} sh -c 'yes hostile-console-line > /dev/ttyS0'"),
        ),
        (
            "disk filled (dd until ENOSPC, kept full)",
            format!("dd if=/dev/zero of=/root/fill bs=1M 2>/dev/null; sleep {secs}; rm -f /root/fill"),
        ),
        (
            "fork flood (until the guest can fork no more)",
            format!("echo -1000 > /proc/self/oom_score_adj; timeout -s KILL {secs} sh -c 'echo 0 > /proc/self/oom_score_adj; while :; do sleep 600 & done' >/dev/null 2>&1; kill -9 -1"),
        ),
        (
            "memory exhausted (tail /dev/zero, OOM-killed, again)",
            format!("end=$(( $(date +%s) + {secs} )); while [ $(date +%s) -lt $end ]; do tail /dev/zero; done"),
        ),
        (
            "CPU spin (2 busy loops)",
            format!("timeout {secs} sh -c 'while :; do :; done' & timeout {secs} sh -c 'while :; do :; done'"),
        ),
    ]
}

/// Runs the group; `interrupted` ends it early (cleaned up) with the reason.
pub async fn run(
    plan: &HostilePlan,
    interrupted: impl Future<Output = &'static str>,
) -> Result<()> {
    let mut dir = DataDir::with_prefix("space-bench-hostile-")?;
    let result = tokio::select! {
        r = measure(plan, &dir) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    let cleaned = tokio::task::block_in_place(|| dir.cleanup());
    crate::bench::with_cleanup(result, cleaned)
}

async fn measure(plan: &HostilePlan, dir: &DataDir) -> Result<()> {
    let mut cfg = NodeConfig::new(dir.data());
    cfg.storage = StorageOptions {
        driver: Some(DriverKind::Btrfs),
        loop_image_size: 16 << 30,
        loop_image: true,
    };
    cfg.qemu.qemu = plan.qemu.clone();
    cfg.qemu.detached = false;
    cfg.ready_timeout = READY_TIMEOUT;
    cfg.rolling.enabled = false;
    cfg.pools = PoolConfig::disabled();
    let node = Node::open(cfg)
        .await
        .context("opening the node (needs root for the loop-mounted btrfs image)")?;
    let result = measure_on(plan, &node).await;
    if tokio::time::timeout(Duration::from_secs(120), node.shutdown())
        .await
        .is_err()
    {
        eprintln!("space-bench: the node did not shut down within 2 minutes");
    }
    result
}

/// `echo` execs in `quiet` back to back for `for_how_long`.
async fn exec_latency(quiet: &GuestClient, for_how_long: Duration) -> Result<(Samples, usize)> {
    let mut s = Samples::new();
    let mut failed = 0;
    let t0 = Instant::now();
    while t0.elapsed() < for_how_long {
        let t = Instant::now();
        match quiet.run(ExecSpec::shell("echo ok")).await {
            Ok(out) if out.stdout.as_ref() == b"ok\n" => s.push_duration(t.elapsed()),
            _ => failed += 1,
        }
    }
    Ok((s, failed))
}

async fn measure_on(plan: &HostilePlan, node: &Node) -> Result<()> {
    progress("building the stock template minimal");
    node.build_template(TemplateSpec {
        template: TemplateRef::new("minimal", "1")?,
        kernel: plan.kernel.clone(),
        rootfs: plan.rootfs.clone(),
        vcpus: 1,
        memory_mib: 256,
        kernel_cmdline: None,
        ready_timeout: READY_TIMEOUT,
        guest: Default::default(),
        start: None,
        source: String::new(),
    })
    .await?;
    let create = |disk_mib: Option<u64>| async move {
        let mut req = CreateRequest::new("minimal".parse()?);
        req.options = SandboxOptions {
            disk_mib,
            ..Default::default()
        };
        anyhow::Ok(node.create(req).await?.id)
    };
    let quiet_id = create(None).await?;
    let hostile_id = create(Some(512)).await?;
    let quiet = node.guest(&quiet_id).await?;
    let secs = plan.seconds;
    let window = Duration::from_secs(secs);

    progress(&format!("baseline: the quiet sandbox's execs for {secs} s"));
    let (baseline, failed) = exec_latency(&quiet, window).await?;
    if failed > 0 {
        bail!("{failed} execs failed with nothing else running");
    }
    let mut t = Table::new(format!(
        "The quiet sandbox's exec (`echo ok`) while another sandbox attacks its own guest \
         ({secs} s each; ratio of p50 and p99 to the baseline, same run)"
    ));
    let (b50, b99) = (baseline.percentile(50.0), baseline.percentile(99.0));
    t.add("baseline (nothing else running)", "ms", baseline);
    let mut notes = Vec::new();
    for (name, line) in attacks(secs) {
        progress(&format!("attack: {name}"));
        let hostile = node.guest(&hostile_id).await?;
        let attack = tokio::spawn(async move { hostile.run(ExecSpec::shell(line)).await });
        // Let it get going before measuring.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (s, failed) =
            exec_latency(&quiet, window.saturating_sub(Duration::from_secs(2))).await?;
        notes.push(format!(
            "{name}: p50 {}, p99 {}, {failed} quiet execs failed",
            fmt_ratio(ratio(s.percentile(50.0), b50)),
            fmt_ratio(ratio(s.percentile(99.0), b99)),
        ));
        t.add(name, "ms", s);
        let _ = tokio::time::timeout(Duration::from_secs(secs + 60), attack).await;
        // The attacked guest must come back before the next attack.
        let t0 = Instant::now();
        loop {
            let g = node.guest(&hostile_id).await?;
            if let Ok(out) = g.run(ExecSpec::shell("echo back")).await {
                if out.stdout.as_ref() == b"back\n" {
                    break;
                }
            }
            if t0.elapsed() > Duration::from_secs(180) {
                bail!("the hostile sandbox did not answer again after {name}");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    print!("{}", t.render());
    for n in notes {
        println!("{n}");
    }
    println!();
    node.kill(&hostile_id).await?;
    node.kill(&quiet_id).await?;
    Ok(())
}
