//! Headers the gateway sets on a sandbox's requests to some hosts ([`HeaderRule`], held in
//! [`crate::EgressPolicy::headers`]). A value is text in which `${secret:NAME}` stands for the
//! current value of vault secret `NAME`: the gateway puts it in as the request leaves, so it
//! never enters the VM (`docs/egress.md`, *Headers*).

use serde::{Deserialize, Serialize};

use crate::policy::EgressRule;

/// Most header rules a policy holds.
pub const MAX_HEADER_RULES: usize = 64;
/// Longest header name.
pub const MAX_HEADER_NAME: usize = 256;
/// Longest header value as written (before secrets are put in).
pub const MAX_HEADER_VALUE: usize = 8 * 1024;

/// Where a secret reference starts in a value.
const OPEN: &str = "${secret:";

/// Headers that belong to one hop of a connection and are never passed on (RFC 9110 7.6.1,
/// with the proxy ones).
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Besides [`HOP_BY_HOP`], what the gateway sets itself (framing, and what it asks upstream
/// for when it scrubs). A rule may set none of them.
const GATEWAY_OWNED: &[&str] = &["accept-encoding", "content-length", "expect", "host"];

/// One header set (replacing any the request carries under that name, in any case) on every
/// request to a destination `host` matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderRule {
    /// Which destinations (rule syntax, `docs/egress.md`).
    pub host: EgressRule,
    /// The header's name (an HTTP token).
    pub name: String,
    /// Its value: text, with `${secret:NAME}` for a vault secret's value.
    pub value: String,
}

/// A piece of a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part<'a> {
    /// Sent as written.
    Text(&'a str),
    /// The value of this vault secret.
    Secret(&'a str),
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_secret_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && (b[0].is_ascii_uppercase() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
}

/// Splits `value` into text and secret references; an error names a reference that is not
/// `${secret:NAME}` with `NAME` a vault name.
pub fn parse_value(value: &str) -> Result<Vec<Part<'_>>, String> {
    let mut parts = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find(OPEN) {
        if at > 0 {
            parts.push(Part::Text(&rest[..at]));
        }
        let after = &rest[at + OPEN.len()..];
        let end = after.find('}').ok_or_else(|| {
            format!("a secret reference in a header value has no closing '}}' ({OPEN}NAME}})")
        })?;
        let name = &after[..end];
        if !is_secret_name(name) {
            return Err(format!(
                "secret reference {:?} in a header value: the name must match \
                 [A-Z_][A-Z0-9_]{{0,63}}",
                name.chars().take(80).collect::<String>()
            ));
        }
        parts.push(Part::Secret(name));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest));
    }
    Ok(parts)
}

impl HeaderRule {
    /// Checks the name (a token the gateway does not own), the value (printable, bounded,
    /// references well formed).
    pub fn validate(&self) -> Result<(), String> {
        let n = &self.name;
        if n.is_empty() || n.len() > MAX_HEADER_NAME || !n.bytes().all(is_token_byte) {
            return Err(format!(
                "header name {:?} must be 1 to {MAX_HEADER_NAME} token characters \
                 (letters, digits, !#$%&'*+-.^_`|~)",
                n.chars().take(80).collect::<String>()
            ));
        }
        if HOP_BY_HOP
            .iter()
            .chain(GATEWAY_OWNED)
            .any(|r| n.eq_ignore_ascii_case(r))
        {
            return Err(format!(
                "header {n} is set by the gateway itself and may not be set by a rule"
            ));
        }
        if self.value.len() > MAX_HEADER_VALUE {
            return Err(format!(
                "the value of header {n} is {} bytes; at most {MAX_HEADER_VALUE}",
                self.value.len()
            ));
        }
        // ASCII control characters but the tab break a header; other characters travel as
        // UTF-8 bytes, which HTTP allows in values.
        if let Some(c) = self
            .value
            .chars()
            .find(|c| c.is_ascii_control() && *c != '\t')
        {
            return Err(format!(
                "the value of header {n} holds the control character {c:?}"
            ));
        }
        parse_value(&self.value).map(|_| ())
    }

    /// The value's pieces (the rule is valid).
    pub fn parts(&self) -> Vec<Part<'_>> {
        parse_value(&self.value).unwrap_or_else(|_| vec![Part::Text(&self.value)])
    }

    /// The vault secrets the value names, each once.
    pub fn secrets(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for p in self.parts() {
            if let Part::Secret(s) = p {
                if !out.contains(&s) {
                    out.push(s);
                }
            }
        }
        out
    }
}

/// Checks a policy's header rules: each valid, at most [`MAX_HEADER_RULES`].
pub fn validate_headers(rules: &[HeaderRule]) -> Result<(), String> {
    if rules.len() > MAX_HEADER_RULES {
        return Err(format!(
            "the egress policy has {} header rules; at most {MAX_HEADER_RULES}",
            rules.len()
        ));
    }
    rules.iter().try_for_each(HeaderRule::validate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(name: &str, value: &str) -> HeaderRule {
        HeaderRule {
            host: "api.example.com".parse().unwrap(),
            name: name.into(),
            value: value.into(),
        }
    }

    #[test]
    fn values_split_into_text_and_secrets() {
        assert_eq!(
            parse_value("Bearer ${secret:API_KEY}").unwrap(),
            vec![Part::Text("Bearer "), Part::Secret("API_KEY")]
        );
        assert_eq!(
            parse_value("${secret:A}:${secret:_B2}!").unwrap(),
            vec![
                Part::Secret("A"),
                Part::Text(":"),
                Part::Secret("_B2"),
                Part::Text("!")
            ]
        );
        assert_eq!(
            parse_value("plain ${x}").unwrap(),
            vec![Part::Text("plain ${x}")]
        );
        assert!(parse_value("").unwrap().is_empty());
        assert!(parse_value("${secret:lower}").is_err());
        assert!(parse_value("${secret:OPEN").is_err());
        assert!(parse_value("${secret:}").is_err());
        assert_eq!(rule("X", "${secret:A}${secret:A}").secrets(), vec!["A"]);
    }

    #[test]
    fn names_and_values_are_checked() {
        assert!(rule("Authorization", "Bearer ${secret:T}")
            .validate()
            .is_ok());
        assert!(rule("X-Api-Key", "\tk").validate().is_ok());
        for bad in [
            "",
            "Bad Name",
            "a:b",
            "Host",
            "content-LENGTH",
            "Transfer-Encoding",
        ] {
            assert!(rule(bad, "v").validate().is_err(), "{bad:?}");
        }
        for bad in ["a\r\nInjected: 1", "nul\0", "del\u{7f}", "esc\u{1b}"] {
            assert!(rule("X", bad).validate().is_err(), "{bad:?}");
        }
        // The API document admits what is not an ASCII control character.
        assert!(rule("X", "\u{99}\u{a7}é").validate().is_ok());
        assert!(rule("X", &"v".repeat(MAX_HEADER_VALUE + 1))
            .validate()
            .is_err());
        let many = vec![rule("X", "v"); MAX_HEADER_RULES + 1];
        assert!(validate_headers(&many).is_err());
        assert!(validate_headers(&many[..MAX_HEADER_RULES]).is_ok());
    }

    #[test]
    fn rules_read_as_they_are_written() {
        let json = serde_json::json!({"host": "*.example.com:443", "name": "X-Key",
            "value": "${secret:K}"});
        let r: HeaderRule = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(serde_json::to_value(&r).unwrap(), json);
        assert!(serde_json::from_value::<HeaderRule>(
            serde_json::json!({"host": "a.b", "name": "X", "value": "", "extra": 1})
        )
        .is_err());
    }
}
