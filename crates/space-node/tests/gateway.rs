//! The node's side of the egress gateway on a real guest; the gateway itself is tested
//! through its wire protocol in `crates/space-gateway/tests`.

mod common;

use space_node::{EgressPolicy, SecretBinding};

fn policy(json: &str) -> EgressPolicy {
    serde_json::from_str(json).unwrap()
}

/// The node's side on a real guest: the CA made at first start (key 0600) and sent with the
/// identity, the placeholder (never a value) in the guest's environment, an environment that
/// would hide the placeholder refused, the policy changed live, kept in the record and copied
/// by fork.
#[test]
fn node_sends_placeholders_and_keeps_the_policy() {
    common::with_node(
        common::Disk::Btrfs,
        |_| {},
        |node| async move {
            common::build_minimal(&node, "1").await;
            let ca_dir = node.layout().root().join("state").join("ca");
            let key_mode = std::fs::metadata(ca_dir.join("ca.key"))
                .unwrap()
                .permissions();
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&key_mode) & 0o777,
                0o600
            );
            assert_eq!(
                std::fs::read_to_string(ca_dir.join("ca.pem")).unwrap(),
                node.ca_pem()
            );
            let binding =
                SecretBinding::new("GITHUB_TOKEN", vec!["api.github.com".parse().unwrap()]);
            let mut options = space_node::SandboxOptions {
                egress: policy(r#"{"default": "deny", "allow": ["pypi.org"]}"#),
                secrets: vec![binding.clone()],
                ..Default::default()
            };
            options.env.insert("GITHUB_TOKEN".into(), "mine".into());
            let mut req = common::minimal();
            req.options = options.clone();
            let err = node.create(req).await.unwrap_err();
            assert!(err.to_string().contains("GITHUB_TOKEN"), "{err}");
            options.env.clear();
            let id = common::create(&node, options).await;
            let g = node.guest(&id).await.unwrap();
            assert_eq!(
                common::sh(&g, "echo $GITHUB_TOKEN").await.trim(),
                binding.placeholder
            );
            let info = node
                .set_egress(&id, policy(r#"{"allow": ["*.example.org:443"]}"#))
                .await
                .unwrap();
            assert_eq!(
                info.options.egress.allow[0].to_string(),
                "*.example.org:443"
            );
            let on_disk: serde_json::Value =
                serde_json::from_slice(&std::fs::read(node.record_path(&id)).unwrap()).unwrap();
            assert_eq!(
                on_disk["options"]["egress"]["allow"][0],
                "*.example.org:443"
            );
            assert_eq!(on_disk["options"]["secrets"][0]["name"], "GITHUB_TOKEN");
            let bad = serde_json::from_str::<EgressPolicy>(r#"{"allow": ["a b"]}"#);
            assert!(bad.is_err());
            let child = node.fork(&id).await.unwrap();
            assert_eq!(child.options.egress, info.options.egress);
            assert_eq!(child.options.secrets, vec![binding.clone()]);
            let cg = node.guest(&child.id).await.unwrap();
            assert_eq!(
                common::sh(&cg, "echo $GITHUB_TOKEN").await.trim(),
                binding.placeholder
            );
            node.kill(&child.id).await.unwrap();
            node.kill(&id).await.unwrap();
        },
    );
}
