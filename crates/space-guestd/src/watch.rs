//! `GET /v1/watch`: inotify events under a directory, streamed as `Event` records.
//!
//! The watch is in place before the response headers go out, so a host that waits for them
//! sees every later change. With `recursive=true` subdirectories get watches too, including
//! ones created (or moved in) while the stream runs, up to `MAX_WATCH_DIRS`. The inotify
//! descriptor lives exactly as long as the stream: when the host drops it, the task notices
//! the closed channel and drops the descriptor.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use space_proto::limits::MAX_WATCH_DIRS;

/// Most `Created` events made up for the contents of one new directory tree.
const MAX_SYNTHETIC: usize = 10_000;
use space_proto::query::{parse_query, validate_path};
use space_proto::{ErrorKind, Frame, FrameKind, ProtoError, WatchEvent, WatchEventKind};
use tokio::io::unix::AsyncFd;

use crate::body::{ChannelBody, HandlerResult};
use crate::daemon::{Daemon, WatchSlot};

/// Errors of setting up a watch.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("inotify: {0}")]
    Inotify(Errno),
    #[error("more than {MAX_WATCH_DIRS} directories to watch")]
    TooManyDirs,
}

/// Lets tokio poll the inotify descriptor.
struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

pub struct Watcher {
    fd: AsyncFd<Fd>,
    dirs: HashMap<WatchDescriptor, PathBuf>,
    root: PathBuf,
    recursive: bool,
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_ONLYDIR
        | AddWatchFlags::IN_DONT_FOLLOW
}

