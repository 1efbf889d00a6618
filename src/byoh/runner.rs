//! Running BYOH turns in the background under leases, taking up turns whose replica stopped,
//! and sweeping old sessions.
//!
//! Owns: the task body of a turn (`drive`): its toolbox (built per turn by `sandbox`, never held
//! idle — but for an `input_required` pause with background processes running, when the engine
//! keeps it, processes and all, for the resume; they end with the invocation, before its end
//! is written), the store-backed [`Front`] (every message, and the compacted view the model is
//! sent, committed as they change), the model's limits for the turn (the settings, else the
//! assumed window; the evaluator's key goes to `POST …/chat/completions` and nowhere else, so
//! the model listing is never asked), and the one status write that ends the turn; the
//! replica's background loops — lease renewal (which also hears, as a fallback, of
//! cancellations and takeovers), the orphan reaper (takes up or fails turns whose lease ran
//! out and whose owner is not alive, and takes back its own), the cancellation listener, the
//! sandbox probe, and the retention sweeper.
//!
//! Invariants:
//! * Every write of a turn carries its fence; a write refused as fenced, a renewal refused, or
//!   a whole lease period without a successful renewal (the store unreachable, the process
//!   paused) stops the turn at once — its commands are killed, and it writes nothing more.
//! * A turn writes its end status only from `running`, so a cancellation that landed first
//!   stands; a turn stopped by shutdown stays `running` with its lease ended, for another
//!   replica (or the next start) to take up.
//! * A turn's end is written until it lands (a full disk empties), answered from memory by its
//!   replica meanwhile: a finished turn is never stranded `running` — unless the replica loses
//!   its lease meanwhile (the store refused its renewals too): then it stops, and the turn is
//!   taken up from its transcript.
//! * A turn whose replica stopped is resumed by another when it can call the model (no key
//!   needed, or a retried submission brought one); otherwise it fails, `--orphan-grace-secs`
//!   after its lease ran out, with a message that says why. Its transcript is durable, so the
//!   turn goes on from its last committed step: a step whose tool call had started but whose
//!   result was not committed is answered as interrupted, never run again; a model call whose
//!   answer was not committed is made again (at-least-once).
//! * Every turn runs under a `--max-running` permit, one taken up from a stopped replica too:
//!   the reaper claims such a turn only with a permit free, so it stays an orphan (for another
//!   replica, or a later round) while this one is full.
//! * Each session's workspace is its own directory under the data directory (shared storage
//!   every replica mounts), named by `sandbox` from a hash of the session id.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::engine::{Engine, Inner, Live};
use super::protocol::Status;
use super::sandbox;
use super::store::{InvocationRow, Store, StoreError, Tokens, now_ms};
use crate::agent::model::Usage;
use crate::agent::turn::{self, TurnEnd};
use crate::chat::context::ContextView;
use crate::chat::message::{ChatMessage, KeySource};
use crate::chat::session::{ChatTurn, Front, SessionError, Tail, repair_tail, step_limit_message};
use crate::floor::backoff::{Backoff, sleep_or_cancel};

/// The store as a turn's front: every message is committed as it is made, under the turn's
/// fence.
struct StoreFront {
    store: Store,
    id: String,
    live: Arc<Live>,
}

/// A store error of a turn: a fenced write stops the turn (and kills its commands) at once.
fn turn_store_error(live: &Live, e: StoreError) -> SessionError {
    if matches!(e, StoreError::Fenced(_)) {
        live.lose();
    }
    SessionError::Store(e.to_string())
}

impl Front for StoreFront {
    async fn appended(&mut self, messages: &[ChatMessage]) -> Result<(), SessionError> {
        // The model may echo a credential: nothing stored (and so nothing returned) holds one.
        let credentials = self.live.credentials();
        let mut stored = messages.to_vec();
        for m in &mut stored {
            credentials.scrub_message(m);
        }
        self.store
            .append(&self.id, stored, &self.live.fence)
            .await
            .map_err(|e| turn_store_error(&self.live, e))
    }

    async fn compacted(&mut self, view: &ContextView) -> Result<(), SessionError> {
        self.store
            .set_view(&self.id, view, &self.live.fence)
            .await
            .map_err(|e| turn_store_error(&self.live, e))
    }

    async fn used(&mut self, usage: &Usage) -> Result<(), SessionError> {
        let tokens = Tokens {
            input: usage.input_tokens,
            output: usage.output_tokens,
        };
        self.store
            .add_tokens(&self.id, tokens, &self.live.fence)
            .await
            .map_err(|e| turn_store_error(&self.live, e))
    }
}

