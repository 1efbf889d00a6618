//! The durable BYOH store: an embedded SQLite database (WAL) in the data directory.
//!
//! Owns: invocations (one per session: ids, status, error, the connection without its key,
//! pending questions, the last applied resume, where the current submission's output starts)
//! and each session's transcript, one row per message, written after every step.
//!
//! Invariants:
//! * One thread owns the connection and runs every operation in turn, so each operation is
//!   atomic against every other: a check-and-insert cannot race a duplicate submission, and a
//!   conditional status change cannot overwrite a cancellation.
//! * Callers never block an async thread on the database: they send a job and await its answer.
//! * Nothing secret is stored: the model API key never reaches this module.
//! * A swept invocation keeps a tombstone row (ids, status, error), so its status still answers.
//! * A turn's end whose write failed (a full disk) is held in memory ([`Store::hold_end`]) and
//!   answered from there until the write lands: a status never goes back to `running`.
//!
//! Non-goals: deciding what a submission means (`invocation`), workspaces on disk (`runner`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Row, params};
use tokio::sync::{mpsc, oneshot};

use super::protocol::Status;
use crate::chat::message::{ChatMessage, ModelEndpoint};

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("could not open the store {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("store query failed: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("the store thread has stopped")]
    Stopped,
}

/// One invocation as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct InvocationRow {
    pub invocation_id: String,
    pub session_id: String,
    pub status: Status,
    /// Set when, and only when, `status` is `failed`.
    pub error: Option<String>,
    pub connection: ModelEndpoint,
    /// Whether the latest submission came with an API key (which is kept in memory only).
    pub needs_key: bool,
    /// Index of the first transcript message of the current submission's output.
    pub output_start: usize,
    /// Ids of the questions an `input_required` turn waits on.
    pub pending: Vec<String>,
    /// Ids answered by the last applied resume (to recognise its retries).
    pub last_resume: Vec<String>,
    /// When the invocation reached a terminal status (ms since the epoch).
    pub finished_ms: Option<i64>,
    /// The transcript and workspace were removed after the retention period.
    pub swept: bool,
}

/// How a start was taken.
#[derive(Debug)]
pub enum StartOutcome {
    Inserted,
    /// The invocation exists: a retry.
    Exists(InvocationRow),
    /// The session already holds another invocation.
    SessionTaken(String),
}

/// How a resume was taken.
#[derive(Debug)]
pub enum ResumeOutcome {
    Applied(InvocationRow),
    /// A retry of the last applied resume.
    Duplicate(InvocationRow),
    /// The replies do not match the pending questions: the message says how.
    Mismatch(String),
    /// The invocation is not waiting for input, and this is not a retry of the last resume.
    NotWaiting(InvocationRow),
    NotFound,
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// A handle on the store thread. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    tx: mpsc::Sender<Job>,
    /// What `get_status` answers, by invocation id: filled and invalidated on the store thread
    /// only (reads fill it in the same job that reads the row, writes drop the entry in the job
    /// that commits), so it never holds a status older than the last committed one.
    statuses: Arc<Mutex<HashMap<String, StatusRow>>>,
    /// Ends of turns whose write has not landed yet (a full disk): what `get` and `status`
    /// answer for them meanwhile. Dropped by the job that commits any change of the row.
    ends: Arc<Mutex<HashMap<String, InvocationRow>>>,
}

/// The part of a row the status object needs.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusRow {
    pub session_id: String,
    pub status: Status,
    pub error: Option<String>,
}

impl InvocationRow {
    pub fn status_row(&self) -> StatusRow {
        StatusRow {
            session_id: self.session_id.clone(),
            status: self.status,
            error: self.error.clone(),
        }
    }
}

/// Entries the status cache holds before it starts over.
const STATUS_CACHE_MAX: usize = 100_000;

type Statuses = Arc<Mutex<HashMap<String, StatusRow>>>;

