//! The durable BYOH store: one interface, two engines — SQLite in the data directory (the
//! default, one replica) and PostgreSQL (`--store postgres://…`, any number of replicas).
//!
//! Owns: invocations (one per session: ids, status, error, the connection without its key,
//! pending questions, the last applied resume, where the current submission's output starts),
//! each session's transcript (one row per message, written after every step, with when it was
//! stored), the lease of each running turn (owner replica, epoch, expiry), the per-session uid
//! pool (a free list), and the schema versions ([`migrate`]).
//!
//! Invariants, kept by both engines (the decisions are made once, here, on a row read inside the
//! write's transaction; the engines only differ in SQL):
//! * Idempotency is the database's: the invocation id is the primary key and the session id is
//!   unique, so two replicas receiving the same `submit` at once insert one row; a resume is
//!   decided on the row locked for update, so it is applied once.
//! * Every write of a turn carries its [`Fence`] (owner and epoch) and lands only while that
//!   fence holds the lease and the turn is open: a replica that lost its lease — another claimed
//!   the turn (epoch + 1), or the turn was cancelled — writes nothing more. A lease that ran out
//!   is taken over only from an owner that is not alive (on PostgreSQL, whose liveness lock is
//!   free: `pg_live`), so a live replica's late writes and renewals still land.
//! * Lease times are the store's clock (PostgreSQL's `clock_timestamp()`; on SQLite, the one
//!   machine's), so replicas' clocks need not agree.
//! * Reads never wait behind writes: SQLite reads run on their own read-only connections (WAL),
//!   PostgreSQL reads on a pool.
//! * Nothing secret is stored: the model API key never reaches this module, and the store's URL
//!   is printed only without its password ([`StoreSpec`]'s `Display`).
//! * A swept invocation keeps a tombstone row (ids, status, error), so its status still answers.
//!
//! Non-goals: deciding what a submission means (`invocation`), leases' timing and takeover
//! (`runner`), workspaces on disk (`runner`).

mod migrate;
mod pg_live;
mod pg_tls;
mod postgres;
mod sqlite;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;

use super::protocol::Status;
use crate::chat::context::ContextView;
use crate::chat::message::{ChatMessage, ModelEndpoint};
use crate::exec::confine::UidRange;
use crate::floor::secret::Secret;

pub use migrate::SchemaError;
pub use pg_tls::TlsRefusal;

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("could not open the store {what}: {why}")]
    Open { what: String, why: String },
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error("store query failed: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("store query failed: {}", postgres_error(.0))]
    Postgres(#[from] tokio_postgres::Error),
    #[error("could not reach the store: {0}")]
    Pool(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("the store thread has stopped")]
    Stopped,
    /// An idle session's directories could not be parked, so its uid was not lent.
    #[error("could not park an idle session's workspace to lend its uid: {0}")]
    Park(String),
    /// The turn's lease is no longer this replica's: it must stop and write nothing more.
    #[error(
        "this replica no longer holds the lease of invocation {0:?} (it ran out, or another \
         replica took the turn over, or it was cancelled); the turn stops here"
    )]
    Fenced(String),
}

/// What PostgreSQL said (its severity and message, not the detail, which may quote values), or
/// why it could not be asked: `tokio_postgres::Error` alone says only "db error".
fn postgres_error(e: &tokio_postgres::Error) -> String {
    match (e.as_db_error(), std::error::Error::source(e)) {
        (Some(db), _) => format!("{}: {}", db.severity(), db.message()),
        (None, Some(cause)) => format!("{e}: {cause}"),
        (None, None) => e.to_string(),
    }
}

/// Which store `podhost serve` keeps its sessions in.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// An SQLite file (by default `podhost.sqlite` in the data directory).
    Sqlite(PathBuf),
    /// A PostgreSQL database, by URL (`postgres://user:password@host:port/db`) or libpq
    /// key=value string; it may hold a password, so it is a [`Secret`].
    Postgres(Secret),
}

/// Why a store setting names no store podhost can open. Each names the setting and its value
/// without the password.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error(
        "{setting}: {value:?} is not a PostgreSQL URL: give postgres://user@host:5432/db, or \
         leave it unset for SQLite in the data directory"
    )]
    NotPostgres { setting: String, value: String },
    /// A TLS setting podhost cannot honour.
    #[error("{setting}: {value:?} {why}")]
    Tls {
        setting: String,
        value: String,
        why: TlsRefusal,
    },
    /// What tokio-postgres says is wrong with the string.
    #[error("{setting}: {value:?} is not a valid PostgreSQL connection string: {why}")]
    Invalid {
        setting: String,
        value: String,
        why: String,
    },
}

