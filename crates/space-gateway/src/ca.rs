//! The TLS configurations of both sides of an interception: the leaves the deployment CA
//! (`space_tls`, `<data>/state/ca/`) mints for intercepted hosts, and the roots upstreams are
//! checked against.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::policy::Host;
use super::GatewayError;

pub use space_tls::{CA_CERT, CA_KEY};

/// The crypto provider of both sides (ring), chosen explicitly so the process default does not
/// matter.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    space_tls::provider()
}

/// The deployment CA, as the gateway uses it.
pub struct Authority(space_tls::Authority);

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

fn tls_err(e: space_tls::CaError) -> GatewayError {
    match e {
        space_tls::CaError::Io { op, path, source } => GatewayError::Io { op, path, source },
        space_tls::CaError::Tls(m) => GatewayError::Tls(m),
    }
}

impl Authority {
    /// Loads the CA from `dir`, making it (and `dir`, mode 0700) when absent.
    pub fn open(dir: &Path) -> Result<Authority, GatewayError> {
        space_tls::Authority::open(dir)
            .map(Authority)
            .map_err(tls_err)
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        self.0.ca_pem()
    }

    /// A TLS server configuration presenting a leaf for `host` (minted, or reused for a day),
    /// ALPN `http/1.1` only.
    pub fn server_config(&self, host: &Host) -> Result<Arc<rustls::ServerConfig>, GatewayError> {
        let name = match host {
            Host::Ip(ip) => space_tls::LeafName::Ip(*ip),
            Host::Name(n) => space_tls::LeafName::Dns(n.clone()),
        };
        let leaf = self.0.leaf(&name).map_err(tls_err)?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| GatewayError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(space_tls::Always(leaf)));
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// The certificates of a PEM file, as PEM again (whatever else the file holds, comments or
/// keys, is left out); an unreadable file or one without a certificate is an error naming it.
pub fn read_certificates(path: &Path) -> Result<String, GatewayError> {
    use base64::Engine as _;
    let pem = std::fs::read(path).map_err(|source| GatewayError::Io {
        op: "reading",
        path: path.to_owned(),
        source,
    })?;
    let mut out = String::new();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|source| GatewayError::Io {
            op: "parsing",
            path: path.to_owned(),
            source,
        })?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for chunk in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    if out.is_empty() {
        return Err(GatewayError::Tls(format!(
            "{} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(out)
}

/// The TLS client configuration for upstreams: the system's roots (webpki-roots when the
/// system has none) plus the PEM files in `extra_roots`; ALPN `http/1.1`.
pub fn client_config(extra_roots: &[PathBuf]) -> Result<Arc<rustls::ClientConfig>, GatewayError> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    let (added, _) = roots.add_parsable_certificates(native.certs);
    if added == 0 {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    for path in extra_roots {
        let pem = std::fs::read(path).map_err(|source| GatewayError::Io {
            op: "reading",
            path: path.clone(),
            source,
        })?;
        let mut n = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|source| GatewayError::Io {
                op: "parsing",
                path: path.clone(),
                source,
            })?;
            roots
                .add(cert)
                .map_err(|e| GatewayError::Tls(format!("{}: {e}", path.display())))?;
            n += 1;
        }
        if n == 0 {
            return Err(GatewayError::Tls(format!(
                "{} holds no PEM certificate",
                path.display()
            )));
        }
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| GatewayError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Making, keeping and reloading the CA are space_tls's, and tested there.
    #[test]
    fn leaves_for_names_and_addresses_speak_http_1_1() {
        let tmp = tempfile::tempdir().unwrap();
        let a = Authority::open(&tmp.path().join("ca")).unwrap();
        assert!(a.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let host = Host::parse("example.com").unwrap();
        let c1 = a.server_config(&host).unwrap();
        assert_eq!(c1.alpn_protocols, vec![b"http/1.1".to_vec()]);
        a.server_config(&Host::parse("10.1.2.3").unwrap()).unwrap();
    }
}
