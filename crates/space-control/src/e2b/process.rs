//! envd's `process.Process` service over the guest protocol: a process started here is a
//! guest process like any other (`GET /v1/processes` lists it); its output streams from the
//! guest, and other calls reach it by pid (attach, stdin, resize, signal). A client that goes
//! away leaves the process running.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{json, Value};
use space_proto::{Command, ExecHandle, ExecOutput, ExecSpec, ExitStatus, PtySpec};

use super::connect::{self, Code, RpcError, RpcResult, StreamTx};
use super::envd::Envd;

/// Keepalive interval when the client names none.
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);
/// The shortest keepalive interval a client may ask for.
const MIN_KEEPALIVE: Duration = Duration::from_secs(1);

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ProcessConfig {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Size {
    cols: u16,
    rows: u16,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Pty {
    size: Option<Size>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StartRequest {
    process: ProcessConfig,
    pty: Option<Pty>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Selector {
    pid: Option<u32>,
    tag: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Selected {
    process: Selector,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Input {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendInput {
    process: Selector,
    input: Input,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendSignal {
    process: Selector,
    signal: Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Update {
    process: Selector,
    pty: Option<Pty>,
}

/// One message of `StreamInput`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamInputMessage {
    start: Option<Selected>,
    data: Option<StreamData>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamData {
    input: Input,
}

/// A pid chosen by pid or by tag (among running processes).
async fn resolve(e: &Envd, sel: &Selector) -> RpcResult<(u32, bool)> {
    let list = e.guest.processes().await?;
    let found = match (sel.pid, &sel.tag) {
        (Some(pid), _) => list.iter().find(|p| p.pid == pid && p.running),
        (None, Some(tag)) => list
            .iter()
            .find(|p| p.running && p.tag.as_deref() == Some(tag.as_str())),
        (None, None) => return Err(RpcError::invalid("select a process by pid or tag")),
    };
    found.map(|p| (p.pid, p.pty)).ok_or_else(|| {
        RpcError::new(
            Code::NotFound,
            match (sel.pid, &sel.tag) {
                (Some(pid), _) => format!("process with pid {pid} not found"),
                (_, tag) => format!(
                    "process with tag {:?} not found",
                    tag.as_deref().unwrap_or("")
                ),
            },
        )
    })
}

fn decode_input(input: &Input) -> RpcResult<Bytes> {
    let text = input
        .stdin
        .as_deref()
        .or(input.pty.as_deref())
        .unwrap_or("");
    b64()
        .decode(text)
        .map(Bytes::from)
        .map_err(|e| RpcError::invalid(format!("input is not base64: {e}")))
}

fn signal_number(v: &Value) -> RpcResult<i32> {
    match v {
        Value::String(s) => match s.as_str() {
            "SIGNAL_SIGKILL" => Ok(9),
            "SIGNAL_SIGTERM" => Ok(15),
            other => Err(RpcError::invalid(format!("unknown signal {other:?}"))),
        },
        Value::Number(n) => match n.as_i64() {
            Some(9) => Ok(9),
            Some(15) => Ok(15),
            _ => Err(RpcError::invalid(format!("unknown signal {n}"))),
        },
        _ => Err(RpcError::invalid("a signal is required")),
    }
}

/// The end event of an exit status, as envd words it.
fn end_event(s: &ExitStatus) -> Value {
    match (s.signal, s.exit_code) {
        (Some(sig), _) => {
            let name = match sig {
                9 => "killed".to_string(),
                15 => "terminated".to_string(),
                n => format!("signal {n}"),
            };
            let status = format!("signal: {name}");
            json!({"exitCode": -1, "exited": false, "status": status, "error": status})
        }
        (None, Some(0)) => json!({"exitCode": 0, "exited": true, "status": "exit status 0"}),
        (None, Some(code)) => {
            let status = format!("exit status {code}");
            json!({"exitCode": code, "exited": true, "status": status, "error": status})
        }
        (None, None) => {
            json!({"exitCode": -1, "exited": false, "status": "unknown", "error": "the process ended without an exit status"})
        }
    }
}

fn keepalive_interval(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s).max(MIN_KEEPALIVE))
        .unwrap_or(DEFAULT_KEEPALIVE)
}

/// `Connect-Timeout-Ms` of a start: the process's lifetime (none when absent or 0).
fn lifetime(headers: &HeaderMap) -> Option<u64> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
}

/// Output of a process the stream forwards.
enum Output {
    Exec(ExecHandle),
    Pty(space_proto::PtyHandle),
}

impl Output {
    fn pid(&self) -> u32 {
        match self {
            Output::Exec(h) => h.pid(),
            Output::Pty(h) => h.pid(),
        }
    }

    /// The next data event, `None` at the exit (its status then in `status`).
    async fn next(&mut self, pty: bool) -> Result<Option<Value>, space_proto::ClientError> {
        let enc = |b: &[u8]| b64().encode(b);
        Ok(match self {
            Output::Exec(h) => h.next_output().await?.map(|o| match o {
                ExecOutput::Stdout(b) if pty => json!({"pty": enc(&b)}),
                ExecOutput::Stdout(b) => json!({"stdout": enc(&b)}),
                ExecOutput::Stderr(b) => json!({"stderr": enc(&b)}),
            }),
            Output::Pty(h) => h.next_output().await?.map(|b| json!({"pty": enc(&b)})),
        })
    }

    fn status(&self) -> Option<ExitStatus> {
        match self {
            Output::Exec(h) => h.status(),
            Output::Pty(h) => h.status(),
        }
    }
}

/// Streams a process's events: start, data and keepalives, end. Returns when the process
/// ended or the client went away (the process runs on).
async fn forward(tx: StreamTx, mut out: Output, pty: bool, keepalive: Duration) {
    if !tx
        .send(&json!({"event": {"start": {"pid": out.pid()}}}))
        .await
    {
        return;
    }
    // Output is read by its own task, so that waiting for it can be given up (keepalive,
    // client gone) without losing part of a record.
    let (events, mut rx) = tokio::sync::mpsc::channel::<RpcResult<Option<Value>>>(4);
    let reader = tokio::spawn(async move {
        loop {
            let next = out.next(pty).await;
            let last = !matches!(next, Ok(Some(_)));
            let next = match next {
                Ok(Some(data)) => Ok(Some(json!({"event": {"data": data}}))),
                Ok(None) => {
                    let status = out.status().unwrap_or(ExitStatus {
                        exit_code: None,
                        signal: None,
                        timed_out: false,
                    });
                    if status.timed_out {
                        // The start's deadline (`Connect-Timeout-Ms`) passed and the process
                        // was killed: the stream ends as a Connect deadline, as envd's does,
                        // not as an exit.
                        Err(RpcError::new(
                            Code::DeadlineExceeded,
                            "the process ran past the request's deadline and was killed",
                        ))
                    } else {
                        Ok(Some(json!({"event": {"end": end_event(&status)}})))
                    }
                }
                Err(e) => Err(RpcError::from(e)),
            };
            if events.send(next).await.is_err() || last {
                return;
            }
        }
    });
    loop {
        let next = tokio::select! {
            n = rx.recv() => n,
            _ = tokio::time::sleep(keepalive) => {
                if !tx.send(&json!({"event": {"keepalive": {}}})).await {
                    break;
                }
                continue;
            }
            _ = tx.closed() => break,
        };
        match next {
            Some(Ok(Some(event))) => {
                let end = event["event"].get("end").is_some();
                if !tx.send(&event).await {
                    break;
                }
                if end {
                    tx.end(None).await;
                    break;
                }
            }
            Some(Ok(None)) | None => {
                tx.end(Some(RpcError::new(
                    Code::Internal,
                    "the process's output ended without an exit",
                )))
                .await;
                break;
            }
            Some(Err(err)) => {
                tx.end(Some(err)).await;
                break;
            }
        }
    }
    reader.abort();
}

/// `Start` (server stream).
pub async fn start(e: Envd, headers: HeaderMap, body: Body) -> Response {
    let req: StartRequest = match connect::stream_request(&headers, body).await {
        Ok(r) => r,
        Err(err) => return err.stream(),
    };
    if req.process.cmd.is_empty() {
        return RpcError::invalid("process.cmd is empty").stream();
    }
    let username = match e.username().await {
        Ok(u) => u,
        Err(err) => return err.stream(),
    };
    // A relative working directory is under the user's home, as envd resolves it (asked
    // of the guest only then: most starts name none or an absolute one).
    let cwd = match &req.process.cwd {
        Some(c) if !c.starts_with('/') => {
            let home = match e.account().await {
                Ok(a) => a.home.clone(),
                Err(err) => return err.stream(),
            };
            match super::filesystem::resolve(&home, c) {
                Ok(p) => Some(p),
                Err(err) => return err.stream(),
            }
        }
        other => other.clone(),
    };
    let mut argv = vec![req.process.cmd.clone()];
    argv.extend(req.process.args.iter().cloned());
    let keepalive = keepalive_interval(&headers);
    let started = match &req.pty {
        Some(p) => {
            let size = p.size.as_ref();
            let mut spec = PtySpec::new(
                size.map_or(24, |s| s.rows.max(1)),
                size.map_or(80, |s| s.cols.max(1)),
            )
            .command(Command::Argv(argv));
            spec.env = req.process.envs.clone();
            spec.cwd = cwd.clone();
            spec.username = Some(username);
            spec.tag = req.tag.clone();
            e.guest.pty(spec).await.map(Output::Pty)
        }
        None => {
            let mut spec = ExecSpec::from_command(Command::Argv(argv));
            spec.env = req.process.envs.clone();
            spec.cwd = cwd.clone();
            spec.username = Some(username);
            spec.tag = req.tag.clone();
            spec.timeout_ms = lifetime(&headers);
            spec.keep_stdin = req.stdin == Some(true);
            e.guest.exec(spec).await.map(|mut h| {
                if req.stdin != Some(true) {
                    // No stdin: the process reads end-of-file at once.
                    drop(h.take_stdin());
                }
                Output::Exec(h)
            })
        }
    };
    let out = match started {
        Ok(o) => o,
        Err(err) => {
            let mut err = RpcError::from(err);
            if err.code == Code::NotFound && err.message.contains("working directory") {
                err.code = Code::InvalidArgument;
            }
            return err.stream();
        }
    };
    e.touch();
    let pty = req.pty.is_some();
    let (tx, response) = StreamTx::open();
    tokio::spawn(forward(tx, out, pty, keepalive));
    response
}

/// `Connect` (server stream): the events of a running process from now on.
pub async fn connect(e: Envd, headers: HeaderMap, body: Body) -> Response {
    let req: Selected = match connect::stream_request(&headers, body).await {
        Ok(r) => r,
        Err(err) => return err.stream(),
    };
    let (pid, pty) = match resolve(&e, &req.process).await {
        Ok(p) => p,
        Err(err) => return err.stream(),
    };
    let h = match e.guest.attach(pid).await {
        Ok(h) => h,
        Err(err) => return RpcError::from(err).stream(),
    };
    let (tx, response) = StreamTx::open();
    tokio::spawn(forward(
        tx,
        Output::Exec(h),
        pty,
        keepalive_interval(&headers),
    ));
    response
}

/// `List`: the running processes.
pub async fn list(e: Envd, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let _: Value = connect::unary_request(&headers, body).await?;
        let list = e.guest.processes().await?;
        let processes: Vec<Value> = list
            .iter()
            .filter(|p| p.running)
            .map(|p| {
                let mut config = json!({
                    "cmd": p.argv.first().cloned().unwrap_or_default(),
                    "args": p.argv.iter().skip(1).collect::<Vec<_>>(),
                    "envs": p.env,
                });
                if let Some(cwd) = &p.cwd {
                    config["cwd"] = json!(cwd);
                }
                let mut v = json!({"config": config, "pid": p.pid});
                if let Some(t) = &p.tag {
                    v["tag"] = json!(t);
                }
                v
            })
            .collect();
        Ok::<_, RpcError>(json!({ "processes": processes }))
    };
    answer(run.await)
}

fn answer(r: RpcResult<Value>) -> Response {
    match r {
        Ok(v) => connect::unary_ok(&v),
        Err(e) => e.unary(),
    }
}

/// `SendInput`.
pub async fn send_input(e: Envd, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let req: SendInput = connect::unary_request(&headers, body).await?;
        let (pid, _) = resolve(&e, &req.process).await?;
        let data = decode_input(&req.input)?;
        e.guest.send_stdin(pid, data, false).await?;
        Ok(json!({}))
    };
    answer(run.await)
}

/// `CloseStdin`.
pub async fn close_stdin(e: Envd, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let req: Selected = connect::unary_request(&headers, body).await?;
        let (pid, _) = resolve(&e, &req.process).await?;
        e.guest.send_stdin(pid, Bytes::new(), true).await?;
        Ok(json!({}))
    };
    answer(run.await)
}

/// `SendSignal`.
pub async fn send_signal(e: Envd, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let req: SendSignal = connect::unary_request(&headers, body).await?;
        let signal = signal_number(&req.signal)?;
        let (pid, _) = resolve(&e, &req.process).await?;
        e.guest.signal(pid, signal).await?;
        Ok(json!({}))
    };
    answer(run.await)
}

/// `Update`: a PTY's size.
pub async fn update(e: Envd, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let req: Update = connect::unary_request(&headers, body).await?;
        let (pid, _) = resolve(&e, &req.process).await?;
        if let Some(size) = req.pty.and_then(|p| p.size) {
            e.guest.resize(pid, size.rows, size.cols).await?;
        }
        Ok(json!({}))
    };
    answer(run.await)
}

/// `StreamInput` (client stream): `start` names the process, then `data` messages feed it.
/// The answer (one empty message) comes when the client's stream ends.
pub async fn stream_input(e: Envd, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let mut reader = connect::EnvelopeReader::new(&headers, body)?;
        let mut pid = None;
        while let Some(msg) = reader.next::<StreamInputMessage>().await? {
            if let Some(start) = msg.start {
                pid = Some(resolve(&e, &start.process).await?.0);
            }
            if let Some(data) = msg.data {
                let pid = pid.ok_or_else(|| {
                    RpcError::invalid("input came before the start message naming the process")
                })?;
                e.guest
                    .send_stdin(pid, decode_input(&data.input)?, false)
                    .await?;
            }
        }
        Ok::<_, RpcError>(())
    };
    let result = run.await;
    let (tx, response) = StreamTx::open();
    tokio::spawn(async move {
        match result {
            Ok(()) => {
                if tx.send(&json!({})).await {
                    tx.end(None).await;
                }
            }
            Err(err) => tx.end(Some(err)).await,
        }
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_are_worded_as_envd_words_them() {
        let s = |exit_code, signal| ExitStatus {
            exit_code,
            signal,
            timed_out: false,
        };
        assert_eq!(end_event(&s(Some(0), None))["exitCode"], 0);
        assert!(end_event(&s(Some(0), None)).get("error").is_none());
        let failed = end_event(&s(Some(3), None));
        assert_eq!(
            (failed["exitCode"].as_i64(), failed["error"].as_str()),
            (Some(3), Some("exit status 3"))
        );
        let killed = end_event(&s(Some(137), Some(9)));
        assert_eq!(
            (killed["exitCode"].as_i64(), killed["status"].as_str()),
            (Some(-1), Some("signal: killed"))
        );
    }

    #[test]
    fn signals_and_inputs_are_checked() {
        assert_eq!(signal_number(&json!("SIGNAL_SIGKILL")).unwrap(), 9);
        assert_eq!(signal_number(&json!(15)).unwrap(), 15);
        assert!(signal_number(&json!("SIGNAL_SIGSTOP")).is_err());
        assert!(signal_number(&json!(null)).is_err());
        let ok = Input {
            stdin: Some("aGkK".into()),
            pty: None,
        };
        assert_eq!(&decode_input(&ok).unwrap()[..], b"hi\n");
        let bad = Input {
            stdin: Some("not base64!".into()),
            pty: None,
        };
        assert_eq!(decode_input(&bad).unwrap_err().code, Code::InvalidArgument);
    }
}
