//! The egress gateway refusing every way to the host and private networks (names that
//! resolve there, a name that changes its answer between check and connect), and a hostile
//! guest end bounded while the other sandboxes are served: through the real wire protocol, as
//! in `gateway.rs`.

mod egress_rig;

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use egress_rig::*;

/// A DNS server played in the test: fixed answers per name, and one name whose answer
/// changes on every question (public first, then loopback).
struct Dns {
    fixed: HashMap<&'static str, Vec<std::net::IpAddr>>,
    rebinding: &'static str,
    questions: Mutex<Vec<String>>,
    loopback_port: u16,
}

impl space_gateway::resolve::Resolve for Dns {
    fn resolve<'a>(&'a self, name: &'a str, port: u16) -> space_gateway::resolve::Resolution<'a> {
        Box::pin(async move {
            let asked = {
                let mut q = self.questions.lock().unwrap();
                q.push(name.to_owned());
                q.iter().filter(|n| *n == name).count()
            };
            if name == self.rebinding {
                let ip: std::net::IpAddr = if asked % 2 == 1 {
                    "192.88.99.1".parse().unwrap()
                } else {
                    "127.0.0.1".parse().unwrap()
                };
                let port = if asked % 2 == 1 {
                    port
                } else {
                    self.loopback_port
                };
                return Ok(vec![std::net::SocketAddr::new(ip, port)]);
            }
            match self.fixed.get(name) {
                Some(ips) => Ok(ips
                    .iter()
                    .map(|ip| std::net::SocketAddr::new(*ip, self.loopback_port))
                    .collect()),
                None => Err(io::Error::new(io::ErrorKind::NotFound, "no such name")),
            }
        })
    }
}

