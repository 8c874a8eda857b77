//! Volumes with real guests: one volume mounted by several sandboxes at once, each seeing the
//! others' writes after an open; the file API without a sandbox; read-only mounts; a full
//! volume; what a guest can plant in a volume never leads the host outside it; the mount
//! survives suspend and restore and a fork mounts the same volume; a mounted volume cannot
//! be deleted.

mod common;

use common::*;
use space_node::{NodeError, SandboxOptions, VolumeMount};
use space_proto::volume::{VolumeReply, VolumeRequest};

const VOL: &str = "vol-00000000000000a1";
const SMALL: &str = "vol-00000000000000b2";

fn mount(volume: &str, path: &str, read_only: bool) -> SandboxOptions {
    SandboxOptions {
        volumes: vec![VolumeMount {
            volume: volume.into(),
            name: "data".into(),
            path: path.into(),
            read_only,
        }],
        ..SandboxOptions::default()
    }
}

/// Runs `line` and answers its exit status and stderr.
async fn try_sh(client: &space_proto::GuestClient, line: &str) -> (i32, String) {
    let out = client
        .run(space_proto::ExecSpec::shell(line))
        .await
        .unwrap();
    (
        out.status.exit_code.unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn api(node: &space_node::Node, req: VolumeRequest, data: &[u8]) -> (VolumeReply, Vec<u8>) {
    let a = node.volume_call(VOL, req, data.to_vec()).await.unwrap();
    (a.reply, a.data.0)
}

#[test]
fn a_volume_shared_by_sandboxes_and_the_api() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            build_minimal(&node, "1").await;
            node.create_volume(VOL, "t1", 64 << 20).await.unwrap();
            let a = create(&node, mount(VOL, "/data", false)).await;
            let b = create(&node, mount(VOL, "/mnt/v/", false)).await;
            let ro = create(&node, mount(VOL, "/data", true)).await;
            let (ga, gb, gro) = (
                node.guest(&a).await.unwrap(),
                node.guest(&b).await.unwrap(),
                node.guest(&ro).await.unwrap(),
            );

            // One writes, the other reads, renames included.
            sh(&ga, "echo hello > /data/a.txt && mkdir /data/d && echo x > /data/d/x && mv /data/d /data/e").await;
            assert_eq!(sh(&gb, "cat /mnt/v/a.txt /mnt/v/e/x").await, "hello\nx\n");
            assert!(sh(&gb, "grep ' /mnt/v ' /proc/mounts")
                .await
                .contains("space-volume:data"));
            sh(&gb, "echo more >> /mnt/v/a.txt").await;
            assert_eq!(sh(&ga, "cat /data/a.txt").await, "hello\nmore\n");
            let host = node.layout().root().join("volumes").join(VOL).join("a.txt");
            assert_eq!(std::fs::read(&host).unwrap(), b"hello\nmore\n");

            // The file API: what it writes the guests read, and the other way round.
            let (r, _) = api(
                &node,
                VolumeRequest::Create {
                    path: "api.txt".into(),
                    mode: 0o644,
                    uid: 1000,
                    gid: 1000,
                    exclusive: true,
                    truncate: false,
                },
                b"",
            )
            .await;
            assert!(matches!(r, VolumeReply::Attr(_)), "{r:?}");
            api(
                &node,
                VolumeRequest::Write {
                    path: "api.txt".into(),
                    offset: 0,
                },
                b"from the api",
            )
            .await;
            assert_eq!(sh(&ga, "cat /data/api.txt").await, "from the api");
            let (r, bytes) = api(
                &node,
                VolumeRequest::Read {
                    path: "e/x".into(),
                    offset: 0,
                    size: 100,
                },
                b"",
            )
            .await;
            assert_eq!((r, bytes), (VolumeReply::Data(2), b"x\n".to_vec()));

            // Read-only: reads work, writes are refused in the guest.
            assert_eq!(sh(&gro, "cat /data/a.txt").await, "hello\nmore\n");
            let (code, err) = try_sh(&gro, "echo no > /data/z").await;
            assert_ne!(code, 0);
            assert!(err.contains("Read-only"), "{err}");

            // What a guest plants: links out of the volume are text to the host.
            sh(
                &ga,
                "ln -s /etc/passwd /data/evil && ln -s / /data/root && ln /data/a.txt /data/hard",
            )
            .await;
            assert!(
                sh(&ga, "cat /data/evil").await.contains("root:"),
                "the guest follows its own link in its own tree"
            );
            for path in ["evil", "root/etc/passwd"] {
                let (r, _) = api(
                    &node,
                    VolumeRequest::Read {
                        path: path.into(),
                        offset: 0,
                        size: 100,
                    },
                    b"",
                )
                .await;
                assert_eq!(r, VolumeReply::Errno(libc::ELOOP), "{path}");
            }
            let (r, _) = api(
                &node,
                VolumeRequest::ReadLink {
                    path: "evil".into(),
                },
                b"",
            )
            .await;
            assert_eq!(r, VolumeReply::Target("/etc/passwd".into()));
            let (r, _) = api(
                &node,
                VolumeRequest::Read {
                    path: "../../../etc/passwd".into(),
                    offset: 0,
                    size: 100,
                },
                b"",
            )
            .await;
            assert_eq!(r, VolumeReply::Errno(libc::EINVAL));

            // A mounted volume is not deleted.
            assert!(matches!(
                node.delete_volume(VOL).await,
                Err(NodeError::VolumeInUse { .. })
            ));

            // Suspend and restore keep the mount; a fork mounts the same volume.
            node.suspend(&a).await.unwrap();
            sh(&gb, "echo while-away > /mnt/v/away.txt").await;
            node.restore(&a).await.unwrap();
            let ga = node.guest(&a).await.unwrap();
            assert_eq!(
                sh(&ga, "cat /data/away.txt /data/a.txt").await,
                "while-away\nhello\nmore\n"
            );
            sh(&ga, "echo after > /data/after.txt").await;
            let child = node.fork(&a).await.unwrap().id;
            let gc = node.guest(&child).await.unwrap();
            sh(&gc, "echo child > /data/child.txt").await;
            assert_eq!(
                sh(&gb, "cat /mnt/v/after.txt /mnt/v/child.txt").await,
                "after\nchild\n"
            );

            for id in [&a, &b, &ro, &child] {
                node.kill(id).await.unwrap();
            }
            node.delete_volume(VOL).await.unwrap();
            assert!(!host.exists());
        },
    );
}

#[test]
fn a_full_volume_is_enospc_in_the_guest_and_keeps_what_it_had() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            build_minimal(&node, "1").await;
            node.create_volume(SMALL, "t1", 1 << 20).await.unwrap();
            let id = create(&node, mount(SMALL, "/small", false)).await;
            let g = node.guest(&id).await.unwrap();
            sh(&g, "echo kept > /small/kept.txt").await;
            let (code, err) = try_sh(&g, "dd if=/dev/zero of=/small/big bs=64k count=32").await;
            assert_ne!(code, 0);
            assert!(err.contains("No space left"), "{err}");
            assert_eq!(sh(&g, "cat /small/kept.txt").await, "kept\n");
            let size: u64 = sh(&g, "wc -c < /small/big").await.trim().parse().unwrap();
            assert!(size < 1 << 20, "{size}");
            let df = sh(&g, "df -k /small | tail -1").await;
            assert!(df.contains("1024"), "df shows the volume's size: {df}");
            sh(
                &g,
                "rm /small/big && dd if=/dev/zero of=/small/again bs=64k count=8",
            )
            .await;
        },
    );
}
