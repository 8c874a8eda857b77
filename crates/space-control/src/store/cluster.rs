//! The cluster's nodes, their leases and join tokens, and which node owns each sandbox.
//!
//! Times that decide leases are the database's own clock ([`sql::Kind::now_ms`]), never a
//! replica's, so replicas with skewed clocks agree on whether a node's lease has run out.

use super::*;

/// Longest node id, in bytes (it is also the DNS name in the node's certificate).
pub const MAX_NODE_ID_BYTES: usize = 63;

/// Whether `id` is a well-formed node id: `[a-z0-9][a-z0-9-]{0,62}`, not ending in `-`.
pub fn is_node_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NODE_ID_BYTES
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1] != b'-'
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn validate_node_id(id: &str) -> Result<(), StoreError> {
    if is_node_id(id) {
        Ok(())
    } else {
        Err(StoreError::Invalid(format!(
            "node id {:?} must be 1 to {MAX_NODE_ID_BYTES} characters from [a-z0-9-], starting \
             with a letter or digit and not ending in -",
            truncate(id, 80)
        )))
    }
}

/// Where a node is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Takes new sandboxes.
    Active,
    /// Keeps what it runs, takes nothing new; its sandboxes are being moved off.
    Draining,
    /// Its lease ran out past the grace period; its sandboxes were given to other nodes. It
    /// must join again (a new incarnation) to take part.
    Lost,
    /// Taken out of the cluster by an operator.
    Removed,
}

impl NodeState {
    /// Its name in the database and the API.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Active => "active",
            NodeState::Draining => "draining",
            NodeState::Lost => "lost",
            NodeState::Removed => "removed",
        }
    }

    fn parse(s: &str) -> Result<NodeState, StoreError> {
        Ok(match s {
            "active" => NodeState::Active,
            "draining" => NodeState::Draining,
            "lost" => NodeState::Lost,
            "removed" => NodeState::Removed,
            other => return Err(StoreError::Database(format!("node state {other:?}"))),
        })
    }
}

/// A node as the database knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRow {
    /// Its id.
    pub id: String,
    /// Where its node API listens (`host:port`).
    pub address: String,
    /// Bumped at every join: a node that comes back after being lost is a new incarnation.
    pub incarnation: i64,
    /// Where it is in its life.
    pub state: NodeState,
    /// When its lease runs out, ms on the database's clock.
    pub lease_expires_ms: u64,
    /// Whether the lease is still running (at the time of the query, on the database clock).
    pub live: bool,
    /// When it (last) joined.
    pub joined_unix_ms: u64,
    /// What it last reported (capacity, templates, pools; `docs/cluster.md`), as JSON.
    pub report: serde_json::Value,
}

const NODE_COLUMNS: &str =
    "id, address, incarnation, state, lease_expires_ms, joined_unix_ms, report";

fn node_row(r: &Row, now: i64) -> Result<NodeRow, StoreError> {
    let lease = r.int(4)?;
    Ok(NodeRow {
        id: r.text(0)?,
        address: r.text(1)?,
        incarnation: r.int(2)?,
        state: NodeState::parse(&r.text(3)?)?,
        lease_expires_ms: from_db(lease),
        live: lease > now,
        joined_unix_ms: from_db(r.int(5)?),
        report: serde_json::from_str(&r.text(6)?)
            .map_err(|e| StoreError::Database(format!("a node's report: {e}")))?,
    })
}

/// The database's clock, in ms since the Unix epoch.
pub(super) fn db_now(c: &mut dyn Sql) -> Result<i64, StoreError> {
    let sql = format!("SELECT {}", c.kind().now_ms());
    one(c, &sql, args![], |r| r.int(0))?
        .ok_or_else(|| StoreError::Database("the database has no clock".into()))
}

/// A new join token: what is shown once to the operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinToken {
    /// Its id (public).
    pub id: String,
    /// The token itself, `spacejoin_<id>_<secret>`; only its hash is stored.
    pub token: String,
    /// When it stops working, ms since the Unix epoch.
    pub expires_unix_ms: u64,
}

