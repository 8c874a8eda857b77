//! `/mcp`: the MCP server (`space_mcp`, `docs/mcp.md`) over Streamable HTTP on the API
//! listener.
//!
//! Every request to `/mcp` is authenticated like any API request (a missing or wrong key is
//! `401` in the API's error format, before the MCP layer sees it). A tool call then goes to
//! the API router in process, with the `Authorization` of the HTTP request that carried it:
//! the tool may do exactly what the key may, is scoped to its tenant, and is audited and
//! counted under the API operation it performs.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{FromRequestParts as _, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::{StreamExt as _, TryStreamExt as _};
use http::header;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use space_mcp::{Api, Call, Reply, SpaceMcp};
use tower::ServiceExt as _;

use crate::api::{Caller, Shared};

/// The path the MCP server answers at.
pub const PATH: &str = "/mcp";

/// Largest MCP request body (a `write_file` of a 1 MiB file as base64, with room).
const MAX_REQUEST: usize = 8 << 20;

/// The API router, called in process.
struct InProcess {
    router: Router,
}

impl Api for InProcess {
    fn send(&self, call: Call) -> space_mcp::api::Sending<'_> {
        let router = self.router.clone();
        Box::pin(async move {
            let mut req = http::Request::builder().method(call.method).uri(&call.path);
            if let Some(a) = call.authorization {
                req = req.header(header::AUTHORIZATION, a);
            }
            if let Some(h) = call.host {
                req = req.header(header::HOST, h);
            }
            let body = match call.body {
                space_mcp::Body::Empty => Body::empty(),
                space_mcp::Body::Json(v) => {
                    req = req.header(header::CONTENT_TYPE, "application/json");
                    Body::from(serde_json::to_vec(&v).map_err(|e| e.to_string())?)
                }
                space_mcp::Body::Raw(b) => {
                    req = req.header(header::CONTENT_TYPE, "application/octet-stream");
                    req = req.header(header::CONTENT_LENGTH, b.len());
                    Body::from(b)
                }
            };
            let req = req.body(body).map_err(|e| e.to_string())?;
            let resp = router.oneshot(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .into_data_stream()
                .map_err(|e| e.to_string())
                .boxed();
            Ok(Reply { status, body })
        })
    }
}

/// Refuses `/mcp` requests without a valid key, in the API's error format.
async fn authenticate(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let (mut parts, body) = req.into_parts();
    if let Err(e) = Caller::from_request_parts(&mut parts, &state).await {
        return e.into_response();
    }
    next.run(Request::from_parts(parts, body)).await
}

/// The `/mcp` routes, whose tools call `api`.
pub fn routes(state: Shared, api: Router) -> Router<Shared> {
    let backend: Arc<dyn Api> = Arc::new(InProcess { router: api });
    let server = SpaceMcp::new(backend);
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
