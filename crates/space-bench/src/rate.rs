//! Creates at a sustained rate and in bursts, through the HTTP API: does the warm pool keep
//! up?
//!
//! Two servers on fresh loop-mounted btrfs data directories serve `minimal`, each with a pool
//! floor of `--pool-size`:
//!
//! - **demand**: the pool follows demand as a node's does by default (up to `--pool-max`,
//!   two members made at once, at background CPU priority; a create that finds it empty waits
//!   for a member being made when that is sooner than a restore);
//! - **fixed**: the pool keeps exactly its floor, refilled one member at a time (the reference).
//!
//! Each phase runs on one server and then on the other, so drift of the host affects both:
//!
//! 1. for each rate of `--rates`, creates arrive at that rate, evenly spaced, for `--seconds`
//!    (open loop: an arrival never waits for an earlier create);
//! 2. both servers sit idle for the demand pool's window, so its pool is back at its floor;
//!    then `--burst` creates at once, twice, ten seconds apart (the second meets the pool the
//!    first one grew).
//!
//! Every create is `POST /v1/sandboxes` (timed to its 201), then `POST .../exec` of `true`
//! read to its exit line (timed, cumulative: the first exec), then a kill (not timed). The
//! pool's hits, waits and misses in each phase come from the node's counters, and its largest
//! size from samples every 100 ms.
//!
//! Nothing is asserted; the numbers are for reading.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use space::host::Host;
use space_node::PoolStats;

use crate::api::{ApiBench, Served};
use crate::bench::progress;
use crate::node::DataDir;
use crate::stats::{Samples, Summary, Table, Targets};

/// The template every create uses.
const TEMPLATE: &str = "minimal";

/// The 201 target at 2 creates per second, in ms at p90.
const TARGET_P90_MS: f64 = 40.0;

/// Pause between the two bursts.
const BURST_GAP: Duration = Duration::from_secs(10);

/// What the rate benchmark runs.
pub struct RatePlan {
    /// Creates per second of each sustained phase.
    pub rates: Vec<f64>,
    /// Length of each sustained phase.
    pub seconds: u64,
    /// Creates sent at once in each burst (0: no bursts).
    pub burst: usize,
    /// The pools' floor.
    pub pool_size: usize,
    /// The demand pool's ceiling.
    pub pool_max: usize,
    /// Guest kernel.
    pub kernel: std::path::PathBuf,
    /// The `minimal` root image.
    pub rootfs: std::path::PathBuf,
    /// QEMU binary.
    pub qemu: std::path::PathBuf,
}

