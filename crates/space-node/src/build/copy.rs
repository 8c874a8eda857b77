//! What a `COPY` or `ADD` writes: its sources found in the build context (wildcards in the
//! last part, `.dockerignore` applied, nothing outside the context), directories walked, local
//! tar archives unpacked for `ADD`, and the digest of it all for the step cache.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};
use space_image::dockerfile::ignore::Ignore;

use super::import::IMAGE_BUDGET;
use crate::error::{NodeError, Result};

/// The most a build context may hold.
const MAX_CONTEXT_BYTES: u64 = 8 << 30;

fn invalid(msg: impl Into<String>) -> NodeError {
    NodeError::Invalid(msg.into())
}

/// A file a `COPY` writes: where from (on this host) and where to (in the guest).
#[derive(Debug, Clone)]
pub(super) struct Item {
    pub src: PathBuf,
    pub dest: String,
    pub mode: u32,
    pub dir: bool,
    /// Owner kept from an unpacked archive (else root or `--chown`).
    pub owner: Option<(u32, u32)>,
}

/// A relative path of the context, checked: no `..` out of it.
fn context_path(raw: &str) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in Path::new(raw.trim_start_matches('/')).components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(invalid(format!("{raw:?} points outside the build context")));
                }
            }
            Component::Prefix(_) => return Err(invalid(format!("{raw:?} is not a path"))),
        }
    }
    Ok(out)
}

/// Whether `name` matches the wildcard pattern `pat` (`*`, `?`).
fn wildcard(pat: &[u8], name: &[u8]) -> bool {
    match (pat.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            wildcard(&pat[1..], name) || (!name.is_empty() && wildcard(pat, &name[1..]))
        }
        (Some(b'?'), Some(_)) => wildcard(&pat[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => wildcard(&pat[1..], &name[1..]),
        _ => false,
    }
}

/// The context paths a source names: itself, or what its wildcards match (in the last part).
fn expand_source(context: &Path, raw: &str) -> Result<Vec<PathBuf>> {
    let rel = context_path(raw)?;
    let last = rel.file_name().map(|n| n.to_string_lossy().into_owned());
    match last {
        Some(pat) if pat.contains(['*', '?']) => {
            let parent = rel.parent().unwrap_or(Path::new(""));
            let mut out = Vec::new();
            if let Ok(entries) = std::fs::read_dir(context.join(parent)) {
                for e in entries.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if wildcard(pat.as_bytes(), name.as_bytes()) {
                        out.push(parent.join(name));
                    }
                }
            }
            out.sort();
            Ok(out)
        }
        _ => Ok(vec![rel]),
    }
}

/// Whether the first bytes of a file are those of a tar archive (plain or compressed).
fn is_archive(path: &Path) -> bool {
    let mut head = [0u8; 512];
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let n = f.read(&mut head).unwrap_or(0);
    let head = &head[..n];
    head.starts_with(&[0x1f, 0x8b])
        || head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd])
        || (n >= 262 && &head[257..262] == b"ustar")
}

