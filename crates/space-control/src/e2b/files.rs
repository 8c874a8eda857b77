//! envd's file API: `GET /files?path=&username=` streams a file; `POST /files` writes the
//! parts of a multipart form (each part named `file`, its filename the path, relative ones
//! under the user's home) or one file's bytes, each file and the directories made for it
//! owned by the user, with the `X-Metadata-*` headers as its `user.e2b.*` attributes. The
//! answer is `[{name, type, path, metadata}]`, one entry per file. Errors are `{"code": <status>,
//! "message"}`: 404 for a missing file, 507 when the disk is full.

use std::collections::BTreeMap;

use async_compression::tokio::bufread::GzipDecoder;
use axum::body::Body;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use serde_json::{json, Value};
use space_proto::limits::MAX_XATTRS;
use space_proto::{Account, ClientError, ErrorKind, FileStat, WriteOptions};
use tokio_util::io::{ReaderStream, StreamReader};

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

/// A guest's failure as envd's file routes answer it.
fn guest_error(e: ClientError) -> Response {
    let e = crate::error::ApiError::from(e);
    let status = match e.guest {
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
    error(status, e.message)
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
            // Checked with the access token before the request gets here.
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

/// The prefix of the extended attributes that hold a file's E2B metadata.
pub const METADATA_XATTR: &str = "user.e2b.";

/// The `X-Metadata-<key>` headers of an upload as extended attributes (`user.e2b.<key>`,
/// the key lowercased as envd does), each checked as the SDKs check them.
fn metadata(headers: &HeaderMap) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        // Header names arrive lowercased.
        let Some(key) = name.as_str().strip_prefix("x-metadata-") else {
            continue;
        };
        if key.is_empty() {
            return Err("a metadata header has no key".into());
        }
        let value = value
            .to_str()
            .ok()
            .filter(|v| v.bytes().all(|b| (0x20..0x7f).contains(&b)))
            .ok_or_else(|| format!("the metadata value of {key:?} is not printable ASCII"))?;
        let xattr = format!("{METADATA_XATTR}{key}");
        space_proto::query::validate_xattr(&xattr, value).map_err(|e| e.message)?;
        out.insert(xattr, value.to_owned());
    }
    if out.len() > MAX_XATTRS {
        return Err(format!("a file holds at most {MAX_XATTRS} metadata keys"));
    }
    Ok(out)
}

/// A file's E2B metadata: its `user.e2b.*` attributes without the prefix.
pub fn file_metadata(stat: &FileStat) -> BTreeMap<&str, &str> {
    stat.xattrs
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(METADATA_XATTR)?, v.as_str())))
        .collect()
}

type Chunks = futures::stream::BoxStream<'static, std::io::Result<Bytes>>;

/// The request body, decompressed when it says `Content-Encoding: gzip`.
fn decoded(headers: &HeaderMap, body: Body) -> Result<Chunks, String> {
    let raw = body.into_data_stream().map_err(std::io::Error::other);
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase());
    match encoding.as_deref() {
        None | Some("") | Some("identity") => Ok(raw.boxed()),
        Some("gzip") | Some("x-gzip") => {
            let reader = StreamReader::new(raw);
            let mut decoder = GzipDecoder::new(reader);
            decoder.multiple_members(true);
            Ok(ReaderStream::new(decoder).boxed())
        }
        Some(other) => Err(format!(
            "uploads are sent as they are or gzip-compressed, not {other:?}"
        )),
    }
}

/// Writes one file from `chunks`; the entry of the answer, or the error's response.
async fn write_one<S>(
    e: &Envd,
    account: &Account,
    target: &str,
    chunks: S,
    xattrs: &BTreeMap<String, String>,
) -> Result<Value, Response>
where
    S: futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
{
    let target = resolve(&account.home, target).map_err(rpc_error)?;
    let options = WriteOptions {
        mode: None,
        create_parents: true,
        owner: Some((account.uid, account.gid)),
        xattrs: xattrs.clone(),
        // As envd: the file is truncated and written where it is (a watch sees it written),
        // and its E2B metadata is what this upload says, nothing older.
        in_place: true,
        clear_xattrs: Some(METADATA_XATTR.to_owned()),
    };
    let stat = e
        .guest
        .write_file_stream(&target, chunks, options)
        .await
        .map_err(guest_error)?;
    let name = target.rsplit('/').next().unwrap_or("").to_owned();
    let mut entry = json!({"name": name, "type": "file", "path": target});
    let meta = file_metadata(&stat);
    if !meta.is_empty() {
        entry["metadata"] = json!(meta);
    }
    Ok(entry)
}

