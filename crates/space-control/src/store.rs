//! The control plane's state: tenants, API keys, sandbox ownership and the audit log, kept in
//! one SQLite database.
//!
//! Every method is synchronous and short (a few indexed statements), so async callers may call
//! them directly. The connection sits behind a mutex; SQLite runs in WAL mode with
//! `synchronous=NORMAL`, so a committed change survives a crash of the process (and at worst
//! the last few transactions are lost on a power failure).
//!
//! The schema is versioned with `PRAGMA user_version`. Opening a database applies the missing
//! migrations in one transaction; a database written by a newer build is refused.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Row, TransactionBehavior};
use serde::{Deserialize, Serialize};

use crate::keys;

/// Schema migrations; entry `i` takes the database from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE tenants (
    name            TEXT PRIMARY KEY NOT NULL,
    created_unix_ms INTEGER NOT NULL,
    max_sandboxes   INTEGER NOT NULL,
    max_vcpus       INTEGER NOT NULL,
    max_memory_mib  INTEGER NOT NULL
) STRICT;
CREATE TABLE api_keys (
    id              TEXT PRIMARY KEY NOT NULL,
    tenant          TEXT NOT NULL REFERENCES tenants(name),
    admin           INTEGER NOT NULL,
    label           TEXT,
    hash            TEXT NOT NULL,
    created_unix_ms INTEGER NOT NULL,
    revoked_unix_ms INTEGER
) STRICT;
CREATE INDEX api_keys_tenant ON api_keys(tenant);
CREATE TABLE sandboxes (
    id              TEXT PRIMARY KEY NOT NULL,
    tenant          TEXT NOT NULL REFERENCES tenants(name),
    created_unix_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX sandboxes_tenant ON sandboxes(tenant);
CREATE TABLE audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    at_unix_ms INTEGER NOT NULL,
    tenant     TEXT,
    key_id     TEXT,
    sandbox    TEXT,
    operation  TEXT NOT NULL,
    result     TEXT NOT NULL,
    detail     TEXT
) STRICT;
CREATE INDEX audit_tenant ON audit(tenant, id);
CREATE INDEX audit_sandbox ON audit(sandbox, id);
"#,
    r#"
CREATE TABLE secrets (
    tenant          TEXT NOT NULL REFERENCES tenants(name),
    name            TEXT NOT NULL,
    hosts           TEXT NOT NULL,
    nonce           BLOB NOT NULL,
    ciphertext      BLOB NOT NULL,
    created_unix_ms INTEGER NOT NULL,
    updated_unix_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
) STRICT;
CREATE TABLE ports (
    sandbox         TEXT NOT NULL REFERENCES sandboxes(id),
    port            INTEGER NOT NULL,
    token_hash      TEXT NOT NULL UNIQUE,
    created_unix_ms INTEGER NOT NULL,
    PRIMARY KEY (sandbox, port)
) STRICT;
CREATE TABLE meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value BLOB NOT NULL
) STRICT;
"#,
    r#"
CREATE TABLE tenant_master_keys (
    tenant          TEXT PRIMARY KEY NOT NULL REFERENCES tenants(name),
    provider        TEXT NOT NULL,
    key_id          TEXT NOT NULL,
    region          TEXT NOT NULL,
    endpoint        TEXT,
    updated_unix_ms INTEGER NOT NULL
) STRICT;
"#,
    r#"
ALTER TABLE tenants ADD COLUMN max_suspended_ms INTEGER;
"#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

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

/// How long a statement waits for a lock held by another connection.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

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
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            max_sandboxes: 100,
            max_vcpus: 64,
            max_memory_mib: 65536,
            max_suspended_ms: None,
        }
    }
}

impl Quotas {
    fn validate(&self) -> Result<(), StoreError> {
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

/// The state store.
pub struct Store {
    conn: Mutex<Connection>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Converts a time for storage; times past year 292 million saturate.
fn to_db(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn from_db(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn bounded(s: String, max: usize) -> String {
    if s.len() <= max {
        s
    } else {
        truncate(&s, max).to_owned()
    }
}

fn validate_key_id(id: &str) -> Result<(), StoreError> {
    if keys::is_key_id(id) {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "key id {:?} must be k plus 15 characters from [a-z0-9]",
            truncate(id, 64)
        )))
    }
}

fn validate_sandbox_id(id: &str) -> Result<(), StoreError> {
    let ok = !id.is_empty()
        && id.len() <= MAX_SANDBOX_ID_BYTES
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "sandbox id {:?} must be 1 to {MAX_SANDBOX_ID_BYTES} characters from [A-Za-z0-9_-]",
            truncate(id, 80)
        )))
    }
}

fn validate_label(label: &str) -> Result<(), StoreError> {
    if label.chars().count() > MAX_LABEL_CHARS {
        return Err(StoreError::Invalid(format!(
            "label is longer than {MAX_LABEL_CHARS} characters"
        )));
    }
    if label.chars().any(char::is_control) {
        return Err(StoreError::Invalid(
            "label must not contain control characters".into(),
        ));
    }
    Ok(())
}

fn tenant_from_db(name: String) -> rusqlite::Result<TenantName> {
    TenantName::try_from(name).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn tenant_row(row: &Row<'_>) -> rusqlite::Result<Tenant> {
    Ok(Tenant {
        name: tenant_from_db(row.get(0)?)?,
        created_unix_ms: from_db(row.get(1)?),
        quotas: Quotas {
            max_sandboxes: u32::try_from(row.get::<_, i64>(2)?).unwrap_or(0),
            max_vcpus: u32::try_from(row.get::<_, i64>(3)?).unwrap_or(0),
            max_memory_mib: from_db(row.get(4)?),
            max_suspended_ms: row.get::<_, Option<i64>>(5)?.map(from_db),
        },
    })
}

const TENANT_COLUMNS: &str =
    "name, created_unix_ms, max_sandboxes, max_vcpus, max_memory_mib, max_suspended_ms";

fn key_row(row: &Row<'_>) -> rusqlite::Result<KeyInfo> {
    Ok(KeyInfo {
        id: row.get(0)?,
        tenant: tenant_from_db(row.get(1)?)?,
        admin: row.get(2)?,
        label: row.get(3)?,
        created_unix_ms: from_db(row.get(4)?),
        revoked_unix_ms: row.get::<_, Option<i64>>(5)?.map(from_db),
    })
}

const KEY_COLUMNS: &str = "id, tenant, admin, label, created_unix_ms, revoked_unix_ms";

fn audit_row(row: &Row<'_>) -> rusqlite::Result<AuditEvent> {
    Ok(AuditEvent {
        id: row.get(0)?,
        at_unix_ms: from_db(row.get(1)?),
        tenant: row
            .get::<_, Option<String>>(2)?
            .map(tenant_from_db)
            .transpose()?,
        key_id: row.get(3)?,
        sandbox: row.get(4)?,
        operation: row.get(5)?,
        result: row.get(6)?,
        detail: row.get(7)?,
    })
}

fn get_tenant(conn: &Connection, name: &TenantName) -> Result<Option<Tenant>, StoreError> {
    Ok(conn
        .query_row(
            &format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE name = ?1"),
            [name.as_str()],
            tenant_row,
        )
        .optional()?)
}

fn get_key(conn: &Connection, id: &str) -> Result<Option<KeyInfo>, StoreError> {
    Ok(conn
        .query_row(
            &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = ?1"),
            [id],
            key_row,
        )
        .optional()?)
}

fn insert_tenant(
    conn: &Connection,
    name: &TenantName,
    quotas: Quotas,
) -> Result<Tenant, StoreError> {
    quotas.validate()?;
    if get_tenant(conn, name)?.is_some() {
        return Err(StoreError::Conflict(format!(
            "tenant {name} exists already"
        )));
    }
    let tenant = Tenant {
        name: name.clone(),
        created_unix_ms: now_ms(),
        quotas,
    };
    conn.execute(
        "INSERT INTO tenants (name, created_unix_ms, max_sandboxes, max_vcpus, max_memory_mib,
                              max_suspended_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            name.as_str(),
            to_db(tenant.created_unix_ms),
            quotas.max_sandboxes,
            quotas.max_vcpus,
            to_db(quotas.max_memory_mib),
            quotas.max_suspended_ms.map(to_db),
        ],
    )?;
    Ok(tenant)
}

