//! Buffered watches (`/v1/watchers`): a watch whose events wait in the daemon until the host
//! takes them, for hosts that poll rather than hold a stream. Any host connection can take
//! them, so a control plane of several replicas can serve one client's polls.
//!
//! Each takes one of the daemon's watch slots. A buffer holds at most [`MAX_BUFFERED`]
//! events; past that one `overflow` event stands for what was dropped. A watch nobody took
//! events from for [`IDLE`] ends by itself.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use http::Request;
use hyper::body::Incoming;
use space_proto::{
    ErrorKind, ProtoError, WatchEvent, WatchEventKind, WatcherCreated, WatcherEvents,
    WatcherRequest,
};

use crate::body::{ok_json, read_json, HandlerResult};
use crate::daemon::Daemon;

/// Events one watch keeps before dropping.
pub const MAX_BUFFERED: usize = 10_000;
/// How long a watch lives without a poll.
pub const IDLE: Duration = Duration::from_secs(600);

struct Buffered {
    events: Arc<Mutex<VecDeque<WatchEvent>>>,
    polled: Mutex<Instant>,
    task: tokio::task::AbortHandle,
}

/// The daemon's buffered watches.
#[derive(Default)]
pub struct Watchers {
    all: Mutex<HashMap<String, Arc<Buffered>>>,
    next: AtomicU64,
}

impl Watchers {
    fn all(&self) -> MutexGuard<'_, HashMap<String, Arc<Buffered>>> {
        self.all.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the watches nobody polled for [`IDLE`].
    fn sweep(&self) {
        self.all().retain(|_, w| {
            let idle = w.polled.lock().unwrap_or_else(|p| p.into_inner()).elapsed() > IDLE;
            if idle {
                w.task.abort();
            }
            !idle
        });
    }
}

fn unknown(id: &str) -> ProtoError {
    ProtoError::new(ErrorKind::NotFound, format!("no watcher {id:?}"))
}

/// `POST /v1/watchers`
pub async fn create(d: Arc<Daemon>, req: Request<Incoming>) -> HandlerResult {
    d.watchers.sweep();
    let r: WatcherRequest = read_json(req.into_body()).await?;
    let (watcher, slot) = crate::watch::open(&d, &r.path, r.recursive)?;
    let events: Arc<Mutex<VecDeque<WatchEvent>>> = Arc::default();
    let sink = events.clone();
    let task = tokio::spawn(async move {
        let _slot = slot;
        crate::watch::run(
            watcher,
            |event| {
                let mut q = sink.lock().unwrap_or_else(|p| p.into_inner());
                if q.len() < MAX_BUFFERED {
                    q.push_back(event);
                } else if q.back().is_none_or(|e| e.kind != WatchEventKind::Overflow) {
                    q.push_back(WatchEvent {
                        path: event.path,
                        kind: WatchEventKind::Overflow,
                        is_dir: false,
                    });
                }
                std::future::ready(true)
            },
            std::future::pending(),
        )
        .await
    });
    let id = format!("w{}", d.watchers.next.fetch_add(1, Ordering::Relaxed) + 1);
    let w = Arc::new(Buffered {
        events,
        polled: Mutex::new(Instant::now()),
        task: task.abort_handle(),
    });
    d.watchers.all().insert(id.clone(), w);
    ok_json(&WatcherCreated { id })
}

/// `GET /v1/watchers/{id}`: the events buffered since the last call.
pub fn take(d: &Daemon, id: &str) -> HandlerResult {
    let w = d
        .watchers
        .all()
        .get(id)
        .cloned()
        .ok_or_else(|| unknown(id))?;
    *w.polled.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    let events: Vec<WatchEvent> = w
        .events
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
        .collect();
    ok_json(&WatcherEvents { events })
}

/// `DELETE /v1/watchers/{id}`
pub fn remove(d: &Daemon, id: &str) -> HandlerResult {
    let w = d.watchers.all().remove(id).ok_or_else(|| unknown(id))?;
    w.task.abort();
    ok_json(&serde_json::json!({}))
}
