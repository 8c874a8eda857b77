//! A bounded parser of the first bytes of a TLS connection: the ClientHello and its SNI.
//!
//! Input comes from the guest and is hostile: every length is checked against what is there,
//! nothing is allocated beyond [`MAX_HELLO`], and no input makes it panic.

/// The most bytes read while looking for a complete ClientHello.
pub const MAX_HELLO: usize = 16 * 1024;

/// What the bytes seen so far are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A prefix of a ClientHello: read more (up to [`MAX_HELLO`]).
    Incomplete,
    /// Not the start of a TLS connection, or a malformed ClientHello.
    NotTls(&'static str),
    /// A complete ClientHello with its server name (host_name type), if it names one.
    Complete {
        /// The SNI, as sent (ASCII).
        sni: Option<String>,
    },
}

const HANDSHAKE: u8 = 22;
const CLIENT_HELLO: u8 = 1;
const MAX_RECORD: usize = 16384 + 2048;

/// Looks at the first bytes of a connection.
pub fn parse(buf: &[u8]) -> Hello {
    // Reassemble the handshake bytes of the records seen so far.
    let mut hs = Vec::new();
    let mut at = 0;
    loop {
        let Some(header) = buf.get(at..at + 5) else {
            if at < buf.len() && buf[at] != HANDSHAKE {
                return Hello::NotTls("not a TLS handshake record");
            }
            break;
        };
        if header[0] != HANDSHAKE {
            return Hello::NotTls("not a TLS handshake record");
        }
        if header[1] != 3 || header[2] > 4 {
            return Hello::NotTls("not a TLS record version");
        }
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if len == 0 || len > MAX_RECORD {
            return Hello::NotTls("bad TLS record length");
        }
        let Some(body) = buf.get(at + 5..at + 5 + len) else {
            hs.extend_from_slice(&buf[(at + 5).min(buf.len())..]);
            break;
        };
        hs.extend_from_slice(body);
        at += 5 + len;
        if hs.len() >= 4 {
            let need = 4 + u24(&hs[1..4]);
            if hs.len() >= need {
                break;
            }
        }
    }
    if hs.is_empty() {
        return Hello::Incomplete;
    }
    if hs[0] != CLIENT_HELLO {
        return Hello::NotTls("the first handshake message is not a ClientHello");
    }
    if hs.len() < 4 {
        return Hello::Incomplete;
    }
    let len = u24(&hs[1..4]);
    if len > MAX_HELLO {
        return Hello::NotTls("ClientHello too large");
    }
    let Some(body) = hs.get(4..4 + len) else {
        return Hello::Incomplete;
    };
    match client_hello_sni(body) {
        Ok(sni) => Hello::Complete { sni },
        Err(why) => Hello::NotTls(why),
    }
}

fn u24(b: &[u8]) -> usize {
    ((b[0] as usize) << 16) | ((b[1] as usize) << 8) | b[2] as usize
}

/// A cursor that never reads past its end.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], &'static str> {
        if n > self.b.len() {
            return Err("truncated ClientHello");
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }

    fn u8(&mut self) -> Result<usize, &'static str> {
        Ok(self.take(1)?[0] as usize)
    }

    fn u16(&mut self) -> Result<usize, &'static str> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]) as usize)
    }

    fn vec8(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u8()?;
        self.take(n)
    }

    fn vec16(&mut self) -> Result<&'a [u8], &'static str> {
        let n = self.u16()?;
        self.take(n)
    }
}

