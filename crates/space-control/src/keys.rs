//! API keys: generation, strict parsing, hashing and constant-time verification.
//!
//! A key looks like `space_<key id>_<secret>`. The key id is `k` followed by 15 characters
//! from `[a-z0-9]`; it is not secret and names the key in listings, audit events and the
//! store. The secret is 32 characters from `[A-Za-z0-9]` drawn from the operating system's
//! CSPRNG (about 190 bits). The store keeps only [`hash`] of the whole key, so a leaked
//! database does not leak usable keys; because the secret is long and random, a fast hash is
//! enough.

use rand::rngs::OsRng;
use rand::Rng;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The fixed prefix of every key.
pub const PREFIX: &str = "space_";
/// Length of a key id, including its leading `k`.
pub const KEY_ID_LEN: usize = 16;
/// Length of the secret part of a key.
pub const SECRET_LEN: usize = 32;
/// Length of a whole key: prefix, key id, separator and secret.
pub const KEY_LEN: usize = PREFIX.len() + KEY_ID_LEN + 1 + SECRET_LEN;

const ID_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
const SECRET_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn random_string(alphabet: &[u8], len: usize) -> String {
    let mut rng = OsRng;
    (0..len)
        .map(|_| char::from(alphabet[rng.gen_range(0..alphabet.len())]))
        .collect()
}

/// Makes a new key; returns `(key id, full key)`. The full key is shown to its owner once
/// and never stored.
pub fn generate() -> (String, String) {
    let id = format!("k{}", random_string(ID_ALPHABET, KEY_ID_LEN - 1));
    let secret = random_string(SECRET_ALPHABET, SECRET_LEN);
    let key = format!("{PREFIX}{id}_{secret}");
    debug_assert_eq!(key.len(), KEY_LEN);
    (id, key)
}

/// Whether `id` is a well-formed key id (`k` plus 15 characters from `[a-z0-9]`).
pub fn is_key_id(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() == KEY_ID_LEN
        && b[0] == b'k'
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// Returns the key id of a well-formed key, or `None` for anything else (wrong prefix,
/// lengths, separators or characters).
pub fn parse(token: &str) -> Option<&str> {
    if token.len() != KEY_LEN || !token.is_ascii() {
        return None;
    }
    let rest = token.strip_prefix(PREFIX)?;
    let (id, tail) = rest.split_at(KEY_ID_LEN);
    let secret = tail.strip_prefix('_')?;
    if !is_key_id(id) || secret.len() != SECRET_LEN {
        return None;
    }
    if !secret.bytes().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    Some(id)
}

/// The lowercase hex SHA-256 of the whole key: what the store keeps.
pub fn hash(full_key: &str) -> String {
    hex::encode(Sha256::digest(full_key.as_bytes()))
}

/// Whether `full_key` hashes to `stored_hash`, compared in constant time.
pub fn verify(full_key: &str, stored_hash: &str) -> bool {
    let computed = hash(full_key);
    // Both are 64 hex characters when the stored hash is well-formed; `ct_eq` on slices of
    // different lengths is false without looking at the contents.
    bool::from(computed.as_bytes().ct_eq(stored_hash.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn generated_keys_parse_to_their_id() {
        let mut ids = HashSet::new();
        for _ in 0..200 {
            let (id, key) = generate();
            assert!(is_key_id(&id), "{id}");
            assert_eq!(key.len(), KEY_LEN);
            assert_eq!(parse(&key), Some(id.as_str()));
            assert!(ids.insert(id), "key ids repeat");
        }
    }

    #[test]
    fn secrets_use_the_whole_alphabet() {
        // 200 keys of 32 characters each: every one of the 62 characters should appear; the
        // chance that one is missing from a uniform draw is about 62 * (61/62)^6400 ≈ 0.
        let mut seen = HashSet::new();
        for _ in 0..200 {
            let (_, key) = generate();
            seen.extend(key[KEY_LEN - SECRET_LEN..].chars());
        }
        assert_eq!(seen.len(), SECRET_ALPHABET.len());
    }

    #[test]
    fn parse_is_strict() {
        let (id, key) = generate();
        assert_eq!(parse(&key), Some(id.as_str()));
        let secret = &key[KEY_LEN - SECRET_LEN..];
        let bad = [
            String::new(),
            "space_".to_string(),
            key[1..].to_string(),
            format!("{key}a"),
            key[..key.len() - 1].to_string(),
            format!("Space_{id}_{secret}"),
            format!("spacex{id}_{secret}"),
            format!("space_{id}-{secret}"),
            format!("space_{}_{secret}", id.to_uppercase()),
            format!("space_x{}_{secret}", &id[1..]),
            format!("space_{}!_{secret}", &id[..15]),
            format!("space_{id}_{}-", &secret[..31]),
            format!("space_{id}_{}é", &secret[..30]),
            format!("space_{id}_{} ", &secret[..31]),
            format!(" space_{id}_{}", &secret[..31]),
        ];
        for b in &bad {
            assert_eq!(parse(b), None, "{b:?} parsed");
        }
    }

    #[test]
    fn hash_is_hex_sha256_of_the_whole_key() {
        // SHA-256 of "abc" is a published test vector.
        assert_eq!(
            hash("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let (_, key) = generate();
        let h = hash(&key);
        assert_eq!(h.len(), 64);
        assert!(verify(&key, &h));
        let (_, other) = generate();
        assert!(!verify(&other, &h));
        assert!(!verify(&key, &h[..63]));
        assert!(!verify(&key, ""));
    }
}
