//! `space volume create|ls|rm|cp|files` and the `--volume` of `space create`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::{json, Value};

use crate::cli::VolumeCmd;
use crate::client::{seg, Client};
use crate::output::{self, field};

/// `NAME:/PATH[:ro]` as one of a create's `volumes`.
pub fn mount_arg(arg: &str) -> Result<Value> {
    let (name, rest) = arg
        .split_once(':')
        .with_context(|| format!("--volume {arg:?}: expected NAME:/PATH or NAME:/PATH:ro"))?;
    let (path, read_only) = match rest.rsplit_once(':') {
        Some((p, "ro")) => (p, true),
        Some((p, "rw")) => (p, false),
        _ => (rest, false),
    };
    if name.is_empty() || !path.starts_with('/') {
        bail!("--volume {arg:?}: expected NAME:/PATH or NAME:/PATH:ro");
    }
    Ok(json!({"name": name, "path": path, "read_only": read_only}))
}

fn path(name: &str, rest: &str) -> Result<String> {
    Ok(format!("/v1/volumes/{}{rest}", seg(name)?))
}

/// `NAME:/path` (or `NAME`, the root).
fn remote(arg: &str) -> Option<(&str, &str)> {
    match arg.split_once(':') {
        Some((name, p)) if !name.is_empty() && !name.contains('/') => Some((name, p)),
        _ => None,
    }
}

fn size(bytes: Option<u64>) -> String {
    match bytes {
        Some(b) if b >= 1 << 30 => format!("{:.1}G", b as f64 / (1u64 << 30) as f64),
        Some(b) => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        None => "-".into(),
    }
}

/// `space volume ...`.
pub async fn volume(c: &Client, cmd: VolumeCmd, json: bool) -> Result<()> {
    match cmd {
        VolumeCmd::Create { name, size: mib } => {
            let mut body = json!({ "name": name });
            if let Some(m) = mib {
                body["size_mib"] = json!(m);
            }
            let v: Value = c.post("/v1/volumes", &body).await?;
            if json {
                output::json(&v);
            } else {
                println!("{}", field(&v, "name"));
            }
        }
        VolumeCmd::Ls => {
            let v: Value = c.get("/v1/volumes", &[]).await?;
            let list = v
                .get("volumes")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if json {
                output::json(&Value::Array(list));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|v| {
                    vec![
                        field(v, "name"),
                        field(v, "id"),
                        size(v.get("used_bytes").and_then(Value::as_u64)),
                        size(v.get("size_bytes").and_then(Value::as_u64)),
                        output::age(v, "created_unix_ms"),
                    ]
                })
                .collect();
            output::print_table(&["NAME", "ID", "USED", "SIZE", "CREATED"], &rows);
        }
        VolumeCmd::Rm { name } => {
            c.delete(&path(&name, "")?).await?;
            if !json {
                println!("deleted {}", output::sanitize(&name));
            }
        }
        VolumeCmd::Files { target } => {
            let (name, dir) = remote(&target).unwrap_or((target.as_str(), "/"));
            let query = [(
                "path".to_owned(),
                if dir.is_empty() {
                    "/".into()
                } else {
                    dir.to_owned()
                },
            )];
            let v: Value = c.get(&path(name, "/files/list")?, &query).await?;
            let entries = v
                .get("entries")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if json {
                output::json(&Value::Array(entries));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| {
                    let stat = e.get("stat").cloned().unwrap_or(Value::Null);
                    vec![
                        field(&stat, "file_type"),
                        field(&stat, "size"),
                        field(e, "name"),
                    ]
                })
                .collect();
            output::print_table(&["TYPE", "SIZE", "NAME"], &rows);
        }
        VolumeCmd::Cp { src, dst } => match (remote(&src), remote(&dst)) {
            (None, Some((name, to))) => {
                let src = Path::new(&src);
                let data = tokio::fs::read(src)
                    .await
                    .with_context(|| format!("reading {}", src.display()))?;
                let mut to = to.to_owned();
                if to.ends_with('/') || to.is_empty() {
                    let file = src
                        .file_name()
                        .and_then(|n| n.to_str())
                        .context("the source has no file name to copy into a directory")?;
                    to = format!("{}/{file}", to.trim_end_matches('/'));
                }
                let req = c
                    .request(Method::PUT, &path(name, "/files")?)
                    .query(&[("path", to.as_str())])
                    .header("content-type", "application/octet-stream")
                    .body(data);
                c.send(req).await?;
            }
            (Some((name, from)), None) => {
                let req = c
                    .request(Method::GET, &path(name, "/files")?)
                    .query(&[("path", from)]);
                let bytes = c.send(req).await?.bytes().await?;
                tokio::fs::write(&dst, &bytes)
                    .await
                    .with_context(|| format!("writing {dst}"))?;
            }
            _ => bail!(
                "one side of `space volume cp` is a volume (NAME:/path), the other a local file"
            ),
        },
    }
    Ok(())
}
