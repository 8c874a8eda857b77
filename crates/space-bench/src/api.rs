//! The public API's overhead over the node: the control plane (`space_control`) serving on
//! loopback over a node on a fresh loop-mounted btrfs data directory, with a warm pool for
//! `minimal`.
//!
//! 1. **Create to first exec, API against node.** Each run does one create-to-first-exec
//!    through the node's library calls (`node.create` -> `guest` -> `run true`) and one
//!    through HTTP (`POST /v1/sandboxes`, then `POST /v1/sandboxes/{id}/exec` with `true`, read
//!    to its `exit` line), alternating which goes first, both from a full pool, so host
//!    drift affects them alike. The table shows both and their difference.
//! 2. **Node over the network.** A second server whose node is reached through the network
//!    node API (mutual TLS on loopback, `ServerConfig::node_over_network`), against the first
//!    (in process, as `space up`): alternating API create-to-first-exec pairs.
//! 3. **Concurrent creates.** `--concurrent` creates are sent at once through HTTP (more than
//!    the pool holds: the rest restore the template's snapshot) and each then runs `true`;
//!    latency per create, per first exec, and the wall time of the burst.
//!
//! Nothing is asserted; the numbers are for reading.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use space::host::{Host, HostConfig};
use space_control::server::ServerConfig;
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{CreateRequest, Node, NodeConfig, PoolConfig, SandboxId, TemplateName};
use space_proto::ExecSpec;

use crate::bench::progress;
use crate::node::DataDir;
use crate::stats::{Samples, Summary, Table, Targets};

/// The template every create uses (built on the server's first start).
const TEMPLATE: &str = "minimal";
/// Size of the loop-mounted btrfs image.
const LOOP_IMAGE_SIZE: u64 = 8 << 30;
/// Bound on waiting for the warm pool to be full.
const POOL_WAIT: Duration = Duration::from_secs(180);
/// The node-level figure the API should stay within, in ms at p50.
const OVERHEAD_TARGET_MS: f64 = 5.0;
/// What reaching the node over the network may add to create-to-first-exec, in ms at p50.
const REMOTE_TARGET_MS: f64 = 3.0;

/// What the API benchmark runs.
pub struct ApiPlan {
    /// Counted create-to-exec pairs.
    pub runs: usize,
    /// Creates in the concurrent burst.
    pub concurrent: usize,
    /// Warm-pool members of `minimal`.
    pub pool_size: usize,
    /// Guest kernel.
    pub kernel: std::path::PathBuf,
    /// The `minimal` root image.
    pub rootfs: std::path::PathBuf,
    /// QEMU binary.
    pub qemu: std::path::PathBuf,
}

/// Runs the API groups; `interrupted` ends the run early (with everything cleaned up).
pub async fn run(plan: &ApiPlan, interrupted: impl Future<Output = &'static str>) -> Result<()> {
    let mut dirs = [
        DataDir::with_prefix("space-bench-api-")?,
        DataDir::with_prefix("space-bench-api-net-")?,
    ];
    let mut slots: [Option<Host>; 2] = [None, None];
    let result = tokio::select! {
        r = measure(plan, &dirs, &mut slots) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    for server in slots.iter_mut().filter_map(Option::take) {
        stop_server(server).await;
    }
    let mut cleaned = Ok(());
    for dir in &mut dirs {
        if let Err(e) = tokio::task::block_in_place(|| dir.cleanup()) {
            cleaned = Err(e);
        }
    }
    crate::bench::with_cleanup(result, cleaned)
}

/// Kills a benchmark server's sandboxes, stops it (within 2 minutes) and its node.
pub(crate) async fn stop_server(server: Host) {
    progress("shutting a server down");
    let node = server.node().clone();
    kill_all(&node).await;
    if tokio::time::timeout(Duration::from_secs(120), server.shutdown())
        .await
        .is_err()
    {
        eprintln!("space-bench: the server did not shut down within 2 minutes");
    }
    // The VMs of this run die with it: nothing is left for a next start to adopt.
    node.shutdown().await;
}

async fn kill_all(node: &Node) {
    if let Ok(list) = node.list().await {
        for s in list {
            if s.state != space_node::State::Terminated {
                let _ = node.kill(&s.id).await;
            }
        }
    }
}

fn template_name() -> TemplateName {
    TEMPLATE.parse().expect("the template name is valid")
}

fn server_config(plan: &ApiPlan, dir: &DataDir, node_over_network: bool) -> HostConfig {
    let served = Served {
        template: TEMPLATE,
        rootfs: &plan.rootfs,
        kernel: &plan.kernel,
        qemu: &plan.qemu,
        pool_size: plan.pool_size,
        follow_demand: false,
    };
    served.config(dir, node_over_network)
}

/// The one template a benchmark's server serves, with a warm pool of it.
pub(crate) struct Served<'a> {
    pub template: &'a str,
    pub rootfs: &'a std::path::Path,
    pub kernel: &'a std::path::Path,
    pub qemu: &'a std::path::Path,
    pub pool_size: usize,
    /// The pool follows demand as a node's does by default; otherwise it keeps exactly
    /// `pool_size` members, refilled one at a time, so every take meets the same pool.
    pub follow_demand: bool,
}

