//! The segment's side of the context budget (v5 §3, §6): the context the loop sizes, summary
//! calls as model effects with `purpose: "summary"`, the compaction applied to the transcript
//! (its edit's facts kept for the output), the pinned memory index, and refused files dropped.
//!
//! Invariants: every value here comes from the transcript, the replayed outcomes and
//! journaled effects, so a replayed segment compacts the same way, with the same ids and
//! hashes; a fresh memory index is only ever taken through its own journaled effect.

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{Fault, MEMORY_INDEX_EFFECT, Segment};
use crate::agent::compaction::{Compaction, SummaryCall};
use crate::agent::context::{Context, UnitKind, estimate_json};
use crate::agent::model::{ModelAnswer, ModelFailure, ResultOutcome};
use crate::agent::turn::Effect;
use crate::nylorun::turn::context::{self as pod_context, MemoryPin};
use crate::nylorun::turn::effects::{self, Decision, Intent, Recorded};
use crate::nylorun::turn::outcome;
use crate::nylorun::turn::transcript::{self, Entry};

impl Segment {
    /// Pins a memory index when the session has memory and its state holds none.
    pub(super) async fn pin_first(&mut self) -> Result<(), Fault> {
        if self.run.ts.memory.is_some() && self.history.pin.is_none() {
            self.history.pin = self
                .fresh_pin("memory-index".to_owned(), self.run.ids.step_id(0))
                .await?;
        }
        Ok(())
    }

    /// A fresh memory index, taken through a journaled `harness` effect (no `callId`: no tool
    /// call of the model's): the first attempt records TurnStart's index as its outcome, and a
    /// replay reads it back, whatever the index is by then. `None` when none could be taken.
    async fn fresh_pin(
        &mut self,
        identity: String,
        step_id: String,
    ) -> Result<Option<MemoryPin>, Fault> {
        let Some(memory) = &self.run.ts.memory else {
            return Ok(None);
        };
        let fresh = MemoryPin::of(memory);
        let mut intent = Intent::tool(
            &self.run.ids,
            0,
            "",
            MEMORY_INDEX_EFFECT,
            json!({"kind": "harness"}),
            json!({}),
        );
        intent.effect_id = self.run.ids.effect_id("tool", &identity);
        intent.context = json!({"invocationId": step_id, "stepId": step_id});
        let hash = intent.hash();
        let value = match self.run.journal.decide(&intent, &hash).await? {
            Decision::Known { value, .. } => value,
            Decision::Wait { .. } => return Ok(None),
            Decision::Execute { .. } => {
                let value = outcome::to_value(&ResultOutcome::Completed {
                    output: fresh.value(),
                    files: None,
                })
                .map_err(|e| Fault::Internal(e.to_string()))?;
                match self.run.journal.outcome(&intent.effect_id, value).await? {
                    Recorded::Completed(v) => v,
                    Recorded::Uncertain => return Ok(None),
                }
            }
        };
        Ok(MemoryPin::from_value(&value))
    }

    /// The pinned memory item's text: the pin, or (memory on, nothing pinned) where to look.
    pub(super) fn pin_text(&self) -> Option<String> {
        self.run.ts.memory.as_ref()?;
        Some(match &self.history.pin {
            Some(pin) => pin.text(),
            None => "Your memory index is not shown here; view /memories to see your memories."
                .to_owned(),
        })
    }

    /// The next model call's context: the budget, and the transcript as units.
    pub(super) fn context_now(&self) -> Option<Context> {
        let pin = self.pin_text();
        let head = transcript::head(&self.run.offer.instructions, pin.as_deref());
        let tools: u64 = self.run.offer.tools.iter().map(estimate_json).sum();
        Some(Context {
            budget: self.budget.context,
            fixed: pod_context::tokens_of(&head) + tools,
            units: pod_context::sized_units(
                &self.history.entries,
                &self.run.ids.turn_id,
                &self.history.files,
            ),
        })
    }

