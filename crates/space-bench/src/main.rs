//! `space-bench`: measures the sandbox runtime (and, with `node`, the node's lifecycle) on this
//! host and prints tables (p50/p90/p99, mean, n). It never asserts on timing; the numbers are
//! for reading and quoting.
//!
//! ```text
//! source target/space/env.sh && cargo run --release -p space-bench -- [--runs N]
//!     [--only boot,snapshot,restore,pause,exec,files] [--dir DIR | --no-btrfs]
//! source target/space/env.sh && cargo run --release -p space-bench -- node [--runs N]
//!     [--only create,pool,pause,snapshot,suspend,fork,memory] [--pool-size N] [--idle N]
//! cargo run --release -p space-bench -- storage [--runs N] [--mib N]
//! source target/space/env.sh && cargo run --release -p space-bench -- archive [--runs N]
//!     [--dirty 0,16,64] [--chunk-kib 256,64,1024] [--store URL]
//! source target/space/env.sh && cargo run --release -p space-bench -- api [--runs N]
//!     [--concurrent N] [--pool-size N]
//! source target/space/env.sh && cargo run --release -p space-bench -- rate [--rates 1,2,4]
//!     [--seconds N] [--burst N] [--pool-size N] [--pool-max N]
//! cargo run --release -p space-bench -- egress [--runs N] [--big-runs N] [--big-mib N]
//!     [--guest [--guest-runs N]]
//! source target/space/env.sh && cargo run --release -p space-bench -- e2b [--runs N]
//!     [--round-trips N] [--pool-size N]
//! source target/space/env.sh && cargo run --release -p space-bench -- mcp [--round-trips N]
//! source target/space/env.sh && cargo run --release -p space-bench -- desktop [--runs N]
//!     [--actions N] [--pool-size N]
//! source target/space/env.sh && cargo run --release -p space-bench -- templates [--runs N]
//! source target/space/env.sh && cargo run --release -p space-bench -- console [--runs N]
//!     [--sandboxes N] [--running N] [--keystrokes N]
//! source target/space/env.sh && cargo run --release -p space-bench -- hostile [--seconds N]
//! ```

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Parser, Subcommand};
use space_runtime::{accel, cow, CloneMethod, QemuRuntime, QemuRuntimeConfig};

use space_bench::bench::{Bench, Group, Plan};
use space_bench::host::{self, host_summary, kernel_version, shutdown_signal};
use space_bench::node::{NodeGroup, NodePlan};
use space_bench::scratch::Scratch;

/// Measures boot, snapshot, restore, pause/resume, exec and file transfer of space sandboxes
/// (`node`: the same lifecycle through the node).
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Runs per measurement (in the runtime groups exec and 4 KiB files run 5x this, large
    /// files half of it).
    #[arg(long, default_value_t = 20, global = true)]
    runs: usize,
    /// Only these groups (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Group>,
    /// Put sandboxes in a fresh directory inside DIR instead of a loop-mounted btrfs image.
    #[arg(long, value_name = "DIR", conflicts_with = "no_btrfs")]
    dir: Option<PathBuf>,
    /// Use a plain directory under /var/tmp (the root filesystem) instead of a btrfs image,
    /// to show the copy fallback where reflinks are not available.
    #[arg(long)]
    no_btrfs: bool,
    /// Guest kernel (uncompressed vmlinux).
    #[arg(long, env = "SPACE_KERNEL", global = true)]
    kernel: Option<PathBuf>,
    /// Root disk image the guests boot.
    #[arg(long, env = "SPACE_ROOTFS_MINIMAL", global = true)]
    rootfs: Option<PathBuf>,
    /// vCPUs per guest.
    #[arg(long, default_value_t = 1, global = true)]
    vcpus: u32,
    /// Guest RAM in MiB.
    #[arg(long, default_value_t = 256, global = true)]
    memory_mib: u64,
    /// QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64", global = true)]
    qemu: PathBuf,
    /// Whether `--runs` was on the command line (groups with another default use theirs).
    #[arg(skip)]
    runs_given: bool,
}

