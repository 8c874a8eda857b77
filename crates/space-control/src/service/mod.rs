//! The service layer: one function per operation of the API, under every protocol that
//! offers it. `/v1` ([`crate::api`]), the E2B facade ([`crate::e2b`]) and MCP (through
//! [`in_process::InProcess`]) read their requests, call these, and write the answers in their
//! own shapes; the operations scope ids to the caller's tenant, wake sleeping sandboxes,
//! admit quotas and audit, and fail with the one error type, [`crate::error::ApiError`],
//! which each protocol maps to its error shape in one place (`error.rs` for `/v1`,
//! `e2b/rest.rs` and `e2b/connect.rs` for E2B, [`in_process`] for MCP).
//!
//! - [`sandboxes`]: the sandbox view, listing, lifecycle, fork, timeouts, snapshots;
//! - [`create`]: creates, once per idempotency key;
//! - [`exec`]: commands and their events;
//! - [`files`]: file reads, writes and file system operations;
//! - [`ports`]: exposed ports;
//! - [`templates`]: the templates a caller sees;
//! - [`browser`]: the sandbox's Chromium for automation clients, and its live view.

pub mod browser;
pub mod cdp;
pub mod create;
pub mod exec;
pub mod files;
pub mod fill;
pub mod in_process;
pub mod ports;
pub mod sandboxes;
pub mod templates;
pub mod volumes;

pub use crate::api::Shared;

use crate::error::{ApiError, ApiResult};

/// The `http(s)://host` URLs made for a caller start with: the server's public URL, else the
/// `Host` the caller reached the server by (`https` when it came over TLS).
pub fn public_base(st: &Shared, host: Option<&str>, tls: bool) -> ApiResult<String> {
    if let Some(u) = &st.public_url {
        return Ok(u.clone());
    }
    let host = host
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 261
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .ok_or_else(|| {
            ApiError::invalid("the request has no usable Host header to build a URL on")
        })?;
    Ok(format!("{}://{host}", if tls { "https" } else { "http" }))
}
