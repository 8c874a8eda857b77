//! An image's root tree made into a sandbox's root image: `space-guestd` installed as init,
//! the egress proxy configured for the tools that read their own settings (apt, pip, npm, git,
//! login shells), then a raw ext4 image made from the tree by `mkfs.ext4 -d`, without
//! mounting anything.
//!
//! The settings are the ones the stock images get (`guest/build-image.sh`), and they are
//! written through the same rule as layers: a path is resolved inside the tree, so an image
//! whose `/etc` is a link to somewhere else cannot make this write outside its tree.

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

use crate::layers::resolve_dir;
use crate::{ImageError, Result};

/// The egress proxy inside every guest (`docs/egress.md`).
pub const PROXY: &str = "http://127.0.0.1:3128";
/// What bypasses it.
pub const NO_PROXY: &str = "localhost,127.0.0.1,::1";
/// Where the deployment's CA lands in a guest once its identity is applied.
pub const GUEST_CA: &str = "/usr/local/share/ca-certificates/space-ca.crt";
/// The system bundle the CA is added to.
pub const GUEST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Room an image gets beyond its tree: a tenth more, and this.
const SLACK_BYTES: u64 = 512 << 20;

fn parts(path: &str) -> Vec<OsString> {
    path.split('/')
        .filter(|p| !p.is_empty())
        .map(OsString::from)
        .collect()
}

/// Writes `data` to `path` (absolute, inside the tree) with `mode`; a link at `path` is
/// replaced, not followed. With `append`, a regular file there is appended to.
fn write_in(root: &Path, path: &str, data: &[u8], mode: u32, append: bool) -> Result<()> {
    let p = parts(path);
    let (name, dirs) = p.split_last().expect("a file path");
    let file = resolve_dir(root, dirs, true)?.join(name);
    let existing = fs::symlink_metadata(&file).ok();
    let keep = append && existing.as_ref().is_some_and(|m| m.is_file());
    if !keep {
        crate::layers::remove(&file)?;
    }
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(keep)
        .truncate(!keep)
        .mode(mode)
        .open(&file)
        .map_err(|e| ImageError::io(format!("write {path} in the image"), e))?;
    f.write_all(data)
        .map_err(|e| ImageError::io(format!("write {path} in the image"), e))?;
    if !keep {
        std::os::unix::fs::fchown(&f, Some(0), Some(0))
            .map_err(|e| ImageError::io(format!("chown {path} in the image"), e))?;
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| ImageError::io(format!("chmod {path} in the image"), e))?;
    }
    Ok(())
}

/// The login-shell settings of the proxy and of the CA bundle; values already set are kept.
fn profile_script() -> String {
    let mut s = String::from(
        "# The egress proxy of space (docs/egress.md); values already set are kept.\n",
    );
    for v in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        s.push_str(&format!(": \"${{{v}:={PROXY}}}\"; export {v}\n"));
    }
    for v in ["NO_PROXY", "no_proxy"] {
        s.push_str(&format!(": \"${{{v}:={NO_PROXY}}}\"; export {v}\n"));
    }
    s.push_str(&format!("if [ -f {GUEST_CA} ]; then\n"));
    for v in [
        "SSL_CERT_FILE",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
        "GIT_SSL_CAINFO",
    ] {
        s.push_str(&format!("    : \"${{{v}:={GUEST_BUNDLE}}}\"; export {v}\n"));
    }
    s.push_str(&format!(
        "    : \"${{NODE_EXTRA_CA_CERTS:={GUEST_CA}}}\"; export NODE_EXTRA_CA_CERTS\nfi\n"
    ));
    s
}

