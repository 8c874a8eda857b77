//! `space up`'s assembly: a [`Node`] opened in this process with what the control plane
//! gives it before it opens ([`Server::hooks`]), its stock templates built, and the API
//! [`Server`] started in front of it through the node API (in process, or over mutual TLS on
//! loopback for tests and benchmarks).
//!
//! `space-control` knows nodes only through the node API; this is the one place that links
//! both and hands one to the other.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context as _;
use space_control::server::{HostedNode, Server, ServerConfig};
use space_node::api::{ClusterCa, Identity, NodeServer, RemoteNode};
use space_node::node::preparing::Preparing;
use space_node::{
    ArchiveConfig, LocalNode, Node, NodeApi, NodeConfig, NodeError, SandboxId, TemplateName,
    TemplateRef, TemplateSpec, VersionReq,
};

/// How to run `space up`.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The API server. Its data directory and ready timeout are the node's.
    pub server: ServerConfig,
    /// The node (data directory, storage, QEMU, pools, ...).
    pub node: NodeConfig,
    /// The kernel templates are built with.
    pub kernel: PathBuf,
    /// Root images templates can be built from: image name -> rootfs file.
    pub images: BTreeMap<String, PathBuf>,
    /// The `space-guestd` binary put into templates made of OCI images and Dockerfiles
    /// (default: `$SPACE_GUESTD`).
    pub guestd: Option<PathBuf>,
    /// Images to build as same-named templates at start when no build of them exists.
    pub stock_templates: Vec<String>,
    /// Templates prepared in the background after the start: their image is made by a
    /// recipe first (the `desktop` image of `space up`), then built like a stock template.
    /// Until then a create of one is answered `503 template_not_ready` with the progress.
    pub prepare: BTreeMap<String, Recipe>,
    /// Reach the node through the network node API (mutual TLS on loopback, from a cluster
    /// CA made for the process) instead of in process: every call and guest stream then
    /// takes the path a control replica's takes to a remote node. For tests and benchmarks.
    pub node_over_network: bool,
}

impl HostConfig {
    /// Defaults around a node configuration: the server's defaults, no images.
    pub fn new(node: NodeConfig, kernel: impl Into<PathBuf>) -> HostConfig {
        HostConfig {
            server: ServerConfig::new(node.data_dir.clone()),
            node,
            kernel: kernel.into(),
            images: BTreeMap::new(),
            guestd: std::env::var_os("SPACE_GUESTD").map(PathBuf::from),
            stock_templates: Vec::new(),
            prepare: BTreeMap::new(),
            node_over_network: false,
        }
    }
}

/// `space up` running: the API server (what it derefs to) and its node.
pub struct Host {
    server: Server,
    node: Node,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("server", &self.server)
            .finish()
    }
}

impl Deref for Host {
    type Target = Server;

    fn deref(&self) -> &Server {
        &self.server
    }
}

impl Host {
    /// Opens the node (crash recovery runs there) with the server's hooks (the gateway's
    /// secrets and audit sink, the object store's keyring), builds the stock templates that
    /// have no build yet (progress on stderr), then starts the server in front of it.
    pub async fn start(mut config: HostConfig) -> anyhow::Result<Host> {
        config.server.data_dir = config.node.data_dir.clone();
        config.server.ready_timeout = config.node.ready_timeout;
        let hooks = Server::hooks(&config.server)?;
        config.node.gateway.secrets = Some(hooks.secrets.clone());
        config.node.gateway.audit = Some(hooks.audit.clone());
        if let (Some((archive, keyring)), Some(settings)) = (&hooks.archive, &config.server.archive)
        {
            let mut a = ArchiveConfig::new(archive.clone(), keyring.clone());
            a.cache_max_bytes = settings.cache_max_bytes;
            a.upload_interval = settings.upload_interval;
            config.node.archive = Some(a);
        }
        let node = Node::open(config.node.clone())
            .await
            .context("opening the node")?;
        for name in &config.stock_templates {
            let Some(rootfs) = config.images.get(name) else {
                node.shutdown_detach().await;
                anyhow::bail!("stock template {name}: no image of that name is configured");
            };
            if let Err(e) = build_stock(&node, &config, name, rootfs).await {
                node.shutdown_detach().await;
                return Err(e);
            }
        }
        for (name, recipe) in &config.prepare {
            let tname: TemplateName = name.parse()?;
            if node.template(&tname, &VersionReq::Latest).is_err() {
                node.set_preparing(
                    name,
                    Preparing::new("waiting for the server to start", recipe.expected),
                );
                tokio::spawn(prepare(
                    node.clone(),
                    config.clone(),
                    name.clone(),
                    recipe.clone(),
                ));
            }
        }
        let local: Arc<dyn NodeApi> = Arc::new(
            LocalNode::new(node.clone(), config.kernel.clone(), config.images.clone())
                .with_guestd(config.guestd.clone()),
        );
        let (api, node_server) = if config.node_over_network {
            match loopback_node(local).await {
                Ok((api, server)) => (api, Some(server)),
                Err(e) => {
                    node.shutdown_detach().await;
                    return Err(e.context("serving the node API on loopback"));
                }
            }
        } else {
            (local, None)
        };
        let hosted = Arc::new(Embedded {
            node: node.clone(),
            api,
            node_server: Mutex::new(node_server),
        });
        let server = Server::start(config.server, hooks, hosted).await?;
        Ok(Host { server, node })
    }

