//! Work: keeping leases waiting, holding granted runs, renewing, cancelling and releasing them
//! (v5 §2 and §8).
//!
//! Owns: one lease slot per run podhost may hold (`concurrency`), each keeping one `lease`
//! waiting; a [`RunState`] per granted run (its cancellation token, current run token, and why it
//! stopped); the renew timer of each run; the `cancel` message; and what is sent when a run ends
//! (`lease.release` or the turn's output).
//!
//! Invariants:
//! * A granted run is never dropped silently: it ends in an output or a `lease.release`, except
//!   when the connection is gone (core records `connection.lost` itself).
//! * A run's token is a child of its connection's: losing the connection stops its runs.
//! * `shutdown` and `ownership.lost` end in `lease.release` with that reason, whatever the turn
//!   code returns; `cancel` and `deadline` let the turn code report `turn.failed` (cancelled).
//! * A run's end (its output or its release) waits for core's answer as long as the run is held:
//!   renewals go on meanwhile, and podhost gives up only when the run is lost (a renewal refused,
//!   `ownership.lost`), the connection goes, or at shutdown (the pod closes the connection at its
//!   deadline). v5 sets no time limit on a settle; a core slow under load must not lose a
//!   turn's output. Only the release of a run already lost is bounded (`request_timeout`).
//!
//! Non-goals: running a turn. [`RunHandler`] is where the turn code
//! ([`TurnRunner`](crate::nylorun::turn::run::TurnRunner)) plugs in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::nylorun::link::channel::{CallError, Channel, parse_answer, to_params};
use crate::nylorun::link::protocol::{
    CancelParams, CancelReason, ErrorCode, LeaseAnswer, ReleaseParams, ReleaseReason, RenewAnswer,
    RunGrant, RunRef, RunToken, methods,
};

/// Why a run stopped before its turn code finished it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Core's `cancel` with reason `cancel`: report `turn.failed`, status `cancelled`.
    Cancel,
    /// Core's `cancel` with reason `deadline`: report `turn.failed`, status `cancelled`.
    Deadline,
    /// podhost or core is stopping: `lease.release` with `shutdown`.
    Shutdown,
    /// Another owner has the session (`cancel`, or `lease.renew` answered `{ok: false}`):
    /// `lease.release` with `ownership.lost`.
    OwnershipLost,
    /// The connection is gone: nothing can be sent; core ends the run itself.
    ConnectionLost,
}

impl From<CancelReason> for StopReason {
    fn from(r: CancelReason) -> Self {
        match r {
            CancelReason::Cancel => StopReason::Cancel,
            CancelReason::Deadline => StopReason::Deadline,
            CancelReason::Shutdown => StopReason::Shutdown,
            CancelReason::OwnershipLost => StopReason::OwnershipLost,
        }
    }
}

impl StopReason {
    /// The release this reason calls for, if any.
    pub fn release(self) -> Option<ReleaseReason> {
        match self {
            StopReason::Shutdown => Some(ReleaseReason::Shutdown),
            StopReason::OwnershipLost => Some(ReleaseReason::OwnershipLost),
            _ => None,
        }
    }
}

/// One granted run.
pub struct RunState {
    grant: RunGrant,
    token: watch::Sender<Option<RunToken>>,
    cancel: CancellationToken,
    stop: Mutex<Option<(StopReason, Option<String>)>>,
}

impl RunState {
    fn new(mut grant: RunGrant, parent: &CancellationToken) -> Self {
        let token = grant.token.take();
        RunState {
            grant,
            token: watch::Sender::new(token),
            cancel: parent.child_token(),
            stop: Mutex::new(None),
        }
    }

    pub fn run_id(&self) -> &str {
        &self.grant.run_id
    }

    /// Stops the run for `reason` (the first reason wins). True when this call stopped it.
    pub fn stop(&self, reason: StopReason, message: Option<String>) -> bool {
        let first = {
            let mut s = self.stop.lock().unwrap_or_else(PoisonError::into_inner);
            if s.is_none() {
                *s = Some((reason, message));
                true
            } else {
                false
            }
        };
        self.cancel.cancel();
        first
    }

