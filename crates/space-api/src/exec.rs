//! Exec: the request, the events a running command produces, and the one decoder of the
//! NDJSON stream `POST /v1/sandboxes/{id}/exec` answers (`docs/api.md`). The server encodes
//! [`ExecEvent`]s with [`ExecEvent::line`]; every client (the CLI, the MCP server, the
//! benches, the tests) reads them with [`Decoder`].

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::Failure;

/// The longest NDJSON line a decoder takes (an output event carries at most 64 KiB, about
/// 88 KiB as base64).
pub const MAX_LINE: usize = 4 << 20;

/// What to run: exactly one of `cmd` (an argv) or `shell` (a line for `/bin/sh -c`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The argv.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    /// A shell line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Environment added to the sandbox's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The working directory (absolute, in the guest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Bytes written to stdin, then closed (standard base64 on the wire).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "b64_opt_out",
        deserialize_with = "b64_opt_in"
    )]
    pub stdin: Option<Vec<u8>>,
    /// Killed (SIGKILL) after this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl ExecRequest {
    /// Runs `argv`.
    pub fn argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> ExecRequest {
        ExecRequest {
            cmd: Some(argv.into_iter().map(Into::into).collect()),
            ..ExecRequest::default()
        }
    }

    /// Runs `line` with `/bin/sh -c`.
    pub fn shell(line: impl Into<String>) -> ExecRequest {
        ExecRequest {
            shell: Some(line.into()),
            ..ExecRequest::default()
        }
    }
}

/// One event of a running command; `exit` or `error` is the last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// The command started with this pid.
    Started {
        /// Its pid in the guest.
        pid: u32,
    },
    /// Bytes it wrote to stdout.
    Stdout {
        /// The bytes (base64 on the wire).
        #[serde(serialize_with = "b64_out", deserialize_with = "b64_in")]
        data: Bytes,
    },
    /// Bytes it wrote to stderr.
    Stderr {
        /// The bytes (base64 on the wire).
        #[serde(serialize_with = "b64_out", deserialize_with = "b64_in")]
        data: Bytes,
    },
    /// It ended.
    Exit {
        /// Its exit code, when it exited.
        exit_code: Option<i32>,
        /// The signal that ended it, when one did.
        signal: Option<i32>,
    },
    /// The stream failed before the command's end was known.
    Error {
        /// The stable code.
        code: String,
        /// For people.
        message: String,
    },
}

impl ExecEvent {
    /// The event as one NDJSON line, newline included.
    pub fn line(&self) -> Bytes {
        let mut b = serde_json::to_vec(self).unwrap_or_default();
        b.push(b'\n');
        Bytes::from(b)
    }

    /// Whether no event follows this one.
    pub fn is_last(&self) -> bool {
        matches!(self, ExecEvent::Exit { .. } | ExecEvent::Error { .. })
    }

    /// The exit code a shell would report: the code, or 128 + the signal (1 when neither is
    /// known); `None` for an event that is not `exit`.
    pub fn shell_code(&self) -> Option<i32> {
        match self {
            ExecEvent::Exit { exit_code, signal } => Some(match (exit_code, signal) {
                (Some(c), _) => (*c).clamp(0, 255),
                (None, Some(s)) => 128 + (*s).clamp(0, 127),
                (None, None) => 1,
            }),
            _ => None,
        }
    }
}

impl From<Failure> for ExecEvent {
    fn from(f: Failure) -> ExecEvent {
        ExecEvent::Error {
            code: f.code,
            message: f.message,
        }
    }
}

/// A stream of events.
pub type EventStream = BoxStream<'static, Result<ExecEvent, Failure>>;

/// Splits an NDJSON byte stream into [`ExecEvent`]s: bytes go in with [`Decoder::push`],
/// whole events come out of [`Decoder::next_event`]; [`Decoder::finish`] takes a last line
/// without its newline. A line longer than [`MAX_LINE`], or one that is not an event, is an
/// `invalid_response` failure.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: BytesMut,
}

impl Decoder {
    /// An empty decoder.
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Takes more bytes of the stream.
    pub fn push(&mut self, mut chunk: impl bytes::Buf) {
        while chunk.has_remaining() {
            let n = chunk.chunk().len();
            self.buf.extend_from_slice(chunk.chunk());
            chunk.advance(n);
        }
    }

    /// The next whole event, if one has arrived.
    pub fn next_event(&mut self) -> Result<Option<ExecEvent>, Failure> {
        loop {
            let Some(nl) = self.buf.iter().position(|&b| b == b'\n') else {
                if self.buf.len() > MAX_LINE {
                    return Err(Failure::local(
                        "invalid_response",
                        format!("an exec stream line is longer than {MAX_LINE} bytes"),
                    ));
                }
                return Ok(None);
            };
            let line = self.buf.split_to(nl + 1);
            if let Some(ev) = parse(&line[..nl])? {
                return Ok(Some(ev));
            }
        }
    }

    /// The event on a last line that has no newline, at the end of the stream.
    pub fn finish(&mut self) -> Result<Option<ExecEvent>, Failure> {
        let rest = std::mem::take(&mut self.buf);
        parse(&rest)
    }
}

fn parse(line: &[u8]) -> Result<Option<ExecEvent>, Failure> {
    let line = line.trim_ascii();
    if line.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(line).map(Some).map_err(|e| {
        Failure::local(
            "invalid_response",
            format!("the server sent an exec event that is not one: {e}"),
        )
    })
}

