//! The API's answers and request bodies as types (`docs/api.md`): the server builds its
//! answers from them and clients read answers into them, so both sides agree by
//! construction.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use space_proto::{DirEntry, DirListing, FileStat, FileType};

/// A sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sandbox {
    /// Its id.
    pub id: String,
    /// The tenant that owns it.
    pub tenant: String,
    /// The template it was made from.
    pub template: String,
    /// The template's version.
    pub template_version: String,
    /// `creating`, `running`, `paused`, `suspended`, `failed` or `terminated`.
    pub state: String,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Disk in MiB.
    pub disk_mib: u64,
    /// Environment of every process.
    pub env: BTreeMap<String, String>,
    /// The caller's labels.
    pub metadata: BTreeMap<String, String>,
    /// When it suspends or is killed by itself.
    pub timeouts: Timeouts,
    /// What its programs may reach.
    pub egress: EgressPolicy,
    /// Secrets bound to it, by name and placeholder.
    pub secrets: Vec<SecretBinding>,
    /// The sandbox and snapshot it was forked from.
    pub forked_from: Option<ForkedFrom>,
    /// Why it failed, when it did.
    pub failure: Option<String>,
    /// Whether guest access wakes it when paused or suspended.
    pub auto_resume: bool,
    /// The volumes it mounts.
    #[serde(default)]
    pub volumes: Vec<VolumeMountSpec>,
    /// Where a suspended sandbox restores from.
    pub restore_point: Option<RestorePoint>,
    /// When it was made, ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// Since when it is in its state.
    pub state_since_unix_ms: u64,
    /// When it was last used.
    pub last_activity_unix_ms: u64,
    /// The cluster node that holds it (admins only, clusters only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// A sandbox's timeouts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// Idle time after which `action` happens (`None`: never).
    pub idle_ms: Option<u64>,
    /// Age after which `action` happens (`None`: never).
    pub max_lifetime_ms: Option<u64>,
    /// `suspend` or `kill`.
    pub action: String,
}

/// An egress policy: deny rules win, then allow rules, then `default`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressPolicy {
    /// `allow` or `deny`.
    pub default: String,
    /// Rules (`HOST` or `HOST:PORT`) allowed.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Rules refused.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Headers the gateway sets on requests to some destinations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderRule>,
}

/// A header the gateway sets (replacing the request's own) on every request to a destination
/// `host` matches; `${secret:NAME}` in `value` is vault secret `NAME`'s value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderRule {
    /// Which destinations (`HOST` or `HOST:PORT`, as the policy's rules).
    pub host: String,
    /// The header's name.
    pub name: String,
    /// Its value.
    pub value: String,
}

/// A secret bound to a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretBinding {
    /// The secret's name (and the environment variable's).
    pub name: String,
    /// What the sandbox sees instead of the value.
    pub placeholder: String,
}

/// Where a fork came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkedFrom {
    /// The parent.
    pub sandbox: String,
    /// The parent's snapshot the fork started from.
    pub snapshot: String,
}

/// The snapshot a suspended sandbox restores from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestorePoint {
    /// The snapshot.
    pub snapshot: String,
    /// `local`, `remote`, `local+remote` or `lost`.
    pub location: String,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxList {
    /// Newest first.
    pub sandboxes: Vec<Sandbox>,
}

/// A snapshot of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its id.
    pub id: String,
    /// `disk` or `full`.
    pub kind: String,
    /// `request`, `suspend`, `fork`, `pre_rollback` or `rolling`.
    pub reason: String,
    /// When it was taken.
    pub created_unix_ms: u64,
    /// Apparent size of its files.
    pub size_bytes: u64,
    /// How long the guest was stopped for it, in microseconds.
    pub paused_for_us: u64,
    /// Whether its files are on the node's disk.
    pub local: bool,
    /// Its copy in the object store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<RemoteCopy>,
}

/// A snapshot's copy in the object store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteCopy {
    /// BLAKE3 of the manifest object.
    pub manifest_hash: String,
    /// When the upload finished.
    pub uploaded_unix_ms: u64,
    /// Bytes the upload wrote.
    pub uploaded_bytes: u64,
    /// Chunks the upload added.
    pub new_chunks: u64,
    /// Bytes of every chunk the manifest references.
    pub stored_bytes: u64,
}

/// `GET /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotList {
    /// Oldest first.
    pub snapshots: Vec<Snapshot>,
}

/// A port made reachable at a URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortExposed {
    /// The port in the sandbox.
    pub port: u16,
    /// The URL, shown only this once.
    pub url: String,
    /// When.
    pub created_unix_ms: u64,
}

/// The URLs of a sandbox's browser (`POST /v1/sandboxes/{id}/browser`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrowserSession {
    /// The DevTools WebSocket, a token in its query.
    pub cdp_url: String,
    /// The live view (noVNC), a token in its path; `None` for a headless browser.
    pub live_url: Option<String>,
    /// Whether the browser runs on the desktop's display.
    pub headful: bool,
    /// When the tokens of both URLs expire, ms since the epoch.
    pub expires_unix_ms: u64,
}

