//! File routes: streamed read and write, stat, list, mkdir, remove, rename, chmod.
//!
//! The daemon runs as root, so these routes see the whole guest filesystem; the sandbox is the
//! VM, not this API. Writes go to a temporary file in the target's directory that is renamed
//! over the target only once every byte arrived, so a failed or abandoned upload never leaves
//! a partial file behind. Blocking filesystem calls run on the blocking pool.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use space_proto::limits::{MAX_LIST_ENTRIES, MAX_XATTRS};
use space_proto::query::{parse_query, validate_path};
use space_proto::{
    ChmodRequest, DirEntry, DirListing, ErrorKind, FileStat, FileType, MkdirRequest, ProtoError,
    RemoveRequest, RenameRequest,
};

use crate::body::{ok_json, read_json, ChannelBody, HandlerResult};

/// Size of the chunks a download is sent in.
const READ_CHUNK: usize = 256 * 1024;

/// Runs a blocking filesystem operation off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ProtoError> + Send + 'static,
) -> Result<T, ProtoError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ProtoError::internal(format!("filesystem task failed: {e}")))?
}

/// The query parameters of a file route.
struct Params {
    path: String,
    rest: Vec<(String, String)>,
}

impl Params {
    fn from(req: &Request<Incoming>) -> Result<Params, ProtoError> {
        let mut pairs = parse_query(req.uri().query())?;
        let idx = pairs
            .iter()
            .position(|(k, _)| k == "path")
            .ok_or_else(|| ProtoError::invalid("missing query parameter path"))?;
        let (_, path) = pairs.remove(idx);
        validate_path(&path)?;
        Ok(Params { path, rest: pairs })
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.rest
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `xattr.NAME=VALUE` parameters, each checked.
    fn xattrs(&self) -> Result<Vec<(String, String)>, ProtoError> {
        let mut out = Vec::new();
        for (k, v) in &self.rest {
            if let Some(name) = k.strip_prefix("xattr.") {
                space_proto::query::validate_xattr(name, v)?;
                out.push((name.to_owned(), v.clone()));
            }
        }
        if out.len() > MAX_XATTRS {
            return Err(ProtoError::invalid(format!(
                "at most {MAX_XATTRS} extended attributes may be set at once"
            )));
        }
        Ok(out)
    }

    fn flag(&self, key: &str) -> Result<bool, ProtoError> {
        match self.get(key) {
            None | Some("false") | Some("0") => Ok(false),
            Some("true") | Some("1") | Some("") => Ok(true),
            Some(other) => Err(ProtoError::invalid(format!(
                "{key}={other:?} is not a boolean"
            ))),
        }
    }
}

pub fn parse_mode(text: &str) -> Result<u32, ProtoError> {
    let mode = u32::from_str_radix(text, 8)
        .map_err(|_| ProtoError::invalid(format!("mode {text:?} is not an octal number")))?;
    check_mode(mode)?;
    Ok(mode)
}

fn check_mode(mode: u32) -> Result<(), ProtoError> {
    if mode > 0o7777 {
        return Err(ProtoError::invalid(format!(
            "mode {mode:o} has bits outside 7777"
        )));
    }
    Ok(())
}

fn io_err(op: &str, path: &str, e: &io::Error) -> ProtoError {
    ProtoError::io(format!("{op} {path}"), e)
}

/// Stat of a path without following a final symlink.
pub fn stat_path(path: &str) -> Result<FileStat, ProtoError> {
    let meta = fs::symlink_metadata(path).map_err(|e| io_err("stat", path, &e))?;
    Ok(stat_from(path, &meta))
}

fn stat_from(path: &str, meta: &fs::Metadata) -> FileStat {
    let ft = meta.file_type();
    let file_type = if ft.is_symlink() {
        FileType::Symlink
    } else if ft.is_dir() {
        FileType::Dir
    } else if ft.is_file() {
        FileType::File
    } else {
        FileType::Other
    };
    let symlink_target = if ft.is_symlink() {
        fs::read_link(path)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    FileStat {
        path: path.to_string(),
        file_type,
        size: meta.size(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime_unix_ns: meta
            .mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec()),
        symlink_target,
        xattrs: crate::xattrs::read(Path::new(path)),
    }
}

pub async fn read(req: Request<Incoming>) -> HandlerResult {
    let params = Params::from(&req)?;
    let path = params.path.clone();
    let file = blocking(move || {
        // Non-blocking, so opening a FIFO with no writer cannot hang the download; only a
        // regular file is read (a device could stream without end or fail mid-read).
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&path)
            .map_err(|e| io_err("open", &path, &e))?;
        let meta = file.metadata().map_err(|e| io_err("stat", &path, &e))?;
        if meta.is_dir() {
            return Err(ProtoError::new(
                ErrorKind::IsADirectory,
                format!("{path} is a directory"),
            ));
        }
        if !meta.is_file() {
            return Err(ProtoError::new(
                ErrorKind::Unsupported,
                format!("{path} is not a regular file (a device, FIFO or socket)"),
            ));
        }
        Ok(file)
    })
    .await?;
    let (tx, body) = ChannelBody::new(4);
    // A plain blocking thread per download: reads are sequential and the bounded channel
    // paces them to the host.
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        loop {
            let mut buf = vec![0u8; READ_CHUNK];
            match file.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // Resets the stream: the host sees a failed download, not a short file.
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    let mut resp = Response::new(body.boxed());
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/octet-stream"),
    );
    Ok(resp)
}

/// Distinguishes a unique temporary name per upload.
static UPLOADS: AtomicU64 = AtomicU64::new(0);

/// Why a file cannot be created in `dir`, with the error refined where the OS is vague: some
/// filesystems (procfs) answer ENOENT for a directory that exists but takes no new files.
fn create_error(path: &str, dir: &Path, e: &io::Error) -> ProtoError {
    if e.raw_os_error() == Some(libc::ENOENT) && dir.is_dir() {
        return ProtoError::new(
            ErrorKind::ReadOnly,
            format!(
                "cannot write {path}: {} does not accept new files",
                dir.display()
            ),
        );
    }
    match ErrorKind::from_io(e) {
        ErrorKind::ReadOnly => ProtoError::new(
            ErrorKind::ReadOnly,
            format!("cannot write {path}: read-only filesystem"),
        ),
        ErrorKind::PermissionDenied => ProtoError::new(
            ErrorKind::PermissionDenied,
            format!("cannot write {path}: {e}"),
        ),
        ErrorKind::NotFound => ProtoError::new(
            ErrorKind::NotFound,
            format!("cannot write {path}: {} does not exist", dir.display()),
        ),
        _ => io_err("write", path, e),
    }
}

/// Removes the temporary file unless the upload completed.
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// `owner=UID:GID`.
fn parse_owner(text: &str) -> Result<(u32, u32), ProtoError> {
    text.split_once(':')
        .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)))
        .ok_or_else(|| ProtoError::invalid(format!("owner {text:?} is not UID:GID")))
}

