//! Templates: listing, builds (jobs with a status and a log), saves of running sandboxes,
//! deletion; and who may see which.
//!
//! A build request is answered at once (`202`, the build's id) and runs in the control
//! plane's process whether the client stays or not; `?wait=true` answers when it is done
//! (the build, succeeded, with its template; or the build's error). Files a build needs (a
//! Dockerfile's context as a tar, an image archive) are uploaded first
//! (`POST /v1/template-uploads`) and named by their upload id.
//!
//! Names: a name nobody owns is public (the stock templates, admins' builds); a name a tenant
//! built or saved is that tenant's: only it lists it, builds versions of it, makes
//! sandboxes of it and deletes it (and admins).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use space_node_api::{Credentials, ReadyCheck, StartSpec, TemplateRef, TemplateSource};
use space_node_api::{TemplateBuild, TemplateInfo};

use super::{ApiJson, ApiPath, ApiQuery, Caller, Shared};
use crate::error::{ApiError, ApiResult};
use crate::store::{BuildRow, Principal, TenantName};

/// vCPUs of a template build when the request names none.
pub const DEFAULT_TEMPLATE_VCPUS: u32 = 1;
/// Memory of a template build when the request names none.
pub const DEFAULT_TEMPLATE_MEMORY_MIB: u64 = 256;
/// Builds listed at most.
const MAX_LISTED_BUILDS: u32 = 100;

/// The API's JSON form of a template build.
pub fn template_json(t: &TemplateInfo, owner: Option<&str>) -> Value {
    serde_json::to_value(crate::service::templates::view(t, owner)).unwrap_or_default()
}

fn build_json(b: &BuildRow) -> Value {
    json!({
        "id": b.id,
        "tenant": b.tenant,
        "name": b.name,
        "version": b.version,
        "source": b.source,
        "state": b.state,
        "error": b.error,
        "created_unix_ms": b.created_ms,
        "finished_unix_ms": b.finished_ms,
    })
}

/// Whether `who` may see and use template `name` (public, or its tenant's, or an admin).
pub async fn visible(st: &Shared, who: &TenantName, admin: bool, name: &str) -> ApiResult<bool> {
    if admin {
        return Ok(true);
    }
    Ok(match st.store.template_owner(name).await? {
        None => true,
        Some(owner) => owner == who.as_str(),
    })
}

/// Refuses a template `tenant` may not use as if it did not exist.
pub async fn check_visible(st: &Shared, tenant: &TenantName, name: &str) -> ApiResult<()> {
    if visible(st, tenant, false, name).await? {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        "template_not_found",
        format!("no template {name}"),
    ))
}

/// `GET /v1/templates`
pub async fn list_templates(
    State(st): State<Shared>,
    Caller(who): Caller,
) -> ApiResult<Json<space_api::TemplateList>> {
    let templates = crate::service::templates::list(&st, &who).await?;
    Ok(Json(space_api::TemplateList { templates }))
}

/// Registry credentials in a request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageBody {
    pub(crate) reference: String,
    #[serde(default)]
    pub(crate) username: Option<String>,
    #[serde(default)]
    pub(crate) password: Option<String>,
    #[serde(default)]
    pub(crate) plain_http: bool,
}

impl ImageBody {
    fn credentials(&self) -> ApiResult<Option<Credentials>> {
        match (&self.username, &self.password) {
            (None, None) => Ok(None),
            (Some(u), Some(p)) => Ok(Some(Credentials {
                username: u.clone(),
                password: p.clone(),
            })),
            _ => Err(ApiError::invalid(
                "registry credentials need both username and password",
            )),
        }
    }
}

