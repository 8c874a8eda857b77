//! The command line's grammar.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The `space` command line.
#[derive(Debug, Parser)]
#[command(
    name = "space",
    version,
    about = "Sandboxes for AI agents, in microVMs",
    after_help = "Client commands read the server URL and key from SPACE_URL / SPACE_API_KEY, \
                  else from the config file that `space up` writes (see docs/cli.md)."
)]
pub struct Cli {
    /// Print exactly one JSON value instead of a table (client commands).
    #[arg(long, global = true)]
    pub json: bool,
    /// The deployment to talk to: a profile of the config file (`space profile ls`; also
    /// SPACE_PROFILE). `space up` saves its deployment under this name.
    #[arg(long, global = true, value_name = "NAME")]
    pub profile: Option<String>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the API server and a node in one process (the single-host setup).
    Up(UpArgs),
    /// Stop a deployment and delete its data for good: its VMs, control groups, snapshots,
    /// templates, state and the loop-mounted image (asks first unless --yes).
    Purge(PurgeArgs),
    /// Mint an admin key on the host, straight into the deployment's state database (with the
    /// server running or not): the way back in when every admin key is lost.
    AdminKey(AdminKeyArgs),
    /// Run a control replica: the API over a database and the nodes that joined it.
    Control(ControlArgs),
    /// Run a node (alone, or joined to a control plane with --control), or manage the
    /// cluster's nodes (`space node ls`, `token`, `drain`, `remove`).
    Node(NodeArgs),
    /// Manage templates.
    #[command(subcommand)]
    Template(TemplateCmd),
    /// Create a sandbox and print its id.
    Create(CreateArgs),
    /// List sandboxes.
    Ls(LsArgs),
    /// Show one sandbox.
    Info(IdArg),
    /// Run a command in a sandbox, streaming its output; exits with its exit code.
    Exec(ExecArgs),
    /// Open an interactive shell (or run a command) on a terminal in a sandbox.
    Shell(ShellArgs),
    /// Copy a file into or out of a sandbox (one side is ID:/path).
    Cp(CpArgs),
    /// Pause a sandbox (its vCPUs stop; memory stays).
    Pause(IdArg),
    /// Resume a paused sandbox.
    Resume(IdArg),
    /// Suspend a sandbox to disk (its VM exits; `restore` brings it back).
    Suspend(IdArg),
    /// Restore a suspended sandbox.
    Restore(IdArg),
    /// Terminate a sandbox (its record and snapshots stay).
    Kill(IdArg),
    /// Fork a sandbox: a new sandbox with a copy of its memory and disk.
    Fork(IdArg),
    /// Take a snapshot of a sandbox.
    Snapshot(SnapshotArgs),
    /// List a sandbox's snapshots, oldest first.
    Snapshots(IdArg),
    /// Roll a sandbox back to one of its snapshots.
    Rollback(RollbackArgs),
    /// Change a sandbox's timeouts.
    Timeout(TimeoutArgs),
    /// Print the end of a sandbox's serial console.
    Logs(LogsArgs),
    /// Print a sandbox's resource samples (CPU, memory, disk, traffic), oldest first.
    Metrics(MetricsArgs),
    /// A live table of the running sandboxes and what each uses now.
    Top(TopArgs),
    /// Show audit events, newest first.
    Audit(AuditArgs),
    /// Manage the tenant's volumes: file systems that outlive sandboxes.
    #[command(subcommand)]
    Volume(VolumeCmd),
    /// Manage the tenant's credentials vault (values are never shown again).
    #[command(subcommand)]
    Secret(SecretCmd),
    /// Show or change a sandbox's egress policy.
    Net(NetArgs),
    /// Expose a port of a sandbox at a public URL (prints the URL), or list exposed ports.
    Expose(ExposeArgs),
    /// Revoke the URL of an exposed port.
    Unexpose(UnexposeArgs),
    /// Start the sandbox's browser (Chromium) and print its DevTools URL (for Playwright's
    /// connect_over_cdp) and its live view.
    Browser(BrowserArgs),
    /// Serve the sandbox tools to an agent over MCP on stdin/stdout (with this CLI's URL and
    /// key); `docs/mcp.md` has the agent's configuration.
    Mcp(McpArgs),
    /// List the deployments the CLI knows (profiles of the config file) or pick the one used
    /// by default.
    #[command(subcommand)]
    Profile(ProfileCmd),
    /// Manage tenants (admin).
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Manage API keys (admin).
    #[command(subcommand)]
    Key(KeyCmd),
}