    /// The node.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The API server.
    pub fn server(&self) -> &Server {
        &self.server
    }

    /// Stops the server (requests in flight get [`space_control::server::SHUTDOWN_GRACE`]),
    /// then the node's drivers; the VMs keep running for the next start to adopt.
    pub async fn shutdown(self) {
        self.server.shutdown().await;
    }
}

/// The node of this process, as the server sees it.
struct Embedded {
    node: Node,
    api: Arc<dyn NodeApi>,
    node_server: Mutex<Option<NodeServer>>,
}

#[async_trait::async_trait]
impl HostedNode for Embedded {
    fn api(&self) -> Arc<dyn NodeApi> {
        self.api.clone()
    }

    fn take_adopted(&self) -> Vec<(SandboxId, String)> {
        self.node
            .take_adopted()
            .into_iter()
            .map(|r| (r.id, r.tenant))
            .collect()
    }

    async fn shutdown(&self) {
        let server = self
            .node_server
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(s) = server {
            s.stop().await;
        }
        self.node.shutdown_detach().await;
    }
}

/// Serves `local` on a loopback port with mutual TLS and returns the network client of it.
async fn loopback_node(local: Arc<dyn NodeApi>) -> anyhow::Result<(Arc<dyn NodeApi>, NodeServer)> {
    let ca = ClusterCa::generate()?;
    let node_id = "local";
    let node_identity = Identity::new(&ca.issue_node(node_id, 1)?, ca.cert_pem())?;
    let server = NodeServer::start(local, "127.0.0.1:0".parse()?, &node_identity).await?;
    let control = Identity::new(&ca.issue_control(1)?, ca.cert_pem())?;
    let remote = RemoteNode::new(node_id, &server.local_addr().to_string(), &control)?;
    Ok((Arc::new(remote), server))
}

/// A desktop sandbox's vCPUs by default.
pub const DESKTOP_VCPUS: u32 = 2;
/// A desktop sandbox's memory by default: Xfce, Chromium and a page or two.
pub const DESKTOP_MEMORY_MIB: u64 = 2048;

/// Where a template prepared in the background gets its image.
#[derive(Debug, Clone)]
pub enum ImageSource {
    /// An image built already.
    Built(PathBuf),
    /// A program that prints progress on stderr and the image's path as the last line of its
    /// stdout (`guest/build-image.sh desktop <guestd>`), with its arguments.
    Recipe(PathBuf, Vec<String>),
}

/// A template prepared in the background.
#[derive(Debug, Clone)]
pub struct Recipe {
    /// Its image.
    pub image: ImageSource,
    /// About how long it takes cold, for the progress message.
    pub expected: std::time::Duration,
    /// The template's vCPUs and memory.
    pub vcpus: u32,
    /// Memory, MiB.
    pub memory_mib: u64,
}

/// Longest progress line kept.
const MAX_STEP: usize = 200;

