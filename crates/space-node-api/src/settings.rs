//! What a node of a cluster gets from the control plane rather than from its own disk
//! (`docs/cluster.md`): the object store and its credentials, the deployment's master key,
//! which tenants hold their own KMS key, how archiving is paced; and what its heartbeats carry
//! back (key events, the sandboxes that lack their secrets' values).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Everything a node of a cluster is configured with by the control plane.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSettings {
    /// The object store (`None`: the deployment archives nothing).
    pub store: Option<StoreSettings>,
    /// The deployment's master key, hex (32 bytes).
    pub master_key: Option<String>,
    /// The AWS credentials KMS calls are signed with.
    pub aws: Option<AwsCredentials>,
    /// The tenants whose keys a KMS key of their own wraps.
    pub tenant_kms: BTreeMap<String, KmsKey>,
    /// How often each running sandbox's newest full snapshot goes up, ms (`None`: only on
    /// suspend).
    pub upload_interval_ms: Option<u64>,
    /// Local copies of archived snapshots are evicted past this many bytes.
    pub cache_max_bytes: Option<u64>,
}

impl std::fmt::Debug for NodeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSettings")
            .field("store", &self.store.as_ref().map(|s| &s.url))
            .field("master_key", &self.master_key.as_ref().map(|_| "<secret>"))
            .field("tenant_kms", &self.tenant_kms.keys().collect::<Vec<_>>())
            .field("upload_interval_ms", &self.upload_interval_ms)
            .finish_non_exhaustive()
    }
}

impl NodeSettings {
    /// A digest that changes whenever anything in them does (heartbeats carry it, so the
    /// control plane knows when to send them again). Not a secret's hash an attacker could
    /// use: it is keyed with the master key.
    pub fn digest(&self) -> String {
        let key = blake3::derive_key(
            "space node settings digest v1",
            self.master_key.as_deref().unwrap_or("").as_bytes(),
        );
        let bytes = serde_json::to_vec(self).expect("settings serialize");
        blake3::keyed_hash(&key, &bytes).to_hex()[..32].to_owned()
    }
}

/// The object store, as the control plane names it.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreSettings {
    /// `s3://bucket/prefix` or a directory every node sees (`file:///shared/objects`).
    pub url: String,
    /// S3 endpoint of a self-hosted server.
    pub endpoint: Option<String>,
    /// S3 region.
    pub region: Option<String>,
    /// S3 access key id.
    pub access_key_id: Option<String>,
    /// S3 secret key.
    pub secret_access_key: Option<String>,
}

/// AWS credentials.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwsCredentials {
    /// Access key id.
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: String,
    /// Session token of temporary credentials.
    pub session_token: Option<String>,
}

/// A tenant's KMS key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KmsKey {
    /// Key id, ARN or alias.
    pub key_id: String,
    /// Its region.
    pub region: String,
    /// Endpoint of a compatible service.
    pub endpoint: Option<String>,
}

/// A key event as a heartbeat carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEventReport {
    /// The tenant.
    pub tenant: String,
    /// The lineage, if any.
    pub lineage: Option<String>,
    /// The master key's id.
    pub master: String,
    /// `unwrap`, `generate`, `rotate`, `shred`.
    pub operation: String,
    /// Whether it worked.
    pub ok: bool,
    /// The error, when not.
    pub detail: Option<String>,
}

/// Secret values as a call carries them: base64, and never shown by `Debug`.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretMap(pub BTreeMap<String, String>);

impl std::fmt::Debug for SecretMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// A sandbox that lacks the values of the secrets it is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretsWanted {
    /// The sandbox.
    pub id: crate::ids::SandboxId,
    /// The names it is bound to.
    pub names: Vec<String>,
}