/// Every event of a whole NDJSON body (a last line without its newline included).
pub fn events(body: &[u8]) -> Result<Vec<ExecEvent>, Failure> {
    let mut d = Decoder::new();
    d.push(body);
    let mut out = Vec::new();
    while let Some(ev) = d.next_event()? {
        out.push(ev);
    }
    out.extend(d.finish()?);
    Ok(out)
}

/// The events of an NDJSON body. The stream ends after the last event; a body that ends
/// before it yields a `guest_error` failure.
pub fn decode<E: std::fmt::Display + Send + 'static>(
    body: BoxStream<'static, Result<Bytes, E>>,
) -> EventStream {
    struct St<E> {
        body: BoxStream<'static, Result<Bytes, E>>,
        dec: Decoder,
        done: bool,
    }
    let st = St {
        body,
        dec: Decoder::new(),
        done: false,
    };
    futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            match st.dec.next_event() {
                Ok(Some(ev)) => {
                    st.done = ev.is_last();
                    return Some((Ok(ev), st));
                }
                Ok(None) => {}
                Err(f) => {
                    st.done = true;
                    return Some((Err(f), st));
                }
            }
            match st.body.next().await {
                Some(Ok(chunk)) => st.dec.push(chunk),
                Some(Err(e)) => {
                    st.done = true;
                    let f = Failure::local("guest_error", format!("the exec stream broke: {e}"));
                    return Some((Err(f), st));
                }
                None => {
                    st.done = true;
                    let end = match st.dec.finish() {
                        Ok(Some(ev)) if ev.is_last() => Ok(ev),
                        Ok(_) => Err(Failure::local(
                            "guest_error",
                            "the exec stream ended before the command's exit was reported",
                        )),
                        Err(f) => Err(f),
                    };
                    return Some((end, st));
                }
            }
        }
    })
    .boxed()
}

fn b64_out<S: Serializer>(data: &Bytes, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&B64.encode(data))
}

fn b64_in<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
    let s = String::deserialize(d)?;
    B64.decode(s.as_bytes())
        .map(Bytes::from)
        .map_err(|e| serde::de::Error::custom(format!("not base64: {e}")))
}

fn b64_opt_out<S: Serializer>(data: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
    match data {
        Some(d) => s.serialize_str(&B64.encode(d)),
        None => s.serialize_none(),
    }
}

fn b64_opt_in<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    s.map(|s| {
        B64.decode(s.as_bytes())
            .map_err(|e| serde::de::Error::custom(format!("stdin is not base64: {e}")))
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_have_the_documented_lines() {
        let ev = ExecEvent::Stdout {
            data: Bytes::from_static(b"hi\n"),
        };
        assert_eq!(&ev.line()[..], b"{\"type\":\"stdout\",\"data\":\"aGkK\"}\n");
        let ev = ExecEvent::Exit {
            exit_code: Some(3),
            signal: None,
        };
        assert_eq!(
            &ev.line()[..],
            b"{\"type\":\"exit\",\"exit_code\":3,\"signal\":null}\n"
        );
        assert_eq!(ev.shell_code(), Some(3));
        let killed = ExecEvent::Exit {
            exit_code: None,
            signal: Some(9),
        };
        assert_eq!(killed.shell_code(), Some(137));
    }

    #[test]
    fn the_decoder_splits_lines_across_chunks() {
        let mut d = Decoder::new();
        d.push(&b"{\"type\":\"started\",\"pid\":7}\n{\"type\":\"std"[..]);
        assert_eq!(d.next_event().unwrap(), Some(ExecEvent::Started { pid: 7 }));
        assert_eq!(d.next_event().unwrap(), None);
        d.push(
            &b"err\",\"data\":\"eA==\"}\n\n{\"type\":\"exit\",\"exit_code\":0,\"signal\":null}"[..],
        );
        assert_eq!(
            d.next_event().unwrap(),
            Some(ExecEvent::Stderr {
                data: Bytes::from_static(b"x")
            })
        );
        assert_eq!(d.next_event().unwrap(), None);
        assert!(d.finish().unwrap().unwrap().is_last());
    }

    #[test]
    fn hostile_lines_are_refused() {
        let mut d = Decoder::new();
        d.push(&b"not json\n"[..]);
        assert_eq!(d.next_event().unwrap_err().code, "invalid_response");
        let mut d = Decoder::new();
        d.push(&b"{\"type\":\"stdout\",\"data\":\"***\"}\n"[..]);
        assert!(d.next_event().is_err());
        let mut d = Decoder::new();
        d.push(vec![b'a'; MAX_LINE + 1].as_slice());
        assert!(d.next_event().is_err());
    }

    #[tokio::test]
    async fn a_body_that_ends_early_is_a_failure() {
        let chunks: Vec<Result<Bytes, String>> = vec![Ok(Bytes::from_static(
            b"{\"type\":\"started\",\"pid\":1}\n",
        ))];
        let events: Vec<_> = decode(futures::stream::iter(chunks).boxed())
            .collect()
            .await;
        assert_eq!(events.len(), 2);
        assert_eq!(events[1].as_ref().unwrap_err().code, "guest_error");
    }

    #[test]
    fn requests_round_trip_with_base64_stdin() {
        let mut r = ExecRequest::shell("cat");
        r.stdin = Some(b"abc".to_vec());
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v, serde_json::json!({"shell": "cat", "stdin": "YWJj"}));
        assert_eq!(serde_json::from_value::<ExecRequest>(v).unwrap(), r);
        let bad = serde_json::json!({"shell": "cat", "stdin": "%%"});
        assert!(serde_json::from_value::<ExecRequest>(bad).is_err());
    }
}
