//! A secret's value inside bodies: how each kind of request body carries it (form-encoded,
//! JSON-escaped, as is), putting values in place of placeholders in a request body, and the
//! streaming [`Scrubber`] that turns a value, in each encoding it may come back in, into its
//! placeholder again.

use memchr::memmem;

use super::{SecretBinding, SecretValue};

/// How a request body carries text, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// `application/x-www-form-urlencoded`: the value form-encoded.
    Form,
    /// `application/json` and `application/*+json`: the value JSON-escaped (inside the
    /// string the placeholder stood in).
    Json,
    /// Anything else (`multipart/form-data`, `text/plain`, none): the value as is.
    Raw,
}

impl BodyKind {
    /// The kind of a body with this `Content-Type` value.
    pub fn of(content_type: Option<&[u8]>) -> BodyKind {
        let Some(ct) = content_type else {
            return BodyKind::Raw;
        };
        let media = ct.split(|&b| b == b';').next().unwrap_or_default();
        let media = String::from_utf8_lossy(media).trim().to_ascii_lowercase();
        if media == "application/x-www-form-urlencoded" {
            BodyKind::Form
        } else if media == "application/json"
            || (media.starts_with("application/") && media.ends_with("+json"))
        {
            BodyKind::Json
        } else {
            BodyKind::Raw
        }
    }

    /// `value` as this kind of body writes it; `Err` when it cannot be (JSON holds text
    /// only).
    pub fn encode(self, value: &[u8]) -> Result<Vec<u8>, &'static str> {
        match self {
            BodyKind::Form => Ok(percent(value, true, true)),
            BodyKind::Json => std::str::from_utf8(value)
                .map(|v| json(v, Json::Plain))
                .map_err(|_| "a JSON body holds text, and the value is not UTF-8"),
            BodyKind::Raw => Ok(value.to_vec()),
        }
    }
}

/// Percent-encodes all but ASCII letters, digits and `*-._` (the form-urlencoded set);
/// `plus`: a space is `+`.
fn percent(value: &[u8], plus: bool, upper: bool) -> Vec<u8> {
    let digits: &[u8; 16] = if upper {
        b"0123456789ABCDEF"
    } else {
        b"0123456789abcdef"
    };
    let mut out = Vec::with_capacity(value.len() * 3);
    for &b in value {
        if b.is_ascii_alphanumeric() || b"*-._".contains(&b) {
            out.push(b);
        } else if b == b' ' && plus {
            out.push(b'+');
        } else {
            out.extend_from_slice(&[
                b'%',
                digits[usize::from(b >> 4)],
                digits[usize::from(b & 15)],
            ]);
        }
    }
    out
}

/// The ways a JSON writer escapes a string.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Json {
    /// Only what must be: `"`, `\` and control characters.
    Plain,
    /// Also every non-ASCII character as `\uXXXX` (Python's default).
    Ascii,
    /// Also `<`, `>` and `&` as `\u003c`... (Go's default).
    HtmlSafe,
}

fn json(value: &str, style: Json) -> Vec<u8> {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            '<' | '>' | '&' if style == Json::HtmlSafe => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if !c.is_ascii() && style == Json::Ascii => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{u:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.into_bytes()
}

fn html(value: &str, apostrophe: &str) -> Vec<u8> {
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str(apostrophe),
            c => out.push(c),
        }
    }
    out.into_bytes()
}

/// The forms a value may come back in from a site it was sent to: as is, form- and
/// percent-encoded (either case of hex digits), JSON-escaped as common writers do it, and
/// HTML-escaped; each once.
pub fn echo_forms(value: &[u8]) -> Vec<SecretValue> {
    let mut forms = vec![
        value.to_vec(),
        percent(value, true, true),
        percent(value, true, false),
        percent(value, false, true),
        percent(value, false, false),
    ];
    if let Ok(text) = std::str::from_utf8(value) {
        forms.push(json(text, Json::Plain));
        forms.push(json(text, Json::Ascii));
        forms.push(json(text, Json::HtmlSafe));
        forms.push(html(text, "&#39;"));
        forms.push(html(text, "&#x27;"));
    }
    let mut out: Vec<SecretValue> = Vec::with_capacity(forms.len());
    for f in forms {
        if f.is_empty() || out.iter().any(|o| o.as_bytes() == f.as_slice()) {
            drop(SecretValue::new(f));
        } else {
            out.push(SecretValue::new(f));
        }
    }
    out
}

