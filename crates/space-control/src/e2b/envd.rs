//! envd, the in-sandbox API of E2B's SDKs, served by the control plane for every sandbox:
//! a request names its sandbox with the `E2b-Sandbox-Id` header (or the `49983-{id}.{domain}`
//! host) and proves it may reach it with `X-Access-Token`, the sandbox's envd access token
//! (`super::access_token`). Calls become guest-protocol calls on the sandbox's guest, through
//! the node, like every `/v1` stream.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::json;
use space_node_api::SandboxId;

use super::connect::{Code, RpcError, RpcResult};
use super::E2bState;
use crate::api::Shared;

/// The account commands run as when the client names none (E2B's convention), when the
/// sandbox's image has it; else root.
pub const DEFAULT_USER: &str = "user";

/// One envd request's sandbox and guest.
pub struct Envd {
    pub st: Shared,
    pub e2b: Arc<E2bState>,
    pub id: SandboxId,
    pub guest: space_proto::GuestClient,
    /// The user named by `Authorization: Basic <user>:`, if any.
    pub user: Option<String>,
}

impl Envd {
    /// The account to run as: the one named, or [`DEFAULT_USER`] where it exists.
    pub async fn username(&self) -> RpcResult<String> {
        if let Some(u) = &self.user {
            return Ok(u.clone());
        }
        if let Some(has) = self.e2b.has_default_user(&self.id) {
            return Ok(if has { DEFAULT_USER } else { "root" }.into());
        }
        let has = match self.guest.account(DEFAULT_USER).await {
            Ok(_) => true,
            Err(e) if e.kind() == Some(space_proto::ErrorKind::NotFound) => false,
            Err(e) => return Err(e.into()),
        };
        self.e2b.set_default_user(&self.id, has);
        Ok(if has { DEFAULT_USER } else { "root" }.into())
    }

    /// Counts the request as activity of the sandbox (its idle clock).
    pub fn touch(&self) {
        let (node, id) = (self.st.node.clone(), self.id.clone());
        tokio::spawn(async move {
            let _ = node.touch(&id).await;
        });
    }
}

/// The answer E2B's sandbox proxy gives for a sandbox that is not there (or not running):
/// the SDKs read "was not found" in it as "the sandbox is not running".
pub fn sandbox_gone(id: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json!({"code": 502, "message": format!("The sandbox {id} was not found")}).to_string(),
    )
        .into_response()
}

fn unauthorized(message: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json!({"code": 401, "message": message}).to_string(),
    )
        .into_response()
}

/// The user of `Authorization: Basic base64(user:)`.
fn basic_user(headers: &HeaderMap) -> Result<Option<String>, RpcError> {
    let Some(v) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let bad = || {
        RpcError::new(
            Code::Unauthenticated,
            "the Authorization header is not Basic <user>:",
        )
    };
    let text = v.to_str().map_err(|_| bad())?;
    let Some(b64) = text.strip_prefix("Basic ") else {
        return Err(bad());
    };
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|_| bad())?;
    let raw = String::from_utf8(raw).map_err(|_| bad())?;
    let user = raw.split_once(':').map_or(raw.as_str(), |(u, _)| u);
    Ok((!user.is_empty()).then(|| user.to_owned()))
}

/// What a `/files` request's signature says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signed {
    /// It carries none (or is not a signed kind of request).
    No,
    /// A valid signature of sandbox `id`, not expired.
    Valid,
    /// A signature that is not the sandbox's.
    Invalid,
    /// The sandbox's signature, past its expiration.
    Expired,
}

/// Checks a `/files` request's signature of sandbox `id`, as the SDKs sign file URLs: `v1_`
/// and the unpadded base64 of SHA-256 over `path:operation:user:token` (`:expiration`
/// appended when it has one), `read` for a download and `write` for an upload. The signature
/// is checked before the expiration, as envd does, so a forger never learns which failed.
fn signed(e2b: &E2bState, id: &SandboxId, method: &Method, query: Option<&str>) -> Signed {
    use sha2::Digest;
    use subtle::ConstantTimeEq;
    let Ok(pairs) = space_proto::query::parse_query(query) else {
        return Signed::No;
    };
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    let (Some(path), Some(signature)) = (get("path"), get("signature")) else {
        return Signed::No;
    };
    let operation = match *method {
        Method::GET => "read",
        Method::POST => "write",
        _ => return Signed::Invalid,
    };
    let user = get("username").unwrap_or("");
    let token = e2b.access_token(id);
    let mut raw = format!("{path}:{operation}:{user}:{token}");
    let mut expires = None;
    if let Some(exp) = get("signature_expiration") {
        let Ok(exp) = exp.parse::<u64>() else {
            return Signed::Invalid;
        };
        raw.push_str(&format!(":{exp}"));
        expires = Some(exp);
    }
    let want = format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(sha2::Sha256::digest(raw))
    );
    if want.len() != signature.len() || !bool::from(want.as_bytes().ct_eq(signature.as_bytes())) {
        return Signed::Invalid;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match expires {
        Some(exp) if exp <= now => Signed::Expired,
        _ => Signed::Valid,
    }
}

