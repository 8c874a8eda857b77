//! The server roles: `space up` (API and node in one process), `space node` (a node,
//! alone or joined to a control plane) and `space control` (a control replica).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use space::host::{Host, HostConfig, ImageSource, Recipe, DESKTOP_MEMORY_MIB, DESKTOP_VCPUS};
use space_archive::StoreConfig;
use space_control::archive::ArchiveSettings;
use space_control::server::{ServerConfig, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_UPLOAD_BYTES};
use space_node::{Node, NodeConfig, PoolConfig, TemplateName};

use crate::artifacts::Artifacts;
use crate::cli::{ControlArgs, NodeArgs, PurgeArgs, UpArgs};
use crate::config;

/// `space up`'s data directory when none is given.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/space";

/// Parses the `--image NAME=PATH` arguments; without any, the images of the artifacts
/// record, each replaced (or joined) by the environment's (`SPACE_ROOTFS_MINIMAL`,
/// `SPACE_ROOTFS_BASE`, `SPACE_ROOTFS_DESKTOP`).
fn images(args: &[String], recorded: &Artifacts) -> Result<BTreeMap<String, PathBuf>> {
    let mut images = BTreeMap::new();
    for a in args {
        let Some((name, path)) = a.split_once('=') else {
            bail!("--image {a:?} is not NAME=PATH");
        };
        if name.is_empty() || path.is_empty() {
            bail!("--image {a:?} is not NAME=PATH");
        }
        images.insert(name.to_owned(), PathBuf::from(path));
    }
    if args.is_empty() {
        // The record's images, each replaced (or joined) by the environment's.
        images = recorded.images();
        for (name, var) in [
            ("minimal", "SPACE_ROOTFS_MINIMAL"),
            ("base", "SPACE_ROOTFS_BASE"),
            ("desktop", "SPACE_ROOTFS_DESKTOP"),
        ] {
            if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                images.insert(name.to_owned(), PathBuf::from(p));
            }
        }
    }
    if images.is_empty() {
        bail!("no root images: {}", crate::artifacts::how_to_build());
    }
    for (name, path) in &images {
        if !path.is_file() {
            bail!("image {name}: {} does not exist", path.display());
        }
    }
    Ok(images)
}

/// The template of the desktop image (`docs/guest.md`).
const DESKTOP: &str = "desktop";
/// About how long a cold desktop image takes (packages downloaded and installed).
const DESKTOP_EXPECTED: std::time::Duration = std::time::Duration::from_secs(8 * 60);

/// How `space up` gets its `desktop` template: from the image when it exists, else from the
/// recorded recipe with the recorded `space-guestd`; nothing when neither is there.
fn desktop_recipe(
    images: &BTreeMap<String, PathBuf>,
    recorded: &Artifacts,
) -> BTreeMap<String, Recipe> {
    let image = match (images.get(DESKTOP), &recorded.recipe, recorded.guestd()) {
        (Some(path), _, _) => ImageSource::Built(path.clone()),
        (None, Some(recipe), Some(guestd)) if recipe.is_file() => ImageSource::Recipe(
            recipe.clone(),
            vec![DESKTOP.to_owned(), guestd.display().to_string()],
        ),
        _ => return BTreeMap::new(),
    };
    BTreeMap::from([(
        DESKTOP.to_owned(),
        Recipe {
            image,
            expected: DESKTOP_EXPECTED,
            vcpus: DESKTOP_VCPUS,
            memory_mib: DESKTOP_MEMORY_MIB,
        },
    )])
}

/// Sets the pool size of every stock template (and of any other) to `n`.
fn pool_size(pools: &mut PoolConfig, n: usize, templates: &[String]) -> Result<()> {
    for name in space_node::pool::STOCK_TEMPLATES
        .iter()
        .map(|s| s.to_string())
        .chain(templates.iter().cloned())
    {
        let name: TemplateName = name
            .parse()
            .map_err(|e| anyhow::anyhow!("template name {name:?}: {e}"))?;
        pools.sizes.insert(name, n);
    }
    pools.default_size = n;
    Ok(())
}

