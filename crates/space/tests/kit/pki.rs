//! Certificates for test servers: a CA made here and a leaf it signed.

/// A test CA and a leaf it signed.
pub struct TestPki {
    /// The CA's certificate, PEM.
    pub ca_pem: String,
    /// The leaf's certificate, PEM.
    pub leaf_pem: String,
    /// The leaf's key, PEM.
    pub key_pem: String,
    /// The leaf's certificate, DER.
    pub leaf_der: rustls::pki_types::CertificateDer<'static>,
    /// The leaf's key, DER.
    pub key_der: rustls::pki_types::PrivateKeyDer<'static>,
}

/// A CA named `ca_name` and a leaf it signed for `names` (DNS names or IP addresses).
pub fn test_pki(ca_name: &str, names: &[&str]) -> TestPki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    ca_params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let leaf = rcgen::CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    TestPki {
        ca_pem: ca.pem(),
        leaf_pem: leaf.pem(),
        key_pem: leaf_key.serialize_pem(),
        leaf_der: leaf.der().clone(),
        key_der: rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    }
}
