//! Sending a model call again while its hops fail: how many sends, the pauses between them,
//! and the call's fate when they run out (v5 §4). What one send came to is the gate client's
//! to say ([`Sent`]); this module decides what follows.
//!
//! Invariants:
//! * A call is sent at most [`ATTEMPTS`] times, and not again after its second send that timed
//!   out ([`TIMEOUTS`]): the gate has then held the call past its own provider timeout twice, and
//!   a third wait would most likely end the same way.
//! * Each pause is drawn from the pacing [`Backoff`] (jittered exponential), or is the gate's
//!   `Retry-After`, at most [`RETRY_AFTER_CAP`]; a cancellation ends a send or a pause at once.
//! * A call is settled by its last send, and by whether any send may have reached the gate:
//!   if one may have, and no answer said what became of the call, its fate is unknown
//!   ([`CallFate::Unknown`]), whatever the last send came to; otherwise it is a definite
//!   failure (`transient`, or `rate_limited` with the gate's `Retry-After`).
//! * Each re-send counts once in `podhost_model_retries_total`.
//!
//! Non-goals: HTTP (the sends are the caller's), and the meaning of an answer.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{CallFate, ENDPOINT, Stopped};
use crate::agent::model::{ModelAnswer, ModelFailure};
use crate::floor::backoff::{Backoff, sleep_or_cancel};
use crate::floor::{codes, metrics};

/// Sends of one model call in all, the first included.
pub(super) const ATTEMPTS: u32 = 4;
/// The longest `Retry-After` waited before a re-send.
pub(super) const RETRY_AFTER_CAP: Duration = Duration::from_secs(10);
/// Sends of one call that may time out: the one that reaches this count is the last.
const TIMEOUTS: u32 = 2;

/// How often a call is sent, and the pauses between its sends.
#[derive(Clone, Debug)]
pub(super) struct Resends {
    /// Sends in all, the first included.
    attempts: u32,
    /// The pause before a re-send that no `Retry-After` paces.
    pacing: Backoff,
    /// The longest `Retry-After` waited.
    retry_after_cap: Duration,
}

impl Resends {
    pub(super) fn new(pacing: Backoff) -> Self {
        Resends {
            attempts: ATTEMPTS,
            pacing,
            retry_after_cap: RETRY_AFTER_CAP,
        }
    }
}

/// What one send of a call came to, before the decision to send it again.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Sent {
    /// The gate's word on the call: `200 {outcome}`, or a refusal the same bytes would get again.
    Answered(ModelAnswer),
    /// No connection was made: nothing left podhost.
    Unsent(String),
    /// `429`: refused, and nothing taken. `after` is its `Retry-After`.
    Throttled {
        why: String,
        after: Option<Duration>,
    },
    /// The request may have reached the gate, and no answer says what became of the call.
    Lost {
        why: String,
        timed_out: bool,
        after: Option<Duration>,
    },
}

/// Sends a call with `send` until an answer says what became of it, the sends run out, or
/// `cancel` fires; pauses between sends as `policy` says.
pub(super) async fn resend<F, Fut>(
    policy: &Resends,
    effect_id: &str,
    cancel: &CancellationToken,
    mut send: F,
) -> Result<CallFate, Stopped>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Sent>,
{
    let mut pacing = policy.pacing.clone();
    pacing.reset();
    let attempts = policy.attempts.max(1);
    // Whether some send may have reached the gate: then the call may have run.
    let mut reached = false;
    let mut timeouts = 0;
    let mut sends = 0;
    loop {
        sends += 1;
        let sent = tokio::select! {
            sent = send() => sent,
            _ = cancel.cancelled() => return Err(Stopped),
        };
        let (why, after) = match &sent {
            Sent::Answered(_) => return Ok(settle(sent, sends, reached)),
            Sent::Unsent(why) => (why, None),
            Sent::Throttled { why, after } => (why, *after),
            Sent::Lost {
                why,
                timed_out,
                after,
            } => {
                reached = true;
                timeouts += u32::from(*timed_out);
                (why, *after)
            }
        };
        if sends >= attempts || timeouts >= TIMEOUTS {
            return Ok(settle(sent, sends, reached));
        }
        let backoff = pacing.next_delay();
        let pause = after.map_or(backoff, |a| a.min(policy.retry_after_cap));
        metrics::model_retry(ENDPOINT);
        tracing::warn!(
            %effect_id,
            sends,
            pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
            error = %why,
            "a Model Gate hop failed; sending the call again under its key"
        );
        if !sleep_or_cancel(pause, cancel).await {
            return Err(Stopped);
        }
    }
}

