//! The two handlers of the `space.egress` server: `POST /v1/egress/connect` (a tunnel, its
//! SNI check, and interception when the sandbox has credentials) and `POST
//! /v1/egress/forward` (one plain-HTTP request), with the policy, the connection limit, the
//! checked upstream connection, credentials and the audit (`docs/egress.md`).

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use super::exchange;
use super::hello::{self, Hello};
use super::http1::{self, BodyLen};
use super::policy::{private_reason, Decision, Host, MAX_HOST};
use super::streams::*;
use super::{EgressEvent, SandboxGateway};

/// The most bytes of a refusal's text.
const MAX_REASON: usize = 4096;
/// How long a CONNECT may take to send its ClientHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, io::Error>;

/// A refusal's text: at most 4 KiB, cut at a character boundary.
pub(crate) fn bounded_reason(reason: &str) -> &str {
    if reason.len() <= MAX_REASON {
        return reason;
    }
    let mut end = MAX_REASON;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    &reason[..end]
}

fn text(status: u16, reason: &str) -> Response<Body> {
    let body = Full::new(Bytes::copy_from_slice(bounded_reason(reason).as_bytes()))
        .map_err(|never| match never {})
        .boxed();
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY))
        .header("content-type", "text/plain")
        .body(body)
        .unwrap_or_else(|_| Response::new(Full::default().map_err(|n| match n {}).boxed()))
}

/// Why a stream is refused: status, text, and what the audit says.
struct Refusal {
    status: u16,
    text: String,
    rule: String,
    reason: &'static str,
}

impl Refusal {
    fn new(status: u16, text: String, rule: &str, reason: &'static str) -> Refusal {
        Refusal {
            status,
            text,
            rule: rule.to_owned(),
            reason,
        }
    }

    /// Audits the refusal as `egress.deny` and answers it.
    fn answer(self, sb: &SandboxGateway, host: &Host, port: u16) -> Response<Body> {
        deny(sb, host, port, &self.rule, self.reason);
        text(self.status, &self.text)
    }
}

pub(super) fn event(
    sb: &SandboxGateway,
    operation: &'static str,
    host: &Host,
    port: u16,
    detail: String,
) {
    sb.gateway.audit(EgressEvent {
        sandbox: sb.id.clone(),
        operation,
        host: host.to_string(),
        port,
        detail,
    });
}

fn deny(sb: &SandboxGateway, host: &Host, port: u16, rule: &str, reason: &str) {
    event(
        sb,
        "egress.deny",
        host,
        port,
        format!("{host}:{port} rule={rule} reason={reason}"),
    );
}

pub(super) async fn handle(sb: Arc<SandboxGateway>, req: Request<Incoming>) -> Response<Body> {
    let forward = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/egress/connect") => false,
        (&Method::POST, "/v1/egress/forward") => true,
        (&Method::POST, p) if p.starts_with(space_proto::volume::VOLUMES_PREFIX) => {
            let index = p[space_proto::volume::VOLUMES_PREFIX.len()..].to_owned();
            return super::volumes::handle(sb, &index, req.into_body()).await;
        }
        _ => return text(404, "no such route"),
    };
    let (host, port) = match target(req.headers()) {
        Ok(t) => t,
        Err(e) => return text(400, &e),
    };
    let body = BodyReader::new(req.into_body());
    if forward {
        handle_forward(sb, host, port, body).await
    } else {
        handle_connect(sb, host, port, body).await
    }
}

/// `space-host` and `space-port`, validated.
fn target(headers: &http::HeaderMap) -> Result<(Host, u16), String> {
    let host = headers
        .get("space-host")
        .ok_or("the space-host header is missing")?
        .to_str()
        .map_err(|_| "space-host is not ASCII")?;
    if host.len() > MAX_HOST {
        return Err(format!("space-host is longer than {MAX_HOST} bytes"));
    }
    let host = Host::parse(host).map_err(|e| format!("space-host: {e}"))?;
    let port = headers
        .get("space-port")
        .ok_or("the space-port header is missing")?
        .to_str()
        .ok()
        .filter(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse::<u16>().ok())
        .filter(|p| *p > 0)
        .ok_or("space-port must be a number 1..65535")?;
    Ok((host, port))
}

