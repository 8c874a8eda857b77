//! Query strings and guest paths.
//!
//! Paths travel percent-encoded in query strings (`?path=/a%20b`). The encoder escapes every
//! byte outside `A-Z a-z 0-9 - . _ ~ /`; the decoder takes `+` literally (this is not HTML form
//! encoding) and insists on valid UTF-8. [`validate_path`] is the one rule for what a guest path
//! may be: absolute, UTF-8, no NUL, at most `MAX_PATH_LEN` bytes.

use crate::error::ProtoError;
use crate::limits::{MAX_PATH_LEN, MAX_XATTR_NAME, MAX_XATTR_VALUE};

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/')
}

/// Percent-encodes one query component.
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if is_unreserved(b) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[(b >> 4) as usize]));
            out.push(char::from(b"0123456789ABCDEF"[(b & 15) as usize]));
        }
    }
    out
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes one percent-encoded component; `None` on a bad escape or invalid UTF-8.
pub fn decode_component(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hi = hex(*bytes.get(i + 1)?)?;
            let lo = hex(*bytes.get(i + 2)?)?;
            out.push(hi << 4 | lo);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Parses `a=1&b=2` into decoded pairs. A parameter given twice is an error rather than a
/// silent pick of one, since the two ends might pick differently.
pub fn parse_query(query: Option<&str>) -> Result<Vec<(String, String)>, ProtoError> {
    let mut out: Vec<(String, String)> = Vec::new();
    let Some(q) = query else { return Ok(out) };
    for part in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let k = decode_component(k)
            .ok_or_else(|| ProtoError::invalid("query parameter name is not valid"))?;
        let v = decode_component(v)
            .ok_or_else(|| ProtoError::invalid(format!("query parameter {k} is not valid")))?;
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(ProtoError::invalid(format!(
                "query parameter {k} given more than once"
            )));
        }
        out.push((k, v));
    }
    Ok(out)
}

/// The one rule for guest paths.
pub fn validate_path(path: &str) -> Result<(), ProtoError> {
    if path.is_empty() {
        return Err(ProtoError::invalid("path is empty"));
    }
    if !path.starts_with('/') {
        return Err(ProtoError::invalid(format!(
            "path {path:?} is not absolute"
        )));
    }
    if path.contains('\0') {
        return Err(ProtoError::invalid("path contains a NUL byte"));
    }
    if path.len() > MAX_PATH_LEN {
        return Err(ProtoError::invalid(format!(
            "path is {} bytes long; the limit is {MAX_PATH_LEN}",
            path.len()
        )));
    }
    Ok(())
}

/// The one rule for an extended attribute the protocol carries: a name in the `user.`
/// namespace (at most `MAX_XATTR_NAME` bytes, no NUL, something after the prefix) and a
/// UTF-8 value of at most `MAX_XATTR_VALUE` bytes.
pub fn validate_xattr(name: &str, value: &str) -> Result<(), ProtoError> {
    let bad = |why: &str| {
        Err(ProtoError::invalid(format!(
            "extended attribute {name:?}: {why}"
        )))
    };
    if !name.starts_with("user.") || name.len() == "user.".len() {
        return bad("names are user.<something>");
    }
    if name.len() > MAX_XATTR_NAME || name.contains('\0') {
        return bad("the name is too long or has a NUL");
    }
    if value.len() > MAX_XATTR_VALUE {
        return bad("the value is too long");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xattrs_are_user_names_with_bounded_values() {
        assert!(validate_xattr("user.e2b.team", "infra").is_ok());
        assert!(validate_xattr("user.", "x").is_err());
        assert!(validate_xattr("trusted.x", "x").is_err());
        assert!(validate_xattr(&format!("user.{}", "n".repeat(251)), "x").is_err());
        assert!(validate_xattr("user.a\0b", "x").is_err());
        assert!(validate_xattr("user.big", &"v".repeat(MAX_XATTR_VALUE + 1)).is_err());
    }

    #[test]
    fn encode_decode_round_trip() {
        for s in ["/a b/c", "/weird&=?#%+", "/ünï/😀", "/plain/path-1.txt"] {
            let e = encode_component(s);
            assert!(!e.contains(['&', '=', ' ', '#', '?', '+']));
            assert_eq!(decode_component(&e).as_deref(), Some(s));
        }
    }

    #[test]
    fn decode_rejects_bad_input() {
        assert_eq!(decode_component("%"), None);
        assert_eq!(decode_component("%4"), None);
        assert_eq!(decode_component("%zz"), None);
        assert_eq!(decode_component("%ff%fe"), None);
        assert_eq!(decode_component("a+b").as_deref(), Some("a+b"));
    }

    #[test]
    fn parse_query_pairs() {
        let q = parse_query(Some("path=%2Fx%20y&parents=true&flag")).unwrap();
        assert_eq!(
            q,
            vec![
                ("path".into(), "/x y".into()),
                ("parents".into(), "true".into()),
                ("flag".into(), String::new())
            ]
        );
        assert!(parse_query(Some("a=1&a=2")).is_err());
        assert!(parse_query(None).unwrap().is_empty());
    }

    #[test]
    fn path_rules() {
        assert!(validate_path("/ok").is_ok());
        assert!(validate_path("").is_err());
        assert!(validate_path("relative").is_err());
        assert!(validate_path("/a\0b").is_err());
        assert!(validate_path(&format!("/{}", "a".repeat(MAX_PATH_LEN))).is_err());
    }
}
