//! The cluster group: a control replica (over SQLite here, the one-replica case) and three
//! nodes on this machine, each its own data directory, loop image and warm pool, joined with
//! tokens and reached over mutual TLS.
//!
//! **Concurrent creates over three nodes against one.** `--creates` creates are sent at once
//! through the replica's HTTP API, each followed by a first exec of `true`; then two of the
//! nodes are drained and the same burst goes to the one left. Placement spreads the first
//! burst (warm pools first, then free memory), so it has three pools and three nodes'
//! admission to draw on. All nodes share this machine's cores, so the figure shows what
//! placement and the node API cost and what three pools give, not three machines' worth of
//! CPU.
//!
//! Nothing is asserted; the numbers are for reading.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use space_control::replica::{Replica, ReplicaConfig};
use space_control::store::NodeState;
use space_control::vault::VaultKey;
use space_node::api::{LocalNode, TemplateBuild};
use space_node::member::{Member, MemberConfig};
use space_node::storage::{DriverKind, StorageOptions};
use space_node::{Node, NodeApi, NodeConfig, PoolConfig, TemplateName, TemplateRef};

use crate::bench::progress;
use crate::node::DataDir;
use crate::stats::{Samples, Table};

/// What the cluster group runs.
pub struct ClusterPlan {
    /// Creates per burst.
    pub creates: usize,
    /// Nodes.
    pub nodes: usize,
    /// Warm-pool members of `minimal` per node.
    pub pool_size: usize,
    /// Guest kernel.
    pub kernel: std::path::PathBuf,
    /// The `minimal` root image.
    pub rootfs: std::path::PathBuf,
    /// QEMU binary.
    pub qemu: std::path::PathBuf,
}

struct Running {
    replica: Option<Replica>,
    nodes: Vec<(Node, Member)>,
}

