//! Effects (v5 §4): ids, intents, request hashes, replay, and the journal requests.
//!
//! Owns: the effect id `<turnId>:<segment>:<kind>:<identity>`, the intent core journals, its
//! request hash, the replay of `TurnStart.outcomes`, and `effect.intent` / `effect.outcome`.
//!
//! Invariants:
//! * Identities come from the step (the model call's place in the segment) and the model's own
//!   call id — never from the clock or a counter of calls made — so a run that starts the
//!   segment over asks for the same ids.
//! * The hash covers the whole intent *with* `input`; a model intent goes to core *without*
//!   `input` (the prompt never crosses twice).
//! * A replayed outcome is used only when its hash is the intent's: another hash is drift, and
//!   the turn fails.
//! * `run_not_held` / `ownership_lost` from core stop the run (its [`RunLoss`]): the segment
//!   ends in a release, as after a refused renewal.
//!
//! Non-goals: running anything (`run`), the Model Gate (`gates`).

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::floor::text::clip_chars;
use crate::nylorun::link::canonical::request_hash;
use crate::nylorun::link::channel::{CallError, Channel};
use crate::nylorun::link::lease::RunLoss;
use crate::nylorun::link::protocol::ErrorCode;
use crate::nylorun::turn::turn_start::{OutcomeBody, RecordedOutcome};

/// Method names of the turn's journal requests.
pub mod methods {
    pub const EFFECT_INTENT: &str = "effect.intent";
    pub const EFFECT_OUTCOME: &str = "effect.outcome";
    pub const TRANSCRIPT_READ: &str = "transcript.read";
}

/// What core answers a request of the turn within; past it the turn fails as an internal fault.
const JOURNAL_TIMEOUT: Duration = Duration::from_secs(60);

/// The ids every intent of a segment carries.
#[derive(Clone, Debug)]
pub struct SegmentIds {
    pub session_id: String,
    pub turn_id: String,
    pub segment: u32,
    pub agent_id: String,
    pub manifest_hash: String,
}

impl SegmentIds {
    /// `<turnId>:<segment>:<kind>:<identity>`.
    pub fn effect_id(&self, kind: &str, identity: &str) -> String {
        format!("{}:{}:{kind}:{identity}", self.turn_id, self.segment)
    }

    /// The step's id, also the `invocationId` of its model call and tool calls: unique within
    /// the turn (it names the segment) and the same on every replay of it.
    pub fn step_id(&self, step: u32) -> String {
        format!("step-{}-{step}", self.segment)
    }
}

/// The identity of step `step`'s model call.
pub fn model_identity(step: u32) -> String {
    format!("s{step}")
}

/// The identity of step `step`'s model call sent again (`attempt` 1 or more) after an overflow
/// or a refused file.
pub fn retry_identity(step: u32, attempt: u32) -> String {
    format!("s{step}.r{attempt}")
}

/// The identity of part `part` of the summary a compaction before (`threshold`) or after
/// (`overflow`) step `step`'s model call writes.
pub fn summary_identity(step: u32, trigger: &str, part: u32) -> String {
    format!("s{step}.summary.{trigger}.{part}")
}

/// The identity of the tool call `call_id` of step `step`. A call id that is long or holds
/// characters other than `[A-Za-z0-9_.-]` is named by its hash instead, so that an effect id
/// stays short and plain.
pub fn tool_identity(step: u32, call_id: &str) -> String {
    let plain = !call_id.is_empty()
        && call_id.len() <= 128
        && call_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if plain {
        format!("s{step}.{call_id}")
    } else {
        let digest = hex::encode(Sha256::digest(call_id.as_bytes()));
        format!("s{step}.h{}", &digest[..16])
    }
}

/// An effect as core journals it (`EffectIntentSchema`), `input` included.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Intent {
    pub effect_id: String,
    pub session_id: String,
    pub turn_id: String,
    pub agent_id: String,
    pub manifest_hash: String,
    /// `model` or `tool`.
    pub kind: &'static str,
    /// The name the model called the tool by (display only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// What runs the tool call: `{kind: "sandbox"}`, `{kind: "harness"}`, `{kind: "runtime",
    /// operation}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<Value>,
    /// The skill whose folder the call names.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// `"summary"` for a model call that writes a compaction's summary (v5 §6).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub purpose: Option<&'static str>,
    /// The model call, or the tool's arguments.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// `{invocationId, stepId}` for a model call; plus `callId` for a tool call.
    pub context: Value,
}

