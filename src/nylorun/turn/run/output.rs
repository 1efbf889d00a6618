//! The outputs of a segment (v5 §7): one output request, or a release, for every way a segment
//! ends; and podhost's `state`.
//!
//! Invariants: every output carries `state` (within `harnessStateBytes`); a completed,
//! yielded, failed or cancelled segment carries its transcript edits; a waiting one carries
//! none (it runs again once its effects are settled); `shutdown` and `ownership.lost` are
//! releases, whatever else happened.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Fault, STATE_VERSION, Segment};
use crate::agent::turn::TurnEnd;
use crate::nylorun::artifacts::export::export_outputs;
use crate::nylorun::link::lease::{RunEnd, RunHandle, StopReason};
use crate::nylorun::link::protocol::{ReleaseReason, methods};
use crate::nylorun::turn::context::MemoryPin;
use crate::nylorun::turn::shaping::json_len;
use crate::nylorun::turn::transcript::{self, Entry};

/// podhost's `state` (v5 §7: "what you want back next segment").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct HarnessState {
    pub(super) v: u32,
    /// The turn a yielded or waiting segment belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) turn_id: Option<String>,
    /// A waiting segment's input, to run it again when an `approval.answer` comes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) input: Option<Value>,
    /// The memory index the session pinned (refreshed only at a compaction).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) memory: Option<MemoryPin>,
}

impl HarnessState {
    pub(super) fn done() -> Self {
        HarnessState {
            v: STATE_VERSION,
            ..HarnessState::default()
        }
    }

    pub(super) fn value(&self) -> Value {
        serde_json::to_value(self).unwrap_or_else(|_| json!({"v": STATE_VERSION}))
    }
}

pub(super) fn end_name(end: &RunEnd) -> String {
    match end {
        RunEnd::Output { method, output } => match output.get("status").and_then(Value::as_str) {
            Some(s) => format!("{method} {s}"),
            None => (*method).to_owned(),
        },
        RunEnd::Release(r) => format!("release {}", r.as_str()),
    }
}

/// `turn.failed {status: "failed", error}`.
pub(super) fn failed(run_id: &str, code: &str, message: &str, transcript: Option<Value>) -> RunEnd {
    let mut output = json!({
        "runId": run_id,
        "status": "failed",
        "error": {"code": code, "message": message},
        "state": HarnessState::done().value(),
    });
    if let Some(t) = transcript {
        output["transcript"] = t;
    }
    RunEnd::Output {
        method: methods::TURN_FAILED,
        output,
    }
}

/// The end for a run that stopped, or an internal fault's `thrown`.
pub(super) fn stopped_or_thrown(run: &RunHandle, fault: Fault) -> RunEnd {
    let run_id = &run.grant().run_id;
    match fault {
        Fault::Stopped => stopped_end(run, None),
        Fault::Drift => failed(
            run_id,
            "effect_drift",
            "Effect identity request drift",
            None,
        ),
        Fault::Failed { code, message } => failed(run_id, code, &message, None),
        Fault::RunStale => RunEnd::Release(ReleaseReason::OwnershipLost),
        Fault::Internal(message) => thrown(run_id, &message),
    }
}

pub(super) fn thrown(run_id: &str, message: &str) -> RunEnd {
    tracing::error!(%run_id, %message, "the turn failed in podhost");
    RunEnd::Output {
        method: methods::TURN_FAILED,
        output: json!({
            "runId": run_id,
            "status": "failed",
            "state": HarnessState::done().value(),
            "thrown": {"code": "internal", "message": message},
        }),
    }
}

