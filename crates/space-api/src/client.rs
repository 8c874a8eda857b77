//! The HTTP client of the public API: typed operations ([`Operations`]), plus the raw
//! requests, JSON helpers and WebSocket connections the CLI builds the rest of its commands
//! on, all authenticated with one key.

use std::time::Duration;

use anyhow::{anyhow, Context as _};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt as _, TryStreamExt as _};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;

use crate::enc;
use crate::error::Failure;
use crate::exec::{EventStream, ExecRequest};
use crate::model::{
    BrowserSession, CreateSandbox, DirEntry, DirListing, FileStat, Lifecycle, PortExposed, Sandbox,
    SandboxFilter, SandboxList, Snapshot, SnapshotList, Template, TemplateList,
};
use crate::ops::{ByteStream, Caller, Operations};

/// An open WebSocket to the server.
pub type WebSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The most of an error body read (errors are one short JSON object).
const MAX_ERROR_BODY: usize = 64 * 1024;
/// The most of a JSON answer read.
const MAX_JSON: usize = 16 << 20;

/// A client of one server with one key.
#[derive(Clone)]
pub struct Client {
    base: String,
    key: String,
    http: reqwest::Client,
}

impl Client {
    /// A client of the server at `base` (`http(s)://host:port`, no trailing `/`) with API
    /// key `key`; `agent` names the program in `User-Agent`.
    pub fn new(base: &str, key: &str, agent: &str) -> anyhow::Result<Client> {
        if key.is_empty() || key.len() > 512 || key.chars().any(|c| !c.is_ascii_graphic()) {
            return Err(anyhow!(
                "the configured API key is malformed (expected space_<key id>_<secret>)"
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(agent)
            .build()
            .context("setting up the HTTP client")?;
        Ok(Client {
            base: base.trim_end_matches('/').to_owned(),
            key: key.to_owned(),
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

    /// Sends `req`; a non-2xx answer becomes a [`Failure`], an unreachable server a one-line
    /// explanation (also a [`Failure`], status 0).
    pub async fn send(&self, req: RequestBuilder) -> anyhow::Result<Response> {
        Ok(self.send_typed(req).await?)
    }

    async fn send_typed(&self, req: RequestBuilder) -> Result<Response, Failure> {
        let resp = req.send().await.map_err(|e| self.transport_failure(&e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        Err(error_of(resp).await)
    }

    /// Explains a failed request: unreachable servers get the hint that `space up` starts
    /// one.
    pub fn transport_error(&self, e: reqwest::Error) -> anyhow::Error {
        self.transport_failure(&e).into()
    }

    fn transport_failure(&self, e: &reqwest::Error) -> Failure {
        let message = if e.is_connect() {
            format!(
                "the server at {} is not reachable ({}); `space up` starts it",
                self.base,
                root_cause(e)
            )
        } else if e.is_timeout() {
            format!("the server at {} did not answer in time", self.base)
        } else {
            format!("talking to the server at {}: {}", self.base, root_cause(e))
        };
        Failure::local("unreachable", message)
    }

    /// `GET path?query` and the decoded JSON answer.
    pub async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(String, String)],
    ) -> anyhow::Result<T> {
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
    ) -> anyhow::Result<T> {
        let resp = self.send(self.request(method, path).json(body)).await?;
        decode(resp).await
    }

    /// `POST path` with a JSON body.
    pub async fn post<T: DeserializeOwned>(&self, path: &str, body: &Value) -> anyhow::Result<T> {
        self.call(Method::POST, path, body).await
    }

    /// `DELETE path`, ignoring any answer body.
    pub async fn delete(&self, path: &str) -> anyhow::Result<()> {
        self.send(self.request(Method::DELETE, path)).await?;
        Ok(())
    }

    /// Opens the WebSocket at `path`; an HTTP error on the upgrade becomes a [`Failure`].
    pub async fn websocket(&self, path: &str) -> anyhow::Result<WebSocket> {
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
                Err(Failure::from_body(status, &body).into())
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

    /// A typed JSON request: its answer decoded, every failure a [`Failure`].
    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<T, Failure> {
        let mut req = self.request(method, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = self.send_typed(req).await?;
        let bytes = read_limited(resp, MAX_JSON + 1).await;
        if bytes.len() > MAX_JSON {
            return Err(Failure::local(
                "invalid_response",
                format!("the server answered more than {MAX_JSON} bytes of JSON"),
            ));
        }
        serde_json::from_slice(&bytes).map_err(|e| {
            Failure::local(
                "invalid_response",
                format!("the server's answer is not the expected JSON: {e}"),
            )
        })
    }
}

fn sandbox_path(id: &str, rest: &str) -> String {
    format!("/v1/sandboxes/{}{rest}", enc(id))
}

fn byte_stream(resp: Response) -> ByteStream {
    resp.bytes_stream()
        .map_err(|e| Failure::local("guest_error", format!("the stream broke: {e}")))
        .boxed()
}

#[async_trait]
impl Operations for Client {
    async fn list_sandboxes(
        &self,
        _who: &Caller,
        filter: &SandboxFilter,
    ) -> Result<Vec<Sandbox>, Failure> {
        let path = format!("/v1/sandboxes{}", filter.query());
        let list: SandboxList = self.json(Method::GET, &path, None).await?;
        Ok(list.sandboxes)
    }

    async fn get_sandbox(&self, _who: &Caller, id: &str) -> Result<Sandbox, Failure> {
        self.json(Method::GET, &sandbox_path(id, ""), None).await
    }

    async fn create_sandbox(&self, _who: &Caller, req: &CreateSandbox) -> Result<Sandbox, Failure> {
        let body = serde_json::to_value(req)
            .map_err(|e| Failure::local("invalid_request", e.to_string()))?;
        self.json(Method::POST, "/v1/sandboxes", Some(&body)).await
    }

    async fn lifecycle(
        &self,
        _who: &Caller,
        id: &str,
        change: Lifecycle,
    ) -> Result<Sandbox, Failure> {
        let action = match change {
            Lifecycle::Kill => return self.json(Method::DELETE, &sandbox_path(id, ""), None).await,
            Lifecycle::Pause => "/pause",
            Lifecycle::Resume => "/resume",
            Lifecycle::Suspend => "/suspend",
            Lifecycle::Restore => "/restore",
        };
        self.json(Method::POST, &sandbox_path(id, action), Some(&json!({})))
            .await
    }

    async fn fork(&self, _who: &Caller, id: &str) -> Result<Sandbox, Failure> {
        self.json(Method::POST, &sandbox_path(id, "/fork"), Some(&json!({})))
            .await
    }

    async fn snapshot(&self, _who: &Caller, id: &str, full: bool) -> Result<Snapshot, Failure> {
        let body = json!({"kind": if full { "full" } else { "disk" }});
        self.json(Method::POST, &sandbox_path(id, "/snapshots"), Some(&body))
            .await
    }

    async fn snapshots(&self, _who: &Caller, id: &str) -> Result<Vec<Snapshot>, Failure> {
        let list: SnapshotList = self
            .json(Method::GET, &sandbox_path(id, "/snapshots"), None)
            .await?;
        Ok(list.snapshots)
    }

    async fn rollback(&self, _who: &Caller, id: &str, snapshot: &str) -> Result<Sandbox, Failure> {
        let body = json!({ "snapshot": snapshot });
        self.json(Method::POST, &sandbox_path(id, "/rollback"), Some(&body))
            .await
    }

    async fn exec(
        &self,
        _who: &Caller,
        id: &str,
        req: &ExecRequest,
    ) -> Result<EventStream, Failure> {
        let resp = self
            .send_typed(
                self.request(Method::POST, &sandbox_path(id, "/exec"))
                    .json(req),
            )
            .await?;
        Ok(crate::exec::decode(resp.bytes_stream().boxed()))
    }

    async fn read_file(&self, _who: &Caller, id: &str, path: &str) -> Result<ByteStream, Failure> {
        let url = sandbox_path(id, &format!("/files?path={}", enc(path)));
        let resp = self.send_typed(self.request(Method::GET, &url)).await?;
        Ok(byte_stream(resp))
    }

    async fn write_file(
        &self,
        _who: &Caller,
        id: &str,
        path: &str,
        mode: Option<u32>,
        data: Bytes,
    ) -> Result<FileStat, Failure> {
        let mut query = format!("path={}&parents=true", enc(path));
        if let Some(m) = mode {
            query.push_str(&format!("&mode={m:o}"));
        }
        let url = sandbox_path(id, &format!("/files?{query}"));
        let req = self
            .request(Method::PUT, &url)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(data);
        let resp = self.send_typed(req).await?;
        let bytes = read_limited(resp, MAX_ERROR_BODY).await;
        serde_json::from_slice(&bytes).map_err(|e| {
            Failure::local(
                "invalid_response",
                format!("the server's answer is not a file's stat: {e}"),
            )
        })
    }

    async fn stat(&self, _who: &Caller, id: &str, path: &str) -> Result<FileStat, Failure> {
        let url = sandbox_path(id, &format!("/files/stat?path={}", enc(path)));
        self.json(Method::GET, &url, None).await
    }

    async fn list_dir(
        &self,
        _who: &Caller,
        id: &str,
        path: &str,
    ) -> Result<Vec<DirEntry>, Failure> {
        let url = sandbox_path(id, &format!("/files/list?path={}", enc(path)));
        let list: DirListing = self.json(Method::GET, &url, None).await?;
        Ok(list.entries)
    }

    async fn expose_port(
        &self,
        _who: &Caller,
        id: &str,
        port: u16,
    ) -> Result<PortExposed, Failure> {
        let body = json!({ "port": port });
        self.json(Method::POST, &sandbox_path(id, "/ports"), Some(&body))
            .await
    }

    async fn browser(&self, _who: &Caller, id: &str) -> Result<BrowserSession, Failure> {
        self.json(
            Method::POST,
            &sandbox_path(id, "/browser"),
            Some(&json!({})),
        )
        .await
    }

    async fn templates(&self, _who: &Caller) -> Result<Vec<Template>, Failure> {
        let list: TemplateList = self.json(Method::GET, "/v1/templates", None).await?;
        Ok(list.templates)
    }

    async fn volumes(&self, _who: &Caller) -> Result<Vec<crate::Volume>, Failure> {
        let list: crate::VolumeList = self.json(Method::GET, "/v1/volumes", None).await?;
        Ok(list.volumes)
    }

    async fn create_volume(
        &self,
        _who: &Caller,
        name: &str,
        size_mib: Option<u64>,
    ) -> Result<crate::Volume, Failure> {
        let mut body = serde_json::json!({ "name": name });
        if let Some(m) = size_mib {
            body["size_mib"] = m.into();
        }
        self.json(Method::POST, "/v1/volumes", Some(&body)).await
    }
}

/// The [`Failure`] in a failed response.
pub async fn error_of(resp: Response) -> Failure {
    let status = resp.status();
    let body = read_limited(resp, MAX_ERROR_BODY).await;
    Failure::from_body(status.as_u16(), &body)
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

async fn decode<T: DeserializeOwned>(resp: Response) -> anyhow::Result<T> {
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
pub fn seg(s: &str) -> anyhow::Result<String> {
    if s.is_empty() || s.bytes().all(|b| b == b'.') || s.len() > 256 {
        return Err(anyhow!("{s:?} is not a valid id"));
    }
    Ok(enc(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cannot_escape_the_route() {
        assert_eq!(seg("sb-abc").unwrap(), "sb-abc");
        assert_eq!(seg("../keys").unwrap(), "..%2Fkeys");
        assert_eq!(seg("a b?c").unwrap(), "a%20b%3Fc");
        assert!(seg("..").is_err());
        assert!(seg("").is_err());
    }

    #[test]
    fn malformed_keys_are_refused() {
        assert!(Client::new("http://127.0.0.1:1", "", "t").is_err());
        assert!(Client::new("http://127.0.0.1:1", "a b", "t").is_err());
        let c = Client::new("http://127.0.0.1:1/", "space_k_x", "t").unwrap();
        assert_eq!(c.base(), "http://127.0.0.1:1");
    }

    #[tokio::test]
    async fn an_unreachable_server_is_a_failure_that_says_so() {
        let c = Client::new("http://127.0.0.1:1", "space_k_x", "t").unwrap();
        let f = c
            .get_sandbox(&Caller::default(), "sbx-1")
            .await
            .unwrap_err();
        assert_eq!((f.status, f.code.as_str()), (0, "unreachable"));
        assert!(f.message.contains("not reachable"), "{}", f.message);
    }
}
