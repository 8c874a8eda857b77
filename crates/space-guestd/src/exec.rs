//! `POST /v1/exec`: runs a process with piped stdio and streams it both ways.
//!
//! The request body is a `Spec` record followed by `Stdin`/`StdinEof`/`Signal` records; the
//! response is `Started`, then `Stdout`/`Stderr` records as output arrives, then `Exit`. Each
//! process leads its own session (and so its own process group): signals and the timeout's
//! SIGKILL hit everything it started in that group.
//!
//! If the host drops the response stream the process keeps running until it exits on its own
//! (or its timeout fires); its output is read and discarded so it never blocks on a full pipe
//! (or goes to the readers attached since, `crate::processes`), and it stays in the process
//! list, where the host can signal it, feed its stdin and attach to its output. Nothing outlives the
//! process: the tasks serving it end when it exits and its pipes reach end-of-file (or go quiet
//! for `DRAIN_IDLE` after the exit, when a background child still holds them open).

use std::collections::BTreeMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use nix::sys::signal::Signal;
use space_proto::limits::{MAX_ARGS, MAX_ARGV_BYTES};
use space_proto::query::validate_path;
use space_proto::{
    Command, ErrorKind, ExecSpec, ExitStatus, Frame, FrameKind, ProcessInfo, ProtoError,
    SignalRequest, Started,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, watch};

use crate::body::{ChannelBody, FrameReader, HandlerResult};
use crate::daemon::{unix_ms, Daemon};
use crate::processes::{Control, Input, Records};
use crate::reaper::ExitWaiter;

/// How long the host has to send the `Spec` record after opening the request.
pub const SPEC_TIMEOUT: Duration = Duration::from_secs(10);
/// After the process exits, output still arriving is forwarded; a pipe quiet for this long is
/// held open by some background descendant and is abandoned.
pub const DRAIN_IDLE: Duration = Duration::from_millis(200);
/// Largest read from a pipe, and so the largest output record.
const READ_CHUNK: usize = 64 * 1024;
/// Output records buffered per process before backpressure stops reading the pipes.
const OUTPUT_QUEUE: usize = 8;

/// A validated, ready-to-spawn command.
pub struct Prepared {
    pub command: std::process::Command,
    pub argv: Vec<String>,
    /// Its working directory.
    pub cwd: String,
}

/// Who a process runs as and where: the fields shared by exec and PTY specs.
pub struct Who<'a> {
    pub username: Option<&'a str>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub cwd: Option<&'a str>,
}

/// Checks a command and its environment and builds the `std::process::Command` for it. The
/// caller adds stdio and a `pre_exec` hook. With a username, the account's uid, gid and
/// variables (`HOME`, `USER`, `LOGNAME`, `SHELL`; the spec's own `env` wins) apply, and its
/// home is the default working directory.
pub fn prepare(
    d: &Daemon,
    command: &Command,
    env: &BTreeMap<String, String>,
    who: Who<'_>,
) -> Result<Prepared, ProtoError> {
    let Who {
        username,
        mut uid,
        mut gid,
        cwd,
    } = who;
    let argv = command.to_argv();
    if argv.is_empty() || argv[0].is_empty() {
        return Err(ProtoError::invalid("the command is empty"));
    }
    if argv.len() > MAX_ARGS {
        return Err(ProtoError::new(
            ErrorKind::TooLarge,
            format!("{} arguments; the limit is {MAX_ARGS}", argv.len()),
        ));
    }
    let bytes: usize = argv.iter().map(|a| a.len() + 1).sum();
    if bytes > MAX_ARGV_BYTES {
        return Err(ProtoError::new(
            ErrorKind::TooLarge,
            format!("arguments are {bytes} bytes; the limit is {MAX_ARGV_BYTES}"),
        ));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ProtoError::invalid("an argument contains a NUL byte"));
    }
    let (default_user, default_workdir) = {
        let id = d.identity();
        (id.user.clone(), id.workdir.clone())
    };
    let mut username = username.map(str::to_owned);
    if username.is_none() && uid.is_none() && gid.is_none() {
        if let Some(spec) = &default_user {
            (username, uid, gid) = crate::users::parse_spec(spec, crate::users::GROUP)?;
        }
    }
    let mut env = env.clone();
    let mut home = None;
    if let Some(name) = username.as_deref() {
        let account = crate::users::lookup(name)?;
        uid = uid.or(Some(account.uid));
        gid = gid.or(Some(account.gid));
        for (k, v) in [
            ("HOME", account.home.as_str()),
            ("USER", name),
            ("LOGNAME", name),
            ("SHELL", account.shell.as_str()),
        ] {
            env.entry(k.to_owned()).or_insert_with(|| v.to_owned());
        }
        home = Some(account.home);
    }
    let env = d.environment(&env)?;
    let cwd = cwd
        .map(str::to_owned)
        .or(default_workdir.filter(|w| std::path::Path::new(w).is_dir()))
        .or(home.filter(|h| std::path::Path::new(h).is_dir()))
        .unwrap_or_else(|| "/".into());
    let cwd = cwd.as_str();
    validate_path(cwd)?;
    match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(ProtoError::new(
                ErrorKind::NotADirectory,
                format!("working directory {cwd} is not a directory"),
            ))
        }
        Err(e) => return Err(ProtoError::io(format!("working directory {cwd}"), &e)),
    }
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).env_clear().envs(&env).current_dir(cwd);
    if let Some(uid) = uid {
        // Without an explicit gid the process gets the group of the same number, so a uid
        // alone never leaves it in root's group.
        cmd.uid(uid).gid(gid.unwrap_or(uid));
    } else if let Some(gid) = gid {
        cmd.gid(gid);
    }
    Ok(Prepared {
        command: cmd,
        argv,
        cwd: cwd.to_owned(),
    })
}