fn forget(statuses: &Statuses, id: &str) {
    statuses
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(id);
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS invocations (
    invocation_id TEXT PRIMARY KEY,
    session_id    TEXT NOT NULL UNIQUE,
    status        TEXT NOT NULL,
    error         TEXT,
    connection    TEXT NOT NULL,
    needs_key     INTEGER NOT NULL,
    output_start  INTEGER NOT NULL,
    pending       TEXT NOT NULL DEFAULT '[]',
    last_resume   TEXT NOT NULL DEFAULT '[]',
    created_ms    INTEGER NOT NULL,
    updated_ms    INTEGER NOT NULL,
    finished_ms   INTEGER,
    swept         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS invocations_status ON invocations (status, swept);
CREATE TABLE IF NOT EXISTS messages (
    invocation_id TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    body          TEXT NOT NULL,
    PRIMARY KEY (invocation_id, seq)
) WITHOUT ROWID;
";

const COLUMNS: &str = "invocation_id, session_id, status, error, connection, needs_key, \
    output_start, pending, last_resume, finished_ms, swept";

fn corrupt(msg: String) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(msg.into())
}

fn read_row(r: &Row<'_>) -> rusqlite::Result<InvocationRow> {
    let status: String = r.get(2)?;
    let connection: String = r.get(4)?;
    let pending: String = r.get(7)?;
    let last_resume: String = r.get(8)?;
    Ok(InvocationRow {
        invocation_id: r.get(0)?,
        session_id: r.get(1)?,
        status: Status::parse(&status).ok_or_else(|| corrupt(format!("status {status:?}")))?,
        error: r.get(3)?,
        connection: serde_json::from_str(&connection).map_err(|e| corrupt(e.to_string()))?,
        needs_key: r.get(5)?,
        output_start: r.get::<_, i64>(6)? as usize,
        pending: serde_json::from_str(&pending).map_err(|e| corrupt(e.to_string()))?,
        last_resume: serde_json::from_str(&last_resume).map_err(|e| corrupt(e.to_string()))?,
        finished_ms: r.get(9)?,
        swept: r.get(10)?,
    })
}

fn to_json<T: serde::Serialize>(v: &T) -> rusqlite::Result<String> {
    serde_json::to_string(v).map_err(|e| corrupt(e.to_string()))
}

fn get(c: &Connection, id: &str) -> rusqlite::Result<Option<InvocationRow>> {
    c.query_row(
        &format!("SELECT {COLUMNS} FROM invocations WHERE invocation_id = ?1"),
        [id],
        read_row,
    )
    .optional()
}

fn count_messages(c: &Connection, id: &str) -> rusqlite::Result<usize> {
    c.query_row(
        "SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE invocation_id = ?1",
        [id],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n as usize)
}

fn append(c: &Connection, id: &str, messages: &[ChatMessage]) -> rusqlite::Result<usize> {
    let mut seq = count_messages(c, id)?;
    let mut stmt =
        c.prepare_cached("INSERT INTO messages (invocation_id, seq, body) VALUES (?1, ?2, ?3)")?;
    for m in messages {
        stmt.execute(params![id, seq as i64, to_json(m)?])?;
        seq += 1;
    }
    Ok(seq)
}

fn read_messages(c: &Connection, id: &str, from: usize) -> rusqlite::Result<Vec<ChatMessage>> {
    let mut stmt = c.prepare_cached(
        "SELECT body FROM messages WHERE invocation_id = ?1 AND seq >= ?2 ORDER BY seq",
    )?;
    let rows = stmt.query_map(params![id, from as i64], |r| r.get::<_, String>(0))?;
    rows.map(|r| r.and_then(|s| serde_json::from_str(&s).map_err(|e| corrupt(e.to_string()))))
        .collect()
}

impl Store {
    /// Opens (or creates) the database at `path` and starts its thread.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.display().to_string(),
            source,
        };
        let conn = Connection::open(path).map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        // NORMAL: in WAL mode every commit survives a crash of the process; the commits that
        // must also survive a power cut (accepted submissions, end states) go through
        // `Store::durable`, which syncs them.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(open_err)?;
        conn.execute_batch(SCHEMA).map_err(open_err)?;
        let (tx, mut rx) = mpsc::channel::<Job>(1024);
        std::thread::Builder::new()
            .name("podhost-store".into())
            .spawn(move || {
                let mut conn = conn;
                while let Some(job) = rx.blocking_recv() {
                    job(&mut conn);
                }
            })
            .map_err(|e| StoreError::Corrupt(format!("could not start the store thread: {e}")))?;
        Ok(Store {
            tx,
            statuses: Arc::default(),
            ends: Arc::default(),
        })
    }

    /// Runs `f` on the store thread.
    pub async fn call<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        let (done, answer) = oneshot::channel();
        let job: Job = Box::new(move |c| {
            let _ = done.send(f(c));
        });
        self.tx.send(job).await.map_err(|_| StoreError::Stopped)?;
        answer
            .await
            .map_err(|_| StoreError::Stopped)?
            .map_err(StoreError::from)
    }

    /// Runs `f` on the store thread with its commits synced to disk before they count.
    pub async fn durable<R, F>(&self, f: F) -> Result<R, StoreError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> rusqlite::Result<R> + Send + 'static,
    {
        self.call(move |c| {
            c.pragma_update(None, "synchronous", "FULL")?;
            let r = f(c);
            c.pragma_update(None, "synchronous", "NORMAL")?;
            r
        })
        .await
    }

    /// Holds `row` (a turn's end whose write failed) in memory: [`Store::get`] and
    /// [`Store::status`] answer it until a change of the row commits.
    pub fn hold_end(&self, row: InvocationRow) {
        self.ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(row.invocation_id.clone(), row);
    }

    fn held_end(&self, id: &str) -> Option<InvocationRow> {
        self.ends
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// The number of invocations stored.
    pub async fn count(&self) -> Result<u64, StoreError> {
        self.call(|c| {
            c.query_row("SELECT COUNT(*) FROM invocations", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(|n| n as u64)
        })
        .await
    }

    /// The status of an invocation, from memory when it was read since its last change.
    pub async fn status(&self, id: &str) -> Result<Option<StatusRow>, StoreError> {
        if let Some(held) = self.held_end(id) {
            return Ok(Some(held.status_row()));
        }
        let cached = self
            .statuses
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned();
        if cached.is_some() {
            return Ok(cached);
        }
        let id = id.to_owned();
        let statuses = self.statuses.clone();
        self.call(move |c| {
            let Some(row) = get(c, &id)? else {
                return Ok(None);
            };
            let entry = row.status_row();
            let mut map = statuses.lock().unwrap_or_else(PoisonError::into_inner);
            if map.len() >= STATUS_CACHE_MAX {
                map.clear();
            }
            map.insert(id, entry.clone());
            Ok(Some(entry))
        })
        .await
    }

    pub async fn get(&self, id: &str) -> Result<Option<InvocationRow>, StoreError> {
        if let Some(held) = self.held_end(id) {
            return Ok(Some(held));
        }
        let id = id.to_owned();
        self.call(move |c| get(c, &id)).await
    }

    /// Inserts a new invocation with its opening messages, unless it (or its session) exists.
    pub async fn insert_start(
        &self,
        row: InvocationRow,
        messages: Vec<ChatMessage>,
    ) -> Result<StartOutcome, StoreError> {
        self.durable(move |c| {
            let tx = c.transaction()?;
            if let Some(existing) = get(&tx, &row.invocation_id)? {
                return Ok(StartOutcome::Exists(existing));
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
            tx.execute(
                "INSERT INTO invocations (invocation_id, session_id, status, connection, \
                 needs_key, output_start, created_ms, updated_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7)",
                params![
                    row.invocation_id,
                    row.session_id,
                    Status::Queued.as_str(),
                    to_json(&row.connection)?,
                    row.needs_key,
                    messages.len() as i64,
                    now
                ],
            )?;
            append(&tx, &row.invocation_id, &messages)?;
            tx.commit()?;
            Ok(StartOutcome::Inserted)
        })
        .await
    }

    /// Applies a resume whose replies answer exactly the pending questions.
    pub async fn apply_resume(
        &self,
        id: &str,
        ids: Vec<String>,
        messages: Vec<ChatMessage>,
        connection: ModelEndpoint,
        needs_key: bool,
    ) -> Result<ResumeOutcome, StoreError> {
        let id = id.to_owned();
        let statuses = self.statuses.clone();
        self.durable(move |c| {
            let tx = c.transaction()?;
            let Some(row) = get(&tx, &id)? else {
                return Ok(ResumeOutcome::NotFound);
            };
            let same = |a: &[String], b: &[String]| {
                let mut a = a.to_vec();
                let mut b = b.to_vec();
                a.sort();
                b.sort();
                a == b
            };
            if row.status != Status::InputRequired || same(&ids, &row.last_resume) {
                if same(&ids, &row.last_resume) {
                    return Ok(ResumeOutcome::Duplicate(row));
                }
                return Ok(ResumeOutcome::NotWaiting(row));
            }
            let unknown: Vec<&String> = ids.iter().filter(|i| !row.pending.contains(i)).collect();
            if !unknown.is_empty() {
                return Ok(ResumeOutcome::Mismatch(format!(
                    "the resume answers tool call(s) {unknown:?}, which are not pending; the \
                     pending calls are {:?}",
                    row.pending
                )));
            }
            let missing: Vec<&String> = row.pending.iter().filter(|p| !ids.contains(p)).collect();
            if !missing.is_empty() {
                return Ok(ResumeOutcome::Mismatch(format!(
                    "the resume leaves pending tool call(s) {missing:?} unanswered; it needs one \
                     tool message per pending call"
                )));
            }
            let end = append(&tx, &id, &messages)?;
            tx.execute(
                "UPDATE invocations SET status = ?2, pending = '[]', last_resume = ?3, \
                 output_start = ?4, connection = ?5, needs_key = ?6, updated_ms = ?7 \
                 WHERE invocation_id = ?1",
                params![
                    id,
                    Status::Queued.as_str(),
                    to_json(&ids)?,
                    end as i64,
                    to_json(&connection)?,
                    needs_key,
                    now_ms()
                ],
            )?;
            let row = get(&tx, &id)?;
            tx.commit()?;
            forget(&statuses, &id);
            row.map(ResumeOutcome::Applied)
                .ok_or(rusqlite::Error::QueryReturnedNoRows)
        })
        .await
    }

    /// Moves the invocation to `to` if its status is one of `from`; answers the row as it is
    /// afterwards and whether it changed. `error` and `pending` are set with the status.
    pub async fn transition(
        &self,
        id: &str,
        from: &'static [Status],
        to: Status,
        error: Option<String>,
        pending: Vec<String>,
    ) -> Result<(bool, Option<InvocationRow>), StoreError> {
        let id = id.to_owned();
        let statuses = self.statuses.clone();
        let ends = self.ends.clone();
        // End states and questions are what callers act on: sync them; `running` need not be.
        let op = move |c: &mut Connection| {
            if to != Status::Running && crate::failpoint_fails!("serve.store_full") {
                return Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
                    Some("database or disk is full".to_owned()),
                ));
            }
            let tx = c.transaction()?;
            let Some(row) = get(&tx, &id)? else {
                return Ok((false, None));
            };
            if !from.contains(&row.status) {
                ends.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
                return Ok((false, Some(row)));
            }
            let now = now_ms();
            let finished = to.is_terminal().then_some(now);
            tx.execute(
                "UPDATE invocations SET status = ?2, error = ?3, pending = ?4, updated_ms = ?5, \
                 finished_ms = ?6 WHERE invocation_id = ?1",
                params![id, to.as_str(), error, to_json(&pending)?, now, finished],
            )?;
            let row = get(&tx, &id)?;
            tx.commit()?;
            forget(&statuses, &id);
            ends.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
            Ok((true, row))
        };
        if to == Status::Running {
            self.call(op).await
        } else {
            self.durable(op).await
        }
    }

    pub async fn append(&self, id: &str, messages: Vec<ChatMessage>) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.call(move |c| {
            let tx = c.transaction()?;
            append(&tx, &id, &messages)?;
            tx.commit()
        })
        .await
    }

    /// The transcript from message `from` on.
    pub async fn messages(&self, id: &str, from: usize) -> Result<Vec<ChatMessage>, StoreError> {
        let id = id.to_owned();
        self.call(move |c| read_messages(c, &id, from)).await
    }

    /// Invocations whose turn was queued or running (after a restart: the interrupted ones).
    pub async fn unfinished(&self) -> Result<Vec<InvocationRow>, StoreError> {
        self.call(|c| {
            let mut stmt = c.prepare(&format!(
                "SELECT {COLUMNS} FROM invocations WHERE status IN ('queued', 'running')"
            ))?;
            let rows = stmt.query_map([], read_row)?;
            rows.collect()
        })
        .await
    }

    /// Removes the transcripts of terminal invocations that finished before `cutoff_ms`,
    /// keeping their tombstones; answers their session ids.
    pub async fn sweep(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError> {
        self.call(move |c| {
            let tx = c.transaction()?;
            let sessions: Vec<(String, String)> = {
                let mut stmt = tx.prepare(
                    "SELECT invocation_id, session_id FROM invocations WHERE swept = 0 \
                     AND status IN ('completed', 'failed', 'cancelled') AND finished_ms < ?1",
                )?;
                let rows = stmt.query_map([cutoff_ms], |r| Ok((r.get(0)?, r.get(1)?)))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for (id, _) in &sessions {
                tx.execute("DELETE FROM messages WHERE invocation_id = ?1", [id])?;
                tx.execute(
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn row(id: &str, session: &str) -> InvocationRow {
        InvocationRow {
            invocation_id: id.into(),
            session_id: session.into(),
            status: Status::Queued,
            error: None,
            connection: ModelEndpoint::default(),
            needs_key: true,
            output_start: 0,
            pending: vec![],
            last_resume: vec![],
            finished_ms: None,
            swept: false,
        }
    }

    #[tokio::test]
    async fn starts_resumes_and_transitions_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.sqlite");
        let store = Store::open(&path).unwrap();
        let msgs = vec![ChatMessage::user("hi")];
        assert!(matches!(
            store
                .insert_start(row("i", "s"), msgs.clone())
                .await
                .unwrap(),
            StartOutcome::Inserted
        ));
        assert!(matches!(
            store
                .insert_start(row("i", "s"), msgs.clone())
                .await
                .unwrap(),
            StartOutcome::Exists(_)
        ));
        assert!(matches!(
            store.insert_start(row("j", "s"), msgs.clone()).await.unwrap(),
            StartOutcome::SessionTaken(other) if other == "i"
        ));
        let ask = ChatMessage::assistant(
            String::new(),
            vec![crate::chat::message::ToolCall::new(
                "q",
                "ask_user",
                "{}".into(),
            )],
        );
        store.append("i", vec![ask]).await.unwrap();
        // Read (and remembered) before the change, read again after it.
        assert_eq!(
            store.status("i").await.unwrap().unwrap().status,
            Status::Queued
        );
        assert_eq!(store.status("nope").await.unwrap(), None);
        let (changed, _) = store
            .transition(
                "i",
                &[Status::Queued],
                Status::InputRequired,
                None,
                vec!["q".into()],
            )
            .await
            .unwrap();
        assert!(changed);
        let resume = |ids: &[&str]| {
            let store = store.clone();
            let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
            async move {
                let msgs = ids
                    .iter()
                    .map(|i| ChatMessage::tool(i.clone(), "x"))
                    .collect();
                store
                    .apply_resume("i", ids, msgs, ModelEndpoint::default(), false)
                    .await
                    .unwrap()
            }
        };
        assert!(matches!(resume(&["z"]).await, ResumeOutcome::Mismatch(m)
            if m == "the resume answers tool call(s) [\"z\"], which are not pending; the pending calls are [\"q\"]"));
        assert_eq!(
            store.status("i").await.unwrap().unwrap().status,
            Status::InputRequired
        );
        let ResumeOutcome::Applied(applied) = resume(&["q"]).await else {
            panic!()
        };
        assert_eq!(
            store.status("i").await.unwrap().unwrap().status,
            Status::Queued
        );
        assert_eq!(applied.output_start, 3);
        assert!(matches!(resume(&["q"]).await, ResumeOutcome::Duplicate(_)));
        drop(store);

        let store = Store::open(&path).unwrap();
        let got = store.get("i").await.unwrap().unwrap();
        assert_eq!(
            (got.status, got.needs_key, got.last_resume),
            (Status::Queued, false, vec!["q".to_string()])
        );
        assert_eq!(store.messages("i", 0).await.unwrap().len(), 3);
        assert_eq!(store.unfinished().await.unwrap().len(), 1);
    }
}
