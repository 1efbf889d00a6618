//! Turns: `podhost pod` running leased runs against the fake core's journal and the fake Model
//! Gate. This module holds the helpers and the whole-turn tests; `turn_*` hold the rest.

use podhost::nylorun::link::canonical::request_hash;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, FakeCore};
use crate::fake_gates::{self, FakeGates};
use crate::{PodDirs, PodProcess, pod_env, set_env};

pub use crate::turn_fixture::*;

/// The fake core, the fake gates and `podhost pod` (the real binary) between them.
pub struct Setup {
    pub core: FakeCore,
    pub gates: FakeGates,
    pub dirs: PodDirs,
    pub pod: PodProcess,
    pub conn: u64,
}

pub async fn setup(opts: CoreOptions) -> Setup {
    setup_with(opts, |_| {}).await
}

pub async fn setup_with(
    opts: CoreOptions,
    tweak: impl FnOnce(&mut Vec<(String, String)>),
) -> Setup {
    let core = FakeCore::start(opts).await;
    let gates = FakeGates::start(core.state.journal.clone()).await;
    let dirs = PodDirs::new(&core);
    let mut env = pod_env(&core, &dirs);
    set_env(&mut env, "NYLORUN_GATES_URL", &gates.url());
    tweak(&mut env);
    let pod = PodProcess::spawn(&env);
    let (_, conn, _) = core.wait_request(0, "hello").await;
    Setup {
        core,
        gates,
        dirs,
        pod,
        conn,
    }
}

/// Waits for the run's end (an output or a release) and checks core took it; `(method, params)`.
pub async fn wait_end(core: &FakeCore, run_id: &str) -> (String, Value) {
    let (frame, answer) = core.wait_run_end(run_id).await;
    // After a renewal answered `{ok: false}` core no longer holds the run, so it may refuse
    // the release that follows; an output it must take.
    if frame["m"] != "lease.release" {
        assert_eq!(answer["ok"], true, "core refused {frame}: {answer}");
    }
    (frame["m"].as_str().unwrap().to_owned(), frame["p"].clone())
}

