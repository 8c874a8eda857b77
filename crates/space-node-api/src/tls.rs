//! Mutual TLS between control replicas and nodes, from the cluster CA.
//!
//! The cluster CA is its own: the gateway's interception CA (which every guest trusts) never
//! signs a node or control certificate. Every leaf names its role in its common name
//! (`node <id>` or `control`), carries both the server and client purposes, and lives
//! [`LEAF_DAYS`] days. Each side presents its leaf and accepts only leaves of the cluster
//! CA; a control replica additionally checks that the node it dialled is the node it meant
//! (the node id is the certificate's DNS name).

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

/// How long a node or control leaf is valid.
pub const LEAF_DAYS: u64 = 30;

/// A failure to make, read or use cluster certificates.
#[derive(Debug, thiserror::Error)]
#[error("cluster TLS: {0}")]
pub struct TlsError(pub String);

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> TlsError + '_ {
    move |e| TlsError(format!("{what}: {e}"))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Valid from the day of `from` to the day of `to` (Unix seconds).
fn set_validity(params: &mut CertificateParams, from: u64, to: u64) {
    let (y, m, d) = ymd(from);
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = ymd(to);
    params.not_after = rcgen::date_time_ymd(y, m, d);
}

fn ca_params(key: &KeyPair) -> CertificateParams {
    named_ca_params(key, "space cluster CA")
}

/// The parameters of a space CA called `name`: derived from its key alone (the subject
/// names the key's identifier), so its issuer can be rebuilt from the key. The gateway's
/// CA and the cluster CA both are made so.
pub fn named_ca_params(key: &KeyPair, name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let id = params.key_identifier(key);
    let short: String = id.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "space");
    dn.push(DnType::CommonName, format!("{name} {short}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// The civil date (UTC) of a Unix time: year, month, day.
pub fn ymd(secs: u64) -> (i32, u8, u8) {
    let days = (secs / 86_400) as i64;
    // Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
    (year, month, day)
}

/// The cluster CA: its certificate and its key (kept by the control plane only).
pub struct ClusterCa {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").finish_non_exhaustive()
    }
}

/// A leaf certificate and its key, PEM.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Leaf {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
    /// Valid until, seconds since the Unix epoch.
    pub not_after_unix: u64,
}

impl std::fmt::Debug for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaf")
            .field("not_after_unix", &self.not_after_unix)
            .finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new CA, valid for 20 years.
    pub fn generate() -> Result<ClusterCa, TlsError> {
        let key = KeyPair::generate().map_err(err("making the CA key"))?;
        let mut params = ca_params(&key);
        let now = unix_now();
        set_validity(
            &mut params,
            now.saturating_sub(24 * 3600),
            now + 20 * 365 * 24 * 3600,
        );
        let cert = params
            .self_signed(&key)
            .map_err(err("making the CA certificate"))?;
        Ok(ClusterCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA from its certificate and key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, TlsError> {
        let key = KeyPair::from_pem(key_pem).map_err(err("reading the CA key"))?;
        let params = ca_params(&key);
        Ok(ClusterCa {
            issuer: Issuer::new(params, key),
            cert_pem: cert_pem.to_owned(),
            key_pem: key_pem.to_owned(),
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA key, PEM.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// A leaf for node `node_id` (its DNS name, which control replicas check).
    pub fn issue_node(&self, node_id: &str, days: u64) -> Result<Leaf, TlsError> {
        self.issue(&format!("node {node_id}"), Some(node_id), days)
    }

    /// A certificate for node `node_id` over a public key the node made ([`NodeKey`]); the
    /// private key never leaves the node. Returns the certificate (PEM) and its end of
    /// validity (Unix seconds).
    pub fn certify_node(
        &self,
        node_id: &str,
        public_key: &[u8],
        days: u64,
    ) -> Result<(String, u64), TlsError> {
        let key = P256Public::new(public_key)?;
        let (params, not_after) = leaf_params(&format!("node {node_id}"), Some(node_id), days)?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(err("signing a node certificate"))?;
        Ok((cert.pem(), not_after))
    }

    /// A leaf for a control replica.
    pub fn issue_control(&self, days: u64) -> Result<Leaf, TlsError> {
        self.issue("control", Some("control"), days)
    }

    fn issue(&self, common_name: &str, dns: Option<&str>, days: u64) -> Result<Leaf, TlsError> {
        let key = KeyPair::generate().map_err(err("making a leaf key"))?;
        let (params, not_after) = leaf_params(common_name, dns, days)?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(err("signing a leaf certificate"))?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_after_unix: not_after,
        })
    }
}

/// A node's own key pair (ECDSA P-256); its public half goes to the control plane at join.
pub struct NodeKey(KeyPair);

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKey").finish_non_exhaustive()
    }
}

impl NodeKey {
    /// A fresh key.
    pub fn generate() -> Result<NodeKey, TlsError> {
        KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map(NodeKey)
            .map_err(err("making the node key"))
    }

    /// The public key, as an uncompressed P-256 point.
    pub fn public_raw(&self) -> Vec<u8> {
        self.0.public_key_raw().to_vec()
    }

    /// The leaf made of this key and the certificate the control plane issued for it.
    pub fn leaf(&self, cert_pem: &str, not_after_unix: u64) -> Leaf {
        Leaf {
            cert_pem: cert_pem.to_owned(),
            key_pem: self.0.serialize_pem(),
            not_after_unix,
        }
    }
}

