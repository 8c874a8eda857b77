//! The API's error: an HTTP status, a stable machine-readable code and a message for people,
//! answered as `{"error": {"code": "...", "message": "..."}}` (see `docs/api.md`).
//!
//! It is the one error of the service layer ([`crate::service`]): every failure an operation
//! meets (node refusals and failures, guest errors, store errors, JSON and query rejections)
//! is mapped to it here, in one place, so equal causes answer alike under every protocol.
//! Each protocol then maps it to its own shape in one place: [`IntoResponse`] here for `/v1`,
//! `E2bError` and `RpcError` for the E2B facade, [`crate::service::in_process::failure`] for
//! MCP. A guest's failure keeps the guest's own kind ([`ApiError::guest`]), for protocols
//! that tell more kinds apart than `/v1`'s codes do.

use std::fmt::Write as _;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use space_node_api::{Fault, FaultCode, SandboxId};
use space_proto::{ClientError, ErrorKind};

use crate::store::{AuthError, StoreError};

/// One failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable code (`sandbox_not_found`, `quota_exceeded`, ...).
    pub code: &'static str,
    /// What happened, for people.
    pub message: String,
    /// The guest's kind of error, when the guest failed the operation.
    pub guest: Option<ErrorKind>,
}

/// Shorthand for handler results.
pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// An error of any status and code.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            guest: None,
        }
    }

    /// `400 invalid_request`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// `400 invalid_id`.
    pub fn invalid_id(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_id", message)
    }

    /// `401 unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// `403 forbidden`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    /// `404 sandbox_not_found`, worded the same for a missing sandbox and another tenant's.
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "sandbox_not_found",
            format!("no sandbox {id} in this tenant"),
        )
    }

    /// `404 snapshot_not_found`.
    pub fn snapshot_not_found(sandbox: &str, snapshot: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "snapshot_not_found",
            format!("sandbox {sandbox} has no snapshot {snapshot}"),
        )
    }

    /// `404 route_not_found`.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        let path: String = path.chars().take(200).collect();
        Self::new(
            StatusCode::NOT_FOUND,
            "route_not_found",
            format!("no route {method} {path}"),
        )
    }

    /// `405 method_not_allowed`.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        let path: String = path.chars().take(200).collect();
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} is not allowed on {path}"),
        )
    }

    /// `409 conflict`.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// `413 payload_too_large`.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }

    /// `429 quota_exceeded`.
    pub fn quota(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
    }

    /// `500 internal`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// `502 guest_error`.
    pub fn guest(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, "guest_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code, "message": self.message}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// An error and every cause under it, joined with `: `.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !s.ends_with(&text) {
            let _ = write!(s, ": {text}");
        }
        cur = c.source();
    }
    s
}

/// `503 disk_full`: the node's disk is full; the request did nothing and may be sent again
/// once the operator has made room (like `capacity`, a node out of a resource).
fn disk_full(message: String) -> ApiError {
    tracing::error!(cause = %message, "a node's disk is full");
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "disk_full", message)
}

