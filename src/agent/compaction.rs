//! A compaction, run: the summary calls through the host, the compacted history handed back,
//! and the check that the next prompt fits.
//!
//! Owns: [`fit`] (called by the loop before each model call, and after an overflow), the words
//! of a summary call ([`SUMMARY_INSTRUCTIONS`]), the parts a history past a summary call's room
//! is cut into, and the ends of a step that cannot fit.
//!
//! Invariants:
//! * A compaction is a pure function of the host's units, the recorded answers and the budget
//!   ([`super::context::plan`]); its summary calls are numbered by part, so a replay asks for the
//!   same calls in the same order.
//! * One compaction per call: [`fit`] never calls itself, and the loop calls it once before a
//!   call and at most once after an overflow.
//! * A prompt that cannot fit ends the turn with `model.context_overflow` and words that say
//!   what to do; a window that was only assumed is left to the server to refuse.
//!
//! Non-goals: deciding what is kept (the plan's), wording or journaling a call (the host's).

use tokio_util::sync::CancellationToken;

use super::context::{
    Budget, Context, Plan, Tracker, Trigger, clip_to_tokens, estimate_tokens, plan,
};
// What the host is handed, where the fronts that implement it find it.
pub use super::host::{Compaction, SummaryCall};
use super::host::{Effect, TurnEnd, TurnHost};
use super::model::ModelAnswer;
use crate::floor::codes;

/// Room in a summary call for the words around the text and the previous summary's wrapper.
const SUMMARY_SLACK_TOKENS: u64 = 64;

/// What a summary call is told.
pub const SUMMARY_INSTRUCTIONS: &str = "You write the working memory of an agent whose \
conversation has grown too long for its context window. Summarize the conversation you are \
given so that the agent can go on with its task from your summary alone: the task and every \
requirement the user stated, decisions made and why, what was done (commands run, files read \
and changed, with their paths), what was found, errors met and how they were handled, and what \
is left to do. Keep exact names, paths, numbers and identifiers. Write plain prose and short \
lists; do not call tools and do not address the user.";

/// How [`fit`] ended.
#[derive(Debug, PartialEq)]
pub enum Fit {
    /// The next call may go.
    Ready,
    /// The turn ends here (a summary call waits, failed, or the prompt cannot fit).
    End(TurnEnd),
}

/// Fits the next model call of `step` into the model's window: with `Threshold`, compacts only
/// when the prompt is past the threshold; with `Overflow` (after a call failed for it),
/// compacts always. Runs the summary calls through the host, then hands it the compaction.
pub async fn fit<H: TurnHost>(
    host: &mut H,
    step: u32,
    trigger: Trigger,
    tracker: &mut Tracker,
    cancel: &CancellationToken,
) -> Result<Fit, H::Error> {
    let Some(ctx) = host.context() else {
        return Ok(Fit::Ready);
    };
    let estimate = ctx.estimate();
    let Some(budget) = tracker.working(ctx.budget) else {
        tracker.sending(estimate);
        return Ok(Fit::Ready);
    };
    let before = tracker.prompt(estimate);
    if trigger == Trigger::Threshold && before <= budget.threshold_tokens() {
        tracker.sending(estimate);
        return Ok(Fit::Ready);
    }
    let ratio = tracker.ratio();
    let plan = plan(&ctx, &budget, ratio);
    if plan.is_empty() {
        if trigger == Trigger::Threshold && (before <= budget.usable() || budget.assumed) {
            tracker.sending(estimate);
            return Ok(Fit::Ready);
        }
        return Ok(Fit::End(cannot_fit(step, before, &budget)));
    }
    tracing::info!(
        step,
        trigger = trigger.as_str(),
        tokens = before,
        window = budget.window,
        summarized = plan.summarized.len(),
        kept = plan.kept.len(),
        shrink = plan.shrink,
        "compacting the history"
    );

    let (summary, parts) = match summarize(
        host,
        &plan.summarized,
        &budget,
        ratio,
        step,
        trigger,
        cancel,
    )
    .await?
    {
        Ok(done) => done,
        Err(end) => return Ok(Fit::End(end)),
    };

    let tokens_after = tokens_after(&ctx, &plan, summary.as_deref(), ratio);
    let compaction = Compaction {
        step,
        trigger,
        summary,
        summarized: plan.summarized,
        kept: plan.kept,
        shrink: plan.shrink,
        tokens_before: before,
        tokens_after,
        parts,
    };
    host.compacted(&compaction).await?;
    let estimate = host.context().map_or(0, |c| c.estimate());
    let after = tracker.prompt(estimate);
    tracker.sending(estimate);
    if after > budget.usable() && !budget.assumed {
        return Ok(Fit::End(cannot_fit(step, after, &budget)));
    }
    Ok(Fit::Ready)
}

