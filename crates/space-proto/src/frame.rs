//! Record framing inside streamed HTTP bodies (exec, PTY, watch).
//!
//! HTTP/2 DATA frames may be split or merged anywhere by either end, so records carry their own
//! boundaries: `[kind: u8][len: u32 big-endian][payload: len bytes]`, with `len` at most
//! [`MAX_FRAME_PAYLOAD`]. [`FrameDecoder`] is incremental and checks the 5-byte header *before*
//! it buffers a payload, so a hostile length never makes it allocate.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Largest payload of one record (1 MiB).
pub const MAX_FRAME_PAYLOAD: usize = 1024 * 1024;

/// Size of the record header.
pub const HEADER_LEN: usize = 5;

/// What a record carries; the numeric values are the wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// JSON `ExecSpec` or `PtySpec`; first record of an exec or PTY request.
    Spec = 1,
    /// Raw bytes for the process's stdin (or the PTY's input).
    Stdin = 2,
    /// Empty; closes the process's stdin.
    StdinEof = 3,
    /// Raw bytes the process wrote to stdout (or the PTY's output).
    Stdout = 4,
    /// Raw bytes the process wrote to stderr.
    Stderr = 5,
    /// JSON `Started`; first record of an exec or PTY response.
    Started = 6,
    /// JSON `ExitStatus`; last record of an exec or PTY response.
    Exit = 7,
    /// JSON `ProtoError`; a failure after the response headers went out. Ends the stream.
    Error = 8,
    /// JSON `Resize`; changes the PTY's window size.
    Resize = 9,
    /// JSON `SignalRequest`; sends a signal to the process group.
    Signal = 10,
    /// JSON `WatchEvent`.
    Event = 11,
}

impl FrameKind {
    pub fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Spec,
            2 => FrameKind::Stdin,
            3 => FrameKind::StdinEof,
            4 => FrameKind::Stdout,
            5 => FrameKind::Stderr,
            6 => FrameKind::Started,
            7 => FrameKind::Exit,
            8 => FrameKind::Error,
            9 => FrameKind::Resize,
            10 => FrameKind::Signal,
            11 => FrameKind::Event,
            _ => return None,
        })
    }
}

/// Why a byte stream is not a valid sequence of records.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("unknown record kind {0}")]
    UnknownKind(u8),
    #[error("record payload of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("stream ended inside a record ({0} bytes left over)")]
    Truncated(usize),
    #[error("invalid JSON in {kind:?} record: {message}")]
    Json { kind: FrameKind, message: String },
}

/// One record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub payload: Bytes,
}

impl Frame {
    pub fn new(kind: FrameKind, payload: impl Into<Bytes>) -> Frame {
        Frame {
            kind,
            payload: payload.into(),
        }
    }

    /// A record whose payload is `value` as JSON.
    pub fn json<T: Serialize>(kind: FrameKind, value: &T) -> Frame {
        // Serializing our own plain data types cannot fail (no maps with non-string keys, no
        // custom serializers that error); an empty object is a safe fallback regardless.
        let payload = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
        Frame::new(kind, payload)
    }

    /// Parses the payload as JSON.
    pub fn parse<T: DeserializeOwned>(&self) -> Result<T, FrameError> {
        serde_json::from_slice(&self.payload).map_err(|e| FrameError::Json {
            kind: self.kind,
            message: e.to_string(),
        })
    }

    /// Appends the encoded record to `out`. Payloads over the limit are the caller's bug; they
    /// are encoded anyway and the peer rejects them.
    pub fn encode_into(&self, out: &mut BytesMut) {
        out.reserve(HEADER_LEN + self.payload.len());
        out.put_u8(self.kind as u8);
        out.put_u32(self.payload.len() as u32);
        out.put_slice(&self.payload);
    }

    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(HEADER_LEN + self.payload.len());
        self.encode_into(&mut out);
        out.freeze()
    }
}

