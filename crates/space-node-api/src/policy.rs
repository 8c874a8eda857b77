//! Egress rules and policy: which `host:port` a sandbox may reach, and which resolved
//! addresses count as private.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::headers::HeaderRule;

/// Longest DNS name accepted (in a rule or as a destination).
pub const MAX_HOST: usize = 253;

/// Most rules a policy (allow and deny together) or a binding may hold.
pub const MAX_RULES: usize = 1024;

/// What happens to a destination no rule names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EgressDefault {
    /// Reachable.
    #[default]
    Allow,
    /// Refused.
    Deny,
}

impl EgressDefault {
    /// Lowercase name, as serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            EgressDefault::Allow => "allow",
            EgressDefault::Deny => "deny",
        }
    }
}

/// The egress policy of a sandbox: deny rules win, then allow rules, then `default`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressPolicy {
    /// For destinations no rule names.
    #[serde(default)]
    pub default: EgressDefault,
    /// Destinations allowed (and, when named exactly, allowed even at private addresses).
    #[serde(default)]
    pub allow: Vec<EgressRule>,
    /// Destinations refused whatever else says.
    #[serde(default)]
    pub deny: Vec<EgressRule>,
    /// Headers set on requests to some destinations, with secrets put in by the gateway
    /// (`crate::headers`). They reach a destination only when the rules above allow it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderRule>,
}

/// The host part of a rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HostPattern {
    /// `*`: any host.
    Any,
    /// `*.suffix`: names ending in `.suffix` (stored lowercase, without `*.`).
    Suffix(String),
    /// One DNS name, lowercase, without a trailing dot.
    Name(String),
    /// One IP literal.
    Ip(IpAddr),
}

/// One rule: `HOST` or `HOST:PORT` (see `docs/egress.md`). `HOST` is a DNS name, `*.suffix`,
/// `*` or an IP literal (IPv6 in brackets when a port follows); `PORT` is a number or `*`
/// (any; the default).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EgressRule {
    host: HostPattern,
    port: Option<u16>,
}

/// A destination as the guest named it: a lowercase DNS name or an IP literal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, lowercase, without a trailing dot.
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl Host {
    /// Parses a destination host: at most [`MAX_HOST`] bytes of `[A-Za-z0-9.-]`, or an IP
    /// literal (IPv6 without brackets). The other spellings of an IPv4 address that C
    /// resolvers accept (`127.1`, `2130706433`, `0x7f.0.0.1`, `0177.0.0.1`) are that address,
    /// so rules and the private-address check see what a connection would reach.
    pub fn parse(s: &str) -> Result<Host, String> {
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Host::Ip(ip));
        }
        if let Some(ip) = numeric_ipv4(s) {
            return Ok(Host::Ip(IpAddr::V4(ip)));
        }
        validate_name(s).map(Host::Name)
    }

    /// Whether this is the same host as `sni` (a TLS server name), ignoring case and one
    /// trailing dot.
    pub fn same_name(&self, sni: &str) -> bool {
        let sni = sni.strip_suffix('.').unwrap_or(sni);
        match self {
            Host::Name(n) => n.eq_ignore_ascii_case(sni),
            Host::Ip(ip) => sni.parse::<IpAddr>().is_ok_and(|s| s == *ip),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// An IPv4 address in any spelling `inet_aton` accepts: one to four parts separated by
/// dots, each decimal, octal (a leading `0`) or hexadecimal (`0x`), the last filling the
/// bytes left; a trailing dot is allowed. `None` for anything else.
pub fn numeric_ipv4(s: &str) -> Option<Ipv4Addr> {
    let s = s.strip_suffix('.').unwrap_or(s);
    let parts: Vec<&str> = s.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(4);
    for part in &parts {
        let (digits, radix) =
            if let Some(h) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
                (h, 16)
            } else if part.len() > 1 && part.starts_with('0') {
                (&part[1..], 8)
            } else {
                (*part, 10)
            };
        if digits.is_empty() || digits.len() > 32 || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        values.push(u64::from_str_radix(digits, radix).ok()?);
    }
    let (last, leading) = values.split_last()?;
    if leading.iter().any(|&v| v > 255) {
        return None;
    }
    let rest_bits = 8 * (4 - leading.len() as u32);
    if rest_bits < 64 && *last >= 1u64 << rest_bits {
        return None;
    }
    let mut addr: u32 = 0;
    for (i, v) in leading.iter().enumerate() {
        addr |= (*v as u32) << (24 - 8 * i as u32);
    }
    addr |= *last as u32;
    Some(Ipv4Addr::from(addr))
}

/// Whether a DNS label is a number (decimal, or `0x` hexadecimal): no top-level domain is,
/// so a name ending in one is an address spelled in a way no resolver should be asked to
/// guess at.
fn numeric_label(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"));
    match hex {
        Some(h) => h.chars().all(|c| c.is_ascii_hexdigit()),
        None => label.chars().all(|c| c.is_ascii_digit()),
    }
}

/// Checks a DNS name and returns it lowercase without a trailing dot.
fn validate_name(s: &str) -> Result<String, String> {
    let trimmed = s.strip_suffix('.').unwrap_or(s);
    if trimmed.is_empty() {
        return Err("the host name is empty".into());
    }
    if trimmed.len() > MAX_HOST {
        return Err(format!(
            "the host name is {} bytes; at most {MAX_HOST}",
            trimmed.len()
        ));
    }
    if let Some(c) = trimmed
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '.'))
    {
        return Err(format!(
            "host name {:?} holds {c:?}; only letters, digits, '-' and '.' are allowed",
            trimmed.chars().take(64).collect::<String>()
        ));
    }
    if trimmed.split('.').any(|l| l.is_empty() || l.len() > 63) {
        return Err(format!(
            "host name {trimmed:?} has an empty label or one longer than 63 bytes"
        ));
    }
    if trimmed.rsplit('.').next().is_some_and(numeric_label) {
        return Err(format!(
            "host {trimmed:?} is neither a DNS name (its last label is a number) nor an IP \
             address"
        ));
    }
    Ok(trimmed.to_ascii_lowercase())
}