/// Serves one envd request for sandbox `raw_id`.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    st: Shared,
    e2b: Arc<E2bState>,
    raw_id: &str,
    method: Method,
    path: &str,
    query: Option<&str>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let Ok(id) = raw_id.parse::<SandboxId>() else {
        return sandbox_gone(raw_id);
    };
    // The token first: nothing about a sandbox is told to whoever cannot show its token, or
    // (a file URL handed out) a signature made with it.
    let token = headers
        .get("x-access-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let signature = if token.is_empty() && path == "/files" {
        signed(&e2b, &id, &method, query)
    } else {
        Signed::No
    };
    match signature {
        Signed::Invalid => return unauthorized("invalid signature"),
        Signed::Expired => return unauthorized("signature is already expired"),
        Signed::No | Signed::Valid => {}
    }
    if signature != Signed::Valid && !e2b.token_ok(&id, token) {
        return unauthorized(if token.is_empty() {
            "this sandbox's envd needs its access token (X-Access-Token)"
        } else {
            "the access token is not this sandbox's"
        });
    }
    match st.store.sandbox_tenant(id.as_str()).await {
        Ok(Some(_)) => {}
        _ => return sandbox_gone(raw_id),
    }
    let guest = match st.guest(None, &id).await {
        Ok(g) => g,
        Err(_) => return sandbox_gone(raw_id),
    };
    let user = match basic_user(&headers) {
        Ok(u) => u,
        Err(e) => return e.unary(),
    };
    let e = Envd {
        st,
        e2b,
        id,
        guest,
        user,
    };
    use super::process as p;
    match (method, path) {
        (Method::GET, "/health") => StatusCode::NO_CONTENT.into_response(),
        (Method::GET, "/files") => super::files::download(e, query).await,
        (Method::POST, "/files") => super::files::upload(e, query, headers, body).await,
        (Method::POST, rpc) if rpc.starts_with("/filesystem.Filesystem/") => {
            let method = rpc["/filesystem.Filesystem/".len()..].to_owned();
            super::filesystem::call(e, &method, headers, body).await
        }
        (Method::POST, "/process.Process/Start") => p::start(e, headers, body).await,
        (Method::POST, "/process.Process/Connect") => p::connect(e, headers, body).await,
        (Method::POST, "/process.Process/List") => p::list(e, headers, body).await,
        (Method::POST, "/process.Process/SendInput") => p::send_input(e, headers, body).await,
        (Method::POST, "/process.Process/StreamInput") => p::stream_input(e, headers, body).await,
        (Method::POST, "/process.Process/SendSignal") => p::send_signal(e, headers, body).await,
        (Method::POST, "/process.Process/CloseStdin") => p::close_stdin(e, headers, body).await,
        (Method::POST, "/process.Process/Update") => p::update(e, headers, body).await,
        (m, other) => RpcError::new(
            Code::Unimplemented,
            format!("envd has no route {m} {other}"),
        )
        .unary(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_users_are_read_and_bad_headers_refused() {
        let mut h = HeaderMap::new();
        assert_eq!(basic_user(&h).unwrap(), None);
        h.insert("authorization", "Basic dXNlcjo=".parse().unwrap());
        assert_eq!(basic_user(&h).unwrap().as_deref(), Some("user"));
        h.insert("authorization", "Basic cm9vdA==".parse().unwrap());
        assert_eq!(basic_user(&h).unwrap().as_deref(), Some("root"));
        for bad in ["Bearer x", "Basic !!!", "Basic"] {
            h.insert("authorization", bad.parse().unwrap());
            assert_eq!(
                basic_user(&h).unwrap_err().code,
                Code::Unauthenticated,
                "{bad}"
            );
        }
    }
}
