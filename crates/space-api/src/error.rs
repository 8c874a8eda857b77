//! The error every operation answers with: an HTTP status, the stable code scripts match on,
//! and a message for people. Over HTTP it is the body `{"error": {"code", "message"}}`
//! (`docs/api.md`); inside an exec stream it is the `error` event.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A failed operation, or a failure to reach the API.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The HTTP status (0: the API was not reached, its stream broke, or the error came inside
    /// a stream).
    #[serde(skip)]
    pub status: u16,
    /// The stable code (`sandbox_not_found`, `illegal_state`, ...).
    pub code: String,
    /// What happened, for people.
    pub message: String,
}

/// The body of an error answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: Failure,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

impl std::error::Error for Failure {}

impl Failure {
    /// A failure with a status, code and message.
    pub fn new(status: u16, code: impl Into<String>, message: impl Into<String>) -> Failure {
        Failure {
            status,
            code: code.into(),
            message: message.into(),
        }
    }

    /// A failure that is not an answer of the API (status 0).
    pub fn local(code: &str, message: impl Into<String>) -> Failure {
        Failure::new(0, code, message)
    }

    /// Decodes an error body; anything else names the status and quotes the start of the
    /// body.
    pub fn from_body(status: u16, body: &[u8]) -> Failure {
        let parsed = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
            let e = v.get("error")?;
            Some((
                e.get("code")?.as_str()?.to_owned(),
                e.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            ))
        });
        match parsed {
            Some((code, message)) => Failure::new(status, code, message),
            None => {
                let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
                let text = text.trim();
                let message = if text.is_empty() {
                    format!("the server answered HTTP {status}")
                } else {
                    format!("the server answered HTTP {status}: {text}")
                };
                Failure::new(status, format!("http_{status}"), message)
            }
        }
    }

    /// The body of this error as an answer.
    pub fn body(&self) -> Value {
        serde_json::json!({"error": {"code": self.code, "message": self.message}})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_decode_and_others_are_quoted() {
        let f = Failure::from_body(
            404,
            br#"{"error": {"code": "sandbox_not_found", "message": "no sandbox sbx-1"}}"#,
        );
        assert_eq!((f.status, f.code.as_str()), (404, "sandbox_not_found"));
        assert_eq!(f.to_string(), "no sandbox sbx-1 (sandbox_not_found)");
        let f = Failure::from_body(502, b"<html>bad gateway</html>");
        assert_eq!(f.code, "http_502");
        assert!(f.message.contains("bad gateway"), "{}", f.message);
        let f = Failure::from_body(500, b"");
        assert_eq!(f.message, "the server answered HTTP 500");
    }

    #[test]
    fn the_body_round_trips() {
        let f = Failure::new(429, "quota_exceeded", "max_sandboxes");
        let back = Failure::from_body(429, f.body().to_string().as_bytes());
        assert_eq!(back, f);
    }
}
