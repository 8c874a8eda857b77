//! The API end to end, in the part no sandbox's guest is needed for: open routes and
//! authentication, the template list, tenants and keys, bad requests and revoked keys; and a
//! restart of the server on the same data directory, which keeps keys, ownership and a
//! running VM. A real server on 127.0.0.1:0 over a real node (loop-mounted btrfs in a temp
//! dir), driven over HTTP like any client.
//!
//! The rest of the API's end-to-end checks are in `api_sandbox.rs` (create, exec, PTY,
//! files, logs), `api_lifecycle.rs` (pause, snapshots, rollback, timeouts, suspend, wake on
//! access, fork, kill) and `api_tenants.rs` (a second tenant: quotas, idempotency,
//! isolation; template builds); each binary has its own server, so one failure hides none
//! of the others.

use serde_json::{json, Value};
use space::Host;
use space_control::api::net::INGRESS_TOKEN_LEN;
use space_control::api::ROUTES;

mod in_process;

use in_process::{server_config, with_data_dir, with_server, Api};

/// What any caller meets first: authentication, tenants and keys, refusals of bad requests.
#[test]
fn open_routes_keys_tenants_and_bad_requests() {
    with_server(|api, admin| async move { checks(&api, &admin).await });
}

#[test]
fn a_restart_keeps_keys_ownership_and_the_running_vm() {
    with_data_dir(|data| async move {
        let config = server_config(&data);
        let server = Host::start(config.clone()).await.expect("starting");
        let admin = server
            .bootstrap_key()
            .expect("first start makes a key")
            .to_owned();
        let api = Api::new(server.url());
        let a = api.create(&admin, "minimal").await;
        api.sh(&admin, &a, "echo survivor > /tmp/mark").await;
        server.shutdown().await;

        // The VM is adopted, not rebooted: the file in its /tmp is still there.
        let server = Host::start(config).await.expect("restarting");
        assert!(server.bootstrap_key().is_none());
        let api = Api::new(server.url());
        let sb = api
            .ok("GET", &format!("/v1/sandboxes/{a}"), &admin, None, 200)
            .await;
        assert_eq!(sb["state"], "running");
        assert_eq!(api.sh(&admin, &a, "cat /tmp/mark").await, "survivor\n");
        api.ok("DELETE", &format!("/v1/sandboxes/{a}"), &admin, None, 200)
            .await;
        server.shutdown().await;
    });
}

/// The routes nodes call, authenticated by a join token or a node's secret.
const NODE_ROUTES: &[&str] = &[
    "node.join",
    "node.rejoin",
    "node.heartbeat",
    "node.claim",
    "node.audit",
];

