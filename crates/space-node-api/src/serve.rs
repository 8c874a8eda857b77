//! The node's side of the network API: HTTP/2 over mutual TLS, for control replicas only.
//!
//! A connection must present a leaf of the cluster CA named `control`; another node's leaf is
//! refused at once, so a node can never drive another. Calls go to [`calls::dispatch`]; guest
//! traffic for a sandbox is served with that sandbox's guest client (waking it first), on an
//! allowlist of guest routes: health, exec, processes (list, signal, attach, stdin, resize),
//! PTY, files, watch and buffered watches, accounts and TCP to a port (whose query the guest checks, as it checks
//! every query). What the node keeps for itself (identity, growing the file system,
//! shutdown) is not reachable.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::{DnsName, ServerName};
use space_proto::routes;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::calls::{self, Call, FaultBody, NodeApi};
use crate::ids::SandboxId;
use crate::tls::{Identity, TlsError};
use crate::wire::{Fault, FaultCode};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 pings on an idle connection, and how long one may go unanswered.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// A running node API server.
#[derive(Debug)]
pub struct NodeServer {
    addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

fn answer(status: u16, json: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(full(json))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

fn fault_answer(f: Fault) -> Response<Body> {
    let status = calls::status_of(&f);
    let json = serde_json::to_vec(&FaultBody { fault: f }).unwrap_or_default();
    answer(status, json)
}

/// Whether `path` is a guest route a control replica may use.
fn forwardable(path: &str) -> bool {
    matches!(
        path,
        routes::HEALTH
            | routes::EXEC
            | routes::PROCESSES
            | routes::PTY
            | routes::FILES
            | routes::STAT
            | routes::LIST
            | routes::MKDIR
            | routes::REMOVE
            | routes::RENAME
            | routes::CHMOD
            | routes::WATCH
            | routes::TCP
            | routes::USER
            | routes::WATCHERS
    ) || routes::parse_process_path(path).is_some()
        || path.starts_with(routes::WATCHERS_PREFIX)
}

async fn handle(api: Arc<dyn NodeApi>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    if path == calls::CALL_PATH {
        if req.method() != Method::POST {
            return fault_answer(Fault::new(FaultCode::Invalid, "calls are POSTed"));
        }
        let bytes = match Limited::new(req.into_body(), calls::MAX_CALL_BYTES)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return fault_answer(Fault::new(
                    FaultCode::Invalid,
                    format!("reading the call: {e}"),
                ))
            }
        };
        let call: Call = match serde_json::from_slice(&bytes) {
            Ok(c) => c,
            Err(e) => {
                return fault_answer(Fault::new(FaultCode::Invalid, format!("the call: {e}")))
            }
        };
        let name = call.name();
        return match calls::dispatch(api.as_ref(), call).await {
            Ok(v) => answer(200, serde_json::to_vec(&v).unwrap_or_default()),
            Err(f) => {
                tracing::debug!(call = name, code = ?f.code, "node API call refused");
                fault_answer(f)
            }
        };
    }
    let Some(rest) = path.strip_prefix(calls::SANDBOXES_PREFIX) else {
        return fault_answer(Fault::new(
            FaultCode::Invalid,
            format!("no route {}", truncate(&path)),
        ));
    };
    let (id, guest_path) = match rest.split_once('/') {
        Some((id, tail)) => (id, format!("/{tail}")),
        None => (rest, String::new()),
    };
    let Some(guest_path) = guest_path.strip_prefix(calls::GUEST_SEGMENT) else {
        return fault_answer(Fault::new(
            FaultCode::Invalid,
            format!("no route {}", truncate(&path)),
        ));
    };
    let id: SandboxId = match id.parse() {
        Ok(id) => id,
        Err(e) => return fault_answer(Fault::new(FaultCode::InvalidId, format!("{e}"))),
    };
    if !forwardable(guest_path) {
        return fault_answer(Fault::new(
            FaultCode::Invalid,
            format!(
                "guest route {} is not served to the control plane",
                truncate(guest_path)
            ),
        ));
    }
    let pq = match req.uri().query() {
        Some(q) => format!("{guest_path}?{q}"),
        None => guest_path.to_owned(),
    };
    let client = match api.guest(&id).await {
        Ok((c, _)) => c,
        Err(f) => return fault_answer(f),
    };
    let (mut parts, body) = req.into_parts();
    parts.uri = match pq.parse() {
        Ok(u) => u,
        Err(e) => return fault_answer(Fault::new(FaultCode::Invalid, format!("{e}"))),
    };
    let body = body.map_err(|e| Box::new(e) as BoxError).boxed_unsync();
    match client.forward(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync()),
        Err(e) => fault_answer(Fault::new(
            FaultCode::Guest,
            format!("the guest of sandbox {id}: {e}"),
        )),
    }
}

