//! A deliberately small QMP client for the bare restore reference.
//!
//! QMP is newline-delimited JSON over a Unix socket: a greeting, then one reply per command,
//! with asynchronous events interleaved. This client sends one command at a time and reads
//! lines until that command's `return` or `error`, keeping events aside, and can attach a file
//! descriptor to a command (`getfd`) with `SCM_RIGHTS`. It has none of the runtime's
//! machinery (no background reader, no exit racing, no request ids): it exists to show what
//! driving QEMU costs with the least code in between.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::UnixStream;

/// Longest line accepted from QEMU; replies the bench asks for are a few hundred bytes.
const MAX_LINE: usize = 1 << 20;

/// One line QEMU sent, classified.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// The greeting (`{"QMP": {...}}`) sent once on connect.
    Greeting(Value),
    /// A successful reply.
    Return(Value),
    /// A failed reply: QEMU's error class and description.
    Error { class: String, desc: String },
    /// An asynchronous event.
    Event { name: String, data: Value },
}

/// Classifies one QMP line.
pub fn parse_message(line: &[u8]) -> Result<Message> {
    let value: Value = serde_json::from_slice(line).with_context(|| {
        format!(
            "QMP sent a line that is not JSON: {:?}",
            String::from_utf8_lossy(&line[..line.len().min(200)])
        )
    })?;
    let Value::Object(mut obj) = value else {
        bail!("QMP sent a JSON value that is not an object");
    };
    if let Some(greeting) = obj.remove("QMP") {
        return Ok(Message::Greeting(greeting));
    }
    if let Some(ret) = obj.remove("return") {
        return Ok(Message::Return(ret));
    }
    if let Some(err) = obj.remove("error") {
        let field = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        return Ok(Message::Error {
            class: field("class"),
            desc: field("desc"),
        });
    }
    if let Some(Value::String(name)) = obj.remove("event") {
        let data = obj.remove("data").unwrap_or(Value::Null);
        return Ok(Message::Event { name, data });
    }
    bail!("QMP sent an object that is neither greeting, reply nor event")
}

/// The line for a command, newline included.
pub fn command_line(name: &str, args: Option<Value>) -> Vec<u8> {
    let mut cmd = json!({ "execute": name });
    if let Some(args) = args {
        cmd["arguments"] = args;
    }
    let mut line = serde_json::to_vec(&cmd).expect("a JSON value always serializes");
    line.push(b'\n');
    line
}

/// Splits a byte stream into lines.
#[derive(Debug, Default)]
pub struct LineBuffer {
    buf: Vec<u8>,
}

impl LineBuffer {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next complete line without its `\n` (and a trailing `\r`, if any); empty lines are
    /// skipped. Errors when a line grows past [`MAX_LINE`] without ending.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>> {
        loop {
            let Some(end) = self.buf.iter().position(|&b| b == b'\n') else {
                if self.buf.len() > MAX_LINE {
                    bail!("QMP line longer than {MAX_LINE} bytes");
                }
                return Ok(None);
            };
            let mut line: Vec<u8> = self.buf.drain(..=end).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if !line.iter().all(u8::is_ascii_whitespace) {
                return Ok(Some(line));
            }
        }
    }
}

/// A QMP connection driven one command at a time.
pub struct Qmp {
    stream: UnixStream,
    lines: LineBuffer,
    events: VecDeque<(String, Value)>,
}

impl Qmp {
    /// Connects to `path`, retrying every millisecond while the socket is not there yet (QEMU
    /// creates it a few milliseconds after exec) until `deadline`; reads the greeting and
    /// enters command mode.
    pub async fn connect(
        path: &Path,
        deadline: Instant,
        mut alive: impl FnMut() -> bool,
    ) -> Result<Qmp> {
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => break s,
                Err(e) => {
                    if !alive() {
                        bail!("QEMU exited before opening its QMP socket");
                    }
                    if Instant::now() >= deadline {
                        return Err(e).with_context(|| format!("connecting to {}", path.display()));
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        };
        let mut qmp = Qmp {
            stream,
            lines: LineBuffer::default(),
            events: VecDeque::new(),
        };
        match qmp.read_message(deadline).await? {
            Message::Greeting(_) => {}
            other => bail!("expected the QMP greeting, got {other:?}"),
        }
        qmp.execute("qmp_capabilities", None, deadline).await?;
        Ok(qmp)
    }

    /// The next message, or `None` if `deadline` passes first.
    async fn next_message(&mut self, deadline: Instant) -> Result<Option<Message>> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(line) = self.lines.next_line()? {
                return parse_message(&line).map(Some);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let Ok(read) = tokio::time::timeout(remaining, self.stream.read(&mut chunk)).await
            else {
                return Ok(None);
            };
            let n = read.context("reading QMP")?;
            if n == 0 {
                bail!("QEMU closed the QMP connection");
            }
            self.lines.push(&chunk[..n]);
        }
    }

