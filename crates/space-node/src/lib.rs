//! Node services: everything one host does for the sandboxes it runs.
//!
//! - [`storage`]: the data directory and its copy-on-write drivers (btrfs, reflink, copy).
//! - [`ids`]: typed, path-safe identifiers.
//! - [`template`]: template builds (root image + snapshot of a booted, ready VM).
//! - [`record`]: the persisted per-sandbox record.
//! - [`sandbox`]: the per-sandbox state driver and its request enum.
//! - [`node`]: the [`Node`] API over all of it, and the timeout reconciler.
//!
//! `docs/lifecycle.md` describes the state machine, the on-disk layout and the choices made.

pub mod error;
pub mod ids;
pub mod node;
pub mod record;
pub mod retention;
pub mod sandbox;
pub mod storage;
pub mod template;

pub use error::{NodeError, Result};
pub use ids::{SandboxId, SnapshotId, TemplateName, TemplateRef, TemplateVersion, VersionReq};
pub use node::{Node, NodeConfig};
pub use record::{
    Origin, SandboxOptions, SandboxRecord, SnapshotKind, SnapshotReason, SnapshotRecord, State,
    TimeoutAction, TimeoutPolicy,
};
pub use sandbox::{CreateRequest, SandboxInfo, TimeoutKind};
pub use template::{Template, TemplateManifest, TemplateSpec};
