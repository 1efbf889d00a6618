//! Turns in the image: the pod host in a container of the image runs a journaled agent turn
//! against the fake core and the fake Model Gate on the host's 127.0.0.1. Its bash runs in the
//! container (uid 1000, confined) and what it writes under `/workspace/outputs` reaches the fake
//! artifact store as the session's outputs folder; core's `workspace.exec` then finds the files
//! where the turn left them. `turn_stop` holds the shutdown and the tokens.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::fake_core::{CoreOptions, FakeCore};
use crate::fake_gates::{self, FakeGates};
use crate::fake_journal::Status;
use crate::fixture::image;
use crate::pod_host::PodHost;

pub use crate::turn_fixture::*;
use podhost::nylorun::link::canonical::request_hash;

/// The fake core, the fake gates and a pod host in a container of the image between them.
pub struct TurnPod {
    pub core: FakeCore,
    pub gates: FakeGates,
    pub pod: PodHost,
    pub conn: u64,
}

/// Starts the fakes and the pod with `extra` pod variables; waits for `hello`. `None` when the
/// image tests are skipped.
pub async fn turn_pod(extra: &[(&str, &str)]) -> Option<TurnPod> {
    let image = image().await?;
    let core = FakeCore::start(CoreOptions::default()).await;
    let gates = FakeGates::start(core.state.journal.clone()).await;
    let pod = PodHost::start_with(image, &core.url(), &gates.url(), extra).await;
    let (_, conn, _) = core.wait_request(0, "hello").await;
    Some(TurnPod {
        core,
        gates,
        pod,
        conn,
    })
}

/// Waits for the run's end (an output or a release) and checks core took it; `(method, params)`.
pub async fn wait_end(core: &FakeCore, run_id: &str) -> (String, Value) {
    let (frame, answer) = core.wait_run_end(run_id).await;
    assert_eq!(answer["ok"], true, "core refused {frame}: {answer}");
    (frame["m"].as_str().unwrap().to_owned(), frame["p"].clone())
}