impl EgressRule {
    /// Whether the rule matches `host:port`.
    pub fn matches(&self, host: &Host, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.host, host) {
            (HostPattern::Any, _) => true,
            (HostPattern::Suffix(suffix), Host::Name(n)) => {
                n.len() > suffix.len() + 1
                    && n.ends_with(suffix.as_str())
                    && n.as_bytes()[n.len() - suffix.len() - 1] == b'.'
            }
            (HostPattern::Name(a), Host::Name(b)) => a == b,
            (HostPattern::Ip(a), Host::Ip(b)) => a == b,
            _ => false,
        }
    }

    /// Whether every destination `other` matches, this rule matches too.
    pub fn covers(&self, other: &EgressRule) -> bool {
        if self.port.is_some() && self.port != other.port {
            return false;
        }
        let under = |name: &str, suffix: &str| {
            name.len() > suffix.len() + 1
                && name.ends_with(suffix)
                && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
        };
        match (&self.host, &other.host) {
            (HostPattern::Any, _) => true,
            (HostPattern::Suffix(s), HostPattern::Name(n)) => under(n, s),
            (HostPattern::Suffix(s), HostPattern::Suffix(t)) => s == t || under(t, s),
            (HostPattern::Name(a), HostPattern::Name(b)) => a == b,
            (HostPattern::Ip(a), HostPattern::Ip(b)) => a == b,
            _ => false,
        }
    }

    /// Whether the rule names one host exactly (no `*`, no wildcard): only such an allow rule
    /// lets a connection reach a private address.
    pub fn is_exact(&self) -> bool {
        matches!(self.host, HostPattern::Name(_) | HostPattern::Ip(_))
    }
}

