//! envd's `filesystem.Filesystem` service over the guest protocol, and the path and owner
//! rules the file API (`super::files`) shares with it: a relative path (or `~`) is under the
//! user's home, and what a call creates belongs to the user.

use std::collections::HashMap;

use axum::body::Body;
use axum::http::HeaderMap;
use axum::response::Response;
use serde::Deserialize;
use serde_json::{json, Value};
use space_proto::{Account, FileStat, FileType, WatchEventKind};

use super::connect::{self, Code, RpcError, RpcResult, StreamTx};
use super::envd::Envd;

/// Entries a `ListDir` answers at most, over all its levels.
const MAX_ENTRIES: usize = 100_000;
/// How deep a `ListDir` may go.
const MAX_DEPTH: u32 = 64;

impl Envd {
    /// The account calls act as.
    pub async fn account(&self) -> RpcResult<Account> {
        let name = self.username().await?;
        if let Some(a) = self.e2b.cached_account(&self.id, &name) {
            return Ok(a);
        }
        let account = self.guest.account(&name).await.map_err(|e| {
            let mut e = RpcError::from(e);
            if e.code == Code::NotFound {
                e.code = Code::Unauthenticated;
                e.message = format!("invalid username {name:?}: {}", e.message);
            }
            e
        })?;
        self.e2b.keep_account(&self.id, &account);
        Ok(account)
    }
}

/// `path` as an absolute guest path: relative ones (and `~`) are under `home`.
pub fn resolve(home: &str, path: &str) -> RpcResult<String> {
    if path.is_empty() {
        return Err(RpcError::invalid("the path is empty"));
    }
    let joined = if path.starts_with('/') {
        path.to_owned()
    } else if path == "~" {
        home.to_owned()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{}/{rest}", home.trim_end_matches('/'))
    } else {
        format!("{}/{path}", home.trim_end_matches('/'))
    };
    // Lexically clean: `.` and `..` and doubled slashes, as envd does.
    let mut parts: Vec<&str> = Vec::new();
    for p in joined.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let clean = format!("/{}", parts.join("/"));
    space_proto::query::validate_path(&clean).map_err(|e| RpcError::invalid(e.message))?;
    Ok(clean)
}

/// Names of uids and gids, from the guest's `/etc/passwd` and `/etc/group`.
#[derive(Default)]
pub struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    /// The sandbox's names, read again when the ones kept are stale.
    pub async fn of(e: &Envd) -> std::sync::Arc<Names> {
        if let Some(n) = e.e2b.cached_names(&e.id) {
            return n;
        }
        let names = std::sync::Arc::new(Names::read(e).await);
        e.e2b.keep_names(&e.id, names.clone());
        names
    }

    async fn read(e: &Envd) -> Names {
        let table = |text: &str| -> HashMap<u32, String> {
            text.lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    Some((f.get(2)?.parse().ok()?, f.first()?.to_string()))
                })
                .collect()
        };
        let read = |p: &'static str| {
            let g = e.guest.clone();
            async move {
                g.read_file_bytes(p)
                    .await
                    .map(|b| String::from_utf8_lossy(&b[..b.len().min(1 << 20)]).into_owned())
                    .unwrap_or_default()
            }
        };
        let (p, g) = tokio::join!(read("/etc/passwd"), read("/etc/group"));
        Names {
            users: table(&p),
            groups: table(&g),
        }
    }

    fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

