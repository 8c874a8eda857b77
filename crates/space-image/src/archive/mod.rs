//! Image archive files: an OCI image layout in a tar (`skopeo copy ... oci-archive:`, `podman
//! save --format oci-archive`, `docker save` since Docker 25) or a Docker archive (`docker
//! save`, `podman save`, `skopeo copy ... docker-archive:`).
//!
//! The archive is read in one pass to find where each member lies; blobs are then read in
//! place. Every blob is checked against its digest as it is read: OCI blobs by the digest that
//! names them, a Docker archive's layers by the config's `diff_ids` (the digest of the
//! uncompressed layer) and its config by its file name when that is a digest. An archive that
//! is cut short, names a member it lacks, or whose bytes do not match fails with the member it
//! was reading.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::layers::{self, Budget, Compression, LayerStats};
use crate::spec::{self, Digest, ImageConfig, Index, Manifest, MAX_DOCUMENT, MAX_LAYERS};
use crate::{ImageError, Result};

/// Members an archive may have.
const MAX_MEMBERS: usize = 100_000;

fn invalid(msg: impl Into<String>) -> ImageError {
    ImageError::Invalid(msg.into())
}

/// Where one member's bytes lie in the archive file.
#[derive(Debug, Clone, Copy)]
struct Member {
    offset: u64,
    size: u64,
}

/// How one layer's bytes are checked.
#[derive(Debug, Clone)]
pub(crate) enum Check {
    /// The stored (possibly compressed) bytes hash to this.
    Stored(Digest),
    /// The uncompressed tar hashes to this.
    Uncompressed(Digest),
}

#[derive(Debug, Clone)]
struct Layer {
    member: String,
    compression: Option<Compression>,
    check: Check,
}

/// An image in an archive file, its documents read and checked, its layers not yet.
#[derive(Debug)]
pub struct ArchiveImage {
    path: PathBuf,
    members: HashMap<String, Member>,
    /// The image config.
    pub config: ImageConfig,
    /// The digest of the config: the image's id.
    pub config_digest: Digest,
    layers: Vec<Layer>,
}

/// A member's name as a relative path without `.` parts (`./index.json` is `index.json`).
fn member_name(path: &Path) -> Option<String> {
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => parts.push(n.to_str()?.to_owned()),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// Whether two tags name the same image once normalized (`docker.io`, `library/`, `latest`).
fn same_tag(a: &str, b: &str) -> bool {
    use crate::registry::Reference;
    a == b
        || matches!(
            (Reference::parse(a), Reference::parse(b)),
            (Ok(x), Ok(y)) if x == y
        )
}

/// `manifest.json` of a Docker archive.
#[derive(Debug, Deserialize)]
struct DockerEntry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers")]
    layers: Vec<String>,
}

/// The part of a config that names the uncompressed layers.
#[derive(Debug, Default, Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<Digest>,
}

#[derive(Debug, Default, Deserialize)]
struct ConfigRootFs {
    #[serde(default)]
    rootfs: RootFs,
}

/// A reader that hashes what passes through it.
pub(crate) struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

impl<R: Read> Hashing<R> {
    pub(crate) fn new(inner: R) -> Self {
        Hashing {
            inner,
            hash: Sha256::new(),
        }
    }

    /// Reads what is left (a tar reader stops at its end marker) and answers the digest.
    pub(crate) fn finish(mut self) -> io::Result<Digest> {
        io::copy(&mut self, &mut io::sink())?;
        Ok(
            Digest::parse(&format!("sha256:{}", hex::encode(self.hash.finalize())))
                .expect("a sha256 digest is well formed"),
        )
    }
}

