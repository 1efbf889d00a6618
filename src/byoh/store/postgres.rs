//! The PostgreSQL engine of the store: one database shared by every replica.
//!
//! Owns: two connection pools — one for the reads the routes make (a status, a row, a
//! transcript), one for everything else — so that a read never waits for a connection behind
//! this replica's writes; a listener connection that hears cancellations announced by other
//! replicas (`LISTEN podhost_cancel`), reconnecting when it drops; and the replica's liveness
//! connection (`pg_live`), which holds its lock and carries its renewals.
//!
//! Invariants:
//! * A decision that depends on a row (a resume, a conditional status change) reads it
//!   `FOR UPDATE` in the transaction that writes it, so replicas' concurrent requests are
//!   decided one after the other on the latest commit.
//! * A write of a turn first updates its row under the fence's conditions (owner, epoch, open);
//!   the row lock it takes serializes it against a takeover, so a write after a takeover cannot
//!   land.
//! * A turn whose lease ran out is claimed (or failed for want of a key) only when its owner is
//!   not alive — its liveness lock is free (`pg_live`) — or is the claiming replica itself.
//! * Lease times are the database's clock (`podhost_now_ms()`).
//! * Every statement runs prepared, once per connection ([`Prepared`]): a run is one round
//!   trip, and the server parses and plans it once. A turn's append, the write of every step,
//!   is one statement that checks the fence and inserts, with no transaction around it.
//! * A cancellation is announced (`pg_notify`) in the transaction that writes it, so it is
//!   heard once it is committed; missed announcements (a dropped listener) are caught up by the
//!   owner's lease renewals, which fail for a cancelled turn.
//! * Every connection (the migration's, the pool's, the listener's) speaks TLS as the
//!   connection string's `sslmode` says, through [`pg_tls`]: verified against podhost's one
//!   TLS configuration, never falling back to plain text after a failed handshake.

use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::config::SslMode;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Row};
use tracing::{info, warn};

use super::SpecError;
use super::pg_live::Liveness;
use super::pg_tls::{self, MakeRustls};
use super::{
    COLUMNS, Fence, InvocationRow, LeaseTerms, ListQuery, Orphan, Park, ResumeOutcome,
    SessionSummary, StartOutcome, StatusRow, StoreError, Tokens, UidGrant, from_json, grant,
    judge_resume, judge_transition, list_sql, migrate, parse_status, to_json,
};
use crate::byoh::protocol::Status;
use crate::chat::message::{ChatMessage, ModelEndpoint};
use crate::exec::confine::UidRange;

/// Connections the writes' pool opens at most.
pub(super) const POOL_SIZE: usize = 16;
/// How long a request waits for a free connection of a pool before it fails. Every connection
/// busy means the server is answering, only slowly — a replica starved of CPU, or paused, finds
/// all its connections taken by its own turns — so the wait is long: a turn must not fail for
/// the replica's own slowness while its lease (checked by every write) is still its own. A
/// server that does not answer at all fails sooner, at `create_timeout`.
const POOL_WAIT: Duration = Duration::from_secs(60);
/// Connections the reads' pool opens at most.
const READ_POOL_SIZE: usize = 4;
/// The channel cancellations are announced on.
const CANCEL_CHANNEL: &str = "podhost_cancel";
/// Whether a turn whose lease ran out may be taken by the replica named `$1`: its owner is that
/// replica, or not alive (its liveness lock is free, see `pg_live`), or none.
const TAKEABLE: &str = "(owner IS NULL OR owner = $1 OR NOT podhost_alive(owner))";
/// Advisory lock keys: the uid pool's set-up (one key), and each session's take of a uid (this
/// key and a hash of the session id). The migration's lock is `migrate`'s own, a replica's
/// liveness lock `pg_live`'s.
const UID_LOCK: i64 = 0x706f_6468_6f73_7402;
const UID_SESSION_LOCK: i32 = 0x706f_6402;

/// Parses and checks a connection string; errors name it as `setting`, without its password.
/// libpq's `verify-ca` and `verify-full` are read as `require`, which verifies as much (see
/// [`pg_tls`]).
pub(super) fn config(url: &str, setting: &str) -> Result<tokio_postgres::Config, SpecError> {
    let (readable, verify) = pg_tls::tls_settings(url).map_err(|why| SpecError::Tls {
        setting: setting.to_owned(),
        value: super::redact(url),
        why,
    })?;
    let mut config =
        tokio_postgres::Config::from_str(&readable).map_err(|e| SpecError::Invalid {
            setting: setting.to_owned(),
            value: super::redact(url),
            why: super::postgres_error(&e),
        })?;
    if verify {
        config.ssl_mode(SslMode::Require);
    }
    Ok(config)
}

/// Why the pool has no connection; a connection that could not be made says why (a refused
/// certificate, say), not only that it failed.
fn pool_err(e: deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => StoreError::Pool(super::postgres_error(&e)),
        other => StoreError::Pool(other.to_string()),
    }
}