/// The prompt's estimated tokens once `plan` is applied with `summary`.
fn tokens_after(ctx: &Context, plan: &Plan, summary: Option<&str>, ratio: f64) -> u64 {
    let scale = |t: u64| (t as f64 * ratio).ceil() as u64;
    let kept_tokens: u64 = plan
        .kept
        .iter()
        .map(|&i| {
            let u = &ctx.units[i];
            scale(if plan.shrink { u.shrunk } else { u.tokens })
        })
        .sum();
    let summary_tokens = summary.map_or(0, |s| scale(estimate_tokens(s)));
    scale(ctx.fixed) + kept_tokens + summary_tokens
}

/// Runs the summary calls for the `summarized` units, one per part, each carrying the summary so
/// far; gives the summary and its number of parts, or how the turn ends instead.
async fn summarize<H: TurnHost>(
    host: &mut H,
    summarized: &[usize],
    budget: &Budget,
    ratio: f64,
    step: u32,
    trigger: Trigger,
    cancel: &CancellationToken,
) -> Result<Result<(Option<String>, u32), TurnEnd>, H::Error> {
    let mut summary: Option<String> = None;
    let mut parts = 0u32;
    if !summarized.is_empty() {
        let chunks = match summary_chunks(host, summarized, budget, ratio) {
            Ok(c) => c,
            Err(e) => return Ok(Err(failed(e.to_string()))),
        };
        parts = chunks.len() as u32;
        for (k, chunk) in chunks.into_iter().enumerate() {
            let text = match &summary {
                Some(so_far) => format!(
                    "The summary so far:\n\n{so_far}\n\nThe conversation continues as follows. \
                     Write one summary of all of it.\n\n{chunk}"
                ),
                None => format!("The conversation to summarize:\n\n{chunk}"),
            };
            let call = SummaryCall {
                step,
                trigger,
                part: k as u32,
                parts,
                instructions: SUMMARY_INSTRUCTIONS,
                text,
                max_tokens: budget.summary_tokens(),
            };
            let answer = match host.summarize(&call, cancel).await? {
                Effect::Done(a) => a,
                Effect::Wait(id) => {
                    return Ok(Err(TurnEnd::Waiting {
                        effect_ids: vec![id],
                    }));
                }
            };
            match answer {
                ModelAnswer::Candidate(c) => {
                    let text = c.text_output();
                    let text = if text.trim().is_empty() {
                        tracing::warn!(step, part = k, "a summary call answered no text");
                        "(The summary of this part came back empty.)".to_owned()
                    } else {
                        text
                    };
                    // A model that ignored the room is held to it.
                    summary = Some(clip_to_tokens(&text, budget.summary_tokens() * 3 / 2));
                }
                ModelAnswer::Failed(f) => {
                    return Ok(Err(TurnEnd::Failed {
                        code: format!("{}{}", codes::model::TURN_PREFIX, f.code),
                        message: format!(
                            "The history could not be summarized to fit the model's context \
                             window (step {step}): {}",
                            f.message
                        ),
                    }));
                }
            }
            if cancel.is_cancelled() {
                return Ok(Err(TurnEnd::Cancelled));
            }
        }
    }
    Ok(Ok((summary, parts)))
}

/// A context window (in tokens) with no room for a summary call's part of the history.
#[derive(Debug, thiserror::Error)]
#[error("The model's context window ({0} tokens) is too small to summarize the history in")]
struct WindowTooSmall(u64);

