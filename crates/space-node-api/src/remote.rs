//! The control plane's side of the network API: a [`NodeApi`](crate::NodeApi) that calls a `space node` over
//! HTTP/2 and mutual TLS.
//!
//! One connection per node carries every call and every guest stream, multiplexed; it is made
//! on first use and made again when it breaks. The node must present the cluster CA's leaf
//! for the node id it was dialled as. A node that cannot be reached, or whose connection
//! breaks mid-call, is a [`FaultCode::Unavailable`] fault: the caller cannot know whether a
//! call that broke took effect.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde::de::DeserializeOwned;
use space_proto::{GuestBody, GuestClient};
use tokio::net::TcpStream;

use crate::calls::{self, Call, FaultBody, NodeResult};
use crate::ids::SandboxId;
use crate::tls::{node_server_name, Identity, TlsError};
use crate::wire::{Fault, FaultCode};

/// How long reaching a node (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings on the connection, and how long one may go unanswered before the node is
/// taken for gone.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

/// A node reached over the network.
pub struct RemoteNode {
    node_id: String,
    addr: String,
    tls: tokio_rustls::TlsConnector,
    conn: tokio::sync::Mutex<Option<SendRequest<GuestBody>>>,
}

impl std::fmt::Debug for RemoteNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteNode")
            .field("node_id", &self.node_id)
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

fn unavailable(node: &str, addr: &str, what: impl std::fmt::Display) -> Fault {
    Fault::new(
        FaultCode::Unavailable,
        format!("node {node} at {addr}: {what}"),
    )
}

impl RemoteNode {
    /// A client of node `node_id` at `addr` (`host:port`), presenting `identity` (a control
    /// leaf). Nothing is dialled until the first call.
    pub fn new(node_id: &str, addr: &str, identity: &Identity) -> Result<RemoteNode, TlsError> {
        node_server_name(node_id)?;
        Ok(RemoteNode {
            node_id: node_id.to_owned(),
            addr: addr.to_owned(),
            tls: tokio_rustls::TlsConnector::from(identity.client_config()?),
            conn: tokio::sync::Mutex::new(None),
        })
    }

    /// The node's id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The node's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    async fn connect(&self) -> NodeResult<SendRequest<GuestBody>> {
        let fail = |what: String| unavailable(&self.node_id, &self.addr, what);
        let name = node_server_name(&self.node_id).map_err(|e| fail(e.to_string()))?;
        let dial = async {
            let tcp = TcpStream::connect(&self.addr)
                .await
                .map_err(|e| fail(format!("connecting: {e}")))?;
            let _ = tcp.set_nodelay(true);
            self.tls
                .connect(name, tcp)
                .await
                .map_err(|e| fail(format!("TLS: {e}")))
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, dial)
            .await
            .map_err(|_| fail(format!("no answer in {} s", CONNECT_TIMEOUT.as_secs())))??;
        let mut builder = hyper::client::conn::http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(KEEP_ALIVE)
            .keep_alive_timeout(KEEP_ALIVE * 2)
            .keep_alive_while_idle(true)
            .initial_stream_window_size(1024 * 1024)
            .initial_connection_window_size(8 * 1024 * 1024)
            .max_frame_size(256 * 1024);
        let (sender, conn) = builder
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| fail(format!("HTTP/2: {e}")))?;
        let (node, addr) = (self.node_id.clone(), self.addr.clone());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%node, %addr, error = %e, "node API connection ended");
            }
        });
        Ok(sender)
    }

    /// The connection, made when there is none or the last one broke.
    async fn sender(&self) -> NodeResult<SendRequest<GuestBody>> {
        let mut conn = self.conn.lock().await;
        if let Some(s) = conn.as_ref() {
            if !s.is_closed() {
                return Ok(s.clone());
            }
        }
        let s = self.connect().await?;
        *conn = Some(s.clone());
        Ok(s)
    }

    /// A client of sandbox `id`'s guest over this node's connection.
    pub(crate) async fn guest_client(&self, id: &SandboxId) -> NodeResult<GuestClient> {
        Ok(GuestClient::over(
            self.sender().await?,
            calls::guest_base(id),
        ))
    }

    /// Sends `call` and reads its answer.
    pub(crate) async fn call<T: DeserializeOwned>(&self, call: Call) -> NodeResult<T> {
        let fail = |what: String| unavailable(&self.node_id, &self.addr, what);
        let body = serde_json::to_vec(&call)
            .map_err(|e| Fault::new(FaultCode::Internal, format!("encoding a call: {e}")))?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("https://node{}", calls::CALL_PATH))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(
                Full::new(Bytes::from(body))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .map_err(|e| Fault::new(FaultCode::Internal, e.to_string()))?;
        let mut sender = self.sender().await?;
        sender
            .ready()
            .await
            .map_err(|e| fail(format!("{}: {e}", call.name())))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| fail(format!("{}: {e}", call.name())))?;
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), calls::MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| fail(format!("{}: reading the answer: {e}", call.name())))?
            .to_bytes();
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| {
                Fault::new(
                    FaultCode::Internal,
                    format!(
                        "node {}: a malformed {} answer: {e}",
                        self.node_id,
                        call.name()
                    ),
                )
            });
        }
        match serde_json::from_slice::<FaultBody>(&bytes) {
            Ok(b) => Err(b.fault),
            Err(_) => Err(Fault::new(
                FaultCode::Internal,
                format!(
                    "node {}: {} answered {status} without a fault",
                    self.node_id,
                    call.name()
                ),
            )),
        }
    }
}
