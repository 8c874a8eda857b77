//! HTTP/1.1 request heads as the gateway sees them: parsed (bounded), checked for credential
//! placeholders, rewritten with secrets in place and `Connection: close`.

use super::policy::Host;
use super::{SecretBinding, SecretValue};

/// The largest request head accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// The most header fields accepted.
const MAX_HEADERS: usize = 128;

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The method.
    pub method: String,
    /// The request target as sent (origin or absolute form).
    pub target: String,
    /// Header fields in order (values as bytes).
    pub headers: Vec<(String, Vec<u8>)>,
    /// Bytes the head took (request line to the empty line, inclusive).
    pub len: usize,
}

/// How the request's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLen {
    /// Exactly this many bytes.
    Fixed(u64),
    /// Chunked: passed on as it comes until the client stops.
    Chunked,
}

impl Head {
    /// The value of the first header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The body framing, or why it is refused.
    pub fn body_len(&self) -> Result<BodyLen, String> {
        let chunked = self
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"));
        let lengths: Vec<&[u8]> = self
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| v.as_slice())
            .collect();
        if chunked {
            if !lengths.is_empty() {
                return Err("both Transfer-Encoding and Content-Length".into());
            }
            return Ok(BodyLen::Chunked);
        }
        match lengths.as_slice() {
            [] => Ok(BodyLen::Fixed(0)),
            [one] => std::str::from_utf8(one)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse().ok())
                .map(BodyLen::Fixed)
                .ok_or_else(|| "bad Content-Length".into()),
            _ => Err("more than one Content-Length".into()),
        }
    }
}

/// Parses a request head from the start of `buf`: `Ok(None)` when more bytes are needed.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => {
            if buf.len() >= MAX_HEAD {
                Err(format!("request head larger than {MAX_HEAD} bytes"))
            } else {
                Ok(None)
            }
        }
        Ok(httparse::Status::Complete(len)) => {
            if len > MAX_HEAD {
                return Err(format!("request head larger than {MAX_HEAD} bytes"));
            }
            if req.version != Some(1) {
                return Err("only HTTP/1.1 requests are forwarded".into());
            }
            Ok(Some(Head {
                method: req.method.unwrap_or_default().to_owned(),
                target: req.path.unwrap_or_default().to_owned(),
                headers: req
                    .headers
                    .iter()
                    .map(|h| (h.name.to_owned(), h.value.to_vec()))
                    .collect(),
                len,
            }))
        }
        Err(e) => Err(format!("malformed request head: {e}")),
    }
}

/// The host, port and origin-form target of an absolute-form request target
/// (`http://host[:port]/path`), for a plain-HTTP forward.
pub fn absolute_target(target: &str) -> Result<(Host, u16, String), String> {
    let rest = target
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map(|_| &target[7..])
        .ok_or_else(|| "the request target is not an absolute http:// URL".to_owned())?;
    let split = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if authority.contains('@') {
        return Err("user information in the request target is not forwarded".into());
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6
            .split_once(']')
            .ok_or_else(|| "bad IPv6 literal in the request target".to_owned())?;
        (h, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None | Some("") => 80,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("bad port {p:?} in the request target"))?,
    };
    let host = Host::parse(host)?;
    let path = match path {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    Ok((host, port, path))
}

/// What the credential scan of a head found.
#[derive(Debug)]
pub enum Scan<'a> {
    /// Placeholders of secrets bound to this host (replace them), possibly none.
    Use(Vec<&'a SecretBinding>),
    /// A placeholder of a secret not bound to this host: refuse.
    Exfiltration(&'a SecretBinding),
}

/// Looks for every binding's placeholder anywhere in `head` (the raw head bytes).
pub fn scan<'a>(head: &[u8], bindings: &'a [SecretBinding], host: &Host, port: u16) -> Scan<'a> {
    let mut used = Vec::new();
    for b in bindings {
        if !contains(head, b.placeholder.as_bytes()) {
            continue;
        }
        if b.hosts.iter().any(|r| r.matches(host, port)) {
            used.push(b);
        } else {
            return Scan::Exfiltration(b);
        }
    }
    Scan::Use(used)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

fn replace_all(input: &[u8], needle: &[u8], value: &[u8], out: &mut Vec<u8>) -> bool {
    let mut i = 0;
    let mut any = false;
    while i < input.len() {
        if input[i..].starts_with(needle) {
            out.extend_from_slice(value);
            i += needle.len();
            any = true;
        } else {
            out.push(input[i]);
            i += 1;
        }
    }
    any
}

/// Headers that describe the client's hop and are not sent on.
const HOP_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "upgrade",
];