impl Served<'_> {
    /// A server on a fresh loop-mounted btrfs data directory, rolling snapshots off.
    pub(crate) fn config(&self, dir: &DataDir, node_over_network: bool) -> HostConfig {
        let template: TemplateName = self.template.parse().expect("a valid template name");
        let mut node = NodeConfig::new(dir.data());
        node.storage = StorageOptions {
            driver: Some(DriverKind::Btrfs),
            loop_image_size: LOOP_IMAGE_SIZE,
            loop_image: true,
        };
        node.qemu.qemu = self.qemu.to_path_buf();
        node.qemu.detached = false;
        node.rolling.enabled = false;
        // The pool loop on its default tick (a take wakes it at once); only the one template
        // has a pool.
        let mut pools = PoolConfig::default();
        pools.sizes.clear();
        pools.default_size = 0;
        pools.sizes.insert(template, self.pool_size);
        if !self.follow_demand {
            pools.ceiling = 0;
            pools.refills = 1;
        }
        node.pools = pools;
        HostConfig {
            server: ServerConfig {
                listen: "127.0.0.1:0".parse().expect("a valid address"),
                max_upload_bytes: 1 << 30,
                max_body_bytes: 1 << 20,
                ..ServerConfig::new(dir.data())
            },
            node,
            kernel: self.kernel.to_path_buf(),
            images: BTreeMap::from([(self.template.to_owned(), self.rootfs.to_path_buf())]),
            stock_templates: vec![self.template.to_owned()],
            prepare: BTreeMap::new(),
            guestd: std::env::var_os("SPACE_GUESTD").map(std::path::PathBuf::from),
            node_over_network,
        }
    }
}

