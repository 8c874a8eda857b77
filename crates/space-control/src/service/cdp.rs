//! The server's own DevTools (CDP) client on a sandbox's browser: over tunnels to the guest's
//! port 9222 it reads the browser's JSON endpoints and calls methods on the page in front.
//! Everything the guest's browser answers is hostile: bodies, messages and waits are bounded,
//! ids and shapes checked before use.

use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use space_node_api::SandboxId;
use tokio_tungstenite::tungstenite::Message;

use super::browser::CDP_PORT;
use super::Shared;
use crate::error::{ApiError, ApiResult};
use crate::store::Principal;

/// The most of a JSON endpoint's body read.
const MAX_JSON_BODY: usize = 256 << 10;
/// The largest DevTools message taken.
const MAX_MESSAGE: usize = 1 << 20;
/// How long one call may wait for its answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The most messages (events) skipped while waiting for one answer.
const MAX_SKIPPED: usize = 10_000;

fn not_running(id: &SandboxId) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::CONFLICT,
        "illegal_state",
        format!(
            "the browser of sandbox {id} is not running: POST /v1/sandboxes/{id}/browser starts it"
        ),
    )
}

/// `GET <path>` on the browser's DevTools port, as JSON.
pub async fn devtools_json(
    st: &Shared,
    who: Option<&Principal>,
    id: &SandboxId,
    path: &str,
) -> ApiResult<Value> {
    use http_body_util::BodyExt as _;
    let guest = st.guest(who, id).await?;
    let tunnel = guest.tcp(CDP_PORT).await.map_err(|_| not_running(id))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tunnel))
            .await
            .map_err(|e| ApiError::guest(format!("the browser's DevTools port: {e}")))?;
    tokio::spawn(conn);
    let req = http::Request::get(path)
        .header(http::header::HOST, format!("localhost:{CDP_PORT}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| ApiError::guest(format!("the browser's {path}: {e}")))?;
    let body = http_body_util::Limited::new(resp.into_body(), MAX_JSON_BODY)
        .collect()
        .await
        .map_err(|e| ApiError::guest(format!("the browser's {path}: {e}")))?
        .to_bytes();
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::guest(format!("the browser's {path} is not JSON: {e}")))
}

/// Whether `s` is shaped like a DevTools id (target, browser).
pub fn devtools_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A DevTools session on one page.
pub struct Page {
    ws: tokio_tungstenite::WebSocketStream<space_proto::client::TcpTunnel>,
    next: u64,
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Page").field("next", &self.next).finish()
    }
}

impl Page {
    /// Opens the page in front: the first page target the browser lists (it lists the most
    /// recently active first).
    pub async fn front(st: &Shared, who: Option<&Principal>, id: &SandboxId) -> ApiResult<Page> {
        let list = devtools_json(st, who, id, "/json/list").await?;
        let target = list
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["id"].as_str())
            .filter(|t| devtools_id(t))
            .ok_or_else(|| {
                ApiError::new(
                    axum::http::StatusCode::CONFLICT,
                    "illegal_state",
                    format!("the browser of sandbox {id} has no page open"),
                )
            })?
            .to_owned();
        let guest = st.guest(who, id).await?;
        let tunnel = guest.tcp(CDP_PORT).await.map_err(|_| not_running(id))?;
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let url = format!("ws://localhost:{CDP_PORT}/devtools/page/{target}");
        let (ws, _) = tokio_tungstenite::client_async_with_config(url, tunnel, Some(config))
            .await
            .map_err(|e| ApiError::guest(format!("the page's DevTools WebSocket: {e}")))?;
        Ok(Page { ws, next: 1 })
    }

    /// Calls `method` with `params`; answers its `result`.
    pub async fn call(&mut self, method: &str, params: Value) -> ApiResult<Value> {
        let id = self.next;
        self.next += 1;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        self.ws
            .send(Message::text(msg))
            .await
            .map_err(|e| ApiError::guest(format!("DevTools {method}: {e}")))?;
        let wait = async {
            for _ in 0..MAX_SKIPPED {
                let m = match self.ws.next().await {
                    Some(Ok(m)) => m,
                    Some(Err(e)) => return Err(ApiError::guest(format!("DevTools {method}: {e}"))),
                    None => return Err(ApiError::guest(format!("DevTools {method}: closed"))),
                };
                let Message::Text(text) = m else { continue };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if v["id"].as_u64() != Some(id) {
                    continue;
                }
                if let Some(e) = v.get("error") {
                    let text: String = e["message"]
                        .as_str()
                        .unwrap_or("an error")
                        .chars()
                        .take(500)
                        .collect();
                    return Err(ApiError::guest(format!("DevTools {method}: {text}")));
                }
                return Ok(v["result"].clone());
            }
            Err(ApiError::guest(format!(
                "DevTools {method}: no answer among {MAX_SKIPPED} messages"
            )))
        };
        tokio::time::timeout(CALL_TIMEOUT, wait)
            .await
            .map_err(|_| {
                ApiError::guest(format!("DevTools {method}: no answer in {CALL_TIMEOUT:?}"))
            })?
    }

    /// Evaluates `expression` in a world of its own on the page's main frame (page scripts
    /// share the DOM with it, not their globals, so they cannot hook what it calls); answers
    /// the value it returns.
    pub async fn evaluate_isolated(&mut self, expression: &str) -> ApiResult<Value> {
        let tree = self.call("Page.getFrameTree", json!({})).await?;
        let frame = tree["frameTree"]["frame"]["id"]
            .as_str()
            .filter(|f| devtools_id(f))
            .ok_or_else(|| ApiError::guest("the page has no main frame"))?
            .to_owned();
        let world = self
            .call(
                "Page.createIsolatedWorld",
                json!({"frameId": frame, "worldName": "space", "grantUniveralAccess": false}),
            )
            .await?;
        let context = world["executionContextId"]
            .as_i64()
            .ok_or_else(|| ApiError::guest("no isolated world on the page"))?;
        let out = self
            .call(
                "Runtime.evaluate",
                json!({
                    "expression": expression,
                    "contextId": context,
                    "returnByValue": true,
                    "awaitPromise": false,
                }),
            )
            .await?;
        if let Some(ex) = out.get("exceptionDetails") {
            let text: String = ex["exception"]["description"]
                .as_str()
                .or_else(|| ex["text"].as_str())
                .unwrap_or("an exception")
                .chars()
                .take(500)
                .collect();
            return Err(ApiError::guest(format!("on the page: {text}")));
        }
        Ok(out["result"]["value"].clone())
    }
}