/// A handle on the PostgreSQL store. Cheap to clone.
#[derive(Clone)]
pub struct Postgres {
    pool: Pool,
    reads: Pool,
    cancels: Arc<Mutex<Option<mpsc::Receiver<String>>>>,
    /// How a connection of its own is made (the liveness one).
    connect: Arc<(tokio_postgres::Config, MakeRustls)>,
    /// This process's liveness, once it joined as a replica ([`Postgres::join`]).
    live: Arc<tokio::sync::OnceCell<Liveness>>,
}

impl std::fmt::Debug for Postgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Postgres").finish_non_exhaustive()
    }
}

/// Runs of statements prepared once per connection (the pool's statement cache): the first run
/// on a connection parses and plans `sql`, every later one is a single round trip.
trait Prepared: GenericClient {
    async fn run(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        Ok(self
            .execute(&self.prepare_cached(sql).await?, params)
            .await?)
    }

    async fn rows(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        Ok(self.query(&self.prepare_cached(sql).await?, params).await?)
    }

    async fn one(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Row, StoreError> {
        Ok(self
            .query_one(&self.prepare_cached(sql).await?, params)
            .await?)
    }

    async fn opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        Ok(self
            .query_opt(&self.prepare_cached(sql).await?, params)
            .await?)
    }
}

impl<C: GenericClient> Prepared for C {}

fn select() -> String {
    format!("SELECT {COLUMNS}, podhost_now_ms() FROM invocations")
}

fn read_row(r: &Row) -> Result<InvocationRow, StoreError> {
    let status: String = r.try_get(2)?;
    let connection: String = r.try_get(4)?;
    let pending: String = r.try_get(7)?;
    let last_resume: String = r.try_get(8)?;
    let lease_until: Option<i64> = r.try_get(13)?;
    let now: i64 = r.try_get(16)?;
    Ok(InvocationRow {
        invocation_id: r.try_get(0)?,
        session_id: r.try_get(1)?,
        status: parse_status(&status)?,
        error: r.try_get(3)?,
        connection: from_json("connection", &connection)?,
        needs_key: r.try_get(5)?,
        output_start: r.try_get::<_, i64>(6)? as usize,
        pending: from_json("pending", &pending)?,
        last_resume: from_json("last_resume", &last_resume)?,
        finished_ms: r.try_get(9)?,
        swept: r.try_get(10)?,
        owner: r.try_get(11)?,
        epoch: r.try_get(12)?,
        lease_left_ms: lease_until.map(|u| u - now),
        tokens: Tokens::from_columns(r.try_get(14)?, r.try_get(15)?)?,
    })
}

/// Appends `messages` after the transcript's last; answers the transcript's new length.
async fn append(
    tx: &deadpool_postgres::Transaction<'_>,
    id: &str,
    messages: &[ChatMessage],
) -> Result<usize, StoreError> {
    let next: i64 = tx
        .one(
            "SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE invocation_id = $1",
            &[&id],
        )
        .await?
        .try_get(0)?;
    let bodies = bodies(messages)?;
    if !bodies.is_empty() {
        tx.run(
            "INSERT INTO messages (invocation_id, seq, body) \
             SELECT $1, $2 + t.ord - 1, t.body FROM unnest($3::text[]) WITH ORDINALITY AS t(body, ord)",
            &[&id, &next, &bodies],
        )
        .await?;
    }
    Ok(next as usize + bodies.len())
}

fn bodies(messages: &[ChatMessage]) -> Result<Vec<String>, StoreError> {
    messages.iter().map(to_json).collect()
}

/// A turn's append in one statement: the fenced update of its row (owner `$2`, epoch `$3`,
/// open), then the bodies `$4` after the transcript's last message, inserted
/// only where the update matched; answers how many rows the update matched (0 or 1).
///
/// The update's row lock orders the statement after a takeover, a cancellation or a renewal
/// that holds the row. The statement's one snapshot is from before that wait, so it can miss
/// only messages whose writer changed the epoch or the status (a resume, a takeover), and then
/// the update matches nothing and nothing is inserted. A turn's own appends come one after the
/// other: two at once would take the same sequence numbers, and the second would fail on the
/// transcript's primary key rather than land after the first.
const APPEND_FENCED: &str = "WITH held AS (\
        UPDATE invocations SET updated_ms = podhost_now_ms() WHERE invocation_id = $1 \
        AND owner = $2 AND epoch = $3 AND status IN ('queued', 'running') \
        RETURNING invocation_id), \
    inserted AS (\
        INSERT INTO messages (invocation_id, seq, body) \
        SELECT held.invocation_id, last.next + t.ord - 1, t.body FROM held, \
        (SELECT COALESCE(MAX(seq) + 1, 0) AS next FROM messages WHERE invocation_id = $1) AS last, \
        unnest($4::text[]) WITH ORDINALITY AS t(body, ord)) \
    SELECT COUNT(*) FROM held";

