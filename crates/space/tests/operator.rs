//! What an operator runs by hand: `space up` on its own (no Makefile, no environment), and
//! `space purge`, which must leave no VM, control group, mount, loop device or file behind.

mod common;
mod kit;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{json, ok, stderr, TestServer};

/// The cgroup directories a process is in (beyond the root), as `/proc/PID/cgroup` names them.
fn cgroup_dirs(pid: u32) -> Vec<PathBuf> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            if path == "/" {
                return None;
            }
            let mount = if controllers.is_empty() {
                "/sys/fs/cgroup".to_owned()
            } else {
                let first = controllers.split(',').next()?;
                std::fs::read_dir("/sys/fs/cgroup")
                    .ok()?
                    .flatten()
                    .map(|e| e.path())
                    .find(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n.split(',').any(|c| c == first))
                    })?
                    .display()
                    .to_string()
            };
            Some(PathBuf::from(mount).join(path.trim_start_matches('/')))
        })
        .collect()
}

#[test]
fn space_up_stands_alone_and_purge_leaves_nothing_behind() {
    // Only --data-dir and --listen (and a small pool that follows demand over a short
    // window): the kernel, the images and guestd come from the artifacts record
    // `scripts/artifacts.sh` wrote into the cache.
    let window = Duration::from_secs(30);
    let mut server = TestServer::start_bare(
        [
            "--templates",
            "minimal",
            "--pool-size",
            "1",
            "--pool-max",
            "4",
            "--pool-window",
            "30",
        ]
        .map(String::from)
        .to_vec(),
    );
    let made = json(&server.cli(["create", "--template", "minimal", "--json"]));
    let id = made["id"].as_str().expect("an id").to_owned();
    assert_eq!(
        ok(&server.cli(["exec", &id, "--", "echo", "alone"])).trim(),
        "alone"
    );

    // The pool grows under a burst and shrinks back to its floor once the window passed, as
    // /metrics shows.
    let pool = |name: &str| -> u64 {
        let text = server.get("/metrics");
        let line = format!("{name}{{template=\"minimal\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("no {line} in:\n{text}"))
            .trim()
            .parse()
            .unwrap()
    };
    assert_eq!(pool("space_pool_floor"), 1);
    let burst_start = Instant::now();
    let burst: Vec<String> = std::thread::scope(|s| {
        let tasks: Vec<_> = (0..5)
            .map(|_| s.spawn(|| json(&server.cli(["create", "--template", "minimal", "--json"]))))
            .collect();
        tasks
            .into_iter()
            .map(|t| t.join().unwrap()["id"].as_str().unwrap().to_owned())
            .collect()
    });
    assert_eq!(burst.len(), 5);
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !done() {
            assert!(
                Instant::now() < deadline,
                "{what}\n{}",
                server.get("/metrics")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    // How far it grows depends on how close together the creates came (each is a process
    // of its own here); past its floor, and filled, in any case.
    until("the pool did not grow past its floor", &|| {
        pool("space_pool_size") >= 2 && pool("space_pool_ready") >= 2
    });
    assert!(pool("space_pool_size") <= 4, "past its ceiling");
    assert_eq!(
        pool("space_pool_hits_total") + pool("space_pool_misses_total"),
        6
    );
    until("the pool did not shrink back to its floor", &|| {
        pool("space_pool_size") == 1 && pool("space_pool_ready") == 1
    });
    assert!(
        burst_start.elapsed() >= window,
        "shrank before the window passed"
    );
    let templates = ok(&server.cli(["template", "ls"]));
    assert!(templates.contains("minimal"), "{templates}");
    let data = server.data_dir.clone();

    // The API never revokes a deployment's last admin key, and an operator on the host can
    // always mint another one, with the server running.
    let mut mint = server.command(None);
    mint.args(["admin-key", "--json", "--data-dir"]).arg(&data);
    let minted = json(&common::run(mint, None));
    let (minted_key, minted_id) = (
        minted["key"].as_str().unwrap().to_owned(),
        minted["id"].as_str().unwrap().to_owned(),
    );
    assert_eq!(minted["admin"], true, "{minted}");
    let first_id = space_control::keys::parse(&server.admin_key)
        .expect("a whole key")
        .to_owned();
    ok(&server.cli_as(&minted_key, ["key", "revoke", &first_id]));
    let refused = server.cli_as(&minted_key, ["key", "revoke", &minted_id]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("last_admin_key"),
        "{}",
        stderr(&refused)
    );
    let tenants = ok(&server.cli_as(&minted_key, ["tenant", "ls"]));
    assert!(tenants.contains("default"), "{tenants}");
    let audit = ok(&server.cli_as(&minted_key, ["audit", "--json"]));
    assert!(audit.contains("minted on the host"), "{audit}");
    let mut wrong = server.command(None);
    wrong
        .args(["admin-key", "--data-dir"])
        .arg(server.tmp_dir());
    let out = common::run(wrong, None);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no state database"),
        "{}",
        stderr(&out)
    );

    let image = {
        let mut name = data.file_name().unwrap().to_owned();
        name.push(".btrfs.img");
        data.with_file_name(name)
    };
    assert!(
        image.is_file(),
        "the loop image {} is missing",
        image.display()
    );
    assert!(!space_node::teardown::loops_of(&image).is_empty());

    // The server stops; its VMs (the sandbox and the pool's) run on, as they do on Ctrl-C.
    server.stop();
    let vms = space_node::teardown::vms_of(&data);
    assert!(
        !vms.is_empty(),
        "no VM runs from {} after the stop",
        data.display()
    );
    let groups: Vec<PathBuf> = vms.iter().flat_map(|p| cgroup_dirs(*p)).collect();
    assert!(
        !groups.is_empty() && groups.iter().all(|g| g.is_dir()),
        "{groups:?}"
    );

    // Without --yes and without a terminal it refuses, and deletes nothing.
    let mut refuse = server.command(None);
    refuse.args(["purge", "--data-dir"]).arg(&data);
    let out = common::run(refuse, None);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--yes"), "{}", stderr(&out));
    assert!(data.join("sandboxes").exists());

    // A directory that is not space's is refused too.
    let stranger = tempfile::tempdir().unwrap();
    std::fs::write(stranger.path().join("precious.txt"), b"keep").unwrap();
    let mut wrong = server.command(None);
    wrong
        .args(["purge", "--yes", "--data-dir"])
        .arg(stranger.path());
    let out = common::run(wrong, None);
    assert!(!out.status.success(), "{}", stderr(&out));
    assert!(stranger.path().join("precious.txt").exists());

    let mut purge = server.command(None);
    purge.args(["purge", "--yes", "--data-dir"]).arg(&data);
    let out = common::run(purge, None);
    assert!(out.status.success(), "purge failed: {}", stderr(&out));
    assert!(space_node::teardown::vms_of(&data).is_empty());
    for g in &groups {
        assert!(!g.exists(), "cgroup {} is left", g.display());
    }
    assert!(!data.exists(), "{} is left", data.display());
    assert!(!image.exists(), "{} is left", image.display());
    assert!(space_node::teardown::loops_of(&image).is_empty());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&*data.to_string_lossy()),
        "still mounted: {}",
        data.display()
    );
}

