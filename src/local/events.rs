//! `podhost run --json`: the events of a run, one JSON object per line on stdout.
//!
//! Owns: the [`Event`] wire types and their JSON Lines form. The contract is the JSON Schema in
//! `schemas/run-events.v1.json` ([`SCHEMA_ID`]); README.md documents it and the tests validate
//! every event a run prints against it.
//!
//! Invariants:
//! * Every line is one whole JSON object with `type` (what happened) and `elapsed_ms` (since the
//!   run started); the first is `run.started`, the last `run.finished`, also when the run fails
//!   or is stopped by a signal.
//! * Fields are added to a version compatibly (a new optional field, a new event type); a change
//!   that breaks a reader makes a new schema file and a new [`SCHEMA_ID`].
//! * No secret: the API key is never in an event, only the name of the variable it came from.
//!
//! Non-goals: rendering for people (`render`).

use serde::Serialize;
use serde_json::Value;

/// The schema every event line follows; `run.started` names it.
pub const SCHEMA_ID: &str = "urn:podhost:schema:run-events:v1";

/// The schema itself, as shipped in `schemas/`.
pub const SCHEMA: &str = include_str!("../../schemas/run-events.v1.json");

/// Token counts of a model call or a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tokens {
    /// Prompt tokens, when the server reported them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<u64>,
    /// Completion tokens, when the server reported them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<u64>,
}

/// How a run ended, in `run.finished`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The model answered: exit 0.
    Completed,
    /// The agent asked a question there was no terminal to answer.
    InputRequired,
    /// `--max-steps` model calls without an answer.
    StepLimit,
    /// The model call failed, or the model ended without an answer.
    ModelFailed,
    /// Stopped by SIGINT.
    Interrupted,
    /// Stopped by SIGTERM.
    Terminated,
    /// A fault of podhost.
    Error,
}

/// The totals of a run, in `run.finished` (and the human summary line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Model calls made.
    pub model_calls: u32,
    /// Tool calls answered.
    pub tool_calls: u32,
    /// Prompt tokens over all calls (those the server reported).
    pub input_tokens: u64,
    /// Completion tokens over all calls (those the server reported).
    pub output_tokens: u64,
    /// Wall time of the run.
    pub duration_ms: u64,
}

/// One thing that happened in a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum Event {
    /// The run started: what it talks to, and where each setting came from.
    #[serde(rename = "run.started")]
    RunStarted {
        /// [`SCHEMA_ID`].
        schema: &'static str,
        /// podhost's version.
        version: &'static str,
        /// This run's id (a UUID), in `run.finished` too.
        run_id: String,
        model: String,
        base_url: String,
        /// Where the base URL came from: `--base-url` (or `PODHOST_BASE_URL`),
        /// `OPENAI_BASE_URL`, or `default`.
        base_url_from: String,
        /// The variable the API key was read from; absent when no key is sent.
        #[serde(skip_serializing_if = "Option::is_none")]
        api_key_from: Option<String>,
        /// The workspace directory.
        workspace: String,
        /// The directory podhost was started in.
        cwd: String,
        /// The names of the tools offered to the model.
        tools: Vec<String>,
        max_steps: u32,
        /// Whether answers are streamed.
        stream: bool,
        /// Where instructions beyond podhost's own came from (`AGENTS.md`, `--system`).
        instructions: Vec<String>,
        /// Variables commands do not get because their names look like credentials.
        withheld_env: Vec<String>,
    },
    /// A model call began (`step` counts model calls from 1).
    #[serde(rename = "model_call.started")]
    ModelCallStarted { step: u32 },
    /// Bytes of the answer received so far (streamed answers; at most about once a second).
    #[serde(rename = "model_call.progress")]
    ModelCallProgress { step: u32, received_bytes: u64 },
    /// A model call ended.
    #[serde(rename = "model_call.finished")]
    ModelCallFinished {
        step: u32,
        /// `ok`, `failed` or `cancelled`.
        status: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        finish_reason: Option<String>,
        tokens: Tokens,
        /// Tool calls in the answer.
        tool_calls: u32,
        /// Why it failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        duration_ms: u64,
    },
    /// Text the model wrote (`final`: the answer, with no tool call after it).
    #[serde(rename = "message")]
    Message {
        step: u32,
        role: &'static str,
        text: String,
        #[serde(rename = "final")]
        is_final: bool,
    },
    /// A tool call began.
    #[serde(rename = "tool_call.started")]
    ToolCallStarted {
        step: u32,
        call_id: String,
        tool: String,
        /// The arguments; `null` when the model's were not a JSON object.
        input: Value,
    },
    /// A tool call ended.
    #[serde(rename = "tool_call.finished")]
    ToolCallFinished {
        step: u32,
        call_id: String,
        tool: String,
        /// `completed`, `failed`, `denied`, or `input_required` (an `ask_user` there was no
        /// terminal to answer: the run ends asking it).
        status: &'static str,
        /// The tool's output (a string, or an object for bash, write and edit).
        #[serde(skip_serializing_if = "Option::is_none")]
        output: Option<Value>,
        /// The failure's code (`sandbox.*`, `tool.*`).
        #[serde(skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        /// The failure's message.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        duration_ms: u64,
    },
    /// The run ended; always the last line.
    #[serde(rename = "run.finished")]
    RunFinished {
        /// The id `run.started` named.
        run_id: String,
        status: RunStatus,
        /// The process's exit code.
        exit_code: i32,
        /// The final answer (status `completed`).
        #[serde(skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
        /// The questions left unanswered (status `input_required`).
        #[serde(skip_serializing_if = "Option::is_none")]
        questions: Option<Vec<String>>,
        /// Why the run did not complete.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        summary: Summary,
    },
}

/// An event with its time, as one line is written.
#[derive(Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    event: &'a Event,
    elapsed_ms: u64,
}

/// The JSON line of `event` (without the newline).
pub fn line(event: &Event, elapsed_ms: u64) -> String {
    serde_json::to_string(&Line { event, elapsed_ms }).unwrap_or_else(|e| {
        // Serializing these types cannot fail (string keys, no maps of other keys); should it,
        // the line still is JSON and says why.
        serde_json::json!({"type": "error", "elapsed_ms": elapsed_ms, "error": e.to_string()})
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn events_are_flat_objects_with_their_type_and_time() {
        let e = Event::ToolCallFinished {
            step: 2,
            call_id: "c1".into(),
            tool: "bash".into(),
            status: "completed",
            output: Some(json!({"exitCode": 0, "stdout": "hi\n", "stderr": ""})),
            code: None,
            error: None,
            duration_ms: 12,
        };
        let v: Value = serde_json::from_str(&line(&e, 40)).unwrap();
        assert_eq!(
            v,
            json!({"type": "tool_call.finished", "step": 2, "call_id": "c1", "tool": "bash",
                   "status": "completed", "output": {"exitCode": 0, "stdout": "hi\n", "stderr": ""},
                   "duration_ms": 12, "elapsed_ms": 40})
        );
    }

    #[test]
    fn the_shipped_schema_is_json_and_names_itself() {
        let schema: Value = serde_json::from_str(SCHEMA).unwrap();
        assert_eq!(schema["$id"], SCHEMA_ID);
    }
}
