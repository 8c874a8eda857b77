//! E2B's network options onto space's egress policy (`docs/e2b.md`, `docs/egress.md`): at
//! create (`network`, `allow_internet_access`) and on a running sandbox
//! (`PUT /sandboxes/{id}/network`, which replaces the policy whole).
//!
//! - `denyOut` holding all traffic (`0.0.0.0/0`, `::/0`), or `allow_internet_access: false`,
//!   makes the default deny; other `denyOut` entries are deny rules.
//! - `allowOut` entries are allow rules, and win over `denyOut` as in E2B (an entry in both
//!   is allowed).
//! - Entries are host names (`example.com`, `*.example.com`) or IP addresses; a CIDR range
//!   other than a single address or all traffic is refused, as are `dnsServers` and
//!   `egressProxy` (space's gateway resolves names itself and has no upstream proxy).
//! - `rules` (`{host: [{transform: {headers: {name: value}}}]}`) become the policy's header
//!   rules; `${e2b.secrets.NAME}` in a value becomes a reference to the E2B secret's vault
//!   value (`e2b::secrets`), which the gateway puts in as the request leaves.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use space_node_api::policy::{EgressDefault, EgressPolicy, EgressRule};
use space_node_api::HeaderRule;

use super::rest::{self, E2bCaller, E2bError, E2bJson, E2bResult};
use crate::api::Shared;
use crate::error::node_error;
use crate::store::TenantName;

/// The network options of a create or an update, as the SDKs send them.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Network {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    dns_servers: Option<Vec<String>>,
    egress_proxy: Option<Value>,
    rules: Option<Value>,
    /// Read by the create (ports public on their hosts), not by the egress policy.
    pub allow_public_traffic: Option<bool>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

fn all_traffic(entry: &str) -> bool {
    matches!(entry.trim(), "0.0.0.0/0" | "::/0")
}

fn rule(entry: &str, what: &str) -> E2bResult<EgressRule> {
    let e = entry.trim();
    let host = match e.split_once('/') {
        None => e,
        Some((addr, "32")) if addr.parse::<std::net::Ipv4Addr>().is_ok() => addr,
        Some((addr, "128")) if addr.parse::<std::net::Ipv6Addr>().is_ok() => addr,
        Some(_) => {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "{what}: {e:?} is an address range; space's egress rules name hosts and \
                     single addresses (all traffic is 0.0.0.0/0)"
                ),
            ))
        }
    };
    // A bare IPv6 address is written in brackets in a rule.
    let text = if host.parse::<std::net::Ipv6Addr>().is_ok() {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    text.parse::<EgressRule>()
        .map_err(|err| E2bError::new(StatusCode::BAD_REQUEST, format!("{what}: {err}")))
}

impl Network {
    /// The policy these options make (`None`: they leave the default), given
    /// `allow_internet_access` from outside the object (a create's top level).
    pub fn policy(&self, allow_internet_access: Option<bool>) -> E2bResult<Option<EgressPolicy>> {
        let refuse = |what: &str, why: &str| {
            Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("network.{what} is not served: {why} (docs/e2b.md)"),
            ))
        };
        if self.dns_servers.as_ref().is_some_and(|d| !d.is_empty()) {
            return refuse("dnsServers", "the gateway resolves names itself");
        }
        if self.egress_proxy.as_ref().is_some_and(|p| !p.is_null()) {
            return refuse("egressProxy", "the gateway has no upstream proxy");
        }
        let headers = match &self.rules {
            None => Vec::new(),
            Some(r) => header_rules(r)?,
        };
        let internet = self.allow_internet_access.or(allow_internet_access);
        if self.allow_out.is_none()
            && self.deny_out.is_none()
            && internet.is_none()
            && headers.is_empty()
        {
            return Ok(None);
        }
        let allow = self.allow_out.clone().unwrap_or_default();
        let deny = self.deny_out.clone().unwrap_or_default();
        let mut policy = EgressPolicy {
            headers,
            ..EgressPolicy::default()
        };
        if internet == Some(false) || deny.iter().any(|d| all_traffic(d)) {
            policy.default = EgressDefault::Deny;
        }
        if allow.iter().any(|a| all_traffic(a)) {
            policy.default = EgressDefault::Allow;
        }
        for a in allow.iter().filter(|a| !all_traffic(a)) {
            let r = rule(a, "allowOut")?;
            if !policy.allow.contains(&r) {
                policy.allow.push(r);
            }
        }
        for d in deny.iter().filter(|d| !all_traffic(d)) {
            let r = rule(d, "denyOut")?;
            if !policy.allow.contains(&r) && !policy.deny.contains(&r) {
                policy.deny.push(r);
            }
        }
        policy
            .validate()
            .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e))?;
        Ok(Some(policy))
    }

    /// [`Network::policy`] with the E2B secrets its header rules name resolved for `tenant`
    /// ([`resolve_secrets`]).
    pub async fn egress(
        &self,
        st: &Shared,
        tenant: &TenantName,
        allow_internet_access: Option<bool>,
    ) -> E2bResult<Option<EgressPolicy>> {
        let mut policy = self.policy(allow_internet_access)?;
        if let Some(p) = &mut policy {
            resolve_secrets(st, tenant, p).await?;
        }
        Ok(policy)
    }
}

