//! A cluster on one machine, with real guests: two control replicas over one PostgreSQL
//! database, and two nodes (each its own data directory and loop image) that joined with
//! one-time tokens and serve the node API over mutual TLS.
//!
//! - a wrong or reused join token is refused; both nodes are listed live;
//! - creates spread over the nodes, and each sandbox answers exec and a 2 MiB upload and
//!   download (by SHA-256) through either replica;
//! - secret values reach only the node of a sandbox bound to them, and follow a new value;
//! - tenants stay isolated across replicas, and a tenant's quota holds across them;
//! - a sandbox the database gives to another node is discarded by the node it left;
//! - a draining node takes no new sandbox; removing a node makes its heartbeats stale.

mod in_process;
mod kit;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use in_process::{env_path, node_config, with_data_dirs, Api};
use kit::upstream::{https_upstream, Seen};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use space_control::replica::{Replica, ReplicaConfig};
use space_control::vault::VaultKey;
use space_node::api::{LocalNode, TemplateBuild};
use space_node::audit_spool::EgressSpool;
use space_node::member::{Member, MemberConfig};
use space_node::settings::SecretValues;
use space_node::{Node, NodeApi, TemplateRef};
use std::sync::Arc;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// A node joined with `token`. With `upstream_ca`, its gateway also trusts that CA and it
/// has the `base` template (curl), as well as `minimal`.
async fn start_node(
    data: &std::path::Path,
    id: &str,
    control: &str,
    token: &str,
    upstream_ca: Option<&std::path::Path>,
) -> (Node, Member, Arc<SecretValues>) {
    let secrets = Arc::new(SecretValues::default());
    let spool = EgressSpool::new(data.join("state").join(space_node::audit_spool::SPOOL_DIR));
    let mut cfg = node_config(data);
    cfg.gateway.extra_roots = upstream_ca.into_iter().map(|p| p.to_path_buf()).collect();
    cfg.gateway.secrets = Some(secrets.clone());
    cfg.gateway.audit = Some(spool.clone());
    let node = Node::open(cfg).await.expect("opening a node");
    spool.open().expect("opening the spool");
    let mut images = BTreeMap::from([("minimal".to_string(), env_path("SPACE_ROOTFS_MINIMAL"))]);
    if upstream_ca.is_some() {
        images.insert("base".into(), env_path("SPACE_ROOTFS_BASE"));
    }
    let local = LocalNode::new(node.clone(), env_path("SPACE_KERNEL"), images.clone())
        .with_secrets(secrets.clone());
    for name in images.keys() {
        local
            .build_template(TemplateBuild::stock(
                TemplateRef::new(name, "1").unwrap(),
                name,
                1,
                256,
            ))
            .await
            .unwrap_or_else(|e| panic!("building {name}: {e}"));
    }
    let port = free_port();
    let member = Member::start(
        local,
        data,
        MemberConfig {
            control: control.to_owned(),
            join_token: Some(token.to_owned()),
            node_id: id.to_owned(),
            advertise: format!("127.0.0.1:{port}"),
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            egress: Some(spool),
        },
    )
    .await
    .expect("joining");
    (node, member, secrets)
}

/// A join request with `token` for `node_id` and public key `key` (base64), answered as is.
async fn join(api: &Api, token: &str, node_id: &str, key: &str) -> (u16, Value) {
    api.call(
        "POST",
        "/v1/cluster/join",
        None,
        Some(
            json!({"token": token, "node_id": node_id, "address": "127.0.0.1:1",
                    "public_key": key}),
        ),
    )
    .await
}

