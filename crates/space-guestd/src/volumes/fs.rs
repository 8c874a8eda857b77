//! One mount's FUSE file system: the kernel's inode numbers and the paths they stand for,
//! open files and directory listings, kept here in guest memory; every operation one request
//! to the host ([`Inner::call`]), through the gate before it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
};
use http_body_util::{BodyExt, Full, Limited};
use space_proto::volume::{
    check_name, decode, encode, join, volume_path, Attr, Entry, EntryKind, VolumeReply,
    VolumeRequest, MAX_HEADER, MAX_IO,
};

use super::inodes::Inodes;
use super::Gate;
use crate::egress::{Egress, ReqBody};

/// How long the kernel may trust an answer about an entry or its attributes: not at all, so
/// every path walk asks the host again, and an open sees what another sandbox wrote and
/// closed (close-to-open; `docs/volumes.md` has the cost).
const TTL: Duration = Duration::ZERO;
/// Attempts of a request whose uplink failed (it reconnects after a restore).
const ATTEMPTS: u32 = 5;
/// The most entries one directory listing holds.
const MAX_LISTING: usize = 1 << 20;

pub(super) enum Handle {
    File,
    Dir(Option<Vec<Entry>>),
}

pub(super) struct Inner {
    pub(super) index: u32,
    pub(super) egress: Arc<Egress>,
    pub(super) runtime: tokio::runtime::Handle,
    pub(super) gate: Arc<Gate>,
    pub(super) inodes: Mutex<Inodes>,
    pub(super) handles: Mutex<HashMap<u64, Handle>>,
    pub(super) next_fh: AtomicU64,
}

/// One mount's FUSE file system.
pub(super) struct VolumeFs(pub(super) Arc<Inner>);

fn errno(e: i32) -> Errno {
    if (1..4096).contains(&e) {
        Errno::from_i32(e)
    } else {
        Errno::EIO
    }
}

fn time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH
    }
}

fn file_attr(ino: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime_ns),
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
        crtime: time(a.ctime_ns),
        kind: file_type(a.kind),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn file_type(k: EntryKind) -> FileType {
    match k {
        EntryKind::File | EntryKind::Other => FileType::RegularFile,
        EntryKind::Dir => FileType::Directory,
        EntryKind::Symlink => FileType::Symlink,
    }
}

fn ns_of(t: Option<TimeOrNow>) -> Option<i64> {
    t.map(|t| match t {
        TimeOrNow::Now => -1,
        TimeOrNow::SpecificTime(t) => t
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos().min(i64::MAX as u128) as i64)
            .unwrap_or(0),
    })
}

impl Inner {
    /// One request to the host; a failed uplink is tried again (it reconnects after a
    /// restore).
    async fn call(&self, req: &VolumeRequest, data: &[u8]) -> Result<(VolumeReply, Bytes), Errno> {
        self.gate.enter().await;
        let out = self.send(req, data).await;
        self.gate.leave();
        match out? {
            (VolumeReply::Errno(e), _) => Err(errno(e)),
            ok => Ok(ok),
        }
    }

