//! One request and its response through the gateway when the sandbox has credentials or a
//! header rule names the host: inside an intercepted TLS tunnel, or as a plain-HTTP forward.
//!
//! The policy's header rules for the host are set on the request first, their secrets put in
//! (`inject`); those values are scrubbed from the response like bound ones.
//!
//! The request: its head and body are searched for every bound secret's placeholder; one
//! bound elsewhere refuses the request (`403`, `credential.exfiltration`). A body of at most
//! [`MAX_SCANNED_BODY`] bytes (after chunked decoding) is read whole; the values go in place
//! of their placeholders, encoded for its `Content-Type` (`substitute`), and it leaves with a
//! new `Content-Length`. A longer body streams through unchanged, still searched (across
//! reads); a placeholder in it ends the request, since its value cannot be put in without
//! holding the whole body.
//!
//! The response of a host any secret is bound to comes back with those secrets' values, in
//! each form they may be echoed in, turned into their placeholders again: in header values
//! and in the body, which is de-chunked and decompressed (`gzip`, `deflate`; upstream is asked
//! for only these) and goes to the guest chunked. An encoding the gateway cannot read is
//! refused, never passed on unscrubbed.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use memchr::memmem;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::chunked;
use super::handlers::event;
use super::http1::{self, BodyLen, Head};
use super::policy::Host;
use super::streams::CHUNK;
use super::substitute::{self, BodyKind, Scratch, Scrubber};
use super::{SandboxGateway, SecretBinding, SecretValue};
use space_node_api::headers::Part;

/// The largest request body (after chunked decoding) read whole, searched and given values;
/// longer ones stream through. Bounds the memory of a connection of a sandbox with
/// credentials; a login form or a token request is far smaller.
pub const MAX_SCANNED_BODY: usize = 256 * 1024;
/// What upstream is asked to encode responses in when they are scrubbed.
const ACCEPTED_ENCODINGS: &str = "gzip, deflate";
/// Bytes read from upstream at a time while scrubbing a response.
const RELAY_CHUNK: usize = 64 * 1024;
/// The most bytes a decompressor takes at once (a step's output stays bounded).
const INFLATE_STEP: usize = 1024;

/// A refusal: status and text.
pub(super) type Refuse = (u16, String);

/// The request body as read.
enum ReadBody {
    /// All of it (decoded), at most [`MAX_SCANNED_BODY`] bytes.
    Whole(Vec<u8>),
    /// Too long: the raw bytes read so far, and the framing of the rest.
    Streamed { prefix: Vec<u8>, rest: Rest },
}

/// What is left of a streamed body.
#[derive(Clone, Copy)]
enum Rest {
    /// This many bytes.
    Fixed(u64),
    /// Chunked, as it comes until the guest stops.
    Chunked,
}

/// The secrets bound to this host, with their values.
struct Bound<'a> {
    values: Vec<(&'a SecretBinding, SecretValue)>,
}

