//! `podhost run --json`: every event line follows `schemas/run-events.v1.json` (checked with the
//! `jsonschema` package), in the order the run took, for every way a run ends.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::harness::{KEY, output, run_cmd, schema_problems, types};
use crate::openai_fake::{FakeModel, Reply};

#[tokio::test]
async fn a_completed_run_is_a_valid_event_stream() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("AGENTS.md"), "Be brief.").unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([
        Reply::Calls {
            text: Some("Looking.".into()),
            calls: vec![
                (
                    "c1".into(),
                    "write".into(),
                    json!({"path": "a.txt", "content": "x\n"}).to_string(),
                ),
                ("c2".into(), "bash".into(), "{not json".into()),
                (
                    "c3".into(),
                    "read".into(),
                    json!({"path": "missing.txt"}).to_string(),
                ),
            ],
        },
        Reply::call("c4", "bash", json!({"command": "cat a.txt"})),
        Reply::text("Done."),
    ]);
    let out = output(run_cmd(&fake, dir.path(), &["--json", "go"])).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stderr, "");
    assert_eq!(schema_problems(&out.stdout).await, json!([]));
    let events = out.events();
    assert_eq!(
        types(&events),
        [
            "run.started",
            "model_call.started",
            "model_call.finished",
            "message",
            "tool_call.started",
            "tool_call.finished",
            "tool_call.started",
            "tool_call.finished",
            "tool_call.started",
            "tool_call.finished",
            "model_call.started",
            "model_call.finished",
            "tool_call.started",
            "tool_call.finished",
            "model_call.started",
            "model_call.finished",
            "message",
            "run.finished",
        ]
    );
    let strip = |mut e: Value| {
        let o = e.as_object_mut().unwrap();
        for k in ["elapsed_ms", "duration_ms"] {
            o.remove(k);
        }
        e
    };
    let started = strip(events[0].clone());
    assert_eq!(
        started,
        json!({"type": "run.started", "schema": "urn:podhost:schema:run-events:v1",
               "version": env!("CARGO_PKG_VERSION"), "model": "fake-model",
               "base_url": fake.base_url(), "base_url_from": "--base-url",
               "api_key_from": "MODEL_API_KEY",
               "workspace": std::fs::canonicalize(dir.path()).unwrap(),
               "max_steps": 500, "stream": true, "instructions": ["AGENTS.md"],
               "withheld_env": []})
    );
    let calls: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_call.finished")
        .cloned()
        .map(strip)
        .collect();
    assert_eq!(
        calls,
        [
            json!({"type": "tool_call.finished", "step": 1, "call_id": "c1", "tool": "write",
                   "status": "completed", "output": {"path": "a.txt", "bytes": 2}}),
            json!({"type": "tool_call.finished", "step": 1, "call_id": "c3", "tool": "read",
                   "status": "failed", "code": "sandbox.not_found",
                   "error": format!("No file at {}/missing.txt",
                                    std::fs::canonicalize(dir.path()).unwrap().display())}),
            json!({"type": "tool_call.finished", "step": 1, "call_id": "c2", "tool": "bash",
                   "status": "failed", "code": "tool.invalid_input",
                   "error": "The arguments of this bash call are not a JSON object: \"{not json\". \
                             Call the tool again with a JSON object as its arguments."}),
            json!({"type": "tool_call.finished", "step": 2, "call_id": "c4", "tool": "bash",
                   "status": "completed",
                   "output": {"exitCode": 0, "stdout": "x\n", "stderr": ""}}),
        ]
    );
    let last = strip(events.last().unwrap().clone());
    let summary = last["summary"].clone();
    assert_eq!(
        last,
        json!({"type": "run.finished", "status": "completed", "exit_code": 0, "answer": "Done.",
               "summary": summary})
    );
    assert_eq!(
        (
            &summary["model_calls"],
            &summary["tool_calls"],
            &summary["input_tokens"],
            &summary["output_tokens"]
        ),
        (&json!(3), &json!(4), &json!(3), &json!(3))
    );
}

#[tokio::test]
async fn runs_that_end_without_an_answer_are_valid_event_streams() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    // A question without a terminal, a failed model call, the step limit.
    fake.push([
        Reply::call("q", "ask_user", json!({"question": "Which one?"})),
        Reply::Status(404, "no such thing".into(), None),
        Reply::call("s1", "glob", json!({"pattern": "*"})),
    ]);
    let mut ends = Vec::new();
    for args in [
        &["--json", "a"][..],
        &["--json", "b"],
        &["--json", "--max-steps", "1", "c"],
    ] {
        let out = output(run_cmd(&fake, dir.path(), args)).await;
        assert_eq!(schema_problems(&out.stdout).await, json!([]), "{args:?}");
        let last = out.events().last().cloned().unwrap();
        ends.push((
            out.code,
            last["status"].clone(),
            last["exit_code"].clone(),
            last["questions"].clone(),
        ));
    }
    assert_eq!(
        ends,
        [
            (5, json!("input_required"), json!(5), json!(["Which one?"])),
            (3, json!("model_failed"), json!(3), Value::Null),
            (4, json!("step_limit"), json!(4), Value::Null),
        ]
    );
}

#[tokio::test]
async fn a_streamed_answer_reports_progress() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::Trickle(
        std::time::Duration::from_millis(300),
        Box::new(Reply::text("a long answer, streamed in pieces")),
    )]);
    let out = output(run_cmd(&fake, dir.path(), &["--json", "go"])).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(schema_problems(&out.stdout).await, json!([]));
    let progress: Vec<Value> = out
        .events()
        .into_iter()
        .filter(|e| e["type"] == "model_call.progress")
        .collect();
    assert!(!progress.is_empty(), "{}", out.stdout);
    assert!(
        progress
            .iter()
            .all(|p| p["step"] == 1 && p["received_bytes"].as_u64().unwrap() > 0),
        "{progress:?}"
    );
}
