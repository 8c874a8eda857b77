//! A template from an OCI image, on a real guest: an image of three layers made with umoci (a
//! whiteout, an opaque directory) whose first layer carries busybox becomes a root image
//! (`space_image::rootfs::build`), the node builds a template of it, and a sandbox of that
//! template sees exactly the files the layers leave.

mod common;

use std::time::Duration;

use common::*;
use space_image::testing::make_image_with;
use space_image::{ArchiveImage, Budget};
use space_node::{CreateRequest, SandboxOptions, TemplateRef, TemplateSpec};
use space_proto::ExecSpec;

#[test]
fn a_sandbox_of_an_image_template_sees_what_its_layers_leave() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            let work = tempfile::tempdir().unwrap();
            let busybox = std::path::Path::new("/bin/busybox");
            assert!(
                busybox.exists(),
                "busybox-static is needed (scripts/deps.sh)"
            );
            let layout = make_image_with(work.path(), &[("bin/busybox", busybox, 0o755)]);
            let archive = work.path().join("image.tar");
            space_image::testing::run(
                std::process::Command::new("skopeo")
                    .args(["copy", "--insecure-policy"])
                    .arg(format!("oci:{}:t", layout.display()))
                    .arg(format!("oci-archive:{}:t", archive.display())),
            );
            let image = ArchiveImage::open(&archive, None).unwrap();
            let rootfs = work.path().join("rootfs.ext4");
            let built = space_image::rootfs::build(
                &image,
                &env_path("SPACE_GUESTD"),
                work.path(),
                &rootfs,
                64 << 20,
                &mut Budget {
                    bytes: 1 << 30,
                    entries: 100_000,
                },
            )
            .unwrap();
            assert_eq!(built.layers.len(), 3);

            let template = TemplateRef::new("from-image", "1").unwrap();
            node.build_template(TemplateSpec {
                template: template.clone(),
                kernel: env_path("SPACE_KERNEL"),
                rootfs,
                vcpus: 1,
                memory_mib: 256,
                kernel_cmdline: None,
                ready_timeout: Duration::from_secs(120),
                guest: Default::default(),
                start: None,
                source: String::new(),
            })
            .await
            .expect("a template of the image");
            let mut req = CreateRequest::new(template.name.clone());
            req.options = SandboxOptions::default();
            let id = node.create(req).await.expect("create").id;
            let guest = node.guest(&id).await.unwrap();
            let run = |argv: &[&str]| {
                let spec = ExecSpec::argv(argv.iter().copied());
                let guest = guest.clone();
                async move {
                    let out = guest.run(spec).await.unwrap();
                    (
                        out.status.success(),
                        String::from_utf8_lossy(&out.stdout).into_owned(),
                    )
                }
            };
            assert_eq!(
                run(&["/bin/busybox", "cat", "/etc/kept", "/etc/second"]).await,
                (true, "kept\nsecond\n".into())
            );
            assert_eq!(
                run(&["/bin/busybox", "ls", "/opt"]).await,
                (true, "upper\n".into())
            );
            assert!(
                !run(&["/bin/busybox", "test", "-e", "/etc/gone"]).await.0,
                "the whiteout hides /etc/gone"
            );
            // The proxy settings of every guest are in the image too.
            let (ok, profile) =
                run(&["/bin/busybox", "cat", "/etc/profile.d/space-proxy.sh"]).await;
            assert!(ok && profile.contains("HTTPS_PROXY"), "{profile}");
            node.kill(&id).await.unwrap();
        },
    );
}
