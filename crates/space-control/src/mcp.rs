//! `/mcp`: the MCP server (`space_mcp`, `docs/mcp.md`) over Streamable HTTP on the API
//! listener.
//!
//! Every request to `/mcp` is authenticated like any API request (a missing or wrong key is
//! `401` in the API's error format, before the MCP layer sees it). A tool call then calls the
//! service layer in process ([`InProcess`]), with the `Authorization` of the HTTP request
//! that carried it: the tool may do exactly what the key may, is scoped to its tenant, and is
//! audited and counted under the API operation it performs.

use std::sync::Arc;

use axum::extract::{FromRequestParts as _, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use space_mcp::{Operations, SpaceMcp};

use crate::api::{Caller, Shared};
use crate::service::in_process::InProcess;

/// The path the MCP server answers at.
pub const PATH: &str = "/mcp";

/// Largest MCP request body (a `write_file` of a 1 MiB file as base64, with room).
const MAX_REQUEST: usize = 8 << 20;

/// Refuses `/mcp` requests without a valid key, in the API's error format.
async fn authenticate(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    if let Err(e) = Caller::from_request_parts(&mut parts, &state).await {
        return e.into_response();
    }
    next.run(Request::from_parts(parts, body)).await
}

/// The `/mcp` routes, whose tools call the service layer in process.
pub fn routes(state: Shared) -> Router<Shared> {
    let ops: Arc<dyn Operations> = Arc::new(InProcess::new(state.clone()));
    let server = SpaceMcp::new(ops);
    // The Host check guards servers without authentication against DNS rebinding; every
    // request here carries a key, and the server answers on whatever names it is given.
    let config = StreamableHttpServerConfig::default()
        .disable_allowed_hosts()
        .with_max_request_body_bytes(MAX_REQUEST);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    Router::new()
        .route_service(PATH, service)
        .layer(axum::middleware::from_fn_with_state(state, authenticate))
}
