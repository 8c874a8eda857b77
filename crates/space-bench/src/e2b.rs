//! The E2B facade against space's own API, on one server in one run: the official E2B
//! Python SDK and space's Python SDK, alternating, drive the same server with a warm pool
//! of `base` (the template the E2B SDK's default user lives in).
//!
//! The server runs here (as `space up` does, on a fresh loop-mounted btrfs data directory);
//! the measuring is `compat/e2b/python/bench.py`, run with the E2B venv's Python
//! (`scripts/e2b-env.sh`) and `sdk/python` on its path:
//!
//! 1. **Create to first command**: `Sandbox.create` then `commands.run("true")` through the
//!    E2B SDK, against `Sandbox.create` then `exec(["true"])` through space's SDK; the pool
//!    full before each, which goes first alternating.
//! 2. **Command round trip** on one running sandbox reached through both APIs:
//!    `commands.run("true")` (envd's Connect stream) against `/v1` exec of the same
//!    `bash -l -c true`.
//!
//! Nothing is asserted; the table is for reading.

use std::future::Future;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context as _, Result};
use space_control::server::Server;

use crate::api::Served;
use crate::bench::progress;
use crate::node::DataDir;

/// The template both SDKs create from.
const TEMPLATE: &str = "base";

/// What the E2B benchmark runs.
pub struct E2bPlan {
    /// Counted create-to-first-command pairs.
    pub runs: usize,
    /// Counted command round trips per SDK.
    pub round_trips: usize,
    /// Warm-pool members of `base`.
    pub pool_size: usize,
    /// Guest kernel.
    pub kernel: PathBuf,
    /// The `base` root image.
    pub rootfs: PathBuf,
    /// QEMU binary.
    pub qemu: PathBuf,
    /// The Python with the E2B SDK (`target/space/venv-e2b/bin/python`).
    pub python: PathBuf,
    /// The repository's root (for `compat/e2b/python/bench.py` and `sdk/python`).
    pub repo: PathBuf,
}

/// Runs the benchmark; `interrupted` ends it early (with everything cleaned up).
pub async fn run(plan: &E2bPlan, interrupted: impl Future<Output = &'static str>) -> Result<()> {
    let script = plan.repo.join("compat/e2b/python/bench.py");
    if !script.is_file() {
        bail!("{} is missing", script.display());
    }
    if !plan.python.is_file() {
        bail!(
            "{} is missing: run scripts/e2b-env.sh (make test does)",
            plan.python.display()
        );
    }
    let mut dir = DataDir::with_prefix("space-bench-e2b-")?;
    let mut slot: Option<Server> = None;
    let result = tokio::select! {
        r = measure(plan, &dir, &script, &mut slot) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    if let Some(server) = slot.take() {
        crate::api::stop_server(server).await;
    }
    let cleaned = tokio::task::block_in_place(|| dir.cleanup());
    crate::bench::with_cleanup(result, cleaned)
}

async fn measure(
    plan: &E2bPlan,
    dir: &DataDir,
    script: &std::path::Path,
    slot: &mut Option<Server>,
) -> Result<()> {
    progress("starting the server (builds the base template)");
    let served = Served {
        template: TEMPLATE,
        rootfs: &plan.rootfs,
        kernel: &plan.kernel,
        qemu: &plan.qemu,
        pool_size: plan.pool_size,
    };
    let server = Server::start(served.config(dir, false))
        .await
        .context("starting the server (needs root for the loop-mounted btrfs image)")?;
    let key = server
        .bootstrap_key()
        .context("a fresh data directory should print a bootstrap key")?
        .to_owned();
    let url = server.url();
    *slot = Some(server);
    println!("host:        {}", crate::host::host_summary());
    println!(
        "\nThe E2B Python SDK against space's Python SDK, one server ({url}), template {TEMPLATE} \
         with a warm pool of {}; {} create pairs, {} round trips each\n",
        plan.pool_size, plan.runs, plan.round_trips
    );
    let status = tokio::process::Command::new(&plan.python)
        .arg(script)
        .args(["--runs", &plan.runs.to_string()])
        .args(["--round-trips", &plan.round_trips.to_string()])
        .args(["--template", TEMPLATE])
        .env("SPACE_URL", &url)
        .env("SPACE_API_KEY", &key)
        .env("PYTHONPATH", plan.repo.join("sdk/python"))
        // The SDK's own settings of the caller's shell must not point it elsewhere.
        .env("E2B_API_URL", &url)
        .env("E2B_SANDBOX_URL", &url)
        .env("E2B_API_KEY", &key)
        .env_remove("E2B_DOMAIN")
        .kill_on_drop(true)
        .status()
        .await
        .with_context(|| format!("running {}", plan.python.display()))?;
    if !status.success() {
        bail!("{} ended with {status}", script.display());
    }
    Ok(())
}
