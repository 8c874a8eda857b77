//! `POST /v1/pty`: a process on a pseudo-terminal.
//!
//! Same framing as exec: `Spec` then `Stdin`/`Resize`/`Signal` records in; `Started`, `Stdout`
//! records (the terminal's output) and `Exit` out. The child leads a new session with the
//! terminal as its controlling tty, so job control, `stty` and SIGWINCH on resize behave as
//! in a real terminal.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use http::{Request, Response};
use hyper::body::Incoming;
use nix::fcntl::{fcntl, FcntlArg, FdFlag, OFlag};
use nix::pty::{openpty, Winsize};
use nix::sys::signal::Signal;
use space_proto::{
    Command, ErrorKind, Frame, FrameKind, ProtoError, PtySpec, Resize, SignalRequest, Started,
};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{mpsc, watch};

use crate::body::{ChannelBody, FrameReader, HandlerResult};
use crate::daemon::Daemon;
use crate::exec::{info, prepare, pump, read_spec, spawn_error, Fanout, Prepared, Who};
use crate::processes::{Control, Input};
use crate::sys::{raw_read, raw_write};

/// The terminal side the daemon holds, shared by the output reader and the input writer.
pub struct Master {
    fd: AsyncFd<OwnedFd>,
}

fn set_cloexec_nonblock(fd: &OwnedFd, nonblock: bool) -> io::Result<()> {
    fcntl(fd.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
    if nonblock {
        let flags = OFlag::from_bits_truncate(fcntl(fd.as_raw_fd(), FcntlArg::F_GETFL)?);
        fcntl(fd.as_raw_fd(), FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    }
    Ok(())
}

impl Master {
    fn new(fd: OwnedFd) -> io::Result<Master> {
        Ok(Master {
            fd: crate::sys::register(fd)?,
        })
    }

    async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|fd| raw_write(fd.as_raw_fd(), data)) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => {}
            }
        }
        Ok(())
    }

    fn resize(&self, rows: u16, cols: u16) -> io::Result<()> {
        let ws = Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one `struct winsize` from the pointer, which points to a
        // live, properly laid out `Winsize` (nix's alias of libc's struct).
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}

/// Reads the master as an `AsyncRead`; EIO (every slave closed) reads as end-of-file.
struct MasterReader(Arc<Master>);

impl AsyncRead for MasterReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| raw_read(fd.as_raw_fd(), unfilled)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

fn check_size(rows: u16, cols: u16) -> Result<(), ProtoError> {
    if rows == 0 || cols == 0 {
        return Err(ProtoError::invalid(format!(
            "terminal size {rows}x{cols} is empty"
        )));
    }
    Ok(())
}

pub async fn pty(d: Arc<Daemon>, req: Request<Incoming>) -> HandlerResult {
    let mut frames = FrameReader::new(req.into_body());
    let spec: PtySpec = read_spec(&mut frames).await?;
    check_size(spec.rows, spec.cols)?;
    let mut env = spec.env.clone();
    env.entry("TERM".into())
        .or_insert_with(|| spec.term.clone().unwrap_or_else(|| "xterm-256color".into()));
    let command = spec
        .command
        .clone()
        .unwrap_or_else(|| Command::Argv(vec!["/bin/sh".into()]));
    let Prepared {
        mut command,
        argv,
        cwd,
    } = prepare(
        &d,
        &command,
        &env,
        Who {
            username: spec.username.as_deref(),
            uid: spec.uid,
            gid: spec.gid,
            cwd: spec.cwd.as_deref(),
        },
    )?;
    // SAFETY: the hook runs in the forked child before exec and makes only async-signal-safe
    // calls (setsid, ioctl) without allocating. Its stdin is the terminal's slave side, so
    // TIOCSCTTY on fd 0 makes that terminal the new session's controlling tty.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let slot = d.processes.reserve()?;
    let winsize = Winsize {
        ws_row: spec.rows,
        ws_col: spec.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let reaper = d.reaper.clone();
    let spawned = tokio::task::spawn_blocking(move || {
        // The terminal is opened under the spawn lock so no concurrent spawn can inherit its
        // descriptors before they are marked close-on-exec.
        reaper.spawn(|| {
            let pty = openpty(&winsize, None).map_err(io::Error::from)?;
            set_cloexec_nonblock(&pty.master, true)?;
            set_cloexec_nonblock(&pty.slave, false)?;
            command
                .stdin(Stdio::from(pty.slave.try_clone()?))
                .stdout(Stdio::from(pty.slave.try_clone()?))
                .stderr(Stdio::from(pty.slave));
            let child = command.spawn()?;
            // `command` (and with it the last slave descriptor in this process) is dropped
            // when this closure returns, so the master sees EIO once the session ends.
            Ok((child.id(), pty.master))
        })
    })
    .await
    .map_err(|e| ProtoError::internal(format!("spawn task failed: {e}")))?;
    let (pid, master, waiter) = spawned.map_err(|e| spawn_error(&argv[0], &e))?;
    let (control, input) = Control::new(true);
    d.processes.register(
        slot,
        info(pid, (argv, cwd), &spec.env, spec.tag.clone(), true),
        control.clone(),
    );

    let (tx, body) = ChannelBody::new(8);
    let _ = tx.try_send(Ok(
        Frame::json(FrameKind::Started, &Started { pid }).encode()
    ));
    let master = match Master::new(master) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            let _ = d.reaper.signal_group(pid, Signal::SIGKILL);
            return Err(ProtoError::internal(format!("terminal setup failed: {e}")));
        }
    };
    let out = Fanout { first: tx, control };
    tokio::spawn(supervise(d, pid, waiter, frames, (master, input), out));
    Ok(Response::new(body.boxed()))
}

