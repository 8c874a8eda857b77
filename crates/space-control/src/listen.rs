//! The API listener: plain HTTP and TLS on one port. The first byte of a connection decides
//! (a TLS handshake starts with 0x16, no HTTP method does), so `http://127.0.0.1:7070` keeps
//! working while the hosts of sandbox ports (`https://{port}-{id}.{domain}`, which the E2B
//! SDKs and noVNC build with `https://`) get TLS on the same address.
//!
//! The certificate is the operator's (`TlsSettings::cert`), or a leaf the deployment CA mints
//! for the name the client asked for (SNI), when that name is one the server answers to:
//! `localhost` and its subdomains, the domain of sandbox hosts and its subdomains, the public
//! URL's host, and IP addresses. Clients trust the CA by downloading it from
//! `GET /v1/tls/ca.pem`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use space_tls::{Authority, LeafName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::either::Either;

/// How long a client may take to send its first byte, and then to finish a TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections accepted but not yet served, at most.
const BACKLOG: usize = 256;

/// Where the listener's TLS certificates come from.
#[derive(Debug, Clone, Default)]
pub struct TlsSettings {
    /// The operator's certificate chain and key (PEM files); presented for every name.
    pub cert: Option<(PathBuf, PathBuf)>,
    /// The deployment CA's directory, whose leaves are presented when there is no operator
    /// certificate.
    pub ca_dir: Option<PathBuf>,
    /// Names (besides `localhost`, IP addresses and the hosts of the deployment's URLs) the
    /// CA's leaves are minted for, each with its subdomains.
    pub names: Vec<String>,
}

/// The certificates the listener presents.
pub struct Certificates {
    operator: Option<Arc<CertifiedKey>>,
    ca: Option<Arc<Authority>>,
    names: Vec<String>,
    fallback: LeafName,
}

impl std::fmt::Debug for Certificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certificates")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl Certificates {
    /// The certificates of `settings` for a listener on `addr` that answers to the hosts of
    /// `public_url` and `sandbox_domain` too; `None` when TLS is off (no operator certificate
    /// and no CA).
    pub fn open(
        settings: &TlsSettings,
        addr: SocketAddr,
        public_url: Option<&str>,
        sandbox_domain: &str,
    ) -> anyhow::Result<Option<Certificates>> {
        let operator = match &settings.cert {
            Some((cert, key)) => Some(Arc::new(load_pair(cert, key)?)),
            None => None,
        };
        let ca = match (&operator, &settings.ca_dir) {
            (None, Some(dir)) => Some(Arc::new(
                Authority::open(dir).with_context(|| format!("the CA in {}", dir.display()))?,
            )),
            _ => None,
        };
        if operator.is_none() && ca.is_none() {
            return Ok(None);
        }
        let mut names: Vec<String> = vec!["localhost".to_owned()];
        for n in settings
            .names
            .iter()
            .chain(&host_names(public_url, sandbox_domain))
        {
            let n = n.trim_end_matches('.').to_ascii_lowercase();
            if !n.is_empty() && !names.contains(&n) {
                names.push(n);
            }
        }
        let fallback = if addr.ip().is_unspecified() {
            LeafName::Ip(std::net::Ipv4Addr::LOCALHOST.into())
        } else {
            LeafName::Ip(addr.ip())
        };
        Ok(Some(Certificates {
            operator,
            ca,
            names,
            fallback,
        }))
    }

    /// The CA's certificate, PEM, when leaves come from the deployment CA.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca.as_ref().map(|c| c.ca_pem())
    }

    /// Whether leaves are minted for `name`.
    fn serves(&self, name: &str) -> bool {
        self.names.iter().any(|n| {
            name == n
                || name
                    .strip_suffix(n.as_str())
                    .is_some_and(|p| p.ends_with('.'))
        })
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if let Some(k) = &self.operator {
            return Some(k.clone());
        }
        let ca = self.ca.as_ref()?;
        let name = match hello.server_name() {
            Some(n) => {
                let n = n.to_ascii_lowercase();
                if !self.serves(&n) {
                    tracing::debug!(name = %n, "a TLS client asked for a name this server does not answer to");
                    return None;
                }
                LeafName::Dns(n)
            }
            None => self.fallback.clone(),
        };
        match ca.leaf(&name) {
            Ok(k) => Some(k),
            Err(e) => {
                tracing::warn!(error = %e, %name, "minting a certificate for the API listener");
                None
            }
        }
    }
}

