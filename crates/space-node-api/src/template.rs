//! Templates as the node API speaks of them: what one is built from, the process its
//! snapshot holds, the defaults of its sandboxes, and a build's log.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ids::TemplateRef;
use crate::policy::EgressPolicy;

/// The defaults of a template's sandboxes from its image's config (`ENV`, `USER`,
/// `WORKDIR`), and what the image says about itself (its command, its ports).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestDefaults {
    /// Environment of every exec and PTY, under the sandbox's own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Who commands run as when they name nobody (`user`, `uid`, `user:group`, `uid:gid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Their working directory when they name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The image's entrypoint and command (kept and shown; a template runs only its start
    /// command).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The ports the image exposes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

impl GuestDefaults {
    /// Nothing set.
    pub fn is_empty(&self) -> bool {
        self == &GuestDefaults::default()
    }
}

/// A template's start command and ready check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartSpec {
    /// Run under `/bin/sh -c` as the template's default user, in its working directory.
    pub command: String,
    /// When the process counts as serving; `None`: as soon as it started.
    #[serde(default)]
    pub ready: Option<ReadyCheck>,
    /// How long the check may take to pass, milliseconds.
    pub timeout_ms: u64,
}

/// When a template's start command counts as serving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadyCheck {
    /// This shell command exits 0.
    Command(String),
    /// This TCP port of the guest accepts a connection.
    Port(u16),
}

/// How long a start command's ready check may take when the request names no time.
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(120);

/// Credentials for a registry. Never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// A file a build reads (an image archive, a Dockerfile's context).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuildInput {
    /// A file (or, for a context, a directory) on the node's own disk: the server that took
    /// the upload runs in the node's process (`space up`), or a caller on the node.
    Path(PathBuf),
    /// An upload kept in the object store (`space_archive::uploads`), which only `tenant`
    /// can open: what a cluster's replicas hand their nodes.
    Stored {
        /// The tenant that uploaded it.
        tenant: String,
        /// Its id (`upl-...`).
        upload: String,
    },
}

impl BuildInput {
    /// For people.
    pub fn describe(&self) -> String {
        match self {
            BuildInput::Path(p) => p.display().to_string(),
            BuildInput::Stored { upload, .. } => format!("upload {upload}"),
        }
    }
}

/// What a template is built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TemplateSource {
    /// One of the node's stock root images.
    Stock { image: String },
    /// An image of a registry (`reference` as `docker pull` reads it; a digest pins it).
    Image {
        reference: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credentials: Option<Credentials>,
        /// Speak HTTP, not HTTPS, to the registry.
        #[serde(default)]
        plain_http: bool,
    },
    /// An OCI or Docker archive.
    Archive {
        archive: BuildInput,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<String>,
    },
    /// A Dockerfile, with its build context: a directory or a tar file (plain or gzip).
    Dockerfile {
        dockerfile: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<BuildInput>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        build_args: BTreeMap<String, String>,
        /// For a `FROM` image.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        credentials: Option<Credentials>,
        #[serde(default)]
        plain_http: bool,
    },
}

impl TemplateSource {
    /// For people (no credentials).
    pub fn describe(&self) -> String {
        match self {
            TemplateSource::Stock { image } => format!("stock image {image}"),
            TemplateSource::Image { reference, .. } => format!("image {reference}"),
            TemplateSource::Archive { archive, .. } => format!("archive {}", archive.describe()),
            TemplateSource::Dockerfile { .. } => "Dockerfile".to_owned(),
        }
    }
}

/// A piece of a build's log, from an offset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogChunk {
    /// The text from the asked offset (or from the oldest byte kept, when that is later).
    pub text: String,
    /// The offset of the next byte to ask for.
    pub next: u64,
    /// The build ended: nothing more will be written.
    pub done: bool,
}

/// A template build request: what from ([`TemplateSource`]), the shape of the snapshot, the
/// start command.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TemplateBuild {
    /// Name and version of the build; the version must not exist yet.
    pub template: TemplateRef,
    /// What the root image is made of.
    pub source: TemplateSource,
    /// vCPUs of the snapshot.
    pub vcpus: u32,
    /// Guest RAM of the snapshot in MiB.
    pub memory_mib: u64,
    /// The root disk's size at least, MiB (default: what the source needs).
    #[serde(default)]
    pub disk_mib: Option<u64>,
    /// A process to start before the snapshot, and its ready check.
    #[serde(default)]
    pub start: Option<StartSpec>,
    /// How long the build VM may take to report ready, in milliseconds.
    pub ready_timeout_ms: u64,
    /// Names the build's log ([`NodeApi::build_log`]).
    #[serde(default)]
    pub build_id: Option<String>,
    /// What a Dockerfile's builder may reach (default: the default policy).
    #[serde(default)]
    pub egress: Option<EgressPolicy>,
}

impl TemplateBuild {
    /// A build of one of the node's stock images, no start command.
    pub fn stock(template: TemplateRef, image: &str, vcpus: u32, memory_mib: u64) -> Self {
        TemplateBuild {
            template,
            source: TemplateSource::Stock {
                image: image.to_owned(),
            },
            vcpus,
            memory_mib,
            disk_mib: None,
            start: None,
            ready_timeout_ms: 120_000,
            build_id: None,
            egress: None,
        }
    }
}

/// The `source` of a template saved from sandbox `id` (made from template `parent`), with its
/// memory or of its disk alone; [`saved_from`] reads it back.
pub fn saved_source(id: &crate::SandboxId, parent: &TemplateRef, memory: bool) -> String {
    let what = if memory { "sandbox" } else { "disk of sandbox" };
    format!("{what} {id} (from {parent})")
}

/// The sandbox a template was saved from, and whether with its memory, by its `source`.
pub fn saved_from(source: &str) -> Option<(&str, bool)> {
    let (rest, memory) = match source.strip_prefix("disk of sandbox ") {
        Some(rest) => (rest, false),
        None => (source.strip_prefix("sandbox ")?, true),
    };
    let id = rest.split(' ').next()?;
    (!id.is_empty()).then_some((id, memory))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_source_names_its_sandbox() {
        let id: crate::SandboxId = "sbx-0123456789abcdef".parse().unwrap();
        let parent = TemplateRef::new("base", "1").unwrap();
        for memory in [true, false] {
            let s = saved_source(&id, &parent, memory);
            assert_eq!(saved_from(&s), Some(("sbx-0123456789abcdef", memory)));
        }
        assert_eq!(saved_from("stock base"), None);
        assert_eq!(saved_from("sandbox "), None);
    }
}