/// A stopped run: `turn.failed` (cancelled) after `cancel`/`deadline` or core's
/// `turn_cancelled`; a release otherwise (the lease sends it whatever this says).
pub(super) fn stopped_end(run: &RunHandle, transcript: Option<Value>) -> RunEnd {
    let reason = run.stop_reason();
    let message = match reason {
        Some(StopReason::Shutdown) => return RunEnd::Release(ReleaseReason::Shutdown),
        Some(StopReason::OwnershipLost) => return RunEnd::Release(ReleaseReason::OwnershipLost),
        Some(StopReason::ConnectionLost) => return RunEnd::Release(ReleaseReason::ConnectionLost),
        Some(StopReason::Deadline) => run
            .stop_message()
            .unwrap_or_else(|| "The advance ran past its deadline".to_owned()),
        Some(StopReason::Cancel) | None => run
            .stop_message()
            .unwrap_or_else(|| "Turn cancelled".to_owned()),
    };
    let mut output = json!({
        "runId": run.grant().run_id,
        "status": "cancelled",
        "error": {"code": "cancelled", "message": message},
        "state": HarnessState::done().value(),
    });
    if let Some(t) = transcript {
        output["transcript"] = t;
    }
    RunEnd::Output {
        method: methods::TURN_FAILED,
        output,
    }
}

impl Segment {
    /// The transcript's edits since the segment read it: each compaction's own edit, marked
    /// with its facts, then the rest.
    fn edits(&self) -> Result<Value, transcript::EntryTooLarge> {
        let limit = usize::try_from(self.run.limits().record_entry_bytes).unwrap_or(usize::MAX);
        self.history.edits(limit)
    }

