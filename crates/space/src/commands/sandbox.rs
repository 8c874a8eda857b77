//! Sandbox lifecycle commands: create, ls, info, pause/resume/suspend/restore/kill, fork,
//! snapshots, rollback, timeouts, logs.

use std::io::Write as _;

use anyhow::{bail, Result};
use reqwest::Method;
use serde_json::{json, Map, Value};

use super::{pairs, secs_or_never};
use crate::cli::{
    CreateArgs, LogsArgs, LsArgs, RollbackArgs, SnapshotArgs, TimeoutActionArg, TimeoutArgs,
};
use crate::client::{seg, Client};
use crate::output::{self, field};

fn path(id: &str, rest: &str) -> Result<String> {
    Ok(format!("/v1/sandboxes/{}{rest}", seg(id)?))
}

/// Prints a sandbox: the object as JSON, or `id` alone (for `create` and `fork`, so that
/// `ID=$(space create ...)` works), or a line saying what happened.
fn show(sb: &Value, json: bool, done: Option<&str>) {
    if json {
        output::json(sb);
    } else if let Some(done) = done {
        println!("{} {done} (state {})", field(sb, "id"), field(sb, "state"));
    } else {
        println!("{}", field(sb, "id"));
    }
}

/// `space create`.
pub async fn create(c: &Client, a: CreateArgs, json: bool) -> Result<()> {
    let mut body = Map::new();
    body.insert("template".into(), a.template.into());
    if let Some(v) = a.version {
        body.insert("version".into(), v.into());
    }
    if let Some(n) = a.cpus {
        body.insert("vcpus".into(), n.into());
    }
    if let Some(m) = a.memory {
        body.insert("memory_mib".into(), m.into());
    }
    if let Some(d) = a.disk {
        body.insert("disk_mib".into(), d.into());
    }
    if !a.env.is_empty() {
        body.insert("env".into(), json!(pairs(&a.env, "--env")?));
    }
    if !a.meta.is_empty() {
        body.insert("metadata".into(), json!(pairs(&a.meta, "--meta")?));
    }
    let mut timeouts = Map::new();
    if let Some(s) = &a.idle_timeout {
        timeouts.insert("idle_ms".into(), secs_or_never(s, "--idle-timeout")?);
    }
    if let Some(s) = &a.max_lifetime {
        timeouts.insert(
            "max_lifetime_ms".into(),
            secs_or_never(s, "--max-lifetime")?,
        );
    }
    if !timeouts.is_empty() {
        body.insert("timeouts".into(), timeouts.into());
    }
    if !a.secrets.is_empty() {
        body.insert("secrets".into(), json!(a.secrets));
    }
    if !a.volumes.is_empty() {
        let mounts = a
            .volumes
            .iter()
            .map(|v| super::volumes::mount_arg(v))
            .collect::<Result<Vec<_>>>()?;
        body.insert("volumes".into(), json!(mounts));
    }
    if !a.allow.is_empty() || !a.deny.is_empty() || a.default_deny {
        body.insert(
            "egress".into(),
            json!({
                "default": if a.default_deny { "deny" } else { "allow" },
                "allow": a.allow,
                "deny": a.deny,
            }),
        );
    }
    let sb: Value = c.post("/v1/sandboxes", &body.into()).await?;
    show(&sb, json, None);
    Ok(())
}

/// `space ls`.
pub async fn ls(c: &Client, a: LsArgs, json: bool) -> Result<()> {
    if a.all && a.state.is_some() {
        bail!("--all and --state do not combine (--state terminated lists terminated ones)");
    }
    let mut query: Vec<(String, String)> = Vec::new();
    if let Some(t) = a.template {
        query.push(("template".into(), t));
    }
    for (k, v) in pairs(&a.meta, "--meta")? {
        query.push((format!("metadata.{k}"), v));
    }
    let mut list = list(c, &query, a.state.as_deref()).await?;
    if a.all {
        list.extend(list_terminated(c, &query).await?);
        list.sort_by_key(|s| std::cmp::Reverse(s.get("created_unix_ms").and_then(Value::as_u64)));
    }
    if json {
        output::json(&Value::Array(list));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                field(s, "id"),
                field(s, "state"),
                format!("{}:{}", field(s, "template"), field(s, "template_version")),
                field(s, "vcpus"),
                format!("{}M", field(s, "memory_mib")),
                output::age(s, "created_unix_ms"),
                output::pairs(s.get("metadata")),
            ]
        })
        .collect();
    output::print_table(
        &[
            "ID", "STATE", "TEMPLATE", "VCPUS", "MEMORY", "CREATED", "METADATA",
        ],
        &rows,
    );
    Ok(())
}

