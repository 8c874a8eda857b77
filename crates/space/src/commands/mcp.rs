//! `space mcp`: the MCP server (`space_mcp`) on stdin/stdout for a local agent, its tools
//! calling the API over the network with this CLI's URL and key.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use rmcp::ServiceExt as _;
use space_mcp::{Operations, SpaceMcp};

use crate::cli::McpArgs;
use crate::client::Client;

/// Serves until the agent closes stdin.
pub async fn serve(client: &Client, args: McpArgs) -> Result<()> {
    if args.print_config {
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "space".into());
        let snippet = serde_json::json!({
            "mcpServers": {"space": {"command": exe, "args": ["mcp"],
                                     "env": {"SPACE_URL": client.base()}}}
        });
        println!("{}", serde_json::to_string_pretty(&snippet)?);
        return Ok(());
    }
    let ops: Arc<dyn Operations> = Arc::new(client.clone());
    let running = SpaceMcp::new(ops)
        .serve(rmcp::transport::stdio())
        .await
        .context("starting the MCP session on stdin/stdout")?;
    running
        .waiting()
        .await
        .context("serving MCP on stdin/stdout")?;
    Ok(())
}
