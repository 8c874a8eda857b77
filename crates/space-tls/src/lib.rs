//! The deployment CA (`<data>/state/ca/`) and the leaf certificates it mints.
//!
//! The gateway presents its leaves to sandboxes whose TLS it intercepts (every guest trusts
//! the CA); the API listener presents them on the hosts of sandbox ports
//! (`{port}-{id}.{domain}`) when the operator gave no certificate of their own, and serves the
//! CA certificate so that viewers can trust it (`docs/api.md`). The cluster's own CA, which
//! signs node and control certificates, is another (`space_node_api::tls`).

use std::collections::HashMap;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use space_node_api::tls::{named_ca_params, ymd};

/// Certificate file of the CA.
pub const CA_CERT: &str = "ca.pem";
/// Private key file of the CA (mode 0600).
pub const CA_KEY: &str = "ca.key";
/// How long a minted leaf is used before a new one is made.
const LEAF_REUSE: Duration = Duration::from_secs(24 * 3600);
/// Most leaves kept at once.
const MAX_LEAVES: usize = 1024;

/// A failure of the CA.
#[derive(Debug, thiserror::Error)]
pub enum CaError {
    /// A file could not be read or written.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// To which file.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A certificate could not be made or used.
    #[error("{0}")]
    Tls(String),
}

/// The crypto provider of every TLS configuration made here (ring), chosen explicitly so the
/// process default does not matter.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a leaf names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LeafName {
    /// A DNS name (lowercase).
    Dns(String),
    /// An IP address.
    Ip(IpAddr),
}

impl std::fmt::Display for LeafName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeafName::Dns(n) => f.write_str(n),
            LeafName::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// The CA and the leaves it made.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<LeafName, (Instant, Arc<CertifiedKey>)>>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").finish_non_exhaustive()
    }
}

fn ca_err(what: &str) -> impl FnOnce(rcgen::Error) -> CaError + '_ {
    move |e| CaError::Tls(format!("{what}: {e}"))
}

/// The CA's parameters; derived from its key alone, so the issuer can be rebuilt from
/// `ca.key` (the subject names the key's identifier).
fn ca_params(key: &KeyPair) -> CertificateParams {
    named_ca_params(key, "space deployment CA")
}

impl Authority {
    /// Loads the CA from `dir`, making it (and `dir`, mode 0700) when absent.
    pub fn open(dir: &Path) -> Result<Authority, CaError> {
        let io = |op: &'static str, path: PathBuf| move |source| CaError::Io { op, path, source };
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
                    CaError::Tls(format!("{} holds no certificate", cert_path.display()))
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

    /// A leaf for `name` with its chain (minted, or reused for a day), valid three days.
    pub fn leaf(&self, name: &LeafName) -> Result<Arc<CertifiedKey>, CaError> {
        {
            let leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((made, key)) = leaves.get(name) {
                if made.elapsed() < LEAF_REUSE {
                    return Ok(key.clone());
                }
            }
        }
        let key = KeyPair::generate().map_err(ca_err("making a leaf key"))?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![match name {
            LeafName::Ip(ip) => SanType::IpAddress(*ip),
            LeafName::Dns(n) => SanType::DnsName(
                n.clone()
                    .try_into()
                    .map_err(ca_err("naming a leaf certificate"))?,
            ),
        }];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name.to_string());
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
        let signer = provider()
            .key_provider
            .load_private_key(key_der)
            .map_err(|e| CaError::Tls(format!("loading a leaf key: {e}")))?;
        let certified = Arc::new(CertifiedKey::new(chain, signer));
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if leaves.len() >= MAX_LEAVES {
            leaves.retain(|_, (made, _)| made.elapsed() < LEAF_REUSE);
            if leaves.len() >= MAX_LEAVES {
                leaves.clear();
            }
        }
        leaves.insert(name.clone(), (Instant::now(), certified.clone()));
        Ok(certified)
    }
}

/// A certificate resolver that always presents one leaf.
#[derive(Debug)]
pub struct Always(pub Arc<CertifiedKey>);

impl rustls::server::ResolvesServerCert for Always {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
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
    fn the_ca_is_made_once_and_reloaded_and_leaves_are_reused() {
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
        let name = LeafName::Dns("example.com".into());
        let l1 = b.leaf(&name).unwrap();
        let l2 = b.leaf(&name).unwrap();
        assert!(Arc::ptr_eq(&l1, &l2));
        assert_eq!(l1.cert.len(), 2, "the leaf and the CA");
        b.leaf(&LeafName::Ip("10.1.2.3".parse().unwrap())).unwrap();
    }
}
