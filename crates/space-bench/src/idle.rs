//! The CPU idle sandboxes cost: every thread of each QEMU, and of the process the node runs
//! in, over a while, in % of one core, by kind of QEMU thread (the main loop, vCPUs, others).
//! Part of `space-bench node`'s memory group.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::bench::progress;
use crate::procmem;
use crate::stats::{Samples, Table};

/// How long idle sandboxes' CPU time is counted over.
const IDLE_CPU: Duration = Duration::from_secs(20);

/// What idle sandboxes cost in CPU: every thread of each QEMU in `pids` and of this process
/// (the node runs in it) over [`IDLE_CPU`], in % of one core, by kind of QEMU thread.
pub async fn idle_cpu(pids: &[String]) -> Result<()> {
    progress(&format!(
        "memory: counting the idle sandboxes' CPU time for {IDLE_CPU:?}"
    ));
    let read_all = || -> Result<Vec<Vec<(String, u64)>>> {
        pids.iter().map(|p| procmem::thread_ticks(p)).collect()
    };
    let (before, me_before) = (read_all()?, procmem::thread_ticks("self")?);
    let t0 = Instant::now();
    tokio::time::sleep(IDLE_CPU).await;
    let (after, me_after) = (read_all()?, procmem::thread_ticks("self")?);
    let secs = t0.elapsed().as_secs_f64();
    let hz = procmem::clock_ticks_per_second() as f64;
    let percent = |ticks: u64| ticks as f64 / hz / secs * 100.0;
    // QEMU names its vCPU threads `CPU <n>/TCG` (or `/KVM`) and leaves the main loop with the
    // program's name; the rest are RCU, I/O and worker threads.
    let kind = |name: &str| {
        if name.starts_with("CPU ") {
            1
        } else if name.starts_with("qemu-system") {
            0
        } else {
            2
        }
    };
    let total_of = |threads: &[(String, u64)], k: Option<usize>| -> u64 {
        threads
            .iter()
            .filter(|(n, _)| k.is_none_or(|k| kind(n) == k))
            .map(|(_, t)| t)
            .sum()
    };
    let mut rows = [
        Samples::new(),
        Samples::new(),
        Samples::new(),
        Samples::new(),
    ];
    for (b, a) in before.iter().zip(&after) {
        for (i, k) in [None, Some(0), Some(1), Some(2)].into_iter().enumerate() {
            rows[i].push(percent(total_of(a, k).saturating_sub(total_of(b, k))));
        }
    }
    let all: f64 = rows[0].mean().unwrap_or(0.0) * pids.len() as f64;
    let node = percent(total_of(&me_after, None).saturating_sub(total_of(&me_before, None)));
    let [total, main, vcpu, other] = rows;
    let mut t = Table::new(format!(
        "Idle CPU per sandbox ({} idle sandboxes, {secs:.0} s; % of one core; clock ticks of \
         {:.0} Hz, so one sandbox's figure is coarse and the mean is the one to read)",
        pids.len(),
        hz
    ));
    t.add("QEMU, all threads", "%", total);
    t.add("  main loop (I/O, timers)", "%", main);
    t.add("  vCPU threads (the guest)", "%", vcpu);
    t.add("  other threads (RCU, workers)", "%", other);
    print!("{}", t.render());
    println!(
        "all QEMUs together: {all:.1}% of one core; the node process (space-bench, the node runs \
         in it): {node:.1}%\n"
    );
    Ok(())
}