/// Creates `dir` and its missing parents with `mode`, each new one owned by `owner`.
fn make_dirs(dir: &Path, mode: u32, owner: Option<(u32, u32)>) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at {
        match fs::symlink_metadata(d) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(d.to_path_buf()),
            Err(e) => return Err(e),
        }
        at = d.parent();
    }
    for d in missing.iter().rev() {
        match fs::DirBuilder::new().mode(mode).create(d) {
            Ok(()) => {
                if let Some((uid, gid)) = owner {
                    std::os::unix::fs::lchown(d, Some(uid), Some(gid))?;
                }
            }
            // Made by someone else meanwhile.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    if !dir.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EEXIST));
    }
    Ok(())
}

pub async fn write(req: Request<Incoming>) -> HandlerResult {
    let params = Params::from(&req)?;
    let mode = params.get("mode").map(parse_mode).transpose()?;
    let parents = params.flag("parents")?;
    let owner = params.get("owner").map(parse_owner).transpose()?;
    let xattrs = params.xattrs()?;
    // Written in place (truncated, then written: what a watch sees as writes to the file)
    // rather than to a temporary file renamed over it; a cut-off upload then leaves the file
    // partly written.
    let in_place = params.flag("in_place")?;
    // Attributes under this prefix that the file had are dropped, not kept.
    let clear = params.get("clear_xattrs").map(str::to_owned);
    if let Some(p) = &clear {
        if !p.starts_with("user.") {
            return Err(ProtoError::invalid(
                "clear_xattrs names a prefix of user. attributes",
            ));
        }
    }
    let path = params.path.clone();
    let target = PathBuf::from(&path);
    let Some(name) = target.file_name().map(|n| n.to_os_string()) else {
        // "/", "/." or "/x/..": a directory, as writing over an existing one would be.
        return Err(ProtoError::new(
            ErrorKind::IsADirectory,
            format!("{path} names a directory, not a file"),
        ));
    };
    let dir = target.parent().unwrap_or(Path::new("/")).to_path_buf();

    // The guard is made where the file is made, so the file is removed even if this request
    // is cancelled (the host reset the stream) while the blocking task runs.
    let (file, guard, final_mode) = {
        let (path, dir) = (path.clone(), dir.clone());
        blocking(move || {
            if parents {
                make_dirs(&dir, 0o755, owner).map_err(|e| create_error(&path, &dir, &e))?;
            }
            let existing = match fs::metadata(&path) {
                Ok(m) if m.is_dir() => {
                    return Err(ProtoError::new(
                        ErrorKind::IsADirectory,
                        format!("{path} is a directory"),
                    ))
                }
                Ok(m) => Some((m.mode() & 0o7777, (m.uid(), m.gid()))),
                Err(_) => None,
            };
            let final_mode = mode.or(existing.map(|e| e.0)).unwrap_or(0o644);
            let final_owner = owner.or(existing.map(|e| e.1));
            let replaces = existing.is_some();
            let (file, guard) = if in_place {
                // Made with its mode and owner before a byte is written, as envd does: a
                // watch sees the file created, its attributes changed once, then written.
                let file = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(final_mode)
                    .open(&path)
                    .map_err(|e| create_error(&path, &dir, &e))?;
                if let Some((uid, gid)) = final_owner {
                    std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
                        .map_err(|e| io_err("chown", &path, &e))?;
                }
                let now = file
                    .metadata()
                    .map_err(|e| io_err("stat", &path, &e))?
                    .mode()
                    & 0o7777;
                if now != final_mode {
                    file.set_permissions(fs::Permissions::from_mode(final_mode))
                        .map_err(|e| io_err("chmod", &path, &e))?;
                }
                if let (true, Some(p)) = (replaces, &clear) {
                    crate::xattrs::remove_prefixed(&file, p)
                        .map_err(|e| io_err("clear the extended attributes of", &path, &e))?;
                }
                (file, TempGuard(None))
            } else {
                let n = UPLOADS.fetch_add(1, Ordering::Relaxed);
                let mut tmp_name = std::ffi::OsString::from(".");
                tmp_name.push(&name);
                tmp_name.push(format!(".space-upload-{}-{n}", std::process::id()));
                let tmp = dir.join(tmp_name);
                let file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(|e| create_error(&path, &dir, &e))?;
                let guard = TempGuard(Some(tmp));
                // A file that is replaced keeps its attributes (but those cleared); the
                // write's own come on top.
                if replaces {
                    crate::xattrs::copy(Path::new(&path), &file, clear.as_deref())
                        .map_err(|e| io_err("copy the extended attributes of", &path, &e))?;
                }
                (file, guard)
            };
            for (name, value) in &xattrs {
                crate::xattrs::set(&file, name.as_bytes(), value.as_bytes())
                    .map_err(|e| io_err(&format!("set {name} on"), &path, &e))?;
            }
            Ok((file, guard, (final_mode, final_owner)))
        })
        .await?
    };
    let (final_mode, final_owner) = final_mode;

    // Body chunks are handed to a blocking writer thread through a small channel, so a slow
    // disk slows the upload instead of buffering it.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let writer = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || -> Result<fs::File, ProtoError> {
            let mut file = file;
            while let Some(chunk) = rx.blocking_recv() {
                file.write_all(&chunk)
                    .map_err(|e| io_err("write", &path, &e))?;
            }
            Ok(file)
        })
    };
    let mut body = req.into_body();
    let mut upload_error = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    if tx.send(data).await.is_err() {
                        // The writer failed; its error is reported below.
                        break;
                    }
                }
            }
            Err(_) => {
                upload_error = Some(ProtoError::new(
                    ErrorKind::Closed,
                    format!("upload of {path} was cut off; the file is unchanged"),
                ));
                break;
            }
        }
    }
    drop(tx);
    let file = writer
        .await
        .map_err(|e| ProtoError::internal(format!("writer failed: {e}")))??;
    if let Some(e) = upload_error {
        return Err(e);
    }
    let stat = blocking(move || {
        let mut guard = guard;
        if !in_place {
            if let Some((uid, gid)) = final_owner {
                std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
                    .map_err(|e| io_err("chown", &path, &e))?;
            }
            file.set_permissions(fs::Permissions::from_mode(final_mode))
                .map_err(|e| io_err("chmod", &path, &e))?;
        }
        drop(file);
        if !in_place {
            let Some(tmp) = guard.0.as_ref() else {
                return Err(ProtoError::internal("upload lost its temporary file"));
            };
            fs::rename(tmp, &path).map_err(|e| io_err("rename into", &path, &e))?;
            guard.0 = None;
        }
        stat_path(&path)
    })
    .await?;
    ok_json(&stat)
}