/// The error for a failed spawn, naming the command.
pub fn spawn_error(argv0: &str, err: &io::Error) -> ProtoError {
    match ErrorKind::from_io(err) {
        ErrorKind::NotFound => {
            ProtoError::new(ErrorKind::NotFound, format!("command not found: {argv0}"))
        }
        ErrorKind::PermissionDenied => ProtoError::new(
            ErrorKind::PermissionDenied,
            format!("cannot execute {argv0}: {err}"),
        ),
        _ => ProtoError::new(
            ErrorKind::SpawnFailed,
            format!("cannot start {argv0}: {err}"),
        ),
    }
}

/// Reads the first record of a streamed request, which must be a `Spec`.
pub async fn read_spec<T: serde::de::DeserializeOwned>(
    frames: &mut FrameReader,
) -> Result<T, ProtoError> {
    let frame = tokio::time::timeout(SPEC_TIMEOUT, frames.next())
        .await
        .map_err(|_| ProtoError::new(ErrorKind::Timeout, "no Spec record received"))?
        .map_err(|e| e.to_proto())?;
    match frame {
        Some(f) if f.kind == FrameKind::Spec => f
            .parse()
            .map_err(|e| ProtoError::invalid(format!("invalid Spec record: {e}"))),
        Some(f) => Err(ProtoError::new(
            ErrorKind::Protocol,
            format!("first record must be a Spec, got {:?}", f.kind),
        )),
        None => Err(ProtoError::new(
            ErrorKind::Protocol,
            "request body ended before the Spec record",
        )),
    }
}

/// The process list's entry of a process that just started.
pub fn info(
    pid: u32,
    prepared: (Vec<String>, String),
    env: &BTreeMap<String, String>,
    tag: Option<String>,
    pty: bool,
) -> ProcessInfo {
    let (argv, cwd) = prepared;
    ProcessInfo {
        pid,
        argv,
        started_at_unix_ms: unix_ms(SystemTime::now()),
        running: true,
        pty,
        exit: None,
        tag,
        env: env.clone(),
        cwd: Some(cwd),
    }
}

/// Where the output records of a process go: the stream of the request that started it
/// (until that reader goes away) and every reader attached since.
#[derive(Clone)]
pub struct Fanout {
    pub first: Records,
    pub control: Arc<Control>,
}

impl Fanout {
    /// Sends one record; `first_gone` is set once the first reader went away.
    async fn send(&self, record: Bytes, first_gone: &mut bool) {
        if !*first_gone && self.first.send(Ok(record.clone())).await.is_err() {
            *first_gone = true;
        }
        self.control.broadcast(&record).await;
    }

    /// Sends the last records (an error, if any, then the exit) to the first reader and to
    /// `attached`, the readers the process table handed over when the process finished.
    pub async fn finish(&self, attached: Vec<Records>, last: Vec<Bytes>) {
        for r in std::iter::once(&self.first).chain(attached.iter()) {
            for rec in &last {
                if r.send(Ok(rec.clone())).await.is_err() {
                    break;
                }
            }
        }
    }
}