impl From<Fault> for ApiError {
    fn from(f: Fault) -> Self {
        let m = f.message.clone();
        match f.code {
            FaultCode::NotFound => {
                ApiError::sandbox_not_found(f.sandbox.as_ref().map_or("?", |s| s.as_str()))
            }
            FaultCode::IllegalState => ApiError::new(StatusCode::CONFLICT, "illegal_state", m),
            // Never a note about the snapshot's owner: it may be another tenant's sandbox.
            FaultCode::SnapshotNotFound => ApiError::snapshot_not_found(
                f.sandbox.as_ref().map_or("?", |s| s.as_str()),
                f.snapshot.as_ref().map_or("?", |s| s.as_str()),
            ),
            FaultCode::TemplateNotFound => {
                ApiError::new(StatusCode::NOT_FOUND, "template_not_found", m)
            }
            FaultCode::VolumeNotFound => {
                ApiError::new(StatusCode::NOT_FOUND, "volume_not_found", m)
            }
            FaultCode::VolumeInUse => ApiError::new(StatusCode::CONFLICT, "volume_in_use", m),
            FaultCode::TemplateNotReady => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "template_not_ready", m)
            }
            FaultCode::TemplateExists | FaultCode::TemplateStale | FaultCode::TemplateInUse => {
                ApiError::conflict(m)
            }
            FaultCode::InvalidId => ApiError::invalid_id(m),
            FaultCode::Invalid => ApiError::invalid(m),
            FaultCode::Capacity => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "capacity", m),
            FaultCode::ShuttingDown => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", m)
            }
            FaultCode::DiskFull => disk_full(m),
            FaultCode::Guest => ApiError::guest(m),
            FaultCode::Archive => ApiError::new(StatusCode::BAD_GATEWAY, "archive_unavailable", m),
            FaultCode::Key => ApiError::new(StatusCode::FORBIDDEN, "key_unavailable", m),
            FaultCode::Unavailable => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "node_unavailable", m)
            }
            FaultCode::Internal => {
                tracing::error!(
                    cause = %m,
                    sandbox = f.sandbox.as_ref().map(|s| s.as_str()),
                    "internal fault of a node"
                );
                ApiError::internal(format!("node: {m}"))
            }
        }
    }
}

/// Maps a node fault of a request about sandbox `id`, so that a sandbox the node does not
/// know answers exactly like another tenant's.
pub fn node_error(id: &SandboxId) -> impl Fn(Fault) -> ApiError + '_ {
    move |f| match f.code {
        FaultCode::NotFound => ApiError::sandbox_not_found(id.as_str()),
        _ => f.into(),
    }
}

