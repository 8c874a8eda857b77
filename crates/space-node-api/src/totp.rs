//! Time-based one-time passwords (RFC 6238, over RFC 4226's HOTP). A secret of kind `totp`
//! keeps a seed; the gateway puts the code of the moment a request leaves in place of its
//! placeholder, so a sandbox passes a second factor without ever holding the seed.

use hmac::{Hmac, Mac};

/// The hash of the HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// SHA-1, what nearly every site uses.
    Sha1,
    /// SHA-256.
    Sha256,
    /// SHA-512.
    Sha512,
}

impl Algorithm {
    fn name(self) -> &'static str {
        match self {
            Algorithm::Sha1 => "SHA1",
            Algorithm::Sha256 => "SHA256",
            Algorithm::Sha512 => "SHA512",
        }
    }
}

/// The shortest and longest seed accepted, in bytes (80 bits is the common minimum).
const SEED_BYTES: std::ops::RangeInclusive<usize> = 10..=128;

/// A TOTP generator: seed, hash, digits and period. `Debug` shows no seed, and the seed is
/// overwritten when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Totp {
    seed: Vec<u8>,
    algorithm: Algorithm,
    digits: u32,
    period: u64,
}

impl std::fmt::Debug for Totp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Totp")
            .field("algorithm", &self.algorithm)
            .field("digits", &self.digits)
            .field("period", &self.period)
            .finish_non_exhaustive()
    }
}

impl Drop for Totp {
    fn drop(&mut self) {
        crate::secrets::SecretValue::wipe(&mut self.seed);
    }
}

impl Totp {
    /// Reads a seed as sites show it: base32 (case, spaces and `=` padding do not matter),
    /// or an `otpauth://totp/...?secret=...` URI with optional `algorithm`, `digits` (6 to
    /// 8) and `period` (1 to 300 seconds).
    pub fn parse(text: &str) -> Result<Totp, String> {
        let text = text.trim();
        let mut t = Totp {
            seed: Vec::new(),
            algorithm: Algorithm::Sha1,
            digits: 6,
            period: 30,
        };
        let seed = if let Some(rest) = strip_prefix_ci(text, "otpauth://") {
            let rest = strip_prefix_ci(rest, "totp/")
                .ok_or("only otpauth://totp/ URIs are one-time password seeds (not hotp)")?;
            let query = rest.split_once('?').map(|(_, q)| q).unwrap_or("");
            let mut seed = None;
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                let v = percent_decode(v)?;
                match k.to_ascii_lowercase().as_str() {
                    "secret" => seed = Some(v),
                    "algorithm" => {
                        t.algorithm = match v.to_ascii_uppercase().as_str() {
                            "SHA1" => Algorithm::Sha1,
                            "SHA256" => Algorithm::Sha256,
                            "SHA512" => Algorithm::Sha512,
                            other => return Err(format!("unknown TOTP algorithm {other:?}")),
                        }
                    }
                    "digits" => {
                        t.digits = v
                            .parse()
                            .ok()
                            .filter(|d| (6..=8).contains(d))
                            .ok_or("TOTP digits must be 6, 7 or 8")?
                    }
                    "period" => {
                        t.period = v
                            .parse()
                            .ok()
                            .filter(|p| (1..=300).contains(p))
                            .ok_or("a TOTP period is 1 to 300 seconds")?
                    }
                    _ => {}
                }
            }
            seed.ok_or("the otpauth URI has no secret parameter")?
        } else {
            text.to_owned()
        };
        t.seed = base32_decode(&seed)?;
        if !SEED_BYTES.contains(&t.seed.len()) {
            return Err(format!(
                "a TOTP seed is {} to {} bytes ({} to {} base32 characters); this one is {}",
                SEED_BYTES.start(),
                SEED_BYTES.end(),
                SEED_BYTES.start() * 8 / 5,
                SEED_BYTES.end() * 8 / 5,
                t.seed.len()
            ));
        }
        Ok(t)
    }

    /// The canonical text of this generator (an `otpauth://totp` URI; it holds the seed).
    pub fn to_text(&self) -> String {
        format!(
            "otpauth://totp/space?secret={}&algorithm={}&digits={}&period={}",
            base32_encode(&self.seed),
            self.algorithm.name(),
            self.digits,
            self.period
        )
    }

    /// The code for the moment `unix_secs`.
    pub fn code_at(&self, unix_secs: u64) -> String {
        let counter = (unix_secs / self.period).to_be_bytes();
        let mac: Vec<u8> = match self.algorithm {
            Algorithm::Sha1 => hmac_of::<Hmac<sha1::Sha1>>(&self.seed, &counter),
            Algorithm::Sha256 => hmac_of::<Hmac<sha2::Sha256>>(&self.seed, &counter),
            Algorithm::Sha512 => hmac_of::<Hmac<sha2::Sha512>>(&self.seed, &counter),
        };
        // Dynamic truncation (RFC 4226 §5.3).
        let at = usize::from(mac[mac.len() - 1] & 0x0f);
        let bin = u32::from_be_bytes([mac[at] & 0x7f, mac[at + 1], mac[at + 2], mac[at + 3]]);
        let code = bin % 10u32.pow(self.digits);
        format!("{code:0width$}", width = self.digits as usize)
    }

    /// The code for now.
    pub fn now(&self) -> String {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.code_at(secs)
    }
}