impl Cli {
    /// Parses the command line, noting whether `--runs` was given.
    fn parse_args() -> Cli {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let matches = Cli::command().get_matches();
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        cli.runs_given = runs_given(&matches);
        cli
    }
}

/// Whether `--runs` came from the command line, before or after the subcommand.
fn runs_given(matches: &clap::ArgMatches) -> bool {
    let explicit = |m: &clap::ArgMatches| {
        m.value_source("runs") == Some(clap::parser::ValueSource::CommandLine)
    };
    explicit(matches) || matches.subcommand().is_some_and(|(_, sub)| explicit(sub))
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measures the node (crates/space-node) on a loop-mounted btrfs data directory: create
    /// with and without a warm pool, pause/resume, snapshots, suspend/restore, fork, kill and
    /// the host memory of idle sandboxes, against a bare QEMU restore of the same snapshot.
    Node(NodeArgs),
    /// Measures the public HTTP API (crates/space-control) against the node it serves: create
    /// from the warm pool to the first exec through HTTP and through the node's library calls,
    /// and a burst of concurrent creates.
    Api(ApiArgs),
    /// Measures creates through the HTTP API at sustained rates and in bursts, on a server
    /// whose pool follows demand against one whose pool keeps a fixed size: latency to the 201
    /// and to the first exec, and the pools' hits, waits and misses.
    Rate(RateArgs),
    /// Measures what the egress gateway adds to HTTPS (no VM): a small request and a large
    /// download straight to a local HTTPS server, through a spliced tunnel, and through an
    /// intercepted tunnel with a credential put in. `--runs` defaults to 200 here.
    Egress(EgressArgs),
    /// Measures sandboxes through the object store: suspend to committed and the bytes it
    /// uploads for 0, 16 and 64 MiB written, restore from the store against a local restore,
    /// an idle second suspend, a fork's dedup, wake on access, and the chunk sizes.
    Archive(ArchiveArgs),
    /// Measures a suspended sandbox restored from its local copy and from the object store
    /// (a Garage on loopback by default) to the first exec, for guests of 256 MiB, 1 GiB and
    /// 4 GiB holding 25% of their RAM size as fresh data, random and text, and where the time
    /// of a restore from the store goes. `--runs` defaults to 3 here.
    Restore(RestoreArgs),
    /// Measures volumes' copies in the object store through a node's file API: a copy by
    /// what changed, a restore of the whole volume, and how long an acknowledged write waits
    /// for a copy that holds it at the default interval. `--runs` defaults to 3 here.
    VolumeCopies(VolumeCopiesArgs),
    /// Measures a cluster on this machine: a control replica and several nodes joined over
    /// mutual TLS; a burst of concurrent creates over all nodes against one node.
    Cluster(ClusterArgs),
    /// Measures a node's loss with real processes (a replica, three `space node`s, Garage):
    /// SIGKILL to its running sandboxes answering elsewhere, and restores of its suspended
    /// ones on other nodes against restores in place.
    Failover(FailoverArgs),
    /// Measures the E2B facade: the official E2B Python SDK against space's Python SDK on one
    /// server with a warm pool of `base`: create to first command, and a command round trip.
    E2b(E2bArgs),
    /// Measures the MCP server: a `run_command` round trip through the official MCP Python
    /// SDK over stdio (`space mcp`) and over HTTP (`/mcp`), against the same command through
    /// the REST exec, on one `base` sandbox.
    Mcp(McpArgs),
    /// Measures a desktop sandbox through the clients an agent uses: create to first
    /// screenshot (pool and without a pool member), screenshot, click and typing through the
    /// e2b-desktop SDK, the native API and the MCP tools, the browser over CDP, and idle
    /// memory, CPU and first-suspend size beside `base`.
    Desktop(DesktopArgs),
    /// Measures the web console in Chromium: time to interactive of the sandbox list with
    /// many sandboxes (cold and warm) and keystroke echo in a terminal against `space shell`.
    /// `--runs` (loads of the list) defaults to 10 here.
    Console(ConsoleArgs),
    /// Measures template builds: a small Dockerfile cold and with its cache warm, the import
    /// of an image per 100 MB, and create from the Dockerfile's template against the stock
    /// one. `--runs` defaults to 5 here.
    Templates,
    /// Measures what a sandbox attacking its own guest (console flood, full disk, fork
    /// flood, memory exhaustion, CPU spin) costs another sandbox's exec latency, against a
    /// quiet baseline in the same run.
    Hostile(HostileArgs),
    /// Measures the node's storage drivers without VMs: snapshot, delete and clone of a volume
    /// holding one disk-sized file, with btrfs and reflink on a loop-mounted btrfs image and
    /// copy on the root filesystem.
    Storage(StorageArgs),
}

