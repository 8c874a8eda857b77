//! The schema of each database and how a connection is set up.
//!
//! SQLite counts its version in `PRAGMA user_version`; PostgreSQL in the one row of
//! `schema_version`. The two lists are numbered separately (PostgreSQL started later, from
//! the schema SQLite had reached), and every change to the schema appends an entry to both.

use super::*;

/// SQLite migrations; entry `i` takes the database from version `i` to `i + 1`.
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
    r#"
CREATE TABLE nodes (
    id               TEXT PRIMARY KEY NOT NULL,
    address          TEXT NOT NULL,
    incarnation      INTEGER NOT NULL,
    state            TEXT NOT NULL,
    lease_expires_ms INTEGER NOT NULL,
    joined_unix_ms   INTEGER NOT NULL,
    token_hash       TEXT NOT NULL,
    report           TEXT NOT NULL
) STRICT;
CREATE TABLE join_tokens (
    id              TEXT PRIMARY KEY NOT NULL,
    hash            TEXT NOT NULL,
    created_unix_ms INTEGER NOT NULL,
    expires_unix_ms INTEGER NOT NULL,
    used_unix_ms    INTEGER,
    used_by         TEXT
) STRICT;
ALTER TABLE sandboxes ADD COLUMN node TEXT;
ALTER TABLE sandboxes ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
CREATE INDEX sandboxes_node ON sandboxes(node);
"#,
    r#"
CREATE TABLE reservations (
    id         TEXT PRIMARY KEY NOT NULL,
    node       TEXT NOT NULL,
    memory_mib INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX reservations_node ON reservations(node, expires_ms);
"#,
    // 7: claims (one holder at a time for work that must be done once in the cluster).
    r#"
CREATE TABLE claims (
    name     TEXT PRIMARY KEY NOT NULL,
    holder   TEXT NOT NULL,
    until_ms INTEGER NOT NULL
) STRICT;
"#,
    // 8: idempotency keys of creates.
    r#"
CREATE TABLE create_keys (
    tenant      TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    sandbox     TEXT,
    created_ms  INTEGER NOT NULL,
    PRIMARY KEY (tenant, key)
) STRICT;
CREATE INDEX create_keys_created ON create_keys(created_ms);
"#,
    // 9: template owners and builds.
    r#"
CREATE TABLE template_owners (
    name   TEXT PRIMARY KEY,
    tenant TEXT NOT NULL
) STRICT;
CREATE TABLE template_builds (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    name        TEXT NOT NULL,
    version     TEXT NOT NULL,
    source      TEXT NOT NULL,
    state       TEXT NOT NULL,
    error       TEXT,
    log         TEXT NOT NULL,
    created_ms  INTEGER NOT NULL,
    finished_ms INTEGER
) STRICT;
CREATE INDEX template_builds_created ON template_builds(tenant, created_ms);
"#,
    // 10: what a secret holds (a value, or a TOTP seed).
    r#"
ALTER TABLE secrets ADD COLUMN kind TEXT NOT NULL DEFAULT 'value';
"#,
    // 11: volumes, and the tenants' quota on their size.
    r#"
CREATE TABLE volumes (
    id         TEXT PRIMARY KEY NOT NULL,
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    node       TEXT,
    created_ms INTEGER NOT NULL,
    UNIQUE (tenant, name)
) STRICT;
ALTER TABLE tenants ADD COLUMN max_volume_mib INTEGER NOT NULL DEFAULT 102400;
"#,
    // 12: E2B's secrets: name, metadata and version beside their vault rows.
    r#"
CREATE TABLE e2b_secrets (
    id         TEXT PRIMARY KEY NOT NULL,
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    version    INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    UNIQUE (tenant, name)
) STRICT;
"#,
];

/// The SQLite schema version this build writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// PostgreSQL migrations; entry `i` takes the database from version `i` to `i + 1`. Integers
/// are `BIGINT` throughout (the store binds 64-bit values); `seq` columns keep insertion
/// order where SQLite has `rowid`.
pub(super) const PG_MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE tenants (
    name             TEXT PRIMARY KEY,
    created_unix_ms  BIGINT NOT NULL,
    max_sandboxes    BIGINT NOT NULL,
    max_vcpus        BIGINT NOT NULL,
    max_memory_mib   BIGINT NOT NULL,
    max_suspended_ms BIGINT
);
CREATE TABLE api_keys (
    id              TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL REFERENCES tenants(name),
    admin           BOOLEAN NOT NULL,
    label           TEXT,
    hash            TEXT NOT NULL,
    created_unix_ms BIGINT NOT NULL,
    revoked_unix_ms BIGINT
);
CREATE INDEX api_keys_tenant ON api_keys(tenant);
CREATE TABLE sandboxes (
    id              TEXT PRIMARY KEY,
    seq             BIGSERIAL NOT NULL,
    tenant          TEXT NOT NULL REFERENCES tenants(name),
    created_unix_ms BIGINT NOT NULL
);
CREATE INDEX sandboxes_tenant ON sandboxes(tenant, seq);
CREATE TABLE audit (
    id         BIGSERIAL PRIMARY KEY,
    at_unix_ms BIGINT NOT NULL,
    tenant     TEXT,
    key_id     TEXT,
    sandbox    TEXT,
    operation  TEXT NOT NULL,
    result     TEXT NOT NULL,
    detail     TEXT
);
CREATE INDEX audit_tenant ON audit(tenant, id);
CREATE INDEX audit_sandbox ON audit(sandbox, id);
CREATE TABLE secrets (
    tenant          TEXT NOT NULL REFERENCES tenants(name),
    name            TEXT NOT NULL,
    seq             BIGSERIAL NOT NULL,
    hosts           TEXT NOT NULL,
    nonce           BYTEA NOT NULL,
    ciphertext      BYTEA NOT NULL,
    created_unix_ms BIGINT NOT NULL,
    updated_unix_ms BIGINT NOT NULL,
    PRIMARY KEY (tenant, name)
);
CREATE TABLE ports (
    sandbox         TEXT NOT NULL REFERENCES sandboxes(id),
    port            BIGINT NOT NULL,
    token_hash      TEXT NOT NULL UNIQUE,
    created_unix_ms BIGINT NOT NULL,
    PRIMARY KEY (sandbox, port)
);
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value BYTEA NOT NULL
);
CREATE TABLE tenant_master_keys (
    tenant          TEXT PRIMARY KEY REFERENCES tenants(name),
    provider        TEXT NOT NULL,
    key_id          TEXT NOT NULL,
    region          TEXT NOT NULL,
    endpoint        TEXT,
    updated_unix_ms BIGINT NOT NULL
);
"#,
    r#"