/// The HTTPS upstream of the corporate-network test: a Python server on 127.0.0.1 with a
/// certificate of the test's CA, serving `/hello` and a one-package index for pip.
const UPSTREAM: &str = r#"
import http.server, io, ssl, sys, zipfile
cert, key, port_file = sys.argv[1:4]
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:
    z.writestr("corpdemo/__init__.py", "VALUE = 42\n")
    z.writestr("corpdemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: corpdemo\nVersion: 1.0\n")
    z.writestr("corpdemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr("corpdemo-1.0.dist-info/RECORD", "")
WHEEL = buf.getvalue()
NAME = "corpdemo-1.0-py3-none-any.whl"
PAGES = {
    "/hello": b"hello from the corporate upstream\n",
    "/simple/corpdemo/": f'<html><body><a href="/files/{NAME}">{NAME}</a></body></html>'.encode(),
    f"/files/{NAME}": WHEEL,
}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = PAGES.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        kind = "text/html" if self.path.startswith("/simple/") else "application/octet-stream"
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
open(port_file, "w").write(str(srv.server_address[1]))
srv.serve_forever()
"#;

/// A CA and a leaf it signed for 127.0.0.1 and `only-via-proxy.test`: (CA PEM, leaf PEM, key
/// PEM).
fn test_pki() -> (String, String, String) {
    let p = kit::pki::test_pki(
        "Corporate Inspection CA (test)",
        &["127.0.0.1", "only-via-proxy.test"],
    );
    (p.ca_pem, p.leaf_pem, p.key_pem)
}

/// A `CONNECT` proxy on 127.0.0.1 that knows one name the host's resolver does not:
/// `only-via-proxy.test` is the upstream on 127.0.0.1. Records each CONNECT target.
fn start_proxy(upstream_port: u16, seen: Arc<Mutex<Vec<String>>>) -> u16 {
    use std::io::{Read as _, Write as _};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in l.incoming().flatten() {
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut client = client;
                let mut head = Vec::new();
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                    if client.read(&mut b).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(b[0]);
                }
                let line = String::from_utf8_lossy(&head)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_owned();
                let target = line.split_whitespace().nth(1).unwrap_or("").to_owned();
                seen.lock().unwrap().push(target.clone());
                let addr = match target.rsplit_once(':') {
                    Some(("only-via-proxy.test", _)) => format!("127.0.0.1:{upstream_port}"),
                    _ => {
                        let _ = client.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n");
                        return;
                    }
                };
                let Ok(up) = std::net::TcpStream::connect(addr) else {
                    let _ = client.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
                    return;
                };
                let _ = client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
                let (mut c2, mut u2) = (client.try_clone().unwrap(), up.try_clone().unwrap());
                let mut up = up;
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c2, &mut u2);
                    let _ = u2.shutdown(std::net::Shutdown::Write);
                });
                let _ = std::io::copy(&mut up, &mut client);
                let _ = client.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    port
}