    /// Runs or replays a summary call: a model effect with `purpose: "summary"`.
    pub(super) async fn summary_call(
        &mut self,
        call: &SummaryCall,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, Fault> {
        if call.part == 0 {
            self.history.summary_ids.clear();
        }
        let body = json!({
            "prompt": [
                {"kind": "instructions", "role": "system",
                 "content": [{"type": "text", "text": call.instructions}]},
                {"kind": "message", "role": "user", "content": [{"type": "text", "text": call.text}]},
            ],
            "tools": [],
            "executionId": self.run.ids.session_id,
            "model": {"controls": {"maxOutputTokens": call.max_tokens}},
        });
        let identity = effects::summary_identity(call.step, call.trigger.as_str(), call.part);
        let invocation_id = format!("compaction-{}-{identity}", self.run.ids.segment);
        let mut intent = Intent::model(&self.run.ids, call.step, body);
        intent.effect_id = self.run.ids.effect_id("model", &identity);
        intent.purpose = Some("summary");
        intent.context =
            json!({"invocationId": invocation_id, "stepId": self.run.ids.step_id(call.step)});
        let effect_id = intent.effect_id.clone();
        let answer = self
            .model_effect(intent, invocation_id, call.step, cancel)
            .await?;
        if let Effect::Done(ModelAnswer::Candidate(_)) = &answer {
            // The summary's outcome is recorded; the compaction is not yet applied or reported.
            crate::failpoint!("pod.compaction_after_summary");
            self.history.summary_ids.push(effect_id);
        }
        Ok(answer)
    }

    /// Replaces the transcript as the compaction says, records the edit's facts, and refreshes
    /// the pinned memory index.
    pub(super) async fn apply_compaction(&mut self, c: &Compaction) -> Result<(), Fault> {
        let units = pod_context::units(&self.history.entries);
        let step_id = self.run.ids.step_id(c.step);
        let mut next = Vec::with_capacity(self.history.entries.len());
        if let Some(summary) = &c.summary {
            next.push(
                Entry::Compaction {
                    turn_id: self.run.ids.turn_id.clone(),
                    step_id: step_id.clone(),
                    summary: summary.clone(),
                    trigger: c.trigger.as_str().to_owned(),
                    tokens_before: c.tokens_before,
                    tokens_after: c.tokens_after,
                }
                .into(),
            );
        }
        for &i in &c.kept {
            let Some((kind, range)) = units.get(i) else {
                continue;
            };
            for e in &self.history.entries[range.clone()] {
                next.push(if c.shrink && *kind == UnitKind::Step {
                    pod_context::shrink(e)
                } else {
                    e.clone()
                });
            }
        }
        self.history.entries = next;
        if c.summary.is_none() {
            return Ok(());
        }
        let facts = json!({
            "trigger": c.trigger.as_str(),
            "tokensBefore": c.tokens_before,
            "tokensAfter": c.tokens_after,
            "summaryEffectIds": std::mem::take(&mut self.history.summary_ids),
        });
        tracing::info!(run_id = %self.run.run_id, step = c.step, trigger = c.trigger.as_str(), before = c.tokens_before, after = c.tokens_after, parts = c.parts, "history compacted");
        self.history
            .compactions
            .push((self.history.entries.clone(), facts));
        // The index is refreshed at a compaction only, through its own journaled effect.
        if self.run.ts.memory.is_some() {
            let identity = format!("memory-index.s{}.{}", c.step, c.trigger.as_str());
            if let Some(pin) = self.fresh_pin(identity, step_id).await? {
                self.history.pin = Some(pin);
            }
        }
        // The compaction is applied in memory; the edit that reports it leaves with the
        // segment's output.
        crate::failpoint!("pod.compaction_before_report");
        Ok(())
    }

    /// Replaces the file parts a refused call was about with notes.
    pub(super) fn drop_refused_files(
        &mut self,
        step: u32,
        failure: &ModelFailure,
    ) -> Result<bool, Fault> {
        let dropped = pod_context::drop_refused(
            &mut self.history.entries,
            &self.history.files,
            &failure.message,
        );
        if dropped > 0 {
            tracing::info!(run_id = %self.run.run_id, step, dropped, "file parts the model refused were replaced by notes");
        }
        Ok(dropped > 0)
    }
}
