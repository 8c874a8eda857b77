//! The HTTP/2 server on a VM's `space.egress` stream: the sync line, then `POST
//! /v1/egress/connect` and `POST /v1/egress/forward`, answered by `handlers` (`docs/egress.md`).

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::handlers;
use super::{GatewayError, SandboxGateway};

/// Bytes of the stream's last reads kept to find a sync line the HTTP/2 server swallowed.
const TAIL: usize = 1024;

/// Serves one `space.egress` stream for `sandbox`: waits for the guest's sync line (discarding
/// what comes before it, at most 1 MiB), echoes it, then serves HTTP/2 until the stream ends.
pub async fn serve<S>(stream: S, sandbox: Arc<SandboxGateway>) -> Result<(), GatewayError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    serve_seeded(stream, sandbox, Vec::new()).await.map(|_| ())
}

/// [`serve`], with `seed` taken as bytes read before the stream's own; answers the last bytes
/// the HTTP/2 server read (a sync line of a guest that restarted its side may be among them).
pub(crate) async fn serve_seeded<S>(
    mut stream: S,
    sandbox: Arc<SandboxGateway>,
    seed: Vec<u8>,
) -> Result<Vec<u8>, GatewayError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (line, rest) = sync(&mut stream, seed).await?;
    stream
        .write_all(&line)
        .await
        .map_err(|e| GatewayError::Stream(format!("echoing the sync line: {e}")))?;
    let tail = Arc::new(Mutex::new(Vec::new()));
    sandbox.sent.fetch_add(rest.len() as u64, Ordering::Relaxed);
    let io = Tap {
        inner: stream,
        prefix: Bytes::from(rest),
        tail: tail.clone(),
        sandbox: sandbox.clone(),
    };
    let sb = sandbox.clone();
    let service = hyper::service::service_fn(move |req| {
        let sb = sb.clone();
        async move { Ok::<_, Infallible>(handlers::handle(sb, req).await) }
    });
    // Frames of up to 256 KiB and windows that hold a volume write whole: every frame the
    // guest writes into its port is a trip through the VMM.
    let served = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .max_concurrent_streams(1024)
        .max_frame_size(256 * 1024)
        .initial_stream_window_size(4 * 1024 * 1024)
        .initial_connection_window_size(16 * 1024 * 1024)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(id = %sandbox.id, error = %e, "egress HTTP/2 connection ended");
    }
    let tail = std::mem::take(&mut *tail.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(tail)
}

/// Reads until the sync line; answers it and the bytes after it.
async fn sync<S: AsyncRead + Unpin>(
    stream: &mut S,
    seed: Vec<u8>,
) -> Result<(Vec<u8>, Vec<u8>), GatewayError> {
    let mut scanner = space_proto::sync::SyncScanner::any_token();
    let mut chunk = vec![0u8; 8192];
    let mut fed = seed;
    loop {
        let found = scanner
            .push(&fed)
            .map_err(|e| GatewayError::Stream(format!("no sync line: {e}")))?;
        if let Some((line, rest)) = found {
            return Ok((line, rest.to_vec()));
        }
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| GatewayError::Stream(format!("reading the sync line: {e}")))?;
        if n == 0 {
            return Err(GatewayError::Stream(
                "the stream ended before the sync line".into(),
            ));
        }
        fed = chunk[..n].to_vec();
    }
}

/// The stream under the HTTP/2 server: replays `prefix` first, keeps the last bytes read.
struct Tap<S> {
    inner: S,
    prefix: Bytes,
    tail: Arc<Mutex<Vec<u8>>>,
    /// Counts the bytes both ways.
    sandbox: Arc<SandboxGateway>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tap<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let new = &buf.filled()[before..];
            self.sandbox
                .sent
                .fetch_add(new.len() as u64, Ordering::Relaxed);
            let mut tail = self.tail.lock().unwrap_or_else(|e| e.into_inner());
            tail.extend_from_slice(new);
            let excess = tail.len().saturating_sub(TAIL);
            tail.drain(..excess);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tap<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.sandbox.received.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn sync_line_found_after_garbage() {
        let line = b"SPACE-EGRESS/1 0123456789abcdef0123456789ABCDEF\n";
        let mut input = b"stale bytes SPACE-EGRESS/1 short\nSPACE-EGRESS/1 ".to_vec();
        input.extend_from_slice(line);
        input.extend_from_slice(b"PRI * HTTP/2.0");
        let (mut a, mut b) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            for c in input.chunks(7) {
                a.write_all(c).await.unwrap();
            }
            a
        });
        let (got, rest) = sync(&mut b, Vec::new()).await.unwrap();
        assert_eq!(got, line);
        let mut rest = rest;
        let _a = writer.await.unwrap();
        while rest.len() < 14 {
            let mut c = [0u8; 14];
            let n = b.read(&mut c).await.unwrap();
            rest.extend_from_slice(&c[..n]);
        }
        assert_eq!(rest, b"PRI * HTTP/2.0");
    }

    #[tokio::test]
    async fn sync_gives_up_after_a_mebibyte() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            let junk = vec![b'x'; 1 << 16];
            for _ in 0..40 {
                if a.write_all(&junk).await.is_err() {
                    return;
                }
            }
        });
        let err = sync(&mut b, Vec::new()).await.unwrap_err();
        assert!(err.to_string().contains("no sync line"), "{err}");
        // A line in the seed is found without reading.
        let seed = b"xxSPACE-EGRESS/1 00000000000000000000000000000000\nrest".to_vec();
        let (line, rest) = sync(&mut tokio::io::empty(), seed).await.unwrap();
        assert_eq!(line.len(), space_proto::sync::SYNC_LINE_LEN);
        assert_eq!(rest, b"rest");
        assert!(sync(&mut tokio::io::empty(), Vec::new()).await.is_err());
    }
}
