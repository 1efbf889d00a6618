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
    let run_id = started["run_id"].as_str().unwrap().to_owned();
    assert_eq!(uuid::Uuid::parse_str(&run_id).unwrap().to_string(), run_id);
    assert_eq!(
        started,
        json!({"type": "run.started", "schema": "urn:podhost:schema:run-events:v1",
               "version": env!("CARGO_PKG_VERSION"), "run_id": run_id, "model": "fake-model",
               "base_url": fake.base_url(), "base_url_from": "--base-url",
               "api_key_from": "MODEL_API_KEY",
               "workspace": std::fs::canonicalize(dir.path()).unwrap(),
               "cwd": std::env::current_dir().unwrap(),
               "tools": ["bash", "read", "write", "edit", "grep", "glob", "bash_output",
                         "bash_kill", "ask_user"],
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
    // The fake reports its own count of each prompt; the summary adds them up.
    let prompt_tokens: u64 = fake.requests().iter().map(|r| r.tokens).sum();
    assert_eq!(
        last,
        json!({"type": "run.finished", "run_id": run_id, "status": "completed", "exit_code": 0,
               "answer": "Done.", "summary": summary})
    );
    assert_eq!(
        (
            &summary["model_calls"],
            &summary["tool_calls"],
            &summary["input_tokens"],
            &summary["output_tokens"]
        ),
        (&json!(3), &json!(4), &json!(prompt_tokens), &json!(3))
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
        assert_paired(&out.events());
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

/// Every `tool_call.started` is followed by exactly one `tool_call.finished` of its call, and
/// every `tool_call.finished` follows its `started`.
fn assert_paired(events: &[Value]) {
    let mut open: Vec<&Value> = Vec::new();
    for e in events {
        let id = &e["call_id"];
        match e["type"].as_str().unwrap() {
            "tool_call.started" => open.push(id),
            "tool_call.finished" => {
                let at = open.iter().position(|o| *o == id);
                assert!(at.is_some(), "finished without its start: {e}");
                open.remove(at.unwrap());
            }
            _ => {}
        }
    }
    assert!(
        open.is_empty(),
        "started, never finished: {open:?}\n{events:#?}"
    );
}

#[tokio::test]
async fn a_question_left_for_the_user_ends_its_tool_call() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::call(
        "q",
        "ask_user",
        json!({"question": "Which one?"}),
    )]);
    let out = output(run_cmd(&fake, dir.path(), &["--json", "a"])).await;
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert_eq!(schema_problems(&out.stdout).await, json!([]));
    let events = out.events();
    assert_paired(&events);
    let mut finished = events
        .iter()
        .find(|e| e["type"] == "tool_call.finished")
        .cloned()
        .unwrap();
    finished.as_object_mut().unwrap().remove("elapsed_ms");
    assert_eq!(
        finished,
        json!({"type": "tool_call.finished", "step": 1, "call_id": "q", "tool": "ask_user",
               "status": "input_required", "duration_ms": finished["duration_ms"]})
    );
    // The question was not answered: the totals do not count it.
    assert_eq!(events.last().unwrap()["summary"]["tool_calls"], 0);
}

/// The progress task and the loop write through one sink: a call's progress never comes
/// after its end, however the two tasks are scheduled. A streamed answer arrives whole in a
/// moment, so the first progress of a call races its end in every run; half the runs have the
/// progress task scheduled late (a failpoint), when it loses that race every time.
#[tokio::test]
async fn no_progress_follows_its_model_calls_end() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    let mut progress = 0;
    for run in 0..16 {
        fake.push([
            Reply::call("c1", "glob", json!({"pattern": "*"})),
            Reply::call("c2", "glob", json!({"pattern": "*"})),
            Reply::text("a streamed answer, long enough to come in several pieces"),
        ]);
        let mut cmd = run_cmd(&fake, dir.path(), &["--json", "go"]);
        if run % 2 == 1 {
            cmd.env("PODHOST_FAILPOINTS", "run.progress_late=fail");
        }
        let out = output(cmd).await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        let mut open = None;
        for e in out.events() {
            match e["type"].as_str().unwrap() {
                "model_call.started" => open = Some(e["step"].clone()),
                "model_call.finished" => open = None,
                "model_call.progress" => {
                    progress += 1;
                    assert_eq!(Some(e["step"].clone()), open, "{}", out.stdout);
                }
                _ => {}
            }
        }
    }
    // Progress is still reported (the sink does not just drop it all).
    assert!(progress > 0);
}

/// The schema keeps the promise of version 1: new event types and new fields are valid, while
/// the known events keep their required fields and their types.
#[tokio::test]
async fn the_schema_takes_new_types_and_fields_and_holds_known_events_to_theirs() {
    let lines = [
        json!({"type": "model_call.cached", "elapsed_ms": 3, "anything": [1, 2]}),
        json!({"type": "model_call.started", "elapsed_ms": 3, "step": 1, "attempt": 2}),
        json!({"type": "tool_call.started", "elapsed_ms": 4, "step": 1, "call_id": "c",
               "tool": "bash", "input": {}, "sandbox": {"net": false}}),
        // Not valid: a known event without a required field, or with one of the wrong type.
        json!({"type": "model_call.started", "elapsed_ms": 3}),
        json!({"type": "model_call.progress", "elapsed_ms": 3, "step": 1,
               "received_bytes": "many"}),
        json!({"type": "run.finished", "elapsed_ms": 3, "status": "completed", "exit_code": 0,
               "answer": "x", "summary": {"model_calls": 1, "tool_calls": 0,
               "input_tokens": 0, "output_tokens": 0, "duration_ms": 1}}),
        // Not valid: no type, or no time.
        json!({"elapsed_ms": 3}),
        json!({"type": "model_call.cached"}),
    ];
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let problems = schema_problems(&text).await;
    let lines_types: Vec<(Value, Value)> = problems
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["line"].clone(), p["type"].clone()))
        .collect();
    assert_eq!(
        lines_types,
        [
            (json!(4), json!("model_call.started")),
            (json!(5), json!("model_call.progress")),
            (json!(6), json!("run.finished")),
            (json!(7), Value::Null),
            (json!(8), json!("model_call.cached")),
        ],
        "{problems:#}"
    );
}