fn permissions(t: FileType, mode: u32) -> String {
    let kind = match t {
        FileType::Dir => 'd',
        FileType::Symlink => 'L',
        _ => '-',
    };
    let mut s = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

/// An RFC 3339 UTC time of `ns` since the Unix epoch.
fn timestamp(ns: i64) -> String {
    let ms = u64::try_from(ns.div_euclid(1_000_000)).unwrap_or(0);
    let base = super::rest::rfc3339(ms);
    // rfc3339 gives milliseconds; keep nanoseconds as envd does.
    let frac = ns.rem_euclid(1_000_000_000);
    format!("{}.{frac:09}Z", &base[..19])
}

/// envd's `EntryInfo` of a guest stat.
pub fn entry(s: &FileStat, names: &Names) -> Value {
    let name = s.path.rsplit('/').next().unwrap_or("").to_owned();
    let kind = match s.file_type {
        FileType::File => "FILE_TYPE_FILE",
        FileType::Dir => "FILE_TYPE_DIRECTORY",
        FileType::Symlink => "FILE_TYPE_SYMLINK",
        FileType::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mut v = json!({
        "name": if s.path == "/" { "/".to_owned() } else { name },
        "type": kind,
        "path": s.path,
        "size": s.size.to_string(),
        // Permission bits only, as envd sends them (the type is in `type`).
        "mode": s.mode & 0o7777,
        "permissions": permissions(s.file_type, s.mode),
        "owner": names.user(s.uid),
        "group": names.group(s.gid),
        "modifiedTime": timestamp(s.mtime_unix_ns),
        "isSymlink": s.file_type == FileType::Symlink,
    });
    if let Some(t) = &s.symlink_target {
        v["symlinkTarget"] = json!(t);
    }
    let metadata = super::files::file_metadata(s);
    if !metadata.is_empty() {
        v["metadata"] = json!(metadata);
    }
    v
}

/// The order a depth-first walk in name order visits two paths in: by their parts, a
/// directory right before what is in it.
fn walk_order(a: &str, b: &str) -> std::cmp::Ordering {
    a.split('/').cmp(b.split('/'))
}

fn answer(r: RpcResult<Value>) -> Response {
    match r {
        Ok(v) => connect::unary_ok(&v),
        Err(e) => e.unary(),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PathRequest {
    path: String,
    depth: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MoveRequest {
    source: String,
    destination: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatchRequest {
    path: String,
    recursive: bool,
    include_entry: bool,
}

/// Filesystem errors: a missing path is the SDK's file-not-found.
fn fs_error(e: space_proto::ClientError) -> RpcError {
    RpcError::from(e)
}

/// One unary call of `filesystem.Filesystem`, or its `WatchDir` stream.
pub async fn call(e: Envd, method: &str, headers: HeaderMap, body: Body) -> Response {
    if method == "WatchDir" {
        return watch(e, headers, body).await;
    }
    let run = async {
        let account = e.account().await?;
        let home = account.home.clone();
        match method {
            "Stat" => {
                let r: PathRequest = connect::unary_request(&headers, body).await?;
                let path = resolve(&home, &r.path)?;
                let s = e.guest.stat(&path).await.map_err(fs_error)?;
                Ok(json!({"entry": entry(&s, &*Names::of(&e).await)}))
            }
            "MakeDir" => {
                let r: PathRequest = connect::unary_request(&headers, body).await?;
                let path = resolve(&home, &r.path)?;
                match e.guest.stat(&path).await {
                    Ok(_) => {
                        return Err(RpcError::new(
                            Code::AlreadyExists,
                            format!("{path} already exists"),
                        ))
                    }
                    Err(err) if err.kind() == Some(space_proto::ErrorKind::NotFound) => {}
                    Err(err) => return Err(fs_error(err)),
                }
                let s = e
                    .guest
                    .mkdir_owned(&path, true, Some((account.uid, account.gid)))
                    .await
                    .map_err(fs_error)?;
                Ok(json!({"entry": entry(&s, &*Names::of(&e).await)}))
            }
            "Move" => {
                let r: MoveRequest = connect::unary_request(&headers, body).await?;
                let (from, to) = (resolve(&home, &r.source)?, resolve(&home, &r.destination)?);
                let s = e.guest.rename(&from, &to).await.map_err(fs_error)?;
                Ok(json!({"entry": entry(&s, &*Names::of(&e).await)}))
            }
            "Remove" => {
                let r: PathRequest = connect::unary_request(&headers, body).await?;
                let path = resolve(&home, &r.path)?;
                // envd removes with RemoveAll: a path that is not there is removed already.
                match e.guest.remove(&path, true).await {
                    Ok(()) => {}
                    Err(err) if err.kind() == Some(space_proto::ErrorKind::NotFound) => {}
                    Err(err) => return Err(fs_error(err)),
                }
                Ok(json!({}))
            }
            "ListDir" => {
                let r: PathRequest = connect::unary_request(&headers, body).await?;
                let path = resolve(&home, &r.path)?;
                let depth = r.depth.unwrap_or(1).clamp(1, MAX_DEPTH);
                let root = e.guest.stat(&path).await.map_err(fs_error)?;
                if root.file_type != FileType::Dir {
                    return Err(RpcError::invalid(format!("{path} is not a directory")));
                }
                let names = Names::of(&e).await;
                // Depth first, each directory's entries in name order, as envd walks.
                let mut out = Vec::new();
                let mut stack: Vec<(String, u32)> = vec![(path, 1)];
                while let Some((dir, level)) = stack.pop() {
                    let mut listed = match e.guest.list(&dir).await {
                        Ok(l) => l,
                        // A directory below that went away meanwhile.
                        Err(err)
                            if dir != root.path
                                && err.kind() == Some(space_proto::ErrorKind::NotFound) =>
                        {
                            continue
                        }
                        Err(err) => return Err(fs_error(err)),
                    };
                    listed.sort_by(|a, b| a.stat.path.cmp(&b.stat.path));
                    // Entries of this directory, each followed by what is under it: the
                    // subdirectories go on the stack in reverse, so the first comes next.
                    let mut below = Vec::new();
                    for d in listed {
                        if out.len() >= MAX_ENTRIES {
                            return Err(RpcError::new(
                                Code::ResourceExhausted,
                                format!("more than {MAX_ENTRIES} entries"),
                            ));
                        }
                        if d.stat.file_type == FileType::Dir && level < depth {
                            below.push(d.stat.path.clone());
                        }
                        out.push((d.stat.path.clone(), entry(&d.stat, &names)));
                    }
                    stack.extend(below.into_iter().rev().map(|p| (p, level + 1)));
                }
                // Pre-order by path, which is how a walk in name order visits them.
                out.sort_by(|a, b| walk_order(&a.0, &b.0));
                let out: Vec<Value> = out.into_iter().map(|(_, v)| v).collect();
                Ok(json!({ "entries": out }))
            }
            "CreateWatcher" => {
                let r: WatchRequest = connect::unary_request(&headers, body).await?;
                let dir = resolve(&home, &r.path)?;
                match e.guest.stat(&dir).await.map_err(fs_error)? {
                    s if s.file_type == FileType::Dir => {}
                    _ => return Err(RpcError::invalid(format!("{dir} is not a directory"))),
                }
                let id = e
                    .guest
                    .create_watcher(&dir, r.recursive)
                    .await
                    .map_err(fs_error)?;
                Ok(
                    json!({"watcherId": WatcherId { guest: id, dir, entries: r.include_entry }.encode()}),
                )
            }
            "GetWatcherEvents" => {
                let r: WatcherRequest = connect::unary_request(&headers, body).await?;
                let w = WatcherId::decode(&r.watcher_id)?;
                let events = e.guest.watcher_events(&w.guest).await.map_err(fs_error)?;
                let names = if w.entries {
                    Some(Names::of(&e).await)
                } else {
                    None
                };
                let mut out = Vec::new();
                for ev in events {
                    let Some(v) = fs_event(&e, &w.dir, &ev, names.as_deref()).await else {
                        continue;
                    };
                    out.push(v);
                }
                Ok(json!({ "events": out }))
            }
            "RemoveWatcher" => {
                let r: WatcherRequest = connect::unary_request(&headers, body).await?;
                let w = WatcherId::decode(&r.watcher_id)?;
                e.guest.remove_watcher(&w.guest).await.map_err(fs_error)?;
                Ok(json!({}))
            }
            other => Err(RpcError::new(
                Code::Unimplemented,
                format!("filesystem.Filesystem has no method {other}"),
            )),
        }
    };
    answer(run.await)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatcherRequest {
    watcher_id: String,
}

/// A polling watcher's id as the client holds it: the guest's watch, the directory (events
/// are named relative to it) and whether entries are wanted; so any replica can answer.
struct WatcherId {
    guest: String,
    dir: String,
    entries: bool,
}

impl WatcherId {
    fn encode(&self) -> String {
        format!(
            "{}.{}.{}",
            self.guest,
            u8::from(self.entries),
            hex::encode(self.dir.as_bytes())
        )
    }

    fn decode(s: &str) -> RpcResult<WatcherId> {
        let bad = || RpcError::new(Code::NotFound, format!("no watcher {s:?}"));
        let mut parts = s.splitn(3, '.');
        let (Some(guest), Some(flag), Some(dir)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let dir = hex::decode(dir)
            .ok()
            .and_then(|d| String::from_utf8(d).ok())
            .ok_or_else(bad)?;
        Ok(WatcherId {
            guest: guest.to_owned(),
            dir,
            entries: flag == "1",
        })
    }
}

/// envd's `FilesystemEvent` of a guest event under `dir` (`None`: not reported).
async fn fs_event(
    e: &Envd,
    dir: &str,
    ev: &space_proto::WatchEvent,
    names: Option<&Names>,
) -> Option<Value> {
    let kind = event_type(ev.kind)?;
    let prefix = format!("{}/", dir.trim_end_matches('/'));
    let name = ev.path.strip_prefix(&prefix).unwrap_or(&ev.path).to_owned();
    let mut v = json!({"name": name, "type": kind});
    if let Some(names) = names {
        if let Ok(s) = e.guest.stat(&ev.path).await {
            v["entry"] = entry(&s, names);
        }
    }
    Some(v)
}

/// envd's event type of a guest watch event (`None`: not reported). envd's watcher reports
/// writes, not the close after them, so a new file's upload is three events there (create,
/// chmod, write) and here.
fn event_type(k: WatchEventKind) -> Option<&'static str> {
    Some(match k {
        WatchEventKind::Created | WatchEventKind::MovedTo => "EVENT_TYPE_CREATE",
        WatchEventKind::Modified => "EVENT_TYPE_WRITE",
        WatchEventKind::Removed => "EVENT_TYPE_REMOVE",
        WatchEventKind::MovedFrom => "EVENT_TYPE_RENAME",
        WatchEventKind::Attrib => "EVENT_TYPE_CHMOD",
        _ => return None,
    })
}

/// `WatchDir` (server stream): `start`, then events named relative to the directory.
async fn watch(e: Envd, headers: HeaderMap, body: Body) -> Response {
    let req: WatchRequest = match connect::stream_request(&headers, body).await {
        Ok(r) => r,
        Err(err) => return err.stream(),
    };
    let home = match e.account().await {
        Ok(a) => a.home,
        Err(err) => return err.stream(),
    };
    let dir = match resolve(&home, &req.path) {
        Ok(d) => d,
        Err(err) => return err.stream(),
    };
    match e.guest.stat(&dir).await {
        Ok(s) if s.file_type == FileType::Dir => {}
        Ok(_) => return RpcError::invalid(format!("{dir} is not a directory")).stream(),
        Err(err) => return fs_error(err).stream(),
    }
    let mut stream = match e.guest.watch(&dir, req.recursive).await {
        Ok(s) => s,
        Err(err) => return fs_error(err).stream(),
    };
    let (tx, response) = StreamTx::open();
    let keepalive = std::time::Duration::from_secs(
        headers
            .get("keepalive-ping-interval")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(90)
            .max(1),
    );
    tokio::spawn(async move {
        if !tx.send(&json!({"start": {}})).await {
            return;
        }
        let names = if req.include_entry {
            Some(Names::of(&e).await)
        } else {
            None
        };
        // The guest's events are read by their own task, so a keepalive never cuts one.
        let (events, mut rx) = tokio::sync::mpsc::channel(16);
        let reader = tokio::spawn(async move {
            loop {
                let next = stream.next().await;
                let last = !matches!(next, Ok(Some(_)));
                if events.send(next).await.is_err() || last {
                    return;
                }
            }
        });
        loop {
            let next = tokio::select! {
                n = rx.recv() => n,
                _ = tokio::time::sleep(keepalive) => {
                    if !tx.send(&json!({"keepalive": {}})).await { break; }
                    continue;
                }
                _ = tx.closed() => break,
            };
            match next {
                Some(Ok(Some(ev))) => {
                    let Some(v) = fs_event(&e, &dir, &ev, names.as_deref()).await else {
                        continue;
                    };
                    if !tx.send(&json!({"filesystem": v})).await {
                        break;
                    }
                }
                Some(Ok(None)) | None => {
                    tx.end(None).await;
                    break;
                }
                Some(Err(err)) => {
                    tx.end(Some(fs_error(err))).await;
                    break;
                }
            }
        }
        reader.abort();
    });
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_visits_a_directory_then_what_is_in_it_in_name_order() {
        let mut paths = vec!["/r/b", "/r/a.txt", "/r/a/z", "/r/a", "/r/a/b/c", "/r/a/b"];
        paths.sort_by(|a, b| walk_order(a, b));
        assert_eq!(
            paths,
            ["/r/a", "/r/a/b", "/r/a/b/c", "/r/a/z", "/r/a.txt", "/r/b"]
        );
    }

    #[test]
    fn paths_resolve_under_the_home() {
        let h = "/home/user";
        assert_eq!(resolve(h, "a.txt").unwrap(), "/home/user/a.txt");
        assert_eq!(resolve(h, "~").unwrap(), "/home/user");
        assert_eq!(resolve(h, "~/x/../y").unwrap(), "/home/user/y");
        assert_eq!(resolve(h, "/tmp//a/./b").unwrap(), "/tmp/a/b");
        assert_eq!(resolve(h, "/../../etc").unwrap(), "/etc");
        assert!(resolve(h, "").is_err());
        assert!(resolve(h, "a\0b").is_err());
    }

    #[test]
    fn entries_read_as_envd_writes_them() {
        let s = FileStat {
            path: "/home/user/d".into(),
            file_type: FileType::Dir,
            size: 4096,
            mode: 0o755,
            uid: 1000,
            gid: 1000,
            mtime_unix_ns: 1_500_000_000_123_456_789,
            symlink_target: None,
            xattrs: [
                ("user.e2b.owner-team".to_owned(), "infra".to_owned()),
                ("user.other".to_owned(), "not metadata".to_owned()),
            ]
            .into(),
        };
        let mut names = Names::default();
        names.users.insert(1000, "user".into());
        let v = entry(&s, &names);
        assert_eq!(v["name"], "d");
        assert_eq!(v["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(v["permissions"], "drwxr-xr-x");
        assert_eq!(v["size"], "4096");
        assert_eq!(v["owner"], "user");
        assert_eq!(v["group"], "1000");
        assert_eq!(v["mode"], 0o755);
        assert_eq!(v["modifiedTime"], "2017-07-14T02:40:00.123456789Z");
        assert_eq!(v["metadata"], json!({"owner-team": "infra"}));
    }
}