    /// Why the run stopped; `ConnectionLost` when its token was cancelled with no reason given.
    pub fn stop_reason(&self) -> Option<StopReason> {
        let s = self.stop.lock().unwrap_or_else(PoisonError::into_inner);
        match &*s {
            Some((r, _)) => Some(*r),
            None if self.cancel.is_cancelled() => Some(StopReason::ConnectionLost),
            None => None,
        }
    }

    pub fn stop_message(&self) -> Option<String> {
        self.stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(|(_, m)| m.clone())
    }
}

/// What the turn code tells the lease when core answers one of the run's own requests (a
/// journal or artifact request) `run_not_held` or `ownership_lost`: the run is no longer
/// podhost's. It stops the run as a refused renewal does, so it ends in `lease.release`
/// (`ownership.lost`), never in an output. Cheap to clone.
#[derive(Clone)]
pub struct RunLoss {
    state: Arc<RunState>,
}

impl std::fmt::Debug for RunLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunLoss")
            .field("run_id", &self.state.run_id())
            .finish()
    }
}

impl RunLoss {
    /// True when `e` says the run is no longer held; then the run is stopped for it.
    pub fn check(&self, method: &str, e: &CallError) -> bool {
        let lost = matches!(
            e,
            CallError::Remote {
                code: ErrorCode::RunNotHeld | ErrorCode::OwnershipLost,
                ..
            }
        );
        if lost && self.state.stop(StopReason::OwnershipLost, None) {
            tracing::warn!(run_id = %self.state.run_id(), %method, error = %e, "core says the run is no longer held; stopping it");
        }
        lost
    }
}

/// The runs one connection holds, by run id.
#[derive(Clone, Default)]
pub struct Runs {
    map: Arc<Mutex<HashMap<String, Arc<RunState>>>>,
}

impl Runs {
    fn insert(&self, run: Arc<RunState>) {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(run.run_id().to_owned(), run);
    }

    fn remove(&self, run_id: &str) {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run_id);
    }

    pub fn get(&self, run_id: &str) -> Option<Arc<RunState>> {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run_id)
            .cloned()
    }

    pub fn len(&self) -> usize {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops every run for `reason`.
    pub fn stop_all(&self, reason: StopReason) {
        let all: Vec<_> = self
            .map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        for run in all {
            run.stop(reason, None);
        }
    }

    /// Core's `cancel` message. A cancel for a run this connection does not hold is ignored.
    pub fn on_cancel(&self, params: Value) {
        let params: CancelParams = match serde_json::from_value(params) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "malformed cancel message; dropped");
                return;
            }
        };
        match self.get(&params.run_id) {
            Some(run) => {
                tracing::info!(run_id = %params.run_id, reason = ?params.reason, "core cancelled the run");
                run.stop(params.reason.into(), params.message);
            }
            None => {
                tracing::info!(run_id = %params.run_id, reason = ?params.reason, "cancel for a run not held here; ignored");
            }
        }
    }
}

/// What the turn code gets for a granted run.
pub struct RunHandle {
    grant: RunGrant,
    input: Value,
    token: watch::Receiver<Option<RunToken>>,
    state: Arc<RunState>,
    channel: Channel,
}

impl RunHandle {
    /// The grant (its `token` is empty: the current one is [`RunHandle::token`]).
    pub fn grant(&self) -> &RunGrant {
        &self.grant
    }

    /// The `TurnStart`.
    pub fn input(&self) -> &Value {
        &self.input
    }

    /// The run token to present to the gates now.
    pub fn token(&self) -> Option<RunToken> {
        self.token.borrow().clone()
    }

    /// Changes to the run token (a renewal may hand a new one).
    pub fn token_updates(&self) -> watch::Receiver<Option<RunToken>> {
        self.token.clone()
    }

    /// Cancelled when the run must stop; tool calls take child tokens of it.
    pub fn cancelled(&self) -> CancellationToken {
        self.state.cancel.clone()
    }

    /// Why the run was stopped, once it was.
    pub fn stop_reason(&self) -> Option<StopReason> {
        self.state.stop_reason()
    }

