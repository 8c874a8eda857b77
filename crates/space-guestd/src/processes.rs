//! The process table: the processes the daemon started, and for each running one the way in
//! from other requests than the one that started it (attach to its output, feed or close its
//! stdin, resize its terminal).
//!
//! Running processes are bounded by `MAX_PROCESSES`; the most recent finished ones are kept
//! so that a host that lost a stream can still learn how a process ended.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use space_proto::limits::{MAX_FINISHED_PROCESSES, MAX_PROCESSES};
use space_proto::query::parse_query;
use space_proto::{
    ErrorKind, ExitStatus, Frame, FrameKind, ProcessInfo, ProtoError, Resize, Started,
};
use tokio::sync::mpsc;

use crate::body::{ok_json, read_json, ChannelBody, HandlerResult};
use crate::daemon::Daemon;

/// Output records an attached reader may fall behind by before the process waits for it.
pub const ATTACH_QUEUE: usize = 8;
/// Readers attached to one process at once.
pub const MAX_ATTACHED: usize = 16;
/// Input messages queued for one process.
const INPUT_QUEUE: usize = 16;

/// Input to a process from any request.
#[derive(Debug)]
pub enum Input {
    Data(Bytes),
    Eof,
    Resize(Resize),
}

/// A stream of encoded records to one reader.
pub type Records = mpsc::Sender<io::Result<Bytes>>;

/// The way into one running process.
pub struct Control {
    input: mpsc::Sender<Input>,
    /// Readers attached after the start.
    attached: Mutex<Vec<Records>>,
    pty: bool,
}

impl Control {
    /// A control and the receiving end of its input, for the task that feeds the process.
    pub fn new(pty: bool) -> (Arc<Control>, mpsc::Receiver<Input>) {
        let (tx, rx) = mpsc::channel(INPUT_QUEUE);
        (
            Arc::new(Control {
                input: tx,
                attached: Mutex::new(Vec::new()),
                pty,
            }),
            rx,
        )
    }

    /// A sender of input, as the starting request's own stream uses it.
    pub fn input(&self) -> mpsc::Sender<Input> {
        self.input.clone()
    }

    fn attached(&self) -> MutexGuard<'_, Vec<Records>> {
        self.attached.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends one encoded record to every attached reader, waiting for each (a reader that
    /// went away is dropped).
    pub async fn broadcast(&self, record: &Bytes) {
        let readers: Vec<Records> = self.attached().clone();
        if readers.is_empty() {
            return;
        }
        let mut gone = false;
        for r in &readers {
            gone |= r.send(Ok(record.clone())).await.is_err();
        }
        if gone {
            self.attached().retain(|r| !r.is_closed());
        }
    }
}

/// Processes the daemon started.
#[derive(Default)]
pub struct ProcessTable {
    inner: Mutex<Procs>,
}

#[derive(Default)]
struct Procs {
    running: HashMap<u32, (ProcessInfo, Arc<Control>)>,
    finished: VecDeque<ProcessInfo>,
    reserved: usize,
}

/// A slot for a process about to be spawned; released on drop unless registered.
pub struct Reservation<'a> {
    table: &'a ProcessTable,
    live: bool,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.live {
            self.table.lock().reserved -= 1;
        }
    }
}

fn not_running(pid: u32) -> ProtoError {
    ProtoError::new(
        ErrorKind::NotFound,
        format!("no running process {pid} started by the daemon"),
    )
}

impl ProcessTable {
    fn lock(&self) -> MutexGuard<'_, Procs> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn reserve(&self) -> Result<Reservation<'_>, ProtoError> {
        let mut p = self.lock();
        if p.running.len() + p.reserved >= MAX_PROCESSES {
            return Err(ProtoError::new(
                ErrorKind::Busy,
                format!("{MAX_PROCESSES} processes are already running"),
            ));
        }
        p.reserved += 1;
        Ok(Reservation {
            table: self,
            live: true,
        })
    }

    pub fn register(&self, mut slot: Reservation<'_>, info: ProcessInfo, control: Arc<Control>) {
        slot.live = false;
        let mut p = self.lock();
        p.reserved -= 1;
        p.running.insert(info.pid, (info, control));
    }