fn bad_rules(why: impl std::fmt::Display) -> E2bError {
    E2bError::new(StatusCode::BAD_REQUEST, format!("network.rules: {why}"))
}

/// `rules` as the SDKs send them: host (or address) to a list of rules, each with an optional
/// `transform.headers` (name to value). Values keep E2B's references; see
/// [`resolve_secrets`].
fn header_rules(rules: &Value) -> E2bResult<Vec<HeaderRule>> {
    let map = match rules {
        Value::Null => return Ok(Vec::new()),
        Value::Object(m) => m,
        _ => return Err(bad_rules("expected an object of host to a list of rules")),
    };
    let mut out = Vec::new();
    for (host, list) in map {
        let host_rule = rule(host, "network.rules")?;
        let list = list
            .as_array()
            .ok_or_else(|| bad_rules(format!("the rules of {host:?} are not a list")))?;
        for r in list {
            let r = r
                .as_object()
                .ok_or_else(|| bad_rules(format!("a rule of {host:?} is not an object")))?;
            if let Some(k) = r.keys().find(|k| *k != "transform") {
                return Err(bad_rules(format!("unknown rule field {k:?}")));
            }
            let transform = match r.get("transform") {
                None | Some(Value::Null) => continue,
                Some(Value::Object(t)) => t,
                Some(_) => return Err(bad_rules("a transform is not an object")),
            };
            if let Some(k) = transform.keys().find(|k| *k != "headers") {
                return Err(bad_rules(format!(
                    "unknown transform field {k:?} (headers are served)"
                )));
            }
            let headers = match transform.get("headers") {
                None | Some(Value::Null) => continue,
                Some(Value::Object(h)) => h,
                Some(_) => return Err(bad_rules("transform.headers is not an object")),
            };
            for (name, value) in headers {
                let value = value.as_str().ok_or_else(|| {
                    bad_rules(format!("the value of header {name:?} is not a string"))
                })?;
                if value.contains("${secret:") {
                    return Err(bad_rules(format!(
                        "the value of header {name:?} holds \"${{secret:\", which space \
                         reserves; name E2B secrets as ${{e2b.secrets.NAME}}"
                    )));
                }
                out.push(HeaderRule {
                    host: host_rule.clone(),
                    name: name.clone(),
                    value: value.to_owned(),
                });
            }
        }
    }
    Ok(out)
}

/// Rewrites each `${e2b.secrets.NAME}` in the policy's header values into a reference to
/// the vault value of the caller's E2B secret `NAME`; a secret that does not exist, or any
/// other `${e2b.` reference (workload identity tokens), is refused.
pub async fn resolve_secrets(
    st: &Shared,
    tenant: &TenantName,
    policy: &mut EgressPolicy,
) -> E2bResult<()> {
    const OPEN: &str = "${e2b.";
    const SECRETS: &str = "${e2b.secrets.";
    for h in &mut policy.headers {
        let mut out = String::with_capacity(h.value.len());
        let mut rest = h.value.as_str();
        while let Some(at) = rest.find(OPEN) {
            out.push_str(&rest[..at]);
            let after = &rest[at..];
            if !after.starts_with(SECRETS) {
                return Err(bad_rules(format!(
                    "header {:?}: only ${{e2b.secrets.NAME}} references are served (workload \
                     identity tokens are not)",
                    h.name
                )));
            }
            let inner = &after[SECRETS.len()..];
            let end = inner.find('}').ok_or_else(|| {
                bad_rules(format!(
                    "header {:?}: a secret reference has no '}}'",
                    h.name
                ))
            })?;
            let name = &inner[..end];
            let secret = super::secrets::find(st, tenant, name).await.map_err(|_| {
                bad_rules(format!(
                    "header {:?} names secret {:?}, which does not exist (Secret.create)",
                    h.name,
                    name.chars().take(80).collect::<String>()
                ))
            })?;
            out.push_str("${secret:");
            out.push_str(&secret.vault_name());
            out.push('}');
            rest = &inner[end + 1..];
        }
        out.push_str(rest);
        h.value = out;
    }
    Ok(())
}

