//! `space exec`: runs a command in a sandbox and streams its output.
//!
//! With local stdin on a terminal (or `--no-stdin`) the command runs through the NDJSON
//! `POST .../exec` form with empty stdin; otherwise local stdin is forwarded through the
//! WebSocket form as it is read, and closed at its end.

use std::io::Write as _;

use anyhow::{anyhow, bail, Context, Result};
use futures::{SinkExt as _, StreamExt as _};
use reqwest::Method;
use serde_json::json;
use tokio::io::AsyncReadExt as _;
use tokio_tungstenite::tungstenite::Message;

use super::pairs;
use crate::cli::ExecArgs;
use space_api::{Decoder, ExecEvent, ExecRequest};

use crate::client::{seg, ApiError, Client};

/// How much local stdin is sent per frame.
const STDIN_CHUNK: usize = 64 * 1024;

/// `space exec`; returns the command's exit code (128 + signal when a signal ended it).
pub async fn exec(c: &Client, a: ExecArgs) -> Result<i32> {
    use std::io::IsTerminal as _;
    let mut req = ExecRequest::argv(a.cmd);
    if !a.env.is_empty() {
        req.env = pairs(&a.env, "--env")?;
    }
    req.cwd = a.cwd;
    if let Some(t) = a.timeout {
        if t == 0 || t > u64::MAX / 1000 {
            bail!("--timeout {t} is out of range");
        }
        req.timeout_ms = Some(t * 1000);
    }
    let id = seg(&a.id)?;
    if a.no_stdin || std::io::stdin().is_terminal() {
        exec_post(c, &id, &req).await
    } else {
        exec_ws(c, &id, &req).await
    }
}

fn write_out(stream: u8, data: &[u8]) -> Result<()> {
    if stream == 2 {
        let mut e = std::io::stderr().lock();
        e.write_all(data)?;
        e.flush()?;
    } else {
        let mut o = std::io::stdout().lock();
        o.write_all(data)?;
        o.flush()?;
    }
    Ok(())
}

/// Handles one event; `Some(code)` at the end of the command.
fn event(ev: ExecEvent) -> Result<Option<i32>> {
    match ev {
        ExecEvent::Stdout { data } => write_out(1, &data)?,
        ExecEvent::Stderr { data } => write_out(2, &data)?,
        ExecEvent::Error { code, message } => return Err(ApiError::new(0, code, message).into()),
        ExecEvent::Exit { .. } => return Ok(ev.shell_code()),
        ExecEvent::Started { .. } => {}
    }
    Ok(None)
}

async fn exec_post(c: &Client, id: &str, req: &ExecRequest) -> Result<i32> {
    let mut resp = c
        .send(
            c.request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(req),
        )
        .await?;
    let mut decoder = Decoder::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| c.transport_error(e))? {
        decoder.push(chunk);
        while let Some(ev) = decoder.next_event()? {
            if let Some(code) = event(ev)? {
                return Ok(code);
            }
        }
    }
    if let Some(ev) = decoder.finish()? {
        if let Some(code) = event(ev)? {
            return Ok(code);
        }
    }
    Err(anyhow!(
        "the exec stream ended before the command's exit status arrived"
    ))
}

async fn exec_ws(c: &Client, id: &str, req: &ExecRequest) -> Result<i32> {
    let ws = c.websocket(&format!("/v1/sandboxes/{id}/exec/ws")).await?;
    let (mut sink, mut stream) = ws.split();
    sink.send(Message::text(serde_json::to_string(req)?))
        .await
        .context("sending the exec request")?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Message>(4);
    // Local stdin, chunk by chunk, then the end-of-input marker.
    let stdin_tx = tx.clone();
    tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let mut buf = vec![0u8; STDIN_CHUNK];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => break,
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
        let _ = stdin_tx
            .send(Message::text(json!({"type": "eof"}).to_string()))
            .await;
    });
    // Ctrl-C is passed on to the command as SIGINT.
    let sig_tx = tx;
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            let msg = Message::text(json!({"type": "signal", "signal": 2}).to_string());
            if sig_tx.send(msg).await.is_err() {
                return;
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
        let msg = msg.map_err(|e| anyhow!("the exec WebSocket broke: {e}"))?;
        match msg {
            Message::Binary(b) => match b.split_first() {
                Some((&stream_no @ (1 | 2), data)) => write_out(stream_no, data)?,
                _ => bail!("the server sent an output frame of an unknown stream"),
            },
            Message::Text(t) => {
                let ev: ExecEvent = serde_json::from_str(t.as_str())
                    .context("the server sent an exec event that is not one")?;
                if let Some(code) = event(ev)? {
                    return Ok(code);
                }
            }
            Message::Close(_) => break,
            _ => {}
        }
    }
    Err(anyhow!(
        "the exec WebSocket closed before the command's exit status arrived"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_events_become_api_errors_and_exits_end_the_command() {
        let e = event(ExecEvent::Error {
            code: "guest_error".into(),
            message: "gone".into(),
        })
        .unwrap_err();
        assert_eq!(e.downcast_ref::<ApiError>().unwrap().code, "guest_error");
        let end = ExecEvent::Exit {
            exit_code: None,
            signal: Some(9),
        };
        assert_eq!(event(end).unwrap(), Some(137));
        assert_eq!(event(ExecEvent::Started { pid: 1 }).unwrap(), None);
    }
}
