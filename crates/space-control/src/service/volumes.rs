//! Volumes (`docs/volumes.md`): a tenant's named file systems, made, listed and deleted here,
//! mounted by creates ([`mounts`]), and read and written without a sandbox (the file API on a
//! volume, over [`NodeApi::volume_call`]). Each call scopes the name to the caller's tenant
//! (another tenant's volume is `volume_not_found`) and audits what changes.

use axum::http::StatusCode;
use rand::RngCore;
use space_api as api;
use space_node_api::{Blob, NodeApi, VolumeMount};
use space_proto::volume::{check_path, join, Attr, EntryKind, VolumeReply, VolumeRequest, MAX_IO};
use space_proto::{DirEntry, FileStat, FileType};

use super::Shared;
use crate::error::{ApiError, ApiResult};
use crate::store::{Principal, TenantName, VolumeRow};

/// A volume's size when the create names none: 10 GiB.
pub const DEFAULT_VOLUME_MIB: u64 = 10_240;
/// The largest volume: 16 TiB.
pub const MAX_VOLUME_MIB: u64 = 16 << 20;
/// Who owns what the file API makes: the stock images' `user` (1000:1000).
const API_OWNER: (u32, u32) = (1000, 1000);

/// A volume name: 1 to 64 of letters, digits, `-` and `_` (what E2B takes).
pub fn check_name(name: &str) -> ApiResult<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "volume name {name:?}: 1 to 64 letters, digits, - and _"
        )))
    }
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "volume_not_found",
        format!("no volume {name}"),
    )
}

/// Volume `id`'s content token (E2B's volume content API takes it as a bearer token): a MAC
/// of the id under the deployment's vault key, so every replica makes and checks it without
/// storing it, and it ends with the volume.
pub fn token(st: &Shared, id: &str) -> String {
    format!(
        "spvt_{}",
        hex::encode(st.vault.mac("volume content token", id.as_bytes()))
    )
}

