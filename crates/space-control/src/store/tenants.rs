//! Tenants, API keys and authentication, sandbox ownership, the audit log.

use super::*;

impl Store {
    // ---- tenants ----

    /// Creates a tenant; `Conflict` if the name is taken.
    pub async fn create_tenant(
        &self,
        name: &TenantName,
        quotas: Quotas,
    ) -> Result<Tenant, StoreError> {
        let name = name.clone();
        self.write(move |c| insert_tenant(c, &name, quotas)).await
    }

    /// Creates a tenant and its first key in one transaction, so a failure leaves neither;
    /// `Conflict` if the name is taken, `Invalid` for a bad label.
    pub async fn create_tenant_with_key(
        &self,
        name: &TenantName,
        quotas: Quotas,
        admin: bool,
        label: Option<&str>,
    ) -> Result<(Tenant, KeyCreated), StoreError> {
        let name = name.clone();
        let label = label.map(str::to_owned);
        self.write(move |c| {
            let tenant = insert_tenant(c, &name, quotas)?;
            let key = insert_key(c, &name, admin, label.as_deref())?;
            Ok((tenant, key))
        })
        .await
    }

    /// The tenant named `name`, if it exists.
    pub async fn tenant(&self, name: &TenantName) -> Result<Option<Tenant>, StoreError> {
        let name = name.clone();
        self.read(move |c| get_tenant(c, &name)).await
    }

    /// Every tenant, by name.
    pub async fn tenants(&self) -> Result<Vec<Tenant>, StoreError> {
        self.read(|c| {
            rows(
                c,
                &format!("SELECT {TENANT_COLUMNS} FROM tenants ORDER BY name"),
                args![],
                tenant_row,
            )
        })
        .await
    }

    /// Replaces a tenant's quotas; `NotFound` for an unknown tenant.
    pub async fn set_quotas(
        &self,
        name: &TenantName,
        quotas: Quotas,
    ) -> Result<Tenant, StoreError> {
        quotas.validate()?;
        let name = name.clone();
        self.write(move |c| {
            let n = c.execute(
                "UPDATE tenants SET max_sandboxes = $2, max_vcpus = $3, max_memory_mib = $4,
                   max_suspended_ms = $5, max_volume_mib = $6
                 WHERE name = $1",
                args![
                    name.as_str(),
                    quotas.max_sandboxes,
                    quotas.max_vcpus,
                    to_db(quotas.max_memory_mib),
                    quotas.max_suspended_ms.map(to_db),
                    to_db(quotas.max_volume_mib)
                ],
            )?;
            if n == 0 {
                return Err(StoreError::NotFound {
                    what: "tenant",
                    id: name.to_string(),
                });
            }
            get_tenant(c, &name)?.ok_or_else(|| StoreError::NotFound {
                what: "tenant",
                id: name.to_string(),
            })
        })
        .await
    }

    // ---- keys ----

    /// Makes a key for `tenant`; `NotFound` for an unknown tenant, `Invalid` for a label
    /// over [`MAX_LABEL_CHARS`] characters or with control characters. Only the hash of the
    /// key is stored.
    pub async fn create_key(
        &self,
        tenant: &TenantName,
        admin: bool,
        label: Option<&str>,
    ) -> Result<KeyCreated, StoreError> {
        let tenant = tenant.clone();
        let label = label.map(str::to_owned);
        self.write(move |c| insert_key(c, &tenant, admin, label.as_deref()))
            .await
    }

    /// The keys of `tenant`, oldest first, revoked ones included.
    pub async fn keys(&self, tenant: &TenantName) -> Result<Vec<KeyInfo>, StoreError> {
        let tenant = tenant.clone();
        self.read(move |c| {
            rows(
                c,
                &format!(
                    "SELECT {KEY_COLUMNS} FROM api_keys WHERE tenant = $1 \
                     ORDER BY created_unix_ms, id"
                ),
                args![tenant.as_str()],
                key_row,
            )
        })
        .await
    }

    /// The key with id `id`, if it exists; `Invalid` for a malformed id.
    pub async fn key(&self, id: &str) -> Result<Option<KeyInfo>, StoreError> {
        validate_key_id(id)?;
        let id = id.to_owned();
        self.read(move |c| get_key(c, &id)).await
    }