/// Body of `POST /v1/templates`: one source (`image`, `from_image`, `from_archive`,
/// `dockerfile`), the shape, the start command.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildBody {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) version: Option<String>,
    /// A stock image of the server's.
    #[serde(default)]
    pub(crate) image: Option<String>,
    #[serde(default)]
    pub(crate) from_image: Option<ImageBody>,
    /// An upload id of an OCI or Docker archive.
    #[serde(default)]
    pub(crate) from_archive: Option<String>,
    /// The tag to pick in an archive holding several images.
    #[serde(default)]
    pub(crate) archive_tag: Option<String>,
    /// The Dockerfile's text.
    #[serde(default)]
    pub(crate) dockerfile: Option<String>,
    /// An upload id of the build context (a tar, plain or gzip).
    #[serde(default)]
    pub(crate) context: Option<String>,
    #[serde(default)]
    pub(crate) build_args: BTreeMap<String, String>,
    /// Credentials and scheme for a Dockerfile's `FROM` image.
    #[serde(default)]
    pub(crate) registry: Option<ImageBody>,
    #[serde(default)]
    pub(crate) vcpus: Option<u32>,
    #[serde(default)]
    pub(crate) memory_mib: Option<u64>,
    #[serde(default)]
    pub(crate) disk_mib: Option<u64>,
    #[serde(default)]
    pub(crate) start: Option<String>,
    #[serde(default)]
    pub(crate) ready_command: Option<String>,
    #[serde(default)]
    pub(crate) ready_port: Option<u16>,
    #[serde(default)]
    pub(crate) start_timeout_ms: Option<u64>,
    /// What a Dockerfile's `RUN` steps may reach (default: the default egress policy).
    #[serde(default)]
    pub(crate) egress: Option<space_node_api::policy::EgressPolicy>,
}

/// `?wait=true`
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct WaitQuery {
    /// Answer when the build has ended (the build, with its template, or its error).
    #[serde(default)]
    wait: bool,
}

/// Refuses a template name outside `[a-z0-9][a-z0-9-]{0,39}`.
pub(crate) fn check_name(name: &str) -> ApiResult<()> {
    if crate::store::TenantName::is_valid(name) {
        return Ok(());
    }
    Err(ApiError::invalid_id(format!(
        "template name {:?} must match [a-z0-9][a-z0-9-]{{0,39}}",
        name.chars().take(64).collect::<String>()
    )))
}

/// One more than the newest numeric version of `name`, or `1`.
pub fn next_version<'a>(versions: impl IntoIterator<Item = &'a str>) -> String {
    let newest = versions
        .into_iter()
        .filter_map(|v| v.parse::<u64>().ok())
        .max();
    newest.map_or(1, |n| n.saturating_add(1)).to_string()
}

async fn source_of(st: &Shared, who: &Principal, body: &BuildBody) -> ApiResult<TemplateSource> {
    let given = [
        body.image.is_some(),
        body.from_image.is_some(),
        body.from_archive.is_some(),
        body.dockerfile.is_some(),
    ]
    .iter()
    .filter(|g| **g)
    .count();
    if given != 1 {
        return Err(ApiError::invalid(
            "name exactly one source: image, from_image, from_archive or dockerfile",
        ));
    }
    if body.context.is_some() && body.dockerfile.is_none() {
        return Err(ApiError::invalid("a context goes with a dockerfile"));
    }
    if let Some(image) = &body.image {
        return Ok(TemplateSource::Stock {
            image: image.clone(),
        });
    }
    if let Some(i) = &body.from_image {
        space_image::registry::Reference::parse(&i.reference)
            .map_err(|e| ApiError::invalid(format!("image reference: {e}")))?;
        return Ok(TemplateSource::Image {
            reference: i.reference.clone(),
            credentials: i.credentials()?,
            plain_http: i.plain_http,
        });
    }
    if let Some(upload) = &body.from_archive {
        return Ok(TemplateSource::Archive {
            archive: super::uploads::input(st, who, upload).await?,
            tag: body.archive_tag.clone(),
        });
    }
    let text = body.dockerfile.clone().unwrap_or_default();
    // Refused here, before anything runs, with the line.
    space_image::dockerfile::parse(&text, &body.build_args)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    Ok(TemplateSource::Dockerfile {
        dockerfile: text,
        context: match &body.context {
            Some(c) => Some(super::uploads::input(st, who, c).await?),
            None => None,
        },
        build_args: body.build_args.clone(),
        credentials: body
            .registry
            .as_ref()
            .map(ImageBody::credentials)
            .transpose()?
            .flatten(),
        plain_http: body.registry.as_ref().is_some_and(|r| r.plain_http),
    })
}

