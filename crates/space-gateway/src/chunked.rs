//! The chunked transfer coding of HTTP/1.1: an incremental, bounded decoder (for request
//! bodies the gateway looks into and responses it scrubs) and the framing of chunks it
//! writes.

/// The longest chunk-size line (with extensions) accepted.
const MAX_SIZE_LINE: usize = 4096;
/// The most bytes of trailer fields accepted (they are read and dropped).
const MAX_TRAILERS: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk-size line.
    Size,
    /// This many data bytes left in the chunk.
    Data(u64),
    /// The CRLF after a chunk's data; how many of its bytes were seen.
    DataEnd(u8),
    /// Trailer lines, up to the empty one.
    Trailers,
    /// The last chunk and the trailers are read.
    Done,
}

/// Decodes a chunked body fed in pieces of any size.
#[derive(Debug)]
pub struct Decoder {
    state: State,
    line: Vec<u8>,
    trailers: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new()
    }
}

impl Decoder {
    /// A decoder at the start of a body.
    pub fn new() -> Decoder {
        Decoder {
            state: State::Size,
            line: Vec::new(),
            trailers: 0,
        }
    }

    /// Whether the whole body was read.
    pub fn done(&self) -> bool {
        self.state == State::Done
    }

    /// Takes `input`, appends the data it carries to `out`, and returns how many bytes it
    /// used: all of them, unless the body ended inside `input` (the rest is not the body's).
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, String> {
        let mut i = 0;
        while i < input.len() {
            match self.state {
                State::Done => break,
                State::Size | State::Trailers => {
                    let Some(nl) = input[i..].iter().position(|&b| b == b'\n') else {
                        self.line.extend_from_slice(&input[i..]);
                        self.bound_line()?;
                        i = input.len();
                        break;
                    };
                    self.line.extend_from_slice(&input[i..i + nl]);
                    i += nl + 1;
                    self.bound_line()?;
                    let line = std::mem::take(&mut self.line);
                    let line = line.strip_suffix(b"\r").unwrap_or(&line);
                    self.state = if self.state == State::Size {
                        match parse_size(line)? {
                            0 => State::Trailers,
                            n => State::Data(n),
                        }
                    } else if line.is_empty() {
                        State::Done
                    } else {
                        self.trailers += line.len() + 2;
                        if self.trailers > MAX_TRAILERS {
                            return Err(format!(
                                "chunked trailers larger than {MAX_TRAILERS} bytes"
                            ));
                        }
                        State::Trailers
                    };
                }
                State::Data(left) => {
                    let take = (input.len() - i).min(usize::try_from(left).unwrap_or(usize::MAX));
                    out.extend_from_slice(&input[i..i + take]);
                    i += take;
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        State::DataEnd(0)
                    } else {
                        State::Data(left)
                    };
                }
                State::DataEnd(seen) => {
                    let want = if seen == 0 { b'\r' } else { b'\n' };
                    if input[i] != want {
                        return Err("a chunk's data is not followed by CRLF".into());
                    }
                    i += 1;
                    self.state = if seen == 0 {
                        State::DataEnd(1)
                    } else {
                        State::Size
                    };
                }
            }
        }
        Ok(i)
    }

    fn bound_line(&self) -> Result<(), String> {
        let limit = if self.state == State::Size {
            MAX_SIZE_LINE
        } else {
            MAX_TRAILERS
        };
        if self.line.len() > limit {
            Err(format!("a chunked line longer than {limit} bytes"))
        } else {
            Ok(())
        }
    }
}

fn parse_size(line: &[u8]) -> Result<u64, String> {
    let digits = line.split(|&b| b == b';').next().unwrap_or_default();
    let digits = trim(digits);
    if digits.is_empty() || digits.len() > 15 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err("a bad chunk size".into());
    }
    let text = std::str::from_utf8(digits).map_err(|_| "a bad chunk size".to_owned())?;
    u64::from_str_radix(text, 16).map_err(|_| "a bad chunk size".into())
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|c| !matches!(c, b' ' | b'\t'))
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !matches!(c, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &b[start..end]
}

/// Appends `data` as one chunk (nothing for empty data: an empty chunk ends the body).
pub fn write_chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk, with no trailers.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_in_steps(raw: &[u8], step: usize) -> Result<(Vec<u8>, usize, bool), String> {
        let mut d = Decoder::new();
        let mut out = Vec::new();
        let mut used = 0;
        for piece in raw.chunks(step) {
            let n = d.feed(piece, &mut out)?;
            used += n;
            if n < piece.len() {
                break;
            }
        }
        Ok((out, used, d.done()))
    }

    #[test]
    fn bodies_decode_however_they_are_cut() {
        let raw = b"5;ext=1\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nNEXT";
        for step in 1..raw.len() {
            let (out, used, done) = decode_in_steps(raw, step).unwrap();
            assert_eq!(out, b"hello 0123456789", "step {step}");
            assert!(done, "step {step}");
            assert_eq!(used, raw.len() - 4, "step {step}");
        }
        let mut framed = Vec::new();
        write_chunk(b"abc", &mut framed);
        write_chunk(b"", &mut framed);
        framed.extend_from_slice(LAST_CHUNK);
        let (out, _, done) = decode_in_steps(&framed, 3).unwrap();
        assert_eq!((out.as_slice(), done), (&b"abc"[..], true));
    }

    #[test]
    fn bad_framing_is_refused() {
        for bad in [
            &b"zz\r\n"[..],
            b"5\r\nhelloXX",
            b"fffffffffffffffff\r\n",
            b"\r\n",
        ] {
            assert!(decode_in_steps(bad, 64).is_err(), "{bad:?}");
        }
        let long = vec![b'1'; MAX_SIZE_LINE + 10];
        assert!(decode_in_steps(&long, 7).is_err());
        // A truncated body is not done.
        let (_, _, done) = decode_in_steps(b"5\r\nhel", 64).unwrap();
        assert!(!done);
    }
}
