//! The manifest of one archived snapshot: every file's chunk map, flat (never a diff against
//! another manifest), with what a restoring node needs to know before it fetches anything.
//!
//! Stored as `b"SPACEMF1"` followed by a sealed blob (see [`crate::crypto`]) whose plaintext
//! is zstd-compressed JSON. The object's BLAKE3 hash (of all its bytes) is its *manifest
//! hash*: the head object and the node's record hold it, and a reader checks it before
//! anything else.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use crate::crypto::{ChunkId, LineageKeys};

/// The manifest format this code writes. Format 1 (no page deltas) is read too.
pub const FORMAT: u32 = 2;
/// The oldest format this code reads.
pub const OLDEST_FORMAT: u32 = 1;
/// The unit of a page delta: a delta chunk stores the pages, of this many bytes, in which it
/// differs from the chunk it applies to.
pub const DELTA_PAGE: u32 = 4096;
const MAGIC: &[u8; 8] = b"SPACEMF1";
/// Largest manifest object accepted, sealed, and largest JSON after decompression. A manifest
/// costs about 100 bytes per stored chunk: 64 MiB of JSON is over 600,000 chunks (150 GiB at
/// 256 KiB).
pub const MAX_MANIFEST_BYTES: usize = 64 << 20;
/// Chunk sizes a manifest may use.
pub const MIN_CHUNK: u32 = 4 << 10;
/// See [`MIN_CHUNK`].
pub const MAX_CHUNK: u32 = 16 << 20;
/// Largest file a manifest may describe (1 TiB).
pub const MAX_FILE_BYTES: u64 = 1 << 40;
const MAX_FILES: usize = 64;
/// Entries of a prefetch list: 256 MiB of 4 KiB chunks, more than any restore touches first.
pub const MAX_PREFETCH: usize = 1 << 16;
/// Files in a manifest of a volume's copy (one per regular file of the volume).
pub const MAX_VOLUME_FILES: usize = 1 << 20;
const MAX_NAME: usize = 255;

/// Errors of reading a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The object's hash is not the one expected.
    #[error("manifest hash is {found}, expected {expected} (the object was changed or replaced)")]
    Hash {
        /// Hash of the bytes read.
        found: String,
        /// Hash the caller holds.
        expected: String,
    },
    /// Does not start with the magic bytes.
    #[error("not a space manifest (bad magic; truncated or another kind of object)")]
    Magic,
    /// Over [`MAX_MANIFEST_BYTES`].
    #[error("manifest is larger than {MAX_MANIFEST_BYTES} bytes")]
    TooLarge,
    /// Did not open under the lineage key as this snapshot's manifest.
    #[error("manifest does not open: {0}")]
    Crypto(#[from] crate::crypto::CryptoError),
    /// The plaintext is not a valid manifest.
    #[error("manifest is malformed: {0}")]
    Malformed(String),
    /// A format this code does not read.
    #[error("manifest format {0} is not supported (this build reads format {FORMAT})")]
    Format(u32),
}

/// The template whose chunks a snapshot's files may refer to as `base`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseRef {
    /// Template name.
    pub name: String,
    /// Template version.
    pub version: String,
    /// Manifest hash of the template's own archive: a node uses a local copy of the template
    /// as the base only when its copy came from (or was uploaded as) exactly that archive.
    pub manifest_hash: String,
}

/// What a host must be to restore the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    /// The QEMU build that wrote the device state, as it describes itself.
    pub qemu: String,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// The host CPU's model name.
    pub cpu_model: String,
    /// BLAKE3 of the host CPU's flag list (under KVM the guest sees these).
    pub cpu_flags: String,
}

/// A run of consecutive chunks of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Run {
    /// `n` chunks of zeros, not stored.
    Zero(u64),
    /// `n` chunks equal to the base file's at the same offsets, not stored.
    Base(u64),
    /// One stored chunk each, by index into [`Manifest::chunks`].
    Chunks(Vec<u32>),
}

impl Run {
    fn len(&self) -> u64 {
        match self {
            Run::Zero(n) | Run::Base(n) => *n,
            Run::Chunks(c) => c.len() as u64,
        }
    }
}

/// One file of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMap {
    /// Path relative to the snapshot directory (`/`-separated, no `..`).
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// The file of the base template this one's `base` runs refer to.
    pub base: Option<String>,
    /// Chunk runs covering `size`.
    pub runs: Vec<Run>,
}