impl FromStr for EgressRule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let fail = |why: String| format!("egress rule {:?}: {why}", truncate(s, 80));
        if s.is_empty() {
            return Err(fail("empty".into()));
        }
        // Split off the port: `[v6]:port`, `[v6]`, a bare v6 literal (no port), `host:port`.
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (ip, after) = rest
                .split_once(']')
                .ok_or_else(|| fail("'[' without ']'".into()))?;
            let ip: Ipv6Addr = ip
                .parse()
                .map_err(|_| fail(format!("{ip:?} is not an IPv6 address")))?;
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| fail("expected ':' after ']'".into()))?,
                ),
            };
            (HostPattern::Ip(IpAddr::V6(ip)), port)
        } else if s.matches(':').count() > 1 {
            let ip: Ipv6Addr = s.parse().map_err(|_| {
                fail("not an IPv6 address (write [v6]:port for one with a port)".into())
            })?;
            (HostPattern::Ip(IpAddr::V6(ip)), None)
        } else {
            let (h, p) = match s.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            };
            let host = if h == "*" {
                HostPattern::Any
            } else if let Some(suffix) = h.strip_prefix("*.") {
                HostPattern::Suffix(validate_name(suffix).map_err(fail)?)
            } else if h.contains('*') {
                return Err(fail(
                    "'*' may only stand alone or lead as '*.suffix'".into(),
                ));
            } else if let Some(ip) = numeric_ipv4(h) {
                HostPattern::Ip(IpAddr::V4(ip))
            } else {
                HostPattern::Name(validate_name(h).map_err(fail)?)
            };
            (host, p)
        };
        let port = match port {
            None | Some("*") => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
                _ => return Err(fail(format!("port {p:?} is not 1..65535 or '*'"))),
            },
        };
        Ok(EgressRule { host, port })
    }
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v6 = matches!(self.host, HostPattern::Ip(IpAddr::V6(_)));
        match &self.host {
            HostPattern::Any => f.write_str("*")?,
            HostPattern::Suffix(s) => write!(f, "*.{s}")?,
            HostPattern::Name(n) => f.write_str(n)?,
            HostPattern::Ip(ip) if v6 && self.port.is_some() => write!(f, "[{ip}]")?,
            HostPattern::Ip(ip) => write!(f, "{ip}")?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

impl Serialize for EgressRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for EgressRule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What the policy says about one destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the destination may be reached (private addresses aside).
    pub allowed: bool,
    /// The rule that decided (`default` when none did).
    pub rule: String,
    /// Whether an allow rule names this host exactly (private addresses allowed).
    pub exact_allow: bool,
}

impl EgressPolicy {
    /// Checks the policy's size.
    pub fn validate(&self) -> Result<(), String> {
        let n = self.allow.len() + self.deny.len();
        if n > MAX_RULES {
            return Err(format!(
                "the egress policy has {n} rules; at most {MAX_RULES}"
            ));
        }
        crate::headers::validate_headers(&self.headers)
    }

    /// The header rules for `host:port`, in order (a later one for the same name wins).
    pub fn headers_for<'a>(
        &'a self,
        host: &'a Host,
        port: u16,
    ) -> impl Iterator<Item = &'a HeaderRule> + 'a {
        self.headers
            .iter()
            .filter(move |r| r.host.matches(host, port))
    }

    /// Decides `host:port`: deny rules win, then allow rules, then the default.
    pub fn decide(&self, host: &Host, port: u16) -> Decision {
        if let Some(r) = self.deny.iter().find(|r| r.matches(host, port)) {
            return Decision {
                allowed: false,
                rule: r.to_string(),
                exact_allow: false,
            };
        }
        let exact_allow = self
            .allow
            .iter()
            .any(|r| r.is_exact() && r.matches(host, port));
        if let Some(r) = self.allow.iter().find(|r| r.matches(host, port)) {
            return Decision {
                allowed: true,
                rule: r.to_string(),
                exact_allow,
            };
        }
        Decision {
            allowed: self.default == EgressDefault::Allow,
            rule: "default".into(),
            exact_allow,
        }
    }
}

/// Why an address is private (refused unless the host is allowed exactly), or `None` for a
/// public one. Covers loopback, link-local, RFC 1918, shared address space (100.64/10, where
/// some clouds put their metadata service), fc00::/7, unspecified (and 0.0.0.0/8), multicast,
/// broadcast and the rest of 240/4, the IETF, benchmarking and documentation ranges, cloud
/// metadata addresses, and IPv4 addresses carried inside IPv6 (mapped, compatible, translated,
/// NAT64, 6to4 and Teredo), judged as the IPv4 address they reach.
pub fn private_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => private_v6(v6),
    }
}