/// Runs `line` in sandbox `id` with the gateway as the proxy for loopback too (the guest's
/// NO_PROXY names 127.0.0.1); answers (exit code, stdout, stderr).
fn via_gateway(s: &TestServer, id: &str, line: &str) -> (i32, String, String) {
    let out = s.cli([
        "exec",
        "-n",
        id,
        "--",
        "sh",
        "-c",
        &format!("unset NO_PROXY no_proxy; {line}"),
    ]);
    (
        out.status.code().unwrap_or(-1),
        common::stdout(&out),
        stderr(&out),
    )
}

#[test]
fn operator_cas_are_trusted_in_sandboxes_and_the_host_proxy_is_used() {
    common::env_path("SPACE_ROOTFS_BASE");
    let tmp = tempfile::tempdir().unwrap();
    let (ca, leaf, key) = test_pki();
    let cas = tmp.path().join("host-cas");
    std::fs::create_dir_all(cas.join("corp")).unwrap();
    // As an operator adds one: a .crt under /usr/local/share/ca-certificates (a subdirectory).
    std::fs::write(cas.join("corp/inspection.crt"), &ca).unwrap();
    std::fs::write(tmp.path().join("leaf.pem"), &leaf).unwrap();
    std::fs::write(tmp.path().join("key.pem"), &key).unwrap();
    std::fs::write(tmp.path().join("upstream.py"), UPSTREAM).unwrap();
    let port_file = tmp.path().join("port");
    let mut upstream = std::process::Command::new("python3")
        .arg(tmp.path().join("upstream.py"))
        .arg(tmp.path().join("leaf.pem"))
        .arg(tmp.path().join("key.pem"))
        .arg(&port_file)
        .spawn()
        .expect("starting the HTTPS upstream");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let port: u16 = loop {
        if let Some(p) = std::fs::read_to_string(&port_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the upstream did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let seen = Arc::new(Mutex::new(Vec::new()));
    let proxy = start_proxy(port, seen.clone());

    let args = || {
        ["--templates", "base", "--pool-size", "1", "--pool-max", "0"]
            .map(String::from)
            .to_vec()
    };
    let env = vec![
        ("SPACE_HOST_CA_DIR".to_owned(), cas.display().to_string()),
        (
            "HTTPS_PROXY".to_owned(),
            format!("http://127.0.0.1:{proxy}"),
        ),
        ("NO_PROXY".to_owned(), "127.0.0.1,localhost".to_owned()),
    ];
    let server = TestServer::start_bare_with_env(args(), env);
    let id = ok(&server.cli(["create", "--template", "base", "--allow", "127.0.0.1"]))
        .trim()
        .to_owned();
    let hello = format!("https://127.0.0.1:{port}/hello");
    let (code, out, err) = via_gateway(&server, &id, &format!("curl -sS --max-time 60 {hello}"));
    assert_eq!(
        (code, out.as_str()),
        (0, "hello from the corporate upstream\n"),
        "{err}"
    );
    let py = format!(
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('{hello}', timeout=60).read().decode(), end='')\""
    );
    let (code, out, err) = via_gateway(&server, &id, &py);
    assert_eq!(
        (code, out.as_str()),
        (0, "hello from the corporate upstream\n"),
        "{err}"
    );
    let pip = format!(
        "pip download --no-deps --disable-pip-version-check -q -d /tmp/dl \
         --index-url https://127.0.0.1:{port}/simple/ corpdemo==1.0 && ls /tmp/dl"
    );
    let (code, out, err) = via_gateway(&server, &id, &pip);
    assert_eq!(
        (code, out.trim()),
        (0, "corpdemo-1.0-py3-none-any.whl"),
        "pip: {err}"
    );
    // A name only the host's proxy knows, reached through it (NO_PROXY spares 127.0.0.1).
    let far = format!("https://only-via-proxy.test:{port}/hello");
    let (code, out, err) = via_gateway(&server, &id, &format!("curl -sS --max-time 60 {far}"));
    assert_eq!(
        (code, out.as_str()),
        (0, "hello from the corporate upstream\n"),
        "{err}"
    );
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [format!("only-via-proxy.test:{port}")],
        "the proxy saw other tunnels than the one through it"
    );
    drop(server);

    // Without the CA and without the proxy, the same requests fail, and say why.
    let empty = tmp.path().join("no-cas");
    std::fs::create_dir_all(&empty).unwrap();
    let env = vec![("SPACE_HOST_CA_DIR".to_owned(), empty.display().to_string())];
    let plain = TestServer::start_bare_with_env(args(), env);
    let id = ok(&plain.cli(["create", "--template", "base", "--allow", "127.0.0.1"]))
        .trim()
        .to_owned();
    let (code, _, err) = via_gateway(&plain, &id, &format!("curl -sS --max-time 60 {hello}"));
    assert_eq!(code, 60, "curl should fail on the certificate: {err}");
    assert!(err.contains("certificate"), "{err}");
    let (code, _, err) = via_gateway(&plain, &id, &pip);
    assert_ne!(code, 0);
    assert!(
        err.contains("CERTIFICATE_VERIFY_FAILED") || err.contains("certificate"),
        "{err}"
    );
    let (code, _, err) = via_gateway(&plain, &id, &format!("curl -sS --max-time 60 {far}"));
    assert_ne!(code, 0, "reached without the proxy: {err}");
    let _ = upstream.kill();
    let _ = upstream.wait();
}
