//! What each protocol route means for an invocation: the state machine, idempotency,
//! backpressure and cancellation.
//!
//! Owns: the routes' methods on the [`Engine`]: submit (start, resume), get_status,
//! collect_output, cancel.
//!
//! Invariants:
//! * Submissions are deduplicated on `invocation_id` alone: a retried start or resume answers
//!   the current status and is applied once, also when it arrives while the first is still in
//!   flight — in this process both hold the invocation's lock; across replicas the store decides
//!   (a unique key, a row locked for update).
//! * Any replica answers every route from the store (the replica running a turn answers its
//!   `get_status` from memory while nothing but the turn itself may change it); a turn runs on
//!   the replica that claimed it.
//! * A retried submission that brings a key for a turn whose replica died (its lease ran out)
//!   claims the turn and runs it here; while the lease still runs it waits, at most one lease
//!   period, to tell a live owner (which renews it) from a dead one.
//! * A refused submission (busy, invalid) stores nothing.
//! * A status only moves along the protocol's graph, through the store's conditional updates:
//!   a turn that ends as a cancellation lands cannot overwrite `cancelled`.
//! * API keys (and base URLs that carry a credential) live only in [`Live`] entries, in memory,
//!   and go when the turn ends; every credential value is scrubbed from what is stored.
//! * Every turn runs under a `--max-running` permit, a turn a restart interrupted too.
//!
//! Non-goals: HTTP (see `server`), running the turn itself (see `runner`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tracing::info;

use super::engine::{Engine, Live, Secrets};
use super::protocol::{CancelRequest, CheckedConnection, SessionAction, Status, SubmitRequest};
use super::store::{InvocationRow, ResumeOutcome, StartOutcome, StatusRow, StoreError};
use crate::chat::message::ChatMessage;

/// Why a request was refused; `server` maps each to one HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ByohError {
    /// The body is well-formed but breaks the protocol's rules (422).
    #[error("{0}")]
    Invalid(String),
    /// The invocation was never submitted (404).
    #[error("{0}")]
    NotFound(String),
    /// Too many turns are running (409 without an invocation id).
    #[error("{0}")]
    Busy(String),
    /// `collect_output` before output exists (409).
    #[error("{0}")]
    NoOutput(String),
    #[error("{0}")]
    Store(#[from] StoreError),
}

fn not_found(id: &str) -> ByohError {
    ByohError::NotFound(format!("no invocation {id:?} was ever submitted"))
}

fn check_session(row: &InvocationRow, session_id: &str) -> Result<(), ByohError> {
    if row.session_id != session_id {
        return Err(ByohError::Invalid(format!(
            "invocation {:?} belongs to session {:?}, not {session_id:?}",
            row.invocation_id, row.session_id
        )));
    }
    Ok(())
}

impl Engine {
    /// Turns running now.
    pub fn running(&self) -> usize {
        self.inner.running()
    }

    fn permit(&self) -> Result<OwnedSemaphorePermit, ByohError> {
        self.inner.permits.clone().try_acquire_owned().map_err(|_| {
            crate::floor::metrics::busy_refusal();
            ByohError::Busy(format!(
                "podhost is busy: {} turns are running, the most it runs at once; retry later",
                self.inner.config.max_running
            ))
        })
    }

    /// `submit`: starts a session or resumes a paused turn, once per invocation id.
    pub async fn submit(&self, req: SubmitRequest) -> Result<InvocationRow, ByohError> {
        let id = req.invocation_id.clone();
        let _lock = self.inner.lock(&id).await;
        let existing = self.get(&id).await?;
        let conn = req
            .model_connection
            .checked()
            .map_err(|e| ByohError::Invalid(e.0))?;
        let secrets = Secrets::of(&conn);
        // Nothing stored carries a credential of the submission (the evaluator's own rows
        // could, and the model may echo one later).
        let mut input_messages = req.input_messages.clone();
        for m in &mut input_messages {
            secrets.credentials.scrub_message(m);
        }
        match req.session_action {
            SessionAction::Start => {
                self.start(&req, existing, conn, secrets, input_messages)
                    .await
            }
            SessionAction::Resume => {
                self.resume(&req, existing, conn, secrets, input_messages)
                    .await
            }
        }
    }