async fn list(c: &Client, query: &[(String, String)], state: Option<&str>) -> Result<Vec<Value>> {
    let mut query = query.to_vec();
    if let Some(s) = state {
        query.push(("state".into(), s.to_owned()));
    }
    let v: Value = c.get("/v1/sandboxes", &query).await?;
    match v.get("sandboxes") {
        Some(Value::Array(a)) => Ok(a.clone()),
        _ => bail!("the server's sandbox list has no `sandboxes` array"),
    }
}

async fn list_terminated(c: &Client, query: &[(String, String)]) -> Result<Vec<Value>> {
    list(c, query, Some("terminated")).await
}

/// `space info`.
pub async fn info(c: &Client, id: &str, json: bool) -> Result<()> {
    let sb: Value = c.get(&path(id, "")?, &[]).await?;
    if json {
        output::json(&sb);
        return Ok(());
    }
    let t = sb.get("timeouts").cloned().unwrap_or(Value::Null);
    let forked = match sb.get("forked_from") {
        Some(f) if f.is_object() => format!(
            "{} (snapshot {})",
            field(f, "sandbox"),
            field(f, "snapshot")
        ),
        _ => "-".into(),
    };
    let mut rows = vec![
        ("id", field(&sb, "id")),
        ("tenant", field(&sb, "tenant")),
        ("state", field(&sb, "state")),
        (
            "template",
            format!(
                "{}:{}",
                field(&sb, "template"),
                field(&sb, "template_version")
            ),
        ),
        ("vcpus", field(&sb, "vcpus")),
        ("memory", format!("{} MiB", field(&sb, "memory_mib"))),
        ("disk", format!("{} MiB", field(&sb, "disk_mib"))),
        (
            "restore point",
            match sb.get("restore_point") {
                Some(p) if p.is_object() => {
                    format!("{} ({})", field(p, "snapshot"), field(p, "location"))
                }
                _ => "-".into(),
            },
        ),
        ("env", output::pairs(sb.get("env"))),
        ("metadata", output::pairs(sb.get("metadata"))),
        ("idle timeout", output::millis(t.get("idle_ms"))),
        ("max lifetime", output::millis(t.get("max_lifetime_ms"))),
        ("timeout action", field(&t, "action")),
        ("egress", egress_summary(sb.get("egress"))),
        (
            "secrets",
            sb.get("secrets")
                .and_then(Value::as_array)
                .filter(|a| !a.is_empty())
                .map(|a| {
                    a.iter()
                        .map(|b| field(b, "name"))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .unwrap_or_else(|| "-".into()),
        ),
        ("forked from", forked),
        ("failure", field(&sb, "failure")),
        ("created", output::age(&sb, "created_unix_ms")),
        ("state since", output::age(&sb, "state_since_unix_ms")),
        ("last activity", output::age(&sb, "last_activity_unix_ms")),
    ];
    // The node that holds it: admins of a cluster see it (`space node drain` takes it).
    if sb.get("node").is_some_and(Value::is_string) {
        rows.insert(3, ("node", field(&sb, "node")));
    }
    for (k, v) in rows {
        println!("{:<15} {v}", format!("{k}:"));
    }
    Ok(())
}

/// One line for a policy: `default allow; allow a,b; deny c`.
fn egress_summary(p: Option<&Value>) -> String {
    let Some(p) = p.filter(|p| p.is_object()) else {
        return "-".into();
    };
    let list = |k: &str| -> String {
        p.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().map(output::text).collect::<Vec<_>>().join(","))
            .unwrap_or_default()
    };
    let mut out = format!("default {}", field(p, "default"));
    for k in ["allow", "deny"] {
        let l = list(k);
        if !l.is_empty() {
            out.push_str(&format!("; {k} {l}"));
        }
    }
    out
}

/// `space pause|resume|suspend|restore`.
pub async fn transition(c: &Client, id: &str, op: &str, done: &str, json: bool) -> Result<()> {
    let sb: Value = c.post(&path(id, &format!("/{op}"))?, &json!({})).await?;
    show(&sb, json, Some(done));
    Ok(())
}

/// `space kill`.
pub async fn kill(c: &Client, id: &str, json: bool) -> Result<()> {
    let resp = c.send(c.request(Method::DELETE, &path(id, "")?)).await?;
    let sb: Value = resp.json().await.unwrap_or(Value::Null);
    if sb.is_object() {
        show(&sb, json, Some("killed"));
    } else if json {
        output::json(&json!({"id": id, "state": "terminated"}));
    } else {
        println!("{id} killed");
    }
    Ok(())
}

/// `space fork`.
pub async fn fork(c: &Client, id: &str, json: bool) -> Result<()> {
    let sb: Value = c.post(&path(id, "/fork")?, &json!({})).await?;
    show(&sb, json, None);
    Ok(())
}

/// `space snapshot`.
pub async fn snapshot(c: &Client, a: SnapshotArgs, json: bool) -> Result<()> {
    let kind = if a.full { "full" } else { "disk" };
    let snap: Value = c
        .post(&path(&a.id, "/snapshots")?, &json!({ "kind": kind }))
        .await?;
    if json {
        output::json(&snap);
    } else {
        println!("{}", field(&snap, "id"));
    }
    Ok(())
}

/// Where a listed snapshot lives: on the node, in the object store, or both.
fn location(s: &Value) -> &'static str {
    let local = s.get("local").and_then(Value::as_bool).unwrap_or(true);
    let remote = s.get("remote").is_some_and(|r| r.is_object());
    match (local, remote) {
        (true, false) => "local",
        (true, true) => "local+remote",
        (false, true) => "remote",
        (false, false) => "lost",
    }
}