/// Policy and the connection limit.
fn admit(
    sb: &SandboxGateway,
    host: &Host,
    port: u16,
) -> Result<(Decision, OwnedSemaphorePermit), Refusal> {
    let decision = sb.policy().decide(host, port);
    if !decision.allowed {
        let why = if decision.rule == "default" {
            "the policy's default".to_owned()
        } else {
            format!("rule {}", decision.rule)
        };
        return Err(Refusal::new(
            403,
            format!("egress to {host}:{port} is refused by {why}"),
            &decision.rule,
            "policy",
        ));
    }
    let permit = sb.connections.clone().try_acquire_owned().map_err(|_| {
        Refusal::new(
            429,
            format!(
                "too many egress connections from this sandbox (at most {})",
                sb.gateway.config.max_connections
            ),
            &decision.rule,
            "limit",
        )
    })?;
    Ok((decision, permit))
}

/// The refusal of a destination that resolves to a private address no exact allow rule names.
fn private_refusal(
    host: &Host,
    port: u16,
    kind: &str,
    ip: std::net::IpAddr,
    rule: &str,
) -> Refusal {
    Refusal::new(
        403,
        format!(
            "egress to {host}:{port} is refused: it resolves to a {kind} address ({ip}); only an \
             allow rule naming the host exactly reaches such addresses"
        ),
        rule,
        "private_address",
    )
}

/// Resolves the destination, drops private addresses the policy does not allow, and connects
/// to a checked address (no second resolution).
async fn open_upstream(
    sb: &SandboxGateway,
    host: &Host,
    port: u16,
    decision: &Decision,
) -> Result<TcpStream, Refusal> {
    let limit = sb.gateway.config.connect_timeout;
    let rule = decision.rule.as_str();
    if let Some(proxy) = sb
        .gateway
        .config
        .upstream_proxy
        .as_ref()
        .filter(|p| !p.bypasses(host))
    {
        // The private-address rule holds through the proxy too, for names that resolve here.
        let resolver = sb.gateway.config.resolver.as_ref();
        let resolved = tokio::time::timeout(limit, super::upstream::resolve(resolver, host, port))
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        if !decision.exact_allow {
            if let Some((kind, ip)) = resolved
                .iter()
                .find_map(|a| private_reason(a.ip()).map(|k| (k, a.ip())))
            {
                return Err(private_refusal(host, port, kind, ip, rule));
            }
        }
        return proxy
            .connect(host, port, limit)
            .await
            .map_err(|e| Refusal::new(502, e, rule, "proxy"));
    }
    let work = async {
        let addrs: Vec<SocketAddr> = match host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
            Host::Name(n) => sb
                .gateway
                .config
                .resolver
                .resolve(n, port)
                .await
                .map_err(|e| {
                    Refusal::new(
                        502,
                        format!("cannot resolve {host}: {e}"),
                        rule,
                        "unresolvable",
                    )
                })?
                .into_iter()
                .take(super::resolve::MAX_ADDRESSES)
                .collect(),
        };
        let mut refused = None;
        let mut last_err = None;
        for addr in addrs {
            if let Some(kind) = private_reason(addr.ip()) {
                if !decision.exact_allow {
                    refused = Some((kind, addr.ip()));
                    continue;
                }
            }
            match TcpStream::connect(addr).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last_err = Some(e),
            }
        }
        if let Some(e) = last_err {
            return Err(Refusal::new(
                502,
                format!("cannot connect to {host}:{port}: {e}"),
                rule,
                "unreachable",
            ));
        }
        match refused {
            Some((kind, ip)) => Err(private_refusal(host, port, kind, ip, rule)),
            None => Err(Refusal::new(
                502,
                format!("{host} has no address"),
                rule,
                "unresolvable",
            )),
        }
    };
    match tokio::time::timeout(limit, work).await {
        Ok(r) => r,
        Err(_) => Err(Refusal::new(
            504,
            format!("connecting to {host}:{port} timed out after {limit:?}"),
            rule,
            "timeout",
        )),
    }
}

