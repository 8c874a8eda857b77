//! `space mcp`: the MCP server (`space_mcp`) on stdin/stdout for a local agent, its tools
//! calling the API over the network with this CLI's URL and key.

use std::sync::Arc;

use anyhow::{Context as _, Result};
use futures::{StreamExt as _, TryStreamExt as _};
use rmcp::ServiceExt as _;
use space_mcp::{Api, Call, Reply, SpaceMcp};

use crate::cli::McpArgs;
use crate::client::Client;

/// The API over the network.
struct Network {
    client: Client,
}

impl Api for Network {
    fn send(&self, call: Call) -> space_mcp::api::Sending<'_> {
        Box::pin(async move {
            let method = reqwest::Method::from_bytes(call.method.as_str().as_bytes())
                .map_err(|e| e.to_string())?;
            let mut req = self.client.request(method, &call.path);
            req = match call.body {
                space_mcp::Body::Empty => req,
                space_mcp::Body::Json(v) => req.json(&v),
                space_mcp::Body::Raw(b) => req
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(b),
            };
            let resp = req
                .send()
                .await
                .map_err(|e| self.client.transport_error(e).to_string())?;
            let status = resp.status().as_u16();
            let body = resp.bytes_stream().map_err(|e| e.to_string()).boxed();
            Ok(Reply { status, body })
        })
    }
}

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
    let api: Arc<dyn Api> = Arc::new(Network {
        client: client.clone(),
    });
    let running = SpaceMcp::new(api)
        .serve(rmcp::transport::stdio())
        .await
        .context("starting the MCP session on stdin/stdout")?;
    running
        .waiting()
        .await
        .context("serving MCP on stdin/stdout")?;
    Ok(())
}
