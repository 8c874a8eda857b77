//! Process streams: exec as NDJSON (`POST .../exec`), exec over a WebSocket
//! (`GET .../exec/ws`) and terminal sessions over a WebSocket (`GET .../pty`). The formats are
//! in `docs/api.md`.
//!
//! The guest client is taken before the upgrade, so an unknown sandbox or one in the wrong
//! state is an ordinary JSON error. While a stream is open the sandbox counts as active (the
//! idle timeout does not fire under a running command or an open terminal). When the client
//! goes away the process is ended: SIGKILL for exec, SIGHUP for a terminal.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{json, Value};
use space_api::{ExecEvent, ExecRequest};
use space_node_api::{NodeApi, SandboxId};
use space_proto::{Command, ExitStatus, GuestClient, PtySpec};
use tokio::sync::mpsc;

use super::{ApiJson, ApiPath, Caller, Shared};
use crate::error::{ApiError, ApiResult};
use crate::service::exec::{self, pump_exec, KeepActive, Origin, Out};

/// How long a WebSocket client may take to send its first message.
const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest WebSocket message accepted from a client.
const MAX_WS_MESSAGE: usize = 4 << 20;
/// Signals a client may send.
const MAX_SIGNAL: i32 = 64;

fn exit_json(s: &ExitStatus) -> Value {
    serde_json::to_value(exec::exit_event(s)).unwrap_or_default()
}

fn error_json(e: &ApiError) -> Value {
    serde_json::to_value(exec::error_event(e)).unwrap_or_default()
}

/// Reads a terminal's output into `tx` until it ends or `tx` closes.
async fn pump_pty(mut handle: space_proto::PtyHandle, tx: mpsc::Sender<Out>, at: Origin) {
    loop {
        match handle.next_output().await {
            Ok(Some(b)) => {
                if tx.send(Out::Stdout(b)).await.is_err() {
                    return;
                }
            }
            Ok(None) => break,
            Err(e) => {
                let _ = tx.send(Out::Error(at.failure(e).await)).await;
                return;
            }
        }
    }
    // The status is kept by the handle; `wait` returns it without reading more.
    let out = match handle.wait().await {
        Ok(s) => Out::Exit(s),
        Err(e) => Out::Error(at.failure(e).await),
    };
    let _ = tx.send(out).await;
}

/// `POST /v1/sandboxes/{id}/exec`: NDJSON lines until the process exits.
pub async fn exec(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> ApiResult<Response> {
    let events = exec::exec(&st, &who, &raw, req).await?;
    // Dropping the body (the client went away) drops the events, which kills the process.
    let body = events.map(|ev| {
        let ev = ev.unwrap_or_else(ExecEvent::from);
        Ok::<_, std::convert::Infallible>(ev.line())
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response())
}

fn upgrade(ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>) -> ApiResult<WebSocketUpgrade> {
    // A browser names `space` (and its key, `space.key.<key>`: it cannot set headers on a
    // WebSocket) among the subprotocols and must be answered with one it named.
    ws.map(|w| w.max_message_size(MAX_WS_MESSAGE).protocols([WS_PROTOCOL]))
        .map_err(|r| ApiError::invalid(format!("a WebSocket upgrade is needed: {}", r.body_text())))
}

/// The subprotocol the server answers when a client offers it.
pub const WS_PROTOCOL: &str = "space";

/// Waits for the client's first text message.
async fn first_text(socket: &mut WebSocket) -> Result<String, ApiError> {
    let wait = tokio::time::timeout(FIRST_MESSAGE_TIMEOUT, async {
        loop {
            match socket.recv().await {
                Some(Ok(Message::Text(t))) => return Ok(t.as_str().to_owned()),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                Some(Ok(_)) => {
                    return Err(ApiError::invalid(
                        "the first message must be a JSON text message",
                    ))
                }
                Some(Err(_)) | None => return Err(ApiError::invalid("the client went away")),
            }
        }
    });
    match wait.await {
        Ok(r) => r,
        Err(_) => Err(ApiError::invalid(
            "no first message within 60 s: send the request as a text message",
        )),
    }
}

async fn send_json(socket: &mut WebSocket, v: &Value) -> bool {
    socket
        .send(Message::Text(v.to_string().into()))
        .await
        .is_ok()
}

async fn close(mut socket: WebSocket, code: u16, reason: &str) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
}

async fn fail(mut socket: WebSocket, e: ApiError) {
    let _ = send_json(&mut socket, &error_json(&e)).await;
    close(socket, 1011, e.code).await;
}

/// Control messages a client sends as text.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Control {
    Eof,
    Signal { signal: i32 },
    Resize { rows: u16, cols: u16 },
}

