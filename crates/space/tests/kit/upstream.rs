//! Upstream servers on 127.0.0.1 for the gateway's tests: plain HTTP, and HTTPS with a
//! certificate from a CA made here (which a gateway trusts through its extra roots). Each
//! records the request heads it received and answers `upstream saw <path>`.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// The heads of the requests an upstream received.
#[derive(Default, Clone)]
pub struct Seen(pub Arc<Mutex<Vec<String>>>);

impl Seen {
    pub fn heads(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// The heads whose request line contains `path`.
    pub fn with_path(&self, path: &str) -> Vec<String> {
        self.heads()
            .into_iter()
            .filter(|h| h.lines().next().is_some_and(|l| l.contains(path)))
            .collect()
    }
}

/// Reads one request head (at most 64 KiB), records it, answers `upstream saw <path>`, closes.
pub async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, seen: Seen) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 64 * 1024 {
            return;
        }
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
    seen.0.lock().unwrap().push(head);
    let body = format!("upstream saw {path}\n");
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = s.write_all(resp.as_bytes()).await;
    let _ = s.shutdown().await;
}

pub async fn http_upstream(seen: Seen) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(answer(s, seen.clone()));
        }
    });
    port
}

/// A CA made here and an HTTPS server on 127.0.0.1 with a leaf it signed (for `localhost`
/// and `127.0.0.1`); answers the port and the CA's PEM.
pub async fn https_upstream(seen: Seen) -> (u16, String) {
    let pki = super::pki::test_pki("space e2e upstream CA", &["localhost", "127.0.0.1"]);
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![pki.leaf_der.clone()], pki.key_der.clone_key())
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    answer(tls, seen).await;
                }
            });
        }
    });
    (port, pki.ca_pem)
}
