//! A QMP (QEMU Machine Protocol) client over a Unix stream: the greeting and capability
//! negotiation, commands tagged with ids and matched to their responses, asynchronous events
//! fanned out to subscribers, and file descriptors passed with `getfd` (SCM_RIGHTS).
//!
//! QEMU runs guest-controlled emulation, so what comes back over this socket is treated as
//! untrusted: lines are bounded, malformed messages are dropped, a lost connection fails every
//! waiting command at once instead of leaving it hanging, and slow event subscribers lose old
//! events rather than grow memory.

use std::collections::HashMap;
use std::fmt;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{broadcast, oneshot};
use tokio::task::JoinHandle;

/// Longest line accepted from QEMU. Real replies are a few KiB (`query-migrate`,
/// `query-qmp-schema` excepted, which this client never sends).
pub const MAX_LINE: usize = 1 << 20;

/// Events kept for a subscriber that is not reading; older ones are dropped.
const EVENT_BACKLOG: usize = 256;

/// Errors of the QMP client.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    /// Reading or writing the socket failed.
    #[error("QMP socket i/o")]
    Io(#[from] std::io::Error),
    /// The connection is gone (QEMU exited or closed it); every waiting command gets this.
    #[error("QMP connection closed: {0}")]
    Closed(String),
    /// QEMU sent a line longer than [`MAX_LINE`].
    #[error("QMP line longer than {MAX_LINE} bytes")]
    LineTooLong,
    /// The greeting or a reply did not have the expected shape.
    #[error("unexpected QMP message: {0}")]
    Protocol(String),
    /// QEMU refused the command.
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        /// The command that failed.
        command: String,
        /// QEMU's error class (`GenericError`, `CommandNotFound`, ...).
        class: String,
        /// QEMU's human-readable description.
        desc: String,
    },
    /// A successful reply did not decode into the expected type.
    #[error("decoding the reply to {command}")]
    Decode {
        /// The command whose reply did not decode.
        command: String,
        /// The decoder's complaint.
        source: serde_json::Error,
    },
}

/// QEMU's version as its greeting reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QemuVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
    /// Micro version.
    pub micro: u32,
    /// Distribution build string (for example Debian's package version); migration
    /// compatibility is only promised between identical builds.
    #[serde(default)]
    pub package: String,
}

impl fmt::Display for QemuVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.micro)?;
        if !self.package.is_empty() {
            write!(f, " ({})", self.package)?;
        }
        Ok(())
    }
}

/// An asynchronous QMP event.
#[derive(Debug, Clone)]
pub struct Event {
    /// Event name, e.g. `MIGRATION`, `STOP`, `SHUTDOWN`.
    pub name: String,
    /// Event payload (`null` when absent).
    pub data: Value,
}

/// Answer of `query-status`.
#[derive(Debug, Clone, Deserialize)]
pub struct Status {
    /// Whether vCPUs are running.
    pub running: bool,
    /// QEMU's run state (`running`, `paused`, `postmigrate`, `inmigrate`, ...).
    pub status: String,
}

/// The parts of `query-migrate` the runtime needs.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MigrationInfo {
    /// `none`, `setup`, `active`, `completed`, `failed`, `cancelled`, ...; absent before any
    /// migration.
    #[serde(default)]
    pub status: Option<String>,
    /// Why a migration failed.
    #[serde(rename = "error-desc", default)]
    pub error_desc: Option<String>,
}

type Reply = Result<Value, QmpError>;

/// Commands waiting for replies, and why the connection closed once it has.
#[derive(Default)]
struct Pending {
    waiters: HashMap<u64, (String, oneshot::Sender<Reply>)>,
    closed: Option<String>,
}

/// A connected, negotiated QMP session. Commands may be issued concurrently from many tasks.
pub struct Qmp {
    /// Serializes writes so two commands never interleave their bytes.
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Arc<Mutex<Pending>>,
    events: broadcast::Sender<Event>,
    next_id: AtomicU64,
    version: QemuVersion,
    /// Reads replies and events; aborted when the session is dropped.
    reader: JoinHandle<()>,
}

impl fmt::Debug for Qmp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Qmp")
            .field("version", &self.version)
            .field("closed", &self.closed())
            .finish()
    }
}