/// Where a stored chunk is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkLoc {
    /// Its name (keyed hash of its plaintext).
    pub id: ChunkId,
    /// Index into [`Manifest::packs`].
    pub pack: u32,
    /// Byte offset of the sealed chunk in the pack.
    pub offset: u64,
    /// Length of the sealed chunk.
    pub len: u32,
    /// Length of the plaintext (the chunk size, or less for a file's last chunk).
    pub plain_len: u32,
    /// Set when the stored bytes are only the pages in which this chunk differs from another
    /// one; the chunk is that one with these pages put in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<Delta>,
}

/// A chunk stored as the pages in which it differs from another chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delta {
    /// The chunk the pages go into.
    pub on: DeltaOn,
    /// Which pages ([`DELTA_PAGE`] bytes each) are stored, one bit per page, least
    /// significant bit first; the stored bytes are those pages in order.
    pub pages: Vec<u64>,
}

/// What a delta applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeltaOn {
    /// Chunk `index` of the base template's file `file` (one of the manifest's base files).
    Base {
        /// The base file's name.
        file: String,
        /// The chunk index in it.
        index: u64,
    },
    /// A chunk of this manifest's table that is stored whole.
    Chunk(u32),
}

impl Delta {
    /// The byte ranges within a chunk of `plain_len` bytes that the stored pages cover.
    pub fn ranges(&self, plain_len: u32) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        let pages = plain_len.div_ceil(DELTA_PAGE) as usize;
        (0..pages)
            .filter(|&q| {
                self.pages
                    .get(q / 64)
                    .is_some_and(|w| w >> (q % 64) & 1 == 1)
            })
            .map(move |q| {
                let start = q * DELTA_PAGE as usize;
                start..(start + DELTA_PAGE as usize).min(plain_len as usize)
            })
    }

    /// The length of the stored bytes (before sealing) for a chunk of `plain_len` bytes.
    pub fn stored_len(&self, plain_len: u32) -> usize {
        self.ranges(plain_len).map(|r| r.len()).sum()
    }
}

/// One archived snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The lineage whose key opens the chunks.
    pub lineage: String,
    /// The tenant that owns the lineage.
    pub tenant: String,
    /// The sandbox (or template, for a template archive) the snapshot is of.
    pub sandbox: String,
    /// The snapshot's id.
    pub snapshot: String,
    /// When the manifest was made, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// Bytes per chunk (the last chunk of a file may be shorter).
    pub chunk_size: u32,
    /// The template `base` runs refer to.
    pub base: Option<BaseRef>,
    /// The host the snapshot was taken on.
    pub host: Option<HostInfo>,
    /// The sandbox's record as the node keeps it (opaque here).
    pub record: serde_json::Value,
    /// The files.
    pub files: Vec<FileMap>,
    /// Pack object names, relative to the lineage's `packs/`.
    pub packs: Vec<String>,
    /// Every stored chunk the files use, each once.
    pub chunks: Vec<ChunkLoc>,
    /// What a restore fetches first, in order: (file name, chunk index in the file). The
    /// chunks the last restore touched before it answered, recorded by the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefetch: Vec<(String, u64)>,
}

/// Chunks of a file of `size` bytes.
pub fn chunk_count(size: u64, chunk_size: u32) -> u64 {
    size.div_ceil(chunk_size as u64)
}

/// Whether a relative path is safe to create under a directory.
pub fn safe_relative_path(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with('/')
        && name.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.+@:".contains(&b))
        })
}

/// A safe object-name component (pack names, ids).
pub fn safe_component(name: &str) -> bool {
    !name.is_empty() && name.len() <= MAX_NAME && !name.contains('/') && safe_relative_path(name)
}

impl Manifest {
    /// The manifest hash of an encoded manifest object.
    pub fn hash(object: &[u8]) -> String {
        blake3::hash(object).to_hex().to_string()
    }

    /// Encodes and seals the manifest; returns the object's bytes. Fails only when zstd
    /// cannot get the memory it needs.
    pub fn encode(&self, keys: &LineageKeys) -> std::io::Result<Vec<u8>> {
        let json = serde_json::to_vec(self).expect("a manifest always serializes");
        let z = zstd::bulk::compress(&json, 3)?;
        let sealed = keys.seal_manifest(&self.sandbox, &self.snapshot, &z);
        Ok([MAGIC.as_slice(), &sealed].concat())
    }

