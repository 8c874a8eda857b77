//! Requests that race one another on one sandbox: a guest call whose connection is cut
//! because another request killed or suspended the sandbox is answered as that (`409
//! conflict` naming what happened), never as a guest fault (`502`), and the server goes on
//! serving the sandbox's neighbours.

use std::time::Duration;

use serde_json::{json, Value};

mod in_process;

use in_process::with_server;

/// The NDJSON lines of an exec started with `req`, read until `stop` holds for one of them
/// (the rest stays unread); the exec must have been accepted (`200`).
async fn exec_lines(
    resp: reqwest::Response,
    stop: impl Fn(&Value) -> bool,
) -> (Vec<Value>, reqwest::Response) {
    assert_eq!(resp.status(), 200);
    let mut lines = Vec::new();
    let mut buf = Vec::new();
    let mut resp = resp;
    loop {
        let chunk = tokio::time::timeout(Duration::from_secs(120), resp.chunk())
            .await
            .expect("the exec answers within 2 minutes")
            .expect("reading the exec's answer");
        let Some(chunk) = chunk else {
            return (lines, resp);
        };
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            let v: Value = serde_json::from_slice(&line).expect("an NDJSON line");
            let done = stop(&v);
            lines.push(v);
            if done {
                return (lines, resp);
            }
        }
    }
}

/// The last line of an exec's answer, read to its end.
async fn last_line(resp: reqwest::Response) -> Value {
    let (lines, _) = exec_lines(resp, |_| false).await;
    lines.last().cloned().unwrap_or(Value::Null)
}

#[test]
fn a_request_cut_short_by_another_says_what_happened() {
    with_server(|api, admin| async move {
        let bystander = api.create(&admin, "minimal").await;

        // An exec running when another request kills its sandbox ends with a conflict line.
        let a = api.create(&admin, "minimal").await;
        let resp = api
            .request("POST", &format!("/v1/sandboxes/{a}/exec"), Some(&admin))
            .json(&json!({"cmd": ["sleep", "600"]}))
            .send()
            .await
            .unwrap();
        let (lines, resp) = exec_lines(resp, |v| v["type"] == "started").await;
        assert_eq!(lines.last().unwrap()["type"], "started", "{lines:?}");
        api.ok("DELETE", &format!("/v1/sandboxes/{a}"), &admin, None, 200)
            .await;
        let last = last_line(resp).await;
        assert_eq!(
            (last["type"].as_str(), last["code"].as_str()),
            (Some("error"), Some("conflict")),
            "{last}"
        );
        let message = last["message"].as_str().unwrap();
        assert!(message.contains("was killed while"), "{message}");

        // An upload whose sandbox is killed halfway through is refused the same way, and no
        // part of it lands (the sandbox is gone; the next request says so).
        let b = api.create(&admin, "minimal").await;
        let (tx, rx) = futures::channel::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
        let upload = {
            let rb = api
                .request(
                    "PUT",
                    &format!("/v1/sandboxes/{b}/files?path=/root/half"),
                    Some(&admin),
                )
                .body(reqwest::Body::wrap_stream(rx));
            tokio::spawn(async move { rb.send().await })
        };
        let mut tx = tx;
        futures::SinkExt::send(&mut tx, Ok(vec![7u8; 256 << 10]))
            .await
            .unwrap();
        // The first chunk is in the guest's hands before the kill.
        tokio::time::sleep(Duration::from_millis(500)).await;
        api.ok("DELETE", &format!("/v1/sandboxes/{b}"), &admin, None, 200)
            .await;
        // More of the body, until the server stops reading it.
        for _ in 0..64 {
            let sent = tokio::time::timeout(
                Duration::from_secs(5),
                futures::SinkExt::send(&mut tx, Ok(vec![7u8; 64 << 10])),
            )
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                break;
            }
        }
        drop(tx);
        let resp = upload.await.unwrap().expect("the upload is answered");
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (409, Some("conflict")),
            "{v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("was killed while"),
            "{v}"
        );
        let (status, _) = api
            .call(
                "GET",
                &format!("/v1/sandboxes/{b}/files/stat?path=/root/half"),
                Some(&admin),
                None,
            )
            .await;
        assert!(matches!(status, 404 | 409), "stat after the kill: {status}");

        // The neighbour never noticed.
        let out = api.sh(&admin, &bystander, "echo still here").await;
        assert_eq!(out, "still here\n");
        api.ok(
            "DELETE",
            &format!("/v1/sandboxes/{bystander}"),
            &admin,
            None,
            200,
        )
        .await;
    });
}