async fn get_in(
    tx: &deadpool_postgres::Transaction<'_>,
    id: &str,
    lock: bool,
) -> Result<Option<InvocationRow>, StoreError> {
    let sql = format!(
        "{} WHERE invocation_id = $1{}",
        select(),
        if lock { " FOR UPDATE" } else { "" }
    );
    tx.opt(&sql, &[&id])
        .await?
        .as_ref()
        .map(read_row)
        .transpose()
}

impl Postgres {
    /// Connects (TLS trusting what `tls` trusts), migrates the schema (or refuses a newer
    /// one), opens the pool and starts the cancellation listener.
    pub async fn open(url: &str, tls: &Arc<rustls::ClientConfig>) -> Result<Postgres, StoreError> {
        let config = config(url, "the store").map_err(|why| StoreError::Open {
            what: super::redact(url),
            why: why.to_string(),
        })?;
        let tls = MakeRustls::new(tls);
        let open_err = |e: tokio_postgres::Error| StoreError::Open {
            what: super::redact(url),
            why: super::postgres_error(&e),
        };
        let (mut client, conn) =
            tokio::time::timeout(Duration::from_secs(30), config.connect(tls.clone()))
                .await
                .map_err(|_| StoreError::Open {
                    what: super::redact(url),
                    why: "no answer within 30 s".into(),
                })?
                .map_err(open_err)?;
        let driver = tokio::spawn(conn);
        let migrated = migrate::postgres(&mut client, None).await;
        drop(client);
        let _ = driver.await;
        migrated?;
        let pool = |size: usize| {
            let manager = Manager::from_config(
                config.clone(),
                tls.clone(),
                ManagerConfig {
                    recycling_method: RecyclingMethod::Fast,
                },
            );
            Pool::builder(manager)
                .max_size(size)
                .runtime(Runtime::Tokio1)
                .wait_timeout(Some(POOL_WAIT))
                .create_timeout(Some(Duration::from_secs(10)))
                .recycle_timeout(Some(Duration::from_secs(5)))
                .build()
                .map_err(|e| StoreError::Open {
                    what: super::redact(url),
                    why: e.to_string(),
                })
        };
        let (pool, reads) = (pool(POOL_SIZE)?, pool(READ_POOL_SIZE)?);
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(listen(config.clone(), tls.clone(), tx));
        Ok(Postgres {
            pool,
            reads,
            cancels: Arc::new(Mutex::new(Some(rx))),
            connect: Arc::new((config, tls)),
            live: Arc::new(tokio::sync::OnceCell::new()),
        })
    }

    /// Joins as replica `owner`: its liveness lock is held from here on (see `pg_live`).
    pub async fn join(&self, owner: Arc<str>, lease: Duration) -> Result<(), StoreError> {
        let c = self.client().await?;
        self.live
            .get_or_try_init(|| {
                let (config, tls) = &*self.connect;
                Liveness::join(&c, config.clone(), tls.clone(), owner, lease)
            })
            .await?;
        Ok(())
    }

    pub fn cancellations(&self) -> Option<mpsc::Receiver<String>> {
        self.cancels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(pool_err)
    }

    /// A connection of the reads' pool, which writes never hold.
    async fn reader(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.reads.get().await.map_err(pool_err)
    }