/// Whether `presented` is volume `id`'s content token (compared in constant time).
pub fn token_matches(st: &Shared, id: &str, presented: &str) -> bool {
    let want = token(st, id);
    want.len() == presented.len()
        && want
            .bytes()
            .zip(presented.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// The answer's view of a volume, its use from its node.
async fn view(st: &Shared, row: &VolumeRow) -> api::Volume {
    let info = st.node.volume_info(&row.id).await.ok();
    api::Volume {
        id: row.id.clone(),
        name: row.name.clone(),
        size_bytes: row.size_bytes,
        used_bytes: info.as_ref().map(|i| i.used_bytes),
        synced_unix_ms: info.and_then(|i| i.synced_unix_ms),
        created_unix_ms: row.created_unix_ms,
    }
}

/// The caller's volume `name`.
pub async fn row(st: &Shared, tenant: &TenantName, name: &str) -> ApiResult<VolumeRow> {
    check_name(name)?;
    st.store
        .volume(tenant, name)
        .await?
        .ok_or_else(|| not_found(name))
}

/// Makes a volume of `size_mib` (default [`DEFAULT_VOLUME_MIB`]) for the caller's tenant.
pub async fn create(
    st: &Shared,
    who: &Principal,
    name: &str,
    size_mib: Option<u64>,
) -> ApiResult<api::Volume> {
    let result = create_inner(st, &who.tenant, name, size_mib).await;
    st.audit(
        who,
        None,
        "volume.create",
        result.as_ref().err(),
        Some(format!("volume {name}")),
    )
    .await;
    result
}

async fn create_inner(
    st: &Shared,
    tenant: &TenantName,
    name: &str,
    size_mib: Option<u64>,
) -> ApiResult<api::Volume> {
    check_name(name)?;
    let size_mib = size_mib.unwrap_or(DEFAULT_VOLUME_MIB);
    if size_mib == 0 || size_mib > MAX_VOLUME_MIB {
        return Err(ApiError::invalid(format!(
            "size_mib must be 1 to {MAX_VOLUME_MIB}"
        )));
    }
    let quota = st
        .store
        .tenant(tenant)
        .await?
        .map(|t| t.quotas.max_volume_mib)
        .unwrap_or(0);
    let have = st.store.volume_bytes(tenant).await? >> 20;
    if have + size_mib > quota {
        return Err(ApiError::quota(format!(
            "the tenant's volumes would be {} MiB; its quota is {quota} MiB",
            have + size_mib
        )));
    }
    let mut raw = [0u8; 8];
    rand::rngs::OsRng.fill_bytes(&mut raw);
    let id = format!("vol-{}", hex::encode(raw));
    let row = VolumeRow {
        id: id.clone(),
        tenant: tenant.clone(),
        name: name.to_owned(),
        size_bytes: size_mib << 20,
        node: None,
        created_unix_ms: space_node_api::sandbox::now_ms(),
    };
    st.store.insert_volume(&row).await.map_err(|e| match e {
        crate::store::StoreError::Conflict(m) => {
            ApiError::new(StatusCode::CONFLICT, "volume_exists", m)
        }
        e => e.into(),
    })?;
    if let Err(e) = st
        .node
        .create_volume(&id, tenant.as_str(), row.size_bytes)
        .await
    {
        let _ = st.store.delete_volume(&id).await;
        return Err(e.into());
    }
    let row = st.store.volume_by_id(&id).await?.unwrap_or(row);
    Ok(view(st, &row).await)
}

/// The caller's volumes, by name.
pub async fn list(st: &Shared, who: &Principal) -> ApiResult<Vec<api::Volume>> {
    let mut out = Vec::new();
    for row in st.store.volumes(&who.tenant).await? {
        out.push(view(st, &row).await);
    }
    Ok(out)
}

/// The caller's volume `name`.
pub async fn get(st: &Shared, who: &Principal, name: &str) -> ApiResult<api::Volume> {
    let row = row(st, &who.tenant, name).await?;
    Ok(view(st, &row).await)
}

/// Deletes the caller's volume `name` and its files; refused while a sandbox mounts it.
pub async fn delete(st: &Shared, who: &Principal, name: &str) -> ApiResult<()> {
    let result = async {
        let row = row(st, &who.tenant, name).await?;
        st.node.delete_volume(&row.id).await?;
        st.store.delete_volume(&row.id).await?;
        Ok(())
    }
    .await;
    st.audit(
        who,
        None,
        "volume.delete",
        result.as_ref().err(),
        Some(format!("volume {name}")),
    )
    .await;
    result
}

/// The mounts of a create: each of the tenant's volumes by name, at its path.
pub async fn mounts(
    st: &Shared,
    tenant: &TenantName,
    wanted: &[api::VolumeMountSpec],
) -> ApiResult<Vec<VolumeMount>> {
    let mut out: Vec<VolumeMount> = Vec::new();
    for w in wanted {
        let row = row(st, tenant, &w.name).await?;
        space_proto::volume::check_mount_path(&w.path).map_err(ApiError::invalid)?;
        // One volume once, one path once (what a schema cannot say of a list).
        let path = w.path.trim_end_matches('/');
        if out
            .iter()
            .any(|m| m.volume == row.id || m.path.trim_end_matches('/') == path)
        {
            return Err(ApiError::conflict(format!(
                "volume {} or path {} is mounted twice",
                row.name, w.path
            )));
        }
        out.push(VolumeMount {
            volume: row.id,
            name: row.name,
            path: w.path.clone(),
            read_only: w.read_only,
        });
    }
    Ok(out)
}

// ---- the file API -----------------------------------------------------------------------

/// A path of the file API (`/a/b`, or `a/b`) as the volume names it (`a/b`; `""` the root).
pub fn rel_path(path: &str) -> ApiResult<String> {
    let rel = path.trim_start_matches('/');
    let rel = rel.strip_suffix('/').unwrap_or(rel);
    check_path(rel).map_err(|e| ApiError::invalid(format!("path {path:?}: {e}")))?;
    Ok(rel.to_owned())
}

/// One call on a volume; an errno becomes the API's error for it.
async fn call(
    st: &Shared,
    row: &VolumeRow,
    req: VolumeRequest,
    data: Vec<u8>,
    path: &str,
) -> ApiResult<(VolumeReply, Vec<u8>)> {
    let a = st.node.volume_call(&row.id, req, Blob(data)).await?;
    match a.reply {
        VolumeReply::Errno(e) => Err(errno_error(e, path)),
        r => Ok((r, a.data.0)),
    }
}

/// The API's error for an errno of an operation on `path`.
pub fn errno_error(e: i32, path: &str) -> ApiError {
    match e {
        libc::ENOENT => ApiError::new(
            StatusCode::NOT_FOUND,
            "file_not_found",
            format!("no such file or directory: {path}"),
        ),
        libc::EEXIST => ApiError::conflict(format!("{path} exists already")),
        libc::ENOSPC => ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "no_space",
            format!("the volume is full: {path} was not written"),
        ),
        // What the volume holds decides these, not the request's form: conflicts.
        libc::ENOTDIR => ApiError::conflict(format!("a part of {path} is not a directory")),
        libc::EISDIR => ApiError::conflict(format!("{path} is a directory")),
        libc::ENOTEMPTY => ApiError::conflict(format!("{path} is not empty")),
        libc::ELOOP => ApiError::conflict(format!(
            "{path} goes through a symbolic link, which the file API does not follow"
        )),
        libc::EINVAL | libc::EBUSY | libc::EXDEV => {
            ApiError::conflict(format!("the operation does not apply to {path}"))
        }
        e => ApiError::internal(format!("{path}: {}", std::io::Error::from_raw_os_error(e))),
    }
}

fn stat_of(path: &str, a: &Attr, target: Option<String>) -> FileStat {
    FileStat {
        path: path.to_owned(),
        file_type: match a.kind {
            EntryKind::File => FileType::File,
            EntryKind::Dir => FileType::Dir,
            EntryKind::Symlink => FileType::Symlink,
            EntryKind::Other => FileType::Other,
        },
        size: a.size,
        mode: a.mode,
        uid: a.uid,
        gid: a.gid,
        mtime_unix_ns: a.mtime_ns,
        symlink_target: target,
        xattrs: Default::default(),
    }
}

fn shown(rel: &str) -> String {
    format!("/{rel}")
}

/// `path`'s attributes and, for a symlink, its text.
pub async fn attr(st: &Shared, row: &VolumeRow, path: &str) -> ApiResult<(Attr, Option<String>)> {
    let rel = rel_path(path)?;
    let (r, _) = call(
        st,
        row,
        VolumeRequest::Stat { path: rel.clone() },
        Vec::new(),
        path,
    )
    .await?;
    let VolumeReply::Attr(a) = r else {
        return Err(ApiError::internal(
            "the volume answered a stat with something else",
        ));
    };
    let target = if a.kind == EntryKind::Symlink {
        match call(
            st,
            row,
            VolumeRequest::ReadLink { path: rel },
            Vec::new(),
            path,
        )
        .await?
        {
            (VolumeReply::Target(t), _) => Some(t),
            _ => None,
        }
    } else {
        None
    };
    Ok((a, target))
}

/// The entries of directory `path` with their attributes, by name (at most `limit`).
pub async fn entries(
    st: &Shared,
    row: &VolumeRow,
    path: &str,
    limit: usize,
) -> ApiResult<Vec<space_proto::volume::Entry>> {
    let rel = rel_path(path)?;
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let req = VolumeRequest::ReadDir {
            path: rel.clone(),
            after: after.take(),
        };
        let (r, _) = call(st, row, req, Vec::new(), path).await?;
        let VolumeReply::Entries { entries, more } = r else {
            return Err(ApiError::internal(
                "the volume answered a listing with something else",
            ));
        };
        after = entries.last().map(|e| e.name.clone());
        for e in entries {
            out.push(e);
            if out.len() >= limit {
                return Ok(out);
            }
        }
        if !more || after.is_none() {
            return Ok(out);
        }
    }
}

