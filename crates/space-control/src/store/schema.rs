//! The schema, versioned with `PRAGMA user_version`, and how a connection is set up.

use super::*;

/// Schema migrations; entry `i` takes the database from version `i` to `i + 1`.
pub(super) const MIGRATIONS: &[&str] = &[
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

/// Brings the schema to [`SCHEMA_VERSION`] in one transaction, or refuses a newer one.
pub(super) fn migrate(conn: &mut Connection, what: &str) -> Result<(), StoreError> {
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

pub(super) fn configure(conn: &Connection) -> Result<(), StoreError> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // `journal_mode` answers with the mode in effect (an in-memory database stays "memory").
    let _mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    Ok(())
}
