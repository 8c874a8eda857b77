//! The control plane's state: tenants, API keys, sandbox ownership and the audit log, kept in
//! SQLite (one process, `space up`) or PostgreSQL (any number of control replicas).
//!
//! Every method is async and runs its statements on tokio's blocking pool, so a slow disk or
//! a far database never stalls a worker thread. Both databases run the same statements
//! (`sql`); each has its own numbered migrations (`schema`). SQLite has one connection behind
//! a mutex, in WAL mode with `synchronous=NORMAL`, so a committed change survives a crash of
//! the process (and at worst the last few transactions are lost on a power failure).
//! PostgreSQL has a small pool of connections (`pg`).
//!
//! Opening a database applies the missing migrations in one transaction; a database written
//! by a newer build is refused.
//!
//! The parts: the types callers see (`model`), the statements' common ground (`sql`), the
//! schema and its migrations (`schema`), the PostgreSQL pool (`pg`), tenants, keys,
//! ownership and audit (`tenants`), secrets, ports and metadata (`secrets`).

use std::fmt;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, TransactionBehavior};
use serde::{Deserialize, Serialize};

use crate::keys;

pub(crate) mod cluster;
mod e2b_secrets;
mod idempotency;
mod model;
mod pg;
mod schema;
mod secrets;
pub(crate) mod sql;
mod templates;
mod tenants;
#[cfg(test)]
mod tests;
mod volumes;

pub use cluster::{is_node_id, JoinToken, NodeJoin, NodeRow, NodeState, MAX_NODE_ID_BYTES};
pub use e2b_secrets::{E2bSecretKey, E2bSecretRow};
pub use idempotency::{CreateKey, CREATE_KEY_TTL_MS};
pub use model::*;
#[cfg(test)]
use schema::MIGRATIONS;
pub use schema::SCHEMA_VERSION;
use schema::{configure, migrate};
use sql::{args, Row, Sql, Sqlite, Value};
pub use templates::{BuildRow, MAX_STORED_LOG};
pub use volumes::VolumeRow;

/// How long a statement waits for a lock held by another connection.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The state store. Cheap to share behind an `Arc`; every call is independent.
pub struct Store {
    db: Arc<Db>,
}

/// The database behind a store.
enum Db {
    Sqlite(Mutex<Connection>),
    Postgres(Box<pg::Pool>),
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

fn tenant_from_db(name: String) -> Result<TenantName, StoreError> {
    TenantName::try_from(name).map_err(|e| StoreError::Database(format!("a tenant name: {e}")))
}

fn tenant_row(row: &Row) -> Result<Tenant, StoreError> {
    Ok(Tenant {
        name: tenant_from_db(row.text(0)?)?,
        created_unix_ms: from_db(row.int(1)?),
        quotas: Quotas {
            max_sandboxes: u32::try_from(row.int(2)?).unwrap_or(0),
            max_vcpus: u32::try_from(row.int(3)?).unwrap_or(0),
            max_memory_mib: from_db(row.int(4)?),
            max_suspended_ms: row.opt_int(5)?.map(from_db),
            max_volume_mib: from_db(row.int(6)?),
        },
    })
}

const TENANT_COLUMNS: &str =
    "name, created_unix_ms, max_sandboxes, max_vcpus, max_memory_mib, max_suspended_ms, \
     max_volume_mib";

fn key_row(row: &Row) -> Result<KeyInfo, StoreError> {
    Ok(KeyInfo {
        id: row.text(0)?,
        tenant: tenant_from_db(row.text(1)?)?,
        admin: row.boolean(2)?,
        label: row.opt_text(3)?,
        created_unix_ms: from_db(row.int(4)?),
        revoked_unix_ms: row.opt_int(5)?.map(from_db),
    })
}

const KEY_COLUMNS: &str = "id, tenant, admin, label, created_unix_ms, revoked_unix_ms";

fn audit_row(row: &Row) -> Result<AuditEvent, StoreError> {
    Ok(AuditEvent {
        id: row.int(0)?,
        at_unix_ms: from_db(row.int(1)?),
        tenant: row.opt_text(2)?.map(tenant_from_db).transpose()?,
        key_id: row.opt_text(3)?,
        sandbox: row.opt_text(4)?,
        operation: row.text(5)?,
        result: row.text(6)?,
        detail: row.opt_text(7)?,
    })
}

/// Every row of a query, each through `f`.
fn rows<T>(
    db: &mut dyn Sql,
    sql: &str,
    args: &[Value],
    f: impl Fn(&Row) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    db.query(sql, args)?.iter().map(f).collect()
}

/// The first row of a query through `f`, if there is one.
fn one<T>(
    db: &mut dyn Sql,
    sql: &str,
    args: &[Value],
    f: impl Fn(&Row) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    db.one(sql, args)?.as_ref().map(f).transpose()
}

fn get_tenant(db: &mut dyn Sql, name: &TenantName) -> Result<Option<Tenant>, StoreError> {
    one(
        db,
        &format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE name = $1"),
        args![name.as_str()],
        tenant_row,
    )
}

fn get_key(db: &mut dyn Sql, id: &str) -> Result<Option<KeyInfo>, StoreError> {
    one(
        db,
        &format!("SELECT {KEY_COLUMNS} FROM api_keys WHERE id = $1"),
        args![id],
        key_row,
    )
}

fn insert_tenant(
    db: &mut dyn Sql,
    name: &TenantName,
    quotas: Quotas,
) -> Result<Tenant, StoreError> {
    quotas.validate()?;
    if get_tenant(db, name)?.is_some() {
        return Err(StoreError::Conflict(format!(
            "tenant {name} exists already"
        )));
    }
    let tenant = Tenant {
        name: name.clone(),
        created_unix_ms: now_ms(),
        quotas,
    };
    db.execute(
        "INSERT INTO tenants (name, created_unix_ms, max_sandboxes, max_vcpus, max_memory_mib,
                              max_suspended_ms, max_volume_mib)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        args![
            name.as_str(),
            to_db(tenant.created_unix_ms),
            quotas.max_sandboxes,
            quotas.max_vcpus,
            to_db(quotas.max_memory_mib),
            quotas.max_suspended_ms.map(to_db),
            to_db(quotas.max_volume_mib),
        ],
    )?;
    Ok(tenant)
}

