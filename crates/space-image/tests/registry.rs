//! Images made with umoci, pushed with skopeo to a real registry (Debian's `docker-registry`,
//! the distribution registry) on loopback, anonymous and with basic auth, then pulled and
//! applied; and the same image as OCI and Docker archive files. `scripts/deps.sh` installs the
//! three tools; a missing one fails these tests.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use space_image::registry::{Auth, Reference, Registry};
use space_image::{ArchiveImage, Budget};

fn run(cmd: &mut Command) -> String {
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
struct TestRegistry {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TestRegistry {
    fn start(basic: Option<(&str, &str)>) -> TestRegistry {
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
fn make_image(dir: &Path) -> PathBuf {
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

fn budget() -> Budget {
    Budget {
        bytes: 1 << 30,
        entries: 100_000,
    }
}

fn check_tree(root: &Path) {
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

fn push(layout: &Path, dest: &str, creds: Option<&str>) {
    let mut cmd = Command::new("skopeo");
    cmd.args(["copy", "--dest-tls-verify=false", "--insecure-policy"]);
    if let Some(c) = creds {
        cmd.args(["--dest-creds", c]);
    }
    cmd.arg(format!("oci:{}:t", layout.display())).arg(dest);
    run(&mut cmd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_are_pulled_from_a_registry_anonymous_and_with_basic_auth() {
    let work = tempfile::tempdir().unwrap();
    let layout = make_image(work.path());

    let open = TestRegistry::start(None);
    push(
        &layout,
        &format!("docker://127.0.0.1:{}/team/tool:1", open.port),
        None,
    );
    let reference = Reference::parse(&format!("127.0.0.1:{}/team/tool:1", open.port)).unwrap();
    let blobs = work.path().join("blobs");
    let pulled = Registry::new(&reference, Auth::Anonymous, true)
        .unwrap()
        .pull(&blobs, &mut budget())
        .await
        .unwrap();
    assert_eq!(pulled.layer_count(), 3);
    assert_eq!(pulled.config.config.working_dir, "/opt");
    assert_eq!(pulled.config.config.user, "1000:1000");
    assert!(pulled
        .config
        .env()
        .contains(&("GREETING".into(), "hello".into())));
    let root = tempfile::tempdir().unwrap();
    pulled.apply(root.path(), &mut budget()).unwrap();
    check_tree(root.path());
    // Pinned by the digest it was pulled as: the same image again.
    let pinned = Reference::parse(&format!(
        "127.0.0.1:{}/team/tool@{}",
        open.port, pulled.manifest_digest
    ))
    .unwrap();
    let again = Registry::new(&pinned, Auth::Anonymous, true)
        .unwrap()
        .pull(&blobs, &mut budget())
        .await
        .unwrap();
    assert_eq!(again.config_digest, pulled.config_digest);
    // Unknown images and digests are clear errors.
    let missing = Reference::parse(&format!("127.0.0.1:{}/team/none:1", open.port)).unwrap();
    let e = Registry::new(&missing, Auth::Anonymous, true)
        .unwrap()
        .pull(&blobs, &mut budget())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("has no image"), "{e}");

    let locked = TestRegistry::start(Some(("agent", "s3cret")));
    push(
        &layout,
        &format!("docker://127.0.0.1:{}/team/tool:1", locked.port),
        Some("agent:s3cret"),
    );
    let reference = Reference::parse(&format!("127.0.0.1:{}/team/tool:1", locked.port)).unwrap();
    let good = Auth::Basic {
        user: "agent".into(),
        password: "s3cret".into(),
    };
    let pulled = Registry::new(&reference, good, true)
        .unwrap()
        .pull(&work.path().join("blobs-2"), &mut budget())
        .await
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    pulled.apply(root.path(), &mut budget()).unwrap();
    check_tree(root.path());
    let wrong = Auth::Basic {
        user: "agent".into(),
        password: "wrong".into(),
    };
    let e = Registry::new(&reference, wrong, true)
        .unwrap()
        .pull(&work.path().join("blobs-3"), &mut budget())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("refused the credentials"), "{e}");
    let e = Registry::new(&reference, Auth::Anonymous, true)
        .unwrap()
        .pull(&work.path().join("blobs-4"), &mut budget())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("wants credentials"), "{e}");
}

#[test]
fn images_are_read_from_oci_and_docker_archives_skopeo_writes() {
    let work = tempfile::tempdir().unwrap();
    let layout = make_image(work.path());
    let oci = work.path().join("image.oci.tar");
    let docker = work.path().join("image.docker.tar");
    for dest in [
        format!("oci-archive:{}:t", oci.display()),
        format!("docker-archive:{}:team/tool:1", docker.display()),
    ] {
        run(Command::new("skopeo")
            .args(["copy", "--insecure-policy"])
            .arg(format!("oci:{}:t", layout.display()))
            .arg(dest));
    }
    for (path, tag) in [(&oci, None), (&docker, Some("team/tool:1"))] {
        let image = ArchiveImage::open(path, tag).unwrap();
        assert_eq!(image.layer_count(), 3, "{}", path.display());
        assert_eq!(image.config.config.user, "1000:1000");
        let root = tempfile::tempdir().unwrap();
        image.apply(root.path(), &mut budget()).unwrap();
        check_tree(root.path());
    }
    // A truncated archive is a clear error.
    let bytes = std::fs::read(&docker).unwrap();
    let cut = work.path().join("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = ArchiveImage::open(&cut, None).unwrap_err().to_string();
    assert!(
        e.contains("cut short") || e.contains("has no member"),
        "{e}"
    );
}