fn join_parts(token: &str) -> Option<(&str, &str)> {
    let rest = token.strip_prefix("spacejoin_")?;
    let (id, secret) = rest.split_once('_')?;
    let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_alphanumeric());
    (ok(id, 12) && ok(secret, 32)).then_some((id, secret))
}

pub(crate) fn random_alnum(n: usize) -> String {
    use rand::Rng as _;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rngs::OsRng;
    (0..n)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// What a node sends when it joins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeJoin {
    /// The id it asks for.
    pub id: String,
    /// Where its node API listens.
    pub address: String,
    /// SHA-256 (hex) of the secret it will present on heartbeats.
    pub token_hash: String,
    /// What it reports.
    pub report: serde_json::Value,
}

impl Store {
    /// Makes a join token valid for `ttl_ms`.
    pub async fn create_join_token(&self, ttl_ms: u64) -> Result<JoinToken, StoreError> {
        let id = random_alnum(12);
        let secret = random_alnum(32);
        let token = format!("spacejoin_{id}_{secret}");
        let hash = keys::hash(&token);
        let expires = now_ms().saturating_add(ttl_ms);
        let tid = id.clone();
        self.write(move |c| {
            c.execute(
                "INSERT INTO join_tokens (id, hash, created_unix_ms, expires_unix_ms)
                 VALUES ($1, $2, $3, $4)",
                args![tid.as_str(), hash.as_str(), to_db(now_ms()), to_db(expires)],
            )?;
            Ok(())
        })
        .await?;
        Ok(JoinToken {
            id,
            token,
            expires_unix_ms: expires,
        })
    }

    /// Uses up a join token and records the node it admits (a new node, or a new incarnation
    /// of one that joined before), with a lease of `lease_ms`. `Invalid` for a malformed,
    /// unknown, used or expired token (one message for all, so a probe learns nothing).
    pub async fn join_node(
        &self,
        token: &str,
        join: NodeJoin,
        lease_ms: u64,
    ) -> Result<NodeRow, StoreError> {
        validate_node_id(&join.id)?;
        let refused =
            || StoreError::Invalid("the join token is not valid (unknown, used or expired)".into());
        let (tid, _) = join_parts(token).ok_or_else(refused)?;
        let (tid, token) = (tid.to_owned(), token.to_owned());
        let report = serde_json::to_string(&join.report)
            .map_err(|e| StoreError::Database(format!("encoding the node report: {e}")))?;
        self.write(move |c| {
            let now = db_now(c)?;
            let row = one(
                c,
                "SELECT hash, expires_unix_ms, used_unix_ms FROM join_tokens WHERE id = $1",
                args![tid.as_str()],
                |r| Ok((r.text(0)?, r.int(1)?, r.opt_int(2)?)),
            )?;
            let Some((hash, expires, used)) = row else {
                return Err(refused());
            };
            if !keys::verify(&token, &hash) || used.is_some() || expires <= now {
                return Err(refused());
            }
            c.execute(
                "UPDATE join_tokens SET used_unix_ms = $2, used_by = $3 WHERE id = $1",
                args![tid.as_str(), now, join.id.as_str()],
            )?;
            let previous = one(
                c,
                "SELECT incarnation, state FROM nodes WHERE id = $1",
                args![join.id.as_str()],
                |r| Ok((r.int(0)?, r.text(1)?)),
            )?;
            let lease = now.saturating_add(to_db(lease_ms));
            match previous {
                Some((incarnation, _)) => {
                    c.execute(
                        "UPDATE nodes SET address = $2, incarnation = $3, state = 'active',
                           lease_expires_ms = $4, joined_unix_ms = $5, token_hash = $6,
                           report = $7
                         WHERE id = $1",
                        args![
                            join.id.as_str(),
                            join.address.as_str(),
                            incarnation + 1,
                            lease,
                            now,
                            join.token_hash.as_str(),
                            report.as_str()
                        ],
                    )?;
                }
                None => {
                    c.execute(
                        &format!(
                            "INSERT INTO nodes ({NODE_COLUMNS}, token_hash)
                             VALUES ($1, $2, 1, 'active', $3, $4, $5, $6)"
                        ),
                        args![
                            join.id.as_str(),
                            join.address.as_str(),
                            lease,
                            now,
                            report.as_str(),
                            join.token_hash.as_str()
                        ],
                    )?;
                }
            }
            get_node(c, &join.id, now)?
                .ok_or_else(|| StoreError::Database("a joined node vanished".into()))
        })
        .await
    }

