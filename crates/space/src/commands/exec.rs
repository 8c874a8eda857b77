//! `space exec`: runs a command in a sandbox and streams its output.
//!
//! With local stdin on a terminal (or `--no-stdin`) the command runs through the NDJSON
//! `POST .../exec` form with empty stdin; otherwise local stdin is forwarded through the
//! WebSocket form as it is read, and closed at its end.

use std::io::Write as _;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine as _;
use futures::{SinkExt as _, StreamExt as _};
use reqwest::Method;
use serde_json::{json, Map, Value};
use tokio::io::AsyncReadExt as _;
use tokio_tungstenite::tungstenite::Message;

use super::pairs;
use crate::cli::ExecArgs;
use crate::client::{seg, ApiError, Client};

/// The longest NDJSON line accepted (an output chunk in base64 is far smaller).
const MAX_LINE: usize = 16 << 20;
/// How much local stdin is sent per frame.
const STDIN_CHUNK: usize = 64 * 1024;

/// `space exec`; returns the command's exit code (128 + signal when a signal ended it).
pub async fn exec(c: &Client, a: ExecArgs) -> Result<i32> {
    use std::io::IsTerminal as _;
    let mut req = Map::new();
    req.insert("cmd".into(), json!(a.cmd));
    if !a.env.is_empty() {
        req.insert("env".into(), json!(pairs(&a.env, "--env")?));
    }
    if let Some(d) = a.cwd {
        req.insert("cwd".into(), d.into());
    }
    if let Some(t) = a.timeout {
        if t == 0 || t > u64::MAX / 1000 {
            bail!("--timeout {t} is out of range");
        }
        req.insert("timeout_ms".into(), (t * 1000).into());
    }
    let req = Value::Object(req);
    let id = seg(&a.id)?;
    if a.no_stdin || std::io::stdin().is_terminal() {
        exec_post(c, &id, &req).await
    } else {
        exec_ws(c, &id, &req).await
    }
}

/// The exit code of an `exit` event.
fn exit_code(ev: &Value) -> i32 {
    if let Some(code) = ev.get("exit_code").and_then(Value::as_i64) {
        return code.clamp(0, 255) as i32;
    }
    if let Some(sig) = ev.get("signal").and_then(Value::as_i64) {
        return 128 + sig.clamp(0, 127) as i32;
    }
    1
}

fn stream_error(ev: &Value) -> anyhow::Error {
    let s = |k: &str| ev.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    ApiError {
        status: 0,
        code: if s("code").is_empty() {
            "internal".into()
        } else {
            s("code")
        },
        message: s("message"),
    }
    .into()
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
fn event(ev: &Value) -> Result<Option<i32>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    match ev.get("type").and_then(Value::as_str) {
        Some("started") => Ok(None),
        Some(kind @ ("stdout" | "stderr")) => {
            let data = ev.get("data").and_then(Value::as_str).unwrap_or("");
            let bytes = b64
                .decode(data)
                .context("the server sent output that is not base64")?;
            write_out(if kind == "stderr" { 2 } else { 1 }, &bytes)?;
            Ok(None)
        }
        Some("exit") => Ok(Some(exit_code(ev))),
        Some("error") => Err(stream_error(ev)),
        _ => Ok(None),
    }
}

async fn exec_post(c: &Client, id: &str, req: &Value) -> Result<i32> {
    let mut resp = c
        .send(
            c.request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .json(req),
        )
        .await?;
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let chunk = resp.chunk().await.map_err(|e| c.transport_error(e))?;
        let Some(chunk) = chunk else {
            break;
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            if let Some(code) = line_event(&line)? {
                return Ok(code);
            }
        }
        if buf.len() > MAX_LINE {
            bail!("the server sent an exec event longer than {MAX_LINE} bytes");
        }
    }
    if let Some(code) = line_event(&buf)? {
        return Ok(code);
    }
    Err(anyhow!(
        "the exec stream ended before the command's exit status arrived"
    ))
}

fn line_event(line: &[u8]) -> Result<Option<i32>> {
    let line = line.trim_ascii();
    if line.is_empty() {
        return Ok(None);
    }
    let ev: Value =
        serde_json::from_slice(line).context("the server sent an exec event that is not JSON")?;
    event(&ev)
}

async fn exec_ws(c: &Client, id: &str, req: &Value) -> Result<i32> {
    let ws = c.websocket(&format!("/v1/sandboxes/{id}/exec/ws")).await?;
    let (mut sink, mut stream) = ws.split();
    sink.send(Message::text(req.to_string()))
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
                let ev: Value = serde_json::from_str(t.as_str())
                    .context("the server sent an exec event that is not JSON")?;
                if let Some(code) = event(&ev)? {
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
    fn exit_events_map_to_shell_style_codes() {
        assert_eq!(exit_code(&json!({"exit_code": 3, "signal": null})), 3);
        assert_eq!(exit_code(&json!({"exit_code": null, "signal": 9})), 137);
        assert_eq!(exit_code(&json!({"exit_code": 70000})), 255);
        assert_eq!(exit_code(&json!({})), 1);
    }

    #[test]
    fn error_events_become_api_errors() {
        let e =
            event(&json!({"type": "error", "code": "guest_error", "message": "gone"})).unwrap_err();
        let api = e.downcast_ref::<ApiError>().unwrap();
        assert_eq!(api.code, "guest_error");
        assert!(line_event(b"not json\n").is_err());
        assert_eq!(line_event(b"  \n").unwrap(), None);
    }
}