/// `space up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Where sandboxes, templates and the state database live.
    #[arg(long, default_value = "/var/lib/space")]
    pub data_dir: PathBuf,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The address the API listens on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// The guest kernel (uncompressed vmlinux) [default: the one `make artifacts` recorded
    /// in $SPACE_CACHE/artifacts.json, ~/.cache/space by default].
    #[arg(long, env = "SPACE_KERNEL")]
    pub kernel: Option<PathBuf>,
    /// A root image templates can be built from, as NAME=PATH (repeatable) [default:
    /// SPACE_ROOTFS_MINIMAL as `minimal` and SPACE_ROOTFS_BASE as `base`, else the images
    /// recorded in the artifacts file].
    #[arg(long = "image", value_name = "NAME=PATH")]
    pub images: Vec<String>,
    /// Stock templates to build when missing, comma-separated [default: one per image, and
    /// `desktop` prepared in the background].
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    pub templates: Option<Vec<String>>,
    /// Do not prepare the `desktop` template in the background.
    #[arg(long)]
    pub no_desktop: bool,
    /// Warm VMs kept ready per stock template even when nobody creates (the pools' floor) [default: 2].
    #[arg(long, value_name = "N")]
    pub pool_size: Option<usize>,
    /// The most warm VMs a template's pool grows to when creates come fast (0: pools keep
    /// exactly their floor) [default: 16, less when memory is short].
    #[arg(long, value_name = "N")]
    pub pool_max: Option<usize>,
    /// How far back, in seconds, the creates that size the pools count [default: 60].
    #[arg(long, value_name = "SECS")]
    pub pool_window: Option<u64>,
    /// Guest memory admitted against the host's, in percent: above 100 admits more guest RAM
    /// than the host has (guest RAM is a file the kernel can write back, so the risk is
    /// slowness when every guest uses all of it, not an out-of-memory kill) [default: 100].
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u64).range(50..=1000))]
    pub memory_overcommit: Option<u64>,
    /// Free space kept on the data disk, MiB: under it, creates, forks, restores and
    /// snapshots are refused (`503 disk_full`), since guests' RAM is a file there that grows
    /// as they touch it and a VM whose memory cannot grow dies (0: none) [default: 1024].
    #[arg(long, value_name = "MIB")]
    pub disk_reserve: Option<u64>,
    /// Seconds between resource samples of each running sandbox (`GET .../metrics`, `space
    /// top`; 0: no sampling) [default: 5].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub metrics_interval: Option<u64>,
    /// The largest file upload in bytes (default 1 GiB).
    #[arg(long, value_name = "BYTES")]
    pub max_upload: Option<u64>,
    /// A PEM file of CA certificates the gateway trusts for upstreams besides the system's
    /// (repeatable; for tests and private upstreams).
    #[arg(long = "extra-root", value_name = "PEM")]
    pub extra_roots: Vec<PathBuf>,
    /// A PEM file of CA certificates sandboxes trust (their system store and the usual
    /// variables) and the gateway trusts for upstreams, for a TLS-inspecting proxy or a
    /// private PKI (repeatable; `none`: only the deployment's own CA) [default: the host's
    /// locally added CAs, the *.crt files under /usr/local/share/ca-certificates].
    #[arg(long = "guest-ca", value_name = "PEM")]
    pub guest_cas: Vec<PathBuf>,
    /// The object store.
    #[command(flatten)]
    pub archive: ArchiveArgs,
}