/// Writes what [`Input`] brings to a process's stdin until the end of its input, the
/// process closing its stdin, or the process exiting (the task is aborted then).
async fn write_stdin(d: Arc<Daemon>, pid: u32, mut rx: mpsc::Receiver<Input>, pipe: pipe::Sender) {
    let mut pipe = Some(pipe);
    while let Some(input) = rx.recv().await {
        match input {
            Input::Data(bytes) => {
                if let Some(p) = pipe.as_mut() {
                    if p.write_all(&bytes).await.is_err() {
                        // The process closed its stdin; later input has nowhere to go.
                        pipe = None;
                    }
                }
            }
            Input::Eof => pipe = None,
            Input::Resize(_) => {
                d.warn_limited("exec input", &format!("process {pid} has no terminal"))
            }
        }
    }
}

struct Spawned {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

pub async fn exec(d: Arc<Daemon>, req: Request<Incoming>) -> HandlerResult {
    let mut frames = FrameReader::new(req.into_body());
    let spec: ExecSpec = read_spec(&mut frames).await?;
    let Prepared {
        mut command,
        argv,
        cwd,
    } = prepare(
        &d,
        &spec.command,
        &spec.env,
        Who {
            username: spec.username.as_deref(),
            uid: spec.uid,
            gid: spec.gid,
            cwd: spec.cwd.as_deref(),
        },
    )?;
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the hook runs in the forked child before exec, where only async-signal-safe
    // calls are allowed; setsid is one, and the hook allocates nothing.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let slot = d.processes.reserve()?;
    let reaper = d.reaper.clone();
    let spawned = tokio::task::spawn_blocking(move || {
        reaper.spawn(|| {
            let mut child = command.spawn()?;
            let pid = child.id();
            let (Some(i), Some(o), Some(e)) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                return Err(io::Error::other("child pipes missing"));
            };
            Ok((
                pid,
                Spawned {
                    stdin: i.into(),
                    stdout: o.into(),
                    stderr: e.into(),
                },
            ))
        })
    })
    .await
    .map_err(|e| ProtoError::internal(format!("spawn task failed: {e}")))?;
    let (pid, pipes, waiter) = spawned.map_err(|e| spawn_error(&argv[0], &e))?;
    let (control, input) = Control::new(false);
    d.processes.register(
        slot,
        info(pid, (argv, cwd), &spec.env, spec.tag.clone(), false),
        control.clone(),
    );

    let (tx, body) = ChannelBody::new(OUTPUT_QUEUE);
    // Cannot fail: the channel is new and has room.
    let _ = tx.try_send(Ok(
        Frame::json(FrameKind::Started, &Started { pid }).encode()
    ));
    let out = Fanout { first: tx, control };
    let stdin = pipe::Sender::from_owned_fd(pipes.stdin);
    let stdout = pipe::Receiver::from_owned_fd(pipes.stdout);
    let stderr = pipe::Receiver::from_owned_fd(pipes.stderr);
    let run = Run {
        d: d.clone(),
        pid,
        keep_stdin: spec.keep_stdin,
    };
    match (stdin, stdout, stderr) {
        (Ok(stdin), Ok(stdout), Ok(stderr)) => {
            tokio::spawn(supervise(
                run,
                spec.timeout_ms,
                waiter,
                frames,
                Some((input, stdin)),
                vec![(stdout, FrameKind::Stdout), (stderr, FrameKind::Stderr)],
                out,
            ));
        }
        _ => {
            // The pipes came straight from spawn; failing to register them with the runtime
            // means the runtime is out of resources. The process cannot be served: kill it.
            let _ = d.reaper.signal_group(pid, Signal::SIGKILL);
            tokio::spawn(supervise::<pipe::Receiver>(
                run,
                None,
                waiter,
                frames,
                None,
                Vec::new(),
                out,
            ));
        }
    }
    Ok(Response::new(body.boxed()))
}

/// The process a supervisor serves.
pub struct Run {
    pub d: Arc<Daemon>,
    pub pid: u32,
    /// Stdin stays open when the request body ends.
    pub keep_stdin: bool,
}

