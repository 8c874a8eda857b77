//! The server roles: `space up` (API and node in one process), `space node` (a node,
//! alone or joined to a control plane) and `space control` (a control replica).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use space_archive::StoreConfig;
use space_control::archive::ArchiveSettings;
use space_control::server::{
    Server, ServerConfig, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_UPLOAD_BYTES,
};
use space_node::{Node, NodeConfig, PoolConfig, TemplateName};

use crate::cli::{ControlArgs, NodeArgs, UpArgs};
use crate::config::{self, ConfigFile};

/// Parses the `--image NAME=PATH` arguments and adds the defaults from the environment.
fn images(args: &[String]) -> Result<BTreeMap<String, PathBuf>> {
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
        for (name, var) in [
            ("minimal", "SPACE_ROOTFS_MINIMAL"),
            ("base", "SPACE_ROOTFS_BASE"),
        ] {
            if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                images.insert(name.to_owned(), PathBuf::from(p));
            }
        }
    }
    if images.is_empty() {
        bail!(
            "no root images: pass --image NAME=PATH or set SPACE_ROOTFS_MINIMAL (`make up` \
             builds the images and sets it)"
        );
    }
    for (name, path) in &images {
        if !path.is_file() {
            bail!("image {name}: {} does not exist", path.display());
        }
    }
    Ok(images)
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
    if !a.kernel.is_file() {
        bail!(
            "the kernel {} does not exist (`make up` builds it and sets SPACE_KERNEL)",
            a.kernel.display()
        );
    }
    let images = images(&a.images)?;
    let archive = archive_settings(
        &a.archive,
        Some(StoreConfig::Local(a.data_dir.join("objects"))),
    )?;
    let templates = match a.templates {
        Some(t) => t.into_iter().filter(|t| !t.is_empty()).collect(),
        None => images.keys().cloned().collect::<Vec<_>>(),
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
    for root in &a.extra_roots {
        if !root.is_file() {
            bail!("--extra-root {} does not exist", root.display());
        }
    }
    // The secret source and the audit sink of the gateway come from the server (the vault
    // lives there); the extra roots are for upstreams with a private CA.
    node.gateway.extra_roots = a.extra_roots.clone();
    let cfg = ServerConfig {
        node,
        listen: a.listen,
        kernel: a.kernel.clone(),
        images,
        stock_templates: templates.clone(),
        guestd: std::env::var_os("SPACE_GUESTD").map(PathBuf::from),
        max_upload_bytes: a.max_upload.unwrap_or(DEFAULT_MAX_UPLOAD_BYTES),
        max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        archive,
        database: None,
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
    let server = Server::start(cfg).await.context("starting the server")?;
    let url = server.url();
    let config_path = config::config_path()?;
    match server.bootstrap_key() {
        Some(key) => {
            let saved = save_config(&config_path, &url, Some(key));
            println!("space is up at {url}");
            println!();
            println!("Admin API key (shown only this once; keep it safe):");
            println!();
            println!("    {key}");
            println!();
            match saved {
                Ok(()) => println!(
                    "Saved with the URL in {} (mode 0600): the `space` CLI works right away.",
                    config_path.display()
                ),
                Err(e) => eprintln!(
                    "space: could not save the CLI config in {}: {e:#}; set SPACE_URL and \
                     SPACE_API_KEY instead",
                    config_path.display()
                ),
            }
        }
        None => {
            if let Err(e) = save_config(&config_path, &url, None) {
                eprintln!("space: could not update {}: {e:#}", config_path.display());
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

/// Writes the URL (and the key, when given) into the CLI config file, keeping what else it
/// holds: a later start does not erase the key the first one saved.
fn save_config(path: &Path, url: &str, key: Option<&str>) -> Result<()> {
    let mut file = config::read(path).unwrap_or_default();
    if key.is_none() && file == ConfigFile::default() && !path.exists() {
        // Nothing to keep and no key to give: a file with only a URL helps nobody.
        return Ok(());
    }
    file.url = Some(url.to_owned());
    if let Some(k) = key {
        file.api_key = Some(k.to_owned());
    }
    config::write(path, &file)
}

/// `space node`: the node services, joined to a control plane with `--control` (serving the
/// node API over mutual TLS) or alone; until Ctrl-C or SIGTERM.
pub async fn node(a: NodeArgs) -> Result<()> {
    let mut cfg = NodeConfig::new(&a.data_dir);
    if let Some(n) = a.pool_size {
        pool_size(&mut cfg.pools, n, &[])?;
    }
    // A member's gateway injects the values the control plane sends, kept in memory.
    let secrets = std::sync::Arc::new(space_node::settings::SecretValues::default());
    if a.control.is_some() {
        cfg.gateway.secrets = Some(secrets.clone());
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
    let result = member(&a, &node, control, secrets).await;
    node.shutdown_detach().await;
    result
}

async fn member(
    a: &NodeArgs,
    node: &Node,
    control: String,
    secrets: std::sync::Arc<space_node::settings::SecretValues>,
) -> Result<()> {
    let images = if a.images.is_empty() && std::env::var_os("SPACE_ROOTFS_MINIMAL").is_none() {
        BTreeMap::new()
    } else {
        images(&a.images)?
    };
    let kernel = a.kernel.clone().unwrap_or_default();
    let local = space_node::LocalNode::new(node.clone(), kernel.clone(), images.clone())
        .with_guestd(std::env::var_os("SPACE_GUESTD").map(PathBuf::from))
        .with_secrets(secrets);
    // Stock templates: built once in the cluster, from this node's images.
    let mut builds = Vec::new();
    if kernel.is_file() {
        for name in images.keys() {
            let _: TemplateName = name
                .parse()
                .map_err(|e| anyhow::anyhow!("image name {name:?}: {e}"))?;
            builds.push(space_node::api::TemplateBuild::stock(
                space_node::TemplateRef::new(name, "1")?,
                name,
                space_control::api::templates::DEFAULT_TEMPLATE_VCPUS,
                space_control::api::templates::DEFAULT_TEMPLATE_MEMORY_MIB,
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
        let good = images(&[format!("x={}", img.display())]);
        let missing = images(&[format!("y={}", dir.join("nope").display())]);
        let malformed = images(&["novalue".into()]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(good.unwrap().get("x"), Some(&img));
        assert!(missing.unwrap_err().to_string().contains("does not exist"));
        assert!(malformed.is_err());
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