    /// `submit` with `start`: a new invocation, or a retried one adopted.
    async fn start(
        &self,
        req: &SubmitRequest,
        existing: Option<InvocationRow>,
        conn: CheckedConnection<'_>,
        secrets: Secrets,
        input_messages: Vec<ChatMessage>,
    ) -> Result<InvocationRow, ByohError> {
        let id = req.invocation_id.clone();
        if let Some(row) = existing {
            check_session(&row, &req.session_id)?;
            return self.adopt(row, secrets).await;
        }
        let permit = self.permit()?;
        let mut row = InvocationRow::new(&id, &req.session_id, conn.stored());
        row.needs_key = secrets.needed();
        row.output_start = input_messages.len();
        match self
            .inner
            .store
            .insert_start(row.clone(), input_messages, &self.inner.terms)
            .await?
        {
            StartOutcome::Inserted(fence) => {
                crate::failpoint!("serve.after_accept");
                let live = self.inner.register(&id, secrets, fence);
                self.spawn(id, live, Some(permit));
                Ok(row)
            }
            StartOutcome::Exists(row) => {
                check_session(&row, &req.session_id)?;
                drop(permit);
                self.adopt(*row, secrets).await
            }
            StartOutcome::SessionTaken(other) => Err(ByohError::Invalid(format!(
                "session {:?} already holds invocation {other:?}; a session has one \
                 invocation",
                req.session_id
            ))),
        }
    }

    /// `submit` with `resume`: answers the questions of an `input_required` turn.
    async fn resume(
        &self,
        req: &SubmitRequest,
        existing: Option<InvocationRow>,
        conn: CheckedConnection<'_>,
        secrets: Secrets,
        input_messages: Vec<ChatMessage>,
    ) -> Result<InvocationRow, ByohError> {
        let id = req.invocation_id.clone();
        let Some(row) = existing else {
            return Err(not_found(&id));
        };
        check_session(&row, &req.session_id)?;
        let ids = req.validate_resume().map_err(|e| ByohError::Invalid(e.0))?;
        let permit = if row.status == Status::InputRequired && ids != row.last_resume {
            Some(self.permit()?)
        } else {
            None
        };
        let outcome = self
            .inner
            .store
            .apply_resume(
                &id,
                ids,
                input_messages,
                conn.stored(),
                secrets.needed(),
                &self.inner.terms,
            )
            .await?;
        match outcome {
            ResumeOutcome::Applied(row, fence) => {
                let live = self.inner.register(&id, secrets, fence);
                self.spawn(id, live, permit);
                Ok(row)
            }
            ResumeOutcome::Duplicate(row) => {
                drop(permit);
                self.adopt(row, secrets).await
            }
            ResumeOutcome::Mismatch(msg) => Err(ByohError::Invalid(msg)),
            ResumeOutcome::NotWaiting(row) => Err(ByohError::Invalid(format!(
                "invocation {id:?} is {}, not waiting for input; a resume answers the \
                 questions of an input_required turn",
                row.status
            ))),
            ResumeOutcome::NotFound => Err(not_found(&id)),
        }
    }

    /// A retried submission of an existing invocation: its secrets replace the old ones of a
    /// turn this replica runs; a turn whose replica stopped (restart, crash, lost lease) is
    /// claimed and taken up here when it can now call the model (it waits for a slot like any
    /// other turn). Call with the invocation's lock held.
    async fn adopt(
        &self,
        row: InvocationRow,
        secrets: Secrets,
    ) -> Result<InvocationRow, ByohError> {
        let id = row.invocation_id.clone();
        if let Some(live) = self.inner.live(&id) {
            live.set_secrets(secrets);
            return Ok(row);
        }
        if !row.is_open() || (row.needs_key && !secrets.needed()) {
            return Ok(row);
        }
        let Some(orphan) = self.orphaned(row).await? else {
            // Its owner is alive (it renewed the lease) or the turn moved on: answer as it is.
            return self
                .inner
                .store
                .get(&id)
                .await?
                .ok_or_else(|| not_found(&id));
        };
        match self
            .inner
            .store
            .claim(&id, orphan.epoch, &self.inner.terms)
            .await?
        {
            Some((row, fence)) => {
                info!(invocation_id = %id, epoch = fence.epoch, "taking up a turn whose replica stopped");
                let live = self.inner.register(&id, secrets, fence);
                self.spawn(id, live, None);
                Ok(row)
            }
            // Another replica claimed it first.
            None => Ok(self.inner.store.get(&id).await?.unwrap_or(orphan)),
        }
    }

