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

use std::collections::BTreeSet;
use std::io::Read as _;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Digest as _;

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
        st.store
            .insert_waiting_build(&row)
            .await
            .map_err(ApiError::from)?;
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

fn valid_hash(hash: &str) -> bool {
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

/// One step of a build as the SDKs send it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StepBody {
    #[serde(rename = "type")]
    kind: String,
    args: Vec<String>,
    files_hash: Option<String>,
    force: Option<bool>,
}

/// Body of `POST /v2/templates/{id}/builds/{buildID}`.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StartBody {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<Value>,
    force: Option<bool>,
    steps: Vec<StepBody>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

/// The Dockerfile of `body`'s steps: each `copy` reads from the directory named by its files
/// hash; a forced step (and everything after it) runs again, not from the step cache;
/// `base_user` is the user the base runs steps as (to go back to after a step run as another).
/// Answers the text and the files hashes it reads.
pub fn dockerfile(
    body: &StartBody,
    base_user: &str,
    build_id: &str,
) -> Result<(String, BTreeSet<String>), String> {
    let from = match (&body.from_template, &body.from_image) {
        (Some(t), None) => t.clone(),
        (None, Some(i)) if i == E2B_BASE_IMAGE || i.starts_with("e2bdev/base:") => {
            "base".to_owned()
        }
        (None, Some(i)) => i.clone(),
        (None, None) => return Err("the build names no base: fromImage or fromTemplate".into()),
        (Some(_), Some(_)) => return Err("name one base: fromImage or fromTemplate".into()),
    };
    if from.trim().is_empty() || from.contains(char::is_whitespace) {
        return Err(format!("base {from:?} is not an image or template name"));
    }
    let json = |v: &[String]| serde_json::to_string(v).expect("strings serialize");
    // Words of the exec (JSON) form are expanded, not unquoted: `$` is written `\$`.
    let exec_word = |s: &str| s.replace('$', "\\$");
    // Words of the shell form are unquoted, then expanded: a double-quoted word whose `\`,
    // `"` and `$` are escaped for the first and `$` once more for the second.
    let shell_word = |s: &str| {
        let mut w = String::from('"');
        for c in s.chars() {
            match c {
                '$' => w.push_str("\\\\\\$"),
                '\\' | '"' => {
                    w.push('\\');
                    w.push(c);
                }
                c => w.push(c),
            }
        }
        w.push('"');
        w
    };
    let mut out = format!("FROM {from}\n");
    let mut hashes = BTreeSet::new();
    let mut user = base_user.to_owned();
    let mut forced = body.force == Some(true);
    for (i, step) in body.steps.iter().enumerate() {
        let n = i + 1;
        let arg = |k: usize| step.args.get(k).map(String::as_str).unwrap_or_default();
        if !forced && step.force == Some(true) {
            forced = true;
        }
        if forced && i == 0 || step.force == Some(true) {
            // A command seen by no earlier build: the cache has nothing from here on.
            out.push_str(&format!(
                "RUN {}\n",
                json(&["/bin/sh".into(), "-c".into(), format!(": {build_id}")])
            ));
        }
        if step
            .args
            .iter()
            .any(|a| a.contains('\n') || a.contains('\r'))
            && step.kind != "RUN"
        {
            return Err(format!(
                "step {n} ({}): an argument has a line break",
                step.kind
            ));
        }
        match step.kind.as_str() {
            "RUN" => {
                let cmd = arg(0);
                if cmd.trim().is_empty() {
                    return Err(format!("step {n} (RUN) has no command"));
                }
                let run = format!(
                    "RUN {}\n",
                    json(&["/bin/sh".into(), "-c".into(), cmd.to_owned()])
                );
                match arg(1) {
                    "" => out.push_str(&run),
                    u if u == user => out.push_str(&run),
                    u => {
                        check_word(u, n, "user")?;
                        out.push_str(&format!("USER {u}\n{run}USER {user}\n"));
                    }
                }
            }
            "COPY" => {
                let hash = step
                    .files_hash
                    .as_deref()
                    .filter(|h| valid_hash(h))
                    .ok_or_else(|| format!("step {n} (COPY) has no files hash"))?;
                let (src, dest) = (arg(0), arg(1));
                if src.is_empty() || dest.is_empty() {
                    return Err(format!("step {n} (COPY) needs a source and a destination"));
                }
                if src.starts_with('/') || src.split('/').any(|c| c == "..") {
                    return Err(format!(
                        "step {n} (COPY): {src:?} is not a path inside the context"
                    ));
                }
                hashes.insert(hash.to_owned());
                let mut line = "COPY".to_owned();
                if !arg(2).is_empty() {
                    check_word(arg(2), n, "user")?;
                    line.push_str(&format!(" --chown={}", arg(2)));
                }
                if !arg(3).is_empty() {
                    let mode = arg(3).trim_start_matches('0');
                    let mode = if mode.is_empty() { "0" } else { mode };
                    if u32::from_str_radix(mode, 8).map_or(true, |m| m > 0o7777) {
                        return Err(format!("step {n} (COPY): mode {:?} is not octal", arg(3)));
                    }
                    line.push_str(&format!(" --chmod={mode}"));
                }
                let src = src.trim_start_matches("./");
                line.push_str(&format!(
                    " {}\n",
                    json(&[exec_word(&format!("{hash}/{src}")), exec_word(dest)])
                ));
                out.push_str(&line);
            }
            "ENV" => {
                if step.args.is_empty() || step.args.len() % 2 != 0 {
                    return Err(format!("step {n} (ENV) takes name and value pairs"));
                }
                let mut line = "ENV".to_owned();
                for kv in step.args.chunks(2) {
                    let (k, v) = (&kv[0], &kv[1]);
                    if !valid_env_name(k) {
                        return Err(format!("step {n} (ENV): {k:?} is not a variable name"));
                    }
                    line.push_str(&format!(" {k}={}", shell_word(v)));
                }
                out.push_str(&line);
                out.push('\n');
            }
            "WORKDIR" => {
                let dir = arg(0);
                if dir.is_empty() {
                    return Err(format!("step {n} (WORKDIR) has no directory"));
                }
                out.push_str(&format!("WORKDIR {}\n", shell_word(dir)));
            }
            "USER" => {
                let u = arg(0);
                check_word(u, n, "user")?;
                out.push_str(&format!("USER {u}\n"));
                user = u.to_owned();
            }
            other => {
                return Err(format!(
                    "step {n}: {other:?} is not a step space builds (RUN, COPY, ENV, WORKDIR, USER)"
                ))
            }
        }
    }
    Ok((out, hashes))
}

