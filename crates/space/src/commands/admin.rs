//! Tenants, keys and the audit log.

use anyhow::{bail, Result};
use serde_json::{json, Map, Value};

use crate::cli::{AuditArgs, KeyCmd, NodeCmd, TenantCmd};
use crate::client::{seg, Client};
use crate::output::{self, field};

fn array(v: &Value, key: &str) -> Result<Vec<Value>> {
    match v.get(key) {
        Some(Value::Array(a)) => Ok(a.clone()),
        _ => bail!("the server's answer has no `{key}` array"),
    }
}

/// `space audit`.
pub async fn audit(c: &Client, a: AuditArgs, json: bool) -> Result<()> {
    let mut query = Vec::new();
    if let Some(s) = a.sandbox {
        query.push(("sandbox".to_owned(), s));
    }
    if let Some(o) = a.operation {
        query.push(("operation".to_owned(), o));
    }
    if let Some(n) = a.limit {
        query.push(("limit".to_owned(), n.to_string()));
    }
    let list = array(&c.get("/v1/audit", &query).await?, "events")?;
    if json {
        output::json(&Value::Array(list));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|e| {
            vec![
                field(e, "id"),
                output::age(e, "at_unix_ms"),
                field(e, "tenant"),
                field(e, "key_id"),
                field(e, "operation"),
                field(e, "sandbox"),
                field(e, "result"),
                field(e, "detail"),
            ]
        })
        .collect();
    output::print_table(
        &[
            "ID",
            "AT",
            "TENANT",
            "KEY",
            "OPERATION",
            "SANDBOX",
            "RESULT",
            "DETAIL",
        ],
        &rows,
    );
    Ok(())
}

/// Prints a freshly made key: the secret alone on stdout (so that `KEY=$(space key create
/// acme)` works), the warning that it is shown once on stderr.
fn show_new_key(k: &Value) {
    println!("{}", field(k, "key"));
    eprintln!(
        "key {} of tenant {}: keep it now, it is not shown again",
        field(k, "id"),
        field(k, "tenant")
    );
}

/// `space tenant ...`.
pub async fn tenant(c: &Client, cmd: TenantCmd, json: bool) -> Result<()> {
    match cmd {
        TenantCmd::Ls => {
            let list = array(&c.get("/v1/tenants", &[]).await?, "tenants")?;
            if json {
                output::json(&Value::Array(list));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|t| {
                    let q = t.get("quotas").cloned().unwrap_or(Value::Null);
                    vec![
                        field(t, "name"),
                        field(&q, "max_sandboxes"),
                        field(&q, "max_vcpus"),
                        format!("{}M", field(&q, "max_memory_mib")),
                        output::age(t, "created_unix_ms"),
                    ]
                })
                .collect();
            output::print_table(
                &[
                    "NAME",
                    "MAX SANDBOXES",
                    "MAX VCPUS",
                    "MAX MEMORY",
                    "CREATED",
                ],
                &rows,
            );
        }
        TenantCmd::Create(a) => {
            let mut body = Map::new();
            body.insert("name".into(), a.name.into());
            let mut quotas = Map::new();
            if let Some(n) = a.max_sandboxes {
                quotas.insert("max_sandboxes".into(), n.into());
            }
            if let Some(n) = a.max_cpus {
                quotas.insert("max_vcpus".into(), n.into());
            }
            if let Some(n) = a.max_memory {
                quotas.insert("max_memory_mib".into(), n.into());
            }
            if let Some(n) = a.max_volumes {
                quotas.insert("max_volume_mib".into(), n.into());
            }
            if !quotas.is_empty() {
                body.insert("quotas".into(), quotas.into());
            }
            let created: Value = c.post("/v1/tenants", &body.into()).await?;
            if json {
                output::json(&created);
            } else {
                let key = created.get("key").cloned().unwrap_or(Value::Null);
                show_new_key(&key);
            }
        }
        TenantCmd::MasterKey(a) => {
            let path = format!("/v1/tenants/{}/master-key", seg(&a.name)?);
            let body = match (&a.kms_key_id, a.deployment) {
                (Some(k), _) => Some(serde_json::json!({
                    "provider": "kms",
                    "key_id": k,
                    "region": a.kms_region,
                    "endpoint": a.kms_endpoint,
                })),
                (None, true) => Some(serde_json::json!({"provider": "deployment"})),
                (None, false) => None,
            };
            let v: Value = match body {
                Some(b) => c.call(reqwest::Method::PUT, &path, &b).await?,
                None => c.get(&path, &[]).await?,
            };
            if json {
                output::json(&v);
            } else {
                let rows = [
                    ("provider", field(&v, "provider")),
                    ("id", field(&v, "id")),
                    ("region", field(&v, "region")),
                    ("endpoint", field(&v, "endpoint")),
                ];
                for (k, val) in rows {
                    println!("{k:<10} {val}");
                }
            }
        }
    }
    Ok(())
}

