//! The OCI documents of an image: the index (or a Docker manifest list), the manifest, and
//! the image config, each read as untrusted JSON with a size bound, and the rules that pick a
//! `linux/amd64` manifest and check digests.

use std::collections::BTreeMap;

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use crate::{ImageError, Result};

/// Largest index, manifest or config accepted.
pub const MAX_DOCUMENT: usize = 4 << 20;
/// Layers an image may have.
pub const MAX_LAYERS: usize = 256;

pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

/// A content digest, `sha256:<64 hex>` (the only algorithm accepted).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`.
    pub fn parse(s: &str) -> Result<Digest> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| invalid(format!("digest {s:?} is not sha256:<hex>")))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(invalid(format!(
                "digest {s:?} is not sha256:<64 hex digits>"
            )));
        }
        Ok(Digest(s.to_owned()))
    }

    /// The digest of `data`.
    pub fn of(data: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(data))))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Refuses `data` unless it hashes to this digest.
    pub fn verify(&self, data: &[u8], what: &str) -> Result<()> {
        let got = Digest::of(data);
        if &got != self {
            return Err(invalid(format!(
                "{what} does not match its digest: expected {self}, got {got}"
            )));
        }
        Ok(())
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

fn invalid(msg: impl Into<String>) -> ImageError {
    ImageError::Invalid(msg.into())
}

/// A pointer to a blob.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
}

/// An image index or a Docker manifest list.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    #[serde(default)]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

/// An image manifest (OCI or Docker schema 2).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// The parts of an image config that make a sandbox's default command environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: RunConfig,
}

/// `config` of an image config. Fields keep the OCI spelling.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct RunConfig {
    #[serde(rename = "Env", deserialize_with = "null_default")]
    pub env: Vec<String>,
    #[serde(rename = "WorkingDir", deserialize_with = "null_default")]
    pub working_dir: String,
    #[serde(rename = "User", deserialize_with = "null_default")]
    pub user: String,
    #[serde(rename = "Entrypoint", deserialize_with = "null_default")]
    pub entrypoint: Vec<String>,
    #[serde(rename = "Cmd", deserialize_with = "null_default")]
    pub cmd: Vec<String>,
    #[serde(rename = "ExposedPorts", deserialize_with = "null_default")]
    pub exposed_ports: BTreeMap<String, serde_json::Value>,
}

