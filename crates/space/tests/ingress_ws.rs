//! End to end: a WebSocket echo server inside a real `base` guest, reached from here through
//! both ways in: the public ingress URL (`/ingress/<token>/echo`) and the authenticated port
//! proxy (`/v1/sandboxes/{id}/ports/{port}/proxy/echo`). The upgrade must pass, frames must
//! flow both ways (a short message and one large enough for a 64-bit length), and the close
//! handshake must complete; a revoked URL and a missing key are refused. The ingress URL also
//! works over TLS on the same port, with the deployment CA served by `/v1/tls/ca.pem`.
//!
//! Needs the guest artifacts (`source target/space/env.sh`), including `SPACE_ROOTFS_BASE`.

mod common;

use std::time::Duration;

use common::{env_path, json, ok, stderr, stdout, TestServer};
use futures::{SinkExt as _, StreamExt as _};
use tokio::io::AsyncReadExt as _;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::http::header::{AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL};
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Message};

/// The port the echo server listens on inside the guest.
const WS_PORT: u16 = 8765;

/// How long one WebSocket step (connect, send, receive) may take under TCG.
const STEP: Duration = Duration::from_secs(60);

/// A WebSocket echo server on the Python standard library alone (the `base` image has no
/// `websockets` package and no network to fetch one): the RFC 6455 handshake on `/echo`, a
/// plain 404 on any other path, text and binary frames sent back unmasked, pings answered,
/// a close echoed. One thread per connection; each request line and its `Host`,
/// `X-Forwarded-Prefix` and `Authorization` headers go to stdout so the test can check what
/// the app saw.
const ECHO_SERVER: &str = r#"import base64
import hashlib
import socket
import struct
import sys
import threading

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_HEAD = 16 * 1024
MAX_FRAME = 1 << 20


def log(*parts):
    print(*parts, flush=True)


class Peer:
    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("the peer closed the connection")
        self.buf += chunk

    def head(self):
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise ValueError("request head too large")
            self.fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return head.decode("latin-1")

    def take(self, n):
        while len(self.buf) < n:
            self.fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def frame(opcode, payload):
    n = len(payload)
    first = 0x80 | opcode
    if n < 126:
        return struct.pack("!BB", first, n) + payload
    if n < 65536:
        return struct.pack("!BBH", first, 126, n) + payload
    return struct.pack("!BBQ", first, 127, n) + payload


def serve(sock):
    peer = Peer(sock)
    lines = peer.head().split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    log("request", method, path,
        "host=" + headers.get("host", "-"),
        "prefix=" + headers.get("x-forwarded-prefix", "-"),
        "auth=" + headers.get("authorization", "-"))
    key = headers.get("sec-websocket-key", "")
    if path != "/echo" or headers.get("upgrade", "").lower() != "websocket" or not key:
        body = b"not a websocket echo request\n"
        sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        return
    accept = base64.b64encode(hashlib.sha1(key.encode("ascii") + GUID).digest())
    reply = (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
             b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n")
    protocol = headers.get("sec-websocket-protocol", "").split(",")[0].strip()
    if protocol:
        reply += b"Sec-WebSocket-Protocol: " + protocol.encode("latin-1") + b"\r\n"
    # A greeting in the same write as the handshake's answer.
    sock.sendall(reply + b"\r\n" + frame(0x1, b"welcome"))
    while True:
        b0, b1 = peer.take(2)
        if not b0 & 0x80:
            raise ValueError("fragmented frames are not supported")
        opcode = b0 & 0x0F
        if not b1 & 0x80:
            raise ValueError("a client frame is not masked")
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", peer.take(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", peer.take(8))
        if n > MAX_FRAME:
            raise ValueError("frame too large")
        mask = peer.take(4)
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(peer.take(n)))
        if opcode in (0x1, 0x2):
            sock.sendall(frame(opcode, data))
            log("echoed", len(data))
        elif opcode == 0x9:
            sock.sendall(frame(0xA, data))
        elif opcode == 0xA:
            continue
        elif opcode == 0x8:
            sock.sendall(frame(0x8, data[:2]))
            log("closed")
            return
        else:
            raise ValueError("unknown opcode %d" % opcode)


def handle(sock):
    try:
        serve(sock)
    except Exception as e:
        log("connection ended:", type(e).__name__, e)
    finally:
        sock.close()