/// What `path` is (a symlink is described, not followed).
pub async fn stat(st: &Shared, row: &VolumeRow, path: &str) -> ApiResult<FileStat> {
    let rel = rel_path(path)?;
    let (a, target) = attr(st, row, &rel).await?;
    Ok(stat_of(&shown(&rel), &a, target))
}

/// The directory `path`'s entries, by name (at most `limit`).
pub async fn list_dir(
    st: &Shared,
    row: &VolumeRow,
    path: &str,
    limit: usize,
) -> ApiResult<Vec<DirEntry>> {
    let rel = rel_path(path)?;
    Ok(entries(st, row, &rel, limit)
        .await?
        .into_iter()
        .map(|e| DirEntry {
            stat: stat_of(&shown(&join(&rel, &e.name)), &e.attr, None),
            name: e.name,
        })
        .collect())
}

/// The whole file at `path` (at most `max` bytes, else `payload_too_large`).
pub async fn read(st: &Shared, row: &VolumeRow, path: &str, max: u64) -> ApiResult<Vec<u8>> {
    let rel = rel_path(path)?;
    if rel.is_empty() {
        return Err(ApiError::conflict("the volume's root is a directory"));
    }
    let mut out = Vec::new();
    loop {
        let req = VolumeRequest::Read {
            path: rel.clone(),
            offset: out.len() as u64,
            size: MAX_IO,
        };
        let (r, data) = call(st, row, req, Vec::new(), path).await?;
        if !matches!(r, VolumeReply::Data(_)) {
            return Err(ApiError::internal(
                "the volume answered a read with something else",
            ));
        }
        let done = data.len() < MAX_IO as usize;
        out.extend_from_slice(&data);
        if out.len() as u64 > max {
            return Err(ApiError::too_large(format!(
                "{path} is over this server's limit of {max} bytes for one read"
            )));
        }
        if done {
            return Ok(out);
        }
    }
}