impl Intent {
    pub fn model(ids: &SegmentIds, step: u32, call: Value) -> Intent {
        let step_id = ids.step_id(step);
        Intent {
            effect_id: ids.effect_id("model", &model_identity(step)),
            session_id: ids.session_id.clone(),
            turn_id: ids.turn_id.clone(),
            agent_id: ids.agent_id.clone(),
            manifest_hash: ids.manifest_hash.clone(),
            kind: "model",
            tool_name: None,
            target: None,
            skill: None,
            purpose: None,
            input: Some(call),
            context: json!({"invocationId": step_id, "stepId": step_id}),
        }
    }

    pub fn tool(
        ids: &SegmentIds,
        step: u32,
        call_id: &str,
        tool_name: &str,
        target: Value,
        args: Value,
    ) -> Intent {
        let step_id = ids.step_id(step);
        Intent {
            effect_id: ids.effect_id("tool", &tool_identity(step, call_id)),
            session_id: ids.session_id.clone(),
            turn_id: ids.turn_id.clone(),
            agent_id: ids.agent_id.clone(),
            manifest_hash: ids.manifest_hash.clone(),
            kind: "tool",
            tool_name: Some(tool_name.to_owned()),
            target: Some(target),
            skill: None,
            purpose: None,
            input: Some(args),
            context: json!({"invocationId": step_id, "callId": call_id, "stepId": step_id}),
        }
    }

    /// The request hash: SHA-256 of the canonical JSON of the whole intent, `input` included.
    pub fn hash(&self) -> String {
        request_hash(&serde_json::to_value(self).unwrap_or(Value::Null))
    }

    /// The intent as sent: a model intent without its `input`.
    pub fn wire(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if self.kind == "model"
            && let Some(o) = v.as_object_mut()
        {
            o.remove("input");
        }
        v
    }
}

/// What to do with an effect.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Its outcome is known (replayed from `TurnStart.outcomes`, or core answered `completed`).
    Known { value: Value, replayed: bool },
    /// Run it; `rejoin` re-sends a call a previous owner left at a gate; `traceparent` is the
    /// call's span context for the command it runs.
    Execute {
        rejoin: bool,
        traceparent: Option<String>,
    },
    /// The segment ends waiting on it (`uncertain` when its fate is unknown).
    Wait { uncertain: bool },
}

/// What core recorded for an outcome podhost reported.
#[derive(Clone, Debug, PartialEq)]
pub enum Recorded {
    Completed(Value),
    Uncertain,
}

/// Why a journal request did not give an answer to act on.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum JournalError {
    /// A replayed or journaled row of this id has another request hash.
    #[error("Effect identity request drift")]
    Drift { effect_id: String },
    /// Core says the turn was cancelled.
    #[error("core cancelled the turn: {0}")]
    TurnCancelled(String),
    /// The run stopped (its token fired) while the request was in flight.
    #[error("the run stopped")]
    Stopped,
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("core did not answer {method} within {secs} s")]
    Timeout { method: &'static str, secs: u64 },
    #[error("core's answer to {method} is not one podhost can use: {answer}")]
    BadAnswer {
        method: &'static str,
        answer: String,
    },
}

/// The journal of one run: the replayable outcomes and the two requests.
pub struct Journal {
    channel: Channel,
    run_id: String,
    replay: HashMap<String, RecordedOutcome>,
    cancel: CancellationToken,
    /// Told when core says the run is no longer held.
    loss: Option<RunLoss>,
}

