//! The failover group: a cluster of real processes on this machine (one `space control`
//! replica over SQLite, three `space node` processes, Garage as the object store), and what a
//! node's loss costs the sandboxes on it.
//!
//! Each round creates sandboxes until the node that will be killed holds some running and
//! some suspended ones, waits until each running one has a full snapshot in the store, and
//! sends that node SIGKILL. Then:
//!
//! - **failover**: for each running sandbox of the killed node, the time from the SIGKILL to
//!   its first exec answered by another node. It cannot be shorter than the lease (10 s)
//!   plus the grace (5 s) less the time since the node's last heartbeat, so the table also
//!   shows what came after the node was declared lost;
//! - **restore elsewhere**: for each suspended sandbox of the killed node, a restore through
//!   the API (it moves to a live node and its snapshot comes from the store) to its first
//!   exec, against a restore of a sandbox suspended on a live node (its local copy) in the
//!   same round.
//!
//! The killed node is started again on its data directory (it rejoins as a new incarnation
//! and discards what moved) before the next round. Nothing is asserted.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Value};

use crate::bench::progress;
use crate::stats::{fmt_ratio, ratio, Samples, Table};

/// What the failover group runs.
pub struct FailoverPlan {
    /// Rounds (each kills a node).
    pub rounds: usize,
    /// Running sandboxes the killed node should hold in each round.
    pub running: usize,
    /// Suspended sandboxes the killed node should hold in each round.
    pub suspended: usize,
    /// Guest kernel.
    pub kernel: PathBuf,
    /// The `minimal` root image.
    pub rootfs: PathBuf,
}

const NODES: usize = 3;
/// The lease plus the grace before a silent node is taken for lost.
const LOST_AFTER: Duration = Duration::from_secs(15);