    /// An update that matches no row, in a transaction rolled back at once: it needs what a
    /// write needs (a connection, a primary that is not read-only, the row-exclusive lock on
    /// `invocations`, waited for at most `wait`) and changes nothing.
    pub async fn check_writable(&self, wait: Duration) -> Result<(), StoreError> {
        let mut c = tokio::time::timeout(wait, self.client())
            .await
            .map_err(|_| StoreError::Pool(format!("no connection within {wait:?}")))??;
        let tx = c.transaction().await?;
        // The lock's wait is what is checked; the statement's bound only keeps a stuck server
        // from holding the connection.
        let ms = wait.as_millis().max(1);
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = {ms}; SET LOCAL statement_timeout = {}; \
             UPDATE invocations SET updated_ms = updated_ms WHERE false",
            ms * 2
        ))
        .await?;
        tx.rollback().await?;
        Ok(())
    }

    pub async fn count(&self) -> Result<u64, StoreError> {
        let c = self.client().await?;
        let n: i64 = c
            .one("SELECT COUNT(*) FROM invocations", &[])
            .await?
            .try_get(0)?;
        Ok(n as u64)
    }

    pub async fn kept_sessions(&self) -> Result<Vec<String>, StoreError> {
        let c = self.client().await?;
        c.rows(
            "SELECT session_id FROM invocations WHERE swept = FALSE",
            &[],
        )
        .await?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect()
    }

    pub async fn status(&self, id: &str) -> Result<Option<StatusRow>, StoreError> {
        let c = self.reader().await?;
        let Some(r) = c
            .opt(
                "SELECT session_id, status, error FROM invocations WHERE invocation_id = $1",
                &[&id],
            )
            .await?
        else {
            return Ok(None);
        };
        let status: String = r.try_get(1)?;
        Ok(Some(StatusRow {
            session_id: r.try_get(0)?,
            status: parse_status(&status)?,
            error: r.try_get(2)?,
        }))
    }

    pub async fn get(&self, id: &str) -> Result<Option<InvocationRow>, StoreError> {
        let c = self.reader().await?;
        c.opt(&format!("{} WHERE invocation_id = $1", select()), &[&id])
            .await?
            .as_ref()
            .map(read_row)
            .transpose()
    }

    pub async fn insert_start(
        &self,
        row: InvocationRow,
        messages: Vec<ChatMessage>,
        terms: &LeaseTerms,
    ) -> Result<StartOutcome, StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let inserted = tx
            .run(
                "INSERT INTO invocations (invocation_id, session_id, status, connection, \
                 needs_key, output_start, created_ms, updated_ms, owner, epoch, lease_until_ms) \
                 VALUES ($1, $2, 'queued', $3, $4, $5, podhost_now_ms(), podhost_now_ms(), $6, 1, \
                 podhost_now_ms() + $7) ON CONFLICT DO NOTHING",
                &[
                    &row.invocation_id,
                    &row.session_id,
                    &to_json(&row.connection)?,
                    &row.needs_key,
                    &(messages.len() as i64),
                    &&*terms.owner,
                    &terms.ttl_ms,
                ],
            )
            .await?;
        if inserted == 0 {
            // A conflict: the invocation exists (a retry), or its session holds another one.
            if let Some(existing) = get_in(&tx, &row.invocation_id, false).await? {
                return Ok(StartOutcome::Exists(Box::new(existing)));
            }
            let other = tx
                .opt(
                    "SELECT invocation_id FROM invocations WHERE session_id = $1",
                    &[&row.session_id],
                )
                .await?;
            return match other {
                Some(r) => Ok(StartOutcome::SessionTaken(r.try_get(0)?)),
                None => Err(StoreError::Corrupt(format!(
                    "inserting invocation {:?} conflicted with a row that is gone",
                    row.invocation_id
                ))),
            };
        }
        append(&tx, &row.invocation_id, &messages).await?;
        tx.commit().await?;
        Ok(StartOutcome::Inserted(terms.fence(1)))
    }

    pub async fn apply_resume(
        &self,
        id: &str,
        ids: Vec<String>,
        messages: Vec<ChatMessage>,
        connection: ModelEndpoint,
        needs_key: bool,
        terms: &LeaseTerms,
    ) -> Result<ResumeOutcome, StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let Some(row) = get_in(&tx, id, true).await? else {
            return Ok(ResumeOutcome::NotFound);
        };
        let epoch = row.epoch + 1;
        if let Some(outcome) = judge_resume(row, &ids) {
            return Ok(outcome);
        }
        let end = append(&tx, id, &messages).await? as i64;
        tx.run(
            "UPDATE invocations SET status = 'queued', pending = '[]', last_resume = $2, \
             output_start = $3, connection = $4, needs_key = $5, updated_ms = podhost_now_ms(), \
             owner = $6, epoch = $7, lease_until_ms = podhost_now_ms() + $8 \
             WHERE invocation_id = $1",
            &[
                &id,
                &to_json(&ids)?,
                &end,
                &to_json(&connection)?,
                &needs_key,
                &&*terms.owner,
                &epoch,
                &terms.ttl_ms,
            ],
        )
        .await?;
        let row = get_in(&tx, id, false)
            .await?
            .ok_or_else(|| StoreError::Corrupt(format!("invocation {id:?} vanished")))?;
        tx.commit().await?;
        Ok(ResumeOutcome::Applied(row, terms.fence(epoch)))
    }

    pub async fn claim(
        &self,
        id: &str,
        epoch: i64,
        terms: &LeaseTerms,
    ) -> Result<Option<(InvocationRow, Fence)>, StoreError> {
        let c = self.client().await?;
        let row = c
            .opt(
                &format!(
                    "UPDATE invocations SET owner = $2, epoch = epoch + 1, \
                     lease_until_ms = podhost_now_ms() + $3, updated_ms = podhost_now_ms() \
                     WHERE invocation_id = $1 AND epoch = $4 \
                     AND status IN ('queued', 'running') \
                     AND (lease_until_ms IS NULL OR lease_until_ms <= podhost_now_ms()) \
                     AND {} RETURNING {COLUMNS}, podhost_now_ms()",
                    TAKEABLE.replace("$1", "$2")
                ),
                &[&id, &&*terms.owner, &terms.ttl_ms, &epoch],
            )
            .await?;
        let Some(row) = row.as_ref().map(read_row).transpose()? else {
            return Ok(None);
        };
        let fence = terms.fence(row.epoch);
        Ok(Some((row, fence)))
    }

    pub async fn transition(
        &self,
        id: &str,
        from: &'static [Status],
        to: Status,
        error: Option<String>,
        pending: Vec<String>,
        fence: Option<&Fence>,
    ) -> Result<(bool, Option<InvocationRow>), StoreError> {
        if to != Status::Running && crate::failpoint_fails!("serve.store_full") {
            // What PostgreSQL answers when its disk is full (SQLSTATE 53100).
            let c = self.client().await?;
            c.batch_execute(
                "DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = 'disk_full', \
                 MESSAGE = 'could not extend file: No space left on device'; END $$",
            )
            .await?;
        }
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let Some(row) = get_in(&tx, id, true).await? else {
            return Ok((false, None));
        };
        if !judge_transition(&row, from, fence)? {
            return Ok((false, Some(row)));
        }
        let open = super::OPEN.contains(&to);
        let terminal = to.is_terminal();
        let row = tx
            .one(
                &format!(
                    "UPDATE invocations SET status = $2, error = $3, pending = $4, \
                     updated_ms = podhost_now_ms(), \
                     finished_ms = CASE WHEN $5 THEN podhost_now_ms() END, \
                     lease_until_ms = CASE WHEN $6 THEN lease_until_ms END \
                     WHERE invocation_id = $1 RETURNING {COLUMNS}, podhost_now_ms()"
                ),
                &[
                    &id,
                    &to.as_str(),
                    &error,
                    &to_json(&pending)?,
                    &terminal,
                    &open,
                ],
            )
            .await?;
        if to == Status::Cancelled {
            tx.run("SELECT pg_notify($1, $2)", &[&CANCEL_CHANNEL, &id])
                .await?;
        }
        tx.commit().await?;
        Ok((true, Some(read_row(&row)?)))
    }

    pub async fn append(
        &self,
        id: &str,
        messages: Vec<ChatMessage>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        let held: i64 = c
            .one(
                APPEND_FENCED,
                &[&id, &&*fence.owner, &fence.epoch, &bodies(&messages)?],
            )
            .await?
            .try_get(0)?;
        if held == 0 {
            return Err(StoreError::Fenced(id.to_owned()));
        }
        Ok(())
    }

    pub async fn add_tokens(
        &self,
        id: &str,
        (tokens_in, tokens_out): (Option<i64>, Option<i64>),
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let c = self.client().await?;
        // `sum + n` is NULL when either is: then the sum as it was, else `n` (the first).
        let held = c
            .run(
                "UPDATE invocations SET updated_ms = podhost_now_ms(), \
                 tokens_in = COALESCE(tokens_in + $4::BIGINT, tokens_in, $4::BIGINT), \
                 tokens_out = COALESCE(tokens_out + $5::BIGINT, tokens_out, $5::BIGINT) \
                 WHERE invocation_id = $1 AND owner = $2 AND epoch = $3 \
                 AND status IN ('queued', 'running')",
                &[&id, &&*fence.owner, &fence.epoch, &tokens_in, &tokens_out],
            )
            .await?;
        if held == 0 {
            return Err(StoreError::Fenced(id.to_owned()));
        }
        Ok(())
    }

    pub async fn messages(&self, id: &str, from: usize) -> Result<Vec<ChatMessage>, StoreError> {
        let c = self.reader().await?;
        let rows = c
            .rows(
                "SELECT body FROM messages WHERE invocation_id = $1 AND seq >= $2 ORDER BY seq",
                &[&id, &(from as i64)],
            )
            .await?;
        rows.iter()
            .map(|r| from_json("message", r.try_get::<_, &str>(0)?))
            .collect()
    }

    pub async fn message_times(&self, id: &str) -> Result<Vec<Option<i64>>, StoreError> {
        let c = self.reader().await?;
        c.rows(
            "SELECT at_ms FROM messages WHERE invocation_id = $1 ORDER BY seq",
            &[&id],
        )
        .await?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect()
    }

    pub async fn list_sessions(&self, q: &ListQuery) -> Result<Vec<SessionSummary>, StoreError> {
        let c = self.reader().await?;
        let sql = list_sql(
            q,
            |n| format!("${n}"),
            |col, p| format!("strpos({col}, {p}) > 0"),
        );
        let status = q.status.map(Status::as_str);
        let limit = i64::from(q.limit);
        let mut args: Vec<&(dyn ToSql + Sync)> = Vec::new();
        if let Some(s) = &status {
            args.push(s);
        }
        if let Some(s) = &q.search {
            args.push(s);
        }
        if let Some((ms, id)) = &q.before {
            args.push(ms);
            args.push(id);
        }
        args.push(&limit);
        let rows = c.rows(&sql, &args).await?;
        rows.iter()
            .map(|r| {
                let status: String = r.try_get(2)?;
                Ok(SessionSummary {
                    invocation_id: r.try_get(0)?,
                    session_id: r.try_get(1)?,
                    status: parse_status(&status)?,
                    error: r.try_get(3)?,
                    created_ms: r.try_get(4)?,
                    updated_ms: r.try_get(5)?,
                    finished_ms: r.try_get(6)?,
                    swept: r.try_get(7)?,
                    steps: r.try_get::<_, i64>(8)? as u64,
                    tool_calls: r.try_get::<_, i64>(9)? as u64,
                    tokens: Tokens::from_columns(r.try_get(10)?, r.try_get(11)?)?,
                })
            })
            .collect()
    }

    pub async fn set_view(&self, id: &str, view: String, fence: &Fence) -> Result<(), StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let held = tx
            .run(
                "UPDATE invocations SET updated_ms = podhost_now_ms() WHERE invocation_id = $1 \
                 AND owner = $2 AND epoch = $3 AND status IN ('queued', 'running')",
                &[&id, &&*fence.owner, &fence.epoch],
            )
            .await?;
        if held == 0 {
            return Err(StoreError::Fenced(id.to_owned()));
        }
        tx.run(
            "INSERT INTO contexts (invocation_id, view) VALUES ($1, $2) \
             ON CONFLICT (invocation_id) DO UPDATE SET view = excluded.view",
            &[&id, &view],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn view(&self, id: &str) -> Result<Option<String>, StoreError> {
        let c = self.client().await?;
        let row = c
            .opt("SELECT view FROM contexts WHERE invocation_id = $1", &[&id])
            .await?;
        Ok(row.map(|r| r.try_get::<_, String>(0)).transpose()?)
    }

    pub async fn renew(
        &self,
        terms: &LeaseTerms,
        held: Vec<(String, i64)>,
    ) -> Result<Vec<String>, StoreError> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, epochs): (Vec<String>, Vec<i64>) = held.into_iter().unzip();
        // A lease that ran out is renewed too while the turn is still this replica's (no other
        // took it: none does while this one's liveness lock is held).
        let sql = "UPDATE invocations SET lease_until_ms = podhost_now_ms() + $2 \
                   FROM unnest($3::text[], $4::bigint[]) AS h(id, ep) \
                   WHERE invocation_id = h.id AND epoch = h.ep AND owner = $1 \
                   AND status IN ('queued', 'running') RETURNING invocation_id";
        let params: [&(dyn ToSql + Sync); 4] = [&&*terms.owner, &terms.ttl_ms, &ids, &epochs];
        // On the liveness connection once joined, never behind the writes' pool.
        let rows = match self.live.get() {
            Some(live) => {
                let c = live.client().await?;
                let stmt = c.prepare(sql).await?;
                c.query(&stmt, &params).await?
            }
            None => self.client().await?.rows(sql, &params).await?,
        };
        rows.iter()
            .map(|r| Ok(r.try_get::<_, String>(0)?))
            .collect()
    }

    pub async fn release(&self, id: &str, fence: &Fence) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.run(
            "UPDATE invocations SET lease_until_ms = podhost_now_ms() WHERE invocation_id = $1 \
             AND owner = $2 AND epoch = $3",
            &[&id, &&*fence.owner, &fence.epoch],
        )
        .await?;
        Ok(())
    }

    pub async fn orphans(&self, me: &str) -> Result<Vec<Orphan>, StoreError> {
        let c = self.client().await?;
        let rows = c
            .rows(
                &format!(
                    "SELECT invocation_id, epoch, needs_key, \
                     podhost_now_ms() - COALESCE(lease_until_ms, updated_ms), owner = $1 \
                     FROM invocations WHERE status IN ('queued', 'running') \
                     AND (lease_until_ms IS NULL OR lease_until_ms <= podhost_now_ms()) \
                     AND {TAKEABLE}"
                ),
                &[&me],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Orphan {
                    invocation_id: r.try_get(0)?,
                    epoch: r.try_get(1)?,
                    needs_key: r.try_get(2)?,
                    expired_for_ms: r.try_get(3)?,
                    ours: r.try_get::<_, Option<bool>>(4)?.unwrap_or(false),
                })
            })
            .collect()
    }

    pub async fn fail_orphan(
        &self,
        id: &str,
        epoch: i64,
        grace_ms: i64,
        message: String,
        me: &str,
    ) -> Result<bool, StoreError> {
        let c = self.client().await?;
        let n = c
            .run(
                &format!(
                    "UPDATE invocations SET status = 'failed', error = $2, \
                     updated_ms = podhost_now_ms(), finished_ms = podhost_now_ms(), \
                     epoch = epoch + 1, lease_until_ms = NULL \
                     WHERE invocation_id = $1 AND epoch = $3 \
                     AND status IN ('queued', 'running') \
                     AND COALESCE(lease_until_ms, updated_ms) + $4 <= podhost_now_ms() \
                     AND {}",
                    TAKEABLE.replace("$1", "$5")
                ),
                &[&id, &message, &epoch, &grace_ms, &me],
            )
            .await?;
        Ok(n == 1)
    }

    pub async fn expire_leases(&self) -> Result<usize, StoreError> {
        // Other replicas may hold live leases here: never end them wholesale.
        Ok(0)
    }

    pub async fn sweep(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let rows = tx
            .rows(
                "UPDATE invocations SET swept = TRUE, pending = '[]', last_resume = '[]' \
                 WHERE swept = FALSE AND status IN ('completed', 'failed', 'cancelled') \
                 AND finished_ms < $1 RETURNING invocation_id, session_id",
                &[&cutoff_ms],
            )
            .await?;
        let ids: Vec<String> = rows
            .iter()
            .map(|r| r.try_get(0))
            .collect::<Result<_, _>>()?;
        tx.run(
            "DELETE FROM messages WHERE invocation_id = ANY($1)",
            &[&ids],
        )
        .await?;
        tx.run(
            "DELETE FROM contexts WHERE invocation_id = ANY($1)",
            &[&ids],
        )
        .await?;
        tx.commit().await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<_, String>(1)?))
            .collect()
    }

    pub async fn uid_range_known(&self, first: u32) -> Result<bool, StoreError> {
        let c = self.client().await?;
        Ok(c.one(
            "SELECT EXISTS (SELECT 1 FROM uid_next WHERE first = $1)",
            &[&i64::from(first)],
        )
        .await?
        .try_get(0)?)
    }

    pub async fn adopt_uids(
        &self,
        range: UidRange,
        owner: &str,
        held: Vec<(String, u32)>,
    ) -> Result<(), StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let (first, last) = (i64::from(range.first), i64::from(range.last));
        // Replicas starting at once set the range up one after the other.
        tx.run("SELECT pg_advisory_xact_lock($1)", &[&UID_LOCK])
            .await?;
        if tx
            .opt("SELECT 1 FROM uid_next WHERE first = $1", &[&first])
            .await?
            .is_some()
        {
            return Ok(tx.commit().await?);
        }
        for (session, uid) in &held {
            tx.run(
                "INSERT INTO session_uids (uid, session_id, owner, claimed_ms, used) \
                 VALUES ($1, $2, $3, podhost_now_ms(), nextval('uid_use')) ON CONFLICT DO NOTHING",
                &[&i64::from(*uid), session, &owner],
            )
            .await?;
        }
        let top: Option<i64> = tx
            .one(
                "SELECT MAX(uid) FROM session_uids WHERE uid BETWEEN $1 AND $2",
                &[&first, &last],
            )
            .await?
            .try_get(0)?;
        let next = top.map_or(first, |t| t + 1);
        // The uids below the first never handed out that no session holds are free.
        tx.run(
            "INSERT INTO uid_free (uid) SELECT u FROM generate_series($1::bigint, $2::bigint - 1) u \
             WHERE NOT EXISTS (SELECT 1 FROM session_uids s WHERE s.uid = u) \
             ON CONFLICT DO NOTHING",
            &[&first, &next],
        )
        .await?;
        tx.run(
            "INSERT INTO uid_next (first, next) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&first, &next],
        )
        .await?;
        Ok(tx.commit().await?)
    }

    pub async fn take_uid(
        &self,
        session_id: &str,
        owner: &str,
        range: UidRange,
        park: Park,
    ) -> Result<Option<UidGrant>, StoreError> {
        let mut c = self.client().await?;
        let started = std::time::Instant::now();
        let taken = take_uid(&mut c, session_id, owner, range, park).await;
        super::note_take(&taken, started.elapsed());
        taken
    }

    pub async fn release_uid(&self, session_id: &str) -> Result<(), StoreError> {
        let c = self.client().await?;
        c.run(
            "WITH gone AS (DELETE FROM session_uids WHERE session_id = $1 RETURNING uid) \
             INSERT INTO uid_free (uid) SELECT uid FROM gone ON CONFLICT DO NOTHING",
            &[&session_id],
        )
        .await?;
        Ok(())
    }
}