impl Journal {
    pub fn new(
        channel: Channel,
        run_id: String,
        outcomes: Vec<RecordedOutcome>,
        cancel: CancellationToken,
        loss: Option<RunLoss>,
    ) -> Self {
        let replay = outcomes
            .into_iter()
            .map(|o| (o.effect_id.clone(), o))
            .collect();
        Journal {
            channel,
            run_id,
            replay,
            cancel,
            loss,
        }
    }

    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Replays the effect, or asks core (`effect.intent`).
    pub async fn decide(&self, intent: &Intent, hash: &str) -> Result<Decision, JournalError> {
        if let Some(recorded) = self.replay.get(&intent.effect_id) {
            if recorded.request_hash != hash {
                tracing::warn!(
                    effect_id = %intent.effect_id,
                    recorded = %recorded.request_hash,
                    now = %hash,
                    "a replayed outcome has another request hash"
                );
                return Err(JournalError::Drift {
                    effect_id: intent.effect_id.clone(),
                });
            }
            return Ok(Decision::Known {
                value: recorded.outcome.value.clone(),
                replayed: true,
            });
        }
        crate::failpoint!("pod.before_intent");
        let params = json!({"runId": self.run_id, "effect": intent.wire(), "requestHash": hash});
        let answer = self
            .request(methods::EFFECT_INTENT, params, &intent.effect_id)
            .await?;
        crate::floor::metrics::effect_journaled(intent.kind);
        let status = answer.get("status").and_then(Value::as_str);
        match status {
            Some("execute") => Ok(Decision::Execute {
                rejoin: answer.get("rejoin").and_then(Value::as_bool) == Some(true),
                traceparent: answer
                    .get("traceparent")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            }),
            Some("completed") => Ok(Decision::Known {
                value: outcome_value(methods::EFFECT_INTENT, &answer)?,
                replayed: false,
            }),
            Some("pending") => Ok(Decision::Wait { uncertain: false }),
            Some("uncertain") => Ok(Decision::Wait { uncertain: true }),
            _ => Err(JournalError::BadAnswer {
                method: methods::EFFECT_INTENT,
                answer: answer.to_string(),
            }),
        }
    }

    /// Reports what an effect produced (`effect.outcome {runId, effectId, value}`).
    pub async fn outcome(&self, effect_id: &str, value: Value) -> Result<Recorded, JournalError> {
        let params = json!({"runId": self.run_id, "effectId": effect_id, "value": value});
        self.recorded(params, effect_id).await
    }

    /// Reports that podhost could not learn what an effect did (`{…, error}`).
    pub async fn outcome_error(
        &self,
        effect_id: &str,
        error: &str,
    ) -> Result<Recorded, JournalError> {
        let params = json!({"runId": self.run_id, "effectId": effect_id, "error": error});
        self.recorded(params, effect_id).await
    }

    async fn recorded(&self, params: Value, effect_id: &str) -> Result<Recorded, JournalError> {
        let answer = self
            .request(methods::EFFECT_OUTCOME, params, effect_id)
            .await?;
        match answer.get("status").and_then(Value::as_str) {
            Some("completed") => Ok(Recorded::Completed(outcome_value(
                methods::EFFECT_OUTCOME,
                &answer,
            )?)),
            Some("uncertain") => Ok(Recorded::Uncertain),
            _ => Err(JournalError::BadAnswer {
                method: methods::EFFECT_OUTCOME,
                answer: answer.to_string(),
            }),
        }
    }

    /// `transcript.read {runId}` → `(cursor, entries)`.
    pub async fn read_transcript(&self) -> Result<(i64, Vec<Value>), JournalError> {
        let answer = self
            .request(
                methods::TRANSCRIPT_READ,
                json!({"runId": self.run_id}),
                "transcript",
            )
            .await?;
        let bad = || JournalError::BadAnswer {
            method: methods::TRANSCRIPT_READ,
            answer: truncate(&answer.to_string(), 200),
        };
        let cursor = answer
            .get("cursor")
            .and_then(Value::as_i64)
            .ok_or_else(bad)?;
        let entries = answer
            .get("entries")
            .and_then(Value::as_array)
            .ok_or_else(bad)?
            .clone();
        Ok((cursor, entries))
    }