def main():
    port = int(sys.argv[1])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(16)
    log("listening", port)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


main()
"#;

/// Waits inside the guest until something accepts connections on `127.0.0.1:<port>`.
const WAIT_FOR_PORT: &str = r#"import socket, sys, time
deadline = time.time() + 60
while True:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2).close()
        break
    except OSError:
        if time.time() > deadline:
            sys.exit("nothing listens on port " + sys.argv[1])
        time.sleep(0.1)
"#;

/// Runs `line` with `sh -c` in sandbox `id` and panics unless it exits 0; answers stdout.
fn sh(s: &TestServer, id: &str, line: &str) -> String {
    ok(&s.cli(["exec", "-n", id, "--", "sh", "-c", line]))
}

/// `http://host:port` → `ws://host:port`.
fn ws_base(http: &str) -> String {
    let rest = http
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("not an http URL: {http}"));
    format!("ws://{rest}")
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The subprotocol the client offers; the echo server accepts the first one offered.
const SUBPROTOCOL: &str = "echo.v1";

/// Opens a WebSocket to `url` offering [`SUBPROTOCOL`], with `Authorization: Bearer <key>`
/// when given; checks that the server's choice of subprotocol came through.
async fn connect(url: &str, key: Option<&str>) -> Result<Ws, tungstenite::Error> {
    let mut req = url.into_client_request()?;
    req.headers_mut().insert(
        SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static("echo.v1, echo.v0"),
    );
    if let Some(key) = key {
        req.headers_mut()
            .insert(AUTHORIZATION, format!("Bearer {key}").parse().unwrap());
    }
    let (ws, resp) = tokio::time::timeout(STEP, tokio_tungstenite::connect_async(req))
        .await
        .unwrap_or_else(|_| panic!("connecting to {url} took over {STEP:?}"))?;
    assert_eq!(resp.status().as_u16(), 101, "{resp:?}");
    assert_eq!(
        resp.headers().get(SEC_WEBSOCKET_PROTOCOL),
        Some(&HeaderValue::from_static(SUBPROTOCOL)),
        "{resp:?}"
    );
    Ok(ws)
}

/// The next message, within [`STEP`].
async fn next(ws: &mut Ws, what: &str) -> Option<Message> {
    tokio::time::timeout(STEP, ws.next())
        .await
        .unwrap_or_else(|_| panic!("no answer to {what} within {STEP:?}"))
        .map(|m| m.unwrap_or_else(|e| panic!("reading the answer to {what}: {e}")))
}

/// Sends `text` and expects exactly it back.
async fn echo(ws: &mut Ws, text: &str) {
    tokio::time::timeout(STEP, ws.send(Message::text(text)))
        .await
        .expect("sending took too long")
        .expect("sending a text message");
    match next(ws, "a text message").await {
        Some(Message::Text(got)) => {
            assert_eq!(got.len(), text.len(), "the echo has another length");
            assert!(got.as_str() == text, "the echo differs from what was sent");
        }
        other => panic!("expected the echo, got {other:?}"),
    }
}

/// The greeting the server sends in the same write as its `101`, a ping, two round trips (a
/// short message and a 70 000-byte one, which takes a 64-bit frame length), then the close
/// handshake: the server's close frame comes back with the code sent, the stream ends, and
/// the connection is closed from the far end.
async fn exchange(url: &str, key: Option<&str>, tag: &str) {
    let mut ws = connect(url, key)
        .await
        .unwrap_or_else(|e| panic!("the WebSocket upgrade at {url} failed: {e}"));
    match next(&mut ws, "the upgrade").await {
        Some(Message::Text(t)) => assert_eq!(t.as_str(), "welcome"),
        other => panic!("expected the server's greeting, got {other:?}"),
    }
    ws.send(Message::Ping(format!("ping {tag}").into_bytes().into()))
        .await
        .expect("sending a ping");
    match next(&mut ws, "a ping").await {
        Some(Message::Pong(p)) => assert_eq!(p.as_ref(), format!("ping {tag}").as_bytes()),
        other => panic!("expected a pong, got {other:?}"),
    }
    echo(&mut ws, &format!("hello through {tag}")).await;
    let big: String = (0..70_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    echo(&mut ws, &big).await;
    tokio::time::timeout(
        STEP,
        ws.close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })),
    )
    .await
    .expect("closing took too long")
    .expect("sending the close frame");
    match next(&mut ws, "the close frame").await {
        Some(Message::Close(Some(f))) => assert_eq!(f.code, CloseCode::Normal),
        other => panic!("expected the server's close frame, got {other:?}"),
    }
    assert!(
        next(&mut ws, "the end of the stream").await.is_none(),
        "the stream goes on after the close handshake"
    );
    // The server closed its socket after its close frame; the proxy must have closed ours in
    // turn, so the raw connection reads to its end with nothing left.
    let mut tcp = ws.into_inner();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(STEP, tcp.read_to_end(&mut rest))
        .await
        .unwrap_or_else(|_| panic!("{tag} kept the connection open after the close"));
    assert!(
        read.is_ok() && rest.is_empty(),
        "{tag}: after the close came {read:?} and {} bytes",
        rest.len()
    );
}