impl Drop for Qmp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Splits a byte stream from QEMU into `\n`-terminated lines, bounded by [`MAX_LINE`]; a
/// trailing `\r` is dropped. The lines do not depend on how the stream was cut into reads.
#[derive(Debug, Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
    /// Where the next line starts in `buf`.
    start: usize,
    /// How far past `start` is known to hold no `\n`.
    scanned: usize,
}

impl LineSplitter {
    /// An empty splitter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole line without its terminator, `Ok(None)` when none is complete yet, or
    /// [`QmpError::LineTooLong`] once a line, whole or not yet, passes [`MAX_LINE`]; after
    /// that error the stream is not worth reading further.
    pub fn next_line(&mut self) -> Result<Option<Vec<u8>>, QmpError> {
        let from = self.start + self.scanned;
        if let Some(pos) = self.buf[from..].iter().position(|&b| b == b'\n') {
            let end = from + pos;
            if end - self.start > MAX_LINE {
                return Err(QmpError::LineTooLong);
            }
            let mut line = self.buf[self.start..end].to_vec();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.start = end + 1;
            self.scanned = 0;
            if self.start > self.buf.len() / 2 {
                self.buf.drain(..self.start);
                self.start = 0;
            }
            return Ok(Some(line));
        }
        self.scanned = self.buf.len() - self.start;
        if self.scanned > MAX_LINE {
            return Err(QmpError::LineTooLong);
        }
        Ok(None)
    }

    /// Bytes held that are not yet a whole line.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }
}

/// Reads lines off an async stream with a [`LineSplitter`].
struct LineReader<R> {
    inner: R,
    lines: LineSplitter,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            lines: LineSplitter::new(),
        }
    }

    /// The next line without its terminator; `None` at a clean end of stream.
    async fn next_line(&mut self) -> Result<Option<Vec<u8>>, QmpError> {
        loop {
            if let Some(line) = self.lines.next_line()? {
                return Ok(Some(line));
            }
            let mut chunk = [0u8; 8192];
            let n = self.inner.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.lines.push(&chunk[..n]);
        }
    }
}