/// `null` reads as the default (images write `"Cmd": null`).
fn null_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Parses one of the documents, bounded by [`MAX_DOCUMENT`].
pub fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8], what: &str) -> Result<T> {
    if bytes.len() > MAX_DOCUMENT {
        return Err(invalid(format!(
            "the {what} is {} bytes, more than the {MAX_DOCUMENT} accepted",
            bytes.len()
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| invalid(format!("the {what} is not valid: {e}")))
}

/// Whether a media type is an index or a manifest list.
pub fn is_index(media_type: &str) -> bool {
    media_type == MEDIA_OCI_INDEX || media_type == MEDIA_DOCKER_LIST
}

/// Whether a media type is a single-image manifest.
pub fn is_manifest(media_type: &str) -> bool {
    media_type == MEDIA_OCI_MANIFEST || media_type == MEDIA_DOCKER_MANIFEST
}

/// The `linux/amd64` entry of an index (one without a platform counts when it is the only
/// image manifest).
pub fn pick_amd64(index: &Index) -> Result<&Descriptor> {
    let images: Vec<&Descriptor> = index
        .manifests
        .iter()
        .filter(|d| is_manifest(&d.media_type) || is_index(&d.media_type))
        .collect();
    if let Some(d) = images.iter().find(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
    }) {
        return Ok(d);
    }
    match images.as_slice() {
        [only] if only.platform.is_none() => Ok(only),
        _ => {
            let have: Vec<String> = images
                .iter()
                .filter_map(|d| d.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect();
            Err(invalid(format!(
                "the image has no linux/amd64 manifest (it has: {})",
                if have.is_empty() {
                    "none".into()
                } else {
                    have.join(", ")
                }
            )))
        }
    }
}

impl Manifest {
    /// Checks what a manifest must hold before any of it is fetched.
    pub fn validate(&self) -> Result<()> {
        if self.layers.len() > MAX_LAYERS {
            return Err(invalid(format!(
                "the image has {} layers, more than the {MAX_LAYERS} accepted",
                self.layers.len()
            )));
        }
        for l in &self.layers {
            if crate::layers::Compression::from_media_type(&l.media_type).is_none() {
                return Err(invalid(format!(
                    "layer {} has the media type {:?}, which is not a layer space can apply",
                    l.digest, l.media_type
                )));
            }
        }
        Ok(())
    }
}

impl ImageConfig {
    /// Refuses an image for another platform.
    pub fn check_platform(&self) -> Result<()> {
        if (!self.os.is_empty() && self.os != "linux")
            || (!self.architecture.is_empty() && self.architecture != "amd64")
        {
            return Err(invalid(format!(
                "the image is for {}/{}; space runs linux/amd64",
                self.os, self.architecture
            )));
        }
        Ok(())
    }

    /// The image's environment as pairs (entries without `=` are ignored, as runtimes do).
    pub fn env(&self) -> Vec<(String, String)> {
        self.config
            .env
            .iter()
            .filter_map(|e| e.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    /// The default command: entrypoint then cmd.
    pub fn command(&self) -> Vec<String> {
        let mut c = self.config.entrypoint.clone();
        c.extend(self.config.cmd.iter().cloned());
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_and_checked() {
        let d = Digest::of(b"hello");
        assert_eq!(
            d.as_str(),
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert!(d.verify(b"hello", "x").is_ok());
        assert!(d
            .verify(b"hullo", "x")
            .unwrap_err()
            .to_string()
            .contains("does not match"));
        for bad in [
            "md5:abc",
            "sha256:ABC",
            "sha256:../../etc",
            "sha256:",
            &"sha256:".repeat(2),
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn configs_read_nulls_and_pick_linux_amd64() {
        let cfg: ImageConfig = parse(
            br#"{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/usr/bin","A=b=c","junk"],
                "WorkingDir":"/srv","User":"1000:1000","Entrypoint":null,"Cmd":["python3","-m","http.server"],
                "ExposedPorts":{"8000/tcp":{}}}}"#,
            "config",
        )
        .unwrap();
        cfg.check_platform().unwrap();
        assert_eq!(
            cfg.env(),
            [
                ("PATH".into(), "/usr/bin".into()),
                ("A".into(), "b=c".into())
            ]
        );
        assert_eq!(cfg.command(), ["python3", "-m", "http.server"]);
        assert_eq!(cfg.config.user, "1000:1000");
        let arm: ImageConfig =
            parse(br#"{"architecture":"arm64","os":"linux"}"#, "config").unwrap();
        assert!(arm.check_platform().is_err());

        let d = |p: Option<(&str, &str)>| {
            format!(
                r#"{{"mediaType":"{MEDIA_OCI_MANIFEST}","digest":"{}","size":1{}}}"#,
                Digest::of(p.map_or("x", |p| p.1).as_bytes()),
                p.map_or(String::new(), |(os, arch)| format!(
                    r#","platform":{{"os":"{os}","architecture":"{arch}"}}"#
                ))
            )
        };
        let index: Index = parse(
            format!(
                r#"{{"manifests":[{},{}]}}"#,
                d(Some(("linux", "arm64"))),
                d(Some(("linux", "amd64")))
            )
            .as_bytes(),
            "index",
        )
        .unwrap();
        assert_eq!(
            pick_amd64(&index)
                .unwrap()
                .platform
                .as_ref()
                .unwrap()
                .architecture,
            "amd64"
        );
        let only: Index = parse(
            format!(r#"{{"manifests":[{}]}}"#, d(None)).as_bytes(),
            "index",
        )
        .unwrap();
        assert!(pick_amd64(&only).is_ok());
        let arm_only: Index = parse(
            format!(r#"{{"manifests":[{}]}}"#, d(Some(("linux", "arm64")))).as_bytes(),
            "index",
        )
        .unwrap();
        let e = pick_amd64(&arm_only).unwrap_err().to_string();
        assert!(e.contains("linux/arm64"), "{e}");
        assert!(parse::<Index>(&vec![b' '; MAX_DOCUMENT + 1], "index").is_err());
    }
}
