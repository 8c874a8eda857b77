//! The volume protocol: what a guest's file system of a mounted volume asks the host, over the
//! guest's uplink (the `space.egress` channel, `docs/volumes.md`).
//!
//! The guest serves FUSE for each mount and keeps the kernel's inode numbers, open files and
//! directory handles itself; every request it sends the host names a path relative to the
//! volume's root, so the host keeps no state between requests and a sandbox may be suspended,
//! restored elsewhere or forked between any two of them.
//!
//! A request is `POST /v1/volumes/{mount}` (`mount` is the index of the mount in the sandbox's
//! list) with a body of [`encode`]d [`VolumeRequest`] and, for a write, the bytes; the answer
//! is `200` with an encoded [`VolumeReply`] and, for a read, the bytes. Any other status is a
//! fault of the channel (no such mount, a body that does not parse), not of the file system.

use serde::{Deserialize, Serialize};

/// The route prefix of volume requests on the uplink.
pub const VOLUMES_PREFIX: &str = "/v1/volumes/";
/// The most bytes one read or write moves (the guest asks FUSE for writes of at most this).
pub const MAX_IO: u32 = 1 << 20;
/// The most entries one readdir answers.
pub const MAX_ENTRIES: u32 = 512;
/// The longest path a request may name, bytes.
pub const MAX_PATH: usize = 4096;
/// The longest name of one path component, bytes.
pub const MAX_NAME: usize = 255;
/// The longest JSON part of a request or reply.
pub const MAX_HEADER: usize = 256 << 10;

/// `POST /v1/volumes/mount` (host to guest, on the control channel): mount volume `index` of the sandbox at `path`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountRequest {
    pub index: u32,
    pub path: String,
    #[serde(default)]
    pub read_only: bool,
    /// Shown as the file system's source in `/proc/mounts`.
    pub name: String,
}

/// `POST /v1/volumes/quiesce` (host to guest): shut the gate (`hold`) or open it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuiesceRequest {
    pub hold: bool,
}

/// Answer of both: requests under way now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumesState {
    pub mounts: u32,
    pub in_flight: u32,
}

/// The path of mount `index`'s requests.
pub fn volume_path(index: u32) -> String {
    format!("{VOLUMES_PREFIX}{index}")
}

/// What the host does. Paths are relative to the volume's root (`""` is the root; components
/// are separated by `/`, and none is empty, `.` or `..`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum VolumeRequest {
    /// The entry at `path`, not following a symlink.
    Stat { path: String },
    /// Changes what is given; answers the new attributes.
    SetAttr {
        path: String,
        #[serde(default)]
        mode: Option<u32>,
        #[serde(default)]
        uid: Option<u32>,
        #[serde(default)]
        gid: Option<u32>,
        #[serde(default)]
        size: Option<u64>,
        /// Nanoseconds since the epoch; `-1` is now.
        #[serde(default)]
        atime_ns: Option<i64>,
        #[serde(default)]
        mtime_ns: Option<i64>,
    },
    /// Up to [`MAX_ENTRIES`] entries of the directory, by name order, after `after` (a name
    /// the previous answer ended with; `None` from the start).
    ReadDir {
        path: String,
        #[serde(default)]
        after: Option<String>,
    },
    /// `size` bytes (at most [`MAX_IO`]) from `offset`; fewer at the end of the file.
    Read {
        path: String,
        offset: u64,
        size: u32,
    },
    /// The request's bytes at `offset` (the file must exist).
    Write { path: String, offset: u64 },
    /// A regular file, `mode` (permission bits) for `uid`:`gid`; with `exclusive`, an
    /// existing one is `EEXIST`, else it is kept (and truncated with `truncate`).
    Create {
        path: String,
        mode: u32,
        uid: u32,
        gid: u32,
        #[serde(default)]
        exclusive: bool,
        #[serde(default)]
        truncate: bool,
    },
    /// A directory.
    MkDir {
        path: String,
        mode: u32,
        uid: u32,
        gid: u32,
    },
    /// Removes a file or symlink.
    Unlink { path: String },
    /// Removes an empty directory.
    RmDir { path: String },
    /// Moves `from` to `to`; `noreplace`: an existing `to` is `EEXIST`; `exchange`: swaps them.
    Rename {
        from: String,
        to: String,
        #[serde(default)]
        noreplace: bool,
        #[serde(default)]
        exchange: bool,
    },
    /// A symlink at `path` holding `target` (kept as text; the host never follows it).
    Symlink {
        path: String,
        target: String,
        uid: u32,
        gid: u32,
    },
    /// A symlink's text.
    ReadLink { path: String },
    /// A hard link `to` of the file `from`.
    Link { from: String, to: String },
    /// Flushes the file's data to the host's disk.
    Fsync { path: String },
    /// The volume's size and use.
    StatFs,
}

impl VolumeRequest {
    /// Whether the request changes the volume (refused on a read-only mount).
    pub fn writes(&self) -> bool {
        !matches!(
            self,
            VolumeRequest::Stat { .. }
                | VolumeRequest::ReadDir { .. }
                | VolumeRequest::Read { .. }
                | VolumeRequest::ReadLink { .. }
                | VolumeRequest::Fsync { .. }
                | VolumeRequest::StatFs
        )
    }
}