#[derive(clap::Args, Debug)]
struct ArchiveArgs {
    /// MiB the guest writes before each measured suspend (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [0u64, 16, 64])]
    dirty: Vec<u64>,
    /// Chunk sizes in KiB to compare (the first is used for the main measurements).
    #[arg(long, value_delimiter = ',', default_values_t = [256u32, 64, 1024])]
    chunk_kib: Vec<u32>,
    /// The object store (default: a fresh directory under /var/tmp per node).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
}

#[derive(clap::Args, Debug)]
struct RestoreArgs {
    /// Guest RAM sizes in MiB (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [256u64, 1024, 4096])]
    sizes: Vec<u64>,
    /// Fresh data each guest holds, as a percentage of its RAM size.
    #[arg(long, default_value_t = 25)]
    fresh_pct: u64,
    /// The kinds of data: random (incompressible), text (hex, zstd halves it).
    #[arg(long, value_delimiter = ',', default_values_t = ["random".to_string(), "text".to_string()])]
    kinds: Vec<String>,
    /// The object store (default: a Garage on loopback, started for the run).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
}

#[derive(clap::Args, Debug)]
struct VolumeCopiesArgs {
    /// MiB of random data in the volume's big file.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    mib: u64,
    /// Writes whose wait for a copy is measured.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    writes: u64,
    /// The object store (default: a fresh directory under /var/tmp).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
}

#[derive(clap::Args, Debug)]
struct HostileArgs {
    /// Seconds each attack, and the baseline, runs.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(5..=3600))]
    seconds: u64,
}

#[derive(clap::Args, Debug)]
struct StorageArgs {
    /// Size of the file the volume holds, in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=16384))]
    mib: u64,
}

#[derive(clap::Args, Debug)]
struct EgressArgs {
    /// Large downloads per path (0: skip them).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=100))]
    big_runs: u64,
    /// Size of the large download in MiB.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=16384))]
    big_mib: u64,
    /// Also run curl inside real guests (boots `base` guests on a node; needs root, the
    /// kernel and the base image).
    #[arg(long)]
    guest: bool,
    /// curl runs per path inside the guests.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    guest_runs: u64,
    /// Root image with curl for `--guest`.
    #[arg(long, env = "SPACE_ROOTFS_BASE")]
    rootfs_base: Option<PathBuf>,
}

/// Small requests per path of the egress group when `--runs` is not given.
const EGRESS_RUNS: usize = 200;

#[derive(clap::Args, Debug)]
struct ApiArgs {
    /// Creates sent at once in the concurrent group (0: skip it).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=200))]
    concurrent: u64,
    /// Members of the `minimal` pool.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    pool_size: u64,
}

#[derive(clap::Args, Debug)]
struct RateArgs {
    /// Creates per second of each sustained phase (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1.0, 2.0, 4.0])]
    rates: Vec<f64>,
    /// Length of each sustained phase, in seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: u64,
    /// Creates sent at once in each of the two bursts (0: no bursts).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(0..=200))]
    burst: u64,
    /// The pools' floor.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    pool_size: u64,
    /// The demand pool's ceiling.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=64))]
    pool_max: u64,
}

#[derive(clap::Args, Debug)]
struct E2bArgs {
    /// Command round trips per SDK.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    round_trips: u64,
    /// Members of the `base` pool.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    pool_size: u64,
    /// The `base` root image.
    #[arg(long, env = "SPACE_ROOTFS_BASE")]
    rootfs_base: Option<PathBuf>,
    /// The Python that has the E2B SDK (default: target/space/venv-e2b/bin/python).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Measure E2B's snapshots, forks and template builds instead (`--runs` creates from
    /// each source, `--build-runs` builds each way).
    #[arg(long)]
    builds: bool,
    /// Template builds each way (cold and cached), with `--builds`.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    build_runs: u64,
}

