//! The HTTP client the store speaks through for plain-HTTP endpoints: hyper's, with every
//! response's bytes acknowledged as soon as they are read.
//!
//! Why not the default client: a store that writes a response's headers and then its body
//! in two writes, without `TCP_NODELAY` (Garage does), holds the body until the headers are
//! acknowledged; and Linux, on a connection it judges request/response, delays that
//! acknowledgement by up to 40 ms. The stall hits every body that fits in one segment: on
//! loopback (Garage's own advice is a gateway on each client host, at `localhost:3900`)
//! that is every body up to 64 KiB, so manifests, device state and compressed chunks each
//! took 44 ms instead of about 1 ms (`space-bench restore` prints both clients side by side). Setting
//! `TCP_QUICKACK` after each read sends the acknowledgement at once.
//!
//! HTTPS endpoints keep object_store's own client (its TLS roots and settings); a TLS
//! gateway on loopback would meet the same stall.

use std::fmt;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body::{Body, Frame, SizeHint};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use object_store::client::{
    HttpClient, HttpConnector as StoreConnector, HttpError, HttpErrorKind, HttpRequest,
    HttpRequestBody, HttpResponse, HttpResponseBody, HttpService,
};
use object_store::ClientOptions;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// How long a connection may take to open.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a whole request may take, its response's body read included.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an idle connection stays in the pool.
const POOL_IDLE: Duration = Duration::from_secs(60);

/// Makes the store's [`HttpClient`] for a plain-HTTP endpoint (see the module's text).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct QuickAckConnector;

impl StoreConnector for QuickAckConnector {
    fn connect(&self, _options: &ClientOptions) -> object_store::Result<HttpClient> {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        http.enforce_http(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(Connect(http));
        Ok(HttpClient::new(QuickAckClient(client)))
    }
}

/// Opens TCP connections whose reads are acknowledged at once.
#[derive(Clone)]
struct Connect(HttpConnector);

type ConnectFuture = Pin<Box<dyn Future<Output = Result<TokioIo<QuickAck>, BoxError>> + Send>>;
type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl tower_service::Service<Uri> for Connect {
    type Response = TokioIo<QuickAck>;
    type Error = BoxError;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.0.call(uri);
        Box::pin(async move {
            let io = connecting.await?;
            Ok(TokioIo::new(QuickAck(io.into_inner())))
        })
    }
}

/// A TCP stream that acknowledges what it has read at once.
struct QuickAck(TcpStream);

impl QuickAck {
    fn ack_now(&self) {
        let one: libc::c_int = 1;
        // SAFETY: the descriptor is this stream's, open for the call; the option value is a
        // live c_int whose size is passed with it. A failure only leaves the ACK delayed.
        unsafe {
            libc::setsockopt(
                self.0.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_QUICKACK,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

impl AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.ack_now();
        }
        r
    }
}

impl AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Connection for QuickAck {
    fn connected(&self) -> Connected {
        self.0.connected()
    }
}

/// The client object_store calls.
struct QuickAckClient(Client<Connect, HttpRequestBody>);

impl fmt::Debug for QuickAckClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("QuickAckClient")
    }
}

fn request_error(e: hyper_util::client::legacy::Error) -> HttpError {
    let kind = if e.is_connect() {
        HttpErrorKind::Connect
    } else {
        // The request went out on a pooled connection the store had closed, or the
        // connection broke: object_store retries these.
        HttpErrorKind::Request
    };
    HttpError::new(kind, e)
}

#[async_trait::async_trait]
impl HttpService for QuickAckClient {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let deadline = tokio::time::Instant::now() + REQUEST_TIMEOUT;
        let res = tokio::time::timeout_at(deadline, self.0.request(req))
            .await
            .map_err(|_| HttpError::new(HttpErrorKind::Timeout, TimedOut))?
            .map_err(request_error)?;
        let (parts, body) = res.into_parts();
        let body = Deadline {
            body: sync_wrapper::SyncWrapper::new(body),
            sleep: Box::pin(tokio::time::sleep_until(deadline)),
        };
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the object store did not answer within {REQUEST_TIMEOUT:?}")]
struct TimedOut;

/// A response body that fails once the request's time is up.
struct Deadline {
    body: sync_wrapper::SyncWrapper<hyper::body::Incoming>,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

impl Body for Deadline {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        // What has arrived is delivered (the end included) even past the deadline; only a
        // wait for more is cut short.
        match Pin::new(self.body.get_mut()).poll_frame(cx) {
            Poll::Pending => {}
            ready => return ready.map_err(|e| HttpError::new(HttpErrorKind::Interrupted, e)),
        }
        if self.sleep.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(HttpError::new(HttpErrorKind::Timeout, TimedOut))));
        }
        Poll::Pending
    }

    fn size_hint(&self) -> SizeHint {
        // `SyncWrapper` lends its value only mutably; the hint is not needed.
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    /// Serves one connection: reads a request's head, then writes `parts` with a pause
    /// between them, then closes.
    fn serve_once(parts: Vec<Vec<u8>>) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if s.read(&mut b).unwrap() == 0 {
                    return;
                }
                head.push(b[0]);
            }
            for p in parts {
                s.write_all(&p).unwrap();
                s.flush().unwrap();
                std::thread::sleep(Duration::from_millis(30));
            }
        });
        format!("http://{addr}/object")
    }

    fn client() -> HttpClient {
        QuickAckConnector.connect(&ClientOptions::new()).unwrap()
    }

    fn get(url: &str) -> HttpRequest {
        http::Request::get(url)
            .body(HttpRequestBody::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn a_body_written_after_its_headers_arrives_whole() {
        let body = b"0123456789".repeat(500);
        let url = serve_once(vec![
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes(),
            body[..1000].to_vec(),
            body[1000..].to_vec(),
        ]);
        let res = client().execute(get(&url)).await.unwrap();
        assert_eq!(res.status(), 200);
        let got = res.into_body().bytes().await.unwrap();
        assert_eq!(&got[..], &body[..]);
    }

    #[tokio::test]
    async fn a_body_cut_short_is_an_error_not_a_shorter_object() {
        let url = serve_once(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n".to_vec(),
            b"only forty bytes of the hundred promised".to_vec(),
        ]);
        let res = client().execute(get(&url)).await.unwrap();
        assert_eq!(res.status(), 200);
        let err = res.into_body().bytes().await.unwrap_err();
        assert_eq!(err.kind(), HttpErrorKind::Interrupted, "{err}");
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let err = client()
            .execute(get(&format!("http://127.0.0.1:{port}/object")))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), HttpErrorKind::Connect, "{err}");
    }
}