fn v4_at(hi: u16, lo: u16) -> Ipv4Addr {
    Ipv4Addr::from(((hi as u32) << 16) | lo as u32)
}

fn private_v6(v6: Ipv6Addr) -> Option<&'static str> {
    let seg = v6.segments();
    if v6.is_loopback() {
        return Some("loopback");
    }
    if v6.is_unspecified() {
        return Some("unspecified");
    }
    // fd00:ec2::254, the metadata service's IPv6 address on one cloud.
    if seg == [0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x254] {
        return Some("cloud metadata");
    }
    // ::a.b.c.d (compatible), ::ffff:a.b.c.d (mapped), ::ffff:0:a.b.c.d (translated),
    // 64:ff9b::a.b.c.d and 64:ff9b:1::/48 (NAT64): the IPv4 address is the last 32 bits.
    let compatible = seg[..6] == [0; 6];
    let mapped = seg[..5] == [0; 5] && seg[5] == 0xffff;
    let translated = seg[..4] == [0; 4] && seg[4] == 0xffff && seg[5] == 0;
    let nat64 = seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || seg[..3] == [0x64, 0xff9b, 1];
    if compatible || mapped || translated || nat64 {
        return private_v4(v4_at(seg[6], seg[7]));
    }
    // 2002:a.b.c.d::/48 (6to4) embeds an IPv4 address, 2001:0::/32 (Teredo) an inverted
    // one; both are tunnels into IPv4 no destination needs, and both are refused.
    if seg[0] == 0x2002 {
        return Some(private_v4(v4_at(seg[1], seg[2])).unwrap_or("6to4"));
    }
    if seg[0] == 0x2001 && seg[1] == 0 {
        return Some("Teredo");
    }
    if v6.is_multicast() {
        return Some("multicast");
    }
    if seg[0] & 0xffc0 == 0xfe80 {
        return Some("link-local");
    }
    if seg[0] & 0xfe00 == 0xfc00 {
        return Some("private");
    }
    if seg[0] & 0xffc0 == 0xfec0 {
        return Some("private (site-local)");
    }
    // 100::/64 (discard), 2001:db8::/32 (documentation), 3fff::/20 (documentation).
    if seg[..4] == [0x100, 0, 0, 0]
        || (seg[0] == 0x2001 && seg[1] == 0xdb8)
        || (seg[0] == 0x3fff && seg[1] < 0x1000)
    {
        return Some("reserved");
    }
    None
}

