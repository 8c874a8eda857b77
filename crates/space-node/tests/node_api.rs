//! The node API over the network, with a real guest: a node serves its API on mutual TLS
//! from a cluster CA, and a control-side client drives it.
//!
//! - lifecycle calls cross with their results, and refusals keep their kind (`not_found`,
//!   `illegal_state`) while failures stay failures;
//! - exec, files (sha256 both ways), watch and a TCP port are guest protocol streams the node
//!   serves for the sandbox; the routes the node keeps for itself are not reachable;
//! - a paused sandbox is woken by guest traffic, and the client is told;
//! - a client with another CA's leaf, a node's leaf posing as the control plane, an expired
//!   control leaf, a node answering under another node's id and a node with an expired leaf
//!   are all refused.

mod common;

use std::sync::Arc;

use common::*;
use space_node::api::{
    ClusterCa, FaultCode, Identity, LocalNode, NodeApi, NodeServer, RemoteNode, Woke,
};
use space_node::{SandboxId, State, VersionReq};
use space_proto::{ExecSpec, WriteOptions};

fn identity(ca: &ClusterCa, leaf: &space_node::api::Leaf) -> Identity {
    Identity::new(leaf, ca.cert_pem()).unwrap()
}

#[test]
fn a_node_served_over_mutual_tls() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            let template = build_minimal(&node, "1").await;
            let ca = ClusterCa::generate().unwrap();
            let node_leaf = ca.issue_node("node-a", 30).unwrap();
            let local: Arc<dyn NodeApi> = Arc::new(LocalNode::new(
                node.clone(),
                env_path("SPACE_KERNEL"),
                [("minimal".to_string(), env_path("SPACE_ROOTFS_MINIMAL"))].into(),
            ));
            let server = NodeServer::start(
                local,
                "127.0.0.1:0".parse().unwrap(),
                &identity(&ca, &node_leaf),
            )
            .await
            .unwrap();
            let addr = server.local_addr().to_string();
            let control = identity(&ca, &ca.issue_control(30).unwrap());
            let remote = RemoteNode::new("node-a", &addr, &control).unwrap();

            // Calls and their answers.
            let status = remote.status().await.unwrap();
            assert!(matches!(status.accelerator.as_str(), "tcg" | "kvm"));
            let t = remote
                .template(&"minimal".parse().unwrap(), &VersionReq::Latest)
                .await
                .unwrap();
            assert_eq!(t.template, template);
            assert_eq!(t.image, "minimal");
            assert_eq!(remote.images().await.unwrap(), ["minimal"]);
            let sb = remote.create(minimal()).await.unwrap();
            assert_eq!(sb.state, State::Running);
            assert_eq!(remote.info(&sb.id).await.unwrap().id, sb.id);
            assert!(remote.usage().await.unwrap().iter().any(|u| u.id == sb.id));

            // Refusals keep their kind across the wire.
            let nobody = SandboxId::generate();
            let f = remote.info(&nobody).await.unwrap_err();
            assert_eq!(f.code, FaultCode::NotFound);
            assert!(f.is_refusal());
            let f = remote.resume(&sb.id).await.unwrap_err();
            assert_eq!(f.code, FaultCode::IllegalState, "{f}");

            // Guest streams through the node.
            let (guest, woke) = remote.guest(&sb.id).await.unwrap();
            assert_eq!(woke, None);
            assert_eq!(
                sh(&guest, "echo through-the-node").await,
                "through-the-node\n"
            );
            let data: Vec<u8> = (0..(3 << 20)).map(|i: u32| (i % 251) as u8).collect();
            guest
                .write_file("/tmp/big", data.clone(), WriteOptions::default())
                .await
                .unwrap();
            assert_eq!(guest_sha(&guest, "/tmp/big").await, sha256(&data));
            let in_guest = sh(&guest, "sha256sum /tmp/big | cut -d' ' -f1").await;
            assert_eq!(in_guest.trim(), sha256(&data));
            let mut watch = guest.watch("/tmp", false).await.unwrap();
            guest
                .write_file("/tmp/seen", b"x".to_vec(), WriteOptions::default())
                .await
                .unwrap();
            // The upload goes through a temporary name first; the final name must follow.
            let seen = tokio::time::timeout(std::time::Duration::from_secs(10), async {
                while let Some(ev) = watch.next().await.unwrap() {
                    if ev.path == "/tmp/seen" {
                        return ev;
                    }
                }
                panic!("the watch ended");
            })
            .await
            .expect("a watch event for /tmp/seen");
            assert!(!seen.is_dir);
            // A TCP port of the guest, through the node.
            guest
                .write_file(
                    "/tmp/hello.sh",
                    b"#!/bin/sh\necho hello-port\n".to_vec(),
                    WriteOptions {
                        mode: Some(0o755),
                        ..WriteOptions::default()
                    },
                )
                .await
                .unwrap();
            let port_server = guest
                .exec(ExecSpec::shell("busybox nc -l -p 7000 -e /tmp/hello.sh"))
                .await
                .unwrap();
            let server_pid = port_server.pid();
            let mut tunnel = None;
            for _ in 0..50 {
                match guest.tcp(7000).await {
                    Ok(t) => {
                        tunnel = Some(t);
                        break;
                    }
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
                }
            }
            let mut tunnel = tunnel.expect("the guest port answers");
            let mut got = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut tunnel, &mut got)
                .await
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&got).trim(), "hello-port");
            let _ = guest.signal(server_pid, 9).await;
            drop(port_server);
            // What the node keeps for itself is not served.
            assert!(guest.shutdown().await.is_err());
            assert_eq!(sh(&guest, "echo still-up").await, "still-up\n");

            // Guest traffic wakes a paused sandbox, and says so.
            remote.pause(&sb.id).await.unwrap();
            assert_eq!(remote.info(&sb.id).await.unwrap().state, State::Paused);
            let (guest, woke) = remote.guest(&sb.id).await.unwrap();
            assert_eq!(woke, Some(Woke::Resume));
            assert_eq!(sh(&guest, "echo awake").await, "awake\n");

            // Who may connect.
            let other_ca = ClusterCa::generate().unwrap();
            let stranger = identity(&other_ca, &other_ca.issue_control(30).unwrap());
            let f = RemoteNode::new("node-a", &addr, &stranger)
                .unwrap()
                .status()
                .await
                .unwrap_err();
            assert_eq!(f.code, FaultCode::Unavailable, "{f}");
            let posing = identity(&ca, &ca.issue_node("node-b", 30).unwrap());
            let f = RemoteNode::new("node-a", &addr, &posing)
                .unwrap()
                .status()
                .await
                .unwrap_err();
            assert_eq!(f.code, FaultCode::Unavailable, "{f}");
            let f = RemoteNode::new("node-b", &addr, &control)
                .unwrap()
                .status()
                .await
                .unwrap_err();
            assert_eq!(f.code, FaultCode::Unavailable, "{f}");
            assert!(f.message.contains("TLS"), "{f}");

            // An expired control leaf is refused by the node.
            let expired = identity(&ca, &ca.issue_control(0).unwrap());
            let f = RemoteNode::new("node-a", &addr, &expired)
                .unwrap()
                .status()
                .await
                .unwrap_err();
            assert_eq!(f.code, FaultCode::Unavailable, "{f}");

            remote.kill(&sb.id).await.unwrap();
            assert_eq!(remote.info(&sb.id).await.unwrap().state, State::Terminated);
            server.stop().await;
            // A stopped node is unavailable, not an internal failure.
            let f = remote.status().await.unwrap_err();
            assert_eq!(f.code, FaultCode::Unavailable, "{f}");

            // A node whose own leaf has expired is refused by the control plane's client.
            let stale: Arc<dyn NodeApi> = Arc::new(LocalNode::new(
                node.clone(),
                env_path("SPACE_KERNEL"),
                Default::default(),
            ));
            let stale = NodeServer::start(
                stale,
                "127.0.0.1:0".parse().unwrap(),
                &identity(&ca, &ca.issue_node("node-a", 0).unwrap()),
            )
            .await
            .unwrap();
            let f = RemoteNode::new("node-a", &stale.local_addr().to_string(), &control)
                .unwrap()
                .status()
                .await
                .unwrap_err();
            assert_eq!(f.code, FaultCode::Unavailable, "{f}");
            assert!(
                f.message.contains("TLS") && f.message.contains("xpired"),
                "{f}"
            );
            stale.stop().await;
        },
    );
}
