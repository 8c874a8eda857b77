//! End to end: the real `space up` with the `base` template, real guests, and real upstream
//! servers on 127.0.0.1 started here (plain HTTP, and HTTPS with a certificate from a CA made
//! here that the gateway trusts through `--extra-root`). Egress policy, the SNI check, no
//! route out without the proxy, credentials that reach the upstream but never the guest (nor
//! a snapshot or a log), exfiltration refused, policy changes, fork, ingress and audit.
//!
//! Needs the guest artifacts (`source target/space/env.sh`), including `SPACE_ROOTFS_BASE`.

mod common;
mod kit;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{env_path, json, ok, stderr, stdout, TestServer};
use kit::upstream::{http_upstream, https_upstream, Seen};
use serde_json::Value;

/// Runs `line` with `sh -c` in sandbox `id`; answers (exit code, stdout, stderr).
fn sh(s: &TestServer, id: &str, line: &str) -> (i32, String, String) {
    let out = s.cli(["exec", "-n", id, "--", "sh", "-c", line]);
    (out.status.code().unwrap_or(-1), stdout(&out), stderr(&out))
}

/// Like [`sh`], with the proxy used for loopback destinations too (the guest's `NO_PROXY`
/// names 127.0.0.1 and localhost, where the test's upstreams listen on the host).
fn via_proxy(s: &TestServer, id: &str, line: &str) -> (i32, String, String) {
    sh(s, id, &format!("unset NO_PROXY no_proxy; {line}"))
}

fn create(s: &TestServer, args: &[&str]) -> String {
    let mut all = vec!["create", "--template", "base"];
    all.extend_from_slice(args);
    ok(&s.cli(all)).trim().to_owned()
}

