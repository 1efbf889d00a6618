//! What one step of the segment holds: which step it is, the tool calls its answer made (they
//! share one `tool-results` entry), and its budget for MCP and HTTP results (v5 §5b).
//!
//! Invariant: a step's state is set when its answer arrives ([`Step::begin`]) and read until
//! the next answer; a replayed step sees the same calls, so the same budgets.

use crate::agent::model::Candidate;
use crate::nylorun::turn::shaping::ENTRY_ENVELOPE_BYTES;
use crate::nylorun::turn::toolgate::results::StepBudget;

/// Room per result in a `tool-results` entry beyond its value (`callId`, `toolName`, keys).
const RESULT_OVERHEAD_BYTES: u64 = 64;
/// The least record budget a call gets, however many share the entry.
const MIN_CALL_BYTES: u64 = 1024;

/// The step in progress.
pub(super) struct Step {
    /// The last step that answered (`None` before the first).
    pub(super) last: Option<u32>,
    /// The lengths of each tool call's id and name (they share one record entry).
    pub(super) calls: Vec<(usize, usize)>,
    /// The step's budget for its MCP and HTTP results.
    pub(super) budget: StepBudget,
}

impl Step {
    /// Before the first step, within `record_entry_bytes`.
    pub(super) fn new(record_entry_bytes: u64) -> Self {
        Step {
            last: None,
            calls: Vec::new(),
            budget: StepBudget::new(record_entry_bytes),
        }
    }

    /// Step `step` answered `candidate`: its calls share the next entry.
    pub(super) fn begin(&mut self, step: u32, candidate: &Candidate, record_entry_bytes: u64) {
        self.last = Some(step);
        self.calls = candidate
            .tool_calls()
            .map(|c| (c.id.len(), c.name.len()))
            .collect();
        self.budget = StepBudget::new(record_entry_bytes);
    }

    /// The record budget of one tool call's outcome: the step's calls share one entry of
    /// `record_entry_bytes`.
    pub(super) fn call_budget(&self, record_entry_bytes: u64) -> u64 {
        let n = self.calls.len().max(1) as u64;
        let overhead: u64 = self
            .calls
            .iter()
            .map(|(id, name)| (*id + *name) as u64 + RESULT_OVERHEAD_BYTES)
            .sum();
        let room = record_entry_bytes.saturating_sub(ENTRY_ENVELOPE_BYTES as u64 + overhead);
        (room / n).max(MIN_CALL_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::model::{Block, ToolCallBlock};

    #[test]
    fn a_steps_calls_share_one_entry() {
        let call = |id: &str| {
            Block::ToolCall(ToolCallBlock::from_json_arguments(
                id.into(),
                "bash".into(),
                "{}",
            ))
        };
        let candidate = Candidate {
            output: vec![call("c1"), call("c2")],
            ..Candidate::default()
        };
        let mut step = Step::new(100_000);
        assert_eq!(step.call_budget(100_000), 100_000 - 4096);
        step.begin(3, &candidate, 100_000);
        assert_eq!(step.last, Some(3));
        // Two calls: each gets half of what the envelope and their ids and names leave.
        assert_eq!(
            step.call_budget(100_000),
            (100_000 - 4096 - 2 * (6 + 64)) / 2
        );
        assert_eq!(step.call_budget(5000), MIN_CALL_BYTES);
    }
}