fn client_hello_sni(body: &[u8]) -> Result<Option<String>, &'static str> {
    let mut r = Reader { b: body };
    let version = r.take(2)?;
    if version[0] != 3 {
        return Err("not a TLS ClientHello version");
    }
    r.take(32)?; // random
    let session = r.vec8()?;
    if session.len() > 32 {
        return Err("bad session id");
    }
    let suites = r.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err("bad cipher suites");
    }
    if r.vec8()?.is_empty() {
        return Err("no compression methods");
    }
    if r.b.is_empty() {
        return Ok(None);
    }
    let mut exts = Reader { b: r.vec16()? };
    if !r.b.is_empty() {
        return Err("trailing bytes after the extensions");
    }
    let mut sni = None;
    let mut seen_sni = false;
    while !exts.b.is_empty() {
        let kind = exts.u16()?;
        let data = exts.vec16()?;
        if kind != 0 {
            continue;
        }
        if seen_sni {
            return Err("two server_name extensions");
        }
        seen_sni = true;
        let mut list = Reader {
            b: Reader { b: data }.vec16()?,
        };
        while !list.b.is_empty() {
            let name_type = list.u8()?;
            let name = list.vec16()?;
            if name_type != 0 {
                continue;
            }
            if sni.is_some() {
                return Err("two host names in server_name");
            }
            if name.is_empty()
                || name.len() > 255
                || !name
                    .iter()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b':'))
            {
                return Err("bad server name");
            }
            sni = Some(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok(sni)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ClientHello record as a client would send it, with `sni` and some other extensions.
    pub(crate) fn client_hello(sni: Option<&str>) -> Vec<u8> {
        let mut exts = Vec::new();
        // supported_versions
        exts.extend_from_slice(&[0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04]);
        if let Some(name) = sni {
            let n = name.as_bytes();
            let mut list = vec![0u8];
            list.extend_from_slice(&(n.len() as u16).to_be_bytes());
            list.extend_from_slice(n);
            let mut ext = (list.len() as u16).to_be_bytes().to_vec();
            ext.extend_from_slice(&list);
            exts.extend_from_slice(&[0x00, 0x00]);
            exts.extend_from_slice(&(ext.len() as u16).to_be_bytes());
            exts.extend_from_slice(&ext);
        }
        // padding-like unknown extension
        exts.extend_from_slice(&[0xff, 0x01, 0x00, 0x04, 1, 2, 3, 4]);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(32);
        body.extend_from_slice(&[9u8; 32]);
        body.extend_from_slice(&[0, 4, 0x13, 0x01, 0x13, 0x02]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![CLIENT_HELLO];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        let mut rec = vec![HANDSHAKE, 3, 1];
        rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        rec.extend_from_slice(&hs);
        rec
    }

    #[test]
    fn finds_the_server_name() {
        let rec = client_hello(Some("Example.COM"));
        assert_eq!(
            parse(&rec),
            Hello::Complete {
                sni: Some("Example.COM".into())
            }
        );
        assert_eq!(parse(&client_hello(None)), Hello::Complete { sni: None });
        // Trailing application bytes after the hello do not matter.
        let mut more = rec.clone();
        more.extend_from_slice(b"\x17\x03\x03\x00\x01x");
        assert!(matches!(parse(&more), Hello::Complete { .. }));
    }

    #[test]
    fn every_prefix_is_incomplete() {
        let rec = client_hello(Some("api.github.com"));
        for n in 0..rec.len() {
            assert_eq!(parse(&rec[..n]), Hello::Incomplete, "prefix {n}");
        }
    }

    #[test]
    fn fragmented_across_records() {
        let rec = client_hello(Some("a.example"));
        let hs = &rec[5..];
        let (a, b) = hs.split_at(10);
        let mut two = Vec::new();
        for part in [a, b] {
            two.extend_from_slice(&[HANDSHAKE, 3, 3]);
            two.extend_from_slice(&(part.len() as u16).to_be_bytes());
            two.extend_from_slice(part);
        }
        assert_eq!(
            parse(&two),
            Hello::Complete {
                sni: Some("a.example".into())
            }
        );
        for n in 0..two.len() {
            assert_eq!(parse(&two[..n]), Hello::Incomplete, "prefix {n}");
        }
    }

    #[test]
    fn not_tls() {
        for garbage in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"SSH-2.0-OpenSSH_9.0\r\n",
            b"\x16\x02\x00\x00\x05hello",
            b"\x16\x03\x03\x00\x00",
            b"\x16\x03\x03\xff\xff",
            b"\x17\x03\x03\x00\x05hello",
            b"\x16\x03\x03\x00\x04\x02\x00\x00\x00",
        ] {
            assert!(
                matches!(parse(garbage), Hello::NotTls(_)),
                "{garbage:?}: {:?}",
                parse(garbage)
            );
        }
    }

    #[test]
    fn hostile_lengths_and_mutations_never_panic() {
        let rec = client_hello(Some("x.example.org"));
        // Flip every byte to a few values: the parser answers something, never panics, and
        // never claims a different complete name than one that is in the bytes.
        for i in 0..rec.len() {
            for v in [0u8, 1, 0x7f, 0xff, rec[i].wrapping_add(1)] {
                let mut m = rec.clone();
                m[i] = v;
                if let Hello::Complete { sni: Some(s) } = parse(&m) {
                    assert!(s.len() <= 255);
                }
            }
        }
        // Truncated records with every cut and a pseudo-random fill.
        let mut seed = 0x1234_5678u32;
        for len in 0..600 {
            let mut m = vec![HANDSHAKE, 3, 3, (len >> 8) as u8, len as u8];
            for _ in 0..len {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                m.push((seed >> 16) as u8);
            }
            let _ = parse(&m);
            if len > 4 {
                m[5] = CLIENT_HELLO;
                let _ = parse(&m);
            }
        }
        // A handshake length claiming more than the bound.
        let big = [HANDSHAKE, 3, 3, 0, 4, CLIENT_HELLO, 0xff, 0xff, 0xff];
        assert!(matches!(parse(&big), Hello::NotTls(_)));
        // Two host names.
        let mut two = client_hello(Some("a.b"));
        let pos = two.windows(3).position(|w| w == b"a.b").unwrap();
        two[pos] = b'%';
        assert!(matches!(parse(&two), Hello::NotTls(_)));
    }
}