/// Runs the phases; `interrupted` ends the run early (with everything cleaned up).
pub async fn run(plan: &RatePlan, interrupted: impl Future<Output = &'static str>) -> Result<()> {
    let mut dirs = [
        DataDir::with_prefix("space-bench-rate-demand-")?,
        DataDir::with_prefix("space-bench-rate-fixed-")?,
    ];
    let mut slots: [Option<Host>; 2] = [None, None];
    let result = tokio::select! {
        r = measure(plan, &dirs, &mut slots) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    for server in slots.iter_mut().filter_map(Option::take) {
        crate::api::stop_server(server).await;
    }
    let mut cleaned = Ok(());
    for dir in &mut dirs {
        if let Err(e) = tokio::task::block_in_place(|| dir.cleanup()) {
            cleaned = Err(e);
        }
    }
    crate::bench::with_cleanup(result, cleaned)
}

/// One server under test.
struct Subject {
    name: &'static str,
    bench: ApiBench,
}

async fn start(
    plan: &RatePlan,
    dir: &DataDir,
    follow_demand: bool,
    slot: &mut Option<Host>,
) -> Result<ApiBench> {
    let served = Served {
        template: TEMPLATE,
        rootfs: &plan.rootfs,
        kernel: &plan.kernel,
        qemu: &plan.qemu,
        pool_size: plan.pool_size,
        follow_demand,
    };
    let mut config = served.config(dir, false);
    if follow_demand {
        config.node.pools.ceiling = plan.pool_max;
    }
    let server = Host::start(config)
        .await
        .context("starting the server (needs root for the loop-mounted btrfs image)")?;
    let key = server
        .bootstrap_key()
        .context("a fresh data directory should print a bootstrap key")?
        .to_owned();
    let bench = ApiBench {
        url: server.url(),
        node: server.node().clone(),
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()?,
        key,
    };
    *slot = Some(server);
    Ok(bench)
}

/// What one phase measured on one server.
struct Phase {
    created: Samples,
    first_exec: Samples,
    failed: usize,
    hits: u64,
    waits: u64,
    misses: u64,
    largest: usize,
}

fn pool(bench: &ApiBench) -> Option<PoolStats> {
    bench
        .node
        .pool_stats()
        .into_iter()
        .find(|s| s.template.name.as_str() == TEMPLATE)
}

/// One create through the API: the 201, then the first exec (cumulative); then a kill.
async fn create_exec_kill(bench: ApiBench) -> Result<(Duration, Duration)> {
    let t = Instant::now();
    let id = bench.api_create().await?;
    let created = t.elapsed();
    let exec = bench.api_exec_true(&id).await;
    let first_exec = t.elapsed();
    bench.api_kill(&id).await?;
    exec?;
    Ok((created, first_exec))
}

/// Sends a create at each of `arrivals` (offsets from the start), each in its own task, and
/// collects what they measured and what the pool did meanwhile.
async fn phase(bench: &ApiBench, arrivals: &[Duration]) -> Result<Phase> {
    let before = pool(bench).ok_or_else(|| anyhow!("the server has no pool of {TEMPLATE}"))?;
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut largest = before.target;
    for at in arrivals {
        tokio::time::sleep_until(start + *at).await;
        tasks.spawn(create_exec_kill(bench.clone()));
        largest = largest.max(pool(bench).map_or(0, |p| p.target));
    }
    let mut out = Phase {
        created: Samples::new(),
        first_exec: Samples::new(),
        failed: 0,
        hits: 0,
        waits: 0,
        misses: 0,
        largest,
    };
    let mut sampler = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            done = tasks.join_next() => match done {
                None => break,
                Some(Ok(Ok((created, first_exec)))) => {
                    out.created.push_duration(created);
                    out.first_exec.push_duration(first_exec);
                }
                Some(Ok(Err(e))) => {
                    out.failed += 1;
                    eprintln!("space-bench: a create failed: {e:#}");
                }
                Some(Err(e)) => return Err(e.into()),
            },
            _ = sampler.tick() => {
                out.largest = out.largest.max(pool(bench).map_or(0, |p| p.target));
            }
        }
    }
    let after = pool(bench).ok_or_else(|| anyhow!("the pool of {TEMPLATE} is gone"))?;
    out.hits = after.hits - before.hits;
    out.waits = after.waits - before.waits;
    out.misses = after.misses - before.misses;
    Ok(out)
}

/// Waits (bounded) until the pool holds what it wants now.
async fn settle(bench: &ApiBench) -> Result<()> {
    bench.wait_pool_full().await
}

fn report(title: String, results: &[(&str, &Phase)], summary: &mut Summary, what: &str) {
    let mut t = Table::new(title);
    for (name, p) in results {
        t.add(
            format!("{name}: POST /v1/sandboxes -> 201"),
            "ms",
            p.created.clone(),
        );
        t.add(
            format!("{name}: to first exec `true`"),
            "ms",
            p.first_exec.clone(),
        );
    }
    print!("{}", t.render());
    for (name, p) in results {
        println!(
            "{name}: pool hits {} (of which waited for a member being made {}), misses {}, \
             largest pool size {}, failed creates {}",
            p.hits, p.waits, p.misses, p.largest, p.failed
        );
    }
    println!();
    if let [(_, demand), (_, fixed)] = results {
        summary.add(
            format!("{what}: 201, demand / fixed"),
            &demand.created,
            &fixed.created,
            "",
        );
        summary.add(
            format!("{what}: first exec, demand / fixed"),
            &demand.first_exec,
            &fixed.first_exec,
            "",
        );
    }
}