const RUNNING: &[Status] = &[Status::Running];

/// Runs the turn of invocation `id` to its end and records how it ended.
pub(super) async fn drive(inner: &Inner, id: &str, live: &Arc<Live>) {
    let started = std::time::Instant::now();
    let Some(row) = start(&inner.store, id, live).await else {
        return;
    };
    info!(invocation_id = id, status = %Status::Running, "turn started");
    live.remember(Some(row.status_row()));
    let _running = crate::floor::metrics::turn_running("byoh");
    let mut conn = row.connection.clone();
    if let Some(url) = live.base_url() {
        conn.base_url = url;
    }
    let end = run_turn(inner, id, live, &row.session_id, conn).await;
    // Background processes wait for a resume, and end with the invocation otherwise: before
    // its end is written, so that whoever reads that end finds them gone.
    let waits = matches!(end, Ok(Some(TurnEnd::InputRequired { .. })) | Ok(None));
    if !waits || live.cancel.is_cancelled() || !inner.has_jobs(id) {
        inner.end_jobs(id).await;
    }
    // The task's own end write comes next: from here on the store answers.
    live.remember(None);
    let (to, error, pending) = match end {
        Ok(Some(TurnEnd::Completed { .. })) => (Status::Completed, None, vec![]),
        Ok(Some(TurnEnd::InputRequired { calls })) => (
            Status::InputRequired,
            None,
            calls.into_iter().map(|c| c.id).collect(),
        ),
        // Cancelled by `cancel` (which wrote the status), by a lost lease (another replica
        // owns the turn now), or by shutdown (the status stays `running` and the lease ends,
        // for another replica or the next start to take up).
        _ if live.cancel.is_cancelled() => {
            crate::floor::metrics::turn_ended("byoh", "cancelled");
            stopped(inner, id, live).await;
            return;
        }
        Ok(Some(TurnEnd::Failed { message, .. })) => (Status::Failed, Some(message), vec![]),
        Ok(Some(TurnEnd::Yielded)) => (
            Status::Failed,
            Some(step_limit_message(inner.config.max_steps)),
            vec![],
        ),
        Ok(Some(other)) => (
            Status::Failed,
            Some(format!("the turn ended unexpectedly ({other:?})")),
            vec![],
        ),
        Ok(None) => return,
        Err(e) => {
            // A command's session or supervisor could not even start: the next turns' would
            // not either, until a probe shows otherwise. (A sandbox that could not be made at
            // all was recorded where it was tried.) A fault in the middle of a command (its
            // supervisor died) fails this turn only: a session's own commands could cause it,
            // and one session must not make the host refuse everyone's work.
            if let SessionError::Tool(fault) = &e
                && fault.nothing_ran()
            {
                inner.sandboxes.failed(&fault.to_string());
            }
            (Status::Failed, Some(e.to_string()), vec![])
        }
    };
    crate::floor::metrics::turn_ended("byoh", to.as_str());
    let error = error.map(|e| live.credentials().scrub(&e));
    crate::failpoint!("serve.before_end");
    record_end(inner, id, live, &row, (to, error, pending), started).await;
}

/// Moves the invocation to `running` under the turn's fence; its row, unless another task or
/// replica has it.
async fn start(store: &Store, id: &str, live: &Live) -> Option<InvocationRow> {
    let fence = &live.fence;
    let (changed, row) = match store
        .transition(
            id,
            &[Status::Queued, Status::Running],
            Status::Running,
            None,
            vec![],
            Some(fence),
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            if matches!(e, StoreError::Fenced(_)) {
                live.lose();
            }
            warn!(invocation_id = id, error = %e, "could not start the turn");
            return None;
        }
    };
    row.filter(|_| changed)
}