/// Every route of the table reaches its handler (no fallback answers it), each refuses a
/// caller without a key (and leaves an audit event) unless it is open, and what no route
/// matches is answered in JSON. A node on the copy driver: no guest is started.
#[test]
fn every_route_is_routed_and_the_rest_is_json() {
    with_data_dir(|data| async move {
        let mut node = space_node::NodeConfig::new(&data);
        node.storage = space_node::storage::StorageOptions {
            driver: Some(space_node::storage::DriverKind::Copy),
            loop_image_size: 0,
            loop_image: false,
        };
        node.pools = space_node::PoolConfig::disabled();
        node.rolling.enabled = false;
        node.timeout_tick = None;
        let mut cfg = space::HostConfig::new(node, "/nonexistent");
        cfg.server.listen = "127.0.0.1:0".parse().unwrap();
        cfg.server.database = in_process::test_database();
        let server = Host::start(cfg).await.expect("starting");
        let http = reqwest::Client::new();
        let call = |method: &'static str, path: String| {
            let req = http.request(method.parse().unwrap(), format!("{}{path}", server.url()));
            async move {
                let resp = req.send().await.expect("sending");
                let status = resp.status().as_u16();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                (status, body)
            }
        };
        for r in ROUTES {
            let path = r
                .path
                .replace("{id}", "sbx-0011223344556677")
                .replace("{name}", "acme")
                .replace("{version}", "1")
                .replace("{key_id}", "k00000000000000a")
                .replace("{port}", "8000")
                .replace("{token}", &"t".repeat(INGRESS_TOKEN_LEN))
                .replace("{*path}", "some/path");
            let (status, body) = call(r.method, path).await;
            assert!(
                body["error"]["code"] != "route_not_found"
                    && body["error"]["code"] != "method_not_allowed",
                "{r:?} hit a fallback: {status} {body}"
            );
            // Everything but the open routes wants a key; an unknown ingress token is 404.
            if r.operation == "console.page" {
                // The console's page is HTML, for a person to log in on.
                assert_eq!(status, 200, "{r:?}");
            } else if r.operation.starts_with("ingress.")
                || matches!(r.operation, "browser.live" | "console.file")
            {
                assert_eq!(status, 404, "{r:?}: {body}");
                assert_eq!(body["error"]["code"], "not_found");
            } else if NODE_ROUTES.contains(&r.operation) {
                // Nodes authenticate in the body; without one it is refused as malformed.
                assert!((400..500).contains(&status), "{r:?}: {status} {body}");
                assert!(body["error"]["code"].is_string(), "{r:?}: {body}");
            } else if !matches!(r.operation, "health" | "openapi" | "metrics" | "tls.ca") {
                assert_eq!(status, 401, "{r:?}: {body}");
                assert_eq!(body["error"]["code"], "unauthorized");
            } else {
                assert_eq!(status, 200, "{r:?}");
            }
        }
        let (status, body) = call("GET", "/v1/nothing/here".into()).await;
        assert_eq!(status, 404);
        assert_eq!(body["error"]["code"], "route_not_found");
        let (status, body) = call("PATCH", "/v1/sandboxes".into()).await;
        assert_eq!(status, 405);
        assert_eq!(body["error"]["code"], "method_not_allowed");
        assert_eq!(server.metrics().requests("route_not_found", 404), 1);
        assert_eq!(server.metrics().requests("method_not_allowed", 405), 1);
        assert_eq!(server.metrics().requests("sandbox.create", 401), 1);
        // Each refused request left an audit event.
        let events = server
            .store()
            .audit(&space_control::store::AuditFilter {
                operation: Some("auth".into()),
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap();
        let open = ROUTES
            .iter()
            .filter(|r| {
                r.operation.starts_with("ingress.")
                    || r.operation == "browser.live"
                    || NODE_ROUTES.contains(&r.operation)
                    || matches!(
                        r.operation,
                        "health"
                            | "openapi"
                            | "metrics"
                            | "tls.ca"
                            | "console.page"
                            | "console.file"
                    )
            })
            .count();
        assert_eq!(events.len(), ROUTES.len() - open);
        assert!(events.iter().all(|e| e.result == "unauthorized"));
        server.shutdown().await;
    });
}

async fn checks(api: &Api, admin: &str) {
    // ---- open routes, authentication -----------------------------------------------------
    let health = api.ok("GET", "/v1/health", "x", None, 200).await;
    assert_eq!(health["status"], "ok");
    assert!(matches!(
        health["accelerator"].as_str(),
        Some("tcg" | "kvm")
    ));
    let (s, doc) = api.call("GET", "/v1/openapi.json", None, None).await;
    assert_eq!(s, 200);
    assert!(doc.is_object());
    api.err("GET", "/v1/sandboxes", None, None, 401, "unauthorized")
        .await;
    api.err(
        "GET",
        "/v1/sandboxes",
        Some("garbage"),
        None,
        401,
        "unauthorized",
    )
    .await;
    let wrong = "space_kaaaaaaaaaaaaaaa_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    api.err(
        "GET",
        "/v1/sandboxes",
        Some(wrong),
        None,
        401,
        "unauthorized",
    )
    .await;
    let events = api
        .ok("GET", "/v1/audit?operation=auth", admin, None, 200)
        .await;
    let events = events["events"].as_array().unwrap();
    assert!(events.len() >= 3, "{events:?}");
    assert!(events.iter().all(|e| e["result"] == "unauthorized"));
    assert_eq!(
        events[0]["key_id"], "kaaaaaaaaaaaaaaa",
        "newest first: {events:?}"
    );
    api.err("GET", "/v1/nope", Some(admin), None, 404, "route_not_found")
        .await;
    api.err(
        "PATCH",
        "/v1/sandboxes",
        Some(admin),
        None,
        405,
        "method_not_allowed",
    )
    .await;

    // ---- templates -------------------------------------------------------------------------
    let templates = api.ok("GET", "/v1/templates", admin, None, 200).await;
    let t = &templates["templates"][0];
    assert_eq!(
        (t["name"].as_str(), t["version"].as_str()),
        (Some("minimal"), Some("1"))
    );
    assert_eq!(t["image"], "minimal");
    assert!(t["image_mib"].as_u64().unwrap() > 0);

    // ---- tenants and keys --------------------------------------------------------------------
    let acme = api
        .ok(
            "POST",
            "/v1/tenants",
            admin,
            Some(json!({"name": "acme", "quotas": {"max_sandboxes": 1}})),
            201,
        )
        .await;
    assert_eq!(acme["tenant"]["quotas"]["max_sandboxes"], 1);
    assert_eq!(acme["tenant"]["quotas"]["max_vcpus"], 64);
    assert_eq!(acme["key"]["admin"], false);
    let acme_key = acme["key"]["key"].as_str().unwrap().to_owned();
    let acme_key_id = acme["key"]["id"].as_str().unwrap().to_owned();
    let acme2 = api
        .ok(
            "POST",
            "/v1/tenants/acme/keys",
            admin,
            Some(json!({"label": "second"})),
            201,
        )
        .await;
    let acme_key2 = acme2["key"].as_str().unwrap().to_owned();
    let keys = api
        .ok("GET", "/v1/tenants/acme/keys", admin, None, 200)
        .await;
    assert_eq!(keys["keys"].as_array().unwrap().len(), 2);
    assert!(
        keys["keys"][0].get("key").is_none(),
        "listing shows a secret"
    );
    api.err(
        "GET",
        "/v1/tenants",
        Some(&acme_key),
        None,
        403,
        "forbidden",
    )
    .await;
    api.err(
        "POST",
        "/v1/tenants",
        Some(admin),
        Some(json!({"name": "acme"})),
        409,
        "conflict",
    )
    .await;
    api.err(
        "POST",
        "/v1/tenants",
        Some(admin),
        Some(json!({"name": "Bad!"})),
        400,
        "invalid_id",
    )
    .await;
    api.err(
        "GET",
        "/v1/tenants/nobody/keys",
        Some(admin),
        None,
        404,
        "tenant_not_found",
    )
    .await;

    // ---- bad requests --------------------------------------------------------------------------
    api.err(
        "POST",
        "/v1/sandboxes",
        Some(admin),
        Some(json!({"template": "nothing"})),
        404,
        "template_not_found",
    )
    .await;
    api.err(
        "POST",
        "/v1/sandboxes",
        Some(admin),
        Some(json!({"template": "Bad Name"})),
        400,
        "invalid_id",
    )
    .await;
    api.err(
        "POST",
        "/v1/sandboxes",
        Some(admin),
        Some(json!({"template": 5})),
        400,
        "invalid_request",
    )
    .await;
    let resp = api
        .request("POST", "/v1/sandboxes", Some(admin))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_json");
    let resp = api
        .request("POST", "/v1/sandboxes", Some(admin))
        .body(r#"{"template":"minimal"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    // The server answers before it has read the body and closes the connection; the client
    // must not put that connection back in its pool, or the next request may be written into
    // the closed socket.
    let big = json!({"template": "minimal", "metadata": {"x": "y".repeat(2 << 20)}});
    let resp = api
        .request("POST", "/v1/sandboxes", Some(admin))
        .header("connection", "close")
        .json(&big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "payload_too_large");
    api.err(
        "GET",
        "/v1/sandboxes/NOT..VALID",
        Some(admin),
        None,
        400,
        "invalid_id",
    )
    .await;

    // ---- revoked keys --------------------------------------------------------------------------
    let (s, _) = api
        .call(
            "DELETE",
            &format!("/v1/keys/{acme_key_id}"),
            Some(admin),
            None,
        )
        .await;
    assert_eq!(s, 204);
    api.err(
        "GET",
        "/v1/sandboxes",
        Some(&acme_key),
        None,
        401,
        "unauthorized",
    )
    .await;
    let ev = api
        .ok("GET", "/v1/audit?operation=auth&limit=1", admin, None, 200)
        .await;
    assert_eq!(ev["events"][0]["key_id"], acme_key_id.as_str());
    assert_eq!(ev["events"][0]["tenant"], "acme");
    let keys = api
        .ok("GET", "/v1/tenants/acme/keys", admin, None, 200)
        .await;
    for k in keys["keys"].as_array().unwrap() {
        let revoked = k["revoked_unix_ms"].as_u64().is_some();
        assert_eq!(revoked, k["id"] == acme_key_id.as_str(), "{keys}");
    }
    // The tenant's other key is untouched.
    api.ok("GET", "/v1/sandboxes", &acme_key2, None, 200).await;
    api.err(
        "DELETE",
        "/v1/keys/NOPE",
        Some(admin),
        None,
        400,
        "invalid_id",
    )
    .await;
    api.err(
        "DELETE",
        "/v1/keys/k000000000000000",
        Some(admin),
        None,
        404,
        "key_not_found",
    )
    .await;
}