/// `PUT /sandboxes/{id}/network`: replaces the sandbox's egress policy (what the body omits
/// is cleared: an empty body allows all). New connections use it at once. 204.
pub async fn update(
    State(st): State<Shared>,
    E2bCaller(who): E2bCaller,
    Path(raw): Path<String>,
    E2bJson(body): E2bJson<Network>,
) -> E2bResult<StatusCode> {
    let result = async {
        let (id, _) = rest::owned(&st, &who, &raw).await?;
        let policy = body
            .egress(&st, &who.tenant, None)
            .await?
            .unwrap_or_default();
        crate::api::net::check_header_secrets(&st, &who.tenant, &policy).await?;
        st.node
            .set_egress(&id, policy)
            .await
            .map_err(node_error(&id))?;
        Ok(StatusCode::NO_CONTENT)
    }
    .await;
    rest::audited(&st, &who, &raw, "egress.update", result).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(v: Value) -> Network {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn e2b_network_options_become_a_policy() {
        assert_eq!(net(serde_json::json!({})).policy(None).unwrap(), None);
        let p = net(serde_json::json!({}))
            .policy(Some(false))
            .unwrap()
            .unwrap();
        assert_eq!(p.default, EgressDefault::Deny);
        let p = net(serde_json::json!({
            "denyOut": ["0.0.0.0/0", "10.1.2.3"],
            "allowOut": ["example.com", "10.1.2.3/32", "2001:db8::1"],
        }))
        .policy(None)
        .unwrap()
        .unwrap();
        assert_eq!(p.default, EgressDefault::Deny);
        let allow: Vec<String> = p.allow.iter().map(ToString::to_string).collect();
        assert_eq!(allow.len(), 3, "{allow:?}");
        assert!(p.deny.is_empty(), "allowOut wins: {:?}", p.deny);
        let p = net(serde_json::json!({"denyOut": ["evil.example"]}))
            .policy(None)
            .unwrap()
            .unwrap();
        assert_eq!(p.default, EgressDefault::Allow);
        assert_eq!(p.deny.len(), 1);
        for bad in [
            serde_json::json!({"denyOut": ["10.0.0.0/8"]}),
            serde_json::json!({"allowOut": ["bad host!"]}),
            serde_json::json!({"dnsServers": ["1.1.1.1"]}),
            serde_json::json!({"egressProxy": {"address": "x:1"}}),
            serde_json::json!({"rules": {"api.example.com": {}}}),
            serde_json::json!({"rules": {"api.example.com": [{"transform": {"body": 1}}]}}),
            serde_json::json!({"rules": {"bad host!": []}}),
            serde_json::json!({"rules": {"a.example": [{"transform": {"headers": {"X": 1}}}]}}),
            serde_json::json!({"rules": {"a.example": [{"transform": {"headers":
                {"X": "${secret:RAW}"}}}]}}),
            serde_json::json!({"rules": {"a.example": [{"transform": {"headers":
                {"Host": "x"}}}]}}),
        ] {
            let e = net(bad.clone()).policy(None).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn rules_become_header_rules_in_order() {
        let p = net(serde_json::json!({"rules": {
            "api.example.com": [
                {},
                {"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets.key}"}}},
                {"transform": {"headers": {"X-Two": "2"}}},
            ],
            "10.0.0.1/32": [{"transform": {"headers": {"X-Ip": "yes"}}}],
        }}))
        .policy(None)
        .unwrap()
        .unwrap();
        assert_eq!(p.default, EgressDefault::Allow);
        let rules: Vec<(String, &str, &str)> = p
            .headers
            .iter()
            .map(|h| (h.host.to_string(), h.name.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            rules,
            vec![
                ("10.0.0.1".to_owned(), "X-Ip", "yes"),
                (
                    "api.example.com".to_owned(),
                    "Authorization",
                    "Bearer ${e2b.secrets.key}"
                ),
                ("api.example.com".to_owned(), "X-Two", "2"),
            ]
        );
        // An empty rules object changes nothing.
        assert_eq!(
            net(serde_json::json!({"rules": {}})).policy(None).unwrap(),
            None
        );
    }
}