/// Makes an image's tree a sandbox's: `guestd` as `/sbin/init` and `/usr/bin/space-guestd`,
/// and the proxy settings.
pub fn prepare_tree(root: &Path, guestd: &Path) -> Result<()> {
    // Mount points init needs (it makes them too, but a read-only root could not).
    for (dir, mode) in [
        ("proc", 0o555),
        ("sys", 0o555),
        ("dev", 0o755),
        ("run", 0o755),
        ("tmp", 0o1777),
    ] {
        let path = resolve_dir(root, &parts(dir), true)?;
        if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(|e| ImageError::io(format!("chmod /{dir} in the image"), e))?;
        }
    }
    let init =
        fs::read(guestd).map_err(|e| ImageError::io(format!("read {}", guestd.display()), e))?;
    write_in(root, "/usr/bin/space-guestd", &init, 0o755, false)?;
    write_in(root, "/sbin/init", &init, 0o755, false)?;
    let apt = format!("Acquire::http::Proxy \"{PROXY}\";\nAcquire::https::Proxy \"{PROXY}\";\n");
    write_in(
        root,
        "/etc/apt/apt.conf.d/90space-proxy",
        apt.as_bytes(),
        0o644,
        false,
    )?;
    write_in(
        root,
        "/etc/pip.conf",
        format!("[global]\nproxy = {PROXY}\n").as_bytes(),
        0o644,
        false,
    )?;
    write_in(
        root,
        "/etc/npmrc",
        format!("proxy={PROXY}\nhttps-proxy={PROXY}\nnoproxy={NO_PROXY}\n").as_bytes(),
        0o644,
        false,
    )?;
    write_in(
        root,
        "/etc/gitconfig",
        format!("[http]\n\tproxy = {PROXY}\n").as_bytes(),
        0o644,
        true,
    )?;
    write_in(
        root,
        "/etc/profile.d/space-proxy.sh",
        profile_script().as_bytes(),
        0o644,
        false,
    )?;
    let mut env = String::new();
    for v in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.push_str(&format!("{v}=\"{PROXY}\"\n"));
    }
    env.push_str(&format!(
        "NO_PROXY=\"{NO_PROXY}\"\nno_proxy=\"{NO_PROXY}\"\n"
    ));
    write_in(root, "/etc/environment", env.as_bytes(), 0o644, true)?;
    Ok(())
}

/// An image whose layers can be applied: an archive file's, or one pulled from a registry.
pub trait Image {
    /// The image config.
    fn config(&self) -> &crate::spec::ImageConfig;
    /// Applies the layers onto `root`.
    fn apply_layers(
        &self,
        root: &Path,
        budget: &mut crate::Budget,
    ) -> Result<Vec<crate::LayerStats>>;
}

impl Image for crate::ArchiveImage {
    fn config(&self) -> &crate::spec::ImageConfig {
        &self.config
    }
    fn apply_layers(
        &self,
        root: &Path,
        budget: &mut crate::Budget,
    ) -> Result<Vec<crate::LayerStats>> {
        self.apply(root, budget)
    }
}

impl Image for crate::registry::PulledImage {
    fn config(&self) -> &crate::spec::ImageConfig {
        &self.config
    }
    fn apply_layers(
        &self,
        root: &Path,
        budget: &mut crate::Budget,
    ) -> Result<Vec<crate::LayerStats>> {
        self.apply(root, budget)
    }
}

/// What [`build`] made.
#[derive(Debug, Clone)]
pub struct Built {
    /// Size of the image file.
    pub image_bytes: u64,
    /// Bytes the tree took.
    pub tree_bytes: u64,
    pub layers: Vec<crate::LayerStats>,
}

/// Makes the sandbox root image `out` of `image`: its layers applied in a staging tree under
/// `work` (removed afterwards, also on failure), `guestd` installed, an ext4 image of at
/// least `min_bytes`.
pub fn build(
    image: &dyn Image,
    guestd: &Path,
    work: &Path,
    out: &Path,
    min_bytes: u64,
    budget: &mut crate::Budget,
) -> Result<Built> {
    let stage = tempfile::Builder::new()
        .prefix(".image-stage-")
        .tempdir_in(work)
        .map_err(|e| {
            ImageError::io(format!("make a staging directory in {}", work.display()), e)
        })?;
    fs::set_permissions(stage.path(), fs::Permissions::from_mode(0o755))
        .map_err(|e| ImageError::io("chmod the staging directory", e))?;
    let layers = image.apply_layers(stage.path(), budget)?;
    prepare_tree(stage.path(), guestd)?;
    // Runtimes make the working directory when an image names one it lacks.
    let workdir = &image.config().config.working_dir;
    if workdir.starts_with('/') {
        resolve_dir(stage.path(), &parts(workdir), true)?;
    }
    let tree = tree_bytes(stage.path())?;
    let size = image_bytes(tree, min_bytes);
    make_ext4(stage.path(), out, size)?;
    Ok(Built {
        image_bytes: size,
        tree_bytes: tree,
        layers,
    })
}

