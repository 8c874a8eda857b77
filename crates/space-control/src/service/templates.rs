//! Templates as callers see them: the versions they may create from, in the API's form.

use std::collections::BTreeMap;

use space_api as api;
use space_node_api::{ReadyCheck, TemplateInfo};

use super::Shared;
use crate::error::ApiResult;
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