fn start_of(body: &BuildBody) -> ApiResult<Option<StartSpec>> {
    let ready = match (&body.ready_command, body.ready_port) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "name one ready check: ready_command or ready_port",
            ))
        }
        (Some(c), None) => Some(ReadyCheck::Command(c.clone())),
        (None, Some(p)) => Some(ReadyCheck::Port(p)),
        (None, None) => None,
    };
    match &body.start {
        None if ready.is_some() => Err(ApiError::invalid("a ready check needs a start command")),
        None => Ok(None),
        Some(c) if c.trim().is_empty() => Err(ApiError::invalid("the start command is empty")),
        Some(c) => Ok(Some(StartSpec {
            command: c.clone(),
            ready,
            timeout_ms: body
                .start_timeout_ms
                .unwrap_or(space_node_api::template::DEFAULT_START_TIMEOUT.as_millis() as u64),
        })),
    }
}

pub(crate) fn new_build_id() -> String {
    use rand::RngCore;
    let mut b = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut b);
    format!("bld-{}", hex::encode(b))
}

/// `POST /v1/templates[?wait=true]`
pub async fn build_template(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiQuery(q): ApiQuery<WaitQuery>,
    ApiJson(body): ApiJson<BuildBody>,
) -> ApiResult<Response> {
    let started = start_build(&st, &who, body, None).await;
    let (row, job) = match started {
        Ok(x) => x,
        Err(e) => {
            st.audit(&who, None, "template.build", Some(&e), None).await;
            return Err(e);
        }
    };
    let detail = format!("template {}:{} build {}", row.name, row.version, row.id);
    st.audit(&who, None, "template.build", None, Some(detail))
        .await;
    if !q.wait {
        return Ok((StatusCode::ACCEPTED, Json(build_json(&row))).into_response());
    }
    let result = job
        .await
        .map_err(|e| ApiError::internal(format!("the build task failed: {e}")))?;
    let t = result?;
    let owner = st.store.template_owner(t.template.name.as_str()).await?;
    let mut done = match st.store.build(&row.id).await? {
        Some(b) => build_json(&b),
        None => build_json(&row),
    };
    done["template"] = template_json(&t, owner.as_deref());
    Ok((StatusCode::ACCEPTED, Json(done)).into_response())
}

pub(crate) type Job = tokio::task::JoinHandle<ApiResult<TemplateInfo>>;

/// Starts a build of `body` for `who`: a new one, or the `waiting` build `waiting` (whose
/// name is `body.name`).
pub(crate) async fn start_build(
    st: &Shared,
    who: &Principal,
    body: BuildBody,
    waiting: Option<&str>,
) -> ApiResult<(BuildRow, Job)> {
    check_name(&body.name)?;
    let source = source_of(st, who, &body).await?;
    let start = start_of(&body)?;
    if let Some(p) = &body.egress {
        p.validate().map_err(ApiError::invalid)?;
        if !p.headers.is_empty() {
            return Err(ApiError::invalid(
                "egress.headers applies to sandboxes; a build's RUN steps get no header rules",
            ));
        }
    }
    if let TemplateSource::Dockerfile {
        dockerfile,
        build_args,
        ..
    } = &source
    {
        // A base that is a template must be one the caller may use.
        let file = space_image::dockerfile::parse(dockerfile, build_args)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
        if file.from.parse::<space_node_api::TemplateName>().is_ok() && !who.admin {
            check_visible(st, &who.tenant, &file.from).await?;
        }
    }
    if let TemplateSource::Stock { image } = &source {
        let images = st.node.images().await?;
        if !images.contains(image) {
            return Err(ApiError::invalid(format!(
                "no image {:?} on this server; it has: {}",
                image.chars().take(64).collect::<String>(),
                images.join(", ")
            )));
        }
    }
    // Who the name is: a public name takes builds from admins only; a tenant's from it.
    let all = st.node.templates().await?;
    let exists = all.iter().any(|t| t.template.name.as_str() == body.name);
    match st.store.template_owner(&body.name).await? {
        None if exists && !who.admin => {
            return Err(ApiError::forbidden(format!(
                "the template {} is public: only an admin builds its versions",
                body.name
            )))
        }
        None if !who.admin => st.store.claim_template(&body.name, &who.tenant).await?,
        Some(owner) if owner != who.tenant.as_str() && !who.admin => {
            return Err(ApiError::conflict(format!(
                "the template name {} is taken",
                body.name
            )))
        }
        _ => {}
    }
    let version = match &body.version {
        Some(v) => v.clone(),
        None => next_version(
            all.iter()
                .filter(|t| t.template.name.as_str() == body.name)
                .map(|t| t.template.version.as_str()),
        ),
    };
    let template =
        TemplateRef::new(&body.name, &version).map_err(|e| ApiError::invalid_id(e.to_string()))?;
    if all.iter().any(|t| t.template == template) {
        return Err(ApiError::conflict(format!("template {template} exists")));
    }
    let id = waiting.map_or_else(new_build_id, str::to_owned);
    let row = BuildRow {
        id: id.clone(),
        tenant: who.tenant.to_string(),
        name: body.name.clone(),
        version: version.clone(),
        source: source.describe(),
        state: "running".into(),
        error: None,
        log: String::new(),
        created_ms: 0,
        finished_ms: None,
    };
    match waiting {
        None => st.store.insert_build(&row).await?,
        Some(_) => {
            if !st
                .store
                .start_waiting_build(&id, &version, &row.source)
                .await?
            {
                return Err(ApiError::conflict(format!(
                    "build {id} has started already"
                )));
            }
        }
    }
    let build = TemplateBuild {
        template,
        source,
        vcpus: body.vcpus.unwrap_or(DEFAULT_TEMPLATE_VCPUS),
        memory_mib: body.memory_mib.unwrap_or(DEFAULT_TEMPLATE_MEMORY_MIB),
        disk_mib: body.disk_mib,
        start,
        ready_timeout_ms: u64::try_from(st.ready_timeout.as_millis()).unwrap_or(u64::MAX),
        build_id: Some(id.clone()),
        egress: body.egress.clone(),
    };
    let job = tokio::spawn(run_build(st.clone(), id, build));
    let row = st.store.build(&row.id).await?.unwrap_or(row);
    Ok((row, job))
}