/// Whether `raw` has the form of a node's public key (see [`P256Public`]): what a
/// joining node sent is checked with this before anything is signed over it.
pub fn check_node_key(raw: &[u8]) -> Result<(), TlsError> {
    P256Public::new(raw).map(drop)
}

/// A P-256 public key sent by a node: an uncompressed point (65 bytes, `0x04` first).
struct P256Public(Vec<u8>);

impl P256Public {
    fn new(raw: &[u8]) -> Result<P256Public, TlsError> {
        if raw.len() != 65 || raw[0] != 0x04 {
            return Err(TlsError(
                "a node public key must be an uncompressed P-256 point (65 bytes)".into(),
            ));
        }
        Ok(P256Public(raw.to_vec()))
    }
}

impl rcgen::PublicKeyData for P256Public {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

/// The parameters of a leaf: role in the common name, one DNS name, both TLS purposes.
fn leaf_params(
    common_name: &str,
    dns: Option<&str>,
    days: u64,
) -> Result<(CertificateParams, u64), TlsError> {
    let mut params = CertificateParams::default();
    if let Some(name) = dns {
        params.subject_alt_names = vec![SanType::DnsName(
            name.to_owned()
                .try_into()
                .map_err(err("naming a leaf certificate"))?,
        )];
    }
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "space");
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = unix_now();
    let not_after = now + days * 24 * 3600;
    set_validity(&mut params, now.saturating_sub(24 * 3600), not_after);
    Ok((params, not_after))
}

/// One side's TLS identity: its leaf and the CA it trusts.
#[derive(Clone)]
pub struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    roots: Arc<rustls::RootCertStore>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").finish_non_exhaustive()
    }
}

fn certs(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(err(what))?;
    if certs.is_empty() {
        return Err(TlsError(format!("{what}: no certificate")));
    }
    Ok(certs)
}

impl Identity {
    /// The identity of a leaf under the CA whose certificate is `ca_pem`.
    pub fn new(leaf: &Leaf, ca_pem: &str) -> Result<Identity, TlsError> {
        let chain = certs(&leaf.cert_pem, "the leaf certificate")?;
        let key = rustls_pemfile::private_key(&mut leaf.key_pem.as_bytes())
            .map_err(err("the leaf key"))?
            .ok_or_else(|| TlsError("the leaf key: no key".into()))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca_pem, "the CA certificate")? {
            roots.add(c).map_err(err("the CA certificate"))?;
        }
        Ok(Identity {
            chain,
            key: Arc::new(key),
            roots: Arc::new(roots),
        })
    }

    fn key(&self) -> PrivateKeyDer<'static> {
        match &*self.key {
            PrivateKeyDer::Pkcs8(k) => {
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(k.secret_pkcs8_der().to_vec()))
            }
            other => other.clone_key(),
        }
    }

    /// A server configuration that requires a client leaf of the cluster CA; ALPN `h2`.
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            self.roots.clone(),
            provider(),
        )
        .build()
        .map_err(err("the client verifier"))?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(err("TLS versions"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key())
            .map_err(err("the server certificate"))?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// A client configuration that presents this leaf and trusts only the cluster CA; ALPN
    /// `h2`.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(err("TLS versions"))?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key())
            .map_err(err("the client certificate"))?;
        cfg.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(cfg))
    }
}

/// The name a control replica expects on the certificate of node `node_id`.
pub fn node_server_name(node_id: &str) -> Result<ServerName<'static>, TlsError> {
    ServerName::try_from(node_id.to_owned()).map_err(err("a node id as a TLS name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(ymd(0), (1970, 1, 1));
        assert_eq!(ymd(951_782_400), (2000, 2, 29));
        assert_eq!(ymd(1_709_251_199), (2024, 2, 29));
        assert_eq!(ymd(4_102_444_800), (2100, 1, 1));
    }

    #[test]
    fn a_node_key_is_certified_without_its_private_half_leaving() {
        let ca = ClusterCa::generate().unwrap();
        let key = NodeKey::generate().unwrap();
        let (cert, not_after) = ca.certify_node("node-a", &key.public_raw(), 30).unwrap();
        assert!(not_after > unix_now() + 29 * 24 * 3600);
        let leaf = key.leaf(&cert, not_after);
        let id = Identity::new(&leaf, ca.cert_pem()).unwrap();
        id.server_config().unwrap();
        id.client_config().unwrap();
        // The certificate is the node's name under this CA.
        let der = certs(&cert, "cert").unwrap().remove(0);
        let ee = webpki::EndEntityCert::try_from(&der).unwrap();
        let name = ServerName::try_from("node-a").unwrap();
        assert!(ee.verify_is_valid_for_subject_name(&name).is_ok());
        let other = ServerName::try_from("node-b").unwrap();
        assert!(ee.verify_is_valid_for_subject_name(&other).is_err());
        // Anything but an uncompressed P-256 point is refused.
        assert!(ca.certify_node("node-a", &[4u8; 64], 30).is_err());
        assert!(ca.certify_node("node-a", &[5u8; 65], 30).is_err());
        // A CA read back from its PEMs issues leaves the same clients accept.
        let again = ClusterCa::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
        let leaf = again.issue_control(1).unwrap();
        Identity::new(&leaf, ca.cert_pem()).unwrap();
    }
}
