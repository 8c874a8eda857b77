//! The `space` command line: `space up` runs the platform on one host; every other command
//! is a client of its HTTP API (`docs/api.md`, `docs/cli.md`).

mod artifacts;
mod cli;
mod client;
mod commands;
mod config;
mod mint;
mod output;
mod term;
mod up;

use std::io::Write as _;

use clap::Parser as _;

use crate::cli::{Cli, Command};
use crate::client::ApiError;

fn main() {
    let cli = Cli::parse();
    if let Some(p) = &cli.profile {
        if !config::is_profile_name(p) {
            fail(&anyhow::anyhow!(
                "--profile {p:?} is not a profile name (1 to 64 of A-Z a-z 0-9 . _ -)"
            ));
        }
    }
    config::choose_profile(cli.profile.clone());
    let server_role = match &cli.command {
        Command::Up(_) | Command::Control(_) => true,
        Command::Node(a) => a.cmd.is_none(),
        _ => false,
    };
    // stdout carries the protocol under `space mcp`: its log goes to stderr, warnings only.
    let mcp = matches!(cli.command, Command::Mcp(_));
    if server_role || mcp {
        // rmcp logs every MCP session it serves at info.
        let default = if mcp { "warn" } else { "info,rmcp=warn" };
        tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| default.into()),
            )
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => fail(&anyhow::anyhow!("starting the async runtime: {e}")),
    };
    let json = cli.json;
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Up(a) => up::up(a).await.map(|()| 0),
            Command::Node(a) if a.cmd.is_none() => up::node(a).await.map(|()| 0),
            Command::Control(a) => up::control(a).await.map(|()| 0),
            Command::Purge(a) => up::purge(a).await.map(|()| 0),
            Command::AdminKey(a) => mint::admin_key(a, json).await.map(|()| 0),
            other => commands::run(other, json).await,
        }
    });
    let _ = std::io::stdout().flush();
    match result {
        // Background readers of stdin may still block: exit without waiting for them.
        Ok(code) => std::process::exit(code),
        Err(e) => fail(&e),
    }
}

/// Prints `error: <message> (<code>)` (or the error chain) on one line and exits 1.
fn fail(e: &anyhow::Error) -> ! {
    let line = match e.downcast_ref::<ApiError>() {
        Some(api) => api.to_string(),
        None => format!("{e:#}"),
    };
    let line: String = line
        .chars()
        .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
        .collect();
    eprintln!("error: {line}");
    std::process::exit(1);
}
