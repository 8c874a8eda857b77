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
//!
//! The parts: the types callers see (`model`), the schema and its migrations
//! (`schema`), tenants, keys, ownership and audit (`tenants`), secrets, ports and metadata
//! (`secrets`).

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

mod model;
mod schema;
mod secrets;
mod tenants;
#[cfg(test)]
mod tests;

pub use model::*;
#[cfg(test)]
use schema::MIGRATIONS;
pub use schema::SCHEMA_VERSION;
use schema::{configure, migrate};

/// How long a statement waits for a lock held by another connection.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

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
}