/// Polls the sandbox's audit events until every operation in `want` shows; answers them.
fn audit_until(s: &TestServer, id: &str, want: &[&str]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = json(&s.cli(["audit", "--sandbox", id, "--limit", "1000", "--json"]));
        let events = v.as_array().cloned().unwrap_or_default();
        let has = |op: &str| events.iter().any(|e| e["operation"] == op);
        if want.iter().all(|op| has(op)) {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "audit of {id} lacks some of {want:?}: {events:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The files under `dir` (recursively) whose bytes contain `needle`, by `grep` (fast on the
/// large memory and disk files).
fn files_containing(dir: &Path, needle: &str) -> Vec<String> {
    if !dir.exists() {
        return Vec::new();
    }
    let out = std::process::Command::new("grep")
        .args(["-rlaF", "--", needle])
        .arg(dir)
        .output()
        .expect("running grep");
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "grep failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The number of bytes of regular files under `dir`.
fn bytes_under(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in rd.flatten() {
        let Ok(m) = std::fs::symlink_metadata(e.path()) else {
            continue;
        };
        if m.is_dir() {
            total += bytes_under(&e.path());
        } else if m.is_file() {
            total += m.len();
        }
    }
    total
}

#[test]
fn egress_credentials_and_ingress_end_to_end() {
    env_path("SPACE_ROOTFS_BASE");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (plain_seen, tls_seen) = (Seen::default(), Seen::default());
    let plain = rt.block_on(http_upstream(plain_seen.clone()));
    let (tls, ca_pem) = rt.block_on(https_upstream(tls_seen.clone()));

    // The server trusts the test CA for upstreams; the CA file lives next to the data dir.
    let ca_dir = tempfile::Builder::new()
        .prefix("space-e2e-ca")
        .tempdir_in("/var/tmp")
        .unwrap();
    let ca_file = ca_dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let s = TestServer::start_with(vec![
        "--templates".into(),
        "base".into(),
        "--pool-size".into(),
        "0".into(),
        "--pool-max".into(),
        "0".into(),
        "--extra-root".into(),
        ca_file.display().to_string(),
    ]);

    // ---- the vault ----
    let value = format!("e2e-secret-{}", std::process::id()) + "-Zq7VbN3xR9";
    let out = s.cli_stdin(
        format!("{value}\n").as_bytes(),
        ["secret", "set", "TOKEN", "--host", "127.0.0.1"],
    );
    assert!(ok(&out).contains("created"), "{}", stdout(&out));
    let listed = json(&s.cli(["secret", "ls", "--json"]));
    assert_eq!(listed[0]["name"], "TOKEN");
    assert_eq!(listed[0]["hosts"], serde_json::json!(["127.0.0.1"]));
    assert!(
        !listed.to_string().contains(&value),
        "a listing shows the value"
    );
    // Bad input is refused with a clear message and changes nothing.
    let bad = s.cli(["secret", "set", "lower", "--host", "x", "--value", "v"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("[A-Z_]"), "{}", stderr(&bad));
    let bad = s.cli(["secret", "set", "OTHER", "--host", "a*b", "--value", "v"]);
    assert!(!bad.status.success(), "{}", stdout(&bad));
    assert_eq!(
        json(&s.cli(["secret", "ls", "--json"]))
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // ---- a sandbox with the credential bound, the loopback upstream allowed exactly ----
    let id = create(
        &s,
        &[
            "--secret",
            "TOKEN",
            "--allow",
            "127.0.0.1",
            "--allow",
            "localhost",
            "--deny",
            "denied.example",
        ],
    );
    let info = json(&s.cli(["info", &id, "--json"]));
    let placeholder = info["secrets"][0]["placeholder"]
        .as_str()
        .expect("a placeholder")
        .to_owned();
    assert!(placeholder.starts_with("space-secret-") && placeholder.len() == 45);
    assert_eq!(info["secrets"][0]["name"], "TOKEN");
    assert_eq!(info["egress"]["default"], "allow");

    // The guest has the placeholder and never the value.
    let (code, env_text, _) = sh(&s, &id, "tr '\\0' '\\n' < /proc/self/environ");
    assert_eq!(code, 0);
    assert!(
        env_text.contains(&format!("TOKEN={placeholder}")),
        "{env_text}"
    );
    assert!(!env_text.contains(&value));
    assert!(
        env_text.contains("HTTPS_PROXY=http://127.0.0.1:3128"),
        "{env_text}"
    );

    // A CA bundle in the guest that has both the system's (with the deployment CA) and the
    // test upstream's.
    ok(&s.cli_stdin(
        ca_pem.as_bytes(),
        ["exec", &id, "--", "sh", "-c", "cat > /tmp/upstream-ca.pem"],
    ));
    sh(
        &s,
        &id,
        "cat /etc/ssl/certs/ca-certificates.crt /tmp/upstream-ca.pem > /tmp/cas.pem",
    );

    // curl over plain HTTP and HTTPS (intercepted: the sandbox has a binding), with the
    // placeholder in the Authorization header.
    let (code, body, err) = via_proxy(
        &s,
        &id,
        &format!(
            "curl -sS -m 30 -H \"Authorization: Bearer $TOKEN\" http://127.0.0.1:{plain}/plain-1"
        ),
    );
    assert_eq!(code, 0, "curl over HTTP: {err}");
    assert_eq!(body, "upstream saw /plain-1\n");
    let (code, body, err) = via_proxy(
        &s,
        &id,
        &format!(
            "curl -sS -m 30 --cacert /tmp/cas.pem -H \"Authorization: Bearer $TOKEN\" \
             https://127.0.0.1:{tls}/tls-1"
        ),
    );
    assert_eq!(code, 0, "curl over HTTPS: {err}");
    assert_eq!(body, "upstream saw /tls-1\n");
    for (seen, path) in [(&plain_seen, "/plain-1"), (&tls_seen, "/tls-1")] {
        let heads = seen.with_path(path);
        assert_eq!(heads.len(), 1, "{heads:?}");
        let auth = heads[0]
            .lines()
            .find_map(|l| {
                let (name, v) = l.split_once(':')?;
                name.eq_ignore_ascii_case("authorization")
                    .then(|| v.trim().to_owned())
            })
            .unwrap_or_default();
        assert_eq!(auth, format!("Bearer {value}"), "{}", heads[0]);
        assert!(!heads[0].contains(&placeholder), "{}", heads[0]);
    }

    // python3's urllib through the proxy, HTTP and HTTPS.
    let py = format!(
        "import ssl, urllib.request\n\
         ctx = ssl.create_default_context(cafile='/tmp/cas.pem')\n\
         print(urllib.request.urlopen('http://127.0.0.1:{plain}/py-plain', timeout=30).read().decode(), end='')\n\
         print(urllib.request.urlopen('https://127.0.0.1:{tls}/py-tls', timeout=30, context=ctx).read().decode(), end='')\n"
    );
    ok(&s.cli_stdin(
        py.as_bytes(),
        ["exec", &id, "--", "sh", "-c", "cat > /tmp/fetch.py"],
    ));
    let (code, body, err) = via_proxy(&s, &id, "python3 /tmp/fetch.py");
    assert_eq!(code, 0, "python: {err}");
    assert_eq!(body, "upstream saw /py-plain\nupstream saw /py-tls\n");

    // A denied host: 403 with the reason.
    let (code, body, _) = via_proxy(
        &s,
        &id,
        "curl -s -m 30 -D - -o /tmp/deny-body http://denied.example/x; cat /tmp/deny-body",
    );
    assert_eq!(code, 0);
    assert!(body.starts_with("HTTP/1.1 403"), "{body}");
    assert!(
        body.to_ascii_lowercase()
            .contains("x-space-egress: refused"),
        "{body}"
    );
    assert!(body.contains("denied.example"), "{body}");

    // The placeholder sent to an allowed host the secret is not bound to: refused.
    let (code, body, _) = via_proxy(
        &s,
        &id,
        &format!(
            "curl -s -m 30 -o - -w '\\n%{{http_code}}' -H \"Authorization: Bearer $TOKEN\" \
             http://localhost:{plain}/exfil"
        ),
    );
    assert_eq!(code, 0);
    assert!(body.trim_end().ends_with("403"), "{body}");
    assert!(body.contains("TOKEN"), "{body}");
    assert!(plain_seen.with_path("/exfil").is_empty());

    // A CONNECT whose ClientHello names another host is cut.
    let sni = format!(
        "import socket, ssl\n\
         s = socket.create_connection(('127.0.0.1', 3128))\n\
         s.sendall(b'CONNECT 127.0.0.1:{tls} HTTP/1.1\\r\\nHost: 127.0.0.1:{tls}\\r\\n\\r\\n')\n\
         head = b''\n\
         while b'\\r\\n\\r\\n' not in head:\n\
         \x20   c = s.recv(1)\n\
         \x20   if not c: break\n\
         \x20   head += c\n\
         print(head.split(b'\\r\\n')[0].decode())\n\
         ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE\n\
         try:\n\
         \x20   t = ctx.wrap_socket(s, server_hostname='evil.example')\n\
         \x20   t.sendall(b'GET /sni HTTP/1.1\\r\\nHost: evil.example\\r\\n\\r\\n')\n\
         \x20   print('ANSWERED', t.recv(100))\n\
         except Exception as e:\n\
         \x20   print('CUT', type(e).__name__)\n"
    );
    ok(&s.cli_stdin(
        sni.as_bytes(),
        ["exec", &id, "--", "sh", "-c", "cat > /tmp/sni.py"],
    ));
    let (code, body, err) = sh(&s, &id, "python3 /tmp/sni.py");
    assert_eq!(code, 0, "{err}");
    assert!(body.contains("CUT"), "{body}");
    assert!(tls_seen.with_path("/sni").is_empty());

    // Without the proxy there is no route out at all.
    let (code, _, err) = sh(
        &s,
        &id,
        &format!("curl --noproxy '*' -sS -m 10 http://1.1.1.1/ || curl --noproxy '*' -sS -m 10 http://127.0.0.1:{plain}/direct"),
    );
    assert_ne!(code, 0, "a direct connection worked");
    assert!(!err.is_empty());
    // No routes but the loopback's: no IPv4 route at all, IPv6 routes only on lo.
    let (_, routes, _) = sh(
        &s,
        &id,
        "tail -n +2 /proc/net/route; cat /proc/net/ipv6_route",
    );
    let off_lo: Vec<&str> = routes
        .lines()
        .filter(|l| l.split_whitespace().last() != Some("lo"))
        .collect();
    assert!(off_lo.is_empty(), "routes out: {off_lo:?}");
    assert!(plain_seen.with_path("/direct").is_empty());

    // ---- fork keeps the policy and the bindings ----
    let child = ok(&s.cli(["fork", &id])).trim().to_owned();
    let child_info = json(&s.cli(["info", &child, "--json"]));
    assert_eq!(child_info["egress"], info["egress"]);
    assert_eq!(child_info["secrets"], info["secrets"]);
    let (code, body, err) = via_proxy(
        &s,
        &child,
        &format!(
            "curl -sS -m 30 --cacert /tmp/cas.pem -H \"Authorization: Bearer $TOKEN\" \
             https://127.0.0.1:{tls}/child"
        ),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(body, "upstream saw /child\n");
    assert!(tls_seen.with_path("/child")[0].contains(&value));
    ok(&s.cli(["kill", &child]));

    // ---- a policy change applies to new connections, without a restart ----
    let p = json(&s.cli(["net", &id, "deny", "127.0.0.1", "--json"]));
    assert_eq!(
        p["deny"],
        serde_json::json!(["denied.example", "127.0.0.1"])
    );
    assert_eq!(p["allow"], serde_json::json!(["localhost"]));
    let (_, body, _) = via_proxy(
        &s,
        &id,
        &format!(
            "curl -s -m 30 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{plain}/after-deny"
        ),
    );
    assert_eq!(body, "403");
    assert!(plain_seen.with_path("/after-deny").is_empty());
    ok(&s.cli(["net", &id, "allow", "127.0.0.1"]));
    let (_, body, _) = via_proxy(
        &s,
        &id,
        &format!(
            "curl -s -m 30 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{plain}/after-allow"
        ),
    );
    assert_eq!(body, "200");
    let shown = ok(&s.cli(["net", &id, "ls"]));
    assert!(
        shown.contains("default: allow") && shown.contains("allow  127.0.0.1"),
        "{shown}"
    );

    // ---- header rules: the gateway sets a header, with the value put in ----
    // A rule may not carry a secret where it is not bound, nor name one that does not exist.
    let bad = s.cli([
        "net",
        &id,
        "header",
        "localhost",
        "X-Api-Key",
        "k ${secret:TOKEN}",
    ]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("may not be sent to localhost"),
        "{}",
        stderr(&bad)
    );
    let bad = s.cli([
        "net",
        &id,
        "header",
        "127.0.0.1",
        "X-A",
        "${secret:MISSING}",
    ]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("MISSING"), "{}", stderr(&bad));
    let p = json(&s.cli([
        "net",
        &id,
        "header",
        "127.0.0.1",
        "X-Api-Key",
        "k ${secret:TOKEN}",
        "--json",
    ]));
    assert_eq!(
        p["headers"],
        serde_json::json!([{"host": "127.0.0.1", "name": "X-Api-Key",
            "value": "k ${secret:TOKEN}"}])
    );
    assert_eq!(p["allow"], serde_json::json!(["localhost", "127.0.0.1"]));
    let (code, _, err) = via_proxy(
        &s,
        &id,
        &format!(
            "curl -sS -m 30 -H 'X-Api-Key: guest' http://127.0.0.1:{plain}/header-plain && \
             curl -sS -m 30 --cacert /tmp/cas.pem https://127.0.0.1:{tls}/header-tls"
        ),
    );
    assert_eq!(code, 0, "{err}");
    for (seen, path) in [(&plain_seen, "/header-plain"), (&tls_seen, "/header-tls")] {
        let head = seen.with_path(path).pop().expect("the request arrived");
        let keys: Vec<&str> = head
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("x-api-key:"))
            .collect();
        assert_eq!(keys, [format!("X-Api-Key: k {value}").as_str()], "{head}");
    }
    // The guest never had the value: the environment and disk are checked below.
    ok(&s.cli(["net", &id, "unheader", "127.0.0.1", "X-Api-Key"]));
    let (_, body, _) = via_proxy(
        &s,
        &id,
        &format!("curl -sS -m 30 http://127.0.0.1:{plain}/header-gone"),
    );
    assert_eq!(body, "upstream saw /header-gone\n");
    let head = plain_seen.with_path("/header-gone").pop().unwrap();
    assert!(!head.to_ascii_lowercase().contains("x-api-key"), "{head}");

    // ---- audit ----
    let events = audit_until(
        &s,
        &id,
        &[
            "egress.allow",
            "egress.deny",
            "credential.use",
            "credential.exfiltration",
            "egress.update",
        ],
    );
    let exfil = events
        .iter()
        .find(|e| e["operation"] == "credential.exfiltration")
        .unwrap();
    assert_eq!(exfil["result"], "exfiltration");
    assert!(exfil["detail"].as_str().unwrap().contains("TOKEN"));
    assert!(!serde_json::to_string(&events).unwrap().contains(&value));
    let set = json(&s.cli(["audit", "--operation", "secret.set", "--json"]));
    // Newest first: the two refused sets, then the set of TOKEN.
    let results: Vec<&str> = set
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["result"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(results, ["invalid_request", "invalid_request", "ok"]);
    assert_eq!(
        set[2]["detail"],
        "secret=TOKEN kind=value created hosts=127.0.0.1"
    );
    assert!(!set.to_string().contains(&value));

    // ---- ingress ----
    sh(
        &s,
        &id,
        "mkdir -p /tmp/www && echo hello-from-inside > /tmp/www/hello.txt && \
         (setsid nohup python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp/www \
         >/dev/null 2>&1 &)",
    );
    let url = ok(&s.cli(["expose", &id, "8000"])).trim().to_owned();
    assert!(url.starts_with(&format!("{}/ingress/", s.url)), "{url}");
    let http = reqwest::blocking_get_text(&rt, &format!("{url}hello.txt?x=1"));
    assert_eq!(http, (200, "hello-from-inside\n".to_owned()));
    let listed = json(&s.cli(["expose", &id, "--ls", "--json"]));
    assert_eq!(listed[0]["port"], 8000);
    // A request to a suspended sandbox's URL wakes it (restore), and the server in the guest
    // answers as if nothing happened.
    ok(&s.cli(["suspend", &id]));
    let http = reqwest::blocking_get_text(&rt, &format!("{url}hello.txt"));
    assert_eq!(http, (200, "hello-from-inside\n".to_owned()));
    let woke = json(&s.cli(["audit", "--json"]));
    assert!(
        woke.as_array()
            .unwrap()
            .iter()
            .any(|e| e["operation"] == "sandbox.wake" && e["sandbox"] == id.as_str()),
        "{woke}"
    );
    let unknown = format!("{}/ingress/{}/hello.txt", s.url, "A".repeat(32));
    assert_eq!(reqwest::blocking_get_text(&rt, &unknown).0, 404);
    ok(&s.cli(["unexpose", &id, "8000"]));
    assert_eq!(
        reqwest::blocking_get_text(&rt, &format!("{url}hello.txt")).0,
        404
    );

    // ---- nothing holds the value: snapshot memory and disk, records, logs ----
    ok(&s.cli(["snapshot", &id, "--full"]));
    let mut scanned = 0;
    for sub in ["snapshots", "sandboxes", "state", "templates"] {
        let dir = s.data_dir.join(sub);
        scanned += bytes_under(&dir);
        let hits = files_containing(&dir, &value);
        assert!(hits.is_empty(), "the secret's value is in {hits:?}");
    }
    assert!(scanned > 64 << 20, "only {scanned} bytes scanned");
    let log = std::fs::read_to_string(&s.log_path).unwrap_or_default();
    assert!(!log.contains(&value), "the server log has the value");
    let console = ok(&s.cli(["logs", &id]));
    assert!(!console.contains(&value));
    // The placeholder, by contrast, is in the snapshot (the guest's memory has it), which
    // shows the scan reads those files.
    let snaps = s.data_dir.join("snapshots");
    assert!(
        !files_containing(&snaps, &placeholder).is_empty(),
        "the placeholder is not found in the snapshot either: the scan proves nothing"
    );

    // ---- the object store holds neither the value nor a file's plaintext ----
    let marker = format!("file-plaintext-{}", "7f3a9c".repeat(8));
    let (code, _, err) = sh(
        &s,
        &id,
        &format!("echo {marker} > /root/plain.txt && cp /root/plain.txt /tmp/plain.txt && sync"),
    );
    assert_eq!(code, 0, "{err}");
    ok(&s.cli(["suspend", &id]));
    let objects = s.data_dir.join("objects");
    let stored = bytes_under(&objects);
    assert!(stored > 1 << 20, "only {stored} bytes in the object store");
    for needle in [value.as_str(), marker.as_str(), placeholder.as_str()] {
        let hits = files_containing(&objects, needle);
        assert!(hits.is_empty(), "{needle:?} is readable in {hits:?}");
    }
    // The same marker is in the local snapshot (disk and memory): the scan would see it.
    assert!(!files_containing(&s.data_dir.join("snapshots"), &marker).is_empty());
    ok(&s.cli(["restore", &id]));
    assert_eq!(sh(&s, &id, "cat /tmp/plain.txt").1.trim(), marker);

    // ---- the vault's delete ----
    ok(&s.cli(["secret", "rm", "TOKEN"]));
    assert!(json(&s.cli(["secret", "ls", "--json"]))
        .as_array()
        .unwrap()
        .is_empty());
    let gone = s.cli(["secret", "rm", "TOKEN"]);
    assert!(
        stderr(&gone).contains("secret_not_found"),
        "{}",
        stderr(&gone)
    );
    let missing = s.cli(["create", "--template", "base", "--secret", "TOKEN"]);
    assert!(
        stderr(&missing).contains("secret_not_found"),
        "{}",
        stderr(&missing)
    );
    ok(&s.cli(["kill", &id]));
    drop(s);
    drop(rt);
}

/// A tiny blocking GET for the ingress checks.
mod reqwest {
    /// Answers (status, body) of `GET url`.
    pub fn blocking_get_text(rt: &tokio::runtime::Runtime, url: &str) -> (u16, String) {
        rt.block_on(async {
            let client = ::reqwest::Client::builder()
                .redirect(::reqwest::redirect::Policy::none())
                .build()
                .unwrap();
            // The app may take a moment to start listening: retry 502s for a while.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let resp = client.get(url).send().await.expect("GET");
                let status = resp.status().as_u16();
                let body = resp.text().await.unwrap_or_default();
                if status != 502 || std::time::Instant::now() > deadline {
                    return (status, body);
                }
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            }
        })
    }
}

/// Many proxied HTTPS connections in quick succession, one after the other, in one guest:
/// every one of them is answered and the guest stays responsive. Each `curl` is a new process
/// with its own TLS, so under TCG the VMM keeps translating code; a translation buffer that
/// outgrows the VM's memory limit makes the host page the guest's RAM in and out until the
/// guest stops making progress (it froze after 15-20 runs).
#[test]
fn egress_many_connections_in_a_row() {
    env_path("SPACE_ROOTFS_BASE");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let tls_seen = Seen::default();
    let (tls, ca_pem) = rt.block_on(https_upstream(tls_seen.clone()));
    let ca_dir = tempfile::Builder::new()
        .prefix("space-e2e-ca")
        .tempdir_in("/var/tmp")
        .unwrap();
    let ca_file = ca_dir.path().join("upstream-ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let s = TestServer::start_with(vec![
        "--templates".into(),
        "base".into(),
        "--pool-size".into(),
        "0".into(),
        "--pool-max".into(),
        "0".into(),
        "--extra-root".into(),
        ca_file.display().to_string(),
    ]);
    let id = create(&s, &["--allow", "127.0.0.1"]);
    ok(&s.cli_stdin(
        ca_pem.as_bytes(),
        ["exec", &id, "--", "sh", "-c", "cat > /tmp/upstream-ca.pem"],
    ));
    const RUNS: usize = 40;
    let (code, out, err) = via_proxy(
        &s,
        &id,
        &format!(
            "i=0; while [ $i -lt {RUNS} ]; do i=$((i+1)); \
             curl -sS -m 30 -o /dev/null -w '%{{http_code}}\\n' --cacert /tmp/upstream-ca.pem \
             https://127.0.0.1:{tls}/many-$i || echo failed; done"
        ),
    );
    assert_eq!(code, 0, "the loop: {err}");
    let codes: Vec<&str> = out.lines().collect();
    assert_eq!(codes, vec!["200"; RUNS], "curl answers; stderr: {err}");
    assert_eq!(tls_seen.with_path("/many-").len(), RUNS);
    ok(&s.cli(["kill", &id]));
    drop(s);
    drop(rt);
}
