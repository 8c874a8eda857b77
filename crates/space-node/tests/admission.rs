//! Admission control against real guests: a create the node has no memory for is refused and
//! changes nothing; a node with a small budget refuses the VM that does not fit, and admits it
//! again once another one is suspended.

mod common;

use common::*;
use space_node::{AdmissionConfig, NodeError, SandboxOptions};

fn no_background_vms(c: &mut space_node::NodeConfig) {
    c.pools.sizes.clear();
    c.pools.default_size = 0;
    c.rolling.enabled = false;
}

/// Sandbox directories and records on the node.
fn footprint(node: &space_node::Node) -> (usize, usize) {
    let count = |d: std::path::PathBuf| std::fs::read_dir(d).map(|e| e.count()).unwrap_or(0);
    (
        count(node.layout().sandboxes()),
        count(node.layout().root().join("state").join("sandboxes")),
    )
}

#[test]
fn a_create_larger_than_the_host_is_refused_and_changes_nothing() {
    with_node(Disk::Btrfs, no_background_vms, |node| async move {
        build_minimal(&node, "1").await;
        let before = footprint(&node);
        let mut req = minimal();
        // More than this host has (and a shape that would cold-boot: refused before that).
        req.options.memory_mib = Some(1 << 20);
        let e = node.create(req).await.unwrap_err();
        // No waiting makes room for it: a bad request, not a full node.
        assert!(matches!(e, NodeError::Invalid(_)), "{e:?}");
        assert!(e.is_refusal());
        let msg = e.to_string();
        assert!(
            msg.contains(
                "a sandbox of 1048576 MiB and 1 vCPUs is larger than this node can ever hold"
            ),
            "{msg}"
        );
        assert_eq!(footprint(&node), before);
        assert!(node.list().await.unwrap().is_empty());
    });
}

#[test]
fn a_small_budget_refuses_the_second_vm() {
    with_node(
        Disk::Btrfs,
        |c| {
            no_background_vms(c);
            // One 256 MiB guest plus its 256 MiB overhead fits; two do not.
            c.admission = AdmissionConfig {
                memory_budget_mib: Some(700),
                ..AdmissionConfig::default()
            };
        },
        |node| async move {
            build_minimal(&node, "1").await;
            let first = create(&node, SandboxOptions::default()).await;
            let before = footprint(&node);
            let e = node.create(minimal()).await.unwrap_err();
            assert!(matches!(e, NodeError::Capacity(_)), "{e:?}");
            assert!(
                e.to_string()
                    .contains("512 MiB committed to 1 VMs of the node's budget of 700 MiB"),
                "{e}"
            );
            assert_eq!(footprint(&node), before);
            // A fork needs a VM too.
            assert!(matches!(
                node.fork(&first).await.unwrap_err(),
                NodeError::Capacity(_)
            ));
            // Suspending frees the room; the suspended one cannot come back while the other
            // holds it.
            node.suspend(&first).await.unwrap();
            let second = create(&node, SandboxOptions::default()).await;
            let e = node.restore(&first).await.unwrap_err();
            assert!(matches!(e, NodeError::Capacity(_)), "{e:?}");
            node.kill(&second).await.unwrap();
            node.restore(&first).await.unwrap();
        },
    );
}
