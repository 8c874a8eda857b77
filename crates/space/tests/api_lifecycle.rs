//! The API end to end through a sandbox's lifecycle: pause and resume (and a paused
//! sandbox woken by guest access, or refusing it with `auto_resume` off), snapshots and
//! rollback, timeouts, suspend and restore through the object store, wake on access from
//! suspended, fork, the audit of all of it, and kill. A real server over a real node with
//! real guests.

use serde_json::json;

mod in_process;

use in_process::{with_server, Api};

/// One sandbox (and a fork of it) through every lifecycle operation.
#[test]
fn pause_snapshots_timeouts_suspend_fork_and_kill() {
    with_server(|api, admin| async move { checks(&api, &admin).await });
}

async fn checks(api: &Api, admin: &str) {
    // ---- create ----------------------------------------------------------------------------------
    let a = api.create_described(admin).await;
    let sbp = format!("/v1/sandboxes/{a}");

    // ---- pause / resume, and wake on access --------------------------------------------------
    let p = api
        .ok("POST", &format!("{sbp}/pause"), admin, None, 200)
        .await;
    assert_eq!(p["state"], "paused");
    api.err(
        "POST",
        &format!("{sbp}/pause"),
        Some(admin),
        None,
        409,
        "illegal_state",
    )
    .await;
    // Guest access to a paused sandbox resumes it (auto_resume is on by default).
    assert_eq!(api.sh(admin, &a, "echo awake").await.trim(), "awake");
    let info = api.ok("GET", &sbp, admin, None, 200).await;
    assert_eq!(info["state"], "running");
    assert_eq!(info["auto_resume"], true);
    let woke = api
        .ok(
            "GET",
            &format!("/v1/audit?sandbox={a}&operation=sandbox.wake"),
            admin,
            None,
            200,
        )
        .await;
    let woke = woke["events"].as_array().unwrap();
    assert_eq!(woke.len(), 1, "{woke:?}");
    assert!(woke[0]["detail"].as_str().unwrap().starts_with("resume"));
    api.ok("POST", &format!("{sbp}/pause"), admin, None, 200)
        .await;
    let r = api
        .ok("POST", &format!("{sbp}/resume"), admin, None, 200)
        .await;
    assert_eq!(r["state"], "running");
    // With auto_resume off, a paused sandbox refuses guest access instead.
    let strict = api
        .ok(
            "POST",
            "/v1/sandboxes",
            admin,
            Some(json!({"template": "minimal", "auto_resume": false})),
            201,
        )
        .await;
    assert_eq!(strict["auto_resume"], false);
    let strict = strict["id"].as_str().unwrap().to_owned();
    api.ok(
        "POST",
        &format!("/v1/sandboxes/{strict}/pause"),
        admin,
        None,
        200,
    )
    .await;
    let msg = api
        .err(
            "POST",
            &format!("/v1/sandboxes/{strict}/exec"),
            Some(admin),
            Some(json!({"cmd": ["true"]})),
            409,
            "illegal_state",
        )
        .await;
    assert!(msg.contains("running"), "{msg}");
    api.ok(
        "DELETE",
        &format!("/v1/sandboxes/{strict}"),
        admin,
        None,
        200,
    )
    .await;

    // ---- snapshot and rollback -----------------------------------------------------------------
    api.sh(admin, &a, "echo before > /tmp/marker").await;
    let snap = api
        .ok(
            "POST",
            &format!("{sbp}/snapshots"),
            admin,
            Some(json!({"kind": "full"})),
            201,
        )
        .await;
    assert_eq!(snap["kind"], "full");
    assert_eq!(snap["reason"], "request");
    let snap_id = snap["id"].as_str().unwrap().to_owned();
    let disk = api
        .ok("POST", &format!("{sbp}/snapshots"), admin, None, 201)
        .await;
    assert_eq!(disk["kind"], "disk");
    let list = api
        .ok("GET", &format!("{sbp}/snapshots"), admin, None, 200)
        .await;
    let ids: Vec<&str> = list["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&snap_id.as_str()), "{ids:?}");
    api.sh(admin, &a, "echo after > /tmp/marker").await;
    let rb = api
        .ok(
            "POST",
            &format!("{sbp}/rollback"),
            admin,
            Some(json!({"snapshot": snap_id})),
            200,
        )
        .await;
    assert_eq!(rb["state"], "running");
    assert_eq!(api.sh(admin, &a, "cat /tmp/marker").await, "before\n");
    api.err(
        "POST",
        &format!("{sbp}/rollback"),
        Some(admin),
        Some(json!({"snapshot": "1700000000000-full-0000"})),
        404,
        "snapshot_not_found",
    )
    .await;
    api.err(
        "POST",
        &format!("{sbp}/rollback"),
        Some(admin),
        Some(json!({"snapshot": "../../etc"})),
        400,
        "invalid_id",
    )
    .await;

    // ---- timeouts -----------------------------------------------------------------------------
    let t = api
        .ok(
            "PUT",
            &format!("{sbp}/timeouts"),
            admin,
            Some(json!({"idle_ms": 600_000})),
            200,
        )
        .await;
    assert_eq!(
        t["timeouts"],
        json!({"idle_ms": 600_000, "max_lifetime_ms": 3_600_000, "action": "suspend"})
    );
    let t = api
        .ok(
            "PUT",
            &format!("{sbp}/timeouts"),
            admin,
            Some(json!({"action": "kill", "max_lifetime_ms": null})),
            200,
        )
        .await;
    assert_eq!(
        t["timeouts"],
        json!({"idle_ms": 600_000, "max_lifetime_ms": null, "action": "kill"})
    );
    api.err(
        "PUT",
        &format!("{sbp}/timeouts"),
        Some(admin),
        Some(json!({"idle_ms": 0})),
        400,
        "invalid_request",
    )
    .await;

    // ---- suspend / restore ------------------------------------------------------------------
    let s = api
        .ok("POST", &format!("{sbp}/suspend"), admin, None, 200)
        .await;
    assert_eq!(s["state"], "suspended");
    let r = api
        .ok("POST", &format!("{sbp}/restore"), admin, None, 200)
        .await;
    assert_eq!(r["state"], "running");
    assert_eq!(api.sh(admin, &a, "cat /tmp/marker").await, "before\n");
    let snaps = api
        .ok("GET", &format!("{sbp}/snapshots"), admin, None, 200)
        .await;
    let suspended = snaps["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["reason"] == "suspend")
        .unwrap()
        .clone();
    assert!(
        suspended["remote"]["manifest_hash"].is_string(),
        "{suspended}"
    );

    // ---- wake on access: an exec and a file read restore a suspended sandbox ----------------
    api.ok("POST", &format!("{sbp}/suspend"), admin, None, 200)
        .await;
    assert_eq!(api.sh(admin, &a, "cat /tmp/marker").await, "before\n");
    api.ok("POST", &format!("{sbp}/suspend"), admin, None, 200)
        .await;
    let resp = api
        .request("GET", &format!("{sbp}/files?path=/tmp/marker"), Some(admin))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.text().await.unwrap(), "before\n");
    let wakes = api
        .ok(
            "GET",
            &format!("/v1/audit?sandbox={a}&operation=sandbox.wake"),
            admin,
            None,
            200,
        )
        .await;
    let restores = wakes["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["detail"].as_str().unwrap().starts_with("restore"))
        .count();
    assert_eq!(restores, 2, "{wakes}");
    // Every unwrap of the tenant's key is in the audit log.
    let keys = api
        .ok("GET", "/v1/audit?operation=key.unwrap", admin, None, 200)
        .await;
    assert!(!keys["events"].as_array().unwrap().is_empty(), "{keys}");

    // ---- fork ------------------------------------------------------------------------------------
    let child = api
        .ok("POST", &format!("{sbp}/fork"), admin, None, 201)
        .await;
    let c = child["id"].as_str().unwrap().to_owned();
    assert_eq!(child["forked_from"]["sandbox"], a.as_str());
    assert_eq!(child["tenant"], "default");
    assert_eq!(api.sh(admin, &c, "cat /tmp/marker").await, "before\n");

    // ---- audit of the lifecycle ------------------------------------------------------------
    let ev = api
        .ok(
            "GET",
            &format!("/v1/audit?sandbox={a}&limit=1000"),
            admin,
            None,
            200,
        )
        .await;
    let ops: Vec<&str> = ev["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["operation"].as_str().unwrap())
        .collect();
    for op in [
        "sandbox.create",
        "sandbox.pause",
        "sandbox.resume",
        "snapshot.create",
        "snapshot.rollback",
        "sandbox.set_timeouts",
        "sandbox.suspend",
        "sandbox.restore",
        "sandbox.fork",
    ] {
        assert!(ops.contains(&op), "{op} not audited: {ops:?}");
    }

    // ---- kill --------------------------------------------------------------------------------
    for id in [&c, &a] {
        let k = api
            .ok("DELETE", &format!("/v1/sandboxes/{id}"), admin, None, 200)
            .await;
        assert_eq!(k["state"], "terminated");
    }
    api.err("DELETE", &sbp, Some(admin), None, 409, "illegal_state")
        .await;
    let gone = api.ok("GET", "/v1/sandboxes", admin, None, 200).await;
    assert_eq!(gone["sandboxes"], json!([]));
    let dead = api
        .ok("GET", "/v1/sandboxes?state=terminated", admin, None, 200)
        .await;
    // The two killed here and the one with auto_resume off.
    assert_eq!(dead["sandboxes"].as_array().unwrap().len(), 3);
}