/// Where sandboxes are archived, and with which key.
#[derive(Debug, Args)]
pub struct ArchiveArgs {
    /// Where suspended sandboxes are archived: a directory, `file:///path`, or
    /// `s3://bucket/prefix` (credentials, region and endpoint from AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL; an endpoint means path-style
    /// requests). `none` keeps snapshots on the nodes' disks only. Default for `space up`:
    /// `<data-dir>/objects`; for `space control`: none (a cluster's store must be one every
    /// node reaches; the control plane hands it to them).
    #[arg(long, env = "SPACE_OBJECT_STORE", value_name = "URL")]
    pub object_store: Option<String>,
    /// The deployment's master key file, which wraps every tenant key of the archive (made on
    /// first start; back it up away from the store). Default for `space up`:
    /// `<data-dir>/state/master.key`; for `space control`: a key made by the first replica
    /// and kept in the database, sealed by the vault key.
    #[arg(long, env = "SPACE_MASTER_KEY_FILE", value_name = "PATH")]
    pub master_key_file: Option<PathBuf>,
    /// Local copies of archived snapshots of suspended sandboxes are evicted past this many
    /// bytes (default: only when the disk runs low; 0: right after each upload).
    #[arg(long, value_name = "BYTES")]
    pub cache_max: Option<u64>,
    /// Seconds between uploads of a full snapshot of each running sandbox (default 60; 0:
    /// only on suspend and request).
    #[arg(long, value_name = "SECONDS")]
    pub upload_interval: Option<u64>,
}

/// TLS on the API listener (`docs/api.md`): the listener answers TLS and plain HTTP on one
/// port; the hosts of sandbox ports (`https://{port}-{id}.{domain}`) need the TLS.
#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// The certificate chain (PEM) the listener presents; default: leaves of the deployment
    /// CA (`space up`), served at /v1/tls/ca.pem.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The operator's certificate and key, when given.
    pub fn pair(&self) -> Option<(PathBuf, PathBuf)> {
        self.tls_cert.clone().zip(self.tls_key.clone())
    }
}

/// `space control`.
#[derive(Debug, Args)]
pub struct ControlArgs {
    #[command(flatten)]
    pub tls: TlsArgs,
    /// The state database: `postgres://user@host/db` (any number of replicas) or a SQLite
    /// file (one replica).
    #[arg(long, env = "SPACE_DATABASE", value_name = "URL")]
    pub database: String,
    /// The address the API listens on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// The vault key every replica shares, 64 hex digits (secrets and the cluster CA key are
    /// sealed with it).
    #[arg(
        long,
        env = "SPACE_VAULT_KEY",
        value_name = "HEX",
        hide_env_values = true
    )]
    pub vault_key: String,
    /// The largest file upload in bytes (default 1 GiB).
    #[arg(long, value_name = "BYTES")]
    pub max_upload: Option<u64>,
    /// The object store the nodes archive to.
    #[command(flatten)]
    pub archive: ArchiveArgs,
}

