//! Idempotency keys of creates: a create sent again with the same key (a client's retry
//! after a lost answer) gets the sandbox the first one made instead of a second sandbox.
//!
//! A key is the tenant's for [`CREATE_KEY_TTL_MS`]. It is taken before the create starts
//! (its sandbox empty), filled in when the create succeeds, and given back when it fails, so
//! a failed create may be retried under the same key. A key whose create never finished (its
//! replica died) is taken over after [`CREATE_KEY_STALE_MS`].

use super::cluster::db_now;
use super::*;

/// How long a key names its sandbox.
pub const CREATE_KEY_TTL_MS: u64 = 24 * 3600 * 1000;
/// How long a create may hold a key before another may take it over.
pub const CREATE_KEY_STALE_MS: u64 = 10 * 60 * 1000;

/// What a key says about a create about to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateKey {
    /// The key is this create's now: make the sandbox, then [`Store::finish_create_key`].
    Fresh,
    /// The key's create made this sandbox.
    Done(String),
    /// The key's create is still running.
    Busy,
    /// The key was used for a create that asked for something else.
    Mismatch,
}

impl Store {
    /// Takes `key` of `tenant` for a create whose request hashes to `fingerprint`, or says
    /// what the key already stands for.
    pub async fn begin_create_key(
        &self,
        tenant: &TenantName,
        key: &str,
        fingerprint: &str,
    ) -> Result<CreateKey, StoreError> {
        let (tenant, key, fingerprint) =
            (tenant.to_string(), key.to_owned(), fingerprint.to_owned());
        self.write(move |c| {
            let now = db_now(c)?;
            // Keys that ran out are nobody's: every begin sweeps them.
            c.execute(
                "DELETE FROM create_keys WHERE created_ms <= $1",
                args![now.saturating_sub(to_db(CREATE_KEY_TTL_MS))],
            )?;
            let row = one(
                c,
                "SELECT fingerprint, sandbox, created_ms FROM create_keys
                 WHERE tenant = $1 AND key = $2",
                args![tenant.as_str(), key.as_str()],
                |r| Ok((r.text(0)?, r.opt_text(1)?, r.int(2)?)),
            )?;
            match row {
                None => {
                    c.execute(
                        "INSERT INTO create_keys (tenant, key, fingerprint, sandbox, created_ms)
                         VALUES ($1, $2, $3, NULL, $4)",
                        args![tenant.as_str(), key.as_str(), fingerprint.as_str(), now],
                    )?;
                    Ok(CreateKey::Fresh)
                }
                Some((f, _, _)) if f != fingerprint => Ok(CreateKey::Mismatch),
                Some((_, Some(sandbox), _)) => Ok(CreateKey::Done(sandbox)),
                Some((_, None, created))
                    if created <= now.saturating_sub(to_db(CREATE_KEY_STALE_MS)) =>
                {
                    c.execute(
                        "UPDATE create_keys SET created_ms = $3 WHERE tenant = $1 AND key = $2",
                        args![tenant.as_str(), key.as_str(), now],
                    )?;
                    Ok(CreateKey::Fresh)
                }
                Some((_, None, _)) => Ok(CreateKey::Busy),
            }
        })
        .await
    }

    /// Ends the create holding `key`: its sandbox, or `None` when it failed (the key is
    /// given back).
    pub async fn finish_create_key(
        &self,
        tenant: &TenantName,
        key: &str,
        sandbox: Option<&str>,
    ) -> Result<(), StoreError> {
        let (tenant, key) = (tenant.to_string(), key.to_owned());
        let sandbox = sandbox.map(str::to_owned);
        self.write(move |c| {
            match &sandbox {
                Some(id) => c.execute(
                    "UPDATE create_keys SET sandbox = $3 WHERE tenant = $1 AND key = $2",
                    args![tenant.as_str(), key.as_str(), id.as_str()],
                )?,
                None => c.execute(
                    "DELETE FROM create_keys WHERE tenant = $1 AND key = $2 AND sandbox IS NULL",
                    args![tenant.as_str(), key.as_str()],
                )?,
            };
            Ok(())
        })
        .await
    }
}