/// Every file and directory a `COPY` writes, in order (directories first).
#[allow(clippy::too_many_arguments)]
pub(super) fn collect(
    context: &Path,
    ignore: &Ignore,
    sources: &[String],
    dest: &str,
    chmod: Option<u32>,
    add: bool,
    work: &Path,
    line: usize,
) -> Result<Vec<Item>> {
    let mut matched = Vec::new();
    for raw in sources {
        let found = expand_source(context, raw)?;
        let found: Vec<PathBuf> = found
            .into_iter()
            .filter(|rel| rel.as_os_str().is_empty() || !ignore.is_ignored(&rel.to_string_lossy()))
            .filter(|rel| std::fs::symlink_metadata(context.join(rel)).is_ok())
            .collect();
        if found.is_empty() {
            return Err(invalid(format!(
                "source {raw:?} is not in the build context (or .dockerignore leaves it out)"
            )));
        }
        matched.extend(found);
    }
    let into_dir =
        dest.ends_with('/') || matched.len() > 1 || sources.iter().any(|s| s.contains(['*', '?']));
    let mut items = Vec::new();
    let mut bytes = 0u64;
    let mut unpacked = 0;
    for rel in matched {
        let abs = context.join(&rel);
        let meta = std::fs::symlink_metadata(&abs).map_err(NodeError::io("reading", &abs))?;
        let name = rel
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if meta.is_dir() {
            // A directory's contents go into the destination.
            let how = Walk {
                ignore: Some(ignore),
                chmod,
                keep_owners: false,
            };
            let dest = dest.trim_end_matches('/');
            walk(context, &rel, dest, &how, true, &mut items, &mut bytes)?;
        } else if meta.is_file() {
            if add && is_archive(&abs) {
                let dir = work.join(format!("add-{line}-{unpacked}"));
                unpacked += 1;
                unpack_tar(&abs, &dir, &format!("unpacking {name}"))?;
                let before = items.len();
                let how = Walk {
                    ignore: None,
                    chmod,
                    keep_owners: true,
                };
                let dest = dest.trim_end_matches('/');
                walk(
                    &dir,
                    Path::new(""),
                    dest,
                    &how,
                    true,
                    &mut items,
                    &mut bytes,
                )?;
                if items.len() == before {
                    return Err(invalid(format!("{name}: the archive holds nothing")));
                }
                continue;
            }
            let target = if into_dir {
                format!("{}/{name}", dest.trim_end_matches('/'))
            } else {
                dest.to_owned()
            };
            bytes += meta.len();
            items.push(Item {
                src: abs,
                dest: target,
                mode: chmod.unwrap_or(meta.permissions().mode() & 0o7777),
                dir: false,
                owner: None,
            });
        }
        if bytes > MAX_CONTEXT_BYTES {
            return Err(invalid(format!(
                "the files are more than {} GiB",
                MAX_CONTEXT_BYTES >> 30
            )));
        }
    }
    Ok(items)
}

/// How a directory is walked: the context's (`.dockerignore` applies; root owns what is
/// written) or an unpacked archive's (owners and directory modes kept).
struct Walk<'a> {
    ignore: Option<&'a Ignore>,
    chmod: Option<u32>,
    keep_owners: bool,
}

/// The items of directory `root/rel`, written at `dest`: the directory, then what it holds.
/// The top directory (`top`) is made with mode 0755, owned as the copy says.
fn walk(
    root: &Path,
    rel: &Path,
    dest: &str,
    how: &Walk<'_>,
    top: bool,
    items: &mut Vec<Item>,
    bytes: &mut u64,
) -> Result<()> {
    let dir = root.join(rel);
    let meta = std::fs::metadata(&dir).map_err(NodeError::io("reading", &dir))?;
    let kept = how.keep_owners && !top;
    items.push(Item {
        src: dir.clone(),
        dest: if dest.is_empty() {
            "/".into()
        } else {
            dest.to_owned()
        },
        mode: if kept {
            meta.permissions().mode() & 0o7777
        } else {
            0o755
        },
        dir: true,
        owner: kept.then(|| (meta.uid(), meta.gid())),
    });
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .map_err(NodeError::io("listing", &dir))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let child = rel.join(e.file_name());
        if how
            .ignore
            .is_some_and(|i| i.is_ignored(&child.to_string_lossy()))
        {
            continue;
        }
        let m = std::fs::symlink_metadata(e.path()).map_err(NodeError::io("reading", e.path()))?;
        let target = format!("{dest}/{}", e.file_name().to_string_lossy());
        if m.is_dir() {
            walk(root, &child, &target, how, false, items, bytes)?;
        } else if m.is_file() {
            *bytes += m.len();
            items.push(Item {
                src: e.path(),
                dest: target,
                mode: how.chmod.unwrap_or(m.permissions().mode() & 0o7777),
                dir: false,
                owner: how.keep_owners.then(|| (m.uid(), m.gid())),
            });
        } else {
            tracing::debug!(path = %child.display(), "not a file or directory: not copied");
        }
    }
    Ok(())
}

