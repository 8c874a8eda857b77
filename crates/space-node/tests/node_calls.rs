//! Every call of the node API, each through the whole path a control replica's call takes to
//! a node of a cluster: `RemoteNode` -> mutual TLS -> `NodeServer` -> the fence of a member
//! (`member::FenceGate`) -> `LocalNode` -> the node (on the fake runtime, so the table runs
//! in seconds). A call that is missing anywhere on the path, or that some layer answers with
//! "not here" instead of doing it, fails the table; so does a call the list has and the table
//! forgot. A raised fence refuses every call.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use space_node::api::{
    Call, ClusterCa, Fault, FaultCode, Gate, Gated, Identity, LocalNode, NodeApi, NodeResult,
    NodeServer, RemoteNode, TemplateBuild,
};
use space_node::member::FenceGate;
use space_node::settings::{NodeSettings, SecretMap, SecretValues, StoreSettings};
use space_node::{
    EgressPolicy, Node, NodeConfig, SnapshotKind, State, TemplateRef, TimeoutPolicy, VersionReq,
};
use space_runtime::fake::FakeRuntime;

/// Notes the name of every call that reached it.
#[derive(Clone, Default)]
struct Reached(Arc<Mutex<BTreeSet<&'static str>>>);

impl Gate for Reached {
    fn admit(&self, call: &'static str) -> NodeResult<()> {
        self.0.lock().unwrap().insert(call);
        Ok(())
    }
}

fn fake_config(cfg: &mut NodeConfig) {
    cfg.storage = space_node::storage::StorageOptions {
        driver: Some(space_node::storage::DriverKind::Copy),
        loop_image_size: 0,
        loop_image: false,
    };
    cfg.ready_timeout = Duration::from_secs(10);
    cfg.pools = space_node::PoolConfig::disabled();
    cfg.rolling.enabled = false;
}

/// A made-up kernel and root image (the fake runtime reads neither).
fn inputs(data: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = data.join("inputs");
    std::fs::create_dir_all(&dir).unwrap();
    let (kernel, rootfs) = (dir.join("vmlinux"), dir.join("rootfs.ext4"));
    std::fs::write(&kernel, b"a kernel the fake runtime hashes and never runs").unwrap();
    std::fs::File::create(&rootfs)
        .and_then(|f| f.set_len(4 << 20))
        .unwrap();
    (kernel, rootfs)
}

/// A call answered with a fault that says the call is not served here.
fn not_here(f: &Fault) -> bool {
    f.message.contains("is a call to") || f.message.contains("not here")
}

#[track_caller]
fn done<T>(call: &str, r: NodeResult<T>) -> T {
    match r {
        Ok(v) => v,
        Err(f) => panic!("{call}: {:?} {}", f.code, f.message),
    }
}

#[test]
fn every_call_crosses_the_whole_path_to_the_node() {
    let fake = Arc::new(FakeRuntime::new(env_path("SPACE_GUESTD")));
    let opened = fake.clone();
    with_node_opened(
        Disk::Copy,
        fake_config,
        move |cfg| async move { Node::open_with(cfg, opened).await },
        |node| async move {
            let data = node.layout().root().to_owned();
            let (kernel, rootfs) = inputs(&data);
            let secrets = Arc::new(SecretValues::default());
            let local = LocalNode::new(node.clone(), kernel, [("minimal".into(), rootfs)].into())
                .with_secrets(secrets.clone());
            let fenced = Arc::new(AtomicBool::new(false));
            let reached = Reached::default();
            let api: Arc<dyn NodeApi> = Arc::new(Gated {
                inner: Gated {
                    inner: local,
                    gate: FenceGate(fenced.clone()),
                },
                gate: reached.clone(),
            });
            let ca = ClusterCa::generate().unwrap();
            let leaf = ca.issue_node("node-a", 30).unwrap();
            let server = NodeServer::start(
                api,
                "127.0.0.1:0".parse().unwrap(),
                &Identity::new(&leaf, ca.cert_pem()).unwrap(),
            )
            .await
            .unwrap();
            let control = Identity::new(&ca.issue_control(30).unwrap(), ca.cert_pem()).unwrap();
            let remote =
                RemoteNode::new("node-a", &server.local_addr().to_string(), &control).unwrap();
            let r = &remote;

            // The node's own settings first: an object store (a directory) and a master key,
            // which publishing, fetching and adopting need.
            let objects = data.join("objects");
            std::fs::create_dir_all(&objects).unwrap();
            done(
                "configure",
                r.configure(NodeSettings {
                    store: Some(StoreSettings {
                        url: format!("file://{}", objects.display()),
                        ..Default::default()
                    }),
                    master_key: Some("11".repeat(32)),
                    ..Default::default()
                })
                .await,
            );
            let status = done("status", r.status().await);
            assert_eq!(status.qemu, node.runtime().version().to_string());

            // Templates.
            let minimal = TemplateRef::new("minimal", "1").unwrap();
            let mut build = TemplateBuild::stock(minimal.clone(), "minimal", 1, 64);
            build.build_id = Some("build-1".into());
            build.ready_timeout_ms = 10_000;
            let built = done("build_template", r.build_template(build).await);
            assert_eq!(built.template, minimal);
            let log = done("build_log", r.build_log("build-1", 0).await);
            assert!(log.done && log.text.contains("building minimal"), "{log:?}");
            assert!(done("templates", r.templates().await)
                .iter()
                .any(|t| t.template == minimal));
            let t = done(
                "template",
                r.template(&minimal.name, &VersionReq::Latest).await,
            );
            assert_eq!(t.template, minimal);
            assert_eq!(done("images", r.images().await), ["minimal"]);
            done("publish_template", r.publish_template(&minimal).await);
            assert_eq!(
                done("fetch_template", r.fetch_template(&minimal).await).template,
                minimal
            );
            assert!(done("pools", r.pools().await).is_empty());
            assert!(done("ca_pem", r.ca_pem().await).contains("BEGIN CERTIFICATE"));

            // A sandbox through its lifecycle.
            let sb = done("create", r.create(minimal_request()).await);
            let id = sb.id.clone();
            assert_eq!(done("info", r.info(&id).await).state, State::Running);
            assert!(done("list", r.list().await).iter().any(|s| s.id == id));
            assert!(done("usage", r.usage().await).iter().any(|u| u.id == id));
            done("touch", r.touch(&id).await);
            let (guest, woke) = done("guest", r.guest(&id).await);
            assert_eq!(woke, None);
            assert_eq!(sh(&guest, "echo through").await.trim(), "through");
            done("console_tail", r.console_tail(&id, 1024).await);
            done("metrics", r.metrics(&id, 0, u64::MAX).await);
            let vol = "vol-00000000000000c1";
            let made = done(
                "create_volume",
                r.create_volume(vol, "default", 1 << 20).await,
            );
            assert_eq!(made.size_bytes, 1 << 20);
            assert_eq!(done("volume_info", r.volume_info(vol).await).id, vol);
            // Copies need a btrfs data directory; this node's is plain: both calls reach the
            // node and are refused there, saying why.
            for f in [
                r.sync_volume(vol).await.unwrap_err(),
                r.restore_volume(vol, "default", 1 << 20, 5)
                    .await
                    .unwrap_err(),
            ] {
                assert_eq!(f.code, FaultCode::Invalid, "{f}");
                assert!(f.message.contains("btrfs"), "{f}");
            }
            assert!(done("volumes", r.volumes().await)
                .iter()
                .any(|v| v.id == vol));
            let answer = done(
                "volume_call",
                r.volume_call(
                    vol,
                    space_proto::volume::VolumeRequest::StatFs,
                    space_node::api::Blob(Vec::new()),
                )
                .await,
            );
            assert!(matches!(
                answer.reply,
                space_proto::volume::VolumeReply::StatFs(s) if s.size_bytes == 1 << 20
            ));
            done("delete_volume", r.delete_volume(vol).await);
            let snap = done("snapshot", r.snapshot(&id, SnapshotKind::Full).await);
            done("rollback", r.rollback(&id, &snap.id).await);
            let timeouts = TimeoutPolicy {
                idle: Some(Duration::from_secs(600)),
                ..TimeoutPolicy::default()
            };
            let after = done("set_timeouts", r.set_timeouts(&id, timeouts).await);
            assert_eq!(after.options.timeouts, timeouts);
            let policy: EgressPolicy = serde_json::from_value(serde_json::json!({
                "default": "deny", "allow": ["example.com"]
            }))
            .unwrap();
            let after = done("set_egress", r.set_egress(&id, policy.clone()).await);
            assert_eq!(after.options.egress, policy);
            let mut values = std::collections::BTreeMap::new();
            values.insert(
                "TOKEN".to_owned(),
                space_node::api::rpc::encode_bytes(b"value"),
            );
            done("set_secrets", r.set_secrets(&id, SecretMap(values)).await);
            assert!(secrets.has(&id));
            done("forget_secret", r.forget_secret("TOKEN").await);
            assert!(!secrets.has(&id));
            done("pause", r.pause(&id).await);
            assert_eq!(
                done("wake", r.wake(&id).await),
                Some(space_node::api::Woke::Resume)
            );
            done("pause", r.pause(&id).await);
            done("resume", r.resume(&id).await);
            let child = done("fork", r.fork(&id).await);
            let saved = TemplateRef::new("saved", "1").unwrap();
            assert_eq!(
                done(
                    "save_template",
                    r.save_template(&child.id, &saved, true).await
                )
                .template,
                saved
            );
            done("kill", r.kill(&child.id).await);
            done("delete_template", r.delete_template(&saved).await);

            // Suspended into the store, given up, taken back under a new epoch.
            done("suspend", r.suspend(&id).await);
            wait_until(
                "the suspend snapshot is in the store",
                Duration::from_secs(60),
                || node.archive().is_some(),
            )
            .await;
            for _ in 0..600 {
                let info = done("info", r.info(&id).await);
                if info.snapshots.iter().any(|s| s.remote.is_some()) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            done("discard", r.discard(&id).await);
            let back = done("adopt", r.adopt(&id, "default", 1).await);
            assert_eq!(back.state, State::Suspended);
            done("restore", r.restore(&id).await);
            assert_eq!(done("info", r.info(&id).await).state, State::Running);

            // Every call of the list reached the node, and guest traffic too.
            let mut want: BTreeSet<&str> = Call::NAMES.iter().copied().collect();
            want.insert("guest");
            assert_eq!(*reached.0.lock().unwrap(), want);

            // A raised fence refuses every call, with the node's reason.
            fenced.store(true, Ordering::SeqCst);
            for f in [
                r.status().await.map(|_| ()).unwrap_err(),
                r.info(&id).await.map(|_| ()).unwrap_err(),
                r.guest(&id).await.map(|_| ()).unwrap_err(),
                r.build_log("build-1", 0).await.map(|_| ()).unwrap_err(),
                r.save_template(&id, &saved, true)
                    .await
                    .map(|_| ())
                    .unwrap_err(),
            ] {
                assert_eq!(f.code, FaultCode::Unavailable, "{f}");
                assert!(f.message.contains("fenced"), "{f}");
                assert!(!not_here(&f));
            }
            fenced.store(false, Ordering::SeqCst);
            done("kill", r.kill(&id).await);
            server.stop().await;
        },
    );
}

fn minimal_request() -> space_node::CreateRequest {
    space_node::CreateRequest::new("minimal".parse().unwrap())
}