/// With the run id added.
pub fn of_run(run_id: &str, mut params: Value) -> Value {
    params["runId"] = json!(run_id);
    params
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

const OUTPUTS_COMMAND: &str = "mkdir -p /workspace/outputs/sub && echo report > \
                               /workspace/outputs/report.txt && echo deep > \
                               /workspace/outputs/sub/deep.txt";

#[tokio::test]
async fn a_turn_runs_bash_in_the_container_and_its_outputs_become_the_outputs_folder() {
    let Some(t) = turn_pod(&[]).await else { return };
    let call = fake_gates::tool_call("call_1", "bash", json!({"command": OUTPUTS_COMMAND}));
    let answer = fake_gates::text("The report is in your outputs folder.");
    t.gates.script([call.clone(), answer.clone()]);
    t.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Write the report.")));
    let (method, output) = wait_end(&t.core, "run-1").await;
    assert_eq!(
        method,
        "turn.completed",
        "{output}\nlogs:\n{}",
        t.pod.container.logs().await
    );

    // The model saw the sandbox's instructions and tools, then the command's result.
    let calls = t.gates.calls();
    assert_eq!(calls.len(), 2);
    let first_call = json!({
        "prompt": [
            {"kind": "instructions", "role": "system",
             "content": [{"type": "text", "text": sandbox_instructions()}]},
            {"kind": "message", "role": "user",
             "content": [{"type": "text", "text": "Write the report."}]},
        ],
        "tools": sandbox_tools(),
        "executionId": SESSION,
    });
    assert_eq!(calls[0].body["call"], first_call);
    let bash_output = json!({"exitCode": 0, "stdout": "", "stderr": ""});
    let mut second_call = first_call.clone();
    second_call["prompt"].as_array_mut().unwrap().extend([
        json!({"kind": "message", "role": "assistant", "content": [
                {"type": "tool-call", "id": "call_1", "name": "bash",
                 "args": {"command": OUTPUTS_COMMAND}}]}),
        json!({"kind": "tool-result", "toolCallId": "call_1", "toolName": "bash",
               "status": "completed",
               "content": [{"type": "text", "text": bash_output.to_string()}]}),
    ]);
    assert_eq!(calls[1].body["call"], second_call);
    let tokens: Vec<Option<&str>> = calls.iter().map(|c| c.token.as_deref()).collect();
    assert_eq!(tokens, [Some(TOKEN), Some(TOKEN)]);

    // The outputs folder: one version with exactly the two files.
    let folders = t.core.artifacts().list(SESSION);
    assert_eq!(folders.len(), 1, "{folders:#?}");
    let folder = &folders[0];
    assert_eq!(
        (&folder["kind"], &folder["name"], &folder["version"]),
        (&json!("folder"), &json!("outputs"), &json!(1)),
        "{folder}"
    );
    let folder_id = folder["artifactId"].as_str().unwrap();
    assert_eq!(
        t.core.artifacts().folder_files(SESSION, folder_id, 1),
        vec![
            ("report.txt".to_owned(), 7, sha(b"report\n")),
            ("sub/deep.txt".to_owned(), 5, sha(b"deep\n")),
        ]
    );
    assert!(t.core.journal().claims().is_empty());

    // Every frame podhost sent about the run: each effect journaled before it ran, the
    // folder written, the turn completed.
    let (c0, c1) = (candidate_of(&call), candidate_of(&answer));
    let tool = tool_intent(0, 0, "call_1", "bash", json!({"command": OUTPUTS_COMMAND}));
    let entries = vec![
        json!({"kind": "input", "turnId": TURN,
               "event": {"kind": "user-message", "text": "Write the report."}}),
        json!({"kind": "candidate", "turnId": TURN, "stepId": "step-0-0", "candidate": c0}),
        json!({"kind": "tool-results", "turnId": TURN, "stepId": "step-0-0", "results": [
            {"callId": "call_1", "toolName": "bash", "kind": "completed", "output": bash_output}]}),
        json!({"kind": "candidate", "turnId": TURN, "stepId": "step-0-1", "candidate": c1}),
        json!({"kind": "final", "turnId": TURN, "stepId": "step-0-1",
               "output": "The report is in your outputs folder."}),
    ];
    let frames = t.core.run_frames(t.conn, "run-1");
    let r = |p: Value| of_run("run-1", p);
    // The folder as a pod writes it: small files inline, in path order, one upload.
    let file = |path: &str, bytes: &[u8]| {
        (
            "artifact.write".to_owned(),
            r(
                json!({"op": "file", "uploadId": "up_0001", "path": path, "size": bytes.len(),
                     "sha256": sha(bytes), "base64": BASE64.encode(bytes)}),
            ),
        )
    };
    let mut expected = vec![
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
                     "value": {"kind": "completed", "output": bash_output}})),
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
    ];
    expected.extend([
        (
            "artifact.write".to_owned(),
            r(
                json!({"op": "begin", "key": "outputs:turn_1", "kind": "folder",
                     "name": "outputs", "sameName": true}),
            ),
        ),
        file("report.txt", b"report\n"),
        file("sub/deep.txt", b"deep\n"),
        (
            "artifact.write".to_owned(),
            r(json!({"op": "commit", "uploadId": "up_0001"})),
        ),
    ]);
    expected.push((
        "turn.completed".to_owned(),
        r(json!({
            "status": "completed",
            "output": "The report is in your outputs folder.",
            "state": {"v": 1},
            "transcript": [{"keep": 0, "entries": entries, "length": 5}],
        })),
    ));
    assert_eq!(frames, expected);
    assert_eq!(t.core.journal().transcript(SESSION).1, entries);
    // Core's journal holds each effect as completed, with the value podhost reported.
    let rows: Vec<(Status, Option<Value>)> = [
        "turn_1:0:model:s0",
        "turn_1:0:tool:s0.call_1",
        "turn_1:0:model:s1",
    ]
    .into_iter()
    .map(|id| {
        let row = t.core.journal().row(id).unwrap();
        (row.status, row.value)
    })
    .collect();
    assert_eq!(
        rows,
        [
            (Status::Completed, Some(c0)),
            (
                Status::Completed,
                Some(json!({"kind": "completed", "output": bash_output}))
            ),
            (Status::Completed, Some(c1)),
        ]
    );

    // The turn's files stay in the workspace, owned by uid 1000: core's `workspace.exec` sees
    // them as the turn left them.
    let answer = t
        .core
        .request(
            t.conn,
            "workspace.exec",
            json!({"session": {"ownerId": SESSION, "activeTurnId": null}, "tool": "bash",
                   "input": {"command": "stat -c '%u %s %n' outputs/report.txt outputs/sub/deep.txt"}}),
        )
        .await;
    assert_eq!(
        answer["r"],
        json!({"kind": "completed", "output": {"exitCode": 0, "stderr": "",
               "stdout": "1000 7 outputs/report.txt\n1000 5 outputs/sub/deep.txt\n"}}),
        "{answer}"
    );
}