/// One take of a uid (see [`super::Store::take_uid`]), in one transaction.
/// Long: one transaction's statements in order (the session's own uid, one given back, one never
/// handed out, one lent), each the fallback of the one before.
async fn take_uid(
    c: &mut deadpool_postgres::Object,
    session_id: &str,
    owner: &str,
    range: UidRange,
    park: Park,
) -> Result<Option<UidGrant>, StoreError> {
    let tx = c.transaction().await?;
    let (first, last) = (i64::from(range.first), i64::from(range.last));
    // One take for a session at a time, whichever replica asks.
    tx.run(
        "SELECT pg_advisory_xact_lock($1, hashtext($2))",
        &[&UID_SESSION_LOCK, &session_id],
    )
    .await?;
    if let Some(r) = tx
        .opt(
            "UPDATE session_uids SET used = nextval('uid_use') WHERE session_id = $1 \
                 RETURNING uid",
            &[&session_id],
        )
        .await?
    {
        tx.commit().await?;
        return grant(r.try_get(0)?, UidGrant::Held);
    }
    let insert = async |tx: &deadpool_postgres::Transaction<'_>, uid: i64| {
        let params: [&(dyn ToSql + Sync); 3] = [&uid, &session_id, &owner];
        tx.run(
            "INSERT INTO session_uids (uid, session_id, owner, claimed_ms, used) \
                 VALUES ($1, $2, $3, podhost_now_ms(), nextval('uid_use')) ON CONFLICT DO NOTHING",
            &params,
        )
        .await
        .map(|n| n == 1)
    };
    // Given back, lowest first; a uid a session of another range holds is skipped.
    while let Some(r) = tx
        .opt(
            "DELETE FROM uid_free WHERE uid = (SELECT uid FROM uid_free \
                 WHERE uid BETWEEN $1 AND $2 ORDER BY uid LIMIT 1 FOR UPDATE SKIP LOCKED) \
                 RETURNING uid",
            &[&first, &last],
        )
        .await?
    {
        let uid: i64 = r.try_get(0)?;
        if insert(&tx, uid).await? {
            tx.commit().await?;
            return grant(uid, UidGrant::Fresh);
        }
    }
    // Never handed out yet.
    while let Some(r) = tx
        .opt(
            "UPDATE uid_next SET next = next + 1 WHERE first = $1 AND next <= $2 \
                 RETURNING next - 1",
            &[&first, &last],
        )
        .await?
    {
        let uid: i64 = r.try_get(0)?;
        if insert(&tx, uid).await? {
            tx.commit().await?;
            return grant(uid, UidGrant::Fresh);
        }
    }
    // Lent by the idle session that used its uid least recently, parked first. Its row
    // stays locked until the commit, so that session's own take (resumed meanwhile on any
    // replica) waits, then finds no uid and takes another.
    let Some(r) = tx
        .opt(
            "SELECT s.uid, s.session_id FROM session_uids s \
                 WHERE s.uid BETWEEN $1 AND $2 AND NOT EXISTS (SELECT 1 FROM invocations i \
                 WHERE i.session_id = s.session_id AND i.status IN ('queued', 'running')) \
                 ORDER BY s.used LIMIT 1 FOR UPDATE OF s SKIP LOCKED",
            &[&first, &last],
        )
        .await?
    else {
        return Ok(None);
    };
    let (uid, from): (i64, String) = (r.try_get(0)?, r.try_get(1)?);
    let lender = from.clone();
    tokio::task::spawn_blocking(move || park(&lender))
        .await
        .map_err(|e| StoreError::Park(e.to_string()))?
        .map_err(StoreError::Park)?;
    let params: [&(dyn ToSql + Sync); 3] = [&uid, &session_id, &owner];
    tx.run(
        "UPDATE session_uids SET session_id = $2, owner = $3, claimed_ms = podhost_now_ms(), \
             used = nextval('uid_use') WHERE uid = $1",
        &params,
    )
    .await?;
    tx.commit().await?;
    grant(uid, |uid| UidGrant::Reclaimed { uid, from })
}