struct Proc {
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    fn spawn(mut cmd: Command, log: PathBuf) -> Result<Proc> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        Ok(Proc {
            child: Some(child),
            log,
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    async fn wait_for(&mut self, needle: &str, wait: Duration) -> Result<()> {
        let until = Instant::now() + wait;
        while !self.text().contains(needle) {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "exited ({status}) before {needle:?}; log {}",
                    self.log.display()
                );
            }
            if Instant::now() > until {
                bail!("no {needle:?} within {wait:?}; log {}", self.log.display());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Node {
    id: String,
    data: PathBuf,
    port: u16,
    proc: Option<Proc>,
}

struct Cluster {
    space: PathBuf,
    dir: PathBuf,
    url: String,
    key: String,
    http: reqwest::Client,
    replica: Option<Proc>,
    nodes: Vec<Node>,
    plan_kernel: PathBuf,
    plan_rootfs: PathBuf,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl Cluster {
    async fn call(&self, method: reqwest::Method, path: &str, body: Value) -> Result<Value> {
        let resp = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(&self.key)
            .json(&body)
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            bail!("{path}: {status}: {text}");
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn exec_ok(&self, id: &str) -> bool {
        let r = self
            .http
            .post(format!("{}/v1/sandboxes/{id}/exec", self.url))
            .bearer_auth(&self.key)
            .timeout(Duration::from_secs(10))
            .json(&json!({"cmd": ["true"]}))
            .send()
            .await;
        match r {
            Ok(r) if r.status().is_success() => r.bytes().await.is_ok_and(|t| {
                space_api::exec::events(&t).is_ok_and(|evs| {
                    evs.last().and_then(space_api::ExecEvent::shell_code) == Some(0)
                })
            }),
            _ => false,
        }
    }

    /// A restore through the API, to the first exec that answers.
    async fn restore_to_exec(&self, id: &str) -> Result<Duration> {
        let t = Instant::now();
        self.call(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{id}/restore"),
            json!({}),
        )
        .await?;
        while !self.exec_ok(id).await {}
        Ok(t.elapsed())
    }

    fn start_node(&mut self, i: usize, token: Option<String>) -> Result<()> {
        let n = &self.nodes[i];
        let mut cmd = Command::new(&self.space);
        cmd.arg("node")
            .args(["--control", &self.url, "--node-id", &n.id])
            .args(["--advertise", &format!("127.0.0.1:{}", n.port)])
            .arg("--data-dir")
            .arg(&n.data)
            .arg("--kernel")
            .arg(&self.plan_kernel)
            .arg("--image")
            .arg(format!("minimal={}", self.plan_rootfs.display()))
            .args(["--pool-size", "0"])
            .env("RUST_LOG", "info")
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY");
        if let Some(t) = token {
            cmd.args(["--join-token", &t]);
        }
        let log = self.dir.join(format!("{}.log", n.id));
        self.nodes[i].proc = Some(Proc::spawn(cmd, log)?);
        Ok(())
    }

    /// Which node holds each sandbox now, by the directories in the nodes' data.
    fn homes(&self, ids: &[String]) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for id in ids {
            for (i, n) in self.nodes.iter().enumerate() {
                if n.proc.is_some() && n.data.join("sandboxes").join(id).exists() {
                    out.insert(id.clone(), i);
                }
            }
        }
        out
    }

    async fn wait_nodes_live(&self, want: usize) -> Result<()> {
        let until = Instant::now() + Duration::from_secs(300);
        loop {
            let v = self
                .call(reqwest::Method::GET, "/v1/nodes", Value::Null)
                .await?;
            let live = v["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| {
                    n["live"] == true
                        && n["state"] == "active"
                        && n["templates"].as_array().is_some_and(|t| !t.is_empty())
                })
                .count();
            if live >= want {
                return Ok(());
            }
            if Instant::now() > until {
                bail!("{live} of {want} nodes live with templates after 5 minutes: {v}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_uploaded(&self, id: &str, after_ms: u64) -> Result<()> {
        let until = Instant::now() + Duration::from_secs(120);
        loop {
            let v = self
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/sandboxes/{id}/snapshots"),
                    Value::Null,
                )
                .await?;
            let done = v["snapshots"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "full"
                    && s["created_unix_ms"].as_u64().unwrap_or(0) > after_ms
                    && s["remote"].is_object()
            });
            if done {
                return Ok(());
            }
            if Instant::now() > until {
                bail!("no snapshot of {id} reached the store: {v}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs the group; `interrupted` ends it early (with everything cleaned up).
pub async fn run(
    plan: &FailoverPlan,
    interrupted: impl std::future::Future<Output = &'static str>,
) -> Result<()> {
    let garage = tokio::task::block_in_place(space_archive::testing::Garage::start);
    let dir = tempfile::Builder::new()
        .prefix("space-bench-failover-")
        .tempdir_in("/var/tmp")?;
    let space = std::env::current_exe()?
        .parent()
        .context("the bench binary's directory")?
        .join("space");
    if !space.is_file() {
        bail!(
            "{} is missing: build it with `cargo build --release -p space` (make bench does)",
            space.display()
        );
    }
    let mut cluster = Cluster {
        space,
        dir: dir.path().to_owned(),
        url: String::new(),
        key: String::new(),
        http: reqwest::Client::builder().build()?,
        replica: None,
        nodes: Vec::new(),
        plan_kernel: plan.kernel.clone(),
        plan_rootfs: plan.rootfs.clone(),
    };
    let result = tokio::select! {
        r = measure(plan, &garage, &mut cluster) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    progress("shutting the cluster down");
    for n in &mut cluster.nodes {
        if let Some(mut p) = n.proc.take() {
            p.kill();
        }
    }
    for n in &cluster.nodes {
        cleanup_node(&n.data);
    }
    if let Some(mut r) = cluster.replica.take() {
        r.kill();
    }
    drop(garage);
    result
}

/// Kills what runs under a node's data directory and unmounts its loop image.
fn cleanup_node(data: &Path) {
    for e in std::fs::read_dir(data.join("sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Some(pid) = std::fs::read_to_string(e.path().join("qemu.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
        {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.starts_with("qemu") {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let _ = nix::mount::umount2(data, nix::mount::MntFlags::MNT_DETACH);
}

async fn measure(
    plan: &FailoverPlan,
    garage: &space_archive::testing::Garage,
    c: &mut Cluster,
) -> Result<()> {
    progress("starting a control replica");
    let port = free_port()?;
    c.url = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new(&c.space);
    cmd.arg("control")
        .args([
            "--database",
            &c.dir.join("control.db").display().to_string(),
        ])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--object-store", &format!("s3://{}/bench", garage.bucket)])
        .args(["--upload-interval", "5"])
        .env("SPACE_VAULT_KEY", hex_key())
        .env("AWS_ACCESS_KEY_ID", &garage.key_id)
        .env("AWS_SECRET_ACCESS_KEY", &garage.secret)
        .env("AWS_REGION", "garage")
        .env("AWS_ENDPOINT_URL", &garage.endpoint)
        .env("RUST_LOG", "info");
    let mut replica = Proc::spawn(cmd, c.dir.join("replica.log"))?;
    replica
        .wait_for("Add nodes with a token", Duration::from_secs(60))
        .await?;
    c.key = replica
        .text()
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("space_"))
        .context("the replica printed no admin key")?
        .to_owned();
    c.replica = Some(replica);
    for i in 0..NODES {
        c.nodes.push(Node {
            id: format!("node-{}", i + 1),
            data: c.dir.join(format!("node-{}", i + 1)),
            port: free_port()?,
            proc: None,
        });
    }
    for i in 0..NODES {
        progress(&format!("starting node {} of {NODES}", i + 1));
        let t = c
            .call(reqwest::Method::POST, "/v1/cluster/join-tokens", json!({}))
            .await?;
        let token = t["token"].as_str().context("a join token")?.to_owned();
        c.start_node(i, Some(token))?;
    }
    c.wait_nodes_live(NODES).await?;
    println!(
        "failover:    one control replica (SQLite), {NODES} `space node` processes on this \
         machine, Garage as the store, uploads every 5 s; {} rounds, each killing one node \
         holding {} running and {} suspended sandboxes\n",
        plan.rounds, plan.running, plan.suspended
    );

    let (mut failover, mut after_lost, mut elsewhere, mut local) = (
        Samples::new(),
        Samples::new(),
        Samples::new(),
        Samples::new(),
    );
    for round in 0..plan.rounds {
        progress(&format!(
            "round {} of {}: placing sandboxes",
            round + 1,
            plan.rounds
        ));
        // Create until one node holds enough of each kind.
        let mut ids: Vec<String> = Vec::new();
        let victim = loop {
            let v = c
                .call(
                    reqwest::Method::POST,
                    "/v1/sandboxes",
                    json!({"template": "minimal"}),
                )
                .await?;
            ids.push(v["id"].as_str().context("an id")?.to_owned());
            let homes = c.homes(&ids);
            let mut count = [0usize; NODES];
            for n in homes.values() {
                count[*n] += 1;
            }
            let want = plan.running + plan.suspended;
            if let Some(n) = (0..NODES).find(|n| count[*n] >= want) {
                break n;
            }
            if ids.len() > want * NODES + 6 {
                bail!("placement did not put {want} sandboxes on one node: {homes:?}");
            }
        };
        let homes = c.homes(&ids);
        let on_victim: Vec<String> = ids
            .iter()
            .filter(|i| homes[*i] == victim)
            .cloned()
            .collect();
        let (sleeping, running) = on_victim.split_at(plan.suspended);
        let reference: Vec<String> = ids
            .iter()
            .filter(|i| homes[*i] != victim)
            .cloned()
            .collect();
        for id in sleeping.iter().chain(reference.iter().take(plan.suspended)) {
            c.call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{id}/suspend"),
                json!({}),
            )
            .await?;
        }
        let mark = now_ms();
        for id in running {
            c.wait_uploaded(id, mark.saturating_sub(60_000)).await?;
        }
        // The reference: a restore on the node that suspended it (its local copy).
        for id in reference.iter().take(plan.suspended) {
            local.push_duration(c.restore_to_exec(id).await?);
        }
        progress(&format!(
            "round {}: SIGKILL of {} ({} running, {} suspended there)",
            round + 1,
            c.nodes[victim].id,
            running.len(),
            sleeping.len()
        ));
        let killed = Instant::now();
        if let Some(mut p) = c.nodes[victim].proc.take() {
            p.kill();
        }
        let mut pending: Vec<String> = running.to_vec();
        while !pending.is_empty() {
            if killed.elapsed() > Duration::from_secs(240) {
                bail!("{pending:?} did not come back within 4 minutes");
            }
            let mut left = Vec::new();
            for id in pending {
                if c.exec_ok(&id).await {
                    let d = killed.elapsed();
                    failover.push_duration(d);
                    after_lost.push_duration(d.saturating_sub(LOST_AFTER));
                } else {
                    left.push(id);
                }
            }
            pending = left;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The node is lost by now: its suspended sandboxes move when restored.
        for id in sleeping {
            elsewhere.push_duration(c.restore_to_exec(id).await?);
        }
        progress(&format!("round {}: cleaning up", round + 1));
        for id in &ids {
            let _ = c
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/sandboxes/{id}"),
                    json!({}),
                )
                .await;
        }
        c.start_node(victim, None)?;
        c.wait_nodes_live(NODES).await?;
    }
    let mut t = Table::new(format!(
        "A node's SIGKILL: its running sandboxes answering elsewhere, and restores of its \
         suspended ones on other nodes ({} rounds)",
        plan.rounds
    ));
    t.add("SIGKILL to first exec on another node", "ms", failover);
    t.add(
        "  of which after the lease and grace (15 s)",
        "ms",
        after_lost,
    );
    t.add(
        "restore of a sandbox suspended on the lost node (moves, from the store)",
        "ms",
        elsewhere,
    );
    t.add(
        "restore of a sandbox suspended on its own live node (local copy)",
        "ms",
        local,
    );
    print!("{}", t.render());
    println!(
        "restore elsewhere / restore in place (p50): {}\n",
        fmt_ratio(ratio(
            t.p50("restore of a sandbox suspended on the lost node (moves, from the store)"),
            t.p50("restore of a sandbox suspended on its own live node (local copy)")
        ))
    );
    Ok(())
}

fn hex_key() -> String {
    space_archive::testing::noise(now_ms(), 32)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
