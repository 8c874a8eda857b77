//! A client of the public HTTP API (`docs/api.md`): JSON requests, error decoding, streamed
//! bodies and WebSocket connections, all authenticated with the configured key.

use std::fmt;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use crate::config::Settings;

/// An open WebSocket to the server.
pub type WebSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The most of an error body read (errors are one short JSON object).
const MAX_ERROR_BODY: usize = 64 * 1024;

/// An error the API answered with: its stable code and its message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status (0 for an error reported inside a stream).
    pub status: u16,
    /// The stable error code (`sandbox_not_found`, ...).
    pub code: String,
    /// The message for people.
    pub message: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    /// Decodes an error body (`{"error": {"code", "message"}}`); anything else becomes an
    /// error that names the status and quotes the start of the body.
    pub fn from_body(status: u16, body: &[u8]) -> ApiError {
        let parsed: Option<(String, String)> =
            serde_json::from_slice::<Value>(body).ok().and_then(|v| {
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
            Some((code, message)) => ApiError {
                status,
                code,
                message,
            },
            None => {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
                let text = text.trim();
                ApiError {
                    status,
                    code: format!("http_{status}"),
                    message: if text.is_empty() {
                        format!("the server answered HTTP {status}")
                    } else {
                        format!("the server answered HTTP {status}: {text}")
                    },
                }
            }
        }
    }
}

/// The API client.
#[derive(Clone)]
pub struct Client {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl Client {
    /// A client for `settings`; fails when no key is configured.
    pub fn new(settings: &Settings) -> Result<Client> {
        let key = settings.api_key.clone().ok_or_else(|| {
            let path = crate::config::config_path()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|_| "the config file".into());
            anyhow!(
                "no API key: set SPACE_API_KEY, or put it in {path} (`space up` writes it on \
                 its first start)"
            )
        })?;
        if key.is_empty() || key.len() > 512 || key.chars().any(|c| !c.is_ascii_graphic()) {
            return Err(anyhow!(
                "the configured API key is malformed (expected space_<key id>_<secret>)"
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("space-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("setting up the HTTP client")?;
        Ok(Client {
            base: settings.url.clone(),
            key,
            http,
        })
    }

    /// The API's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request to `path` (which starts with `/`) with the key attached.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(&self.key)
    }

    /// Sends `req`; a non-2xx answer becomes an [`ApiError`], an unreachable server a
    /// one-line explanation.
    pub async fn send(&self, req: RequestBuilder) -> Result<Response> {
        let resp = req.send().await.map_err(|e| self.transport_error(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(error_of(resp).await.into())
    }

    /// Explains a failed request: unreachable servers get the hint that `space up` starts
    /// one.
    pub fn transport_error(&self, e: reqwest::Error) -> anyhow::Error {
        if e.is_connect() {
            anyhow!(
                "the server at {} is not reachable ({}); `space up` starts it",
                self.base,
                root_cause(&e)
            )
        } else if e.is_timeout() {
            anyhow!("the server at {} did not answer in time", self.base)
        } else {
            anyhow!("talking to the server at {}: {}", self.base, root_cause(&e))
        }
    }

    /// `GET path?query` and the decoded JSON answer.
    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(String, String)],
    ) -> Result<T> {
        let resp = self
            .send(self.request(Method::GET, path).query(query))
            .await?;
        decode(resp).await
    }

    /// `method path` with a JSON body and the decoded JSON answer.
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &Value,
    ) -> Result<T> {
        let resp = self.send(self.request(method, path).json(body)).await?;
        decode(resp).await
    }

    /// `POST path` with a JSON body.
    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &Value) -> Result<T> {
        self.call(Method::POST, path, body).await
    }

    /// `DELETE path`, ignoring any answer body.
    pub async fn delete(&self, path: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, path)).await?;
        Ok(())
    }

    /// Opens the WebSocket at `path`; an HTTP error on the upgrade becomes an [`ApiError`].
    pub async fn websocket(&self, path: &str) -> Result<WebSocket> {
        let url = if let Some(rest) = self.base.strip_prefix("https://") {
            format!("wss://{rest}{path}")
        } else if let Some(rest) = self.base.strip_prefix("http://") {
            format!("ws://{rest}{path}")
        } else {
            return Err(anyhow!("the server URL {} is not http(s)", self.base));
        };
        let mut req = url
            .as_str()
            .into_client_request()
            .with_context(|| format!("building the WebSocket request for {url}"))?;
        req.headers_mut().insert(
            tungstenite::http::header::AUTHORIZATION,
            format!("Bearer {}", self.key)
                .parse()
                .context("the API key is not a valid header value")?,
        );
        match tokio_tungstenite::connect_async(req).await {
            Ok((ws, _)) => Ok(ws),
            Err(tungstenite::Error::Http(resp)) => {
                let status = resp.status().as_u16();
                let body = resp.body().clone().unwrap_or_default();
                Err(ApiError::from_body(status, &body).into())
            }
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                Err(anyhow!(
                    "the server at {} is not reachable ({e}); `space up` starts it",
                    self.base
                ))
            }
            Err(e) => Err(anyhow!("opening a WebSocket to {url}: {e}")),
        }
    }
}

/// The [`ApiError`] in a failed response.
pub async fn error_of(resp: Response) -> ApiError {
    let status = resp.status();
    let body = read_limited(resp, MAX_ERROR_BODY).await;
    ApiError::from_body(status.as_u16(), &body)
}

async fn read_limited(mut resp: Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        let room = limit.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= limit {
            break;
        }
    }
    body
}

async fn decode<T: DeserializeOwned>(resp: Response) -> Result<T> {
    if resp.status() == StatusCode::NO_CONTENT {
        return serde_json::from_value(Value::Null).context("the server answered with no body");
    }
    let bytes = resp.bytes().await.context("reading the server's answer")?;
    serde_json::from_slice(&bytes).context("the server's answer is not the expected JSON")
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Percent-encodes a path segment (ids are validated by the server; this only keeps a
/// hostile argument from changing the route). Empty and dot-only segments, which URL
/// normalization would remove or resolve, are refused.
pub fn seg(s: &str) -> Result<String> {
    if s.is_empty() || s.bytes().all(|b| b == b'.') || s.len() > 256 {
        return Err(anyhow!("{s:?} is not a valid id"));
    }
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_decode_or_fall_back_to_the_status() {
        let e = ApiError::from_body(
            404,
            br#"{"error":{"code":"sandbox_not_found","message":"no sandbox sb-1"}}"#,
        );
        assert_eq!(e.to_string(), "no sandbox sb-1 (sandbox_not_found)");
        let e = ApiError::from_body(502, b"<html>bad gateway</html>");
        assert_eq!(e.code, "http_502");
        assert!(e.message.contains("bad gateway"), "{}", e.message);
        let e = ApiError::from_body(500, b"");
        assert_eq!(e.message, "the server answered HTTP 500");
    }

    #[test]
    fn segments_cannot_escape_the_route() {
        assert_eq!(seg("sb-abc").unwrap(), "sb-abc");
        assert_eq!(seg("../keys").unwrap(), "..%2Fkeys");
        assert_eq!(seg("a b?c").unwrap(), "a%20b%3Fc");
        assert!(seg("..").is_err());
        assert!(seg("").is_err());
    }
}