    async fn send(&self, req: &VolumeRequest, data: &[u8]) -> Result<(VolumeReply, Bytes), Errno> {
        let body = Bytes::from(encode(req, data));
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt.min(4))).await;
            }
            let request = http::Request::post(volume_path(self.index))
                .body(ReqBody::new(
                    Full::new(body.clone()).map_err(|n| match n {}),
                ))
                .map_err(|_| Errno::EIO)?;
            let resp = match self.egress.send(request).await {
                Ok(r) => r,
                Err(e) => {
                    last = Some(e.to_string());
                    continue;
                }
            };
            if resp.status() != http::StatusCode::OK {
                tracing::warn!(status = %resp.status(), "a volume request was refused");
                return Err(Errno::EIO);
            }
            let limit = MAX_IO as usize + MAX_HEADER + 4;
            let bytes = match Limited::new(resp.into_body(), limit).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => {
                    last = Some(e.to_string());
                    continue;
                }
            };
            let (reply, rest) = decode::<VolumeReply>(&bytes).map_err(|_| Errno::EIO)?;
            let offset = bytes.len() - rest.len();
            return Ok((reply, bytes.slice(offset..)));
        }
        tracing::warn!(error = ?last, "a volume request failed");
        Err(Errno::EIO)
    }

    fn path(&self, ino: INodeNo) -> Result<String, Errno> {
        self.inodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .path(ino.0)
            .ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> Result<String, Errno> {
        let name = std::str::from_utf8(name.as_bytes()).map_err(|_| Errno::EINVAL)?;
        check_name(name).map_err(|_| Errno::EINVAL)?;
        Ok(join(&self.path(parent)?, name))
    }

    fn remember(&self, path: &str) -> u64 {
        self.inodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remember(path)
    }

    fn handle(&self, h: Handle) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, h);
        FileHandle(fh)
    }

    /// An entry made or found at `path`, remembered for the kernel.
    async fn entry(&self, path: String, req: VolumeRequest) -> Result<FileAttr, Errno> {
        match self.call(&req, &[]).await? {
            (VolumeReply::Attr(a), _) => Ok(file_attr(self.remember(&path), &a)),
            _ => Err(Errno::EIO),
        }
    }

    async fn listing(&self, path: &str) -> Result<Vec<Entry>, Errno> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let req = VolumeRequest::ReadDir {
                path: path.to_owned(),
                after: after.take(),
            };
            let (entries, more) = match self.call(&req, &[]).await? {
                (VolumeReply::Entries { entries, more }, _) => (entries, more),
                _ => return Err(Errno::EIO),
            };
            after = entries.last().map(|e| e.name.clone());
            all.extend(entries);
            if !more || after.is_none() || all.len() >= MAX_LISTING {
                return Ok(all);
            }
        }
    }
}

