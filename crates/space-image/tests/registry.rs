//! Images made with umoci, pushed with skopeo to a real registry (Debian's `docker-registry`,
//! the distribution registry) on loopback, anonymous and with basic auth, then pulled and
//! applied; and the same image as OCI and Docker archive files. `scripts/deps.sh` installs the
//! three tools; a missing one fails these tests.

use std::path::Path;
use std::process::Command;

use space_image::registry::{Auth, Reference, Registry};
use space_image::testing::{check_tree, make_image, run, TestRegistry};
use space_image::{ArchiveImage, Budget};

fn budget() -> Budget {
    Budget {
        bytes: 1 << 30,
        entries: 100_000,
    }
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
