//! Secrets (sealed by the vault), exposed ports, and small metadata values.

use super::*;
use space_node_api::secrets::SecretKind;

fn secret_row(row: &Row) -> Result<SecretRow, StoreError> {
    let hosts: Vec<String> = serde_json::from_str(&row.text(2)?)
        .map_err(|e| StoreError::Database(format!("a secret's hosts: {e}")))?;
    Ok(SecretRow {
        tenant: tenant_from_db(row.text(0)?)?,
        name: row.text(1)?,
        hosts,
        nonce: row.blob(3)?,
        ciphertext: row.blob(4)?,
        created_unix_ms: from_db(row.int(5)?),
        updated_unix_ms: from_db(row.int(6)?),
        kind: {
            let k = row.text(7)?;
            SecretKind::parse(&k)
                .ok_or_else(|| StoreError::Database(format!("a secret of unknown kind {k:?}")))?
        },
    })
}

const SECRET_COLUMNS: &str =
    "tenant, name, hosts, nonce, ciphertext, created_unix_ms, updated_unix_ms, kind";

fn port_row(row: &Row) -> Result<PortInfo, StoreError> {
    Ok(PortInfo {
        sandbox: row.text(0)?,
        port: u16::try_from(row.int(1)?).unwrap_or(0),
        created_unix_ms: from_db(row.int(2)?),
    })
}

fn get_secret(
    c: &mut dyn Sql,
    tenant: &TenantName,
    name: &str,
) -> Result<Option<SecretRow>, StoreError> {
    one(
        c,
        &format!("SELECT {SECRET_COLUMNS} FROM secrets WHERE tenant = $1 AND name = $2"),
        args![tenant.as_str(), name],
        secret_row,
    )
}

/// Writes the sealed secret `row` (its hosts encoded as `hosts`), replacing one of its name
/// and keeping that one's creation time; answers whether it is new.
pub(super) fn upsert_secret(
    c: &mut dyn Sql,
    row: &SecretRow,
    hosts: &str,
) -> Result<bool, StoreError> {
    let replaced = c.execute(
        "UPDATE secrets SET hosts = $3, nonce = $4, ciphertext = $5, updated_unix_ms = $6,
         kind = $7 WHERE tenant = $1 AND name = $2",
        args![
            row.tenant.as_str(),
            row.name.as_str(),
            hosts,
            row.nonce.as_slice(),
            row.ciphertext.as_slice(),
            to_db(row.updated_unix_ms),
            row.kind.as_str()
        ],
    )?;
    if replaced > 0 {
        return Ok(false);
    }
    c.execute(
        &format!("INSERT INTO secrets ({SECRET_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"),
        args![
            row.tenant.as_str(),
            row.name.as_str(),
            hosts,
            row.nonce.as_slice(),
            row.ciphertext.as_slice(),
            to_db(row.created_unix_ms),
            to_db(row.updated_unix_ms),
            row.kind.as_str()
        ],
    )?;
    Ok(true)
}

impl Store {
    // ---- vault ----

    /// Stores (or replaces) the sealed secret `row.name` of `row.tenant`; returns whether it
    /// is new. A replacement keeps the creation time. `NotFound` for an unknown tenant.
    pub async fn put_secret(&self, row: &SecretRow) -> Result<bool, StoreError> {
        let hosts = serde_json::to_string(&row.hosts)
            .map_err(|e| StoreError::Database(format!("encoding the secret's hosts: {e}")))?;
        let row = row.clone();
        self.write(move |c| {
            if get_tenant(c, &row.tenant)?.is_none() {
                return Err(StoreError::NotFound {
                    what: "tenant",
                    id: row.tenant.to_string(),
                });
            }
            upsert_secret(c, &row, &hosts)
        })
        .await
    }

    /// The sealed secret `name` of `tenant`, if it exists.
    pub async fn secret(
        &self,
        tenant: &TenantName,
        name: &str,
    ) -> Result<Option<SecretRow>, StoreError> {
        let (tenant, name) = (tenant.clone(), name.to_owned());
        self.read(move |c| get_secret(c, &tenant, &name)).await
    }

    /// The secrets of `tenant` by name, without their values.
    pub async fn secrets(&self, tenant: &TenantName) -> Result<Vec<SecretInfo>, StoreError> {
        let tenant = tenant.clone();
        let rows = self
            .read(move |c| {
                rows(
                    c,
                    &format!(
                        "SELECT {SECRET_COLUMNS} FROM secrets WHERE tenant = $1 ORDER BY name"
                    ),
                    args![tenant.as_str()],
                    secret_row,
                )
            })
            .await?;
        Ok(rows.iter().map(SecretInfo::from).collect())
    }

    /// The oldest sealed secret of any tenant, if there is one.
    pub async fn any_secret(&self) -> Result<Option<SecretRow>, StoreError> {
        self.read(|c| {
            let seq = c.kind().seq();
            one(
                c,
                &format!("SELECT {SECRET_COLUMNS} FROM secrets ORDER BY {seq} LIMIT 1"),
                args![],
                secret_row,
            )
        })
        .await
    }

