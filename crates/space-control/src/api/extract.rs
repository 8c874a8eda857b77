//! What a handler takes from a request: the caller (authenticated by its API key), and the
//! JSON body, query and path, each refused with the API's own error shape rather than axum's;
//! and the serde helpers that keep numbers whole and objects objects.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::Json;
use serde::de::DeserializeOwned;

use super::Shared;
use crate::error::{ApiError, ApiResult};
use crate::store::{AuthError, NewAuditEvent, Principal};

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl FromRequestParts<Shared> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> ApiResult<Self> {
        let result = match parts.headers.get(header::AUTHORIZATION) {
            Some(h) => match h.to_str() {
                Ok(s) => state.store.authenticate(Some(s)).await,
                Err(_) => Err(AuthError::Malformed),
            },
            None => match websocket_key(&parts.headers) {
                Some(key) => {
                    state
                        .store
                        .authenticate(Some(&format!("Bearer {key}")))
                        .await
                }
                None => state.store.authenticate(None).await,
            },
        };
        let e = match result {
            Ok(p) => return Ok(Caller(p)),
            Err(e) => e,
        };
        let key_id = e.key_id().map(str::to_owned);
        let tenant = e.tenant().cloned();
        let err = ApiError::from(e);
        if err.code == "unauthorized" {
            let event = NewAuditEvent {
                tenant,
                key_id,
                sandbox: None,
                operation: "auth".into(),
                result: "unauthorized".into(),
                detail: Some(err.message.clone()),
            };
            if let Err(e) = state.store.record(event).await {
                tracing::error!(error = %e, "recording an authentication failure");
            }
        }
        Err(err)
    }
}

/// The key a browser sends on a WebSocket upgrade, which cannot carry headers of its own:
/// the subprotocol `space.key.<key>` beside `space` (`docs/api.md`, *Authentication*).
fn websocket_key(headers: &axum::http::HeaderMap) -> Option<String> {
    let upgrade = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade {
        return None;
    }
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix("space.key.").map(str::to_owned))
}

/// An authenticated caller with an admin key (`403 forbidden` for a tenant key).
#[derive(Debug, Clone)]
pub struct AdminCaller(pub Principal);

impl FromRequestParts<Shared> for AdminCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> ApiResult<Self> {
        let Caller(p) = Caller::from_request_parts(parts, state).await?;
        if !p.admin {
            return Err(ApiError::forbidden(format!(
                "this route needs an admin key; key {} of tenant {} is not one",
                p.key_id, p.tenant
            )));
        }
        Ok(AdminCaller(p))
    }
}

/// A JSON body whose rejections answer in the API's error format.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> ApiResult<Self> {
        let Json(v) = Json::<serde_json::Value>::from_request(req, state).await?;
        // Every body of the API is an object; serde would also take a struct as an array of
        // its fields.
        if !v.is_object() {
            return Err(ApiError::invalid("the body must be a JSON object"));
        }
        T::deserialize(integral(v))
            .map(ApiJson)
            .map_err(|e| ApiError::invalid(format!("the JSON body does not fit: {e}")))
    }
}

/// A whole number of a path or query string: digits, or a number with no fraction (`255.0`,
/// `1e3`), as JSON Schema counts integers; `None` when it is neither or does not fit `T`.
pub fn parse_whole<T: TryFrom<u64>>(s: &str) -> Option<T> {
    let n = s.parse::<u64>().ok().or_else(|| {
        let f: f64 = s.parse().ok()?;
        let whole = f.is_finite() && f.fract() == 0.0 && f >= 0.0 && f < 2f64.powi(64);
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        whole.then_some(f as u64)
    })?;
    T::try_from(n).ok()
}

/// `deserialize_with` for a whole number of a query string (see [`parse_whole`]).
pub fn whole<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    let s = <String as serde::Deserialize>::deserialize(d)?;
    parse_whole(&s)
        .ok_or_else(|| serde::de::Error::custom(format!("{s:?} is not a whole number in range")))
}

/// `deserialize_with` for a field holding an object: a JSON object only (serde would also
/// take a struct as an array of its fields).
pub fn object<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: DeserializeOwned,
{
    let v = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
    if !v.is_object() {
        return Err(serde::de::Error::custom("expected a JSON object"));
    }
    T::deserialize(v).map_err(serde::de::Error::custom)
}

/// [`object`] for a field that may be left out or null.
pub fn object_opt<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: DeserializeOwned,
{
    let v = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
    match v {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::Object(_) => T::deserialize(v)
            .map(Some)
            .map_err(serde::de::Error::custom),
        _ => Err(serde::de::Error::custom("expected a JSON object or null")),
    }
}

/// [`whole`] for a parameter that may be left out.
pub fn whole_opt<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<u64>,
{
    whole(d).map(Some)
}

/// `v` with every number that is a whole number written as a float (`253.0`, `1e3`) made an
/// integer: JSON Schema counts those as integers, so the document's `integer` fields take
/// them.
pub fn integral(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::Number(n) if !n.is_i64() && !n.is_u64() => {
            let whole = n.as_f64().filter(|f| f.is_finite() && f.fract() == 0.0);
            // Beyond 2^64 a float is no exact integer of any field here: left as it is.
            match whole {
                Some(f) if f >= -(2f64.powi(63)) && f < 2f64.powi(63) =>
                {
                    #[allow(clippy::cast_possible_truncation)]
                    Value::from(f as i64)
                }
                Some(f) if f >= 0.0 && f < 2f64.powi(64) =>
                {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    Value::from(f as u64)
                }
                _ => Value::Number(n),
            }
        }
        Value::Array(items) => Value::Array(items.into_iter().map(integral).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, integral(v))).collect())
        }
        other => other,
    }
}

/// A JSON body that may be left out entirely (no body, no content type): `None` then.
#[derive(Debug)]
pub struct OptionalJson<T>(pub Option<T>);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> ApiResult<Self> {
        let typed = req.headers().contains_key(header::CONTENT_TYPE);
        let empty = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() == b"0");
        if !typed && (empty || !req.headers().contains_key(header::TRANSFER_ENCODING)) {
            // No content type: only an empty body is accepted.
            let bytes = axum::body::Bytes::from_request(req, state)
                .await
                .map_err(|r| {
                    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                        ApiError::too_large("the request body is over the limit")
                    } else {
                        ApiError::invalid(r.body_text())
                    }
                })?;
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Ok(OptionalJson(None));
            }
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "this route takes a JSON body: send Content-Type: application/json",
            ));
        }
        let ApiJson(v) = ApiJson::<T>::from_request(req, state).await?;
        Ok(OptionalJson(Some(v)))
    }
}

/// A query string whose rejections answer in the API's error format.
#[derive(Debug)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(r) => Err(r.into()),
        }
    }
}

/// Path parameters whose rejections answer in the API's error format.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> ApiResult<Self> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(v)) => Ok(ApiPath(v)),
            Err(r) => Err(ApiError::invalid(r.body_text())),
        }
    }
}
