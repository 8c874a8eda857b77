//! HTTP body plumbing shared by the handlers: the response body type, JSON answers and errors,
//! bounded JSON request bodies, channel-fed streaming bodies, and a record reader for streamed
//! request bodies.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::{Body, Frame as BodyFrame};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;
use serde::Serialize;
use space_proto::limits::MAX_JSON_BODY;
use space_proto::{ErrorKind, Frame, FrameDecoder, ProtoError};
use tokio::sync::mpsc;

/// Body of every response.
pub type RespBody = UnsyncBoxBody<Bytes, io::Error>;

/// What every handler returns; the router turns the error into a JSON error response.
pub type HandlerResult = Result<Response<RespBody>, ProtoError>;

pub fn full(bytes: impl Into<Bytes>) -> RespBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response<RespBody> {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut resp = Response::new(full(bytes));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

pub fn ok_json<T: Serialize>(value: &T) -> HandlerResult {
    Ok(json_response(StatusCode::OK, value))
}

pub fn error_response(err: &ProtoError) -> Response<RespBody> {
    let status =
        StatusCode::from_u16(err.kind.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, err)
}

/// Reads a JSON request body of at most `MAX_JSON_BODY` bytes.
pub async fn read_json<T: DeserializeOwned>(body: Incoming) -> Result<T, ProtoError> {
    let bytes = match Limited::new(body, MAX_JSON_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ProtoError::new(
                ErrorKind::TooLarge,
                format!("JSON body exceeds {MAX_JSON_BODY} bytes"),
            ))
        }
        Err(_) => {
            return Err(ProtoError::new(
                ErrorKind::Closed,
                "request body was cut off",
            ))
        }
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| ProtoError::invalid(format!("invalid JSON body: {e}")))
}

/// A response body fed by a task through a bounded channel, so a slow host applies
/// backpressure all the way to the producer (a pipe, a file, inotify). An `Err` item resets the
/// HTTP/2 stream, which is how a failure after the headers reaches the host for raw bodies.
pub struct ChannelBody {
    rx: mpsc::Receiver<io::Result<Bytes>>,
}

impl ChannelBody {
    pub fn new(capacity: usize) -> (mpsc::Sender<io::Result<Bytes>>, ChannelBody) {
        let (tx, rx) = mpsc::channel(capacity);
        (tx, ChannelBody { rx })
    }

    pub fn boxed(self) -> RespBody {
        BodyExt::boxed_unsync(self)
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<BodyFrame<Bytes>, io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|r| r.map(BodyFrame::data)))
    }
}

/// Why reading records from a request body stopped early.
#[derive(Debug, thiserror::Error)]
pub enum FrameReadError {
    #[error("request body failed")]
    Body(#[source] hyper::Error),
    #[error("bad record")]
    Frame(#[from] space_proto::FrameError),
}

impl FrameReadError {
    pub fn to_proto(&self) -> ProtoError {
        match self {
            FrameReadError::Body(_) => ProtoError::new(ErrorKind::Closed, "request body failed"),
            FrameReadError::Frame(e) => ProtoError::new(ErrorKind::Protocol, e.to_string()),
        }
    }
}

/// Records out of a streamed request body.
pub struct FrameReader {
    body: Incoming,
    decoder: FrameDecoder,
    done: bool,
}

impl FrameReader {
    pub fn new(body: Incoming) -> FrameReader {
        FrameReader {
            body,
            decoder: FrameDecoder::new(),
            done: false,
        }
    }

    /// The next record; `Ok(None)` at a clean end of the body.
    pub async fn next(&mut self) -> Result<Option<Frame>, FrameReadError> {
        loop {
            if let Some(f) = self.decoder.next_frame()? {
                return Ok(Some(f));
            }
            if self.done {
                return Ok(None);
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.decoder.push(&data);
                    }
                }
                Some(Err(e)) => return Err(FrameReadError::Body(e)),
                None => {
                    self.done = true;
                    self.decoder.finish()?;
                }
            }
        }
    }
}