    /// Claims an event of the turn (`event {runId, sessionId, turnId, type, payload}`): what
    /// the export says when it stored nothing. Best effort: a refusal is logged, never fails
    /// the turn.
    async fn claim(&self, kind: &str, payload: Value) {
        let params = json!({
            "runId": self.run.run_id,
            "sessionId": self.run.ids.session_id,
            "turnId": self.run.ids.turn_id,
            "type": kind,
            "payload": payload,
        });
        let sent = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            self.run
                .handle
                .channel()
                .request::<_, Value>(methods::EVENT, &params),
        )
        .await;
        match sent {
            Ok(Ok(_)) => tracing::info!(run_id = %self.run.run_id, %kind, "event claimed"),
            Ok(Err(e)) => {
                tracing::warn!(run_id = %self.run.run_id, %kind, error = %e, "event not taken")
            }
            Err(_) => {
                tracing::warn!(run_id = %self.run.run_id, %kind, "event got no answer in time")
            }
        }
    }

    /// The segment's output.
    pub(super) async fn finish(mut self, end: Result<TurnEnd, Fault>) -> RunEnd {
        let run_id = self.run.run_id.clone();
        let state = HarnessState {
            memory: self.history.pin.clone(),
            ..HarnessState::done()
        };
        match end {
            Ok(TurnEnd::Completed { candidate }) => {
                self.completed(candidate.text_output(), &state).await
            }
            Ok(TurnEnd::Waiting { effect_ids }) => self.waiting(effect_ids),
            Ok(TurnEnd::Yielded) => match self.edits() {
                Ok(edits) => RunEnd::Output {
                    method: methods::CHECKPOINT,
                    output: json!({
                        "runId": run_id,
                        "status": "yielded",
                        "state": HarnessState {
                            v: STATE_VERSION,
                            turn_id: Some(self.run.ids.turn_id.clone()),
                            input: None,
                            memory: self.history.pin.clone(),
                        }
                        .value(),
                        "transcript": edits,
                    }),
                },
                Err(e) => failed(&run_id, "transcript.entry_too_large", &e.to_string(), None),
            },
            Ok(TurnEnd::Failed { code, message }) => {
                let edits = self.edits().ok();
                let mut output = json!({
                    "runId": run_id,
                    "status": "failed",
                    "error": {"code": code, "message": message},
                    "state": state.value(),
                });
                if let Some(t) = edits {
                    output["transcript"] = t;
                }
                RunEnd::Output {
                    method: methods::TURN_FAILED,
                    output,
                }
            }
            Ok(TurnEnd::Cancelled) | Err(Fault::Stopped) => {
                stopped_end(&self.run.handle, self.edits().ok())
            }
            Ok(TurnEnd::InputRequired { .. }) => thrown(
                &run_id,
                "the loop asked the user a question podhost cannot ask",
            ),
            Err(fault) => stopped_or_thrown(&self.run.handle, fault),
        }
    }

    /// The output of a completed segment: its final entry, then the `outputs` folder exported
    /// (a sandboxed turn), then `turn.completed`.
    async fn completed(&mut self, text: String, state: &HarnessState) -> RunEnd {
        let run_id = self.run.run_id.clone();
        let output = Value::String(text);
        let step_id = self.run.ids.step_id(self.step.last.unwrap_or(0));
        self.history.entries.push(
            Entry::Final {
                turn_id: self.run.ids.turn_id.clone(),
                step_id,
                output: output.clone(),
            }
            .into(),
        );
        let edits = match self.edits() {
            Ok(e) => e,
            Err(e) => {
                return failed(&run_id, "transcript.entry_too_large", &e.to_string(), None);
            }
        };
        if self.run.ts.has_sandbox() {
            let artifacts = self.run.artifacts(self.run.limits().clone());
            let outputs = self.clients.toolbox.workspace().root().join("outputs");
            let report = export_outputs(
                &artifacts,
                &self.clients.toolbox,
                &outputs,
                &self.run.ids.turn_id,
            )
            .await;
            tracing::info!(%run_id, ?report, "outputs folder exported");
            for (kind, payload) in report.claims() {
                self.claim(kind, payload).await;
            }
            // Core said the run is another owner's: it is released, not completed.
            if self.run.cancel.is_cancelled() {
                return stopped_end(&self.run.handle, None);
            }
        }
        RunEnd::Output {
            method: methods::TURN_COMPLETED,
            output: json!({
                "runId": run_id,
                "status": "completed",
                "output": output,
                "state": state.value(),
                "transcript": edits,
            }),
        }
    }

    /// The output of a segment that waits on its effects (`turn.waiting`).
    fn waiting(&self, effect_ids: Vec<String>) -> RunEnd {
        let run_id = &self.run.run_id;
        // The segment runs again once its effects are settled; it leaves no edits, and
        // keeps its input for an `approval.answer`.
        // The segment runs again from its start: with the index it started with.
        let mut waiting = HarnessState {
            v: STATE_VERSION,
            turn_id: Some(self.run.ids.turn_id.clone()),
            input: Some(self.run.input_raw.clone()),
            memory: self.history.pin_at_start.clone(),
        };
        if json_len(&waiting.value()) as u64 > self.run.limits().harness_state_bytes {
            tracing::warn!(%run_id, "the waiting segment's input is too large for the state; an approval cannot run it again");
            waiting.input = None;
        }
        RunEnd::Output {
            method: methods::TURN_WAITING,
            output: json!({
                "runId": run_id,
                "status": if self.run.uncertain { "uncertain" } else { "waiting" },
                "effectIds": effect_ids,
                "state": waiting.value(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn state_is_small_and_reads_back() {
        assert_eq!(HarnessState::done().value(), json!({"v": 1}));
        let waiting = HarnessState {
            v: STATE_VERSION,
            turn_id: Some("t".into()),
            input: Some(json!({"kind": "continue"})),
            memory: None,
        };
        let v = waiting.value();
        assert_eq!(
            v,
            json!({"v": 1, "turnId": "t", "input": {"kind": "continue"}})
        );
        assert_eq!(HarnessState::deserialize(&v).unwrap(), waiting);
    }

    #[test]
    fn failures_name_their_code() {
        assert_eq!(
            failed("r", "model.auth", "no", None),
            RunEnd::Output {
                method: methods::TURN_FAILED,
                output: json!({"runId": "r", "status": "failed", "state": {"v": 1},
                               "error": {"code": "model.auth", "message": "no"}}),
            }
        );
        assert_eq!(end_name(&failed("r", "x", "y", None)), "turn.failed failed");
        assert_eq!(
            end_name(&RunEnd::Release(ReleaseReason::Shutdown)),
            "release shutdown"
        );
    }
}
