//! Chunks as they are stored, and the packs that hold them.
//!
//! A stored chunk is one sealed blob (see [`crate::crypto`]) whose plaintext is a one-byte
//! encoding tag followed by the chunk's bytes: `0` raw, `1` zstd. zstd is used when it makes
//! the chunk smaller. A pack is stored chunks written back to back with nothing between them;
//! the manifest that references a chunk says which pack, at which offset and how long, so a
//! pack needs no index of its own and one ranged read fetches a run of chunks.

use crate::crypto::{ChunkId, CryptoError, LineageKeys};

const RAW: u8 = 0;
const ZSTD: u8 = 1;
/// zstd's level for chunks: fast, since the snapshot path has a VM waiting on it.
const ZSTD_LEVEL: i32 = 1;

/// Why a stored chunk was refused.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    /// Did not open under the lineage's key as this chunk.
    #[error("chunk {id} does not open: {source}")]
    Crypto {
        /// The chunk.
        id: ChunkId,
        /// Why.
        source: CryptoError,
    },
    /// Opened, but the content is malformed.
    #[error("chunk {id} is malformed: {why}")]
    Malformed {
        /// The chunk.
        id: ChunkId,
        /// Why.
        why: String,
    },
    /// Opened and decoded, but the content does not hash to its name.
    #[error("chunk {id} does not match its hash")]
    Mismatch {
        /// The chunk.
        id: ChunkId,
    },
}

/// Encodes and seals chunk `plain`, named `id`: the bytes that go into a pack.
pub fn encode_chunk(keys: &LineageKeys, id: &ChunkId, plain: &[u8]) -> Vec<u8> {
    let compressed = zstd::bulk::compress(plain, ZSTD_LEVEL).ok();
    let mut stored = Vec::with_capacity(plain.len() + 1);
    match compressed {
        Some(c) if c.len() < plain.len() => {
            stored.push(ZSTD);
            stored.extend_from_slice(&c);
        }
        _ => {
            stored.push(RAW);
            stored.extend_from_slice(plain);
        }
    }
    keys.seal_chunk(id, &stored)
}

/// Opens, decodes and verifies a stored chunk that must be `id` with `len` bytes.
pub fn decode_chunk(
    keys: &LineageKeys,
    id: &ChunkId,
    len: usize,
    sealed: &[u8],
) -> Result<Vec<u8>, ChunkError> {
    let plain = decode_stored(keys, id, len, sealed)?;
    verify(keys, id, &plain)?;
    Ok(plain)
}

/// Opens and decodes the stored bytes of chunk `id`, which must be `len` bytes long, without
/// checking them against the name: for a delta, whose name is that of the whole chunk it
/// makes. Check the result with [`verify`].
pub fn decode_stored(
    keys: &LineageKeys,
    id: &ChunkId,
    len: usize,
    sealed: &[u8],
) -> Result<Vec<u8>, ChunkError> {
    let stored = keys
        .open_chunk(id, sealed)
        .map_err(|source| ChunkError::Crypto { id: *id, source })?;
    let malformed = |why: String| ChunkError::Malformed { id: *id, why };
    let (&tag, body) = stored
        .split_first()
        .ok_or_else(|| malformed("empty".into()))?;
    let plain = match tag {
        RAW => body.to_vec(),
        // The capacity bounds the output: a hostile frame cannot inflate past the chunk size.
        ZSTD => zstd::bulk::decompress(body, len).map_err(|e| malformed(format!("zstd: {e}")))?,
        other => return Err(malformed(format!("unknown encoding {other}"))),
    };
    if plain.len() != len {
        return Err(malformed(format!(
            "{} bytes where the manifest says {len}",
            plain.len()
        )));
    }
    Ok(plain)
}

/// Checks that `plain` is chunk `id`.
/// Puts a delta's stored `pages` (back to back, in page order) into `plain`, the chunk of
/// `plain_len` bytes it applies to.
pub fn put_pages(d: &crate::manifest::Delta, plain_len: u32, pages: &[u8], plain: &mut [u8]) {
    let mut at = 0;
    for r in d.ranges(plain_len) {
        let n = r.len();
        plain[r].copy_from_slice(&pages[at..at + n]);
        at += n;
    }
}

pub fn verify(keys: &LineageKeys, id: &ChunkId, plain: &[u8]) -> Result<(), ChunkError> {
    if keys.chunk_id(plain) != *id {
        return Err(ChunkError::Mismatch { id: *id });
    }
    Ok(())
}

/// A pack being filled.
#[derive(Default)]
pub struct PackBuilder {
    bytes: Vec<u8>,
    chunks: usize,
}

impl PackBuilder {
    /// Appends a stored chunk; returns its offset and length in the pack.
    pub fn push(&mut self, stored: &[u8]) -> (u64, u32) {
        let offset = self.bytes.len() as u64;
        self.bytes.extend_from_slice(stored);
        self.chunks += 1;
        (offset, stored.len() as u32)
    }

    /// Bytes so far.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// No chunk yet.
    pub fn is_empty(&self) -> bool {
        self.chunks == 0
    }

    /// The pack's bytes.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Key;

    #[test]
    fn chunks_round_trip_compressed_or_raw() {
        let keys = LineageKeys::derive("lin", &Key::random());
        let text = b"hello ".repeat(1000);
        let mut noise = vec![0u8; 4096];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut noise);
        for plain in [text.as_slice(), noise.as_slice()] {
            let id = keys.chunk_id(plain);
            let sealed = encode_chunk(&keys, &id, plain);
            assert_eq!(
                decode_chunk(&keys, &id, plain.len(), &sealed).unwrap(),
                plain
            );
        }
        // Compressible data is stored compressed, noise raw (plus tag, nonce and tag).
        let id = keys.chunk_id(&text);
        assert!(encode_chunk(&keys, &id, &text).len() < 200);
        let id = keys.chunk_id(&noise);
        assert_eq!(encode_chunk(&keys, &id, &noise).len(), 4096 + 1 + 28);
    }

    #[test]
    fn bad_chunks_are_refused() {
        let keys = LineageKeys::derive("lin", &Key::random());
        let plain = b"abc".repeat(100);
        let id = keys.chunk_id(&plain);
        let sealed = encode_chunk(&keys, &id, &plain);
        let mut flipped = sealed.clone();
        flipped[30] ^= 0x40;
        assert!(matches!(
            decode_chunk(&keys, &id, plain.len(), &flipped),
            Err(ChunkError::Crypto { .. })
        ));
        // Opens, but the manifest claims another size.
        assert!(matches!(
            decode_chunk(&keys, &id, plain.len() - 1, &sealed),
            Err(ChunkError::Malformed { .. })
        ));
        // A chunk sealed under the right key and name but with other content (only someone
        // with the key can do this) still fails the hash.
        let forged = keys.seal_chunk(&id, &[&[0u8][..], b"xyz"].concat());
        assert!(matches!(
            decode_chunk(&keys, &id, 3, &forged),
            Err(ChunkError::Mismatch { .. })
        ));
        let unknown = keys.seal_chunk(&id, &[9u8, 1, 2]);
        assert!(matches!(
            decode_chunk(&keys, &id, 2, &unknown),
            Err(ChunkError::Malformed { .. })
        ));
    }

    #[test]
    fn packs_place_chunks_back_to_back() {
        let mut p = PackBuilder::default();
        assert!(p.is_empty());
        assert_eq!(p.push(b"aaaa"), (0, 4));
        assert_eq!(p.push(b"bb"), (4, 2));
        assert_eq!(p.len(), 6);
        assert_eq!(p.finish(), b"aaaabb");
    }
}
