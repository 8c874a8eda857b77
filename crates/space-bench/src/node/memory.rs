//! The memory phase of the node group: the host memory idle sandboxes take.

use super::*;

impl NodeBench<'_> {
    /// Starts up to `idle` sandboxes (fewer if admission refuses), runs one exec in each,
    /// leaves them idle, and reads every QEMU's memory and the node process's.
    pub(super) async fn memory(&mut self) -> Result<()> {
        let want = self.plan.idle;
        progress(&format!("memory: starting {want} sandboxes"));
        let available_before = procmem::mem_available_kib();
        let mut ids = Vec::new();
        let mut refused = None;
        for k in 1..=want {
            match self.node.create(self.request()).await {
                Ok(info) => {
                    self.alive.push(info.id.clone());
                    ids.push(info.id);
                }
                Err(e) if e.is_refusal() => {
                    refused = Some(format!("sandbox {k} of {want} was refused: {e}"));
                    break;
                }
                Err(e) => return Err(e).context(format!("creating sandbox {k} of {want}")),
            }
        }
        for id in &ids {
            self.first_exec(id, Instant::now()).await?;
        }
        progress(&format!(
            "memory: {} sandboxes idle for {SETTLE:?}",
            ids.len()
        ));
        tokio::time::sleep(SETTLE).await;
        let available_after = procmem::mem_available_kib();
        let mut mems: Vec<ProcMem> = Vec::new();
        let mut pids = Vec::new();
        for id in &ids {
            let dir = self.node.layout().sandbox_dir(id.as_str())?;
            let pid_file = dir.join(space_runtime::cmdline::PID_FILE);
            let pid = std::fs::read_to_string(&pid_file)
                .with_context(|| format!("reading {}", pid_file.display()))?;
            mems.push(procmem::read(pid.trim())?);
            pids.push(pid.trim().to_owned());
        }
        let me = procmem::read("self")?;
        let mib = |kib: u64| kib as f64 / 1024.0;
        let samples = |f: &dyn Fn(&ProcMem) -> Option<u64>| {
            let mut s = Samples::new();
            for m in &mems {
                if let Some(v) = f(m) {
                    s.push(mib(v));
                }
            }
            s
        };
        let mut t = Table::new(format!(
            "Host memory per sandbox ({} idle sandboxes, each after one exec; one QEMU each; \
             MiB = 2^20 bytes)",
            ids.len()
        ));
        t.add("QEMU RSS", "MiB", samples(&|m| Some(m.rss_kib)));
        t.add("QEMU PSS", "MiB", samples(&|m| m.pss_kib));
        t.add(
            "  of which anonymous (QEMU)",
            "MiB",
            samples(&|m| m.pss_anon_kib),
        );
        t.add(
            "  of which file (guest RAM, binaries)",
            "MiB",
            samples(&|m| m.pss_file_kib),
        );
        print!("{}", t.render());
        let sum = |f: &dyn Fn(&ProcMem) -> Option<u64>| -> Option<f64> {
            mems.iter().map(f).sum::<Option<u64>>().map(mib)
        };
        let cell = |v: Option<f64>| match v {
            Some(v) => format!("{v:.0} MiB"),
            None => "not readable".into(),
        };
        let node_pss = me.pss_kib.map(mib);
        println!(
            "node total: QEMUs RSS {}, PSS {}; node process (space-bench, the node runs in it) \
             RSS {}, PSS {}; all together PSS {}",
            cell(sum(&|m| Some(m.rss_kib))),
            cell(sum(&|m| m.pss_kib)),
            cell(Some(mib(me.rss_kib))),
            cell(node_pss),
            cell(sum(&|m| m.pss_kib).zip(node_pss).map(|(a, b)| a + b)),
        );
        if let (Some(b), Some(a)) = (available_before, available_after) {
            println!(
                "MemAvailable: {:.0} MiB before the creates, {:.0} MiB with the sandboxes idle \
                 (a change of {:+.0} MiB; other work on the host moves it too)",
                mib(b),
                mib(a),
                mib(a) - mib(b)
            );
        }
        match refused {
            Some(why) => println!("admission: {why}\n"),
            None => println!("admission: all {want} admitted\n"),
        }
        crate::idle::idle_cpu(&pids).await?;
        progress("memory: killing the idle sandboxes");
        for id in ids {
            self.kill(&id).await?;
        }
        Ok(())
    }
}
