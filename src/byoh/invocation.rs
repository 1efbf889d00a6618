//! What each protocol route means for an invocation: the state machine, idempotency,
//! backpressure and cancellation.
//!
//! Owns: the routes' methods on the [`Engine`]: submit (start, resume), get_status,
//! collect_output, cancel.
//!
//! Invariants:
//! * Submissions are deduplicated on `invocation_id` alone: a retried start or resume answers
//!   the current status and is applied once, also when it arrives while the first is still in
//!   flight (both hold the invocation's lock).
//! * A refused submission (busy, invalid) stores nothing.
//! * A status only moves along the protocol's graph, through the store's conditional updates:
//!   a turn that ends as a cancellation lands cannot overwrite `cancelled`.
//! * API keys (and base URLs that carry a credential) live only in [`Live`] entries, in memory,
//!   and go when the turn ends; every credential value is scrubbed from what is stored.
//! * Every turn runs under a `--max-running` permit, a turn a restart interrupted too.
//!
//! Non-goals: HTTP (see `server`), running the turn itself (see `runner`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;

use super::engine::{Engine, Live, Secrets};
use super::protocol::{CancelRequest, SessionAction, Status, SubmitRequest};
use super::store::{InvocationRow, ResumeOutcome, StartOutcome, StatusRow, StoreError};

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
        let existing = self.inner.store.get(&id).await?;
        let secrets = Secrets::of(&req.model_connection);
        // Nothing stored carries a credential of the submission (the evaluator's own rows
        // could, and the model may echo one later).
        let mut input_messages = req.input_messages.clone();
        for m in &mut input_messages {
            secrets.credentials.scrub_message(m);
        }
        match req.session_action {
            SessionAction::Start => {
                if let Some(row) = existing {
                    check_session(&row, &req.session_id)?;
                    return Ok(self.adopt(row, secrets));
                }
                let permit = self.permit()?;
                let row = InvocationRow {
                    invocation_id: id.clone(),
                    session_id: req.session_id.clone(),
                    status: Status::Queued,
                    error: None,
                    connection: req.model_connection.stored(),
                    needs_key: secrets.needed(),
                    output_start: input_messages.len(),
                    pending: Vec::new(),
                    last_resume: Vec::new(),
                    finished_ms: None,
                    swept: false,
                };
                match self
                    .inner
                    .store
                    .insert_start(row.clone(), input_messages)
                    .await?
                {
                    StartOutcome::Inserted => {
                        crate::failpoint!("serve.after_accept");
                        let live = self.inner.register(&id, secrets);
                        self.spawn(id, live, Some(permit));
                        Ok(row)
                    }
                    StartOutcome::Exists(row) => Ok(self.adopt(row, secrets)),
                    StartOutcome::SessionTaken(other) => Err(ByohError::Invalid(format!(
                        "session {:?} already holds invocation {other:?}; a session has one \
                         invocation",
                        req.session_id
                    ))),
                }
            }
            SessionAction::Resume => {
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
                        req.model_connection.stored(),
                        secrets.needed(),
                    )
                    .await?;
                match outcome {
                    ResumeOutcome::Applied(row) => {
                        let live = self.inner.register(&id, secrets);
                        self.spawn(id, live, permit);
                        Ok(row)
                    }
                    ResumeOutcome::Duplicate(row) => Ok(self.adopt(row, secrets)),
                    ResumeOutcome::Mismatch(msg) => Err(ByohError::Invalid(msg)),
                    ResumeOutcome::NotWaiting(row) => Err(ByohError::Invalid(format!(
                        "invocation {id:?} is {}, not waiting for input; a resume answers the \
                         questions of an input_required turn",
                        row.status
                    ))),
                    ResumeOutcome::NotFound => Err(not_found(&id)),
                }
            }
        }
    }

    /// A retried submission of an existing invocation: its key replaces the old one; a turn a
    /// restart interrupted is taken up again when it can now call the model. Call with the
    /// invocation's lock held.
    fn adopt(&self, row: InvocationRow, secrets: Secrets) -> InvocationRow {
        if let Some(live) = self.inner.live(&row.invocation_id) {
            live.set_secrets(secrets);
            return row;
        }
        let orphan = matches!(row.status, Status::Queued | Status::Running);
        if orphan && (secrets.needed() || !row.needs_key) {
            let live = self.inner.register(&row.invocation_id, secrets);
            self.spawn(row.invocation_id.clone(), live, None);
        }
        row
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
                            inner.unregister(&id);
                            return;
                        }
                    }
                }
            };
            super::runner::drive(&inner, &id, &live).await;
            inner.unregister(&id);
            drop(permit);
        });
    }

    /// `get_status`: answered from memory while the status has not changed.
    pub async fn status(&self, id: &str) -> Result<StatusRow, ByohError> {
        self.inner
            .store
            .status(id)
            .await?
            .ok_or_else(|| not_found(id))
    }

    /// The whole stored row.
    async fn row(&self, id: &str) -> Result<InvocationRow, ByohError> {
        self.inner.store.get(id).await?.ok_or_else(|| not_found(id))
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
    /// killed and its model call aborted. Waits a little for the turn to stop.
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
            .transition(id, OPEN, Status::Cancelled, None, Vec::new())
            .await?;
        if let Some(live) = self.inner.live(id) {
            live.cancel.cancel();
            let mut done = live.done.subscribe();
            let _ =
                tokio::time::timeout(self.inner.config.cancel_wait, done.wait_for(|d| *d)).await;
        }
        after.ok_or_else(|| not_found(id))
    }

    /// Stops every turn (their statuses stay as stored, to be taken up after a restart) and
    /// waits for the tasks, at most `deadline`.
    pub async fn shutdown(&self, deadline: Duration) {
        self.inner.tracker.close();
        self.inner.root.cancel();
        let _ = tokio::time::timeout(deadline, self.inner.tracker.wait()).await;
    }
}