/// Encodes `data` as records of `kind`, splitting it so no payload exceeds the limit.
pub fn encode_chunked(kind: FrameKind, data: &[u8], out: &mut BytesMut) {
    for chunk in data.chunks(MAX_FRAME_PAYLOAD) {
        out.put_u8(kind as u8);
        out.put_u32(chunk.len() as u32);
        out.put_slice(chunk);
    }
}

/// Incremental decoder: [`push`](FrameDecoder::push) bytes as they arrive, then pull records
/// with [`next_frame`](FrameDecoder::next_frame) until it returns `Ok(None)`. After an error the
/// decoder stays failed: a byte stream that lost its framing cannot be resynchronised.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    max_payload: usize,
    failed: Option<FrameError>,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new()
    }
}

impl FrameDecoder {
    pub fn new() -> FrameDecoder {
        FrameDecoder::with_max_payload(MAX_FRAME_PAYLOAD)
    }

    pub fn with_max_payload(max_payload: usize) -> FrameDecoder {
        FrameDecoder {
            buf: BytesMut::new(),
            max_payload,
            failed: None,
        }
    }

    /// Adds bytes. Callers pull all complete records after each push, so the buffer holds at
    /// most one partial record plus one pushed chunk.
    pub fn push(&mut self, data: &[u8]) {
        if self.failed.is_none() {
            self.buf.extend_from_slice(data);
        }
    }