/// The HTTP status (and body) of a refused WebSocket upgrade at `url`.
async fn refused(url: &str, key: Option<&str>) -> (u16, String) {
    match connect(url, key).await {
        Ok(_) => panic!("the upgrade at {url} was accepted"),
        Err(tungstenite::Error::Http(resp)) => (
            resp.status().as_u16(),
            String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default()).into_owned(),
        ),
        Err(e) => panic!("the upgrade at {url} failed without an HTTP answer: {e}"),
    }
}

/// The ingress URL `url` (`http://127.0.0.1:<port>/ingress/<token>/`) as `wss://localhost`
/// on the same port: the listener answers TLS there with a leaf of the deployment CA, which
/// `/v1/tls/ca.pem` serves; a name the server does not answer to gets no certificate, and
/// plain HTTP still works beside it.
async fn over_tls(s: &TestServer, url: &str) {
    let ca = reqwest::get(format!("{}/v1/tls/ca.pem", s.url))
        .await
        .unwrap();
    assert_eq!(ca.status(), 200);
    let pem = ca.text().await.unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    assert_eq!(roots.len(), 1, "{pem}");
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let client = std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    );
    let port = s.url.rsplit(':').next().unwrap().to_owned();
    let path = url.split_once("/ingress/").unwrap().1;
    let wss = format!("wss://localhost:{port}/ingress/{path}echo");
    let mut req = wss.as_str().into_client_request().unwrap();
    req.headers_mut().insert(
        SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static("echo.v1, echo.v0"),
    );
    let (mut ws, resp) = tokio::time::timeout(
        STEP,
        tokio_tungstenite::connect_async_tls_with_config(
            req,
            None,
            false,
            Some(tokio_tungstenite::Connector::Rustls(client.clone())),
        ),
    )
    .await
    .expect("the TLS WebSocket took too long")
    .unwrap_or_else(|e| panic!("the WebSocket over TLS at {wss} failed: {e}"));
    assert_eq!(resp.status().as_u16(), 101);
    match next(&mut ws, "the upgrade over TLS").await {
        Some(Message::Text(t)) => assert_eq!(t.as_str(), "welcome"),
        other => panic!("expected the server's greeting, got {other:?}"),
    }
    echo(&mut ws, "hello over TLS").await;
    drop(ws);

    // A name that is not the server's: no certificate, so no handshake.
    let tcp = tokio::net::TcpStream::connect(format!("127.0.0.1:{port}"))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("bank.example").unwrap();
    let refused = tokio_rustls::TlsConnector::from(client)
        .connect(name, tcp)
        .await;
    assert!(
        refused.is_err(),
        "the listener presented a certificate for bank.example"
    );

    // Plain HTTP beside it.
    let health = reqwest::get(format!("{}/v1/health", s.url)).await.unwrap();
    assert_eq!(health.status(), 200);
}

