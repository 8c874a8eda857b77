//! Credentials in request bodies and out of responses, through the gateway's real wire
//! protocol and real TLS: values put in form, JSON, multipart and chunked bodies (however the
//! guest cuts its writes), placeholders bound elsewhere refused, long bodies streamed, and
//! echoes of a value (plain, chunked, gzip, in a header) turned back into the placeholder.

mod egress_rig;

use std::time::Duration;

use space_gateway::SecretBinding;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use egress_rig::*;

struct Rig {
    s: Setup,
    g: Guest,
    ca: String,
    /// `PASSWORD`, bound to localhost and 127.0.0.1.
    pw: SecretBinding,
    /// `GITHUB_TOKEN`, bound to api.github.com only.
    token: SecretBinding,
}

async fn rig() -> Rig {
    let s = setup(|_| {}).await;
    let pw = SecretBinding::new(
        "PASSWORD",
        vec!["localhost".parse().unwrap(), "127.0.0.1".parse().unwrap()],
    );
    let token = SecretBinding::new("GITHUB_TOKEN", vec!["api.github.com".parse().unwrap()]);
    let sb = s.gateway.sandbox(
        sandbox_id(),
        policy(r#"{"allow": ["localhost", "127.0.0.1"]}"#),
        vec![pw.clone(), token.clone()],
    );
    let g = Guest::connect(sb).await;
    let ca = s.gateway.ca_pem();
    Rig {
        s,
        g,
        ca,
        pw,
        token,
    }
}

impl Rig {
    /// One HTTPS exchange through a tunnel to the local upstream, the request written in
    /// `pieces` with a pause between them; the whole response.
    async fn send(&mut self, pieces: &[Vec<u8>]) -> Vec<u8> {
        let t = self
            .g
            .connect_tunnel("localhost", self.s.https_port)
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost".to_owned()).unwrap();
        let mut tls = tls_client(&self.ca).connect(name, t).await.unwrap();
        for p in pieces {
            tls.write_all(p).await.unwrap();
            tls.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut out = Vec::new();
        let _ = tls.read_to_end(&mut out).await;
        out
    }

    async fn post(&mut self, path: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: {content_type}\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        self.send(&[req]).await
    }

    /// The last request the HTTPS upstream saw.
    fn seen(&self) -> (String, Vec<u8>) {
        self.s.https_seen.0.lock().unwrap().last().cloned().unwrap()
    }
}

fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .expect("a Content-Length")
        .trim()
        .parse()
        .unwrap()
}

fn form_field(body: &[u8], name: &str) -> String {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// Every way the password could appear in a response, by a decoder's view: raw, form-encoded
/// and JSON-escaped.
fn assert_no_password(bytes: &[u8], what: &str) {
    let text = String::from_utf8_lossy(bytes);
    assert!(!text.contains(PASSWORD), "{what}: {text}");
    let form: String = form_urlencoded::byte_serialize(PASSWORD.as_bytes()).collect();
    assert!(!text.contains(&form), "{what}: {text}");
    let json = serde_json::to_string(PASSWORD).unwrap();
    assert!(!text.contains(json.trim_matches('"')), "{what}: {text}");
    assert!(!text.contains("wörd"), "{what}: {text}");
}

#[tokio::test]
async fn values_go_into_bodies_encoded_for_their_type() {
    let mut r = rig().await;
    let p = r.pw.placeholder.clone();

    // A form: the value form-encoded, the length recomputed.
    let resp = r
        .post(
            "/login",
            "application/x-www-form-urlencoded",
            format!("user=me&password={p}&again={p}").as_bytes(),
        )
        .await;
    assert!(resp.starts_with(b"HTTP/1.1 200 OK"), "{resp:?}");
    let (head, body) = r.seen();
    assert_eq!(form_field(&body, "password"), PASSWORD);
    assert_eq!(form_field(&body, "again"), PASSWORD);
    assert_eq!(form_field(&body, "user"), "me");
    assert_eq!(content_length(&head), body.len());
    assert!(!String::from_utf8_lossy(&body).contains(&p));
    r.s.audit
        .wait_for("credential.use", "secret=PASSWORD host=localhost")
        .await;

    // JSON: the value escaped inside its string.
    r.post(
        "/login",
        "application/json; charset=utf-8",
        format!(r#"{{"user": "me", "password": "{p}"}}"#).as_bytes(),
    )
    .await;
    let (head, body) = r.seen();
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(doc["password"], PASSWORD);
    assert_eq!(content_length(&head), body.len());

    // Multipart and plain text: as is.
    let multipart =
        format!("--b\r\nContent-Disposition: form-data; name=\"password\"\r\n\r\n{p}\r\n--b--\r\n");
    r.post(
        "/login",
        "multipart/form-data; boundary=b",
        multipart.as_bytes(),
    )
    .await;
    let (_, body) = r.seen();
    assert_eq!(
        String::from_utf8(body).unwrap(),
        multipart.replace(&p, PASSWORD)
    );
    r.post("/login", "text/plain", format!("pw={p}").as_bytes())
        .await;
    assert_eq!(r.seen().1, format!("pw={PASSWORD}").into_bytes());
}

#[tokio::test]
async fn chunked_bodies_and_placeholders_cut_across_writes() {
    let mut r = rig().await;
    let p = r.pw.placeholder.clone();
    // The placeholder is cut across two chunks, and the chunks across writes that cut the
    // chunk-size lines themselves.
    let (a, b) = p.split_at(20);
    let body1 = format!("password={a}");
    let body2 = format!("{b}&user=me");
    let raw = format!(
        "POST /login HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body1}\r\n{:x}\r\n{body2}\r\n0\r\n\r\n",
        body1.len(),
        body2.len()
    )
    .into_bytes();
    let pieces: Vec<Vec<u8>> = raw.chunks(17).map(<[u8]>::to_vec).collect();
    let resp = r.send(&pieces).await;
    assert!(resp.starts_with(b"HTTP/1.1 200 OK"), "{resp:?}");
    let (head, body) = r.seen();
    assert!(
        !head.to_ascii_lowercase().contains("transfer-encoding"),
        "{head}"
    );
    assert_eq!(content_length(&head), body.len());
    assert_eq!(form_field(&body, "password"), PASSWORD);
    assert_eq!(form_field(&body, "user"), "me");

    // A client that waits for 100 Continue gets it from the gateway.
    let t =
        r.g.connect_tunnel("localhost", r.s.https_port)
            .await
            .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost".to_owned()).unwrap();
    let mut tls = tls_client(&r.ca).connect(name, t).await.unwrap();
    let body = format!("password={p}");
    tls.write_all(
        format!(
            "POST /login HTTP/1.1\r\nHost: localhost\r\nExpect: 100-continue\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut first = [0u8; 25];
    tls.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 100 Continue\r\n\r\n");
    tls.write_all(body.as_bytes()).await.unwrap();
    let mut rest = Vec::new();
    let _ = tls.read_to_end(&mut rest).await;
    assert!(rest.starts_with(b"HTTP/1.1 200 OK"), "{rest:?}");
    let (head, body) = r.seen();
    assert!(!head.to_ascii_lowercase().contains("expect:"), "{head}");
    assert_eq!(form_field(&body, "password"), PASSWORD);
}

#[tokio::test]
async fn placeholders_bound_elsewhere_are_refused_in_bodies() {
    let mut r = rig().await;
    let before = r.s.https_seen.heads().len();
    let resp = r
        .post(
            "/collect",
            "application/json",
            format!(r#"{{"t": "{}"}}"#, r.token.placeholder).as_bytes(),
        )
        .await;
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 403 Forbidden"), "{text}");
    assert!(
        text.ends_with("credential GITHUB_TOKEN may not be sent to localhost"),
        "{text}"
    );
    let d =
        r.s.audit
            .wait_for("credential.exfiltration", "GITHUB_TOKEN")
            .await;
    assert_eq!(d, "secret=GITHUB_TOKEN host=localhost");
    assert_eq!(r.s.https_seen.heads().len(), before, "nothing was sent on");

    // Over plain HTTP too.
    let raw = format!(
        "POST http://127.0.0.1:{}/collect HTTP/1.1\r\nContent-Length: 45\r\n\r\n{}",
        r.s.http_port, r.token.placeholder
    );
    let (status, body) =
        r.g.forward("127.0.0.1", r.s.http_port, raw.as_bytes())
            .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("HTTP/1.1 403 Forbidden"), "{body}");
    assert!(r.s.http_seen.heads().is_empty());
}

#[tokio::test]
async fn long_bodies_stream_through_and_placeholders_in_them_end_the_request() {
    let mut r = rig().await;
    let n = 300 * 1024;
    let big: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
    let resp = r.post("/upload", "application/octet-stream", &big).await;
    assert!(resp.starts_with(b"HTTP/1.1 200 OK"), "{resp:?}");
    assert_eq!(r.seen().1, big, "the long body arrived as it was");

    // A bound placeholder past the bound cannot be replaced: 413.
    let mut with_pw = big.clone();
    with_pw.extend_from_slice(r.pw.placeholder.as_bytes());
    let resp = r.post("/upload", "text/plain", &with_pw).await;
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("credential PASSWORD"), "{text}");

    // One bound elsewhere is an exfiltration, wherever it is.
    let mut with_token = big.clone();
    with_token.extend_from_slice(r.token.placeholder.as_bytes());
    let resp = r.post("/upload", "text/plain", &with_token).await;
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 403"), "{text}");
    r.s.audit
        .wait_for("credential.exfiltration", "GITHUB_TOKEN")
        .await;
}

#[tokio::test]
async fn echoes_come_back_as_the_placeholder() {
    let mut r = rig().await;
    let p = r.pw.placeholder.clone();
    let form = format!("password={p}");
    for path in ["/echo", "/echo-gzip", "/echo-chunked", "/echo-header"] {
        let resp = r
            .post(path, "application/x-www-form-urlencoded", form.as_bytes())
            .await;
        // The site did get the value...
        assert_eq!(form_field(&r.seen().1, "password"), PASSWORD, "{path}");
        // ...and the guest gets the placeholder wherever the site echoed it.
        assert_no_password(&resp, path);
        let body = response_body(&resp);
        assert_eq!(
            String::from_utf8(body).unwrap(),
            format!("you sent: password={p}"),
            "{path}"
        );
        let text = String::from_utf8_lossy(&resp).to_ascii_lowercase();
        assert!(!text.contains("content-encoding"), "{path}: {text}");
    }
    let resp = r.post("/echo-header", "text/plain", p.as_bytes()).await;
    let text = String::from_utf8_lossy(&resp);
    assert!(
        text.contains(&format!("Location: /login?was={p}\r\n")),
        "{text}"
    );

    // The same echo in JSON, as JSON writers escape it.
    let resp = r
        .post(
            "/echo",
            "application/json",
            format!(r#"{{"password":"{p}"}}"#).as_bytes(),
        )
        .await;
    assert_no_password(&resp, "json");

    // An encoding the gateway cannot read is refused, not passed on.
    let resp = r
        .post(
            "/echo-br",
            "application/x-www-form-urlencoded",
            form.as_bytes(),
        )
        .await;
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 502"), "{text}");
    assert!(text.contains("encoded as br"), "{text}");
    assert_no_password(&resp, "br");

    // HEAD: a head and no body.
    let resp = r
        .send(&[b"HEAD /echo HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec()])
        .await;
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(text.ends_with("\r\n\r\n"), "{text}");

    // Upstream was asked for encodings the gateway reads.
    let (head, _) = r.seen();
    assert!(
        head.contains("Accept-Encoding: gzip, deflate\r\n"),
        "{head}"
    );

    // A long response streams through, scrubbed.
    let resp = r
        .send(&[format!("GET /big?n={} HTTP/1.1\r\nHost: localhost\r\n\r\n", 3 << 20).into_bytes()])
        .await;
    assert_eq!(response_body(&resp).len(), 3 << 20);
    // A body that inflates a thousandfold streams through too (32 KiB on the wire).
    let resp = r
        .send(&[format!(
            "GET /zeros-gzip?n={} HTTP/1.1\r\nHost: localhost\r\n\r\n",
            32 << 20
        )
        .into_bytes()])
        .await;
    let body = response_body(&resp);
    assert_eq!(body.len(), 32 << 20);
    assert!(body.iter().all(|&b| b == 0));

    // Over plain HTTP, the same.
    let raw = format!(
        "POST http://127.0.0.1:{}/echo HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: {}\r\n\r\n{form}",
        r.s.http_port,
        form.len()
    );
    let (status, body) =
        r.g.forward("127.0.0.1", r.s.http_port, raw.as_bytes())
            .await;
    assert_eq!(status, 200, "{body}");
    assert_no_password(body.as_bytes(), "forward");
    assert_eq!(
        form_field(&r.s.http_seen.0.lock().unwrap()[0].1, "password"),
        PASSWORD
    );
    assert_eq!(
        String::from_utf8(response_body(body.as_bytes())).unwrap(),
        format!("you sent: password={p}")
    );
    for (op, detail) in r.s.audit.ops() {
        assert!(!detail.contains("wörd"), "{op}: {detail}");
    }
}
