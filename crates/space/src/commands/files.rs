//! `space cp`: files into and out of a sandbox, streamed (never held in memory whole).

use std::io::IsTerminal as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use futures::StreamExt as _;
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::Method;
use tokio::io::AsyncWriteExt as _;

use crate::cli::CpArgs;
use crate::client::{seg, Client};

/// Files at least this large get a progress bar (when stderr is a terminal).
const PROGRESS_MIN: u64 = 1 << 20;

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    Local(PathBuf),
    Remote { id: String, path: String },
}

/// `ID:/path` (an id is `sbx-` or `sb-` and then id characters) is a sandbox path; anything
/// else is a local one (write `./sbx-x:y` for a local file of that name).
fn place(arg: &str) -> Result<Place> {
    if let Some((id, path)) = arg.split_once(':') {
        let rest = id.strip_prefix("sbx-").or_else(|| id.strip_prefix("sb-"));
        if rest.is_some_and(|r| {
            !r.is_empty()
                && r.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        }) {
            if !path.starts_with('/') {
                bail!("{arg:?}: the path in a sandbox must be absolute (ID:/path)");
            }
            return Ok(Place::Remote {
                id: id.to_owned(),
                path: path.to_owned(),
            });
        }
    }
    if arg.is_empty() {
        bail!("an empty path");
    }
    Ok(Place::Local(PathBuf::from(arg)))
}

fn bar(len: Option<u64>) -> ProgressBar {
    match len {
        Some(n) if n >= PROGRESS_MIN && std::io::stderr().is_terminal() => {
            let bar = ProgressBar::new(n);
            if let Ok(style) = ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            ) {
                bar.set_style(style);
            }
            bar
        }
        _ => ProgressBar::hidden(),
    }
}

/// `space cp SRC DST`.
pub async fn cp(c: &Client, a: CpArgs) -> Result<()> {
    match (place(&a.src)?, place(&a.dst)?) {
        (Place::Local(src), Place::Remote { id, path }) => upload(c, &src, &id, &path).await,
        (Place::Remote { id, path }, Place::Local(dst)) => download(c, &id, &path, &dst).await,
        (Place::Local(_), Place::Local(_)) => {
            bail!("one side of `space cp` must be in a sandbox (ID:/path)")
        }
        (Place::Remote { .. }, Place::Remote { .. }) => {
            bail!("copying between sandboxes is not supported: copy through a local file")
        }
    }
}

fn base_name(p: &str) -> Option<&str> {
    p.rsplit('/').next().filter(|n| !n.is_empty())
}

async fn upload(c: &Client, src: &Path, id: &str, path: &str) -> Result<()> {
    let file = tokio::fs::File::open(src)
        .await
        .with_context(|| format!("opening {}", src.display()))?;
    let meta = file
        .metadata()
        .await
        .with_context(|| format!("reading {}", src.display()))?;
    if meta.is_dir() {
        bail!("{} is a directory; `space cp` copies files", src.display());
    }
    let mut dest = path.to_owned();
    if dest.ends_with('/') {
        let name = src
            .file_name()
            .and_then(|n| n.to_str())
            .context("the source has no file name to copy into a directory")?;
        dest.push_str(name);
    }
    let mode = format!("{:04o}", meta.permissions().mode() & 0o7777);
    let progress = bar(Some(meta.len()));
    let counter = progress.clone();
    let body = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024).inspect(move |r| {
        if let Ok(b) = r {
            counter.inc(b.len() as u64);
        }
    });
    let result = c
        .send(
            c.request(Method::PUT, &format!("/v1/sandboxes/{}/files", seg(id)?))
                .query(&[("path", dest.as_str()), ("mode", mode.as_str())])
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(reqwest::Body::wrap_stream(body)),
        )
        .await;
    progress.finish_and_clear();
    result?;
    Ok(())
}

async fn download(c: &Client, id: &str, path: &str, dst: &Path) -> Result<()> {
    let mut resp = c
        .send(
            c.request(Method::GET, &format!("/v1/sandboxes/{}/files", seg(id)?))
                .query(&[("path", path)]),
        )
        .await?;
    if dst == Path::new("-") {
        let mut out = tokio::io::stdout();
        while let Some(chunk) = resp.chunk().await.map_err(|e| c.transport_error(e))? {
            out.write_all(&chunk).await?;
        }
        out.flush().await?;
        return Ok(());
    }
    let target = if dst.is_dir() {
        dst.join(base_name(path).context("the sandbox path has no file name")?)
    } else {
        dst.to_owned()
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    // Written next to the target and renamed into place, so a failed download leaves any
    // old file as it was.
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let partial = dir.join(format!(".{name}.space-partial-{}", std::process::id()));
    let progress = bar(resp.content_length());
    let result = async {
        let mut file = tokio::fs::File::create(&partial)
            .await
            .with_context(|| format!("creating {}", partial.display()))?;
        while let Some(chunk) = resp.chunk().await.map_err(|e| c.transport_error(e))? {
            file.write_all(&chunk)
                .await
                .with_context(|| format!("writing {}", partial.display()))?;
            progress.inc(chunk.len() as u64);
        }
        file.flush().await?;
        file.sync_all().await?;
        drop(file);
        tokio::fs::rename(&partial, &target)
            .await
            .with_context(|| format!("writing {}", target.display()))
    }
    .await;
    progress.finish_and_clear();
    if result.is_err() {
        let _ = tokio::fs::remove_file(&partial).await;
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_tell_sandbox_paths_from_local_ones() {
        assert_eq!(
            place("sb-0123abc:/root/x").unwrap(),
            Place::Remote {
                id: "sb-0123abc".into(),
                path: "/root/x".into()
            }
        );
        assert_eq!(
            place("sbx-00ff:/x").unwrap(),
            Place::Remote {
                id: "sbx-00ff".into(),
                path: "/x".into()
            }
        );
        assert_eq!(place("sbx-:/x").unwrap(), Place::Local("sbx-:/x".into()));
        assert_eq!(
            place("./sb-1:/x").unwrap(),
            Place::Local("./sb-1:/x".into())
        );
        assert_eq!(place("a:b").unwrap(), Place::Local("a:b".into()));
        assert!(place("sb-1:relative").is_err());
        assert!(place("").is_err());
        assert_eq!(base_name("/root/file.txt"), Some("file.txt"));
        assert_eq!(base_name("/root/"), None);
    }
}