fn load_pair(cert: &PathBuf, key: &PathBuf) -> anyhow::Result<CertifiedKey> {
    let chain: Vec<_> = rustls_pemfile::certs(
        &mut std::fs::read(cert)
            .with_context(|| format!("reading {}", cert.display()))?
            .as_slice(),
    )
    .collect::<Result<_, _>>()
    .with_context(|| format!("parsing {}", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("{} holds no PEM certificate", cert.display());
    }
    let key_der = rustls_pemfile::private_key(
        &mut std::fs::read(key)
            .with_context(|| format!("reading {}", key.display()))?
            .as_slice(),
    )
    .with_context(|| format!("parsing {}", key.display()))?
    .with_context(|| format!("{} holds no PEM private key", key.display()))?;
    let signer = space_tls::provider()
        .key_provider
        .load_private_key(key_der)
        .with_context(|| format!("the key in {}", key.display()))?;
    let pair = CertifiedKey::new(chain, signer);
    pair.keys_match()
        .with_context(|| format!("{} does not match {}", key.display(), cert.display()))?;
    Ok(pair)
}

/// The host names of a deployment's URLs: the public URL's host and the domain of sandbox
/// hosts, each without its port.
pub fn host_names(public_url: Option<&str>, sandbox_domain: &str) -> Vec<String> {
    let host = |s: &str| -> Option<String> {
        let s = s.split_once("://").map_or(s, |(_, rest)| rest);
        let authority = s.split('/').next()?;
        let host = match authority.strip_prefix('[') {
            Some(v6) => v6.split(']').next()?,
            None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
        };
        (!host.is_empty() && host.parse::<std::net::IpAddr>().is_err())
            .then(|| host.to_ascii_lowercase())
    };
    public_url
        .and_then(host)
        .into_iter()
        .chain(host(sandbox_domain))
        .collect()
}

/// A connection: plain, or TLS.
pub type Conn = Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;

/// The listener `axum::serve` takes: connections come from a task that accepts them, reads
/// their first byte and does TLS handshakes off the accept path, so that a slow client holds
/// up no other.
pub struct Listener {
    rx: mpsc::Receiver<(Conn, SocketAddr)>,
    local: SocketAddr,
}

impl Listener {
    /// Serves connections of `tcp`, TLS ones with `certs` (plain only, without).
    pub fn new(tcp: TcpListener, certs: Option<Arc<Certificates>>) -> std::io::Result<Listener> {
        let local = tcp.local_addr()?;
        let acceptor = certs.map(|c| {
            let mut cfg = rustls::ServerConfig::builder_with_provider(space_tls::provider())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_no_client_auth()
                .with_cert_resolver(c);
            // HTTP/1.1 only: WebSockets (noVNC, exec, terminals) upgrade over it.
            cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
            tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
        });
        let (tx, rx) = mpsc::channel(BACKLOG);
        tokio::spawn(accept_loop(tcp, acceptor, tx));
        Ok(Listener { rx, local })
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    tx: mpsc::Sender<(Conn, SocketAddr)>,
) {
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was taken: wait a
                // moment instead of spinning.
                tracing::warn!(error = %e, "accepting an API connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if tx.is_closed() {
            return;
        }
        // Streamed answers (exec's NDJSON lines) are many small writes: without TCP_NODELAY
        // each one after the first waits for the client's delayed ACK (~40 ms on Linux).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "setting TCP_NODELAY on an API connection");
        }
        let Some(acceptor) = acceptor.clone() else {
            if tx.send((Either::Left(stream), peer)).await.is_err() {
                return;
            }
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut first = [0u8; 1];
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first)).await {
                Ok(Ok(1)) => first[0] == 0x16,
                // Closed, failed or silent: nothing to serve.
                _ => return,
            };
            let conn = if tls {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => Either::Right(s),
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, %peer, "a TLS handshake on the API listener failed");
                        return;
                    }
                    Err(_) => return,
                }
            } else {
                Either::Left(stream)
            };
            let _ = tx.send((conn, peer)).await;
        });
    }
}

/// What the handlers may know of a connection (`axum::extract::ConnectInfo<Peer>`).
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Listener>) -> Peer {
        Peer {
            addr: *stream.remote_addr(),
            tls: matches!(stream.io(), Either::Right(_)),
        }
    }
}

/// Whether the request came over TLS.
pub fn over_tls<B>(req: &http::Request<B>) -> bool {
    req.extensions()
        .get::<axum::extract::ConnectInfo<Peer>>()
        .is_some_and(|c| c.0.tls)
}

impl axum::serve::Listener for Listener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task ends only when this listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaves_are_minted_only_for_names_the_server_answers_to() {
        let tmp = tempfile::tempdir().unwrap();
        let settings = TlsSettings {
            cert: None,
            ca_dir: Some(tmp.path().join("ca")),
            names: vec!["Sandboxes.Example.com.".into()],
        };
        let c = Certificates::open(
            &settings,
            "127.0.0.1:7070".parse().unwrap(),
            Some("https://space.example.org"),
            "localhost:7070",
        )
        .unwrap()
        .unwrap();
        assert!(c.serves("localhost"));
        assert!(c.serves("6080-sbx-1.localhost"));
        assert!(c.serves("sandboxes.example.com"));
        assert!(c.serves("6080-sbx-1.sandboxes.example.com"));
        assert!(!c.serves("example.com"));
        assert!(!c.serves("evilsandboxes.example.com"));
        assert!(!c.serves("bank.com"));
        assert!(c.serves("space.example.org"));
        assert!(c
            .ca_pem()
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----"));
        let off = Certificates::open(
            &TlsSettings::default(),
            "127.0.0.1:1".parse().unwrap(),
            None,
            "localhost:1",
        );
        assert!(off.unwrap().is_none());
    }

    #[test]
    fn host_names_drop_schemes_ports_and_addresses() {
        assert_eq!(
            host_names(Some("https://Space.Example.com:8443/x"), "localhost:7070"),
            ["space.example.com", "localhost"]
        );
        assert_eq!(host_names(None, "sbx.example.org"), ["sbx.example.org"]);
        assert!(host_names(Some("http://10.0.0.1:7070"), "[::1]:7070").is_empty());
    }
}