/// Runs one exchange: reads the request from `guest`, checks and completes it, connects
/// with `connect`, sends it, and relays the response (scrubbed when secrets are bound to the
/// host). `target` turns the head into the request target to send. Refusals are written to
/// the guest as responses.
pub(super) async fn exchange<G, U, C, T>(
    sb: &SandboxGateway,
    host: &Host,
    port: u16,
    guest: G,
    target: T,
    connect: C,
) where
    G: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
    C: std::future::Future<Output = Result<U, Refuse>>,
    T: FnOnce(&Head) -> Result<String, Refuse>,
{
    let (mut gr, mut gw) = tokio::io::split(guest);
    let mut buf = Vec::new();
    let head = match read_head(&mut gr, &mut buf).await {
        Ok(Some(h)) => h,
        Ok(None) => return,
        Err(r) => return refuse(&mut gw, r).await,
    };
    let prepared = match prepare(sb, host, port, &mut gr, &mut gw, buf, &head, target).await {
        Ok(p) => p,
        Err(r) => return refuse(&mut gw, r).await,
    };
    let upstream = match connect.await {
        Ok(u) => u,
        Err(r) => return refuse(&mut gw, r).await,
    };
    let (mut ur, mut uw) = tokio::io::split(upstream);
    if uw.write_all(prepared.out.as_bytes()).await.is_err() {
        return;
    }
    drop(prepared.out);
    for name in &prepared.used {
        event(
            sb,
            "credential.use",
            host,
            port,
            format!("secret={name} host={host}"),
        );
    }
    let mut scrubber = prepared.scrubber;
    let started = AtomicBool::new(false);
    let response = async {
        if scrubber.is_empty() {
            let mut chunk = vec![0u8; CHUNK];
            loop {
                let n = match ur.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                started.store(true, Ordering::Relaxed);
                if gw.write_all(&chunk[..n]).await.is_err() {
                    break;
                }
            }
            let _ = gw.shutdown().await;
            return None;
        }
        match relay_scrubbed(
            &mut ur,
            &mut gw,
            &mut scrubber,
            prepared.head_only,
            &started,
        )
        .await
        {
            Ok(()) => {
                let _ = gw.shutdown().await;
                None
            }
            Err(Some(r)) => Some(r),
            // Cut mid-body: no clean end, so the guest sees the response is incomplete.
            Err(None) => None,
        }
    };
    let body = async {
        match prepared.rest {
            None => std::future::pending().await,
            Some(rest) => send_rest(sb, host, port, &mut gr, &mut uw, rest).await,
        }
    };
    let refusal = tokio::select! {
        r = response => r,
        r = body => r.err(),
    };
    if let Some(r) = refusal {
        if !started.load(Ordering::Relaxed) {
            let _ = gw.write_all(&http1::refusal(r.0, &r.1)).await;
            let _ = gw.shutdown().await;
        }
    }
}

async fn refuse<W: AsyncWrite + Unpin>(w: &mut W, (status, reason): Refuse) {
    let _ = w.write_all(&http1::refusal(status, &reason)).await;
    let _ = w.shutdown().await;
}