/// The fate of a call whose last send came to `last`, after `sends` sends; `reached` when some
/// send may have reached the gate.
fn settle(last: Sent, sends: u32, reached: bool) -> CallFate {
    let (why, code, after) = match last {
        Sent::Answered(answer) => return CallFate::Answered(answer),
        Sent::Unsent(why) | Sent::Lost { why, .. } => (why, codes::model::TRANSIENT, None),
        Sent::Throttled { why, after } => (why, codes::model::RATE_LIMITED, after),
    };
    if reached {
        return CallFate::Unknown(format!(
            "{why}. podhost tried the call {sends} times under its key and cannot tell whether \
             it ran."
        ));
    }
    let mut failure = ModelFailure::new(code, format!("{why} (after {sends} attempts)"), true);
    failure.retry_after_ms = after.map(|a| u64::try_from(a.as_millis()).unwrap_or(u64::MAX));
    CallFate::Answered(ModelAnswer::Failed(failure))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::model::Candidate;
    use pretty_assertions::assert_eq;
    use std::sync::Arc;
    use tokio::time::Instant;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn failed(code: &str, message: &str, retryable: bool) -> ModelAnswer {
        ModelAnswer::Failed(ModelFailure::new(code, message, retryable))
    }

    fn lost(why: &str) -> Sent {
        Sent::Lost {
            why: why.to_owned(),
            timed_out: false,
            after: None,
        }
    }

    fn throttled(after: Option<u64>) -> Sent {
        Sent::Throttled {
            why: "The Model Gate answered 429".to_owned(),
            after: after.map(Duration::from_secs),
        }
    }

    /// The bound, with pauses from 100 ms, doubling, at most 1 s.
    fn quick() -> Resends {
        Resends::new(Backoff::new(ms(100), ms(1000)))
    }

    /// Runs [`resend`] with one scripted reply per send: its result, and when each send was
    /// made (on the test's paused clock).
    async fn run(
        policy: &Resends,
        script: Vec<Sent>,
        cancel: &CancellationToken,
    ) -> (Result<CallFate, Stopped>, Vec<Duration>) {
        let start = Instant::now();
        let mut replies = script.into_iter();
        let mut at = Vec::new();
        let sends = resend(policy, "turn_1:0:model:s0", cancel, || {
            at.push(start.elapsed());
            let reply = replies.next().expect("a send past the script");
            async move { reply }
        });
        let result = tokio::time::timeout(Duration::from_secs(3600), sends)
            .await
            .expect("the sends did not end");
        (result, at)
    }

    /// The pauses between sends.
    fn pauses(at: &[Duration]) -> Vec<Duration> {
        at.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn two_lost_sends_then_an_answer_is_the_answer_after_growing_pauses() {
        let answer = ModelAnswer::Candidate(Candidate::text("hi"));
        let script = vec![
            lost("The Model Gate answered 503"),
            lost("The Model Gate answered 503"),
            Sent::Answered(answer.clone()),
        ];
        let (result, at) = run(&quick(), script, &CancellationToken::new()).await;
        assert_eq!(result, Ok(CallFate::Answered(answer)));
        // Jittered exponential: each pause in the upper half of 100 ms · 2ⁿ.
        let pauses = pauses(&at);
        assert!(
            pauses.len() == 2
                && (ms(50)..=ms(100)).contains(&pauses[0])
                && (ms(100)..=ms(200)).contains(&pauses[1]),
            "{pauses:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_lost_on_every_send_has_an_unknown_fate() {
        let script = vec![lost("The Model Gate answered 503"); 4];
        let (result, at) = run(&quick(), script, &CancellationToken::new()).await;
        assert_eq!(
            (result, at.len()),
            (
                Ok(CallFate::Unknown(
                    "The Model Gate answered 503. podhost tried the call 4 times under its key \
                     and cannot tell whether it ran."
                        .to_owned()
                )),
                4
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_never_left_podhost_is_a_definite_transient_failure() {
        let refused = Sent::Unsent("The Model Gate could not be reached: refused".to_owned());
        let (result, at) = run(&quick(), vec![refused; 4], &CancellationToken::new()).await;
        assert_eq!(
            (result, at.len()),
            (
                Ok(CallFate::Answered(failed(
                    "transient",
                    "The Model Gate could not be reached: refused (after 4 attempts)",
                    true
                ))),
                4
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_send_that_may_have_arrived_leaves_the_fate_unknown() {
        let refused = Sent::Unsent("The Model Gate could not be reached: refused".to_owned());
        let script = vec![
            refused.clone(),
            lost("The Model Gate lost the call: reset"),
            refused,
            throttled(None),
        ];
        let (result, _) = run(&quick(), script, &CancellationToken::new()).await;
        assert_eq!(
            result,
            Ok(CallFate::Unknown(
                "The Model Gate answered 429. podhost tried the call 4 times under its key and \
                 cannot tell whether it ran."
                    .to_owned()
            ))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_paces_a_throttled_call_within_its_cap() {
        let script = vec![
            throttled(Some(3)),
            throttled(Some(600)),
            throttled(None),
            throttled(Some(2)),
        ];
        let (result, at) = run(&quick(), script, &CancellationToken::new()).await;
        let pauses = pauses(&at);
        assert!(
            pauses.len() == 3
                && pauses[0] == Duration::from_secs(3)
                && pauses[1] == RETRY_AFTER_CAP
                && (ms(200)..=ms(400)).contains(&pauses[2]),
            "{pauses:?}"
        );
        // Nothing was taken: a definite failure, with the gate's last Retry-After.
        let mut failure = ModelFailure::new(
            "rate_limited",
            "The Model Gate answered 429 (after 4 attempts)",
            true,
        );
        failure.retry_after_ms = Some(2000);
        assert_eq!(result, Ok(CallFate::Answered(ModelAnswer::Failed(failure))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_timeout_is_the_last_send() {
        let timed_out = Sent::Lost {
            why: "The Model Gate timed out: operation timed out".to_owned(),
            timed_out: true,
            after: None,
        };
        let refused = Sent::Unsent("The Model Gate could not be reached: refused".to_owned());
        let script = vec![timed_out.clone(), refused, timed_out];
        let (result, at) = run(&quick(), script, &CancellationToken::new()).await;
        assert_eq!(
            (result, at.len()),
            (
                Ok(CallFate::Unknown(
                    "The Model Gate timed out: operation timed out. podhost tried the call 3 \
                     times under its key and cannot tell whether it ran."
                        .to_owned()
                )),
                3
            )
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_definite_answer_is_not_sent_again() {
        let refusal = failed(
            "invalid_request",
            "The Model Gate answered 409 run_stale: no",
            false,
        );
        let script = vec![
            lost("The Model Gate answered 502"),
            Sent::Answered(refusal.clone()),
        ];
        let (result, at) = run(&quick(), script, &CancellationToken::new()).await;
        assert_eq!((result, at.len()), (Ok(CallFate::Answered(refusal)), 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_ends_a_pause_at_once() {
        // A pause of 30 s at least.
        let policy = Resends {
            pacing: Backoff::new(Duration::from_secs(60), Duration::from_secs(60)),
            ..quick()
        };
        let cancel = CancellationToken::new();
        let first_sent = Arc::new(tokio::sync::Notify::new());
        let canceller = tokio::spawn({
            let (first_sent, cancel) = (first_sent.clone(), cancel.clone());
            async move {
                first_sent.notified().await;
                cancel.cancel();
            }
        });
        let start = Instant::now();
        let mut sends = 0;
        let call = resend(&policy, "turn_1:0:model:s0", &cancel, || {
            sends += 1;
            first_sent.notify_one();
            async { lost("The Model Gate answered 503") }
        });
        let result = tokio::time::timeout(Duration::from_secs(3600), call)
            .await
            .unwrap();
        assert_eq!(
            (result, sends, start.elapsed()),
            (Err(Stopped), 1, Duration::ZERO)
        );
        tokio::time::timeout(Duration::from_secs(5), canceller)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancel_ends_a_send_at_once() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let policy = quick();
        let call = resend(
            &policy,
            "turn_1:0:model:s0",
            &cancel,
            std::future::pending::<Sent>,
        );
        let result = tokio::time::timeout(Duration::from_secs(3600), call)
            .await
            .unwrap();
        assert_eq!(result, Err(Stopped));
    }

    #[tokio::test(start_paused = true)]
    async fn the_production_bound_waits_well_under_a_minute() {
        // The pod's default pacing (500 ms, at most 10 s), and a gate that asks for an hour.
        let policy = Resends::new(Backoff::new(ms(500), Duration::from_secs(10)));
        let (_, at) = run(
            &policy,
            vec![throttled(Some(3600)); ATTEMPTS as usize],
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(
            (at.len(), at.last().copied()),
            (4, Some(Duration::from_secs(30)))
        );
        // Without a Retry-After: 500 ms + 1 s + 2 s at most.
        let script = vec![lost("The Model Gate answered 503"); ATTEMPTS as usize];
        let (_, at) = run(&policy, script, &CancellationToken::new()).await;
        let last = at.last().copied().unwrap();
        assert!(
            at.len() == 4 && (ms(1750)..=ms(3500)).contains(&last),
            "{at:?}"
        );
    }
}