impl StoreSpec {
    /// Reads `--store`: `postgres://…`/`postgresql://…` or a `host=… dbname=…` string selects
    /// PostgreSQL; absent, SQLite in `data_dir`. Errors name the setting as `setting`
    /// (`PODHOST_STORE` or `--store`, whichever was given).
    pub fn parse(
        value: Option<&str>,
        data_dir: &Path,
        setting: &str,
    ) -> Result<StoreSpec, SpecError> {
        let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return Ok(StoreSpec::Sqlite(data_dir.join("podhost.sqlite")));
        };
        if v.starts_with("postgres://") || v.starts_with("postgresql://") || v.contains('=') {
            postgres::config(v, setting)?;
            return Ok(StoreSpec::Postgres(Secret::new(v)));
        }
        Err(SpecError::NotPostgres {
            setting: setting.to_owned(),
            value: redact(v),
        })
    }
}

/// Whether a connection string holds a password (which [`redact`] would hide).
pub(crate) fn holds_password(url: &str) -> bool {
    redact(url) != url
}

/// The connection string with its password (if any) replaced by `***`: in a URL's user
/// information or `password=` query parameter, or a key=value string's `password`.
fn redact(url: &str) -> String {
    let hide_query = |q: &str| {
        q.split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => kv.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("&")
    };
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
        let authority = match authority.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***@{host}"),
                None => authority.to_owned(),
            },
            None => authority.to_owned(),
        };
        let tail = match tail.split_once('?') {
            Some((path, query)) => format!("{path}?{}", hide_query(query)),
            None => tail.to_owned(),
        };
        return format!("{scheme}://{authority}{tail}");
    }
    url.split_whitespace()
        .map(|kv| match kv.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
            _ => kv.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

impl std::fmt::Display for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Sqlite(p) => write!(f, "sqlite:{}", p.display()),
            StoreSpec::Postgres(url) => f.write_str(&redact(url.expose())),
        }
    }
}

impl std::fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
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
    /// The replica that last claimed the turn.
    pub owner: Option<String>,
    /// How many times the turn was claimed; every write of the turn carries it.
    pub epoch: i64,
    /// How long the lease had left when the row was read (ms, by the store's clock; zero or
    /// less: expired); `None` when no lease was ever taken.
    pub lease_left_ms: Option<i64>,
    /// The model's tokens, summed over the invocation's model calls.
    pub tokens: Tokens,
}

/// The model's tokens of an invocation: the prompt tokens (in) and completion tokens (out)
/// each model answer reported in its `usage`, summed over every model call; `None` where no
/// call reported that count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: Option<u64>,
    pub output: Option<u64>,
}

impl Tokens {
    /// Whether no count is known.
    pub fn is_none(&self) -> bool {
        self.input.is_none() && self.output.is_none()
    }

    /// Reads the two columns (`tokens_in`, `tokens_out`); a negative count is corrupt.
    fn from_columns(input: Option<i64>, output: Option<i64>) -> Result<Tokens, StoreError> {
        let count = |c: Option<i64>| {
            c.map(|n| u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("{n} tokens"))))
                .transpose()
        };
        Ok(Tokens {
            input: count(input)?,
            output: count(output)?,
        })
    }

    /// The counts as the columns' parameters.
    fn to_columns(self) -> (Option<i64>, Option<i64>) {
        let count = |c: Option<u64>| c.map(|n| i64::try_from(n).unwrap_or(i64::MAX));
        (count(self.input), count(self.output))
    }
}

impl InvocationRow {
    pub fn status_row(&self) -> StatusRow {
        StatusRow {
            session_id: self.session_id.clone(),
            status: self.status,
            error: self.error.clone(),
        }
    }

    /// A new invocation of `session_id`, before it is stored.
    pub fn new(invocation_id: &str, session_id: &str, connection: ModelEndpoint) -> Self {
        InvocationRow {
            invocation_id: invocation_id.to_owned(),
            session_id: session_id.to_owned(),
            status: Status::Queued,
            error: None,
            connection,
            needs_key: false,
            output_start: 0,
            pending: Vec::new(),
            last_resume: Vec::new(),
            finished_ms: None,
            swept: false,
            owner: None,
            epoch: 0,
            lease_left_ms: None,
            tokens: Tokens::default(),
        }
    }