impl ArchiveImage {
    /// Reads the archive's index and documents; `tag` picks an image of a Docker archive that
    /// holds several (`None`: the only one).
    pub fn open(path: &Path, tag: Option<&str>) -> Result<ArchiveImage> {
        let file =
            File::open(path).map_err(|e| ImageError::io(format!("open {}", path.display()), e))?;
        let mut members = HashMap::new();
        let mut archive = tar::Archive::new(io::BufReader::new(file));
        let entries = archive
            .entries()
            .map_err(|e| invalid(format!("{} is not a tar archive: {e}", path.display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| {
                invalid(format!(
                    "{} is cut short or not a tar archive: {e}",
                    path.display()
                ))
            })?;
            if members.len() >= MAX_MEMBERS {
                return Err(invalid(format!(
                    "{} has more than {MAX_MEMBERS} members",
                    path.display()
                )));
            }
            if entry.header().entry_type() != tar::EntryType::Regular {
                continue;
            }
            let name = entry
                .path()
                .ok()
                .and_then(|p| member_name(&p))
                .ok_or_else(|| {
                    invalid(format!("{} has a member with a bad name", path.display()))
                })?;
            let size = entry.header().size().unwrap_or(0);
            members.insert(
                name,
                Member {
                    offset: entry.raw_file_position(),
                    size,
                },
            );
        }
        let len = std::fs::metadata(path)
            .map_err(|e| ImageError::io(format!("stat {}", path.display()), e))?
            .len();
        for (name, m) in &members {
            if m.offset.saturating_add(m.size) > len {
                return Err(invalid(format!(
                    "{} is cut short: {name} ends past the end of the file",
                    path.display()
                )));
            }
        }
        let mut image = ArchiveImage {
            path: path.to_owned(),
            members,
            config: ImageConfig::default(),
            config_digest: Digest::of(b""),
            layers: Vec::new(),
        };
        if image.members.contains_key("index.json") {
            image.read_oci()?;
        } else if image.members.contains_key("manifest.json") {
            image.read_docker(tag)?;
        } else {
            return Err(invalid(format!(
                "{} is neither an OCI archive (index.json) nor a Docker archive (manifest.json)",
                path.display()
            )));
        }
        image.config.check_platform()?;
        Ok(image)
    }

    fn reader(&self, name: &str) -> Result<io::Take<File>> {
        let m = self
            .members
            .get(name)
            .ok_or_else(|| invalid(format!("the archive has no member {name}")))?;
        let mut f = File::open(&self.path)
            .map_err(|e| ImageError::io(format!("open {}", self.path.display()), e))?;
        f.seek(SeekFrom::Start(m.offset))
            .map_err(|e| ImageError::io(format!("seek in {}", self.path.display()), e))?;
        Ok(f.take(m.size))
    }

    /// A small member read whole (documents), bounded by [`MAX_DOCUMENT`].
    fn document(&self, name: &str) -> Result<Vec<u8>> {
        let size = self
            .members
            .get(name)
            .ok_or_else(|| invalid(format!("the archive has no member {name}")))?
            .size;
        if size > MAX_DOCUMENT as u64 {
            return Err(invalid(format!(
                "{name} is {size} bytes, more than the {MAX_DOCUMENT} a document may be"
            )));
        }
        let mut out = Vec::with_capacity(size as usize);
        self.reader(name)?
            .read_to_end(&mut out)
            .map_err(|e| ImageError::io(format!("read {name}"), e))?;
        Ok(out)
    }

    fn blob_name(d: &Digest) -> String {
        format!("blobs/sha256/{}", d.hex())
    }

    fn blob(&self, d: &Digest, what: &str) -> Result<Vec<u8>> {
        let bytes = self.document(&Self::blob_name(d))?;
        d.verify(&bytes, what)?;
        Ok(bytes)
    }

    fn read_oci(&mut self) -> Result<()> {
        let mut index: Index = spec::parse(&self.document("index.json")?, "index.json")?;
        // An index may point at a nested index (a multi-platform image): one level.
        let mut manifest_desc = spec::pick_amd64(&index)?.clone();
        if spec::is_index(&manifest_desc.media_type) {
            index = spec::parse(
                &self.blob(&manifest_desc.digest, "the image index")?,
                "image index",
            )?;
            manifest_desc = spec::pick_amd64(&index)?.clone();
            if !spec::is_manifest(&manifest_desc.media_type) {
                return Err(invalid("the image's indexes nest more than one level"));
            }
        }
        let manifest: Manifest = spec::parse(
            &self.blob(&manifest_desc.digest, "the manifest")?,
            "manifest",
        )?;
        manifest.validate()?;
        let config_bytes = self.blob(&manifest.config.digest, "the image config")?;
        self.config = spec::parse(&config_bytes, "image config")?;
        self.config_digest = manifest.config.digest.clone();
        self.layers = manifest
            .layers
            .iter()
            .map(|l| Layer {
                member: Self::blob_name(&l.digest),
                compression: Compression::from_media_type(&l.media_type),
                check: Check::Stored(l.digest.clone()),
            })
            .collect();
        for l in &self.layers {
            if !self.members.contains_key(&l.member) {
                return Err(invalid(format!("the archive has no member {}", l.member)));
            }
        }
        Ok(())
    }

    fn read_docker(&mut self, tag: Option<&str>) -> Result<()> {
        let entries: Vec<DockerEntry> =
            spec::parse(&self.document("manifest.json")?, "manifest.json")?;
        let entry = match tag {
            // Tags match as references: `team/tool:1` is `docker.io/team/tool:1`.
            Some(t) => entries
                .iter()
                .find(|e| e.repo_tags.iter().flatten().any(|r| same_tag(r, t)))
                .ok_or_else(|| invalid(format!("the archive has no image tagged {t}")))?,
            None => match entries.as_slice() {
                [one] => one,
                [] => return Err(invalid("the archive's manifest.json lists no image")),
                _ => {
                    return Err(invalid(
                        "the archive holds several images: name one by its tag",
                    ))
                }
            },
        };
        if entry.layers.len() > MAX_LAYERS {
            return Err(invalid(format!(
                "the image has {} layers, more than the {MAX_LAYERS} accepted",
                entry.layers.len()
            )));
        }
        let config_name = member_name(Path::new(&entry.config))
            .ok_or_else(|| invalid(format!("a bad config name {:?}", entry.config)))?;
        let config_bytes = self.document(&config_name)?;
        // The config's file is named by its digest (`<hex>.json` or `blobs/sha256/<hex>`).
        let stem = config_name
            .rsplit('/')
            .next()
            .unwrap_or("")
            .trim_end_matches(".json");
        if let Ok(d) = Digest::parse(&format!("sha256:{stem}")) {
            d.verify(&config_bytes, "the image config")?;
        }
        self.config = spec::parse(&config_bytes, "image config")?;
        self.config_digest = Digest::of(&config_bytes);
        let rootfs: ConfigRootFs = spec::parse(&config_bytes, "image config")?;
        if rootfs.rootfs.diff_ids.len() != entry.layers.len() {
            return Err(invalid(format!(
                "the config names {} layers and the archive {}",
                rootfs.rootfs.diff_ids.len(),
                entry.layers.len()
            )));
        }
        self.layers = Vec::with_capacity(entry.layers.len());
        for (l, diff_id) in entry.layers.iter().zip(rootfs.rootfs.diff_ids) {
            let member = member_name(Path::new(l))
                .ok_or_else(|| invalid(format!("a bad layer name {l:?}")))?;
            if !self.members.contains_key(&member) {
                return Err(invalid(format!("the archive has no member {member}")));
            }
            self.layers.push(Layer {
                member,
                compression: None,
                check: Check::Uncompressed(diff_id),
            });
        }
        Ok(())
    }

    /// Layers of the image.
    pub fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Applies every layer, in order, onto `root`; each is checked against its digest (a
    /// mismatch fails the whole image: the caller discards `root`).
    pub fn apply(&self, root: &Path, budget: &mut Budget) -> Result<Vec<LayerStats>> {
        let mut out = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            let stats = apply_checked(
                || self.reader(&l.member),
                &l.member,
                l.compression,
                &l.check,
                root,
                budget,
            )?;
            out.push(stats);
        }
        Ok(out)
    }
}

/// Applies one layer whose bytes `open` reads (called twice: once to sniff the compression
/// when it is not known) and checks them against `check` while they pass.
pub(crate) fn apply_checked<R: Read>(
    open: impl Fn() -> Result<R>,
    name: &str,
    compression: Option<Compression>,
    check: &Check,
    root: &Path,
    budget: &mut Budget,
) -> Result<LayerStats> {
    let compression = match compression {
        Some(c) => c,
        None => {
            let mut head = [0u8; 4];
            let n = open()?
                .read(&mut head)
                .map_err(|e| ImageError::io(format!("read {name}"), e))?;
            Compression::sniff(&head[..n])
        }
    };
    match check {
        Check::Stored(want) => {
            let mut hashing = Hashing::new(open()?);
            let stats = layers::apply_layer(root, &mut hashing, compression, budget)?;
            let got = hashing
                .finish()
                .map_err(|e| ImageError::io(format!("read {name}"), e))?;
            if &got != want {
                return Err(invalid(format!(
                    "layer {name} does not match its digest {want} (got {got})"
                )));
            }
            Ok(stats)
        }
        Check::Uncompressed(want) => {
            let raw = layers::decompress(open()?, compression)?;
            let mut hashing = Hashing::new(raw);
            let stats = layers::apply_tar(root, &mut hashing, budget)?;
            let got = hashing
                .finish()
                .map_err(|e| invalid(format!("layer {name}: {e}")))?;
            if &got != want {
                return Err(invalid(format!(
                    "layer {name} does not match its diff id {want} (got {got})"
                )));
            }
            Ok(stats)
        }
    }
}

#[cfg(test)]
mod tests;
