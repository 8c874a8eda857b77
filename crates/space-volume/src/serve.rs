//! One request of a guest's mount, answered from a [`Tree`].

use nix::errno::Errno;
use space_proto::volume::{VolumeReply, VolumeRequest, MAX_IO};

use crate::tree::{Change, Tree};

/// Answers `req` (with `data`, a write's bytes) on `tree`; a read's bytes come back beside
/// the reply. On a read-only mount every request that changes the volume is `EROFS`.
pub fn serve(
    tree: &Tree,
    read_only: bool,
    req: VolumeRequest,
    data: &[u8],
) -> (VolumeReply, Vec<u8>) {
    if read_only && req.writes() {
        return (VolumeReply::Errno(Errno::EROFS as i32), Vec::new());
    }
    match apply(tree, req, data) {
        Ok(out) => out,
        Err(e) => (VolumeReply::Errno(e as i32), Vec::new()),
    }
}

fn apply(tree: &Tree, req: VolumeRequest, data: &[u8]) -> Result<(VolumeReply, Vec<u8>), Errno> {
    use VolumeReply as R;
    use VolumeRequest as Q;
    let none = Vec::new;
    Ok(match req {
        Q::Stat { path } => (R::Attr(tree.stat(&path)?), none()),
        Q::SetAttr {
            path,
            mode,
            uid,
            gid,
            size,
            atime_ns,
            mtime_ns,
        } => {
            let change = Change {
                mode,
                uid,
                gid,
                size,
                atime_ns,
                mtime_ns,
            };
            (R::Attr(tree.set_attr(&path, change)?), none())
        }
        Q::ReadDir { path, after } => {
            let (entries, more) = tree.read_dir(&path, after.as_deref())?;
            (R::Entries { entries, more }, none())
        }
        Q::Read { path, offset, size } => {
            let bytes = tree.read(&path, offset, size.min(MAX_IO))?;
            (R::Data(bytes.len() as u32), bytes)
        }
        Q::Write { path, offset } => {
            let attr = tree.write(&path, offset, data)?;
            (
                R::Written {
                    written: data.len() as u32,
                    attr,
                },
                none(),
            )
        }
        Q::Create {
            path,
            mode,
            uid,
            gid,
            exclusive,
            truncate,
        } => (
            R::Attr(tree.create(&path, mode, (uid, gid), exclusive, truncate)?),
            none(),
        ),
        Q::MkDir {
            path,
            mode,
            uid,
            gid,
        } => (R::Attr(tree.mkdir(&path, mode, (uid, gid))?), none()),
        Q::Unlink { path } => {
            tree.unlink(&path)?;
            (R::Done, none())
        }
        Q::RmDir { path } => {
            tree.rmdir(&path)?;
            (R::Done, none())
        }
        Q::Rename {
            from,
            to,
            noreplace,
            exchange,
        } => {
            tree.rename(&from, &to, noreplace, exchange)?;
            (R::Done, none())
        }
        Q::Symlink {
            path,
            target,
            uid,
            gid,
        } => (R::Attr(tree.symlink(&path, &target, (uid, gid))?), none()),
        Q::ReadLink { path } => (R::Target(tree.read_link(&path)?), none()),
        Q::Link { from, to } => (R::Attr(tree.link(&from, &to)?), none()),
        Q::Fsync { path } => {
            tree.fsync(&path)?;
            (R::Done, none())
        }
        Q::StatFs => (R::StatFs(tree.stat_fs()), none()),
    })
}
