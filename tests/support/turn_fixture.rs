//! The turn both the pod tests and the image tests grant: its TurnStart, the model-facing
//! instructions and tools it leads to, and the effects a turn of it journals.
#![allow(dead_code)]

use podhost::nylorun::link::canonical::request_hash;
use serde_json::{Value, json};

use crate::fake_gates::Reply;

pub const SESSION: &str = "ses_1";
pub const TURN: &str = "turn_1";
pub const AGENT: &str = "agent_1";
/// The run token of the runs the tests grant.
pub const TOKEN: &str = "run-token-1";
pub const INSTRUCTIONS: &str = "You are a careful helper.";
pub const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// A TurnStart of an agent with a sandbox, for `input`, at segment 0 with no transcript.
pub fn turn_start(input: Value) -> Value {
    json!({
        "type": "turn.start",
        "engine": "agent",
        "manifest": {"id": "helper", "instructions": INSTRUCTIONS, "skills": []},
        "definition": {"name": "helper", "version": 3},
        "checkpoint": {"sessionId": SESSION, "turnId": TURN, "segment": 0,
                       "manifestHash": "mh_1", "input": input},
        "outcomes": [],
        "transcript": {"cursor": -1},
        "routing": {"rootManifest": {"name": "helper"},
                    "sandbox": {"ownerId": SESSION, "environmentId": AGENT,
                                "environment": {"SESSION_VAR": "session-value"}}},
        "agent": {"id": AGENT, "kind": "pod", "sandbox": {"workspace": "/workspace"}},
        "options": {"fixtureModel": true},
        "trace": {"traceparent": TRACEPARENT},
        "limits": {"recordEntryBytes": 983040, "harnessStateBytes": 262144},
        "model": {"provider": "fixture", "id": "fixture-1", "inputs": ["text", "image"],
                  "contextWindow": 100000, "maxOutputTokens": 4096},
    })
}

/// The model-facing instructions of [`turn_start`].
pub fn sandbox_instructions() -> String {
    format!(
        "{INSTRUCTIONS}\n\nYou have an isolated Linux sandbox with a persistent working directory \
         at /workspace. Use bash to run commands, read, write and edit to work with files, and \
         grep and glob to search. Network egress is limited by policy; a failed download usually \
         means the host is not allowed.\nFiles you write under /workspace/outputs reach the user \
         too: when your turn ends, they become the session's outputs folder.\n\nTool results too \
         large to show are stored as artifacts: the result then says `truncated` and names its \
         artifactId; read the rest with read_artifact."
    )
}

/// The tools offered with a sandbox: a pod offers no background processes.
pub fn sandbox_tools() -> Vec<Value> {
    podhost::tools::ToolName::ALL
        .iter()
        .map(|t| t.definition_without_background())
        .chain(std::iter::once(
            podhost::nylorun::artifacts::read_artifact_definition(),
        ))
        .map(|d| json!({"name": d.name, "description": d.description, "inputSchema": d.input_schema}))
        .collect()
}

/// The hash core recomputes (or, for a model effect, the one podhost must have sent).
pub fn hash_with_input(intent: &Value, input: &Value) -> String {
    let mut full = intent.clone();
    full["input"] = input.clone();
    request_hash(&full)
}

pub fn model_intent(segment: u32, step: u32) -> Value {
    let step_id = format!("step-{segment}-{step}");
    json!({
        "effectId": format!("{TURN}:{segment}:model:s{step}"),
        "sessionId": SESSION, "turnId": TURN, "agentId": AGENT, "manifestHash": "mh_1",
        "kind": "model",
        "context": {"invocationId": step_id, "stepId": step_id},
    })
}

pub fn tool_intent(segment: u32, step: u32, call_id: &str, tool: &str, input: Value) -> Value {
    let step_id = format!("step-{segment}-{step}");
    json!({
        "effectId": format!("{TURN}:{segment}:tool:s{step}.{call_id}"),
        "sessionId": SESSION, "turnId": TURN, "agentId": AGENT, "manifestHash": "mh_1",
        "kind": "tool", "toolName": tool, "target": {"kind": "sandbox"}, "input": input,
        "context": {"invocationId": step_id, "callId": call_id, "stepId": step_id},
    })
}

pub fn candidate_of(reply: &Reply) -> Value {
    match reply {
        Reply::Outcome(o) => o.clone(),
        other => panic!("{other:?}"),
    }
}