#[tokio::test]
async fn every_way_to_the_host_and_private_networks_is_refused() {
    // A listener on loopback that counts who reaches it: nothing below may.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let loopback_port = listener.local_addr().unwrap().port();
    let reached = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = reached.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(s);
        }
    });
    let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    let dns = Arc::new(Dns {
        fixed: HashMap::from([
            ("localhost", vec![ip("127.0.0.1"), ip("::1")]),
            ("loopback.test", vec![ip("127.0.0.1")]),
            ("metadata.test", vec![ip("169.254.169.254")]),
            ("v6-loopback.test", vec![ip("::1")]),
            ("mapped.test", vec![ip("::ffff:127.0.0.1")]),
            ("private.test", vec![ip("10.0.0.7"), ip("fd00::7")]),
        ]),
        rebinding: "rebind.test",
        questions: Mutex::new(Vec::new()),
        loopback_port,
    });
    let resolver = dns.clone();
    let s = setup(move |c| {
        c.resolver = resolver;
        c.connect_timeout = Duration::from_secs(2);
    })
    .await;
    // Everything allowed by the default and by a wildcard: only the private-address rule
    // stands between the guest and the host.
    let sb = s
        .gateway
        .sandbox(sandbox_id(), policy(r#"{"allow": ["*"]}"#), vec![]);
    let mut g = Guest::connect(sb).await;

    let literals = [
        "127.0.0.1",
        "127.1",
        "127.0.1",
        "2130706433",
        "0x7f000001",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "017700000001",
        "127.0.0.1.",
        "127.254.0.9",
        "0.0.0.0",
        "0",
        "::1",
        "::",
        "::ffff:127.0.0.1",
        "::ffff:7f00:1",
        "::ffff:0:7f00:1",
        "::127.0.0.1",
        "64:ff9b::7f00:1",
        "2002:7f00:1::1",
        "169.254.169.254",
        "0251.0376.0251.0376",
        "2852039166",
        "::ffff:169.254.169.254",
        "fd00:ec2::254",
        "100.100.100.200",
        "169.254.1.1",
        "fe80::1",
        "10.0.0.1",
        "172.16.0.1",
        "192.168.0.1",
        "100.64.0.1",
        "fc00::1",
    ];
    let names = [
        "localhost",
        "loopback.test",
        "metadata.test",
        "v6-loopback.test",
        "mapped.test",
        "private.test",
    ];
    for host in literals.iter().chain(names.iter()) {
        let err = g.connect_tunnel(host, loopback_port).await.unwrap_err();
        assert_eq!(err.0, 403, "CONNECT {host}: {err:?}");
        assert!(err.1.contains("address"), "CONNECT {host}: {err:?}");
        let raw = format!("GET http://{host}:{loopback_port}/ HTTP/1.1\r\nHost: {host}\r\n\r\n");
        let (status, body) = g.forward(host, loopback_port, raw.as_bytes()).await;
        assert!(
            status == 403 || status == 400,
            "forward {host}: {status} {body}"
        );
    }
    s.audit
        .wait_for("egress.deny", "reason=private_address")
        .await;
    // Numbers no resolver reads as one address are refused as hosts, not looked up.
    for bad in [
        "1.2.3.4.5",
        "256.0.0.1",
        "4294967296",
        "127.0.0.1%lo",
        "[::1]",
    ] {
        let (resp, _tx) = g.request("/v1/egress/connect", bad, "80").await;
        assert_eq!(resp.status(), 400, "{bad}");
    }

    // A name whose answer changes between questions: the gateway asks once per connection
    // and connects to the address it checked. The first answer is public (and unroutable
    // here, so the connection fails); the loopback answer that follows is never used for it.
    let err = g
        .connect_tunnel("rebind.test", loopback_port)
        .await
        .unwrap_err();
    assert!(matches!(err.0, 502 | 504), "{err:?}");
    let asked = |name: &str| {
        dns.questions
            .lock()
            .unwrap()
            .iter()
            .filter(|n| *n == name)
            .count()
    };
    assert_eq!(asked("rebind.test"), 1, "one connection, one question");
    // The next connection gets the loopback answer, and is refused for it.
    let err = g
        .connect_tunnel("rebind.test", loopback_port)
        .await
        .unwrap_err();
    assert_eq!(err.0, 403, "{err:?}");
    assert!(err.1.contains("loopback"), "{err:?}");
    assert_eq!(asked("rebind.test"), 2);

    assert_eq!(
        reached.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "something reached the host's loopback"
    );
}

#[tokio::test]
async fn a_hostile_guest_end_is_bounded_and_the_others_are_served() {
    let s = setup(|c| c.max_connections = 8).await;
    let hostile_sb = s
        .gateway
        .sandbox(sandbox_id(), policy(r#"{"allow": ["localhost"]}"#), vec![]);
    let other_sb = s.gateway.sandbox(
        "sbx-gatewayother".parse().unwrap(),
        policy(r#"{"allow": ["localhost"]}"#),
        vec![],
    );

    // Thousands of streams at once: the first few get tunnels, the rest 429 (or the HTTP/2
    // stream limit), and nothing hangs.
    let g = Guest::connect(hostile_sb.clone()).await;
    let mut asks = Vec::new();
    for _ in 0..2000 {
        let mut send = g.send.clone();
        let port = s.https_port;
        asks.push(tokio::spawn(async move {
            let (tx, rx) = mpsc::channel::<Bytes>(1);
            let req = http::Request::post("http://gateway/v1/egress/connect")
                .header("space-host", "localhost")
                .header("space-port", port.to_string())
                .body(ChanBody(rx))
                .unwrap();
            let status = match send.send_request(req).await {
                Ok(resp) => resp.status().as_u16(),
                Err(_) => 0,
            };
            // Hold a granted tunnel open until every stream has been answered.
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(tx);
            status
        }));
    }
    let mut granted = 0;
    let mut limited = 0;
    let all = tokio::time::timeout(Duration::from_secs(60), async {
        for a in asks {
            match a.await.unwrap() {
                200 => granted += 1,
                429 | 0 => limited += 1,
                other => panic!("stream answered {other}"),
            }
        }
    })
    .await;
    assert!(all.is_ok(), "the streams were not all answered within 60 s");
    assert!(granted <= 8, "{granted} tunnels past a limit of 8");
    assert!(limited >= 1992, "{limited} refused");
    s.audit.wait_for("egress.deny", "reason=limit").await;

    // Garbage after the sync line: the connection ends; a new one is served.
    let (host_end, mut guest_end) = tokio::net::UnixStream::pair().unwrap();
    let served = tokio::spawn(space_gateway::serve(host_end, hostile_sb.clone()));
    let line = b"SPACE-EGRESS/1 00112233445566778899aabbccddeeff\n";
    guest_end.write_all(line).await.unwrap();
    let mut echo = vec![0u8; line.len()];
    guest_end.read_exact(&mut echo).await.unwrap();
    let junk: Vec<u8> = (0..256 * 1024).map(|i| (i * 7 + 3) as u8).collect();
    let _ = guest_end.write_all(&junk).await;
    let ended = tokio::time::timeout(Duration::from_secs(10), served).await;
    assert!(ended.is_ok(), "a connection of garbage was not ended");
    drop(guest_end);

    // A preface and then frames that break the protocol: the same.
    let (host_end, mut guest_end) = tokio::net::UnixStream::pair().unwrap();
    let served = tokio::spawn(space_gateway::serve(host_end, hostile_sb.clone()));
    guest_end.write_all(line).await.unwrap();
    guest_end.read_exact(&mut echo).await.unwrap();
    guest_end
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // A SETTINGS frame claiming 16 MiB, then a HEADERS frame on stream 0.
    let _ = guest_end
        .write_all(&[0xff, 0xff, 0xff, 0x04, 0, 0, 0, 0, 0])
        .await;
    let _ = guest_end
        .write_all(&[0, 0, 4, 0x01, 0x04, 0, 0, 0, 0, 1, 2, 3, 4])
        .await;
    let ended = tokio::time::timeout(Duration::from_secs(10), served).await;
    assert!(ended.is_ok(), "a connection breaking HTTP/2 was not ended");

    // The other sandbox was served all along, and the hostile one again once it behaves.
    let mut other = Guest::connect(other_sb).await;
    let t = other.connect_tunnel("localhost", s.https_port).await;
    assert!(t.is_ok(), "{:?}", t.err());
    drop(g);
    let mut again = Guest::connect(hostile_sb).await;
    let mut ok = false;
    for _ in 0..100 {
        match again.connect_tunnel("localhost", s.https_port).await {
            Ok(_) => {
                ok = true;
                break;
            }
            Err((429, _)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(ok, "the hostile sandbox's slots were never freed");
}