/// Makes the image of template `name` with `recipe`, then builds the template; progress and
/// failure go to the node's record of the preparation (and stderr).
async fn prepare(node: Node, config: HostConfig, name: String, recipe: Recipe) {
    let started = Instant::now();
    let path = match &recipe.image {
        ImageSource::Built(path) => path.clone(),
        ImageSource::Recipe(program, args) => match make_image(&node, &name, program, args).await {
            Some(path) => path,
            None => return,
        },
    };
    node.preparing_step(&name, "booting it once to snapshot the template");
    let config = HostConfig {
        stock_templates: Vec::new(),
        ..config
    };
    let spec = StockSpec {
        vcpus: recipe.vcpus,
        memory_mib: recipe.memory_mib,
    };
    match build_stock_as(&node, &config, &name, &path, spec).await {
        Ok(()) => {
            node.prepared(&name);
            eprintln!(
                "[up] template {name} prepared ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
        }
        Err(e) => {
            let why = format!("{e:#}");
            eprintln!("[up] template {name}: {why}");
            node.preparing_failed(&name, why);
        }
    }
}

/// Runs the image recipe `program args` of template `name`; the image's path, or `None` when
/// it failed (recorded in the node's preparation).
async fn make_image(
    node: &Node,
    name: &str,
    program: &std::path::Path,
    args: &[String],
) -> Option<PathBuf> {
    use tokio::io::AsyncBufReadExt as _;
    eprintln!(
        "[up] preparing template {name} in the background: {} {}",
        program.display(),
        args.join(" ")
    );
    node.preparing_step(name, "building its root image");
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let why = format!("starting {}: {e}", program.display());
            eprintln!("[up] template {name}: {why}");
            node.preparing_failed(name, why);
            return None;
        }
    };
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        node.preparing_failed(name, "the recipe's output could not be read");
        return None;
    };
    let progress = {
        let (node, name) = (node.clone(), name.to_owned());
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            let mut last = String::new();
            while let Ok(Some(line)) = lines.next_line().await {
                let step: String = line
                    .trim()
                    .trim_start_matches("[image]")
                    .trim()
                    .chars()
                    .take(MAX_STEP)
                    .collect();
                if !step.is_empty() {
                    node.preparing_step(&name, step.clone());
                    last = step;
                }
            }
            last
        })
    };
    let mut out = String::new();
    {
        use tokio::io::AsyncReadExt as _;
        let mut stdout = stdout.take(64 << 10);
        if let Err(e) = stdout.read_to_string(&mut out).await {
            tracing::warn!(error = %e, "reading the recipe's output");
        }
    }
    let status = child.wait().await;
    let last = progress.await.unwrap_or_default();
    let path = PathBuf::from(out.lines().last().map(str::trim).unwrap_or(""));
    match status {
        Ok(s) if s.success() && path.is_file() => Some(path),
        Ok(s) => {
            let why = format!("the image recipe ended with {s}: {last}");
            eprintln!("[up] template {name}: {why}");
            node.preparing_failed(name, why);
            None
        }
        Err(e) => {
            node.preparing_failed(name, format!("waiting for the image recipe: {e}"));
            None
        }
    }
}

/// The shape a stock template is built with.
#[derive(Debug, Clone, Copy)]
struct StockSpec {
    vcpus: u32,
    memory_mib: u64,
}

/// Builds image `name` as template `name` version 1 when no build of it exists.
async fn build_stock(
    node: &Node,
    config: &HostConfig,
    name: &str,
    rootfs: &std::path::Path,
) -> anyhow::Result<()> {
    let spec = StockSpec {
        vcpus: space_control::api::templates::DEFAULT_TEMPLATE_VCPUS,
        memory_mib: space_control::api::templates::DEFAULT_TEMPLATE_MEMORY_MIB,
    };
    build_stock_as(node, config, name, rootfs, spec).await
}

/// [`build_stock`] with the shape `spec`.
async fn build_stock_as(
    node: &Node,
    config: &HostConfig,
    name: &str,
    rootfs: &std::path::Path,
    spec: StockSpec,
) -> anyhow::Result<()> {
    let tname: TemplateName = name.parse()?;
    match node.template(&tname, &VersionReq::Latest) {
        Ok(_) => return Ok(()),
        Err(NodeError::TemplateNotFound(_) | NodeError::TemplateNotReady(_)) => {}
        Err(e) => return Err(e).with_context(|| format!("looking up template {name}")),
    }
    // A node on a new disk over an existing store: the build its archived sandboxes were
    // made from is the store's, not a new one.
    let tref = TemplateRef::new(name, "1")?;
    if node.archive().is_some() {
        match node.fetch_template(&tref).await {
            Ok(Some(_)) => {
                eprintln!("[up] template {tref} fetched from the object store");
                return Ok(());
            }
            Ok(None) => {}
            Err(e) => eprintln!("[up] template {tref} not fetched from the object store: {e}"),
        }
    }
    eprintln!(
        "[up] building template {name} from {} ...",
        rootfs.display()
    );
    let started = Instant::now();
    let t = node
        .build_template(TemplateSpec {
            template: tref,
            kernel: config.kernel.clone(),
            rootfs: rootfs.to_owned(),
            vcpus: spec.vcpus,
            memory_mib: spec.memory_mib,
            kernel_cmdline: None,
            ready_timeout: config.node.ready_timeout,
            guest: Default::default(),
            start: None,
            source: String::new(),
        })
        .await
        .with_context(|| format!("building template {name}"))?;
    eprintln!(
        "[up] template {name} {} ready ({:.1} s)",
        t.manifest.template.version,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
