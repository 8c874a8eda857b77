//! The public API of space (`docs/api.md`) as Rust types, shared by the server and its
//! clients:
//!
//! - [`model`]: answers and request bodies (sandboxes, snapshots, templates, ports);
//! - [`exec`]: the exec request, its events and the one decoder of the NDJSON stream;
//! - [`error`]: the error every operation answers with;
//! - [`ops`]: the operations every front end offers ([`Operations`]);
//! - [`client`] (feature `client`): the HTTP client the CLI, `space mcp`, the benches and the
//!   tests use.

pub mod error;
pub mod exec;
pub mod metrics;
pub mod model;
pub mod ops;

#[cfg(feature = "client")]
pub mod client;

pub use error::Failure;
pub use exec::{Decoder, EventStream, ExecEvent, ExecRequest};
pub use metrics::{MetricList, MetricSample};
pub use model::*;
pub use ops::{ByteStream, Caller, Operations};

/// Encodes one path segment or query value: unreserved characters stay, the rest is `%XX`.
pub fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn encoding_keeps_unreserved_and_escapes_the_rest() {
        assert_eq!(super::enc("/tmp/a b&c=d"), "%2Ftmp%2Fa%20b%26c%3Dd");
        assert_eq!(super::enc("sbx-00ff_~."), "sbx-00ff_~.");
        assert_eq!(super::enc("é"), "%C3%A9");
    }
}
