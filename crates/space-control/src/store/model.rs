//! What the store holds, as its callers see it.

use super::*;

/// Longest key label, in characters.
pub const MAX_LABEL_CHARS: usize = 200;
/// Longest audit `detail`, in bytes; longer details are cut on a character boundary.
pub const MAX_DETAIL_BYTES: usize = 4096;
/// Longest short audit field (`operation`, `result`, `sandbox`, `key_id`), in bytes.
pub const MAX_AUDIT_FIELD_BYTES: usize = 128;
/// Longest sandbox id the ownership table accepts, in bytes.
pub const MAX_SANDBOX_ID_BYTES: usize = 64;
/// Most audit events one query returns.
pub const MAX_AUDIT_LIMIT: u32 = 1000;
/// Audit events a query returns when the caller does not say.
pub const DEFAULT_AUDIT_LIMIT: u32 = 100;

/// A failure of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The thing exists already (a tenant name, a sandbox id).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The named thing does not exist.
    #[error("no {what} {id}")]
    NotFound {
        /// What kind of thing: `tenant`, `key`, `sandbox`.
        what: &'static str,
        /// The id that was looked up.
        id: String,
    },
    /// Revoking this key would leave the deployment without an admin key.
    #[error(
        "key {0} is the last admin key that is not revoked; create another admin key first \
         (or mint one on the host with `space admin-key`)"
    )]
    LastAdmin(String),
    /// The input is malformed or out of range; the message says which part.
    #[error("invalid: {0}")]
    Invalid(String),
    /// The credentials vault could not encrypt or decrypt (a wrong vault key, a damaged
    /// row); the message says which secret and what to check.
    #[error("vault: {0}")]
    Vault(String),
    /// SQLite failed.
    #[error("state database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL failed or could not be reached.
    #[error("state database: {0}")]
    Postgres(#[from] postgres::Error),
    /// The database answered something this build does not expect, or could not be used
    /// (no free connection, a failed worker); the message says what.
    #[error("state database: {0}")]
    Database(String),
    /// The database file or its directory could not be prepared.
    #[error("state database file: {0}")]
    Io(#[from] std::io::Error),
}

/// A tenant name: `[a-z0-9][a-z0-9-]{0,39}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenantName(String);

impl TenantName {
    /// The longest tenant name, in characters.
    pub const MAX_LEN: usize = 40;

    /// Whether `s` is a well-formed tenant name.
    pub fn is_valid(s: &str) -> bool {
        let b = s.as_bytes();
        !b.is_empty()
            && b.len() <= Self::MAX_LEN
            && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
            && b[1..]
                .iter()
                .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for TenantName {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if Self::is_valid(s) {
            Ok(Self(s.to_owned()))
        } else {
            Err(StoreError::Invalid(format!(
                "tenant name {:?} must match [a-z0-9][a-z0-9-]{{0,39}}",
                truncate(s, 64)
            )))
        }
    }
}

impl TryFrom<String> for TenantName {
    type Error = StoreError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        if Self::is_valid(&s) {
            Ok(Self(s))
        } else {
            s.parse()
        }
    }
}

impl From<TenantName> for String {
    fn from(t: TenantName) -> String {
        t.0
    }
}

impl AsRef<str> for TenantName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A tenant's limits (see docs/api.md, *Tenants and keys*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quotas {
    /// Sandboxes that are not terminated.
    pub max_sandboxes: u32,
    /// vCPUs of the sandboxes that have a VM.
    pub max_vcpus: u32,
    /// Memory of the sandboxes that have a VM, in MiB.
    pub max_memory_mib: u64,
    /// How long a sandbox may stay suspended before it is killed, in ms; `None`: forever.
    #[serde(default)]
    pub max_suspended_ms: Option<u64>,
    /// The sizes of the tenant's volumes together, in MiB.
    #[serde(default = "default_volume_mib")]
    pub max_volume_mib: u64,
}

fn default_volume_mib() -> u64 {
    DEFAULT_MAX_VOLUME_MIB
}

/// [`Quotas::max_volume_mib`] by default: 100 GiB.
pub const DEFAULT_MAX_VOLUME_MIB: u64 = 102_400;

impl Default for Quotas {
    fn default() -> Self {
        Self {
            max_sandboxes: 100,
            max_vcpus: 64,
            max_memory_mib: 65536,
            max_suspended_ms: None,
            max_volume_mib: DEFAULT_MAX_VOLUME_MIB,
        }
    }
}

impl Quotas {
    pub(super) fn validate(&self) -> Result<(), StoreError> {
        if i64::try_from(self.max_volume_mib).is_err() {
            return Err(StoreError::Invalid(format!(
                "quotas.max_volume_mib {} is out of range (at most {})",
                self.max_volume_mib,
                i64::MAX
            )));
        }
        if i64::try_from(self.max_memory_mib).is_err() {
            return Err(StoreError::Invalid(format!(
                "quotas.max_memory_mib {} is out of range (at most {})",
                self.max_memory_mib,
                i64::MAX
            )));
        }
        Ok(())
    }
}

/// A tenant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// Its name.
    pub name: TenantName,
    /// When it was created.
    pub created_unix_ms: u64,
    /// Its limits.
    pub quotas: Quotas,
}

/// An API key as listed: everything but the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    /// The key id (`k` plus 15 lowercase alphanumerics).
    pub id: String,
    /// The tenant the key acts for.
    pub tenant: TenantName,
    /// Whether the key may manage tenants, keys and templates.
    pub admin: bool,
    /// A note from whoever made the key.
    pub label: Option<String>,
    /// When the key was made.
    pub created_unix_ms: u64,
    /// When the key was revoked, if it was.
    pub revoked_unix_ms: Option<u64>,
}

