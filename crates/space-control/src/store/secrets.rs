//! Secrets (sealed by the vault), exposed ports, and small metadata values.

use super::*;

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
