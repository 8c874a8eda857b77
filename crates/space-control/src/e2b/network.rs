//! E2B's network options onto space's egress policy (`docs/e2b.md`, `docs/egress.md`): at
//! create (`network`, `allow_internet_access`) and on a running sandbox
//! (`PUT /sandboxes/{id}/network`, which replaces the policy whole).
//!
//! - `denyOut` holding all traffic (`0.0.0.0/0`, `::/0`), or `allow_internet_access: false`,
//!   makes the default deny; other `denyOut` entries are deny rules.
//! - `allowOut` entries are allow rules, and win over `denyOut` as in E2B (an entry in both
//!   is allowed).
//! - Entries are host names (`example.com`, `*.example.com`) or IP addresses; a CIDR range
//!   other than a single address or all traffic is refused, as are `dnsServers`,
//!   `egressProxy` and `rules` (space's gateway resolves names itself, has no upstream proxy,
//!   and injects credentials by placeholder: `docs/egress.md`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::Value;
use space_node_api::policy::{EgressDefault, EgressPolicy, EgressRule};

use super::rest::{self, E2bCaller, E2bError, E2bJson, E2bResult};
use crate::api::Shared;
use crate::error::node_error;

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
        if self
            .rules
            .as_ref()
            .is_some_and(|r| r.as_object().is_none_or(|o| !o.is_empty()))
        {
            return refuse(
                "rules",
                "credentials are injected by placeholder through /v1/secrets",
            );
        }
        let internet = self.allow_internet_access.or(allow_internet_access);
        if self.allow_out.is_none() && self.deny_out.is_none() && internet.is_none() {
            return Ok(None);
        }
        let allow = self.allow_out.clone().unwrap_or_default();
        let deny = self.deny_out.clone().unwrap_or_default();
        let mut policy = EgressPolicy::default();
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
        let policy = body.policy(None)?.unwrap_or_default();
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
            serde_json::json!({"rules": {"api.example.com": [{}]}}),
        ] {
            let e = net(bad.clone()).policy(None).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