/// `space node`: the node role, or (with a subcommand) the cluster's nodes as an admin sees
/// them.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct NodeArgs {
    /// List, drain or remove nodes, or make a join token (admin); without one, run a node.
    #[command(subcommand)]
    pub cmd: Option<NodeCmd>,
    /// The node's data directory.
    #[arg(long, default_value = "/var/lib/space")]
    pub data_dir: PathBuf,
    /// The control plane to join (any replica's URL). Without it the node runs its services
    /// alone, with no API.
    #[arg(long, value_name = "URL")]
    pub control: Option<String>,
    /// The one-time token from `space node token` (needed on the first join only).
    #[arg(
        long,
        env = "SPACE_JOIN_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub join_token: Option<String>,
    /// The node's id in the cluster (a DNS label). Default: the host name.
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// The address control replicas reach this node's API at (`host:port`).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:7443")]
    pub advertise: String,
    /// Where the node API listens. Default: all addresses, the advertised port.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// The guest kernel, for stock template builds.
    #[arg(long, env = "SPACE_KERNEL")]
    pub kernel: Option<PathBuf>,
    /// A root image templates can be built from, as NAME=PATH (repeatable). Defaults:
    /// SPACE_ROOTFS_MINIMAL as `minimal`, SPACE_ROOTFS_BASE as `base`.
    #[arg(long = "image", value_name = "NAME=PATH")]
    pub images: Vec<String>,
    /// Warm VMs kept ready per stock template even when nobody creates (the pools' floor) (default: the node's).
    #[arg(long, value_name = "N")]
    pub pool_size: Option<usize>,
    /// The most warm VMs a template's pool grows to when creates come fast (0: pools keep
    /// exactly their floor) [default: 16, less when memory is short].
    #[arg(long, value_name = "N")]
    pub pool_max: Option<usize>,
    /// How far back, in seconds, the creates that size the pools count [default: 60].
    #[arg(long, value_name = "SECS")]
    pub pool_window: Option<u64>,
    /// Guest memory admitted against the host's, in percent: above 100 admits more guest RAM
    /// than the host has (guest RAM is a file the kernel can write back, so the risk is
    /// slowness when every guest uses all of it, not an out-of-memory kill) [default: 100].
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u64).range(50..=1000))]
    pub memory_overcommit: Option<u64>,
    /// Free space kept on the data disk, MiB: under it, creates, forks, restores and
    /// snapshots are refused (`503 disk_full`), since guests' RAM is a file there that grows
    /// as they touch it and a VM whose memory cannot grow dies (0: none) [default: 1024].
    #[arg(long, value_name = "MIB")]
    pub disk_reserve: Option<u64>,
    /// Seconds between resource samples of each running sandbox (`GET .../metrics`, `space
    /// top`; 0: no sampling) [default: 5].
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub metrics_interval: Option<u64>,
    /// A PEM file of CA certificates sandboxes (and the gateway, for upstreams) trust
    /// (repeatable; `none`: only the deployment's own CA) [default: the host's locally added
    /// CAs, the *.crt files under /usr/local/share/ca-certificates].
    #[arg(long = "guest-ca", value_name = "PEM")]
    pub guest_cas: Vec<PathBuf>,
}

/// `space node ls|token|drain|remove`.
#[derive(Debug, Subcommand)]
pub enum NodeCmd {
    /// List the cluster's nodes.
    Ls,
    /// Make a one-time join token for a new node.
    Token {
        /// Seconds the token works (default 3600).
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<u64>,
    },
    /// Stop placing sandboxes on a node and move its sandboxes to the others (through the
    /// object store; without one, only placement stops).
    Drain {
        /// The node id.
        id: String,
    },
    /// Take a node out of the cluster.
    Remove {
        /// The node id.
        id: String,
    },
}

