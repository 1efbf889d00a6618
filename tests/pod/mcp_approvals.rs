//! A call the tool policy holds for a person (v5 §4, §7): the segment waits on it; once answered,
//! core runs the same segment again (`approval.answer`, nothing more than v5 says) and the held
//! call's intent answers `execute` (approved) or `completed` with `tool.denied` (denied).

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_gates;
use crate::mcp::{SESSION, TOKEN, TURN, intents_of, mcp_setup, mcp_turn_start, outcome_of};
use crate::turn::wait_end;

const EFFECT: &str = "turn_1:0:tool:s0.c1";

/// Runs the held segment to its `turn.waiting`; returns the TurnStart core sends once a person
/// answered `approved`.
async fn held(m: &crate::mcp::McpSetup, approved: bool, after: &str) -> Value {
    let s = &m.s;
    s.core
        .journal()
        .script_intent(EFFECT, json!({"status": "pending"}));
    s.gates.script([
        fake_gates::tool_call("c1", "py__tick", json!({})),
        fake_gates::text(after),
    ]);
    let ts = mcp_turn_start(json!("Tick, if allowed."), json!([{"name": "py"}]));
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let (method, waiting) = wait_end(&s.core, "run-1").await;
    assert_eq!(
        (method, waiting.clone()),
        (
            "turn.waiting".to_owned(),
            json!({"runId": "run-1", "status": "waiting", "effectIds": [EFFECT],
                   "state": {"v": 1, "turnId": TURN, "input": "Tick, if allowed."}})
        )
    );
    assert!(s.gates.toolgate.requests_of("tool-calls").is_empty());

    s.core.journal().answer_approval(EFFECT, approved);
    // The session recorded its MCP facts: core's next TurnStart carries them.
    let mut ts = ts;
    ts["mcp"] = s.core.journal().mcp_facts(SESSION).unwrap();
    s.core.journal().approval_turn(&ts, &waiting)
}

#[tokio::test]
async fn an_approved_call_runs_when_the_segment_runs_again() {
    let m = mcp_setup().await;
    let s = &m.s;
    let approval = held(&m, true, "Ticked.").await;
    assert_eq!(approval["type"], "approval.answer");
    assert_eq!(approval["checkpoint"]["segment"], 0);
    assert_eq!(approval["checkpoint"]["input"], "Tick, if allowed.");
    s.core.grant_turn("run-2", "run-token-2", approval);
    let (method, done) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{done}");
    assert_eq!(done["output"], "Ticked.");

    // The model call replayed; the held call was asked again with the same id and hash.
    let first = intents_of(s, s.conn, "run-1");
    let second = intents_of(s, s.conn, "run-2");
    assert_eq!(second[0], first[1]);
    assert_eq!(second[1].0, "turn_1:0:model:s1");
    assert_eq!(s.gates.toolgate.executions(EFFECT), 1);
    assert_eq!(
        outcome_of(s, s.conn, "run-2", EFFECT),
        json!({"kind": "completed", "output": {"content": [{"type": "text", "text": "tick 1"}],
               "structuredContent": {"result": "tick 1"}}})
    );
    // No discovery again, and the transcript starts from the segment's own input.
    assert_eq!(s.core.journal().mcp_reports().len(), 1);
    assert_eq!(
        done["transcript"][0]["entries"][0]["event"],
        json!({"kind": "user-message", "text": "Tick, if allowed."})
    );
}

#[tokio::test]
async fn a_denied_call_is_a_failure_the_model_reads() {
    let m = mcp_setup().await;
    let s = &m.s;
    let approval = held(&m, false, "I was not allowed to.").await;
    s.core.grant_turn("run-2", "run-token-2", approval);
    let (method, done) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{done}");
    assert_eq!(done["output"], "I was not allowed to.");
    assert!(s.gates.toolgate.requests_of("tool-calls").is_empty());
    assert_eq!(
        done["transcript"][0]["entries"][2]["results"],
        json!([{"callId": "c1", "toolName": "py__tick", "kind": "failed", "code": "tool.denied",
                "message": "A person denied this call."}])
    );
    let first = intents_of(s, s.conn, "run-1");
    let second = intents_of(s, s.conn, "run-2");
    assert_eq!(second[0], first[1]);
    // The model saw the denial.
    let last = s.gates.calls().last().unwrap().body["call"]["prompt"].clone();
    let result = last.as_array().unwrap().last().unwrap().clone();
    assert_eq!(result["status"], "failed");
    assert_eq!(result["toolName"], "py__tick");
}
