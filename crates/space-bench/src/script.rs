//! A server in this process, measured by a client SDK's script: the groups whose clients are
//! other people's SDKs (E2B's, MCP's) run `space up`'s server here, on a fresh loop-mounted
//! btrfs data directory with a warm pool, and a Python script of `compat/` prints the table.

use std::future::Future;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context as _, Result};
use space::host::{Host, HostConfig};

use crate::api::Served;
use crate::bench::progress;
use crate::node::DataDir;

/// What a script-measured group runs.
pub struct ScriptPlan {
    /// The group's name (the data directory's prefix).
    pub group: &'static str,
    /// The line printed above the script's table; `{url}` is replaced by the server's URL.
    pub header: String,
    /// The template the pool keeps warm.
    pub template: &'static str,
    /// Warm-pool members.
    pub pool_size: usize,
    /// Guest kernel.
    pub kernel: PathBuf,
    /// The template's root image.
    pub rootfs: PathBuf,
    /// QEMU binary.
    pub qemu: PathBuf,
    /// The Python with the SDK, and the script that says how to install it when missing.
    pub python: PathBuf,
    /// The script that makes `python`'s venv.
    pub installer: &'static str,
    /// The measuring script.
    pub script: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment besides `SPACE_URL`, `SPACE_API_KEY` and `SPACE_DATA_DIR`; `{url}` and
    /// `{key}` in a value are replaced.
    pub env: Vec<(String, String)>,
    /// Environment variables removed (the caller's shell may have set them).
    pub unset: Vec<&'static str>,
    /// Changes to the server's configuration beyond the one pooled template (more images,
    /// templates prepared in the background).
    pub configure: Option<Configure>,
}

/// The environment of a script that drives the server through an E2B SDK: space's Python SDK
/// from `repo` on the path, the E2B SDK's variables pointed at the server (the caller's
/// shell's own must not point it elsewhere).
pub fn e2b_env(repo: &std::path::Path) -> Vec<(String, String)> {
    vec![
        (
            "PYTHONPATH".into(),
            repo.join("sdk/python").display().to_string(),
        ),
        ("E2B_API_URL".into(), "{url}".into()),
        ("E2B_SANDBOX_URL".into(), "{url}".into()),
        ("E2B_API_KEY".into(), "{key}".into()),
    ]
}

/// A change to the server's configuration.
pub type Configure = Box<dyn Fn(&mut HostConfig) + Send + Sync>;

/// Runs the plan; `interrupted` ends it early (with everything cleaned up).
pub async fn run(plan: &ScriptPlan, interrupted: impl Future<Output = &'static str>) -> Result<()> {
    if !plan.script.is_file() {
        bail!("{} is missing", plan.script.display());
    }
    if !plan.python.is_file() {
        bail!(
            "{} is missing: run {} (make test does)",
            plan.python.display(),
            plan.installer
        );
    }
    let mut dir = DataDir::with_prefix(&format!("space-bench-{}-", plan.group))?;
    let mut slot: Option<Host> = None;
    let result = tokio::select! {
        r = measure(plan, &dir, &mut slot) => r,
        s = interrupted => Err(anyhow!("interrupted by {s}")),
    };
    if let Some(server) = slot.take() {
        crate::api::stop_server(server).await;
    }
    let cleaned = tokio::task::block_in_place(|| dir.cleanup());
    crate::bench::with_cleanup(result, cleaned)
}

async fn measure(plan: &ScriptPlan, dir: &DataDir, slot: &mut Option<Host>) -> Result<()> {
    progress(&format!(
        "starting the server (builds the {} template)",
        plan.template
    ));
    let served = Served {
        template: plan.template,
        rootfs: &plan.rootfs,
        kernel: &plan.kernel,
        qemu: &plan.qemu,
        pool_size: plan.pool_size,
        follow_demand: false,
    };
    let mut config = served.config(dir, false);
    if let Some(configure) = &plan.configure {
        configure(&mut config);
    }
    let server = Host::start(config)
        .await
        .context("starting the server (needs root for the loop-mounted btrfs image)")?;
    let key = server
        .bootstrap_key()
        .context("a fresh data directory should print a bootstrap key")?
        .to_owned();
    let url = server.url();
    *slot = Some(server);
    println!("host:        {}", crate::host::host_summary());
    println!("\n{}\n", plan.header.replace("{url}", &url));
    let mut cmd = tokio::process::Command::new(&plan.python);
    cmd.arg(&plan.script)
        .args(&plan.args)
        .env("SPACE_URL", &url)
        .env("SPACE_API_KEY", &key)
        .env("SPACE_DATA_DIR", dir.data());
    for (k, v) in &plan.env {
        cmd.env(k, v.replace("{url}", &url).replace("{key}", &key));
    }
    for k in &plan.unset {
        cmd.env_remove(k);
    }
    let status = cmd
        .kill_on_drop(true)
        .status()
        .await
        .with_context(|| format!("running {}", plan.python.display()))?;
    if !status.success() {
        bail!("{} ended with {status}", plan.script.display());
    }
    Ok(())
}
