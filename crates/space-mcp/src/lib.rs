//! The Model Context Protocol server of space (`docs/mcp.md`): sandboxes as tools an agent
//! calls, to create them, run code, move files, snapshot, roll back and fork.
//!
//! - [`api`]: how tools reach the API ([`Operations`]), as the caller;
//! - [`tools`]: the tools, their input schemas and what each does;
//! - [`exec`]: commands run to their end, with bounded output;
//! - [`procs`]: background processes whose output is read later;
//! - [`progress`]: progress notifications for long calls.
//!
//! [`SpaceMcp`] is the server; `space mcp` serves it over stdio, and `space up` /
//! `space control` at `/mcp` over Streamable HTTP.

pub mod api;
pub mod exec;
pub mod procs;
pub mod progress;
pub mod tools;

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

pub use api::{Failure, Operations};

/// What the server tells the model about itself.
pub const INSTRUCTIONS: &str = "space runs sandboxes: isolated Linux microVMs for running code. \
Start with create_sandbox (template `base` has python3, curl and git) and keep its id. \
run_command runs a shell command and returns its exit code and output; start_process runs \
servers and other long jobs in the background (read_process_output reads them). read_file, \
write_file and list_directory move files. snapshot_sandbox before risky changes, \
rollback_sandbox to undo them, fork_sandbox to try two things at once. expose_port gives a \
URL for a port a program listens on. A sandbox left idle is suspended and wakes by itself \
when used. kill_sandbox when you are done.";

/// The MCP server over [`Operations`].
#[derive(Clone)]
pub struct SpaceMcp {
    ops: Arc<dyn Operations>,
}

impl SpaceMcp {
    /// A server whose tools call `ops`.
    pub fn new(ops: Arc<dyn Operations>) -> SpaceMcp {
        SpaceMcp { ops }
    }

    /// Every tool, as `tools/list` answers.
    pub fn tools() -> Vec<Tool> {
        tools::all().map(tool_of).collect()
    }
}

fn tool_of(spec: &tools::Spec) -> Tool {
    let mut annotations = ToolAnnotations::new();
    annotations.title = Some(spec.title.to_owned());
    annotations.read_only_hint = Some(spec.read_only);
    annotations.destructive_hint = Some(spec.destructive);
    annotations.open_world_hint = Some(false);
    let mut tool = Tool::new(spec.name, spec.description, (spec.schema)());
    tool.title = Some(spec.title.to_owned());
    tool.annotations = Some(annotations);
    tool
}

impl ServerHandler for SpaceMcp {
    fn get_info(&self) -> ServerConfig {
        let mut config = ServerConfig::new(ServerCapabilities::builder().enable_tools().build());
        config.server_info = Implementation::new("space", env!("CARGO_PKG_VERSION"));
        config.with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(SpaceMcp::tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools::all().find(|t| t.name == name).map(tool_of)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        if !tools::all().any(|t| t.name == name) {
            return Err(ErrorData::invalid_params(
                format!("there is no tool {name:?}; tools/list names the tools there are"),
                None,
            ));
        }
        // Over HTTP, each call carries its caller's key and the host it came to.
        let parts = context.extensions.get::<http::request::Parts>();
        let header = |h: http::header::HeaderName| parts.and_then(|p| p.headers.get(h)).cloned();
        let conn = api::Conn::new(
            self.ops.clone(),
            header(http::header::AUTHORIZATION),
            header(http::header::HOST),
        );
        let raw = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let progress = context
            .meta
            .get_progress_token()
            .map(|token| (context.peer.clone(), token));
        let status = progress::Status::default();
        let work = progress::reporting(
            progress,
            &name,
            &status,
            tools::call(&conn, &name, raw, &status),
        );
        let outcome = tokio::select! {
            out = work => out,
            _ = context.ct.cancelled() => Err(tools::ToolError(format!("{name} was cancelled"))),
        };
        let result = match outcome {
            Ok(done) => {
                let mut content = vec![ContentBlock::text(done.text)];
                if let Some((data, mime)) = done.image {
                    content.push(ContentBlock::image(data, mime));
                }
                let mut r = CallToolResult::success(content);
                if done.data.is_object() {
                    r.structured_content = Some(done.data);
                }
                r
            }
            Err(tools::ToolError(message)) => {
                CallToolResult::error(vec![ContentBlock::text(message)])
            }
        };
        Ok(result.into())
    }
}