/// Puts each value whose placeholder appears in `body` in its place, encoded for `kind`;
/// returns the new body and the names of the secrets put in. The result holds secrets.
pub fn substitute(
    body: &[u8],
    kind: BodyKind,
    secrets: &[(&SecretBinding, SecretValue)],
) -> Result<(SecretValue, Vec<String>), String> {
    let mut cur = SecretValue::new(body.to_vec());
    let mut used = Vec::new();
    for (b, v) in secrets {
        let needle = b.placeholder.as_bytes();
        if memmem::find(cur.as_bytes(), needle).is_none() {
            continue;
        }
        let encoded = SecretValue::new(
            kind.encode(v.as_bytes())
                .map_err(|e| format!("credential {}: {e}", b.name))?,
        );
        let mut next = Vec::with_capacity(cur.as_bytes().len() + encoded.as_bytes().len());
        let mut rest = cur.as_bytes();
        while let Some(at) = memmem::find(rest, needle) {
            next.extend_from_slice(&rest[..at]);
            next.extend_from_slice(encoded.as_bytes());
            rest = &rest[at + needle.len()..];
        }
        next.extend_from_slice(rest);
        cur = SecretValue::new(next);
        used.push(b.name.clone());
    }
    Ok((cur, used))
}

/// Replaces every occurrence of the given values (each in all of its [`echo_forms`]) with
/// the text that stands for it (a binding's placeholder, a header rule's reference), over a stream cut anywhere: bytes that could be the start
/// of a value are held until the next push shows what follows.
pub struct Scrubber {
    /// (form of a value, index of its placeholder).
    patterns: Vec<(SecretValue, usize)>,
    placeholders: Vec<String>,
    longest: usize,
    /// The bytes held back from the last push.
    pending: Scratch,
    /// Held bytes and the next input together, reused push after push.
    work: Scratch,
}

/// A buffer that may hold secrets, reused rather than reallocated, and overwritten with zeros
/// (its whole capacity) once, when dropped: wiping every piece of a stream as it passes would
/// cost a pass over each byte.
#[derive(Default)]
pub struct Scratch(pub Vec<u8>);

impl Drop for Scratch {
    fn drop(&mut self) {
        self.0.resize(self.0.capacity(), 0);
        SecretValue::wipe(&mut self.0);
    }
}

impl std::ops::Deref for Scratch {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl std::ops::DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.0
    }
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("patterns", &self.patterns.len())
            .finish_non_exhaustive()
    }
}

impl Scrubber {
    /// A scrubber for these values, each with the text that replaces it.
    pub fn new<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Scrubber {
        let mut patterns = Vec::new();
        let mut placeholders = Vec::new();
        for (stands_for, value) in secrets {
            placeholders.push(stands_for.to_owned());
            for form in echo_forms(value) {
                patterns.push((form, placeholders.len() - 1));
            }
        }
        let longest = patterns
            .iter()
            .map(|(p, _)| p.as_bytes().len())
            .max()
            .unwrap_or(0);
        Scrubber {
            patterns,
            placeholders,
            longest,
            pending: Scratch::default(),
            work: Scratch::default(),
        }
    }