async fn token(api: &Api, admin: &str) -> String {
    api.ok(
        "POST",
        "/v1/cluster/join-tokens",
        admin,
        Some(json!({"ttl_s": 600})),
        201,
    )
    .await["token"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn two_replicas_two_nodes() {
    with_data_dirs(2, |dirs| async move {
        let database = in_process::postgres::database();
        let vault_key = VaultKey::generate();
        let config = |key: &VaultKey| ReplicaConfig {
            tls: Default::default(),
            database: database.clone(),
            listen: "127.0.0.1:0".parse().unwrap(),
            vault_key: key.clone(),
            max_upload_bytes: 8 << 20,
            max_body_bytes: 1 << 20,
            ready_timeout: Duration::from_secs(120),
            archive: None,
        };
        let r1 = Replica::start(config(&vault_key)).await.expect("replica 1");
        let admin = r1
            .bootstrap_key()
            .expect("the first start makes a key")
            .to_owned();
        let r2 = Replica::start(config(&vault_key)).await.expect("replica 2");
        assert!(
            r2.bootstrap_key().is_none(),
            "one deployment, one bootstrap key"
        );
        let (a1, a2) = (Api::new(r1.url()), Api::new(r2.url()));

        // Joining: a made-up token is refused; each node joins with its own.
        let key = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            space_node::api::NodeKey::generate().unwrap().public_raw(),
        );
        let bogus = format!("spacejoin_{}_{}", "a".repeat(12), "b".repeat(32));
        let (status, v) = join(&a1, &bogus, "node-x", &key).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (401, Some("unauthorized")),
            "{v}"
        );
        let t1 = token(&a1, &admin).await;
        let t2 = token(&a2, &admin).await;
        // A key of the wrong form is the caller's fault (400), and the token still works.
        let short = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [4u8; 33]);
        let (status, v) = join(&a1, &t1, "node-a", &short).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("invalid_request")),
            "{v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .contains("public_key"),
            "{v}"
        );
        // An HTTPS upstream only node-a's gateway trusts (and only node-a has `base`).
        let tls_seen = Seen::default();
        let (tls_port, upstream_ca) = https_upstream(tls_seen.clone()).await;
        let ca_file = dirs[0].with_extension("upstream-ca.pem");
        std::fs::write(&ca_file, upstream_ca).unwrap();
        let (node_a, member_a, secrets_a) =
            start_node(&dirs[0], "node-a", &r1.url(), &t1, Some(&ca_file)).await;
        let (node_b, member_b, secrets_b) =
            start_node(&dirs[1], "node-b", &r2.url(), &t2, None).await;
        let (status, v) = join(&a1, &t1, "node-y", &key).await;
        assert_eq!(status, 401, "a used token: {v}");
        let nodes = a2.ok("GET", "/v1/nodes", &admin, None, 200).await;
        let live: Vec<&str> = nodes["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["live"] == true && n["state"] == "active")
            .map(|n| n["id"].as_str().unwrap())
            .collect();
        assert_eq!(live, ["node-a", "node-b"], "{nodes}");

        // Each replica's /metrics shows every node.
        let text = reqwest::get(format!("{}/metrics", r2.url()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for line in [
            "space_node_up{node=\"node-a\"} 1",
            "space_node_up{node=\"node-b\"} 1",
        ] {
            assert!(text.contains(line), "no {line} in /metrics");
        }

        // Creates spread over both nodes; every sandbox answers through either replica.
        let mut ids = Vec::new();
        for i in 0..4 {
            let api = if i % 2 == 0 { &a1 } else { &a2 };
            let sb = api
                .ok(
                    "POST",
                    "/v1/sandboxes",
                    &admin,
                    Some(json!({"template": "minimal"})),
                    201,
                )
                .await;
            ids.push(sb["id"].as_str().unwrap().to_owned());
        }
        let mut on = BTreeMap::new();
        for id in &ids {
            let (node, epoch) = r1.store().sandbox_node(id).await.unwrap().expect("placed");
            assert_eq!(epoch, 1);
            // An admin's answer names the node that holds it, through either replica.
            for api in [&a1, &a2] {
                let sb = api
                    .ok("GET", &format!("/v1/sandboxes/{id}"), &admin, None, 200)
                    .await;
                assert_eq!(sb["node"], json!(node), "{sb}");
            }
            *on.entry(node).or_insert(0) += 1;
        }
        assert_eq!(on.len(), 2, "creates all went to one node: {on:?}");
        let data: Vec<u8> = (0..(2 << 20)).map(|i: u32| (i * 7 % 253) as u8).collect();
        for (i, id) in ids.iter().enumerate() {
            let (writer, reader) = if i % 2 == 0 { (&a1, &a2) } else { (&a2, &a1) };
            assert_eq!(
                writer.sh(&admin, id, "echo from-$((6*7))").await,
                "from-42\n"
            );
            let resp = writer
                .request(
                    "PUT",
                    &format!("/v1/sandboxes/{id}/files?path=/tmp/blob"),
                    Some(&admin),
                )
                .body(data.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let got = reader
                .request(
                    "GET",
                    &format!("/v1/sandboxes/{id}/files?path=/tmp/blob"),
                    Some(&admin),
                )
                .send()
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            assert_eq!(sha(&got), sha(&data));
            let in_guest = reader
                .sh(&admin, id, "sha256sum /tmp/blob | cut -d' ' -f1")
                .await;
            assert_eq!(in_guest.trim(), sha(&data));
        }

        // Secret values reach the node of a sandbox bound to them, in memory, and only that
        // node; a new value replaces them there; a kill drops them.
        a1.ok(
            "PUT",
            "/v1/secrets/TOKEN",
            &admin,
            Some(json!({"value": "first-value", "hosts": ["api.example.com"]})),
            201,
        )
        .await;
        let sb = a2
            .ok(
                "POST",
                "/v1/sandboxes",
                &admin,
                Some(json!({"template": "minimal", "secrets": ["TOKEN"]})),
                201,
            )
            .await;
        let bound: space_node::SandboxId = sb["id"].as_str().unwrap().parse().unwrap();
        let (home, _) = r1
            .store()
            .sandbox_node(bound.as_str())
            .await
            .unwrap()
            .unwrap();
        let (mine, theirs) = if home == "node-a" {
            (&secrets_a, &secrets_b)
        } else {
            (&secrets_b, &secrets_a)
        };
        let wait_value = |want: Option<&'static [u8]>| {
            let (mine, bound) = (mine.clone(), bound.clone());
            async move {
                for _ in 0..200 {
                    if mine.get(&bound, "TOKEN").as_deref() == want {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                false
            }
        };
        assert!(
            wait_value(Some(b"first-value")).await,
            "the value did not reach {home}"
        );
        assert!(!theirs.has(&bound), "the other node got the values");
        a2.ok(
            "PUT",
            "/v1/secrets/TOKEN",
            &admin,
            Some(json!({"value": "second-value", "hosts": ["api.example.com"]})),
            200,
        )
        .await;
        assert!(
            wait_value(Some(b"second-value")).await,
            "the new value did not replace it"
        );
        a1.ok(
            "DELETE",
            &format!("/v1/sandboxes/{bound}"),
            &admin,
            None,
            200,
        )
        .await;
        assert!(wait_value(None).await, "a killed sandbox keeps its values");

        // A credential injected over HTTPS by a node's gateway: the upstream gets the value,
        // and the node delivers `credential.use` to the audit log, read here through the
        // replica the sandbox was not made through.
        a1.ok(
            "PUT",
            "/v1/secrets/UPSTREAM",
            &admin,
            Some(json!({"value": "upstream-value", "hosts": ["127.0.0.1"]})),
            201,
        )
        .await;
        let sb = a1
            .ok(
                "POST",
                "/v1/sandboxes",
                &admin,
                Some(json!({"template": "base", "secrets": ["UPSTREAM"],
                    "egress": {"default": "allow", "allow": ["127.0.0.1"], "deny": []}})),
                201,
            )
            .await;
        assert_eq!(sb["node"], "node-a", "{sb}");
        let user: space_node::SandboxId = sb["id"].as_str().unwrap().parse().unwrap();
        let mut delivered = false;
        for _ in 0..200 {
            if secrets_a.get(&user, "UPSTREAM").as_deref() == Some(&b"upstream-value"[..]) {
                delivered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(delivered, "the value did not reach node-a");
        let out = a1
            .sh(
                &admin,
                user.as_str(),
                &format!(
                    "unset NO_PROXY no_proxy; curl -sS -m 30 -H \"Authorization: Bearer $UPSTREAM\" \
                     https://127.0.0.1:{tls_port}/cluster-tls"
                ),
            )
            .await;
        assert_eq!(out, "upstream saw /cluster-tls\n");
        let heads = tls_seen.with_path("/cluster-tls");
        assert_eq!(heads.len(), 1, "{heads:?}");
        assert!(
            heads[0].contains("Bearer upstream-value"),
            "the upstream did not get the value: {}",
            heads[0]
        );
        let mut used = Vec::new();
        for _ in 0..300 {
            let v = a2
                .ok(
                    "GET",
                    &format!("/v1/audit?sandbox={user}&operation=credential.use"),
                    &admin,
                    None,
                    200,
                )
                .await;
            used = v["events"].as_array().cloned().unwrap_or_default();
            if !used.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            used.len(),
            1,
            "credential.use never reached the audit log: {used:?}"
        );
        assert_eq!(used[0]["tenant"], "default", "{used:?}");
        assert_eq!(used[0]["result"], "ok", "{used:?}");
        assert!(
            used[0]["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("UPSTREAM"),
            "{used:?}"
        );
        assert!(
            !used[0].to_string().contains("upstream-value"),
            "a secret's value in the audit log: {used:?}"
        );
        a2.ok(
            "DELETE",
            &format!("/v1/sandboxes/{user}"),
            &admin,
            None,
            200,
        )
        .await;

        // A sandbox given to another node (as failover does) stops running on the node it
        // left: that node's next heartbeat names it, and the node discards it (VM, files
        // and record).
        let mut moved = None;
        for id in &ids {
            if r1.store().sandbox_node(id).await.unwrap().unwrap().0 == "node-a" {
                moved = Some(id.clone());
                break;
            }
        }
        let moved = moved.expect("a sandbox on node-a");
        let epoch = r1
            .store()
            .move_sandbox(&moved, Some(("node-a", 1)), "node-b")
            .await
            .unwrap();
        assert_eq!(epoch, Some(2));
        let sid: space_node::SandboxId = moved.parse().unwrap();
        let mut stopped = false;
        for _ in 0..100 {
            if matches!(
                node_a.info(&sid).await,
                Err(space_node::NodeError::NotFound(_))
            ) {
                stopped = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let dir = node_a.layout().sandbox_dir(&moved).unwrap();
        assert!(!dir.exists(), "{} is left on node-a", dir.display());
        assert!(
            stopped,
            "node-a still runs {moved}, which belongs to node-b now"
        );
        ids.retain(|i| *i != moved);

        // Tenants stay isolated across replicas.
        let created = a1
            .ok(
                "POST",
                "/v1/tenants",
                &admin,
                Some(json!({"name": "other", "quotas": {"max_sandboxes": 2}})),
                201,
            )
            .await;
        let other = created["key"]["key"].as_str().unwrap().to_owned();
        // Its quota holds across replicas: six creates at once through both, room for two.
        let tries: Vec<_> = (0..6)
            .map(|i| {
                let api = if i % 2 == 0 { a1.clone() } else { a2.clone() };
                let key = other.clone();
                tokio::spawn(async move {
                    api.call(
                        "POST",
                        "/v1/sandboxes",
                        Some(&key),
                        Some(json!({"template": "minimal"})),
                    )
                    .await
                })
            })
            .collect();
        let mut theirs = Vec::new();
        let mut refused = 0;
        for t in tries {
            match t.await.unwrap() {
                (201, v) => theirs.push(v["id"].as_str().unwrap().to_owned()),
                (429, v) => {
                    assert_eq!(v["error"]["code"], "quota_exceeded", "{v}");
                    refused += 1;
                }
                (status, v) => panic!("a create answered {status}: {v}"),
            }
        }
        assert_eq!((theirs.len(), refused), (2, 4), "{theirs:?}");
        a2.err(
            "GET",
            &format!("/v1/sandboxes/{}", ids[0]),
            Some(&other),
            None,
            404,
            "sandbox_not_found",
        )
        .await;
        let listed = a2.ok("GET", "/v1/sandboxes", &other, None, 200).await;
        assert_eq!(listed["sandboxes"].as_array().unwrap().len(), 2);
        // A tenant does not see where its sandboxes run.
        for sb in listed["sandboxes"].as_array().unwrap() {
            assert!(sb.get("node").is_none(), "{sb}");
        }
        for id in &theirs {
            a1.ok("DELETE", &format!("/v1/sandboxes/{id}"), &other, None, 200)
                .await;
        }
        let listed = a1.ok("GET", "/v1/sandboxes", &admin, None, 200).await;
        assert_eq!(listed["sandboxes"].as_array().unwrap().len(), 3);

        // A draining node takes nothing new.
        a1.ok("POST", "/v1/nodes/node-b/drain", &admin, None, 200)
            .await;
        for _ in 0..2 {
            let sb = a2
                .ok(
                    "POST",
                    "/v1/sandboxes",
                    &admin,
                    Some(json!({"template": "minimal"})),
                    201,
                )
                .await;
            let id = sb["id"].as_str().unwrap();
            let (node, _) = r2.store().sandbox_node(id).await.unwrap().unwrap();
            assert_eq!(node, "node-a");
            ids.push(id.to_owned());
        }
        for id in &ids {
            a1.ok("DELETE", &format!("/v1/sandboxes/{id}"), &admin, None, 200)
                .await;
        }
        // A removed node's incarnation is stale: its heartbeats are refused from now on.
        a2.ok("DELETE", "/v1/nodes/node-b", &admin, None, 200).await;
        let row = r1.store().node("node-b").await.unwrap().unwrap();
        assert_eq!(row.state, space_control::store::NodeState::Removed);
        let audit = a1
            .ok("GET", "/v1/audit?operation=node.join", &admin, None, 200)
            .await;
        let results: Vec<&str> = audit["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["result"].as_str().unwrap())
            .collect();
        assert_eq!(
            results,
            [
                "unauthorized",
                "ok",
                "ok",
                "invalid_request",
                "unauthorized"
            ],
            "{audit}"
        );

        member_a.stop().await;
        member_b.stop().await;
        r1.shutdown().await;
        r2.shutdown().await;
        node_a.shutdown().await;
        node_b.shutdown().await;
    });
}