#[test]
fn websocket_through_ingress_and_port_proxy() {
    env_path("SPACE_ROOTFS_BASE");
    let s = TestServer::start_with(
        ["--templates", "base", "--pool-size", "0", "--pool-max", "0"]
            .map(String::from)
            .to_vec(),
    );
    let rt = tokio::runtime::Runtime::new().unwrap();

    let id = ok(&s.cli(["create", "--template", "base"]))
        .trim()
        .to_owned();
    assert!(!id.is_empty(), "create printed no id");

    // Upload the server and the readiness probe, start the server detached, wait for it.
    let local = s.tmp_dir().join("ws.py");
    std::fs::write(&local, ECHO_SERVER).unwrap();
    ok(&s.cli(["cp", local.to_str().unwrap(), &format!("{id}:/root/ws.py")]));
    let probe = s.tmp_dir().join("wait_port.py");
    std::fs::write(&probe, WAIT_FOR_PORT).unwrap();
    ok(&s.cli([
        "cp",
        probe.to_str().unwrap(),
        &format!("{id}:/root/wait_port.py"),
    ]));
    sh(
        &s,
        &id,
        &format!("setsid nohup python3 /root/ws.py {WS_PORT} >/root/ws.log 2>&1 &"),
    );
    let waited = s.cli([
        "exec",
        "-n",
        &id,
        "--",
        "python3",
        "/root/wait_port.py",
        &WS_PORT.to_string(),
    ]);
    assert!(
        waited.status.success(),
        "the echo server did not start: {}\n{}",
        stderr(&waited),
        sh(&s, &id, "cat /root/ws.log")
    );

    // ---- the public ingress URL ----
    let port = WS_PORT.to_string();
    let exposed = json(&s.cli(["expose", &id, &port, "--json"]));
    assert_eq!(exposed["port"], WS_PORT);
    let url = exposed["url"].as_str().expect("a url").to_owned();
    let http_prefix = format!("{}/ingress/", s.url);
    assert!(url.starts_with(&http_prefix) && url.ends_with('/'), "{url}");
    let ingress = format!("{}echo", ws_base(&url));
    rt.block_on(exchange(&ingress, None, "ingress"));

    // Any other path reaches the app too, which answers 404 to it: the proxy passes the
    // refused upgrade's answer on as it is.
    let (status, body) = rt.block_on(refused(&format!("{}elsewhere", ws_base(&url)), None));
    assert_eq!(status, 404);
    assert!(body.contains("not a websocket echo request"), "{body}");

    // ---- the same URL over TLS on the same port ----
    rt.block_on(over_tls(&s, &url));

    // ---- the authenticated port proxy ----
    let proxied = format!(
        "{}/v1/sandboxes/{id}/ports/{WS_PORT}/proxy/echo",
        ws_base(&s.url)
    );
    rt.block_on(exchange(&proxied, Some(&s.admin_key), "the port proxy"));
    let (status, _) = rt.block_on(refused(&proxied, None));
    assert_eq!(status, 401, "the port proxy let a caller without a key in");

    // What the app saw: the prefix stripped, Host rewritten, the prefix forwarded, no key.
    let log = sh(&s, &id, "cat /root/ws.log");
    let requests: Vec<&str> = log.lines().filter(|l| l.starts_with("request ")).collect();
    let token_prefix = url
        .strip_prefix(&s.url)
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    assert_eq!(
        requests,
        [
            format!("request GET /echo host=localhost:{WS_PORT} prefix={token_prefix} auth=-"),
            format!("request GET /elsewhere host=localhost:{WS_PORT} prefix={token_prefix} auth=-"),
            // The same URL over TLS.
            format!("request GET /echo host=localhost:{WS_PORT} prefix={token_prefix} auth=-"),
            format!(
                "request GET /echo host=localhost:{WS_PORT} \
                 prefix=/v1/sandboxes/{id}/ports/{WS_PORT}/proxy auth=-"
            ),
        ],
        "the server's log:\n{log}"
    );
    assert_eq!(
        log.lines().filter(|l| *l == "echoed 70000").count(),
        2,
        "{log}"
    );
    assert_eq!(log.lines().filter(|l| *l == "closed").count(), 2, "{log}");
    assert!(!log.contains(&s.admin_key), "the API key reached the app");

    // ---- a revoked URL no longer upgrades ----
    ok(&s.cli(["unexpose", &id, &port]));
    let (status, _) = rt.block_on(refused(&ingress, None));
    assert_eq!(status, 404, "a revoked ingress URL still answers");

    let killed = s.cli(["kill", &id]);
    assert!(killed.status.success(), "{}", stdout(&killed));
    drop(rt);
    drop(s);
}
