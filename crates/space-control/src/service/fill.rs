//! Typing a credential into a field of the sandbox's browser, for what substitution at the
//! gateway cannot do alone: `POST /v1/sandboxes/{id}/browser/fill`.
//!
//! By default the field gets the secret's placeholder, as if the agent had typed it; the
//! gateway puts the value in when the form leaves for a bound host. `mode: value` types the
//! value itself (for a TOTP secret, the current code), for sites whose page script hashes or
//! encrypts the field before sending: this puts the value in the VM, so it is done only when
//! the page in front is `https` on one of the hosts the secret is bound to (a look-alike
//! domain gets nothing), and the origin is checked again in the same script that sets the
//! field. The script runs in a world of its own, so page scripts cannot hook what it calls.
//! Every fill is audited as `credential.fill` (never with the value).

use serde_json::Value;
use space_node_api::policy::Host;
use space_node_api::{SandboxId, SecretBinding};

use super::cdp::Page;
use super::Shared;
use crate::error::{node_error, ApiError, ApiResult};
use crate::store::Principal;

/// The longest selector taken.
pub const MAX_SELECTOR: usize = 1024;

/// What a fill types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FillMode {
    /// The placeholder (the default).
    #[default]
    Placeholder,
    /// The value itself (bound `https` origins only).
    Value,
}

impl FillMode {
    /// Its name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            FillMode::Placeholder => "placeholder",
            FillMode::Value => "value",
        }
    }
}

/// What a fill did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Filled {
    /// The secret.
    pub secret: String,
    /// `placeholder` or `value`.
    pub mode: &'static str,
    /// The origin of the page filled.
    pub origin: String,
    /// The field, as `tag[type=...]`.
    pub field: String,
}

/// Fills `selector` on the page in front of sandbox `raw`'s browser with secret `secret`.
pub async fn fill(
    st: &Shared,
    who: &Principal,
    raw: &str,
    secret: &str,
    selector: &str,
    mode: FillMode,
) -> ApiResult<Filled> {
    let id = super::sandboxes::scoped(st, who, raw, "credential.fill").await?;
    let result = run(st, who, &id, secret, selector, mode).await;
    st.audit(
        who,
        Some(id.as_str()),
        "credential.fill",
        result.as_ref().err(),
        Some(match &result {
            Ok(f) => format!(
                "secret={} mode={} origin={} field={}",
                f.secret, f.mode, f.origin, f.field
            ),
            Err(_) => format!("secret={secret} mode={}", mode.as_str()),
        }),
    )
    .await;
    result
}

fn js(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

async fn run(
    st: &Shared,
    who: &Principal,
    id: &SandboxId,
    secret: &str,
    selector: &str,
    mode: FillMode,
) -> ApiResult<Filled> {
    crate::vault::validate_secret_name(secret)?;
    if selector.trim().is_empty() || selector.len() > MAX_SELECTOR || selector.contains('\0') {
        return Err(ApiError::invalid(format!(
            "selector must be a CSS selector of 1 to {MAX_SELECTOR} bytes"
        )));
    }
    let info = st.node.info(id).await.map_err(node_error(id))?;
    let binding: SecretBinding = info
        .options
        .secrets
        .iter()
        .find(|b| b.name == secret)
        .cloned()
        .ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::NOT_FOUND,
                "secret_not_found",
                format!(
                    "sandbox {id} has no secret {secret} bound (name it in `secrets` when \
                     creating the sandbox)"
                ),
            )
        })?;
    let mut page = Page::front(st, Some(who), id).await?;
    let probe = page
        .evaluate_isolated(&format!(
            "(() => {{ let el = null; try {{ el = document.querySelector({sel}); }} \
             catch (e) {{ return {{origin: location.origin, bad: String(e && e.message)}}; }} \
             return {{origin: location.origin, found: !!el, field: el ? el.tagName.toLowerCase() \
             + (el.type ? '[type=' + el.type + ']' : '') : ''}}; }})()",
            sel = js(selector)
        ))
        .await?;
    let origin = bounded(&probe["origin"], 300);
    if let Some(bad) = probe.get("bad") {
        return Err(ApiError::invalid(format!(
            "selector {selector:?} is not valid: {}",
            bounded(bad, 300)
        )));
    }
    if probe["found"] != Value::Bool(true) {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "illegal_state",
            format!("no element on the page in front ({origin}) matches {selector:?}"),
        ));
    }
    let field = bounded(&probe["field"], 100);
    let value = match mode {
        FillMode::Placeholder => {
            space_node_api::secrets::SecretValue::new(binding.placeholder.clone().into_bytes())
        }
        FillMode::Value => {
            if !origin_bound(&origin, &binding) {
                return Err(ApiError::forbidden(format!(
                    "the page in front is {origin}, not https on a host secret {secret} is bound \
                     to: its value is typed only there"
                )));
            }
            let stored = st.vault.value(&who.tenant, secret).await?.ok_or_else(|| {
                ApiError::new(
                    axum::http::StatusCode::NOT_FOUND,
                    "secret_not_found",
                    format!("no secret {secret} in this tenant"),
                )
            })?;
            stored
                .current()
                .ok_or_else(|| ApiError::internal(format!("secret {secret} has no value now")))?
        }
    };
    let text = std::str::from_utf8(value.as_bytes()).map_err(|_| {
        ApiError::invalid(format!("secret {secret} is not text: it cannot be typed"))
    })?;
    let script = SET
        .replace("__ORIGIN__", &js(&origin))
        .replace("__SELECTOR__", &js(selector))
        .replace("__VALUE__", &js(text));
    let done = page.evaluate_isolated(&script).await;
    drop(script);
    let done = done?;
    if done["ok"] != Value::Bool(true) {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "illegal_state",
            format!("the field was not filled: {}", bounded(&done["why"], 200)),
        ));
    }
    Ok(Filled {
        secret: secret.to_owned(),
        mode: mode.as_str(),
        origin,
        field,
    })
}