/// A template build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// Its name.
    pub name: String,
    /// Its version.
    pub version: String,
    /// Default virtual CPUs.
    pub vcpus: u32,
    /// Default memory.
    pub memory_mib: u64,
    /// Size of its image.
    pub image_mib: u64,
    /// The image file.
    pub image: String,
    /// When it was built.
    pub created_unix_ms: u64,
    /// What it was built from.
    pub source: String,
    /// The tenant that owns it (`None`: shared).
    pub owner: Option<String>,
    /// Environment of every process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Who commands run as by default.
    #[serde(default)]
    pub user: Option<String>,
    /// Their default working directory.
    #[serde(default)]
    pub workdir: Option<String>,
    /// The image's command.
    #[serde(default)]
    pub command: Vec<String>,
    /// The ports the image exposes.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// The process its snapshot holds, started at build time.
    #[serde(default)]
    pub start: Option<TemplateStart>,
}

/// A template's start command and ready check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateStart {
    /// The shell line.
    pub command: String,
    /// `{"command": ...}`, `{"port": ...}` or `None`.
    pub ready: Option<ReadyCheck>,
}

/// When a template's start command is ready.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadyCheck {
    /// This shell line exits 0.
    Command(String),
    /// This port accepts a connection.
    Port(u16),
}

/// `GET /v1/templates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateList {
    /// Every version of every template the caller sees.
    pub templates: Vec<Template>,
}

/// The body of `POST /v1/sandboxes` as a client sends it (fields left out take the
/// template's or the server's defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSandbox {
    /// The template.
    pub template: String,
    /// Its version (`None`: the newest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Virtual CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// Disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_mib: Option<u64>,
    /// Environment of every process.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// Secrets of the tenant's vault to bind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// What its programs may reach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressPolicy>,
    /// Timeouts other than the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<TimeoutsUpdate>,
    /// Whether guest access wakes it (`None`: yes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<bool>,
    /// Volumes of the tenant to mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeMountSpec>,
}

/// Timeouts to set; those left out keep their value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeoutsUpdate {
    /// Idle time before `action`, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ms: Option<u64>,
    /// Age before `action`, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lifetime_ms: Option<u64>,
    /// `suspend` or `kill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

/// What a listing of sandboxes lets through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    /// Only this state (`None`: every state but `terminated`).
    pub state: Option<String>,
    /// Only this template.
    pub template: Option<String>,
    /// Only sandboxes with every one of these labels.
    pub metadata: Vec<(String, String)>,
}

impl SandboxFilter {
    /// The query string of `GET /v1/sandboxes` (empty, or starting with `?`).
    pub fn query(&self) -> String {
        let mut q: Vec<String> = Vec::new();
        if let Some(s) = &self.state {
            q.push(format!("state={}", crate::enc(s)));
        }
        if let Some(t) = &self.template {
            q.push(format!("template={}", crate::enc(t)));
        }
        for (k, v) in &self.metadata {
            q.push(format!("metadata.{}={}", crate::enc(k), crate::enc(v)));
        }
        if q.is_empty() {
            String::new()
        } else {
            format!("?{}", q.join("&"))
        }
    }
}

/// A change of a sandbox's lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// Stop its vCPUs, keeping its memory.
    Pause,
    /// Run a paused sandbox again.
    Resume,
    /// Snapshot it and stop its VM.
    Suspend,
    /// Start a suspended sandbox from its snapshot.
    Restore,
    /// End it for good.
    Kill,
}

impl Lifecycle {
    /// The operation's name in audit and metrics.
    pub fn operation(self) -> &'static str {
        match self {
            Lifecycle::Pause => "sandbox.pause",
            Lifecycle::Resume => "sandbox.resume",
            Lifecycle::Suspend => "sandbox.suspend",
            Lifecycle::Restore => "sandbox.restore",
            Lifecycle::Kill => "sandbox.kill",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_encode_their_values() {
        let f = SandboxFilter {
            state: Some("running".into()),
            template: None,
            metadata: vec![("team".into(), "a b".into())],
        };
        assert_eq!(f.query(), "?state=running&metadata.team=a%20b");
        assert_eq!(SandboxFilter::default().query(), "");
    }

    #[test]
    fn ready_checks_have_the_documented_form() {
        let s = TemplateStart {
            command: "serve".into(),
            ready: Some(ReadyCheck::Port(8000)),
        };
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"command": "serve", "ready": {"port": 8000}})
        );
    }
}

/// A volume: a tenant's file system that outlives sandboxes (`docs/volumes.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// Its id (`vol-` and 16 hex digits).
    pub id: String,
    /// Its name, unique in the tenant.
    pub name: String,
    /// Writes past it are refused.
    pub size_bytes: u64,
    /// Bytes in use (null when its node did not answer).
    pub used_bytes: Option<u64>,
    /// Every write acknowledged before this moment (ms since the Unix epoch) is in the
    /// volume's copy in the object store, and survives the loss of its node (null: no copy
    /// was made since its node started, or there is no object store).
    #[serde(default)]
    pub synced_unix_ms: Option<u64>,
    /// When it was made.
    pub created_unix_ms: u64,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeList {
    /// By name.
    pub volumes: Vec<Volume>,
}

/// A volume a create mounts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMountSpec {
    /// The tenant's volume.
    pub name: String,
    /// Where it appears in the guest (absolute; not `/`, `/proc`, `/sys`, `/dev`, `/run`).
    pub path: String,
    /// Whether the sandbox may only read it.
    #[serde(default)]
    pub read_only: bool,
}