/// Serves one process until it exits: feeds stdin, forwards output, enforces the timeout, and
/// sends the exit status last.
async fn supervise<R>(
    run: Run,
    timeout_ms: Option<u64>,
    mut waiter: ExitWaiter,
    frames: FrameReader,
    stdin: Option<(mpsc::Receiver<Input>, pipe::Sender)>,
    outputs: Vec<(R, FrameKind)>,
    out: Fanout,
) where
    R: AsyncRead + Unpin + Send + 'static,
{
    let Run { d, pid, keep_stdin } = run;
    // Set by the input task before it kills the process, so its `Error` record always comes
    // before the exit status.
    let broke: Arc<std::sync::Mutex<Option<ProtoError>>> = Arc::default();
    let writer = stdin.map(|(rx, pipe)| tokio::spawn(write_stdin(d.clone(), pid, rx, pipe)));
    let input = tokio::spawn(feed_stdin(
        Run {
            d: d.clone(),
            pid,
            keep_stdin,
        },
        frames,
        out.control.input(),
        broke.clone(),
    ));
    let (exited_tx, exited_rx) = watch::channel(false);
    let pumps: Vec<_> = outputs
        .into_iter()
        .map(|(r, kind)| tokio::spawn(pump(r, kind, out.clone(), exited_rx.clone())))
        .collect();

    let mut timed_out = false;
    let status = match timeout_ms {
        Some(ms) => {
            tokio::select! {
                s = &mut waiter => s.ok(),
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {
                    timed_out = true;
                    let _ = d.reaper.signal_group(pid, Signal::SIGKILL);
                    waiter.await.ok()
                }
            }
        }
        None => waiter.await.ok(),
    };
    let _ = exited_tx.send(true);
    for p in pumps {
        let _ = p.await;
    }
    input.abort();
    if let Some(w) = writer {
        w.abort();
    }
    let exit = match status {
        Some(mut s) => {
            s.timed_out = timed_out;
            s
        }
        None => ExitStatus {
            exit_code: None,
            signal: None,
            timed_out,
        },
    };
    let attached = d.processes.finish(pid, exit);
    let mut last = Vec::new();
    let broke = broke.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(err) = broke {
        last.push(Frame::json(FrameKind::Error, &err).encode());
    }
    last.push(Frame::json(FrameKind::Exit, &exit).encode());
    out.finish(attached, last).await;
}

/// Applies the request's records after the `Spec`: stdin bytes, end of stdin, signals.
///
/// A request stream that breaks the framing (unknown record, oversized length) cannot be
/// trusted further: the process group is killed and the response carries an `Error` record
/// before the exit status. A body that merely ends closes stdin.
async fn feed_stdin(
    run: Run,
    mut frames: FrameReader,
    stdin: mpsc::Sender<Input>,
    broke: Arc<std::sync::Mutex<Option<ProtoError>>>,
) {
    let Run { d, pid, keep_stdin } = run;
    loop {
        let frame = match frames.next().await {
            Ok(Some(f)) => f,
            Ok(None) => {
                if !keep_stdin {
                    let _ = stdin.send(Input::Eof).await;
                }
                return;
            }
            Err(e @ crate::body::FrameReadError::Frame(_)) => {
                let err = e.to_proto();
                d.warn_limited("exec request stream", &err);
                *broke.lock().unwrap_or_else(|e| e.into_inner()) = Some(err);
                let _ = d.reaper.signal_group(pid, Signal::SIGKILL);
                return;
            }
            // The host's side of the stream failed (reset, connection gone): stdin ends,
            // unless it is kept for other requests.
            Err(_) => {
                if !keep_stdin {
                    let _ = stdin.send(Input::Eof).await;
                }
                return;
            }
        };
        match frame.kind {
            FrameKind::Stdin => {
                let _ = stdin.send(Input::Data(frame.payload)).await;
            }
            FrameKind::StdinEof => {
                let _ = stdin.send(Input::Eof).await;
            }
            FrameKind::Signal => {
                if let Ok(req) = frame.parse::<SignalRequest>() {
                    if let Err(e) = crate::server::signal(&d, pid, req.signal) {
                        d.warn_limited("exec signal", &e);
                    }
                }
            }
            other => {
                d.warn_limited(
                    "exec request stream",
                    &format!("unexpected {other:?} record ignored"),
                );
            }
        }
    }
}

/// Forwards one output pipe as records. Keeps reading (and discarding) after the host went
/// away so the process never blocks on a full pipe.
pub async fn pump<R: AsyncRead + Unpin>(
    mut reader: R,
    kind: FrameKind,
    out: Fanout,
    mut exited: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut host_gone = false;
    loop {
        let read = if *exited.borrow() {
            match tokio::time::timeout(DRAIN_IDLE, reader.read(&mut buf)).await {
                Ok(r) => r,
                Err(_) => return,
            }
        } else {
            tokio::select! {
                r = reader.read(&mut buf) => r,
                changed = exited.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
            }
        };
        match read {
            Ok(0) => return,
            Ok(n) => {
                let frame = Frame::new(kind, Bytes::copy_from_slice(&buf[..n]));
                out.send(frame.encode(), &mut host_gone).await;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // EIO is how a PTY master reports that the terminal closed.
            Err(_) => return,
        }
    }
}
