//! The agent loop: ask the model, run the tools it calls, repeat until it answers.
//!
//! Owns: the order of effects in a turn, the end states, and the normalisation every front needs
//! (unique tool-call ids, malformed arguments answered to the model, model failures ending the
//! turn). It knows nothing of WebSockets, HTTP or storage: a front plugs in through [`TurnHost`],
//! which journals each effect before running it (or replays it) and keeps the transcript.
//!
//! Before each model call the loop fits the prompt into the model's window ([`compaction::fit`]):
//! past the threshold it compacts the history. A call that fails for context overflow is
//! answered by one compaction and one retry; a call that fails refusing a file, by dropping
//! that file from the history (the host's [`TurnHost::drop_files`]) and one retry.
//!
//! Invariants:
//! * Effects are addressed by `(step, attempt, call id)` only. Steps count model calls within
//!   this run of the loop, attempts the retries of one step (at most one), and call ids come
//!   from the (replayed) model answer, so a replay of the same segment asks for the same effects
//!   in the same order. A compaction's summary calls are addressed by the step, the trigger and
//!   the part, and happen where the replayed answers and failures put them.
//! * Every tool call of an answer gets exactly one result, or the turn ends waiting/suspended
//!   with that call named.
//! * Cancellation is checked between effects; a host passes the token into each effect.

use std::collections::HashSet;

use tokio_util::sync::CancellationToken;

use super::compaction::{self, Fit};
use super::context::{Tracker, Trigger};
// The port, where the fronts that drive the loop find it.
pub use super::host::{Effect, ToolEffect, TurnEnd, TurnHost};
use super::media;
use super::model::{Candidate, ModelAnswer, ResultOutcome, ToolCallBlock, ToolResult};
use crate::floor::codes;

/// Runs the loop from step `first` until the turn ends.
pub async fn drive<H: TurnHost>(
    host: &mut H,
    first: u32,
    cancel: &CancellationToken,
) -> Result<TurnEnd, H::Error> {
    let mut step = first;
    let mut tracker = Tracker::default();
    loop {
        if cancel.is_cancelled() {
            return Ok(TurnEnd::Cancelled);
        }
        if step > first && host.should_yield(step) {
            return Ok(TurnEnd::Yielded);
        }
        if let Fit::End(end) =
            compaction::fit(host, step, Trigger::Threshold, &mut tracker, cancel).await?
        {
            return Ok(end);
        }
        let mut candidate = match answer(host, step, &mut tracker, cancel).await? {
            Ok(c) => c,
            Err(end) => return Ok(end),
        };
        if cancel.is_cancelled() {
            return Ok(TurnEnd::Cancelled);
        }
        unique_call_ids(&mut candidate, step);
        host.prepare(step, &mut candidate);
        host.answered(step, &candidate).await?;

        let calls: Vec<ToolCallBlock> = candidate.tool_calls().cloned().collect();
        if calls.is_empty() {
            return Ok(TurnEnd::Completed { candidate });
        }

        let mut results = Vec::with_capacity(calls.len());
        let mut waits = Vec::new();
        let mut asks = Vec::new();
        for call in &calls {
            if cancel.is_cancelled() {
                return Ok(TurnEnd::Cancelled);
            }
            let outcome = match call.argument_error() {
                Some(message) => {
                    ToolEffect::Done(ResultOutcome::failed(codes::tool::INVALID_INPUT, message))
                }
                None => host.tool(step, call, cancel).await?,
            };
            match outcome {
                ToolEffect::Done(outcome) => results.push(ToolResult {
                    call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    outcome,
                }),
                ToolEffect::Wait(id) => waits.push(id),
                ToolEffect::Ask => asks.push(call.clone()),
            }
        }
        if !waits.is_empty() {
            return Ok(TurnEnd::Waiting { effect_ids: waits });
        }
        if cancel.is_cancelled() {
            return Ok(TurnEnd::Cancelled);
        }
        host.results(step, &results).await?;
        if !asks.is_empty() {
            return Ok(TurnEnd::InputRequired { calls: asks });
        }
        step += 1;
    }
}