async fn handle_connect(
    sb: Arc<SandboxGateway>,
    host: Host,
    port: u16,
    body: BodyReader,
) -> Response<Body> {
    let (decision, permit) = match admit(&sb, &host, port) {
        Ok(a) => a,
        Err(r) => return r.answer(&sb, &host, port),
    };
    let upstream = match open_upstream(&sb, &host, port, &decision).await {
        Ok(s) => s,
        Err(r) => return r.answer(&sb, &host, port),
    };
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        tunnel(&sb, &host, port, &decision.rule, body, tx, upstream).await;
        drop(permit);
    });
    Response::new(ChannelBody(rx).boxed())
}

/// Reads the ClientHello (bounded, timed) and checks its SNI against the CONNECT host.
async fn check_hello(body: &mut BodyReader, host: &Host) -> Result<(), &'static str> {
    let read = async {
        loop {
            match hello::parse(&body.buf) {
                Hello::Complete { sni } => return Ok(sni),
                Hello::NotTls(_) => return Err("not_tls"),
                Hello::Incomplete if body.buf.len() >= hello::MAX_HELLO => return Err("not_tls"),
                Hello::Incomplete => {}
            }
            if !body.fill_more().await.unwrap_or(false) {
                return Err("not_tls");
            }
        }
    };
    let sni = tokio::time::timeout(HELLO_TIMEOUT, read)
        .await
        .map_err(|_| "not_tls")??;
    let ok = match (host, sni) {
        (Host::Name(_), Some(s)) => host.same_name(&s),
        (Host::Name(_), None) => false,
        (Host::Ip(_), None) => true,
        (Host::Ip(_), Some(s)) => host.same_name(&s),
    };
    if ok {
        Ok(())
    } else {
        Err("sni_mismatch")
    }
}

async fn tunnel(
    sb: &SandboxGateway,
    host: &Host,
    port: u16,
    rule: &str,
    mut body: BodyReader,
    tx: mpsc::Sender<io::Result<Bytes>>,
    upstream: TcpStream,
) {
    if let Err(reason) = check_hello(&mut body, host).await {
        deny(sb, host, port, rule, reason);
        let _ = tx.try_send(Err(io::Error::other(reason)));
        return;
    }
    let meter = Meter::new();
    let kind = if !sb.exchanges(host, port) {
        pump(sb, &mut body, &tx, upstream, &meter, None).await;
        "tunnel"
    } else {
        let (guest_side, inner) = tokio::io::duplex(64 * 1024);
        let mut pumped = std::pin::pin!(pump(sb, &mut body, &tx, inner, &meter, None));
        tokio::select! {
            _ = &mut pumped => {}
            _ = intercept(sb, host, port, guest_side, upstream) => pumped.await,
        }
        "intercept"
    };
    allowed(sb, host, port, kind, rule, &meter);
}

fn allowed(sb: &SandboxGateway, host: &Host, port: u16, kind: &str, rule: &str, meter: &Meter) {
    event(
        sb,
        "egress.allow",
        host,
        port,
        format!(
            "{host}:{port} kind={kind} rule={rule} up={} down={}",
            meter.up.load(Ordering::Relaxed),
            meter.down.load(Ordering::Relaxed)
        ),
    );
}

/// One intercepted request inside a CONNECT tunnel: TLS with a minted leaf towards the guest,
/// TLS verified against the roots towards the upstream, and the exchange between them
/// (credentials put in, the response scrubbed; `exchange`).
async fn intercept(
    sb: &SandboxGateway,
    host: &Host,
    port: u16,
    guest_side: tokio::io::DuplexStream,
    upstream: TcpStream,
) {
    let cfg = match sb.gateway.authority.server_config(host) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(id = %sb.id, error = %e, "minting a leaf certificate");
            return;
        }
    };
    let accept = tokio_rustls::TlsAcceptor::from(cfg).accept(guest_side);
    let tls = match tokio::time::timeout(HELLO_TIMEOUT, accept).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            tracing::debug!(id = %sb.id, %host, error = %e, "guest TLS handshake failed");
            return;
        }
        Err(_) => return,
    };
    let name = match host {
        Host::Name(n) => rustls::pki_types::ServerName::try_from(n.clone()),
        Host::Ip(ip) => Ok(rustls::pki_types::ServerName::IpAddress((*ip).into())),
    };
    let Ok(name) = name else { return };
    let connector = tokio_rustls::TlsConnector::from(sb.gateway.client_tls.clone());
    let limit = sb.gateway.config.connect_timeout;
    let connect = async move {
        match tokio::time::timeout(limit, connector.connect(name, upstream)).await {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err((502, format!("TLS to {host}:{port} failed: {e}"))),
            Err(_) => Err((
                504,
                format!("TLS to {host}:{port} timed out after {limit:?}"),
            )),
        }
    };
    exchange::exchange(sb, host, port, tls, |h| Ok(h.target.clone()), connect).await;
}