/// Sets the field unless the page left the origin that was checked; `__VALUE__` is filled
/// in last (it never comes back in the answer).
const SET: &str = r#"(() => {
  if (location.origin !== __ORIGIN__) return {ok: false, why: "the page moved to another origin"};
  let el = null;
  try { el = document.querySelector(__SELECTOR__); } catch (e) { return {ok: false, why: "bad selector"}; }
  if (!el) return {ok: false, why: "no element matches the selector any more"};
  let proto = null;
  if (el instanceof HTMLInputElement) proto = HTMLInputElement.prototype;
  else if (el instanceof HTMLTextAreaElement) proto = HTMLTextAreaElement.prototype;
  else if (!el.isContentEditable) return {ok: false, why: "the element is not a text field"};
  el.focus();
  if (proto) Object.getOwnPropertyDescriptor(proto, "value").set.call(el, __VALUE__);
  else el.textContent = __VALUE__;
  el.dispatchEvent(new Event("input", {bubbles: true}));
  el.dispatchEvent(new Event("change", {bubbles: true}));
  return {ok: true};
})()"#;

fn bounded(v: &Value, n: usize) -> String {
    v.as_str().unwrap_or_default().chars().take(n).collect()
}

/// Whether `origin` is `https://host[:port]` with the host and port one of the binding's
/// rules matches.
pub fn origin_bound(origin: &str, binding: &SecretBinding) -> bool {
    let Some(rest) = origin.strip_prefix("https://") else {
        return false;
    };
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || rest.starts_with('[') => match p.parse::<u16>() {
            Ok(p) => (h, p),
            Err(_) => (rest, 443),
        },
        _ => (rest, 443),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let Ok(host) = Host::parse(host) else {
        return false;
    };
    binding.hosts.iter().any(|r| r.matches(&host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_on_bound_hosts_takes_a_value() {
        let b = SecretBinding::new(
            "PASSWORD",
            vec![
                "login.example.com".parse().unwrap(),
                "*.bank.example".parse().unwrap(),
                "192.0.2.2:8443".parse().unwrap(),
            ],
        );
        for ok in [
            "https://login.example.com",
            "https://app.bank.example",
            "https://192.0.2.2:8443",
        ] {
            assert!(origin_bound(ok, &b), "{ok}");
        }
        for bad in [
            "http://login.example.com",
            "https://login.example.com.evil.example",
            "https://login-example.com",
            "https://bank.example.evil",
            "https://192.0.2.2:9443",
            "https://192.0.2.2",
            "null",
            "",
            "https://",
        ] {
            assert!(!origin_bound(bad, &b), "{bad}");
        }
    }
}