impl Watcher {
    /// Watches `dir` and, when recursive, every directory below it. With `found`, every entry
    /// below `dir` that exists once its directory is watched is listed there (at most
    /// [`MAX_SYNTHETIC`]): entries made in a new directory before its watch was added raise no
    /// event of their own.
    fn add_tree(
        &mut self,
        dir: &Path,
        mut found: Option<&mut Vec<(PathBuf, bool)>>,
    ) -> Result<(), WatchError> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            if self.dirs.len() >= MAX_WATCH_DIRS {
                return Err(WatchError::TooManyDirs);
            }
            match self.fd.get_ref().0.add_watch(&d, mask()) {
                Ok(wd) => {
                    self.dirs.insert(wd, d.clone());
                }
                // A subdirectory that vanished (or is not a directory) is skipped; the root
                // was checked by the caller.
                Err(_) if d != dir => continue,
                Err(e) => return Err(WatchError::Inotify(e)),
            }
            if self.recursive {
                if let Ok(rd) = std::fs::read_dir(&d) {
                    for entry in rd.flatten() {
                        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                        if let Some(f) = found.as_deref_mut() {
                            if f.len() < MAX_SYNTHETIC {
                                f.push((entry.path(), is_dir));
                            }
                        }
                        if is_dir {
                            stack.push(entry.path());
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn root_str(&self) -> String {
        self.root.to_string_lossy().into_owned()
    }

    /// Converts one inotify event, updating the watch set as directories come and go. A new
    /// directory brings `Created` events for what is already in it (a duplicate is possible
    /// for an entry made while the directory was being listed; a miss is not).
    fn translate(&mut self, ev: InotifyEvent) -> Vec<WatchEvent> {
        let mut found = Vec::new();
        let Some(first) = self.translate_one(ev, &mut found) else {
            return Vec::new();
        };
        let mut out = vec![first];
        out.extend(found.into_iter().map(|(p, is_dir)| WatchEvent {
            path: p.to_string_lossy().into_owned(),
            kind: WatchEventKind::Created,
            is_dir,
        }));
        out
    }

    fn translate_one(
        &mut self,
        ev: InotifyEvent,
        found: &mut Vec<(PathBuf, bool)>,
    ) -> Option<WatchEvent> {
        let m = ev.mask;
        if m.contains(AddWatchFlags::IN_Q_OVERFLOW) {
            return Some(WatchEvent {
                path: String::new(),
                kind: WatchEventKind::Overflow,
                is_dir: false,
            });
        }
        if m.contains(AddWatchFlags::IN_IGNORED) {
            self.dirs.remove(&ev.wd);
            return None;
        }
        let dir = self.dirs.get(&ev.wd)?.clone();
        let path = match &ev.name {
            Some(name) => dir.join(OsStr::new(name)),
            None => dir.clone(),
        };
        let is_dir = m.contains(AddWatchFlags::IN_ISDIR);
        let kind = if m.contains(AddWatchFlags::IN_CREATE) {
            WatchEventKind::Created
        } else if m.contains(AddWatchFlags::IN_MOVED_TO) {
            WatchEventKind::MovedTo
        } else if m.contains(AddWatchFlags::IN_MOVED_FROM) {
            WatchEventKind::MovedFrom
        } else if m.contains(AddWatchFlags::IN_DELETE) {
            WatchEventKind::Removed
        } else if m.contains(AddWatchFlags::IN_DELETE_SELF) {
            // Subdirectories report their removal through their parent; only the root's
            // own removal is news.
            if dir != self.root {
                return None;
            }
            WatchEventKind::Removed
        } else if m.contains(AddWatchFlags::IN_CLOSE_WRITE) {
            WatchEventKind::ClosedWrite
        } else if m.contains(AddWatchFlags::IN_MODIFY) {
            WatchEventKind::Modified
        } else if m.contains(AddWatchFlags::IN_ATTRIB) {
            WatchEventKind::Attrib
        } else {
            return None;
        };
        if self.recursive
            && is_dir
            && matches!(kind, WatchEventKind::Created | WatchEventKind::MovedTo)
        {
            // Directories that appear are watched too; past the limit they are silently
            // left out rather than ending the stream.
            let _ = self.add_tree(&path, Some(found));
        }
        Some(WatchEvent {
            path: path.to_string_lossy().into_owned(),
            kind,
            is_dir,
        })
    }
}

pub async fn watch(d: Arc<Daemon>, req: Request<Incoming>) -> HandlerResult {
    let mut pairs = parse_query(req.uri().query())?;
    let mut take = |key: &str| {
        pairs
            .iter()
            .position(|(k, _)| k == key)
            .map(|i| pairs.remove(i).1)
    };
    let path = take("path").ok_or_else(|| ProtoError::invalid("missing query parameter path"))?;
    let recursive = matches!(take("recursive").as_deref(), Some("true") | Some("1"));
    let (watcher, slot) = open(&d, &path, recursive)?;
    let (tx, body) = ChannelBody::new(16);
    tokio::spawn(async move {
        let _slot = slot;
        let gone = tx.clone();
        run(
            watcher,
            |event| {
                let tx = tx.clone();
                async move {
                    tx.send(Ok(Frame::json(FrameKind::Event, &event).encode()))
                        .await
                        .is_ok()
                }
            },
            async move { gone.closed().await },
        )
        .await
    });
    Ok(Response::new(body.boxed()))
}

/// A watch of `path` in place, and the slot it takes among the daemon's watches.
pub fn open(
    d: &Arc<Daemon>,
    path: &str,
    recursive: bool,
) -> Result<(Watcher, WatchSlot), ProtoError> {
    validate_path(path)?;
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(ProtoError::new(
                ErrorKind::NotADirectory,
                format!("{path} is not a directory"),
            ))
        }
        Err(e) => return Err(ProtoError::io(format!("watch {path}"), &e)),
    }
    let slot = d.try_add_watch().ok_or_else(|| {
        ProtoError::new(
            ErrorKind::Busy,
            format!(
                "{} watches are already open",
                space_proto::limits::MAX_WATCH_STREAMS
            ),
        )
    })?;
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(|e| ProtoError::new(ErrorKind::from_errno(e as i32), format!("inotify: {e}")))?;
    // SAFETY: `Fd` owns the inotify descriptor, which stays open until the `AsyncFd` (and so
    // the `Fd`) is dropped, and `as_raw_fd` always returns that same descriptor.
    let fd = unsafe { AsyncFd::register(Fd(inotify)) }
        .map_err(|e| ProtoError::io("inotify registration", &io::Error::from(e)))?;
    let root = PathBuf::from(&path);
    let mut watcher = Watcher {
        fd,
        dirs: HashMap::new(),
        root: root.clone(),
        recursive,
    };
    watcher.add_tree(&root, None).map_err(|e| match e {
        WatchError::TooManyDirs => ProtoError::new(ErrorKind::TooLarge, format!("{path}: {e}")),
        WatchError::Inotify(errno) => ProtoError::new(
            ErrorKind::from_errno(errno as i32),
            format!("watch {path}: {e}"),
        ),
    })?;
    Ok((watcher, slot))
}

/// Hands every event of `w` to `sink` until the sink says no more (`false`), `stop`
/// completes, the watched directory goes, or nothing is watched any more.
pub async fn run<F, Fut>(mut w: Watcher, mut sink: F, stop: impl std::future::Future<Output = ()>)
where
    F: FnMut(WatchEvent) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    tokio::pin!(stop);
    loop {
        let events = tokio::select! {
            _ = &mut stop => return,
            ready = w.fd.readable() => {
                let Ok(mut guard) = ready else { return };
                match guard.try_io(|fd| fd.get_ref().0.read_events().map_err(io::Error::from)) {
                    Ok(Ok(events)) => events,
                    Ok(Err(_)) => return,
                    Err(_would_block) => continue,
                }
            }
        };
        let translated: Vec<WatchEvent> =
            events.into_iter().flat_map(|ev| w.translate(ev)).collect();
        for event in translated {
            let root_gone = event.kind == WatchEventKind::Removed && event.path == w.root_str();
            if !sink(event).await {
                return;
            }
            if root_gone {
                return;
            }
        }
        if w.dirs.is_empty() {
            // Everything watched is gone: end the stream.
            return;
        }
    }
}
