//! What tests of images share (the `testing` feature): a real distribution registry on
//! loopback, and a three-layer image made with umoci (a whiteout and an opaque directory).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd`, panicking with its error output when it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("{cmd:?}: {e} (scripts/deps.sh installs umoci, skopeo, docker-registry)")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A distribution registry on a free loopback port, stopped on drop.
pub struct TestRegistry {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl TestRegistry {
    /// Starts one, with basic auth for `basic` (user, password) when given.
    pub fn start(basic: Option<(&str, &str)>) -> TestRegistry {
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut config = format!(
            "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        );
        if let Some((user, password)) = basic {
            let line = run(Command::new("htpasswd").args(["-Bbn", user, password]));
            let file = dir.path().join("htpasswd");
            std::fs::write(&file, line.trim()).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: space-test\n    path: {}\n",
                file.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting docker-registry (scripts/deps.sh installs it)");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the registry did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        TestRegistry {
            child,
            port,
            _dir: dir,
        }
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An OCI layout with one image `t` of three layers, made with umoci: files, then a whiteout
/// of one of them (umoci writes it for a removed file), then a hand-made layer with an opaque
/// directory; and a config with Env, WorkingDir and User.
pub fn make_image(dir: &Path) -> PathBuf {
    make_image_with(dir, &[])
}

/// [`make_image`] with `extra` files (path in the image, source file on the host, mode) in
/// its first layer.
pub fn make_image_with(dir: &Path, extra: &[(&str, &Path, u32)]) -> PathBuf {
    let layout = dir.join("oci");
    let bundle = dir.join("bundle");
    let image = format!("{}:t", layout.display());
    run(Command::new("umoci")
        .args(["init", "--layout"])
        .arg(&layout));
    run(Command::new("umoci").args(["new", "--image", &image]));
    run(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc")).unwrap();
    std::fs::create_dir_all(rootfs.join("opt/sub")).unwrap();
    std::fs::write(rootfs.join("etc/kept"), b"kept\n").unwrap();
    std::fs::write(rootfs.join("etc/gone"), b"gone\n").unwrap();
    std::fs::write(rootfs.join("opt/lower"), b"lower\n").unwrap();
    std::fs::write(rootfs.join("opt/sub/lower"), b"lower\n").unwrap();
    for (path, source, mode) in extra {
        let target = rootfs.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(source, &target).unwrap();
        std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(*mode))
            .unwrap();
    }
    run(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle));
    // A repack diffs against the image the bundle was unpacked from: unpack the new one.
    let bundle = dir.join("bundle-2");
    run(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    std::fs::remove_file(rootfs.join("etc/gone")).unwrap();
    std::fs::write(rootfs.join("etc/second"), b"second\n").unwrap();
    run(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle));
    // The third layer, by hand: `opt` opaque, with one new file.
    let tar_path = dir.join("opaque.tar");
    {
        let mut b = tar::Builder::new(std::fs::File::create(&tar_path).unwrap());
        for (path, data, kind) in [
            ("opt/", &b""[..], tar::EntryType::Directory),
            ("opt/.wh..wh..opq", &b""[..], tar::EntryType::Regular),
            ("opt/upper", &b"upper\n"[..], tar::EntryType::Regular),
        ] {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(kind);
            h.set_mode(if kind == tar::EntryType::Directory {
                0o755
            } else {
                0o644
            });
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(1_600_000_000);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, path, data).unwrap();
        }
        b.finish().unwrap();
    }
    run(Command::new("umoci")
        .args(["raw", "add-layer", "--image", &image])
        .arg(&tar_path));
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--config.env",
        "GREETING=hello",
        "--config.workingdir",
        "/opt",
        "--config.user",
        "1000:1000",
        "--config.cmd",
        "sh",
    ]));
    layout
}

/// Panics unless `root` holds what [`make_image`]'s layers leave.
pub fn check_tree(root: &Path) {
    assert_eq!(std::fs::read(root.join("etc/kept")).unwrap(), b"kept\n");
    assert_eq!(std::fs::read(root.join("etc/second")).unwrap(), b"second\n");
    assert!(
        !root.join("etc/gone").exists(),
        "the whiteout removed etc/gone"
    );
    let mut opt: Vec<String> = std::fs::read_dir(root.join("opt"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    opt.sort();
    assert_eq!(
        opt,
        ["upper"],
        "the opaque directory hides the lower layers' files"
    );
}