/// Writes how the turn ended, `started` at the time given.
async fn record_end(
    inner: &Inner,
    id: &str,
    live: &Live,
    row: &InvocationRow,
    (to, error, pending): (Status, Option<String>, Vec<String>),
    started: std::time::Instant,
) {
    let store = &inner.store;
    let fence = &live.fence;
    // The end must land: until it does (a full disk), this replica answers it from memory and
    // the write is tried again. A shutdown, a cancellation or a lost lease meanwhile stops
    // trying (the store's status then stands, or the lease's next owner ends the turn).
    let mut backoff = Backoff::new(END_RETRY_FIRST, END_RETRY_CAP);
    let mut held = false;
    loop {
        match store
            .transition(id, RUNNING, to, error.clone(), pending.clone(), Some(fence))
            .await
        {
            Ok((true, _)) => {
                live.remember(None);
                info!(
                    invocation_id = id,
                    status = %to,
                    duration_ms = started.elapsed().as_millis() as u64,
                    "turn ended"
                );
                return;
            }
            Ok((false, row)) => {
                live.remember(None);
                info!(
                    invocation_id = id,
                    status = %row.map(|r| r.status.as_str()).unwrap_or("gone"),
                    "turn ended after its status changed"
                );
                return;
            }
            Err(StoreError::Fenced(_)) => {
                live.lose();
                stopped(inner, id, live).await;
                return;
            }
            Err(e) => {
                if !held {
                    held = true;
                    let mut end = row.clone();
                    end.status = to;
                    end.error = error.clone();
                    end.pending = pending.clone();
                    end.finished_ms = to.is_terminal().then(now_ms);
                    live.hold_end(end);
                }
                let delay = backoff.next_delay();
                warn!(invocation_id = id, status = %to, error = %e, retry_in = ?delay, "could not record the turn's end; answering it from memory and trying again");
                if !sleep_or_cancel(delay, &live.cancel).await {
                    stopped(inner, id, live).await;
                    return;
                }
            }
        }
    }
}

/// The first wait before a failed end write is tried again, and the longest.
const END_RETRY_FIRST: Duration = Duration::from_millis(100);
const END_RETRY_CAP: Duration = Duration::from_secs(5);

/// After a turn's task stopped early: a lost lease is logged; at shutdown the lease is ended
/// so that another replica can take the turn up without waiting for it to run out.
async fn stopped(inner: &Inner, id: &str, live: &Live) {
    if live.is_lost() {
        warn!(
            invocation_id = id,
            epoch = live.fence.epoch,
            "the turn's lease was lost: its commands were killed and it writes nothing more"
        );
    } else if inner.root.is_cancelled()
        && let Err(e) = inner.store.release(id, &live.fence).await
    {
        warn!(invocation_id = id, error = %e, "could not end the lease at shutdown");
    }
}

/// Runs the loop over the stored transcript; `None` when the tail already said how it ended
/// (and the status was written).
async fn run_turn(
    inner: &Inner,
    id: &str,
    live: &Arc<Live>,
    session_id: &str,
    conn: crate::chat::message::ModelEndpoint,
) -> Result<Option<TurnEnd>, SessionError> {
    let store_err = |e: StoreError| turn_store_error(live, e);
    let store = &inner.store;
    let mut transcript = store.messages(id, 0).await.map_err(store_err)?;
    let (fill, tail) = repair_tail(&transcript);
    if !fill.is_empty() {
        store
            .append(id, fill.clone(), &live.fence)
            .await
            .map_err(store_err)?;
        transcript.extend(fill);
    }
    match tail {
        Tail::Completed => {
            return Ok(Some(TurnEnd::Completed {
                candidate: Default::default(),
            }));
        }
        Tail::InputRequired(ids) => {
            live.remember(None);
            store
                .transition(
                    id,
                    RUNNING,
                    Status::InputRequired,
                    None,
                    ids,
                    Some(&live.fence),
                )
                .await
                .map_err(store_err)?;
            return Ok(None);
        }
        Tail::Continue => {}
    }
    let made = sandbox::for_turn(inner, session_id, &live.cancel);
    let Some(toolbox) = inner.toolbox_for(id, made).await? else {
        return Ok(None);
    };
    let view = store.view(id).await.map_err(store_err)?;
    // The evaluator's key authorizes only `POST …/chat/completions` (the protocol's words): the
    // server's model listing is never asked. The window is the setting's, else assumed until a
    // refusal names it.
    let limits = inner.config.limits.clone().complete(Default::default());
    let front = StoreFront {
        store: store.clone(),
        id: id.to_owned(),
        live: live.clone(),
    };
    // The key stays with the turn's secrets: each call takes the latest a submission brought.
    let key = {
        let live = live.clone();
        KeySource::latest(move || live.key())
    };
    let mut host = ChatTurn::new(front, inner.client.clone(), conn, key, toolbox, transcript)
        .with_max_steps(inner.config.max_steps)
        .with_context(limits, view);
    turn::drive(&mut host, 0, &live.cancel).await.map(Some)
}

