//! Where the guest artifacts are when nothing names them: `scripts/artifacts.sh` (which
//! `make up`, `make test` and `make artifacts` run) builds the guest kernel, `space-guestd`
//! and the stock root images into the cache (`$SPACE_CACHE`, default `~/.cache/space`) and
//! records their paths in `artifacts.json` there. A `space` binary run on its own (installed,
//! or from another directory) finds them through that file, so `space up` needs no other
//! setup than the artifacts having been built once on the machine.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use serde::Deserialize;

/// The cache directory: `$SPACE_CACHE`, else `$HOME/.cache/space`.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("SPACE_CACHE").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/space")
        }
    }
}

/// The record `scripts/artifacts.sh` writes.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Artifacts {
    /// The guest kernel.
    pub kernel: Option<PathBuf>,
    /// `space-guestd`, static.
    pub guestd: Option<PathBuf>,
    /// The stock root images by name.
    #[serde(default)]
    pub images: BTreeMap<String, PathBuf>,
    /// The image recipe (`guest/build-image.sh` of the checkout that built the artifacts),
    /// with which `space up` makes the `desktop` image in the background when it is missing.
    #[serde(default)]
    pub recipe: Option<PathBuf>,
}

/// The path of the record.
pub fn record_path() -> PathBuf {
    cache_dir().join("artifacts.json")
}

/// The record, empty when there is none; an unreadable or malformed one is an error that
/// names it.
pub fn load() -> Result<Artifacts> {
    let path = record_path();
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Artifacts::default()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if text.len() > 1 << 20 {
        bail!(
            "{} is over 1 MiB: it is not an artifacts record",
            path.display()
        );
    }
    serde_json::from_slice(&text).with_context(|| {
        format!(
            "{} is not an artifacts record (remove it and run `make artifacts` again)",
            path.display()
        )
    })
}

/// How to get the artifacts, for errors.
pub fn how_to_build() -> String {
    format!(
        "build them once with `make artifacts` in a checkout of space (the kernel and the \
         Debian image take a few minutes the first time), which records them in {}; or name \
         them with --kernel and --image NAME=PATH",
        record_path().display()
    )
}

impl Artifacts {
    /// The kernel: `given` (a flag or `SPACE_KERNEL`), else the recorded one.
    pub fn kernel(&self, given: Option<PathBuf>) -> Result<PathBuf> {
        let (kernel, from) = match given {
            Some(k) => (k, "given"),
            None => match &self.kernel {
                Some(k) => (k.clone(), "recorded"),
                None => bail!("no guest kernel: {}", how_to_build()),
            },
        };
        if !kernel.is_file() {
            bail!(
                "the {from} guest kernel {} does not exist: {}",
                kernel.display(),
                how_to_build()
            );
        }
        Ok(kernel)
    }

    /// `space-guestd`: `SPACE_GUESTD`, else the recorded one (template builds put it in).
    pub fn guestd(&self) -> Option<PathBuf> {
        std::env::var_os("SPACE_GUESTD")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| self.guestd.clone().filter(|p| p.is_file()))
    }

    /// The recorded images that exist.
    pub fn images(&self) -> BTreeMap<String, PathBuf> {
        self.images
            .iter()
            .filter(|(_, p)| p.is_file())
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect()
    }
}