/// Asks for `step`'s answer. A failure for context overflow is answered by one compaction and
/// one retry; a refused file, by dropping it and one retry; any other failure ends the turn.
async fn answer<H: TurnHost>(
    host: &mut H,
    step: u32,
    tracker: &mut Tracker,
    cancel: &CancellationToken,
) -> Result<Result<Candidate, TurnEnd>, H::Error> {
    let mut attempt = 0;
    loop {
        let failure = match host.model(step, attempt, cancel).await? {
            Effect::Done(ModelAnswer::Candidate(c)) => {
                tracker.measured(c.usage.as_ref());
                return Ok(Ok(c));
            }
            Effect::Done(ModelAnswer::Failed(f)) => f,
            Effect::Wait(id) => {
                return Ok(Err(TurnEnd::Waiting {
                    effect_ids: vec![id],
                }));
            }
        };
        if cancel.is_cancelled() {
            return Ok(Err(TurnEnd::Cancelled));
        }
        let overflow = failure.code == codes::model::CONTEXT_OVERFLOW;
        if attempt == 0 && overflow {
            tracing::info!(step, message = %failure.message, "the prompt overflowed the model's window");
            tracker.overflowed(&failure);
            if let Fit::End(end) =
                compaction::fit(host, step, Trigger::Overflow, tracker, cancel).await?
            {
                return Ok(Err(end));
            }
            attempt += 1;
            continue;
        }
        if attempt == 0
            && media::is_file_refusal(&failure.code, &failure.message)
            && host.drop_files(step, &failure).await?
        {
            tracing::info!(step, message = %failure.message, "a file the model refused was dropped");
            attempt += 1;
            continue;
        }
        let message = if overflow && attempt > 0 {
            format!(
                "The prompt of step {step} still overflowed the model's context window after the \
                 history was compacted: {}",
                failure.message
            )
        } else {
            failure.message
        };
        return Ok(Err(TurnEnd::Failed {
            code: format!("{}{}", codes::model::TURN_PREFIX, failure.code),
            message,
        }));
    }
}

/// The longest tool-call id a suffix may make (the BYOH protocol's limit on ids).
pub const MAX_CALL_ID_CHARS: usize = 512;

/// `base` with the suffix `_<n>`, the base cut so that the id stays within
/// [`MAX_CALL_ID_CHARS`] characters. The same base and `n` give the same id.
pub fn suffixed_call_id(base: &str, n: usize) -> String {
    let suffix = format!("_{n}");
    let keep = MAX_CALL_ID_CHARS.saturating_sub(suffix.len());
    let mut id: String = base.chars().take(keep).collect();
    id.push_str(&suffix);
    id
}