fn hmac_of<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m =
        <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC takes a key of any length");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    s.get(..prefix.len())
        .filter(|p| p.eq_ignore_ascii_case(prefix))
        .map(|_| &s[prefix.len()..])
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or("a bad percent escape in the otpauth URI")?;
            out.push(hex);
            i += 3;
        } else {
            out.push(if b[i] == b'+' { b' ' } else { b[i] });
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "the otpauth URI is not UTF-8".into())
}

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// Decodes RFC 4648 base32, ignoring case, spaces, hyphens and `=` padding.
pub fn base32_decode(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() * 5 / 8);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes() {
        if matches!(c, b' ' | b'-' | b'=' | b'\t') {
            continue;
        }
        let v = BASE32
            .iter()
            .position(|&a| a == c.to_ascii_uppercase())
            .ok_or_else(|| {
                "a TOTP seed is base32 (letters A-Z and digits 2-7) or an otpauth://totp URI"
                    .to_owned()
            })?;
        acc = (acc << 5) | v as u32;
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// Encodes RFC 4648 base32 without padding.
pub fn base32_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 8 / 5 + 1);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &b in bytes {
        acc = (acc << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(BASE32[((acc >> bits) & 31) as usize] as char);
        }
        acc &= (1 << bits) - 1;
    }
    if bits > 0 {
        out.push(BASE32[((acc << (5 - bits)) & 31) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc_6238_vectors() {
        // The RFC's seeds: "12345678901234567890" repeated to the hash's length.
        let seeds = [
            (Algorithm::Sha1, &b"12345678901234567890"[..]),
            (Algorithm::Sha256, b"12345678901234567890123456789012"),
            (
                Algorithm::Sha512,
                b"1234567890123456789012345678901234567890123456789012345678901234",
            ),
        ];
        let expected = [
            (59, ["94287082", "46119246", "90693936"]),
            (1111111109, ["07081804", "68084774", "25091201"]),
            (2000000000, ["69279037", "90698825", "38618901"]),
            (20000000000, ["65353130", "77737706", "47863826"]),
        ];
        for (time, codes) in expected {
            for ((alg, seed), code) in seeds.iter().zip(codes) {
                let uri = format!(
                    "otpauth://totp/x?secret={}&algorithm={}&digits=8&period=30",
                    base32_encode(seed),
                    alg.name()
                );
                let t = Totp::parse(&uri).unwrap();
                assert_eq!(t.code_at(time), code, "{alg:?} at {time}");
                // The canonical text reads back as the same generator.
                assert_eq!(Totp::parse(&t.to_text()).unwrap(), t);
            }
        }
    }

    #[test]
    fn seeds_as_sites_show_them() {
        let a = Totp::parse("jbsw y3dp ehpk 3pxp").unwrap();
        let b = Totp::parse("JBSWY3DPEHPK3PXP==").unwrap();
        assert_eq!(a, b);
        assert_eq!(a.code_at(0).len(), 6);
        assert_eq!(
            base32_decode("JBSWY3DPEHPK3PXP").unwrap(),
            b"Hello!\xde\xad\xbe\xef"
        );
        for bad in [
            "not base32 1890",
            "JBSW",
            "otpauth://hotp/x?secret=JBSWY3DPEHPK3PXP",
            "otpauth://totp/x?secret=JBSWY3DPEHPK3PXP&digits=9",
            "otpauth://totp/x?secret=JBSWY3DPEHPK3PXP&algorithm=MD5",
            "otpauth://totp/x?issuer=me",
        ] {
            assert!(Totp::parse(bad).is_err(), "{bad}");
        }
        assert!(!format!("{a:?}").contains("JBSW"));
    }
}
