//! E2B's template builder (`Template().from_template(...).run_cmd(...)...` then
//! `Template.build`) onto space's Dockerfile builds (`docs/e2b.md`, `docs/images.md`).
//!
//! The SDK's calls, in order:
//!
//! 1. `POST /v3/templates` names the template and its shape: the name is claimed for the
//!    tenant and a build is recorded as `waiting` (its shape kept with it), in the state store
//!    so any replica serves what follows.
//! 2. For each `copy` step, `GET /templates/{id}/files/{hash}` says whether files with that
//!    hash are here; when they are not, the SDK `PUT`s a tar of them to the URL it is given:
//!    a signed URL of this server, good for an hour, kept as one of the tenant's uploads
//!    named by the hash (so the next build finds them: `present`).
//! 3. `POST /v2/templates/{id}/builds/{buildID}` brings the steps. They become a Dockerfile
//!    ([`dockerfile`]) and the files a context (each hash's tar under a directory named by
//!    the hash), and the waiting build starts as a space build: the same builder VM, step
//!    cache, log and template publication as `POST /v1/templates`.
//! 4. `GET /templates/{id}/builds/{buildID}/status` answers the state and the log lines from
//!    an offset.

mod steps;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Digest as _;

use steps::merge_contexts;
pub use steps::{dockerfile, StartBody, StepBody};

use super::rest::{self, E2bCaller, E2bError, E2bJson, E2bResult};
use crate::api::templates::{check_name, new_build_id, start_build, BuildBody, ImageBody};
use crate::api::{uploads, Shared};
use crate::error::ApiError;
use crate::listen::Peer;
use crate::store::{BuildRow, Principal, TenantName};

/// The image E2B's `from_base_image` names: space's `base` template stands for it.
pub const E2B_BASE_IMAGE: &str = "e2bdev/base";
/// How long an upload URL is good for.
pub const UPLOAD_URL_TTL_MS: u64 = 3_600_000;
/// Log entries one status answer carries at most (as E2B's).
pub const MAX_LOG_ENTRIES: usize = 100;
/// The disk of an E2B build before `minFreeDiskMb` is added (space's builder default).
pub const BUILD_DISK_MIB: u64 = 2048;

fn bad(message: impl Into<String>) -> E2bError {
    E2bError::new(StatusCode::BAD_REQUEST, message)
}

/// What `POST /v3/templates` asked for, kept with the waiting build.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct RequestBody {
    name: Option<String>,
    alias: Option<String>,
    tags: Option<Vec<String>>,
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u64>,
    min_free_disk_mb: Option<u64>,
}

/// What a waiting build's `source` holds until it starts.
#[derive(Debug, Serialize, Deserialize)]
struct Waiting {
    e2b_template_request: RequestBody,
}

/// `POST /v3/templates`: 202 `{templateID, buildID, names, tags, aliases, public}`.
pub async fn request(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    E2bJson(body): E2bJson<RequestBody>,
) -> E2bResult<Response> {
    let result = async {
        let name = body
            .name
            .clone()
            .or_else(|| body.alias.clone())
            .ok_or_else(|| bad("the template needs a name"))?;
        // `name:tag`: space's versions are numbered; the tag is answered back, not kept.
        let name = name.split(':').next().unwrap_or_default().to_owned();
        check_name(&name).map_err(|e| bad(e.message))?;
        claim(&st, &who, &name).await?;
        let id = new_build_id();
        let row = BuildRow {
            id: id.clone(),
            tenant: who.tenant.to_string(),
            name: name.clone(),
            version: String::new(),
            source: serde_json::to_string(&Waiting {
                e2b_template_request: body.clone(),
            })
            .map_err(|e| ApiError::internal(e.to_string()))?,
            state: "waiting".into(),
            error: None,
            log: String::new(),
            created_ms: 0,
            finished_ms: None,
        };
        st.store.insert_build(&row).await.map_err(ApiError::from)?;
        Ok((name, id))
    }
    .await;
    let (name, id) = rest::audited(&st, &who, "", "template.build", result).await?;
    let tags = body
        .tags
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| vec!["default".into()]);
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({
            "templateID": name,
            "buildID": id,
            "names": [name],
            "aliases": [name],
            "tags": tags,
            "public": false,
        })),
    )
        .into_response())
}