fn private_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    let bits = u32::from(ip);
    let within =
        |net: [u8; 4], len: u32| bits >> (32 - len) == u32::from_be_bytes(net) >> (32 - len);
    if ip == Ipv4Addr::new(169, 254, 169, 254) || ip == Ipv4Addr::new(100, 100, 100, 200) {
        Some("cloud metadata")
    } else if ip.is_loopback() {
        Some("loopback")
    } else if ip.is_unspecified() || o[0] == 0 {
        Some("unspecified")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if ip.is_private() {
        Some("private")
    } else if within([100, 64, 0, 0], 10) {
        Some("shared address space")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if within([240, 0, 0, 0], 4)
        || within([192, 0, 0, 0], 24)
        || within([198, 18, 0, 0], 15)
        || within([192, 0, 2, 0], 24)
        || within([198, 51, 100, 0], 24)
        || within([203, 0, 113, 0], 24)
    {
        Some("reserved")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> EgressRule {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    fn name(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn rules_parse_and_print() {
        for (input, shown) in [
            ("pypi.org", "pypi.org"),
            ("PyPI.org:443", "pypi.org:443"),
            ("*.github.com", "*.github.com"),
            ("*", "*"),
            ("*:22", "*:22"),
            ("127.0.0.1:*", "127.0.0.1"),
            ("10.0.0.1:8080", "10.0.0.1:8080"),
            ("::1", "::1"),
            ("[::1]:443", "[::1]:443"),
            ("[fe80::1]", "fe80::1"),
            ("example.com.", "example.com"),
        ] {
            assert_eq!(rule(input).to_string(), shown, "{input}");
            assert_eq!(rule(shown), rule(input));
        }
        for bad in [
            "",
            "a:b",
            "host:0",
            "host:65536",
            "host:+1",
            "ex*ample.com",
            "*.",
            "**.x",
            "a..b",
            "[::1",
            "[::1]x",
            "[1.2.3.4]",
            "1:2:3",
            "sp ace.com",
            "ünï.com",
            &"a".repeat(300),
            "x.*",
        ] {
            let err = bad.parse::<EgressRule>().unwrap_err();
            assert!(err.starts_with("egress rule"), "{bad}: {err}");
        }
        let json = r#"{"default":"deny","allow":["pypi.org","*.pythonhosted.org","api.github.com:443"],"deny":["*.example.com"]}"#;
        let p: EgressPolicy = serde_json::from_str(json).unwrap();
        assert_eq!(p.default, EgressDefault::Deny);
        assert_eq!(serde_json::to_string(&p).unwrap(), json);
        assert_eq!(
            serde_json::from_str::<EgressPolicy>("{}").unwrap(),
            EgressPolicy::default()
        );
        let err = serde_json::from_str::<EgressPolicy>(r#"{"allow":["a b"]}"#).unwrap_err();
        assert!(err.to_string().contains("egress rule"), "{err}");
        assert!(serde_json::from_str::<EgressPolicy>(r#"{"alow":[]}"#).is_err());
    }

    #[test]
    fn matching() {
        let sfx = rule("*.github.com");
        assert!(sfx.matches(&name("api.github.com"), 443));
        assert!(sfx.matches(&name("A.B.GitHub.com"), 1));
        assert!(!sfx.matches(&name("github.com"), 443));
        assert!(!sfx.matches(&name("evilgithub.com"), 443));
        assert!(!sfx.matches(&name("1.2.3.4"), 443));
        let port = rule("pypi.org:443");
        assert!(port.matches(&name("PYPI.ORG"), 443));
        assert!(!port.matches(&name("pypi.org"), 80));
        assert!(!port.matches(&name("www.pypi.org"), 443));
        let ip = rule("127.0.0.1:*");
        assert!(ip.matches(&name("127.0.0.1"), 9));
        assert!(!ip.matches(&name("localhost"), 9));
        assert!(rule("[::1]:80").matches(&name("::1"), 80));
        assert!(rule("*").matches(&name("::1"), 80));
        assert!(rule("*").matches(&name("x"), 80));
    }

    #[test]
    fn a_rule_covers_what_it_would_always_match() {
        for (wide, narrow) in [
            ("*", "*.a.com:443"),
            ("*.a.com", "x.a.com"),
            ("*.a.com", "*.x.a.com"),
            ("*.a.com", "*.a.com:443"),
            ("x.a.com", "x.a.com:8443"),
            ("10.0.0.1", "10.0.0.1:80"),
        ] {
            assert!(rule(wide).covers(&rule(narrow)), "{wide} covers {narrow}");
        }
        for (wide, narrow) in [
            ("*.a.com", "a.com"),
            ("*.a.com", "*"),
            ("x.a.com", "*.a.com"),
            ("x.a.com:443", "x.a.com"),
            ("*.a.com", "xa.com"),
            ("*.a.com", "10.0.0.1"),
        ] {
            assert!(
                !rule(wide).covers(&rule(narrow)),
                "{wide} does not cover {narrow}"
            );
        }
    }

    #[test]
    fn deny_wins_then_allow_then_default() {
        let p = EgressPolicy {
            default: EgressDefault::Deny,
            allow: vec![rule("*.example.com"), rule("ok.example.com")],
            deny: vec![rule("bad.example.com")],
            headers: Vec::new(),
        };
        let d = p.decide(&name("bad.example.com"), 443);
        assert!(!d.allowed);
        assert_eq!(d.rule, "bad.example.com");
        let d = p.decide(&name("ok.example.com"), 443);
        assert!(d.allowed);
        assert_eq!(d.rule, "*.example.com");
        assert!(d.exact_allow);
        let d = p.decide(&name("x.example.com"), 443);
        assert!(d.allowed && !d.exact_allow);
        let d = p.decide(&name("other.org"), 443);
        assert!(!d.allowed);
        assert_eq!(d.rule, "default");
        let open = EgressPolicy::default();
        let d = open.decide(&name("other.org"), 443);
        assert!(d.allowed && !d.exact_allow && d.rule == "default");
    }

    #[test]
    fn private_addresses() {
        for private in [
            "127.0.0.1",
            "127.5.5.5",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a00:1",
            "64:ff9b:1::7f00:1",
            "::ffff:0:7f00:1",
            "::127.0.0.1",
            "::ffff:7f00:1",
            "::ffff:192.168.0.1",
            "fd00:ec2::254",
            "2002:7f00:1::1",
            "2002:0808:0808::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "2001:db8::1",
            "100::1",
            "100.64.0.1",
            "100.100.100.200",
            "100.127.255.255",
            "192.0.0.170",
            "192.0.2.1",
            "198.18.0.1",
            "198.51.100.7",
            "203.0.113.9",
            "240.0.0.1",
            "fec0::1",
        ] {
            let ip: IpAddr = private.parse().unwrap();
            assert!(private_reason(ip).is_some(), "{private}");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "192.169.0.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
            "64:ff9b::808:808",
            "100.128.0.1",
            "198.20.0.1",
            "2001:4860:4860::8888",
        ] {
            let ip: IpAddr = public.parse().unwrap();
            assert_eq!(private_reason(ip), None, "{public}");
        }
        for metadata in ["169.254.169.254", "100.100.100.200", "fd00:ec2::254"] {
            assert_eq!(
                private_reason(metadata.parse().unwrap()),
                Some("cloud metadata"),
                "{metadata}"
            );
        }
        assert_eq!(
            private_reason("::ffff:169.254.169.254".parse().unwrap()),
            Some("cloud metadata")
        );
    }

    #[test]
    fn every_spelling_of_an_ipv4_address_is_that_address() {
        let loopback = Host::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));
        for spelling in [
            "127.0.0.1",
            "127.1",
            "127.0.1",
            "2130706433",
            "0x7f000001",
            "0X7F000001",
            "0x7f.0.0.1",
            "0177.0.0.1",
            "0177.0.0.01",
            "017700000001",
            "127.0.0.1.",
            "0x7f.1",
        ] {
            assert_eq!(Host::parse(spelling), Ok(loopback.clone()), "{spelling}");
        }
        assert_eq!(
            Host::parse("0251.0376.0251.0376"),
            Ok(Host::Ip("169.254.169.254".parse().unwrap()))
        );
        assert_eq!(
            Host::parse("0"),
            Ok(Host::Ip(IpAddr::V4(Ipv4Addr::UNSPECIFIED)))
        );
        // Numbers no resolver reads as one address are not names either.
        for bad in [
            "256.0.0.1",
            "1.2.3.4.5",
            "4294967296",
            "0x",
            "08.0.0.1",
            "a.123",
        ] {
            assert!(Host::parse(bad).is_err(), "{bad}");
        }
        // Names with digits stay names.
        for name in ["1.example.com", "0x7f.example", "123abc", "a1"] {
            assert!(matches!(Host::parse(name), Ok(Host::Name(_))), "{name}");
        }
        // A rule spelt like that names the same address.
        assert_eq!(rule("127.1:80"), rule("127.0.0.1:80"));
        assert!(rule("2130706433").matches(&loopback, 9));
    }

    #[test]
    fn destination_hosts() {
        assert_eq!(name("Example.COM"), Host::Name("example.com".into()));
        assert!(matches!(name("::1"), Host::Ip(_)));
        assert!(Host::parse("a_b.com").is_err());
        assert!(Host::parse("[::1]").is_err());
        assert!(Host::parse("").is_err());
        assert!(Host::parse(&"a.".repeat(200)).is_err());
        assert!(name("Example.com").same_name("EXAMPLE.com."));
        assert!(!name("example.com").same_name("example.org"));
        assert!(name("10.0.0.1").same_name("10.0.0.1"));
        assert!(!name("10.0.0.1").same_name("10.0.0.2"));
    }
}
