//! The API end to end on one sandbox: create, exec (NDJSON, WebSocket with stdin, a client
//! that goes away), the PTY with resize, files (upload, download, limits, list, stat, mkdir,
//! rename, watch) and logs. A real server over a real node with a real guest.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio_tungstenite::tungstenite::Message;

mod in_process;

use in_process::{with_server, Api, MAX_UPLOAD};

fn sha256(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// One sandbox through everything a client does with its guest.
#[test]
fn create_exec_pty_files_and_logs() {
    with_server(|api, admin| async move { checks(&api, &admin).await });
}

async fn checks(api: &Api, admin: &str) {
    // ---- create ----------------------------------------------------------------------------------
    let a = api.create_described(admin).await;
    let sbp = format!("/v1/sandboxes/{a}");

    // ---- a browser where there is none -----------------------------------------------------------
    // `minimal` has neither Chromium nor the account it runs as: the sandbox is the wrong
    // kind (409), not missing (404).
    let refused = api
        .err(
            "POST",
            &format!("{sbp}/browser"),
            Some(admin),
            None,
            409,
            "illegal_state",
        )
        .await;
    assert!(refused.contains("no browser"), "{refused}");

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

    // ---- kill, metrics -------------------------------------------------------------------------
    api.ok("DELETE", &sbp, admin, None, 200).await;
    let metrics = api.metrics().await;
    let uploads_413 = format!(
        "space_api_requests_total{{operation=\"files.upload\",status=\"413\"}} {}",
        1 + u32::from(midstream_answered)
    );
    for needle in [
        "space_api_requests_total{operation=\"sandbox.create\",status=\"201\"} 1",
        uploads_413.as_str(),
        "space_api_request_duration_seconds_bucket{operation=\"sandbox.exec\",le=\"+Inf\"}",
        "space_sandboxes{state=\"terminated\"} 1",
        "space_sandboxes{state=\"running\"} 0",
    ] {
        assert!(
            metrics.contains(needle),
            "{needle} missing from:\n{metrics}"
        );
    }
}
