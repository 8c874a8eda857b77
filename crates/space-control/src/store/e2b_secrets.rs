//! E2B's secrets (`docs/e2b.md`, *Secrets*): a name any E2B program may choose, metadata and
//! a version, beside a vault row (`secrets`) that holds the sealed value under the vault name
//! [`E2bSecretRow::vault_name`]. Both change in one transaction.

use super::secrets::upsert_secret;
use super::*;

/// An E2B secret's record; its value is the vault row [`E2bSecretRow::vault_name`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSecretRow {
    /// 32 lowercase hex digits.
    pub id: String,
    pub tenant: TenantName,
    /// Unique within the tenant.
    pub name: String,
    /// The caller's metadata, a JSON object of strings.
    pub metadata: String,
    /// 1 when created, one more on each update of the value.
    pub version: u64,
    pub created_unix_ms: u64,
    pub updated_unix_ms: u64,
}

impl E2bSecretRow {
    /// The vault name of the secret `id`: `_E2B_` and the id in capitals.
    pub fn vault_name_of(id: &str) -> String {
        format!("_E2B_{}", id.to_ascii_uppercase())
    }

    /// The vault name its value is kept under.
    pub fn vault_name(&self) -> String {
        Self::vault_name_of(&self.id)
    }
}

const COLUMNS: &str = "id, tenant, name, metadata, version, created_ms, updated_ms";

fn e2b_secret_row(row: &Row) -> Result<E2bSecretRow, StoreError> {
    Ok(E2bSecretRow {
        id: row.text(0)?,
        tenant: tenant_from_db(row.text(1)?)?,
        name: row.text(2)?,
        metadata: row.text(3)?,
        version: from_db(row.int(4)?),
        created_unix_ms: from_db(row.int(5)?),
        updated_unix_ms: from_db(row.int(6)?),
    })
}