/// `space template ...`.
#[derive(Debug, Subcommand)]
pub enum TemplateCmd {
    /// List templates.
    Ls,
    /// Build a template: from a stock image, a Dockerfile, an image reference or an image
    /// archive. Follows the build's log until it ends.
    Build(Box<TemplateBuildArgs>),
    /// Make a template of a running sandbox, its processes included.
    Save {
        /// The sandbox id (sbx-...).
        id: String,
        /// The template name.
        name: String,
        /// The version (default: one more than the newest).
        #[arg(long)]
        version: Option<String>,
        /// Keep the disk only: sandboxes of the template boot it afresh, without this one's
        /// processes and memory.
        #[arg(long)]
        disk_only: bool,
    },
    /// Show a build's log.
    Logs {
        /// The build id (bld-...).
        build: String,
        /// Keep following until the build ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// List builds, newest first.
    Builds,
    /// Delete a template version.
    Rm {
        /// The template name.
        name: String,
        /// The version to delete.
        version: String,
    },
}

/// `space template build`.
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("source")
        .required(true)
        .args(["image", "dockerfile", "from_image", "from_archive"])
))]
pub struct TemplateBuildArgs {
    /// The template name.
    pub name: String,
    /// A stock root image of the server's (`minimal`, `base`).
    #[arg(long)]
    pub image: Option<String>,
    /// A Dockerfile.
    #[arg(long)]
    pub dockerfile: Option<std::path::PathBuf>,
    /// The Dockerfile's build context (default: the Dockerfile's directory).
    #[arg(long, requires = "dockerfile")]
    pub context: Option<std::path::PathBuf>,
    /// A build argument `NAME=VALUE` (repeatable).
    #[arg(long = "build-arg", requires = "dockerfile")]
    pub build_args: Vec<String>,
    /// An image reference (`registry/repository[:tag][@digest]`).
    #[arg(long)]
    pub from_image: Option<String>,
    /// An OCI or Docker archive file (`docker save`, `skopeo copy ... oci-archive:`).
    #[arg(long)]
    pub from_archive: Option<std::path::PathBuf>,
    /// The image to pick in an archive holding several.
    #[arg(long, requires = "from_archive")]
    pub tag: Option<String>,
    /// The registry user (the password comes from $SPACE_REGISTRY_PASSWORD).
    #[arg(long)]
    pub registry_user: Option<String>,
    /// Speak plain HTTP to the registry.
    #[arg(long)]
    pub plain_http: bool,
    /// A command started before the snapshot (every sandbox starts with it running).
    #[arg(long)]
    pub start: Option<String>,
    /// A command that must exit 0 before the snapshot.
    #[arg(long, requires = "start", conflicts_with = "ready_port")]
    pub ready: Option<String>,
    /// A TCP port that must accept before the snapshot.
    #[arg(long, requires = "start")]
    pub ready_port: Option<u16>,
    /// vCPUs of sandboxes made from it.
    #[arg(long)]
    pub cpus: Option<u32>,
    /// Memory of sandboxes made from it, in MiB.
    #[arg(long)]
    pub memory: Option<u64>,
    /// Its root disk at least, in MiB.
    #[arg(long)]
    pub disk: Option<u64>,
    /// The version (default: one more than the newest).
    #[arg(long)]
    pub version: Option<String>,
    /// Answer with the build id at once instead of following its log.
    #[arg(long)]
    pub no_follow: bool,
}

/// `space purge`.
#[derive(Debug, Args)]
pub struct PurgeArgs {
    /// The deployment's data directory.
    #[arg(long, default_value = "/var/lib/space")]
    pub data_dir: PathBuf,
    /// Do not ask: delete at once.
    #[arg(long)]
    pub yes: bool,
}

/// `space admin-key`.
#[derive(Debug, Args)]
pub struct AdminKeyArgs {
    /// The deployment's data directory (its state database is `state/control.db` there).
    #[arg(long, default_value = "/var/lib/space")]
    pub data_dir: PathBuf,
    /// The state database instead, as `space control --database` takes it (a PostgreSQL URL
    /// or a SQLite file).
    #[arg(long, env = "SPACE_DATABASE")]
    pub database: Option<String>,
    /// The tenant the key belongs to.
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// A label to recognise the key by.
    #[arg(long, default_value = "minted on the host")]
    pub label: String,
}

/// `space mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Print the configuration snippet an agent needs to start this server, and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// One sandbox id.
#[derive(Debug, Args)]
pub struct IdArg {
    /// The sandbox id (sbx-...).
    pub id: String,
}