    /// A node that joined before comes back (after a restart, or after it was lost): with
    /// its secret, it gets a new incarnation, an active state and a fresh lease. `NotFound`
    /// for an unknown node, a wrong secret, or a node an operator removed.
    pub async fn rejoin_node(
        &self,
        id: &str,
        secret: &str,
        address: &str,
        report: &serde_json::Value,
        lease_ms: u64,
    ) -> Result<NodeRow, StoreError> {
        validate_node_id(id)?;
        let report = serde_json::to_string(report)
            .map_err(|e| StoreError::Database(format!("encoding the node report: {e}")))?;
        let (id, secret, address) = (id.to_owned(), secret.to_owned(), address.to_owned());
        self.write(move |c| {
            let gone = || StoreError::NotFound {
                what: "node",
                id: id.clone(),
            };
            let now = db_now(c)?;
            let (hash, incarnation) = one(
                c,
                "SELECT token_hash, incarnation FROM nodes WHERE id = $1 AND state <> 'removed'",
                args![id.as_str()],
                |r| Ok((r.text(0)?, r.int(1)?)),
            )?
            .ok_or_else(gone)?;
            if !keys::verify(&secret, &hash) {
                return Err(gone());
            }
            c.execute(
                "UPDATE nodes SET address = $2, incarnation = $3, state = 'active',
                   lease_expires_ms = $4, joined_unix_ms = $5, report = $6
                 WHERE id = $1",
                args![
                    id.as_str(),
                    address.as_str(),
                    incarnation + 1,
                    now.saturating_add(to_db(lease_ms)),
                    now,
                    report.as_str()
                ],
            )?;
            get_node(c, &id, now)?.ok_or_else(gone)
        })
        .await
    }

    /// Renews the lease of incarnation `incarnation` of node `id` for `lease_ms` and records
    /// its report. `NotFound` when the node is unknown, the secret wrong, the incarnation not
    /// the current one, or the node lost or removed: it must stop and join again.
    pub async fn heartbeat(
        &self,
        id: &str,
        incarnation: i64,
        secret: &str,
        report: &serde_json::Value,
        lease_ms: u64,
    ) -> Result<NodeRow, StoreError> {
        validate_node_id(id)?;
        let report = serde_json::to_string(report)
            .map_err(|e| StoreError::Database(format!("encoding the node report: {e}")))?;
        let (id, secret) = (id.to_owned(), secret.to_owned());
        self.write(move |c| {
            let gone = || StoreError::NotFound {
                what: "node incarnation",
                id: format!("{id}/{incarnation}"),
            };
            let now = db_now(c)?;
            let hash = one(
                c,
                "SELECT token_hash FROM nodes WHERE id = $1 AND incarnation = $2
                   AND state IN ('active', 'draining')",
                args![id.as_str(), incarnation],
                |r| r.text(0),
            )?
            .ok_or_else(gone)?;
            if !keys::verify(&secret, &hash) {
                return Err(gone());
            }
            c.execute(
                "UPDATE nodes SET lease_expires_ms = $3, report = $4
                 WHERE id = $1 AND incarnation = $2",
                args![
                    id.as_str(),
                    incarnation,
                    now.saturating_add(to_db(lease_ms)),
                    report.as_str()
                ],
            )?;
            get_node(c, &id, now)?.ok_or_else(gone)
        })
        .await
    }

    /// Whether `secret` is that of incarnation `incarnation` of node `id`, a member now.
    pub async fn node_authentic(
        &self,
        id: &str,
        incarnation: i64,
        secret: &str,
    ) -> Result<bool, StoreError> {
        validate_node_id(id)?;
        let (id, secret) = (id.to_owned(), secret.to_owned());
        self.read(move |c| {
            let hash = one(
                c,
                "SELECT token_hash FROM nodes WHERE id = $1 AND incarnation = $2
                   AND state IN ('active', 'draining')",
                args![id.as_str(), incarnation],
                |r| r.text(0),
            )?;
            Ok(hash.is_some_and(|h| keys::verify(&secret, &h)))
        })
        .await
    }