/// How an E2B secret is looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum E2bSecretKey<'a> {
    Id(&'a str),
    Name(&'a str),
}

fn get(
    c: &mut dyn Sql,
    tenant: &TenantName,
    key: E2bSecretKey<'_>,
) -> Result<Option<E2bSecretRow>, StoreError> {
    let (column, value) = match key {
        E2bSecretKey::Id(id) => ("id", id),
        E2bSecretKey::Name(name) => ("name", name),
    };
    one(
        c,
        &format!("SELECT {COLUMNS} FROM e2b_secrets WHERE tenant = $1 AND {column} = $2"),
        args![tenant.as_str(), value],
        e2b_secret_row,
    )
}

fn hosts_json(sealed: &SecretRow) -> Result<String, StoreError> {
    serde_json::to_string(&sealed.hosts)
        .map_err(|e| StoreError::Database(format!("encoding the secret's hosts: {e}")))
}

impl Store {
    /// Records a new E2B secret and its sealed value (`sealed`, under the row's vault name)
    /// together. `Conflict` when the tenant has a secret of that name; `Invalid` when it
    /// keeps `limit` vault secrets already; `NotFound` for an unknown tenant.
    pub async fn insert_e2b_secret(
        &self,
        row: &E2bSecretRow,
        sealed: &SecretRow,
        limit: usize,
    ) -> Result<(), StoreError> {
        let hosts = hosts_json(sealed)?;
        let (row, sealed) = (row.clone(), sealed.clone());
        self.write(move |c| {
            if get_tenant(c, &row.tenant)?.is_none() {
                return Err(StoreError::NotFound {
                    what: "tenant",
                    id: row.tenant.to_string(),
                });
            }
            let taken = one(
                c,
                "SELECT id FROM e2b_secrets WHERE tenant = $1 AND name = $2",
                args![row.tenant.as_str(), row.name.as_str()],
                |r| r.text(0),
            )?;
            if taken.is_some() {
                return Err(StoreError::Conflict(format!(
                    "a secret named {:?} exists already",
                    row.name
                )));
            }
            let held = one(
                c,
                "SELECT COUNT(*) FROM secrets WHERE tenant = $1",
                args![row.tenant.as_str()],
                |r| r.int(0),
            )?
            .unwrap_or(0);
            if from_db(held) >= limit as u64 {
                return Err(StoreError::Invalid(format!(
                    "a tenant keeps at most {limit} secrets"
                )));
            }
            c.execute(
                &format!("INSERT INTO e2b_secrets ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7)"),
                args![
                    row.id.as_str(),
                    row.tenant.as_str(),
                    row.name.as_str(),
                    row.metadata.as_str(),
                    to_db(row.version),
                    to_db(row.created_unix_ms),
                    to_db(row.updated_unix_ms)
                ],
            )?;
            upsert_secret(c, &sealed, &hosts).map(|_| ())
        })
        .await
    }

    /// Stores a new value (`sealed`, under the secret's vault name) of the E2B secret `id`
    /// as its next version, and replaces its metadata when `metadata` is given; answers the
    /// record after the change, or `None` when there is no such secret.
    pub async fn update_e2b_secret(
        &self,
        tenant: &TenantName,
        id: &str,
        sealed: &SecretRow,
        metadata: Option<String>,
    ) -> Result<Option<E2bSecretRow>, StoreError> {
        let hosts = hosts_json(sealed)?;
        let (tenant, id, sealed) = (tenant.clone(), id.to_owned(), sealed.clone());
        self.write(move |c| {
            let changed = c.execute(
                "UPDATE e2b_secrets SET version = version + 1, updated_ms = $3,
                 metadata = COALESCE($4, metadata) WHERE tenant = $1 AND id = $2",
                args![
                    tenant.as_str(),
                    id.as_str(),
                    to_db(sealed.updated_unix_ms),
                    metadata.as_deref()
                ],
            )?;
            if changed == 0 {
                return Ok(None);
            }
            upsert_secret(c, &sealed, &hosts)?;
            get(c, &tenant, E2bSecretKey::Id(&id))
        })
        .await
    }

    /// The E2B secret of `tenant` with this id or name.
    pub async fn e2b_secret(
        &self,
        tenant: &TenantName,
        key: E2bSecretKey<'_>,
    ) -> Result<Option<E2bSecretRow>, StoreError> {
        let tenant = tenant.clone();
        let (by_id, value) = match key {
            E2bSecretKey::Id(v) => (true, v.to_owned()),
            E2bSecretKey::Name(v) => (false, v.to_owned()),
        };
        self.read(move |c| {
            let key = if by_id {
                E2bSecretKey::Id(&value)
            } else {
                E2bSecretKey::Name(&value)
            };
            get(c, &tenant, key)
        })
        .await
    }

    /// The E2B secrets of `tenant`, oldest first.
    pub async fn e2b_secrets(&self, tenant: &TenantName) -> Result<Vec<E2bSecretRow>, StoreError> {
        let tenant = tenant.clone();
        self.read(move |c| {
            rows(
                c,
                &format!(
                    "SELECT {COLUMNS} FROM e2b_secrets WHERE tenant = $1
                     ORDER BY created_ms, id"
                ),
                args![tenant.as_str()],
                e2b_secret_row,
            )
        })
        .await
    }

    /// Deletes the E2B secret `id` of `tenant` and its value; returns whether it existed.
    pub async fn delete_e2b_secret(
        &self,
        tenant: &TenantName,
        id: &str,
    ) -> Result<bool, StoreError> {
        let (tenant, id) = (tenant.clone(), id.to_owned());
        self.write(move |c| {
            let gone = c.execute(
                "DELETE FROM e2b_secrets WHERE tenant = $1 AND id = $2",
                args![tenant.as_str(), id.as_str()],
            )? > 0;
            if gone {
                c.execute(
                    "DELETE FROM secrets WHERE tenant = $1 AND name = $2",
                    args![tenant.as_str(), E2bSecretRow::vault_name_of(&id).as_str()],
                )?;
            }
            Ok(gone)
        })
        .await
    }
}