fn control(text: &str) -> Result<Control, ApiError> {
    serde_json::from_str(text).map_err(|e| ApiError::invalid(format!("control message: {e}")))
}

fn check_signal(signal: i32) -> Result<i32, ApiError> {
    if (1..=MAX_SIGNAL).contains(&signal) {
        Ok(signal)
    } else {
        Err(ApiError::invalid(format!(
            "signal {signal} is not 1..={MAX_SIGNAL}"
        )))
    }
}

/// `GET /v1/sandboxes/{id}/exec/ws`
pub async fn exec_ws(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let id = st.scope(&who, &raw).await?;
    let ws = upgrade(ws)?;
    let guest = st.guest(Some(&who), &id).await?;
    let node = st.node.clone();
    Ok(ws.on_upgrade(move |socket| exec_session(socket, node, id, guest)))
}

async fn exec_session(
    mut socket: WebSocket,
    node: Arc<dyn NodeApi>,
    id: SandboxId,
    guest: GuestClient,
) {
    let req = match first_text(&mut socket).await.and_then(|t| {
        serde_json::from_str::<ExecRequest>(&t)
            .map_err(|e| ApiError::invalid(format!("ExecRequest: {e}")))
    }) {
        Ok(r) => r,
        Err(e) => return fail(socket, e).await,
    };
    let (spec, stdin) = match exec::spec(req) {
        Ok(s) => s,
        Err(e) => return fail(socket, e).await,
    };
    let mut handle = match guest.exec(spec).await {
        Ok(h) => h,
        Err(e) => return fail(socket, super::guest_failure(&*node, &id, e).await).await,
    };
    let _keep = KeepActive::start(node.clone(), id.clone());
    let pid = handle.pid();
    let mut stdin_w = handle.take_stdin();
    if !send_json(&mut socket, &json!({"type": "started", "pid": pid})).await {
        let _ = guest.signal(pid, 9).await;
        return;
    }
    if let (Some(w), Some(data)) = (&stdin_w, stdin) {
        if w.write(&data).await.is_err() {
            stdin_w = None;
        }
    }
    let (tx, mut rx) = mpsc::channel::<Out>(32);
    tokio::spawn(pump_exec(handle, tx, Origin(node.clone(), id.clone())));
    loop {
        tokio::select! {
            out = rx.recv() => {
                let Some(out) = out else { return };
                let sent = match &out {
                    Out::Stdout(b) | Out::Stderr(b) => {
                        let tag = if matches!(out, Out::Stdout(_)) { 1u8 } else { 2u8 };
                        let mut framed = Vec::with_capacity(b.len() + 1);
                        framed.push(tag);
                        framed.extend_from_slice(b);
                        socket.send(Message::Binary(framed.into())).await.is_ok()
                    }
                    Out::Exit(s) => {
                        let _ = send_json(&mut socket, &exit_json(s)).await;
                        return close(socket, 1000, "exit").await;
                    }
                    Out::Error(e) => {
                        let e = e.clone();
                        return fail(socket, e).await;
                    }
                };
                if !sent {
                    let _ = guest.signal(pid, 9).await;
                    return;
                }
            }
            msg = socket.recv() => {
                match msg {
                    Some(Ok(Message::Binary(data))) => {
                        if let Some(w) = &stdin_w {
                            if w.write(&data).await.is_err() {
                                stdin_w = None;
                            }
                        }
                    }
                    Some(Ok(Message::Text(t))) => match control(t.as_str()) {
                        Ok(Control::Eof) => {
                            if let Some(w) = stdin_w.take() {
                                let _ = w.close().await;
                            }
                        }
                        Ok(Control::Signal { signal }) => {
                            let r = match check_signal(signal) {
                                Ok(s) => guest.signal(pid, s).await.map_err(ApiError::from),
                                Err(e) => Err(e),
                            };
                            if let Err(e) = r {
                                let _ = send_json(&mut socket, &error_json(&e)).await;
                            }
                        }
                        Ok(Control::Resize { .. }) => {}
                        Err(e) => {
                            let _ = send_json(&mut socket, &error_json(&e)).await;
                        }
                    },
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => {
                        let _ = guest.signal(pid, 9).await;
                        return;
                    }
                }
            }
        }
    }
}