fn insert_key(
    conn: &Connection,
    tenant: &TenantName,
    admin: bool,
    label: Option<&str>,
) -> Result<KeyCreated, StoreError> {
    if let Some(label) = label {
        validate_label(label)?;
    }
    if get_tenant(conn, tenant)?.is_none() {
        return Err(StoreError::NotFound {
            what: "tenant",
            id: tenant.to_string(),
        });
    }
    let created_unix_ms = now_ms();
    // Key ids are 78 random bits; a collision is next to impossible, but a retry is cheap and
    // keeps a collision from surfacing as an error.
    for _ in 0..4 {
        let (id, key) = keys::generate();
        let inserted = conn.execute(
            "INSERT OR IGNORE INTO api_keys (id, tenant, admin, label, hash, created_unix_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                id,
                tenant.as_str(),
                admin,
                label,
                keys::hash(&key),
                to_db(created_unix_ms)
            ],
        )?;
        if inserted == 1 {
            return Ok(KeyCreated {
                info: KeyInfo {
                    id,
                    tenant: tenant.clone(),
                    admin,
                    label: label.map(str::to_owned),
                    created_unix_ms,
                    revoked_unix_ms: None,
                },
                key,
            });
        }
    }
    Err(StoreError::Conflict(
        "could not find an unused key id".into(),
    ))
}