/// Bytes the tree takes: file sizes rounded up to 4 KiB, and a block per entry.
pub fn tree_bytes(root: &Path) -> Result<u64> {
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            fs::read_dir(&dir).map_err(|e| ImageError::io(format!("list {}", dir.display()), e))?;
        for e in entries {
            let e = e.map_err(|e| ImageError::io(format!("list {}", dir.display()), e))?;
            let m = fs::symlink_metadata(e.path())
                .map_err(|err| ImageError::io(format!("stat {}", e.path().display()), err))?;
            total = total.saturating_add(m.size().div_ceil(4096) * 4096 + 4096);
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    Ok(total)
}

/// The size a root image of `tree` gets: the tree, a tenth more and 512 MiB, or `at_least`.
pub fn image_bytes(tree: u64, at_least: u64) -> u64 {
    let size = tree.saturating_add(tree / 10).saturating_add(SLACK_BYTES);
    size.max(at_least).div_ceil(1 << 20) << 20
}

/// Makes the raw ext4 image `image` of `size` bytes holding `tree` (owners, modes, links,
/// times and extended attributes as they are in the tree), and checks it.
pub fn make_ext4(tree: &Path, image: &Path, size: u64) -> Result<()> {
    let f = fs::File::create(image)
        .map_err(|e| ImageError::io(format!("create {}", image.display()), e))?;
    f.set_len(size)
        .map_err(|e| ImageError::io(format!("size {}", image.display()), e))?;
    drop(f);
    let run = |cmd: &mut Command, what: &str| -> Result<()> {
        let out = cmd.output().map_err(|e| {
            ImageError::io(format!("run {what} (Debian: apt-get install e2fsprogs)"), e)
        })?;
        if !out.status.success() {
            return Err(ImageError::Invalid(format!(
                "{what} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    };
    run(
        Command::new("mkfs.ext4")
            .args([
                "-F",
                "-q",
                "-t",
                "ext4",
                "-b",
                "4096",
                "-L",
                "space-root",
                "-m",
                "0",
            ])
            .args(["-E", "root_owner=0:0", "-d"])
            .arg(tree)
            .arg(image),
        "mkfs.ext4",
    )?;
    run(Command::new("e2fsck").arg("-fn").arg(image), "e2fsck")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_gets_init_and_the_proxy_settings_inside_itself() {
        let outside = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // A merged /usr (sbin a link into usr) and a hostile /etc pointing out of the tree.
        fs::create_dir_all(r.join("usr/sbin")).unwrap();
        std::os::unix::fs::symlink("usr/sbin", r.join("sbin")).unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("etc")).unwrap();
        let guestd = r.join("guestd-binary");
        fs::write(&guestd, b"\x7fELF not really").unwrap();
        prepare_tree(r, &guestd).unwrap();
        assert_eq!(
            fs::read(r.join("usr/sbin/init")).unwrap(),
            b"\x7fELF not really"
        );
        assert_eq!(
            fs::metadata(r.join("usr/bin/space-guestd")).unwrap().mode() & 0o777,
            0o755
        );
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
        let etc = r.join(outside.path().strip_prefix("/").unwrap());
        let profile = fs::read_to_string(etc.join("profile.d/space-proxy.sh")).unwrap();
        assert!(profile.contains(": \"${HTTPS_PROXY:=http://127.0.0.1:3128}\"; export HTTPS_PROXY"));
        assert!(fs::read_to_string(etc.join("environment"))
            .unwrap()
            .contains("no_proxy=\"localhost,127.0.0.1,::1\""));
    }

    #[test]
    fn an_ext4_image_is_made_without_mounting() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("etc")).unwrap();
        fs::write(root.path().join("etc/hostname"), b"box\n").unwrap();
        let bytes = tree_bytes(root.path()).unwrap();
        assert!(bytes >= 8192);
        let size = image_bytes(bytes, 64 << 20);
        assert_eq!(size % (1 << 20), 0);
        let out = tempfile::tempdir().unwrap();
        let image = out.path().join("rootfs.ext4");
        make_ext4(root.path(), &image, size).unwrap();
        // debugfs reads the file back out of the image.
        let cat = Command::new("debugfs")
            .args(["-R", "cat /etc/hostname"])
            .arg(&image)
            .output()
            .unwrap();
        assert_eq!(cat.stdout, b"box\n");
        // A tree larger than the image is a clear failure.
        fs::write(root.path().join("big"), vec![1u8; 8 << 20]).unwrap();
        let e = make_ext4(root.path(), &image, 4 << 20)
            .unwrap_err()
            .to_string();
        assert!(e.contains("mkfs.ext4 failed"), "{e}");
    }
}
