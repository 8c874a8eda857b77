//! The control plane's side of the network API: a [`NodeApi`] that calls a `space node` over
//! HTTP/2 and mutual TLS.
//!
//! One connection per node carries every call and every guest stream, multiplexed; it is made
//! on first use and made again when it breaks. The node must present the cluster CA's leaf
//! for the node id it was dialled as. A node that cannot be reached, or whose connection
//! breaks mid-call, is a [`FaultCode::Unavailable`] fault: the caller cannot know whether a
//! call that broke took effect.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Method, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use serde::de::DeserializeOwned;
use space_proto::{GuestBody, GuestClient};
use tokio::net::TcpStream;

use super::rpc::{self, Call, FaultBody};
use super::tls::{node_server_name, Identity, TlsError};
use super::{
    Fault, FaultCode, NodeApi, NodeResult, NodeStatus, Pool, Sandbox, Snapshot, TemplateBuild,
    TemplateInfo, Usage, Woke,
};
use crate::gateway::EgressPolicy;
use crate::ids::{SandboxId, SnapshotId, TemplateName, TemplateRef, VersionReq};
use crate::record::{SnapshotKind, TimeoutPolicy};
use crate::sandbox::CreateRequest;

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

    async fn call<T: DeserializeOwned>(&self, call: Call) -> NodeResult<T> {
        let fail = |what: String| unavailable(&self.node_id, &self.addr, what);
        let body = serde_json::to_vec(&call)
            .map_err(|e| Fault::new(FaultCode::Internal, format!("encoding a call: {e}")))?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(format!("https://node{}", rpc::CALL_PATH))
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
        let bytes = Limited::new(resp.into_body(), rpc::MAX_ANSWER_BYTES)
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

#[async_trait]
impl NodeApi for RemoteNode {
    async fn status(&self) -> NodeResult<NodeStatus> {
        self.call(Call::Status).await
    }

    async fn create(&self, req: CreateRequest) -> NodeResult<Sandbox> {
        self.call(Call::Create { req: Box::new(req) }).await
    }

    async fn fork(&self, id: &SandboxId) -> NodeResult<Sandbox> {
        self.call(Call::Fork { id: id.clone() }).await
    }

    async fn info(&self, id: &SandboxId) -> NodeResult<Sandbox> {
        self.call(Call::Info { id: id.clone() }).await
    }

    async fn list(&self) -> NodeResult<Vec<Sandbox>> {
        self.call(Call::List).await
    }

    async fn usage(&self) -> NodeResult<Vec<Usage>> {
        self.call(Call::Usage).await
    }

    async fn pause(&self, id: &SandboxId) -> NodeResult<()> {
        self.call(Call::Pause { id: id.clone() }).await
    }

    async fn resume(&self, id: &SandboxId) -> NodeResult<()> {
        self.call(Call::Resume { id: id.clone() }).await
    }

    async fn suspend(&self, id: &SandboxId) -> NodeResult<Snapshot> {
        self.call(Call::Suspend { id: id.clone() }).await
    }

    async fn restore(&self, id: &SandboxId) -> NodeResult<()> {
        self.call(Call::Restore { id: id.clone() }).await
    }

    async fn kill(&self, id: &SandboxId) -> NodeResult<()> {
        self.call(Call::Kill { id: id.clone() }).await
    }

    async fn configure(&self, settings: crate::settings::NodeSettings) -> NodeResult<()> {
        self.call(Call::Configure {
            settings: Box::new(settings),
        })
        .await
    }

    async fn adopt(&self, id: &SandboxId, tenant: &str, epoch: u64) -> NodeResult<Sandbox> {
        self.call(Call::Adopt {
            id: id.clone(),
            tenant: tenant.to_owned(),
            epoch,
        })
        .await
    }

    async fn discard(&self, id: &SandboxId) -> NodeResult<()> {
        self.call(Call::Discard { id: id.clone() }).await
    }

    async fn set_secrets(
        &self,
        id: &SandboxId,
        values: crate::settings::SecretMap,
    ) -> NodeResult<()> {
        self.call(Call::SetSecrets {
            id: id.clone(),
            values,
        })
        .await
    }

    async fn forget_secret(&self, name: &str) -> NodeResult<()> {
        self.call(Call::ForgetSecret {
            name: name.to_owned(),
        })
        .await
    }

    async fn publish_template(&self, template: &TemplateRef) -> NodeResult<()> {
        self.call(Call::PublishTemplate {
            template: template.clone(),
        })
        .await
    }

    async fn fetch_template(&self, template: &TemplateRef) -> NodeResult<TemplateInfo> {
        self.call(Call::FetchTemplate {
            template: template.clone(),
        })
        .await
    }

    async fn touch(&self, id: &SandboxId) -> NodeResult<()> {
        self.call(Call::Touch { id: id.clone() }).await
    }

    async fn snapshot(&self, id: &SandboxId, kind: SnapshotKind) -> NodeResult<Snapshot> {
        self.call(Call::Snapshot {
            id: id.clone(),
            kind,
        })
        .await
    }

    async fn rollback(&self, id: &SandboxId, snapshot: &SnapshotId) -> NodeResult<()> {
        self.call(Call::Rollback {
            id: id.clone(),
            snapshot: snapshot.clone(),
        })
        .await
    }

    async fn set_timeouts(&self, id: &SandboxId, timeouts: TimeoutPolicy) -> NodeResult<Sandbox> {
        self.call(Call::SetTimeouts {
            id: id.clone(),
            timeouts,
        })
        .await
    }

    async fn set_egress(&self, id: &SandboxId, policy: EgressPolicy) -> NodeResult<Sandbox> {
        self.call(Call::SetEgress {
            id: id.clone(),
            policy,
        })
        .await
    }

    async fn console_tail(&self, id: &SandboxId, max_bytes: usize) -> NodeResult<Vec<u8>> {
        let text: String = self
            .call(Call::ConsoleTail {
                id: id.clone(),
                max_bytes,
            })
            .await?;
        rpc::decode_bytes(&text)
    }

    async fn guest(&self, id: &SandboxId) -> NodeResult<(GuestClient, Option<Woke>)> {
        let woke: Option<Woke> = self.call(Call::Wake { id: id.clone() }).await?;
        let sender = self.sender().await?;
        Ok((GuestClient::over(sender, rpc::guest_base(id)), woke))
    }

    async fn templates(&self) -> NodeResult<Vec<TemplateInfo>> {
        self.call(Call::Templates).await
    }

    async fn template(
        &self,
        name: &TemplateName,
        version: &VersionReq,
    ) -> NodeResult<TemplateInfo> {
        self.call(Call::Template {
            name: name.clone(),
            version: version.clone(),
        })
        .await
    }

    async fn images(&self) -> NodeResult<Vec<String>> {
        self.call(Call::Images).await
    }

    async fn build_template(&self, build: TemplateBuild) -> NodeResult<TemplateInfo> {
        self.call(Call::BuildTemplate {
            build: Box::new(build),
        })
        .await
    }

    async fn delete_template(&self, template: &TemplateRef) -> NodeResult<()> {
        self.call(Call::DeleteTemplate {
            template: template.clone(),
        })
        .await
    }

    async fn build_log(&self, build: &str, from: u64) -> NodeResult<crate::build::LogChunk> {
        self.call(Call::BuildLog {
            build: build.to_owned(),
            from,
        })
        .await
    }

    async fn save_template(
        &self,
        id: &SandboxId,
        template: &TemplateRef,
    ) -> NodeResult<TemplateInfo> {
        self.call(Call::SaveTemplate {
            id: id.clone(),
            template: template.clone(),
        })
        .await
    }

    async fn pools(&self) -> NodeResult<Vec<Pool>> {
        self.call(Call::Pools).await
    }

    async fn ca_pem(&self) -> NodeResult<String> {
        self.call(Call::CaPem).await
    }
}
