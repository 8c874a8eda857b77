//! envd's file API: `GET /files?path=&username=` streams a file; `POST /files` writes the
//! parts of a multipart form (each part named `file`, its filename the path, relative ones
//! under the user's home), each file and the directories made for it owned by the user.
//! The answer is `[{name, type, path}]`, one entry per file. Errors are `{"code": <status>,
//! "message"}`: 404 for a missing file, 507 when the disk is full.

use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{StreamExt, TryStreamExt};

use serde_json::json;
use space_proto::{ClientError, ErrorKind, WriteOptions};

use super::connect::{Code, RpcError};
use super::envd::Envd;
use super::filesystem::resolve;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"code": status.as_u16(), "message": message.into()}).to_string(),
    )
        .into_response()
}

fn guest_error(e: ClientError) -> Response {
    let status = match e.kind() {
        Some(ErrorKind::NotFound) => StatusCode::NOT_FOUND,
        Some(ErrorKind::NoSpace) => StatusCode::INSUFFICIENT_STORAGE,
        Some(ErrorKind::PermissionDenied | ErrorKind::ReadOnly) => StatusCode::FORBIDDEN,
        Some(
            ErrorKind::InvalidArgument
            | ErrorKind::IsADirectory
            | ErrorKind::NotADirectory
            | ErrorKind::AlreadyExists,
        ) => StatusCode::BAD_REQUEST,
        Some(ErrorKind::TooLarge) => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_GATEWAY,
    };
    error(status, RpcError::from(e).message)
}

fn rpc_error(e: RpcError) -> Response {
    let status = match e.code {
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        _ => StatusCode::BAD_GATEWAY,
    };
    error(status, e.message)
}

/// The `path` and `username` of a query.
fn params(query: Option<&str>) -> Result<(Option<String>, Option<String>), String> {
    let pairs = space_proto::query::parse_query(query).map_err(|e| e.message)?;
    let (mut path, mut user) = (None, None);
    for (k, v) in pairs {
        match k.as_str() {
            "path" => path = Some(v),
            "username" => user = Some(v).filter(|u| !u.is_empty()),
            // Signed links carry these; they are not checked yet, the access token is.
            "signature" | "signature_expiration" => {}
            other => return Err(format!("unknown query parameter {other:?}")),
        }
    }
    Ok((path, user))
}

/// `GET /files?path=P[&username=U]`
pub async fn download(mut e: Envd, query: Option<&str>) -> Response {
    let (path, user) = match params(query) {
        Ok(p) => p,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    let Some(path) = path else {
        return error(StatusCode::BAD_REQUEST, "the path parameter is required");
    };
    if user.is_some() {
        e.user = user;
    }
    let account = match e.account().await {
        Ok(a) => a,
        Err(err) => return rpc_error(err),
    };
    let path = match resolve(&account.home, &path) {
        Ok(p) => p,
        Err(err) => return rpc_error(err),
    };
    match e.guest.stat(&path).await {
        Ok(s) if s.file_type == space_proto::FileType::Dir => {
            return error(StatusCode::BAD_REQUEST, format!("{path} is a directory"))
        }
        Ok(_) => {}
        Err(err) => return guest_error(err),
    }
    let reader = match e.guest.read_file(&path).await {
        Ok(r) => r,
        Err(err) => return guest_error(err),
    };
    e.touch();
    let body = Body::from_stream(reader.map_err(std::io::Error::other));
    ([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response()
}

/// `POST /files[?path=P][&username=U]` with a multipart form.
pub async fn upload(mut e: Envd, query: Option<&str>, headers: HeaderMap, body: Body) -> Response {
    let (path, user) = match params(query) {
        Ok(p) => p,
        Err(m) => return error(StatusCode::BAD_REQUEST, m),
    };
    if user.is_some() {
        e.user = user;
    }
    let account = match e.account().await {
        Ok(a) => a,
        Err(err) => return rpc_error(err),
    };
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !ct.starts_with("multipart/form-data") {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("uploads are multipart/form-data, not {ct:?}"),
        );
    }
    let boundary = match multer::parse_boundary(ct) {
        Ok(b) => b,
        Err(err) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the form's boundary: {err}"),
            )
        }
    };
    let mut form = multer::Multipart::new(body.into_data_stream(), boundary);
    let mut written = Vec::new();
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(err) => return error(StatusCode::BAD_REQUEST, format!("the form: {err}")),
        };
        if field.name() != Some("file") {
            continue;
        }
        // One file: the `path` parameter names it; several: each part's filename does.
        let named = field.file_name().map(str::to_owned);
        let target = match (&path, &named) {
            (Some(p), _) if written.is_empty() => p.clone(),
            (_, Some(n)) if !n.is_empty() => n.clone(),
            _ => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "a part has no file name and no path was given",
                )
            }
        };
        let target = match resolve(&account.home, &target) {
            Ok(p) => p,
            Err(err) => return rpc_error(err),
        };
        let options = WriteOptions {
            mode: None,
            create_parents: true,
            owner: Some((account.uid, account.gid)),
        };
        // The part borrows the form: its chunks go to the upload through a small channel.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
        let chunks = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let pump = async move {
            let mut field = field;
            loop {
                let next = field.next().await;
                let Some(chunk) = next else { break };
                let failed = chunk.is_err();
                if tx.send(chunk.map_err(std::io::Error::other)).await.is_err() || failed {
                    break;
                }
            }
        };
        let (written_file, ()) =
            tokio::join!(e.guest.write_file_stream(&target, chunks, options), pump);
        if let Err(err) = written_file {
            return guest_error(err);
        }
        let name = target.rsplit('/').next().unwrap_or("").to_owned();
        written.push(json!({"name": name, "type": "file", "path": target}));
    }
    if written.is_empty() {
        return error(StatusCode::BAD_REQUEST, "the form has no part named file");
    }
    e.touch();
    axum::Json(written).into_response()
}
