//! Node services: everything one host does for the sandboxes it runs.
//!
//! - [`storage`]: the data directory and its copy-on-write drivers (btrfs, reflink, copy).
//! - [`ids`]: typed, path-safe identifiers.
//! - [`template`]: template builds (root image + snapshot of a booted, ready VM).
//! - [`record`]: the persisted per-sandbox record.
//! - [`sandbox`]: the per-sandbox state driver and its request enum.
//! - [`node`]: the [`Node`] API over all of it, and the timeout reconciler.
//! - [`pool`]: warm pools (VMs restored, warmed and paused ahead of creates).
//! - [`scheduler`]: rolling snapshots and retention, around [`retention`].
//! - [`recovery`]: crash recovery (adoption, restores, cut-short transitions, orphans).
//! - [`admission`]: the memory, vCPU and sandbox-count limits a create must fit in.
//! - [`archive`]: snapshots to and from the object store, and sandboxes found there.
//! - [`audit_spool`]: a cluster node's gateway events on disk until the control plane has them.
//!
//! The egress gateway (policy, SNI check, limits, TLS interception, credentials) is
//! [`space_gateway`]: the node opens one and runs its loop for every sandbox's VM.
//!
//! `docs/lifecycle.md` describes the state machine, the on-disk layout and the choices made.

pub mod admission;
pub mod api;
pub mod archive;
pub mod audit_spool;
pub mod build;
pub mod error;
pub mod fence;
pub use space_node_api::ids;
pub mod member;
pub mod metrics;
pub mod node;
pub mod pool;
pub mod record;
pub mod recovery;
pub mod retention;
pub mod sandbox;
pub mod scheduler;
pub mod settings;
pub mod storage;
pub mod teardown;
pub mod template;
pub(crate) mod volumes;

pub use admission::AdmissionConfig;
pub use api::{Fault, FaultCode, LocalNode, NodeApi, NodeResult};
pub use archive::{
    ArchiveConfig, ArchiveReport, RestoreMode, RestoreReport, DEFAULT_VOLUME_COPY_INTERVAL,
};
pub use build::{BuildInput, BuildLog, Credentials, LogChunk, TemplateSource};
pub use error::{NodeError, Result};
pub use ids::{SandboxId, SnapshotId, TemplateName, TemplateRef, TemplateVersion, VersionReq};
pub use node::{Node, NodeConfig, SandboxUsage, Wake, DEFAULT_MAX_DISK_MIB, DEFAULT_METRICS_TICK};
pub use pool::{PoolConfig, PoolStats};
pub use record::{
    Origin, RecoveryAction, RecoveryEvent, RemoteCopy, SandboxOptions, SandboxRecord, SnapshotKind,
    SnapshotReason, SnapshotRecord, State, TimeoutAction, TimeoutPolicy,
};
pub use recovery::RecoveryReport;
pub use sandbox::{CreateRequest, SandboxInfo, TimeoutKind};
pub use scheduler::{RollingConfig, RollingReport};
pub use space_gateway::{
    EgressAudit, EgressDefault, EgressEvent, EgressPolicy, EgressRule, GatewayConfig,
    SecretBinding, SecretSource, SecretValue,
};
pub use space_node_api::VolumeMount;
pub use template::{
    GuestDefaults, ReadyCheck, StartSpec, Template, TemplateManifest, TemplateSpec,
};