/// Runs the group; `interrupted` ends it early (with everything cleaned up).
pub async fn run(
    plan: &ClusterPlan,
    interrupted: impl Future<Output = &'static str>,
) -> Result<()> {
    let mut dirs = Vec::new();
    for _ in 0..plan.nodes {
        dirs.push(DataDir::with_prefix("space-bench-cluster-")?);
    }
    let state = tempfile::Builder::new()
        .prefix("space-bench-cluster-db-")
        .tempdir_in("/var/tmp")?;
    let mut running = Running {
        replica: None,
        nodes: Vec::new(),
    };
    let result = tokio::select! {
        r = measure(plan, &dirs, state.path(), &mut running) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    progress("shutting the cluster down");
    for (node, member) in running.nodes.drain(..) {
        member.stop().await;
        if let Ok(all) = node.list().await {
            for s in all {
                if s.state != space_node::State::Terminated {
                    let _ = node.kill(&s.id).await;
                }
            }
        }
        node.shutdown().await;
    }
    if let Some(r) = running.replica.take() {
        r.shutdown().await;
    }
    let mut cleaned = Ok(());
    for dir in &mut dirs {
        if let Err(e) = tokio::task::block_in_place(|| dir.cleanup()) {
            cleaned = Err(e);
        }
    }
    crate::bench::with_cleanup(result, cleaned)
}

fn template() -> TemplateName {
    "minimal".parse().expect("a valid name")
}

async fn measure(
    plan: &ClusterPlan,
    dirs: &[DataDir],
    state: &std::path::Path,
    running: &mut Running,
) -> Result<()> {
    progress("starting a control replica");
    let replica = Replica::start(ReplicaConfig {
        tls: Default::default(),
        database: state.join("control.db").display().to_string(),
        listen: "127.0.0.1:0".parse()?,
        vault_key: VaultKey::generate(),
        max_upload_bytes: 1 << 20,
        max_body_bytes: 1 << 20,
        ready_timeout: Duration::from_secs(120),
        archive: None,
    })
    .await?;
    let key = replica
        .bootstrap_key()
        .context("a fresh database makes a key")?
        .to_owned();
    let url = replica.url();
    let store = replica.store().clone();
    running.replica = Some(replica);
    for (i, dir) in dirs.iter().enumerate() {
        progress(&format!("starting node {} of {}", i + 1, plan.nodes));
        let mut cfg = NodeConfig::new(dir.data());
        cfg.storage = StorageOptions {
            driver: Some(DriverKind::Btrfs),
            loop_image_size: 8 << 30,
            loop_image: true,
        };
        cfg.qemu.qemu = plan.qemu.clone();
        cfg.qemu.detached = false;
        cfg.rolling.enabled = false;
        let mut pools = PoolConfig::default();
        pools.sizes.clear();
        pools.default_size = 0;
        pools.sizes.insert(template(), plan.pool_size);
        pools.ceiling = 0;
        cfg.pools = pools;
        let node = Node::open(cfg).await?;
        let local = LocalNode::new(
            node.clone(),
            plan.kernel.clone(),
            BTreeMap::from([("minimal".to_string(), plan.rootfs.clone())]),
        );
        local
            .build_template(TemplateBuild::stock(
                TemplateRef::new("minimal", "1")?,
                "minimal",
                1,
                256,
            ))
            .await
            .map_err(|e| anyhow!("building minimal: {e}"))?;
        let token = store.create_join_token(60_000).await?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let member = Member::start(
            local,
            dir.data(),
            MemberConfig {
                control: url.clone(),
                join_token: Some(token.token),
                node_id: format!("node-{}", i + 1),
                advertise: format!("127.0.0.1:{port}"),
                listen: SocketAddr::from(([127, 0, 0, 1], port)),
                egress: None,
            },
        )
        .await?;
        running.nodes.push((node, member));
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()?;
    let nodes: Vec<Node> = running.nodes.iter().map(|(n, _)| n.clone()).collect();
    println!(
        "cluster:     one control replica on {url} (SQLite), {} nodes on this machine, pool of \
         {} per node; {} creates per burst\n",
        plan.nodes, plan.pool_size, plan.creates
    );
    let all = burst(&http, &url, &key, &nodes, plan.creates).await?;
    for i in 2..=plan.nodes {
        store
            .set_node_state(&format!("node-{i}"), NodeState::Draining)
            .await?;
    }
    let one = burst(&http, &url, &key, &nodes[..1], plan.creates).await?;
    let mut t = Table::new(format!(
        "{} concurrent creates through the API, each then a first exec: over {} nodes against \
         one (pools full at the start)",
        plan.creates, plan.nodes
    ));
    t.add(
        format!("{} nodes: create answered (201)", plan.nodes),
        "ms",
        all.created.clone(),
    );
    t.add(
        format!("{} nodes: first exec's exit line read", plan.nodes),
        "ms",
        all.exec.clone(),
    );
    t.add("1 node: create answered (201)", "ms", one.created.clone());
    t.add(
        "1 node: first exec's exit line read",
        "ms",
        one.exec.clone(),
    );
    print!("{}", t.render());
    let rate = |b: &Burst| b.ok as f64 / b.wall.as_secs_f64();
    println!(
        "{} nodes: {} of {} succeeded, wall {} ms, {:.1} creates/s; placement: {:?}",
        plan.nodes,
        all.ok,
        plan.creates,
        all.wall.as_millis(),
        rate(&all),
        all.spread
    );
    println!(
        "1 node:  {} of {} succeeded, wall {} ms, {:.1} creates/s",
        one.ok,
        plan.creates,
        one.wall.as_millis(),
        rate(&one)
    );
    println!(
        "creates/s, {} nodes / 1 node: {:.2}x\n",
        plan.nodes,
        rate(&all) / rate(&one)
    );
    Ok(())
}

struct Burst {
    created: Samples,
    exec: Samples,
    wall: Duration,
    ok: usize,
    spread: BTreeMap<String, usize>,
}

async fn wait_pools(nodes: &[Node]) -> Result<()> {
    let start = Instant::now();
    loop {
        let full = nodes.iter().all(|n| {
            n.pool_stats()
                .iter()
                .any(|s| s.template.name == template() && s.target > 0 && s.ready >= s.target)
        });
        if full {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(300) {
            bail!("the pools did not fill within 5 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn burst(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    nodes: &[Node],
    n: usize,
) -> Result<Burst> {
    progress("filling the pools");
    wait_pools(nodes).await?;
    // A heartbeat (2 s) after the pools filled lets the reports say so.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    progress(&format!("{n} concurrent creates"));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let http = Arc::new(http.clone());
    for _ in 0..n {
        let (http, url, key) = (http.clone(), url.to_owned(), key.to_owned());
        tasks.spawn(async move {
            let t = Instant::now();
            let v: serde_json::Value = http
                .post(format!("{url}/v1/sandboxes"))
                .bearer_auth(&key)
                .json(&serde_json::json!({"template": "minimal"}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let created = t.elapsed();
            let id = v["id"].as_str().context("no id")?.to_owned();
            let text = http
                .post(format!("{url}/v1/sandboxes/{id}/exec"))
                .bearer_auth(&key)
                .json(&serde_json::json!({"cmd": ["true"]}))
                .send()
                .await?
                .error_for_status()?
                .text()
                .await?;
            let events = space_api::exec::events(text.as_bytes())?;
            if !events.last().is_some_and(space_api::ExecEvent::is_last) {
                bail!("exec ended without an exit line: {text}");
            }
            Ok::<_, anyhow::Error>((id, created, t.elapsed()))
        });
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
    let mut spread = BTreeMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let here = node
            .list()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|s| ids.contains(&s.id.to_string()))
            .count();
        spread.insert(format!("node-{}", i + 1), here);
    }
    for id in &ids {
        let _ = http
            .delete(format!("{url}/v1/sandboxes/{id}"))
            .bearer_auth(key)
            .send()
            .await;
    }
    for f in failures.iter().take(3) {
        eprintln!("space-bench: a create failed: {f}");
    }
    Ok(Burst {
        created,
        exec,
        wall,
        ok: ids.len(),
        spread,
    })
}
