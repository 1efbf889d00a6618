//! The SQLite engine of the store: one file in the data directory, for one replica.
//!
//! Owns: the writer thread and its connection, a pool of read-only connections (all opened at
//! start), and the lock on the data directory that keeps a second process off the same store.
//!
//! Invariants:
//! * One thread owns the writing connection and runs every write in turn, so each write is
//!   atomic against every other (a check-and-insert cannot race a duplicate submission).
//! * Reads run on their own read-only connections on blocking threads: in WAL mode they see
//!   the last commit and never wait behind a write.
//! * Callers never block an async thread on the database.
//! * Only one process opens a data directory's store at a time (an exclusive `flock` on
//!   `podhost.lock`, released by the kernel when the process dies), so leases left in it at
//!   start are its predecessor's.
//! * Submissions' acceptance, questions and end states are committed synchronously
//!   (`synchronous = FULL` for that write); messages and `running` may ride on the next sync.
//!
//! Non-goals: sharing one store between machines (that is PostgreSQL's).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use rusqlite::{Connection, OpenFlags, OptionalExtension, Row, Transaction, params};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::{
    COLUMNS, Fence, InvocationRow, LeaseTerms, ListQuery, Orphan, Park, ResumeOutcome,
    SessionSummary, StartOutcome, StatusRow, StoreError, Tokens, UidGrant, from_json, grant,
    judge_resume, judge_transition, list_sql, migrate, now_ms, parse_status, to_json,
};
use crate::byoh::protocol::Status;
use crate::chat::message::{ChatMessage, ModelEndpoint};
use crate::exec::confine::UidRange;

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// Read-only connections, all open while the store is.
const READERS: usize = 8;
/// Prepared statements the writer's connection keeps.
const WRITER_STATEMENTS: usize = 64;
/// How long a statement waits for a lock another connection holds.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The page cache of a read-only connection, in KiB. Small: every commit of the writer empties
/// a reader's cache at its next read, so pages kept past that only hold memory (at SQLite's
/// default of 2,000 KiB, eight readers would keep 16 MiB).
const READER_CACHE_KIB: i64 = 256;

/// Opens one of the read-only connections (all are opened at start, so the store's
/// descriptors do not grow with the load's peak).
fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    c.busy_timeout(BUSY_TIMEOUT)?;
    c.pragma_update(None, "cache_size", -READER_CACHE_KIB)?;
    Ok(c)
}

/// A handle on the SQLite store. Cheap to clone.
#[derive(Clone)]
pub struct Sqlite {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    writer: mpsc::Sender<Job>,
    idle: Mutex<Vec<Connection>>,
    readers: Semaphore,
    /// Held for the life of the store.
    _lock: Flock<File>,
}

impl std::fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sqlite")
            .field("path", &self.inner.path)
            .finish()
    }
}

fn open_err(path: &Path) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
    move |e| StoreError::Open {
        what: path.display().to_string(),
        why: e.to_string(),
    }
}

/// Takes the data directory's lock, or says who holds it.
fn lock_dir(path: &Path) -> Result<Flock<File>, StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let lock_path = dir.join("podhost.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| StoreError::Open {
            what: lock_path.display().to_string(),
            why: e.to_string(),
        })?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| StoreError::Open {
        what: path.display().to_string(),
        why: if errno == nix::errno::Errno::EWOULDBLOCK {
            format!(
                "another podhost serve is using it ({} is locked); an SQLite store serves one \
                 process — stop the other one, or use PostgreSQL (--store postgres://…) for \
                 several replicas",
                lock_path.display()
            )
        } else {
            format!("could not lock {}: {errno}", lock_path.display())
        },
    })
}

/// Runs `sql` as a statement from the connection's cache: a turn's statements are parsed once
/// per connection, not at every write.
fn exec(c: &Connection, sql: &str, params: impl rusqlite::Params) -> rusqlite::Result<usize> {
    c.prepare_cached(sql)?.execute(params)
}

/// The first row of `sql` (a statement from the connection's cache), as `f` reads it.
fn query_row<T>(
    c: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
    f: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    c.prepare_cached(sql)?.query_row(params, f)
}

