//! A desktop sandbox through the clients an agent uses, on one server in one run: create to
//! first screenshot (from the pool and without a pool member), per-action latency through
//! the e2b-desktop SDK, the native API and the MCP tools, the browser over CDP, and idle
//! memory, CPU and first-suspend size beside `base`.
//!
//! The server runs here (as `space up` does, on a fresh loop-mounted btrfs data directory)
//! with `desktop` (a warm pool), `desktop-cold` (the same image and shape, no pool) and
//! `base`; the measuring is `compat/e2b-desktop/python/bench.py`, run with the e2b-desktop
//! venv's Python (`scripts/e2b-env.sh`) and `sdk/python` on its path. Nothing is asserted;
//! the tables are for reading.

use std::future::Future;
use std::path::PathBuf;

use anyhow::Result;
use space::host::{ImageSource, Recipe};

use crate::script::ScriptPlan;

/// The pooled template.
const TEMPLATE: &str = "desktop";
/// The same image and shape without a pool.
const COLD: &str = "desktop-cold";

/// What the desktop benchmark runs.
pub struct DesktopPlan {
    /// Counted creates per way (pool, no pool member).
    pub runs: usize,
    /// Counted rounds of actions per client.
    pub actions: usize,
    /// Warm-pool members of `desktop`.
    pub pool_size: usize,
    /// Guest kernel.
    pub kernel: PathBuf,
    /// The `desktop` root image.
    pub rootfs: PathBuf,
    /// The `base` root image (the idle comparison).
    pub rootfs_base: PathBuf,
    /// QEMU binary.
    pub qemu: PathBuf,
    /// The Python with the e2b-desktop SDK (`target/space/venv-e2b-desktop/bin/python`).
    pub python: PathBuf,
    /// The repository's root (for the script and `sdk/python`).
    pub repo: PathBuf,
}

/// Runs the benchmark; `interrupted` ends it early (with everything cleaned up).
pub async fn run(
    plan: &DesktopPlan,
    interrupted: impl Future<Output = &'static str>,
) -> Result<()> {
    let desktop = plan.rootfs.clone();
    let base = plan.rootfs_base.clone();
    let configure = move |config: &mut space::host::HostConfig| {
        // Both desktop templates get the desktop's shape, so they are built after the start
        // (as `space up` prepares `desktop`) rather than as stock templates.
        config.stock_templates = vec!["base".to_owned()];
        config.images.insert("base".to_owned(), base.clone());
        for name in [TEMPLATE, COLD] {
            config.images.insert(name.to_owned(), desktop.clone());
            config.prepare.insert(
                name.to_owned(),
                Recipe {
                    image: ImageSource::Built(desktop.clone()),
                    expected: std::time::Duration::from_secs(60),
                    vcpus: space::host::DESKTOP_VCPUS,
                    memory_mib: space::host::DESKTOP_MEMORY_MIB,
                },
            );
        }
    };
    let script = ScriptPlan {
        group: "desktop",
        header: format!(
            "A desktop sandbox ({} vCPUs, {} MiB) on one server ({{url}}): {} with a warm pool \
             of {}, {} without one; {} creates per way, {} rounds of actions per client",
            space::host::DESKTOP_VCPUS,
            space::host::DESKTOP_MEMORY_MIB,
            TEMPLATE,
            plan.pool_size,
            COLD,
            plan.runs,
            plan.actions
        ),
        template: TEMPLATE,
        pool_size: plan.pool_size,
        kernel: plan.kernel.clone(),
        rootfs: plan.rootfs.clone(),
        qemu: plan.qemu.clone(),
        python: plan.python.clone(),
        installer: "scripts/e2b-env.sh",
        script: plan.repo.join("compat/e2b-desktop/python/bench.py"),
        args: vec![
            "--runs".into(),
            plan.runs.to_string(),
            "--actions".into(),
            plan.actions.to_string(),
        ],
        env: crate::script::e2b_env(&plan.repo),
        unset: vec!["E2B_DOMAIN", "E2B_DEBUG"],
        configure: Some(Box::new(configure)),
    };
    crate::script::run(&script, interrupted).await
}
