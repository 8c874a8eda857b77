//! The node operations the public API adds on top of the lifecycle, with real guests:
//!
//! - changing a running sandbox's timeouts takes effect at the reconciler's next pass and is
//!   kept in the record;
//! - the console tail holds what the guest writes to its console and is bounded;
//! - a template build in use cannot be deleted; once its sandboxes are killed it can, and it
//!   is gone from the list;
//! - a node that shuts down detached leaves its VMs running, and the next node on the same
//!   data directory adopts them with what the guest had in memory.

mod common;

use std::time::Duration;

use common::*;
use space_node::{
    Node, NodeConfig, NodeError, PoolConfig, RecoveryAction, SandboxOptions, State, TimeoutAction,
    TimeoutPolicy, VersionReq,
};

#[test]
fn timeouts_console_and_template_deletion() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            let template = build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;

            // Timeouts: from the 15-minute default to a 1-second idle timeout that kills.
            let before = node.info(&id).await.unwrap();
            assert_eq!(before.options.timeouts, TimeoutPolicy::default());
            let policy = TimeoutPolicy {
                idle: Some(Duration::from_secs(1)),
                max_lifetime: None,
                action: TimeoutAction::Kill,
            };
            let after = node.set_timeouts(&id, policy).await.unwrap();
            assert_eq!(after.options.timeouts, policy);
            let on_disk: space_node::SandboxRecord =
                serde_json::from_slice(&record_bytes(&node, &id)).unwrap();
            assert_eq!(
                on_disk.options.timeouts, policy,
                "the record keeps the new policy"
            );
            let zero = TimeoutPolicy {
                idle: Some(Duration::ZERO),
                ..policy
            };
            assert!(matches!(
                node.set_timeouts(&id, zero).await,
                Err(NodeError::Invalid(_))
            ));

            // The console: what the guest writes there, and no more than asked for. (A sandbox
            // restored from the template's snapshot never printed a boot banner of its own.)
            let client = node.guest(&id).await.unwrap();
            sh(&client, "echo console-marker-$((6*7)) > /dev/console").await;
            drop(client);
            let console = node.console_tail(&id, 64 << 10).await.unwrap();
            let text = String::from_utf8_lossy(&console);
            assert!(text.contains("console-marker-42"), "console: {text}");
            let tail = node.console_tail(&id, 5).await.unwrap();
            assert_eq!(tail, console[console.len() - 5..]);

            // In use: refused, nothing removed.
            match node.delete_template(&template).await {
                Err(NodeError::TemplateInUse { sandbox, count, .. }) => {
                    assert_eq!(sandbox, id);
                    assert_eq!(count, 1);
                }
                other => panic!("expected TemplateInUse, got {other:?}"),
            }
            node.template(&template.name, &VersionReq::Latest).unwrap();

            // The 1-second idle timeout fires and kills (the node's own reconciler or this call,
            // whichever comes first).
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while node.info(&id).await.unwrap().state != State::Terminated {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the idle timeout never fired"
                );
                node.reconcile_timeouts().await;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(node.console_tail(&id, 1024).await.unwrap().is_empty());

            node.delete_template(&template).await.unwrap();
            assert!(node.templates().unwrap().is_empty());
            assert!(matches!(
                node.template(&template.name, &VersionReq::Latest),
                Err(NodeError::TemplateNotFound(_))
            ));
            assert!(matches!(
                node.delete_template(&template).await,
                Err(NodeError::TemplateNotFound(_))
            ));
        },
    );
}

#[test]
fn detached_shutdown_leaves_vms_for_the_next_node() {
    with_node(
        Disk::Btrfs,
        |_| {},
        |node| async move {
            build_minimal(&node, "1").await;
            let id = create(&node, SandboxOptions::default()).await;
            let client = node.guest(&id).await.unwrap();
            // Only in guest memory (tmpfs): survives only if the VM itself does.
            sh(&client, "echo kept > /tmp/marker").await;
            let pid = start_sleeper(&client).await;
            drop(client);
            let data = node.layout().root().to_path_buf();
            node.shutdown_detach().await;

            let mut cfg = NodeConfig::new(&data);
            cfg.pools = PoolConfig::disabled();
            cfg.rolling.enabled = false;
            let next = Node::open(cfg).await.expect("reopening the node");
            let info = next.info(&id).await.unwrap();
            assert_eq!(info.state, State::Running);
            assert_eq!(
                info.recoveries.last().map(|e| e.action),
                Some(RecoveryAction::Adopted)
            );
            let client = next.guest(&id).await.unwrap();
            assert_eq!(sh(&client, "cat /tmp/marker").await.trim(), "kept");
            assert!(
                alive(&client, pid).await,
                "a process from before still runs"
            );
            drop(client);
            next.shutdown().await;
        },
    );
}