/// `POST /files[?path=P][&username=U]`: a multipart form, or one file's bytes
/// (`application/octet-stream`, `path` required); either may be gzip-compressed. Metadata
/// headers apply to every file.
pub async fn upload(mut e: Envd, query: Option<&str>, headers: HeaderMap, body: Body) -> Response {
    let (path, user) = match params(query) {
        Ok(p) => p,
        Err(m) => return drained(body, error(StatusCode::BAD_REQUEST, m)).await,
    };
    if user.is_some() {
        e.user = user;
    }
    let xattrs = match metadata(&headers) {
        Ok(m) => m,
        Err(m) => return drained(body, error(StatusCode::BAD_REQUEST, m)).await,
    };
    let account = match e.account().await {
        Ok(a) => a,
        Err(err) => return drained(body, rpc_error(err)).await,
    };
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let chunks = match decoded(&headers, body) {
        Ok(c) => c,
        Err(m) => return error(StatusCode::UNSUPPORTED_MEDIA_TYPE, m),
    };
    let written = match media.as_str() {
        "application/octet-stream" => {
            let Some(path) = path else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "an octet-stream upload needs the path parameter",
                );
            };
            match write_one(&e, &account, &path, chunks, &xattrs).await {
                Ok(entry) => vec![entry],
                Err(r) => return r,
            }
        }
        "multipart/form-data" => match write_form(&e, &account, ct, path, chunks, &xattrs).await {
            Ok(entries) => entries,
            Err(r) => return r,
        },
        _ => {
            return error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("uploads are multipart/form-data or application/octet-stream, not {ct:?}"),
            )
        }
    };
    e.touch();
    axum::Json(written).into_response()
}

/// How much of a refused upload's body is read before the answer.
const DRAIN_BYTES: usize = 8 << 20;
/// How long that may take.
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_secs(5);

/// Answers `refusal` after reading what the client is still sending (a small body, within
/// bounds): a server that answers and closes while the client writes leaves it a broken
/// pipe instead of the error.
async fn drained(body: Body, refusal: Response) -> Response {
    let mut stream = body.into_data_stream();
    let mut read = 0usize;
    let _ = tokio::time::timeout(DRAIN_TIME, async {
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > DRAIN_BYTES {
                break;
            }
        }
    })
    .await;
    refusal
}

/// The parts named `file` of a multipart form: with one file the `path` parameter names
/// it, with several each part's filename does.
async fn write_form(
    e: &Envd,
    account: &Account,
    content_type: &str,
    path: Option<String>,
    chunks: Chunks,
    xattrs: &BTreeMap<String, String>,
) -> Result<Vec<Value>, Response> {
    let boundary = multer::parse_boundary(content_type).map_err(|err| {
        error(
            StatusCode::BAD_REQUEST,
            format!("the form's boundary: {err}"),
        )
    })?;
    let mut form = multer::Multipart::new(chunks, boundary);
    let mut written = Vec::new();
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(err) => return Err(error(StatusCode::BAD_REQUEST, format!("the form: {err}"))),
        };
        if field.name() != Some("file") {
            continue;
        }
        let named = field.file_name().map(str::to_owned);
        let target = match (&path, &named) {
            (Some(p), _) if written.is_empty() => p.clone(),
            (_, Some(n)) if !n.is_empty() => n.clone(),
            _ => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "a part has no file name and no path was given",
                ))
            }
        };
        // The part borrows the form: its chunks go to the upload through a small channel.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(4);
        let part = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        let pump = async move {
            let mut field = field;
            while let Some(chunk) = field.next().await {
                let failed = chunk.is_err();
                if tx.send(chunk.map_err(std::io::Error::other)).await.is_err() || failed {
                    break;
                }
            }
        };
        let (entry, ()) = tokio::join!(write_one(e, account, &target, part, xattrs), pump);
        written.push(entry?);
    }
    if written.is_empty() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "the form has no part named file",
        ));
    }
    Ok(written)
}
