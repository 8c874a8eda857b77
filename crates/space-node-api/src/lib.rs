//! The contract between space's control plane and its nodes, and nothing else.
//!
//! - [`calls`]: every call of the node API, listed once; from the list come the [`NodeApi`]
//!   trait, the [`Call`] enum of the wire, [`calls::dispatch`], the [`RemoteNode`] client and
//!   [`Gated`] (a node API behind a check, such as a fenced node's);
//! - [`wire`]: what calls answer ([`Sandbox`], [`Snapshot`], [`TemplateInfo`], ...) and the
//!   [`Fault`] they fail with;
//! - [`ids`], [`sandbox`], [`template`], [`policy`], [`headers`], [`secrets`], [`settings`]: the
//!   vocabulary calls take;
//! - [`remote`], [`serve`], [`tls`]: the network API (HTTP/2 over mutual TLS from the cluster
//!   CA), a control replica's client and a node's server;
//! - [`cluster`]: what a node sends to join and heartbeat, and what it is answered.
//!
//! A control replica links this crate and not the node's: no QEMU, gateway or storage code.
//! `docs/cluster.md` describes the layout.

pub mod calls;
pub mod cluster;
pub mod headers;
pub mod ids;
pub mod policy;
pub mod remote;
pub mod sandbox;
pub mod secrets;
pub mod serve;
pub mod settings;
pub mod template;
pub mod tls;
pub mod totp;
pub mod wire;

pub use calls::{Call, Gate, Gated, NodeApi, NodeResult};
pub use headers::HeaderRule;
pub use ids::{
    IdError, SandboxId, SnapshotId, TemplateName, TemplateRef, TemplateVersion, VersionReq,
};
pub use policy::{EgressDefault, EgressPolicy, EgressRule};
pub use remote::RemoteNode;
pub use sandbox::{
    CreateRequest, SandboxOptions, SnapshotKind, SnapshotReason, State, TimeoutAction,
    TimeoutPolicy, VolumeMount,
};
pub use secrets::SecretBinding;
pub use serve::NodeServer;
pub use settings::{NodeSettings, SecretMap};
pub use space_api::MetricSample;
pub use template::{
    BuildInput, Credentials, LogChunk, ReadyCheck, StartSpec, TemplateBuild, TemplateSource,
};
pub use tls::{ClusterCa, Identity, Leaf, NodeKey, TlsError};
pub use wire::{
    Blob, Fault, FaultCode, NodeReport, NodeStatus, Pool, Sandbox, Snapshot, TemplateInfo, Usage,
    VolumeAnswer, VolumeInfo, Woke,
};