/// The message of a turn whose replica stopped and that no retried submission took up.
pub fn orphan_message(grace: Duration) -> String {
    format!(
        "the podhost replica running this turn stopped (a restart, a crash, or a lost lease). \
         The model API key is never stored, so the turn could not go on, and no retried \
         submission brought a fresh key within {} s.",
        grace.as_secs()
    )
}

impl Engine {
    /// Starts the replica's background loops: lease renewal and the cancellation listener (on a
    /// store replicas share), the orphan reaper (which first takes up what a previous process
    /// left), the sweeper. On an SQLite store, which this process holds alone, the leases its
    /// predecessor left end now, and its own never run out while it lives.
    pub async fn recover(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        sandbox::adopt_uids(inner).await?;
        inner
            .store
            .join(inner.terms.owner.clone(), inner.config.lease)
            .await?;
        let ended = inner.store.expire_leases().await?;
        if ended > 0 {
            info!(
                turns = ended,
                "taking up the turns a previous process left open"
            );
        }
        let engine = self.clone();
        inner.tracker.spawn(async move { engine.reap_loop().await });
        if inner.store.is_shared() {
            let engine = self.inner.clone();
            inner
                .tracker
                .spawn(async move { renew_loop(&engine).await });
        }
        if let Some(mut cancels) = inner.store.cancellations() {
            let engine = self.inner.clone();
            inner.tracker.spawn(async move {
                loop {
                    let id = tokio::select! {
                        _ = engine.root.cancelled() => return,
                        id = cancels.recv() => match id {
                            Some(id) => id,
                            None => return,
                        },
                    };
                    if let Some(live) = engine.live(&id) {
                        info!(invocation_id = %id, "cancelled through another replica");
                        live.stop_cancelled();
                    }
                }
            });
        }
        let engine = self.inner.clone();
        inner
            .tracker
            .spawn(async move { sweep_loop(&engine).await });
        let engine = self.inner.clone();
        inner
            .tracker
            .spawn(async move { sandbox::probe_loop(&engine).await });
        Ok(())
    }