async fn supervise(
    d: Arc<Daemon>,
    pid: u32,
    waiter: crate::reaper::ExitWaiter,
    frames: FrameReader,
    (master, input): (Arc<Master>, mpsc::Receiver<Input>),
    out: Fanout,
) {
    let writer = tokio::spawn(write_input(d.clone(), input, master.clone()));
    let feeder = tokio::spawn(feed_input(d.clone(), pid, frames, out.control.input()));
    let (exited_tx, exited_rx) = watch::channel(false);
    let output = tokio::spawn(pump(
        MasterReader(master),
        FrameKind::Stdout,
        out.clone(),
        exited_rx,
    ));
    let status = waiter.await.ok();
    let _ = exited_tx.send(true);
    let _ = output.await;
    feeder.abort();
    writer.abort();
    let exit = status.unwrap_or(space_proto::ExitStatus {
        exit_code: None,
        signal: None,
        timed_out: false,
    });
    let attached = d.processes.finish(pid, exit);
    out.finish(attached, vec![Frame::json(FrameKind::Exit, &exit).encode()])
        .await;
}

/// Applies the terminal's input, from any request, until the session ends.
async fn write_input(d: Arc<Daemon>, mut input: mpsc::Receiver<Input>, master: Arc<Master>) {
    while let Some(i) = input.recv().await {
        let result = match i {
            Input::Data(bytes) => master
                .write_all(&bytes)
                .await
                .map_err(|e| ProtoError::io("terminal input", &e)),
            Input::Resize(r) => check_size(r.rows, r.cols).and_then(|_| {
                master
                    .resize(r.rows, r.cols)
                    .map_err(|e| ProtoError::io("terminal resize", &e))
            }),
            // A terminal has no separate end of input; the host sends ^D for that.
            Input::Eof => Ok(()),
        };
        if let Err(e) = result {
            d.warn_limited("pty input", &e);
        }
    }
}

/// Passes the records of the starting request on: input and resizes to the terminal,
/// signals to the session.
async fn feed_input(d: Arc<Daemon>, pid: u32, mut frames: FrameReader, input: mpsc::Sender<Input>) {
    loop {
        let frame = match frames.next().await {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                d.warn_limited("pty request stream", &e.to_proto());
                return;
            }
        };
        let result = match frame.kind {
            FrameKind::Stdin => {
                let _ = input.send(Input::Data(frame.payload)).await;
                Ok(())
            }
            FrameKind::Resize => match frame.parse::<Resize>() {
                Ok(r) => {
                    let _ = input.send(Input::Resize(r)).await;
                    Ok(())
                }
                Err(e) => Err(ProtoError::invalid(e.to_string())),
            },
            FrameKind::Signal => match frame.parse::<SignalRequest>() {
                Ok(s) => crate::server::signal(&d, pid, s.signal),
                Err(e) => Err(ProtoError::invalid(e.to_string())),
            },
            // A terminal has no separate end of input; the host sends ^D for that.
            FrameKind::StdinEof => Ok(()),
            other => Err(ProtoError::new(
                ErrorKind::Protocol,
                format!("unexpected {other:?} record"),
            )),
        };
        if let Err(e) = result {
            d.warn_limited("pty input", &e);
        }
    }
}
