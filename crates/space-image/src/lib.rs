//! OCI images for space.
//!
//! - [`dockerfile`]: Dockerfiles and `.dockerignore`, parsed into the steps a build runs.
//! - [`layers`]: a layer (a tar stream, plain, gzip or zstd) applied onto a root tree the way
//!   an overlay stack would show it: whiteouts remove, opaque directories hide what lower
//!   layers put there, and every path, link and link target stays inside the root whatever
//!   the archive says.
//! - [`archive`]: an image in an OCI archive or a Docker archive file, checked blob by blob.
//! - [`registry`]: an image pulled from a registry (OCI distribution API; anonymous, basic
//!   and token auth), its blobs checked and kept by digest.
//! - [`rootfs`]: a root tree made into a sandbox's root image: init, proxy settings, ext4.
//! - [`spec`]: the OCI documents an image is made of (index, manifest, config), read as
//!   untrusted JSON, and the platform and media type rules for picking what to apply.

pub mod archive;
pub mod dockerfile;
pub mod layers;
pub mod registry;
pub mod rootfs;
pub mod spec;
#[cfg(feature = "testing")]
pub mod testing;

pub use archive::ArchiveImage;
pub use layers::{apply_layer, Budget, Compression, LayerStats};

/// What can go wrong reading an image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image's bytes say something that cannot be applied (the message names the entry).
    #[error("{0}")]
    Invalid(String),
    /// The root tree could not be written.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl ImageError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> ImageError {
        ImageError::Io {
            what: what.into(),
            source,
        }
    }
}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, ImageError>;
