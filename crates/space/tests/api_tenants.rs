//! The API end to end with a second tenant: a create under an Idempotency-Key, quotas,
//! every sandbox route refusing another tenant's sandbox exactly as one nobody has, the
//! tenant's own audit; then template builds (refused to a tenant, in use, deleted) and the
//! metrics of it all. A real server over a real node with real guests.

use serde_json::{json, Value};

mod in_process;

use in_process::{with_server, Api};

/// The message and the id in it replaced, to compare the answers about two ids.
fn shape(message: &str, id: &str) -> String {
    message.replace(id, "<id>")
}

/// Two tenants side by side, and the templates they share.
#[test]
fn a_second_tenant_quotas_isolation_and_templates() {
    with_server(|api, admin| async move { checks(&api, &admin).await });
}

async fn checks(api: &Api, admin: &str) {
    // ---- a tenant of one sandbox, with two keys ---------------------------------------------
    let acme = api
        .ok(
            "POST",
            "/v1/tenants",
            admin,
            Some(json!({"name": "acme", "quotas": {"max_sandboxes": 1}})),
            201,
        )
        .await;
    let acme_key = acme["key"]["key"].as_str().unwrap().to_owned();
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

    // ---- create ----------------------------------------------------------------------------------
    let a = api.create_described(admin).await;
    let sbp = format!("/v1/sandboxes/{a}");

    api.sh(admin, &a, "echo before > /tmp/marker").await;
    // ---- fork ------------------------------------------------------------------------------------
    let child = api
        .ok("POST", &format!("{sbp}/fork"), admin, None, 201)
        .await;
    let c = child["id"].as_str().unwrap().to_owned();
    assert_eq!(child["forked_from"]["sandbox"], a.as_str());
    assert_eq!(child["tenant"], "default");
    assert_eq!(api.sh(admin, &c, "cat /tmp/marker").await, "before\n");

    // ---- a second tenant, quotas and isolation ----------------------------------------------
    // A create under an Idempotency-Key, sent again, answers the same sandbox (the tenant's
    // quota of one sandbox would refuse a second); with another body it is refused.
    let keyed = |body: Value| {
        api.request("POST", "/v1/sandboxes", Some(&acme_key))
            .header("Idempotency-Key", "acme-first-create")
            .json(&body)
            .send()
    };
    let first = keyed(json!({"template": "minimal"})).await.unwrap();
    assert_eq!(first.status(), 201);
    let b = first.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let again = keyed(json!({"template": "minimal"})).await.unwrap();
    assert_eq!(again.status(), 201);
    assert_eq!(again.json::<Value>().await.unwrap()["id"], b.as_str());
    let other = keyed(json!({"template": "minimal", "metadata": {"k": "v"}}))
        .await
        .unwrap();
    assert_eq!(other.status(), 422);
    assert_eq!(
        other.json::<Value>().await.unwrap()["error"]["code"],
        "idempotency_key_reused"
    );
    let msg = api
        .err(
            "POST",
            "/v1/sandboxes",
            Some(&acme_key),
            Some(json!({"template": "minimal"})),
            429,
            "quota_exceeded",
        )
        .await;
    assert!(
        msg.contains("max_sandboxes") && msg.contains("is 1"),
        "{msg}"
    );
    api.err(
        "POST",
        &format!("/v1/sandboxes/{b}/fork"),
        Some(&acme_key),
        None,
        429,
        "quota_exceeded",
    )
    .await;
    let mine = api.ok("GET", "/v1/sandboxes", &acme_key, None, 200).await;
    let mine: Vec<&str> = mine["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(mine, [b.as_str()]);
    let ours = api
        .ok(
            "GET",
            "/v1/sandboxes?metadata.owner=agent-7",
            admin,
            None,
            200,
        )
        .await;
    let ours: Vec<&str> = ours["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    // The fork keeps its parent's metadata; newest first.
    assert_eq!(ours, [c.as_str(), a.as_str()]);
    isolation(api, &acme_key, &a).await;
    isolation(api, admin, &b).await;
    let still = api.ok("GET", &sbp, admin, None, 200).await;
    assert_eq!(
        still["state"], "running",
        "another tenant's requests changed the sandbox"
    );
    api.ok(
        "PATCH",
        "/v1/tenants/acme",
        admin,
        Some(json!({"quotas": {"max_sandboxes": 5}})),
        200,
    )
    .await;
    let acme_events = api.ok("GET", "/v1/audit", &acme_key, None, 200).await;
    let acme_events = acme_events["events"].as_array().unwrap();
    assert!(
        acme_events.iter().all(|e| e["tenant"] == "acme"),
        "{acme_events:?}"
    );
    assert!(acme_events
        .iter()
        .any(|e| e["operation"] == "sandbox.create" && e["result"] == "quota_exceeded"));

    // ---- templates: build, in use, delete ------------------------------------------------
    api.err(
        "POST",
        "/v1/templates",
        Some(&acme_key2),
        Some(json!({"name": "minimal", "image": "minimal"})),
        403,
        "forbidden",
    )
    .await;
    api.err(
        "POST",
        "/v1/templates",
        Some(admin),
        Some(json!({"name": "minimal", "image": "nothing"})),
        400,
        "invalid_request",
    )
    .await;
    let built = api
        .ok(
            "POST",
            "/v1/templates?wait=true",
            admin,
            Some(json!({"name": "minimal", "image": "minimal"})),
            202,
        )
        .await;
    assert_eq!(built["version"], "2");
    api.err(
        "DELETE",
        "/v1/templates/minimal/1",
        Some(admin),
        None,
        409,
        "conflict",
    )
    .await;
    let (s, _) = api
        .call("DELETE", "/v1/templates/minimal/2", Some(admin), None)
        .await;
    assert_eq!(s, 204);
    api.err(
        "DELETE",
        "/v1/templates/minimal/2",
        Some(admin),
        None,
        404,
        "template_not_found",
    )
    .await;

    // ---- kill, metrics -------------------------------------------------------------------------
    for (key, id) in [(admin, &c), (admin, &a), (acme_key2.as_str(), &b)] {
        let k = api
            .ok("DELETE", &format!("/v1/sandboxes/{id}"), key, None, 200)
            .await;
        assert_eq!(k["state"], "terminated");
    }
    let gone = api.ok("GET", "/v1/sandboxes", admin, None, 200).await;
    assert_eq!(gone["sandboxes"], json!([]));
    let metrics = api.metrics().await;
    for needle in [
        // Two sandboxes, and one create answered again under its idempotency key.
        "space_api_requests_total{operation=\"sandbox.create\",status=\"201\"} 3",
        "space_api_requests_total{operation=\"sandbox.create\",status=\"422\"} 1",
        "space_api_requests_total{operation=\"sandbox.create\",status=\"429\"} 1",
        "space_sandboxes{state=\"terminated\"} 3",
        "space_sandboxes{state=\"running\"} 0",
    ] {
        assert!(
            metrics.contains(needle),
            "{needle} missing from:\n{metrics}"
        );
    }
}

/// Every sandbox route called by `key` with `foreign` (another tenant's sandbox) answers
/// exactly as with an id nobody has.
async fn isolation(api: &Api, key: &str, foreign: &str) {
    let random = "sbx-00000000deadbeef";
    let routes: &[(&str, &str, Option<Value>)] = &[
        ("GET", "", None),
        ("DELETE", "", None),
        ("POST", "/pause", None),
        ("POST", "/resume", None),
        ("POST", "/suspend", None),
        ("POST", "/restore", None),
        ("POST", "/fork", None),
        ("PUT", "/timeouts", Some(json!({"idle_ms": 1000}))),
        ("GET", "/logs", None),
        ("POST", "/exec", Some(json!({"cmd": ["true"]}))),
        ("GET", "/exec/ws", None),
        ("GET", "/pty", None),
        ("GET", "/files?path=/tmp", None),
        ("PUT", "/files?path=/tmp/x", None),
        ("DELETE", "/files?path=/tmp/x", None),
        ("GET", "/files/list?path=/tmp", None),
        ("GET", "/files/stat?path=/tmp", None),
        ("POST", "/files/mkdir", Some(json!({"path": "/tmp/y"}))),
        (
            "POST",
            "/files/rename",
            Some(json!({"from": "/tmp/a", "to": "/tmp/b"})),
        ),
        ("GET", "/files/watch?path=/tmp", None),
        ("GET", "/snapshots", None),
        ("POST", "/snapshots", Some(json!({"kind": "disk"}))),
        (
            "POST",
            "/rollback",
            Some(json!({"snapshot": "1700000000000-disk-0000"})),
        ),
    ];
    for (method, tail, body) in routes {
        let mut answers = Vec::new();
        for id in [foreign, random] {
            let path = format!("/v1/sandboxes/{id}{tail}");
            let (s, v) = api.call(method, &path, Some(key), body.clone()).await;
            assert_eq!(
                (s, v["error"]["code"].as_str()),
                (404, Some("sandbox_not_found")),
                "{method} {path}: {v}"
            );
            answers.push(shape(v["error"]["message"].as_str().unwrap(), id));
        }
        assert_eq!(
            answers[0], answers[1],
            "{method} {tail} tells the ids apart"
        );
    }
}