    /// Core's message with its `cancel`, if any.
    pub fn stop_message(&self) -> Option<String> {
        self.state.stop_message()
    }

    /// The connection the run is bound to, for its own requests.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// What the run's own requests report a loss of the run to.
    pub fn loss(&self) -> RunLoss {
        RunLoss {
            state: self.state.clone(),
        }
    }
}

/// How the turn code ends a run.
#[derive(Clone, Debug, PartialEq)]
pub enum RunEnd {
    /// An output request (`turn.completed`, `turn.failed`, `turn.waiting`, `checkpoint`, …)
    /// with its `TurnOutput`.
    Output { method: &'static str, output: Value },
    /// Give the run back without an output.
    Release(ReleaseReason),
}

/// Where the turn code plugs in: one call per granted run.
pub trait RunHandler: Send + Sync + 'static {
    fn handle(&self, run: RunHandle) -> BoxFuture<'static, RunEnd>;
}

/// Timing of the lease slots.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease slots: runs held at once.
    pub concurrency: usize,
    /// How long a stopped run's turn code may take before the run is ended without it.
    pub stop_grace: Duration,
    /// The pause after a failed `lease` or a run given back unrun.
    pub pause: Duration,
    /// After aborting a waiting lease, how long to listen for a grant already on its way.
    pub abort_wait: Duration,
    /// Bound on the `lease.release` of a run that is no longer held (lost, or granted as
    /// leasing stopped); a held run's end waits for its answer without a bound.
    pub request_timeout: Duration,
}

/// The lease slots and runs of one connection.
pub struct Leaser {
    channel: Channel,
    runs: Runs,
    handler: Arc<dyn RunHandler>,
    renew_every: Duration,
    cfg: LeaseConfig,
    tracker: TaskTracker,
    /// Cancelled when podhost stops taking work (shutdown).
    stop_leasing: CancellationToken,
}

impl Leaser {
    pub fn new(
        channel: Channel,
        runs: Runs,
        handler: Arc<dyn RunHandler>,
        renew_every: Duration,
        cfg: LeaseConfig,
    ) -> Arc<Self> {
        Arc::new(Leaser {
            channel,
            runs,
            handler,
            renew_every: renew_every.max(Duration::from_millis(10)),
            cfg,
            tracker: TaskTracker::new(),
            stop_leasing: CancellationToken::new(),
        })
    }

    /// Starts the slots.
    pub fn start(self: &Arc<Self>) {
        for slot in 0..self.cfg.concurrency.max(1) {
            let this = self.clone();
            self.tracker.spawn(async move { this.slot(slot).await });
        }
    }

    /// Stops leasing (waiting leases are aborted) and stops every run with `reason`; runs end in
    /// their release. Then waits for the slots and runs, at most `wait`.
    pub async fn stop(&self, reason: StopReason, wait: Duration) -> bool {
        self.stop_leasing.cancel();
        self.runs.stop_all(reason);
        self.tracker.close();
        tokio::time::timeout(wait, self.tracker.wait())
            .await
            .is_ok()
    }

    async fn slot(&self, slot: usize) {
        loop {
            if self.stop_leasing.is_cancelled() || self.channel.token().is_cancelled() {
                return;
            }
            let mut call = match self.channel.call(methods::LEASE, json!({})).await {
                Ok(c) => c,
                Err(e) => {
                    tracing::debug!(slot, error = %e, "lease slot stops");
                    return;
                }
            };
            tracing::debug!(slot, id = call.id(), "lease waiting");
            let result = tokio::select! {
                r = call.response() => r,
                _ = self.stop_leasing.cancelled() => {
                    call.abort().await;
                    let late = tokio::select! {
                        r = call.response() => r.ok(),
                        _ = tokio::time::sleep(self.cfg.abort_wait) => None,
                        _ = self.channel.closed() => None,
                    };
                    if let Some(v) = late
                        && let Some(run_id) = run_id_of(&v)
                    {
                        tracing::info!(%run_id, "a run was granted as the lease was aborted; releasing it");
                        self.release_unheld(&run_id, ReleaseReason::Shutdown).await;
                    }
                    return;
                }
            };
            let value = match result {
                Ok(v) => v,
                Err(CallError::Closed { .. }) => return,
                Err(e) => {
                    tracing::warn!(slot, error = %e, "lease failed; trying again");
                    if !self.pause().await {
                        return;
                    }
                    continue;
                }
            };
            let run_id = run_id_of(&value);
            let parsed = parse_answer::<LeaseAnswer>(methods::LEASE, value).and_then(|a| {
                a.run.check().map(|()| a).map_err(|e| CallError::BadAnswer {
                    method: methods::LEASE.to_owned(),
                    message: e.to_string(),
                })
            });
            match parsed {
                Ok(answer) => {
                    if self.drive(answer).await && !self.pause().await {
                        return;
                    }
                }
                Err(e) => {
                    tracing::error!(slot, error = %e, "core granted a run podhost cannot read");
                    if let Some(run_id) = run_id {
                        self.release_unheld(&run_id, ReleaseReason::Shutdown).await;
                    }
                    if !self.pause().await {
                        return;
                    }
                }
            }
        }
    }

