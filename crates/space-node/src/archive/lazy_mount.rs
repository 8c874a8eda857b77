//! A file of a lazy restore ([`space_archive::lazy`]) put where the VM opens it: a FUSE file
//! system whose root is that one file, mounted over its path in the sandbox directory. QEMU
//! maps the RAM file shared and reads and writes the disk through it as through any file.
//! What has arrived is served on the session's threads; a read or write of what has not
//! waits for it on a blocking thread, never the session's. The jail binds the sandbox directory with its mounts, so the VM sees the
//! mount at the same path.
//!
//! Everything arriving here comes from the VMM, which the guest may have taken over: sizes
//! never change, ranges outside the file are refused, and nothing but reads, writes and the
//! owner and mode (the jail's `chown`) is served.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fuser::{
    BsdFileFlags, Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo,
    LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyOpen, ReplyWrite,
    Request, SessionACL, TimeOrNow, WriteFlags,
};
use space_archive::lazy::{LazyError, LazyFiles};

use crate::error::{NodeError, Result};

/// How long the kernel may keep the file's attributes (they change only by `setattr`, which
/// the kernel sees).
const ATTR_TTL: Duration = Duration::from_secs(3600);

/// Threads reading the kernel's requests of one mounted file.
const SESSION_THREADS: usize = 2;

struct Owner {
    uid: u32,
    gid: u32,
    mode: u16,
}

struct LazyFs {
    files: LazyFiles,
    fi: usize,
    size: u64,
    owner: Mutex<Owner>,
    made: SystemTime,
    rt: tokio::runtime::Handle,
}