    async fn read_message(&mut self, deadline: Instant) -> Result<Message> {
        self.next_message(deadline)
            .await?
            .ok_or_else(|| anyhow!("timed out waiting for QEMU on QMP"))
    }

    async fn read_reply(&mut self, name: &str, deadline: Instant) -> Result<Value> {
        loop {
            match self.read_message(deadline).await? {
                Message::Return(v) => return Ok(v),
                Message::Error { class, desc } => bail!("QMP {name} failed: {class}: {desc}"),
                Message::Event { name, data } => self.events.push_back((name, data)),
                Message::Greeting(_) => bail!("QMP sent a second greeting"),
            }
        }
    }

    /// Sends a command and waits for its reply.
    pub async fn execute(
        &mut self,
        name: &str,
        args: Option<Value>,
        deadline: Instant,
    ) -> Result<Value> {
        self.stream
            .write_all(&command_line(name, args))
            .await
            .with_context(|| format!("sending QMP {name}"))?;
        self.read_reply(name, deadline).await
    }

    /// Sends a command with `fd` attached as `SCM_RIGHTS` ancillary data (what `getfd` and
    /// `add-fd` expect) and waits for its reply.
    pub async fn execute_with_fd(
        &mut self,
        name: &str,
        args: Option<Value>,
        fd: BorrowedFd<'_>,
        deadline: Instant,
    ) -> Result<Value> {
        let line = command_line(name, args);
        let socket: RawFd = self.stream.as_raw_fd();
        let fds = [fd.as_raw_fd()];
        let sent = loop {
            self.stream.writable().await.context("waiting for QMP")?;
            let attempt = self.stream.try_io(Interest::WRITABLE, || {
                let iov = [IoSlice::new(&line)];
                let cmsgs = [ControlMessage::ScmRights(&fds)];
                sendmsg::<()>(socket, &iov, &cmsgs, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(io::Error::from)
            });
            match attempt {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e).with_context(|| format!("sending QMP {name}")),
            }
        };
        // The descriptor travelled with the first byte; the rest of the line, if the kernel
        // took only part of it, follows as plain data.
        self.stream
            .write_all(&line[sent..])
            .await
            .with_context(|| format!("sending QMP {name}"))?;
        self.read_reply(name, deadline).await
    }

