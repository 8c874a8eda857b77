//! `space template ...`: list, build (and follow the build's log), save a sandbox, logs,
//! builds, delete.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use reqwest::Method;
use serde_json::{json, Map, Value};
use space_image::dockerfile::ignore::Ignore;

use crate::cli::{TemplateBuildArgs, TemplateCmd};
use crate::client::{seg, Client};
use crate::output::{self, field};

/// Where a registry password is read from (never an argument: it would show in `ps`).
pub const REGISTRY_PASSWORD_ENV: &str = "SPACE_REGISTRY_PASSWORD";

fn array(v: &Value, key: &str) -> Result<Vec<Value>> {
    match v.get(key) {
        Some(Value::Array(a)) => Ok(a.clone()),
        _ => bail!("the server's answer has no `{key}` array"),
    }
}

/// `space template ...`.
pub async fn template(c: &Client, cmd: TemplateCmd, json: bool) -> Result<()> {
    match cmd {
        TemplateCmd::Ls => {
            let list = array(&c.get("/v1/templates", &[]).await?, "templates")?;
            if json {
                output::json(&Value::Array(list));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|t| {
                    vec![
                        field(t, "name"),
                        field(t, "version"),
                        field(t, "source"),
                        field(t, "vcpus"),
                        format!("{}M", field(t, "memory_mib")),
                        format!("{}M", field(t, "image_mib")),
                        output::age(t, "created_unix_ms"),
                    ]
                })
                .collect();
            output::print_table(
                &[
                    "NAME", "VERSION", "SOURCE", "VCPUS", "MEMORY", "DISK", "CREATED",
                ],
                &rows,
            );
        }
        TemplateCmd::Build(a) => build(c, *a, json).await?,
        TemplateCmd::Save {
            id,
            name,
            version,
            disk_only,
        } => {
            let mut body = Map::new();
            body.insert("name".into(), name.into());
            if disk_only {
                body.insert("memory".into(), false.into());
            }
            if let Some(v) = version {
                body.insert("version".into(), v.into());
            }
            let t: Value = c
                .post(
                    &format!("/v1/sandboxes/{}/template", seg(&id)?),
                    &body.into(),
                )
                .await?;
            if json {
                output::json(&t);
            } else {
                println!(
                    "template {}:{} saved from {id}",
                    field(&t, "name"),
                    field(&t, "version")
                );
            }
        }
        TemplateCmd::Logs { build, follow } => {
            print_log(c, &build, follow).await?;
        }
        TemplateCmd::Builds => {
            let list = array(&c.get("/v1/builds", &[]).await?, "builds")?;
            if json {
                output::json(&Value::Array(list));
                return Ok(());
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|b| {
                    vec![
                        field(b, "id"),
                        format!("{}:{}", field(b, "name"), field(b, "version")),
                        field(b, "state"),
                        field(b, "source"),
                        output::age(b, "created_unix_ms"),
                    ]
                })
                .collect();
            output::print_table(&["BUILD", "TEMPLATE", "STATE", "SOURCE", "STARTED"], &rows);
        }
        TemplateCmd::Rm { name, version } => {
            c.delete(&format!("/v1/templates/{}/{}", seg(&name)?, seg(&version)?))
                .await?;
            if json {
                output::json(&json!({"name": name, "version": version, "deleted": true}));
            } else {
                println!("template {name}:{version} deleted");
            }
        }
    }
    Ok(())
}

