//! Test support: real filesystems for the driver tests, cleaned up on drop even when a test
//! fails (unmount, which also detaches the auto-clear loop device, then the temporary
//! directory with the image goes).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::loopback;

/// Whether the tests can mount loop images (root, and the tool to format them).
pub fn can_mount(mkfs: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        println!("note: not root, skipping the test that needs a loop-mounted filesystem");
        return false;
    }
    let found = ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .any(|d| Path::new(d).join(mkfs).is_file());
    if !found {
        println!("note: {mkfs} is not installed, skipping the test that needs it");
    }
    found
}

/// Unmounts `path` on drop, if it is still a mount point. Lazily if it is busy, so a failed
/// test holding a file open still leaves no mount behind.
pub struct UnmountOnDrop(pub PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        if !is_mount_point(&self.0) {
            return;
        }
        if loopback::unmount(&self.0).is_err() {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Whether `path` is a mount point (its device differs from its parent's).
pub fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(a), Some(Ok(b))) = (
        std::fs::metadata(path),
        path.parent().map(std::fs::metadata),
    ) else {
        return false;
    };
    a.dev() != b.dev()
}

/// A fresh filesystem on a 1 GiB sparse image in a temporary directory, mounted at
/// [`LoopFs::path`].
pub struct LoopFs {
    // Field order is drop order: unmount before the directory holding the image goes.
    _mount: UnmountOnDrop,
    mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// A btrfs made the way [`loopback`] makes the data directory's, or `None` (with a note)
    /// when this host cannot mount one.
    pub fn btrfs() -> Option<Self> {
        if !can_mount("mkfs.btrfs") {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        loopback::create_image(&image, 1 << 30).unwrap();
        let guard = UnmountOnDrop(mnt.clone());
        loopback::mount_image(&image, &mnt).unwrap();
        Some(Self {
            _mount: guard,
            mnt,
            _dir: dir,
        })
    }

    /// An XFS with reflinks, or `None` (with a note) when not root. `make test` installs
    /// xfsprogs, so a missing `mkfs.xfs` is a failure, not a skip.
    pub fn xfs() -> Option<Self> {
        if !nix::unistd::geteuid().is_root() {
            println!("note: not root, skipping the test that needs a loop-mounted filesystem");
            return None;
        }
        assert!(
            can_mount("mkfs.xfs"),
            "mkfs.xfs is missing: scripts/deps.sh installs xfsprogs"
        );
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("fs.img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(1 << 30)
            .unwrap();
        let ok = Command::new("mkfs.xfs")
            .args(["-q", "-m", "reflink=1"])
            .arg(&image)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mkfs.xfs failed");
        let guard = UnmountOnDrop(mnt.clone());
        let ok = Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mnt)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mounting the XFS image failed");
        Some(Self {
            _mount: guard,
            mnt,
            _dir: dir,
        })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

/// Whether a loop device is still attached to `image` (to check that cleanup detached it).
pub fn loop_attached(image: &Path) -> bool {
    let out = Command::new("losetup")
        .arg("-j")
        .arg(image)
        .output()
        .unwrap();
    !String::from_utf8_lossy(&out.stdout).trim().is_empty()
}
