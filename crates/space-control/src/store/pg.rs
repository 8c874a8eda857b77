//! A small pool of PostgreSQL connections for the store's blocking calls.
//!
//! Connections are made on demand up to [`MAX_CONNECTIONS`] and kept for reuse; a caller that
//! finds them all busy waits up to [`WAIT`]. A connection that failed (closed by the server,
//! a broken socket) is dropped instead of being handed out again, and the idle ones are then
//! pinged before use, so a database restart costs the calls in flight and the first call
//! after it, and nothing more.

use std::str::FromStr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use postgres::{Client, Config, NoTls};

use super::schema::migrate_postgres;
use super::StoreError;

/// Most connections one store holds open.
pub(crate) const MAX_CONNECTIONS: usize = 16;
/// How long a call waits for a free connection.
const WAIT: Duration = Duration::from_secs(30);
/// How long making a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection idle longer than this is pinged before it is handed out: an idle client does
/// not notice that the server closed it (a restart, a failover) until it is used.
const CHECK_AFTER_IDLE: Duration = Duration::from_secs(5);
/// How long that ping may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

struct Slots {
    idle: Vec<(Client, Instant)>,
    open: usize,
    /// When a connection was last found broken: connections idle since before then are
    /// pinged before use too (a database restart cuts them all at once).
    broke_at: Option<Instant>,
}

pub(crate) struct Pool {
    config: Config,
    slots: Mutex<Slots>,
    freed: Condvar,
}

/// A connection taken from the pool; [`Conn::done`] gives it back.
pub(crate) struct Conn<'a> {
    pool: &'a Pool,
    client: Option<Client>,
}

impl Pool {
    /// Parses `url`, connects once and migrates the schema.
    pub(crate) fn open(url: &str) -> Result<Pool, StoreError> {
        let mut config = Config::from_str(url).map_err(|e| {
            StoreError::Invalid(format!(
                "database URL: {e} (expected postgres://user@host/db)"
            ))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        config.application_name("space-control");
        let pool = Pool {
            config,
            slots: Mutex::new(Slots {
                idle: Vec::new(),
                open: 0,
                broke_at: None,
            }),
            freed: Condvar::new(),
        };
        let mut c = pool.get()?;
        let migrated = migrate_postgres(c.client());
        c.done(migrated.as_ref().err());
        migrated?;
        Ok(pool)
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection: an idle one, a new one while there are fewer than the most, or the
    /// first one given back within [`WAIT`].
    pub(crate) fn get(&self) -> Result<Conn<'_>, StoreError> {
        let deadline = Instant::now() + WAIT;
        let mut slots = self.slots();
        loop {
            while let Some((mut c, since)) = slots.idle.pop() {
                let stale = since.elapsed() > CHECK_AFTER_IDLE
                    || slots.broke_at.is_some_and(|b| since <= b);
                if stale {
                    drop(slots);
                    let ok = !c.is_closed() && c.is_valid(CHECK_TIMEOUT).is_ok();
                    slots = self.slots();
                    if !ok {
                        slots.open -= 1;
                        drop_client(c);
                        continue;
                    }
                } else if c.is_closed() {
                    slots.open -= 1;
                    drop_client(c);
                    continue;
                }
                return Ok(Conn {
                    pool: self,
                    client: Some(c),
                });
            }
            if slots.open < MAX_CONNECTIONS {
                slots.open += 1;
                drop(slots);
                return match self.config.connect(NoTls) {
                    Ok(c) => Ok(Conn {
                        pool: self,
                        client: Some(c),
                    }),
                    Err(e) => {
                        self.slots().open -= 1;
                        self.freed.notify_one();
                        Err(e.into())
                    }
                };
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Database(format!(
                    "all {MAX_CONNECTIONS} database connections stayed busy for {}s",
                    WAIT.as_secs()
                )));
            }
            slots = self
                .freed
                .wait_timeout(slots, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Conn<'_> {
    pub(crate) fn client(&mut self) -> &mut Client {
        self.client
            .as_mut()
            .expect("a pooled connection is present until it is given back")
    }

    /// Gives the connection back, or drops it when the call failed in a way that may have
    /// broken it (anything but a refusal of the statement itself).
    pub(crate) fn done(mut self, error: Option<&StoreError>) {
        let Some(client) = self.client.take() else {
            return;
        };
        let broken = client.is_closed() || matches!(error, Some(StoreError::Postgres(e)) if cut(e));
        let mut slots = self.pool.slots();
        if broken {
            slots.open -= 1;
            slots.broke_at = Some(Instant::now());
            drop(slots);
            drop_client(client);
        } else {
            slots.idle.push((client, Instant::now()));
        }
        self.pool.freed.notify_one();
    }
}

/// Whether an error means the connection is gone: a transport failure, or the server ending
/// the session (a FATAL error such as "terminating connection due to administrator command",
/// which arrives as the answer to the next statement).
fn cut(e: &postgres::Error) -> bool {
    match e.as_db_error() {
        None => true,
        Some(db) => {
            let code = db.code().code();
            matches!(db.severity(), "FATAL" | "PANIC")
                || code.starts_with("57")
                || code.starts_with("08")
        }
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        // Reached only when a call panicked: the connection may be mid-transaction.
        if let Some(c) = self.client.take() {
            self.pool.slots().open -= 1;
            self.pool.freed.notify_one();
            drop_client(c);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut self.slots().idle);
        for (c, _) in idle {
            drop_client(c);
        }
    }
}

/// A client owns a small runtime of its own, which must not be dropped on an async worker;
/// a store may well be dropped on one, so the client goes away on a thread of its own.
fn drop_client(c: Client) {
    if tokio::runtime::Handle::try_current().is_ok() {
        let slot = Arc::new(Mutex::new(Some(c)));
        let theirs = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("space-pg-close".into())
            .spawn(move || drop(lock_slot(&theirs).take()));
        if let Err(e) = spawned {
            // No thread for it, and dropping it here would panic: the connection is leaked
            // (the server drops it when it notices) rather than the caller brought down.
            tracing::warn!(error = %e, "no thread to close a database connection on; leaking it");
            if let Some(c) = lock_slot(&slot).take() {
                std::mem::forget(c);
            }
        }
    } else {
        drop(c);
    }
}

fn lock_slot(slot: &Mutex<Option<Client>>) -> MutexGuard<'_, Option<Client>> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}
