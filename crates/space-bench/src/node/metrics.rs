//! The metrics phase of the node group: what sampling each running sandbox every 5 s costs
//! idle sandboxes (their QEMUs' CPU and the node process's), windows with and without the
//! sampler alternating in one run, and how long one sampling of them all takes.

use super::*;

/// How long each window counts CPU time.
const WINDOW: Duration = Duration::from_secs(20);
/// Windows of each kind (they alternate: off, on, off, on, ...).
const ROUNDS: usize = 3;
/// Idle sandboxes the phase runs, at most.
const SANDBOXES: usize = 4;

impl NodeBench<'_> {
    /// Starts a few idle sandboxes and counts their CPU time with the sampler off and every
    /// [`space_node::DEFAULT_METRICS_TICK`], alternating.
    pub(super) async fn metrics(&mut self) -> Result<()> {
        let want = self.plan.idle.clamp(1, SANDBOXES);
        progress(&format!("metrics: starting {want} sandboxes"));
        let mut ids = Vec::new();
        let mut pids = Vec::new();
        for k in 1..=want {
            let info = self
                .node
                .create(self.request())
                .await
                .with_context(|| format!("creating sandbox {k} of {want}"))?;
            self.alive.push(info.id.clone());
            self.first_exec(&info.id, Instant::now()).await?;
            let dir = self.node.layout().sandbox_dir(info.id.as_str())?;
            let pid = std::fs::read_to_string(dir.join(space_runtime::cmdline::PID_FILE))?;
            pids.push(pid.trim().to_owned());
            ids.push(info.id);
        }
        tokio::time::sleep(SETTLE).await;
        let tick = space_node::DEFAULT_METRICS_TICK;
        let hz = procmem::clock_ticks_per_second() as f64;
        let ticks = |pid: &str| -> Result<u64> {
            Ok(procmem::thread_ticks(pid)?.iter().map(|(_, t)| t).sum())
        };
        let (mut qemu_off, mut qemu_on) = (Samples::new(), Samples::new());
        let (mut node_off, mut node_on) = (Samples::new(), Samples::new());
        let mut one = Samples::new();
        // The first sampling only sets each sandbox's base.
        self.node.sample_metrics().await;
        for round in 0..ROUNDS * 2 {
            let on = round % 2 == 1;
            progress(&format!(
                "metrics: window {} of {} ({WINDOW:?}, sampler {})",
                round + 1,
                ROUNDS * 2,
                if on { "every 5 s" } else { "off" }
            ));
            let before: Vec<u64> = pids.iter().map(|p| ticks(p)).collect::<Result<_>>()?;
            let me_before = ticks("self")?;
            let t0 = Instant::now();
            if on {
                let mut next = Instant::now();
                while t0.elapsed() < WINDOW {
                    let t = Instant::now();
                    let taken = self.node.sample_metrics().await;
                    one.push_duration(t.elapsed());
                    if taken != ids.len() {
                        progress(&format!("metrics: {taken} of {} sampled", ids.len()));
                    }
                    next += tick;
                    let left = WINDOW.saturating_sub(t0.elapsed());
                    tokio::time::sleep(next.saturating_duration_since(Instant::now()).min(left))
                        .await;
                }
            } else {
                tokio::time::sleep(WINDOW).await;
            }
            let secs = t0.elapsed().as_secs_f64();
            let pct = |d: u64| d as f64 / hz / secs * 100.0;
            for (p, b) in pids.iter().zip(&before) {
                let d = pct(ticks(p)?.saturating_sub(*b));
                if on { &mut qemu_on } else { &mut qemu_off }.push(d);
            }
            let me = pct(ticks("self")?.saturating_sub(me_before));
            if on { &mut node_on } else { &mut node_off }.push(me);
        }
        let ratio = |a: &Samples, b: &Samples| match (a.mean(), b.mean()) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        let summary = format!(
            "QEMU per sandbox, sampled / not: {} (mean); node process: {} (mean)",
            ratio(&qemu_on, &qemu_off),
            ratio(&node_on, &node_off)
        );
        let mut t = Table::new(format!(
            "Metrics sampling cost ({} idle sandboxes; {ROUNDS} windows of {WINDOW:?} each way, \
             alternating; % of one core, clock ticks of {hz:.0} Hz)",
            ids.len()
        ));
        t.add("QEMU per sandbox, no sampling", "%", qemu_off);
        t.add("QEMU per sandbox, sampled every 5 s", "%", qemu_on);
        t.add("node process, no sampling", "%", node_off);
        t.add("node process, sampling", "%", node_on);
        t.add(
            format!("one sampling of {} sandboxes", ids.len()),
            "ms",
            one,
        );
        print!("{}", t.render());
        println!("{summary}\n");
        progress("metrics: killing the sandboxes");
        for id in ids {
            self.kill(&id).await?;
        }
        Ok(())
    }
}