/// Starts a server on `dir` and the client of it.
async fn start(
    plan: &ApiPlan,
    dir: &DataDir,
    node_over_network: bool,
    slot: &mut Option<Host>,
) -> Result<ApiBench> {
    let server = Host::start(server_config(plan, dir, node_over_network))
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

async fn measure(plan: &ApiPlan, dirs: &[DataDir; 2], slots: &mut [Option<Host>; 2]) -> Result<()> {
    progress("starting the server (builds the minimal template)");
    let bench = start(plan, &dirs[0], false, &mut slots[0]).await?;
    println!(
        "api:         control plane on {} (HTTP/1.1 over loopback, one keep-alive client); \
         pool of {} for {TEMPLATE}; rolling snapshots off\n",
        bench.url, plan.pool_size
    );
    let (node_exec, api_exec) = bench.pairs(plan.runs).await?;
    bench.burst(plan.concurrent).await?;

    let mut summary = Summary::new();
    summary.add(
        "API create / node create, both to first exec",
        &api_exec,
        &node_exec,
        "what HTTP, auth, audit and the ownership row add",
    );
    print!("{}", summary.render());
    let mut targets = Targets::new();
    let (n50, n90) = (
        node_exec.percentile(50.0).unwrap_or(f64::NAN),
        node_exec.percentile(90.0).unwrap_or(f64::NAN),
    );
    targets.time(
        format!("API create to first exec within {OVERHEAD_TARGET_MS} ms of the node's"),
        &api_exec,
        n50 + OVERHEAD_TARGET_MS,
        n90 + OVERHEAD_TARGET_MS,
    );
    print!("{}", targets.render());

    progress("starting a second server whose node is reached over mutual TLS");
    let remote = start(plan, &dirs[1], true, &mut slots[1]).await?;
    let (local_exec, remote_exec) = compare(&bench, &remote, plan.runs).await?;
    let mut summary = Summary::new();
    summary.add(
        "API create to first exec, node over mutual TLS / in process",
        &remote_exec,
        &local_exec,
        "what the network node API adds (loopback)",
    );
    print!("{}", summary.render());
    let mut targets = Targets::new();
    targets.time(
        format!("through a remote node within {REMOTE_TARGET_MS} ms of in process"),
        &remote_exec,
        local_exec.percentile(50.0).unwrap_or(f64::NAN) + REMOTE_TARGET_MS,
        local_exec.percentile(90.0).unwrap_or(f64::NAN) + REMOTE_TARGET_MS,
    );
    print!("{}", targets.render());
    Ok(())
}

/// Alternating API create-to-exec pairs on the in-process server and on the one whose node
/// is reached over the network, both from a full pool; one uncounted pair first.
async fn compare(local: &ApiBench, remote: &ApiBench, runs: usize) -> Result<(Samples, Samples)> {
    progress("filling the pools");
    local.wait_pool_full().await?;
    remote.wait_pool_full().await?;
    let (mut l, mut r) = (Samples::new(), Samples::new());
    for i in 0..=runs {
        if i > 0 {
            progress(&format!("in process against over the network {i}/{runs}"));
        }
        for remote_first in [i % 2 == 0, i % 2 != 0] {
            let (bench, samples) = if remote_first {
                (remote, &mut r)
            } else {
                (local, &mut l)
            };
            bench.wait_pool_full().await?;
            let (id, _, exec) = bench.api_create_exec().await?;
            bench.api_kill(&id).await?;
            if i > 0 {
                samples.push_duration(exec);
            }
        }
    }
    let mut t = Table::new(format!(
        "API create from the warm pool to first exec: node in process (space up) against node \
         over mutual TLS on loopback ({runs} pairs, alternating, pools full before each)"
    ));
    t.add(
        "in process: create + exec `true` exit line",
        "ms",
        l.clone(),
    );
    t.add(
        "over the network: create + exec `true` exit line",
        "ms",
        r.clone(),
    );
    print!("{}", t.render());
    if let (Some(a), Some(b)) = (r.percentile(50.0), l.percentile(50.0)) {
        println!(
            "over the network minus in process at p50: {:.2} ms\n",
            a - b
        );
    }
    Ok((l, r))
}

#[derive(Clone)]
pub(crate) struct ApiBench {
    pub url: String,
    pub key: String,
    pub node: Node,
    pub http: reqwest::Client,
}

impl ApiBench {
    fn pool_ready(&self) -> Option<(usize, usize)> {
        self.node
            .pool_stats()
            .into_iter()
            .find(|s| s.template.name == template_name())
            .map(|s| (s.ready, s.target))
    }

    pub(crate) async fn wait_pool_full(&self) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some((ready, target)) = self.pool_ready() {
                if target > 0 && ready >= target {
                    return Ok(());
                }
            }
            if start.elapsed() > POOL_WAIT {
                bail!(
                    "the warm pool did not fill within {POOL_WAIT:?} (now {:?})",
                    self.pool_ready()
                );
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Node library: create, guest, `run true`. Returns the id and the time to the answer.
    async fn node_create_exec(&self) -> Result<(SandboxId, Duration)> {
        let t = Instant::now();
        let info = self
            .node
            .create(CreateRequest::new(template_name()))
            .await?;
        let client = self.node.guest(&info.id).await?;
        let out = client.run(ExecSpec::argv(["true"])).await?;
        let took = t.elapsed();
        if !out.status.success() {
            bail!("`true` answered {:?}", out.status);
        }
        Ok((info.id, took))
    }

    /// HTTP: create, then exec `true` read to its exit line. Returns the id, the time to the
    /// create's answer and to the exec's exit line.
    async fn api_create_exec(&self) -> Result<(String, Duration, Duration)> {
        let t = Instant::now();
        let id = self.api_create().await?;
        let created = t.elapsed();
        self.api_exec_true(&id).await?;
        Ok((id, created, t.elapsed()))
    }

    pub(crate) async fn api_create(&self) -> Result<String> {
        let resp = self
            .http
            .post(format!("{}/v1/sandboxes", self.url))
            .bearer_auth(&self.key)
            .json(&serde_json::json!({ "template": TEMPLATE }))
            .send()
            .await?;
        let status = resp.status();
        let body: serde_json::Value = resp.json().await?;
        if status != reqwest::StatusCode::CREATED {
            bail!("create answered {status}: {body}");
        }
        body["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("create answered no id: {body}"))
    }

    pub(crate) async fn api_exec_true(&self, id: &str) -> Result<()> {
        let resp = self
            .http
            .post(format!("{}/v1/sandboxes/{id}/exec", self.url))
            .bearer_auth(&self.key)
            .json(&serde_json::json!({ "cmd": ["true"] }))
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("exec answered {status}: {text}");
        }
        let events = space_api::exec::events(text.as_bytes())
            .with_context(|| format!("the exec stream: {text:?}"))?;
        match events.last() {
            Some(space_api::ExecEvent::Exit {
                exit_code: Some(0), ..
            }) => Ok(()),
            other => bail!("`true` ended with {other:?}"),
        }
    }

    pub(crate) async fn api_kill(&self, id: &str) -> Result<()> {
        let resp = self
            .http
            .delete(format!("{}/v1/sandboxes/{id}", self.url))
            .bearer_auth(&self.key)
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("kill answered {}", resp.status());
        }
        Ok(())
    }

    /// Mean server-side time of each operation, from the duration histogram's sum and count.
    async fn server_means(&self, operations: &[&str]) -> Result<Vec<String>> {
        let text = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await?
            .text()
            .await?;
        let value = |series: &str, op: &str| -> Option<f64> {
            let prefix =
                format!("space_api_request_duration_seconds_{series}{{operation=\"{op}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse().ok())
        };
        Ok(operations
            .iter()
            .map(|op| match (value("sum", op), value("count", op)) {
                (Some(sum), Some(n)) if n > 0.0 => format!("{op} {:.2} ms", sum / n * 1e3),
                _ => format!("{op} -"),
            })
            .collect())
    }

    /// Alternating node and API create-to-exec pairs from a full pool; one uncounted pair
    /// first warms caches and connections.
    async fn pairs(&self, runs: usize) -> Result<(Samples, Samples)> {
        progress("filling the pool");
        self.wait_pool_full().await?;
        let (mut node_exec, mut api_created, mut api_exec) =
            (Samples::new(), Samples::new(), Samples::new());
        for i in 0..=runs {
            if i > 0 {
                progress(&format!("create to first exec {i}/{runs}"));
            }
            for api_first in [i % 2 == 0, i % 2 != 0] {
                self.wait_pool_full().await?;
                if api_first {
                    let (id, created, exec) = self.api_create_exec().await?;
                    self.api_kill(&id).await?;
                    if i > 0 {
                        api_created.push_duration(created);
                        api_exec.push_duration(exec);
                    }
                } else {
                    let (id, exec) = self.node_create_exec().await?;
                    self.node.kill(&id).await?;
                    if i > 0 {
                        node_exec.push_duration(exec);
                    }
                }
            }
        }
        let mut t = Table::new(format!(
            "Create from the warm pool to first exec: node library calls against the HTTP API \
             ({runs} pairs, alternating which goes first, pool full before each)"
        ));
        t.add(
            "node: create -> guest -> run true answered",
            "ms",
            node_exec.clone(),
        );
        t.add("API: POST /v1/sandboxes answered (201)", "ms", api_created);
        t.add(
            "API: then POST .../exec `true` exit line read",
            "ms",
            api_exec.clone(),
        );
        print!("{}", t.render());
        let (a, n) = (api_exec.percentile(50.0), node_exec.percentile(50.0));
        if let (Some(a), Some(n)) = (a, n) {
            println!("API minus node at p50: {:.2} ms", a - n);
        }
        match self
            .server_means(&["sandbox.create", "sandbox.exec", "sandbox.kill"])
            .await
        {
            Ok(means) => println!(
                "server side (from /metrics, request to response head, mean over every call \
                 incl. warm-up): {}\n",
                means.join(", ")
            ),
            Err(e) => println!("server side: /metrics unreadable: {e:#}\n"),
        }
        Ok((node_exec, api_exec))
    }

    /// `n` creates at once through HTTP, each followed by `run true`; then all are killed.
    async fn burst(&self, n: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.wait_pool_full().await?;
        progress(&format!("{n} concurrent creates"));
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..n {
            let me = ApiBench {
                url: self.url.clone(),
                key: self.key.clone(),
                node: self.node.clone(),
                http: self.http.clone(),
            };
            tasks.spawn(async move { me.api_create_exec().await });
        }
        let (mut created, mut exec, mut ids, mut failures) =
            (Samples::new(), Samples::new(), Vec::new(), Vec::new());
        while let Some(joined) = tasks.join_next().await {
            match joined.map_err(anyhow::Error::from).and_then(|r| r) {
                Ok((id, c, e)) => {
                    created.push_duration(c);
                    exec.push_duration(e);
                    ids.push(id);
                }
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        let wall = start.elapsed();
        for id in &ids {
            if let Err(e) = self.api_kill(id).await {
                failures.push(format!("killing {id}: {e:#}"));
            }
        }
        let mut t = Table::new(format!(
            "{n} concurrent creates through the API (pool of {} full at the start; the rest \
             restore the template's snapshot), each then runs `true`",
            self.pool_ready().map(|p| p.1).unwrap_or(0)
        ));
        t.add("POST /v1/sandboxes answered (201)", "ms", created);
        t.add("then first exec's exit line read", "ms", exec);
        print!("{}", t.render());
        println!(
            "burst: {} of {n} succeeded; wall time {:.0} ms ({:.1} creates/s)",
            ids.len(),
            wall.as_secs_f64() * 1e3,
            ids.len() as f64 / wall.as_secs_f64()
        );
        for f in &failures {
            println!("- {f}");
        }
        println!();
        Ok(())
    }
}