    /// Checks the hash (when given), opens, decompresses, parses and validates a manifest
    /// object that must describe `sandbox`'s `snapshot`.
    pub fn decode(
        object: &[u8],
        expected_hash: Option<&str>,
        keys: &LineageKeys,
        sandbox: &str,
        snapshot: &str,
    ) -> Result<Manifest, ManifestError> {
        if object.len() > MAX_MANIFEST_BYTES {
            return Err(ManifestError::TooLarge);
        }
        if let Some(expected) = expected_hash {
            let found = Manifest::hash(object);
            if found != expected {
                return Err(ManifestError::Hash {
                    found,
                    expected: expected.to_owned(),
                });
            }
        }
        let sealed = object.strip_prefix(MAGIC).ok_or(ManifestError::Magic)?;
        let z = keys.open_manifest(sandbox, snapshot, sealed)?;
        let json = zstd::bulk::decompress(&z, MAX_MANIFEST_BYTES)
            .map_err(|e| ManifestError::Malformed(format!("zstd: {e}")))?;
        let format: FormatOnly =
            serde_json::from_slice(&json).map_err(|e| ManifestError::Malformed(e.to_string()))?;
        if !(OLDEST_FORMAT..=FORMAT).contains(&format.format) {
            return Err(ManifestError::Format(format.format));
        }
        let m: Manifest =
            serde_json::from_slice(&json).map_err(|e| ManifestError::Malformed(e.to_string()))?;
        if m.sandbox != sandbox || m.snapshot != snapshot || m.lineage != keys.lineage() {
            return Err(ManifestError::Malformed(format!(
                "describes {}/{} of lineage {}, not {sandbox}/{snapshot}",
                m.sandbox, m.snapshot, m.lineage
            )));
        }
        m.validate().map_err(ManifestError::Malformed)?;
        Ok(m)
    }

    /// Structural checks: every bound and every index.
    pub fn validate(&self) -> Result<(), String> {
        if !(MIN_CHUNK..=MAX_CHUNK).contains(&self.chunk_size) || !self.chunk_size.is_power_of_two()
        {
            return Err(format!("chunk size {} is not allowed", self.chunk_size));
        }
        let max_files = if crate::volumes::is_volume_lineage(&self.lineage) {
            MAX_VOLUME_FILES
        } else {
            MAX_FILES
        };
        if self.files.len() > max_files {
            return Err(format!("{} files", self.files.len()));
        }
        for p in &self.packs {
            if !safe_component(p) {
                return Err(format!("pack name {p:?}"));
            }
        }
        let mut ids = HashSet::with_capacity(self.chunks.len());
        for c in &self.chunks {
            if c.pack as usize >= self.packs.len() {
                return Err(format!(
                    "chunk {} names pack {} of {}",
                    c.id,
                    c.pack,
                    self.packs.len()
                ));
            }
            if c.plain_len == 0 || c.plain_len > self.chunk_size {
                return Err(format!("chunk {} has {} bytes", c.id, c.plain_len));
            }
            let max_sealed = c.plain_len as u64 + 1 + crate::crypto::SEAL_OVERHEAD as u64;
            if (c.len as u64) > max_sealed || (c.len as usize) < crate::crypto::SEAL_OVERHEAD + 1 {
                return Err(format!("chunk {} is stored in {} bytes", c.id, c.len));
            }
            if !ids.insert(c.id) {
                return Err(format!("chunk {} listed twice", c.id));
            }
        }
        let base_files: HashSet<&str> = self
            .files
            .iter()
            .filter_map(|f| f.base.as_deref())
            .collect();
        for c in &self.chunks {
            let Some(d) = &c.delta else { continue };
            let pages = self.chunk_size.div_ceil(DELTA_PAGE).div_ceil(64) as usize;
            let used = c.plain_len.div_ceil(DELTA_PAGE) as usize;
            let beyond = d
                .pages
                .iter()
                .enumerate()
                .any(|(w, bits)| (0..64).any(|b| bits >> b & 1 == 1 && w * 64 + b >= used));
            if d.pages.len() != pages || beyond || d.stored_len(c.plain_len) == 0 {
                return Err(format!("chunk {} has a malformed page map", c.id));
            }
            match &d.on {
                DeltaOn::Base { file, .. } => {
                    if self.base.is_none() || !base_files.contains(file.as_str()) {
                        return Err(format!(
                            "chunk {} applies to base file {file:?}, which no file of the \
                             snapshot is based on",
                            c.id
                        ));
                    }
                }
                DeltaOn::Chunk(i) => match self.chunks.get(*i as usize) {
                    Some(on) if on.delta.is_none() && on.plain_len == c.plain_len => {}
                    _ => {
                        return Err(format!(
                            "chunk {} applies to chunk {i}, which is missing, a delta itself \
                             or of another length",
                            c.id
                        ))
                    }
                },
            }
        }
        let mut names = HashSet::new();
        for f in &self.files {
            if !safe_relative_path(&f.name) || !names.insert(f.name.as_str()) {
                return Err(format!("file name {:?}", f.name));
            }
            if let Some(b) = &f.base {
                if !safe_relative_path(b) {
                    return Err(format!("base file name {b:?}"));
                }
            }
            if f.size > MAX_FILE_BYTES {
                return Err(format!("file {} is {} bytes", f.name, f.size));
            }
            let want = chunk_count(f.size, self.chunk_size);
            let mut have = 0u64;
            for r in &f.runs {
                have = have.saturating_add(r.len());
                match r {
                    Run::Base(_) if f.base.is_none() || self.base.is_none() => {
                        return Err(format!("file {} has base chunks and no base", f.name));
                    }
                    Run::Chunks(c) => {
                        for (k, &i) in c.iter().enumerate() {
                            let Some(loc) = self.chunks.get(i as usize) else {
                                return Err(format!("file {} names chunk {i}", f.name));
                            };
                            // Only a file's last chunk may be short.
                            let index = have - c.len() as u64 + k as u64;
                            let expect = chunk_len(f.size, self.chunk_size, index);
                            if loc.plain_len as u64 != expect {
                                return Err(format!(
                                    "file {} chunk {index} is {} bytes, not {expect}",
                                    f.name, loc.plain_len
                                ));
                            }
                        }
                    }
                    _ => {}
                }
            }
            if have != want {
                return Err(format!(
                    "file {} has {have} chunks in its map, its size needs {want}",
                    f.name
                ));
            }
        }
        if self.prefetch.len() > MAX_PREFETCH {
            return Err(format!("{} prefetch entries", self.prefetch.len()));
        }
        for (name, index) in &self.prefetch {
            let Some(f) = self.file(name) else {
                return Err(format!(
                    "prefetch names file {name:?}, which it does not have"
                ));
            };
            if *index >= chunk_count(f.size, self.chunk_size) {
                return Err(format!(
                    "prefetch names chunk {index} of {name}, past its end"
                ));
            }
        }
        Ok(())
    }