/// Writes the head to send upstream: `target` as the request target, the secrets' values in
/// place of their placeholders in the request line and header values, hop-by-hop headers and
/// those named in `drop` left out, `add` and `Connection: close` added. Fails when a value
/// cannot be placed (control bytes in a header value, whitespace in the request line). The
/// result holds secrets: it is a [`SecretValue`] so it is wiped when dropped.
pub fn rewrite(
    head: &Head,
    target: &str,
    secrets: &[(&SecretBinding, SecretValue)],
    drop: &[&str],
    add: &[(&str, &[u8])],
) -> Result<SecretValue, String> {
    let mut out = Vec::with_capacity(head.len + 256);
    let put = |input: &[u8], out: &mut Vec<u8>, in_line: bool| -> Result<(), String> {
        let mut cur: Vec<u8> = input.to_vec();
        for (b, v) in secrets {
            let bad = v
                .as_bytes()
                .iter()
                .any(|&c| c == b'\r' || c == b'\n' || c == 0 || (in_line && c <= b' '));
            let mut next = Vec::with_capacity(cur.len());
            if replace_all(&cur, b.placeholder.as_bytes(), v.as_bytes(), &mut next) && bad {
                wipe(&mut next);
                wipe(&mut cur);
                return Err(format!(
                    "the value of credential {} cannot be placed in {}",
                    b.name,
                    if in_line {
                        "the request line"
                    } else {
                        "a header"
                    }
                ));
            }
            wipe(&mut cur);
            cur = next;
        }
        out.extend_from_slice(&cur);
        wipe(&mut cur);
        Ok(())
    };
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    let r = put(target.as_bytes(), &mut out, true);
    if let Err(e) = r {
        wipe(&mut out);
        return Err(e);
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &head.headers {
        if HOP_HEADERS
            .iter()
            .chain(drop)
            .any(|h| name.eq_ignore_ascii_case(h))
        {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        if let Err(e) = put(value, &mut out, false) {
            wipe(&mut out);
            return Err(e);
        }
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in add {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    Ok(SecretValue::new(out))
}

/// A parsed response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code.
    pub code: u16,
    /// The reason phrase.
    pub reason: String,
    /// Header fields in order (values as bytes).
    pub headers: Vec<(String, Vec<u8>)>,
    /// Bytes the head took.
    pub len: usize,
}

impl ResponseHead {
    /// The values of every header `name` (case-insensitive), in order.
    pub fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// Parses a response head from the start of `buf` (at most [`MAX_HEAD`] bytes): `Ok(None)`
/// when more bytes are needed.
pub fn parse_response_head(buf: &[u8]) -> Result<Option<ResponseHead>, String> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut fields);
    match resp.parse(buf) {
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            Err(format!("response head larger than {MAX_HEAD} bytes"))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD => {
            Err(format!("response head larger than {MAX_HEAD} bytes"))
        }
        Ok(httparse::Status::Complete(len)) => Ok(Some(ResponseHead {
            code: resp.code.unwrap_or(0),
            reason: resp.reason.unwrap_or_default().to_owned(),
            headers: resp
                .headers
                .iter()
                .map(|h| (h.name.to_owned(), h.value.to_vec()))
                .collect(),
            len,
        })),
        Err(e) => Err(format!("malformed response head: {e}")),
    }
}

fn wipe(v: &mut [u8]) {
    SecretValue::wipe(v);
}

/// A complete `text/plain` refusal inside an intercepted tunnel, as the guest proxy writes
/// its own refusals.
pub fn refusal(status: u16, reason: &str) -> Vec<u8> {
    let phrase = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        431 => "Request Header Fields Too Large",
        502 => "Bad Gateway",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    let body = super::handlers::bounded_reason(reason);
    format!(
        "HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain\r\nX-Space-Egress: refused\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(name: &str, n: u8, hosts: &[&str]) -> SecretBinding {
        SecretBinding {
            name: name.into(),
            placeholder: format!("space-secret-{}", format!("{n:x}").repeat(32)),
            hosts: hosts.iter().map(|h| h.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn heads_parse_bounded() {
        let raw = b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
        let h = parse_head(raw).unwrap().unwrap();
        assert_eq!(h.method, "GET");
        assert_eq!(h.target, "/a?b=1");
        assert_eq!(h.len, raw.len() - 5);
        assert_eq!(h.header("host"), Some(&b"x"[..]));
        assert_eq!(h.body_len().unwrap(), BodyLen::Fixed(5));
        for n in 0..h.len {
            assert_eq!(parse_head(&raw[..n]).unwrap(), None, "prefix {n}");
        }
        assert!(parse_head(b"GET / HTTP/1.0\r\n\r\n").is_err());
        assert!(parse_head(b"\x00\x01garbage\r\n\r\n").is_err());
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.extend(std::iter::repeat_n(b'a', MAX_HEAD));
        assert!(parse_head(&big).unwrap_err().contains("larger"));
        let mut many = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..200 {
            many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert!(parse_head(&many).is_err());
        let te = parse_head(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(te.body_len().unwrap(), BodyLen::Chunked);
        for bad in [
            "Content-Length: 1\r\nContent-Length: 2",
            "Content-Length: -1",
            "Content-Length: 1\r\nTransfer-Encoding: chunked",
            "Content-Length: ",
        ] {
            let raw = format!("POST / HTTP/1.1\r\n{bad}\r\n\r\n");
            let h = parse_head(raw.as_bytes()).unwrap().unwrap();
            assert!(h.body_len().is_err(), "{bad}");
        }
    }

    #[test]
    fn absolute_targets() {
        let (h, p, path) = absolute_target("http://Example.com:8080/x?y").unwrap();
        assert_eq!(
            (h.to_string(), p, path.as_str()),
            ("example.com".into(), 8080, "/x?y")
        );
        let (h, p, path) = absolute_target("HTTP://10.0.0.1").unwrap();
        assert_eq!(
            (h.to_string(), p, path.as_str()),
            ("10.0.0.1".into(), 80, "/")
        );
        let (h, p, path) = absolute_target("http://[::1]:81?q").unwrap();
        assert_eq!((h.to_string(), p, path.as_str()), ("::1".into(), 81, "/?q"));
        for bad in [
            "/relative",
            "https://x/",
            "http://u:p@x/",
            "http://x:0/",
            "http://x:99999/",
            "http://bad_host/",
            "http:///",
        ] {
            assert!(absolute_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn placeholders_replaced_in_line_and_values_only() {
        let gh = binding("GITHUB_TOKEN", 1, &["api.github.com"]);
        let other = binding("OTHER", 2, &["*.other.example"]);
        let all = vec![gh.clone(), other.clone()];
        let raw = format!(
            "GET /repos?token={p} HTTP/1.1\r\nHost: api.github.com\r\nAuthorization: Bearer {p}\r\n\
             Connection: keep-alive\r\nProxy-Authorization: x\r\n\r\n",
            p = gh.placeholder
        );
        let head = parse_head(raw.as_bytes()).unwrap().unwrap();
        let host = Host::parse("api.github.com").unwrap();
        let Scan::Use(used) = scan(raw.as_bytes(), &all, &host, 443) else {
            panic!("refused");
        };
        assert_eq!(used.len(), 1);
        let value = SecretValue::new(b"ghp_realvalue".to_vec());
        let out = rewrite(&head, &head.target, &[(used[0], value)], &[], &[]).unwrap();
        let text = String::from_utf8(out.as_bytes().to_vec()).unwrap();
        assert_eq!(
            text,
            "GET /repos?token=ghp_realvalue HTTP/1.1\r\nHost: api.github.com\r\n\
             Authorization: Bearer ghp_realvalue\r\nConnection: close\r\n\r\n"
        );
        assert!(!text.contains(&gh.placeholder));

        // The same placeholder to another host is an exfiltration attempt.
        let evil = Host::parse("evil.example").unwrap();
        match scan(raw.as_bytes(), &all, &evil, 443) {
            Scan::Exfiltration(b) => assert_eq!(b.name, "GITHUB_TOKEN"),
            other => panic!("{other:?}"),
        }
        // A placeholder hidden in a header name still counts for the scan.
        let sneaky = format!("GET / HTTP/1.1\r\nX-{}: 1\r\n\r\n", other.placeholder);
        assert!(matches!(
            scan(sneaky.as_bytes(), &all, &host, 443),
            Scan::Exfiltration(b) if b.name == "OTHER"
        ));
        // No placeholder: nothing used, nothing refused.
        assert!(matches!(
            scan(b"GET / HTTP/1.1\r\n\r\n", &all, &evil, 443),
            Scan::Use(v) if v.is_empty()
        ));
    }

    #[test]
    fn values_that_would_split_the_head_are_refused() {
        let gh = binding("T", 3, &["x"]);
        let raw = format!("GET /{p} HTTP/1.1\r\nA: {p}\r\n\r\n", p = gh.placeholder);
        let head = parse_head(raw.as_bytes()).unwrap().unwrap();
        let err = rewrite(
            &head,
            &head.target,
            &[(&gh, SecretValue::new(b"a\r\nEvil: 1".to_vec()))],
            &[],
            &[],
        )
        .unwrap_err();
        assert!(err.contains("credential T"), "{err}");
        let err = rewrite(
            &head,
            &head.target,
            &[(&gh, SecretValue::new(b"a b".to_vec()))],
            &[],
            &[],
        )
        .unwrap_err();
        assert!(err.contains("request line"), "{err}");
        // In a header only, a space is fine.
        let raw = format!("GET / HTTP/1.1\r\nA: {p}\r\n\r\n", p = gh.placeholder);
        let head = parse_head(raw.as_bytes()).unwrap().unwrap();
        let out = rewrite(
            &head,
            "/",
            &[(&gh, SecretValue::new(b"a b".to_vec()))],
            &["a"],
            &[("B", b"1".as_slice())],
        )
        .unwrap();
        assert!(!out.as_bytes().windows(6).any(|w| w == b"A: a b"));
        assert!(out
            .as_bytes()
            .ends_with(b"B: 1\r\nConnection: close\r\n\r\n"));
        let out = rewrite(
            &head,
            "/",
            &[(&gh, SecretValue::new(b"a b".to_vec()))],
            &[],
            &[],
        )
        .unwrap();
        assert!(out.as_bytes().windows(6).any(|w| w == b"A: a b"));
    }

    #[test]
    fn refusals_are_complete_responses() {
        let r = String::from_utf8(refusal(403, "credential X may not be sent to y")).unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(r.contains("X-Space-Egress: refused"));
        assert!(r.ends_with("\r\n\r\ncredential X may not be sent to y"));
    }
}