    /// Every node ever joined (removed ones included), by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        self.read(|c| {
            let now = db_now(c)?;
            rows(
                c,
                &format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY id"),
                args![],
                |r| node_row(r, now),
            )
        })
        .await
    }

    /// One node.
    pub async fn node(&self, id: &str) -> Result<Option<NodeRow>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            let now = db_now(c)?;
            get_node(c, &id, now)
        })
        .await
    }

    /// Sets a node's state (drain, remove); `NotFound` for an unknown node.
    pub async fn set_node_state(&self, id: &str, state: NodeState) -> Result<NodeRow, StoreError> {
        let id = id.to_owned();
        self.write(move |c| {
            let n = c.execute(
                "UPDATE nodes SET state = $2 WHERE id = $1",
                args![id.as_str(), state.as_str()],
            )?;
            let now = db_now(c)?;
            if n == 0 {
                return Err(StoreError::NotFound {
                    what: "node",
                    id: id.clone(),
                });
            }
            get_node(c, &id, now)?.ok_or_else(|| StoreError::NotFound {
                what: "node",
                id: id.clone(),
            })
        })
        .await
    }

    /// Marks lost every active or draining node whose lease ran out more than `grace_ms` ago
    /// and returns them. Safe to run on every replica at once: a node is returned by exactly
    /// one of them.
    pub async fn mark_lost(&self, grace_ms: u64) -> Result<Vec<NodeRow>, StoreError> {
        self.write(move |c| {
            let now = db_now(c)?;
            let cutoff = now.saturating_sub(to_db(grace_ms));
            let lost = rows(
                c,
                &format!(
                    "UPDATE nodes SET state = 'lost'
                     WHERE state IN ('active', 'draining') AND lease_expires_ms < $1
                     RETURNING {NODE_COLUMNS}"
                ),
                args![cutoff],
                |r| node_row(r, now),
            )?;
            Ok(lost)
        })
        .await
    }

    // ---- sandbox placement ----

    /// Reserves `memory_mib` on node `node` for `ttl_ms` if what the node last reported free,
    /// less the reservations still running, leaves room; returns the reservation's id, or
    /// `None` when it does not fit. The check and the reservation are one transaction, with
    /// the node's row locked in PostgreSQL, so two replicas never book the same memory.
    /// Reservations are not released when the create ends: they run out after `ttl_ms`, by
    /// when the node's own report counts the new VM.
    pub async fn reserve(
        &self,
        node: &str,
        memory_mib: u64,
        ttl_ms: u64,
    ) -> Result<Option<String>, StoreError> {
        let node = node.to_owned();
        self.write(move |c| {
            let lock = match c.kind() {
                sql::Kind::Postgres => " FOR UPDATE",
                sql::Kind::Sqlite => "",
            };
            let now = db_now(c)?;
            let Some(report) = one(
                c,
                &format!(
                    "SELECT report FROM nodes WHERE id = $1 AND state = 'active' \
                     AND lease_expires_ms > $2{lock}"
                ),
                args![node.as_str(), now],
                |r| r.text(0),
            )?
            else {
                return Ok(None);
            };
            let report: serde_json::Value = serde_json::from_str(&report)
                .map_err(|e| StoreError::Database(format!("a node's report: {e}")))?;
            let free = report["memory_free_mib"].as_u64().unwrap_or(0);
            let held = one(
                c,
                "SELECT CAST(COALESCE(SUM(memory_mib), 0) AS BIGINT) FROM reservations
                 WHERE node = $1 AND expires_ms > $2",
                args![node.as_str(), now],
                |r| r.int(0),
            )?
            .map_or(0, from_db);
            if held.saturating_add(memory_mib) > free {
                return Ok(None);
            }
            c.execute(
                "DELETE FROM reservations WHERE node = $1 AND expires_ms <= $2",
                args![node.as_str(), now],
            )?;
            let id = random_alnum(16);
            c.execute(
                "INSERT INTO reservations (id, node, memory_mib, expires_ms) VALUES ($1, $2, $3, $4)",
                args![
                    id.as_str(),
                    node.as_str(),
                    to_db(memory_mib),
                    now.saturating_add(to_db(ttl_ms))
                ],
            )?;
            Ok(Some(id))
        })
        .await
    }

    /// Claims `name` for `holder` for `ttl_ms` (on the database's clock): answers whether
    /// `holder` holds it now. A claim that ran out is taken over; the holder claiming again
    /// extends it. Work that must be done once in the cluster (making a tenant's key, moving
    /// a lost node's sandbox) runs under one.
    pub async fn claim(&self, name: &str, holder: &str, ttl_ms: u64) -> Result<bool, StoreError> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.write(move |c| {
            let now = db_now(c)?;
            let until = now.saturating_add(to_db(ttl_ms));
            c.execute(
                "INSERT INTO claims (name, holder, until_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,
                   until_ms = excluded.until_ms
                 WHERE claims.until_ms <= $4 OR claims.holder = excluded.holder",
                args![name.as_str(), holder.as_str(), until, now],
            )?;
            let now_holder = one(
                c,
                "SELECT holder FROM claims WHERE name = $1",
                args![name.as_str()],
                |r| r.text(0),
            )?;
            Ok(now_holder.as_deref() == Some(holder.as_str()))
        })
        .await
    }

    /// Gives up `holder`'s claim of `name` (a claim of another holder stays).
    pub async fn release_claim(&self, name: &str, holder: &str) -> Result<(), StoreError> {
        let (name, holder) = (name.to_owned(), holder.to_owned());
        self.write(move |c| {
            c.execute(
                "DELETE FROM claims WHERE name = $1 AND holder = $2",
                args![name.as_str(), holder.as_str()],
            )?;
            Ok(())
        })
        .await
    }

    /// Memory held by running reservations, per node.
    pub async fn reserved(&self) -> Result<std::collections::HashMap<String, u64>, StoreError> {
        self.read(|c| {
            let now = db_now(c)?;
            let held = rows(
                c,
                "SELECT node, CAST(SUM(memory_mib) AS BIGINT) FROM reservations
                 WHERE expires_ms > $1 GROUP BY node",
                args![now],
                |r| Ok((r.text(0)?, from_db(r.int(1)?))),
            )?;
            Ok(held.into_iter().collect())
        })
        .await
    }

    /// Drops a reservation at once (its create failed, so nothing will use the memory).
    pub async fn release(&self, reservation: &str) -> Result<(), StoreError> {
        let id = reservation.to_owned();
        self.read(move |c| {
            c.execute("DELETE FROM reservations WHERE id = $1", args![id.as_str()])?;
            Ok(())
        })
        .await
    }

    /// The node that owns sandbox `id` and its epoch, if it is placed (`None` for `space up`'s
    /// sandboxes, which live on the one in-process node).
    pub async fn sandbox_node(&self, id: &str) -> Result<Option<(String, i64)>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            Ok(one(
                c,
                "SELECT node, epoch FROM sandboxes WHERE id = $1",
                args![id.as_str()],
                |r| Ok(r.opt_text(0)?.map(|n| (n, r.int(1).unwrap_or(0)))),
            )?
            .flatten())
        })
        .await
    }

    /// Gives sandbox `id` to `node` if it is still owned by `from` at epoch `epoch` (or
    /// unplaced, for `from = None`), bumping the epoch; returns the new epoch, or `None` when
    /// another replica moved it first. Every change of owner goes through here, so two
    /// replicas can never both move one sandbox.
    pub async fn move_sandbox(
        &self,
        id: &str,
        from: Option<(&str, i64)>,
        node: &str,
    ) -> Result<Option<i64>, StoreError> {
        self.move_guarded(id, from, None, node).await
    }

    /// [`Store::move_sandbox`] from node `from`, lost as incarnation `incarnation`: the move
    /// happens only while that node is still lost as that incarnation. The node's row is
    /// locked for the move (PostgreSQL), so a rejoin of the node waits for it, and the
    /// rejoined node's first heartbeat sees the new owner: a node never continues a sandbox
    /// that is being restored elsewhere.
    pub async fn move_from_lost(
        &self,
        id: &str,
        from: (&str, i64),
        incarnation: i64,
        node: &str,
    ) -> Result<Option<i64>, StoreError> {
        self.move_guarded(id, Some(from), Some(incarnation), node)
            .await
    }

    async fn move_guarded(
        &self,
        id: &str,
        from: Option<(&str, i64)>,
        lost: Option<i64>,
        node: &str,
    ) -> Result<Option<i64>, StoreError> {
        validate_node_id(node)?;
        let (id, node) = (id.to_owned(), node.to_owned());
        let from = from.map(|(n, e)| (n.to_owned(), e));
        self.write(move |c| {
            if let (Some((old, _)), Some(incarnation)) = (&from, lost) {
                let lock = match c.kind() {
                    sql::Kind::Postgres => " FOR UPDATE",
                    sql::Kind::Sqlite => "",
                };
                let still = one(
                    c,
                    &format!(
                        "SELECT 1 FROM nodes WHERE id = $1 AND state = 'lost' \
                         AND incarnation = $2{lock}"
                    ),
                    args![old.as_str(), incarnation],
                    |r| r.int(0),
                )?;
                if still.is_none() {
                    return Ok(None);
                }
            }
            let n = match &from {
                Some((old, epoch)) => c.execute(
                    "UPDATE sandboxes SET node = $2, epoch = epoch + 1
                     WHERE id = $1 AND node = $3 AND epoch = $4",
                    args![id.as_str(), node.as_str(), old.as_str(), *epoch],
                )?,
                None => c.execute(
                    "UPDATE sandboxes SET node = $2, epoch = epoch + 1
                     WHERE id = $1 AND node IS NULL",
                    args![id.as_str(), node.as_str()],
                )?,
            };
            if n == 0 {
                return Ok(None);
            }
            one(
                c,
                "SELECT epoch FROM sandboxes WHERE id = $1",
                args![id.as_str()],
                |r| r.int(0),
            )
        })
        .await
    }

    /// The owner node and epoch of each of `ids` that has an ownership row (`None`:
    /// recorded, but placed nowhere, as on `space up`). Ids without a row are left out.
    pub async fn owners(
        &self,
        ids: Vec<String>,
    ) -> Result<std::collections::HashMap<String, (Option<String>, i64)>, StoreError> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        self.read(move |c| {
            let mut out = std::collections::HashMap::new();
            for chunk in ids.chunks(500) {
                let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
                let args: Vec<Value> = chunk.iter().map(|i| Value::Text(i.clone())).collect();
                let found = rows(
                    c,
                    &format!(
                        "SELECT id, node, epoch FROM sandboxes WHERE id IN ({})",
                        marks.join(", ")
                    ),
                    &args,
                    |r| Ok((r.text(0)?, (r.opt_text(1)?, r.int(2)?))),
                )?;
                out.extend(found);
            }
            Ok(out)
        })
        .await
    }

    /// The sandboxes node `node` owns, with their epochs.
    pub async fn sandboxes_on(&self, node: &str) -> Result<Vec<(String, i64)>, StoreError> {
        let node = node.to_owned();
        self.read(move |c| {
            rows(
                c,
                "SELECT id, epoch FROM sandboxes WHERE node = $1 ORDER BY id",
                args![node.as_str()],
                |r| Ok((r.text(0)?, r.int(1)?)),
            )
        })
        .await
    }
}

fn get_node(c: &mut dyn Sql, id: &str, now: i64) -> Result<Option<NodeRow>, StoreError> {
    one(
        c,
        &format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = $1"),
        args![id],
        |r| node_row(r, now),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_dns_labels() {
        for ok in ["a", "node-1", "n0", &"a".repeat(63)] {
            assert!(is_node_id(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "Node", "a_b", "a.b", &"a".repeat(64), "é"] {
            assert!(!is_node_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn join_tokens_parse_strictly() {
        let t = format!("spacejoin_{}_{}", "a".repeat(12), "b".repeat(32));
        assert!(join_parts(&t).is_some());
        for bad in [
            "spacejoin_",
            "space_abc_def",
            &format!("spacejoin_{}_{}", "a".repeat(11), "b".repeat(32)),
            &format!("spacejoin_{}_{}!", "a".repeat(12), "b".repeat(31)),
        ] {
            assert!(join_parts(bad).is_none(), "{bad}");
        }
    }
}