    /// Waits `pause` unless leasing stops first.
    async fn pause(&self) -> bool {
        tokio::select! {
            _ = tokio::time::sleep(self.cfg.pause) => true,
            _ = self.stop_leasing.cancelled() => false,
            _ = self.channel.closed() => false,
        }
    }

    /// Holds one run until it ends. True when it was given back without running (pause).
    async fn drive(&self, answer: LeaseAnswer) -> bool {
        let run = Arc::new(RunState::new(answer.run, self.channel.token()));
        let run_id = run.run_id().to_owned();
        tracing::info!(
            %run_id,
            session_id = %run.grant.session_id,
            turn_id = %run.grant.turn_id,
            epoch = run.grant.epoch,
            "run granted"
        );
        self.runs.insert(run.clone());
        let _held = crate::floor::metrics::lease_held();
        if self.stop_leasing.is_cancelled() {
            run.stop(StopReason::Shutdown, None);
        }
        let handle = RunHandle {
            grant: run.grant.clone(),
            input: answer.input,
            token: run.token.subscribe(),
            state: run.clone(),
            channel: self.channel.clone(),
        };
        let mut task = tokio::spawn(self.handler.handle(handle));
        let mut renew_at = Instant::now() + self.renew_every;
        let mut give_up_at: Option<Instant> = None;
        let end = loop {
            let renewing = matches!(
                run.stop_reason(),
                None | Some(StopReason::Cancel | StopReason::Deadline)
            );
            tokio::select! {
                end = &mut task => break match end {
                    Ok(end) => Some(end),
                    Err(e) => {
                        tracing::error!(%run_id, error = %e, "the run's turn code failed");
                        None
                    }
                },
                _ = tokio::time::sleep_until(renew_at), if renewing => {
                    self.renew(&run).await;
                    renew_at = Instant::now() + self.renew_every;
                }
                _ = run.cancel.cancelled(), if give_up_at.is_none() => {
                    give_up_at = Some(Instant::now() + self.cfg.stop_grace);
                }
                _ = tokio::time::sleep_until(give_up_at.unwrap_or_else(Instant::now)), if give_up_at.is_some() => {
                    tracing::warn!(%run_id, grace = ?self.cfg.stop_grace, "the run's turn code did not stop in time");
                    task.abort();
                    break None;
                }
            }
        };
        // The run stays held (renewed, and reachable by `cancel`) until core answers its end.
        let given_back = self.finish(&run, end).await;
        self.runs.remove(&run_id);
        given_back
    }

