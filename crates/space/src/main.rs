//! The `space` command line.
//!
//! `space up` runs the platform on its embedded defaults. Until the node and control plane
//! exist it boots one demo sandbox from the stock `minimal` template, shows that it answers,
//! and keeps it running until interrupted. `space run` boots a sandbox, runs one command in it,
//! streams the output and exits with the command's status.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use rand::RngCore;
use space_proto::client::{ExecOutput, GuestClient};
use space_proto::types::{ExecSpec, Identity};
use space_runtime::{BootSpec, QemuRuntime, QemuRuntimeConfig, QemuVm, Runtime, Vm};

#[derive(Parser)]
#[command(
    name = "space",
    version,
    about = "Sandboxes for AI agents, in microVMs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run space on its embedded defaults (boots a demo sandbox and keeps it up).
    Up(GuestArgs),
    /// Boot a sandbox, run one command in it, and exit with its status.
    Run {
        #[command(flatten)]
        guest: GuestArgs,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true)]
        argv: Vec<String>,
    },
}

#[derive(Args)]
struct GuestArgs {
    /// Guest kernel (uncompressed vmlinux).
    #[arg(long, env = "SPACE_KERNEL")]
    kernel: PathBuf,
    /// Root filesystem image the sandbox starts from (it is cloned, never written).
    #[arg(long, env = "SPACE_ROOTFS_MINIMAL")]
    rootfs: PathBuf,
    /// Where sandbox directories live.
    #[arg(long, env = "SPACE_DATA", default_value = "/var/lib/space")]
    data: PathBuf,
    /// vCPUs of the sandbox.
    #[arg(long, default_value_t = 1)]
    vcpus: u32,
    /// Memory of the sandbox in MiB.
    #[arg(long, default_value_t = 256)]
    memory_mib: u64,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    let code = runtime.block_on(async {
        match cli.command {
            Command::Up(args) => up(args).await.map(|()| 0),
            Command::Run { guest, argv } => run(guest, argv).await,
        }
    })?;
    std::process::exit(code);
}

/// A booted sandbox whose directory is removed when it is dropped.
struct Sandbox {
    id: String,
    vm: QemuVm,
    client: GuestClient,
    dir: PathBuf,
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // The VM handle kills QEMU when it drops; the directory is ours to remove.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn new_id() -> String {
    let mut bytes = [0u8; 6];
    rand::thread_rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sbx-{hex}")
}

async fn boot(args: &GuestArgs) -> Result<Sandbox> {
    for (what, path) in [("kernel", &args.kernel), ("rootfs", &args.rootfs)] {
        if !path.is_file() {
            bail!(
                "{what} {} does not exist; `make up` builds it",
                path.display()
            );
        }
    }
    let runtime = QemuRuntime::new(QemuRuntimeConfig::default()).await?;
    let id = new_id();
    let dir = args.data.join("sandboxes").join(&id);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let started = Instant::now();
    let booted = async {
        let vm = runtime
            .boot(BootSpec {
                dir: dir.clone(),
                kernel: args.kernel.clone(),
                rootfs: args.rootfs.clone(),
                vcpus: args.vcpus,
                memory_mib: args.memory_mib,
                kernel_cmdline: None,
            })
            .await?;
        let client = vm.wait_ready(Duration::from_secs(60)).await?;
        anyhow::Ok((vm, client))
    }
    .await;
    let (vm, client) = match booted {
        Ok(v) => v,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let sandbox = Sandbox {
        id: id.clone(),
        vm,
        client,
        dir,
    };
    let mut entropy = vec![0u8; 64];
    rand::thread_rng().fill_bytes(&mut entropy);
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
    sandbox
        .client
        .identity(&Identity {
            sandbox_id: id.clone(),
            entropy,
            time_unix_ns: Some(now.as_nanos() as u64),
            hostname: Some(id.clone()),
            env: Default::default(),
        })
        .await?;
    tracing::info!(
        sandbox = %id,
        accel = %runtime.accel(),
        ready_ms = started.elapsed().as_millis() as u64,
        "sandbox ready"
    );
    Ok(sandbox)
}

async fn up(args: GuestArgs) -> Result<()> {
    let sandbox = boot(&args).await?;
    let out = sandbox
        .client
        .run(ExecSpec::shell(
            "echo \"hostname: $(hostname)\"; echo \"kernel:   $(uname -r)\"; \
             echo \"cpus:     $(grep -c ^processor /proc/cpuinfo)\"",
        ))
        .await?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    println!(
        "sandbox {} is running in {}; press Ctrl-C to stop it",
        sandbox.id,
        display(sandbox.vm.dir())
    );
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        exit = sandbox.vm.wait() => bail!("the sandbox's VM exited: {exit}"),
    }
    println!("stopping {}", sandbox.id);
    // A clean shutdown lets the guest flush its disk; the kill below is the backstop.
    let _ = tokio::time::timeout(Duration::from_secs(5), sandbox.client.shutdown()).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), sandbox.vm.wait()).await;
    sandbox.vm.kill().await.ok();
    Ok(())
}

async fn run(args: GuestArgs, argv: Vec<String>) -> Result<i32> {
    let sandbox = boot(&args).await?;
    let mut exec = sandbox.client.exec(ExecSpec::argv(argv)).await?;
    if let Some(stdin) = exec.take_stdin() {
        stdin.close().await?;
    }
    while let Some(chunk) = exec.next_output().await? {
        match chunk {
            ExecOutput::Stdout(b) => std::io::stdout().write_all(&b)?,
            ExecOutput::Stderr(b) => std::io::stderr().write_all(&b)?,
        }
    }
    let status = exec.wait().await?;
    std::io::stdout().flush()?;
    sandbox.vm.kill().await.ok();
    Ok(status.exit_code.unwrap_or(1))
}

fn display(p: &Path) -> String {
    p.display().to_string()
}
