//! What the segment holds of the session's transcript: the entries it read and the ones it
//! leaves, how the model is shown their files, the pinned memory index, and the compactions
//! made so far.
//!
//! Invariant: `before` is the transcript as read and never changes; each compaction keeps the
//! transcript it left, so its edit can be reported apart from the rest (v5 §6).

use serde_json::Value;

use crate::nylorun::turn::context::{self as pod_context, MemoryPin};
use crate::nylorun::turn::transcript::{self, Files};

/// The transcript and its context.
pub(super) struct History {
    /// The transcript as read, and as it grows.
    pub(super) before: Vec<Value>,
    pub(super) entries: Vec<Value>,
    pub(super) files: Files,
    /// The memory index shown at the head of the prompt (`None` without memory, or when none
    /// could be pinned), and as the session's state had it when the segment started.
    pub(super) pin: Option<MemoryPin>,
    pub(super) pin_at_start: Option<MemoryPin>,
    /// Each compaction of this segment: the transcript it left, and its facts.
    pub(super) compactions: Vec<(Vec<Value>, Value)>,
    /// The summary calls of the compaction in progress.
    pub(super) summary_ids: Vec<String>,
}

impl History {
    /// A unit's entries as text, for a summary call.
    pub(super) fn unit_text(&self, unit: usize) -> String {
        pod_context::units(&self.entries)
            .get(unit)
            .map(|(_, range)| pod_context::render(&self.entries[range.clone()]))
            .unwrap_or_default()
    }

    /// The transcript's edits since the segment read it, each at most `limit` bytes: each
    /// compaction's own edit, marked with its facts, then the rest.
    pub(super) fn edits(&self, limit: usize) -> Result<Value, transcript::EntryTooLarge> {
        let mut edits = Vec::new();
        let mut from = &self.before;
        for (snapshot, facts) in &self.compactions {
            edits.extend(transcript::marked_updates(
                from,
                snapshot,
                limit,
                Some(facts),
            )?);
            from = snapshot;
        }
        edits.extend(transcript::updates(from, &self.entries, limit)?);
        Ok(serde_json::to_value(edits).unwrap_or_else(|_| Value::Array(Vec::new())))
    }
}