/// Writes `data` as the file at `path` (replacing one that is there unless `exclusive`; the
/// parents made with `parents`): into a temporary file beside it, renamed over it once whole,
/// so a failed write (a full volume) leaves the old file.
#[allow(clippy::too_many_arguments)]
pub async fn write(
    st: &Shared,
    row: &VolumeRow,
    path: &str,
    data: &[u8],
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
    exclusive: bool,
    parents: bool,
) -> ApiResult<FileStat> {
    let rel = rel_path(path)?;
    let Some((parent, name)) = rel
        .rsplit_once('/')
        .or(Some(("", rel.as_str())))
        .filter(|(_, n)| !n.is_empty())
    else {
        return Err(ApiError::conflict("the volume's root is a directory"));
    };
    if parents && !parent.is_empty() {
        mkdir(st, row, parent, true, None, owner).await?;
    }
    if exclusive {
        if let Ok(s) = stat(st, row, &rel).await {
            return Err(ApiError::conflict(format!("{} exists already", s.path)));
        }
    }
    let mut tmp = [0u8; 6];
    rand::rngs::OsRng.fill_bytes(&mut tmp);
    let tmp = join(
        parent,
        &format!(".{name}.space-upload-{}", hex::encode(tmp)),
    );
    let (uid, gid) = owner.unwrap_or(API_OWNER);
    let create = VolumeRequest::Create {
        path: tmp.clone(),
        mode: mode.unwrap_or(0o644),
        uid,
        gid,
        exclusive: true,
        truncate: false,
    };
    call(st, row, create, Vec::new(), path).await?;
    let written = async {
        for (k, chunk) in data.chunks(MAX_IO as usize).enumerate() {
            let req = VolumeRequest::Write {
                path: tmp.clone(),
                offset: (k * MAX_IO as usize) as u64,
            };
            call(st, row, req, chunk.to_vec(), path).await?;
        }
        let rename = VolumeRequest::Rename {
            from: tmp.clone(),
            to: rel.clone(),
            noreplace: exclusive,
            exchange: false,
        };
        call(st, row, rename, Vec::new(), path).await
    }
    .await;
    if let Err(e) = written {
        let _ = call(
            st,
            row,
            VolumeRequest::Unlink { path: tmp },
            Vec::new(),
            path,
        )
        .await;
        return Err(e);
    }
    stat(st, row, &rel).await
}