/// `space key ...`.
pub async fn key(c: &Client, cmd: KeyCmd, json: bool) -> Result<()> {
    match cmd {
        KeyCmd::Ls { tenant } => {
            let v: Value = c
                .get(&format!("/v1/tenants/{}/keys", seg(&tenant)?), &[])
                .await?;
            let list = array(&v, "keys")?;
            if json {
                output::json(&Value::Array(list));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|k| {
                    let revoked = match k.get("revoked_unix_ms") {
                        Some(Value::Null) | None => "-".to_owned(),
                        Some(_) => output::age(k, "revoked_unix_ms"),
                    };
                    vec![
                        field(k, "id"),
                        field(k, "admin"),
                        field(k, "label"),
                        output::age(k, "created_unix_ms"),
                        revoked,
                    ]
                })
                .collect();
            output::print_table(&["ID", "ADMIN", "LABEL", "CREATED", "REVOKED"], &rows);
        }
        KeyCmd::Create {
            tenant,
            admin,
            label,
        } => {
            let mut body = Map::new();
            body.insert("admin".into(), admin.into());
            if let Some(l) = label {
                body.insert("label".into(), l.into());
            }
            let k: Value = c
                .post(&format!("/v1/tenants/{}/keys", seg(&tenant)?), &body.into())
                .await?;
            if json {
                output::json(&k);
            } else {
                show_new_key(&k);
            }
        }
        KeyCmd::Revoke { key_id } => {
            c.delete(&format!("/v1/keys/{}", seg(&key_id)?)).await?;
            if json {
                output::json(&json!({"id": key_id, "revoked": true}));
            } else {
                println!("key {key_id} revoked");
            }
        }
    }
    Ok(())
}

/// `space node ls|token|drain|remove`.
pub async fn node(c: &Client, cmd: NodeCmd, json: bool) -> Result<()> {
    let show = |v: &Value| {
        if json {
            output::json(v);
        } else {
            println!("{} {}", field(v, "id"), field(v, "state"));
        }
    };
    match cmd {
        NodeCmd::Ls => {
            let v: Value = c.get("/v1/nodes", &[]).await?;
            let list = array(&v, "nodes")?;
            if json {
                output::json(&Value::Array(list));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|n| {
                    vec![
                        field(n, "id"),
                        field(n, "state"),
                        if n["live"] == true { "yes" } else { "no" }.into(),
                        field(n, "incarnation"),
                        field(n, "address"),
                        field(n, "sandboxes"),
                        format!("{}M", field(n, "memory_free_mib")),
                        field(n, "accelerator"),
                    ]
                })
                .collect();
            output::print_table(
                &[
                    "ID",
                    "STATE",
                    "LIVE",
                    "INCARNATION",
                    "ADDRESS",
                    "SANDBOXES",
                    "FREE",
                    "ACCEL",
                ],
                &rows,
            );
        }
        NodeCmd::Token { ttl } => {
            let body = match ttl {
                Some(t) => json!({ "ttl_s": t }),
                None => json!({}),
            };
            let v: Value = c.post("/v1/cluster/join-tokens", &body).await?;
            if json {
                output::json(&v);
            } else {
                println!("{}", field(&v, "token"));
                eprintln!("(works once; pass it to `space node --control URL --join-token TOKEN`)");
            }
        }
        NodeCmd::Drain { id } => {
            let v: Value = c
                .post(&format!("/v1/nodes/{}/drain", seg(&id)?), &json!({}))
                .await?;
            show(&v);
        }
        NodeCmd::Remove { id } => {
            let v: Value = c
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/nodes/{}", seg(&id)?),
                    &json!({}),
                )
                .await?;
            show(&v);
        }
    }
    Ok(())
}