/// Brings the schema to [`SCHEMA_VERSION`] in one transaction, or refuses a newer one.
fn migrate(conn: &mut Connection, what: &str) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let version: i64 = tx.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let version = u32::try_from(version).unwrap_or(u32::MAX);
    if version > SCHEMA_VERSION {
        return Err(StoreError::Invalid(format!(
            "state database {what} has schema version {version}, newer than the version {SCHEMA_VERSION} \
             this build of space understands; run a newer space or restore an older database"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", i as u32 + 1)?;
    }
    tx.commit()?;
    Ok(())
}

fn configure(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // `journal_mode` answers with the mode in effect (an in-memory database stays "memory").
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    Ok(())
}

impl Store {
    /// Opens (creating if needed) the database at `path`, creating its parent directories.
    /// The file is readable by its owner only (mode 0600); SQLite gives its WAL and shared
    /// memory files the same mode.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() {
                fs::create_dir_all(parent)?;
            }
        }
        // Create the file with the right mode before SQLite does, and tighten an existing one.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?;
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
        drop(file);
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        migrate(&mut conn, &path.display().to_string())?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    /// Opens a private database in memory (for tests).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let mut conn = Connection::open_in_memory()?;
        configure(&conn)?;
        migrate(&mut conn, "in memory")?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    pub(crate) fn conn(&self) -> MutexGuard<'_, Connection> {
        // A panic while the lock was held cannot leave SQLite inconsistent: an unfinished
        // transaction is rolled back when it is dropped.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` in an immediate transaction and commits when it succeeds.
    pub(crate) fn write<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        Ok(out)
    }

    // ---- tenants ----

    /// Creates a tenant; `Conflict` if the name is taken.
    pub fn create_tenant(&self, name: &TenantName, quotas: Quotas) -> Result<Tenant, StoreError> {
        self.write(|c| insert_tenant(c, name, quotas))
    }

    /// Creates a tenant and its first key in one transaction, so a failure leaves neither;
    /// `Conflict` if the name is taken, `Invalid` for a bad label.
    pub fn create_tenant_with_key(
        &self,
        name: &TenantName,
        quotas: Quotas,
        admin: bool,
        label: Option<&str>,
    ) -> Result<(Tenant, KeyCreated), StoreError> {
        self.write(|c| {
            let tenant = insert_tenant(c, name, quotas)?;
            let key = insert_key(c, name, admin, label)?;
            Ok((tenant, key))
        })
    }

    /// The tenant named `name`, if it exists.
    pub fn tenant(&self, name: &TenantName) -> Result<Option<Tenant>, StoreError> {
        get_tenant(&self.conn(), name)
    }

    /// Every tenant, by name.
    pub fn tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {TENANT_COLUMNS} FROM tenants ORDER BY name"
        ))?;
        let rows = stmt.query_map([], tenant_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Replaces a tenant's quotas; `NotFound` for an unknown tenant.
    pub fn set_quotas(&self, name: &TenantName, quotas: Quotas) -> Result<Tenant, StoreError> {
        quotas.validate()?;
        self.write(|c| {
            let n = c.execute(
                "UPDATE tenants SET max_sandboxes = ?2, max_vcpus = ?3, max_memory_mib = ?4,
                   max_suspended_ms = ?5
                 WHERE name = ?1",
                params![
                    name.as_str(),
                    quotas.max_sandboxes,
                    quotas.max_vcpus,
                    to_db(quotas.max_memory_mib),
                    quotas.max_suspended_ms.map(to_db)
                ],
            )?;
            if n == 0 {
                return Err(StoreError::NotFound {
                    what: "tenant",
                    id: name.to_string(),
                });
            }
            get_tenant(c, name)?.ok_or_else(|| StoreError::NotFound {
                what: "tenant",
                id: name.to_string(),
            })
        })
    }

    // ---- keys ----

    /// Makes a key for `tenant`; `NotFound` for an unknown tenant, `Invalid` for a label
    /// over [`MAX_LABEL_CHARS`] characters or with control characters. Only the hash of the
    /// key is stored.
    pub fn create_key(
        &self,
        tenant: &TenantName,
        admin: bool,
        label: Option<&str>,
    ) -> Result<KeyCreated, StoreError> {
        self.write(|c| insert_key(c, tenant, admin, label))
    }

    /// The keys of `tenant`, oldest first, revoked ones included.
    pub fn keys(&self, tenant: &TenantName) -> Result<Vec<KeyInfo>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {KEY_COLUMNS} FROM api_keys WHERE tenant = ?1 ORDER BY created_unix_ms, id"
        ))?;
        let rows = stmt.query_map([tenant.as_str()], key_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The key with id `id`, if it exists; `Invalid` for a malformed id.
    pub fn key(&self, id: &str) -> Result<Option<KeyInfo>, StoreError> {
        validate_key_id(id)?;
        get_key(&self.conn(), id)
    }

    /// Revokes a key and returns it. Revoking a revoked key changes nothing (it keeps the
    /// first revocation time). `NotFound` for an unknown key, `Invalid` for a malformed id.
    pub fn revoke_key(&self, id: &str) -> Result<KeyInfo, StoreError> {
        validate_key_id(id)?;
        self.write(|c| {
            c.execute(
                "UPDATE api_keys SET revoked_unix_ms = ?2
                 WHERE id = ?1 AND revoked_unix_ms IS NULL",
                params![id, to_db(now_ms())],
            )?;
            get_key(c, id)?.ok_or_else(|| StoreError::NotFound {
                what: "key",
                id: id.to_owned(),
            })
        })
    }

    /// Checks an `Authorization` header value, which must be exactly `Bearer <key>`.
    ///
    /// The key is looked up by its id and its hash compared in constant time; the key itself
    /// is never stored or logged. A wrong secret is [`AuthError::Unknown`], like an unknown
    /// id; [`AuthError::Revoked`] needs the right secret.
    pub fn authenticate(&self, authorization_header: Option<&str>) -> Result<Principal, AuthError> {
        let header = authorization_header.ok_or(AuthError::Missing)?;
        let key = header.strip_prefix("Bearer ").ok_or(AuthError::Malformed)?;
        let key_id = keys::parse(key).ok_or(AuthError::Malformed)?;
        let row: Option<(String, bool, String, Option<i64>)> = self
            .conn()
            .query_row(
                "SELECT tenant, admin, hash, revoked_unix_ms FROM api_keys WHERE id = ?1",
                [key_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(StoreError::from)?;
        let unknown = || AuthError::Unknown {
            key_id: key_id.to_owned(),
        };
        let Some((tenant, admin, hash, revoked)) = row else {
            // Spend the same work as for a known id, so timing does not tell ids apart.
            let _ = keys::verify(key, &"0".repeat(64));
            return Err(unknown());
        };
        if !keys::verify(key, &hash) {
            return Err(unknown());
        }
        let tenant = TenantName::try_from(tenant).map_err(AuthError::Store)?;
        if revoked.is_some() {
            return Err(AuthError::Revoked {
                key_id: key_id.to_owned(),
                tenant,
            });
        }
        Ok(Principal {
            tenant,
            key_id: key_id.to_owned(),
            admin,
        })
    }

    /// On a store without any tenant, creates `tenant` with default quotas and an admin key
    /// labelled `bootstrap`, and returns that key; otherwise returns `None`, so restarting a
    /// server never makes another key.
    pub fn bootstrap(&self, tenant: &TenantName) -> Result<Option<KeyCreated>, StoreError> {
        self.write(|c| {
            let count: i64 = c.query_row("SELECT COUNT(*) FROM tenants", [], |r| r.get(0))?;
            if count > 0 {
                return Ok(None);
            }
            insert_tenant(c, tenant, Quotas::default())?;
            insert_key(c, tenant, true, Some("bootstrap")).map(Some)
        })
    }

    // ---- sandbox ownership ----

    /// Records that sandbox `id` belongs to `tenant`. `Conflict` if the id is recorded
    /// already, `NotFound` for an unknown tenant, `Invalid` for a malformed id.
    pub fn add_sandbox(&self, id: &str, tenant: &TenantName) -> Result<(), StoreError> {
        validate_sandbox_id(id)?;
        self.write(|c| {
            if get_tenant(c, tenant)?.is_none() {
                return Err(StoreError::NotFound {
                    what: "tenant",
                    id: tenant.to_string(),
                });
            }
            let n = c.execute(
                "INSERT OR IGNORE INTO sandboxes (id, tenant, created_unix_ms) VALUES (?1, ?2, ?3)",
                params![id, tenant.as_str(), to_db(now_ms())],
            )?;
            if n == 0 {
                return Err(StoreError::Conflict(format!(
                    "sandbox {id} has an owner already"
                )));
            }
            Ok(())
        })
    }

    /// Forgets the owner of sandbox `id` (for a sandbox whose creation failed); returns
    /// whether it was recorded.
    pub fn remove_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        self.write(|c| {
            c.execute("DELETE FROM ports WHERE sandbox = ?1", [id])?;
            Ok(c.execute("DELETE FROM sandboxes WHERE id = ?1", [id])? > 0)
        })
    }

    /// The tenant that owns sandbox `id`, if it is recorded.
    pub fn sandbox_tenant(&self, id: &str) -> Result<Option<TenantName>, StoreError> {
        let name: Option<String> = self
            .conn()
            .query_row("SELECT tenant FROM sandboxes WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()?;
        Ok(name.map(tenant_from_db).transpose()?)
    }

    /// The sandboxes `tenant` owns, in the order they were recorded.
    pub fn sandboxes_of(&self, tenant: &TenantName) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT id FROM sandboxes WHERE tenant = ?1 ORDER BY rowid")?;
        let rows = stmt.query_map([tenant.as_str()], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every recorded sandbox with its owner, in the order they were recorded.
    pub fn owned_sandboxes(&self) -> Result<Vec<(String, TenantName)>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare("SELECT id, tenant FROM sandboxes ORDER BY rowid")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, tenant_from_db(r.get(1)?)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    // ---- audit ----

    /// Records an audit event stamped with the current time and returns its id. Long fields
    /// are cut (on a character boundary) rather than refused, so recording never fails for
    /// the caller's input.
    pub fn record(&self, event: NewAuditEvent) -> Result<i64, StoreError> {
        let conn = self.conn();
        conn.execute(
            "INSERT INTO audit (at_unix_ms, tenant, key_id, sandbox, operation, result, detail)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                to_db(now_ms()),
                event.tenant.as_ref().map(TenantName::as_str),
                event.key_id.map(|s| bounded(s, MAX_AUDIT_FIELD_BYTES)),
                event.sandbox.map(|s| bounded(s, MAX_AUDIT_FIELD_BYTES)),
                bounded(event.operation, MAX_AUDIT_FIELD_BYTES),
                bounded(event.result, MAX_AUDIT_FIELD_BYTES),
                event.detail.map(|s| bounded(s, MAX_DETAIL_BYTES)),
            ],
        )?;
        Ok(conn.last_insert_rowid())
    }

    /// Audit events matching `filter`, newest first.
    pub fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEvent>, StoreError> {
        let mut conds: Vec<String> = Vec::new();
        let mut args: Vec<Value> = Vec::new();
        let mut add = |column: &str, op: &str, v: Value| {
            args.push(v);
            conds.push(format!("{column} {op} ?{}", args.len()));
        };
        if let Some(t) = &filter.tenant {
            add("tenant", "=", Value::Text(t.to_string()));
        }
        if let Some(s) = &filter.sandbox {
            add("sandbox", "=", Value::Text(s.clone()));
        }
        if let Some(o) = &filter.operation {
            add("operation", "=", Value::Text(o.clone()));
        }
        if let Some(t) = filter.since_unix_ms {
            add("at_unix_ms", ">=", Value::Integer(to_db(t)));
        }
        let limit = filter.limit.clamp(1, MAX_AUDIT_LIMIT);
        args.push(Value::Integer(i64::from(limit)));
        let mut sql = String::from(
            "SELECT id, at_unix_ms, tenant, key_id, sandbox, operation, result, detail FROM audit",
        );
        if !conds.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conds.join(" AND "));
        }
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", args.len()));
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map(rusqlite::params_from_iter(args), audit_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
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

fn secret_row(row: &Row<'_>) -> rusqlite::Result<SecretRow> {
    let hosts: String = row.get(2)?;
    let hosts: Vec<String> = serde_json::from_str(&hosts).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, Box::new(e))
    })?;
    Ok(SecretRow {
        tenant: tenant_from_db(row.get(0)?)?,
        name: row.get(1)?,
        hosts,
        nonce: row.get(3)?,
        ciphertext: row.get(4)?,
        created_unix_ms: from_db(row.get(5)?),
        updated_unix_ms: from_db(row.get(6)?),
    })
}