/// Reads one request head into `buf` (bounded); `None` when the guest sent nothing.
pub(super) async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
) -> Result<Option<Head>, Refuse> {
    let mut chunk = vec![0u8; CHUNK];
    loop {
        match http1::parse_head(buf) {
            Ok(Some(h)) => return Ok(Some(h)),
            Ok(None) => {}
            Err(e) if e.contains("larger") => return Err((431, e)),
            Err(e) => return Err((400, e)),
        }
        let room = http1::MAX_HEAD - buf.len().min(http1::MAX_HEAD) + 1;
        let n = match r.read(&mut chunk[..room.min(CHUNK)]).await {
            Ok(0) | Err(_) => return Ok(None),
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// What goes upstream.
struct Prepared {
    /// The head and (whole) body, values in place.
    out: SecretValue,
    /// The secrets put in.
    used: Vec<String>,
    /// The body past the scan bound, still to stream.
    rest: Option<Rest>,
    /// For the response.
    scrubber: Scrubber,
    /// A `HEAD` request: the response has no body.
    head_only: bool,
}

/// The first binding whose placeholder is in `bytes` and that may not go to `host`, audited.
pub(super) fn exfiltration(
    sb: &SandboxGateway,
    host: &Host,
    port: u16,
    bytes: &[u8],
) -> Result<(), Refuse> {
    match http1::scan(bytes, &sb.bindings, host, port) {
        http1::Scan::Use(_) => Ok(()),
        http1::Scan::Exfiltration(b) => {
            event(
                sb,
                "credential.exfiltration",
                host,
                port,
                format!("secret={} host={host}", b.name),
            );
            Err((
                403,
                format!("credential {} may not be sent to {host}", b.name),
            ))
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn prepare<R, W, T>(
    sb: &SandboxGateway,
    host: &Host,
    port: u16,
    gr: &mut R,
    gw: &mut W,
    mut buf: Vec<u8>,
    head: &Head,
    target: T,
) -> Result<Prepared, Refuse>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
    T: FnOnce(&Head) -> Result<String, Refuse>,
{
    let target = target(head)?;
    exfiltration(sb, host, port, &buf[..head.len])?;
    let framing = head.body_len().map_err(|e| (400, e))?;
    let has_body = head.header("content-length").is_some() || framing == BodyLen::Chunked;
    let expects = head
        .header("expect")
        .is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"));
    if expects && framing != BodyLen::Fixed(0) {
        // The gateway reads the body before upstream is reached: it says continue itself.
        let _ = gw.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await;
    }
    let leftover = buf.split_off(head.len);
    let body = read_body(gr, leftover, framing).await?;
    match &body {
        ReadBody::Whole(b) => exfiltration(sb, host, port, b)?,
        ReadBody::Streamed { prefix, .. } => exfiltration(sb, host, port, prefix)?,
    }
    let bound = values(sb, host, port).await;
    let injected = inject(sb, host, port).await?;
    let in_head: Vec<(&SecretBinding, SecretValue)> = bound
        .values
        .iter()
        .filter(|(b, _)| memmem::find(&buf[..head.len], b.placeholder.as_bytes()).is_some())
        .map(|(b, v)| (*b, SecretValue::new(v.as_bytes().to_vec())))
        .collect();
    let mut used: Vec<String> = in_head.iter().map(|(b, _)| b.name.clone()).collect();
    for (name, _) in injected.secrets.iter() {
        if !used.contains(name) {
            used.push(name.clone());
        }
    }
    let mut left_out: Vec<&str> = vec!["expect"];
    left_out.extend(injected.headers.iter().map(|(n, _)| n.as_str()));
    let mut add: Vec<(&str, &[u8])> = injected
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect();
    if !bound.values.is_empty() || !injected.secrets.is_empty() {
        left_out.push("accept-encoding");
        add.push(("Accept-Encoding", ACCEPTED_ENCODINGS.as_bytes()));
    }
    let content_length;
    let (body_out, rest) = match body {
        ReadBody::Whole(raw) => {
            let kind = BodyKind::of(head.header("content-type"));
            let (out, in_body) =
                substitute::substitute(&raw, kind, &bound.values).map_err(|e| (502, e))?;
            drop_wiped(raw);
            for n in in_body {
                if !used.contains(&n) {
                    used.push(n);
                }
            }
            if has_body {
                left_out.extend(["content-length", "transfer-encoding"]);
                content_length = out.as_bytes().len().to_string();
                add.push(("Content-Length", content_length.as_bytes()));
            }
            (out, None)
        }
        ReadBody::Streamed { prefix, rest } => {
            if let Some((b, _)) = bound
                .values
                .iter()
                .find(|(b, _)| memmem::find(&prefix, b.placeholder.as_bytes()).is_some())
            {
                return Err(too_long(&b.name));
            }
            (SecretValue::new(prefix), Some(rest))
        }
    };
    let head_out =
        http1::rewrite(head, &target, &in_head, &left_out, &add).map_err(|e| (502, e))?;
    let mut out = Vec::with_capacity(head_out.as_bytes().len() + body_out.as_bytes().len());
    out.extend_from_slice(head_out.as_bytes());
    out.extend_from_slice(body_out.as_bytes());
    // One-time codes are put in but not looked for: short, common as text, spent once used.
    let references: Vec<String> = injected
        .secrets
        .iter()
        .map(|(name, _)| format!("${{secret:{name}}}"))
        .collect();
    let scrubber = Scrubber::new(
        bound
            .values
            .iter()
            .filter(|(_, v)| !v.is_one_time())
            .map(|(b, v)| (b.placeholder.as_str(), v.as_bytes()))
            .chain(
                injected
                    .secrets
                    .iter()
                    .zip(&references)
                    .filter(|((_, v), _)| !v.is_one_time())
                    .map(|((_, v), r)| (r.as_str(), v.as_bytes())),
            ),
    );
    drop_wiped(buf);
    Ok(Prepared {
        out: SecretValue::new(out),
        used,
        rest,
        scrubber,
        head_only: head.method.eq_ignore_ascii_case("HEAD"),
    })
}

fn drop_wiped(mut v: Vec<u8>) {
    SecretValue::wipe(&mut v);
}

fn too_long(name: &str) -> Refuse {
    (
        413,
        format!(
            "credential {name} is in a request body longer than {MAX_SCANNED_BODY} bytes; \
             placeholders are replaced only in bodies up to that size"
        ),
    )
}

/// The values of the secrets bound to this host (those that could be sent there, so those
/// a response from there could echo).
async fn values<'a>(sb: &'a SandboxGateway, host: &Host, port: u16) -> Bound<'a> {
    let mut values = Vec::new();
    if let Some(source) = &sb.gateway.config.secrets {
        for b in sb.bindings.iter() {
            if !b.hosts.iter().any(|r| r.matches(host, port)) {
                continue;
            }
            if let Some(v) = source.value(&sb.id, &b.name).await {
                values.push((b, v));
            }
        }
    }
    Bound { values }
}

/// What the sandbox's header rules add to a request to this host.
struct Injected {
    /// (name, value with secrets in), one per name; a later rule for a name wins.
    headers: Vec<(String, SecretValue)>,
    /// The secrets put in, with their values (for the audit and the response's scrubber).
    secrets: Vec<(String, SecretValue)>,
}

/// The headers the policy's rules set on a request to `host:port`, secrets in place; a rule
/// naming a secret the vault no longer has refuses the request (`502`).
async fn inject(sb: &SandboxGateway, host: &Host, port: u16) -> Result<Injected, Refuse> {
    let policy = sb.policy();
    let mut injected = Injected {
        headers: Vec::new(),
        secrets: Vec::new(),
    };
    for rule in policy.headers_for(host, port) {
        let mut value = Vec::with_capacity(rule.value.len());
        for part in rule.parts() {
            match part {
                Part::Text(t) => value.extend_from_slice(t.as_bytes()),
                Part::Secret(name) => {
                    let known = injected.secrets.iter().find(|(n, _)| n == name);
                    let v = match known {
                        Some((_, v)) => SecretValue::new(v.as_bytes().to_vec()),
                        None => {
                            let found = match &sb.gateway.config.secrets {
                                Some(source) => source.value(&sb.id, name).await,
                                None => None,
                            };
                            let Some(v) = found else {
                                drop_wiped(value);
                                return Err((
                                    502,
                                    format!(
                                        "header {} for {host} names credential {name}, which \
                                         the vault does not hold",
                                        rule.name
                                    ),
                                ));
                            };
                            let copy = SecretValue::new(v.as_bytes().to_vec());
                            injected.secrets.push((name.to_owned(), v));
                            copy
                        }
                    };
                    if v.as_bytes()
                        .iter()
                        .any(|&c| c == b'\r' || c == b'\n' || c == 0)
                    {
                        drop_wiped(value);
                        return Err((
                            502,
                            format!("the value of credential {name} cannot be placed in a header"),
                        ));
                    }
                    value.extend_from_slice(v.as_bytes());
                }
            }
        }
        let value = SecretValue::new(value);
        match injected
            .headers
            .iter_mut()
            .find(|(n, _)| n.eq_ignore_ascii_case(&rule.name))
        {
            Some(slot) => *slot = (rule.name.clone(), value),
            None => injected.headers.push((rule.name.clone(), value)),
        }
    }
    Ok(injected)
}

/// Reads the request body: whole when it fits [`MAX_SCANNED_BODY`], else what was read so
/// far and the framing of the rest.
async fn read_body<R: AsyncRead + Unpin>(
    r: &mut R,
    mut raw: Vec<u8>,
    framing: BodyLen,
) -> Result<ReadBody, Refuse> {
    let mut chunk = vec![0u8; CHUNK];
    match framing {
        BodyLen::Fixed(n) => {
            if n > MAX_SCANNED_BODY as u64 {
                raw.truncate(usize::try_from(n).unwrap_or(usize::MAX).min(raw.len()));
                let rest = n - raw.len() as u64;
                return Ok(ReadBody::Streamed {
                    prefix: raw,
                    rest: Rest::Fixed(rest),
                });
            }
            let n = n as usize;
            while raw.len() < n {
                let want = (n - raw.len()).min(CHUNK);
                match r.read(&mut chunk[..want]).await {
                    Ok(0) | Err(_) => return Err((400, "the request body ended early".into())),
                    Ok(k) => raw.extend_from_slice(&chunk[..k]),
                }
            }
            raw.truncate(n);
            Ok(ReadBody::Whole(raw))
        }
        BodyLen::Chunked => {
            let mut decoder = chunked::Decoder::new();
            let mut decoded = Vec::new();
            let mut fed = 0;
            loop {
                fed += decoder
                    .feed(&raw[fed..], &mut decoded)
                    .map_err(|e| (400, e))?;
                if decoder.done() {
                    drop_wiped(raw);
                    return Ok(ReadBody::Whole(decoded));
                }
                if decoded.len() > MAX_SCANNED_BODY {
                    drop_wiped(decoded);
                    return Ok(ReadBody::Streamed {
                        prefix: raw,
                        rest: Rest::Chunked,
                    });
                }
                match r.read(&mut chunk).await {
                    Ok(0) | Err(_) => return Err((400, "the request body ended early".into())),
                    Ok(k) => raw.extend_from_slice(&chunk[..k]),
                }
            }
        }
    }
}

/// Streams the rest of a long body, searching it (across reads) for placeholders: any one
/// ends the request (refused as an exfiltration when the secret is not bound here).
async fn send_rest<R, W>(
    sb: &SandboxGateway,
    host: &Host,
    port: u16,
    r: &mut R,
    w: &mut W,
    rest: Rest,
) -> Result<(), Refuse>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut left = match rest {
        Rest::Fixed(n) => Some(n),
        Rest::Chunked => None,
    };
    let keep = sb
        .bindings
        .iter()
        .map(|b| b.placeholder.len())
        .max()
        .unwrap_or(1)
        - 1;
    let mut tail: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let want = match left {
            Some(0) => break,
            Some(n) => usize::try_from(n).unwrap_or(CHUNK).min(CHUNK),
            None => CHUNK,
        };
        let n = match r.read(&mut chunk[..want]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        tail.extend_from_slice(&chunk[..n]);
        if let Some(b) = sb
            .bindings
            .iter()
            .find(|b| memmem::find(&tail, b.placeholder.as_bytes()).is_some())
        {
            exfiltration(sb, host, port, &tail)?;
            return Err(too_long(&b.name));
        }
        let cut = tail.len().saturating_sub(keep);
        tail.drain(..cut);
        if w.write_all(&chunk[..n]).await.is_err() {
            break;
        }
        if let Some(l) = left.as_mut() {
            *l -= n as u64;
        }
    }
    // Only the response ends the exchange.
    std::future::pending().await
}

/// How a response body is framed.
enum Framing {
    None,
    Fixed(u64),
    Chunked(chunked::Decoder),
    Close,
}

/// A decompressor.
enum Inflate {
    Identity,
    Gzip(flate2::write::GzDecoder<Vec<u8>>),
    Zlib(flate2::write::ZlibDecoder<Vec<u8>>),
    Deflate(flate2::write::DeflateDecoder<Vec<u8>>),
    /// `deflate` before its first byte shows zlib's header or raw deflate.
    DeflateUnknown,
}

impl Inflate {
    fn push(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        if let Inflate::DeflateUnknown = self {
            let Some(&first) = input.first() else {
                return Ok(());
            };
            // zlib's first byte names method 8 (deflate) in its low bits.
            *self = if first & 0x0f == 8 {
                Inflate::Zlib(flate2::write::ZlibDecoder::new(Vec::new()))
            } else {
                Inflate::Deflate(flate2::write::DeflateDecoder::new(Vec::new()))
            };
        }
        while !input.is_empty() {
            let step = input.len().min(INFLATE_STEP);
            let (now, later) = input.split_at(step);
            let bad = |e: std::io::Error| format!("the response does not decompress: {e}");
            match self {
                Inflate::Identity => out.extend_from_slice(now),
                Inflate::Gzip(d) => {
                    d.write_all(now).map_err(bad)?;
                    out.append(d.get_mut());
                }
                Inflate::Zlib(d) => {
                    d.write_all(now).map_err(bad)?;
                    out.append(d.get_mut());
                }
                Inflate::Deflate(d) => {
                    d.write_all(now).map_err(bad)?;
                    out.append(d.get_mut());
                }
                Inflate::DeflateUnknown => {}
            }
            input = later;
        }
        Ok(())
    }

    fn finish(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        let bad = |e: std::io::Error| format!("the response's compressed body is cut: {e}");
        match self {
            Inflate::Identity | Inflate::DeflateUnknown => {}
            Inflate::Gzip(d) => {
                d.try_finish().map_err(bad)?;
                out.append(d.get_mut());
            }
            Inflate::Zlib(d) => {
                d.try_finish().map_err(bad)?;
                out.append(d.get_mut());
            }
            Inflate::Deflate(d) => {
                d.try_finish().map_err(bad)?;
                out.append(d.get_mut());
            }
        }
        Ok(())
    }
}

/// The decoder for a `Content-Encoding`, or why there is none.
fn inflate_for(head: &http1::ResponseHead) -> Result<Inflate, String> {
    let mut codings = Vec::new();
    for v in head.all("content-encoding") {
        for c in String::from_utf8_lossy(v).split(',') {
            let c = c.trim().to_ascii_lowercase();
            if !c.is_empty() && c != "identity" {
                codings.push(c);
            }
        }
    }
    match codings.as_slice() {
        [] => Ok(Inflate::Identity),
        [one] if one == "gzip" || one == "x-gzip" => {
            Ok(Inflate::Gzip(flate2::write::GzDecoder::new(Vec::new())))
        }
        [one] if one == "deflate" => Ok(Inflate::DeflateUnknown),
        _ => Err(codings.join(", ")),
    }
}

/// Headers of the upstream response not passed on when its body is re-framed.
const REFRAMED: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "content-encoding",
    "content-md5",
    "digest",
    "repr-digest",
    "content-digest",
];

/// Relays one response from `up` to `guest`, values scrubbed. `Err(Some)`: refused before
/// anything was sent; `Err(None)`: cut after the head was sent.
async fn relay_scrubbed<U, G>(
    up: &mut U,
    guest: &mut G,
    scrubber: &mut Scrubber,
    head_only: bool,
    started: &AtomicBool,
) -> Result<(), Option<Refuse>>
where
    U: AsyncRead + Unpin,
    G: AsyncWrite + Unpin,
{
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = Scratch(vec![0u8; RELAY_CHUNK]);
    let head = loop {
        match http1::parse_response_head(&buf) {
            Ok(Some(h)) if (100..200).contains(&h.code) && h.code != 101 => {
                let out = response_head(&h, scrubber, false, true);
                buf.drain(..h.len);
                started.store(true, Ordering::Relaxed);
                guest.write_all(&out).await.map_err(|_| None)?;
                continue;
            }
            Ok(Some(h)) => break h,
            Ok(None) => {}
            Err(e) => return Err(Some((502, e))),
        }
        match up.read(&mut chunk).await {
            Ok(0) | Err(_) => {
                let none = started.load(Ordering::Relaxed);
                return Err((!none).then(|| (502, "upstream closed without a response".into())));
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let no_body = head_only || head.code == 204 || head.code == 304;
    let framing = if no_body {
        Framing::None
    } else if head.all("transfer-encoding").any(|v| {
        String::from_utf8_lossy(v)
            .to_ascii_lowercase()
            .contains("chunked")
    }) {
        Framing::Chunked(chunked::Decoder::new())
    } else if let Some(v) = head.all("content-length").next() {
        let n = std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| Some((502, "upstream sent a bad Content-Length".to_owned())))?;
        Framing::Fixed(n)
    } else {
        Framing::Close
    };
    let mut inflate = if no_body {
        Inflate::Identity
    } else {
        inflate_for(&head).map_err(|c| {
            Some((
                502,
                format!(
                    "the response is encoded as {c}, which the gateway cannot search for \
                     credential values"
                ),
            ))
        })?
    };
    let decoded = !matches!(inflate, Inflate::Identity);
    let out = response_head(&head, scrubber, decoded, !no_body);
    started.store(true, Ordering::Relaxed);
    guest.write_all(&out).await.map_err(|_| None)?;
    if no_body {
        return Ok(());
    }
    // The response may hold values until scrubbed: its buffers are reused and wiped once,
    // when they drop (on every way out of here).
    let mut pending = Scratch(buf.split_off(head.len));
    drop(Scratch(buf));
    let mut framing = framing;
    let identity = matches!(inflate, Inflate::Identity);
    let (mut body, mut plain, mut scrubbed) =
        (Scratch::default(), Scratch::default(), Scratch::default());
    let mut framed = Scratch::default();
    loop {
        // Unframe what was read.
        let complete = match &mut framing {
            Framing::Fixed(left) => {
                let take = pending
                    .len()
                    .min(usize::try_from(*left).unwrap_or(usize::MAX));
                body.extend_from_slice(&pending[..take]);
                *left -= take as u64;
                *left == 0
            }
            Framing::Chunked(d) => {
                d.feed(&pending, &mut body).map_err(|_| None)?;
                d.done()
            }
            Framing::Close | Framing::None => {
                body.extend_from_slice(&pending);
                false
            }
        };
        pending.clear();
        if identity {
            scrubber.push(&body, &mut scrubbed);
        } else {
            // A step at a time, passed on when a chunk's worth is ready: what one step
            // inflates to stays bounded (about 1 MiB), however well the body compresses.
            for step in body.chunks(INFLATE_STEP) {
                inflate.push(step, &mut plain).map_err(|_| None)?;
                scrubber.push(&plain, &mut scrubbed);
                plain.clear();
                if scrubbed.len() >= RELAY_CHUNK {
                    chunked::write_chunk(&scrubbed, &mut framed);
                    scrubbed.clear();
                    guest.write_all(&framed).await.map_err(|_| None)?;
                    framed.clear();
                }
            }
            if complete {
                inflate.finish(&mut plain).map_err(|_| None)?;
                scrubber.push(&plain, &mut scrubbed);
                plain.clear();
            }
        }
        body.clear();
        if complete {
            scrubber.finish(&mut scrubbed);
        }
        chunked::write_chunk(&scrubbed, &mut framed);
        scrubbed.clear();
        if complete {
            framed.extend_from_slice(chunked::LAST_CHUNK);
        }
        if !framed.is_empty() {
            guest.write_all(&framed).await.map_err(|_| None)?;
            framed.clear();
        }
        if complete {
            return Ok(());
        }
        match up.read(&mut chunk).await {
            Ok(0) | Err(_) if matches!(framing, Framing::Close) => {
                // A body framed by the end of the connection ends here.
                framing = Framing::Fixed(0);
                continue;
            }
            Ok(0) | Err(_) => return Err(None),
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The head sent to the guest: status line, header values scrubbed, re-framed as chunked
/// (`body`) with `Connection: close`.
fn response_head(
    head: &http1::ResponseHead,
    scrubber: &Scrubber,
    decoded: bool,
    body: bool,
) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {} {}\r\n", head.code, head.reason).into_bytes();
    let interim = (100..200).contains(&head.code);
    for (name, value) in &head.headers {
        let lower = name.to_ascii_lowercase();
        let skip = if interim {
            false
        } else if !body {
            matches!(
                lower.as_str(),
                "connection" | "keep-alive" | "transfer-encoding"
            )
        } else {
            REFRAMED.contains(&lower.as_str()) && (decoded || lower != "content-encoding")
        };
        if skip {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&scrubber.scrub_all(value));
        out.extend_from_slice(b"\r\n");
    }
    if !interim {
        if body {
            out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
        }
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}