macro_rules! run {
    ($fs:expr, $reply:ident, |$inner:ident| $body:expr, |$ok:ident| $done:expr) => {{
        let $inner = $fs.0.clone();
        let rt = $inner.runtime.clone();
        rt.spawn(async move {
            let result = async { $body }.await;
            match result {
                Ok($ok) => $done,
                Err(e) => $reply.error(e),
            }
        });
    }};
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let path = self.0.child(parent, name);
        run!(
            self,
            reply,
            |i| {
                let path = path?;
                i.entry(path.clone(), VolumeRequest::Stat { path }).await
            },
            |a| reply.entry(&TTL, &a, Generation(0))
        );
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.0
            .inodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let path = self.0.path(ino);
        run!(
            self,
            reply,
            |i| {
                match i.call(&VolumeRequest::Stat { path: path? }, &[]).await? {
                    (VolumeReply::Attr(a), _) => Ok(file_attr(ino.0, &a)),
                    _ => Err(Errno::EIO),
                }
            },
            |a| reply.attr(&TTL, &a)
        );
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let path = self.0.path(ino);
        let (atime_ns, mtime_ns) = (ns_of(atime), ns_of(mtime));
        run!(
            self,
            reply,
            |i| {
                let req = VolumeRequest::SetAttr {
                    path: path?,
                    mode: mode.map(|m| m & 0o7777),
                    uid,
                    gid,
                    size,
                    atime_ns,
                    mtime_ns,
                };
                match i.call(&req, &[]).await? {
                    (VolumeReply::Attr(a), _) => Ok(file_attr(ino.0, &a)),
                    _ => Err(Errno::EIO),
                }
            },
            |a| reply.attr(&TTL, &a)
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let path = self.0.path(ino);
        run!(
            self,
            reply,
            |i| {
                match i
                    .call(&VolumeRequest::ReadLink { path: path? }, &[])
                    .await?
                {
                    (VolumeReply::Target(t), _) => Ok(t),
                    _ => Err(Errno::EIO),
                }
            },
            |t| reply.data(t.as_bytes())
        );
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            reply.error(Errno::EPERM);
            return;
        }
        let path = self.0.child(parent, name);
        let (uid, gid) = (req.uid(), req.gid());
        run!(
            self,
            reply,
            |i| {
                let path = path?;
                let q = VolumeRequest::Create {
                    path: path.clone(),
                    mode: mode & !umask & 0o7777,
                    uid,
                    gid,
                    exclusive: true,
                    truncate: false,
                };
                i.entry(path, q).await
            },
            |a| reply.entry(&TTL, &a, Generation(0))
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let path = self.0.child(parent, name);
        let (uid, gid) = (req.uid(), req.gid());
        run!(
            self,
            reply,
            |i| {
                let path = path?;
                let q = VolumeRequest::MkDir {
                    path: path.clone(),
                    mode: mode & !umask & 0o7777,
                    uid,
                    gid,
                };
                i.entry(path, q).await
            },
            |a| reply.entry(&TTL, &a, Generation(0))
        );
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = self.0.child(parent, name);
        run!(
            self,
            reply,
            |i| {
                let path = path?;
                i.call(&VolumeRequest::Unlink { path: path.clone() }, &[])
                    .await?;
                i.inodes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .removed(&path);
                Ok::<(), Errno>(())
            },
            |_x| reply.ok()
        );
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = self.0.child(parent, name);
        run!(
            self,
            reply,
            |i| {
                let path = path?;
                i.call(&VolumeRequest::RmDir { path: path.clone() }, &[])
                    .await?;
                i.inodes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .removed(&path);
                Ok::<(), Errno>(())
            },
            |_x| reply.ok()
        );
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let path = self.0.child(parent, link_name);
        let target = std::str::from_utf8(target.as_os_str().as_bytes()).map(str::to_owned);
        let (uid, gid) = (req.uid(), req.gid());
        run!(
            self,
            reply,
            |i| {
                let path = path?;
                let target = target.map_err(|_| Errno::EINVAL)?;
                let q = VolumeRequest::Symlink {
                    path: path.clone(),
                    target,
                    uid,
                    gid,
                };
                i.entry(path, q).await
            },
            |a| reply.entry(&TTL, &a, Generation(0))
        );
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let from = self.0.child(parent, name);
        let to = self.0.child(newparent, newname);
        let bits = flags.bits();
        run!(
            self,
            reply,
            |i| {
                let (from, to) = (from?, to?);
                let exchange = bits & libc::RENAME_EXCHANGE != 0;
                let q = VolumeRequest::Rename {
                    from: from.clone(),
                    to: to.clone(),
                    noreplace: bits & libc::RENAME_NOREPLACE != 0,
                    exchange,
                };
                i.call(&q, &[]).await?;
                let mut inodes = i.inodes.lock().unwrap_or_else(|e| e.into_inner());
                if exchange {
                    let swap = format!("{from}\u{0}swap");
                    inodes.renamed(&from, &swap);
                    inodes.renamed(&to, &from);
                    inodes.renamed(&swap, &to);
                } else {
                    inodes.renamed(&from, &to);
                }
                Ok::<(), Errno>(())
            },
            |_x| reply.ok()
        );
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let from = self.0.path(ino);
        let to = self.0.child(newparent, newname);
        run!(
            self,
            reply,
            |i| {
                let to = to?;
                let q = VolumeRequest::Link {
                    from: from?,
                    to: to.clone(),
                };
                i.entry(to, q).await
            },
            |a| reply.entry(&TTL, &a, Generation(0))
        );
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        if self.0.path(ino).is_err() {
            reply.error(Errno::ENOENT);
            return;
        }
        // No FOPEN_KEEP_CACHE: every open drops the pages cached of the file, so what another
        // sandbox wrote before it closed is read (close-to-open).
        reply.opened(self.0.handle(Handle::File), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let path = self.0.path(ino);
        run!(
            self,
            reply,
            |i| {
                let q = VolumeRequest::Read {
                    path: path?,
                    offset,
                    size: size.min(MAX_IO),
                };
                match i.call(&q, &[]).await? {
                    (VolumeReply::Data(n), bytes) if n as usize == bytes.len() => Ok(bytes),
                    _ => Err(Errno::EIO),
                }
            },
            |b| reply.data(&b)
        );
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let path = self.0.path(ino);
        let data = data.to_vec();
        run!(
            self,
            reply,
            |i| {
                let q = VolumeRequest::Write {
                    path: path?,
                    offset,
                };
                match i.call(&q, &data).await? {
                    (VolumeReply::Written { written, .. }, _) => Ok(written),
                    _ => Err(Errno::EIO),
                }
            },
            |n| reply.written(n)
        );
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        // Writes reach the host as they are made: nothing is held here.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.0
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let path = self.0.path(ino);
        run!(
            self,
            reply,
            |i| {
                i.call(&VolumeRequest::Fsync { path: path? }, &[]).await?;
                Ok::<(), Errno>(())
            },
            |_x| reply.ok()
        );
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: fuser::OpenFlags, reply: ReplyOpen) {
        if self.0.path(ino).is_err() {
            reply.error(Errno::ENOENT);
            return;
        }
        reply.opened(self.0.handle(Handle::Dir(None)), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let path = self.0.path(ino);
        run!(
            self,
            reply,
            |i| {
                let path = path?;
                let cached = match i
                    .handles
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&fh.0)
                {
                    Some(Handle::Dir(Some(list))) if offset > 0 => Some(list.clone()),
                    Some(Handle::Dir(_)) => None,
                    _ => return Err(Errno::EBADF),
                };
                let list = match cached {
                    Some(l) => l,
                    None => {
                        // A listing is read whole when it starts, and served from here after.
                        let l = i.listing(&path).await?;
                        if let Some(h) = i
                            .handles
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_mut(&fh.0)
                        {
                            *h = Handle::Dir(Some(l.clone()));
                        }
                        l
                    }
                };
                Ok((ino, list))
            },
            |found| {
                let (ino, list) = found;
                let mut all: Vec<(u64, FileType, &str)> = vec![
                    (ino.0, FileType::Directory, "."),
                    (ino.0, FileType::Directory, ".."),
                ];
                all.extend(
                    list.iter()
                        .map(|e| (e.attr.ino.max(2), file_type(e.attr.kind), e.name.as_str())),
                );
                // The offset of each entry is its place in the listing plus one: the kernel asks
                // again from the last one it took.
                for (k, (n, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(n), k as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
        );
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: fuser::OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.0
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        run!(
            self,
            reply,
            |i| {
                match i.call(&VolumeRequest::StatFs, &[]).await? {
                    (VolumeReply::StatFs(s), _) => Ok(s),
                    _ => Err(Errno::EIO),
                }
            },
            |s| {
                let block = 4096u64;
                let blocks = s.size_bytes / block;
                let free = s.size_bytes.saturating_sub(s.used_bytes) / block;
                reply.statfs(
                    blocks,
                    free,
                    free,
                    s.entries + (1 << 20),
                    1 << 20,
                    block as u32,
                    255,
                    block as u32,
                )
            }
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let path = self.0.child(parent, name);
        let (uid, gid) = (req.uid(), req.gid());
        run!(
            self,
            reply,
            |i| {
                let path = path?;
                let q = VolumeRequest::Create {
                    path: path.clone(),
                    mode: mode & !umask & 0o7777,
                    uid,
                    gid,
                    exclusive: flags & libc::O_EXCL != 0,
                    truncate: flags & libc::O_TRUNC != 0,
                };
                let attr = i.entry(path, q).await?;
                Ok::<_, Errno>((attr, i.handle(Handle::File)))
            },
            |made| reply.created(&TTL, &made.0, Generation(0), made.1, FopenFlags::empty())
        );
    }
}