/// `space create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The template to create from.
    #[arg(long)]
    pub template: String,
    /// The template version (default: the newest).
    #[arg(long)]
    pub version: Option<String>,
    /// vCPUs (default: the template's).
    #[arg(long)]
    pub cpus: Option<u32>,
    /// Memory in MiB (default: the template's).
    #[arg(long)]
    pub memory: Option<u64>,
    /// Root disk size in MiB (default: the template's).
    #[arg(long)]
    pub disk: Option<u64>,
    /// An environment variable for every command, K=V (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// Metadata, K=V (repeatable).
    #[arg(long = "meta", value_name = "K=V")]
    pub meta: Vec<String>,
    /// Seconds without activity before the timeout action, or `never` (default 900).
    #[arg(long, value_name = "SECS|never")]
    pub idle_timeout: Option<String>,
    /// Seconds the sandbox may live, or `never` (the default).
    #[arg(long, value_name = "SECS|never")]
    pub max_lifetime: Option<String>,
    /// A secret of the vault to bind (repeatable): the sandbox's environment gets
    /// NAME=<placeholder>, and the gateway puts the value in requests to the secret's hosts.
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// An egress allow rule, HOST[:PORT] (repeatable; `*.suffix` and `*` work).
    #[arg(long = "allow", value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// An egress deny rule, HOST[:PORT] (repeatable; deny rules win over allow rules).
    #[arg(long = "deny", value_name = "PATTERN")]
    pub deny: Vec<String>,
    /// Refuse egress to hosts no allow rule names (the default is to allow them).
    #[arg(long)]
    pub default_deny: bool,
    /// A volume of the tenant to mount, NAME:/PATH, or NAME:/PATH:ro read-only (repeatable).
    #[arg(long = "volume", value_name = "NAME:/PATH[:ro]")]
    pub volumes: Vec<String>,
}

/// `space volume ...`.
#[derive(Debug, Subcommand)]
pub enum VolumeCmd {
    /// Make a volume.
    Create {
        /// Its name (letters, digits, - and _).
        name: String,
        /// Its size in MiB (default 10 GiB).
        #[arg(long, value_name = "MIB")]
        size: Option<u64>,
    },
    /// List the tenant's volumes.
    Ls,
    /// Delete a volume and its files (refused while a sandbox mounts it).
    Rm {
        /// Its name.
        name: String,
    },
    /// Copy a file into or out of a volume (one side is NAME:/path), no sandbox needed.
    Cp {
        /// A local file, or NAME:/path.
        src: String,
        /// A local file, or NAME:/path (ending in `/`: into that directory).
        dst: String,
    },
    /// List a directory of a volume.
    Files {
        /// NAME or NAME:/path.
        target: String,
    },
}

/// `space profile ...`.
#[derive(Debug, Subcommand)]
pub enum ProfileCmd {
    /// List the profiles (the current one marked with `*`).
    Ls,
    /// Make a profile the one used when no --profile is given.
    Use {
        /// The profile's name.
        name: String,
    },
    /// Forget a profile (its key is deleted from the config file).
    Rm {
        /// The profile's name.
        name: String,
    },
}

/// `space secret ...`.
#[derive(Debug, Subcommand)]
pub enum SecretCmd {
    /// Set (or replace) a secret; the value comes from --value or, without it, from stdin
    /// (one trailing newline is dropped).
    Set(SecretSetArgs),
    /// List the secrets (names and hosts; never values).
    Ls,
    /// Delete a secret.
    Rm {
        /// The secret name.
        name: String,
    },
}

/// `space secret set`.
#[derive(Debug, Args)]
pub struct SecretSetArgs {
    /// The secret name, `[A-Z_][A-Z0-9_]{0,63}`.
    pub name: String,
    /// A host pattern the secret may be sent to, HOST[:PORT] (repeatable, at least one).
    #[arg(long = "host", value_name = "PATTERN", required = true)]
    pub hosts: Vec<String>,
    /// The value (visible in the process list and shell history: prefer stdin).
    #[arg(long)]
    pub value: Option<String>,
    /// A one-time password seed (base32, or an otpauth://totp URI): the gateway sends the
    /// code of the moment in place of the placeholder.
    #[arg(long)]
    pub totp: bool,
}

/// `space net`.
#[derive(Debug, Args)]
pub struct NetArgs {
    /// The sandbox id.
    pub id: String,
    /// What to do.
    #[command(subcommand)]
    pub action: NetCmd,
}