fn read_row(r: &Row<'_>, now: i64) -> rusqlite::Result<Result<InvocationRow, StoreError>> {
    let status: String = r.get(2)?;
    let connection: String = r.get(4)?;
    let pending: String = r.get(7)?;
    let last_resume: String = r.get(8)?;
    let lease_until: Option<i64> = r.get(13)?;
    let (tokens_in, tokens_out) = (r.get(14)?, r.get(15)?);
    let row = (|| -> Result<InvocationRow, StoreError> {
        Ok(InvocationRow {
            invocation_id: r.get(0)?,
            session_id: r.get(1)?,
            status: parse_status(&status)?,
            error: r.get(3)?,
            connection: from_json("connection", &connection)?,
            needs_key: r.get(5)?,
            output_start: r.get::<_, i64>(6)? as usize,
            pending: from_json("pending", &pending)?,
            last_resume: from_json("last_resume", &last_resume)?,
            finished_ms: r.get(9)?,
            swept: r.get(10)?,
            owner: r.get(11)?,
            epoch: r.get(12)?,
            lease_left_ms: lease_until.map(|u| u - now),
            tokens: Tokens::from_columns(tokens_in, tokens_out)?,
        })
    })();
    Ok(row)
}

fn get(c: &Connection, id: &str) -> Result<Option<InvocationRow>, StoreError> {
    let now = now_ms();
    query_row(
        c,
        &format!("SELECT {COLUMNS} FROM invocations WHERE invocation_id = ?1"),
        [id],
        |r| read_row(r, now),
    )
    .optional()?
    .transpose()
}

fn must_get(c: &Connection, id: &str) -> Result<InvocationRow, StoreError> {
    get(c, id)?.ok_or_else(|| StoreError::Corrupt(format!("invocation {id:?} vanished")))
}

fn append(c: &Connection, id: &str, messages: &[ChatMessage]) -> Result<usize, StoreError> {
    let mut next: i64 = query_row(
        c,
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE invocation_id = ?1",
        [id],
        |r| r.get(0),
    )?;
    let mut stmt = c.prepare_cached(
        "INSERT INTO messages (invocation_id, seq, body, at_ms) VALUES (?1, ?2, ?3, ?4)",
    )?;
    let now = now_ms();
    for m in messages {
        stmt.execute(params![id, next, to_json(m)?, now])?;
        next += 1;
    }
    Ok(next as usize)
}

fn read_messages(c: &Connection, id: &str, from: usize) -> Result<Vec<ChatMessage>, StoreError> {
    let mut stmt = c.prepare_cached(
        "SELECT body FROM messages WHERE invocation_id = ?1 AND seq >= ?2 ORDER BY seq",
    )?;
    let bodies = stmt
        .query_map(params![id, from as i64], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    bodies.iter().map(|b| from_json("message", b)).collect()
}

/// A write transaction that takes the write lock at once (no upgrade from a read later).
fn begin(c: &mut Connection) -> Result<Transaction<'_>, StoreError> {
    Ok(c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?)
}