    /// Whether a turn is to run (queued or running), which only happens under a lease.
    pub fn is_open(&self) -> bool {
        OPEN.contains(&self.status)
    }

    /// Whether the turn is open and no replica holds a live lease on it.
    pub fn is_orphan(&self) -> bool {
        self.is_open() && self.lease_left_ms.is_none_or(|l| l <= 0)
    }

    /// Whether `fence` holds this row's lease: its owner and epoch. A lease that ran out is
    /// still its owner's until another replica claims it (which moves the epoch on), and none
    /// does while the owner is alive.
    fn held_by(&self, fence: &Fence) -> bool {
        self.owner.as_deref() == Some(&*fence.owner) && self.epoch == fence.epoch
    }
}

/// A page of the viewer's list of sessions: newest first, after a cursor, by status and id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ListQuery {
    /// Only sessions in this status.
    pub status: Option<Status>,
    /// Only sessions whose invocation or session id contains this text.
    pub search: Option<String>,
    /// The cursor: the start time (ms) and invocation id of the last row of the page before.
    pub before: Option<(i64, String)>,
    /// At most this many rows.
    pub limit: u32,
}

/// One session as the viewer's list shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionSummary {
    pub invocation_id: String,
    pub session_id: String,
    pub status: Status,
    pub error: Option<String>,
    /// When the invocation was submitted (ms since the epoch).
    pub created_ms: i64,
    /// The last write to the invocation (ms since the epoch).
    pub updated_ms: i64,
    pub finished_ms: Option<i64>,
    /// The model's answers in the transcript (one per model call that landed).
    pub steps: u64,
    /// The tool results in the transcript (one per tool call).
    pub tool_calls: u64,
    /// The transcript was removed after the retention period.
    pub swept: bool,
    /// The model's tokens, summed over the invocation's model calls.
    pub tokens: Tokens,
}

/// The SQL of a [`ListQuery`] page, with the engine's placeholders (`?N` or `$N`) and its
/// test for "`col` contains the parameter `p`"; the parameters, in order: the status (if
/// filtered), the search text (if any), the cursor's time and id (if any), then the limit. The
/// cursor is a row comparison, so the index on (created_ms, invocation_id) starts the scan
/// where the page before ended. A message's role is read without parsing it: a stored
/// message's JSON starts with its role (`{"role":"assistant"…`), the first field of the wire
/// form.
fn list_sql(q: &ListQuery, ph: fn(usize) -> String, contains: fn(&str, &str) -> String) -> String {
    let count = |role: &str| {
        format!(
            "(SELECT COUNT(*) FROM messages m WHERE m.invocation_id = i.invocation_id \
             AND m.body LIKE '{{\"role\":\"{role}\"%')"
        )
    };
    let mut sql = format!(
        "SELECT i.invocation_id, i.session_id, i.status, i.error, i.created_ms, i.updated_ms, \
         i.finished_ms, i.swept, {}, {}, i.tokens_in, i.tokens_out FROM invocations i \
         WHERE 1 = 1",
        count("assistant"),
        count("tool")
    );
    let mut n = 0;
    let mut next = || {
        n += 1;
        ph(n)
    };
    if q.status.is_some() {
        sql += &format!(" AND i.status = {}", next());
    }
    if q.search.is_some() {
        let p = next();
        sql += &format!(
            " AND ({} OR {})",
            contains("i.invocation_id", &p),
            contains("i.session_id", &p)
        );
    }
    if q.before.is_some() {
        sql += &format!(
            " AND (i.created_ms, i.invocation_id) < ({}, {})",
            next(),
            next()
        );
    }
    sql += &format!(
        " ORDER BY i.created_ms DESC, i.invocation_id DESC LIMIT {}",
        next()
    );
    sql
}

/// The statuses of a turn that runs (or is about to) under a lease.
pub const OPEN: &[Status] = &[Status::Queued, Status::Running];

/// The part of a row the status object needs.
#[derive(Clone, Debug, PartialEq)]
pub struct StatusRow {
    pub session_id: String,
    pub status: Status,
    pub error: Option<String>,
}

/// A replica's claim on a turn: every write of the turn carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub owner: Arc<str>,
    pub epoch: i64,
}