/// `space net ID ...`.
#[derive(Debug, Subcommand)]
pub enum NetCmd {
    /// Show the policy.
    Ls,
    /// Add an allow rule (and drop the same rule from the deny list).
    Allow {
        /// HOST[:PORT].
        pattern: String,
    },
    /// Add a deny rule (and drop the same rule from the allow list).
    Deny {
        /// HOST[:PORT].
        pattern: String,
    },
    /// Remove a rule from both lists.
    Rm {
        /// HOST[:PORT].
        pattern: String,
    },
    /// Set what happens to hosts no rule names.
    Default {
        /// `allow` or `deny`.
        action: DefaultArg,
    },
    /// Set a header on every request to HOST (replacing a rule for the same host and name);
    /// `${secret:NAME}` in VALUE is put in by the gateway as the request leaves.
    Header {
        /// HOST[:PORT], as the rules.
        host: String,
        /// The header's name.
        name: String,
        /// Its value, e.g. 'Bearer ${secret:API_TOKEN}'.
        value: String,
    },
    /// Remove the header rule for HOST and NAME.
    Unheader {
        /// HOST[:PORT].
        host: String,
        /// The header's name.
        name: String,
    },
}

/// The egress default.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DefaultArg {
    /// Hosts no rule names are reachable.
    Allow,
    /// Hosts no rule names are refused.
    Deny,
}

/// `space expose`.
#[derive(Debug, Args)]
pub struct ExposeArgs {
    /// The sandbox id.
    pub id: String,
    /// The port inside the sandbox.
    #[arg(required_unless_present = "ls", conflicts_with = "ls")]
    pub port: Option<u16>,
    /// List the exposed ports instead.
    #[arg(long)]
    pub ls: bool,
}

/// `space browser`.
#[derive(Debug, Args)]
pub struct BrowserArgs {
    /// The sandbox id (template `desktop`).
    pub id: String,
    /// Type this secret into the field `--selector` of the page in front (its placeholder;
    /// the gateway puts the value in when the form goes to a bound host).
    #[arg(long, value_name = "SECRET", requires = "selector")]
    pub fill: Option<String>,
    /// The CSS selector of the field `--fill` types into.
    #[arg(long, requires = "fill")]
    pub selector: Option<String>,
    /// With --fill: type the value itself, only on an https page of a host the secret is
    /// bound to (the value then is in the VM: for pages that hash the field in script).
    #[arg(long, requires = "fill")]
    pub value: bool,
}

/// `space unexpose`.
#[derive(Debug, Args)]
pub struct UnexposeArgs {
    /// The sandbox id.
    pub id: String,
    /// The exposed port.
    pub port: u16,
}

/// `space ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only sandboxes in this state.
    #[arg(long)]
    pub state: Option<String>,
    /// Only sandboxes of this template.
    #[arg(long)]
    pub template: Option<String>,
    /// Only sandboxes with this metadata, K=V (repeatable; all must match).
    #[arg(long = "meta", value_name = "K=V")]
    pub meta: Vec<String>,
    /// Include terminated sandboxes.
    #[arg(long)]
    pub all: bool,
}

/// `space exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// The sandbox id.
    pub id: String,
    /// An environment variable, K=V (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    pub env: Vec<String>,
    /// The working directory.
    #[arg(long)]
    pub cwd: Option<String>,
    /// Seconds after which the command is killed.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Do not forward local stdin (the command's stdin is empty).
    #[arg(short = 'n', long)]
    pub no_stdin: bool,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// `space shell`.
#[derive(Debug, Args)]
pub struct ShellArgs {
    /// The sandbox id.
    pub id: String,
    /// A command to run on the terminal instead of a login shell.
    #[arg(last = true, value_name = "CMD")]
    pub cmd: Vec<String>,
}

/// `space cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// The source: a local path or ID:/path.
    pub src: String,
    /// The destination: a local path or ID:/path.
    pub dst: String,
}

/// `space snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// The sandbox id.
    pub id: String,
    /// A full snapshot (memory and disk) instead of a disk-only one.
    #[arg(long)]
    pub full: bool,
}

/// `space rollback`.
#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The sandbox id.
    pub id: String,
    /// The snapshot id to roll back to.
    pub snapshot: String,
}

/// What happens when a timeout fires.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum TimeoutActionArg {
    /// Suspend the sandbox.
    Suspend,
    /// Terminate the sandbox.
    Kill,
}