const SECRET_COLUMNS: &str =
    "tenant, name, hosts, nonce, ciphertext, created_unix_ms, updated_unix_ms";

fn port_row(row: &Row<'_>) -> rusqlite::Result<PortInfo> {
    Ok(PortInfo {
        sandbox: row.get(0)?,
        port: u16::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
        created_unix_ms: from_db(row.get(2)?),
    })
}

impl Store {
    // ---- vault ----

    /// Stores (or replaces) the sealed secret `row.name` of `row.tenant`; returns whether it
    /// is new. A replacement keeps the creation time. `NotFound` for an unknown tenant.
    pub fn put_secret(&self, row: &SecretRow) -> Result<bool, StoreError> {
        let hosts = serde_json::to_string(&row.hosts)
            .map_err(|e| StoreError::Invalid(format!("secret hosts: {e}")))?;
        self.write(|c| {
            if get_tenant(c, &row.tenant)?.is_none() {
                return Err(StoreError::NotFound {
                    what: "tenant",
                    id: row.tenant.to_string(),
                });
            }
            let replaced = c.execute(
                "UPDATE secrets SET hosts = ?3, nonce = ?4, ciphertext = ?5, updated_unix_ms = ?6
                 WHERE tenant = ?1 AND name = ?2",
                params![
                    row.tenant.as_str(),
                    row.name,
                    hosts,
                    row.nonce,
                    row.ciphertext,
                    to_db(row.updated_unix_ms)
                ],
            )?;
            if replaced > 0 {
                return Ok(false);
            }
            c.execute(
                &format!(
                    "INSERT INTO secrets ({SECRET_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
                ),
                params![
                    row.tenant.as_str(),
                    row.name,
                    hosts,
                    row.nonce,
                    row.ciphertext,
                    to_db(row.created_unix_ms),
                    to_db(row.updated_unix_ms)
                ],
            )?;
            Ok(true)
        })
    }

