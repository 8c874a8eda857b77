//! Tenants, API keys and authentication, sandbox ownership, the audit log.

use super::*;

impl Store {
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