async fn build(c: &Client, a: TemplateBuildArgs, json: bool) -> Result<()> {
    let mut body = Map::new();
    body.insert("name".into(), a.name.clone().into());
    let registry = |reference: Option<&str>| -> Result<Value> {
        let mut r = Map::new();
        if let Some(reference) = reference {
            r.insert("reference".into(), reference.into());
        }
        if let Some(u) = &a.registry_user {
            let p = std::env::var(REGISTRY_PASSWORD_ENV).map_err(|_| {
                anyhow!("--registry-user needs the password in ${REGISTRY_PASSWORD_ENV}")
            })?;
            r.insert("username".into(), u.clone().into());
            r.insert("password".into(), p.into());
        }
        if a.plain_http {
            r.insert("plain_http".into(), true.into());
        }
        Ok(r.into())
    };
    if let Some(image) = &a.image {
        body.insert("image".into(), image.clone().into());
    }
    if let Some(reference) = &a.from_image {
        body.insert("from_image".into(), registry(Some(reference))?);
    }
    if let Some(file) = &a.from_archive {
        eprintln!("uploading {}...", file.display());
        let id = upload(c, file).await?;
        body.insert("from_archive".into(), id.into());
        if let Some(t) = &a.tag {
            body.insert("archive_tag".into(), t.clone().into());
        }
    }
    if let Some(file) = &a.dockerfile {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        body.insert("dockerfile".into(), text.into());
        let dir = match &a.context {
            Some(d) => d.clone(),
            None => file
                .parent()
                .map(|p| {
                    if p.as_os_str().is_empty() {
                        Path::new(".")
                    } else {
                        p
                    }
                })
                .unwrap_or(Path::new("."))
                .to_path_buf(),
        };
        let tar = context_tar(&dir)?;
        eprintln!(
            "uploading the build context {} ({} KiB)...",
            dir.display(),
            std::fs::metadata(tar.path()).map(|m| m.len()).unwrap_or(0) / 1024
        );
        let id = upload(c, tar.path()).await?;
        body.insert("context".into(), id.into());
        let mut args = Map::new();
        for kv in &a.build_args {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| anyhow!("--build-arg {kv:?} is not NAME=VALUE"))?;
            args.insert(k.into(), v.into());
        }
        if !args.is_empty() {
            body.insert("build_args".into(), args.into());
        }
        if a.registry_user.is_some() || a.plain_http {
            body.insert("registry".into(), registry(None)?);
        }
    }
    for (k, v) in [
        ("version", a.version.clone().map(Value::from)),
        ("vcpus", a.cpus.map(Value::from)),
        ("memory_mib", a.memory.map(Value::from)),
        ("disk_mib", a.disk.map(Value::from)),
        ("start", a.start.clone().map(Value::from)),
        ("ready_command", a.ready.clone().map(Value::from)),
        ("ready_port", a.ready_port.map(Value::from)),
    ] {
        if let Some(v) = v {
            body.insert(k.into(), v);
        }
    }
    let b: Value = c.post("/v1/templates", &body.into()).await?;
    let id = field(&b, "id");
    if a.no_follow {
        if json {
            output::json(&b);
        } else {
            println!("{id}");
        }
        return Ok(());
    }
    eprintln!(
        "build {id} of {}:{}",
        field(&b, "name"),
        field(&b, "version")
    );
    print_log(c, &id, true).await?;
    // The log ends a moment before the build's end is recorded.
    let mut done: Value = c.get(&format!("/v1/builds/{}", seg(&id)?), &[]).await?;
    for _ in 0..100 {
        if done["state"] != "running" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        done = c.get(&format!("/v1/builds/{}", seg(&id)?), &[]).await?;
    }
    if json {
        output::json(&done);
    }
    match done["state"].as_str() {
        Some("succeeded") => {
            if !json {
                println!(
                    "template {}:{} built",
                    field(&done, "name"),
                    field(&done, "version")
                );
            }
            Ok(())
        }
        Some("running") => {
            bail!("the log ended but build {id} still runs: `space template logs -f {id}`")
        }
        _ => bail!(
            "build {id} failed: {}",
            done["error"].as_str().unwrap_or("no reason given")
        ),
    }
}

/// Prints a build's log to stderr; with `follow`, until the build ends.
async fn print_log(c: &Client, build: &str, follow: bool) -> Result<()> {
    use std::io::Write;
    let path = format!("/v1/builds/{}/log", seg(build)?);
    let mut req = c.request(Method::GET, &path);
    if follow {
        req = req.query(&[("follow", "true")]);
    }
    let resp = c.send(req).await?;
    let mut stream = resp.bytes_stream();
    let mut err = std::io::stderr();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| c.transport_error(e))?;
        err.write_all(&chunk)?;
        err.flush()?;
    }
    Ok(())
}

/// Uploads a file for a build; answers its upload id.
async fn upload(c: &Client, file: &Path) -> Result<String> {
    let f = tokio::fs::File::open(file)
        .await
        .with_context(|| format!("opening {}", file.display()))?;
    let len = f.metadata().await?.len();
    let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(f));
    let resp = c
        .send(
            c.request(Method::POST, "/v1/template-uploads")
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .header(reqwest::header::CONTENT_LENGTH, len)
                .body(body),
        )
        .await?;
    let v: Value = resp.json().await.context("reading the upload's answer")?;
    v["upload"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("the server's answer has no upload id"))
}

/// A tar of `dir` without what its `.dockerignore` leaves out (the server applies it again).
fn context_tar(dir: &Path) -> Result<tempfile::NamedTempFile> {
    if !dir.is_dir() {
        bail!("the build context {} is not a directory", dir.display());
    }
    let ignore = match std::fs::read_to_string(dir.join(".dockerignore")) {
        Ok(t) => Ignore::parse(&t),
        Err(_) => Ignore::parse(""),
    };
    let out = tempfile::NamedTempFile::new().context("making a temporary file")?;
    let mut b = tar::Builder::new(std::io::BufWriter::new(out.reopen()?));
    b.follow_symlinks(false);
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        let mut entries: Vec<_> = std::fs::read_dir(&abs)
            .with_context(|| format!("listing {}", abs.display()))?
            .collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let child = rel.join(e.file_name());
            let name = child.to_string_lossy().into_owned();
            if name != ".dockerignore" && ignore.is_ignored(&name) {
                continue;
            }
            let kind = e.file_type()?;
            if kind.is_dir() {
                b.append_dir(&child, e.path())
                    .with_context(|| format!("adding {}", e.path().display()))?;
                stack.push(child);
            } else if kind.is_file() || kind.is_symlink() {
                b.append_path_with_name(e.path(), &child)
                    .with_context(|| format!("adding {}", e.path().display()))?;
            }
        }
    }
    b.into_inner()?
        .into_inner()
        .map_err(|e| anyhow!("writing the context: {e}"))?;
    Ok(out)
}