fn truncate(s: &str) -> String {
    s.chars().take(200).collect()
}

/// Whether the client's leaf names the control plane.
fn is_control(conn: &rustls::ServerConnection) -> bool {
    let Some(leaf) = conn.peer_certificates().and_then(|c| c.first()) else {
        return false;
    };
    let Ok(cert) = webpki::EndEntityCert::try_from(leaf) else {
        return false;
    };
    let Ok(name) = DnsName::try_from("control") else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&ServerName::DnsName(name))
        .is_ok()
}

impl NodeServer {
    /// Serves `api` on `listen` with `identity` (the node's leaf).
    pub async fn start(
        api: Arc<dyn NodeApi>,
        listen: SocketAddr,
        identity: &Identity,
    ) -> Result<NodeServer, TlsError> {
        let tls = tokio_rustls::TlsAcceptor::from(identity.server_config()?);
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| TlsError(format!("listening on {listen}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| TlsError(format!("listening on {listen}: {e}")))?;
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    r = listener.accept() => match r {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!(error = %e, "accepting a node API connection");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    _ = stopped.changed() => return,
                };
                let _ = tcp.set_nodelay(true);
                let (tls, api, mut stopped) = (tls.clone(), api.clone(), stopped.clone());
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp))
                        .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::warn!(%peer, error = %e, "node API: TLS handshake refused");
                            return;
                        }
                        Err(_) => {
                            tracing::warn!(%peer, "node API: TLS handshake timed out");
                            return;
                        }
                    };
                    if !is_control(stream.get_ref().1) {
                        tracing::warn!(%peer, "node API: a client that is not the control plane was refused");
                        return;
                    }
                    let service = hyper::service::service_fn(move |req| {
                        let api = api.clone();
                        async move { Ok::<_, Infallible>(handle(api, req).await) }
                    });
                    let mut builder =
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    builder
                        .timer(TokioTimer::new())
                        .keep_alive_interval(KEEP_ALIVE)
                        .keep_alive_timeout(KEEP_ALIVE * 2)
                        .initial_stream_window_size(1024 * 1024)
                        .initial_connection_window_size(8 * 1024 * 1024)
                        .max_frame_size(256 * 1024)
                        .max_concurrent_streams(1024);
                    let conn = builder.serve_connection(TokioIo::new(stream), service);
                    tokio::pin!(conn);
                    tokio::select! {
                        r = conn.as_mut() => {
                            if let Err(e) = r {
                                tracing::debug!(%peer, error = %e, "node API connection ended");
                            }
                        }
                        _ = stopped.changed() => {}
                    }
                });
            }
        });
        Ok(NodeServer { addr, stop, task })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and drops every connection.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::forwardable;

    #[test]
    fn only_the_control_planes_guest_routes_are_forwarded() {
        for ok in [
            "/v1/exec",
            "/v1/pty",
            "/v1/files",
            "/v1/watch",
            "/v1/processes",
            "/v1/processes/12/signal",
            "/v1/tcp",
            "/v1/health",
        ] {
            assert!(forwardable(ok), "{ok}");
        }
        for no in [
            "/v1/identity",
            "/v1/fs/grow",
            "/v1/shutdown",
            "/v1/tcp/8080",
            "/v1/exec/../shutdown",
            "",
            "/",
        ] {
            assert!(!forwardable(no), "{no}");
        }
    }
}