/// Makes template name `name` the caller's, or checks that it is.
async fn claim(st: &Shared, who: &Principal, name: &str) -> E2bResult<()> {
    let all = st.node.templates().await.map_err(ApiError::from)?;
    let exists = all.iter().any(|t| t.template.name.as_str() == name);
    match st
        .store
        .template_owner(name)
        .await
        .map_err(ApiError::from)?
    {
        None if exists && !who.admin => Err(E2bError::new(
            StatusCode::FORBIDDEN,
            format!("the template {name} is public: only an admin builds its versions"),
        )),
        None if !who.admin => Ok(st
            .store
            .claim_template(name, &who.tenant)
            .await
            .map_err(ApiError::from)?),
        Some(owner) if owner != who.tenant.as_str() && !who.admin => Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("the template name {name} is taken"),
        )),
        _ => Ok(()),
    }
}

/// Whether `who` may build template `name` here (its tenant's, or any for an admin).
async fn owns(st: &Shared, who: &Principal, name: &str) -> E2bResult<bool> {
    if who.admin {
        return Ok(true);
    }
    let owner = st
        .store
        .template_owner(name)
        .await
        .map_err(ApiError::from)?;
    Ok(owner.as_deref() == Some(who.tenant.as_str()))
}

pub(crate) fn valid_hash(hash: &str) -> bool {
    hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The upload id files with hash `hash` are kept under (one per tenant and hash).
fn files_upload(hash: &str) -> String {
    let d = sha2::Sha256::digest(format!("e2b template files {hash}").as_bytes());
    format!("upl-{}", &hex::encode(d)[..32])
}

/// `GET /templates/{id}/files/{hash}`: 201 `{present}` and, when they are not, the `url` to `PUT`
/// a tar of them to.
pub async fn file_link(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path((template, hash)): Path<(String, String)>,
    peer: Option<axum::Extension<ConnectInfo<Peer>>>,
    headers: HeaderMap,
) -> E2bResult<(StatusCode, Json<Value>)> {
    if !valid_hash(&hash) {
        return Err(bad(format!(
            "files hash {:?} is not 64 lowercase hex digits",
            hash.chars().take(80).collect::<String>()
        )));
    }
    if !owns(&st, &who, &template).await? {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template {template} not found"),
        ));
    }
    let id = files_upload(&hash);
    if uploads::exists(&st, &who.tenant, &id).await? {
        return Ok((StatusCode::CREATED, Json(json!({"present": true}))));
    }
    let tls = peer.is_some_and(|p| p.0 .0.tls);
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let base = crate::service::public_base(&st, host, tls)?;
    let expires = space_node_api::sandbox::now_ms() + UPLOAD_URL_TTL_MS;
    let sig = super::state(&st).upload_signature(who.tenant.as_str(), &hash, expires);
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "present": false,
            "url": format!(
                "{base}{}/{hash}?tenant={}&expires={expires}&signature={sig}",
                super::TEMPLATE_FILES_PATH,
                who.tenant.as_str()
            ),
        })),
    ))
}

/// The query of an upload URL.
#[derive(Debug, Deserialize)]
pub struct Signed {
    tenant: String,
    expires: u64,
    signature: String,
}

/// `PUT /e2b/template-files/{hash}?tenant=&expires=&signature=`: the tar of a `copy` step's
/// files. 200; 403 for a URL this server did not sign or that has expired.
pub async fn file_upload(
    State(st): State<Shared>,
    Path(hash): Path<String>,
    Query(q): Query<Signed>,
    body: Body,
) -> Response {
    let result = async {
        if !valid_hash(&hash) {
            return Err(bad("the files hash is not 64 lowercase hex digits"));
        }
        let e2b = super::state(&st);
        if !e2b.upload_signature_ok(&q.tenant, &hash, q.expires, &q.signature) {
            return Err(E2bError::new(
                StatusCode::FORBIDDEN,
                "invalid signature for this upload",
            ));
        }
        if q.expires < space_node_api::sandbox::now_ms() {
            return Err(E2bError::new(
                StatusCode::FORBIDDEN,
                "the upload URL has expired",
            ));
        }
        let tenant: TenantName = q
            .tenant
            .parse()
            .map_err(|_| bad("the upload URL names no tenant"))?;
        uploads::store(&st, &tenant, &files_upload(&hash), body).await?;
        Ok(StatusCode::OK)
    }
    .await;
    match result {
        Ok(s) => s.into_response(),
        Err(e) => e.into_response(),
    }
}

