//! The MCP server against the REST API, on one server in one run: the official MCP Python
//! SDK calls `run_command` over stdio (`space mcp`, a child process of the script) and over
//! Streamable HTTP (`/mcp`), and the same command goes through `POST /v1/sandboxes/{id}/exec`
//! with a plain HTTP client, all on one running sandbox, round robin.
//!
//! The server runs here (as `space up` does); the measuring is `compat/mcp/python/bench.py`,
//! run with the MCP venv's Python (`scripts/mcp-env.sh`). Nothing is asserted; the table is
//! for reading.

use std::future::Future;
use std::path::PathBuf;

use anyhow::Result;

use crate::script::ScriptPlan;

/// The template the sandbox is made from.
const TEMPLATE: &str = "base";

/// What the MCP benchmark runs.
pub struct McpPlan {
    /// Counted round trips per way.
    pub round_trips: usize,
    /// Guest kernel.
    pub kernel: PathBuf,
    /// The `base` root image.
    pub rootfs: PathBuf,
    /// QEMU binary.
    pub qemu: PathBuf,
    /// The Python with the MCP SDK (`target/space/venv-mcp/bin/python`).
    pub python: PathBuf,
    /// The `space` binary the script starts as `space mcp`.
    pub space: PathBuf,
    /// The repository's root (for `compat/mcp/python/bench.py`).
    pub repo: PathBuf,
}

/// Runs the benchmark; `interrupted` ends it early (with everything cleaned up).
pub async fn run(plan: &McpPlan, interrupted: impl Future<Output = &'static str>) -> Result<()> {
    let script = ScriptPlan {
        group: "mcp",
        header: format!(
            "run_command over MCP (stdio and HTTP) against the REST exec, one server ({{url}}), \
             one {TEMPLATE} sandbox; {} round trips each, round robin",
            plan.round_trips
        ),
        template: TEMPLATE,
        pool_size: 1,
        kernel: plan.kernel.clone(),
        rootfs: plan.rootfs.clone(),
        qemu: plan.qemu.clone(),
        python: plan.python.clone(),
        installer: "scripts/mcp-env.sh",
        script: plan.repo.join("compat/mcp/python/bench.py"),
        args: vec![
            "--round-trips".into(),
            plan.round_trips.to_string(),
            "--template".into(),
            TEMPLATE.into(),
        ],
        env: vec![("SPACE_BIN".into(), plan.space.display().to_string())],
        unset: vec!["SPACE_CONFIG"],
        configure: None,
    };
    crate::script::run(&script, interrupted).await
}
