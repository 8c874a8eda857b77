//! The deployment CA (`<data>/state/ca/`), the leaf certificates it mints for intercepted
//! hosts, and the TLS configurations of both sides of an interception.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use space_node_api::tls::{named_ca_params, ymd};

use super::policy::Host;
use super::GatewayError;

/// Certificate file of the CA.
pub const CA_CERT: &str = "ca.pem";
/// Private key file of the CA (mode 0600).
pub const CA_KEY: &str = "ca.key";
/// How long a minted leaf is used before a new one is made.
const LEAF_REUSE: Duration = Duration::from_secs(24 * 3600);
/// Most leaves kept at once.
const MAX_LEAVES: usize = 1024;

/// The crypto provider of both sides (ring), chosen explicitly so the process default does not
/// matter.
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The CA and the leaf certificates it made.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, (Instant, Arc<rustls::ServerConfig>)>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

fn ca_err(what: &str) -> impl FnOnce(rcgen::Error) -> GatewayError + '_ {
    move |e| GatewayError::Tls(format!("{what}: {e}"))
}

/// The CA's parameters; derived from its key alone, so the issuer can be rebuilt from
/// `ca.key` (the subject names the key's identifier).
fn ca_params(key: &KeyPair) -> CertificateParams {
    named_ca_params(key, "space deployment CA")
}

impl Authority {
    /// Loads the CA from `dir`, making it (and `dir`, mode 0700) when absent.
    pub fn open(dir: &Path) -> Result<Authority, GatewayError> {
        let io = |op: &'static str, path: PathBuf| {
            move |source| GatewayError::Io {
                op,
                path: path.clone(),
                source,
            }
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io("creating", dir.to_owned()))?;
        let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
        if cert_path.is_file() && key_path.is_file() {
            let key_pem =
                std::fs::read_to_string(&key_path).map_err(io("reading", key_path.clone()))?;
            let ca_pem =
                std::fs::read_to_string(&cert_path).map_err(io("reading", cert_path.clone()))?;
            let key = KeyPair::from_pem(&key_pem).map_err(ca_err("reading the CA key"))?;
            let ca_der = rustls_pemfile::certs(&mut ca_pem.as_bytes())
                .next()
                .and_then(|c| c.ok())
                .ok_or_else(|| {
                    GatewayError::Tls(format!("{} holds no certificate", cert_path.display()))
                })?;
            let params = ca_params(&key);
            return Ok(Authority {
                issuer: Issuer::new(params, key),
                ca_pem,
                ca_der,
                leaves: Mutex::default(),
            });
        }
        let key = KeyPair::generate().map_err(ca_err("making the CA key"))?;
        let mut params = ca_params(&key);
        let now = unix_now();
        params.not_before = {
            let (y, mo, d) = ymd(now.saturating_sub(24 * 3600));
            rcgen::date_time_ymd(y, mo, d)
        };
        params.not_after = {
            let (y, mo, d) = ymd(now + 20 * 365 * 24 * 3600);
            rcgen::date_time_ymd(y, mo, d)
        };
        let cert = params
            .self_signed(&key)
            .map_err(ca_err("making the CA certificate"))?;
        let ca_pem = cert.pem();
        // The key first: a certificate without its key is never left behind.
        write_new(&key_path, key.serialize_pem().as_bytes(), 0o600)
            .map_err(io("writing", key_path.clone()))?;
        write_new(&cert_path, ca_pem.as_bytes(), 0o644)
            .map_err(io("writing", cert_path.clone()))?;
        tracing::info!(dir = %dir.display(), "deployment CA made");
        Ok(Authority {
            issuer: Issuer::new(params, key),
            ca_der: cert.der().clone(),
            ca_pem,
            leaves: Mutex::default(),
        })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A TLS server configuration presenting a leaf for `host` (minted, or reused for a day),
    /// ALPN `http/1.1` only.
    pub fn server_config(&self, host: &Host) -> Result<Arc<rustls::ServerConfig>, GatewayError> {
        let name = host.to_string();
        {
            let leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((made, cfg)) = leaves.get(&name) {
                if made.elapsed() < LEAF_REUSE {
                    return Ok(cfg.clone());
                }
            }
        }
        let key = KeyPair::generate().map_err(ca_err("making a leaf key"))?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![match host {
            Host::Ip(ip) => SanType::IpAddress(*ip),
            Host::Name(n) => SanType::DnsName(
                n.clone()
                    .try_into()
                    .map_err(ca_err("naming a leaf certificate"))?,
            ),
        }];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name.clone());
        params.distinguished_name = dn;
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = unix_now();
        params.not_before = {
            let (y, mo, d) = ymd(now.saturating_sub(3600));
            rcgen::date_time_ymd(y, mo, d)
        };
        params.not_after = {
            let (y, mo, d) = ymd(now + 3 * 24 * 3600);
            rcgen::date_time_ymd(y, mo, d)
        };
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(ca_err("signing a leaf certificate"))?;
        let chain = vec![cert.der().clone(), self.ca_der.clone()];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| GatewayError::Tls(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key_der)
            .map_err(|e| GatewayError::Tls(format!("leaf certificate: {e}")))?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let cfg = Arc::new(cfg);
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if leaves.len() >= MAX_LEAVES {
            leaves.retain(|_, (made, _)| made.elapsed() < LEAF_REUSE);
            if leaves.len() >= MAX_LEAVES {
                leaves.clear();
            }
        }
        leaves.insert(name, (Instant::now(), cfg.clone()));
        Ok(cfg)
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

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_is_made_once_and_reloaded() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("ca");
        let a = Authority::open(&dir).unwrap();
        let mode = std::fs::metadata(dir.join(CA_KEY)).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        let b = Authority::open(&dir).unwrap();
        assert_eq!(a.ca_pem(), b.ca_pem());
        assert!(a.ca_pem().starts_with("-----BEGIN CERTIFICATE-----"));
        let host = Host::parse("example.com").unwrap();
        let c1 = b.server_config(&host).unwrap();
        let c2 = b.server_config(&host).unwrap();
        assert!(Arc::ptr_eq(&c1, &c2));
        assert_eq!(c1.alpn_protocols, vec![b"http/1.1".to_vec()]);
        b.server_config(&Host::parse("10.1.2.3").unwrap()).unwrap();
    }
}