    /// One `lease.renew`.
    async fn renew(&self, run: &RunState) {
        let run_id = run.run_id().to_owned();
        let params = RunRef {
            run_id: run_id.clone(),
        };
        let answer = tokio::time::timeout(
            self.renew_every.max(self.cfg.request_timeout),
            self.channel
                .request::<_, RenewAnswer>(methods::LEASE_RENEW, &params),
        )
        .await;
        match answer {
            Ok(Ok(RenewAnswer {
                ok: true, token, ..
            })) => {
                if let Some(token) = token {
                    tracing::info!(%run_id, "switched to the renewed run token");
                    run.token.send_replace(Some(token));
                }
            }
            Ok(Ok(RenewAnswer { ok: false, .. })) => {
                tracing::warn!(%run_id, "core says the run is over (renew ok: false)");
                run.stop(StopReason::OwnershipLost, None);
            }
            Ok(Err(
                e @ CallError::Remote {
                    code: ErrorCode::RunNotHeld | ErrorCode::OwnershipLost,
                    ..
                },
            )) => {
                tracing::warn!(%run_id, error = %e, "the run is no longer held");
                run.stop(StopReason::OwnershipLost, None);
            }
            Ok(Err(CallError::Closed { .. })) => {}
            Ok(Err(e)) => tracing::warn!(%run_id, error = %e, "renewal failed; trying again"),
            Err(_) => tracing::warn!(%run_id, "renewal got no answer in time; trying again"),
        }
    }

    /// Sends what the run's end calls for. True when the run was given back unrun.
    async fn finish(&self, run: &RunState, end: Option<RunEnd>) -> bool {
        let run_id = run.run_id();
        match run.stop_reason() {
            Some(StopReason::ConnectionLost) => {
                tracing::info!(%run_id, "run ended with the connection");
                false
            }
            Some(reason @ (StopReason::Shutdown | StopReason::OwnershipLost)) => {
                if let Some(r) = reason.release() {
                    self.release(run, r).await;
                }
                false
            }
            stopped => match end {
                Some(RunEnd::Output { method, output }) => {
                    self.output(run, method, output).await;
                    false
                }
                Some(RunEnd::Release(r)) => {
                    self.release(run, r).await;
                    stopped.is_none()
                }
                None => {
                    // The turn code failed or hung: report what core must hear.
                    let output = match stopped {
                        Some(_) => json!({
                            "runId": run_id,
                            "status": "cancelled",
                            "error": {"message": run.stop_message().unwrap_or_else(|| "Turn cancelled".to_owned())},
                        }),
                        None => json!({
                            "runId": run_id,
                            "thrown": {"message": "the turn code stopped without an output"},
                        }),
                    };
                    self.output(run, methods::TURN_FAILED, output).await;
                    false
                }
            },
        }
    }

    async fn output(&self, run: &RunState, method: &'static str, output: Value) {
        let run_id = run.run_id();
        match self.send_end(run, method, output).await {
            Ok(()) => tracing::info!(%run_id, %method, "run output sent"),
            Err(why) => tracing::warn!(%run_id, %method, %why, "run output not taken"),
        }
    }

    async fn release(&self, run: &RunState, reason: ReleaseReason) {
        let run_id = run.run_id();
        let params = ReleaseParams {
            run_id: run_id.to_owned(),
            reason,
        };
        let sent = match to_params(methods::LEASE_RELEASE, &params) {
            Ok(p) => self.send_end(run, methods::LEASE_RELEASE, p).await,
            Err(e) => Err(EndUnanswered::Refused(e)),
        };
        match sent {
            Ok(()) => tracing::info!(%run_id, reason = reason.as_str(), "run released"),
            Err(why) => {
                tracing::warn!(%run_id, reason = reason.as_str(), %why, "release not taken")
            }
        }
    }

