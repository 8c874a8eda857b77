//! What a node of a cluster sends the control plane (`space node --control URL`) and what it
//! is answered: joining with a one-time token, rejoining as a new incarnation, heartbeats that
//! renew its lease, and claims of work one node must do once. These go over the public API's
//! HTTPS, not the node API (the node has no certificate before it joins).

use serde::{Deserialize, Serialize};

use crate::secrets::EgressRecord;
use crate::wire::NodeReport;

/// Where a node joins.
pub const JOIN_PATH: &str = "/v1/cluster/join";
/// Where a member that restarted or was lost comes back.
pub const REJOIN_PATH: &str = "/v1/cluster/rejoin";
/// Where a member renews its lease.
pub const HEARTBEAT_PATH: &str = "/v1/cluster/heartbeat";
/// Where a member claims work.
pub const CLAIM_PATH: &str = "/v1/cluster/claim";
/// Where a member delivers its gateway's audit events.
pub const AUDIT_PATH: &str = "/v1/cluster/audit";
/// The most events one delivery carries.
pub const MAX_AUDIT_BATCH: usize = 500;

/// `POST /v1/cluster/join`: a node with a join token asks to become a member.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Join {
    /// The one-time token (`space node token`).
    pub token: String,
    /// The node's id, a DNS label.
    pub node_id: String,
    /// Where control replicas reach its node API (`host:port`).
    pub address: String,
    /// Its public key: an uncompressed P-256 point, base64.
    pub public_key: String,
    /// What it is and holds.
    #[serde(default)]
    pub report: serde_json::Value,
}

/// `POST /v1/cluster/rejoin`: a member comes back with its secret as a new incarnation.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rejoin {
    /// The node's id.
    pub node_id: String,
    /// The secret its membership was granted with.
    pub secret: String,
    /// Where control replicas reach its node API.
    pub address: String,
    /// Its new public key.
    pub public_key: String,
    /// What it is and holds.
    #[serde(default)]
    pub report: serde_json::Value,
}

/// The answer of a join or rejoin.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Membership {
    /// The node's id.
    pub node_id: String,
    /// Its incarnation: every heartbeat names it.
    pub incarnation: i64,
    /// Its leaf of the cluster CA, over the public key it sent.
    pub cert_pem: String,
    /// The leaf's end of validity, Unix seconds.
    pub not_after_unix: u64,
    /// The cluster CA.
    pub ca_pem: String,
    /// The secret of its heartbeats and rejoins.
    pub secret: String,
    /// How long a lease lasts, ms.
    pub lease_ms: u64,
    /// How often it heartbeats, ms.
    pub heartbeat_ms: u64,
}

/// `POST /v1/cluster/heartbeat`: renews the lease and reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// The node's id.
    pub node_id: String,
    /// The incarnation it was granted.
    pub incarnation: i64,
    /// Its secret.
    pub secret: String,
    /// What it is and holds ([`NodeReport`]; `null` when it could not make one).
    #[serde(default)]
    pub report: serde_json::Value,
}

/// The answer of a heartbeat.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    /// How long the renewed lease lasts, ms.
    pub lease_ms: u64,
    /// The node's state in the cluster (`active`, `draining`, ...).
    pub state: String,
    /// Sandboxes the node holds that the database gives to another node: the node discards
    /// them.
    #[serde(default)]
    pub foreign: Vec<String>,
}

/// `POST /v1/cluster/claim`: a member claims (or gives up) work one node does once.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// The node's id.
    pub node_id: String,
    /// Its incarnation.
    pub incarnation: i64,
    /// Its secret.
    pub secret: String,
    /// What is claimed: `template:<name>@<version>`.
    pub name: String,
    /// How long the claim holds, ms (default and most: 30 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<u64>,
    /// Gives the claim up.
    #[serde(default)]
    pub release: bool,
}

/// The answer of a claim.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClaimAnswer {
    /// Whether the node holds the claim now.
    pub held: bool,
}

/// `POST /v1/cluster/audit`: a member delivers its gateway's audit events, oldest first.
/// Delivery is at least once: a batch whose answer was lost is sent again.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditBatch {
    /// The node's id.
    pub node_id: String,
    /// Its incarnation.
    pub incarnation: i64,
    /// Its secret.
    pub secret: String,
    /// At most [`MAX_AUDIT_BATCH`] events.
    pub events: Vec<EgressRecord>,
}

/// The answer of an audit delivery.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditAnswer {
    /// How many events went into the audit log (all of them).
    pub recorded: u64,
}

/// A report as a join or heartbeat carries it.
pub fn report_json(report: &NodeReport) -> serde_json::Value {
    serde_json::to_value(report).unwrap_or(serde_json::Value::Null)
}
