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
//!
//! With `--builds`, `compat/e2b/python/bench_builds.py` instead: creates from the template,
//! a full and a filesystem snapshot; taking each snapshot and a fork; `Template.build` cold
//! and cached.
//!
//! Nothing is asserted; the table is for reading.

use std::future::Future;
use std::path::PathBuf;

use anyhow::Result;

use crate::script::ScriptPlan;

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
    /// Measure snapshots, forks and template builds (this many builds each way) instead.
    pub builds: Option<usize>,
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
    let (header, script, args) = match plan.builds {
        None => (
            format!(
                "The E2B Python SDK against space's Python SDK, one server ({{url}}), template \
                 {TEMPLATE} with a warm pool of {}; {} create pairs, {} round trips each",
                plan.pool_size, plan.runs, plan.round_trips
            ),
            "compat/e2b/python/bench.py",
            vec![
                "--runs".into(),
                plan.runs.to_string(),
                "--round-trips".into(),
                plan.round_trips.to_string(),
                "--template".into(),
                TEMPLATE.into(),
            ],
        ),
        Some(builds) => (
            format!(
                "E2B snapshots, forks and template builds through the E2B Python SDK, one \
                 server ({{url}}), template {TEMPLATE} with a warm pool of {}; {} creates from \
                 each source, {builds} builds each way",
                plan.pool_size, plan.runs
            ),
            "compat/e2b/python/bench_builds.py",
            vec![
                "--runs".into(),
                plan.runs.to_string(),
                "--build-runs".into(),
                builds.to_string(),
                "--template".into(),
                TEMPLATE.into(),
            ],
        ),
    };
    let script = ScriptPlan {
        group: "e2b",
        header,
        template: TEMPLATE,
        pool_size: plan.pool_size,
        kernel: plan.kernel.clone(),
        rootfs: plan.rootfs.clone(),
        qemu: plan.qemu.clone(),
        python: plan.python.clone(),
        installer: "scripts/e2b-env.sh",
        script: plan.repo.join(script),
        args,
        env: crate::script::e2b_env(&plan.repo),
        unset: vec!["E2B_DOMAIN"],
        configure: None,
    };
    crate::script::run(&script, interrupted).await
}