    /// Sends a run's end and waits for core's answer while the run is held: renewing it on its
    /// schedule, giving up when the run is lost or the connection goes. A run already lost
    /// when its end is sent waits at most `request_timeout`.
    async fn send_end(
        &self,
        run: &RunState,
        method: &'static str,
        params: Value,
    ) -> Result<(), EndUnanswered> {
        let mut call = self
            .channel
            .call(method, params)
            .await
            .map_err(EndUnanswered::Refused)?;
        crate::failpoint!("pod.after_output_sent");
        let lost = |run: &RunState| {
            matches!(
                run.stop_reason(),
                Some(StopReason::OwnershipLost | StopReason::ConnectionLost)
            )
        };
        let bound = lost(run).then(|| Instant::now() + self.cfg.request_timeout);
        // A stop that comes while the answer is awaited: a loss ends the wait.
        let mut stop_seen = run.cancel.is_cancelled();
        let mut renew_at = Instant::now() + self.renew_every;
        let started = Instant::now();
        loop {
            let renewing = matches!(
                run.stop_reason(),
                None | Some(StopReason::Cancel | StopReason::Deadline)
            );
            tokio::select! {
                answer = call.response() => {
                    return match answer {
                        Ok(_) => Ok(()),
                        Err(e) => Err(EndUnanswered::Refused(e)),
                    };
                }
                _ = tokio::time::sleep_until(renew_at), if renewing => {
                    tracing::debug!(run_id = %run.run_id(), %method, waited = ?started.elapsed(), "still waiting for core's answer; renewing");
                    self.renew(run).await;
                    renew_at = Instant::now() + self.renew_every;
                }
                _ = run.cancel.cancelled(), if !stop_seen => stop_seen = true,
                _ = tokio::time::sleep_until(bound.unwrap_or_else(Instant::now)), if bound.is_some() => {
                    call.abort().await;
                    return Err(EndUnanswered::NoAnswer(self.cfg.request_timeout));
                }
            }
            if bound.is_none() && lost(run) {
                call.abort().await;
                return Err(EndUnanswered::Lost(started.elapsed()));
            }
        }
    }

    /// `lease.release` of a run podhost does not hold as a [`RunState`] (granted as leasing
    /// stopped, or unreadable): bounded by `request_timeout`.
    async fn release_unheld(&self, run_id: &str, reason: ReleaseReason) {
        let params = ReleaseParams {
            run_id: run_id.to_owned(),
            reason,
        };
        let sent = tokio::time::timeout(
            self.cfg.request_timeout,
            self.channel
                .request::<_, Value>(methods::LEASE_RELEASE, &params),
        )
        .await;
        match sent {
            Ok(Ok(_)) => tracing::info!(%run_id, reason = reason.as_str(), "run released"),
            Ok(Err(e)) => {
                tracing::warn!(%run_id, reason = reason.as_str(), error = %e, "release not taken")
            }
            Err(_) => {
                tracing::warn!(%run_id, reason = reason.as_str(), "release got no answer in time")
            }
        }
    }
}

/// Why a run's end got no answer.
#[derive(Debug, thiserror::Error)]
enum EndUnanswered {
    #[error("{0}")]
    Refused(CallError),
    #[error("the run was lost after {0:?} of waiting for core's answer")]
    Lost(Duration),
    #[error("no answer within {0:?} for a run no longer held")]
    NoAnswer(Duration),
}

/// `run.runId` of a lease answer, even one that does not otherwise parse.
fn run_id_of(v: &Value) -> Option<String> {
    v.get("run")?.get("runId")?.as_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> RunGrant {
        RunGrant {
            run_id: "run-1".into(),
            session_id: "s".into(),
            turn_id: "t".into(),
            epoch: 1,
            token: Some(RunToken::new("tok")),
            token_expires_at: None,
        }
    }

    #[test]
    fn first_stop_reason_wins_and_loss_is_connection_lost() {
        let parent = CancellationToken::new();
        let run = RunState::new(grant(), &parent);
        assert_eq!(run.stop_reason(), None);
        assert!(run.grant.token.is_none(), "the token lives in the watch");
        assert!(run.stop(StopReason::Cancel, Some("by a person".into())));
        assert!(!run.stop(StopReason::Shutdown, None));
        assert_eq!(run.stop_reason(), Some(StopReason::Cancel));
        assert_eq!(run.stop_message().as_deref(), Some("by a person"));

        let other = RunState::new(grant(), &parent);
        parent.cancel();
        assert_eq!(other.stop_reason(), Some(StopReason::ConnectionLost));
    }

    #[test]
    fn cancel_reasons_map_to_their_ends() {
        assert_eq!(StopReason::from(CancelReason::Cancel).release(), None);
        assert_eq!(StopReason::from(CancelReason::Deadline).release(), None);
        assert_eq!(
            StopReason::from(CancelReason::Shutdown).release(),
            Some(ReleaseReason::Shutdown)
        );
        assert_eq!(
            StopReason::from(CancelReason::OwnershipLost).release(),
            Some(ReleaseReason::OwnershipLost)
        );
    }
}