impl Sqlite {
    /// Opens (creating) the store at `path`, migrates it, and starts its writer thread.
    pub fn open(path: &Path) -> Result<Sqlite, StoreError> {
        let lock = lock_dir(path)?;
        let conn = Connection::open(path).map_err(open_err(path))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err(path))?;
        // Commits that callers act on (a submission's acceptance, end states) go through
        // `durable`, which syncs them.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(open_err(path))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(open_err(path))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err(path))?;
        let conn = migrate::sqlite(conn, None)?;
        // Room for every statement the writer runs (a turn's, a submission's, a uid's take,
        // the sweeper's), so none is parsed again after the first time.
        conn.set_prepared_statement_cache_capacity(WRITER_STATEMENTS);
        Self::start(path, conn, lock)
    }

    /// Opens the store at `path` with its schema brought only to `version`: a store as the
    /// podhost of that schema wrote it (tests of upgrades).
    #[cfg(test)]
    pub fn open_at_version(path: &Path, version: i32) -> Result<(), StoreError> {
        let conn = Connection::open(path).map_err(open_err(path))?;
        migrate::sqlite(conn, Some(version))?;
        Ok(())
    }

    fn start(path: &Path, conn: Connection, lock: Flock<File>) -> Result<Sqlite, StoreError> {
        let idle = (0..READERS)
            .map(|_| open_reader(path))
            .collect::<Result<Vec<_>, _>>()
            .map_err(open_err(path))?;
        let (tx, mut rx) = mpsc::channel::<Job>(1024);
        std::thread::Builder::new()
            .name("podhost-store".into())
            .spawn(move || {
                let mut conn = conn;
                while let Some(job) = rx.blocking_recv() {
                    job(&mut conn);
                }
            })
            .map_err(|e| StoreError::Open {
                what: path.display().to_string(),
                why: format!("could not start the store thread: {e}"),
            })?;
        Ok(Sqlite {
            inner: Arc::new(Inner {
                path: path.to_owned(),
                writer: tx,
                idle: Mutex::new(idle),
                readers: Semaphore::new(READERS),
                _lock: lock,
            }),
        })
    }

    /// Runs `f` on the writer thread.
    async fn write<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let (done, answer) = oneshot::channel();
        let job: Job = Box::new(move |c| {
            let _ = done.send(f(c));
        });
        self.inner
            .writer
            .send(job)
            .await
            .map_err(|_| StoreError::Stopped)?;
        answer.await.map_err(|_| StoreError::Stopped)?
    }

    /// Runs `f` on the writer thread with its commit synced to disk before it counts.
    async fn durable<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, StoreError> + Send + 'static,
    {
        self.write(move |c| {
            exec(c, "PRAGMA synchronous = FULL", [])?;
            let r = f(c);
            exec(c, "PRAGMA synchronous = NORMAL", [])?;
            r
        })
        .await
    }

    /// Runs `f` on a read-only connection on a blocking thread.
    async fn read<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
    {
        let _permit = self
            .inner
            .readers
            .acquire()
            .await
            .map_err(|_| StoreError::Stopped)?;
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let idle = inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop();
            // One is missing only if a read panicked with it.
            let conn = match idle {
                Some(c) => c,
                None => open_reader(&inner.path)?,
            };
            let r = f(&conn);
            inner
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(conn);
            r
        })
        .await
        .map_err(|_| StoreError::Stopped)?
    }

    /// Takes the write lock within `wait` and gives it back at once (`BEGIN IMMEDIATE;
    /// ROLLBACK`) on the writer's connection.
    pub async fn check_writable(&self, wait: Duration) -> Result<(), StoreError> {
        self.write(move |c| {
            c.busy_timeout(wait)?;
            let checked = c.execute_batch("BEGIN IMMEDIATE; ROLLBACK;");
            // What every other statement runs with.
            c.busy_timeout(BUSY_TIMEOUT)?;
            Ok(checked?)
        })
        .await
    }

    pub async fn count(&self) -> Result<u64, StoreError> {
        self.read(|c| {
            Ok(query_row(c, "SELECT COUNT(*) FROM invocations", [], |r| {
                r.get::<_, i64>(0)
            })? as u64)
        })
        .await
    }

    pub async fn kept_sessions(&self) -> Result<Vec<String>, StoreError> {
        self.read(|c| {
            let mut stmt = c.prepare("SELECT session_id FROM invocations WHERE swept = 0")?;
            let rows = stmt.query_map([], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    pub async fn status(&self, id: &str) -> Result<Option<StatusRow>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            let row: Option<(String, String, Option<String>)> = c
                .prepare_cached(
                    "SELECT session_id, status, error FROM invocations WHERE invocation_id = ?1",
                )?
                .query_row([&id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            row.map(|(session_id, status, error)| {
                Ok(StatusRow {
                    session_id,
                    status: parse_status(&status)?,
                    error,
                })
            })
            .transpose()
        })
        .await
    }

    pub async fn get(&self, id: &str) -> Result<Option<InvocationRow>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| get(c, &id)).await
    }

    pub async fn insert_start(
        &self,
        row: InvocationRow,
        messages: Vec<ChatMessage>,
        terms: &LeaseTerms,
    ) -> Result<StartOutcome, StoreError> {
        let terms = terms.clone();
        self.durable(move |c| {
            let tx = begin(c)?;
            if let Some(existing) = get(&tx, &row.invocation_id)? {
                return Ok(StartOutcome::Exists(Box::new(existing)));
            }
            let other: Option<String> = tx
                .query_row(
                    "SELECT invocation_id FROM invocations WHERE session_id = ?1",
                    [&row.session_id],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(other) = other {
                return Ok(StartOutcome::SessionTaken(other));
            }
            let now = now_ms();
            exec(
                &tx,
                "INSERT INTO invocations (invocation_id, session_id, status, connection, \
                 needs_key, output_start, created_ms, updated_ms, owner, epoch, lease_until_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8, 1, ?9)",
                params![
                    row.invocation_id,
                    row.session_id,
                    Status::Queued.as_str(),
                    to_json(&row.connection)?,
                    row.needs_key,
                    messages.len() as i64,
                    now,
                    &*terms.owner,
                    now + terms.ttl_ms,
                ],
            )?;
            append(&tx, &row.invocation_id, &messages)?;
            tx.commit()?;
            Ok(StartOutcome::Inserted(terms.fence(1)))
        })
        .await
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
        let id = id.to_owned();
        let terms = terms.clone();
        self.durable(move |c| {
            let tx = begin(c)?;
            let Some(row) = get(&tx, &id)? else {
                return Ok(ResumeOutcome::NotFound);
            };
            let epoch = row.epoch + 1;
            if let Some(outcome) = judge_resume(row, &ids) {
                return Ok(outcome);
            }
            let end = append(&tx, &id, &messages)?;
            let now = now_ms();
            exec(
                &tx,
                "UPDATE invocations SET status = ?2, pending = '[]', last_resume = ?3, \
                 output_start = ?4, connection = ?5, needs_key = ?6, updated_ms = ?7, \
                 owner = ?8, epoch = ?9, lease_until_ms = ?10 WHERE invocation_id = ?1",
                params![
                    id,
                    Status::Queued.as_str(),
                    to_json(&ids)?,
                    end as i64,
                    to_json(&connection)?,
                    needs_key,
                    now,
                    &*terms.owner,
                    epoch,
                    now + terms.ttl_ms,
                ],
            )?;
            let row = must_get(&tx, &id)?;
            tx.commit()?;
            Ok(ResumeOutcome::Applied(row, terms.fence(epoch)))
        })
        .await
    }

    pub async fn claim(
        &self,
        id: &str,
        epoch: i64,
        terms: &LeaseTerms,
    ) -> Result<Option<(InvocationRow, Fence)>, StoreError> {
        let id = id.to_owned();
        let terms = terms.clone();
        self.write(move |c| {
            let tx = begin(c)?;
            let now = now_ms();
            let n = exec(
                &tx,
                "UPDATE invocations SET owner = ?2, epoch = epoch + 1, lease_until_ms = ?3, \
                 updated_ms = ?4 WHERE invocation_id = ?1 AND epoch = ?5 \
                 AND status IN ('queued', 'running') \
                 AND (lease_until_ms IS NULL OR lease_until_ms <= ?4)",
                params![id, &*terms.owner, now + terms.ttl_ms, now, epoch],
            )?;
            if n == 0 {
                return Ok(None);
            }
            let row = must_get(&tx, &id)?;
            tx.commit()?;
            let fence = terms.fence(row.epoch);
            Ok(Some((row, fence)))
        })
        .await
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
        let id = id.to_owned();
        let fence = fence.cloned();
        let op = move |c: &mut Connection| {
            if to != Status::Running && crate::failpoint_fails!("serve.store_full") {
                return Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                    Some("database or disk is full".to_owned()),
                )
                .into());
            }
            let tx = begin(c)?;
            let Some(row) = get(&tx, &id)? else {
                return Ok((false, None));
            };
            if !judge_transition(&row, from, fence.as_ref())? {
                return Ok((false, Some(row)));
            }
            let now = now_ms();
            let finished = to.is_terminal().then_some(now);
            // A lease lives while the turn is open; any other status ends it.
            let open = super::OPEN.contains(&to);
            exec(
                &tx,
                "UPDATE invocations SET status = ?2, error = ?3, pending = ?4, updated_ms = ?5, \
                 finished_ms = ?6, lease_until_ms = CASE WHEN ?7 THEN lease_until_ms END \
                 WHERE invocation_id = ?1",
                params![
                    id,
                    to.as_str(),
                    error,
                    to_json(&pending)?,
                    now,
                    finished,
                    open
                ],
            )?;
            let row = get(&tx, &id)?;
            tx.commit()?;
            Ok((true, row))
        };
        // End states and questions are what callers act on: sync them; `running` need not be.
        if to == Status::Running {
            self.write(op).await
        } else {
            self.durable(op).await
        }
    }

    pub async fn append(
        &self,
        id: &str,
        messages: Vec<ChatMessage>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let id = id.to_owned();
        let fence = fence.clone();
        self.write(move |c| {
            let tx = begin(c)?;
            let now = now_ms();
            let held = exec(
                &tx,
                "UPDATE invocations SET updated_ms = ?2 WHERE invocation_id = ?1 AND owner = ?3 \
                 AND epoch = ?4 AND status IN ('queued', 'running')",
                params![id, now, &*fence.owner, fence.epoch],
            )?;
            if held == 0 {
                return Err(StoreError::Fenced(id));
            }
            append(&tx, &id, &messages)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn add_tokens(
        &self,
        id: &str,
        (tokens_in, tokens_out): (Option<i64>, Option<i64>),
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let id = id.to_owned();
        let fence = fence.clone();
        self.write(move |c| {
            // `sum + n` is NULL when either is: then the sum as it was, else `n` (the first).
            let held = exec(
                c,
                "UPDATE invocations SET updated_ms = ?2, \
                 tokens_in = COALESCE(tokens_in + ?5, tokens_in, ?5), \
                 tokens_out = COALESCE(tokens_out + ?6, tokens_out, ?6) \
                 WHERE invocation_id = ?1 AND owner = ?3 AND epoch = ?4 \
                 AND status IN ('queued', 'running')",
                params![
                    id,
                    now_ms(),
                    &*fence.owner,
                    fence.epoch,
                    tokens_in,
                    tokens_out
                ],
            )?;
            if held == 0 {
                return Err(StoreError::Fenced(id));
            }
            Ok(())
        })
        .await
    }

    pub async fn messages(&self, id: &str, from: usize) -> Result<Vec<ChatMessage>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| read_messages(c, &id, from)).await
    }

    pub async fn message_times(&self, id: &str) -> Result<Vec<Option<i64>>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT at_ms FROM messages WHERE invocation_id = ?1 ORDER BY seq",
            )?;
            let times = stmt.query_map([&id], |r| r.get(0))?;
            Ok(times.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    pub async fn list_sessions(&self, q: &ListQuery) -> Result<Vec<SessionSummary>, StoreError> {
        let q = q.clone();
        self.read(move |c| {
            let sql = list_sql(
                &q,
                |n| format!("?{n}"),
                |col, p| format!("instr({col}, {p}) > 0"),
            );
            let mut args: Vec<rusqlite::types::Value> = Vec::new();
            args.extend(q.status.map(|s| s.as_str().to_owned().into()));
            args.extend(q.search.clone().map(Into::into));
            if let Some((ms, id)) = &q.before {
                args.push((*ms).into());
                args.push(id.clone().into());
            }
            args.push(i64::from(q.limit).into());
            let mut stmt = c.prepare_cached(&sql)?;
            let rows = stmt.query_map(rusqlite::params_from_iter(args), |r| {
                Ok((
                    (r.get::<_, String>(0)?, r.get::<_, String>(1)?),
                    (r.get::<_, String>(2)?, r.get::<_, Option<String>>(3)?),
                    (r.get(4)?, r.get(5)?, r.get(6)?, r.get::<_, bool>(7)?),
                    (r.get::<_, i64>(8)?, r.get::<_, i64>(9)?),
                    (r.get(10)?, r.get(11)?),
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let ((invocation_id, session_id), (status, error), times, counts, tokens) = row?;
                out.push(SessionSummary {
                    invocation_id,
                    session_id,
                    status: parse_status(&status)?,
                    error,
                    created_ms: times.0,
                    updated_ms: times.1,
                    finished_ms: times.2,
                    swept: times.3,
                    steps: counts.0 as u64,
                    tool_calls: counts.1 as u64,
                    tokens: Tokens::from_columns(tokens.0, tokens.1)?,
                });
            }
            Ok(out)
        })
        .await
    }

    pub async fn set_view(&self, id: &str, view: String, fence: &Fence) -> Result<(), StoreError> {
        let id = id.to_owned();
        let fence = fence.clone();
        self.durable(move |c| {
            let tx = begin(c)?;
            let now = now_ms();
            let held = exec(
                &tx,
                "UPDATE invocations SET updated_ms = ?2 WHERE invocation_id = ?1 AND owner = ?3 \
                 AND epoch = ?4 AND status IN ('queued', 'running')",
                params![id, now, &*fence.owner, fence.epoch],
            )?;
            if held == 0 {
                return Err(StoreError::Fenced(id));
            }
            exec(
                &tx,
                "INSERT INTO contexts (invocation_id, view) VALUES (?1, ?2) \
                 ON CONFLICT (invocation_id) DO UPDATE SET view = excluded.view",
                params![id, view],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn view(&self, id: &str) -> Result<Option<String>, StoreError> {
        let id = id.to_owned();
        self.read(move |c| {
            Ok(query_row(
                c,
                "SELECT view FROM contexts WHERE invocation_id = ?1",
                [&id],
                |r| r.get(0),
            )
            .optional()?)
        })
        .await
    }

    pub async fn renew(
        &self,
        terms: &LeaseTerms,
        held: Vec<(String, i64)>,
    ) -> Result<Vec<String>, StoreError> {
        let terms = terms.clone();
        self.write(move |c| {
            let tx = begin(c)?;
            let now = now_ms();
            let mut renewed = Vec::with_capacity(held.len());
            {
                let mut stmt = tx.prepare_cached(
                    "UPDATE invocations SET lease_until_ms = ?2 WHERE invocation_id = ?1 \
                     AND owner = ?3 AND epoch = ?4 AND status IN ('queued', 'running')",
                )?;
                for (id, epoch) in held {
                    if stmt.execute(params![id, now + terms.ttl_ms, &*terms.owner, epoch])? == 1 {
                        renewed.push(id);
                    }
                }
            }
            tx.commit()?;
            Ok(renewed)
        })
        .await
    }

    pub async fn release(&self, id: &str, fence: &Fence) -> Result<(), StoreError> {
        let id = id.to_owned();
        let fence = fence.clone();
        self.write(move |c| {
            exec(
                c,
                "UPDATE invocations SET lease_until_ms = ?2 WHERE invocation_id = ?1 \
                 AND owner = ?3 AND epoch = ?4",
                params![id, now_ms(), &*fence.owner, fence.epoch],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn orphans(&self, me: &str) -> Result<Vec<Orphan>, StoreError> {
        let me = me.to_owned();
        self.read(move |c| {
            let now = now_ms();
            let mut stmt = c.prepare_cached(
                "SELECT invocation_id, epoch, needs_key, COALESCE(lease_until_ms, updated_ms), \
                 owner IS ?2 FROM invocations WHERE status IN ('queued', 'running') \
                 AND (lease_until_ms IS NULL OR lease_until_ms <= ?1)",
            )?;
            let rows = stmt.query_map(params![now, me], |r| {
                Ok(Orphan {
                    invocation_id: r.get(0)?,
                    epoch: r.get(1)?,
                    needs_key: r.get(2)?,
                    expired_for_ms: now - r.get::<_, i64>(3)?,
                    ours: r.get(4)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
        .await
    }

    /// (`_me`: one process holds an SQLite store, so no owner of a lease that ran out lives.)
    pub async fn fail_orphan(
        &self,
        id: &str,
        epoch: i64,
        grace_ms: i64,
        message: String,
        _me: &str,
    ) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.durable(move |c| {
            let now = now_ms();
            let n = exec(
                c,
                "UPDATE invocations SET status = 'failed', error = ?2, updated_ms = ?3, \
                 finished_ms = ?3, epoch = epoch + 1, lease_until_ms = NULL \
                 WHERE invocation_id = ?1 AND epoch = ?4 AND status IN ('queued', 'running') \
                 AND COALESCE(lease_until_ms, updated_ms) + ?5 <= ?3",
                params![id, message, now, epoch, grace_ms],
            )?;
            Ok(n == 1)
        })
        .await
    }

    pub async fn expire_leases(&self) -> Result<usize, StoreError> {
        self.write(|c| {
            Ok(exec(
                c,
                "UPDATE invocations SET lease_until_ms = ?1 \
                 WHERE status IN ('queued', 'running')",
                [now_ms()],
            )?)
        })
        .await
    }

    pub async fn sweep(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError> {
        self.write(move |c| {
            let tx = begin(c)?;
            let sessions: Vec<(String, String)> = {
                let mut stmt = tx.prepare(
                    "SELECT invocation_id, session_id FROM invocations WHERE swept = 0 \
                     AND status IN ('completed', 'failed', 'cancelled') AND finished_ms < ?1",
                )?;
                let rows = stmt.query_map([cutoff_ms], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for (id, _) in &sessions {
                exec(&tx, "DELETE FROM messages WHERE invocation_id = ?1", [id])?;
                exec(&tx, "DELETE FROM contexts WHERE invocation_id = ?1", [id])?;
                exec(
                    &tx,
                    "UPDATE invocations SET swept = 1, pending = '[]', last_resume = '[]' \
                     WHERE invocation_id = ?1",
                    [id],
                )?;
            }
            tx.commit()?;
            Ok(sessions.into_iter().map(|(_, s)| s).collect())
        })
        .await
    }

    pub async fn uid_range_known(&self, first: u32) -> Result<bool, StoreError> {
        self.read(move |c| {
            Ok(query_row(
                c,
                "SELECT EXISTS (SELECT 1 FROM uid_next WHERE first = ?1)",
                [i64::from(first)],
                |r| r.get(0),
            )?)
        })
        .await
    }

    pub async fn adopt_uids(
        &self,
        range: UidRange,
        owner: &str,
        held: Vec<(String, u32)>,
    ) -> Result<(), StoreError> {
        let owner = owner.to_owned();
        self.write(move |c| {
            let tx = begin(c)?;
            let now = now_ms();
            let (first, last) = (i64::from(range.first), i64::from(range.last));
            let known: bool = query_row(
                &tx,
                "SELECT EXISTS (SELECT 1 FROM uid_next WHERE first = ?1)",
                [first],
                |r| r.get(0),
            )?;
            if known {
                return Ok(());
            }
            for (session, uid) in &held {
                exec(
                    &tx,
                    "INSERT OR IGNORE INTO session_uids (uid, session_id, owner, claimed_ms, \
                     used) VALUES (?1, ?2, ?3, ?4, (SELECT COALESCE(MAX(used), 0) + 1 \
                     FROM session_uids))",
                    params![i64::from(*uid), session, owner, now],
                )?;
            }
            let top: Option<i64> = query_row(
                &tx,
                "SELECT MAX(uid) FROM session_uids WHERE uid BETWEEN ?1 AND ?2",
                params![first, last],
                |r| r.get(0),
            )?;
            let next = top.map_or(first, |t| t + 1);
            // The uids below the first never handed out that no session holds are free.
            exec(
                &tx,
                "WITH RECURSIVE u(uid) AS (SELECT ?1 UNION ALL SELECT uid + 1 FROM u \
                 WHERE uid + 1 < ?2) \
                 INSERT OR IGNORE INTO uid_free (uid) SELECT uid FROM u WHERE uid < ?2 \
                 AND uid NOT IN (SELECT uid FROM session_uids)",
                params![first, next],
            )?;
            exec(
                &tx,
                "INSERT OR IGNORE INTO uid_next (first, next) VALUES (?1, ?2)",
                params![first, next],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn take_uid(
        &self,
        session_id: &str,
        owner: &str,
        range: UidRange,
        park: Park,
    ) -> Result<Option<UidGrant>, StoreError> {
        let (session_id, owner) = (session_id.to_owned(), owner.to_owned());
        self.write(move |c| {
            let started = std::time::Instant::now();
            let taken = take_uid(c, &session_id, &owner, range, &park);
            super::note_take(&taken, started.elapsed());
            taken
        })
        .await
    }

    pub async fn release_uid(&self, session_id: &str) -> Result<(), StoreError> {
        let session_id = session_id.to_owned();
        self.write(move |c| {
            let tx = begin(c)?;
            let uid: Option<i64> = tx
                .query_row(
                    "DELETE FROM session_uids WHERE session_id = ?1 RETURNING uid",
                    [&session_id],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(uid) = uid {
                exec(
                    &tx,
                    "INSERT OR IGNORE INTO uid_free (uid) VALUES (?1)",
                    [uid],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }
}

/// One take of a uid (see [`super::Store::take_uid`]), in one transaction on the writer.
/// Long: the transaction's statements in order, each a fallback for the one before (as in
/// the Postgres store).
fn take_uid(
    c: &mut Connection,
    session_id: &str,
    owner: &str,
    range: UidRange,
    park: &Park,
) -> Result<Option<UidGrant>, StoreError> {
    let tx = begin(c)?;
    let now = now_ms();
    let (first, last) = (i64::from(range.first), i64::from(range.last));
    // The order of use: one more than the last take's (an indexed maximum).
    let used: i64 = query_row(
        &tx,
        "SELECT COALESCE(MAX(used), 0) + 1 FROM session_uids",
        [],
        |r| r.get(0),
    )?;
    let held: Option<i64> = tx
        .query_row(
            "UPDATE session_uids SET used = ?2 WHERE session_id = ?1 RETURNING uid",
            params![session_id, used],
            |r| r.get(0),
        )
        .optional()?;
    if let Some(uid) = held {
        tx.commit()?;
        return grant(uid, UidGrant::Held);
    }
    let insert = |tx: &Transaction<'_>, uid: i64| -> rusqlite::Result<bool> {
        Ok(exec(
            tx,
            "INSERT OR IGNORE INTO session_uids (uid, session_id, owner, claimed_ms, \
                 used) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![uid, session_id, owner, now, used],
        )? == 1)
    };
    // Given back, lowest first; a uid a session of another range holds is skipped.
    loop {
        let free: Option<i64> = tx
            .query_row(
                "DELETE FROM uid_free WHERE uid = (SELECT uid FROM uid_free \
                     WHERE uid BETWEEN ?1 AND ?2 ORDER BY uid LIMIT 1) RETURNING uid",
                params![first, last],
                |r| r.get(0),
            )
            .optional()?;
        let Some(uid) = free else { break };
        if insert(&tx, uid)? {
            tx.commit()?;
            return grant(uid, UidGrant::Fresh);
        }
    }
    // Never handed out yet.
    loop {
        let next: Option<i64> = tx
            .query_row(
                "UPDATE uid_next SET next = next + 1 WHERE first = ?1 AND next <= ?2 \
                     RETURNING next - 1",
                params![first, last],
                |r| r.get(0),
            )
            .optional()?;
        let Some(uid) = next else { break };
        if insert(&tx, uid)? {
            tx.commit()?;
            return grant(uid, UidGrant::Fresh);
        }
    }
    // Lent by the idle session that used its uid least recently, parked first.
    let idle: Option<(i64, String)> = tx
        .query_row(
            "SELECT s.uid, s.session_id FROM session_uids s \
                 WHERE s.uid BETWEEN ?1 AND ?2 AND NOT EXISTS (SELECT 1 FROM invocations i \
                 WHERE i.session_id = s.session_id AND i.status IN ('queued', 'running')) \
                 ORDER BY s.used LIMIT 1",
            params![first, last],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((uid, from)) = idle else {
        return Ok(None);
    };
    park(&from).map_err(StoreError::Park)?;
    exec(
        &tx,
        "UPDATE session_uids SET session_id = ?2, owner = ?3, claimed_ms = ?4, \
             used = ?5 WHERE uid = ?1",
        params![uid, session_id, owner, now, used],
    )?;
    tx.commit()?;
    grant(uid, |uid| UidGrant::Reclaimed { uid, from })
}