#[tokio::test]
async fn a_full_turn_runs_bash_then_answers_with_every_frame_journaled() {
    let s = setup(CoreOptions::default()).await;
    let call = fake_gates::tool_call(
        "call_1",
        "bash",
        json!({"command": "echo hi > note.txt && cat note.txt"}),
    );
    let answer = fake_gates::text("The note says hi.");
    s.gates.script([call.clone(), answer.clone()]);
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Write a note.")));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");

    // The model saw the instructions, the tools and the message, then the tool's result.
    let calls = s.gates.calls();
    assert_eq!(calls.len(), 2);
    let user = json!({"kind": "message", "role": "user",
                      "content": [{"type": "text", "text": "Write a note."}]});
    let first_call = json!({
        "prompt": [
            {"kind": "instructions", "role": "system",
             "content": [{"type": "text", "text": sandbox_instructions()}]},
            user,
        ],
        "tools": sandbox_tools(),
        "executionId": SESSION,
    });
    assert_eq!(
        calls[0].body,
        json!({"effectId": "turn_1:0:model:s0", "invocationId": "step-0-0", "call": first_call})
    );
    let bash_output = json!({"exitCode": 0, "stdout": "hi\n", "stderr": ""});
    let mut second_call = first_call.clone();
    second_call["prompt"].as_array_mut().unwrap().extend([
        json!({"kind": "message", "role": "assistant", "content": [
                {"type": "tool-call", "id": "call_1", "name": "bash",
                 "args": {"command": "echo hi > note.txt && cat note.txt"}}]}),
        json!({"kind": "tool-result", "toolCallId": "call_1", "toolName": "bash",
                   "status": "completed",
                   "content": [{"type": "text", "text": bash_output.to_string()}]}),
    ]);
    assert_eq!(calls[1].body["call"], second_call);
    for c in &calls {
        assert_eq!(c.token.as_deref(), Some(TOKEN));
        assert_eq!(c.key, c.body["effectId"].as_str().map(str::to_owned));
        assert_eq!(
            c.traceparent.as_deref(),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
    }

    // Every frame podhost sent about the run.
    let bash_in = json!({"command": "echo hi > note.txt && cat note.txt"});
    let tool = tool_intent(0, 0, "call_1", "bash", bash_in.clone());
    let tool_value = json!({"kind": "completed", "output": bash_output});
    let (c0, c1) = (candidate_of(&call), candidate_of(&answer));
    let entries = vec![
        json!({"kind": "input", "turnId": TURN,
               "event": {"kind": "user-message", "text": "Write a note."}}),
        json!({"kind": "candidate", "turnId": TURN, "stepId": "step-0-0", "candidate": c0}),
        json!({"kind": "tool-results", "turnId": TURN, "stepId": "step-0-0", "results": [
            {"callId": "call_1", "toolName": "bash", "kind": "completed", "output": bash_output}]}),
        json!({"kind": "candidate", "turnId": TURN, "stepId": "step-0-1", "candidate": c1}),
        json!({"kind": "final", "turnId": TURN, "stepId": "step-0-1",
               "output": "The note says hi."}),
    ];
    let r = |p: Value| {
        let mut p = p;
        p["runId"] = json!("run-1");
        p
    };
    let expected = vec![
        (
            "effect.intent".to_owned(),
            r(json!({"effect": model_intent(0, 0),
            "requestHash": hash_with_input(&model_intent(0, 0), &first_call)})),
        ),
        (
            "effect.outcome".to_owned(),
            r(json!({"effectId": "turn_1:0:model:s0", "value": c0})),
        ),
        (
            "effect.intent".to_owned(),
            r(json!({"effect": tool, "requestHash": request_hash(&tool)})),
        ),
        (
            "effect.outcome".to_owned(),
            r(json!({"effectId": "turn_1:0:tool:s0.call_1",
                                                "value": tool_value})),
        ),
        (
            "effect.intent".to_owned(),
            r(json!({"effect": model_intent(0, 1),
            "requestHash": hash_with_input(&model_intent(0, 1), &second_call)})),
        ),
        (
            "effect.outcome".to_owned(),
            r(json!({"effectId": "turn_1:0:model:s1", "value": c1})),
        ),
        (
            "turn.completed".to_owned(),
            r(json!({
                "status": "completed",
                "output": "The note says hi.",
                "state": {"v": 1},
                "transcript": [{"keep": 0, "entries": entries, "length": 5}],
            })),
        ),
    ];
    assert_eq!(s.core.run_frames(s.conn, "run-1"), expected);
    assert_eq!(s.core.journal().transcript(SESSION).1, entries);
    assert_eq!(
        std::fs::read_to_string(s.dirs.workspace.join("note.txt")).unwrap(),
        "hi\n"
    );
    assert!(
        s.pod.logs().iter().all(|l| !l.contains(TOKEN)),
        "the run token reached a log line"
    );
}