/// `space snapshots`.
pub async fn snapshots(c: &Client, id: &str, json: bool) -> Result<()> {
    let v: Value = c.get(&path(id, "/snapshots")?, &[]).await?;
    let Some(Value::Array(list)) = v.get("snapshots") else {
        bail!("the server's snapshot list has no `snapshots` array");
    };
    if json {
        output::json(&Value::Array(list.clone()));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|s| {
            vec![
                field(s, "id"),
                field(s, "kind"),
                field(s, "reason"),
                output::age(s, "created_unix_ms"),
                field(s, "size_bytes"),
                location(s).into(),
            ]
        })
        .collect();
    output::print_table(
        &["ID", "KIND", "REASON", "CREATED", "BYTES", "WHERE"],
        &rows,
    );
    Ok(())
}

/// `space rollback`.
pub async fn rollback(c: &Client, a: RollbackArgs, json: bool) -> Result<()> {
    let sb: Value = c
        .post(
            &path(&a.id, "/rollback")?,
            &json!({ "snapshot": a.snapshot }),
        )
        .await?;
    show(&sb, json, Some(&format!("rolled back to {}", a.snapshot)));
    Ok(())
}

/// `space timeout`.
pub async fn timeout(c: &Client, a: TimeoutArgs, json: bool) -> Result<()> {
    let mut body = Map::new();
    if let Some(s) = &a.idle {
        body.insert("idle_ms".into(), secs_or_never(s, "--idle")?);
    }
    if let Some(s) = &a.max_lifetime {
        body.insert(
            "max_lifetime_ms".into(),
            secs_or_never(s, "--max-lifetime")?,
        );
    }
    if let Some(action) = a.action {
        let name = match action {
            TimeoutActionArg::Suspend => "suspend",
            TimeoutActionArg::Kill => "kill",
        };
        body.insert("action".into(), name.into());
    }
    if body.is_empty() {
        bail!("nothing to change: give --idle, --max-lifetime or --action");
    }
    let sb: Value = c
        .call(Method::PUT, &path(&a.id, "/timeouts")?, &body.into())
        .await?;
    if json {
        output::json(&sb);
    } else {
        let t = sb.get("timeouts").cloned().unwrap_or(Value::Null);
        println!(
            "{}: idle {}, max lifetime {}, action {}",
            field(&sb, "id"),
            output::millis(t.get("idle_ms")),
            output::millis(t.get("max_lifetime_ms")),
            field(&t, "action")
        );
    }
    Ok(())
}

/// `space logs`: the console bytes as they are.
pub async fn logs(c: &Client, a: LogsArgs) -> Result<()> {
    let mut query = Vec::new();
    if let Some(n) = a.tail {
        query.push(("tail_bytes".to_owned(), n.to_string()));
    }
    let resp = c
        .send(c.request(Method::GET, &path(&a.id, "/logs")?).query(&query))
        .await?;
    let mut resp = resp;
    let mut out = std::io::stdout().lock();
    while let Some(chunk) = resp.chunk().await.map_err(|e| c.transport_error(e))? {
        out.write_all(&chunk)?;
    }
    out.flush()?;
    Ok(())
}
