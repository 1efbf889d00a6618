//! A tool call's outcome in the turn: typed ([`ResultOutcome`]) wherever podhost makes or reads
//! one, JSON only on the wire.
//!
//! Owns: [`Produced`], what running a call produced, which the segment serializes once, where it
//! reports it (`effect.outcome`, v5 §4); and [`recorded`], the outcome core recorded (replayed
//! or answered) as the model and the transcript's `tool-results` entry take it.
//!
//! Invariants:
//! * An outcome is serialized once, right before it is fitted to the record and journaled; the
//!   model is told what core recorded, never podhost's own copy, so a replay tells it the same.
//! * A recorded value that is not a `{kind: completed | denied | failed, …}` outcome (a spilled
//!   stub, a plain output an earlier build recorded) is the call's completed output, as is.
//!
//! Non-goals: fitting an outcome to the record ([`super::spill`], [`super::toolgate::results`]).

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use crate::agent::model::ResultOutcome;

/// What running a tool call produced, before it is journaled.
#[derive(Clone, Debug, PartialEq)]
pub enum Produced {
    /// An outcome podhost made: fitted to the call's share of the record (the spill), then
    /// journaled.
    Outcome(ResultOutcome),
    /// An outcome journaled as it is: a short failure podhost wrote (a gate's refusal, a tool
    /// core runs) that needs no fitting.
    Exact(ResultOutcome),
    /// An MCP or HTTP answer, already fitted to the step's budget as JSON
    /// ([`super::toolgate::results`]).
    Shaped(Value),
    /// podhost could not learn what the call did: journaled as `{error}`, its fate unknown.
    Unknown(String),
}

/// An outcome serde could not turn into JSON.
#[derive(Debug, thiserror::Error)]
#[error("could not encode an outcome: {0}")]
pub struct EncodeError(#[from] serde_json::Error);

/// An outcome as it is journaled.
pub fn to_value(outcome: &ResultOutcome) -> Result<Value, EncodeError> {
    Ok(serde_json::to_value(outcome)?)
}

/// A recorded value as it reads: a tool's outcome, or any other value.
#[derive(Deserialize)]
#[serde(untagged)]
enum Recorded {
    Told(ResultOutcome),
    Plain(IgnoredAny),
}

/// A recorded tool outcome as the model is told: a `{kind: completed | denied | failed, …}`
/// value as such, anything else (a spilled stub, a plain output) as a completed output.
pub fn recorded(value: Value) -> ResultOutcome {
    match Recorded::deserialize(&value) {
        Ok(Recorded::Told(outcome)) => outcome,
        Ok(Recorded::Plain(_)) | Err(_) => ResultOutcome::Completed {
            output: value,
            files: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn recorded_tool_outcomes_read_as_results() {
        assert_eq!(
            recorded(json!({"kind": "failed", "code": "tool.denied", "message": "no"})),
            ResultOutcome::failed("tool.denied", "no")
        );
        assert_eq!(
            recorded(json!({"kind": "denied", "reason": "policy"})),
            ResultOutcome::Denied {
                reason: "policy".into()
            }
        );
        // A spilled stub, or any plain value, is what the call produced.
        let stub = json!({"truncated": true, "artifactId": "a1", "size": 9, "preview": "…"});
        assert_eq!(
            recorded(stub.clone()),
            ResultOutcome::Completed {
                output: stub,
                files: None
            }
        );
        for odd in [
            json!({"kind": "completed"}),
            json!({"kind": 3}),
            json!("text"),
        ] {
            assert_eq!(
                recorded(odd.clone()),
                ResultOutcome::Completed {
                    output: odd,
                    files: None
                }
            );
        }
    }

    #[test]
    fn an_outcome_is_journaled_as_the_wire_has_it() {
        let cases = [
            (
                ResultOutcome::Completed {
                    output: json!({"exitCode": 0}),
                    files: None,
                },
                json!({"kind": "completed", "output": {"exitCode": 0}}),
            ),
            (
                ResultOutcome::failed("tool.unavailable", "no"),
                json!({"kind": "failed", "code": "tool.unavailable", "message": "no"}),
            ),
        ];
        for (outcome, expected) in cases {
            let value = to_value(&outcome).unwrap();
            assert_eq!(value, expected);
            assert_eq!(recorded(value), outcome);
        }
    }
}