/// The summarized units' text, in parts that each fit one summary call.
fn summary_chunks<H: TurnHost>(
    host: &H,
    summarized: &[usize],
    budget: &Budget,
    ratio: f64,
) -> Result<Vec<String>, WindowTooSmall> {
    let room = budget.summary_tokens();
    let call_usable = budget.window.saturating_sub(room);
    let overhead = estimate_tokens(SUMMARY_INSTRUCTIONS) + SUMMARY_SLACK_TOKENS + room + room / 2;
    let part = ((call_usable as f64 * budget.threshold) / ratio) as u64;
    let part = part.saturating_sub(overhead);
    if part < SUMMARY_SLACK_TOKENS {
        return Err(WindowTooSmall(budget.window));
    }
    let mut chunks = Vec::new();
    let mut current = String::new();
    for &i in summarized {
        let text = clip_to_tokens(&host.unit_text(i), part);
        if !current.is_empty() && estimate_tokens(&current) + estimate_tokens(&text) + 1 > part {
            chunks.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push('\n');
        }
        current.push_str(&text);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    Ok(chunks)
}

fn failed(message: String) -> TurnEnd {
    TurnEnd::Failed {
        code: format!(
            "{}{}",
            codes::model::TURN_PREFIX,
            codes::model::CONTEXT_OVERFLOW
        ),
        message,
    }
}

/// The end of a step whose prompt cannot fit, compacted or not.
fn cannot_fit(step: u32, tokens: u64, budget: &Budget) -> TurnEnd {
    failed(format!(
        "The prompt of step {step} is about {tokens} tokens and cannot be made to fit the \
         model's context window ({} tokens, {} of them kept for the answer): what must stay \
         (the instructions, the tools, the latest input and the last step) is already past it. \
         Use a model with a larger window, or send a shorter input.",
        budget.window, budget.answer
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::context::{Context, Unit, UnitKind};
    use crate::agent::model::{Candidate, ModelFailure, ResultOutcome, ToolCallBlock, ToolResult};
    use crate::agent::turn::ToolEffect;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_window_too_small_to_summarize_in_says_its_size() {
        assert_eq!(
            WindowTooSmall(1000).to_string(),
            "The model's context window (1000 tokens) is too small to summarize the history in"
        );
    }

    fn units(kinds: &[(UnitKind, u64)]) -> Vec<Unit> {
        kinds.iter().map(|&(k, t)| Unit::new(k, t)).collect()
    }

    /// A host whose history is units it keeps itself: each step adds one of `step_tokens`.
    struct Windowed {
        budget: Budget,
        fixed: u64,
        units: Vec<Unit>,
        step_tokens: u64,
        answers: Vec<ModelAnswer>,
        has_file: bool,
        log: Vec<String>,
    }

    impl Windowed {
        fn new(window: u64, fixed: u64, units: Vec<Unit>, answers: Vec<ModelAnswer>) -> Self {
            Windowed {
                budget: Budget::new(window, Some(window / 10), 0.8),
                fixed,
                units,
                step_tokens: 200,
                answers,
                has_file: false,
                log: Vec::new(),
            }
        }
    }

    impl TurnHost for Windowed {
        type Error = String;
        fn should_yield(&self, _: u32) -> bool {
            false
        }
        async fn model(
            &mut self,
            step: u32,
            attempt: u32,
            _: &CancellationToken,
        ) -> Result<Effect<ModelAnswer>, String> {
            self.log.push(format!("model {step}.{attempt}"));
            if self.answers.is_empty() {
                return Err("script ran out".into());
            }
            Ok(Effect::Done(self.answers.remove(0)))
        }
        async fn answered(&mut self, _: u32, _: &Candidate) -> Result<(), String> {
            Ok(())
        }
        async fn tool(
            &mut self,
            _: u32,
            _: &ToolCallBlock,
            _: &CancellationToken,
        ) -> Result<ToolEffect, String> {
            Ok(ToolEffect::Done(ResultOutcome::Completed {
                output: serde_json::json!("ok"),
                files: None,
            }))
        }
        async fn results(&mut self, _: u32, _: &[ToolResult]) -> Result<(), String> {
            self.units.push(Unit::new(UnitKind::Step, self.step_tokens));
            Ok(())
        }
        fn context(&self) -> Option<Context> {
            Some(Context {
                budget: Some(self.budget),
                fixed: self.fixed,
                units: self.units.clone(),
            })
        }
        fn unit_text(&self, unit: usize) -> String {
            "x".repeat(self.units[unit].tokens as usize * 3)
        }
        async fn summarize(
            &mut self,
            call: &SummaryCall,
            _: &CancellationToken,
        ) -> Result<Effect<ModelAnswer>, String> {
            self.log.push(format!(
                "summary {} {} {}/{}",
                call.step,
                call.trigger.as_str(),
                call.part,
                call.parts
            ));
            Ok(Effect::Done(ModelAnswer::Candidate(Candidate::text("sum"))))
        }
        async fn compacted(&mut self, c: &Compaction) -> Result<(), String> {
            self.log.push(format!(
                "compacted {:?} kept {:?} shrink {}",
                c.summarized, c.kept, c.shrink
            ));
            let mut next = vec![Unit::new(UnitKind::Summary, 2)];
            next.extend(c.kept.iter().map(|&i| self.units[i]));
            self.units = next;
            Ok(())
        }
        async fn drop_files(&mut self, _: u32, _: &ModelFailure) -> Result<bool, String> {
            let had = std::mem::take(&mut self.has_file);
            if had {
                self.log.push("dropped".into());
            }
            Ok(had)
        }
    }

    fn call() -> ModelAnswer {
        use crate::agent::model::Block;
        ModelAnswer::Candidate(Candidate {
            output: vec![Block::ToolCall(ToolCallBlock::from_json_arguments(
                "c".into(),
                "bash".into(),
                "{}",
            ))],
            ..Candidate::default()
        })
    }

    fn done() -> ModelAnswer {
        ModelAnswer::Candidate(Candidate::text("done"))
    }

    fn overflow() -> ModelAnswer {
        ModelAnswer::Failed(ModelFailure::new(
            "context_overflow",
            "This model's maximum context length is 800 tokens.",
            false,
        ))
    }

    async fn run(host: &mut Windowed) -> TurnEnd {
        crate::agent::turn::drive(host, 0, &CancellationToken::new())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn the_loop_compacts_before_a_call_past_the_threshold() {
        use UnitKind::*;
        // Usable 900, threshold 720: 100 fixed + 50 input + 200 a step.
        let mut host = Windowed::new(
            1000,
            100,
            units(&[(Input, 50)]),
            vec![call(), call(), call(), call(), done()],
        );
        assert_eq!(
            run(&mut host).await,
            TurnEnd::Completed {
                candidate: Candidate::text("done")
            }
        );
        assert_eq!(
            host.log,
            [
                "model 0.0",
                "model 1.0",
                "model 2.0",
                // A window this small holds one step a summary call.
                "summary 3 threshold 0/2",
                "summary 3 threshold 1/2",
                "compacted [1, 2] kept [0, 3] shrink false",
                "model 3.0",
                "model 4.0",
            ]
        );
    }

    #[tokio::test]
    async fn an_overflow_gets_one_compaction_and_one_retry_and_never_a_loop() {
        use UnitKind::*;
        let history = units(&[(Input, 50), (Step, 200), (Step, 200)]);
        let mut host = Windowed::new(100_000, 100, history.clone(), vec![overflow(), done()]);
        assert!(matches!(run(&mut host).await, TurnEnd::Completed { .. }));
        assert_eq!(
            host.log,
            [
                "model 0.0",
                "summary 0 overflow 0/1",
                "compacted [1] kept [0, 2] shrink false",
                "model 0.1",
            ]
        );
        // Overflowing again after the compaction ends the turn, saying so.
        let mut host = Windowed::new(100_000, 100, history, vec![overflow(), overflow()]);
        assert_eq!(
            run(&mut host).await,
            TurnEnd::Failed {
                code: "model.context_overflow".into(),
                message: "The prompt of step 0 still overflowed the model's context window after \
                          the history was compacted: This model's maximum context length is 800 \
                          tokens."
                    .into()
            }
        );
        assert_eq!(
            host.log.iter().filter(|l| l.starts_with("model")).count(),
            2
        );
    }

    #[tokio::test]
    async fn what_cannot_fit_fails_with_a_clear_error() {
        use UnitKind::*;
        let mut host = Windowed::new(1000, 950, units(&[(Input, 50)]), vec![done()]);
        assert_eq!(
            run(&mut host).await,
            TurnEnd::Failed {
                code: "model.context_overflow".into(),
                message: "The prompt of step 0 is about 1000 tokens and cannot be made to fit the \
                          model's context window (1000 tokens, 100 of them kept for the answer): \
                          what must stay (the instructions, the tools, the latest input and the \
                          last step) is already past it. Use a model with a larger window, or send \
                          a shorter input."
                    .into()
            }
        );
        assert!(host.log.is_empty(), "{:?}", host.log);
    }

    #[tokio::test]
    async fn a_history_past_the_window_is_summarized_in_parts() {
        use UnitKind::*;
        let mut history = units(&[(Input, 10)]);
        history.extend(units(&[(Step, 500); 6]));
        history.push(Unit::new(Input, 10));
        let mut host = Windowed::new(1000, 20, history, vec![done()]);
        run(&mut host).await;
        let parts: Vec<&String> = host
            .log
            .iter()
            .filter(|l| l.starts_with("summary"))
            .collect();
        assert!(parts.len() >= 6, "{:?}", host.log);
        assert_eq!(parts[0], &format!("summary 0 threshold 0/{}", parts.len()));
        assert_eq!(
            host.log[parts.len()],
            "compacted [0, 1, 2, 3, 4, 5, 6] kept [7] shrink false"
        );
    }

    #[tokio::test]
    async fn a_refused_file_is_dropped_and_the_call_sent_once_more() {
        use UnitKind::*;
        let refused = || {
            ModelAnswer::Failed(ModelFailure::new(
                "unsupported_input",
                "The model does not read pdf input",
                false,
            ))
        };
        let mut host = Windowed::new(100_000, 10, units(&[(Input, 10)]), vec![refused(), done()]);
        host.has_file = true;
        assert!(matches!(run(&mut host).await, TurnEnd::Completed { .. }));
        assert_eq!(host.log, ["model 0.0", "dropped", "model 0.1"]);
        // Nothing left to drop: the refusal ends the turn.
        let mut host = Windowed::new(100_000, 10, units(&[(Input, 10)]), vec![refused()]);
        assert_eq!(
            run(&mut host).await,
            TurnEnd::Failed {
                code: "model.unsupported_input".into(),
                message: "The model does not read pdf input".into()
            }
        );
    }
}