    /// Bytes held that do not yet form a complete record.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete record, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.buf.is_empty() {
            return Ok(None);
        }
        // Validate the kind as soon as its byte is here, and the length as soon as the header
        // is complete, before waiting for (and buffering) any payload.
        if let Err(e) = self.check_header() {
            self.buf = BytesMut::new();
            self.failed = Some(e.clone());
            return Err(e);
        }
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        let kind = FrameKind::from_u8(self.buf[0]).ok_or(FrameError::UnknownKind(self.buf[0]))?;
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Frame { kind, payload }))
    }

    fn check_header(&self) -> Result<(), FrameError> {
        let kind = self.buf[0];
        if FrameKind::from_u8(kind).is_none() {
            return Err(FrameError::UnknownKind(kind));
        }
        if self.buf.len() >= HEADER_LEN {
            let len =
                u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
            if len > self.max_payload {
                return Err(FrameError::TooLarge {
                    len,
                    max: self.max_payload,
                });
            }
        }
        Ok(())
    }

    /// Call at end of stream: an error if a record was cut short.
    pub fn finish(&self) -> Result<(), FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated(self.buf.len()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Frame> {
        vec![
            Frame::new(FrameKind::Spec, &b"{\"command\":{\"argv\":[\"true\"]}}"[..]),
            Frame::new(FrameKind::Stdin, vec![0u8, 1, 2, 255]),
            Frame::new(FrameKind::StdinEof, Bytes::new()),
            Frame::new(FrameKind::Stdout, vec![b'x'; 70_000]),
            Frame::new(FrameKind::Stderr, Bytes::new()),
            Frame::new(FrameKind::Exit, &b"{}"[..]),
        ]
    }

    fn encode_all(frames: &[Frame]) -> Vec<u8> {
        let mut out = BytesMut::new();
        for f in frames {
            f.encode_into(&mut out);
        }
        out.to_vec()
    }

    /// A small deterministic generator so the split-point test is reproducible without a
    /// dependency.
    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn round_trip_whole() {
        let frames = sample();
        let mut d = FrameDecoder::new();
        d.push(&encode_all(&frames));
        let mut got = Vec::new();
        while let Some(f) = d.next_frame().unwrap() {
            got.push(f);
        }
        assert_eq!(got, frames);
        d.finish().unwrap();
    }

    #[test]
    fn round_trip_at_arbitrary_split_points() {
        let frames = sample();
        let bytes = encode_all(&frames);
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for round in 0..300 {
            let mut d = FrameDecoder::new();
            let mut got = Vec::new();
            let mut pos = 0;
            while pos < bytes.len() {
                // Mix single bytes, small and large chunks.
                let max = match round % 3 {
                    0 => 1,
                    1 => 16,
                    _ => 40_000,
                };
                let n = 1 + (rng.next() as usize % max);
                let end = (pos + n).min(bytes.len());
                d.push(&bytes[pos..end]);
                pos = end;
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, frames, "round {round}");
            d.finish().unwrap();
        }
    }

    #[test]
    fn unknown_kind_is_rejected_immediately() {
        let mut d = FrameDecoder::new();
        d.push(&[0x7f]);
        assert_eq!(d.next_frame(), Err(FrameError::UnknownKind(0x7f)));
        // Stays failed.
        d.push(&[1, 0, 0, 0, 0]);
        assert!(d.next_frame().is_err());
    }

    #[test]
    fn oversized_length_is_rejected_before_payload() {
        let mut d = FrameDecoder::new();
        let len = (MAX_FRAME_PAYLOAD as u32) + 1;
        let mut hdr = vec![FrameKind::Stdin as u8];
        hdr.extend_from_slice(&len.to_be_bytes());
        d.push(&hdr);
        assert_eq!(
            d.next_frame(),
            Err(FrameError::TooLarge {
                len: MAX_FRAME_PAYLOAD + 1,
                max: MAX_FRAME_PAYLOAD
            })
        );
        assert_eq!(d.buffered(), 0);
    }

    #[test]
    fn exact_limit_is_accepted() {
        let f = Frame::new(FrameKind::Stdout, vec![7u8; MAX_FRAME_PAYLOAD]);
        let mut d = FrameDecoder::new();
        d.push(&f.encode());
        assert_eq!(d.next_frame().unwrap(), Some(f));
    }

    #[test]
    fn truncated_stream_is_reported() {
        let mut d = FrameDecoder::new();
        let bytes = Frame::new(FrameKind::Stdout, &b"hello"[..]).encode();
        d.push(&bytes[..7]);
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.finish(), Err(FrameError::Truncated(7)));
    }

    #[test]
    fn chunked_encoding_respects_limit() {
        let data = vec![3u8; MAX_FRAME_PAYLOAD * 2 + 10];
        let mut out = BytesMut::new();
        encode_chunked(FrameKind::Stdin, &data, &mut out);
        let mut d = FrameDecoder::new();
        d.push(&out);
        let mut total = 0;
        let mut n = 0;
        while let Some(f) = d.next_frame().unwrap() {
            assert!(f.payload.len() <= MAX_FRAME_PAYLOAD);
            total += f.payload.len();
            n += 1;
        }
        assert_eq!((total, n), (data.len(), 3));
    }

    #[test]
    fn garbage_never_panics_and_never_overbuffers() {
        let mut rng = XorShift(12345);
        for _ in 0..2000 {
            let len = rng.next() as usize % 64;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            let mut d = FrameDecoder::with_max_payload(32);
            for chunk in bytes.chunks(1 + rng.next() as usize % 7) {
                d.push(chunk);
                loop {
                    match d.next_frame() {
                        Ok(Some(f)) => assert!(f.payload.len() <= 32),
                        Ok(None) => break,
                        Err(_) => break,
                    }
                }
                assert!(d.buffered() <= HEADER_LEN + 32 + 7);
            }
            let _ = d.finish();
        }
    }

    #[test]
    fn json_payloads_parse() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct P {
            pid: u32,
        }
        let f = Frame::json(FrameKind::Started, &P { pid: 9 });
        assert_eq!(f.parse::<P>().unwrap(), P { pid: 9 });
        let bad = Frame::new(FrameKind::Started, &b"{"[..]);
        assert!(matches!(bad.parse::<P>(), Err(FrameError::Json { .. })));
    }
}
