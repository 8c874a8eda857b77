//! Reading ahead of the kernel, per open file: while a file is read in order, it is fetched
//! from the host a whole request (1 MiB) at a time, and the next one is asked for while the
//! kernel still reads the current one. A sequential read then costs one round trip a MiB,
//! overlapped with the reading, instead of one per 128 KiB the kernel asks for. A read out of
//! order fetches only what it asks for.
//!
//! What is held is dropped when this mount changes the file (a write, a truncate, a create
//! over it) or any name (a rename or unlink can put another file at the path): each open file
//! has a generation, raised after such a change is answered, and bytes fetched under an older
//! generation are never served. Other sandboxes' writes are seen at the next open, as without
//! read-ahead (close-to-open, `docs/volumes.md`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use fuser::Errno;
use space_proto::volume::{VolumeReply, VolumeRequest, MAX_IO};
use tokio::task::JoinHandle;

use super::fs::Inner;

/// One open file's read-ahead.
pub(super) struct ReadAhead {
    /// The file's inode number in this mount.
    pub(super) ino: u64,
    generation: AtomicU64,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The generation `window` and `next` were fetched under.
    generation: u64,
    /// Bytes of the file from an offset; `eof` when the file ended within them.
    window: Option<Window>,
    /// A fetch under way of the bytes right after `window`.
    next: Option<(u64, JoinHandle<Result<Bytes, Errno>>)>,
    /// Where the last read ended: a read starting there is a read in order.
    last_end: u64,
}

struct Window {
    at: u64,
    data: Bytes,
    eof: bool,
}

impl Window {
    fn end(&self) -> u64 {
        self.at + self.data.len() as u64
    }

    /// `size` bytes at `offset`, if the window holds them (or holds up to the file's end).
    fn serve(&self, offset: u64, size: u32) -> Option<Bytes> {
        if offset < self.at || offset > self.end() {
            return None;
        }
        let start = (offset - self.at) as usize;
        let want = start + size as usize;
        if want <= self.data.len() || self.eof {
            return Some(self.data.slice(start..want.min(self.data.len())));
        }
        None
    }
}

/// `size` bytes of the file at `path` from `offset`, as the host answers them.
async fn fetch(inner: &Inner, ino: u64, offset: u64, size: u32) -> Result<Bytes, Errno> {
    let path = inner.path(fuser::INodeNo(ino))?;
    let q = VolumeRequest::Read { path, offset, size };
    match inner.call(&q, &[]).await? {
        (VolumeReply::Data(n), bytes) if n as usize == bytes.len() => Ok(bytes),
        _ => Err(Errno::EIO),
    }
}

impl ReadAhead {
    pub(super) fn new(ino: u64) -> ReadAhead {
        ReadAhead {
            ino,
            generation: AtomicU64::new(0),
            state: tokio::sync::Mutex::new(State::default()),
        }
    }

    /// The file changed: nothing fetched before now is served.
    pub(super) fn changed(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// `size` bytes at `offset` (fewer at the end of the file).
    pub(super) async fn read(
        &self,
        inner: &Arc<Inner>,
        offset: u64,
        size: u32,
    ) -> Result<Bytes, Errno> {
        let size = size.min(MAX_IO);
        let mut st = self.state.lock().await;
        let generation = self.generation.load(Ordering::SeqCst);
        if st.generation != generation {
            st.window = None;
            if let Some((_, h)) = st.next.take() {
                h.abort();
            }
            st.generation = generation;
        }
        let in_order = offset == st.last_end || offset == 0;
        st.last_end = offset + size as u64;
        loop {
            if let Some(w) = &st.window {
                if let Some(out) = w.serve(offset, size) {
                    // Less than half a request left after this read: ask for the next one.
                    let left = w.end().saturating_sub(offset + size as u64);
                    if !w.eof && st.next.is_none() && left < (MAX_IO / 2) as u64 {
                        let (at, i, ino) = (w.end(), inner.clone(), self.ino);
                        let h = tokio::spawn(async move { fetch(&i, ino, at, MAX_IO).await });
                        st.next = Some((at, h));
                    }
                    return Ok(out);
                }
            }
            // The fetch under way continues the window: wait for it and join them.
            let joins = match (&st.window, &st.next) {
                (Some(w), Some((at, _))) => {
                    *at == w.end() && offset >= w.at && offset < at + MAX_IO as u64
                }
                _ => false,
            };
            if joins {
                let (_, h) = st.next.take().expect("checked above");
                let more = h.await.map_err(|_| Errno::EIO)??;
                let w = st.window.take().expect("checked above");
                let from = (offset - w.at) as usize;
                let mut data = BytesMut::with_capacity(w.data.len() - from + more.len());
                data.extend_from_slice(&w.data[from..]);
                data.extend_from_slice(&more);
                st.window = Some(Window {
                    at: offset,
                    data: data.freeze(),
                    eof: more.len() < MAX_IO as usize,
                });
                continue;
            }
            if let Some((_, h)) = st.next.take() {
                h.abort();
            }
            if !in_order {
                // Out of order: only what was asked.
                return fetch(inner, self.ino, offset, size).await;
            }
            let data = fetch(inner, self.ino, offset, MAX_IO).await?;
            st.window = Some(Window {
                at: offset,
                eof: data.len() < MAX_IO as usize,
                data,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_serves_what_it_holds_and_the_end_of_the_file() {
        let w = Window {
            at: 100,
            data: Bytes::from(vec![7u8; 50]),
            eof: false,
        };
        assert_eq!(w.serve(100, 10).map(|b| b.len()), Some(10));
        assert_eq!(w.serve(140, 10).map(|b| b.len()), Some(10));
        assert!(w.serve(145, 10).is_none(), "past the window, not the end");
        assert!(w.serve(99, 1).is_none());
        let end = Window { eof: true, ..w };
        assert_eq!(end.serve(145, 10).map(|b| b.len()), Some(5));
        assert_eq!(end.serve(150, 10).map(|b| b.len()), Some(0));
    }
}