async fn measure(
    plan: &RatePlan,
    dirs: &[DataDir; 2],
    slots: &mut [Option<Host>; 2],
) -> Result<()> {
    progress("starting the demand-following server (builds the minimal template)");
    let (first, second) = slots.split_at_mut(1);
    let demand = start(plan, &dirs[0], true, &mut first[0]).await?;
    progress("starting the fixed-pool server (builds the minimal template)");
    let fixed = start(plan, &dirs[1], false, &mut second[0]).await?;
    let window = space_node::pool::DEFAULT_POOL_WINDOW;
    let subjects = [
        Subject {
            name: "demand",
            bench: demand,
        },
        Subject {
            name: "fixed",
            bench: fixed,
        },
    ];
    println!("host:        {}", crate::host::host_summary());
    println!(
        "rate:        two servers on loopback serving {TEMPLATE}, pool floor {} each; demand: \
         follows the creates of the last {}s up to {}, two members made at once; fixed: \
         exactly {}, one refill at a time; every create is killed after its first exec\n",
        plan.pool_size,
        window.as_secs(),
        plan.pool_max,
        plan.pool_size
    );
    for s in &subjects {
        settle(&s.bench).await?;
    }
    let mut summary = Summary::new();
    let mut targets = Targets::new();
    for rate in &plan.rates {
        let n = (rate * plan.seconds as f64).round().max(1.0) as usize;
        let arrivals: Vec<Duration> = (0..n)
            .map(|i| Duration::from_secs_f64(i as f64 / rate))
            .collect();
        let mut results = Vec::new();
        for s in &subjects {
            settle(&s.bench).await?;
            progress(&format!(
                "{}: {rate} creates per second for {} s",
                s.name, plan.seconds
            ));
            results.push((s.name, phase(&s.bench, &arrivals).await?));
        }
        let refs: Vec<(&str, &Phase)> = results.iter().map(|(n, p)| (*n, p)).collect();
        report(
            format!(
                "{rate} creates per second for {} s ({n} creates, evenly spaced, open loop)",
                plan.seconds
            ),
            &refs,
            &mut summary,
            &format!("{rate}/s"),
        );
        if (*rate - 2.0).abs() < f64::EPSILON {
            targets.time(
                "demand pool at 2 creates per second: POST -> 201",
                &results[0].1.created,
                TARGET_P90_MS,
                TARGET_P90_MS,
            );
        }
    }
    if plan.burst > 0 {
        progress(&format!(
            "idle for {} s, so the pools are back at their floor",
            window.as_secs() + 5
        ));
        tokio::time::sleep(window + Duration::from_secs(5)).await;
        let arrivals = vec![Duration::ZERO; plan.burst];
        let mut bursts: Vec<Vec<(&str, Phase)>> = vec![Vec::new(), Vec::new()];
        for s in &subjects {
            settle(&s.bench).await?;
            for (i, burst) in bursts.iter_mut().enumerate() {
                if i > 0 {
                    tokio::time::sleep(BURST_GAP).await;
                }
                progress(&format!(
                    "{}: burst {} of {} creates at once",
                    s.name,
                    i + 1,
                    plan.burst
                ));
                burst.push((s.name, phase(&s.bench, &arrivals).await?));
            }
        }
        for (i, burst) in bursts.iter().enumerate() {
            let refs: Vec<(&str, &Phase)> = burst.iter().map(|(n, p)| (*n, p)).collect();
            let when = if i == 0 {
                "the pool at its floor".to_owned()
            } else {
                format!("{} s after the first", BURST_GAP.as_secs())
            };
            report(
                format!("Burst {} of {} creates at once ({when})", i + 1, plan.burst),
                &refs,
                &mut summary,
                &format!("burst {}", i + 1),
            );
        }
    }
    print!("{}", summary.render());
    print!("{}", targets.render());
    Ok(())
}
