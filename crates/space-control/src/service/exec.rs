//! Exec: a command run in a sandbox of the caller's, its output and end as [`ExecEvent`]s.
//! `/v1` writes the events as NDJSON lines or WebSocket frames, MCP reads them as they are.
//! While a command runs the sandbox counts as active; when the reader of its events goes
//! away the command is killed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use space_api::{self as api, ExecEvent};
use space_node_api::{NodeApi, SandboxId};
use space_proto::{Command, ExecOutput, ExecSpec, ExitStatus};
use tokio::sync::mpsc;

use super::Shared;
use crate::error::{ApiError, ApiResult};
use crate::store::Principal;

/// How often a running command counts as activity.
const TOUCH_EVERY: Duration = Duration::from_secs(30);

/// The guest's spec of a request, and its stdin.
pub fn spec(req: api::ExecRequest) -> ApiResult<(ExecSpec, Option<Vec<u8>>)> {
    let command = match (req.cmd, req.shell) {
        (Some(argv), None) if !argv.is_empty() => Command::Argv(argv),
        (Some(_), None) => return Err(ApiError::invalid("cmd must not be empty")),
        (None, Some(line)) => Command::Shell(line),
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of cmd (an argv array) or shell (a line for /bin/sh -c)",
            ))
        }
    };
    let mut spec = ExecSpec::from_command(command);
    spec.env = req.env;
    spec.cwd = req.cwd;
    spec.timeout_ms = req.timeout_ms;
    Ok((spec, req.stdin))
}

/// Touches a sandbox every [`TOUCH_EVERY`] until dropped.
pub(crate) struct KeepActive(tokio::task::JoinHandle<()>);

impl KeepActive {
    pub(crate) fn start(node: Arc<dyn NodeApi>, id: SandboxId) -> Self {
        KeepActive(tokio::spawn(async move {
            let mut tick = tokio::time::interval(TOUCH_EVERY);
            tick.tick().await;
            loop {
                tick.tick().await;
                if node.touch(&id).await.is_err() {
                    return;
                }
            }
        }))
    }
}

impl Drop for KeepActive {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a process produced, as a pump hands it on.
pub(crate) enum Out {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(ExitStatus),
    Error(ApiError),
}

impl Out {
    /// The event it is.
    pub(crate) fn event(self) -> ExecEvent {
        match self {
            Out::Stdout(data) => ExecEvent::Stdout { data },
            Out::Stderr(data) => ExecEvent::Stderr { data },
            Out::Exit(s) => exit_event(&s),
            Out::Error(e) => error_event(&e),
        }
    }
}

/// The `exit` event of a status.
pub fn exit_event(s: &ExitStatus) -> ExecEvent {
    ExecEvent::Exit {
        exit_code: s.exit_code,
        signal: s.signal,
    }
}

/// The `error` event of an error.
pub fn error_event(e: &ApiError) -> ExecEvent {
    ExecEvent::Error {
        code: e.code.to_owned(),
        message: e.message.clone(),
    }
}

/// Where a process runs: its failures are answered knowing what became of the sandbox.
#[derive(Clone)]
pub(crate) struct Origin(pub(crate) Arc<dyn NodeApi>, pub(crate) SandboxId);

impl Origin {
    pub(crate) async fn failure(&self, e: space_proto::ClientError) -> ApiError {
        crate::api::guest_failure(&*self.0, &self.1, e).await
    }
}

/// Reads an exec's output into `tx` until it exits or `tx` closes.
pub(crate) async fn pump_exec(
    mut handle: space_proto::ExecHandle,
    tx: mpsc::Sender<Out>,
    at: Origin,
) {
    loop {
        let out = match handle.next_output().await {
            Ok(Some(ExecOutput::Stdout(b))) => Out::Stdout(b),
            Ok(Some(ExecOutput::Stderr(b))) => Out::Stderr(b),
            Ok(None) => match handle.status() {
                Some(s) => Out::Exit(s),
                None => Out::Error(ApiError::guest("the process ended without an exit status")),
            },
            Err(e) => Out::Error(at.failure(e).await),
        };
        let last = matches!(out, Out::Exit(_) | Out::Error(_));
        if tx.send(out).await.is_err() || last {
            return;
        }
    }
}

/// Runs a command in a sandbox of the caller's (waking it when it sleeps and may be woken).
/// The events start with `started` and end with `exit` or `error`; dropping the stream
/// before its end kills the command.
pub async fn exec(
    st: &Shared,
    who: &Principal,
    raw: &str,
    req: api::ExecRequest,
) -> ApiResult<api::EventStream> {
    let id = st.scope(who, raw).await?;
    let (spec, stdin) = spec(req)?;
    let guest = st.guest(Some(who), &id).await?;
    let mut handle = st.guest_call(&id, guest.exec(spec)).await?;
    let pid = handle.pid();
    if let Some(w) = handle.take_stdin() {
        tokio::spawn(async move {
            if let Some(data) = stdin {
                if w.write(&data).await.is_err() {
                    return;
                }
            }
            let _ = w.close().await;
        });
    }
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(32);
    tokio::spawn(pump_exec(
        handle,
        out_tx,
        Origin(st.node.clone(), id.clone()),
    ));
    let (tx, rx) = mpsc::channel::<ExecEvent>(32);
    let keep = KeepActive::start(st.node.clone(), id);
    tokio::spawn(async move {
        let _keep = keep;
        if tx.send(ExecEvent::Started { pid }).await.is_err() {
            let _ = guest.signal(pid, 9).await;
            return;
        }
        loop {
            let out = tokio::select! {
                out = out_rx.recv() => out,
                // The reader went away while the process was quiet.
                () = tx.closed() => {
                    let _ = guest.signal(pid, 9).await;
                    return;
                }
            };
            let Some(out) = out else { return };
            let ev = out.event();
            let last = ev.is_last();
            if tx.send(ev).await.is_err() {
                // The reader went away: so does the process.
                let _ = guest.signal(pid, 9).await;
                return;
            }
            if last {
                return;
            }
        }
    });
    Ok(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|ev| (Ok(ev), rx))
    })
    .boxed())
}