/// The build job: one at a time (each boots VMs), its end and log recorded.
async fn run_build(st: Shared, id: String, build: TemplateBuild) -> ApiResult<TemplateInfo> {
    let _one = st.builds.lock().await;
    let result = st.node.build_template(build).await;
    let log = match st.node.build_log(&id, 0).await {
        Ok(chunk) => chunk.text,
        Err(_) => String::new(),
    };
    let err = result.as_ref().err().map(|f| f.message.clone());
    if let Err(e) = st.store.finish_build(&id, err.as_deref(), &log).await {
        tracing::error!(build = %id, error = %e, "recording the end of a build");
    }
    Ok(result?)
}

async fn visible_build(st: &Shared, who: &Principal, id: &str) -> ApiResult<BuildRow> {
    match st.store.build(id).await? {
        Some(b) if who.admin || b.tenant == who.tenant.as_str() => Ok(b),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "build_not_found",
            format!("no build {id}"),
        )),
    }
}

/// `GET /v1/builds`
pub async fn list_builds(State(st): State<Shared>, Caller(who): Caller) -> ApiResult<Json<Value>> {
    let tenant = (!who.admin).then_some(&who.tenant);
    let rows = st.store.builds(tenant, MAX_LISTED_BUILDS).await?;
    Ok(Json(
        json!({ "builds": rows.iter().map(build_json).collect::<Vec<_>>() }),
    ))
}

/// `GET /v1/builds/{id}`
pub async fn get_build(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(build_json(&visible_build(&st, &who, &id).await?)))
}

/// `?from=N&follow=true`
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
pub struct LogQuery {
    /// The byte offset to start at.
    #[serde(default, deserialize_with = "super::whole")]
    #[schemars(with = "u64")]
    from: u64,
    #[serde(default)]
    follow: bool,
}