#[derive(clap::Args, Debug)]
struct McpArgs {
    /// Round trips per way.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    round_trips: u64,
    /// The `base` root image.
    #[arg(long, env = "SPACE_ROOTFS_BASE")]
    rootfs_base: Option<PathBuf>,
    /// The Python that has the MCP SDK (default: target/space/venv-mcp/bin/python).
    #[arg(long)]
    python: Option<PathBuf>,
    /// The `space` binary to start as `space mcp` (default: target/release/space).
    #[arg(long)]
    space: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ConsoleArgs {
    /// Sandboxes on the list.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=2_000))]
    sandboxes: u64,
    /// Of which stay running (the rest are suspended, as most of a long-lived fleet is).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=200))]
    running: u64,
    /// Keystrokes each way.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    keystrokes: u64,
    /// The `base` root image.
    #[arg(long, env = "SPACE_ROOTFS_BASE")]
    rootfs_base: Option<PathBuf>,
    /// The Python that has Playwright (default: target/space/venv-browser/bin/python).
    #[arg(long)]
    python: Option<PathBuf>,
    /// The `space` binary for `space shell` (default: target/release/space).
    #[arg(long)]
    space: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct DesktopArgs {
    /// Rounds of actions per client.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    actions: u64,
    /// Members of the `desktop` pool.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    pool_size: u64,
    /// The `desktop` root image.
    #[arg(long, env = "SPACE_ROOTFS_DESKTOP")]
    rootfs_desktop: Option<PathBuf>,
    /// The `base` root image.
    #[arg(long, env = "SPACE_ROOTFS_BASE")]
    rootfs_base: Option<PathBuf>,
    /// The Python that has the e2b-desktop SDK (default:
    /// target/space/venv-e2b-desktop/bin/python).
    #[arg(long)]
    python: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ClusterArgs {
    /// Creates sent at once in each burst.
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(1..=200))]
    creates: u64,
    /// Nodes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=8))]
    nodes: u64,
    /// Members of the `minimal` pool on each node.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=16))]
    pool_size: u64,
}

#[derive(clap::Args, Debug)]
struct FailoverArgs {
    /// Rounds, each killing one node.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Running sandboxes on the killed node per round.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=8))]
    running: u64,
    /// Suspended sandboxes on the killed node per round.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=8))]
    suspended: u64,
}

#[derive(clap::Args, Debug)]
struct NodeArgs {
    /// Only these node groups (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<NodeGroup>,
    /// Members of the `minimal` pool in the pool group (at least 2).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(2..=16))]
    pool_size: u64,
    /// Idle sandboxes kept running for the memory group.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=200))]
    idle: u64,
    /// Guest memory admitted against the host's, in percent (as `space up
    /// --memory-overcommit`), for many idle sandboxes in the memory group.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(50..=1000))]
    overcommit: u64,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse_args();
    // The platform's own logs, to stderr, only when asked for (`RUST_LOG=space_node=debug`).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("space-bench: starting tokio: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("space-bench: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    if let Some(Command::Storage(args)) = &cli.command {
        let plan = space_bench::storage::StoragePlan {
            runs: cli.runs,
            mib: args.mib,
        };
        return tokio::task::block_in_place(|| space_bench::storage::run(&plan));
    }
    if let Some(Command::Egress(args)) = &cli.command {
        if !cli.only.is_empty() || cli.dir.is_some() || cli.no_btrfs {
            bail!("--only, --dir and --no-btrfs belong to the runtime groups, not to `egress`");
        }
        let guest = if args.guest {
            let kernel = cli
                .kernel
                .clone()
                .filter(|k| k.is_file())
                .ok_or_else(|| anyhow!("--guest needs the kernel: pass --kernel or set SPACE_KERNEL (`source target/space/env.sh`)"))?;
            let rootfs = args
                .rootfs_base
                .clone()
                .filter(|r| r.is_file())
                .ok_or_else(|| anyhow!("--guest needs the base image: pass --rootfs-base or set SPACE_ROOTFS_BASE (`source target/space/env.sh`)"))?;
            Some(space_bench::egress::GuestPlan {
                runs: args.guest_runs as usize,
                kernel,
                rootfs,
                qemu: cli.qemu.clone(),
            })
        } else {
            None
        };
        let plan = space_bench::egress::EgressPlan {
            guest,
            runs: if cli.runs_given {
                cli.runs
            } else {
                EGRESS_RUNS
            },
            big_runs: args.big_runs as usize,
            big_mib: args.big_mib,
        };
        return space_bench::egress::run(&plan, shutdown_signal()).await;
    }
    let mut paths = Vec::new();
    for (what, flag, var, path) in [
        ("kernel", "kernel", "SPACE_KERNEL", &cli.kernel),
        ("root image", "rootfs", "SPACE_ROOTFS_MINIMAL", &cli.rootfs),
    ] {
        let Some(path) = path else {
            bail!(
                "no {what}: pass --{flag} or set {var} (build the artifacts and \
                 `source target/space/env.sh`)"
            );
        };
        if !path.is_file() {
            bail!(
                "{what} {} does not exist; build the artifacts and `source target/space/env.sh`",
                path.display()
            );
        }
        paths.push(path.clone());
    }
    let (kernel, rootfs) = (paths[0].clone(), paths[1].clone());
    if let Some(Command::Api(args)) = &cli.command {
        if !cli.only.is_empty() || cli.dir.is_some() || cli.no_btrfs {
            bail!("--only, --dir and --no-btrfs belong to the runtime groups, not to `api`");
        }
        let plan = space_bench::api::ApiPlan {
            runs: cli.runs,
            concurrent: args.concurrent as usize,
            pool_size: args.pool_size as usize,
            kernel,
            rootfs,
            qemu: cli.qemu.clone(),
        };
        return space_bench::api::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Rate(args)) = &cli.command {
        if !cli.only.is_empty() || cli.dir.is_some() || cli.no_btrfs {
            bail!("--only, --dir and --no-btrfs belong to the runtime groups, not to `rate`");
        }
        if let Some(r) = args
            .rates
            .iter()
            .find(|r| !(r.is_finite() && **r > 0.0 && **r <= 50.0))
        {
            bail!("--rates {r}: each rate is a number of creates per second in (0, 50]");
        }
        let plan = space_bench::rate::RatePlan {
            rates: args.rates.clone(),
            seconds: args.seconds,
            burst: args.burst as usize,
            pool_size: args.pool_size as usize,
            pool_max: args.pool_max as usize,
            kernel,
            rootfs,
            qemu: cli.qemu.clone(),
        };
        return space_bench::rate::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::E2b(args)) = &cli.command {
        let rootfs = args
            .rootfs_base
            .clone()
            .filter(|r| r.is_file())
            .ok_or_else(|| anyhow!("no base image: pass --rootfs-base or set SPACE_ROOTFS_BASE (`source target/space/env.sh`)"))?;
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let plan = space_bench::e2b::E2bPlan {
            runs: cli.runs,
            round_trips: args.round_trips as usize,
            pool_size: args.pool_size as usize,
            builds: args.builds.then_some(args.build_runs as usize),
            kernel,
            rootfs,
            qemu: cli.qemu.clone(),
            python: args
                .python
                .clone()
                .unwrap_or_else(|| repo.join("target/space/venv-e2b/bin/python")),
            repo,
        };
        return space_bench::e2b::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Mcp(args)) = &cli.command {
        let rootfs = args
            .rootfs_base
            .clone()
            .filter(|r| r.is_file())
            .ok_or_else(|| anyhow!("no base image: pass --rootfs-base or set SPACE_ROOTFS_BASE (`source target/space/env.sh`)"))?;
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let plan = space_bench::mcp::McpPlan {
            round_trips: args.round_trips as usize,
            kernel,
            rootfs,
            qemu: cli.qemu.clone(),
            python: args
                .python
                .clone()
                .unwrap_or_else(|| repo.join("target/space/venv-mcp/bin/python")),
            space: args
                .space
                .clone()
                .unwrap_or_else(|| repo.join("target/release/space")),
            repo,
        };
        return space_bench::mcp::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Console(args)) = &cli.command {
        let rootfs = args
            .rootfs_base
            .clone()
            .filter(|r| r.is_file())
            .ok_or_else(|| anyhow!("no base image: pass --rootfs-base or set SPACE_ROOTFS_BASE (`source target/space/env.sh`)"))?;
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let plan = space_bench::console::ConsolePlan {
            sandboxes: args.sandboxes as usize,
            running: args.running.min(args.sandboxes) as usize,
            loads: if cli.runs_given { cli.runs } else { 10 },
            keystrokes: args.keystrokes as usize,
            kernel,
            rootfs,
            qemu: cli.qemu.clone(),
            python: args
                .python
                .clone()
                .unwrap_or_else(|| repo.join("target/space/venv-browser/bin/python")),
            space: args
                .space
                .clone()
                .unwrap_or_else(|| repo.join("target/release/space")),
            repo,
        };
        return space_bench::console::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Desktop(args)) = &cli.command {
        let image = |path: &Option<PathBuf>, name: &str, var: &str| {
            path.clone().filter(|r| r.is_file()).ok_or_else(|| {
                anyhow!("no {name} image: pass --rootfs-{name} or set {var} (`source target/space/env.sh`)")
            })
        };
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let plan = space_bench::desktop::DesktopPlan {
            // Each create starts Xfce under TCG (tens of seconds): fewer unless asked.
            runs: if cli.runs_given { cli.runs } else { 5 },
            actions: args.actions as usize,
            pool_size: args.pool_size as usize,
            kernel,
            rootfs: image(&args.rootfs_desktop, "desktop", "SPACE_ROOTFS_DESKTOP")?,
            rootfs_base: image(&args.rootfs_base, "base", "SPACE_ROOTFS_BASE")?,
            qemu: cli.qemu.clone(),
            python: args
                .python
                .clone()
                .unwrap_or_else(|| repo.join("target/space/venv-e2b-desktop/bin/python")),
            repo,
        };
        return space_bench::desktop::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Hostile(args)) = &cli.command {
        let plan = space_bench::hostile::HostilePlan {
            seconds: args.seconds,
            qemu: cli.qemu.clone(),
            kernel,
            rootfs,
        };
        return space_bench::hostile::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Templates) = &cli.command {
        let guestd = std::env::var_os("SPACE_GUESTD")
            .map(PathBuf::from)
            .filter(|p| p.is_file())
            .ok_or_else(|| {
                anyhow!("no space-guestd: set SPACE_GUESTD (`source target/space/env.sh`)")
            })?;
        let plan = space_bench::templates::TemplatesPlan {
            runs: if cli.runs_given { cli.runs } else { 5 },
            qemu: cli.qemu.clone(),
            kernel,
            rootfs,
            guestd,
        };
        return space_bench::templates::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Cluster(args)) = &cli.command {
        let plan = space_bench::cluster::ClusterPlan {
            creates: args.creates as usize,
            nodes: args.nodes as usize,
            pool_size: args.pool_size as usize,
            kernel: kernel.clone(),
            rootfs: rootfs.clone(),
            qemu: cli.qemu.clone(),
        };
        return space_bench::cluster::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Failover(args)) = &cli.command {
        let plan = space_bench::failover::FailoverPlan {
            rounds: args.rounds as usize,
            running: args.running as usize,
            suspended: args.suspended as usize,
            kernel: kernel.clone(),
            rootfs: rootfs.clone(),
        };
        return space_bench::failover::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Archive(args)) = &cli.command {
        let plan = space_bench::archive::ArchivePlan {
            runs: if cli.runs_given { cli.runs } else { 5 },
            qemu: cli.qemu.clone(),
            kernel,
            rootfs,
            memory_mib: cli.memory_mib,
            dirty_mib: args.dirty.clone(),
            chunk_kib: args.chunk_kib.clone(),
            store: args.store.clone(),
        };
        return space_bench::archive::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Restore(args)) = &cli.command {
        let kinds = args
            .kinds
            .iter()
            .map(|k| k.parse().map_err(anyhow::Error::msg))
            .collect::<Result<Vec<_>>>()?;
        let plan = space_bench::restore::RestorePlan {
            runs: if cli.runs_given { cli.runs } else { 3 },
            qemu: cli.qemu.clone(),
            kernel,
            rootfs,
            sizes_mib: args.sizes.clone(),
            fresh_pct: args.fresh_pct,
            kinds,
            store: args.store.clone(),
        };
        return space_bench::restore::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::VolumeCopies(args)) = &cli.command {
        let plan = space_bench::volume_copies::VolumeCopiesPlan {
            runs: if cli.runs_given { cli.runs } else { 3 },
            mib: args.mib,
            writes: args.writes as usize,
            store: args.store.clone(),
        };
        return space_bench::volume_copies::run(&plan, shutdown_signal()).await;
    }
    if let Some(Command::Node(args)) = &cli.command {
        if !cli.only.is_empty() || cli.dir.is_some() || cli.no_btrfs {
            bail!("--only, --dir and --no-btrfs before `node` belong to the runtime groups; put `--only` after `node`");
        }
        let groups = if args.only.is_empty() {
            NodeGroup::ALL.to_vec()
        } else {
            args.only.clone()
        };
        let plan = NodePlan {
            runs: cli.runs,
            groups,
            qemu: cli.qemu.clone(),
            kernel,
            rootfs,
            vcpus: cli.vcpus,
            memory_mib: cli.memory_mib,
            pool_size: args.pool_size as usize,
            idle: args.idle as usize,
            overcommit_percent: args.overcommit,
        };
        return space_bench::node::run(&plan, shutdown_signal()).await;
    }
    let groups = if cli.only.is_empty() {
        vec![
            Group::Boot,
            Group::Snapshot,
            Group::Restore,
            Group::Pause,
            Group::Exec,
            Group::Files,
        ]
    } else {
        cli.only.clone()
    };

