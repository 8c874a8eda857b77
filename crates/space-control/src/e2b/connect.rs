//! The Connect protocol as E2B's SDKs speak it to envd: JSON codec only.
//!
//! - Unary: a JSON request body (`application/json`), a JSON object answer with 200, or an
//!   error `{"code": "<connect code>", "message"}` with the code's HTTP status.
//! - Server streams: the request body is one envelope (`[flags: u8][len: u32 BE][JSON]`,
//!   `application/connect+json`); the answer is 200 with exactly that content type, data
//!   envelopes (flags 0), then always an end-of-stream envelope (flags 2) holding `{}` or
//!   `{"error": {...}}`. Errors of a stream are sent in that last envelope, never as an
//!   HTTP status, because one SDK reads no body of a non-200 stream answer.
//! - Client streams (`StreamInput`): envelopes read one at a time as they arrive.
//!
//! Nothing is ever compressed; a compressed envelope from a client is refused.

use std::io;

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// The content type of unary calls.
pub const UNARY: &str = "application/json";
/// The content type of streams.
pub const STREAM: &str = "application/connect+json";
/// The largest request message (a `SendInput` carries up to this much stdin).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// Envelope flag of the end of a stream.
const END_STREAM: u8 = 0x02;
/// Envelope flag of a compressed message.
const COMPRESSED: u8 = 0x01;

/// A Connect error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    Unauthenticated,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code.
    pub fn status(self) -> StatusCode {
        match self {
            Code::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            Code::Unknown | Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// An error answered over Connect.
#[derive(Debug, Clone)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

pub type RpcResult<T> = Result<T, RpcError>;

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError::new(Code::InvalidArgument, message)
    }

    fn json(&self) -> Value {
        json!({"code": self.code.as_str(), "message": self.message})
    }

    /// The answer of a unary call that failed.
    pub fn unary(&self) -> Response {
        (
            self.code.status(),
            [(header::CONTENT_TYPE, UNARY)],
            self.json().to_string(),
        )
            .into_response()
    }

    /// The answer of a stream that failed before its first message.
    pub fn stream(&self) -> Response {
        let mut body = BytesMut::new();
        put_envelope(
            &mut body,
            END_STREAM,
            json!({"error": self.json()}).to_string().as_bytes(),
        );
        stream_response(Body::from(body.freeze()))
    }
}

impl From<space_proto::ClientError> for RpcError {
    fn from(e: space_proto::ClientError) -> Self {
        RpcError::from(crate::error::ApiError::from(e))
    }
}

/// The Connect code of a guest's kind of error (finer than `/v1`'s codes: envd's clients
/// tell "exists" from "not a directory").
fn guest_code(kind: space_proto::ErrorKind) -> Code {
    use space_proto::ErrorKind as K;
    match kind {
        K::NotFound => Code::NotFound,
        K::AlreadyExists => Code::AlreadyExists,
        K::PermissionDenied | K::ReadOnly => Code::PermissionDenied,
        K::InvalidArgument | K::NotADirectory | K::IsADirectory | K::NotEmpty | K::Protocol => {
            Code::InvalidArgument
        }
        K::TooLarge | K::NoSpace | K::Busy => Code::ResourceExhausted,
        K::Timeout => Code::DeadlineExceeded,
        K::Unreachable | K::Closed => Code::Unavailable,
        K::Unsupported => Code::Unimplemented,
        _ => Code::Internal,
    }
}

impl From<crate::error::ApiError> for RpcError {
    fn from(e: crate::error::ApiError) -> Self {
        let code = match e.guest {
            Some(kind) => guest_code(kind),
            None => match e.status.as_u16() {
                400 | 413 | 422 => Code::InvalidArgument,
                401 => Code::Unauthenticated,
                403 => Code::PermissionDenied,
                404 => Code::NotFound,
                409 => Code::FailedPrecondition,
                429 | 507 => Code::ResourceExhausted,
                503 | 502 => Code::Unavailable,
                504 => Code::DeadlineExceeded,
                _ => Code::Internal,
            },
        };
        RpcError::new(code, e.message)
    }
}

fn put_envelope(out: &mut BytesMut, flags: u8, data: &[u8]) {
    out.put_u8(flags);
    out.put_u32(u32::try_from(data.len()).unwrap_or(u32::MAX));
    out.put_slice(data);
}

fn stream_response(body: Body) -> Response {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(STREAM),
    );
    r
}