pub async fn stat(req: Request<Incoming>) -> HandlerResult {
    let params = Params::from(&req)?;
    ok_json(&blocking(move || stat_path(&params.path)).await?)
}

pub async fn list(req: Request<Incoming>) -> HandlerResult {
    let params = Params::from(&req)?;
    let listing = blocking(move || {
        let path = params.path;
        let rd = fs::read_dir(&path).map_err(|e| io_err("list", &path, &e))?;
        let mut entries = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| io_err("list", &path, &e))?;
            if entries.len() >= MAX_LIST_ENTRIES {
                return Err(ProtoError::new(
                    ErrorKind::TooLarge,
                    format!("{path} has more than {MAX_LIST_ENTRIES} entries"),
                ));
            }
            // Names that are not UTF-8 are reported lossily; such files can still be reached
            // through exec.
            let name = entry.file_name().to_string_lossy().into_owned();
            let full = entry.path().to_string_lossy().into_owned();
            match entry.metadata() {
                Ok(meta) => entries.push(DirEntry {
                    name,
                    stat: stat_from(&full, &meta),
                }),
                // Removed while listing.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("stat", &full, &e)),
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(DirListing { entries })
    })
    .await?;
    ok_json(&listing)
}

pub async fn mkdir(req: Request<Incoming>) -> HandlerResult {
    let r: MkdirRequest = read_json(req.into_body()).await?;
    validate_path(&r.path)?;
    let mode = r.mode.unwrap_or(0o755);
    check_mode(mode)?;
    let stat = blocking(move || {
        let result = if r.parents {
            make_dirs(Path::new(&r.path), mode, r.owner)
        } else {
            fs::DirBuilder::new()
                .mode(mode)
                .create(&r.path)
                .and_then(|()| match r.owner {
                    Some((uid, gid)) => std::os::unix::fs::lchown(&r.path, Some(uid), Some(gid)),
                    None => Ok(()),
                })
        };
        match result {
            Ok(()) => {}
            Err(e) if r.parents && e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(ProtoError::new(
                    ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", r.path),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(ProtoError::new(
                    ErrorKind::AlreadyExists,
                    format!("{} already exists", r.path),
                ))
            }
            Err(e) => return Err(io_err("mkdir", &r.path, &e)),
        }
        stat_path(&r.path)
    })
    .await?;
    ok_json(&stat)
}

