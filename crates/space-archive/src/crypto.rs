//! Keys, chunk identities and authenticated encryption.
//!
//! Every sealed blob is `nonce (12 bytes) || AES-256-GCM ciphertext || tag (16 bytes)` with a
//! random nonce and associated data that names what the blob is (a chunk of one lineage, the
//! manifest of one snapshot, the key of one lineage), so a blob moved to another place in the
//! store does not open there.
//!
//! A lineage key is never used directly: two subkeys are derived from it with BLAKE3's key
//! derivation, one to name chunks (keyed BLAKE3 of the plaintext, so equal chunks of one lineage
//! get equal names and are stored once, while the names say nothing across lineages) and one
//! to encrypt.

use std::fmt;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use rand::RngCore;
use serde::{Deserialize, Serialize};

/// Bytes in a key.
pub const KEY_LEN: usize = 32;
/// Bytes of nonce and tag a sealed blob adds to its plaintext.
pub const SEAL_OVERHEAD: usize = NONCE_LEN + TAG_LEN;
const NONCE_LEN: usize = 12;
const TAG_LEN: usize = 16;

const CONTEXT_CHUNK_ID: &str = "space-archive v1 chunk identity";
const CONTEXT_DATA: &str = "space-archive v1 data encryption";

/// Failures of opening a sealed blob.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CryptoError {
    /// Shorter than a nonce and a tag.
    #[error("sealed data is {0} bytes, shorter than any sealed blob")]
    Short(usize),
    /// The tag did not verify: wrong key, wrong place, or changed bytes.
    #[error("authentication failed (wrong key, or the data was changed or moved)")]
    Auth,
    /// A key of the wrong length.
    #[error("a key is {KEY_LEN} bytes, not {0}")]
    KeyLength(usize),
}

/// A 256-bit secret key. Its bytes are wiped when it is dropped and never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_LEN]);

impl Key {
    /// A fresh key from the operating system's RNG.
    pub fn random() -> Key {
        let mut k = [0u8; KEY_LEN];
        rand::rngs::OsRng.fill_bytes(&mut k);
        Key(k)
    }

    /// A key from exactly [`KEY_LEN`] bytes.
    pub fn from_slice(bytes: &[u8]) -> Result<Key, CryptoError> {
        let k: [u8; KEY_LEN] = bytes
            .try_into()
            .map_err(|_| CryptoError::KeyLength(bytes.len()))?;
        Ok(Key(k))
    }

    /// The key's bytes (for wrapping it under another key).
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // SAFETY: `b` is a valid, aligned, exclusive reference into the key's own array; a
            // volatile write keeps the compiler from dropping the wipe as a dead store.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

/// Encrypts `plain` under `key`, bound to `aad`.
pub fn seal(key: &Key, aad: &[u8], plain: &[u8]) -> Vec<u8> {
    let cipher = Aes256Gcm::new_from_slice(key.as_bytes()).expect("a 32-byte key");
    let mut nonce = [0u8; NONCE_LEN];
    rand::rngs::OsRng.fill_bytes(&mut nonce);
    let ct = cipher
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: plain, aad })
        .expect("AES-GCM encryption of an in-memory buffer does not fail");
    let mut out = Vec::with_capacity(NONCE_LEN + ct.len());
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ct);
    out
}

/// Decrypts and authenticates a blob made by [`seal`] with the same key and `aad`.
pub fn open(key: &Key, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
    if sealed.len() < SEAL_OVERHEAD {
        return Err(CryptoError::Short(sealed.len()));
    }
    let cipher = Aes256Gcm::new_from_slice(key.as_bytes()).expect("a 32-byte key");
    let (nonce, ct) = sealed.split_at(NONCE_LEN);
    cipher
        .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad })
        .map_err(|_| CryptoError::Auth)
}

/// The name of a chunk within its lineage: keyed BLAKE3 of its plaintext.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkId(pub [u8; 32]);

impl ChunkId {
    /// Lowercase hex.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkId({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for ChunkId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for ChunkId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.as_bytes(), &mut out)
            .map_err(|e| serde::de::Error::custom(format!("chunk id: {e}")))?;
        Ok(ChunkId(out))
    }
}

/// The working keys of one lineage, derived from its lineage key.
pub struct LineageKeys {
    lineage: String,
    id_key: [u8; 32],
    data_key: Key,
}

impl fmt::Debug for LineageKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LineageKeys({})", self.lineage)
    }
}