/// The JSON answer of a unary call.
pub fn unary_ok<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(v) => ([(header::CONTENT_TYPE, UNARY)], v).into_response(),
        Err(e) => RpcError::new(Code::Internal, e.to_string()).unary(),
    }
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn check_encoding(headers: &HeaderMap) -> RpcResult<()> {
    for name in ["content-encoding", "connect-content-encoding"] {
        match headers.get(name).and_then(|v| v.to_str().ok()) {
            None | Some("identity") => {}
            Some(other) => {
                return Err(RpcError::new(
                    Code::Unimplemented,
                    format!("{name} {other:?} is not supported: send identity"),
                ))
            }
        }
    }
    Ok(())
}

async fn read_all(body: Body, limit: usize) -> RpcResult<Bytes> {
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(RpcError::new(
            Code::ResourceExhausted,
            format!("the request is larger than {limit} bytes"),
        )),
        Err(e) => Err(RpcError::new(
            Code::Canceled,
            format!("the request body was cut off: {e}"),
        )),
    }
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> RpcResult<T> {
    let bytes = if bytes.is_empty() { b"{}" } else { bytes };
    serde_json::from_slice(bytes).map_err(|e| RpcError::invalid(format!("invalid message: {e}")))
}

/// The request message of a unary call.
pub async fn unary_request<T: DeserializeOwned>(headers: &HeaderMap, body: Body) -> RpcResult<T> {
    let ct = content_type(headers);
    if !ct.starts_with(UNARY) {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!("unary calls take {UNARY}, not {ct:?}"),
        ));
    }
    check_encoding(headers)?;
    parse(&read_all(body, MAX_MESSAGE).await?)
}

/// One envelope of a client stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Envelope {
    /// A data envelope's message bytes (JSON, not yet parsed).
    Message(Bytes),
    /// The end-of-stream envelope: nothing after it is read.
    End,
}

/// Splits the bytes of a client stream into envelopes, bounded by [`MAX_MESSAGE`]; the
/// envelopes do not depend on how the bytes were cut into frames.
#[derive(Debug, Default)]
pub struct Envelopes {
    buf: BytesMut,
    ended: bool,
}

impl Envelopes {
    /// An empty splitter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes of the body.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes held that are not yet a whole envelope.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next whole envelope, `Ok(None)` when none is complete yet; a header announcing
    /// more than [`MAX_MESSAGE`] or a compressed message is refused as soon as it is seen.
    /// After [`Envelope::End`], always `Ok(None)`.
    pub fn next_envelope(&mut self) -> RpcResult<Option<Envelope>> {
        if self.ended || self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_MESSAGE {
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!("a message of {len} bytes is larger than {MAX_MESSAGE}"),
            ));
        }
        if flags & COMPRESSED != 0 {
            return Err(RpcError::new(
                Code::Unimplemented,
                "compressed messages are not supported",
            ));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        self.buf.advance(5);
        let data = self.buf.split_to(len).freeze();
        if flags & END_STREAM != 0 {
            self.ended = true;
            return Ok(Some(Envelope::End));
        }
        Ok(Some(Envelope::Message(data)))
    }

    /// Checks the body's end: bytes left inside an unfinished envelope are an error.
    pub fn finish(&self) -> RpcResult<()> {
        if self.ended || self.buf.is_empty() {
            Ok(())
        } else {
            Err(RpcError::invalid("the stream ended inside a message"))
        }
    }
}

/// Parses one message of a stream as the request type.
pub fn parse_message<T: DeserializeOwned>(bytes: &[u8]) -> RpcResult<T> {
    parse(bytes)
}

/// Reads envelopes off a request body one at a time.
pub struct EnvelopeReader {
    body: Body,
    envelopes: Envelopes,
    done: bool,
}

impl EnvelopeReader {
    pub fn new(headers: &HeaderMap, body: Body) -> RpcResult<EnvelopeReader> {
        let ct = content_type(headers);
        if !ct.starts_with(STREAM) {
            return Err(RpcError::new(
                Code::Unimplemented,
                format!("streams take {STREAM}, not {ct:?}"),
            ));
        }
        check_encoding(headers)?;
        Ok(EnvelopeReader {
            body,
            envelopes: Envelopes::new(),
            done: false,
        })
    }

    /// The next message; `None` at the end of the body (or at an end-of-stream envelope).
    pub async fn next<T: DeserializeOwned>(&mut self) -> RpcResult<Option<T>> {
        loop {
            match self.envelopes.next_envelope()? {
                Some(Envelope::Message(data)) => return parse(&data).map(Some),
                Some(Envelope::End) => {
                    self.done = true;
                    return Ok(None);
                }
                None => {}
            }
            if self.done {
                self.envelopes.finish()?;
                return Ok(None);
            }
            match self.body.frame().await {
                None => self.done = true,
                Some(Err(e)) => {
                    return Err(RpcError::new(
                        Code::Canceled,
                        format!("the request body was cut off: {e}"),
                    ))
                }
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        self.envelopes.push(&d);
                    }
                }
            }
        }
    }
}

