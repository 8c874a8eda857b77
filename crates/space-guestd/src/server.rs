//! The router: maps each route to its handler and turns handler errors into JSON error
//! responses. Also the handlers small enough not to need a module: health, processes, signal,
//! shutdown.

use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response};
use hyper::body::Incoming;
use nix::sys::signal::Signal;
use space_proto::{
    routes, ErrorKind, Health, ProcessList, ProtoError, SignalRequest, PROTO_VERSION,
};

use crate::body::{error_response, ok_json, read_json, HandlerResult, RespBody};
use crate::daemon::Daemon;
use crate::reaper::ReaperError;

/// Handles one request. Never fails: errors become error responses.
pub async fn handle(daemon: Arc<Daemon>, req: Request<Incoming>) -> Response<RespBody> {
    match route(daemon, req).await {
        Ok(resp) => resp,
        Err(e) => error_response(&e),
    }
}

async fn route(d: Arc<Daemon>, req: Request<Incoming>) -> HandlerResult {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, routes::HEALTH) => health(&d),
        (&Method::POST, routes::EXEC) => crate::exec::exec(d, req).await,
        (&Method::GET, routes::PROCESSES) => ok_json(&ProcessList {
            processes: d.processes.list(),
        }),
        (&Method::POST, routes::PTY) => crate::pty::pty(d, req).await,
        (&Method::GET, routes::FILES) => crate::files::read(req).await,
        (&Method::PUT, routes::FILES) => crate::files::write(req).await,
        (&Method::GET, routes::STAT) => crate::files::stat(req).await,
        (&Method::GET, routes::LIST) => crate::files::list(req).await,
        (&Method::POST, routes::MKDIR) => crate::files::mkdir(req).await,
        (&Method::POST, routes::REMOVE) => crate::files::remove(req).await,
        (&Method::POST, routes::RENAME) => crate::files::rename(req).await,
        (&Method::POST, routes::CHMOD) => crate::files::chmod(req).await,
        (&Method::GET, routes::WATCH) => crate::watch::watch(d, req).await,
        (&Method::POST, routes::FS_GROW) => crate::grow::grow(&d, req).await,
        (&Method::POST, routes::IDENTITY) => crate::identity::identity(d, req).await,
        (&Method::POST, routes::SHUTDOWN) => shutdown(d),
        (&Method::POST, routes::SYNC) => {
            tokio::task::spawn_blocking(|| {
                // SAFETY: sync(2) takes no arguments and touches no memory of ours.
                unsafe { libc::sync() }
            })
            .await
            .map_err(|e| ProtoError::internal(format!("sync failed: {e}")))?;
            ok_json(&serde_json::json!({}))
        }
        (&Method::GET, routes::STATS) => crate::stats::stats().await,
        (&Method::POST, routes::VOLUMES_MOUNT) => {
            let req = read_json(req.into_body()).await?;
            let egress = d.egress.get().cloned().ok_or_else(|| {
                ProtoError::new(ErrorKind::Busy, "the uplink volumes use is not up yet")
            })?;
            ok_json(&d.volumes.mount(egress, req).await?)
        }
        (&Method::POST, routes::VOLUMES_QUIESCE) => {
            let req = read_json(req.into_body()).await?;
            ok_json(&d.volumes.quiesce(req).await)
        }
        (&Method::POST, routes::TCP) => crate::tcp::tcp(d, req).await,
        (&Method::POST, routes::WATCHERS) => crate::watchers::create(d, req).await,
        (&Method::GET, p) if p.starts_with(routes::WATCHERS_PREFIX) => {
            crate::watchers::take(&d, &p[routes::WATCHERS_PREFIX.len()..])
        }
        (&Method::DELETE, p) if p.starts_with(routes::WATCHERS_PREFIX) => {
            crate::watchers::remove(&d, &p[routes::WATCHERS_PREFIX.len()..])
        }
        (&Method::GET, routes::USER) => {
            let pairs = space_proto::query::parse_query(req.uri().query())?;
            match pairs.as_slice() {
                [(k, name)] if k == "name" => ok_json(&crate::users::lookup(name)?),
                _ => Err(ProtoError::invalid("expected the one query parameter name")),
            }
        }
        (m, p) if routes::parse_process_path(p).is_some() => {
            use crate::processes;
            use routes::ProcessAction as A;
            let (pid, action) = routes::parse_process_path(p).unwrap_or((0, A::Signal));
            match (m, action) {
                (&Method::POST, A::Signal) => {
                    let body: SignalRequest = read_json(req.into_body()).await?;
                    signal(&d, pid, body.signal)?;
                    ok_json(&serde_json::json!({}))
                }
                (&Method::GET, A::Attach) => processes::attach(d, pid).await,
                (&Method::POST, A::Stdin) => processes::stdin(d, pid, req).await,
                (&Method::POST, A::Resize) => processes::resize(d, pid, req).await,
                _ => Err(ProtoError::new(
                    ErrorKind::NotFound,
                    format!("no route for {method} {path}"),
                )),
            }
        }
        _ => Err(ProtoError::new(
            ErrorKind::NotFound,
            format!("no route for {method} {path}"),
        )),
    }
}

fn health(d: &Daemon) -> HandlerResult {
    ok_json(&Health {
        daemon_version: env!("CARGO_PKG_VERSION").to_string(),
        proto_version: PROTO_VERSION,
        ready: true,
        uptime_ms: d.started.elapsed().as_millis() as u64,
        sandbox_id: d.identity().sandbox_id.clone(),
    })
}

/// Parses a signal number from the host.
pub fn parse_signal(signal: i32) -> Result<Signal, ProtoError> {
    Signal::try_from(signal)
        .map_err(|_| ProtoError::invalid(format!("{signal} is not a signal number")))
}

/// Signals the process group of a process this daemon started.
pub fn signal(d: &Daemon, pid: u32, signal: i32) -> Result<(), ProtoError> {
    let sig = parse_signal(signal)?;
    if !d.processes.is_running(pid) {
        return Err(ProtoError::new(
            ErrorKind::NotFound,
            format!("no running process {pid} started by the daemon"),
        ));
    }
    d.reaper.signal_group(pid, sig).map_err(|e| match e {
        ReaperError::NoSuchProcess => ProtoError::new(
            ErrorKind::NotFound,
            format!("process {pid} has already exited"),
        ),
        ReaperError::Kill(errno) => ProtoError::new(
            ErrorKind::from_errno(errno as i32),
            format!("signal {signal} to process {pid}: {errno}"),
        ),
        ReaperError::Signal(e) => ProtoError::internal(e.to_string()),
    })
}

fn shutdown(d: Arc<Daemon>) -> HandlerResult {
    tracing::info!("shutdown requested by the host");
    tokio::spawn(async move {
        // Give the answer time to reach the host before the connection goes away.
        tokio::time::sleep(Duration::from_millis(50)).await;
        if d.pid1 {
            crate::init::power_off();
        } else {
            let _ = d.shutdown.send(true);
        }
    });
    ok_json(&serde_json::json!({}))
}