/// A new key: its listing plus the whole key, shown this once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyCreated {
    /// What listings show.
    #[serde(flatten)]
    pub info: KeyInfo,
    /// The whole key, `space_<key id>_<secret>`.
    pub key: String,
}

/// Who is calling: the result of a successful [`Store::authenticate`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// The tenant every call is scoped to.
    pub tenant: TenantName,
    /// The key that authenticated.
    pub key_id: String,
    /// Whether the key is an admin key.
    pub admin: bool,
}

/// Why a request is not authenticated.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// There is no `Authorization` header.
    #[error("no API key: send Authorization: Bearer <key>")]
    Missing,
    /// The header is not `Bearer <key>` with a well-formed key.
    #[error("malformed Authorization header: expected Bearer space_<key id>_<secret>")]
    Malformed,
    /// No key has this id, or the secret is wrong.
    #[error("unknown API key {key_id}")]
    Unknown {
        /// The id named by the presented key.
        key_id: String,
    },
    /// The key was right but has been revoked.
    #[error("API key {key_id} has been revoked")]
    Revoked {
        /// The revoked key.
        key_id: String,
        /// Its tenant.
        tenant: TenantName,
    },
    /// The store failed while checking the key.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AuthError {
    /// The key id the failed request named, when it named one; for the audit event.
    pub fn key_id(&self) -> Option<&str> {
        match self {
            AuthError::Unknown { key_id } | AuthError::Revoked { key_id, .. } => Some(key_id),
            _ => None,
        }
    }

    /// The tenant the failed request is known to belong to, for the audit event. Only a
    /// revoked key with the right secret names one: a wrong secret proves nothing about who
    /// is calling.
    pub fn tenant(&self) -> Option<&TenantName> {
        match self {
            AuthError::Revoked { tenant, .. } => Some(tenant),
            _ => None,
        }
    }
}

/// An audit event to record; the store adds the id and the time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewAuditEvent {
    /// The tenant acted for, when known.
    pub tenant: Option<TenantName>,
    /// The key used, when known.
    pub key_id: Option<String>,
    /// The sandbox acted on, if any.
    pub sandbox: Option<String>,
    /// The operation name (`sandbox.create`, `auth`, ...).
    pub operation: String,
    /// `ok` or the error code.
    pub result: String,
    /// Free text for people, at most [`MAX_DETAIL_BYTES`].
    pub detail: Option<String>,
}

/// A recorded audit event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEvent {
    /// Increasing id; newer events have larger ids.
    pub id: i64,
    /// When it was recorded.
    pub at_unix_ms: u64,
    /// The tenant acted for, when known.
    pub tenant: Option<TenantName>,
    /// The key used, when known.
    pub key_id: Option<String>,
    /// The sandbox acted on, if any.
    pub sandbox: Option<String>,
    /// The operation name.
    pub operation: String,
    /// `ok` or the error code.
    pub result: String,
    /// Free text for people.
    pub detail: Option<String>,
}

/// Which audit events to return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only this tenant's events; `None` returns every event, including those with no
    /// tenant (for admin keys).
    pub tenant: Option<TenantName>,
    /// Only events about this sandbox.
    pub sandbox: Option<String>,
    /// Only events of this operation.
    pub operation: Option<String>,
    /// Only events at or after this time.
    pub since_unix_ms: Option<u64>,
    /// At most this many events, clamped to `1..=1000`.
    pub limit: u32,
}

impl Default for AuditFilter {
    fn default() -> Self {
        Self {
            tenant: None,
            sandbox: None,
            operation: None,
            since_unix_ms: None,
            limit: DEFAULT_AUDIT_LIMIT,
        }
    }
}

/// A secret as the vault keeps it: the ciphertext, never the value.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretRow {
    /// Its tenant.
    pub tenant: TenantName,
    /// Its name (`[A-Z_][A-Z0-9_]{0,63}`).
    pub name: String,
    /// The host patterns it may be sent to, in rule syntax.
    pub hosts: Vec<String>,
    /// The AES-GCM nonce (12 bytes).
    pub nonce: Vec<u8>,
    /// The AES-256-GCM ciphertext with its tag.
    pub ciphertext: Vec<u8>,
    /// When it was first set.
    pub created_unix_ms: u64,
    /// When its value or hosts last changed.
    pub updated_unix_ms: u64,
    /// What it holds.
    pub kind: space_node_api::secrets::SecretKind,
}

impl fmt::Debug for SecretRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretRow")
            .field("tenant", &self.tenant)
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// A secret as listed: everything but the value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    /// Its name.
    pub name: String,
    /// What it holds: `value` or `totp`.
    pub kind: space_node_api::secrets::SecretKind,
    /// The host patterns it may be sent to.
    pub hosts: Vec<String>,
    /// When it was first set.
    pub created_unix_ms: u64,
    /// When its value or hosts last changed.
    pub updated_unix_ms: u64,
}

impl From<&SecretRow> for SecretInfo {
    fn from(r: &SecretRow) -> Self {
        SecretInfo {
            name: r.name.clone(),
            kind: r.kind,
            hosts: r.hosts.clone(),
            created_unix_ms: r.created_unix_ms,
            updated_unix_ms: r.updated_unix_ms,
        }
    }
}

/// An exposed port of a sandbox (the token is never stored, only its SHA-256).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortInfo {
    /// The sandbox.
    pub sandbox: String,
    /// The port inside the sandbox.
    pub port: u16,
    /// When it was exposed (or its URL last replaced).
    pub created_unix_ms: u64,
}