/// How far the pools follow demand: their ceiling and the window of creates that sizes them.
fn pool_demand(pools: &mut PoolConfig, max: Option<usize>, window: Option<u64>) -> Result<()> {
    if let Some(n) = max {
        pools.ceiling = n;
    }
    if let Some(secs) = window {
        anyhow::ensure!(
            (1..=86_400).contains(&secs),
            "--pool-window {secs}: between 1 and 86400 seconds"
        );
        pools.window = std::time::Duration::from_secs(secs);
    }
    Ok(())
}

/// The object store settings: `default` unless told otherwise (`None`: no store).
fn archive_settings(
    a: &crate::cli::ArchiveArgs,
    default: Option<StoreConfig>,
) -> Result<Option<ArchiveSettings>> {
    let store = match a.object_store.as_deref() {
        Some("none") => return Ok(None),
        Some(s) => StoreConfig::parse(s).map_err(|e| anyhow::anyhow!("--object-store: {e}"))?,
        None => match default {
            Some(d) => d,
            None => return Ok(None),
        },
    };
    let mut s = ArchiveSettings::new(store);
    s.master_key_file = a.master_key_file.clone();
    s.cache_max_bytes = a.cache_max;
    if let Some(secs) = a.upload_interval {
        s.upload_interval = (secs > 0).then(|| std::time::Duration::from_secs(secs));
    }
    Ok(Some(s))
}

/// Where the host's locally added CA certificates are: `$SPACE_HOST_CA_DIR`, else Debian's
/// (and Ubuntu's) `/usr/local/share/ca-certificates`.
fn host_ca_dir() -> PathBuf {
    std::env::var_os("SPACE_HOST_CA_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/local/share/ca-certificates"))
}