    /// The sealed secret `name` of `tenant`, if it exists.
    pub fn secret(&self, tenant: &TenantName, name: &str) -> Result<Option<SecretRow>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {SECRET_COLUMNS} FROM secrets WHERE tenant = ?1 AND name = ?2"),
                params![tenant.as_str(), name],
                secret_row,
            )
            .optional()?)
    }

    /// The secrets of `tenant` by name, without their values.
    pub fn secrets(&self, tenant: &TenantName) -> Result<Vec<SecretInfo>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE tenant = ?1 ORDER BY name"
        ))?;
        let rows = stmt.query_map([tenant.as_str()], secret_row)?;
        let rows: Vec<SecretRow> = rows.collect::<Result<_, _>>()?;
        Ok(rows.iter().map(SecretInfo::from).collect())
    }

    /// The oldest sealed secret of any tenant, if there is one.
    pub fn any_secret(&self) -> Result<Option<SecretRow>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                &format!("SELECT {SECRET_COLUMNS} FROM secrets ORDER BY rowid LIMIT 1"),
                [],
                secret_row,
            )
            .optional()?)
    }

    /// Deletes the secret `name` of `tenant`; returns whether it existed.
    pub fn delete_secret(&self, tenant: &TenantName, name: &str) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "DELETE FROM secrets WHERE tenant = ?1 AND name = ?2",
            params![tenant.as_str(), name],
        )?;
        Ok(n > 0)
    }

    /// A value of the store's own bookkeeping (`meta` table).
    pub fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .conn()
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    /// Sets `key` in the `meta` table unless it is set already; returns the value in effect.
    pub fn meta_init(&self, key: &str, value: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.write(|c| {
            c.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES (?1, ?2)",
                params![key, value],
            )?;
            Ok(c.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))?)
        })
    }

    // ---- ingress ports ----

    /// Exposes `port` of the owned sandbox `sandbox` under the token whose SHA-256 (hex) is
    /// `token_hash`, replacing the token of a port exposed already; returns the port and
    /// whether it was exposed before. `NotFound` when no tenant owns the sandbox.
    pub fn expose_port(
        &self,
        sandbox: &str,
        port: u16,
        token_hash: &str,
    ) -> Result<(PortInfo, bool), StoreError> {
        validate_sandbox_id(sandbox)?;
        self.write(|c| {
            let owned: Option<i64> = c
                .query_row("SELECT 1 FROM sandboxes WHERE id = ?1", [sandbox], |r| {
                    r.get(0)
                })
                .optional()?;
            if owned.is_none() {
                return Err(StoreError::NotFound {
                    what: "sandbox",
                    id: sandbox.to_owned(),
                });
            }
            let replaced = c.execute(
                "DELETE FROM ports WHERE sandbox = ?1 AND port = ?2",
                params![sandbox, port],
            )? > 0;
            let info = PortInfo {
                sandbox: sandbox.to_owned(),
                port,
                created_unix_ms: now_ms(),
            };
            c.execute(
                "INSERT INTO ports (sandbox, port, token_hash, created_unix_ms)
                 VALUES (?1, ?2, ?3, ?4)",
                params![sandbox, port, token_hash, to_db(info.created_unix_ms)],
            )?;
            Ok((info, replaced))
        })
    }

    /// The exposed ports of `sandbox`, by port.
    pub fn ports(&self, sandbox: &str) -> Result<Vec<PortInfo>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT sandbox, port, created_unix_ms FROM ports WHERE sandbox = ?1 ORDER BY port",
        )?;
        let rows = stmt.query_map([sandbox], port_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Revokes the URL of `port` of `sandbox`; returns whether it was exposed.
    pub fn unexpose_port(&self, sandbox: &str, port: u16) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "DELETE FROM ports WHERE sandbox = ?1 AND port = ?2",
            params![sandbox, port],
        )?;
        Ok(n > 0)
    }

    /// Revokes every exposed port of `sandbox`; returns how many there were.
    pub fn unexpose_all(&self, sandbox: &str) -> Result<usize, StoreError> {
        Ok(self
            .conn()
            .execute("DELETE FROM ports WHERE sandbox = ?1", [sandbox])?)
    }

    /// The sandbox, port and owner an ingress token (by its SHA-256, hex) opens, if any.
    pub fn port_by_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<(PortInfo, TenantName)>, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT p.sandbox, p.port, p.created_unix_ms, s.tenant
                 FROM ports p JOIN sandboxes s ON s.id = p.sandbox WHERE p.token_hash = ?1",
                [token_hash],
                |r| Ok((port_row(r)?, tenant_from_db(r.get(3)?)?)),
            )
            .optional()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> TenantName {
        name.parse().unwrap()
    }

    fn bearer(key: &str) -> String {
        format!("Bearer {key}")
    }

    fn temp_store() -> (tempfile::TempDir, std::path::PathBuf, Store) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join("space.db");
        let store = Store::open(&path).unwrap();
        (dir, path, store)
    }

    #[test]
    fn tenant_names_are_validated() {
        for ok in ["a", "0", "acme", "a-b-c", "9lives", &"a".repeat(40)] {
            let n: TenantName = ok.parse().unwrap();
            assert_eq!(n.as_str(), ok);
            assert_eq!(n.to_string(), ok);
        }
        for bad in [
            "",
            "-a",
            "A",
            "acme_corp",
            "acme corp",
            "a.b",
            "é",
            &"a".repeat(41),
            "acme\n",
        ] {
            assert!(
                matches!(bad.parse::<TenantName>(), Err(StoreError::Invalid(_))),
                "{bad:?} accepted"
            );
        }
        let n: TenantName = serde_json::from_str("\"acme\"").unwrap();
        assert_eq!(serde_json::to_string(&n).unwrap(), "\"acme\"");
        assert!(serde_json::from_str::<TenantName>("\"Acme\"").is_err());
    }

    #[test]
    fn json_shapes_follow_the_api() {
        let store = Store::open_in_memory().unwrap();
        let tenant = store.create_tenant(&t("acme"), Quotas::default()).unwrap();
        let v = serde_json::to_value(&tenant).unwrap();
        assert_eq!(v["name"], "acme");
        assert_eq!(v["quotas"]["max_sandboxes"], 100);
        assert_eq!(v["quotas"]["max_vcpus"], 64);
        assert_eq!(v["quotas"]["max_memory_mib"], 65536);
        assert!(v["created_unix_ms"].as_u64().unwrap() > 0);

        let created = store.create_key(&t("acme"), false, Some("ci")).unwrap();
        let v = serde_json::to_value(&created).unwrap();
        let obj = v.as_object().unwrap();
        let mut fields: Vec<&str> = obj.keys().map(String::as_str).collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            [
                "admin",
                "created_unix_ms",
                "id",
                "key",
                "label",
                "revoked_unix_ms",
                "tenant"
            ]
        );
        assert_eq!(v["revoked_unix_ms"], serde_json::Value::Null);
        assert_eq!(v["label"], "ci");
        let back: KeyCreated = serde_json::from_value(v).unwrap();
        assert_eq!(back, created);
        let listed = serde_json::to_value(&created.info).unwrap();
        assert!(listed.get("key").is_none());
    }

    #[test]
    fn reopen_keeps_everything() {
        let (_dir, path, store) = temp_store();
        let acme = t("acme");
        let quotas = Quotas {
            max_sandboxes: 3,
            max_vcpus: 4,
            max_memory_mib: 2048,
            max_suspended_ms: None,
        };
        store.create_tenant(&acme, quotas).unwrap();
        let key = store.create_key(&acme, true, Some("ops")).unwrap();
        let other = store.create_key(&acme, false, None).unwrap();
        store.revoke_key(&other.info.id).unwrap();
        store.add_sandbox("sb-0123456789abcdefghij", &acme).unwrap();
        let ev = store
            .record(NewAuditEvent {
                tenant: Some(acme.clone()),
                key_id: Some(key.info.id.clone()),
                sandbox: Some("sb-0123456789abcdefghij".into()),
                operation: "sandbox.create".into(),
                result: "ok".into(),
                detail: Some("template minimal".into()),
            })
            .unwrap();
        let tenants_before = store.tenants().unwrap();
        let keys_before = store.keys(&acme).unwrap();
        let audit_before = store.audit(&AuditFilter::default()).unwrap();
        drop(store);

        let store = Store::open(&path).unwrap();
        assert_eq!(store.tenants().unwrap(), tenants_before);
        assert_eq!(store.tenant(&acme).unwrap().unwrap().quotas, quotas);
        assert_eq!(store.keys(&acme).unwrap(), keys_before);
        assert_eq!(keys_before.len(), 2);
        let p = store.authenticate(Some(&bearer(&key.key))).unwrap();
        assert_eq!(
            p,
            Principal {
                tenant: acme.clone(),
                key_id: key.info.id.clone(),
                admin: true
            }
        );
        assert!(matches!(
            store.authenticate(Some(&bearer(&other.key))),
            Err(AuthError::Revoked { .. })
        ));
        assert_eq!(
            store.sandbox_tenant("sb-0123456789abcdefghij").unwrap(),
            Some(acme.clone())
        );
        let audit = store.audit(&AuditFilter::default()).unwrap();
        assert_eq!(audit, audit_before);
        assert_eq!(audit[0].id, ev);
        // Ids keep increasing after a reopen.
        let ev2 = store
            .record(NewAuditEvent {
                operation: "auth".into(),
                result: "unauthorized".into(),
                ..Default::default()
            })
            .unwrap();
        assert!(ev2 > ev);
    }

    #[test]
    fn database_file_is_private() {
        let (_dir, path, store) = temp_store();
        store.create_tenant(&t("acme"), Quotas::default()).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let wal = path.with_extension("db-wal");
        if let Ok(meta) = fs::metadata(&wal) {
            assert_eq!(
                meta.permissions().mode() & 0o077,
                0,
                "{wal:?} readable by others"
            );
        }
        drop(store);
        // An existing file with loose permissions is tightened on open.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let _store = Store::open(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn database_settings() {
        let (_dir, _path, store) = temp_store();
        let conn = store.conn();
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let fk: i64 = conn
            .query_row("PRAGMA foreign_keys", [], |r| r.get(0))
            .unwrap();
        assert_eq!(fk, 1);
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 1, "synchronous=NORMAL");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, i64::from(SCHEMA_VERSION));
    }

    #[test]
    fn newer_schema_is_refused_and_left_alone() {
        let (_dir, path, store) = temp_store();
        store.create_tenant(&t("acme"), Quotas::default()).unwrap();
        drop(store);
        let newer = SCHEMA_VERSION + 1;
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", newer).unwrap();
        }
        let err = Store::open(&path).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::Invalid(_)), "{err:?}");
        assert!(msg.contains(&format!("schema version {newer}")), "{msg}");
        assert!(msg.contains("newer"), "{msg}");
        // Nothing was changed: the version and the data are as they were.
        let conn = Connection::open(&path).unwrap();
        let v: u32 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, newer);
        let n: i64 = conn
            .query_row("SELECT COUNT(*) FROM tenants", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("space.db");
        fs::write(&path, vec![0x55u8; 8192]).unwrap();
        let err = Store::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::Sqlite(_)), "{err:?}");
        assert_eq!(fs::read(&path).unwrap(), vec![0x55u8; 8192]);
    }

    #[test]
    fn tenants_create_list_update() {
        let store = Store::open_in_memory().unwrap();
        assert!(store.tenants().unwrap().is_empty());
        assert_eq!(store.tenant(&t("acme")).unwrap(), None);
        let acme = store.create_tenant(&t("acme"), Quotas::default()).unwrap();
        store.create_tenant(&t("beta"), Quotas::default()).unwrap();
        assert!(matches!(
            store.create_tenant(&t("acme"), Quotas::default()),
            Err(StoreError::Conflict(_))
        ));
        let names: Vec<String> = store
            .tenants()
            .unwrap()
            .into_iter()
            .map(|t| t.name.to_string())
            .collect();
        assert_eq!(names, ["acme", "beta"]);
        let q = Quotas {
            max_sandboxes: 1,
            max_vcpus: 2,
            max_memory_mib: 512,
            max_suspended_ms: None,
        };
        let updated = store.set_quotas(&t("acme"), q).unwrap();
        assert_eq!(updated.quotas, q);
        assert_eq!(updated.created_unix_ms, acme.created_unix_ms);
        assert_eq!(store.tenant(&t("acme")).unwrap().unwrap().quotas, q);
        assert!(matches!(
            store.set_quotas(&t("nobody"), q),
            Err(StoreError::NotFound { what: "tenant", .. })
        ));
        let huge = Quotas {
            max_memory_mib: u64::MAX,
            ..q
        };
        assert!(matches!(
            store.set_quotas(&t("acme"), huge),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            store.create_tenant(&t("gamma"), huge),
            Err(StoreError::Invalid(_))
        ));
        assert_eq!(store.tenant(&t("acme")).unwrap().unwrap().quotas, q);
        assert_eq!(store.tenant(&t("gamma")).unwrap(), None);
    }

    #[test]
    fn tenant_with_key_is_all_or_nothing() {
        let store = Store::open_in_memory().unwrap();
        let (tenant, key) = store
            .create_tenant_with_key(&t("acme"), Quotas::default(), false, Some("first"))
            .unwrap();
        assert_eq!(tenant.name, t("acme"));
        assert_eq!(key.info.tenant, t("acme"));
        assert!(!key.info.admin);
        let p = store.authenticate(Some(&bearer(&key.key))).unwrap();
        assert_eq!(p.tenant, t("acme"));
        // A bad label fails the key, and the tenant is not left behind without one.
        assert!(matches!(
            store.create_tenant_with_key(&t("beta"), Quotas::default(), false, Some("a\nb")),
            Err(StoreError::Invalid(_))
        ));
        assert_eq!(store.tenant(&t("beta")).unwrap(), None);
        assert!(matches!(
            store.create_tenant_with_key(&t("acme"), Quotas::default(), false, None),
            Err(StoreError::Conflict(_))
        ));
        assert_eq!(store.keys(&t("acme")).unwrap().len(), 1);
    }

    #[test]
    fn keys_authenticate_and_fail_with_the_right_variant() {
        let store = Store::open_in_memory().unwrap();
        let acme = t("acme");
        store.create_tenant(&acme, Quotas::default()).unwrap();
        assert!(matches!(
            store.create_key(&t("nobody"), false, None),
            Err(StoreError::NotFound { what: "tenant", .. })
        ));
        let k = store.create_key(&acme, false, Some("laptop")).unwrap();
        assert_eq!(keys::parse(&k.key), Some(k.info.id.as_str()));
        assert!(!k.info.admin);

        let p = store.authenticate(Some(&bearer(&k.key))).unwrap();
        assert_eq!(p.tenant, acme);
        assert_eq!(p.key_id, k.info.id);
        assert!(!p.admin);

        // Missing.
        let e = store.authenticate(None).unwrap_err();
        assert!(matches!(e, AuthError::Missing));
        assert_eq!((e.key_id(), e.tenant()), (None, None));
        // Malformed: not exactly "Bearer <key>".
        for h in [
            String::new(),
            k.key.clone(),
            format!("bearer {}", k.key),
            format!("Bearer  {}", k.key),
            format!("Bearer {} ", k.key),
            format!("Basic {}", k.key),
            "Bearer ".to_string(),
            "Bearer space_".to_string(),
            format!("Bearer {}", &k.key[..k.key.len() - 1]),
        ] {
            let e = store.authenticate(Some(&h)).unwrap_err();
            assert!(matches!(e, AuthError::Malformed), "{h:?}: {e:?}");
            assert_eq!(e.key_id(), None);
        }
        // Unknown id.
        let (stranger_id, stranger) = keys::generate();
        let e = store.authenticate(Some(&bearer(&stranger))).unwrap_err();
        assert!(matches!(&e, AuthError::Unknown { key_id } if *key_id == stranger_id));
        assert_eq!(e.key_id(), Some(stranger_id.as_str()));
        assert_eq!(e.tenant(), None);
        // Known id, wrong secret: unknown as well, with no tenant.
        let mut wrong = k.key.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == 'a' { 'b' } else { 'a' });
        let e = store.authenticate(Some(&bearer(&wrong))).unwrap_err();
        assert!(matches!(&e, AuthError::Unknown { key_id } if *key_id == k.info.id));
        assert_eq!(e.tenant(), None);

        // Revoked: the right key stops working; revoking again keeps the first time.
        let revoked = store.revoke_key(&k.info.id).unwrap();
        let at = revoked.revoked_unix_ms.expect("revocation time");
        let e = store.authenticate(Some(&bearer(&k.key))).unwrap_err();
        assert!(matches!(&e, AuthError::Revoked { .. }));
        assert_eq!(e.key_id(), Some(k.info.id.as_str()));
        assert_eq!(e.tenant(), Some(&acme));
        std::thread::sleep(Duration::from_millis(5));
        let again = store.revoke_key(&k.info.id).unwrap();
        assert_eq!(again.revoked_unix_ms, Some(at));
        assert_eq!(store.key(&k.info.id).unwrap().unwrap(), again);
        // A wrong secret for a revoked key is still just unknown.
        let e = store.authenticate(Some(&bearer(&wrong))).unwrap_err();
        assert!(matches!(e, AuthError::Unknown { .. }));

        // Other keys of the tenant are unaffected.
        let admin = store.create_key(&acme, true, None).unwrap();
        assert!(store.authenticate(Some(&bearer(&admin.key))).unwrap().admin);
        let listed = store.keys(&acme).unwrap();
        assert_eq!(listed, vec![again, admin.info.clone()]);

        // Lookups of unknown and malformed ids.
        assert_eq!(store.key(&stranger_id).unwrap(), None);
        assert!(matches!(
            store.revoke_key(&stranger_id),
            Err(StoreError::NotFound { what: "key", .. })
        ));
        assert!(matches!(store.key("K123"), Err(StoreError::Invalid(_))));
        assert!(matches!(
            store.revoke_key("k' OR 1=1 --xxxx"),
            Err(StoreError::Invalid(_))
        ));
    }

    #[test]
    fn the_key_is_never_stored() {
        let (_dir, path, store) = temp_store();
        store.create_tenant(&t("acme"), Quotas::default()).unwrap();
        let k = store.create_key(&t("acme"), false, None).unwrap();
        let secret = &k.key[k.key.len() - keys::SECRET_LEN..];
        drop(store);
        let mut bytes = fs::read(&path).unwrap();
        if let Ok(wal) = fs::read(path.with_extension("db-wal")) {
            bytes.extend(wal);
        }
        let needle = secret.as_bytes();
        assert!(!bytes.windows(needle.len()).any(|w| w == needle));
        let hash = keys::hash(&k.key);
        assert!(bytes.windows(hash.len()).any(|w| w == hash.as_bytes()));
    }

    #[test]
    fn labels_are_bounded() {
        let store = Store::open_in_memory().unwrap();
        store.create_tenant(&t("acme"), Quotas::default()).unwrap();
        let long = "é".repeat(MAX_LABEL_CHARS);
        let k = store.create_key(&t("acme"), false, Some(&long)).unwrap();
        assert_eq!(k.info.label.as_deref(), Some(long.as_str()));
        let too_long = "x".repeat(MAX_LABEL_CHARS + 1);
        assert!(matches!(
            store.create_key(&t("acme"), false, Some(&too_long)),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            store.create_key(&t("acme"), false, Some("a\u{1b}[2J")),
            Err(StoreError::Invalid(_))
        ));
        assert_eq!(store.keys(&t("acme")).unwrap().len(), 1);
    }

    #[test]
    fn bootstrap_happens_once() {
        let (_dir, path, store) = temp_store();
        let default = t("default");
        let first = store.bootstrap(&default).unwrap().expect("first bootstrap");
        assert!(first.info.admin);
        assert_eq!(first.info.label.as_deref(), Some("bootstrap"));
        assert_eq!(first.info.tenant, default);
        assert_eq!(
            store.tenant(&default).unwrap().unwrap().quotas,
            Quotas::default()
        );
        assert!(store.authenticate(Some(&bearer(&first.key))).unwrap().admin);
        assert_eq!(store.bootstrap(&default).unwrap(), None);
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(store.bootstrap(&default).unwrap(), None);
        assert_eq!(store.bootstrap(&t("other")).unwrap(), None);
        assert_eq!(store.tenants().unwrap().len(), 1);
        assert_eq!(store.keys(&default).unwrap().len(), 1);

        // A store that already has a tenant, but not the bootstrap one, is left alone too.
        let store = Store::open_in_memory().unwrap();
        store.create_tenant(&t("acme"), Quotas::default()).unwrap();
        assert_eq!(store.bootstrap(&default).unwrap(), None);
        assert_eq!(store.tenant(&default).unwrap(), None);
    }

    #[test]
    fn sandbox_ownership_is_per_tenant() {
        let store = Store::open_in_memory().unwrap();
        let (a, b) = (t("a"), t("b"));
        store.create_tenant(&a, Quotas::default()).unwrap();
        store.create_tenant(&b, Quotas::default()).unwrap();
        store.add_sandbox("sb-a1", &a).unwrap();
        store.add_sandbox("sb-b1", &b).unwrap();
        store.add_sandbox("sb-a2", &a).unwrap();
        assert!(matches!(
            store.add_sandbox("sb-a1", &b),
            Err(StoreError::Conflict(_))
        ));
        assert!(matches!(
            store.add_sandbox("sb-x", &t("nobody")),
            Err(StoreError::NotFound { what: "tenant", .. })
        ));
        for bad in ["", "sb/../x", "sb x", &"a".repeat(MAX_SANDBOX_ID_BYTES + 1)] {
            assert!(
                matches!(store.add_sandbox(bad, &a), Err(StoreError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert_eq!(store.sandbox_tenant("sb-a1").unwrap(), Some(a.clone()));
        assert_eq!(store.sandbox_tenant("sb-b1").unwrap(), Some(b.clone()));
        assert_eq!(store.sandbox_tenant("sb-none").unwrap(), None);
        assert_eq!(store.sandboxes_of(&a).unwrap(), ["sb-a1", "sb-a2"]);
        assert_eq!(store.sandboxes_of(&b).unwrap(), ["sb-b1"]);
        assert!(store.sandboxes_of(&t("nobody")).unwrap().is_empty());
        assert_eq!(
            store.owned_sandboxes().unwrap(),
            vec![
                ("sb-a1".to_string(), a.clone()),
                ("sb-b1".to_string(), b.clone()),
                ("sb-a2".to_string(), a.clone()),
            ]
        );
        assert!(store.remove_sandbox("sb-a1").unwrap());
        assert!(!store.remove_sandbox("sb-a1").unwrap());
        assert_eq!(store.sandboxes_of(&a).unwrap(), ["sb-a2"]);
    }

    fn event(tenant: Option<&TenantName>, sandbox: Option<&str>, op: &str) -> NewAuditEvent {
        NewAuditEvent {
            tenant: tenant.cloned(),
            key_id: None,
            sandbox: sandbox.map(str::to_owned),
            operation: op.into(),
            result: "ok".into(),
            detail: None,
        }
    }

    #[test]
    fn audit_queries_are_isolated_and_filtered() {
        let store = Store::open_in_memory().unwrap();
        let (a, b) = (t("a"), t("b"));
        let e1 = store
            .record(event(Some(&a), Some("sb-1"), "sandbox.create"))
            .unwrap();
        let e2 = store
            .record(event(Some(&b), Some("sb-2"), "sandbox.create"))
            .unwrap();
        let e3 = store.record(event(None, None, "auth")).unwrap();
        let e4 = store
            .record(event(Some(&a), Some("sb-1"), "sandbox.pause"))
            .unwrap();
        let e5 = store
            .record(event(Some(&a), Some("sb-3"), "sandbox.create"))
            .unwrap();
        let ids = |f: AuditFilter| -> Vec<i64> {
            store.audit(&f).unwrap().into_iter().map(|e| e.id).collect()
        };
        // Admin: everything, newest first, including tenantless events.
        assert_eq!(ids(AuditFilter::default()), [e5, e4, e3, e2, e1]);
        // A tenant sees only its own.
        let of_a = AuditFilter {
            tenant: Some(a.clone()),
            ..Default::default()
        };
        assert_eq!(ids(of_a.clone()), [e5, e4, e1]);
        assert_eq!(
            ids(AuditFilter {
                tenant: Some(b.clone()),
                ..Default::default()
            }),
            [e2]
        );
        // Another tenant's sandbox id does not leak through the sandbox filter.
        assert!(ids(AuditFilter {
            sandbox: Some("sb-2".into()),
            ..of_a.clone()
        })
        .is_empty());
        assert_eq!(
            ids(AuditFilter {
                sandbox: Some("sb-1".into()),
                ..of_a.clone()
            }),
            [e4, e1]
        );
        assert_eq!(
            ids(AuditFilter {
                operation: Some("sandbox.create".into()),
                ..of_a.clone()
            }),
            [e5, e1]
        );
        assert_eq!(
            ids(AuditFilter {
                operation: Some("auth".into()),
                ..Default::default()
            }),
            [e3]
        );
        // Limits are clamped to 1..=1000.
        assert_eq!(
            ids(AuditFilter {
                limit: 2,
                ..Default::default()
            }),
            [e5, e4]
        );
        assert_eq!(
            ids(AuditFilter {
                limit: 0,
                ..Default::default()
            }),
            [e5]
        );
        // since: everything is at or after "now minus a minute", nothing is in the future.
        let now = now_ms();
        assert_eq!(
            ids(AuditFilter {
                since_unix_ms: Some(now - 60_000),
                ..of_a.clone()
            })
            .len(),
            3
        );
        assert!(ids(AuditFilter {
            since_unix_ms: Some(now + 60_000),
            ..Default::default()
        })
        .is_empty());
        let all = store.audit(&AuditFilter::default()).unwrap();
        assert!(all
            .iter()
            .all(|e| e.at_unix_ms <= now_ms() && e.at_unix_ms + 60_000 > now));
    }

    #[test]
    fn audit_limit_caps_at_1000() {
        let store = Store::open_in_memory().unwrap();
        for _ in 0..1005 {
            store.record(event(None, None, "auth")).unwrap();
        }
        let got = store
            .audit(&AuditFilter {
                limit: u32::MAX,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(got.len(), 1000);
        assert!(got.windows(2).all(|w| w[0].id > w[1].id));
    }

    #[test]
    fn audit_fields_are_bounded() {
        let store = Store::open_in_memory().unwrap();
        // 'é' is two bytes, so a cut at 4096 bytes falls between characters of "xé…".
        let detail = format!("x{}", "é".repeat(MAX_DETAIL_BYTES));
        let id = store
            .record(NewAuditEvent {
                tenant: None,
                key_id: Some("k".repeat(1000)),
                sandbox: Some("s".repeat(1000)),
                operation: "o".repeat(1000),
                result: "r".repeat(1000),
                detail: Some(detail.clone()),
            })
            .unwrap();
        let got = store.audit(&AuditFilter::default()).unwrap();
        assert_eq!(got.len(), 1);
        let e = &got[0];
        assert_eq!(e.id, id);
        let d = e.detail.as_deref().unwrap();
        assert_eq!(d.len(), MAX_DETAIL_BYTES - 1);
        assert!(detail.starts_with(d));
        assert_eq!(e.operation.len(), MAX_AUDIT_FIELD_BYTES);
        assert_eq!(e.result.len(), MAX_AUDIT_FIELD_BYTES);
        assert_eq!(e.key_id.as_ref().unwrap().len(), MAX_AUDIT_FIELD_BYTES);
        assert_eq!(e.sandbox.as_ref().unwrap().len(), MAX_AUDIT_FIELD_BYTES);
        let v = serde_json::to_value(e).unwrap();
        for f in [
            "id",
            "at_unix_ms",
            "tenant",
            "key_id",
            "sandbox",
            "operation",
            "result",
            "detail",
        ] {
            assert!(v.get(f).is_some(), "{f} missing");
        }
    }

    #[test]
    fn concurrent_writers_share_one_store() {
        let (_dir, _path, store) = temp_store();
        let store = std::sync::Arc::new(store);
        store.create_tenant(&t("acme"), Quotas::default()).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let store = store.clone();
                std::thread::spawn(move || {
                    for j in 0..25 {
                        store
                            .add_sandbox(&format!("sb-{i}-{j}"), &t("acme"))
                            .unwrap();
                        store
                            .record(event(Some(&t("acme")), None, "sandbox.create"))
                            .unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(store.sandboxes_of(&t("acme")).unwrap().len(), 200);
        assert_eq!(
            store
                .audit(&AuditFilter {
                    limit: 1000,
                    ..Default::default()
                })
                .unwrap()
                .len(),
            200
        );
    }

    #[test]
    fn a_version_1_database_migrates_and_keeps_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.execute("INSERT INTO tenants VALUES ('acme', 1, 5, 6, 7)", [])
                .unwrap();
            conn.execute(
                "INSERT INTO sandboxes VALUES ('sbx-0011223344556677', 'acme', 2)",
                [],
            )
            .unwrap();
        }
        let store = Store::open(&path).unwrap();
        let version: i64 = store
            .conn()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, i64::from(SCHEMA_VERSION));
        assert_eq!(SCHEMA_VERSION, 4);
        let acme = t("acme");
        assert_eq!(store.tenant(&acme).unwrap().unwrap().quotas.max_vcpus, 6);
        assert_eq!(
            store.sandbox_tenant("sbx-0011223344556677").unwrap(),
            Some(acme.clone())
        );
        // The new tables work.
        let (p, replaced) = store
            .expose_port("sbx-0011223344556677", 8000, "h1")
            .unwrap();
        assert!(!replaced);
        assert_eq!(p.port, 8000);
        assert!(store.secrets(&acme).unwrap().is_empty());
    }

    #[test]
    fn ports_are_looked_up_by_token_hash_and_replaced() {
        let store = Store::open_in_memory().unwrap();
        let a = t("a");
        store.create_tenant(&a, Quotas::default()).unwrap();
        store.add_sandbox("sbx-1", &a).unwrap();
        assert!(matches!(
            store.expose_port("sbx-2", 80, "x"),
            Err(StoreError::NotFound {
                what: "sandbox",
                ..
            })
        ));
        store.expose_port("sbx-1", 8000, "h1").unwrap();
        store.expose_port("sbx-1", 80, "h2").unwrap();
        let (p, owner) = store.port_by_token("h1").unwrap().unwrap();
        assert_eq!(
            (p.sandbox.as_str(), p.port, owner),
            ("sbx-1", 8000, a.clone())
        );
        // Exposing again replaces the token: the old one stops working.
        let (_, replaced) = store.expose_port("sbx-1", 8000, "h3").unwrap();
        assert!(replaced);
        assert_eq!(store.port_by_token("h1").unwrap(), None);
        assert!(store.port_by_token("h3").unwrap().is_some());
        let ports: Vec<u16> = store
            .ports("sbx-1")
            .unwrap()
            .iter()
            .map(|p| p.port)
            .collect();
        assert_eq!(ports, [80, 8000]);
        assert!(store.unexpose_port("sbx-1", 80).unwrap());
        assert!(!store.unexpose_port("sbx-1", 80).unwrap());
        assert_eq!(store.port_by_token("h2").unwrap(), None);
        // Forgetting the sandbox drops its ports.
        assert!(store.remove_sandbox("sbx-1").unwrap());
        assert_eq!(store.port_by_token("h3").unwrap(), None);
    }
}