fn check_word(w: &str, n: usize, what: &str) -> Result<(), String> {
    if w.is_empty()
        || w.len() > 64
        || !w
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-:".contains(&b))
    {
        return Err(format!(
            "step {n}: {what} {w:?} is not a user or user:group name"
        ));
    }
    Ok(())
}

fn valid_env_name(k: &str) -> bool {
    let b = k.as_bytes();
    !b.is_empty()
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Writes the build context: each files hash's tar (plain or gzip) under a directory named
/// by the hash, to `out`. Entries that leave their directory (absolute, `..`) are refused.
fn merge_contexts(
    parts: &[(String, std::path::PathBuf)],
    out: &std::path::Path,
) -> Result<(), String> {
    let f = std::fs::File::create(out).map_err(|e| format!("creating the context: {e}"))?;
    let mut b = tar::Builder::new(std::io::BufWriter::new(f));
    for (hash, path) in parts {
        let mut raw = std::fs::File::open(path).map_err(|e| format!("files {hash}: {e}"))?;
        let mut magic = [0u8; 2];
        let gz = raw
            .read(&mut magic)
            .map_err(|e| format!("files {hash}: {e}"))?
            == 2
            && magic == [0x1f, 0x8b];
        let raw = std::fs::File::open(path).map_err(|e| format!("files {hash}: {e}"))?;
        let reader: Box<dyn std::io::Read> = if gz {
            Box::new(flate2::read::GzDecoder::new(raw))
        } else {
            Box::new(raw)
        };
        let mut a = tar::Archive::new(reader);
        b.append_dir(hash, std::env::temp_dir())
            .map_err(|e| format!("writing the context: {e}"))?;
        for entry in a.entries().map_err(|e| format!("files {hash}: {e}"))? {
            let mut entry = entry.map_err(|e| format!("files {hash}: {e}"))?;
            let rel = entry
                .path()
                .map_err(|e| format!("files {hash}: {e}"))?
                .into_owned();
            if rel.is_absolute()
                || rel.components().any(|c| {
                    !matches!(
                        c,
                        std::path::Component::Normal(_) | std::path::Component::CurDir
                    )
                })
            {
                return Err(format!(
                    "files {hash}: {} is not a path inside the context",
                    rel.display()
                ));
            }
            let path = std::path::Path::new(hash).join(&rel);
            let mut header = entry.header().clone();
            match header.entry_type() {
                tar::EntryType::Link => {
                    let target = entry
                        .link_name()
                        .map_err(|e| format!("files {hash}: {e}"))?
                        .ok_or_else(|| format!("files {hash}: a hard link without a target"))?
                        .into_owned();
                    if target.is_absolute()
                        || target
                            .components()
                            .any(|c| matches!(c, std::path::Component::ParentDir))
                    {
                        return Err(format!("files {hash}: a hard link leaves the context"));
                    }
                    b.append_link(&mut header, &path, std::path::Path::new(hash).join(target))
                }
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(|e| format!("files {hash}: {e}"))?
                        .ok_or_else(|| format!("files {hash}: a symbolic link without a target"))?
                        .into_owned();
                    b.append_link(&mut header, &path, target)
                }
                tar::EntryType::Regular | tar::EntryType::Directory => {
                    b.append_data(&mut header, &path, &mut entry)
                }
                // Devices, FIFOs, the pax and GNU extension headers (the tar reader has
                // applied the latter to the entries they describe).
                _ => continue,
            }
            .map_err(|e| format!("writing the context: {e}"))?;
        }
    }
    b.into_inner()
        .and_then(|mut w| std::io::Write::flush(&mut w))
        .map_err(|e| format!("writing the context: {e}"))
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
        let not_found = || {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("build {build} of template {template} not found"),
            )
        };
        let row = st
            .store
            .build(&build)
            .await
            .map_err(ApiError::from)?
            .filter(|r| r.name == template && (who.admin || r.tenant == who.tenant.as_str()))
            .ok_or_else(not_found)?;
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