impl Qmp {
    /// Reads the greeting, starts the reader and negotiates capabilities.
    pub async fn connect(stream: UnixStream) -> Result<Self, QmpError> {
        let (read, write) = stream.into_split();
        let mut lines = LineReader::new(read);
        let greeting = lines
            .next_line()
            .await?
            .ok_or_else(|| QmpError::Closed("before the greeting".into()))?;
        let version = parse_greeting(&greeting)?;

        let pending = Arc::new(Mutex::new(Pending::default()));
        let (events, _) = broadcast::channel(EVENT_BACKLOG);
        let reader = tokio::spawn(read_loop(lines, pending.clone(), events.clone()));
        let qmp = Qmp {
            writer: tokio::sync::Mutex::new(write),
            pending,
            events,
            next_id: AtomicU64::new(1),
            version,
            reader,
        };
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    /// The QEMU version from the greeting.
    pub fn version(&self) -> &QemuVersion {
        &self.version
    }

    /// A receiver of events from now on. Subscribe *before* issuing the command whose events
    /// you wait for, or they may pass unseen.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Why the connection is closed, if it is.
    pub fn closed(&self) -> Option<String> {
        lock(&self.pending).closed.clone()
    }

    /// Runs a command and returns its `return` value.
    pub async fn execute(&self, command: &str, args: Option<Value>) -> Result<Value, QmpError> {
        self.send(command, args, None).await
    }

    /// Runs a command and decodes its `return` value.
    pub async fn call<T: DeserializeOwned>(
        &self,
        command: &str,
        args: Option<Value>,
    ) -> Result<T, QmpError> {
        let value = self.execute(command, args).await?;
        serde_json::from_value(value).map_err(|source| QmpError::Decode {
            command: command.to_owned(),
            source,
        })
    }

    /// Hands `fd` to QEMU under `name` (`getfd`), for commands that take `fd:NAME` URIs.
    /// QEMU holds its own duplicate; the caller may close its copy afterwards.
    pub async fn getfd(&self, name: &str, fd: BorrowedFd<'_>) -> Result<(), QmpError> {
        self.send("getfd", Some(json!({ "fdname": name })), Some(fd))
            .await
            .map(drop)
    }

    /// `query-status`.
    pub async fn query_status(&self) -> Result<Status, QmpError> {
        self.call("query-status", None).await
    }

    /// `query-migrate`.
    pub async fn query_migrate(&self) -> Result<MigrationInfo, QmpError> {
        self.call("query-migrate", None).await
    }

    /// Sets migration capabilities, each to `true`.
    pub async fn enable_migration_capabilities(&self, names: &[&str]) -> Result<(), QmpError> {
        let caps: Vec<Value> = names
            .iter()
            .map(|n| json!({ "capability": n, "state": true }))
            .collect();
        self.execute(
            "migrate-set-capabilities",
            Some(json!({ "capabilities": caps })),
        )
        .await
        .map(drop)
    }

    async fn send(
        &self,
        command: &str,
        args: Option<Value>,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Value, QmpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut message = json!({ "execute": command, "id": id });
        if let Some(args) = args {
            message["arguments"] = args;
        }
        let mut bytes = serde_json::to_vec(&message).expect("a JSON value always serializes");
        bytes.push(b'\n');

        let (tx, rx) = oneshot::channel();
        {
            let mut pending = lock(&self.pending);
            if let Some(reason) = &pending.closed {
                return Err(QmpError::Closed(reason.clone()));
            }
            pending.waiters.insert(id, (command.to_owned(), tx));
        }
        // Whether the reply arrives, the write fails or the caller gives up (drops this
        // future), the waiter leaves the map.
        let _forget = Forget {
            pending: &self.pending,
            id,
        };
        self.write(&bytes, fd).await?;
        match rx.await {
            Ok(reply) => reply,
            Err(_) => Err(QmpError::Closed(
                self.closed().unwrap_or_else(|| "reader stopped".into()),
            )),
        }
    }

    async fn write(&self, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
        let mut writer = self.writer.lock().await;
        let mut written = 0;
        if let Some(fd) = fd {
            // The descriptor must travel with the command's first bytes: QEMU attaches received
            // descriptors to the monitor, and `getfd` takes the most recent one.
            let stream: &UnixStream = (*writer).as_ref();
            let fds = [fd.as_raw_fd()];
            written = loop {
                stream.writable().await?;
                let sent = stream.try_io(Interest::WRITABLE, || {
                    sendmsg::<()>(
                        stream.as_raw_fd(),
                        &[IoSlice::new(bytes)],
                        &[ControlMessage::ScmRights(&fds)],
                        MsgFlags::MSG_NOSIGNAL,
                        None,
                    )
                    .map_err(std::io::Error::from)
                });
                match sent {
                    Ok(n) => break n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(e),
                }
            };
        }
        writer.write_all(&bytes[written..]).await
    }
}

/// Removes a waiter when its command is finished with.
struct Forget<'a> {
    pending: &'a Mutex<Pending>,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.pending).waiters.remove(&self.id);
    }
}

fn lock(pending: &Mutex<Pending>) -> std::sync::MutexGuard<'_, Pending> {
    // A panic while holding this lock cannot leave the map inconsistent; keep going.
    pending.lock().unwrap_or_else(|e| e.into_inner())
}

/// Parses QEMU's greeting line (`{"QMP": {"version": ...}}`).
pub fn parse_greeting(line: &[u8]) -> Result<QemuVersion, QmpError> {
    #[derive(Deserialize)]
    struct Greeting {
        #[serde(rename = "QMP")]
        qmp: GreetingBody,
    }
    #[derive(Deserialize)]
    struct GreetingBody {
        version: GreetingVersion,
    }
    #[derive(Deserialize)]
    struct GreetingVersion {
        qemu: Triple,
        #[serde(default)]
        package: String,
    }
    #[derive(Deserialize)]
    struct Triple {
        major: u32,
        minor: u32,
        micro: u32,
    }
    let g: Greeting = serde_json::from_slice(line)
        .map_err(|e| QmpError::Protocol(format!("bad greeting: {e}")))?;
    let v = g.qmp.version;
    Ok(QemuVersion {
        major: v.qemu.major,
        minor: v.qemu.minor,
        micro: v.qemu.micro,
        package: v.package.trim().to_owned(),
    })
}

/// What one line from QEMU turned out to be.
#[derive(Debug)]
pub enum Message {
    /// The answer to the command with this id: its `return`, or its error's class and
    /// description.
    Reply {
        /// The command's id.
        id: u64,
        /// `return`, or `(class, desc)` of `error`.
        result: Result<Value, (String, String)>,
    },
    /// An asynchronous event.
    Event(Event),
}