pub async fn remove(req: Request<Incoming>) -> HandlerResult {
    let r: RemoveRequest = read_json(req.into_body()).await?;
    validate_path(&r.path)?;
    if Path::new(&r.path).parent().is_none() {
        return Err(ProtoError::invalid("refusing to remove /"));
    }
    blocking(move || {
        let meta = fs::symlink_metadata(&r.path).map_err(|e| io_err("remove", &r.path, &e))?;
        let result = if meta.is_dir() {
            if r.recursive {
                fs::remove_dir_all(&r.path)
            } else {
                fs::remove_dir(&r.path)
            }
        } else {
            fs::remove_file(&r.path)
        };
        result.map_err(|e| match ErrorKind::from_io(&e) {
            ErrorKind::NotEmpty => ProtoError::new(
                ErrorKind::NotEmpty,
                format!("{} is a non-empty directory", r.path),
            ),
            _ => io_err("remove", &r.path, &e),
        })
    })
    .await?;
    ok_json(&serde_json::json!({}))
}

pub async fn rename(req: Request<Incoming>) -> HandlerResult {
    let r: RenameRequest = read_json(req.into_body()).await?;
    validate_path(&r.from)?;
    validate_path(&r.to)?;
    let stat = blocking(move || {
        fs::rename(&r.from, &r.to)
            .map_err(|e| ProtoError::io(format!("rename {} to {}", r.from, r.to), &e))?;
        stat_path(&r.to)
    })
    .await?;
    ok_json(&stat)
}

pub async fn chmod(req: Request<Incoming>) -> HandlerResult {
    let r: ChmodRequest = read_json(req.into_body()).await?;
    validate_path(&r.path)?;
    check_mode(r.mode)?;
    let stat = blocking(move || {
        fs::set_permissions(&r.path, fs::Permissions::from_mode(r.mode))
            .map_err(|e| io_err("chmod", &r.path, &e))?;
        stat_path(&r.path)
    })
    .await?;
    ok_json(&stat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_as_octal_within_bounds() {
        assert_eq!(parse_mode("755").unwrap(), 0o755);
        assert_eq!(parse_mode("4755").unwrap(), 0o4755);
        assert!(parse_mode("8").is_err());
        assert!(parse_mode("17777").is_err());
        assert!(parse_mode("").is_err());
    }

    #[test]
    fn create_error_names_the_path() {
        let e = create_error(
            "/proc/x",
            Path::new("/proc"),
            &io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert_eq!(e.kind, ErrorKind::ReadOnly);
        assert!(e.message.contains("/proc/x"));
        let e = create_error(
            "/nope/x",
            Path::new("/nope"),
            &io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert_eq!(e.kind, ErrorKind::NotFound);
    }
}