/// The replica claiming turns, and for how long a claim or renewal holds.
#[derive(Clone, Debug)]
pub struct LeaseTerms {
    pub owner: Arc<str>,
    pub ttl_ms: i64,
}

impl LeaseTerms {
    fn fence(&self, epoch: i64) -> Fence {
        Fence {
            owner: self.owner.clone(),
            epoch,
        }
    }
}

/// How a start was taken.
#[derive(Debug)]
pub enum StartOutcome {
    /// Inserted, and claimed by the caller under this fence.
    Inserted(Fence),
    /// The invocation exists: a retry.
    Exists(Box<InvocationRow>),
    /// The session already holds another invocation.
    SessionTaken(String),
}

/// How a resume was taken.
#[derive(Debug)]
pub enum ResumeOutcome {
    /// Applied, and claimed by the caller under this fence.
    Applied(InvocationRow, Fence),
    /// A retry of the last applied resume.
    Duplicate(InvocationRow),
    /// The replies do not match the pending questions: the message says how.
    Mismatch(String),
    /// The invocation is not waiting for input, and this is not a retry of the last resume.
    NotWaiting(InvocationRow),
    NotFound,
}

/// An open turn whose lease ran out (its owner died, was paused, or shut down).
#[derive(Clone, Debug, PartialEq)]
pub struct Orphan {
    pub invocation_id: String,
    pub epoch: i64,
    pub needs_key: bool,
    /// How long ago the lease ran out (ms, by the store's clock).
    pub expired_for_ms: i64,
    /// Whether the lease is the asking replica's own (it stopped the turn, cut off from the
    /// store for a whole lease, and may take it back).
    pub ours: bool,
}

/// The store: SQLite or PostgreSQL behind one interface. Cheap to clone.
#[derive(Clone, Debug)]
pub enum Store {
    Sqlite(sqlite::Sqlite),
    Postgres(postgres::Postgres),
}

/// Calls the same method on whichever engine this is.
macro_rules! dispatch {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            Store::Sqlite(s) => s.$method($($arg),*).await,
            Store::Postgres(s) => s.$method($($arg),*).await,
        }
    };
}

/// How a session came by its uid from the pool ([`Store::take_uid`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UidGrant {
    /// The uid it already held.
    Held(u32),
    /// A uid no session held: given back by a swept session, or never handed out.
    Fresh(u32),
    /// The uid idle session `from` held, whose directories were parked first.
    Reclaimed { uid: u32, from: String },
}

impl UidGrant {
    pub fn uid(&self) -> u32 {
        match self {
            UidGrant::Held(uid) | UidGrant::Fresh(uid) | UidGrant::Reclaimed { uid, .. } => *uid,
        }
    }
}

/// Puts an idle session's directories out of every pool uid's reach before its uid is lent to
/// another session (`exec::confine::users::park`); its argument is that session's id.
pub type Park = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Logs (at debug) what one take of a uid cost the store: its transaction alone, not the wait
/// for a connection or the writer, so that the cost of the pool's free list shows, whatever the
/// load (`cargo bench --bench evaluation` reads it).
fn note_take(taken: &Result<Option<UidGrant>, StoreError>, took: Duration) {
    if let Ok(Some(grant)) = taken {
        tracing::debug!(
            uid = grant.uid(),
            took_us = took.as_micros() as u64,
            "took a uid from the pool"
        );
    }
}

