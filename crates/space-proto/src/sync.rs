//! The synchronisation line that opens the egress channel (`docs/protocol.md`, *Egress*):
//! the guest writes `SPACE-EGRESS/1 <32 hex digits>\n` with a fresh token, the host looks for
//! a line of that form in what arrives (a port may still hold bytes of an earlier connection)
//! and echoes it, and the guest looks for its own line in what comes back. Both ends scan
//! with [`SyncScanner`]; whatever precedes the line is discarded, at most
//! [`EGRESS_MAX_DISCARD`] bytes of it.

use bytes::{Buf, BytesMut};

use crate::limits::{EGRESS_MAX_DISCARD, EGRESS_SYNC_PREFIX, EGRESS_SYNC_TOKEN_HEX};

/// The length of a synchronisation line, `\n` included.
pub const SYNC_LINE_LEN: usize = EGRESS_SYNC_PREFIX.len() + EGRESS_SYNC_TOKEN_HEX + 1;

/// The synchronisation line for `token`.
pub fn sync_line(token: &[u8; 16]) -> Vec<u8> {
    let mut line = EGRESS_SYNC_PREFIX.to_vec();
    for b in token {
        line.extend_from_slice(format!("{b:02x}").as_bytes());
    }
    line.push(b'\n');
    line
}

/// More than [`EGRESS_MAX_DISCARD`] bytes came before the line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("more than {EGRESS_MAX_DISCARD} bytes arrived before the synchronisation line")]
pub struct TooMuchNoise;

/// What a [`SyncScanner`] looks for.
#[derive(Debug)]
enum Want {
    /// This very line (the guest, waiting for its own token's echo).
    Exact(Vec<u8>),
    /// Any well-formed line (the host, which learns the token from it).
    AnyToken,
}

/// Finds the synchronisation line in a byte stream fed in any pieces, discarding (bounded)
/// what comes before it.
#[derive(Debug)]
pub struct SyncScanner {
    want: Want,
    window: BytesMut,
    discarded: usize,
}

impl SyncScanner {
    /// A scanner for exactly `line` (made by [`sync_line`]).
    pub fn exact(line: Vec<u8>) -> SyncScanner {
        SyncScanner {
            want: Want::Exact(line),
            window: BytesMut::new(),
            discarded: 0,
        }
    }

    /// A scanner for any well-formed line.
    pub fn any_token() -> SyncScanner {
        SyncScanner {
            want: Want::AnyToken,
            window: BytesMut::new(),
            discarded: 0,
        }
    }

    fn line_len(&self) -> usize {
        match &self.want {
            Want::Exact(line) => line.len(),
            Want::AnyToken => SYNC_LINE_LEN,
        }
    }

    fn matches(&self, w: &[u8]) -> bool {
        match &self.want {
            Want::Exact(line) => w == line.as_slice(),
            Want::AnyToken => {
                w.starts_with(EGRESS_SYNC_PREFIX)
                    && w[EGRESS_SYNC_PREFIX.len()..SYNC_LINE_LEN - 1]
                        .iter()
                        .all(u8::is_ascii_hexdigit)
                    && w[SYNC_LINE_LEN - 1] == b'\n'
            }
        }
    }

    /// Feeds bytes. `Ok(Some((line, rest)))` once the line was seen: the line itself and the
    /// bytes after it (the start of the next protocol).
    pub fn push(&mut self, data: &[u8]) -> Result<Option<(Vec<u8>, BytesMut)>, TooMuchNoise> {
        self.window.extend_from_slice(data);
        let len = self.line_len();
        if len == 0 {
            return Ok(Some((Vec::new(), self.window.split())));
        }
        if let Some(pos) = self.window.windows(len).position(|w| self.matches(w)) {
            self.discarded += pos;
            if self.discarded > EGRESS_MAX_DISCARD {
                return Err(TooMuchNoise);
            }
            let rest = self.window.split_off(pos + len);
            let line = self.window[pos..].to_vec();
            return Ok(Some((line, rest)));
        }
        // Only a tail shorter than the line can still be the start of it.
        let keep = len - 1;
        if self.window.len() > keep {
            let drop = self.window.len() - keep;
            self.window.advance(drop);
            self.discarded += drop;
        }
        if self.discarded > EGRESS_MAX_DISCARD {
            return Err(TooMuchNoise);
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line() -> Vec<u8> {
        sync_line(&[0xab; 16])
    }

    #[test]
    fn line_format() {
        let l = line();
        assert_eq!(l.len(), SYNC_LINE_LEN);
        assert!(l.starts_with(b"SPACE-EGRESS/1 abab"));
        assert_eq!(*l.last().unwrap(), b'\n');
    }

    fn stream() -> Vec<u8> {
        let mut input = b"stale bytes of an old connection\x00\xff".to_vec();
        input.extend_from_slice(b"SPACE-EGRESS/1 not-hex-at-all-but-32-bytes-long!\n");
        input.extend_from_slice(&sync_line(&[0x11; 16])); // another token's line
        input.extend_from_slice(&line());
        input.extend_from_slice(b"h2 frames");
        input
    }

    /// Byte by byte (the line may straddle any read), then all at once.
    fn scan(make: impl Fn() -> SyncScanner) -> ((Vec<u8>, BytesMut), (Vec<u8>, BytesMut)) {
        let input = stream();
        let mut s = make();
        let mut found = None;
        for b in &input {
            if let Some(got) = s.push(std::slice::from_ref(b)).unwrap() {
                found = Some(got);
                break;
            }
        }
        (found.unwrap(), make().push(&input).unwrap().unwrap())
    }

    #[test]
    fn the_exact_line_is_found_past_stale_bytes_and_other_lines() {
        let (bytewise, whole) = scan(|| SyncScanner::exact(line()));
        assert_eq!(bytewise, (line(), BytesMut::new()));
        assert_eq!(whole, (line(), BytesMut::from(&b"h2 frames"[..])));
    }

    #[test]
    fn any_token_takes_the_first_well_formed_line() {
        let (bytewise, whole) = scan(SyncScanner::any_token);
        let first = sync_line(&[0x11; 16]);
        assert_eq!(bytewise, (first.clone(), BytesMut::new()));
        let mut rest = line();
        rest.extend_from_slice(b"h2 frames");
        assert_eq!(whole, (first, BytesMut::from(&rest[..])));
    }

    #[test]
    fn scanning_gives_up_after_the_bound() {
        for make in [|| SyncScanner::exact(line()), SyncScanner::any_token] {
            let mut s = make();
            let junk = vec![b'x'; 64 * 1024];
            let mut result = Ok(None);
            for _ in 0..=(EGRESS_MAX_DISCARD / junk.len()) {
                result = s.push(&junk);
                if result.is_err() {
                    break;
                }
            }
            assert_eq!(result, Err(TooMuchNoise));
            // Just under the bound still succeeds.
            let mut s = make();
            let mut input = vec![b'y'; EGRESS_MAX_DISCARD - 1];
            input.extend_from_slice(&line());
            assert!(s.push(&input).unwrap().is_some());
        }
    }
}