/// Makes the directory `path` (and its parents with `parents`; an existing directory is then
/// fine).
pub async fn mkdir(
    st: &Shared,
    row: &VolumeRow,
    path: &str,
    parents: bool,
    mode: Option<u32>,
    owner: Option<(u32, u32)>,
) -> ApiResult<FileStat> {
    let rel = rel_path(path)?;
    if rel.is_empty() {
        return stat(st, row, "").await;
    }
    let (uid, gid) = owner.unwrap_or(API_OWNER);
    let parts: Vec<&str> = rel.split('/').collect();
    let start = if parents { 1 } else { parts.len() };
    for n in start..=parts.len() {
        let p = parts[..n].join("/");
        let req = VolumeRequest::MkDir {
            path: p.clone(),
            mode: mode.unwrap_or(0o755),
            uid,
            gid,
        };
        match call(st, row, req, Vec::new(), path).await {
            Ok(_) => {}
            Err(e) if parents && e.code == "conflict" => {
                let s = stat(st, row, &p).await?;
                if s.file_type != FileType::Dir {
                    return Err(ApiError::conflict(format!("{} is not a directory", s.path)));
                }
            }
            Err(e) => return Err(e),
        }
    }
    stat(st, row, &rel).await
}

/// Removes `path` (a directory with everything in it).
pub async fn remove(st: &Shared, row: &VolumeRow, path: &str) -> ApiResult<()> {
    let rel = rel_path(path)?;
    if rel.is_empty() {
        return Err(ApiError::conflict("the volume's root cannot be removed"));
    }
    let s = stat(st, row, &rel).await?;
    if s.file_type == FileType::Dir {
        for e in list_dir(st, row, &rel, usize::MAX).await? {
            Box::pin(remove(st, row, &e.stat.path)).await?;
        }
        call(
            st,
            row,
            VolumeRequest::RmDir { path: rel },
            Vec::new(),
            path,
        )
        .await?;
    } else {
        call(
            st,
            row,
            VolumeRequest::Unlink { path: rel },
            Vec::new(),
            path,
        )
        .await?;
    }
    Ok(())
}

/// Moves `from` to `to`.
pub async fn rename(st: &Shared, row: &VolumeRow, from: &str, to: &str) -> ApiResult<FileStat> {
    let (f, t) = (rel_path(from)?, rel_path(to)?);
    if f.is_empty() || t.is_empty() {
        return Err(ApiError::conflict("the volume's root cannot be renamed"));
    }
    let req = VolumeRequest::Rename {
        from: f,
        to: t.clone(),
        noreplace: false,
        exchange: false,
    };
    call(st, row, req, Vec::new(), from).await?;
    stat(st, row, &t).await
}

/// Changes `path`'s mode or owner.
pub async fn set_attr(
    st: &Shared,
    row: &VolumeRow,
    path: &str,
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
) -> ApiResult<FileStat> {
    let rel = rel_path(path)?;
    let req = VolumeRequest::SetAttr {
        path: rel.clone(),
        mode,
        uid,
        gid,
        size: None,
        atime_ns: None,
        mtime_ns: None,
    };
    call(st, row, req, Vec::new(), path).await?;
    stat(st, row, &rel).await
}