    /// Deletes the secret `name` of `tenant`; returns whether it existed.
    pub async fn delete_secret(&self, tenant: &TenantName, name: &str) -> Result<bool, StoreError> {
        let (tenant, name) = (tenant.clone(), name.to_owned());
        self.read(move |c| {
            Ok(c.execute(
                "DELETE FROM secrets WHERE tenant = $1 AND name = $2",
                args![tenant.as_str(), name.as_str()],
            )? > 0)
        })
        .await
    }

    /// A value of the store's own bookkeeping (`meta` table).
    pub async fn meta(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = key.to_owned();
        self.read(move |c| {
            one(
                c,
                "SELECT value FROM meta WHERE key = $1",
                args![key.as_str()],
                |r| r.blob(0),
            )
        })
        .await
    }

    /// Sets `key` in the `meta` table unless it is set already; returns the value in effect.
    pub async fn meta_init(&self, key: &str, value: &[u8]) -> Result<Vec<u8>, StoreError> {
        let (key, value) = (key.to_owned(), value.to_vec());
        self.write(move |c| {
            c.execute(
                "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                args![key.as_str(), value],
            )?;
            one(
                c,
                "SELECT value FROM meta WHERE key = $1",
                args![key.as_str()],
                |r| r.blob(0),
            )?
            .ok_or_else(|| StoreError::Database(format!("meta value {key} vanished")))
        })
        .await
    }

    // ---- ingress ports ----

    /// Exposes `port` of the owned sandbox `sandbox` under the token whose SHA-256 (hex) is
    /// `token_hash`, replacing the token of a port exposed already; returns the port and
    /// whether it was exposed before. `NotFound` when no tenant owns the sandbox.
    pub async fn expose_port(
        &self,
        sandbox: &str,
        port: u16,
        token_hash: &str,
    ) -> Result<(PortInfo, bool), StoreError> {
        validate_sandbox_id(sandbox)?;
        let (sandbox, token_hash) = (sandbox.to_owned(), token_hash.to_owned());
        self.write(move |c| {
            let owned = one(
                c,
                "SELECT 1 FROM sandboxes WHERE id = $1",
                args![sandbox.as_str()],
                |r| r.int(0),
            )?;
            if owned.is_none() {
                return Err(StoreError::NotFound {
                    what: "sandbox",
                    id: sandbox.clone(),
                });
            }
            let replaced = c.execute(
                "DELETE FROM ports WHERE sandbox = $1 AND port = $2",
                args![sandbox.as_str(), port],
            )? > 0;
            let info = PortInfo {
                sandbox: sandbox.clone(),
                port,
                created_unix_ms: now_ms(),
            };
            c.execute(
                "INSERT INTO ports (sandbox, port, token_hash, created_unix_ms)
                 VALUES ($1, $2, $3, $4)",
                args![
                    sandbox.as_str(),
                    port,
                    token_hash.as_str(),
                    to_db(info.created_unix_ms)
                ],
            )?;
            Ok((info, replaced))
        })
        .await
    }

    /// The exposed ports of `sandbox`, by port.
    pub async fn ports(&self, sandbox: &str) -> Result<Vec<PortInfo>, StoreError> {
        let sandbox = sandbox.to_owned();
        self.read(move |c| {
            rows(
                c,
                "SELECT sandbox, port, created_unix_ms FROM ports WHERE sandbox = $1 ORDER BY port",
                args![sandbox.as_str()],
                port_row,
            )
        })
        .await
    }

    /// Revokes the URL of `port` of `sandbox`; returns whether it was exposed.
    pub async fn unexpose_port(&self, sandbox: &str, port: u16) -> Result<bool, StoreError> {
        let sandbox = sandbox.to_owned();
        self.read(move |c| {
            Ok(c.execute(
                "DELETE FROM ports WHERE sandbox = $1 AND port = $2",
                args![sandbox.as_str(), port],
            )? > 0)
        })
        .await
    }

    /// Revokes every exposed port of `sandbox`; returns how many there were.
    pub async fn unexpose_all(&self, sandbox: &str) -> Result<usize, StoreError> {
        let sandbox = sandbox.to_owned();
        self.read(move |c| {
            let n = c.execute(
                "DELETE FROM ports WHERE sandbox = $1",
                args![sandbox.as_str()],
            )?;
            Ok(usize::try_from(n).unwrap_or(usize::MAX))
        })
        .await
    }

    /// The sandbox, port and owner an ingress token (by its SHA-256, hex) opens, if any.
    pub async fn port_by_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<(PortInfo, TenantName)>, StoreError> {
        let token_hash = token_hash.to_owned();
        self.read(move |c| {
            one(
                c,
                "SELECT p.sandbox, p.port, p.created_unix_ms, s.tenant
                 FROM ports p JOIN sandboxes s ON s.id = p.sandbox WHERE p.token_hash = $1",
                args![token_hash.as_str()],
                |r| Ok((port_row(r)?, tenant_from_db(r.text(3)?)?)),
            )
        })
        .await
    }
}