    /// The file named `name`.
    pub fn file(&self, name: &str) -> Option<&FileMap> {
        self.files.iter().find(|f| f.name == name)
    }

    /// Stored bytes (sealed) of all chunks the manifest uses.
    pub fn stored_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.len as u64).sum()
    }
}

/// Length of chunk `index` of a file of `size` bytes.
pub fn chunk_len(size: u64, chunk_size: u32, index: u64) -> u64 {
    let start = index * chunk_size as u64;
    (size.saturating_sub(start)).min(chunk_size as u64)
}

#[derive(Deserialize)]
struct FormatOnly {
    format: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Key;

    fn sample(keys: &LineageKeys) -> Manifest {
        let a = keys.chunk_id(b"a");
        let b = keys.chunk_id(b"b");
        Manifest {
            format: FORMAT,
            lineage: keys.lineage().into(),
            tenant: "default".into(),
            sandbox: "sbx-1".into(),
            snapshot: "snap-1".into(),
            created_unix_ms: 1,
            chunk_size: 4096,
            base: Some(BaseRef {
                name: "minimal".into(),
                version: "v1".into(),
                manifest_hash: "00".into(),
            }),
            host: None,
            record: serde_json::json!({"id": "sbx-1"}),
            prefetch: Vec::new(),
            files: vec![
                FileMap {
                    name: "mem".into(),
                    size: 4096 * 3 + 10,
                    mode: 0o600,
                    base: Some("snapshot/mem".into()),
                    runs: vec![Run::Zero(1), Run::Base(1), Run::Chunks(vec![0, 1])],
                },
                FileMap {
                    name: "state".into(),
                    size: 0,
                    mode: 0o600,
                    base: None,
                    runs: vec![],
                },
            ],
            packs: vec!["p1".into()],
            chunks: vec![
                ChunkLoc {
                    id: a,
                    pack: 0,
                    offset: 0,
                    len: 100,
                    plain_len: 4096,
                    delta: None,
                },
                ChunkLoc {
                    id: b,
                    pack: 0,
                    offset: 100,
                    len: 39,
                    plain_len: 10,
                    delta: None,
                },
            ],
        }
    }

