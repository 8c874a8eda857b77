//! The bytes of an egress stream: response bodies fed from a channel, the request body read
//! ahead, token buckets, the meter of bytes and idle time, and the copy loops between the
//! guest's stream and an upstream.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::SandboxGateway;

/// Chunk size of the copy loops.
pub(super) const CHUNK: usize = 16 * 1024;

/// A response body fed from a channel; an `Err` item resets the stream.
pub(super) struct ChannelBody(pub(super) mpsc::Receiver<io::Result<Bytes>>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

/// The request body of a stream, with bytes read ahead kept for later.
pub(crate) struct BodyReader {
    pub(super) body: Incoming,
    pub(super) buf: BytesMut,
    pub(super) done: bool,
}

impl BodyReader {
    pub(super) fn new(body: Incoming) -> BodyReader {
        BodyReader {
            body,
            buf: BytesMut::new(),
            done: false,
        }
    }

    /// Reads one more data frame into the buffer; false at the end.
    pub(super) async fn fill_more(&mut self) -> io::Result<bool> {
        while !self.done {
            match self.body.frame().await {
                None => self.done = true,
                Some(Err(e)) => {
                    self.done = true;
                    return Err(io::Error::other(e));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if !data.is_empty() {
                            self.buf.extend_from_slice(&data);
                            return Ok(true);
                        }
                    }
                }
            }
        }
        Ok(false)
    }

    /// The next bytes (buffered first); `None` at the end.
    pub(super) async fn next_chunk(&mut self) -> io::Result<Option<Bytes>> {
        if self.buf.is_empty() && !self.fill_more().await? {
            return Ok(None);
        }
        Ok(Some(self.buf.split().freeze()))
    }
}

/// A token bucket: `rate` bytes per second, bursts of one second; a take that overdraws
/// waits off the debt.
pub(crate) struct Bucket {
    rate: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub(crate) fn new(rate: u64) -> Bucket {
        Bucket {
            rate: rate as f64,
            state: Mutex::new((rate as f64, Instant::now())),
        }
    }

    pub(super) async fn take(&self, n: usize) {
        let wait = {
            let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let refill = now.duration_since(s.1).as_secs_f64() * self.rate;
            s.0 = (s.0 + refill).min(self.rate) - n as f64;
            s.1 = now;
            if s.0 < 0.0 {
                Duration::from_secs_f64(-s.0 / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

pub(super) async fn take(bucket: &Option<Bucket>, n: usize) {
    if let Some(b) = bucket {
        b.take(n).await;
    }
}

/// Bytes both ways and the time of the last one.
pub(super) struct Meter {
    pub(super) start: Instant,
    pub(super) up: AtomicU64,
    pub(super) down: AtomicU64,
    pub(super) last_ms: AtomicU64,
}

impl Meter {
    pub(super) fn new() -> Meter {
        Meter {
            start: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last_ms: AtomicU64::new(0),
        }
    }

    pub(super) fn add(&self, counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Completes once nothing moved for `idle`.
    pub(super) async fn idle(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let since = self.start.elapsed().saturating_sub(last);
            if since >= idle {
                return;
            }
            tokio::time::sleep(idle - since).await;
        }
    }
}

/// Copies guest→`io` (at most `up_limit` bytes, then nothing more is read from the guest)
/// and `io`→guest, metered and rate-limited, until `io` ends, the guest resets, or nothing
/// moves for the idle timeout. The guest ending its side half-closes `io`.
pub(super) async fn pump<S>(
    sb: &SandboxGateway,
    body: &mut BodyReader,
    tx: &mpsc::Sender<io::Result<Bytes>>,
    io: S,
    meter: &Meter,
    up_limit: Option<u64>,
) where
    S: AsyncRead + AsyncWrite + Send,
{
    let (mut r, mut w) = tokio::io::split(io);
    let up = async {
        let mut left = up_limit;
        loop {
            if left == Some(0) {
                break;
            }
            let mut chunk = match body.next_chunk().await {
                Ok(Some(c)) => c,
                _ => {
                    let _ = w.shutdown().await;
                    break;
                }
            };
            if let Some(l) = left.as_mut() {
                if chunk.len() as u64 > *l {
                    chunk.truncate(*l as usize);
                }
                *l -= chunk.len() as u64;
            }
            take(&sb.up, chunk.len()).await;
            if w.write_all(&chunk).await.is_err() {
                break;
            }
            meter.add(&meter.up, chunk.len());
        }
        // Only the other direction or the idle timer ends the pump.
        std::future::pending::<()>().await
    };
    let down = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            take(&sb.down, n).await;
            meter.add(&meter.down, n);
            if tx
                .send(Ok(Bytes::copy_from_slice(&buf[..n])))
                .await
                .is_err()
            {
                break;
            }
        }
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
        _ = meter.idle(sb.gateway.config.idle_timeout) => {
            let _ = tx.try_send(Err(io::Error::new(io::ErrorKind::TimedOut, "idle")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bucket_limits_the_rate() {
        let b = Bucket::new(100_000);
        let t0 = Instant::now();
        for _ in 0..30 {
            b.take(10_000).await;
        }
        // 300 KB at 100 KB/s with a 100 KB burst: about two seconds.
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(1800), "{took:?}");
        assert!(took < Duration::from_secs(4), "{took:?}");
    }
}