/// First message of a PTY session.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtyRequest {
    rows: u16,
    cols: u16,
    #[serde(default)]
    cmd: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// `GET /v1/sandboxes/{id}/pty`
pub async fn pty(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> ApiResult<Response> {
    let id = st.scope(&who, &raw).await?;
    let ws = upgrade(ws)?;
    let guest = st.guest(Some(&who), &id).await?;
    let node = st.node.clone();
    Ok(ws.on_upgrade(move |socket| pty_session(socket, node, id, guest)))
}

async fn pty_session(
    mut socket: WebSocket,
    node: Arc<dyn NodeApi>,
    id: SandboxId,
    guest: GuestClient,
) {
    let req = match first_text(&mut socket).await.and_then(|t| {
        serde_json::from_str::<PtyRequest>(&t)
            .map_err(|e| ApiError::invalid(format!("PTY request: {e}")))
    }) {
        Ok(r) => r,
        Err(e) => return fail(socket, e).await,
    };
    let mut spec = PtySpec::new(req.rows, req.cols);
    spec.command = match req.cmd {
        Some(argv) if argv.is_empty() => {
            return fail(socket, ApiError::invalid("cmd must not be empty")).await
        }
        Some(argv) => Some(Command::Argv(argv)),
        None => None,
    };
    spec.env = req.env;
    spec.cwd = req.cwd;
    let handle = match guest.pty(spec).await {
        Ok(h) => h,
        Err(e) => return fail(socket, super::guest_failure(&*node, &id, e).await).await,
    };
    let _keep = KeepActive::start(node.clone(), id.clone());
    let input = handle.input();
    let (tx, mut rx) = mpsc::channel::<Out>(32);
    tokio::spawn(pump_pty(handle, tx, Origin(node.clone(), id.clone())));
    loop {
        tokio::select! {
            out = rx.recv() => {
                match out {
                    None => return,
                    Some(Out::Stdout(b) | Out::Stderr(b)) => {
                        if socket.send(Message::Binary(b)).await.is_err() {
                            let _ = input.signal(1).await;
                            return;
                        }
                    }
                    Some(Out::Exit(s)) => {
                        let _ = send_json(&mut socket, &exit_json(&s)).await;
                        return close(socket, 1000, "exit").await;
                    }
                    Some(Out::Error(e)) => return fail(socket, e).await,
                }
            }
            msg = socket.recv() => {
                match msg {
                    Some(Ok(Message::Binary(data))) => {
                        let _ = input.write(&data).await;
                    }
                    Some(Ok(Message::Text(t))) => {
                        let r = match control(t.as_str()) {
                            Ok(Control::Resize { rows, cols }) => {
                                input.resize(rows, cols).await.map_err(ApiError::from)
                            }
                            Ok(Control::Signal { signal }) => match check_signal(signal) {
                                Ok(s) => input.signal(s).await.map_err(ApiError::from),
                                Err(e) => Err(e),
                            },
                            Ok(Control::Eof) => Ok(()),
                            Err(e) => Err(e),
                        };
                        if let Err(e) = r {
                            let _ = send_json(&mut socket, &error_json(&e)).await;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => {
                        // The terminal went away: hang up on the session.
                        let _ = input.signal(1).await;
                        return;
                    }
                }
            }
        }
    }
}