async fn handle_forward(
    sb: Arc<SandboxGateway>,
    host: Host,
    port: u16,
    mut body: BodyReader,
) -> Response<Body> {
    let (decision, permit) = match admit(&sb, &host, port) {
        Ok(a) => a,
        Err(r) => return r.answer(&sb, &host, port),
    };
    let idle = sb.gateway.config.idle_timeout;
    let head = loop {
        match http1::parse_head(&body.buf) {
            Ok(Some(h)) => break h,
            Ok(None) => {}
            Err(e) if e.contains("larger") => return text(431, &e),
            Err(e) => return text(400, &e),
        }
        match tokio::time::timeout(idle, body.fill_more()).await {
            Ok(Ok(true)) => {}
            _ => return text(400, "the request head did not arrive"),
        }
    };
    let target = if head.target.starts_with('/') {
        head.target.clone()
    } else {
        match http1::absolute_target(&head.target) {
            Ok((h, p, path)) if h == host && p == port => path,
            Ok((h, p, _)) => {
                return text(
                    400,
                    &format!("the request names {h}:{p} but space-host says {host}:{port}"),
                )
            }
            Err(e) => return text(400, &e),
        }
    };
    let framing = match head.body_len() {
        Ok(f) => f,
        Err(e) => return text(400, &e),
    };
    if let Err((status, reason)) = exchange::exfiltration(&sb, &host, port, &body.buf[..head.len]) {
        return text(status, &reason);
    }
    if sb.exchanges(&host, port) {
        return forward_with_credentials(sb, host, port, body, decision, permit, target);
    }
    let out = match http1::rewrite(&head, &target, &[], &[], &[]) {
        Ok(o) => o,
        Err(e) => return text(502, &e),
    };
    let mut upstream = match open_upstream(&sb, &host, port, &decision).await {
        Ok(s) => s,
        Err(r) => return r.answer(&sb, &host, port),
    };
    if let Err(e) = upstream.write_all(out.as_bytes()).await {
        return text(502, &format!("writing to {host}:{port}: {e}"));
    }
    drop(out);
    body.buf.advance(head.len);
    let limit = match framing {
        BodyLen::Fixed(n) => Some(n),
        BodyLen::Chunked => None,
    };
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let meter = Meter::new();
        pump(&sb, &mut body, &tx, upstream, &meter, limit).await;
        allowed(&sb, &host, port, "forward", &decision.rule, &meter);
        drop(permit);
    });
    Response::new(ChannelBody(rx).boxed())
}

/// A plain-HTTP forward from a sandbox with credentials: the request and its response go
/// through the exchange (`exchange`), whose refusals are HTTP/1.1 responses in the stream.
fn forward_with_credentials(
    sb: Arc<SandboxGateway>,
    host: Host,
    port: u16,
    mut body: BodyReader,
    decision: Decision,
    permit: OwnedSemaphorePermit,
    target: String,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let meter = Meter::new();
        let (guest_side, inner) = tokio::io::duplex(64 * 1024);
        let connect = async {
            open_upstream(&sb, &host, port, &decision)
                .await
                .map_err(|r| {
                    deny(&sb, &host, port, &r.rule, r.reason);
                    (r.status, r.text)
                })
        };
        let mut pumped = std::pin::pin!(pump(&sb, &mut body, &tx, inner, &meter, None));
        tokio::select! {
            _ = &mut pumped => {}
            _ = exchange::exchange(&sb, &host, port, guest_side, |_| Ok(target), connect) => {
                pumped.await
            }
        }
        allowed(&sb, &host, port, "forward", &decision.rule, &meter);
        drop(permit);
    });
    Response::new(ChannelBody(rx).boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_bounded() {
        let long = "é".repeat(5000);
        let r = bounded_reason(&long);
        assert!(r.len() <= MAX_REASON && r.len() > MAX_REASON - 4);
        assert_eq!(bounded_reason("short"), "short");
    }
}