/// What kind of entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// Anything else (the host never makes one; listed so that nothing is hidden).
    Other,
}

/// An entry's attributes, as `lstat` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub kind: EntryKind,
    /// Permission bits (`0o7777` at most).
    pub mode: u32,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    /// Nanoseconds since the epoch.
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    /// The host's inode number (stable while the volume stays on its node).
    pub ino: u64,
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    pub attr: Attr,
}

/// The size and use of a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeStat {
    /// Its size, bytes.
    pub size_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
    /// Entries (files, directories, links) in it.
    pub entries: u64,
}

/// The host's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeReply {
    /// The operation failed with this errno (Linux numbering).
    Errno(i32),
    /// Done; nothing to say.
    Done,
    /// The entry's attributes after the operation.
    Attr(Attr),
    /// Entries, and whether more follow.
    Entries { entries: Vec<Entry>, more: bool },
    /// Bytes follow the reply (a read); this many.
    Data(u32),
    /// Bytes a write wrote, and the file's attributes after it.
    Written { written: u32, attr: Attr },
    /// A symlink's text.
    Target(String),
    /// Size and use.
    StatFs(VolumeStat),
}

/// Why a body did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("volume message: {0}")]
pub struct DecodeError(pub String);

/// `header` as JSON after its length (4 bytes, big-endian), then `data`.
pub fn encode<T: Serialize>(header: &T, data: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(header).expect("volume messages serialize");
    let mut out = Vec::with_capacity(4 + json.len() + data.len());
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(data);
    out
}

/// The inverse of [`encode`]: the header and the bytes after it.
pub fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<(T, &[u8]), DecodeError> {
    let len: [u8; 4] = body
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| DecodeError("shorter than its length prefix".into()))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_HEADER {
        return Err(DecodeError(format!("a header of {len} bytes")));
    }
    let json = body
        .get(4..4 + len)
        .ok_or_else(|| DecodeError("shorter than its header".into()))?;
    let header = serde_json::from_slice(json).map_err(|e| DecodeError(e.to_string()))?;
    Ok((header, &body[4 + len..]))
}

/// Checks a relative volume path: `""` or `/`-separated names, none empty, `.` or `..`, none
/// longer than [`MAX_NAME`], no NUL, at most [`MAX_PATH`] bytes in all.
pub fn check_path(path: &str) -> Result<(), &'static str> {
    if path.len() > MAX_PATH {
        return Err("path too long");
    }
    if path.is_empty() {
        return Ok(());
    }
    for name in path.split('/') {
        check_name(name)?;
    }
    Ok(())
}

/// Checks one path component.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    match name {
        "" => Err("empty path component"),
        "." | ".." => Err("`.` and `..` are not allowed"),
        n if n.len() > MAX_NAME => Err("name too long"),
        n if n.contains('\0') => Err("NUL in name"),
        n if n.contains('/') => Err("`/` in name"),
        _ => Ok(()),
    }
}

/// Checks a mount point: absolute, its names as [`check_path`] wants them (one trailing `/`
/// allowed), not `/` and not under `/proc`, `/sys`, `/dev` or `/run`.
pub fn check_mount_path(path: &str) -> Result<(), String> {
    let rel = path
        .strip_prefix('/')
        .ok_or_else(|| format!("mount path {path:?} is not absolute"))?;
    let rel = rel.strip_suffix('/').unwrap_or(rel);
    check_path(rel).map_err(|e| format!("mount path {path:?}: {e}"))?;
    let first = rel.split('/').next().unwrap_or("");
    if rel.is_empty() || ["proc", "sys", "dev", "run"].contains(&first) {
        return Err(format!("{path:?} cannot be a mount point"));
    }
    Ok(())
}

/// `parent` joined with `name` (both already checked).
pub fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip() {
        let req = VolumeRequest::Write {
            path: "a/b".into(),
            offset: 7,
        };
        let body = encode(&req, b"bytes");
        let (back, data): (VolumeRequest, &[u8]) = decode(&body).unwrap();
        assert_eq!(back, req);
        assert_eq!(data, b"bytes");
        assert!(back.writes());
        assert!(!VolumeRequest::StatFs.writes());
        let json = serde_json::to_value(VolumeReply::Errno(2)).unwrap();
        assert_eq!(json, serde_json::json!({"errno": 2}));
        assert!(decode::<VolumeRequest>(&[0, 0]).is_err());
        assert!(decode::<VolumeRequest>(&[0, 0, 0, 9, b'{']).is_err());
        assert!(decode::<VolumeRequest>(&[0xff, 0, 0, 0]).is_err());
    }

    #[test]
    fn paths() {
        for ok in ["", "a", "a/b.txt", "x y/é"] {
            check_path(ok).unwrap();
        }
        for bad in ["/a", "a/", "a//b", "..", "a/../b", ".", "a/./b", "a\0b"] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
        assert!(check_path(&"a/".repeat(2049)).is_err());
        assert!(check_name(&"n".repeat(256)).is_err());
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a/b");
    }
}
