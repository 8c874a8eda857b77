//! Browser routes: `POST /v1/sandboxes/{id}/browser` starts the sandbox's Chromium and
//! answers its DevTools URL (for Playwright's `connect_over_cdp`, Puppeteer's `connect`) and
//! its live view; `GET .../browser/cdp` is that DevTools WebSocket; `.../browser/live/{token}/`
//! is the live view (noVNC); `POST .../browser/fill` types a credential into a field. See
//! [`crate::service::browser`] and [`crate::service::fill`].

use axum::extract::{ConnectInfo, FromRequestParts as _, Request, State};
use axum::http::{header, HeaderMap};
use axum::response::Response;
use axum::Json;
use serde::Deserialize;
use space_node_api::SandboxId;

use super::{ApiJson, ApiPath, ApiQuery, Caller, Shared};
use crate::error::{node_error, ApiError, ApiResult};
use crate::listen::Peer;
use crate::service::browser::{self as service, CDP_PORT, LIVE_PORT};

use space_api::BrowserSession;

/// `POST /v1/sandboxes/{id}/browser`
pub async fn start(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    peer: Option<axum::Extension<ConnectInfo<Peer>>>,
    headers: HeaderMap,
) -> ApiResult<Json<BrowserSession>> {
    let tls = peer.is_some_and(|p| p.0 .0.tls);
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let http_base = crate::service::public_base(&st, host, tls)?;
    service::session(&st, &who, &raw, &http_base)
        .await
        .map(Json)
}

/// Body of `POST /v1/sandboxes/{id}/browser/fill`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FillBody {
    secret: String,
    selector: String,
    #[serde(default)]
    mode: Option<String>,
}

/// `POST /v1/sandboxes/{id}/browser/fill`
pub async fn fill(
    State(st): State<Shared>,
    Caller(who): Caller,
    ApiPath(raw): ApiPath<String>,
    ApiJson(body): ApiJson<FillBody>,
) -> ApiResult<Json<crate::service::fill::Filled>> {
    use crate::service::fill::{self, FillMode};
    let mode = match body.mode.as_deref() {
        None | Some("placeholder") => FillMode::Placeholder,
        Some("value") => FillMode::Value,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "mode must be \"placeholder\" or \"value\", not {:?}",
                other.chars().take(40).collect::<String>()
            )))
        }
    };
    fill::fill(&st, &who, &raw, &body.secret, &body.selector, mode)
        .await
        .map(Json)
}

/// `?token=` of the DevTools URL.
#[derive(Debug, Default, Deserialize)]
pub struct TokenQuery {
    #[serde(default)]
    token: Option<String>,
}

/// `GET /v1/sandboxes/{id}/browser/cdp`: the browser's DevTools WebSocket, with the API key
/// header or the URL's token.
pub async fn cdp(
    State(st): State<Shared>,
    ApiPath(raw): ApiPath<String>,
    ApiQuery(q): ApiQuery<TokenQuery>,
    req: Request,
) -> ApiResult<Response> {
    let (mut parts, body) = req.into_parts();
    let (id, who) = match q.token {
        Some(t) => {
            let id: SandboxId = raw
                .parse()
                .map_err(|e: space_node_api::ids::IdError| ApiError::invalid_id(e.to_string()))?;
            if !service::check_token(&st, "cdp", &id, &t) {
                return Err(ApiError::unauthorized(
                    "the token of this DevTools URL is wrong or expired: POST \
                     /v1/sandboxes/{id}/browser makes a new one",
                ));
            }
            (id, None)
        }
        None => {
            let Caller(who) = Caller::from_request_parts(&mut parts, &st).await?;
            (st.scope(&who, &raw).await?, Some(who))
        }
    };
    let path = service::devtools_path(&st, who.as_ref(), &id).await?;
    // DevTools refuses a WebSocket whose Origin it was not told to allow; the client here is
    // the API's caller, not a page.
    parts.headers.remove(header::ORIGIN);
    let req = Request::from_parts(parts, body);
    let info = st.node.info(&id).await.map_err(node_error(&id))?;
    let prefix = format!("/v1/sandboxes/{id}/browser/cdp");
    super::net::proxy_to(
        &st,
        who.as_ref(),
        &info,
        CDP_PORT,
        &prefix,
        path.trim_start_matches('/'),
        req,
        false,
    )
    .await
}

/// `GET /v1/sandboxes/{id}/browser/live/{token}/{*path}`: the live view (noVNC's page, its
/// files and its WebSocket), with the token of the URL `POST .../browser` answered.
pub async fn live(
    State(st): State<Shared>,
    ApiPath((raw, token, rest)): ApiPath<(String, String, String)>,
    req: Request,
) -> ApiResult<Response> {
    let id: SandboxId = raw
        .parse()
        .map_err(|e: space_node_api::ids::IdError| ApiError::invalid_id(e.to_string()))?;
    if !service::check_token(&st, "live", &id, &token) {
        return Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            "no live view at this URL (a wrong or expired token): POST \
             /v1/sandboxes/{id}/browser makes a new one",
        ));
    }
    let info = st.node.info(&id).await.map_err(node_error(&id))?;
    let prefix = format!("/v1/sandboxes/{id}/browser/live/{token}");
    super::net::proxy_to(&st, None, &info, LIVE_PORT, &prefix, &rest, req, true).await
}