/// `GET /v1/builds/{id}/log[?from=N][&follow=true]`: the log as text; with `follow`, it
/// streams until the build ends.
pub async fn build_log(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<LogQuery>,
) -> ApiResult<Response> {
    let row = visible_build(&st, &who, &id).await?;
    let text_plain = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    if row.state != "running" || !q.follow {
        let text = if row.state == "running" {
            st.node
                .build_log(&id, q.from)
                .await
                .map(|c| c.text)
                .unwrap_or_default()
        } else {
            let at = (q.from as usize).min(row.log.len());
            let mut at = at;
            while !row.log.is_char_boundary(at) {
                at += 1;
            }
            row.log[at..].to_owned()
        };
        return Ok((text_plain, text).into_response());
    }
    // Following the node's log; then, once the node's part has ended, waiting for the build
    // itself to end (in a cluster it is published to the object store and fetched by the
    // other nodes after that), with what the build's record adds; then the end.
    #[derive(Clone, Copy)]
    enum Phase {
        Node,
        Settling,
        Done,
    }
    let tail = |log: &str, from: u64| {
        let mut at = (from as usize).min(log.len());
        while !log.is_char_boundary(at) {
            at += 1;
        }
        log[at..].to_owned()
    };
    let stream = futures::stream::unfold(
        (st, id, q.from, Phase::Node),
        move |(st, id, from, phase)| async move {
            match phase {
                Phase::Done => None,
                Phase::Node => match st.node.build_log(&id, from).await {
                    Ok(chunk) => {
                        let next = chunk.next;
                        let phase = if chunk.done {
                            Phase::Settling
                        } else {
                            Phase::Node
                        };
                        Some((
                            Ok::<_, std::io::Error>(bytes::Bytes::from(chunk.text)),
                            (st, id, next, phase),
                        ))
                    }
                    // The node's log is gone (it restarted): what the record has, once the
                    // build has ended.
                    Err(_) => Some((Ok(bytes::Bytes::new()), (st, id, from, Phase::Settling))),
                },
                Phase::Settling => match st.store.build(&id).await {
                    Ok(Some(b)) if b.state != "running" => {
                        let text = tail(&b.log, from);
                        Some((Ok(bytes::Bytes::from(text)), (st, id, from, Phase::Done)))
                    }
                    Ok(Some(_)) => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        Some((Ok(bytes::Bytes::new()), (st, id, from, Phase::Settling)))
                    }
                    _ => None,
                },
            }
        },
    )
    .filter(|c| futures::future::ready(!matches!(c, Ok(b) if b.is_empty())));
    Ok((text_plain, Body::from_stream(stream)).into_response())
}

/// Body of `POST /v1/sandboxes/{id}/template`.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "TemplateSaveRequest")]
pub struct SaveBody {
    #[schemars(with = "crate::api::shapes::Name")]
    name: String,
    /// The new version (default: one more than the newest).
    #[serde(default)]
    #[schemars(with = "Option<crate::api::shapes::TemplateVersion>")]
    version: Option<String>,
    /// `true` (default): the memory too, so its sandboxes start with this one's processes;
    /// `false`: the disk alone, booted afresh (the template's start command runs again).
    #[serde(default)]
    memory: Option<bool>,
}

/// `POST /v1/sandboxes/{id}/template`: a template of the sandbox as it is now.
pub async fn save_template(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SaveBody>,
) -> ApiResult<Response> {
    let result = save_inner(&st, &who, &id, body).await;
    st.audit(
        &who,
        Some(&id),
        "template.save",
        result.as_ref().err(),
        result
            .as_ref()
            .ok()
            .map(|v| format!("template {}:{}", v["name"], v["version"]).replace('"', "")),
    )
    .await;
    Ok((StatusCode::CREATED, Json(result?)).into_response())
}

async fn save_inner(st: &Shared, who: &Principal, id: &str, body: SaveBody) -> ApiResult<Value> {
    let memory = body.memory.unwrap_or(true);
    let t = crate::service::templates::save(st, who, id, &body.name, body.version, memory).await?;
    let owner = st.store.template_owner(&body.name).await?;
    Ok(template_json(&t, owner.as_deref()))
}

/// `DELETE /v1/templates/{name}/{version}`: an admin's, or the owning tenant's.
pub async fn delete_template(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath((name, version)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    let template =
        TemplateRef::new(&name, &version).map_err(|e| ApiError::invalid_id(e.to_string()))?;
    let result = crate::service::templates::delete(&st, &who, &template).await;
    st.audit(
        &who,
        None,
        "template.delete",
        result.as_ref().err(),
        Some(format!("template {template}")),
    )
    .await;
    result.map(|()| StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_version_follows_the_newest_number() {
        assert_eq!(next_version([]), "1");
        assert_eq!(next_version(["1", "2", "x"]), "3");
        assert_eq!(next_version(["9", "10"]), "11");
        assert_eq!(next_version(["beta"]), "1");
    }
}