    /// Records how `pid` ended; returns the readers attached to it then, which get the exit
    /// record from the caller. No reader attaches after this.
    pub fn finish(&self, pid: u32, exit: ExitStatus) -> Vec<Records> {
        let mut p = self.lock();
        let Some((mut info, control)) = p.running.remove(&pid) else {
            return Vec::new();
        };
        info.running = false;
        info.exit = Some(exit);
        p.finished.push_back(info);
        while p.finished.len() > MAX_FINISHED_PROCESSES {
            p.finished.pop_front();
        }
        drop(p);
        let attached = std::mem::take(&mut *control.attached());
        attached
    }

    pub fn is_running(&self, pid: u32) -> bool {
        self.lock().running.contains_key(&pid)
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        let p = self.lock();
        let mut out: Vec<ProcessInfo> = p.running.values().map(|(i, _)| i.clone()).collect();
        out.sort_by_key(|i| (i.started_at_unix_ms, i.pid));
        out.extend(p.finished.iter().cloned());
        out
    }

    /// Attaches `reader` to the output of running process `pid`.
    pub fn attach(&self, pid: u32, reader: Records) -> Result<(), ProtoError> {
        let p = self.lock();
        let (_, control) = p.running.get(&pid).ok_or_else(|| not_running(pid))?;
        let mut attached = control.attached();
        attached.retain(|r| !r.is_closed());
        if attached.len() >= MAX_ATTACHED {
            return Err(ProtoError::new(
                ErrorKind::Busy,
                format!("{MAX_ATTACHED} readers are already attached to process {pid}"),
            ));
        }
        attached.push(reader);
        Ok(())
    }

    /// Sends `input` to running process `pid` (waiting while its queue is full).
    pub async fn input(&self, pid: u32, input: Input) -> Result<(), ProtoError> {
        let control = {
            let p = self.lock();
            p.running
                .get(&pid)
                .ok_or_else(|| not_running(pid))?
                .1
                .clone()
        };
        if matches!(input, Input::Resize(_)) && !control.pty {
            return Err(ProtoError::invalid(format!(
                "process {pid} has no terminal to resize"
            )));
        }
        control.input.send(input).await.map_err(|_| {
            ProtoError::new(
                ErrorKind::Closed,
                format!("the input of process {pid} is closed"),
            )
        })
    }
}

// ---- the routes of one process ----

/// `GET /v1/processes/{pid}/attach`: `Started`, then the output from now on, then `Exit`.
pub async fn attach(d: Arc<Daemon>, pid: u32) -> HandlerResult {
    let (tx, body) = ChannelBody::new(ATTACH_QUEUE);
    // Cannot fail: the channel is new and has room.
    let _ = tx.try_send(Ok(
        Frame::json(FrameKind::Started, &Started { pid }).encode()
    ));
    d.processes.attach(pid, tx)?;
    Ok(Response::new(body.boxed()))
}

/// `POST /v1/processes/{pid}/stdin[?eof=true]`: the body's bytes to the process's input,
/// in order, then the end of its input with `eof=true`.
pub async fn stdin(d: Arc<Daemon>, pid: u32, req: Request<Incoming>) -> HandlerResult {
    let pairs = parse_query(req.uri().query())?;
    let mut eof = false;
    for (k, v) in &pairs {
        match (k.as_str(), v.as_str()) {
            ("eof", "true" | "1" | "") => eof = true,
            ("eof", "false" | "0") => {}
            _ => {
                return Err(ProtoError::invalid(format!(
                    "unknown query parameter {k}={v:?}"
                )))
            }
        }
    }
    if !d.processes.is_running(pid) {
        return Err(not_running(pid));
    }
    let mut body = req.into_body();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|_| ProtoError::new(ErrorKind::Closed, "request body was cut off"))?;
        if let Ok(data) = frame.into_data() {
            if !data.is_empty() {
                d.processes.input(pid, Input::Data(data)).await?;
            }
        }
    }
    if eof {
        d.processes.input(pid, Input::Eof).await?;
    }
    ok_json(&serde_json::json!({}))
}

/// `POST /v1/processes/{pid}/resize`: the terminal's new size.
pub async fn resize(d: Arc<Daemon>, pid: u32, req: Request<Incoming>) -> HandlerResult {
    let size: Resize = read_json(req.into_body()).await?;
    if size.rows == 0 || size.cols == 0 {
        return Err(ProtoError::invalid(format!(
            "terminal size {}x{} is empty",
            size.rows, size.cols
        )));
    }
    d.processes.input(pid, Input::Resize(size)).await?;
    ok_json(&serde_json::json!({}))
}
