//! The loop's port: what a front implements to run the agent loop ([`TurnHost`]), and the
//! values that cross it — where an effect stands ([`Effect`], [`ToolEffect`]), a compaction's
//! summary calls and result ([`SummaryCall`], [`Compaction`]), how a turn ended ([`TurnEnd`]).
//!
//! Both the loop ([`super::turn`]) and the compaction it runs ([`super::compaction`]) talk to
//! the host through this port, so neither imports the other's types: the loop calls the
//! compaction, and both depend on this file, never the other way.
//!
//! Non-goals: the loop's order of effects (the loop's), what is kept in a compaction (the
//! plan's, [`super::context::plan`]).

use tokio_util::sync::CancellationToken;

use super::context::{Context, Trigger};
use super::model::{
    Candidate, ModelAnswer, ModelFailure, ResultOutcome, ToolCallBlock, ToolResult,
};
use crate::floor::codes;

/// Where a model effect stands after the host journaled (and maybe ran) it.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect<T> {
    /// The effect has its value: it ran now, or its recorded outcome was replayed.
    Done(T),
    /// The effect waits on something outside the loop (an outcome core does not know yet): the
    /// segment ends waiting on this effect id.
    Wait(String),
}

/// Where a tool effect stands after the host journaled (and maybe ran) it.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolEffect {
    /// The call has its result: it ran now, or its recorded outcome was replayed.
    Done(ResultOutcome),
    /// The call waits on something outside the loop (a person's approval): the segment ends
    /// waiting on this effect id.
    Wait(String),
    /// The call is a question for the user: the turn ends asking for input, this call unanswered.
    Ask,
}

/// How a turn (or a segment of one) ended.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnEnd {
    /// The model answered without calling tools.
    Completed { candidate: Candidate },
    /// The model asked the user; `calls` are the unanswered questions.
    InputRequired { calls: Vec<ToolCallBlock> },
    /// Effects wait on something outside the loop.
    Waiting { effect_ids: Vec<String> },
    /// The host asked to continue in a new segment.
    Yielded,
    /// The model call failed (`model.<code>`).
    Failed { code: String, message: String },
    /// The cancellation token fired.
    Cancelled,
}

/// A front's side of the loop.
#[allow(async_fn_in_trait)]
pub trait TurnHost {
    /// A fault of the harness (connection lost, store failed, effect drift): the loop stops.
    type Error;

    /// Whether to end the segment before asking the model for step `step` (budgets of steps or
    /// time). Never asked before the first step, so every segment makes progress.
    fn should_yield(&self, step: u32) -> bool;

    /// Runs or replays step `step`'s model call over the transcript so far; `attempt` is 0, or
    /// 1 for the retry after an overflow or a refused file.
    async fn model(
        &mut self,
        step: u32,
        attempt: u32,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, Self::Error>;

    /// Adjusts an answer before it is recorded and acted on — e.g. makes tool-call ids unique
    /// across a whole session. It must depend only on the answer and the transcript, so that a
    /// replayed answer is adjusted the same way.
    fn prepare(&mut self, _step: u32, _candidate: &mut Candidate) {}

    /// Records the model's answer of `step` in the transcript.
    async fn answered(&mut self, step: u32, candidate: &Candidate) -> Result<(), Self::Error>;

    /// Runs or replays one tool call of `step`.
    async fn tool(
        &mut self,
        step: u32,
        call: &ToolCallBlock,
        cancel: &CancellationToken,
    ) -> Result<ToolEffect, Self::Error>;

    /// Records `step`'s tool results (one per call that has one) in the transcript.
    async fn results(&mut self, step: u32, results: &[ToolResult]) -> Result<(), Self::Error>;

    /// The next model call's context: the model's budget and the history by units
    /// ([`super::context`]). `None`: the host keeps no budget, and the loop never compacts.
    fn context(&self) -> Option<Context> {
        None
    }

    /// The text of history unit `unit` (an index into [`Context::units`]) for a summary call.
    fn unit_text(&self, _unit: usize) -> String {
        String::new()
    }

    /// Runs or replays one summary call of a compaction.
    async fn summarize(
        &mut self,
        _call: &SummaryCall,
        _cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, Self::Error> {
        Ok(Effect::Done(ModelAnswer::Failed(ModelFailure::new(
            codes::model::INVALID_REQUEST,
            "this front writes no summaries",
            false,
        ))))
    }

    /// Replaces the history as `compaction` says: the summarized units become one summary,
    /// first, followed by the kept units.
    async fn compacted(&mut self, _compaction: &Compaction) -> Result<(), Self::Error> {
        Ok(())
    }

    /// A call of `step` failed refusing a file: drops the file parts the failure is about from
    /// the history, for this and every later call. `true` when it dropped one (the call is
    /// sent again once).
    async fn drop_files(
        &mut self,
        _step: u32,
        _failure: &ModelFailure,
    ) -> Result<bool, Self::Error> {
        Ok(false)
    }
}

/// One summary call: the host words it, journals it (its identity is the step, the trigger and
/// the part) and runs or replays it.
#[derive(Clone, Debug, PartialEq)]
pub struct SummaryCall {
    pub step: u32,
    pub trigger: Trigger,
    /// Which part (from 0) of `parts`.
    pub part: u32,
    pub parts: u32,
    /// The system text of the call.
    pub instructions: &'static str,
    /// The user text: the summary so far (from the earlier parts) and the history to add.
    pub text: String,
    /// The room of the answer.
    pub max_tokens: u64,
}

/// A compaction the host applies to its history.
#[derive(Clone, Debug, PartialEq)]
pub struct Compaction {
    pub step: u32,
    pub trigger: Trigger,
    /// The summary of the units in `summarized`; `None` when nothing was summarized (the kept
    /// tail was only shrunk).
    pub summary: Option<String>,
    /// Indices of the units the summary replaces, in order.
    pub summarized: Vec<usize>,
    /// Indices of the units kept verbatim, in order (an earlier summary when nothing new was
    /// summarized, pinned ones, then the latest input, then the recent steps).
    pub kept: Vec<usize>,
    /// Shrink the tool results of the kept steps to previews.
    pub shrink: bool,
    /// The prompt's tokens before and (estimated) after.
    pub tokens_before: u64,
    pub tokens_after: u64,
    /// How many summary calls wrote it.
    pub parts: u32,
}
