//! The egress gateway through its real wire protocol: a stream pair with the sync line and an
//! HTTP/2 client on the guest's end, real upstream servers on 127.0.0.1 (plain HTTP, and
//! HTTPS with a certificate from a CA made here), real TLS on both sides of an interception.

mod egress_rig;

use std::time::Duration;

use space_gateway::{EgressDefault, Gateway, GatewayConfig, SecretBinding};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use egress_rig::*;

#[tokio::test]
async fn forward_policy_private_addresses_and_live_policy_changes() {
    let s = setup(|_| {}).await;
    let sb = s.gateway.sandbox(
        sandbox_id(),
        policy(r#"{"allow": ["127.0.0.1"], "deny": ["*.blocked.example"]}"#),
        vec![],
    );
    let mut g = Guest::connect(sb.clone()).await;
    let raw = format!(
        "POST http://127.0.0.1:{}/hello?x=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\nContent-Length: 4\r\n\r\nabcdEXTRA",
        s.http_port
    );
    let (status, body) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(
        body.ends_with("upstream saw /hello?x=1 with 4 body bytes"),
        "{body}"
    );
    let heads = s.http_seen.heads();
    assert!(
        heads[0].starts_with("POST /hello?x=1 HTTP/1.1\r\n"),
        "{heads:?}"
    );
    assert!(heads[0].contains("Connection: close\r\n"));
    assert!(!heads[0].contains("keep-alive"));
    let d = s.audit.wait_for("egress.allow", "kind=forward").await;
    assert!(
        d.contains("rule=127.0.0.1") && d.contains(&format!("127.0.0.1:{}", s.http_port)),
        "{d}"
    );

    // Denied by rule: 403 with the reason, audited.
    let (status, body) = g
        .forward(
            "x.blocked.example",
            80,
            b"GET http://x.blocked.example/ HTTP/1.1\r\n\r\n",
        )
        .await;
    assert_eq!(status, 403);
    assert!(body.contains("rule *.blocked.example"), "{body}");
    s.audit.wait_for("egress.deny", "reason=policy").await;

    // A name resolving to loopback, allowed only through the default: private, refused.
    let err = g
        .connect_tunnel("localhost", s.https_port)
        .await
        .unwrap_err();
    assert_eq!(err.0, 403, "{err:?}");
    assert!(err.1.contains("loopback"), "{err:?}");
    s.audit
        .wait_for("egress.deny", "reason=private_address")
        .await;

    // The request line must name what space-host says.
    let (status, body) = g
        .forward(
            "127.0.0.1",
            s.http_port,
            b"GET http://10.9.9.9/ HTTP/1.1\r\n\r\n",
        )
        .await;
    assert_eq!(status, 400, "{body}");

    // Bad headers.
    let (resp, _tx) = g.request("/v1/egress/connect", "bad_host!", "443").await;
    assert_eq!(resp.status(), 400);
    let (resp, _tx) = g.request("/v1/egress/connect", "a.example", "0").await;
    assert_eq!(resp.status(), 400);
    let (resp, _tx) = g.request("/v1/other", "a.example", "1").await;
    assert_eq!(resp.status(), 404);

    // A new policy applies to the next connection on the same stream.
    sb.set_policy(policy(r#"{"default": "deny"}"#));
    let raw = format!("GET http://127.0.0.1:{}/ HTTP/1.1\r\n\r\n", s.http_port);
    let (status, body) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 403);
    assert!(body.contains("default"), "{body}");
    sb.set_policy(policy(r#"{"allow": ["127.0.0.1:*"]}"#));
    let (status, _) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 200);
    // A wildcard does not open private addresses.
    sb.set_policy(policy(r#"{"default": "deny", "allow": ["*"]}"#));
    let (status, body) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("loopback"), "{body}");
}

#[tokio::test]
async fn tunnels_check_sni_and_splice() {
    let s = setup(|_| {}).await;
    let sb = s
        .gateway
        .sandbox(sandbox_id(), policy(r#"{"allow": ["localhost"]}"#), vec![]);
    let mut g = Guest::connect(sb.clone()).await;
    let upstream_ca = std::fs::read_to_string(s._dir.path().join("upstream-ca.pem")).unwrap();

    // Without bindings the upstream's own certificate comes through (no interception).
    let t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let resp = https_get(
        t,
        &upstream_ca,
        "localhost",
        "GET /spliced HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(
        resp.ends_with("upstream saw /spliced with 0 body bytes"),
        "{resp}"
    );
    let d = s.audit.wait_for("egress.allow", "kind=tunnel").await;
    assert!(d.contains("up=") && !d.contains("up=0 "), "{d}");
    // The sandbox's byte counters saw the handshake and the request one way, the
    // certificate chain and the answer the other.
    let (sent, received) = sb.traffic();
    assert!(
        sent > 300 && received > 1000,
        "sent {sent}, received {received}"
    );

    // SNI naming another host: cut.
    let t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let r = https_get(t, &upstream_ca, "example.com", "GET / HTTP/1.1\r\n\r\n").await;
    assert!(r.is_err(), "{r:?}");
    s.audit.wait_for("egress.deny", "reason=sni_mismatch").await;

    // Not TLS at all: cut.
    let mut t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    t.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = t.read_to_end(&mut out).await;
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    s.audit.wait_for("egress.deny", "reason=not_tls").await;
    assert_eq!(s.https_seen.heads().len(), 1);

    // Nothing listens: 502.
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_port = dead.local_addr().unwrap().port();
    drop(dead);
    let err = g.connect_tunnel("localhost", dead_port).await.unwrap_err();
    assert_eq!(err.0, 502, "{err:?}");
}

#[tokio::test]
async fn connection_limit_answers_429() {
    let s = setup(|c| c.max_connections = 1).await;
    let sb = s
        .gateway
        .sandbox(sandbox_id(), policy(r#"{"allow": ["localhost"]}"#), vec![]);
    let mut g = Guest::connect(sb).await;
    let held = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let err = g
        .connect_tunnel("localhost", s.https_port)
        .await
        .unwrap_err();
    assert_eq!(err.0, 429, "{err:?}");
    s.audit.wait_for("egress.deny", "reason=limit").await;
    // Closing the first frees its slot.
    drop(held);
    let mut ok = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        match g.connect_tunnel("localhost", s.https_port).await {
            Ok(_) => {
                ok = true;
                break;
            }
            Err((429, _)) => continue,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(ok, "the slot was never freed");
}

#[tokio::test]
async fn interception_puts_the_secret_in_and_refuses_exfiltration() {
    let s = setup(|_| {}).await;
    let bound = SecretBinding::new("GITHUB_TOKEN", vec!["localhost".parse().unwrap()]);
    let elsewhere = SecretBinding::new("GITHUB_TOKEN_2", vec!["api.github.com".parse().unwrap()]);
    let sb = s.gateway.sandbox(
        sandbox_id(),
        policy(r#"{"allow": ["localhost", "127.0.0.1"]}"#),
        vec![bound.clone(), elsewhere.clone()],
    );
    let mut g = Guest::connect(sb).await;
    let ca = s.gateway.ca_pem();

    // The guest trusts the deployment CA; the gateway verifies the upstream against the test
    // CA (extra_roots) and puts the value where the placeholder was.
    let t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let req = format!(
        "POST /api?key={p} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {p}\r\nContent-Length: 3\r\n\r\nxyz",
        p = bound.placeholder
    );
    let resp = https_get(t, &ca, "localhost", &req).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    let body = String::from_utf8(response_body(resp.as_bytes())).unwrap();
    assert!(body.ends_with("with 3 body bytes"), "{resp}");
    let (head, body) = s.https_seen.0.lock().unwrap()[0].clone();
    assert!(
        head.contains(&format!("Authorization: Bearer {SECRET}\r\n")),
        "{head}"
    );
    assert!(
        head.starts_with(&format!("POST /api?key={SECRET} HTTP/1.1")),
        "{head}"
    );
    assert!(!head.contains(&bound.placeholder));
    assert_eq!(body, b"xyz");
    let d = s
        .audit
        .wait_for("credential.use", "secret=GITHUB_TOKEN ")
        .await;
    assert_eq!(d, "secret=GITHUB_TOKEN host=localhost");
    s.audit.wait_for("egress.allow", "kind=intercept").await;

    // A placeholder of a secret bound elsewhere: 403 inside the tunnel, nothing sent on.
    let t = g.connect_tunnel("localhost", s.https_port).await.unwrap();
    let req = format!(
        "GET / HTTP/1.1\r\nHost: localhost\r\nX-Token: {}\r\n\r\n",
        elsewhere.placeholder
    );
    let resp = https_get(t, &ca, "localhost", &req).await.unwrap();
    assert!(resp.starts_with("HTTP/1.1 403 Forbidden"), "{resp}");
    assert!(resp.contains("X-Space-Egress: refused"), "{resp}");
    assert!(
        resp.ends_with("credential GITHUB_TOKEN_2 may not be sent to localhost"),
        "{resp}"
    );
    let d = s
        .audit
        .wait_for("credential.exfiltration", "GITHUB_TOKEN_2")
        .await;
    assert_eq!(d, "secret=GITHUB_TOKEN_2 host=localhost");
    assert_eq!(s.https_seen.heads().len(), 1);

    // Plain HTTP gets the same treatment.
    let raw = format!(
        "GET http://127.0.0.1:{}/p HTTP/1.1\r\nX-Token: {}\r\n\r\n",
        s.http_port, bound.placeholder
    );
    let (status, body) = g.forward("127.0.0.1", s.http_port, raw.as_bytes()).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body, "credential GITHUB_TOKEN may not be sent to 127.0.0.1");
    assert!(s.http_seen.heads().is_empty());

    // No event anywhere carries the value.
    for (op, detail) in s.audit.ops() {
        assert!(!detail.contains(SECRET), "{op}: {detail}");
    }
}

#[tokio::test]
async fn the_ca_persists_and_bad_roots_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = Gateway::open(&dir.path().join("ca"), GatewayConfig::default()).unwrap();
    let b = Gateway::open(&dir.path().join("ca"), GatewayConfig::default()).unwrap();
    assert_eq!(a.ca_pem(), b.ca_pem());
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let err = Gateway::open(
        &dir.path().join("ca"),
        GatewayConfig {
            extra_roots: vec![junk],
            ..GatewayConfig::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("no PEM certificate"), "{err}");
    let _ = EgressDefault::Deny;
}