/// A uid read from the store as a grant; a value no uid can be (the store was written by hand)
/// becomes `Corrupt`.
fn grant(uid: i64, make: impl FnOnce(u32) -> UidGrant) -> Result<Option<UidGrant>, StoreError> {
    u32::try_from(uid)
        .map(|u| Some(make(u)))
        .map_err(|_| StoreError::Corrupt(format!("uid {uid} in the pool")))
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Store {
    /// Opens the store, bringing its schema up to date (or refusing a newer one). A
    /// PostgreSQL store's TLS trusts what `tls` (podhost's one client configuration) trusts.
    pub async fn open(
        spec: &StoreSpec,
        tls: &Arc<rustls::ClientConfig>,
    ) -> Result<Store, StoreError> {
        match spec {
            StoreSpec::Sqlite(path) => Ok(Store::Sqlite(sqlite::Sqlite::open(path)?)),
            StoreSpec::Postgres(url) => Ok(Store::Postgres(
                postgres::Postgres::open(url.expose(), tls).await?,
            )),
        }
    }

    /// `sqlite` or `postgres`, for logs.
    pub fn engine(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// Whether other replicas may share this store (only PostgreSQL: an SQLite store belongs
    /// to the one process that holds its data directory's lock).
    pub fn is_shared(&self) -> bool {
        matches!(self, Store::Postgres(_))
    }

    /// Whether the store takes a write now, within `wait`, without anything being written: a
    /// database another process holds locked, one that became read-only (or, on PostgreSQL, a
    /// standby, or one that cannot be reached) says so.
    pub async fn check_writable(&self, wait: Duration) -> Result<(), StoreError> {
        dispatch!(self.check_writable(wait))
    }

    /// The number of invocations stored (tombstones included).
    pub async fn count(&self) -> Result<u64, StoreError> {
        dispatch!(self.count())
    }

    /// The status of an invocation.
    pub async fn status(&self, id: &str) -> Result<Option<StatusRow>, StoreError> {
        dispatch!(self.status(id))
    }

    pub async fn get(&self, id: &str) -> Result<Option<InvocationRow>, StoreError> {
        dispatch!(self.get(id))
    }

    /// Inserts a new invocation with its opening messages, claimed under `terms`, unless it (or
    /// its session) exists.
    pub async fn insert_start(
        &self,
        row: InvocationRow,
        messages: Vec<ChatMessage>,
        terms: &LeaseTerms,
    ) -> Result<StartOutcome, StoreError> {
        let _timer = crate::floor::metrics::store_write();
        dispatch!(self.insert_start(row, messages, terms))
    }

    /// Applies a resume whose replies answer exactly the pending questions, claiming the turn
    /// under `terms`.
    pub async fn apply_resume(
        &self,
        id: &str,
        ids: Vec<String>,
        messages: Vec<ChatMessage>,
        connection: ModelEndpoint,
        needs_key: bool,
        terms: &LeaseTerms,
    ) -> Result<ResumeOutcome, StoreError> {
        let _timer = crate::floor::metrics::store_write();
        dispatch!(self.apply_resume(id, ids, messages, connection, needs_key, terms))
    }

    /// Claims an orphaned turn last claimed at `epoch`; `None` when it is not (or no longer)
    /// an orphan at that epoch — another replica claimed it first, or it ended.
    pub async fn claim(
        &self,
        id: &str,
        epoch: i64,
        terms: &LeaseTerms,
    ) -> Result<Option<(InvocationRow, Fence)>, StoreError> {
        dispatch!(self.claim(id, epoch, terms))
    }

    /// Moves the invocation to `to` if its status is one of `from`; answers the row as it is
    /// afterwards and whether it changed. `error` and `pending` are set with the status. With
    /// a fence, the write lands only while the fence holds the lease ([`StoreError::Fenced`]
    /// otherwise); without one (cancel), on any replica. A cancellation is announced to the
    /// turn's owner.
    pub async fn transition(
        &self,
        id: &str,
        from: &'static [Status],
        to: Status,
        error: Option<String>,
        pending: Vec<String>,
        fence: Option<&Fence>,
    ) -> Result<(bool, Option<InvocationRow>), StoreError> {
        let _timer = crate::floor::metrics::store_write();
        dispatch!(self.transition(id, from, to, error, pending, fence))
    }

    /// Appends messages to the transcript, while `fence` holds the open turn's lease.
    pub async fn append(
        &self,
        id: &str,
        messages: Vec<ChatMessage>,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let _timer = crate::floor::metrics::store_write();
        dispatch!(self.append(id, messages, fence))
    }

    /// Adds the tokens one model call reported to the invocation's sums, while `fence` holds
    /// the open turn's lease. A count the call did not report leaves its sum as it was.
    pub async fn add_tokens(
        &self,
        id: &str,
        tokens: Tokens,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        if tokens.is_none() {
            return Ok(());
        }
        let _timer = crate::floor::metrics::store_write();
        dispatch!(self.add_tokens(id, tokens.to_columns(), fence))
    }

    /// The transcript from message `from` on.
    pub async fn messages(&self, id: &str, from: usize) -> Result<Vec<ChatMessage>, StoreError> {
        dispatch!(self.messages(id, from))
    }

    /// When each message of the transcript was stored (ms since the epoch), in order; `None`
    /// for a message stored before the store kept it.
    pub async fn message_times(&self, id: &str) -> Result<Vec<Option<i64>>, StoreError> {
        dispatch!(self.message_times(id))
    }

    /// A page of the sessions, newest first (see [`ListQuery`]): the scan starts at the cursor
    /// on an index in the list's order, so the first page and a deep one cost alike; a search
    /// by a part of an id reads every row's ids.
    pub async fn list_sessions(&self, q: &ListQuery) -> Result<Vec<SessionSummary>, StoreError> {
        dispatch!(self.list_sessions(q))
    }

    /// Keeps the compacted view of an invocation's transcript, committed synchronously (a later
    /// turn, on any replica, starts from it); fenced like every write of a turn.
    pub async fn set_view(
        &self,
        id: &str,
        view: &ContextView,
        fence: &Fence,
    ) -> Result<(), StoreError> {
        let _timer = crate::floor::metrics::store_write();
        let body = to_json(view)?;
        dispatch!(self.set_view(id, body, fence))
    }

    /// The compacted view of an invocation's transcript (the whole transcript when none).
    pub async fn view(&self, id: &str) -> Result<ContextView, StoreError> {
        let body: Option<String> = dispatch!(self.view(id))?;
        body.map_or(Ok(ContextView::default()), |b| {
            from_json("a context view", &b)
        })
    }

    /// Renews the leases `held` (invocation id, epoch) of `terms.owner` that are still its own
    /// and open, expired or not (none is taken over while its owner lives); answers the ids
    /// renewed. A turn missing from the answer was lost.
    pub async fn renew(
        &self,
        terms: &LeaseTerms,
        held: Vec<(String, i64)>,
    ) -> Result<Vec<String>, StoreError> {
        if crate::failpoint_fails!("serve.renew_fails") {
            return Err(StoreError::Pool(
                "refused (the failpoint serve.renew_fails)".into(),
            ));
        }
        dispatch!(self.renew(terms, held))
    }

    /// Ends a lease at once (this replica stops the turn, as at shutdown), so another replica
    /// can take the turn over without waiting for it to run out.
    pub async fn release(&self, id: &str, fence: &Fence) -> Result<(), StoreError> {
        dispatch!(self.release(id, fence))
    }

    /// Open turns whose lease ran out and whose owner is not alive (on PostgreSQL, its liveness
    /// lock is free) or is `me`.
    pub async fn orphans(&self, me: &str) -> Result<Vec<Orphan>, StoreError> {
        dispatch!(self.orphans(me))
    }

    /// Fails an orphan that needs a key and got none: only if it is still the orphan last
    /// claimed at `epoch`, its lease ran out at least `grace_ms` ago, and its owner is not alive
    /// or is `me`.
    pub async fn fail_orphan(
        &self,
        id: &str,
        epoch: i64,
        grace_ms: i64,
        message: String,
        me: &str,
    ) -> Result<bool, StoreError> {
        dispatch!(self.fail_orphan(id, epoch, grace_ms, message, me))
    }

    /// Makes this process replica `owner` of the store: on PostgreSQL, a connection of its own
    /// holds the replica's liveness lock for as long as it lives and carries its renewals (see
    /// `pg_live`); nothing on SQLite, which one process holds.
    pub async fn join(&self, owner: Arc<str>, lease: Duration) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(_) => Ok(()),
            Store::Postgres(s) => s.join(owner, lease).await,
        }
    }

    /// Ends every lease now: the one process of an SQLite store, at start, takes up what its
    /// predecessor left (the grace for a retried key counts from now).
    pub async fn expire_leases(&self) -> Result<usize, StoreError> {
        dispatch!(self.expire_leases())
    }

    /// Removes the transcripts of terminal invocations that finished before `cutoff_ms`,
    /// keeping their tombstones; answers their session ids.
    pub async fn sweep(&self, cutoff_ms: i64) -> Result<Vec<String>, StoreError> {
        let _timer = crate::floor::metrics::store_write();
        dispatch!(self.sweep(cutoff_ms))
    }

    /// The sessions whose invocation is kept whole (not swept).
    pub async fn kept_sessions(&self) -> Result<Vec<String>, StoreError> {
        dispatch!(self.kept_sessions())
    }

    /// Whether the uid pool starting at `first` was set up ([`adopt_uids`](Self::adopt_uids)).
    pub async fn uid_range_known(&self, first: u32) -> Result<bool, StoreError> {
        dispatch!(self.uid_range_known(first))
    }

    /// Sets up the uid pool `range` once: the sessions in `held` keep the uids their
    /// workspaces already belong to (a store written before the pool was the store's), the
    /// uids below the highest held that nobody holds are free, and the rest are handed out in
    /// order. A range already set up is left as it is.
    pub async fn adopt_uids(
        &self,
        range: UidRange,
        owner: &str,
        held: Vec<(String, u32)>,
    ) -> Result<(), StoreError> {
        dispatch!(self.adopt_uids(range, owner, held))
    }

    /// The uid of `session_id` from the pool `range`, unique across every replica of the
    /// store: the one it holds; else one given back (lowest first); else the range's next never
    /// handed out; else the uid of the idle session (no turn queued or running) that used its
    /// uid least recently, once `park` put that session's directories out of reach, inside the
    /// same transaction (so the lender, resumed meanwhile elsewhere, waits and then takes
    /// another). `None` when every uid of the range serves a session with a turn open. Costs
    /// the same whatever the number of sessions (indexed lookups; the lender is the first idle
    /// one in order of use).
    pub async fn take_uid(
        &self,
        session_id: &str,
        owner: &str,
        range: UidRange,
        park: Park,
    ) -> Result<Option<UidGrant>, StoreError> {
        dispatch!(self.take_uid(session_id, owner, range, park))
    }

    /// Gives the uid of `session_id` back to the pool (its session was swept).
    pub async fn release_uid(&self, session_id: &str) -> Result<(), StoreError> {
        dispatch!(self.release_uid(session_id))
    }

    /// Invocation ids whose cancellation other replicas announced (PostgreSQL's
    /// LISTEN/NOTIFY); `None` on an engine without announcements, or once taken.
    pub fn cancellations(&self) -> Option<mpsc::Receiver<String>> {
        match self {
            Store::Sqlite(_) => None,
            Store::Postgres(s) => s.cancellations(),
        }
    }
}