    /// Revokes a key and returns it. Revoking a revoked key changes nothing (it keeps the
    /// first revocation time). `NotFound` for an unknown key, `Invalid` for a malformed id.
    pub async fn revoke_key(&self, id: &str) -> Result<KeyInfo, StoreError> {
        validate_key_id(id)?;
        let id = id.to_owned();
        self.write(move |c| {
            if c.kind() == sql::Kind::Postgres {
                // Two revokes at once must not each see the other's key as the admin left.
                c.execute("LOCK TABLE api_keys IN SHARE ROW EXCLUSIVE MODE", args![])?;
            }
            let key = get_key(c, &id)?.ok_or_else(|| StoreError::NotFound {
                what: "key",
                id: id.clone(),
            })?;
            if key.revoked_unix_ms.is_some() {
                return Ok(key);
            }
            if key.admin && live_admin_keys(c)? <= 1 {
                return Err(StoreError::LastAdmin(id.clone()));
            }
            c.execute(
                "UPDATE api_keys SET revoked_unix_ms = $2
                 WHERE id = $1 AND revoked_unix_ms IS NULL",
                args![id.as_str(), to_db(now_ms())],
            )?;
            get_key(c, &id)?.ok_or_else(|| StoreError::NotFound {
                what: "key",
                id: id.clone(),
            })
        })
        .await
    }

    /// Checks an `Authorization` header value, which must be exactly `Bearer <key>`.
    ///
    /// The key is looked up by its id and its hash compared in constant time; the key itself
    /// is never stored or logged. A wrong secret is [`AuthError::Unknown`], like an unknown
    /// id; [`AuthError::Revoked`] needs the right secret.
    pub async fn authenticate(
        &self,
        authorization_header: Option<&str>,
    ) -> Result<Principal, AuthError> {
        let header = authorization_header.ok_or(AuthError::Missing)?;
        let key = header.strip_prefix("Bearer ").ok_or(AuthError::Malformed)?;
        let key_id = keys::parse(key).ok_or(AuthError::Malformed)?.to_owned();
        let id = key_id.clone();
        let row = self
            .read(move |c| {
                one(
                    c,
                    "SELECT tenant, admin, hash, revoked_unix_ms FROM api_keys WHERE id = $1",
                    args![id.as_str()],
                    |r| Ok((r.text(0)?, r.boolean(1)?, r.text(2)?, r.opt_int(3)?)),
                )
            })
            .await
            .map_err(AuthError::Store)?;
        let unknown = || AuthError::Unknown {
            key_id: key_id.clone(),
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
                key_id: key_id.clone(),
                tenant,
            });
        }
        Ok(Principal {
            tenant,
            key_id,
            admin,
        })
    }

    /// On a store without any tenant, creates `tenant` with default quotas and an admin key
    /// labelled `bootstrap`, and returns that key; otherwise returns `None`, so restarting a
    /// server never makes another key.
    pub async fn bootstrap(&self, tenant: &TenantName) -> Result<Option<KeyCreated>, StoreError> {
        let tenant = tenant.clone();
        self.write(move |c| {
            if c.kind() == sql::Kind::Postgres {
                // Replicas starting at once must not each make a tenant and a key.
                c.execute("LOCK TABLE tenants IN EXCLUSIVE MODE", args![])?;
            }
            let count = one(c, "SELECT COUNT(*) FROM tenants", args![], |r| r.int(0))?;
            if count.unwrap_or(0) > 0 {
                return Ok(None);
            }
            insert_tenant(c, &tenant, Quotas::default())?;
            insert_key(c, &tenant, true, Some("bootstrap")).map(Some)
        })
        .await
    }

    // ---- sandbox ownership ----

    /// Records that sandbox `id` belongs to `tenant`. `Conflict` if the id is recorded for
    /// another tenant (for the same one it is a no-op), `NotFound` for an unknown tenant,
    /// `Invalid` for a malformed id.
    pub async fn add_sandbox(&self, id: &str, tenant: &TenantName) -> Result<(), StoreError> {
        validate_sandbox_id(id)?;
        let (id, tenant) = (id.to_owned(), tenant.clone());
        self.write(move |c| {
            if get_tenant(c, &tenant)?.is_none() {
                return Err(StoreError::NotFound {
                    what: "tenant",
                    id: tenant.to_string(),
                });
            }
            let n = c.execute(
                "INSERT INTO sandboxes (id, tenant, created_unix_ms) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
                args![id.as_str(), tenant.as_str(), to_db(now_ms())],
            )?;
            if n == 0 {
                // Recording the same owner again changes nothing (placement records a
                // sandbox before the create's own ownership step does).
                let owner = one(
                    c,
                    "SELECT tenant FROM sandboxes WHERE id = $1",
                    args![id.as_str()],
                    |r| r.text(0),
                )?;
                if owner.as_deref() != Some(tenant.as_str()) {
                    return Err(StoreError::Conflict(format!(
                        "sandbox {id} has an owner already"
                    )));
                }
            }
            Ok(())
        })
        .await
    }

    /// Forgets the owner of sandbox `id` (for a sandbox whose creation failed); returns
    /// whether it was recorded.
    pub async fn remove_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.write(move |c| {
            c.execute("DELETE FROM ports WHERE sandbox = $1", args![id.as_str()])?;
            Ok(c.execute("DELETE FROM sandboxes WHERE id = $1", args![id.as_str()])? > 0)
        })
        .await
    }

    /// The tenant that owns sandbox `id`, if it is recorded.
    pub async fn sandbox_tenant(&self, id: &str) -> Result<Option<TenantName>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            one(
                c,
                "SELECT tenant FROM sandboxes WHERE id = $1",
                args![id.as_str()],
                |r| tenant_from_db(r.text(0)?),
            )
        })
        .await
    }

    /// The sandboxes `tenant` owns, in the order they were recorded.
    pub async fn sandboxes_of(&self, tenant: &TenantName) -> Result<Vec<String>, StoreError> {
        let tenant = tenant.clone();
        self.read(move |c| {
            let seq = c.kind().seq();
            rows(
                c,
                &format!("SELECT id FROM sandboxes WHERE tenant = $1 ORDER BY {seq}"),
                args![tenant.as_str()],
                |r| r.text(0),
            )
        })
        .await
    }

    /// Every recorded sandbox with its owner, in the order they were recorded.
    pub async fn owned_sandboxes(&self) -> Result<Vec<(String, TenantName)>, StoreError> {
        self.read(|c| {
            let seq = c.kind().seq();
            rows(
                c,
                &format!("SELECT id, tenant FROM sandboxes ORDER BY {seq}"),
                args![],
                |r| Ok((r.text(0)?, tenant_from_db(r.text(1)?)?)),
            )
        })
        .await
    }

    // ---- audit ----

    /// Records an audit event stamped with the current time and returns its id. Long fields
    /// are cut (on a character boundary) rather than refused, so recording never fails for
    /// the caller's input.
    pub async fn record(&self, event: NewAuditEvent) -> Result<i64, StoreError> {
        self.read(move |c| insert_audit(c, now_ms(), event)).await
    }

    /// Records events that happened earlier (`(when, event)`, ms since the Unix epoch), in
    /// one transaction: all of them or none. Returns how many.
    pub async fn record_all_at(
        &self,
        events: Vec<(u64, NewAuditEvent)>,
    ) -> Result<u64, StoreError> {
        self.write(move |c| {
            let n = events.len() as u64;
            for (at, e) in events {
                insert_audit(c, at, e)?;
            }
            Ok(n)
        })
        .await
    }

    /// [`Store::record`] for a thread outside the runtime.
    pub fn record_blocking(&self, event: NewAuditEvent) -> Result<i64, StoreError> {
        self.read_blocking(move |c| insert_audit(c, now_ms(), event))
    }

    /// Audit events matching `filter`, newest first.
    pub async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEvent>, StoreError> {
        let mut conds: Vec<String> = Vec::new();
        let mut args: Vec<Value> = Vec::new();
        let mut add = |column: &str, op: &str, v: Value| {
            args.push(v);
            conds.push(format!("{column} {op} ${}", args.len()));
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
            add("at_unix_ms", ">=", Value::Int(to_db(t)));
        }
        let limit = filter.limit.clamp(1, MAX_AUDIT_LIMIT);
        args.push(Value::Int(i64::from(limit)));
        let mut sql = String::from(
            "SELECT id, at_unix_ms, tenant, key_id, sandbox, operation, result, detail FROM audit",
        );
        if !conds.is_empty() {
            sql.push_str(" WHERE ");
            sql.push_str(&conds.join(" AND "));
        }
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", args.len()));
        self.read(move |c| rows(c, &sql, &args, audit_row)).await
    }
}