/// The `*.crt` files under `dir` (and its subdirectories, as `update-ca-certificates` reads
/// them), sorted.
fn crt_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "crt") && p.is_file() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The operator's network: the CAs sandboxes trust (`--guest-ca`, by default the host's
/// locally added ones) and the host's HTTP proxy for upstreams (`HTTPS_PROXY`, `NO_PROXY`).
fn corporate_network(gateway: &mut space_gateway::GatewayConfig, given: &[PathBuf]) -> Result<()> {
    let cas = if given.iter().any(|p| p.as_os_str() == "none") {
        if given.len() > 1 {
            bail!("--guest-ca none cannot be combined with other --guest-ca files");
        }
        Vec::new()
    } else if given.is_empty() {
        crt_files(&host_ca_dir())
    } else {
        for p in given {
            if !p.is_file() {
                bail!("--guest-ca {} does not exist", p.display());
            }
        }
        given.to_vec()
    };
    if !cas.is_empty() {
        eprintln!(
            "space: sandboxes trust these CAs besides the deployment's: {}",
            cas.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    gateway.guest_cas = cas;
    gateway.upstream_proxy = space_gateway::upstream::Proxy::from_env()
        .map_err(|e| anyhow::anyhow!("HTTPS_PROXY: {e}"))?;
    if let Some(p) = &gateway.upstream_proxy {
        eprintln!(
            "space: the gateway reaches upstreams through the proxy {} ({} NO_PROXY entries)",
            p.authority,
            p.bypass.len()
        );
    }
    Ok(())
}

/// Waits for Ctrl-C or SIGTERM.
async fn stop_signal() -> Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("watching for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("watching for SIGINT")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// `space up`.
pub async fn up(a: UpArgs) -> Result<()> {
    let recorded = crate::artifacts::load()?;
    let kernel = recorded.kernel(a.kernel.clone())?;
    let images = images(&a.images, &recorded)?;
    let archive = archive_settings(
        &a.archive,
        Some(StoreConfig::Local(a.data_dir.join("objects"))),
    )?;
    // Without --templates: every image's template, `desktop` prepared in the background
    // (from its image, or from the recipe when the image was never built) so that the start
    // does not wait for it.
    // Named in --templates, `desktop` is prepared in the background too (with its shape).
    let named_desktop = a
        .templates
        .as_ref()
        .is_some_and(|t| t.iter().any(|n| n == DESKTOP));
    let prepare = match (&a.templates, a.no_desktop) {
        (None, false) => desktop_recipe(&images, &recorded),
        (Some(_), _) if named_desktop => desktop_recipe(&images, &recorded),
        _ => BTreeMap::new(),
    };
    if named_desktop && prepare.is_empty() {
        bail!("--templates names desktop, but there is no desktop image (scripts/artifacts.sh desktop builds it)");
    }
    let templates = match a.templates {
        Some(t) => t
            .into_iter()
            .filter(|t| !t.is_empty() && t != DESKTOP)
            .collect(),
        None => images
            .keys()
            .filter(|n| !prepare.contains_key(*n) && *n != DESKTOP)
            .cloned()
            .collect::<Vec<_>>(),
    };
    for t in &templates {
        if !images.contains_key(t) {
            bail!(
                "--templates names {t:?}, but there is no image of that name (images: {})",
                images.keys().cloned().collect::<Vec<_>>().join(", ")
            );
        }
    }
    let mut node = NodeConfig::new(&a.data_dir);
    if let Some(n) = a.pool_size {
        pool_size(&mut node.pools, n, &templates)?;
    }
    pool_demand(&mut node.pools, a.pool_max, a.pool_window)?;
    if let Some(p) = a.memory_overcommit {
        node.admission.overcommit_percent = p;
    }
    if let Some(mib) = a.disk_reserve {
        node.admission.disk_reserve_mib = mib;
    }
    if let Some(secs) = a.metrics_interval {
        node.metrics_tick = (secs > 0).then(|| std::time::Duration::from_secs(secs));
    }
    for root in &a.extra_roots {
        if !root.is_file() {
            bail!("--extra-root {} does not exist", root.display());
        }
    }
    // The secret source and the audit sink of the gateway come from the server (the vault
    // lives there); the extra roots are for upstreams with a private CA.
    node.gateway.extra_roots = a.extra_roots.clone();
    corporate_network(&mut node.gateway, &a.guest_cas)?;
    let cfg = HostConfig {
        server: ServerConfig {
            listen: a.listen,
            max_upload_bytes: a.max_upload.unwrap_or(DEFAULT_MAX_UPLOAD_BYTES),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            archive,
            database: None,
            tls: match a.tls.pair() {
                Some(pair) => space_control::listen::TlsSettings {
                    cert: Some(pair),
                    ..Default::default()
                },
                None => ServerConfig::new(&a.data_dir).tls,
            },
            ..ServerConfig::new(&a.data_dir)
        },
        node,
        kernel,
        images,
        stock_templates: templates.clone(),
        prepare,
        guestd: recorded.guestd(),
        node_over_network: false,
    };
    eprintln!(
        "space: starting on {} with data in {} (stock templates: {})",
        a.listen,
        a.data_dir.display(),
        if templates.is_empty() {
            "none".to_owned()
        } else {
            templates.join(", ")
        }
    );
    let server = Host::start(cfg).await.context("starting the server")?;
    let url = server.url();
    let config_path = config::config_path()?;
    let profile = deployment_profile(&a.data_dir);
    match server.bootstrap_key() {
        Some(key) => {
            let saved = save_config(&config_path, &profile, &url, Some(key));
            println!("space is up at {url}");
            println!();
            println!("Admin API key (shown only this once; keep it safe):");
            println!();
            println!("    {key}");
            println!();
            match saved {
                Ok(current) => println!(
                    "Saved with the URL in {} (mode 0600): {}.",
                    config_path.display(),
                    profile_hint(&profile, current)
                ),
                Err(e) => eprintln!(
                    "space: could not save the CLI config in {}: {e:#}; set SPACE_URL and \
                     SPACE_API_KEY instead",
                    config_path.display()
                ),
            }
        }
        None => {
            match save_config(&config_path, &profile, &url, None) {
                Ok(current) => {
                    if !current {
                        println!("The CLI reaches it {}.", profile_hint(&profile, false));
                    }
                }
                Err(e) => eprintln!("space: could not update {}: {e:#}", config_path.display()),
            }
            println!("space is up at {url}");
            println!(
                "The admin API key was shown on the first start (the CLI config {} holds it \
                 if that start saved it there).",
                config_path.display()
            );
        }
    }
    let sig = stop_signal().await?;
    eprintln!("space: {sig}: stopping (sandboxes keep running and are adopted on the next start)");
    server.shutdown().await;
    eprintln!("space: stopped");
    Ok(())
}

/// The CLI profile a deployment on `data_dir` is saved as: `--profile` when given, else
/// `default` for the default data directory, else the directory's path as a name
/// (`/srv/space/b` is `srv-space-b`).
fn deployment_profile(data_dir: &Path) -> String {
    if let Some(p) = config::chosen_profile() {
        return p;
    }
    if data_dir == Path::new(DEFAULT_DATA_DIR) {
        return config::DEFAULT_PROFILE.to_owned();
    }
    let flat: String = data_dir
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| match c {
            '/' => '-',
            c if c.is_ascii_alphanumeric() || "._-".contains(c) => c,
            _ => '_',
        })
        .collect();
    // The end of a long path tells deployments apart better than its start.
    let start = flat.len().saturating_sub(64);
    let name = flat[start..].trim_start_matches(['-', '.']).to_owned();
    if config::is_profile_name(&name) {
        name
    } else {
        config::DEFAULT_PROFILE.to_owned()
    }
}

/// Saves the URL (and the key, when given) as profile `name` of the CLI config file, keeping
/// everything else it holds: a later start does not erase the key the first one saved, and
/// another deployment's profile is left alone. The profile becomes the current one when the
/// file held no other. Answers whether it is the current profile.
fn save_config(path: &Path, name: &str, url: &str, key: Option<&str>) -> Result<bool> {
    let mut file = config::read(path).unwrap_or_default();
    if key.is_none()
        && file
            .profile(name)
            .is_none_or(|p| p.url.is_none() && p.api_key.is_none())
    {
        // Nothing to keep and no key to give: a profile with only a URL helps nobody.
        return Ok(false);
    }
    let first = file.is_empty();
    file.set_profile(
        name,
        config::Profile {
            url: Some(url.to_owned()),
            api_key: key.map(str::to_owned),
        },
    );
    if first && name != config::DEFAULT_PROFILE {
        file.current = Some(name.to_owned());
    }
    let current = file.current.as_deref().unwrap_or(config::DEFAULT_PROFILE) == name;
    config::write(path, &file)?;
    Ok(current)
}

/// Tells how the CLI reaches profile `name`.
fn profile_hint(name: &str, current: bool) -> String {
    if current {
        format!("the `space` CLI works right away (profile {name})")
    } else {
        format!(
            "as profile {name}: `space --profile {name} ...` or SPACE_PROFILE={name} \
             (`space profile use {name}` makes it the default)"
        )
    }
}

/// `space purge`: stops the deployment on a data directory and deletes everything of it.
pub async fn purge(a: PurgeArgs) -> Result<()> {
    use space_node::teardown;
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    let data = std::path::absolute(&a.data_dir)
        .with_context(|| format!("resolving {}", a.data_dir.display()))?;
    if data.parent().is_none() || !data.exists() {
        bail!("{} is not a data directory of space", data.display());
    }
    // Only a directory space made: it has the node's layout (or is its loop mount).
    let ours = ["sandboxes", "templates", "state", "node.json"]
        .iter()
        .any(|p| data.join(p).exists())
        || teardown::is_mount_point(&data);
    if !ours {
        bail!(
            "{} holds no sandboxes, templates or state of space: not deleting it",
            data.display()
        );
    }
    let vms = teardown::vms_of(&data).len();
    if !a.yes {
        if !std::io::stdin().is_terminal() {
            bail!(
                "purging deletes {} for good: pass --yes to confirm",
                data.display()
            );
        }
        eprint!(
            "This stops the deployment on {} and deletes its sandboxes ({vms} VMs running), \
             snapshots, templates and state for good.\nType the directory's path to confirm: ",
            data.display()
        );
        std::io::stderr().flush().ok();
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
        if line.trim() != data.to_string_lossy() {
            bail!("not confirmed: nothing was deleted");
        }
    }
    if let Some((pid, cmdline)) = teardown::server_of(&data) {
        eprintln!("space purge: stopping the server using it (pid {pid}: {cmdline})");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while teardown::server_of(&data).is_some() {
            if std::time::Instant::now() > deadline {
                bail!("the server (pid {pid}) did not stop within 60 s: nothing was deleted");
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    let done = tokio::task::spawn_blocking(move || teardown::purge(&data))
        .await
        .context("the purge task")??;
    eprintln!(
        "space purge: {} VMs killed, {} control groups removed, {} subvolumes deleted{}",
        done.vms_killed,
        done.cgroups_removed,
        done.subvolumes_deleted,
        match &done.image_removed {
            Some(i) => format!(", image {} unmounted and deleted", i.display()),
            None => String::new(),
        }
    );
    // The deployment's CLI profile goes with it.
    let name = deployment_profile(&a.data_dir);
    if let Ok(path) = config::config_path() {
        if let Ok(mut file) = config::read(&path) {
            if name != config::DEFAULT_PROFILE && file.profiles.remove(&name).is_some() {
                if file.current.as_deref() == Some(name.as_str()) {
                    file.current = None;
                }
                if config::write(&path, &file).is_ok() {
                    eprintln!("space purge: CLI profile {name} removed");
                }
            }
        }
    }
    println!("purged {}", a.data_dir.display());
    Ok(())
}

/// `space node`: the node services, joined to a control plane with `--control` (serving the
/// node API over mutual TLS) or alone; until Ctrl-C or SIGTERM.
pub async fn node(a: NodeArgs) -> Result<()> {
    let mut cfg = NodeConfig::new(&a.data_dir);
    if let Some(n) = a.pool_size {
        pool_size(&mut cfg.pools, n, &[])?;
    }
    pool_demand(&mut cfg.pools, a.pool_max, a.pool_window)?;
    if let Some(p) = a.memory_overcommit {
        cfg.admission.overcommit_percent = p;
    }
    if let Some(mib) = a.disk_reserve {
        cfg.admission.disk_reserve_mib = mib;
    }
    if let Some(secs) = a.metrics_interval {
        cfg.metrics_tick = (secs > 0).then(|| std::time::Duration::from_secs(secs));
    }
    corporate_network(&mut cfg.gateway, &a.guest_cas)?;
    // A member's gateway injects the values the control plane sends, kept in memory.
    let secrets = std::sync::Arc::new(space_node::settings::SecretValues::default());
    // And audits what it decides to a spool on its disk, which the member delivers to the
    // control plane's audit log.
    let spool = space_node::audit_spool::EgressSpool::new(
        a.data_dir
            .join("state")
            .join(space_node::audit_spool::SPOOL_DIR),
    );
    if a.control.is_some() {
        cfg.gateway.secrets = Some(secrets.clone());
        cfg.gateway.audit = Some(spool.clone());
    }
    eprintln!("space node: opening {}", a.data_dir.display());
    let node = Node::open(cfg).await.context("opening the node")?;
    let sandboxes = node.list().await.map(|l| l.len()).unwrap_or(0);
    let Some(control) = a.control.clone() else {
        eprintln!(
            "space node: running alone ({sandboxes} sandboxes recovered; timeouts, warm pools \
             and rolling snapshots active); give it --control URL to serve a control plane"
        );
        let sig = stop_signal().await?;
        eprintln!(
            "space node: {sig}: stopping (VMs keep running and are adopted on the next start)"
        );
        node.shutdown_detach().await;
        return Ok(());
    };
    if let Err(e) = spool.open() {
        node.shutdown_detach().await;
        return Err(e).context("opening the egress audit spool");
    }
    let result = member(&a, &node, control, secrets, spool).await;
    node.shutdown_detach().await;
    result
}

async fn member(
    a: &NodeArgs,
    node: &Node,
    control: String,
    secrets: std::sync::Arc<space_node::settings::SecretValues>,
    spool: std::sync::Arc<space_node::audit_spool::EgressSpool>,
) -> Result<()> {
    let recorded = crate::artifacts::load()?;
    let images = if a.images.is_empty()
        && std::env::var_os("SPACE_ROOTFS_MINIMAL").is_none()
        && recorded.images().is_empty()
    {
        BTreeMap::new()
    } else {
        images(&a.images, &recorded)?
    };
    let kernel = a
        .kernel
        .clone()
        .or_else(|| recorded.kernel.clone())
        .unwrap_or_default();
    let local = space_node::LocalNode::new(node.clone(), kernel.clone(), images.clone())
        .with_guestd(recorded.guestd())
        .with_secrets(secrets);
    // Stock templates: built once in the cluster, from this node's images.
    let mut builds = Vec::new();
    if kernel.is_file() {
        for name in images.keys() {
            let _: TemplateName = name
                .parse()
                .map_err(|e| anyhow::anyhow!("image name {name:?}: {e}"))?;
            let (vcpus, memory_mib) = if name == DESKTOP {
                (DESKTOP_VCPUS, DESKTOP_MEMORY_MIB)
            } else {
                (
                    space_control::api::templates::DEFAULT_TEMPLATE_VCPUS,
                    space_control::api::templates::DEFAULT_TEMPLATE_MEMORY_MIB,
                )
            };
            builds.push(space_node::api::TemplateBuild::stock(
                space_node::TemplateRef::new(name, "1")?,
                name,
                vcpus,
                memory_mib,
            ));
        }
    }
    let node_id = match &a.node_id {
        Some(id) => id.clone(),
        None => std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_lowercase())
            .unwrap_or_default(),
    };
    if !space_control::store::is_node_id(&node_id) {
        bail!("node id {node_id:?} is not a DNS label ([a-z0-9-], up to 63); pass --node-id");
    }
    let listen = match a.listen {
        Some(l) => l,
        None => {
            let port = a
                .advertise
                .rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .context("--advertise must be host:port")?;
            std::net::SocketAddr::from(([0, 0, 0, 0], port))
        }
    };
    let member = space_node::member::Member::start(
        local,
        &a.data_dir,
        space_node::member::MemberConfig {
            control: control.clone(),
            join_token: a.join_token.clone(),
            node_id: node_id.clone(),
            advertise: a.advertise.clone(),
            listen,
            egress: Some(spool),
        },
    )
    .await
    .context("joining the cluster")?;
    eprintln!(
        "space node: {node_id} is a member of {control} (incarnation {}); node API on {}",
        member.incarnation(),
        member.local_addr()
    );
    if !member.settled(std::time::Duration::from_secs(30)).await {
        eprintln!("space node: no settings from the control plane yet; templates are built here");
    }
    eprintln!(
        "space node: stock templates ({}) ...",
        builds
            .iter()
            .map(|b| b.template.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    member
        .provide_templates(builds)
        .await
        .context("the stock templates")?;
    eprintln!("space node: ready");
    let sig = stop_signal().await?;
    eprintln!("space node: {sig}: stopping (VMs keep running and are adopted on the next start)");
    member.stop().await;
    Ok(())
}

/// `space control`: a control replica over a database and the nodes that joined it.
pub async fn control(a: ControlArgs) -> Result<()> {
    let vault_key = space_control::vault::VaultKey::from_hex(&a.vault_key)
        .map_err(|e| anyhow::anyhow!("--vault-key: {e}"))?;
    let replica = space_control::replica::Replica::start(space_control::replica::ReplicaConfig {
        database: a.database.clone(),
        listen: a.listen,
        vault_key,
        max_upload_bytes: a.max_upload.unwrap_or(DEFAULT_MAX_UPLOAD_BYTES),
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        ready_timeout: std::time::Duration::from_secs(120),
        archive: archive_settings(&a.archive, None)?,
        tls: space_control::listen::TlsSettings {
            cert: a.tls.pair(),
            ..Default::default()
        },
    })
    .await
    .context("starting the control replica")?;
    println!("space control is up at {}", replica.url());
    if let Some(key) = replica.bootstrap_key() {
        println!();
        println!("Admin API key of the deployment (shown only this once; keep it safe):");
        println!();
        println!("    {key}");
        println!();
    }
    println!("Add nodes with a token from `space node token`.");
    let sig = stop_signal().await?;
    eprintln!("space control: {sig}: stopping");
    replica.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_arguments_parse_and_must_exist() {
        let dir = std::env::temp_dir().join(format!("space-up-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("x.ext4");
        std::fs::write(&img, b"x").unwrap();
        let good = images(&[format!("x={}", img.display())], &Artifacts::default());
        let missing = images(
            &[format!("y={}", dir.join("nope").display())],
            &Artifacts::default(),
        );
        let malformed = images(&["novalue".into()], &Artifacts::default());
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(good.unwrap().get("x"), Some(&img));
        assert!(missing.unwrap_err().to_string().contains("does not exist"));
        assert!(malformed.is_err());
    }

    #[test]
    fn deployments_get_profiles_of_their_own_and_the_first_stays_current() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        assert_eq!(deployment_profile(Path::new(DEFAULT_DATA_DIR)), "default");
        let b = deployment_profile(Path::new("/srv/space b/data"));
        assert_eq!(b, "srv-space_b-data");
        assert!(save_config(&path, "default", "http://a", Some("ka")).unwrap());
        assert!(!save_config(&path, &b, "http://b", Some("kb")).unwrap());
        // A restart of b (no new key) keeps b's key, and a's profile stays as it was.
        assert!(!save_config(&path, &b, "http://b:2", None).unwrap());
        let file = config::read(&path).unwrap();
        assert_eq!(
            (file.url.as_deref(), file.api_key.as_deref()),
            (Some("http://a"), Some("ka"))
        );
        let pb = file.profile(&b).unwrap();
        assert_eq!(
            (pb.url.as_deref(), pb.api_key.as_deref()),
            (Some("http://b:2"), Some("kb"))
        );
        assert_eq!(file.current, None);
        // On an empty file the first deployment is the current one, whatever its name.
        let other = dir.path().join("other.json");
        assert!(save_config(&other, &b, "http://b", Some("kb")).unwrap());
        assert_eq!(
            config::read(&other).unwrap().current.as_deref(),
            Some(b.as_str())
        );
    }

    #[test]
    fn pool_size_covers_stock_and_named_templates() {
        let mut p = PoolConfig::default();
        pool_size(&mut p, 1, &["mine".into()]).unwrap();
        assert!(p.sizes.values().all(|&n| n == 1));
        assert!(p
            .sizes
            .contains_key(&"minimal".parse::<TemplateName>().unwrap()));
        assert!(p
            .sizes
            .contains_key(&"mine".parse::<TemplateName>().unwrap()));
        assert_eq!(p.default_size, 1);
    }
}