    #[test]
    fn round_trip_with_hash() {
        let keys = LineageKeys::derive("lin", &Key::random());
        let m = sample(&keys);
        m.validate().unwrap();
        let obj = m.encode(&keys).unwrap();
        let h = Manifest::hash(&obj);
        let back = Manifest::decode(&obj, Some(&h), &keys, "sbx-1", "snap-1").unwrap();
        assert_eq!(back, m);
        assert!(matches!(
            Manifest::decode(&obj, Some("ff"), &keys, "sbx-1", "snap-1"),
            Err(ManifestError::Hash { .. })
        ));
        assert!(matches!(
            Manifest::decode(&obj[..obj.len() - 1], None, &keys, "sbx-1", "snap-1"),
            Err(ManifestError::Crypto(_))
        ));
        assert!(matches!(
            Manifest::decode(&obj[..5], None, &keys, "sbx-1", "snap-1"),
            Err(ManifestError::Magic)
        ));
        assert!(matches!(
            Manifest::decode(&obj, None, &keys, "sbx-1", "snap-2"),
            Err(ManifestError::Crypto(_))
        ));
        let other = LineageKeys::derive("lin", &Key::random());
        assert!(Manifest::decode(&obj, None, &other, "sbx-1", "snap-1").is_err());
    }

    #[test]
    fn validation_catches_every_inconsistency() {
        let keys = LineageKeys::derive("lin", &Key::random());
        let bad = |f: &dyn Fn(&mut Manifest)| {
            let mut m = sample(&keys);
            f(&mut m);
            m.validate().unwrap_err()
        };
        bad(&|m| m.chunk_size = 1000);
        bad(&|m| m.chunk_size = 1 << 30);
        bad(&|m| m.files[0].size += 4096);
        bad(&|m| m.files[0].runs.push(Run::Zero(1)));
        bad(&|m| m.files[0].runs[2] = Run::Chunks(vec![0, 7]));
        bad(&|m| m.files[0].runs[2] = Run::Chunks(vec![1, 0]));
        bad(&|m| m.files[0].name = "../etc/passwd".into());
        bad(&|m| m.files[0].name = "/abs".into());
        bad(&|m| m.files[1].name = "mem".into());
        bad(&|m| m.files[0].base = None);
        bad(&|m| m.base = None);
        bad(&|m| m.chunks[0].pack = 3);
        bad(&|m| m.chunks[1].id = m.chunks[0].id);
        bad(&|m| m.chunks[0].len = 1 << 20);
        bad(&|m| m.packs[0] = "a/b".into());
        bad(&|m| m.files[0].size = MAX_FILE_BYTES + 1);
        // Page deltas: on a whole chunk of the same length or on a base file, with a page map
        // inside the chunk.
        let delta = |on: DeltaOn, pages: u64| Delta {
            on,
            pages: vec![pages],
        };
        let mut ok = sample(&keys);
        ok.chunks[1].plain_len = 4096;
        ok.files[0].size = 4096 * 4;
        ok.chunks[1].delta = Some(delta(DeltaOn::Chunk(0), 1));
        ok.validate().unwrap();
        ok.chunks[1].delta = Some(delta(
            DeltaOn::Base {
                file: "snapshot/mem".into(),
                index: 0,
            },
            1,
        ));
        ok.validate().unwrap();
        let bad_delta = |d: Delta| {
            let mut m = ok.clone();
            m.chunks[1].delta = Some(d);
            m.validate().unwrap_err()
        };
        bad_delta(delta(DeltaOn::Chunk(1), 1));
        bad_delta(delta(DeltaOn::Chunk(9), 1));
        bad_delta(delta(DeltaOn::Chunk(0), 0));
        bad_delta(delta(DeltaOn::Chunk(0), 2));
        bad_delta(Delta {
            on: DeltaOn::Chunk(0),
            pages: vec![1, 0],
        });
        bad_delta(delta(
            DeltaOn::Base {
                file: "other".into(),
                index: 0,
            },
            1,
        ));
        let mut chained = ok.clone();
        chained.chunks[0].delta = Some(delta(DeltaOn::Chunk(1), 1));
        chained.chunks[1].delta = Some(delta(DeltaOn::Chunk(0), 1));
        chained.validate().unwrap_err();
    }

    #[test]
    fn paths() {
        for ok in ["mem", "snapshot/mem", "rootfs.ext4", "template.json"] {
            assert!(safe_relative_path(ok), "{ok}");
        }
        for bad in ["", "/mem", "a//b", "a/../b", "..", ".", "a b", "a\0", "a/"] {
            assert!(!safe_relative_path(bad), "{bad:?}");
        }
        assert!(!safe_component("a/b"));
        assert_eq!(chunk_count(0, 4096), 0);
        assert_eq!(chunk_count(4097, 4096), 2);
        assert_eq!(chunk_len(4097, 4096, 1), 1);
    }
}