/// Build `build` of template `template`, when it is the caller's (or the caller is an admin).
async fn visible_build(
    st: &Shared,
    who: &Principal,
    template: &str,
    build: &str,
) -> E2bResult<BuildRow> {
    st.store
        .build(build)
        .await
        .map_err(ApiError::from)?
        .filter(|r| r.name == template && (who.admin || r.tenant == who.tenant.as_str()))
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("build {build} of template {template} not found"),
            )
        })
}

/// `POST /v2/templates/{id}/builds/{buildID}`: starts the waiting build with these steps.
/// 202; 404 for a build not the caller's; 409 when it has started already.
pub async fn trigger(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path((template, build)): Path<(String, String)>,
    E2bJson(body): E2bJson<StartBody>,
) -> E2bResult<StatusCode> {
    let result = async {
        let row = visible_build(&st, &who, &template, &build).await?;
        if row.state != "waiting" {
            return Err(E2bError::new(
                StatusCode::CONFLICT,
                format!("build {build} has started already"),
            ));
        }
        let asked = serde_json::from_str::<Waiting>(&row.source)
            .map(|w| w.e2b_template_request)
            .unwrap_or_default();
        let base_user = match &body.from_template {
            Some(t) => st
                .node
                .template(
                    &t.parse()
                        .map_err(|e: space_node_api::ids::IdError| bad(e.to_string()))?,
                    &space_node_api::VersionReq::Latest,
                )
                .await
                .ok()
                .and_then(|t| t.guest.user)
                .unwrap_or_else(|| "root".into()),
            None if body
                .from_image
                .as_deref()
                .is_some_and(|i| i == E2B_BASE_IMAGE || i.starts_with("e2bdev/base:")) =>
            {
                st.node
                    .template(
                        &"base".parse().expect("a name"),
                        &space_node_api::VersionReq::Latest,
                    )
                    .await
                    .ok()
                    .and_then(|t| t.guest.user)
                    .unwrap_or_else(|| "root".into())
            }
            None => "root".into(),
        };
        let (text, hashes) = dockerfile(&body, &base_user, &build).map_err(bad)?;
        let context = match hashes.is_empty() {
            true => None,
            false => Some(context(&st, &who, &hashes).await?),
        };
        let registry = registry(&body)?;
        let (start, ready_command) = match (&body.start_cmd, &body.ready_cmd) {
            (None, None) => (None, None),
            (Some(s), r) => (Some(s.clone()), r.clone()),
            // A ready check alone waits for what the image starts by itself.
            (None, Some(r)) => (Some("true".to_owned()), Some(r.clone())),
        };
        let req = BuildBody {
            name: row.name.clone(),
            dockerfile: Some(text),
            context,
            registry,
            vcpus: asked.cpu_count,
            memory_mib: asked.memory_mb,
            disk_mib: asked.min_free_disk_mb.map(|f| BUILD_DISK_MIB + f),
            start,
            ready_command,
            ..Default::default()
        };
        start_build(&st, &who, req, Some(&build)).await?;
        Ok(StatusCode::ACCEPTED)
    }
    .await;
    rest::audited(&st, &who, &template, "template.build", result).await
}

/// The Dockerfile's `FROM` image's credentials (`fromImageRegistry` of type `registry`).
fn registry(body: &StartBody) -> E2bResult<Option<ImageBody>> {
    let Some(r) = body.from_image_registry.as_ref().filter(|r| !r.is_null()) else {
        return Ok(None);
    };
    let Some(image) = &body.from_image else {
        return Err(bad("fromImageRegistry goes with fromImage"));
    };
    match r.get("type").and_then(Value::as_str) {
        Some("registry") => Ok(Some(ImageBody {
            reference: image.clone(),
            username: r.get("username").and_then(Value::as_str).map(str::to_owned),
            password: r.get("password").and_then(Value::as_str).map(str::to_owned),
            plain_http: false,
        })),
        other => Err(bad(format!(
            "fromImageRegistry of type {other:?} is not served: give a registry's username \
             and password (type \"registry\")"
        ))),
    }
}