/// Unpacks the tar file `archive` (plain, gzip or zstd) into `dir`, within the bounds of an
/// image, every path kept inside `dir` (`space_image::layers`); errors start with `what`.
pub(crate) fn unpack_tar(archive: &Path, dir: &Path, what: &str) -> Result<()> {
    use std::io::BufRead;
    std::fs::create_dir_all(dir).map_err(NodeError::io("creating", dir))?;
    let f = std::fs::File::open(archive).map_err(NodeError::io("opening", archive))?;
    let mut head = std::io::BufReader::new(f);
    let compression = space_image::Compression::sniff(
        head.fill_buf().map_err(NodeError::io("reading", archive))?,
    );
    let reader = space_image::layers::decompress(head, compression)
        .map_err(|e| invalid(format!("{what}: {e}")))?;
    let mut budget = IMAGE_BUDGET;
    space_image::layers::apply_tar(dir, reader, &mut budget)
        .map_err(|e| invalid(format!("{what}: {e}")))?;
    Ok(())
}

/// The digest of what a `COPY` writes: destinations, modes, owners and contents.
pub(super) fn hash_items(items: &[Item]) -> Result<String> {
    let mut h = Sha256::new();
    for it in items {
        h.update(it.dest.as_bytes());
        h.update([0]);
        h.update(it.mode.to_le_bytes());
        h.update(format!("{:?}", it.owner).as_bytes());
        if it.dir {
            h.update(b"dir");
            continue;
        }
        let mut f = std::fs::File::open(&it.src).map_err(NodeError::io("reading", &it.src))?;
        let mut fh = Sha256::new();
        std::io::copy(&mut f, &mut fh).map_err(NodeError::io("reading", &it.src))?;
        h.update(fh.finalize());
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_and_context_paths() {
        assert!(wildcard(b"*.txt", b"a.txt"));
        assert!(wildcard(b"a?c", b"abc"));
        assert!(!wildcard(b"*.txt", b"a.txt.bak"));
        assert!(wildcard(b"*", b""));
        assert_eq!(context_path("./src/../app").unwrap(), PathBuf::from("app"));
        assert!(context_path("../etc/passwd").is_err());
        assert_eq!(context_path("/abs").unwrap(), PathBuf::from("abs"));
    }

    #[test]
    fn copy_sources_are_checked_against_the_context() {
        let ctx = tempfile::tempdir().unwrap();
        let work = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ctx.path().join("src/sub")).unwrap();
        std::fs::write(ctx.path().join("src/a.py"), b"a").unwrap();
        std::fs::write(ctx.path().join("src/sub/b.py"), b"b").unwrap();
        std::fs::write(ctx.path().join("secret.key"), b"k").unwrap();
        std::fs::write(ctx.path().join("x.txt"), b"x").unwrap();
        let ignore = Ignore::parse("*.key\n");
        let c = |sources: &[&str], dest: &str| {
            let s: Vec<String> = sources.iter().map(|s| s.to_string()).collect();
            collect(ctx.path(), &ignore, &s, dest, None, false, work.path(), 1)
        };
        let items = c(&["src"], "/app").unwrap();
        let dests: Vec<&str> = items.iter().map(|i| i.dest.as_str()).collect();
        assert_eq!(dests, ["/app", "/app/a.py", "/app/sub", "/app/sub/b.py"]);
        let items = c(&["x.txt"], "/opt/y.txt").unwrap();
        assert_eq!(items[0].dest, "/opt/y.txt");
        let items = c(&["x.txt"], "/opt/").unwrap();
        assert_eq!(items[0].dest, "/opt/x.txt");
        let items = c(&["*.txt"], "/opt").unwrap();
        assert_eq!(items[0].dest, "/opt/x.txt");
        let e = c(&["missing.txt"], "/").unwrap_err().to_string();
        assert!(
            e.contains("missing.txt") && e.contains("not in the build context"),
            "{e}"
        );
        let e = c(&["secret.key"], "/").unwrap_err().to_string();
        assert!(e.contains(".dockerignore"), "{e}");
        assert!(c(&["../x"], "/").is_err());
        // The digest follows contents.
        let before = hash_items(&c(&["src"], "/app").unwrap()).unwrap();
        std::fs::write(ctx.path().join("src/a.py"), b"changed").unwrap();
        assert_ne!(hash_items(&c(&["src"], "/app").unwrap()).unwrap(), before);
    }
}
