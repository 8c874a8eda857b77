//! An OCI image, from a registry or an archive file, made into a template's root image: its
//! layers applied in a staging tree, `space-guestd` installed, an ext4 image made
//! (`space_image::rootfs`), and its config's `Env`, `User`, `WorkingDir`, command and ports
//! kept as the template's [`GuestDefaults`].

use std::path::{Path, PathBuf};

use space_image::registry::{Auth, Reference, Registry};
use space_image::rootfs::Image;
use space_image::{ArchiveImage, Budget};

use super::{BuildLog, Credentials};
use crate::error::{NodeError, Result};
use crate::template::{blocking, GuestDefaults};

/// The most an image may write into its tree.
pub const IMAGE_BUDGET: Budget = Budget {
    bytes: 32 << 30,
    entries: 4_000_000,
};

/// Where an image comes from.
#[derive(Debug, Clone)]
pub enum ImageSource {
    /// A registry's (`reference` as `docker pull` reads it).
    Registry {
        reference: String,
        credentials: Option<Credentials>,
        plain_http: bool,
    },
    /// An OCI or Docker archive file on this node; `tag` picks one of several images.
    Archive { path: PathBuf, tag: Option<String> },
}

/// An image made into a root image.
#[derive(Debug)]
pub struct Imported {
    /// The root image (inside the work directory given).
    pub rootfs: PathBuf,
    pub guest: GuestDefaults,
    /// The image's identity: its reference and manifest digest, or the archive's config digest.
    pub source: String,
    /// What identifies the image's content (a digest), for cache keys.
    pub digest: String,
}

fn image_error(what: &str) -> impl Fn(space_image::ImageError) -> NodeError + '_ {
    move |e| match e {
        // The image, its reference or the registry's answer: the caller's to fix.
        space_image::ImageError::Invalid(_) => NodeError::Invalid(format!("{what}: {e}")),
        // Reading or writing this node's own files.
        space_image::ImageError::Io { .. } => NodeError::internal(format!("{what}: {e}")),
    }
}

/// The template defaults of an image config.
pub fn defaults_of(config: &space_image::spec::ImageConfig) -> GuestDefaults {
    let run = &config.config;
    GuestDefaults {
        env: config.env().into_iter().collect(),
        user: Some(run.user.clone()).filter(|u| !u.is_empty()),
        workdir: Some(run.working_dir.clone()).filter(|w| w.starts_with('/')),
        command: config.command(),
        ports: run
            .exposed_ports
            .keys()
            .filter_map(|p| {
                let (n, proto) = p.split_once('/').unwrap_or((p, "tcp"));
                (proto == "tcp").then(|| n.parse().ok()).flatten()
            })
            .collect(),
    }
}

/// An image fetched, not yet made into a root image.
pub struct Fetched {
    image: Box<dyn Image + Send>,
    /// Its reference and digest, for people.
    pub source: String,
    /// What identifies its content (the manifest's or the config's digest).
    pub digest: String,
}

impl Fetched {
    /// The defaults its config gives a template.
    pub fn defaults(&self) -> GuestDefaults {
        defaults_of(self.image.config())
    }
}

/// Fetches the image. A registry's blobs are kept by digest under `blobs`: a second pull of
/// the same layers reads them from there and fetches only the manifest.
pub async fn fetch(source: &ImageSource, blobs: &Path, log: &BuildLog) -> Result<Fetched> {
    let mut budget = IMAGE_BUDGET;
    match source {
        ImageSource::Registry {
            reference,
            credentials,
            plain_http,
        } => {
            let r = Reference::parse(reference).map_err(image_error("image reference"))?;
            let auth = match credentials {
                Some(c) => Auth::Basic {
                    user: c.username.clone(),
                    password: c.password.clone(),
                },
                None => Auth::Anonymous,
            };
            log.line(format!("pulling {r}"));
            let registry = Registry::new(&r, auth, *plain_http).map_err(image_error("registry"))?;
            let pulled = registry
                .pull(blobs, &mut budget)
                .await
                .map_err(image_error(&format!("pulling {r}")))?;
            let digest = pulled.manifest_digest.as_str().to_owned();
            log.line(format!(
                "pulled {r}@{digest} ({} layers)",
                pulled.layer_count()
            ));
            Ok(Fetched {
                image: Box::new(pulled),
                source: format!("{r}@{digest}"),
                digest,
            })
        }
        ImageSource::Archive { path, tag } => {
            let (p, t) = (path.clone(), tag.clone());
            let image = blocking(move || {
                ArchiveImage::open(&p, t.as_deref())
                    .map_err(image_error(&format!("image archive {}", p.display())))
            })
            .await?;
            let digest = image.config_digest.as_str().to_owned();
            log.line(format!(
                "read {} ({} layers, config {digest})",
                path.display(),
                image.layer_count()
            ));
            Ok(Fetched {
                image: Box::new(image),
                source: format!("archive {} ({digest})", path.display()),
                digest,
            })
        }
    }
}

/// Makes the root image `work/image.ext4` of at least `min_bytes` of a fetched image.
pub async fn make_rootfs(
    fetched: Fetched,
    guestd: &Path,
    work: &Path,
    min_bytes: u64,
    log: &BuildLog,
) -> Result<Imported> {
    let out = work.join("image.ext4");
    let guest = fetched.defaults();
    let Fetched {
        image,
        source,
        digest,
    } = fetched;
    let (g, w, o) = (guestd.to_owned(), work.to_owned(), out.clone());
    let built = blocking(move || {
        let mut budget = IMAGE_BUDGET;
        space_image::rootfs::build(image.as_ref(), &g, &w, &o, min_bytes, &mut budget)
            .map_err(image_error("making the root image"))
    })
    .await?;
    let entries: u64 = built.layers.iter().map(|l| l.entries).sum();
    log.line(format!(
        "root image: {} MiB ({} MiB of files, {entries} entries)",
        built.image_bytes >> 20,
        built.tree_bytes >> 20,
    ));
    Ok(Imported {
        rootfs: out,
        guest,
        source,
        digest,
    })
}
