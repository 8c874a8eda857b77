//! Templates as callers see them: the versions they may create from, in the API's form.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use space_api as api;
use space_node_api::{ReadyCheck, SandboxId, TemplateInfo, TemplateRef};

use super::Shared;
use crate::api::templates::{check_name, next_version};
use crate::error::{ApiError, ApiResult};
use crate::store::Principal;

/// The API's form of a template build owned by `owner` (`None`: shared).
pub fn view(t: &TemplateInfo, owner: Option<&str>) -> api::Template {
    api::Template {
        name: t.template.name.to_string(),
        version: t.template.version.to_string(),
        vcpus: t.vcpus,
        memory_mib: t.memory_mib,
        image_mib: t.image_mib(),
        image: t.image.clone(),
        created_unix_ms: t.created_unix_ms,
        source: t.source.clone(),
        owner: owner.map(str::to_owned),
        env: t.guest.env.clone(),
        user: t.guest.user.clone(),
        workdir: t.guest.workdir.clone(),
        command: t.guest.command.clone(),
        ports: t.guest.ports.clone(),
        start: t.start.as_ref().map(|s| api::TemplateStart {
            command: s.command.clone(),
            ready: s.ready.as_ref().map(|r| match r {
                ReadyCheck::Command(c) => api::ReadyCheck::Command(c.clone()),
                ReadyCheck::Port(p) => api::ReadyCheck::Port(*p),
            }),
        }),
    }
}

/// Every version of every template the caller may see: the shared ones and its tenant's
/// (an admin sees all).
pub async fn list(st: &Shared, who: &Principal) -> ApiResult<Vec<api::Template>> {
    let all = st.node.templates().await?;
    let owners: BTreeMap<String, String> = st.store.template_owners().await?.into_iter().collect();
    Ok(all
        .iter()
        .filter_map(|t| {
            let owner = owners.get(t.template.name.as_str());
            let ok = who.admin || owner.is_none_or(|o| o == who.tenant.as_str());
            ok.then(|| view(t, owner.map(String::as_str)))
        })
        .collect())
}

/// Saves sandbox `raw` of the caller's as version `version` (default: one more than the
/// newest) of template `name`: with `memory`, its processes included; without, its disk
/// booted afresh. The name becomes the tenant's when nobody owns it; a public name takes
/// versions from admins only.
pub async fn save(
    st: &Shared,
    who: &Principal,
    raw: &str,
    name: &str,
    version: Option<String>,
    memory: bool,
) -> ApiResult<TemplateInfo> {
    let sid: SandboxId = st.scope(who, raw).await?;
    check_name(name)?;
    let all = st.node.templates().await?;
    let exists = all.iter().any(|t| t.template.name.as_str() == name);
    match st.store.template_owner(name).await? {
        None if exists && !who.admin => {
            return Err(ApiError::forbidden(format!(
                "the template {name} is public: only an admin makes its versions"
            )))
        }
        None => st.store.claim_template(name, &who.tenant).await?,
        Some(owner) if owner != who.tenant.as_str() => {
            return Err(ApiError::conflict(format!(
                "the template name {name} is taken"
            )))
        }
        Some(_) => {}
    }
    let version = version.unwrap_or_else(|| {
        next_version(
            all.iter()
                .filter(|t| t.template.name.as_str() == name)
                .map(|t| t.template.version.as_str()),
        )
    });
    let template =
        TemplateRef::new(name, &version).map_err(|e| ApiError::invalid_id(e.to_string()))?;
    Ok(st.node.save_template(&sid, &template, memory).await?)
}

/// Deletes template build `template`: an admin's call, or the owning tenant's (another
/// tenant's is not found). The name is released when its last version goes.
pub async fn delete(st: &Shared, who: &Principal, template: &TemplateRef) -> ApiResult<()> {
    let name = template.name.as_str();
    let owner = st.store.template_owner(name).await?;
    match &owner {
        _ if who.admin => {}
        Some(o) if o == who.tenant.as_str() => {}
        Some(_) => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "template_not_found",
                format!("no template {template}"),
            ))
        }
        None => {
            return Err(ApiError::forbidden(
                "only an admin deletes public templates",
            ))
        }
    }
    st.node.delete_template(template).await?;
    let left = st.node.templates().await?;
    if owner.is_some() && !left.iter().any(|t| t.template.name.as_str() == name) {
        st.store.release_template(name).await?;
    }
    Ok(())
}
