//! The API end to end: a real server on 127.0.0.1:0 over a real node (loop-mounted btrfs in
//! a temp dir) with real guests, driven over HTTP and WebSocket like any client.
//!
//! One server serves every check, so the guests booted stay few: the `minimal` template, a
//! sandbox per tenant, a fork, and a second template build. The server is then restarted on
//! the same data directory to check that sandboxes, keys and ownership survive it.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use space_control::Server;
use tokio_tungstenite::tungstenite::Message;

mod common;

use common::{server_config, with_data_dir, Api, MAX_UPLOAD};

fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// The message and the id in it replaced, to compare the answers about two ids.
fn shape(message: &str, id: &str) -> String {
    message.replace(id, "<id>")
}

#[test]
fn api_end_to_end() {
    with_data_dir(|data| async move {
        let config = server_config(&data);
        let server = Server::start(config.clone()).await.expect("starting");
        let admin = server
            .bootstrap_key()
            .expect("first start makes a key")
            .to_owned();
        let api = Api::new(server.url());
        run_checks(&api, &admin).await;
        let a = api.create(&admin, "minimal").await;
        api.sh(&admin, &a, "echo survivor > /tmp/mark").await;
        server.shutdown().await;

        // A restart keeps keys, ownership and the running VM (adopted, not rebooted).
        let server = Server::start(config).await.expect("restarting");
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

async fn run_checks(api: &Api, admin: &str) {
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

    // ---- create ----------------------------------------------------------------------------------
    let sb = api
        .ok(
            "POST",
            "/v1/sandboxes",
            admin,
            Some(json!({
                "template": "minimal",
                "env": {"GREETING": "hello-env"},
                "metadata": {"owner": "agent-7"},
                "timeouts": {"idle_ms": null, "max_lifetime_ms": 3_600_000},
            })),
            201,
        )
        .await;
    let a = sb["id"].as_str().unwrap().to_owned();
    assert_eq!(sb["state"], "running");
    assert_eq!(sb["tenant"], "default");
    assert_eq!(sb["template"], "minimal");
    assert_eq!(sb["template_version"], "1");
    assert_eq!(sb["metadata"]["owner"], "agent-7");
    assert_eq!(
        sb["timeouts"],
        json!({"idle_ms": null, "max_lifetime_ms": 3_600_000, "action": "suspend"})
    );
    assert_eq!(sb["forked_from"], Value::Null);
    let sbp = format!("/v1/sandboxes/{a}");

    // ---- exec (NDJSON) ---------------------------------------------------------------------------
    let (out, err, exit) = api
        .exec(
            admin,
            &a,
            json!({"shell": "echo out; echo err >&2; echo $GREETING; exit 3"}),
        )
        .await;
    assert_eq!((out.as_str(), err.as_str()), ("out\nhello-env\n", "err\n"));
    assert_eq!(exit["exit_code"], 3);
    let (out, _, exit) = api
        .exec(
            admin,
            &a,
            json!({"cmd": ["cat"], "stdin": B64.encode(b"from stdin")}),
        )
        .await;
    assert_eq!(
        (out.as_str(), exit["exit_code"].as_i64()),
        ("from stdin", Some(0))
    );
    api.err(
        "POST",
        &format!("{sbp}/exec"),
        Some(admin),
        Some(json!({"cmd": ["true"], "shell": "true"})),
        400,
        "invalid_request",
    )
    .await;

    // A client that goes away takes its process with it, even a quiet one.
    let resp = api
        .request("POST", &format!("{sbp}/exec"), Some(admin))
        .json(&json!({"cmd": ["sleep", "4321"]}))
        .send()
        .await
        .unwrap();
    let mut lines = resp.bytes_stream();
    let first = lines.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("started"));
    let count = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done | grep -c '^sleep 4321' || true";
    assert_eq!(api.sh(admin, &a, count).await, "1\n");
    drop(lines);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while api.sh(admin, &a, count).await != "0\n" {
        assert!(
            std::time::Instant::now() < deadline,
            "the exec outlived its client"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // ---- exec over a WebSocket, with stdin ------------------------------------------------------
    let mut ws = api.ws(admin, &format!("{sbp}/exec/ws")).await;
    ws.send(Message::text(json!({"cmd": ["cat"]}).to_string()))
        .await
        .unwrap();
    let started: Value = match ws.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(t.as_str()).unwrap(),
        other => panic!("expected started, got {other:?}"),
    };
    assert_eq!(started["type"], "started");
    ws.send(Message::binary(b"through the socket".to_vec()))
        .await
        .unwrap();
    ws.send(Message::text(r#"{"type":"eof"}"#)).await.unwrap();
    let mut stdout = Vec::new();
    let mut exit = Value::Null;
    while let Some(msg) = tokio::time::timeout(Duration::from_secs(30), ws.next())
        .await
        .expect("exec over WebSocket hangs")
    {
        match msg.unwrap() {
            Message::Binary(b) => {
                assert_eq!(b[0], 1, "stdout frames start with 1");
                stdout.extend_from_slice(&b[1..]);
            }
            Message::Text(t) => exit = serde_json::from_str(t.as_str()).unwrap(),
            Message::Close(_) => break,
            _ => {}
        }
    }
    assert_eq!(stdout, b"through the socket");
    assert_eq!(
        (exit["type"].as_str(), exit["exit_code"].as_i64()),
        (Some("exit"), Some(0))
    );

    // ---- PTY with resize ---------------------------------------------------------------------
    let mut pty = api.ws(admin, &format!("{sbp}/pty")).await;
    pty.send(Message::text(
        json!({"rows": 24, "cols": 80, "cmd": ["/bin/sh"]}).to_string(),
    ))
    .await
    .unwrap();
    pty.send(Message::text(r#"{"type":"resize","rows":41,"cols":101}"#))
        .await
        .unwrap();
    pty.send(Message::binary(b"stty size; exit 5\n".to_vec()))
        .await
        .unwrap();
    let mut screen = String::new();
    let mut exit = Value::Null;
    while let Some(msg) = tokio::time::timeout(Duration::from_secs(30), pty.next())
        .await
        .expect("PTY hangs")
    {
        match msg.unwrap() {
            Message::Binary(b) => screen.push_str(&String::from_utf8_lossy(&b)),
            Message::Text(t) => exit = serde_json::from_str(t.as_str()).unwrap(),
            Message::Close(_) => break,
            _ => {}
        }
    }
    assert!(screen.contains("41 101"), "{screen:?}");
    assert_eq!(
        (exit["type"].as_str(), exit["exit_code"].as_i64()),
        (Some("exit"), Some(5))
    );

    // ---- files -------------------------------------------------------------------------------
    let data: Vec<u8> = (0..(1 << 20)).map(|_| rand::random::<u8>()).collect();
    let resp = api
        .request(
            "PUT",
            &format!("{sbp}/files?path=/tmp/data.bin&mode=0600"),
            Some(admin),
        )
        .body(data.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let stat: Value = resp.json().await.unwrap();
    assert_eq!(stat["size"], 1 << 20);
    assert_eq!(stat["mode"].as_u64().unwrap() & 0o777, 0o600);
    let resp = api
        .request(
            "GET",
            &format!("{sbp}/files?path=/tmp/data.bin"),
            Some(admin),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(sha256(&resp.bytes().await.unwrap()), sha256(&data));
    api.ok(
        "POST",
        &format!("{sbp}/files/mkdir"),
        admin,
        Some(json!({"path": "/tmp/d/e"})),
        200,
    )
    .await;
    let moved = api
        .ok(
            "POST",
            &format!("{sbp}/files/rename"),
            admin,
            Some(json!({"from": "/tmp/data.bin", "to": "/tmp/d/data.bin"})),
            200,
        )
        .await;
    assert_eq!(moved["size"], 1 << 20);
    let listing = api
        .ok(
            "GET",
            &format!("{sbp}/files/list?path=/tmp/d"),
            admin,
            None,
            200,
        )
        .await;
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["data.bin", "e"]);
    let st = api
        .ok(
            "GET",
            &format!("{sbp}/files/stat?path=/tmp/d/e"),
            admin,
            None,
            200,
        )
        .await;
    assert_eq!(st["file_type"], "dir");
    api.err(
        "DELETE",
        &format!("{sbp}/files?path=/tmp/d"),
        Some(admin),
        None,
        409,
        "conflict",
    )
    .await;
    let (s, _) = api
        .call(
            "DELETE",
            &format!("{sbp}/files?path=/tmp/d&recursive=true"),
            Some(admin),
            None,
        )
        .await;
    assert_eq!(s, 204);
    api.err(
        "GET",
        &format!("{sbp}/files/stat?path=/tmp/d"),
        Some(admin),
        None,
        404,
        "file_not_found",
    )
    .await;
    api.err(
        "GET",
        &format!("{sbp}/files/stat?path=relative"),
        Some(admin),
        None,
        400,
        "invalid_request",
    )
    .await;

    // Over the limit: refused up front by Content-Length, and mid-stream without one; the
    // old file stays either way.
    let keep = format!("{sbp}/files?path=/tmp/keep");
    let resp = api
        .request("PUT", &keep, Some(admin))
        .body("old")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = api
        .request("PUT", &keep, Some(admin))
        .header("connection", "close")
        .body(vec![7u8; MAX_UPLOAD as usize + 1])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "payload_too_large");
    let chunks = futures::stream::iter(
        (0..40).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![9u8; 128 << 10]))),
    );
    // Without a length the server finds out mid-stream, answers 413 and closes the
    // connection; a client still writing then may see the close (a broken pipe) before it
    // reads the answer. Either way the upload must not have replaced the file.
    let midstream_answered = match api
        .request("PUT", &keep, Some(admin))
        .header("connection", "close")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
    {
        Ok(resp) => {
            assert_eq!(resp.status(), 413);
            let v: Value = resp.json().await.unwrap();
            assert_eq!(v["error"]["code"], "payload_too_large");
            true
        }
        Err(e) => {
            let chain = format!("{e:?}");
            eprintln!("the over-limit upload without a length ended without an answer: {chain}");
            assert!(
                chain.contains("BrokenPipe")
                    || chain.contains("ConnectionReset")
                    || chain.contains("IncompleteMessage"),
                "the over-limit upload failed in an unexpected way: {chain}"
            );
            false
        }
    };
    let resp = api.request("GET", &keep, Some(admin)).send().await.unwrap();
    assert_eq!(resp.bytes().await.unwrap().as_ref(), b"old");

    // Watch: an event for a file made after the watch started.
    let resp = api
        .request("GET", &format!("{sbp}/files/watch?path=/tmp"), Some(admin))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut events = resp.bytes_stream();
    api.sh(admin, &a, "touch /tmp/watched").await;
    let mut seen = String::new();
    while !seen.contains("watched") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("no watch event")
            .unwrap()
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let first: Value = serde_json::from_str(seen.lines().next().unwrap()).unwrap();
    assert!(
        first["path"].as_str().unwrap().starts_with("/tmp"),
        "{first}"
    );
    drop(events);

    // ---- logs ------------------------------------------------------------------------------------
    let resp = api
        .request("GET", &format!("{sbp}/logs?tail_bytes=100"), Some(admin))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    assert!(resp.bytes().await.unwrap().len() <= 100);

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
    api.err("DELETE", &sbp, Some(admin), None, 409, "illegal_state")
        .await;
    let gone = api.ok("GET", "/v1/sandboxes", admin, None, 200).await;
    assert_eq!(gone["sandboxes"], json!([]));
    let dead = api
        .ok("GET", "/v1/sandboxes?state=terminated", admin, None, 200)
        .await;
    // The two killed here and the one with auto_resume off.
    assert_eq!(dead["sandboxes"].as_array().unwrap().len(), 3);
    let metrics = api
        .request("GET", "/metrics", None)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let uploads_413 = format!(
        "space_api_requests_total{{operation=\"files.upload\",status=\"413\"}} {}",
        1 + u32::from(midstream_answered)
    );
    for needle in [
        // Three sandboxes, and one create answered again under its idempotency key.
        "space_api_requests_total{operation=\"sandbox.create\",status=\"201\"} 4",
        "space_api_requests_total{operation=\"sandbox.create\",status=\"422\"} 1",
        "space_api_requests_total{operation=\"sandbox.create\",status=\"429\"} 1",
        uploads_413.as_str(),
        "space_api_request_duration_seconds_bucket{operation=\"sandbox.exec\",le=\"+Inf\"}",
        "space_sandboxes{state=\"terminated\"} 4",
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
