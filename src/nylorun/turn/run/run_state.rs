//! What the run holds for the whole segment: the lease's handle and token, what core granted
//! (the TurnStart, the segment's ids, its journal), what the model is offered, the skills and
//! the environment commands run with, and whether an effect's fate became unknown.
//!
//! Invariant: all of it is set when the segment opens and stays for the segment, except
//! `uncertain`, which only ever turns true.

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::nylorun::artifacts::Artifacts;
use crate::nylorun::artifacts::skills::MountedSkill;
use crate::nylorun::link::lease::RunHandle;
use crate::nylorun::link::protocol::{RunToken, TurnLimits};
use crate::nylorun::turn::effects::{Journal, SegmentIds};
use crate::nylorun::turn::instructions::Offer;
use crate::nylorun::turn::turn_start::TurnStart;

/// The run a segment runs.
pub(super) struct RunState {
    pub(super) handle: RunHandle,
    pub(super) run_id: String,
    /// Fires when the run stops (cancelled, past its deadline, shut down or taken away).
    pub(super) cancel: CancellationToken,
    pub(super) ts: TurnStart,
    pub(super) ids: SegmentIds,
    pub(super) journal: Journal,
    pub(super) offer: Offer,
    pub(super) skills: Vec<MountedSkill>,
    /// The session's environment plus nothing else: every command's variables.
    pub(super) env: Vec<(String, String)>,
    /// The segment's input as core sent it (or, after an approval, as the waiting segment had it).
    pub(super) input_raw: Value,
    /// An effect's fate is unknown: a waiting segment ends `uncertain`.
    pub(super) uncertain: bool,
}

impl RunState {
    pub(super) fn limits(&self) -> &TurnLimits {
        &self.ts.limits
    }

    /// The run's artifacts within `limits`; a loss of the run they hear of stops it.
    pub(super) fn artifacts(&self, limits: TurnLimits) -> Artifacts {
        Artifacts::new(self.handle.channel().clone(), self.run_id.clone(), limits)
            .with_loss(self.handle.loss())
    }

    /// The run's token as it is now (renewals replace it).
    pub(super) fn current_token(&self) -> Option<RunToken> {
        self.handle.token()
    }

    /// The skill whose folder a sandbox call's input names, if any.
    pub(super) fn skill_of(&self, args: &Value) -> Option<String> {
        if self.skills.is_empty() {
            return None;
        }
        let text = args.to_string();
        self.skills
            .iter()
            .find(|s| text.contains(s.folder.trim_end_matches('/')))
            .map(|s| s.name.clone())
    }
}
