//! A journal recorded by an earlier build: replayed by this one, it must ask for nothing, run
//! nothing and report the same bytes, and a fresh run of the same script must journal the same
//! frames.
//!
//! The fixture (`fixtures/recorded-journal.json`) holds a session's transcript (a previous turn
//! with every entry kind and outcome shape), the TurnStart of the next turn, the frames a first
//! run of it sent and the outcomes core completed. The turn: one step calling `bash` twice (a
//! small output, and one large enough to be spilled) and a tool podhost does not offer, then an
//! answer. To record it again, run the ignored `record_the_journal_fixture`, then review the
//! diff: a change in it is a change on the wire.

use std::path::PathBuf;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::CoreOptions;
use crate::fake_gates::{self, Reply};
use crate::turn::{SESSION, TOKEN, TURN, setup, turn_start, wait_end};

fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/pod/fixtures/recorded-journal.json")
}

fn fixture() -> Value {
    let text = std::fs::read_to_string(fixture_path()).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The previous turn, as core stores it: every entry kind, and results completed (with files),
/// failed, denied and spilled.
fn previous_turn() -> Vec<Value> {
    let t = "turn_0";
    vec![
        json!({"kind": "compaction", "turnId": t, "stepId": "step-0-0",
               "summary": "The user asked for a report.", "trigger": "threshold",
               "tokensBefore": 9000, "tokensAfter": 400}),
        json!({"kind": "input", "turnId": t, "event": {"kind": "user-message", "content": [
            {"type": "text", "text": "Look at this."},
            {"type": "media", "mediaType": "image/png",
             "reference": {"artifactId": "art_img", "version": 1, "name": "chart.png"}}]}}),
        json!({"kind": "input", "turnId": t, "event": {"kind": "interrupt", "text": "Faster."}}),
        json!({"kind": "candidate", "turnId": t, "stepId": "step-0-1", "candidate": {
            "output": [
                {"type": "reasoning", "text": "hidden"},
                {"type": "reasoning", "text": "kept", "providerMetadata": {"sig": "s1"}},
                {"type": "reasoning", "text": "this turn only",
                 "providerMetadata": {"replay": "turn"}},
                {"type": "text", "text": "Checking.", "providerMetadata": {"id": "m1"}},
                {"type": "json", "value": {"a": [1, 2]}},
                {"type": "tool-call", "id": "p1", "name": "bash", "args": {"command": "ls"}},
                {"type": "tool-call", "id": "p2", "name": "read", "args": {"path": "x"}},
                {"type": "tool-call", "id": "p3", "name": "mcp__docs__search",
                 "args": {"q": "y"}},
                {"type": "tool-call", "id": "p4", "name": "bash", "args": {"command": "seq 1 9"}},
            ],
            "finishReason": "tool-calls", "usage": {"inputTokens": 3, "outputTokens": 4}}}),
        json!({"kind": "tool-results", "turnId": t, "stepId": "step-0-1", "results": [
            {"callId": "p1", "toolName": "bash", "kind": "completed",
             "output": {"exitCode": 0, "stdout": "a\n", "stderr": ""},
             "files": [{"mediaType": "image/png",
                        "reference": {"artifactId": "art_out", "version": 2}}]},
            {"callId": "p2", "toolName": "read", "kind": "failed", "code": "tool.not_found",
             "message": "no such file", "retryable": false},
            {"callId": "p3", "toolName": "mcp__docs__search", "kind": "denied",
             "reason": "policy"},
            {"callId": "p4", "toolName": "bash", "kind": "completed",
             "output": {"truncated": true, "artifactId": "art_big", "size": 90000,
                        "preview": "1\n2\n"}},
        ]}),
        json!({"kind": "candidate", "turnId": t, "stepId": "step-0-2", "candidate": {
            "output": [{"type": "text", "text": "Done before."}],
            "finishReason": "stop"}}),
        json!({"kind": "final", "turnId": t, "stepId": "step-0-2", "output": "Done before."}),
    ]
}

/// The model's script for the recorded turn.
fn script() -> Vec<Reply> {
    let calls = json!([
        {"type": "reasoning", "text": "plan", "providerMetadata": {"replay": "turn"}},
        {"type": "tool-call", "id": "c1", "name": "bash",
         "args": {"command": "echo hi > note.txt && cat note.txt"}},
        {"type": "tool-call", "id": "c2", "name": "bash",
         "args": {"command": "head -c 60000 /dev/zero | tr '\\0' b"}},
        {"type": "tool-call", "id": "c3", "name": "no_such_tool", "args": {}},
    ]);
    vec![
        Reply::Outcome(json!({"output": calls, "finishReason": "tool-calls",
                              "usage": {"inputTokens": 10, "outputTokens": 5}})),
        fake_gates::text("All three are done."),
    ]
}

/// Runs the recorded turn against a fresh core and gates: `(turnStart, frames, outcomes)`.
async fn run_fresh() -> (Value, Vec<(String, Value)>, Value) {
    let s = setup(CoreOptions::default()).await;
    let cursor = s.core.journal().seed_transcript(SESSION, previous_turn());
    let mut ts = turn_start(json!("Write a note, then a big one."));
    ts["transcript"] = json!({"cursor": cursor});
    // Small enough that the large output is spilled.
    ts["limits"]["recordEntryBytes"] = json!(40000);
    s.gates.script(script());
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let frames = s.core.run_frames(s.conn, "run-1");
    let outcomes = json!(s.core.journal().completed_outcomes(TURN, 0));
    (ts, frames, outcomes)
}

fn frames_json(frames: &[(String, Value)]) -> Value {
    frames.iter().map(|(m, p)| json!([m, p])).collect()
}

#[tokio::test]
#[ignore = "writes the fixture; run by hand, then review the diff"]
async fn record_the_journal_fixture() {
    let (ts, frames, outcomes) = run_fresh().await;
    let recorded = json!({
        "transcript": previous_turn(),
        "turnStart": ts,
        "frames": frames_json(&frames),
        "outcomes": outcomes,
    });
    let path = fixture_path();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let text = serde_json::to_string_pretty(&recorded).unwrap();
    std::fs::write(&path, text + "\n").unwrap();
}

#[tokio::test]
async fn a_recorded_journal_replays_to_the_same_output_running_nothing() {
    let recorded = fixture();
    let s = setup(CoreOptions::default()).await;
    let entries = recorded["transcript"].as_array().unwrap().clone();
    let cursor = s.core.journal().seed_transcript(SESSION, entries);
    let mut ts = recorded["turnStart"].clone();
    ts["transcript"] = json!({"cursor": cursor});
    ts["outcomes"] = recorded["outcomes"].clone();
    s.core.grant_turn("run-2", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{output}");
    // Every effect was replayed from its recorded outcome (a drifted hash would fail the
    // turn), and the output is the one the recording reported.
    let reads = |frames: &Value, run_id: &str| -> Vec<Value> {
        let frames = frames.as_array().unwrap();
        frames
            .iter()
            .filter(|f| matches!(f[0].as_str(), Some("transcript.read" | "artifact.read")))
            .chain(frames.last())
            .map(|f| {
                let mut f = f.clone();
                f[1]["runId"] = json!(run_id);
                f
            })
            .collect()
    };
    let replayed = frames_json(&s.core.run_frames(s.conn, "run-2"));
    assert_eq!(replayed, json!(reads(&recorded["frames"], "run-2")));
    assert!(s.gates.calls().is_empty());
    assert!(!s.dirs.workspace.join("note.txt").exists());
}

#[tokio::test]
async fn a_fresh_run_journals_the_recorded_frames() {
    let recorded = fixture();
    let (ts, frames, outcomes) = run_fresh().await;
    let mut expected_ts = recorded["turnStart"].clone();
    expected_ts["transcript"] = ts["transcript"].clone();
    assert_eq!(ts, expected_ts);
    assert_eq!(frames_json(&frames), recorded["frames"]);
    assert_eq!(outcomes, recorded["outcomes"]);
}