/// The request message of a server-streaming call: its one envelope.
pub async fn stream_request<T: DeserializeOwned>(headers: &HeaderMap, body: Body) -> RpcResult<T> {
    let mut r = EnvelopeReader::new(headers, body)?;
    r.next()
        .await?
        .ok_or_else(|| RpcError::invalid("the stream carried no request message"))
}

/// The sending side of a server stream.
pub struct StreamTx {
    tx: mpsc::Sender<io::Result<Bytes>>,
}

impl StreamTx {
    /// A stream answer and its sender.
    pub fn open() -> (StreamTx, Response) {
        let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(8);
        let body = Body::from_stream(tokio_stream_from(rx));
        (StreamTx { tx }, stream_response(body))
    }

    /// Sends one message; `false` once the client went away.
    pub async fn send<T: Serialize>(&self, msg: &T) -> bool {
        let Ok(data) = serde_json::to_vec(msg) else {
            return false;
        };
        let mut out = BytesMut::with_capacity(data.len() + 5);
        put_envelope(&mut out, 0, &data);
        self.tx.send(Ok(out.freeze())).await.is_ok()
    }

    /// Ends the stream, with an error or without.
    pub async fn end(self, error: Option<RpcError>) {
        let end = match error {
            Some(e) => json!({"error": e.json()}),
            None => json!({}),
        };
        let mut out = BytesMut::new();
        put_envelope(&mut out, END_STREAM, end.to_string().as_bytes());
        let _ = self.tx.send(Ok(out.freeze())).await;
    }

    /// Whether the client went away.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Waits until the client went away.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<io::Result<Bytes>>,
) -> impl futures::Stream<Item = io::Result<Bytes>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(flags: u8, data: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        put_envelope(&mut b, flags, data);
        b.freeze()
    }

    fn stream_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, STREAM.parse().unwrap());
        h
    }

    #[tokio::test]
    async fn envelopes_split_anywhere_are_read_whole() {
        let mut all = BytesMut::new();
        all.extend_from_slice(&envelope(0, br#"{"a":1}"#));
        all.extend_from_slice(&envelope(0, br#"{"a":2}"#));
        all.extend_from_slice(&envelope(END_STREAM, b"{}"));
        let chunks: Vec<Result<Bytes, io::Error>> = all
            .chunks(3)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = Body::from_stream(futures::stream::iter(chunks));
        let mut r = EnvelopeReader::new(&stream_headers(), body).unwrap();
        let a: Value = r.next().await.unwrap().unwrap();
        let b: Value = r.next().await.unwrap().unwrap();
        assert_eq!((a["a"].as_i64(), b["a"].as_i64()), (Some(1), Some(2)));
        assert!(r.next::<Value>().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn bad_streams_are_refused() {
        let cut = envelope(0, br#"{"a":1}"#).slice(..8);
        let mut r = EnvelopeReader::new(&stream_headers(), Body::from(cut)).unwrap();
        assert_eq!(
            r.next::<Value>().await.unwrap_err().code,
            Code::InvalidArgument
        );
        let zipped = envelope(COMPRESSED, b"xx");
        let mut r = EnvelopeReader::new(&stream_headers(), Body::from(zipped)).unwrap();
        assert_eq!(
            r.next::<Value>().await.unwrap_err().code,
            Code::Unimplemented
        );
        let mut huge = BytesMut::new();
        huge.put_u8(0);
        huge.put_u32(u32::MAX);
        let mut r = EnvelopeReader::new(&stream_headers(), Body::from(huge.freeze())).unwrap();
        assert_eq!(
            r.next::<Value>().await.unwrap_err().code,
            Code::ResourceExhausted
        );
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "application/proto".parse().unwrap());
        assert!(EnvelopeReader::new(&h, Body::empty()).is_err());
        let mut h = stream_headers();
        h.insert("connect-content-encoding", "gzip".parse().unwrap());
        assert!(EnvelopeReader::new(&h, Body::empty()).is_err());
    }

    #[tokio::test]
    async fn a_failed_stream_is_200_with_the_error_in_its_last_envelope() {
        let r = RpcError::new(Code::NotFound, "no process 7").stream();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::CONTENT_TYPE], STREAM);
        let body = r.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body[0], END_STREAM);
        let v: Value = serde_json::from_slice(&body[5..]).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        let u = RpcError::new(Code::AlreadyExists, "x").unary();
        assert_eq!(u.status(), StatusCode::CONFLICT);
    }
}