impl LazyFs {
    fn attr(&self) -> FileAttr {
        let o = self.owner.lock().unwrap_or_else(|e| e.into_inner());
        FileAttr {
            ino: INodeNo(1),
            size: self.size,
            blocks: self.size.div_ceil(512),
            atime: self.made,
            mtime: self.made,
            ctime: self.made,
            crtime: self.made,
            kind: FileType::RegularFile,
            perm: o.mode,
            nlink: 1,
            uid: o.uid,
            gid: o.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

fn errno(e: &LazyError) -> Errno {
    match e {
        LazyError::OutOfRange { .. } => Errno::EINVAL,
        LazyError::NotLazy(_) | LazyError::Failed(_) | LazyError::Io(_) => Errno::EIO,
    }
}

impl Filesystem for LazyFs {
    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino != INodeNo(1) {
            return reply.error(Errno::ENOENT);
        }
        reply.attr(&ATTR_TTL, &self.attr());
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino != INodeNo(1) {
            return reply.error(Errno::ENOENT);
        }
        if size.is_some_and(|s| s != self.size) {
            return reply.error(Errno::EPERM);
        }
        {
            let mut o = self.owner.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(m) = mode {
                o.mode = (m & 0o7777) as u16;
            }
            if let Some(u) = uid {
                o.uid = u;
            }
            if let Some(g) = gid {
                o.gid = g;
            }
        }
        reply.attr(&ATTR_TTL, &self.attr());
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != INodeNo(1) {
            return reply.error(Errno::ENOENT);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = (size as u64).min(self.size.saturating_sub(offset)) as usize;
        let mut buf = vec![0u8; len];
        // What is here is served on this thread; only a wait for the store moves to a
        // blocking thread, so the session keeps serving meanwhile.
        match self.files.try_read_at(self.fi, offset, &mut buf) {
            Some(Ok(())) => return reply.data(&buf),
            Some(Err(e)) => return reply.error(errno(&e)),
            None => {}
        }
        tracing::trace!(fi = self.fi, offset, size, "read waits for the store");
        let (files, fi) = (self.files.clone(), self.fi);
        self.rt
            .spawn_blocking(move || match files.read_at(fi, offset, &mut buf) {
                Ok(()) => reply.data(&buf),
                Err(e) => reply.error(errno(&e)),
            });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.files.try_write_at(self.fi, offset, data) {
            Some(Ok(())) => return reply.written(data.len() as u32),
            Some(Err(e)) => return reply.error(errno(&e)),
            None => {}
        }
        tracing::trace!(
            fi = self.fi,
            offset,
            len = data.len(),
            "write waits for the store"
        );
        let (files, fi, data) = (self.files.clone(), self.fi, data.to_vec());
        self.rt
            .spawn_blocking(move || match files.write_at(fi, offset, &data) {
                Ok(()) => reply.written(data.len() as u32),
                Err(e) => reply.error(errno(&e)),
            });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Written through to the local file already; the VM's files need not be durable.
        reply.ok();
    }
}

/// One lazy file mounted over its path. Unmount it only once the VM is gone (the VM's own
/// mount namespace holds the mount until then).
pub(crate) struct LazyMount {
    path: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl LazyMount {
    /// Mounts file `fi` of `files` over `path` (made as an empty file if missing), served
    /// with blocking threads of `rt`.
    pub(crate) fn mount(
        path: &Path,
        files: &LazyFiles,
        fi: usize,
        rt: tokio::runtime::Handle,
    ) -> Result<LazyMount> {
        if !path.exists() {
            std::fs::File::create(path).map_err(NodeError::io("creating", path))?;
        }
        let fs = LazyFs {
            files: files.clone(),
            fi,
            size: files.size(fi),
            owner: Mutex::new(Owner {
                uid: 0,
                gid: 0,
                mode: 0o600,
            }),
            made: SystemTime::now(),
            rt,
        };
        let mut cfg = Config::default();
        cfg.mount_options = vec![
            MountOption::FSName("space-lazy".into()),
            MountOption::Subtype("space-lazy".into()),
            MountOption::DefaultPermissions,
            MountOption::NoSuid,
            MountOption::NoDev,
            MountOption::NoExec,
        ];
        // The VM runs as another user: the kernel checks the owner and mode served above.
        cfg.acl = SessionACL::All;
        // The RAM file's faults and the disk's requests come from several vCPU and I/O
        // threads at once.
        cfg.n_threads = Some(SESSION_THREADS);
        cfg.clone_fd = true;
        let session = fuser::Session::new(fs, path, &cfg)
            .map_err(NodeError::io("mounting a lazy file on", path))?;
        let session = session
            .spawn()
            .map_err(NodeError::io("serving a lazy file on", path))?;
        Ok(LazyMount {
            path: path.to_owned(),
            session: Some(session),
        })
    }

    /// Unmounts (the file under the mount point is what is left). The session ends with the
    /// connection, once the VM's mount namespace is gone too.
    pub(crate) fn unmount(mut self) {
        self.unmount_inner();
    }

    fn unmount_inner(&mut self) {
        if let Some(session) = self.session.take() {
            if let Err(e) = detach(&self.path) {
                if e.raw_os_error() != Some(libc::EINVAL) {
                    tracing::warn!(path = %self.path.display(), error = %e, "unmounting a lazy file");
                }
            }
            // Not joined: its thread ends when the kernel ends the connection.
            drop(session);
        }
    }
}

impl Drop for LazyMount {
    fn drop(&mut self) {
        self.unmount_inner();
    }
}

/// Detaches whatever is mounted on `path` (a lazy file left by a node that died).
pub(crate) fn detach(path: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call; umount2 only reads it.
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The lazy mounts of one restore, and the files behind them.
pub(crate) struct LazyRestore {
    pub(crate) files: LazyFiles,
    pub(crate) mounts: Vec<LazyMount>,
}

impl LazyRestore {
    /// Ends it: waiters get an error, nothing more is fetched, every file is unmounted (once
    /// the VM is gone).
    pub(crate) fn end(self, why: &str) {
        self.files.fail(why);
        for m in self.mounts {
            m.unmount();
        }
    }
}
