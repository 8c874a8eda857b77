//! Exposed ports: a port of a sandbox made reachable at a URL with an unguessable token.

use axum::http::StatusCode;
use space_api as api;
use space_node_api::State as SbState;

use super::Shared;
use crate::api::net::{new_token, token_hash, MAX_PORTS_PER_SANDBOX};
use crate::error::{node_error, ApiError, ApiResult};
use crate::store::Principal;

pub(crate) fn check_port(port: u16) -> ApiResult<u16> {
    if port == 0 {
        return Err(ApiError::invalid("port must be 1..65535"));
    }
    Ok(port)
}

/// Makes `port` of a sandbox of the caller's reachable at a new URL (a port exposed already
/// gets a new URL; the old one stops working). The URL is on the server's public URL, or on
/// `host`, the name the caller reached the server by.
pub async fn expose(
    st: &Shared,
    who: &Principal,
    raw: &str,
    port: u16,
    host: Option<&str>,
) -> ApiResult<api::PortExposed> {
    let base = super::public_base(st, host, false)?;
    let id = super::sandboxes::scoped(st, who, raw, "port.expose").await?;
    let result = async {
        let port = check_port(port)?;
        let info = st.node.info(&id).await.map_err(node_error(&id))?;
        if matches!(info.state, SbState::Terminated | SbState::Failed) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "illegal_state",
                format!(
                    "sandbox {id} is {}; only a live sandbox exposes ports",
                    info.state
                ),
            ));
        }
        let ports = st.store.ports(id.as_str()).await?;
        if ports.len() >= MAX_PORTS_PER_SANDBOX && !ports.iter().any(|p| p.port == port) {
            return Err(ApiError::invalid(format!(
                "a sandbox exposes at most {MAX_PORTS_PER_SANDBOX} ports"
            )));
        }
        let token = new_token();
        let (p, _) = st
            .store
            .expose_port(id.as_str(), port, &token_hash(&token))
            .await?;
        Ok(api::PortExposed {
            port: p.port,
            url: format!("{base}/ingress/{token}/"),
            created_unix_ms: p.created_unix_ms,
        })
    }
    .await;
    st.audit(
        who,
        Some(id.as_str()),
        "port.expose",
        result.as_ref().err(),
        result.as_ref().ok().map(|v| format!("port={}", v.port)),
    )
    .await;
    result
}