impl From<ClientError> for ApiError {
    fn from(e: ClientError) -> Self {
        match &e {
            ClientError::Guest(p) | ClientError::Invalid(p) => {
                let message = p.message.clone();
                let mapped = match p.kind {
                    ErrorKind::NotFound => {
                        ApiError::new(StatusCode::NOT_FOUND, "file_not_found", message)
                    }
                    ErrorKind::PermissionDenied | ErrorKind::ReadOnly => {
                        ApiError::forbidden(message)
                    }
                    ErrorKind::AlreadyExists
                    | ErrorKind::NotEmpty
                    | ErrorKind::NotADirectory
                    | ErrorKind::IsADirectory
                    | ErrorKind::Unsupported
                    | ErrorKind::Busy => ApiError::conflict(message),
                    ErrorKind::InvalidArgument => ApiError::invalid(message),
                    ErrorKind::TooLarge => ApiError::too_large(message),
                    ErrorKind::NoSpace => ApiError::new(
                        StatusCode::INSUFFICIENT_STORAGE,
                        "no_space",
                        format!("the sandbox's disk is full: {message}"),
                    ),
                    _ => ApiError::guest(format!("{}: {message}", p.kind)),
                };
                ApiError {
                    guest: Some(p.kind),
                    ..mapped
                }
            }
            _ => ApiError::guest(chain(&e)),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match &e {
            StoreError::Conflict(m) => ApiError::conflict(m.clone()),
            StoreError::LastAdmin(_) => {
                ApiError::new(StatusCode::CONFLICT, "last_admin_key", e.to_string())
            }
            StoreError::Invalid(m) => ApiError::invalid(m.clone()),
            StoreError::NotFound { what, .. } => {
                let code = match &**what {
                    "tenant" => "tenant_not_found",
                    "key" => "key_not_found",
                    "sandbox" => "sandbox_not_found",
                    "secret" => "secret_not_found",
                    "port" => "port_not_found",
                    _ => "not_found",
                };
                ApiError::new(StatusCode::NOT_FOUND, code, e.to_string())
            }
            StoreError::Vault(m) => ApiError::internal(format!("vault: {m}")),
            _ => ApiError::internal(format!("state store: {}", chain(&e))),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Store(s) => s.into(),
            other => ApiError::unauthorized(other.to_string()),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match &r {
            JsonRejection::JsonSyntaxError(_) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("the body is not JSON: {}", chain(&r)),
            ),
            JsonRejection::JsonDataError(_) => ApiError::invalid(chain(&r)),
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "this route takes a JSON body: send Content-Type: application/json",
            ),
            _ if r.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::too_large("the request body is over the limit")
            }
            _ => ApiError::invalid(chain(&r)),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::invalid(format!("query string: {}", chain(&r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_refusals_map_to_client_errors() {
        let id: SandboxId = "sbx-0011223344556677".parse().unwrap();
        let fault = |code, message: &str| Fault {
            sandbox: Some(id.clone()),
            ..Fault::new(code, message)
        };
        let e = ApiError::from(fault(FaultCode::NotFound, "no sandbox here"));
        assert_eq!((e.status.as_u16(), e.code), (404, "sandbox_not_found"));
        assert_eq!(e.message, "no sandbox sbx-0011223344556677 in this tenant");
        let e = ApiError::from(fault(
            FaultCode::IllegalState,
            "cannot pause: the sandbox is suspended (legal only when running)",
        ));
        assert_eq!((e.status.as_u16(), e.code), (409, "illegal_state"));
        assert!(e.message.contains("running"), "{}", e.message);
        let e = ApiError::from(Fault {
            snapshot: Some("1-disk-abcd".parse().unwrap()),
            ..fault(
                FaultCode::SnapshotNotFound,
                "snapshot 1-disk-abcd belongs to sbx-other",
            )
        });
        assert_eq!(e.code, "snapshot_not_found");
        assert!(!e.message.contains("sbx-other"), "{}", e.message);
        let e = ApiError::from(Fault::new(FaultCode::Capacity, "full"));
        assert_eq!((e.status.as_u16(), e.code), (503, "capacity"));
        let e = ApiError::from(Fault::new(FaultCode::Invalid, "vcpus"));
        assert_eq!((e.status.as_u16(), e.code), (400, "invalid_request"));
        let e = ApiError::from(Fault::new(
            FaultCode::Unavailable,
            "node-a is not answering",
        ));
        assert_eq!((e.status.as_u16(), e.code), (503, "node_unavailable"));
    }

    #[test]
    fn internal_node_faults_map_to_500() {
        let f = Fault::new(FaultCode::Internal, "a rollback without a target snapshot");
        let e = ApiError::from(f.clone());
        assert_eq!((e.status.as_u16(), e.code), (500, "internal"));
        assert!(
            e.message.contains("without a target snapshot"),
            "{}",
            e.message
        );
        let id: SandboxId = "sbx-0011223344556677".parse().unwrap();
        let e = node_error(&id)(f);
        assert_eq!((e.status.as_u16(), e.code), (500, "internal"));
    }

    #[test]
    fn guest_errors_map_per_kind() {
        let g = |kind| ApiError::from(ClientError::Guest(space_proto::ProtoError::new(kind, "m")));
        assert_eq!(g(ErrorKind::NotFound).code, "file_not_found");
        assert_eq!(g(ErrorKind::PermissionDenied).code, "forbidden");
        assert_eq!(g(ErrorKind::AlreadyExists).code, "conflict");
        assert_eq!(g(ErrorKind::Unsupported).code, "conflict");
        assert_eq!(g(ErrorKind::InvalidArgument).code, "invalid_request");
        assert_eq!(g(ErrorKind::Internal).code, "guest_error");
        let full = g(ErrorKind::NoSpace);
        assert_eq!((full.status.as_u16(), full.code), (507, "no_space"));
        assert_eq!(full.guest, Some(ErrorKind::NoSpace));
        let cut = ApiError::from(ClientError::Closed);
        assert_eq!((cut.code, cut.guest), ("guest_error", None));
    }

    #[test]
    fn body_has_the_documented_shape() {
        let e = ApiError::quota("max_sandboxes");
        assert_eq!(
            e.body(),
            serde_json::json!({"error": {"code": "quota_exceeded", "message": "max_sandboxes"}})
        );
    }
}