    /// Every so often: claims orphans that need no key and runs them here; fails the ones that
    /// need a key and waited the grace for a retried submission in vain.
    async fn reap_loop(&self) {
        let inner = &self.inner;
        let every =
            (inner.config.lease / 4).clamp(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            inner.prune_stashed(inner.config.orphan_grace + inner.config.lease);
            match inner.store.orphans(&inner.terms.owner).await {
                Ok(orphans) => {
                    for o in orphans {
                        self.reap(o).await;
                    }
                }
                Err(e) => warn!(error = %e, "could not look for turns to take up"),
            }
            tokio::select! {
                _ = inner.root.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    async fn reap(&self, o: super::store::Orphan) {
        let inner = &self.inner;
        let id = o.invocation_id.clone();
        let _lock = inner.lock(&id).await;
        if inner.live(&id).is_some() {
            return;
        }
        if !o.needs_key {
            // A slot first: a full replica leaves the turn to another, or to a later round.
            let Ok(permit) = inner.permits.clone().try_acquire_owned() else {
                return;
            };
            match inner.store.claim(&id, o.epoch, &inner.terms).await {
                Ok(Some((_, fence))) => {
                    info!(invocation_id = %id, epoch = fence.epoch, "resuming a turn whose replica stopped");
                    let live = inner.register(&id, Default::default(), fence);
                    self.spawn(id, live, Some(permit));
                }
                Ok(None) => {}
                Err(e) => warn!(invocation_id = %id, error = %e, "could not take up a turn"),
            }
            return;
        }
        // A turn this replica stopped, cut off from the store, whose key it still holds: taken
        // back (once a slot is free) when no other replica took it meanwhile.
        if o.ours
            && let Some(secrets) = inner.unstash(&id)
        {
            let Ok(permit) = inner.permits.clone().try_acquire_owned() else {
                inner.stash(&id, secrets);
                return;
            };
            match inner.store.claim(&id, o.epoch, &inner.terms).await {
                Ok(Some((_, fence))) => {
                    info!(invocation_id = %id, epoch = fence.epoch, "taking back a turn this replica stopped while cut off from the store");
                    let live = inner.register(&id, secrets, fence);
                    self.spawn(id, live, Some(permit));
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(invocation_id = %id, error = %e, "could not take a turn back");
                    inner.stash(&id, secrets);
                }
            }
            return;
        }
        let grace = inner.config.orphan_grace;
        if o.expired_for_ms < grace.as_millis() as i64 {
            return;
        }
        match inner
            .store
            .fail_orphan(
                &id,
                o.epoch,
                grace.as_millis() as i64,
                orphan_message(grace),
                &inner.terms.owner,
            )
            .await
        {
            Ok(true) => {
                warn!(invocation_id = %id, status = %Status::Failed, "a turn whose replica stopped had no key")
            }
            Ok(false) => {}
            Err(e) => warn!(invocation_id = %id, error = %e, "could not fail the turn"),
        }
    }
}

/// Renews the leases of this replica's turns every third of a lease (on PostgreSQL, on the
/// liveness connection, whose lock keeps other replicas from taking a turn over however late a
/// renewal comes). A turn whose renewal is refused (taken over, cancelled) stops at once. When
/// renewals fail for a whole lease (the store unreachable: the lock may be free, and another
/// replica may take the turns up), every turn stops, its secrets kept to take it back should
/// no other replica take it.
async fn renew_loop(inner: &Inner) {
    let lease = inner.config.lease;
    let mut tick = tokio::time::interval(lease / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_ok = std::time::Instant::now();
    loop {
        tokio::select! {
            _ = inner.root.cancelled() => return,
            _ = tick.tick() => {}
        }
        let held = inner.held();
        if held.is_empty() {
            last_ok = std::time::Instant::now();
            continue;
        }
        let asked = std::time::Instant::now();
        let list: Vec<(String, i64)> = held
            .iter()
            .map(|(id, l)| (id.clone(), l.fence.epoch))
            .collect();
        match inner.store.renew(&inner.terms, list).await {
            Ok(renewed) => {
                last_ok = asked;
                let renewed: std::collections::HashSet<String> = renewed.into_iter().collect();
                for (id, live) in held {
                    if !renewed.contains(&id) && !live.cancel.is_cancelled() {
                        lose_unless_ended(inner, &id, &live).await;
                    }
                }
            }
            Err(e) => {
                warn!(error = %e, "could not renew the leases");
                if last_ok.elapsed() >= lease {
                    for (id, live) in &held {
                        warn!(invocation_id = %id, "no lease renewal for a whole lease period: stopping the turn");
                        inner.stash(id, live.secrets());
                        live.lose();
                    }
                }
            }
        }
    }
}

/// A renewal was refused: the turn ended meanwhile (its task is finishing), was cancelled
/// (stop it), or its lease is another replica's or ran out (lose it).
async fn lose_unless_ended(inner: &Inner, id: &str, live: &Arc<Live>) {
    let row = match inner.store.get(id).await {
        Ok(row) => row,
        Err(e) => {
            warn!(invocation_id = %id, error = %e, "could not read a turn whose renewal was refused");
            None
        }
    };
    let Some(row) = row else {
        live.lose();
        return;
    };
    let ours = row.epoch == live.fence.epoch && row.owner.as_deref() == Some(&*live.fence.owner);
    match row.status {
        Status::Cancelled => {
            info!(invocation_id = %id, "cancelled through another replica");
            live.stop_cancelled();
        }
        s if s.is_terminal() || s == Status::InputRequired => {
            // Ended by this turn's own task (which is finishing), or by another claim.
            if row.epoch != live.fence.epoch {
                live.lose();
            }
        }
        _ if ours => {}
        _ => {
            warn!(invocation_id = %id, epoch = live.fence.epoch, "the lease was lost: stopping the turn");
            live.lose();
        }
    }
}

/// Removes terminal sessions older than the retention period, every so often.
async fn sweep_loop(inner: &Inner) {
    let retention = inner.config.retention;
    let every = (retention / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = inner.root.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let cutoff = now_ms() - retention.as_millis() as i64;
        match inner.store.sweep(cutoff).await {
            Ok(sessions) => {
                for session in sessions {
                    let data = inner.config.data_dir.clone();
                    let id = session.clone();
                    let removed = tokio::task::spawn_blocking(move || {
                        sandbox::remove_session_files(&data, &id)
                    })
                    .await;
                    match removed {
                        Ok(Err(e)) => warn!(error = %e, "could not remove a swept workspace"),
                        // Its workspace gone, its uid may serve another session.
                        Ok(Ok(())) if inner.config.tools.uid_pool().is_some() => {
                            if let Err(e) = inner.store.release_uid(&session).await {
                                warn!(error = %e, "could not give a swept session's uid back");
                            }
                        }
                        _ => {}
                    }
                }
            }
            Err(e) => warn!(error = %e, "the retention sweep failed"),
        }
    }
}
