//! The way out of the host when the host has an HTTP proxy (`HTTPS_PROXY`, `NO_PROXY`): the
//! gateway reaches every upstream it does not exempt through a `CONNECT` tunnel of the
//! proxy, whatever the sandbox's connection carries (TLS spliced or intercepted, or plain
//! HTTP), so one mechanism covers them all. The proxy must allow `CONNECT` to the ports the
//! sandboxes use.
//!
//! The egress policy and the private-address rule still apply first: a name that resolves
//! here to a private address is refused as without a proxy. A name that does not resolve
//! here (a network where only the proxy resolves names) goes to the proxy by name.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use super::policy::Host;

/// The most of a proxy's answer to `CONNECT` read before its blank line.
const MAX_REPLY: usize = 16 << 10;

/// An HTTP proxy upstreams go through.
#[derive(Clone, PartialEq, Eq)]
pub struct Proxy {
    /// `host:port` of the proxy.
    pub authority: String,
    /// `Proxy-Authorization` value for `user:password@` in the URL.
    pub authorization: Option<String>,
    /// Hosts reached directly (`NO_PROXY`).
    pub bypass: Vec<Bypass>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("authority", &self.authority)
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<set>"),
            )
            .field("bypass", &self.bypass)
            .finish()
    }
}

/// One `NO_PROXY` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bypass {
    /// `*`: everything.
    All,
    /// A name and its subdomains (`example.com`, `.example.com`).
    Suffix(String),
    /// An address.
    Ip(IpAddr),
    /// An address range (`10.0.0.0/8`).
    Net(IpAddr, u8),
}

impl Proxy {
    /// The proxy the environment names: `HTTPS_PROXY`, else `https_proxy`, else
    /// `ALL_PROXY` / `all_proxy`, with `NO_PROXY` / `no_proxy`. `None` when unset or empty.
    pub fn from_env() -> Result<Option<Proxy>, String> {
        let var = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
        };
        let Some(url) = var(&["HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"]) else {
            return Ok(None);
        };
        let no_proxy = var(&["NO_PROXY", "no_proxy"]).unwrap_or_default();
        Proxy::parse(&url, &no_proxy).map(Some)
    }

    /// Parses a proxy URL (`http://[user:password@]host[:port]`, port 80 by default; a bare
    /// `host:port` too) and a `NO_PROXY` list.
    pub fn parse(url: &str, no_proxy: &str) -> Result<Proxy, String> {
        let url = url.trim();
        let rest = match url.split_once("://") {
            Some(("http", r)) | Some(("HTTP", r)) => r,
            Some((scheme, _)) => {
                return Err(format!(
                    "proxy {url:?}: only http:// proxies are supported (not {scheme}://)"
                ))
            }
            None => url,
        };
        let rest = rest.trim_end_matches('/');
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        if hostport.is_empty() || hostport.contains('/') || hostport.contains(char::is_whitespace) {
            return Err(format!("proxy {url:?} is not http://host[:port]"));
        }
        let has_port = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(':') || hostport.starts_with('[') => {
                p.parse::<u16>()
                    .map_err(|_| format!("proxy {url:?}: bad port {p:?}"))?;
                !p.is_empty()
            }
            _ => false,
        };
        let authority = if has_port {
            hostport.to_owned()
        } else {
            format!("{hostport}:80")
        };
        let authorization = userinfo.map(|u| format!("Basic {}", B64.encode(percent_decode(u))));
        Ok(Proxy {
            authority,
            authorization,
            bypass: parse_no_proxy(no_proxy),
        })
    }

    /// Whether `host` is reached without the proxy.
    pub fn bypasses(&self, host: &Host) -> bool {
        self.bypass.iter().any(|b| match (b, host) {
            (Bypass::All, _) => true,
            (Bypass::Suffix(s), Host::Name(n)) => n == s || n.ends_with(&format!(".{s}")),
            (Bypass::Ip(a), Host::Ip(ip)) => a == ip,
            (Bypass::Net(net, bits), Host::Ip(ip)) => in_net(*ip, *net, *bits),
            _ => false,
        })
    }

    /// A tunnel through the proxy to `host:port`.
    pub async fn connect(
        &self,
        host: &Host,
        port: u16,
        limit: Duration,
    ) -> Result<TcpStream, String> {
        let work = async {
            let mut s = TcpStream::connect(&self.authority)
                .await
                .map_err(|e| format!("cannot connect to the proxy {}: {e}", self.authority))?;
            let _ = s.set_nodelay(true);
            let target = match host {
                Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
                Host::Ip(ip) => format!("{ip}:{port}"),
                Host::Name(n) => format!("{n}:{port}"),
            };
            let mut req = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
            if let Some(a) = &self.authorization {
                req.push_str(&format!("Proxy-Authorization: {a}\r\n"));
            }
            req.push_str("\r\n");
            s.write_all(req.as_bytes())
                .await
                .map_err(|e| format!("writing to the proxy {}: {e}", self.authority))?;
            // Read the answer byte by byte up to its blank line: what follows belongs to the
            // tunnel.
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if head.len() >= MAX_REPLY {
                    return Err(format!(
                        "the proxy {} answered a head over 16 KiB",
                        self.authority
                    ));
                }
                let n = s
                    .read(&mut byte)
                    .await
                    .map_err(|e| format!("reading from the proxy {}: {e}", self.authority))?;
                if n == 0 {
                    return Err(format!(
                        "the proxy {} closed the connection",
                        self.authority
                    ));
                }
                head.push(byte[0]);
            }
            let line = String::from_utf8_lossy(&head);
            let status = line.lines().next().unwrap_or("").trim().to_owned();
            let code = status.split_whitespace().nth(1).unwrap_or("");
            if !code.starts_with('2') {
                return Err(format!(
                    "the proxy {} refused CONNECT {target}: {status}",
                    self.authority
                ));
            }
            Ok(s)
        };
        match tokio::time::timeout(limit, work).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "the proxy {} did not open a tunnel within {limit:?}",
                self.authority
            )),
        }
    }
}

