//! Header rules of a sandbox's egress policy, through the gateway's real wire protocol and
//! real TLS: headers set (replacing the guest's) on requests to the hosts a rule names, vault
//! secrets put in as the request leaves and scrubbed out of what comes back, other hosts
//! spliced untouched, a rule naming a secret the vault lacks refused, and a policy replaced
//! on a running sandbox taking effect on the next connection.

mod egress_rig;

use std::sync::Arc;

use space_gateway::SandboxGateway;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use egress_rig::*;

const RULES: &str = r#"{"allow": ["localhost", "127.0.0.1"], "headers": [
    {"host": "localhost", "name": "Authorization", "value": "Bearer ${secret:GITHUB_TOKEN}"},
    {"host": "localhost", "name": "X-Plain", "value": "first"},
    {"host": "localhost:*", "name": "x-plain", "value": "second"},
    {"host": "127.0.0.1", "name": "X-Api-Key", "value": "k-${secret:PASSWORD}-k"},
    {"host": "elsewhere.example", "name": "X-Other", "value": "never"}
]}"#;

async fn https(g: &mut Guest, ca: &str, port: u16, request: &str) -> String {
    let t = g.connect_tunnel("localhost", port).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost".to_owned()).unwrap();
    let mut tls = tls_client(ca).connect(name, t).await.unwrap();
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn header_lines<'a>(head: &'a str, name: &str) -> Vec<&'a str> {
    head.lines()
        .filter(|l| {
            l.split_once(':')
                .is_some_and(|(n, _)| n.eq_ignore_ascii_case(name))
        })
        .collect()
}

fn sandbox(s: &Setup, json: &str) -> Arc<SandboxGateway> {
    s.gateway.sandbox(sandbox_id(), policy(json), Vec::new())
}

#[tokio::test]
async fn rules_set_headers_with_secrets_and_scrub_the_echo() {
    let s = setup(|_| {}).await;
    let ca = s.gateway.ca_pem();
    let mut g = Guest::connect(sandbox(&s, RULES)).await;
    let resp = https(
        &mut g,
        &ca,
        s.https_port,
        "GET /echo-head HTTP/1.1\r\nHost: localhost\r\nAuthorization: guest-made\r\n\
         X-PLAIN: guest\r\nX-Guest: kept\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    let (head, _) = s.https_seen.0.lock().unwrap().last().cloned().unwrap();
    // The rule's headers replace the guest's, once each; the later rule for a name wins.
    assert_eq!(
        header_lines(&head, "authorization"),
        vec![format!("Authorization: Bearer {SECRET}").as_str()],
        "{head}"
    );
    assert_eq!(header_lines(&head, "x-plain"), vec!["x-plain: second"]);
    assert_eq!(header_lines(&head, "x-guest"), vec!["X-Guest: kept"]);
    assert!(header_lines(&head, "x-other").is_empty(), "{head}");
    assert!(header_lines(&head, "x-api-key").is_empty(), "{head}");
    // The echo of the request's head comes back with the value turned into its reference.
    assert!(!resp.contains(SECRET), "{resp}");
    assert!(
        resp.contains("Authorization: Bearer ${secret:GITHUB_TOKEN}"),
        "{resp}"
    );
    s.audit
        .wait_for("credential.use", "secret=GITHUB_TOKEN host=localhost")
        .await;
    s.audit.wait_for("egress.allow", "kind=intercept").await;
}

#[tokio::test]
async fn plain_http_gets_the_rules_of_its_host() {
    let s = setup(|_| {}).await;
    let mut g = Guest::connect(sandbox(&s, RULES)).await;
    let port = s.http_port;
    let (status, body) = g
        .forward(
            "127.0.0.1",
            port,
            format!(
                "GET http://127.0.0.1:{port}/echo-head HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
                 x-api-key: mine\r\n\r\n"
            )
            .as_bytes(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (head, _) = s.http_seen.0.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        header_lines(&head, "x-api-key"),
        vec![format!("X-Api-Key: k-{PASSWORD}-k").as_str()],
        "{head}"
    );
    // Rules for other hosts stay with them.
    assert!(header_lines(&head, "authorization").is_empty(), "{head}");
    assert!(!body.contains(PASSWORD), "{body}");
    assert!(body.contains("k-${secret:PASSWORD}-k"), "{body}");
}

#[tokio::test]
async fn hosts_without_rules_are_spliced_and_rules_change_on_a_running_sandbox() {
    let s = setup(|_| {}).await;
    // A spliced tunnel shows the upstream's own certificate, an intercepted one the
    // gateway's: the guest trusts both.
    let upstream_ca = std::fs::read_to_string(s._dir.path().join("upstream-ca.pem")).unwrap();
    let ca = format!("{}{upstream_ca}", s.gateway.ca_pem());
    let sb = sandbox(&s, r#"{"allow": ["localhost"]}"#);
    let mut g = Guest::connect(sb.clone()).await;
    let request = "GET /echo-head HTTP/1.1\r\nHost: localhost\r\nX-Plain: guest\r\n\r\n";

    // No rule names the host: the tunnel is spliced and the request arrives as sent.
    let resp = https(&mut g, &ca, s.https_port, request).await;
    assert!(resp.contains("X-Plain: guest"), "{resp}");
    s.audit.wait_for("egress.allow", "kind=tunnel").await;

    // A rule added while the sandbox runs applies to the next connection.
    sb.set_policy(policy(
        r#"{"allow": ["localhost"], "headers": [
            {"host": "*", "name": "X-Plain", "value": "from the rule"}]}"#,
    ));
    let resp = https(&mut g, &ca, s.https_port, request).await;
    assert!(resp.contains("X-Plain: from the rule"), "{resp}");
    assert!(!resp.contains("X-Plain: guest"), "{resp}");
    s.audit.wait_for("egress.allow", "kind=intercept").await;
}

#[tokio::test]
async fn a_rule_naming_a_missing_secret_refuses_the_request() {
    let s = setup(|_| {}).await;
    let ca = s.gateway.ca_pem();
    let mut g = Guest::connect(sandbox(
        &s,
        r#"{"allow": ["localhost"], "headers": [
            {"host": "localhost", "name": "Authorization", "value": "Bearer ${secret:GONE}"}]}"#,
    ))
    .await;
    let before = s.https_seen.0.lock().unwrap().len();
    let resp = https(
        &mut g,
        &ca,
        s.https_port,
        "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 502"), "{resp}");
    assert!(resp.contains("credential GONE"), "{resp}");
    // Nothing reached upstream.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(s.https_seen.0.lock().unwrap().len(), before);
}
