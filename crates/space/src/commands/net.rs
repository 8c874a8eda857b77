//! The credentials vault (`space secret`), egress policies (`space net`) and ingress
//! (`space expose`, `space unexpose`).

use std::io::Read as _;

use anyhow::{bail, Context as _, Result};
use reqwest::Method;
use serde_json::{json, Value};

use crate::cli::{BrowserArgs, DefaultArg, ExposeArgs, NetArgs, NetCmd, SecretCmd, SecretSetArgs};
use crate::client::{seg, Client};
use crate::output::{self, field};

/// The most bytes a secret value read from stdin may have (the server's limit is 64 KiB).
const MAX_STDIN_VALUE: u64 = 64 * 1024 + 2;

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().map(output::text).collect())
        .unwrap_or_default()
}

/// Drops one trailing newline (`\n` or `\r\n`), as `echo` and editors add one.
fn chomp(mut v: Vec<u8>) -> Vec<u8> {
    if v.last() == Some(&b'\n') {
        v.pop();
        if v.last() == Some(&b'\r') {
            v.pop();
        }
    }
    v
}

/// `space secret ...`.
pub async fn secret(c: &Client, cmd: SecretCmd, json: bool) -> Result<()> {
    match cmd {
        SecretCmd::Set(a) => set(c, a, json).await,
        SecretCmd::Ls => {
            let v: Value = c.get("/v1/secrets", &[]).await?;
            let Some(Value::Array(list)) = v.get("secrets") else {
                bail!("the server's answer has no `secrets` array");
            };
            if json {
                output::json(&Value::Array(list.clone()));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|s| {
                    vec![
                        field(s, "name"),
                        field(s, "kind"),
                        strings(s, "hosts").join(","),
                        output::age(s, "updated_unix_ms"),
                    ]
                })
                .collect();
            output::print_table(&["NAME", "KIND", "HOSTS", "UPDATED"], &rows);
            Ok(())
        }
        SecretCmd::Rm { name } => {
            c.delete(&format!("/v1/secrets/{}", seg(&name)?)).await?;
            if json {
                output::json(&json!({"name": name, "deleted": true}));
            } else {
                println!("secret {name} deleted");
            }
            Ok(())
        }
    }
}

async fn set(c: &Client, a: SecretSetArgs, json: bool) -> Result<()> {
    let value = match a.value {
        Some(v) => v,
        None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .lock()
                .take(MAX_STDIN_VALUE + 1)
                .read_to_end(&mut buf)
                .context("reading the secret value from stdin")?;
            if buf.len() as u64 > MAX_STDIN_VALUE {
                bail!("the value on stdin is over 64 KiB");
            }
            String::from_utf8(chomp(buf))
                .map_err(|_| anyhow::anyhow!("the value on stdin is not UTF-8 text"))?
        }
    };
    if value.is_empty() {
        bail!("the secret value is empty (give --value or pipe it on stdin)");
    }
    let resp = c
        .send(
            c.request(Method::PUT, &format!("/v1/secrets/{}", seg(&a.name)?))
                .json(&json!({
                    "value": value,
                    "hosts": a.hosts,
                    "kind": if a.totp { "totp" } else { "value" },
                })),
        )
        .await?;
    let created = resp.status() == reqwest::StatusCode::CREATED;
    let info: Value = resp.json().await.map_err(|e| c.transport_error(e))?;
    if json {
        output::json(&info);
    } else {
        println!(
            "secret {}{} {} (hosts {})",
            field(&info, "name"),
            if a.totp { " (one-time codes)" } else { "" },
            if created { "created" } else { "replaced" },
            strings(&info, "hosts").join(",")
        );
    }
    Ok(())
}

fn egress_path(id: &str) -> Result<String> {
    Ok(format!("/v1/sandboxes/{}/egress", seg(id)?))
}

fn print_policy(p: &Value) {
    println!("default: {}", field(p, "default"));
    for (kind, key) in [("allow", "allow"), ("deny", "deny")] {
        for r in strings(p, key) {
            println!("{kind:<6} {r}");
        }
    }
    for h in p
        .get("headers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        println!(
            "header {} {}: {}",
            field(h, "host"),
            field(h, "name"),
            field(h, "value")
        );
    }
}