fn parse_no_proxy(list: &str) -> Vec<Bypass> {
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            if e == "*" {
                return Some(Bypass::All);
            }
            if let Some((net, bits)) = e.split_once('/') {
                let ip: IpAddr = net.parse().ok()?;
                let bits: u8 = bits.parse().ok()?;
                return Some(Bypass::Net(ip, bits));
            }
            let bare = e.trim_start_matches('[').trim_end_matches(']');
            if let Ok(ip) = bare.parse::<IpAddr>() {
                return Some(Bypass::Ip(ip));
            }
            // `host:port` entries: the port is not told apart.
            let host = match e.rsplit_once(':') {
                Some((h, p)) if p.parse::<u16>().is_ok() => h,
                _ => e,
            };
            Some(Bypass::Suffix(
                host.trim_start_matches("*.")
                    .trim_start_matches('.')
                    .to_ascii_lowercase(),
            ))
        })
        .collect()
}

fn in_net(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if bits <= 32 => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if bits <= 128 => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(h << 4 | l);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The address a host resolves to here, if it does (for the private-address check).
pub async fn resolve(
    resolver: &dyn super::resolve::Resolve,
    host: &Host,
    port: u16,
) -> Option<Vec<SocketAddr>> {
    match host {
        Host::Ip(ip) => Some(vec![SocketAddr::new(*ip, port)]),
        Host::Name(n) => resolver.resolve(n, port).await.ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_urls_parse_with_credentials_and_default_port() {
        let p = Proxy::parse("http://alice:s%40crt@proxy.corp:3128/", "").unwrap();
        assert_eq!(p.authority, "proxy.corp:3128");
        assert_eq!(
            p.authorization.as_deref(),
            Some(format!("Basic {}", B64.encode("alice:s@crt")).as_str())
        );
        assert_eq!(
            Proxy::parse("proxy.corp", "").unwrap().authority,
            "proxy.corp:80"
        );
        assert!(Proxy::parse("socks5://proxy:1080", "").is_err());
        assert!(Proxy::parse("http://proxy:99999", "").is_err());
        assert!(format!("{p:?}").contains("<set>") && !format!("{p:?}").contains("alice"));
    }

    #[test]
    fn no_proxy_matches_suffixes_addresses_and_ranges() {
        let p = Proxy::parse(
            "http://p:1",
            "localhost, .internal.corp,example.org:8080, 10.0.0.0/8, ::1",
        )
        .unwrap();
        let name = |n: &str| Host::Name(n.into());
        let ip = |s: &str| Host::Ip(s.parse().unwrap());
        assert!(p.bypasses(&name("localhost")));
        assert!(p.bypasses(&name("git.internal.corp")));
        assert!(p.bypasses(&name("internal.corp")));
        assert!(!p.bypasses(&name("notinternal.corp")));
        assert!(p.bypasses(&name("example.org")));
        assert!(p.bypasses(&ip("10.1.2.3")));
        assert!(!p.bypasses(&ip("11.1.2.3")));
        assert!(p.bypasses(&ip("::1")));
        assert!(!p.bypasses(&name("pypi.org")));
        assert!(Proxy::parse("http://p:1", "*")
            .unwrap()
            .bypasses(&name("pypi.org")));
    }
}