CREATE TABLE nodes (
    id               TEXT PRIMARY KEY,
    address          TEXT NOT NULL,
    incarnation      BIGINT NOT NULL,
    state            TEXT NOT NULL,
    lease_expires_ms BIGINT NOT NULL,
    joined_unix_ms   BIGINT NOT NULL,
    token_hash       TEXT NOT NULL,
    report           TEXT NOT NULL
);
CREATE TABLE join_tokens (
    id              TEXT PRIMARY KEY,
    hash            TEXT NOT NULL,
    created_unix_ms BIGINT NOT NULL,
    expires_unix_ms BIGINT NOT NULL,
    used_unix_ms    BIGINT,
    used_by         TEXT
);
ALTER TABLE sandboxes ADD COLUMN node TEXT;
ALTER TABLE sandboxes ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
CREATE INDEX sandboxes_node ON sandboxes(node);
"#,
    r#"
CREATE TABLE reservations (
    id         TEXT PRIMARY KEY,
    node       TEXT NOT NULL,
    memory_mib BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL
);
CREATE INDEX reservations_node ON reservations(node, expires_ms);
"#,
    // 4: claims.
    r#"
CREATE TABLE claims (
    name     TEXT PRIMARY KEY,
    holder   TEXT NOT NULL,
    until_ms BIGINT NOT NULL
);
"#,
    // 5: idempotency keys of creates.
    r#"
CREATE TABLE create_keys (
    tenant      TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    sandbox     TEXT,
    created_ms  BIGINT NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX create_keys_created ON create_keys(created_ms);
"#,
    // 6: template owners and builds.
    r#"
CREATE TABLE template_owners (
    name   TEXT PRIMARY KEY,
    tenant TEXT NOT NULL
);
CREATE TABLE template_builds (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    name        TEXT NOT NULL,
    version     TEXT NOT NULL,
    source      TEXT NOT NULL,
    state       TEXT NOT NULL,
    error       TEXT,
    log         TEXT NOT NULL,
    created_ms  BIGINT NOT NULL,
    finished_ms BIGINT
);
CREATE INDEX template_builds_created ON template_builds(tenant, created_ms);
"#,
    // 7: what a secret holds (a value, or a TOTP seed).
    r#"
ALTER TABLE secrets ADD COLUMN kind TEXT NOT NULL DEFAULT 'value';
"#,
    // 8: volumes, and the tenants' quota on their size.
    r#"
CREATE TABLE volumes (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    size_bytes BIGINT NOT NULL,
    node       TEXT,
    created_ms BIGINT NOT NULL,
    UNIQUE (tenant, name)
);
ALTER TABLE tenants ADD COLUMN max_volume_mib BIGINT NOT NULL DEFAULT 102400;
"#,
    // 9: E2B's secrets: name, metadata and version beside their vault rows.
    r#"
CREATE TABLE e2b_secrets (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    metadata   TEXT NOT NULL,
    version    BIGINT NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    UNIQUE (tenant, name)
);
"#,
];

/// The PostgreSQL schema version this build writes.
pub const PG_SCHEMA_VERSION: u32 = PG_MIGRATIONS.len() as u32;

/// Serializes migrations between replicas starting at once (an advisory lock id of its own).
const MIGRATION_LOCK: i64 = 0x7370_6163_6500_0001;

/// Brings a PostgreSQL schema to [`PG_SCHEMA_VERSION`] in one transaction, or refuses a
/// newer one.
pub(super) fn migrate_postgres(client: &mut postgres::Client) -> Result<(), StoreError> {
    let mut tx = client.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")?;
    let version: Option<i64> = tx
        .query_opt("SELECT version FROM schema_version", &[])?
        .map(|r| r.get(0));
    if version.is_none() {
        tx.execute("INSERT INTO schema_version (version) VALUES (0)", &[])?;
    }
    let version = u32::try_from(version.unwrap_or(0)).unwrap_or(u32::MAX);
    if version > PG_SCHEMA_VERSION {
        return Err(StoreError::Invalid(format!(
            "the state database has schema version {version}, newer than the version \
             {PG_SCHEMA_VERSION} this build of space understands; run a newer space"
        )));
    }
    for (i, sql) in PG_MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.batch_execute(sql)?;
        tx.execute("UPDATE schema_version SET version = $1", &[&(i as i64 + 1)])?;
    }
    tx.commit()?;
    Ok(())
}

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
