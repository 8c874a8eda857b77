//! How the tools reach the public HTTP API (`docs/api.md`): an [`Api`] sends one request and
//! hands back the status and the streamed body. `space mcp` sends over the network with the
//! CLI's key; the server's `/mcp` route sends to its own router, in process, with the key the
//! MCP request came with, so a tool can do exactly what its caller's key may do and nothing
//! else, and every call is authenticated, scoped and audited like any other.

use std::future::Future;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt as _;
use http::{HeaderValue, Method};
use serde_json::Value;

/// The most of a JSON answer read (lists of sandboxes or snapshots are far smaller).
const MAX_JSON: usize = 16 << 20;
/// The most of an error body read.
const MAX_ERROR: usize = 64 << 10;

/// A request body.
#[derive(Debug, Clone)]
pub enum Body {
    /// No body.
    Empty,
    /// A JSON document (`Content-Type: application/json`).
    Json(Value),
    /// Raw bytes (`Content-Type: application/octet-stream`).
    Raw(Bytes),
}

/// One request to the API.
#[derive(Debug, Clone)]
pub struct Call {
    /// The method.
    pub method: Method,
    /// The path and query (`/v1/sandboxes?state=running`), already encoded.
    pub path: String,
    /// The body.
    pub body: Body,
    /// The `Authorization` of the MCP request this call serves, when it came over HTTP; an
    /// [`Api`] with a key of its own ignores it.
    pub authorization: Option<HeaderValue>,
    /// The `Host` the MCP request came to, so that URLs the API makes (exposed ports) name
    /// the host the client used.
    pub host: Option<HeaderValue>,
}

/// A streamed body of an answer.
pub type ByteStream = BoxStream<'static, Result<Bytes, String>>;

/// The API's answer.
pub struct Reply {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: ByteStream,
}

/// The future an [`Api`] returns.
pub type Sending<'a> = Pin<Box<dyn Future<Output = Result<Reply, String>> + Send + 'a>>;

/// Sends requests to the public API. An error is a failure to reach it (the message says
/// why); every answer, error statuses included, is a [`Reply`].
pub trait Api: Send + Sync + 'static {
    /// Sends `call`.
    fn send(&self, call: Call) -> Sending<'_>;
}

/// An error of the API, or a failure to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The HTTP status (0: the API was not reached, or its stream broke).
    pub status: u16,
    /// The API's stable error code (`sandbox_not_found`, ...).
    pub code: String,
    /// The message for people.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl Failure {
    /// A failure that is not an API answer.
    pub fn local(code: &str, message: impl Into<String>) -> Failure {
        Failure {
            status: 0,
            code: code.to_owned(),
            message: message.into(),
        }
    }

    /// Decodes an error body (`{"error": {"code", "message"}}`); anything else names the
    /// status and quotes the start of the body.
    pub fn from_body(status: u16, body: &[u8]) -> Failure {
        let parsed = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
            let e = v.get("error")?;
            Some((
                e.get("code")?.as_str()?.to_owned(),
                e.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            ))
        });
        match parsed {
            Some((code, message)) => Failure {
                status,
                code,
                message,
            },
            None => {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
                Failure {
                    status,
                    code: format!("http_{status}"),
                    message: format!("the API answered HTTP {status}: {}", text.trim()),
                }
            }
        }
    }
}

/// The API as one tool call sees it: an [`Api`] and the credentials of the call.
#[derive(Clone)]
pub struct Conn {
    api: std::sync::Arc<dyn Api>,
    authorization: Option<HeaderValue>,
    host: Option<HeaderValue>,
}

impl Conn {
    /// A connection through `api` with the caller's `authorization` and `host` (HTTP only).
    pub fn new(
        api: std::sync::Arc<dyn Api>,
        authorization: Option<HeaderValue>,
        host: Option<HeaderValue>,
    ) -> Conn {
        Conn {
            api,
            authorization,
            host,
        }
    }

    /// Sends a request; an error status is a [`Failure`] with the API's code.
    pub async fn send(&self, method: Method, path: String, body: Body) -> Result<Reply, Failure> {
        let call = Call {
            method,
            path,
            body,
            authorization: self.authorization.clone(),
            host: self.host.clone(),
        };
        let reply = self.api.send(call).await.map_err(|e| {
            Failure::local("unreachable", format!("the space API is unreachable: {e}"))
        })?;
        if reply.status >= 400 {
            let status = reply.status;
            let (body, _) = read_capped(reply.body, MAX_ERROR).await;
            return Err(Failure::from_body(status, &body));
        }
        Ok(reply)
    }

    /// Sends a request and decodes its JSON answer (`null` for an empty one).
    pub async fn json(&self, method: Method, path: String, body: Body) -> Result<Value, Failure> {
        let reply = self.send(method, path, body).await?;
        let (bytes, total) = read_capped(reply.body, MAX_JSON).await;
        if total > MAX_JSON as u64 {
            return Err(Failure::local(
                "invalid_response",
                format!("the API answered more than {MAX_JSON} bytes of JSON"),
            ));
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            Failure::local(
                "invalid_response",
                format!("the API answered something that is not JSON: {e}"),
            )
        })
    }

    /// `GET` of `path` as JSON.
    pub async fn get(&self, path: String) -> Result<Value, Failure> {
        self.json(Method::GET, path, Body::Empty).await
    }

    /// `POST` of `body` to `path` as JSON.
    pub async fn post(&self, path: String, body: Value) -> Result<Value, Failure> {
        self.json(Method::POST, path, Body::Json(body)).await
    }
}

/// Reads a body, keeping at most `cap` bytes and counting all of them; a broken stream ends
/// the read where it broke.
pub async fn read_capped(mut body: ByteStream, cap: usize) -> (Vec<u8>, u64) {
    let mut kept = BytesMut::new();
    let mut total = 0u64;
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        total += chunk.len() as u64;
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    (kept.to_vec(), total)
}

/// Encodes one path segment or query value: unreserved characters stay, the rest is `%XX`.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_decode_and_others_are_quoted() {
        let f = Failure::from_body(
            404,
            br#"{"error": {"code": "sandbox_not_found", "message": "no sandbox sbx-1"}}"#,
        );
        assert_eq!((f.status, f.code.as_str()), (404, "sandbox_not_found"));
        assert_eq!(f.message, "no sandbox sbx-1");
        let f = Failure::from_body(502, b"<html>bad gateway</html>");
        assert_eq!(f.code, "http_502");
        assert!(f.message.contains("bad gateway"), "{}", f.message);
    }

    #[test]
    fn encoding_keeps_unreserved_and_escapes_the_rest() {
        assert_eq!(enc("/tmp/a b&c=d"), "%2Ftmp%2Fa%20b%26c%3Dd");
        assert_eq!(enc("sbx-00ff_~."), "sbx-00ff_~.");
        assert_eq!(enc("é"), "%C3%A9");
    }

    #[tokio::test]
    async fn capped_reads_count_everything_and_keep_the_cap() {
        let chunks: Vec<Result<Bytes, String>> = vec![
            Ok(Bytes::from_static(b"hello ")),
            Ok(Bytes::from_static(b"world")),
        ];
        let (kept, total) = read_capped(futures::stream::iter(chunks).boxed(), 8).await;
        assert_eq!((kept.as_slice(), total), (&b"hello wo"[..], 11));
    }
}