fn insert_audit(c: &mut dyn Sql, at_unix_ms: u64, event: NewAuditEvent) -> Result<i64, StoreError> {
    let id = one(
        c,
        "INSERT INTO audit (at_unix_ms, tenant, key_id, sandbox, operation, result, detail)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        args![
            to_db(at_unix_ms),
            event.tenant.as_ref().map(TenantName::as_str),
            event.key_id.map(|s| bounded(s, MAX_AUDIT_FIELD_BYTES)),
            event.sandbox.map(|s| bounded(s, MAX_AUDIT_FIELD_BYTES)),
            bounded(event.operation, MAX_AUDIT_FIELD_BYTES),
            bounded(event.result, MAX_AUDIT_FIELD_BYTES),
            event.detail.map(|s| bounded(s, MAX_DETAIL_BYTES)),
        ],
        |r| r.int(0),
    )?;
    id.ok_or_else(|| StoreError::Database("an audit insert returned no id".into()))
}

/// How many admin keys are not revoked, across all tenants.
fn live_admin_keys(c: &mut dyn Sql) -> Result<i64, StoreError> {
    let n = one(
        c,
        "SELECT COUNT(*) FROM api_keys WHERE admin = $1 AND revoked_unix_ms IS NULL",
        args![true],
        |r| r.int(0),
    )?;
    Ok(n.unwrap_or(0))
}