    /// Waits until an event named `name` arrives (or one already did), up to `timeout`.
    /// Returns its data, or `None` on timeout.
    pub async fn wait_event(&mut self, name: &str, timeout: Duration) -> Result<Option<Value>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(i) = self.events.iter().position(|(n, _)| n == name) {
                return Ok(self.events.remove(i).map(|(_, d)| d));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            match self.next_message(deadline).await? {
                Some(Message::Event { name, data }) => self.events.push_back((name, data)),
                Some(other) => bail!("unexpected QMP message while idle: {other:?}"),
                None => return Ok(None),
            }
        }
    }

    /// Waits for the current migration to reach `completed`: polls `query-migrate`, and
    /// between polls sleeps until a `MIGRATION` event or a few milliseconds pass.
    pub async fn wait_migration(&mut self, deadline: Instant) -> Result<()> {
        loop {
            let info = self.execute("query-migrate", None, deadline).await?;
            match info.get("status").and_then(Value::as_str) {
                Some("completed") => return Ok(()),
                Some(s @ ("failed" | "cancelled")) => {
                    let why = info
                        .get("error-desc")
                        .and_then(Value::as_str)
                        .unwrap_or(s)
                        .to_owned();
                    bail!("migration {s}: {why}");
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                bail!("timed out waiting for the migration to complete");
            }
            self.wait_event("MIGRATION", Duration::from_millis(5))
                .await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_messages() {
        let greeting =
            br#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}}, "capabilities": ["oob"]}}"#;
        assert!(matches!(
            parse_message(greeting).unwrap(),
            Message::Greeting(_)
        ));
        assert_eq!(
            parse_message(br#"{"return": {}}"#).unwrap(),
            Message::Return(json!({}))
        );
        assert_eq!(
            parse_message(br#"{"return": {"status": "completed"}, "id": 3}"#).unwrap(),
            Message::Return(json!({"status": "completed"}))
        );
        assert_eq!(
            parse_message(br#"{"error": {"class": "GenericError", "desc": "no"}}"#).unwrap(),
            Message::Error {
                class: "GenericError".into(),
                desc: "no".into()
            }
        );
        assert_eq!(
            parse_message(
                br#"{"timestamp": {"seconds": 1, "microseconds": 2}, "event": "MIGRATION", "data": {"status": "active"}}"#
            )
            .unwrap(),
            Message::Event {
                name: "MIGRATION".into(),
                data: json!({"status": "active"})
            }
        );
        assert_eq!(
            parse_message(br#"{"event": "STOP"}"#).unwrap(),
            Message::Event {
                name: "STOP".into(),
                data: Value::Null
            }
        );
    }

    #[test]
    fn rejects_what_is_not_qmp() {
        assert!(parse_message(b"not json").is_err());
        assert!(parse_message(b"[1, 2]").is_err());
        assert!(parse_message(br#"{"something": 1}"#).is_err());
        assert!(parse_message(br#"{"event": 5}"#).is_err());
    }

    #[test]
    fn builds_command_lines() {
        assert_eq!(
            command_line("cont", None),
            b"{\"execute\":\"cont\"}\n".to_vec()
        );
        let line = command_line("getfd", Some(json!({"fdname": "in"})));
        assert_eq!(line.last(), Some(&b'\n'));
        let back: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            back,
            json!({"execute": "getfd", "arguments": {"fdname": "in"}})
        );
    }

    #[test]
    fn splits_lines_across_chunks() {
        let mut lb = LineBuffer::default();
        lb.push(b"{\"return\"");
        assert_eq!(lb.next_line().unwrap(), None);
        lb.push(b": {}}\r\n\n{\"event\": \"STOP\"}\n{\"par");
        assert_eq!(lb.next_line().unwrap().unwrap(), b"{\"return\": {}}");
        assert_eq!(lb.next_line().unwrap().unwrap(), b"{\"event\": \"STOP\"}");
        assert_eq!(lb.next_line().unwrap(), None);
        lb.push(b"tial\": 1}\n");
        assert_eq!(lb.next_line().unwrap().unwrap(), b"{\"partial\": 1}");
    }

    #[test]
    fn bounds_unterminated_lines() {
        let mut lb = LineBuffer::default();
        lb.push(&vec![b'x'; MAX_LINE + 1]);
        assert!(lb.next_line().is_err());
    }

    #[tokio::test]
    async fn talks_to_a_fake_qemu_and_passes_a_descriptor() {
        use std::os::fd::AsFd;
        use tokio::io::AsyncBufReadExt;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let (r, mut w) = stream.into_split();
            let mut lines = tokio::io::BufReader::new(r).lines();
            w.write_all(b"{\"QMP\": {\"capabilities\": []}}\n")
                .await
                .unwrap();
            let mut seen = Vec::new();
            while let Some(line) = lines.next_line().await.unwrap() {
                let v: Value = serde_json::from_str(&line).unwrap();
                let name = v["execute"].as_str().unwrap().to_owned();
                let reply = match name.as_str() {
                    "query-migrate" if !seen.contains(&"query-migrate".to_string()) => {
                        // First poll: still active, then the completion event.
                        "{\"return\": {\"status\": \"active\"}}\n\
                         {\"event\": \"MIGRATION\", \"data\": {\"status\": \"completed\"}}\n"
                    }
                    "query-migrate" => "{\"return\": {\"status\": \"completed\"}}\n",
                    "bad" => "{\"error\": {\"class\": \"GenericError\", \"desc\": \"nope\"}}\n",
                    _ => "{\"return\": {}}\n",
                };
                seen.push(name);
                w.write_all(reply.as_bytes()).await.unwrap();
            }
            seen
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut qmp = Qmp::connect(&path, deadline, || true).await.unwrap();
        let file = tempfile::tempfile().unwrap();
        qmp.execute_with_fd(
            "getfd",
            Some(json!({"fdname": "x"})),
            file.as_fd(),
            deadline,
        )
        .await
        .unwrap();
        let err = qmp.execute("bad", None, deadline).await.unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
        qmp.wait_migration(deadline).await.unwrap();
        drop(qmp);
        let seen = server.await.unwrap();
        assert_eq!(
            seen,
            [
                "qmp_capabilities",
                "getfd",
                "bad",
                "query-migrate",
                "query-migrate"
            ]
        );
    }
}
