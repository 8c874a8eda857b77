//! Who owns a template name, and the template builds (jobs) with their state and log.
//!
//! A template name with no owner row is public (the stock templates, an admin's builds); a
//! name a tenant built is that tenant's alone: only it sees the name, builds new versions of
//! it and makes sandboxes of it.

use super::cluster::db_now;
use super::*;

/// The most of a build's log the store keeps (its end).
pub const MAX_STORED_LOG: usize = 1 << 20;

/// A template build as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildRow {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub version: String,
    /// The source, for people.
    pub source: String,
    /// `waiting` (an E2B template request whose steps have not come), `running`,
    /// `succeeded` or `failed`.
    pub state: String,
    pub error: Option<String>,
    /// The log (the end of it) once the build ended.
    pub log: String,
    pub created_ms: u64,
    pub finished_ms: Option<u64>,
}

const BUILD_COLUMNS: &str =
    "id, tenant, name, version, source, state, error, log, created_ms, finished_ms";

fn build_row(r: &Row) -> Result<BuildRow, StoreError> {
    Ok(BuildRow {
        id: r.text(0)?,
        tenant: r.text(1)?,
        name: r.text(2)?,
        version: r.text(3)?,
        source: r.text(4)?,
        state: r.text(5)?,
        error: r.opt_text(6)?,
        log: r.text(7)?,
        created_ms: from_db(r.int(8)?),
        finished_ms: r.opt_int(9)?.map(from_db),
    })
}

fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    s[cut..].to_owned()
}

impl Store {
    /// The owner of template `name`, if it is private.
    pub async fn template_owner(&self, name: &str) -> Result<Option<String>, StoreError> {
        let name = name.to_owned();
        self.read(move |c| {
            one(
                c,
                "SELECT tenant FROM template_owners WHERE name = $1",
                args![name.as_str()],
                |r| r.text(0),
            )
        })
        .await
    }

    /// Every private template name and its owner.
    pub async fn template_owners(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.read(|c| {
            rows(
                c,
                "SELECT name, tenant FROM template_owners ORDER BY name",
                args![],
                |r| Ok((r.text(0)?, r.text(1)?)),
            )
        })
        .await
    }

    /// Makes `name` the private template of `tenant` (nothing if it is already); refused
    /// ([`StoreError::Conflict`]) when another tenant owns it.
    pub async fn claim_template(&self, name: &str, tenant: &TenantName) -> Result<(), StoreError> {
        let (name, tenant) = (name.to_owned(), tenant.to_string());
        self.write(move |c| {
            let owner = one(
                c,
                "SELECT tenant FROM template_owners WHERE name = $1",
                args![name.as_str()],
                |r| r.text(0),
            )?;
            match owner {
                Some(o) if o == tenant => Ok(()),
                Some(_) => Err(StoreError::Conflict(format!(
                    "the template name {name} is taken"
                ))),
                None => {
                    c.execute(
                        "INSERT INTO template_owners (name, tenant) VALUES ($1, $2)",
                        args![name.as_str(), tenant.as_str()],
                    )?;
                    Ok(())
                }
            }
        })
        .await
    }

    /// Forgets the owner of `name` (its last version is gone).
    pub async fn release_template(&self, name: &str) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.write(move |c| {
            c.execute(
                "DELETE FROM template_owners WHERE name = $1",
                args![name.as_str()],
            )?;
            Ok(())
        })
        .await
    }

    /// Records a build that starts now (`running`), or one that waits for what it builds
    /// (`waiting`: E2B's template request, whose steps come in a second call, `source`
    /// holding what the request asked).
    pub async fn insert_build(&self, b: &BuildRow) -> Result<(), StoreError> {
        if !matches!(b.state.as_str(), "running" | "waiting") {
            return Err(StoreError::Invalid(format!(
                "a build starts running or waiting, not {}",
                b.state
            )));
        }
        let b = b.clone();
        self.write(move |c| {
            let now = db_now(c)?;
            c.execute(
                "INSERT INTO template_builds (id, tenant, name, version, source, state, error,
                     log, created_ms, finished_ms)
                 VALUES ($1, $2, $3, $4, $5, $6, NULL, '', $7, NULL)",
                args![
                    b.id.as_str(),
                    b.tenant.as_str(),
                    b.name.as_str(),
                    b.version.as_str(),
                    b.source.as_str(),
                    b.state.as_str(),
                    now
                ],
            )?;
            Ok(())
        })
        .await
    }

    /// Starts waiting build `id` as version `version` from `source`; `false` when it is not
    /// waiting (started already, or unknown), so it starts once.
    pub async fn start_waiting_build(
        &self,
        id: &str,
        version: &str,
        source: &str,
    ) -> Result<bool, StoreError> {
        let (id, version, source) = (id.to_owned(), version.to_owned(), source.to_owned());
        self.write(move |c| {
            let n = c.execute(
                "UPDATE template_builds SET state = 'running', version = $2, source = $3
                 WHERE id = $1 AND state = 'waiting'",
                args![id.as_str(), version.as_str(), source.as_str()],
            )?;
            Ok(n == 1)
        })
        .await
    }

    /// Ends a build: `error` `None` for success; its log (the end of it) kept.
    pub async fn finish_build(
        &self,
        id: &str,
        error: Option<&str>,
        log: &str,
    ) -> Result<(), StoreError> {
        let (id, error, log) = (
            id.to_owned(),
            error.map(str::to_owned),
            tail(log, MAX_STORED_LOG),
        );
        self.write(move |c| {
            let now = db_now(c)?;
            let state = if error.is_some() {
                "failed"
            } else {
                "succeeded"
            };
            c.execute(
                "UPDATE template_builds SET state = $2, error = $3, log = $4, finished_ms = $5
                 WHERE id = $1",
                args![id.as_str(), state, error.as_deref(), log.as_str(), now],
            )?;
            Ok(())
        })
        .await
    }

    /// One build.
    pub async fn build(&self, id: &str) -> Result<Option<BuildRow>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            one(
                c,
                &format!("SELECT {BUILD_COLUMNS} FROM template_builds WHERE id = $1"),
                args![id.as_str()],
                build_row,
            )
        })
        .await
    }

    /// The newest builds of `tenant` (every tenant's with `None`), newest first.
    pub async fn builds(
        &self,
        tenant: Option<&TenantName>,
        limit: u32,
    ) -> Result<Vec<BuildRow>, StoreError> {
        let tenant = tenant.map(|t| t.to_string());
        self.read(move |c| match &tenant {
            Some(t) => rows(
                c,
                &format!(
                    "SELECT {BUILD_COLUMNS} FROM template_builds WHERE tenant = $1
                     ORDER BY created_ms DESC, id LIMIT $2"
                ),
                args![t.as_str(), i64::from(limit)],
                build_row,
            ),
            None => rows(
                c,
                &format!(
                    "SELECT {BUILD_COLUMNS} FROM template_builds
                     ORDER BY created_ms DESC, id LIMIT $1"
                ),
                args![i64::from(limit)],
                build_row,
            ),
        })
        .await
    }

    /// Marks the builds still running as failed with `why` (a control plane that starts finds
    /// the builds of one that died). Answers how many.
    pub async fn fail_running_builds(&self, why: &str) -> Result<u64, StoreError> {
        let why = why.to_owned();
        self.write(move |c| {
            let now = db_now(c)?;
            c.execute(
                "UPDATE template_builds SET state = 'failed', error = $1, finished_ms = $2
                 WHERE state = 'running'",
                args![why.as_str(), now],
            )
        })
        .await
    }
}
