//! `space shell`: a terminal in a sandbox over the PTY WebSocket.

use std::io::Write as _;

use anyhow::{anyhow, Context, Result};
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use tokio::io::AsyncReadExt as _;
use tokio::signal::unix::{signal, SignalKind};
use tokio_tungstenite::tungstenite::Message;

use crate::cli::ShellArgs;
use space_api::ExecEvent;

use crate::client::{seg, ApiError, Client};
use crate::term;

/// The terminal size used when the local side is not a terminal.
const DEFAULT_SIZE: (u16, u16) = (24, 80);

/// `space shell`; returns the shell's exit code (128 + signal when a signal ended it).
pub async fn shell(c: &Client, a: ShellArgs) -> Result<i32> {
    let id = seg(&a.id)?;
    let ws = c.websocket(&format!("/v1/sandboxes/{id}/pty")).await?;
    let (rows, cols) = term::size().unwrap_or(DEFAULT_SIZE);
    let cmd = if a.cmd.is_empty() {
        Value::Null
    } else {
        json!(a.cmd)
    };
    let (mut sink, mut stream) = ws.split();
    let hello = json!({"rows": rows, "cols": cols, "cmd": cmd, "env": {}, "cwd": null});
    sink.send(Message::text(hello.to_string()))
        .await
        .context("opening the terminal")?;
    let raw = term::RawMode::enter()?;
    let result = session(sink, &mut stream).await;
    drop(raw);
    result
}

async fn session<S>(
    mut sink: S,
    stream: &mut futures::stream::SplitStream<crate::client::WebSocket>,
) -> Result<i32>
where
    S: futures::Sink<Message, Error = tokio_tungstenite::tungstenite::Error>
        + Unpin
        + Send
        + 'static,
{
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Message>(16);
    let stdin_tx = tx.clone();
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if stdin_tx
                        .send(Message::binary(buf[..n].to_vec()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    let mut winch = signal(SignalKind::window_change()).context("watching for resizes")?;
    tokio::spawn(async move {
        while winch.recv().await.is_some() {
            if let Some((rows, cols)) = term::size() {
                let msg = json!({"type": "resize", "rows": rows, "cols": cols});
                if tx.send(Message::text(msg.to_string())).await.is_err() {
                    return;
                }
            }
        }
    });
    tokio::spawn(async move {
        while let Some(msg) = rx.recv().await {
            if sink.send(msg).await.is_err() {
                return;
            }
        }
    });
    while let Some(msg) = stream.next().await {
        let msg = msg.map_err(|e| anyhow!("the terminal connection broke: {e}"))?;
        match msg {
            Message::Binary(b) => {
                let mut out = std::io::stdout().lock();
                out.write_all(&b)?;
                out.flush()?;
            }
            Message::Text(t) => {
                // Text frames are the exec stream's events: `exit` and `error` end it.
                match serde_json::from_str::<ExecEvent>(t.as_str()) {
                    Ok(ExecEvent::Error { code, message }) => {
                        return Err(ApiError::new(0, code, message).into())
                    }
                    Ok(ev) => {
                        if let Some(code) = ev.shell_code() {
                            return Ok(code);
                        }
                    }
                    Err(_) => {}
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    Err(anyhow!(
        "the terminal closed before the shell's exit status arrived"
    ))
}