/// Hears cancellations other replicas announce, for as long as the receiver lives;
/// reconnects (with a growing pause) when the connection drops.
async fn listen(config: tokio_postgres::Config, tls: MakeRustls, tx: mpsc::Sender<String>) {
    let mut pause = Duration::from_millis(200);
    while !tx.is_closed() {
        match listen_once(&config, &tls, &tx).await {
            Ok(()) => return,
            Err(e) => {
                warn!(error = %e, "the cancellation listener lost its connection; reconnecting")
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}

async fn listen_once(
    config: &tokio_postgres::Config,
    tls: &MakeRustls,
    tx: &mpsc::Sender<String>,
) -> Result<(), String> {
    let (client, mut conn) = config
        .connect(tls.clone())
        .await
        .map_err(|e| super::postgres_error(&e))?;
    let forward = tx.clone();
    let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
    let mut pump = tokio::spawn(async move {
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(n)) => {
                    // A full queue drops the announcement; the owner's renewal catches it.
                    let _ = forward.try_send(n.payload().to_owned());
                }
                Ok(_) => {}
                Err(e) => return e.to_string(),
            }
        }
        "the connection closed".to_owned()
    });
    if let Err(e) = client
        .batch_execute(&format!("LISTEN {CANCEL_CHANNEL}"))
        .await
    {
        pump.abort();
        return Err(e.to_string());
    }
    info!("listening for cancellations announced by other replicas");
    let result = tokio::select! {
        why = &mut pump => Err(why.unwrap_or_else(|e| e.to_string())),
        _ = tx.closed() => Ok(()),
    };
    pump.abort();
    result
}