    /// The row once its lease ran out (`None` when its owner shows it is alive by renewing the
    /// lease, or the turn moved on), waiting at most one lease period.
    async fn orphaned(&self, mut row: InvocationRow) -> Result<Option<InvocationRow>, ByohError> {
        let id = row.invocation_id.clone();
        let deadline = Instant::now() + self.inner.config.lease + Duration::from_secs(1);
        let every = (self.inner.config.lease / 20).max(Duration::from_millis(50));
        loop {
            if row.is_orphan() {
                return Ok(Some(row));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(every).await;
            let Some(now) = self.inner.store.get(&id).await? else {
                return Err(not_found(&id));
            };
            let renewed = now.lease_left_ms > row.lease_left_ms;
            if !now.is_open() || now.epoch != row.epoch || renewed {
                return Ok(None);
            }
            row = now;
        }
    }

    /// Runs the turn of `id` in a task. Without a `permit` (a turn a restart interrupted), the
    /// task waits for one first: such turns take `--max-running` slots like any other, and stay
    /// `queued`/`running` in the store meanwhile.
    pub(super) fn spawn(&self, id: String, live: Arc<Live>, permit: Option<OwnedSemaphorePermit>) {
        let inner = self.inner.clone();
        self.inner.tracker.spawn(async move {
            let permit = match permit {
                Some(p) => p,
                None => {
                    let permits = inner.permits.clone();
                    let acquired = tokio::select! {
                        p = permits.acquire_owned() => p.ok(),
                        _ = live.cancel.cancelled() => None,
                    };
                    match acquired {
                        Some(p) => p,
                        None => {
                            inner.unregister(&id, &live);
                            return;
                        }
                    }
                }
            };
            super::runner::drive(&inner, &id, &live).await;
            inner.unregister(&id, &live);
            drop(permit);
        });
    }

    /// `get_status`: from memory for a turn running here (its owner), else from the store (its
    /// read connections, which never wait behind writes), on any replica.
    pub async fn status(&self, id: &str) -> Result<StatusRow, ByohError> {
        if let Some(status) = self.inner.live(id).and_then(|l| l.remembered()) {
            return Ok(status);
        }
        self.inner
            .store
            .status(id)
            .await?
            .ok_or_else(|| not_found(id))
    }

    /// The whole row: the stored one, or the end a turn of this replica could not write yet.
    async fn row(&self, id: &str) -> Result<InvocationRow, ByohError> {
        self.get(id).await?.ok_or_else(|| not_found(id))
    }

    /// The stored row, or the end a turn of this replica could not write yet.
    async fn get(&self, id: &str) -> Result<Option<InvocationRow>, ByohError> {
        if let Some(end) = self.inner.live(id).and_then(|l| l.held_end()) {
            return Ok(Some(end));
        }
        Ok(self.inner.store.get(id).await?)
    }

    /// `collect_output`: the row and the messages of the current submission.
    pub async fn collect(
        &self,
        id: &str,
    ) -> Result<(InvocationRow, Vec<crate::chat::message::ChatMessage>), ByohError> {
        let row = self.row(id).await?;
        if row.swept {
            return Err(ByohError::NoOutput(format!(
                "the output of invocation {id:?} was removed {} s after it finished (the \
                 retention period); its status is kept",
                self.inner.config.retention.as_secs()
            )));
        }
        if !row.status.has_output() {
            let why = match row.status {
                Status::Queued | Status::Running => "not available yet",
                _ => "not available: the turn did not finish with output",
            };
            return Err(ByohError::NoOutput(format!(
                "output of invocation {id:?} is {why} (status {})",
                row.status
            )));
        }
        let messages = self.inner.store.messages(id, row.output_start).await?;
        Ok((row, messages))
    }

    /// `cancel`: any non-terminal status becomes `cancelled`; the turn's tool process group is
    /// killed and its model call aborted — here, or on the replica that owns the turn, which
    /// hears of it through the store. Waits a little for a turn of this replica to stop.
    pub async fn cancel(&self, req: CancelRequest) -> Result<InvocationRow, ByohError> {
        let id = req.invocation_id.as_str();
        let row = self.row(id).await?;
        check_session(&row, &req.session_id)?;
        if row.status.is_terminal() {
            return Ok(row);
        }
        const OPEN: &[Status] = &[Status::Queued, Status::Running, Status::InputRequired];
        let (_, after) = self
            .inner
            .store
            .transition(id, OPEN, Status::Cancelled, None, Vec::new(), None)
            .await?;
        if let Some(live) = self.inner.live(id) {
            live.stop_cancelled();
            let mut done = live.done.subscribe();
            let _ =
                tokio::time::timeout(self.inner.config.cancel_wait, done.wait_for(|d| *d)).await;
        }
        // Also those of a turn that waits for input: they were kept for its resume.
        self.inner.end_jobs(id).await;
        after.ok_or_else(|| not_found(id))
    }

    /// Stops every turn (their statuses stay as stored, to be taken up after a restart), kills
    /// every invocation's background processes, and waits for both, at most `deadline`.
    pub async fn shutdown(&self, deadline: Duration) {
        self.inner.tracker.close();
        self.inner.root.cancel();
        // The background processes of every open invocation too (one waiting for input has no
        // turn to end them).
        let until = tokio::time::Instant::now() + deadline;
        let _ = tokio::time::timeout_at(until, self.inner.end_all_jobs()).await;
        let _ = tokio::time::timeout_at(until, self.inner.tracker.wait()).await;
    }
}