#[tokio::test]
async fn sandbox_tools_are_not_offered_without_a_sandbox() {
    let s = setup(CoreOptions::default()).await;
    let mut ts = turn_start(json!("Touch a file."));
    ts["agent"] = json!({"id": AGENT, "kind": "virtual"});
    ts["routing"] = json!({"rootManifest": {}});
    s.gates.script([
        fake_gates::tool_call("c1", "bash", json!({"command": "touch x"})),
        fake_gates::text("I have no sandbox."),
    ]);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let calls = s.gates.calls();
    let names: Vec<&str> = calls[0].body["call"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["read_artifact"]);
    assert_eq!(
        calls[0].body["call"]["prompt"][0]["content"][0]["text"],
        format!(
            "{INSTRUCTIONS}\n\nTool results too large to show are stored as artifacts: the result \
             then says `truncated` and names its artifactId; read the rest with read_artifact."
        )
    );
    // The call is answered to the model without being journaled or run.
    assert_eq!(
        output["transcript"][0]["entries"][2]["results"],
        json!([{"callId": "c1", "toolName": "bash", "kind": "failed", "code": "tool.unknown",
                "message": "There is no tool named \"bash\". The tools are read_artifact."}])
    );
    let intents: Vec<String> = s
        .core
        .run_frames(s.conn, "run-1")
        .into_iter()
        .filter(|(m, _)| m == "effect.intent")
        .map(|(_, p)| p["effect"]["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(intents, ["model", "model"]);
    assert!(!s.dirs.workspace.join("x").exists());
}

#[tokio::test]
async fn traceparent_and_the_session_environment_reach_a_command() {
    let s = setup(CoreOptions::default()).await;
    let cmd = json!({"command": "printf '%s|%s' \"$TRACEPARENT\" \"$SESSION_VAR\""});
    s.gates.script([
        fake_gates::tool_call("c1", "bash", cmd.clone()),
        fake_gates::tool_call("c2", "bash", cmd.clone()),
        fake_gates::text("done"),
    ]);
    // The second call's intent answer carries its own span context, which wins.
    let span = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01";
    s.core.journal().script_intent(
        "turn_1:0:tool:s1.c2",
        json!({"status": "execute", "traceparent": span}),
    );
    s.core.grant_turn("run-1", TOKEN, turn_start(json!("env")));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let stdout = |entry: usize| {
        output["transcript"][0]["entries"][entry]["results"][0]["output"]["stdout"].clone()
    };
    assert_eq!(
        stdout(2),
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01|session-value"
    );
    assert_eq!(stdout(4), format!("{span}|session-value"));
}

#[tokio::test]
async fn messages_input_writes_one_input_entry_per_message() {
    let s = setup(CoreOptions::default()).await;
    let input = json!({"kind": "messages", "messages": [
        "My name is Ada.",
        {"text": "What is my name?", "metadata": {"via": "queue"}},
    ]});
    s.core.grant_turn("run-1", TOKEN, turn_start(input));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    // The fixture model remembers the first of several user messages.
    assert_eq!(output["output"], "I remember: My name is Ada.");
    let entries = &output["transcript"][0]["entries"];
    assert_eq!(
        entries[0],
        json!({"kind": "input", "turnId": TURN, "event": {"kind": "user-message", "text": "My name is Ada."}})
    );
    assert_eq!(
        entries[1],
        json!({"kind": "input", "turnId": TURN, "event": {"kind": "user-message",
               "text": "What is my name?", "metadata": {"via": "queue"}}})
    );
    let prompt = &s.gates.calls()[0].body["call"]["prompt"];
    assert_eq!(prompt.as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_turn_start_podhost_cannot_run_fails_clearly() {
    let s = setup(CoreOptions::default()).await;
    let mut flow = turn_start(json!("x"));
    flow["engine"] = json!("flow");
    s.core.grant_turn("run-flow", TOKEN, flow);
    assert_eq!(
        wait_end(&s.core, "run-flow").await,
        (
            "turn.failed".to_owned(),
            json!({"runId": "run-flow", "status": "failed", "state": {"v": 1},
                   "error": {"code": "turn_start.unsupported",
                             "message": "podhost runs agent turns only; flows run in Nylorun's own harness"}})
        )
    );
    // A TurnStart that does not parse.
    s.core.grant("run-bad", "tok");
    assert_eq!(
        wait_end(&s.core, "run-bad").await,
        (
            "turn.failed".to_owned(),
            json!({"runId": "run-bad", "status": "failed", "state": {"v": 1},
                   "error": {"code": "turn_start.invalid",
                             "message": "podhost cannot read this TurnStart: missing field `checkpoint`"}})
        )
    );
    // An approval for a segment podhost never left waiting.
    let approve = turn_start(
        json!({"kind": "approve", "interactionId": "turn_1:0:tool:s0.c1", "approved": true}),
    );
    let mut approve = approve;
    approve["type"] = json!("approval.answer");
    s.core.grant_turn("run-approve", "tok-2", approve);
    let (_, p) = wait_end(&s.core, "run-approve").await;
    assert_eq!(
        p["error"],
        json!({"code": "turn_start.unsupported",
               "message": "podhost cannot pair the approval of turn_1:0:tool:s0.c1: its state holds no waiting segment of turn turn_1"})
    );
    assert!(s.gates.calls().is_empty());
}
