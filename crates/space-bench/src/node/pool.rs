//! The pool phase of the node group: creates taken from a warm pool, refilled in the
//! background or after each first exec.

use super::*;

impl NodeBench<'_> {
    /// (ready, target, hits, misses) of the template's pool.
    pub(super) fn pool_counts(&self) -> Option<(usize, usize, u64, u64)> {
        self.node
            .pool_stats()
            .into_iter()
            .find(|s| &s.template == self.template.template_ref())
            .map(|s| (s.ready, s.target, s.hits, s.misses))
    }

    pub(super) async fn wait_pool_full(&self) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some((ready, target, _, _)) = self.pool_counts() {
                if target > 0 && ready >= target {
                    return Ok(());
                }
            }
            if start.elapsed() > POOL_WAIT {
                bail!(
                    "the warm pool did not fill within {POOL_WAIT:?} (now {:?})",
                    self.pool_counts()
                );
            }
            tokio::time::sleep(POOL_POLL).await;
        }
    }

    /// Brings the pool to its size: waits for its background loop, or runs the reconciler.
    pub(super) async fn fill(&self, refill: Refill) -> Result<()> {
        match refill {
            Refill::Background => self.wait_pool_full().await,
            Refill::AfterExec => {
                for _ in 0..3 {
                    self.node.reconcile_pools().await;
                    if let Some((ready, target, _, _)) = self.pool_counts() {
                        if target > 0 && ready >= target {
                            return Ok(());
                        }
                    }
                }
                bail!(
                    "three reconciler runs did not fill the warm pool (now {:?})",
                    self.pool_counts()
                )
            }
        }
    }

    /// Creates from the pool; after each create's first exec, waits until the pool is full
    /// again (timed apart), then kills the sandbox. One uncounted take first.
    pub(super) async fn pool(&mut self, refill: Refill) -> Result<()> {
        let n = self.plan.runs;
        progress(&format!("pool: filling {} members", self.plan.pool_size));
        let t = Instant::now();
        self.fill(refill).await?;
        let filled = t.elapsed();
        let mut rows: [Samples; 7] = Default::default();
        let [create, guest, exec, second, refilled, cycle, kill] = &mut rows;
        let mut failures = Vec::new();
        let mut missed = 0;
        for i in 0..=n {
            let counted = i > 0;
            if counted {
                progress(&format!("pool create {i}/{n} ({refill:?})"));
            }
            let hits_before = self.pool_counts().map(|c| c.2).unwrap_or(0);
            let t = Instant::now();
            let made = self.create_to_exec().await;
            let answered = Instant::now();
            let hit = self.pool_counts().map(|c| c.2).unwrap_or(0) > hits_before;
            match made {
                Ok((id, times)) => {
                    let again = self.first_exec(&id, t).await;
                    self.fill(refill).await?;
                    let (r, c) = (answered.elapsed(), t.elapsed());
                    let k = self.kill(&id).await?;
                    let again = match again {
                        Ok((_, e)) => e,
                        Err(e) => {
                            failures.push(failed(i, "second exec", &e));
                            continue;
                        }
                    };
                    if counted && hit {
                        create.push_duration(times[0]);
                        guest.push_duration(times[1]);
                        exec.push_duration(times[2]);
                        second.push_duration(again);
                        refilled.push_duration(r);
                        cycle.push_duration(c);
                        kill.push_duration(k);
                    } else if counted {
                        missed += 1;
                    }
                }
                Err(e) => {
                    failures.push(failed(i, "create from the pool", &e));
                    self.kill_leftovers().await;
                    self.fill(refill).await?;
                }
            }
            if failures.len() > self.max_failures() {
                bail!("{} creates from the pool failed; giving up", failures.len());
            }
        }
        let counts = self.pool_counts();
        let how = match refill {
            Refill::Background => {
                "refill in the background, woken by the take, as a node does by default"
            }
            Refill::AfterExec => "refill held until the first exec was answered",
        };
        let mut t = Table::new(format!(
            "Create from the warm pool to first exec (pool of {}, {how}; node.create -> \
             guest(id) -> run true, cumulative; the pool is full again before each take)",
            self.plan.pool_size
        ));
        let [create, guest, exec, second, refilled, cycle, kill] = rows;
        t.add("node.create returned (Running)", "ms", create.clone());
        t.add("guest(id) returned", "ms", guest);
        t.add("first exec answered", "ms", exec.clone());
        t.add("(then a second run true answered)", "ms", second);
        t.add("refill wait (first exec -> pool full)", "ms", refilled);
        t.add("take to pool full (from the create call)", "ms", cycle);
        t.add("then node.kill (by itself)", "ms", kill);
        print!("{}", t.render());
        println!(
            "pool: filled from empty in {:.0} ms at the start; {missed} counted creates missed \
             the pool (not in the table); node's counters: hits {}, misses {}",
            filled.as_secs_f64() * 1e3,
            counts.map(|c| c.2).unwrap_or(0),
            counts.map(|c| c.3).unwrap_or(0)
        );
        print_failures("failed creates", &failures);
        self.kept.pool.push((refill, create, exec));
        Ok(())
    }
}