    async fn request(
        &self,
        method: &'static str,
        params: Value,
        what: &str,
    ) -> Result<Value, JournalError> {
        let started = std::time::Instant::now();
        if self.cancel.is_cancelled() {
            return Err(JournalError::Stopped);
        }
        let result = tokio::select! {
            biased;
            _ = self.cancel.cancelled() => return Err(JournalError::Stopped),
            r = tokio::time::timeout(JOURNAL_TIMEOUT, async {
                let mut call = self.channel.call(method, params).await?;
                call.response().await
            }) => r,
        };
        tracing::debug!(%method, %what, ms = started.elapsed().as_secs_f64() * 1000.0, "journal request answered");
        match result {
            Err(_) => Err(JournalError::Timeout {
                method,
                secs: JOURNAL_TIMEOUT.as_secs(),
            }),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(CallError::Remote {
                code: ErrorCode::EffectDrift,
                ..
            })) => Err(JournalError::Drift {
                effect_id: what.to_owned(),
            }),
            Ok(Err(CallError::Remote {
                code: ErrorCode::TurnCancelled,
                message,
                ..
            })) => Err(JournalError::TurnCancelled(message)),
            // The run is another owner's now: it is stopped and released, never failed.
            Ok(Err(e)) if self.loss.as_ref().is_some_and(|l| l.check(method, &e)) => {
                Err(JournalError::Stopped)
            }
            Ok(Err(e)) => Err(JournalError::Call(e)),
        }
    }
}

/// `outcome.value` of a `completed` answer.
fn outcome_value(method: &'static str, answer: &Value) -> Result<Value, JournalError> {
    let outcome = answer
        .get("outcome")
        .ok_or_else(|| JournalError::BadAnswer {
            method,
            answer: truncate(&answer.to_string(), 200),
        })?;
    let body: OutcomeBody =
        serde_json::from_value(outcome.clone()).map_err(|_| JournalError::BadAnswer {
            method,
            answer: truncate(&answer.to_string(), 200),
        })?;
    Ok(body.value)
}

/// An answer in an error message: its start.
fn truncate(s: &str, max: usize) -> String {
    clip_chars(s, max).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn ids() -> SegmentIds {
        SegmentIds {
            session_id: "ses".into(),
            turn_id: "t1".into(),
            segment: 2,
            agent_id: "ag".into(),
            manifest_hash: "mh".into(),
        }
    }

    #[test]
    fn effect_ids_name_the_step_and_the_call() {
        let ids = ids();
        assert_eq!(ids.effect_id("model", &model_identity(0)), "t1:2:model:s0");
        assert_eq!(tool_identity(3, "call_ab-1.x"), "s3.call_ab-1.x");
        let odd = tool_identity(3, "toolu/01:é");
        assert!(odd.starts_with("s3.h") && odd.len() == 4 + 16, "{odd}");
        assert_eq!(odd, tool_identity(3, "toolu/01:é"));
        assert_ne!(odd, tool_identity(4, "toolu/01:é"));
        assert_eq!(tool_identity(1, &"x".repeat(129)).len(), 3 + 1 + 16);
        assert_eq!(ids.step_id(7), "step-2-7");
    }

    #[test]
    fn a_model_intent_is_hashed_with_its_input_and_sent_without_it() {
        let call = json!({"prompt": [], "tools": [], "executionId": "ses"});
        let intent = Intent::model(&ids(), 0, call.clone());
        let wire = intent.wire();
        assert_eq!(
            wire,
            json!({
                "effectId": "t1:2:model:s0", "sessionId": "ses", "turnId": "t1", "agentId": "ag",
                "manifestHash": "mh", "kind": "model",
                "context": {"invocationId": "step-2-0", "stepId": "step-2-0"},
            })
        );
        let mut with_input = wire.clone();
        with_input["input"] = call;
        assert_eq!(intent.hash(), request_hash(&with_input));
        assert_ne!(intent.hash(), request_hash(&wire));

        let tool = Intent::tool(
            &ids(),
            1,
            "c1",
            "bash",
            json!({"kind": "sandbox"}),
            json!({"command": "ls"}),
        );
        assert_eq!(
            tool.wire(),
            json!({
                "effectId": "t1:2:tool:s1.c1", "sessionId": "ses", "turnId": "t1", "agentId": "ag",
                "manifestHash": "mh", "kind": "tool", "toolName": "bash",
                "target": {"kind": "sandbox"}, "input": {"command": "ls"},
                "context": {"invocationId": "step-2-1", "callId": "c1", "stepId": "step-2-1"},
            })
        );
        assert_eq!(tool.hash(), request_hash(&tool.wire()));
    }
}