/// `?logsOffset=N`
#[derive(Debug, Default, Deserialize)]
pub struct StatusQuery {
    #[serde(default, rename = "logsOffset")]
    logs_offset: usize,
    #[serde(default)]
    limit: Option<usize>,
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
    let _ = &q.level;
    let row = st
        .store
        .build(&build)
        .await
        .map_err(ApiError::from)?
        .filter(|r| r.name == template && (who.admin || r.tenant == who.tenant.as_str()))
        .ok_or_else(|| {
            E2bError::new(
                StatusCode::NOT_FOUND,
                format!("build {build} of template {template} not found"),
            )
        })?;
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
    let lines: Vec<&str> = log.lines().collect();
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
        let tail: Vec<Value> = lines
            .iter()
            .rev()
            .take(20)
            .rev()
            .map(|l| entry(l, "error"))
            .collect();
        out["reason"] = json!({"message": message, "logEntries": tail});
    }
    Ok(Json(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use space_image::dockerfile::{parse, Command, Step};

    fn step(kind: &str, args: &[&str]) -> StepBody {
        StepBody {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn steps_become_a_dockerfile_that_reads_back_as_they_said() {
        let hash = "ab".repeat(32);
        let body = StartBody {
            from_image: Some("e2bdev/base".into()),
            steps: vec![
                step("RUN", &["echo \"$HOME\" && printf 'a\\nb'\nls", "root"]),
                StepBody {
                    files_hash: Some(hash.clone()),
                    ..step("COPY", &["app dir/*.py", "/app/$x\\$/", "user", "0755"])
                },
                step("ENV", &["A", "va\"lue $HOME \\ end \\$", "B", ""]),
                step("WORKDIR", &["/app dir/$HOME"]),
                step("USER", &["user"]),
                step("RUN", &["id"]),
            ],
            ..Default::default()
        };
        let (text, hashes) = dockerfile(&body, "user", "bld-1").unwrap();
        assert_eq!(hashes.into_iter().collect::<Vec<_>>(), vec![hash.clone()]);
        let d = parse(&text, &Default::default()).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(d.from, "base");
        let steps: Vec<&Step> = d.steps.iter().map(|s| &s.1).collect();
        assert_eq!(steps[0], &Step::User("root".into()));
        assert_eq!(
            steps[1],
            &Step::Run(Command::Exec(vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo \"$HOME\" && printf 'a\\nb'\nls".into()
            ]))
        );
        assert_eq!(steps[2], &Step::User("user".into()));
        assert_eq!(
            steps[3],
            &Step::Copy {
                sources: vec![format!("{hash}/app dir/*.py")],
                dest: "/app/$x\\$/".into(),
                chown: Some("user".into()),
                chmod: Some(0o755),
                add: false,
            }
        );
        assert_eq!(
            steps[4],
            &Step::Env(vec![
                ("A".into(), "va\"lue $HOME \\ end \\$".into()),
                ("B".into(), String::new())
            ])
        );
        assert_eq!(steps[5], &Step::Workdir("/app dir/$HOME".into()));
        assert_eq!(steps[6], &Step::User("user".into()));
    }

    #[test]
    fn a_forced_step_and_what_follows_miss_the_cache() {
        let mut body = StartBody {
            from_template: Some("base".into()),
            steps: vec![step("RUN", &["a"]), step("RUN", &["b"])],
            ..Default::default()
        };
        body.steps[1].force = Some(true);
        let (text, _) = dockerfile(&body, "root", "bld-2").unwrap();
        assert_eq!(text.matches("bld-2").count(), 1);
        // Run by the shell (`:` is one of its builtins), like every step.
        let d = parse(&text, &Default::default()).unwrap();
        assert!(d.steps.iter().any(|(_, s)| s
            == &Step::Run(Command::Exec(vec![
                "/bin/sh".into(),
                "-c".into(),
                ": bld-2".into()
            ]))));
        assert!(
            text.find("bld-2").unwrap() > text.find("\"a\"").unwrap(),
            "{text}"
        );
        body.force = Some(true);
        let (text, _) = dockerfile(&body, "root", "bld-3").unwrap();
        assert!(
            text.find("bld-3").unwrap() < text.find("\"a\"").unwrap(),
            "{text}"
        );
    }

    #[test]
    fn bad_steps_are_refused_with_their_number() {
        for (steps, want) in [
            (vec![step("HEALTHCHECK", &["x"])], "step 1"),
            (
                vec![step("RUN", &["a"]), step("COPY", &["a", "/b"])],
                "step 2 (COPY) has no files hash",
            ),
            (vec![step("ENV", &["A"])], "pairs"),
            (vec![step("ENV", &["1A", "x"])], "variable name"),
            (vec![step("USER", &["a b"])], "user"),
            (vec![step("WORKDIR", &["/a\nRUN x"])], "line break"),
        ] {
            let body = StartBody {
                from_template: Some("base".into()),
                steps,
                ..Default::default()
            };
            let e = dockerfile(&body, "root", "b").unwrap_err();
            assert!(e.contains(want), "{e}");
        }
        let e = dockerfile(&StartBody::default(), "root", "b").unwrap_err();
        assert!(e.contains("no base"), "{e}");
        let mut body = StartBody {
            from_template: Some("base".into()),
            steps: vec![step("COPY", &["../etc", "/b"])],
            ..Default::default()
        };
        body.steps[0].files_hash = Some("cd".repeat(32));
        assert!(dockerfile(&body, "root", "b")
            .unwrap_err()
            .contains("inside the context"));
    }

    #[test]
    fn contexts_merge_under_their_hashes_and_refuse_escapes() {
        let dir = tempfile::tempdir().unwrap();
        let make = |name: &str, entries: &[(&str, &[u8])], gz: bool| {
            let path = dir.path().join(name);
            let f = std::fs::File::create(&path).unwrap();
            let w: Box<dyn std::io::Write> = if gz {
                Box::new(flate2::write::GzEncoder::new(
                    f,
                    flate2::Compression::fast(),
                ))
            } else {
                Box::new(f)
            };
            let mut b = tar::Builder::new(w);
            for (p, data) in entries {
                let mut h = tar::Header::new_gnu();
                h.set_size(data.len() as u64);
                h.set_mode(0o644);
                h.set_cksum();
                b.append_data(&mut h, p, *data).unwrap();
            }
            b.into_inner().unwrap().flush().unwrap();
            path
        };
        use std::io::Write as _;
        let (h1, h2) = ("a".repeat(64), "b".repeat(64));
        let p1 = make("1.tar", &[("app.py", b"print(1)"), ("d/x.txt", b"x")], true);
        let p2 = make("2.tar", &[("app.py", b"print(2)")], false);
        let out = dir.path().join("ctx.tar");
        merge_contexts(&[(h1.clone(), p1), (h2.clone(), p2)], &out).unwrap();
        let mut a = tar::Archive::new(std::fs::File::open(&out).unwrap());
        let mut seen = std::collections::BTreeMap::new();
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = String::new();
            e.read_to_string(&mut data).unwrap();
            seen.insert(path, data);
        }
        assert_eq!(seen[&format!("{h1}/app.py")], "print(1)");
        assert_eq!(seen[&format!("{h1}/d/x.txt")], "x");
        assert_eq!(seen[&format!("{h2}/app.py")], "print(2)");
        // Written by hand: the tar crate's builder refuses `..` itself.
        let evil = dir.path().join("evil.tar");
        let mut raw = vec![0u8; 512];
        raw[..9].copy_from_slice(b"../escape");
        raw[100..107].copy_from_slice(b"0000644");
        raw[124..135].copy_from_slice(b"00000000000");
        raw[156] = b'0';
        raw[257..263].copy_from_slice(b"ustar\0");
        raw[263..265].copy_from_slice(b"00");
        raw[148..156].copy_from_slice(b"        ");
        let sum: u32 = raw.iter().map(|b| u32::from(*b)).sum();
        raw[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        raw.extend(vec![0u8; 1024]);
        std::fs::write(&evil, raw).unwrap();
        let e = merge_contexts(&[(h1, evil)], &dir.path().join("x.tar")).unwrap_err();
        assert!(e.contains("not a path inside"), "{e}");
    }
}