    /// Whether there is nothing to look for.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The earliest occurrence of any form in `hay` (the longest when several start
    /// there): (offset, its length, its placeholder).
    fn earliest(&self, hay: &[u8]) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None;
        for (p, idx) in &self.patterns {
            let p = p.as_bytes();
            if let Some(at) = memmem::find(hay, p) {
                let better = match best {
                    None => true,
                    Some((b_at, b_len, _)) => at < b_at || (at == b_at && p.len() > b_len),
                };
                if better {
                    best = Some((at, p.len(), *idx));
                }
            }
        }
        best
    }

    /// Takes the next bytes of the stream; appends to `out` what is safe to pass on.
    pub fn push(&mut self, input: &[u8], out: &mut Vec<u8>) {
        if self.patterns.is_empty() {
            out.extend_from_slice(input);
            return;
        }
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        work.extend_from_slice(&self.pending);
        work.extend_from_slice(input);
        let mut start = 0;
        while let Some((at, len, idx)) = self.earliest(&work[start..]) {
            out.extend_from_slice(&work[start..start + at]);
            out.extend_from_slice(self.placeholders[idx].as_bytes());
            start += at + len;
        }
        // A value may begin in the last longest-1 bytes: keep them for the next push.
        let keep = work.len().saturating_sub(self.longest - 1).max(start);
        out.extend_from_slice(&work[start..keep]);
        self.pending.clear();
        self.pending.extend_from_slice(&work[keep..]);
        self.work = work;
    }

    /// The stream ended: appends what was held back.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.pending);
        self.pending.clear();
    }

    /// Scrubs one whole piece (a header value).
    pub fn scrub_all(&self, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(input.len());
        let mut start = 0;
        while let Some((at, len, idx)) = self.earliest(&input[start..]) {
            out.extend_from_slice(&input[start..start + at]);
            out.extend_from_slice(self.placeholders[idx].as_bytes());
            start += at + len;
        }
        out.extend_from_slice(&input[start..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(n: u8) -> SecretBinding {
        SecretBinding {
            name: format!("S{n}"),
            placeholder: format!("space-secret-{}", format!("{n:x}").repeat(32)),
            hosts: vec!["login.example".parse().unwrap()],
        }
    }

    #[test]
    fn kinds_from_content_types() {
        let of = |s: &str| BodyKind::of(Some(s.as_bytes()));
        assert_eq!(
            of("application/x-www-form-urlencoded; charset=UTF-8"),
            BodyKind::Form
        );
        assert_eq!(of("Application/JSON"), BodyKind::Json);
        assert_eq!(of("application/vnd.api+json"), BodyKind::Json);
        assert_eq!(of("multipart/form-data; boundary=x"), BodyKind::Raw);
        assert_eq!(of("text/plain"), BodyKind::Raw);
        assert_eq!(BodyKind::of(None), BodyKind::Raw);
    }

    #[test]
    fn values_are_encoded_per_kind() {
        let v = "p@ss wörd&\"x\"\\\n+%";
        assert_eq!(
            BodyKind::Form.encode(v.as_bytes()).unwrap(),
            b"p%40ss+w%C3%B6rd%26%22x%22%5C%0A%2B%25"
        );
        assert_eq!(
            BodyKind::Json.encode(v.as_bytes()).unwrap(),
            "p@ss wörd&\\\"x\\\"\\\\\\n+%".as_bytes()
        );
        assert_eq!(BodyKind::Raw.encode(v.as_bytes()).unwrap(), v.as_bytes());
        assert!(BodyKind::Json.encode(b"\xff").is_err());
        // Decoders give the value back.
        let json_doc = format!(
            "\"{}\"",
            String::from_utf8(BodyKind::Json.encode(v.as_bytes()).unwrap()).unwrap()
        );
        assert_eq!(serde_json::from_str::<String>(&json_doc).unwrap(), v);
    }

    #[test]
    fn placeholders_in_bodies_become_values() {
        let a = binding(1);
        let b = binding(2);
        let body = format!(
            "user=me&password={}&again={}&other={}",
            a.placeholder, a.placeholder, b.placeholder
        );
        let secrets = vec![(&a, SecretValue::new(b"a b&c".to_vec()))];
        let (out, used) = substitute(body.as_bytes(), BodyKind::Form, &secrets).unwrap();
        assert_eq!(
            String::from_utf8(out.as_bytes().to_vec()).unwrap(),
            format!(
                "user=me&password=a+b%26c&again=a+b%26c&other={}",
                b.placeholder
            )
        );
        assert_eq!(used, vec!["S1".to_owned()]);
        let (out, used) = substitute(b"nothing here", BodyKind::Raw, &secrets).unwrap();
        assert_eq!(out.as_bytes(), b"nothing here");
        assert!(used.is_empty());
        let bad = vec![(&a, SecretValue::new(b"\xfe".to_vec()))];
        let err = substitute(body.as_bytes(), BodyKind::Json, &bad).unwrap_err();
        assert!(err.contains("S1"), "{err}");
    }

    /// Scrubs `input` cut into pieces of `step` bytes.
    fn stream(s: &mut Scrubber, input: &[u8], step: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in input.chunks(step.max(1)) {
            s.push(piece, &mut out);
        }
        s.finish(&mut out);
        out
    }

    #[test]
    fn echoes_are_scrubbed_wherever_the_stream_is_cut() {
        let a = binding(3);
        let b = binding(4);
        let value = "hunter2 <&'\"é>".as_bytes();
        let other = b"swordfish".as_slice();
        let mut page = b"<p>You sent ".to_vec();
        for f in echo_forms(value) {
            page.extend_from_slice(f.as_bytes());
            page.extend_from_slice(b" | ");
        }
        page.extend_from_slice(b"and swordfishswordfish; hunter2 alone stays.");
        let expected_forms = echo_forms(value).len();
        assert!(expected_forms >= 8, "{expected_forms}");
        for step in [1, 2, 3, 7, 16, 45, 1000] {
            let mut s = Scrubber::new([
                (a.placeholder.as_str(), value),
                (b.placeholder.as_str(), other),
            ]);
            let out = stream(&mut s, &page, step);
            let text = String::from_utf8(out).unwrap();
            assert_eq!(
                text.matches(&a.placeholder).count(),
                expected_forms,
                "step {step}: {text}"
            );
            assert_eq!(text.matches(&b.placeholder).count(), 2, "step {step}");
            for f in echo_forms(value).iter().chain(echo_forms(other).iter()) {
                assert!(
                    memmem::find(text.as_bytes(), f.as_bytes()).is_none(),
                    "step {step}"
                );
            }
            assert!(text.ends_with("hunter2 alone stays."), "{text}");
        }
        // Nothing to look for: bytes pass as they are.
        let mut none = Scrubber::new(std::iter::empty());
        assert!(none.is_empty());
        assert_eq!(stream(&mut none, b"abc", 1), b"abc");
        let s = Scrubber::new([(b.placeholder.as_str(), other)]);
        assert_eq!(
            s.scrub_all(b"x=swordfish"),
            format!("x={}", b.placeholder).into_bytes()
        );
    }
}