/// `space net ID ...`: reads the policy, changes it, writes it back.
pub async fn net(c: &Client, a: NetArgs, json: bool) -> Result<()> {
    let path = egress_path(&a.id)?;
    let mut policy: Value = c.get(&path, &[]).await?;
    let mut allow = strings(&policy, "allow");
    let mut deny = strings(&policy, "deny");
    let mut headers: Vec<Value> = policy
        .get("headers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let same = |x: &String, p: &str| x.eq_ignore_ascii_case(p);
    let rule_is = |h: &Value, host: &str, name: &str| {
        h["host"]
            .as_str()
            .is_some_and(|x| x.eq_ignore_ascii_case(host))
            && h["name"]
                .as_str()
                .is_some_and(|x| x.eq_ignore_ascii_case(name))
    };
    match a.action {
        NetCmd::Ls => {
            if json {
                output::json(&policy);
            } else {
                print_policy(&policy);
            }
            return Ok(());
        }
        NetCmd::Allow { pattern } => {
            deny.retain(|x| !same(x, &pattern));
            if !allow.iter().any(|x| same(x, &pattern)) {
                allow.push(pattern);
            }
        }
        NetCmd::Deny { pattern } => {
            allow.retain(|x| !same(x, &pattern));
            if !deny.iter().any(|x| same(x, &pattern)) {
                deny.push(pattern);
            }
        }
        NetCmd::Rm { pattern } => {
            let before = allow.len() + deny.len();
            allow.retain(|x| !same(x, &pattern));
            deny.retain(|x| !same(x, &pattern));
            if allow.len() + deny.len() == before {
                bail!("the policy of {} has no rule {pattern:?}", a.id);
            }
        }
        NetCmd::Default { action } => {
            policy["default"] = match action {
                DefaultArg::Allow => "allow",
                DefaultArg::Deny => "deny",
            }
            .into();
        }
        NetCmd::Header { host, name, value } => {
            let rule = json!({"host": host, "name": name, "value": value});
            match headers.iter_mut().find(|h| rule_is(h, &host, &name)) {
                Some(h) => *h = rule,
                None => headers.push(rule),
            }
        }
        NetCmd::Unheader { host, name } => {
            let before = headers.len();
            headers.retain(|h| !rule_is(h, &host, &name));
            if headers.len() == before {
                bail!(
                    "the policy of {} has no header rule {name} for {host}",
                    a.id
                );
            }
        }
    }
    let body = json!({"default": policy["default"], "allow": allow, "deny": deny,
        "headers": headers});
    let updated: Value = c.call(Method::PUT, &path, &body).await?;
    if json {
        output::json(&updated);
    } else {
        print_policy(&updated);
    }
    Ok(())
}

/// `space expose ID PORT` (prints the URL) or `space expose ID --ls`.
/// `space browser ID`: the DevTools URL on the first line, the live view (if any) on the
/// second.
pub async fn browser(c: &Client, a: BrowserArgs, json: bool) -> Result<()> {
    if let (Some(secret), Some(selector)) = (&a.fill, &a.selector) {
        let v: Value = c
            .post(
                &format!("/v1/sandboxes/{}/browser/fill", seg(&a.id)?),
                &json!({
                    "secret": secret,
                    "selector": selector,
                    "mode": if a.value { "value" } else { "placeholder" },
                }),
            )
            .await?;
        if json {
            output::json(&v);
        } else {
            println!(
                "filled {} with the {} of {} on {}",
                field(&v, "field"),
                field(&v, "mode"),
                field(&v, "secret"),
                field(&v, "origin")
            );
        }
        return Ok(());
    }
    let v: Value = c
        .post(
            &format!("/v1/sandboxes/{}/browser", seg(&a.id)?),
            &json!({}),
        )
        .await?;
    if json {
        output::json(&v);
        return Ok(());
    }
    println!("cdp:  {}", field(&v, "cdp_url"));
    match v.get("live_url").and_then(Value::as_str) {
        Some(live) => println!("live: {live}"),
        None => println!("live: none (the browser is headless: no display runs in the sandbox)"),
    }
    Ok(())
}

pub async fn expose(c: &Client, a: ExposeArgs, json: bool) -> Result<()> {
    let path = format!("/v1/sandboxes/{}/ports", seg(&a.id)?);
    let Some(port) = a.port.filter(|_| !a.ls) else {
        let v: Value = c.get(&path, &[]).await?;
        let Some(Value::Array(list)) = v.get("ports") else {
            bail!("the server's answer has no `ports` array");
        };
        if json {
            output::json(&Value::Array(list.clone()));
            return Ok(());
        }
        let rows: Vec<Vec<String>> = list
            .iter()
            .map(|p| vec![field(p, "port"), output::age(p, "created_unix_ms")])
            .collect();
        output::print_table(&["PORT", "EXPOSED"], &rows);
        return Ok(());
    };
    let v: Value = c.post(&path, &json!({ "port": port })).await?;
    if json {
        output::json(&v);
    } else {
        println!("{}", field(&v, "url"));
    }
    Ok(())
}

/// `space unexpose ID PORT`.
pub async fn unexpose(c: &Client, id: &str, port: u16, json: bool) -> Result<()> {
    c.delete(&format!("/v1/sandboxes/{}/ports/{port}", seg(id)?))
        .await?;
    if json {
        output::json(&json!({"id": id, "port": port, "exposed": false}));
    } else {
        println!("{id} port {port} no longer exposed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_trailing_newline_is_dropped() {
        assert_eq!(chomp(b"abc\n".to_vec()), b"abc");
        assert_eq!(chomp(b"abc\r\n".to_vec()), b"abc");
        assert_eq!(chomp(b"abc\n\n".to_vec()), b"abc\n");
        assert_eq!(chomp(b"abc".to_vec()), b"abc");
        assert_eq!(chomp(Vec::new()), b"");
    }
}