fn insert_key(
    db: &mut dyn Sql,
    tenant: &TenantName,
    admin: bool,
    label: Option<&str>,
) -> Result<KeyCreated, StoreError> {
    if let Some(label) = label {
        validate_label(label)?;
    }
    if get_tenant(db, tenant)?.is_none() {
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
        let inserted = db.execute(
            "INSERT INTO api_keys (id, tenant, admin, label, hash, created_unix_ms)
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
            args![
                id.as_str(),
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

/// Prepares a SQLite database file: its directory, and mode 0600 before SQLite creates it
/// (SQLite gives its WAL and shared-memory files the same mode).
fn prepare_sqlite_file(path: &Path) -> Result<(), StoreError> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            fs::create_dir_all(parent)?;
        }
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// Whether a `--database` value names PostgreSQL rather than a SQLite file.
pub fn is_postgres_url(database: &str) -> bool {
    database.starts_with("postgres://") || database.starts_with("postgresql://")
}

impl Store {
    /// Opens (creating if needed) the SQLite database at `path`, creating its parent
    /// directories. The file is readable by its owner only (mode 0600).
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        prepare_sqlite_file(path)?;
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        migrate(&mut conn, &path.display().to_string())?;
        Ok(Store::sqlite(conn))
    }

    /// Opens a private SQLite database in memory (for tests).
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let mut conn = Connection::open_in_memory()?;
        configure(&conn)?;
        migrate(&mut conn, "in memory")?;
        Ok(Store::sqlite(conn))
    }

    fn sqlite(conn: Connection) -> Store {
        Store {
            db: Arc::new(Db::Sqlite(Mutex::new(conn))),
        }
    }

    /// Connects to the PostgreSQL database at `url` (`postgres://user@host/db`, or
    /// `postgres://user@/db?host=/run/postgresql` for a Unix socket) and brings its schema up
    /// to date; several replicas may do this at once.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        let url = url.to_owned();
        let pool = tokio::task::spawn_blocking(move || pg::Pool::open(&url))
            .await
            .map_err(|e| StoreError::Database(format!("connecting: {e}")))??;
        Ok(Store {
            db: Arc::new(Db::Postgres(Box::new(pool))),
        })
    }

    /// Opens what a `--database` value names: a PostgreSQL URL or a SQLite file.
    pub async fn open_database(database: &str) -> Result<Store, StoreError> {
        if is_postgres_url(database) {
            Store::connect(database).await
        } else {
            let path = Path::new(database.strip_prefix("sqlite://").unwrap_or(database));
            let path = path.to_owned();
            tokio::task::spawn_blocking(move || Store::open(&path))
                .await
                .map_err(|e| StoreError::Database(format!("opening: {e}")))?
        }
    }

    /// `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        match &*self.db {
            Db::Sqlite(_) => "sqlite",
            Db::Postgres(_) => "postgres",
        }
    }

    /// Runs `f` on a connection, on the blocking pool.
    pub(crate) async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Sql) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.read(f))
            .await
            .map_err(|e| StoreError::Database(format!("a store call failed: {e}")))?
    }

    /// Runs `f` in a transaction, on the blocking pool, and commits when it succeeds.
    pub(crate) async fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn Sql) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.write(f))
            .await
            .map_err(|e| StoreError::Database(format!("a store call failed: {e}")))?
    }

    /// The SQLite connection itself (tests of SQLite's own settings).
    #[cfg(test)]
    pub(crate) fn sqlite_conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        match &*self.db {
            Db::Sqlite(m) => Db::sqlite_conn(m),
            Db::Postgres(_) => panic!("not a SQLite store"),
        }
    }

    /// [`Store::read`] for a thread outside the runtime.
    pub(crate) fn read_blocking<T>(
        &self,
        f: impl FnOnce(&mut dyn Sql) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.db.read(f)
    }
}

impl Db {
    fn sqlite_conn(m: &Mutex<Connection>) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while the lock was held cannot leave SQLite inconsistent: an unfinished
        // transaction is rolled back when it is dropped.
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read<T>(
        &self,
        f: impl FnOnce(&mut dyn Sql) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self {
            Db::Sqlite(m) => f(&mut Sqlite(&Self::sqlite_conn(m))),
            Db::Postgres(p) => {
                let mut c = p.get()?;
                let out = f(&mut sql::Postgres(c.client()));
                c.done(out.as_ref().err());
                out
            }
        }
    }

    fn write<T>(
        &self,
        f: impl FnOnce(&mut dyn Sql) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self {
            Db::Sqlite(m) => {
                let mut conn = Self::sqlite_conn(m);
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let out = f(&mut Sqlite(&tx))?;
                tx.commit()?;
                Ok(out)
            }
            Db::Postgres(p) => {
                let mut c = p.get()?;
                let out = (|| {
                    let mut tx = c.client().transaction()?;
                    let out = f(&mut sql::Postgres(&mut tx))?;
                    tx.commit()?;
                    Ok(out)
                })();
                c.done(out.as_ref().err());
                out
            }
        }
    }
}