/// The context of a build reading `hashes`: one upload of the caller's.
async fn context(st: &Shared, who: &Principal, hashes: &BTreeSet<String>) -> E2bResult<String> {
    let dir = tempfile::tempdir()
        .map_err(|e| ApiError::internal(format!("a temporary directory: {e}")))?;
    let mut parts = Vec::new();
    for hash in hashes {
        let id = files_upload(hash);
        if !uploads::exists(st, &who.tenant, &id).await? {
            return Err(bad(format!(
                "the files of hash {hash} were not uploaded (GET /templates/{{id}}/files/{hash})"
            )));
        }
        let path = dir.path().join(format!("{hash}.tar"));
        uploads::fetch(st, &who.tenant, &id, &path).await?;
        parts.push((hash.clone(), path));
    }
    let out = dir.path().join("context.tar");
    let merged = {
        let out = out.clone();
        tokio::task::spawn_blocking(move || merge_contexts(&parts, &out))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
    };
    merged.map_err(bad)?;
    let file = tokio::fs::File::open(&out)
        .await
        .map_err(|e| ApiError::internal(format!("reading the context: {e}")))?;
    let id = uploads::new_id();
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    uploads::store(st, &who.tenant, &id, body).await?;
    Ok(id)
}

/// `?logsOffset=N&limit=N&level=`
#[derive(Debug, Default, Deserialize)]
pub struct StatusQuery {
    #[serde(default, rename = "logsOffset")]
    logs_offset: usize,
    #[serde(default)]
    limit: Option<usize>,
    /// The least level of the entries answered: a build's log lines are `info`.
    #[serde(default)]
    level: Option<String>,
}

/// `GET /templates/{id}/builds/{buildID}/status?logsOffset=`: `{templateID, buildID, status,
/// logEntries, logs, reason}`; the status is `waiting`, `building`, `ready` or `error`.
pub async fn status(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path((template, build)): Path<(String, String)>,
    Query(q): Query<StatusQuery>,
) -> E2bResult<Json<Value>> {
    let quiet = match q.level.as_deref() {
        None | Some("debug" | "info") => false,
        Some("warn" | "error") => true,
        Some(other) => {
            return Err(bad(format!(
                "level {other:?} is not debug, info, warn or error"
            )))
        }
    };
    let row = visible_build(&st, &who, &template, &build).await?;
    let log = match row.state.as_str() {
        "running" => st
            .node
            .build_log(&build, 0)
            .await
            .map(|c| c.text)
            .unwrap_or_default(),
        _ => row.log.clone(),
    };
    let now = rest::rfc3339(space_node_api::sandbox::now_ms());
    let limit = q.limit.unwrap_or(MAX_LOG_ENTRIES).clamp(1, MAX_LOG_ENTRIES);
    let lines: Vec<&str> = if quiet {
        Vec::new()
    } else {
        log.lines().collect()
    };
    let entry =
        |line: &str, level: &str| json!({"timestamp": now, "level": level, "message": line});
    let entries: Vec<Value> = lines
        .iter()
        .skip(q.logs_offset)
        .take(limit)
        .map(|l| entry(l, "info"))
        .collect();
    let status = match row.state.as_str() {
        "waiting" => "waiting",
        "running" => "building",
        "succeeded" => "ready",
        _ => "error",
    };
    let mut out = json!({
        "templateID": row.name,
        "buildID": row.id,
        "status": status,
        "logEntries": entries,
        "logs": lines.iter().skip(q.logs_offset).take(limit).collect::<Vec<_>>(),
    });
    if status == "error" {
        let message = row
            .error
            .clone()
            .unwrap_or_else(|| "the build failed".into());
        // The end of the log, whatever the level asked: it says why.
        let all: Vec<&str> = log.lines().collect();
        let tail: Vec<Value> = all[all.len().saturating_sub(20)..]
            .iter()
            .map(|l| entry(l, "error"))
            .collect();
        out["reason"] = json!({"message": message, "logEntries": tail});
    }
    Ok(Json(out))
}