/// Sorted copies compare equal.
fn same_ids(a: &[String], b: &[String]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort();
    b.sort();
    a == b
}

/// What a resume means for the row it was decided on (locked for update): `None` to apply it.
fn judge_resume(row: InvocationRow, ids: &[String]) -> Option<ResumeOutcome> {
    let retry = same_ids(ids, &row.last_resume);
    if row.status != Status::InputRequired || retry {
        return Some(if retry {
            ResumeOutcome::Duplicate(row)
        } else {
            ResumeOutcome::NotWaiting(row)
        });
    }
    let unknown: Vec<&String> = ids.iter().filter(|i| !row.pending.contains(i)).collect();
    if !unknown.is_empty() {
        return Some(ResumeOutcome::Mismatch(format!(
            "the resume answers tool call(s) {unknown:?}, which are not pending; the pending \
             calls are {:?}",
            row.pending
        )));
    }
    let missing: Vec<&String> = row.pending.iter().filter(|p| !ids.contains(p)).collect();
    if !missing.is_empty() {
        return Some(ResumeOutcome::Mismatch(format!(
            "the resume leaves pending tool call(s) {missing:?} unanswered; it needs one tool \
             message per pending call"
        )));
    }
    None
}

/// What a transition means for the row it was decided on (locked for update): `Ok(false)` when
/// the status is not one of `from` (a cancellation that landed first stands), `Fenced` when
/// the fence no longer holds the lease, `Ok(true)` to write it.
fn judge_transition(
    row: &InvocationRow,
    from: &[Status],
    fence: Option<&Fence>,
) -> Result<bool, StoreError> {
    if !from.contains(&row.status) {
        return Ok(false);
    }
    if let Some(f) = fence
        && !row.held_by(f)
    {
        return Err(StoreError::Fenced(row.invocation_id.clone()));
    }
    Ok(true)
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, s: &str) -> Result<T, StoreError> {
    serde_json::from_str(s).map_err(|e| StoreError::Corrupt(format!("{what}: {e}")))
}

fn parse_status(s: &str) -> Result<Status, StoreError> {
    Status::parse(s).ok_or_else(|| StoreError::Corrupt(format!("status {s:?}")))
}

/// The columns every row read selects, in [`InvocationRow`]'s order, then the lease's expiry,
/// then the tokens.
const COLUMNS: &str = "invocation_id, session_id, status, error, connection, needs_key, \
    output_start, pending, last_resume, finished_ms, swept, owner, epoch, lease_until_ms, \
    tokens_in, tokens_out";