impl Drop for LineageKeys {
    fn drop(&mut self) {
        for b in self.id_key.iter_mut() {
            // SAFETY: as in `Key::drop`, an exclusive reference into our own array.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

impl LineageKeys {
    /// Derives the chunk-naming and encryption keys of `lineage` from its key.
    pub fn derive(lineage: &str, key: &Key) -> LineageKeys {
        LineageKeys {
            lineage: lineage.to_owned(),
            id_key: blake3::derive_key(CONTEXT_CHUNK_ID, key.as_bytes()),
            data_key: Key(blake3::derive_key(CONTEXT_DATA, key.as_bytes())),
        }
    }

    /// The lineage these keys belong to.
    pub fn lineage(&self) -> &str {
        &self.lineage
    }

    /// The name of a chunk with these contents.
    pub fn chunk_id(&self, plain: &[u8]) -> ChunkId {
        ChunkId(*blake3::keyed_hash(&self.id_key, plain).as_bytes())
    }

    fn chunk_aad(&self, id: &ChunkId) -> Vec<u8> {
        let mut aad = Vec::with_capacity(6 + self.lineage.len() + 1 + 32);
        aad.extend_from_slice(b"chunk\0");
        aad.extend_from_slice(self.lineage.as_bytes());
        aad.push(0);
        aad.extend_from_slice(&id.0);
        aad
    }

    /// Seals a chunk's stored form (see [`crate::pack`]) under its identity.
    pub fn seal_chunk(&self, id: &ChunkId, stored: &[u8]) -> Vec<u8> {
        seal(&self.data_key, &self.chunk_aad(id), stored)
    }

    /// Opens a sealed chunk that must be chunk `id` of this lineage.
    pub fn open_chunk(&self, id: &ChunkId, sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        open(&self.data_key, &self.chunk_aad(id), sealed)
    }

    /// Seals a manifest, bound to the snapshot it describes.
    pub fn seal_manifest(&self, sandbox: &str, snapshot: &str, plain: &[u8]) -> Vec<u8> {
        seal(&self.data_key, &self.manifest_aad(sandbox, snapshot), plain)
    }

    /// Opens a manifest that must describe `sandbox`'s `snapshot` in this lineage.
    pub fn open_manifest(
        &self,
        sandbox: &str,
        snapshot: &str,
        sealed: &[u8],
    ) -> Result<Vec<u8>, CryptoError> {
        open(
            &self.data_key,
            &self.manifest_aad(sandbox, snapshot),
            sealed,
        )
    }

    /// Seals an object of this lineage other than a chunk or manifest, bound to `label`.
    pub fn seal_object(&self, label: &str, plain: &[u8]) -> Vec<u8> {
        seal(&self.data_key, &self.object_aad(label), plain)
    }

    /// Opens an object sealed by [`LineageKeys::seal_object`] under the same `label`.
    pub fn open_object(&self, label: &str, sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        open(&self.data_key, &self.object_aad(label), sealed)
    }

    fn object_aad(&self, label: &str) -> Vec<u8> {
        [
            b"object\0".as_slice(),
            self.lineage.as_bytes(),
            b"\0",
            label.as_bytes(),
        ]
        .concat()
    }

    fn manifest_aad(&self, sandbox: &str, snapshot: &str) -> Vec<u8> {
        [
            b"manifest\0".as_slice(),
            self.lineage.as_bytes(),
            b"\0",
            sandbox.as_bytes(),
            b"\0",
            snapshot.as_bytes(),
        ]
        .concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_binding() {
        let k = Key::random();
        let s = seal(&k, b"here", b"secret bytes");
        assert_eq!(s.len(), 12 + 16 + 12);
        assert_eq!(open(&k, b"here", &s).unwrap(), b"secret bytes");
        assert_eq!(open(&k, b"there", &s), Err(CryptoError::Auth));
        assert_eq!(open(&Key::random(), b"here", &s), Err(CryptoError::Auth));
        let mut bad = s.clone();
        bad[20] ^= 1;
        assert_eq!(open(&k, b"here", &bad), Err(CryptoError::Auth));
        assert_eq!(open(&k, b"here", &s[..27]), Err(CryptoError::Short(27)));
        // Fresh nonces: the same plaintext seals differently.
        assert_ne!(seal(&k, b"here", b"secret bytes"), s);
    }

    #[test]
    fn chunk_ids_are_per_lineage() {
        let k = Key::random();
        let a = LineageKeys::derive("lin-a", &k);
        let b = LineageKeys::derive("lin-a", &Key::random());
        assert_eq!(a.chunk_id(b"x"), a.chunk_id(b"x"));
        assert_ne!(a.chunk_id(b"x"), a.chunk_id(b"y"));
        assert_ne!(a.chunk_id(b"x"), b.chunk_id(b"x"));
        // Not the plain hash of the data.
        assert_ne!(a.chunk_id(b"x").0, *blake3::hash(b"x").as_bytes());
    }

    #[test]
    fn a_chunk_opens_only_as_itself_in_its_lineage() {
        let k = Key::random();
        let a = LineageKeys::derive("lin-a", &k);
        let other_lineage_same_key = LineageKeys::derive("lin-b", &k);
        let id = a.chunk_id(b"data");
        let other = a.chunk_id(b"other");
        let sealed = a.seal_chunk(&id, b"data");
        assert_eq!(a.open_chunk(&id, &sealed).unwrap(), b"data");
        assert_eq!(a.open_chunk(&other, &sealed), Err(CryptoError::Auth));
        assert!(other_lineage_same_key.open_chunk(&id, &sealed).is_err());
        let m = a.seal_manifest("sbx-1", "snap-1", b"{}");
        assert!(a.open_manifest("sbx-1", "snap-1", &m).is_ok());
        assert!(a.open_manifest("sbx-2", "snap-1", &m).is_err());
        assert!(a.open_manifest("sbx-1", "snap-2", &m).is_err());
    }

    #[test]
    fn keys_do_not_print() {
        let k = Key::from_slice(&[7u8; 32]).unwrap();
        assert_eq!(format!("{k:?}"), "Key(..)");
        assert!(Key::from_slice(&[0u8; 31]).is_err());
        let id = ChunkId([0xab; 32]);
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(serde_json::from_str::<ChunkId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<ChunkId>("\"abcd\"").is_err());
    }
}