/// Gives every tool call of `candidate` a non-empty id unique within the answer; a suffix never
/// takes an id past [`MAX_CALL_ID_CHARS`]. Depends only on the answer and the step, so a
/// replayed answer gets the same ids.
fn unique_call_ids(candidate: &mut Candidate, step: u32) {
    let mut seen = HashSet::new();
    let mut index = 0usize;
    for block in &mut candidate.output {
        let super::model::Block::ToolCall(call) = block else {
            continue;
        };
        index += 1;
        if call.id.trim().is_empty() {
            call.id = format!("call_{step}_{index}");
        }
        let mut id = call.id.clone();
        let mut n = 1;
        while !seen.insert(id.clone()) {
            n += 1;
            id = suffixed_call_id(&call.id, n);
        }
        call.id = id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::model::Block;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    /// A host that answers from a script and records what the loop did.
    #[derive(Default)]
    struct Scripted {
        answers: Vec<ModelAnswer>,
        tool_effects: Vec<(String, ToolEffect)>,
        log: Vec<String>,
        yield_at: Option<u32>,
    }

    impl TurnHost for Scripted {
        type Error = String;
        fn should_yield(&self, step: u32) -> bool {
            self.yield_at == Some(step)
        }
        async fn model(
            &mut self,
            step: u32,
            _attempt: u32,
            _: &CancellationToken,
        ) -> Result<Effect<ModelAnswer>, String> {
            self.log.push(format!("model {step}"));
            if self.answers.is_empty() {
                return Err("script ran out".into());
            }
            Ok(Effect::Done(self.answers.remove(0)))
        }
        async fn answered(&mut self, step: u32, c: &Candidate) -> Result<(), String> {
            let ids: Vec<_> = c.tool_calls().map(|c| c.id.clone()).collect();
            self.log.push(format!("answered {step} {ids:?}"));
            Ok(())
        }
        async fn tool(
            &mut self,
            step: u32,
            call: &ToolCallBlock,
            _: &CancellationToken,
        ) -> Result<ToolEffect, String> {
            self.log.push(format!("tool {step} {}", call.id));
            let i = self
                .tool_effects
                .iter()
                .position(|(name, _)| *name == call.name);
            Ok(match i {
                Some(i) => self.tool_effects.remove(i).1,
                None => ToolEffect::Done(ResultOutcome::Completed {
                    output: json!("ok"),
                    files: None,
                }),
            })
        }
        async fn results(&mut self, step: u32, r: &[ToolResult]) -> Result<(), String> {
            let ids: Vec<_> = r.iter().map(|r| r.call_id.clone()).collect();
            self.log.push(format!("results {step} {ids:?}"));
            Ok(())
        }
    }

    fn calls(calls: &[(&str, &str, &str)]) -> ModelAnswer {
        ModelAnswer::Candidate(Candidate {
            output: calls
                .iter()
                .map(|(id, name, args)| {
                    Block::ToolCall(ToolCallBlock::from_json_arguments(
                        id.to_string(),
                        name.to_string(),
                        args,
                    ))
                })
                .collect(),
            ..Candidate::default()
        })
    }

    #[test]
    fn a_suffix_keeps_a_reused_long_id_within_512_characters_and_is_the_same_on_replay() {
        let long = "x".repeat(512);
        let answer = || {
            let ModelAnswer::Candidate(c) = calls(&[
                (long.as_str(), "read", "{}"),
                (long.as_str(), "read", "{}"),
                (long.as_str(), "glob", "{}"),
                ("short", "glob", "{}"),
                ("short", "glob", "{}"),
            ]) else {
                unreachable!()
            };
            c
        };
        let mut first = answer();
        unique_call_ids(&mut first, 3);
        let ids: Vec<String> = first.tool_calls().map(|c| c.id.clone()).collect();
        assert_eq!(
            ids,
            [
                long.clone(),
                format!("{}_2", "x".repeat(510)),
                format!("{}_3", "x".repeat(510)),
                "short".to_owned(),
                "short_2".to_owned(),
            ]
        );
        assert!(ids.iter().all(|id| id.chars().count() <= MAX_CALL_ID_CHARS));
        let mut replayed = answer();
        unique_call_ids(&mut replayed, 3);
        assert_eq!(replayed, first);
        // Multi-byte characters count as one each.
        assert_eq!(suffixed_call_id(&"é".repeat(600), 10).chars().count(), 512);
    }

    async fn run_script(host: &mut Scripted) -> TurnEnd {
        drive(host, 0, &CancellationToken::new()).await.unwrap()
    }

    #[tokio::test]
    async fn tools_then_an_answer_completes() {
        let mut host = Scripted {
            answers: vec![
                calls(&[("a", "bash", "{}"), ("a", "read", "{}"), ("", "glob", "{}")]),
                ModelAnswer::Candidate(Candidate::text("done")),
            ],
            ..Scripted::default()
        };
        let end = run_script(&mut host).await;
        assert_eq!(
            end,
            TurnEnd::Completed {
                candidate: Candidate::text("done")
            }
        );
        assert_eq!(
            host.log,
            [
                "model 0",
                r#"answered 0 ["a", "a_2", "call_0_3"]"#,
                "tool 0 a",
                "tool 0 a_2",
                "tool 0 call_0_3",
                r#"results 0 ["a", "a_2", "call_0_3"]"#,
                "model 1",
                "answered 1 []",
            ]
        );
    }

    #[tokio::test]
    async fn malformed_arguments_are_answered_without_running() {
        let mut host = Scripted {
            answers: vec![
                calls(&[("x", "bash", "{oops")]),
                ModelAnswer::Candidate(Candidate::text("k")),
            ],
            ..Scripted::default()
        };
        run_script(&mut host).await;
        assert!(
            !host.log.iter().any(|l| l.starts_with("tool")),
            "{:?}",
            host.log
        );
    }

    #[tokio::test]
    async fn model_failures_waits_asks_and_yields_end_the_turn() {
        let mut failed = Scripted {
            answers: vec![ModelAnswer::Failed(crate::agent::model::ModelFailure::new(
                "auth", "no", false,
            ))],
            ..Scripted::default()
        };
        assert_eq!(
            run_script(&mut failed).await,
            TurnEnd::Failed {
                code: "model.auth".into(),
                message: "no".into()
            }
        );

        let mut waiting = Scripted {
            answers: vec![calls(&[("1", "held", "{}"), ("2", "bash", "{}")])],
            tool_effects: vec![("held".into(), ToolEffect::Wait("t:0:tool:1".into()))],
            ..Scripted::default()
        };
        assert_eq!(
            run_script(&mut waiting).await,
            TurnEnd::Waiting {
                effect_ids: vec!["t:0:tool:1".into()]
            }
        );
        assert!(!waiting.log.iter().any(|l| l.starts_with("results")));

        let mut asking = Scripted {
            answers: vec![calls(&[("1", "ask_user", "{}"), ("2", "bash", "{}")])],
            tool_effects: vec![("ask_user".into(), ToolEffect::Ask)],
            ..Scripted::default()
        };
        let TurnEnd::InputRequired { calls: asked } = run_script(&mut asking).await else {
            panic!()
        };
        assert_eq!(
            asked.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
            ["1"]
        );
        assert_eq!(asking.log.last().unwrap(), r#"results 0 ["2"]"#);

        let mut yielding = Scripted {
            answers: vec![calls(&[("1", "bash", "{}")]), calls(&[("2", "bash", "{}")])],
            yield_at: Some(1),
            ..Scripted::default()
        };
        assert_eq!(run_script(&mut yielding).await, TurnEnd::Yielded);
    }

    #[tokio::test]
    async fn a_cancelled_token_stops_before_the_next_effect() {
        let mut host = Scripted {
            answers: vec![calls(&[("1", "bash", "{}")])],
            ..Scripted::default()
        };
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert_eq!(
            drive(&mut host, 0, &cancel).await.unwrap(),
            TurnEnd::Cancelled
        );
        assert!(host.log.is_empty());
    }
}