    let mut scratch = if cli.no_btrfs {
        Scratch::plain(Some(Path::new("/var/tmp")))?
    } else if let Some(dir) = &cli.dir {
        Scratch::plain(Some(dir))?
    } else {
        Scratch::btrfs().context("setting up the btrfs scratch image (or pass --no-btrfs)")?
    };
    // Everything that can fail or be interrupted runs inside `measured`; the scratch area is
    // cleaned up after it either way. Dropping the future on a signal drops every VM handle,
    // which kills its QEMU.
    let measured = async {
        tokio::select! {
            r = measure(&cli, groups, &scratch, &kernel, &rootfs) => r,
            s = shutdown_signal() => Err(anyhow!("interrupted by {s}")),
        }
    };
    let result = measured.await;
    let cleaned = tokio::task::block_in_place(|| scratch.cleanup());
    space_bench::bench::with_cleanup(result, cleaned)
}

async fn measure(
    cli: &Cli,
    groups: Vec<Group>,
    scratch: &Scratch,
    kernel: &Path,
    rootfs_source: &Path,
) -> Result<()> {
    let decision = accel::detect()?;
    let rt = QemuRuntime::new(QemuRuntimeConfig {
        qemu: cli.qemu.clone(),
        accel: Some(decision.accel),
        ..Default::default()
    })
    .await?;

    // The template image lives in the scratch area so boots clone it the way production
    // clones a template (reflink on btrfs).
    let root = scratch.root().to_owned();
    let rootfs = root.join("template-rootfs.ext4");
    let t = Instant::now();
    let (src, dst) = (rootfs_source.to_owned(), rootfs.clone());
    tokio::task::spawn_blocking(move || cow::clone_file(&src, &dst))
        .await?
        .context("copying the root image into the scratch area")?;
    let staged = t.elapsed();
    let probe = root.join("clone-probe");
    let (src, dst) = (rootfs.clone(), probe.clone());
    let t = Instant::now();
    let method = tokio::task::spawn_blocking(move || cow::clone_file(&src, &dst))
        .await?
        .context("probing how files clone in the scratch area")?;
    let probe_time = t.elapsed();
    std::fs::remove_file(&probe)?;

    let image_size = std::fs::metadata(rootfs_source)?.len();
    host::print_run_start("space-bench", &decision, rt.version());
    println!(
        "guest:       {} vCPU, {} MiB RAM; kernel {} ({})",
        cli.vcpus,
        cli.memory_mib,
        kernel.display(),
        kernel_version(kernel).unwrap_or_else(|| "version string not found".into())
    );
    println!(
        "root image:  {} ({} MiB)",
        rootfs_source.display(),
        image_size >> 20
    );
    println!("host:        {}", host_summary());
    println!("scratch:     {}", scratch.describe());
    println!(
        "clone:       {} ({} MiB image cloned in {:.1} ms; staged into scratch in {:.0} ms)",
        match method {
            CloneMethod::Reflink => "reflink (FICLONE, extents shared)",
            CloneMethod::SparseCopy => "sparse copy fallback (no reflink on this filesystem)",
            CloneMethod::InPlace => "not cloned (the files were made in place)",
        },
        image_size >> 20,
        probe_time.as_secs_f64() * 1e3,
        staged.as_secs_f64() * 1e3
    );
    println!(
        "runs:        {} (exec and 4 KiB files {}, large files {})",
        cli.runs,
        cli.runs * 5,
        (cli.runs / 2).max(1)
    );
    println!();

    let plan = Plan {
        runs: cli.runs,
        groups,
        qemu: cli.qemu.clone(),
        kernel: kernel.to_owned(),
        rootfs,
        vcpus: cli.vcpus,
        memory_mib: cli.memory_mib,
        root,
    };
    Bench::new(&plan, &rt).run().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_parses_groups() {
        let cli = Cli::try_parse_from([
            "space-bench",
            "--kernel",
            "/k",
            "--rootfs",
            "/r",
            "--only",
            "restore,exec",
            "--runs",
            "3",
        ])
        .unwrap();
        assert_eq!(cli.only, [Group::Restore, Group::Exec]);
        assert_eq!(cli.runs, 3);
        assert!(Cli::try_parse_from([
            "space-bench",
            "--kernel",
            "/k",
            "--rootfs",
            "/r",
            "--no-btrfs",
            "--dir",
            "/x"
        ])
        .is_err());
        assert!(Cli::try_parse_from([
            "space-bench",
            "--kernel",
            "/k",
            "--rootfs",
            "/r",
            "--only",
            "warp"
        ])
        .is_err());
    }

    #[test]
    fn cli_parses_the_egress_group() {
        use clap::CommandFactory as _;
        let args = [
            "space-bench",
            "egress",
            "--big-runs",
            "2",
            "--big-mib",
            "10",
        ];
        let cli = Cli::try_parse_from(args).unwrap();
        let Some(Command::Egress(e)) = &cli.command else {
            panic!("no egress command: {cli:?}");
        };
        assert_eq!((e.big_runs, e.big_mib), (2, 10));
        assert!(!runs_given(&Cli::command().get_matches_from(args)));
        for args in [
            ["space-bench", "egress", "--runs", "7"],
            ["space-bench", "--runs", "7", "egress"],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            assert_eq!(cli.runs, 7);
            assert!(
                runs_given(&Cli::command().get_matches_from(args)),
                "{args:?}"
            );
        }
        assert!(Cli::try_parse_from(["space-bench", "egress", "--big-mib", "0"]).is_err());
    }

    #[test]
    fn cli_parses_the_node_group() {
        let cli = Cli::try_parse_from([
            "space-bench",
            "node",
            "--runs",
            "25",
            "--only",
            "pool,memory",
            "--pool-size",
            "3",
            "--kernel",
            "/k",
        ])
        .unwrap();
        assert_eq!(cli.runs, 25);
        assert_eq!(cli.kernel.as_deref(), Some(Path::new("/k")));
        let Some(Command::Node(args)) = &cli.command else {
            panic!("no node command: {cli:?}");
        };
        assert_eq!(args.only, [NodeGroup::Pool, NodeGroup::Memory]);
        assert_eq!((args.pool_size, args.idle), (3, 20));
        // A pool of one cannot refill while a take is served.
        assert!(Cli::try_parse_from(["space-bench", "node", "--pool-size", "1"]).is_err());
        assert!(Cli::try_parse_from(["space-bench", "node", "--only", "boot"]).is_err());
    }
}