/// `space timeout`.
#[derive(Debug, Args)]
pub struct TimeoutArgs {
    /// The sandbox id.
    pub id: String,
    /// Seconds without activity before the action, or `never`.
    #[arg(long, value_name = "SECS|never")]
    pub idle: Option<String>,
    /// Seconds the sandbox may live, or `never`.
    #[arg(long, value_name = "SECS|never")]
    pub max_lifetime: Option<String>,
    /// What a timeout does.
    #[arg(long)]
    pub action: Option<TimeoutActionArg>,
}

/// `space logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The sandbox id.
    pub id: String,
    /// How many bytes from the end (default 64 KiB, at most 1 MiB).
    #[arg(long, value_name = "BYTES")]
    pub tail: Option<u64>,
}

/// `space metrics`.
#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// The sandbox id.
    pub id: String,
    /// Only samples of the last SECS seconds (default: the sandbox's whole series).
    #[arg(long, value_name = "SECS")]
    pub since: Option<u64>,
}

/// `space top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub interval: u64,
    /// Print the table once and exit (as `--json` does).
    #[arg(long)]
    pub once: bool,
}

/// `space audit`.
#[derive(Debug, Args)]
pub struct AuditArgs {
    /// Only events of this sandbox.
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Only events of this operation (e.g. sandbox.create, auth).
    #[arg(long)]
    pub operation: Option<String>,
    /// At most this many events (default 100, at most 1000).
    #[arg(long)]
    pub limit: Option<u32>,
}

/// `space tenant ...`.
#[derive(Debug, Subcommand)]
pub enum TenantCmd {
    /// List tenants.
    Ls,
    /// Create a tenant and print its first key.
    Create(TenantCreateArgs),
    /// Show a tenant's master key, or set it: a KMS key the tenant holds (`--kms-key-id`
    /// with `--kms-region`), or the deployment's own (`--deployment`). Setting it rewraps the
    /// tenant's archive key onto the new master; no data is rewritten.
    MasterKey(MasterKeyArgs),
}

/// `space tenant master-key`.
#[derive(Debug, Args)]
pub struct MasterKeyArgs {
    /// The tenant.
    pub name: String,
    /// A KMS key id, ARN or alias.
    #[arg(long, requires = "kms_region", conflicts_with = "deployment")]
    pub kms_key_id: Option<String>,
    /// The KMS key's region.
    #[arg(long, requires = "kms_key_id")]
    pub kms_region: Option<String>,
    /// Endpoint URL of a KMS-compatible service (default: AWS's).
    #[arg(long, requires = "kms_key_id")]
    pub kms_endpoint: Option<String>,
    /// Back to the deployment's own master key.
    #[arg(long)]
    pub deployment: bool,
}

/// `space tenant create`.
#[derive(Debug, Args)]
pub struct TenantCreateArgs {
    /// The tenant name.
    pub name: String,
    /// The most sandboxes that are not terminated.
    #[arg(long)]
    pub max_sandboxes: Option<u64>,
    /// The most vCPUs of running sandboxes.
    #[arg(long)]
    pub max_cpus: Option<u64>,
    /// The most memory of running sandboxes, in MiB.
    #[arg(long)]
    pub max_memory: Option<u64>,
    /// The sizes of the tenant's volumes together, in MiB (default 102400).
    #[arg(long, value_name = "MIB")]
    pub max_volumes: Option<u64>,
}

/// `space key ...`.
#[derive(Debug, Subcommand)]
pub enum KeyCmd {
    /// List a tenant's keys (never their secrets).
    Ls {
        /// The tenant.
        tenant: String,
    },
    /// Create a key for a tenant and print it (shown only this once).
    Create {
        /// The tenant.
        tenant: String,
        /// An admin key (can manage tenants, keys and templates).
        #[arg(long)]
        admin: bool,
        /// A label to recognise the key by.
        #[arg(long)]
        label: Option<String>,
    },
    /// Revoke a key.
    Revoke {
        /// The key id (k...).
        key_id: String,
    },
}
