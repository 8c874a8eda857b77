//! The web console in the host's Chromium, on one server in one run: time to interactive of
//! the sandbox list with many sandboxes (cold and warm), the page's weight, and keystroke echo
//! latency in a sandbox's terminal through the console against `space shell`.
//!
//! The server runs here (as `space up` does, on a fresh loop-mounted btrfs data directory);
//! the measuring is `compat/console/bench_console.py`, run with the browser venv's Python
//! (`scripts/browser-env.sh`: Playwright, which drives Debian's Chromium). Nothing is
//! asserted; the tables are for reading.

use std::future::Future;
use std::path::PathBuf;

use anyhow::Result;

use crate::script::ScriptPlan;

/// The template the sandboxes are made of.
const TEMPLATE: &str = "base";

/// What the console benchmark runs.
pub struct ConsolePlan {
    /// Sandboxes on the list.
    pub sandboxes: usize,
    /// Of which stay running (the rest are suspended).
    pub running: usize,
    /// Loads of the list, each cold and warm.
    pub loads: usize,
    /// Keystrokes per way.
    pub keystrokes: usize,
    /// Guest kernel.
    pub kernel: PathBuf,
    /// The `base` root image.
    pub rootfs: PathBuf,
    /// QEMU binary.
    pub qemu: PathBuf,
    /// The Python with Playwright (`target/space/venv-browser/bin/python`).
    pub python: PathBuf,
    /// The `space` binary (`space shell`).
    pub space: PathBuf,
    /// The repository's root (for the script).
    pub repo: PathBuf,
}

/// Runs the benchmark; `interrupted` ends it early (with everything cleaned up).
pub async fn run(
    plan: &ConsolePlan,
    interrupted: impl Future<Output = &'static str>,
) -> Result<()> {
    let script = ScriptPlan {
        group: "console",
        header: format!(
            "The web console in Chromium against one server ({{url}}): the list with {} \
             sandboxes of {TEMPLATE} ({} running), {} loads; {} keystrokes each way",
            plan.sandboxes, plan.running, plan.loads, plan.keystrokes
        ),
        template: TEMPLATE,
        pool_size: 2,
        kernel: plan.kernel.clone(),
        rootfs: plan.rootfs.clone(),
        qemu: plan.qemu.clone(),
        python: plan.python.clone(),
        installer: "scripts/browser-env.sh",
        script: plan.repo.join("compat/console/bench_console.py"),
        args: vec![
            "--template".into(),
            TEMPLATE.into(),
            "--sandboxes".into(),
            plan.sandboxes.to_string(),
            "--running".into(),
            plan.running.to_string(),
            "--loads".into(),
            plan.loads.to_string(),
            "--keystrokes".into(),
            plan.keystrokes.to_string(),
        ],
        env: vec![("SPACE_BIN".into(), plan.space.display().to_string())],
        unset: vec![],
        configure: None,
    };
    crate::script::run(&script, interrupted).await
}
