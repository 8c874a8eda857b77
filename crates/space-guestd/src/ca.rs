//! The deployment's CA certificate, from the identity step: the egress gateway intercepts TLS
//! with leaf certificates it signs, so the guest's trust store must hold it. It is written to
//! `usr/local/share/ca-certificates/space-ca.crt` and appended to the system bundle
//! `etc/ssl/certs/ca-certificates.crt` (unless the bundle already holds it), which is what
//! OpenSSL, curl, Python and Git read, without running `update-ca-certificates`.

use std::io;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use space_proto::limits::MAX_CA_PEM;
use space_proto::{ErrorKind, ProtoError};

/// Where the certificate goes, relative to the root.
pub const CA_FILE: &str = "usr/local/share/ca-certificates/space-ca.crt";
/// The system bundle, relative to the root.
pub const BUNDLE_FILE: &str = "etc/ssl/certs/ca-certificates.crt";
/// Absolute paths as processes see them (for their environment).
pub const CA_PATH: &str = "/usr/local/share/ca-certificates/space-ca.crt";
pub const BUNDLE_PATH: &str = "/etc/ssl/certs/ca-certificates.crt";

const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const END: &str = "-----END CERTIFICATE-----";

/// Checks that `pem` is one or more PEM certificates and nothing else; returns them
/// normalised (`\n` line ends, one trailing newline).
pub fn validate(pem: &str) -> Result<String, ProtoError> {
    if pem.len() > MAX_CA_PEM {
        return Err(ProtoError::new(
            ErrorKind::TooLarge,
            format!("ca_pem is {} bytes; the limit is {MAX_CA_PEM}", pem.len()),
        ));
    }
    let bad = |why: &str| ProtoError::invalid(format!("ca_pem is not a PEM certificate: {why}"));
    let mut out = String::new();
    let mut blocks = 0;
    let mut inside: Option<String> = None;
    for line in pem.lines() {
        let line = line.trim_end_matches('\r').trim();
        match &mut inside {
            None if line.is_empty() => {}
            None if line == BEGIN => inside = Some(String::new()),
            None => return Err(bad("text outside a CERTIFICATE block")),
            Some(b64) if line == END => {
                let der = STANDARD
                    .decode(b64.as_bytes())
                    .map_err(|_| bad("invalid base64"))?;
                // A DER certificate is a SEQUENCE.
                if der.len() < 16 || der[0] != 0x30 {
                    return Err(bad("the block is not a DER certificate"));
                }
                out.push_str(BEGIN);
                out.push('\n');
                for chunk in b64.as_bytes().chunks(64) {
                    out.push_str(std::str::from_utf8(chunk).unwrap_or_default());
                    out.push('\n');
                }
                out.push_str(END);
                out.push('\n');
                blocks += 1;
                inside = None;
            }
            Some(b64) => {
                if !line
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'=')
                {
                    return Err(bad("invalid base64"));
                }
                b64.push_str(line);
            }
        }
    }
    if inside.is_some() {
        return Err(bad("unterminated block"));
    }
    if blocks == 0 {
        return Err(bad("no CERTIFICATE block"));
    }
    Ok(out)
}

/// Writes `data` to `path` durably ([`space_fs::write_atomic`]), creating the directory
/// when absent.
fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new("/")))?;
    Ok(space_fs::write_atomic(path, data, mode)?)
}

/// Installs the (validated, normalised) certificate under `root`. Returns the paths written.
pub fn install(root: &Path, pem: &str) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let ca = root.join(CA_FILE);
    if std::fs::read(&ca).ok().as_deref() != Some(pem.as_bytes()) {
        write_atomic(&ca, pem.as_bytes(), 0o644)?;
        written.push(ca);
    }
    let bundle = root.join(BUNDLE_FILE);
    let mut current = match std::fs::read(&bundle) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    let present = current.windows(pem.len()).any(|w| w == pem.as_bytes());
    if !present {
        if !current.is_empty() && !current.ends_with(b"\n") {
            current.push(b'\n');
        }
        current.extend_from_slice(pem.as_bytes());
        write_atomic(&bundle, &current, 0o644)?;
        written.push(bundle);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A syntactically plausible certificate body (a DER SEQUENCE header and filler).
    fn cert(fill: u8) -> String {
        let mut der = vec![0x30, 0x82, 0x01, 0x00];
        der.extend(std::iter::repeat_n(fill, 256));
        let b64 = STANDARD.encode(der);
        let mut s = format!("{BEGIN}\r\n");
        for c in b64.as_bytes().chunks(64) {
            s.push_str(std::str::from_utf8(c).unwrap());
            s.push_str("\r\n");
        }
        s.push_str(END);
        s
    }

    #[test]
    fn validation() {
        let pem = validate(&cert(7)).unwrap();
        assert!(pem.starts_with(BEGIN) && pem.ends_with("-----END CERTIFICATE-----\n"));
        assert!(!pem.contains('\r'));
        let two = validate(&format!("{}\n{}\n", cert(1), cert(2))).unwrap();
        assert_eq!(two.matches(BEGIN).count(), 2);
        assert!(validate("").is_err());
        assert!(validate("hello").is_err());
        assert!(validate(&format!("junk\n{}", cert(1))).is_err());
        assert!(validate(&cert(1).replace(END, "")).is_err());
        let key = cert(1).replace("CERTIFICATE", "PRIVATE KEY");
        assert!(validate(&key).is_err());
        let garbled = cert(1).replacen("MII", "M!I", 1);
        assert!(validate(&garbled).is_err());
        let big = "A".repeat(MAX_CA_PEM + 1);
        assert_eq!(validate(&big).unwrap_err().kind, ErrorKind::TooLarge);
    }

    #[test]
    fn install_creates_and_appends_once() {
        let root = tempfile::tempdir().unwrap();
        let pem = validate(&cert(9)).unwrap();
        // No bundle yet: both files are created.
        let written = install(root.path(), &pem).unwrap();
        assert_eq!(written.len(), 2);
        let bundle = root.path().join(BUNDLE_FILE);
        assert_eq!(std::fs::read_to_string(&bundle).unwrap(), pem);
        assert_eq!(
            std::fs::read_to_string(root.path().join(CA_FILE)).unwrap(),
            pem
        );
        // Again: nothing changes.
        assert!(install(root.path(), &pem).unwrap().is_empty());
        assert_eq!(std::fs::read_to_string(&bundle).unwrap(), pem);
        // An existing bundle without a final newline keeps its content and gains the CA.
        std::fs::write(&bundle, "existing").unwrap();
        install(root.path(), &pem).unwrap();
        assert_eq!(
            std::fs::read_to_string(&bundle).unwrap(),
            format!("existing\n{pem}")
        );
        // A different CA replaces the file and is appended as well.
        let other = validate(&cert(10)).unwrap();
        install(root.path(), &other).unwrap();
        let text = std::fs::read_to_string(&bundle).unwrap();
        assert!(text.contains(&pem) && text.ends_with(&other));
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(bundle.parent().unwrap())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains("space-tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