/// Parses one line after the greeting; `Err` says why it is neither a reply nor an event.
pub fn parse_message(line: &[u8]) -> Result<Message, String> {
    let mut value: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}"))?;
    let obj = value.as_object_mut().ok_or("not an object")?;
    if let Some(name) = obj.get("event").and_then(Value::as_str) {
        let name = name.to_owned();
        let data = obj.remove("data").unwrap_or(Value::Null);
        return Ok(Message::Event(Event { name, data }));
    }
    let id = obj
        .get("id")
        .and_then(Value::as_u64)
        .ok_or("reply without a numeric id")?;
    if let Some(ret) = obj.remove("return") {
        return Ok(Message::Reply {
            id,
            result: Ok(ret),
        });
    }
    if let Some(err) = obj.get("error") {
        let field = |k: &str| err.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        return Ok(Message::Reply {
            id,
            result: Err((field("class"), field("desc"))),
        });
    }
    Err("neither a reply nor an event".into())
}

async fn read_loop(
    mut lines: LineReader<OwnedReadHalf>,
    pending: Arc<Mutex<Pending>>,
    events: broadcast::Sender<Event>,
) {
    let reason = loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => break "end of stream".to_owned(),
            Err(e) => break e.to_string(),
        };
        match parse_message(&line) {
            Ok(Message::Reply { id, result }) => {
                let waiter = lock(&pending).waiters.remove(&id);
                if let Some((command, tx)) = waiter {
                    let reply = result.map_err(|(class, desc)| QmpError::Command {
                        command,
                        class,
                        desc,
                    });
                    // The caller may have given up; that is fine.
                    let _ = tx.send(reply);
                }
            }
            Ok(Message::Event(event)) => {
                // No subscribers is fine, and slow ones see `Lagged`.
                let _ = events.send(event);
            }
            Err(why) => tracing::debug!("dropping QMP message: {why}"),
        }
    };
    let waiters = {
        let mut p = lock(&pending);
        p.closed = Some(reason.clone());
        std::mem::take(&mut p.waiters)
    };
    for (_, (_, tx)) in waiters {
        let _ = tx.send(Err(QmpError::Closed(reason.clone())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::process::Stdio;
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt, BufReader};

    const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian 1:7.2+dfsg-7"}, "capabilities": ["oob"]}}"#;

    #[test]
    fn parses_greeting_and_messages() {
        let v = parse_greeting(GREETING.as_bytes()).unwrap();
        assert_eq!((v.major, v.minor, v.micro), (7, 2, 22));
        assert_eq!(v.to_string(), "7.2.22 (Debian 1:7.2+dfsg-7)");
        assert!(parse_greeting(b"{\"QMP\": {}}").is_err());

        match parse_message(br#"{"return": {"a": 1}, "id": 7}"#).unwrap() {
            Message::Reply {
                id: 7,
                result: Ok(v),
            } => assert_eq!(v["a"], 1),
            m => panic!("{m:?}"),
        }
        match parse_message(br#"{"id": 3, "error": {"class": "GenericError", "desc": "no"}}"#)
            .unwrap()
        {
            Message::Reply {
                id: 3,
                result: Err((c, d)),
            } => assert_eq!((c.as_str(), d.as_str()), ("GenericError", "no")),
            m => panic!("{m:?}"),
        }
        match parse_message(br#"{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}"#)
            .unwrap()
        {
            Message::Event(e) => {
                assert_eq!((e.name.as_str(), e.data.clone()), ("STOP", Value::Null))
            }
            m => panic!("{m:?}"),
        }
        for bad in [
            &b"[1]"[..],
            b"{\"return\": {}}",
            b"{\"id\": 1}",
            b"\xff",
            b"{\"id\": \"x\", \"return\": 1}",
        ] {
            assert!(parse_message(bad).is_err());
        }
    }

    /// A peer that speaks just enough QMP to exercise the client's failure paths.
    async fn scripted_peer(
        script: impl FnOnce(UnixStream) -> JoinHandle<()>,
    ) -> (Result<Qmp, QmpError>, JoinHandle<()>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let peer = script(theirs);
        (Qmp::connect(ours).await, peer)
    }

    #[tokio::test]
    async fn overlong_greeting_is_refused() {
        let (res, peer) = scripted_peer(|mut s| {
            tokio::spawn(async move {
                let junk = vec![b'x'; MAX_LINE + 10];
                let _ = s.write_all(&junk).await;
            })
        })
        .await;
        assert!(matches!(res, Err(QmpError::LineTooLong)), "{res:?}");
        peer.abort();
    }

    #[tokio::test]
    async fn hangup_fails_waiting_commands_and_later_ones() {
        let (res, peer) = scripted_peer(|s| {
            tokio::spawn(async move {
                let (r, mut w) = s.into_split();
                let mut r = BufReader::new(r);
                w.write_all(format!("{GREETING}\r\n").as_bytes())
                    .await
                    .unwrap();
                let mut line = String::new();
                r.read_line(&mut line).await.unwrap();
                let id = serde_json::from_str::<Value>(&line).unwrap()["id"].clone();
                // Junk and an unknown id are dropped, then the real reply.
                w.write_all(b"garbage\r\n{\"return\": {}, \"id\": 999}\r\n")
                    .await
                    .unwrap();
                w.write_all(format!("{{\"return\": {{}}, \"id\": {id}}}\r\n").as_bytes())
                    .await
                    .unwrap();
                // Read the next command and hang up without answering.
                line.clear();
                r.read_line(&mut line).await.unwrap();
            })
        })
        .await;
        let qmp = res.unwrap();
        let err = qmp.execute("stop", None).await.unwrap_err();
        assert!(matches!(err, QmpError::Closed(_)), "{err:?}");
        let err = qmp.execute("cont", None).await.unwrap_err();
        assert!(matches!(err, QmpError::Closed(_)), "{err:?}");
        peer.await.unwrap();
    }

    /// A QEMU with no machine, just a monitor: enough to test the protocol for real.
    struct BareQemu {
        child: std::process::Child,
        dir: tempfile::TempDir,
    }

    impl Drop for BareQemu {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    async fn bare_qemu() -> (BareQemu, Qmp) {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("qmp.sock");
        let mut arg = std::ffi::OsString::from("unix:");
        arg.push(&sock);
        arg.push(",server=on,wait=off");
        let child = std::process::Command::new("qemu-system-x86_64")
            .args(["-M", "none", "-nodefaults", "-nographic", "-qmp"])
            .arg(arg)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("qemu-system-x86_64 must be installed");
        let guard = BareQemu { child, dir };
        for _ in 0..500 {
            if let Ok(s) = UnixStream::connect(&sock).await {
                return (guard, Qmp::connect(s).await.unwrap());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("QEMU's QMP socket did not appear in {:?}", guard.dir.path());
    }

    #[tokio::test]
    async fn real_qemu_commands_errors_events_and_fds() {
        let (mut qemu, qmp) = bare_qemu().await;
        assert!(qmp.version().major >= 7);

        let status = qmp.query_status().await.unwrap();
        assert!(status.running, "{status:?}");

        match qmp.execute("no-such-command", None).await {
            Err(QmpError::Command { class, desc, .. }) => {
                assert_eq!(class, "CommandNotFound");
                assert!(desc.contains("no-such-command"));
            }
            other => panic!("{other:?}"),
        }

        let mut events = qmp.subscribe();
        qmp.execute("stop", None).await.unwrap();
        let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(event.name, "STOP");
        assert!(!qmp.query_status().await.unwrap().running);

        // Concurrent commands get their own replies.
        let (a, b) = tokio::join!(qmp.query_status(), qmp.query_migrate());
        assert_eq!(a.unwrap().status, "paused");
        assert!(b.unwrap().status.is_none());

        // A passed descriptor is registered under its name and can be closed again.
        let file = tempfile::tempfile().unwrap();
        qmp.getfd("probe", file.as_fd()).await.unwrap();
        qmp.execute("closefd", Some(json!({ "fdname": "probe" })))
            .await
            .unwrap();
        let err = qmp
            .execute("closefd", Some(json!({ "fdname": "probe" })))
            .await
            .unwrap_err();
        assert!(matches!(err, QmpError::Command { .. }), "{err:?}");

        // When QEMU dies, the session reports it instead of hanging.
        qemu.child.kill().unwrap();
        qemu.child.wait().unwrap();
        let err = tokio::time::timeout(Duration::from_secs(10), qmp.query_status())
            .await
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(err, QmpError::Closed(_) | QmpError::Io(_)),
            "{err:?}"
        );
        // The reader notices the hangup on its own, too.
        for _ in 0..1000 {
            if qmp.closed().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(qmp.closed().is_some());
    }
}
