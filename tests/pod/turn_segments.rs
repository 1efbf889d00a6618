//! Turns across segments and their other ends: yield and continue, waiting and the approval
//! that follows, uncertain, model failures, limits, runtime tools.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::CoreOptions;
use crate::fake_gates::{self, Reply};
use crate::fake_journal::Status;
use crate::turn::{
    AGENT, SESSION, TOKEN, TURN, candidate_of, model_intent, setup, turn_start, wait_end,
};

#[tokio::test]
async fn a_long_turn_yields_and_continues_in_the_next_segment() {
    let s = setup(CoreOptions::default()).await;
    let call = fake_gates::tool_call("c1", "bash", json!({"command": "echo one"}));
    let answer = fake_gates::text("All done.");
    s.gates.script([call.clone(), answer.clone()]);
    let mut ts = turn_start(json!("Two steps, please."));
    ts["loop"] = json!({"yieldAfter": {"steps": 1}});
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let (method, first) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "checkpoint");
    let results = json!({"kind": "tool-results", "turnId": TURN, "stepId": "step-0-0", "results": [
        {"callId": "c1", "toolName": "bash", "kind": "completed",
         "output": {"exitCode": 0, "stdout": "one\n", "stderr": ""}}]});
    let entries = vec![
        json!({"kind": "input", "turnId": TURN,
               "event": {"kind": "user-message", "text": "Two steps, please."}}),
        json!({"kind": "candidate", "turnId": TURN, "stepId": "step-0-0", "candidate": candidate_of(&call)}),
        results,
    ];
    assert_eq!(
        first,
        json!({"runId": "run-1", "status": "yielded", "state": {"v": 1, "turnId": TURN},
               "transcript": [{"keep": 0, "entries": entries, "length": 3}]})
    );

    // Core starts the next segment of the same turn.
    let (cursor, stored) = s.core.journal().transcript(SESSION);
    assert_eq!(stored, entries);
    let mut next = ts;
    next["checkpoint"]["segment"] = json!(1);
    next["checkpoint"]["input"] = json!({"kind": "continue"});
    next["checkpoint"]["state"] = first["state"].clone();
    next["transcript"] = json!({"cursor": cursor});
    s.core.grant_turn("run-2", "run-token-2", next);
    let (method, second) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{second}");
    assert_eq!(
        second["transcript"],
        json!([{"keep": 3, "length": 5, "entries": [
            {"kind": "candidate", "turnId": TURN, "stepId": "step-1-0", "candidate": candidate_of(&answer)},
            {"kind": "final", "turnId": TURN, "stepId": "step-1-0", "output": "All done."},
        ]}])
    );
    let call = &s.gates.calls()[1];
    assert_eq!(call.body["effectId"], "turn_1:1:model:s0");
    let prompt = call.body["call"]["prompt"].as_array().unwrap();
    assert_eq!(prompt.last().unwrap()["kind"], "tool-result");
    let frames = s.core.run_frames(s.conn, "run-2");
    assert_eq!(
        frames[0],
        ("transcript.read".to_owned(), json!({"runId": "run-2"}))
    );
    assert_eq!(frames[1].1["effect"], model_intent(1, 0));
    assert_eq!(s.core.journal().transcript(SESSION).1.len(), 5);
}

#[tokio::test]
async fn a_pending_call_waits_and_the_approval_runs_it() {
    let s = setup(CoreOptions::default()).await;
    let effect = "turn_1:0:tool:s0.c1";
    s.core
        .journal()
        .script_intent(effect, json!({"status": "pending"}));
    s.gates.script([
        fake_gates::tool_call("c1", "bash", json!({"command": "echo approved > a.txt"})),
        fake_gates::text("Approved and done."),
    ]);
    let ts = turn_start(json!("Do it."));
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let (method, waiting) = wait_end(&s.core, "run-1").await;
    assert_eq!(
        (method, waiting.clone()),
        (
            "turn.waiting".to_owned(),
            json!({"runId": "run-1", "status": "waiting", "effectIds": [effect],
                   "state": {"v": 1, "turnId": TURN, "input": "Do it."}})
        )
    );
    assert!(!s.dirs.workspace.join("a.txt").exists());

    // A person approves; core runs the segment again with its journal.
    s.core.journal().set_row(effect, Status::Invoking, None);
    let mut approval = ts;
    approval["type"] = json!("approval.answer");
    approval["checkpoint"]["input"] =
        json!({"kind": "approve", "interactionId": effect, "approved": true});
    approval["checkpoint"]["state"] = waiting["state"].clone();
    approval["outcomes"] = json!(s.core.journal().completed_outcomes(TURN, 0));
    s.core.grant_turn("run-2", "run-token-2", approval);
    let (method, done) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{done}");
    assert_eq!(done["output"], "Approved and done.");
    assert_eq!(
        done["transcript"][0]["entries"][0]["event"],
        json!({"kind": "user-message", "text": "Do it."})
    );
    assert_eq!(
        std::fs::read_to_string(s.dirs.workspace.join("a.txt")).unwrap(),
        "approved\n"
    );
}

#[tokio::test]
async fn an_uncertain_model_call_ends_the_segment_uncertain() {
    let s = setup(CoreOptions::default()).await;
    s.core
        .journal()
        .script_intent("turn_1:0:model:s0", json!({"status": "uncertain"}));
    let mut ts = turn_start(json!("x".repeat(400)));
    ts["limits"]["harnessStateBytes"] = json!(200);
    s.core.grant_turn("run-1", TOKEN, ts);
    // The input does not fit the state limit, so the state keeps only the turn.
    assert_eq!(
        wait_end(&s.core, "run-1").await,
        (
            "turn.waiting".to_owned(),
            json!({"runId": "run-1", "status": "uncertain", "effectIds": ["turn_1:0:model:s0"],
                   "state": {"v": 1, "turnId": TURN}})
        )
    );
    assert!(s.gates.calls().is_empty());
}

#[tokio::test]
async fn a_model_failure_outcome_fails_the_turn() {
    let s = setup(CoreOptions::default()).await;
    let failure = json!({"kind": "failed", "code": "rate_limited", "message": "Slow down.",
                         "retryable": true, "retryAfterMs": 1000});
    s.gates.script([Reply::Outcome(failure.clone())]);
    s.core.grant_turn("run-1", TOKEN, turn_start(json!("Hi")));
    assert_eq!(
        wait_end(&s.core, "run-1").await,
        (
            "turn.failed".to_owned(),
            json!({"runId": "run-1", "status": "failed", "state": {"v": 1},
                   "error": {"code": "model.rate_limited", "message": "Slow down."},
                   "transcript": [{"keep": 0, "length": 1, "entries": [
                       {"kind": "input", "turnId": TURN, "event": {"kind": "user-message", "text": "Hi"}}]}]})
        )
    );
    // The failure is the call's recorded outcome.
    assert_eq!(
        s.core.journal().row("turn_1:0:model:s0").unwrap().value,
        Some(failure)
    );
}

#[tokio::test]
async fn a_gate_refusal_becomes_a_model_failure() {
    let s = setup(CoreOptions::default()).await;
    s.gates.script([Reply::Http(
        401,
        json!({"error": {"code": "gate_unauthorized", "message": "Unknown run token"}}),
    )]);
    s.core.grant_turn("run-1", TOKEN, turn_start(json!("Hi")));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.failed");
    assert_eq!(
        output["error"],
        json!({"code": "model.auth",
               "message": "The Model Gate answered 401 gate_unauthorized: Unknown run token"})
    );
}

#[tokio::test]
async fn a_model_call_past_model_call_bytes_fails_before_it_is_journaled() {
    let s = setup(CoreOptions::default()).await;
    let ts = turn_start(json!("Hi"));
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    assert_eq!(wait_end(&s.core, "run-1").await.0, "turn.completed");
    let bytes = s.gates.calls()[0].raw.len();

    let mut small = ts;
    small["limits"]["modelCallBytes"] = json!(bytes - 1);
    s.core.grant_turn("run-2", "run-token-2", small);
    assert_eq!(
        wait_end(&s.core, "run-2").await,
        (
            "turn.failed".to_owned(),
            json!({"runId": "run-2", "status": "failed", "state": {"v": 1},
                   "error": {"code": "model.call_too_large", "message": format!(
                       "The model call of step 0 is {bytes} bytes, past limits.modelCallBytes ({} bytes)",
                       bytes - 1)}})
        )
    );
    assert_eq!(s.core.run_frames(s.conn, "run-2").len(), 1);
}

#[tokio::test]
async fn transcript_edits_are_cut_to_the_record_entry_limit() {
    let s = setup(CoreOptions::default()).await;
    // Candidates are not spilled: two with large arguments fill the record entries.
    let write = |name: &str, c: &str| json!({"path": name, "content": c.repeat(1200)});
    s.gates.script([
        fake_gates::tool_call("c1", "write", write("a.txt", "a")),
        fake_gates::tool_call("c2", "write", write("b.txt", "b")),
        fake_gates::text("Wrote both."),
    ]);
    let limit = 3000;
    let mut ts = turn_start(json!("Write."));
    ts["limits"]["recordEntryBytes"] = json!(limit);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let edits = output["transcript"].as_array().unwrap();
    let mut entries: Vec<Value> = Vec::new();
    let mut sizes = Vec::new();
    for e in edits {
        sizes.push(e.to_string().len());
        assert_eq!(e["keep"].as_u64().unwrap() as usize, entries.len());
        entries.extend(e["entries"].as_array().unwrap().iter().cloned());
        assert_eq!(e["length"].as_u64().unwrap() as usize, entries.len());
    }
    assert!(
        sizes.len() > 1 && sizes.iter().all(|s| *s <= limit),
        "{sizes:?}"
    );
    assert_eq!(entries.len(), 7);
    assert_eq!(s.core.journal().transcript(SESSION).1, entries);
    assert_eq!(
        std::fs::read_to_string(s.dirs.workspace.join("b.txt")).unwrap(),
        "b".repeat(1200)
    );
}

#[tokio::test]
async fn memory_and_wake_calls_are_runtime_effects_core_answers() {
    let s = setup(CoreOptions::default()).await;
    let mut ts = turn_start(json!("What do I like?"));
    ts["memory"] = json!({"access": "read_only", "index": "- /memories/prefs.md — likes tea"});
    ts["agent"]["selfWake"] = json!(true);
    s.gates.script([
        fake_gates::tool_call("m1", "memory.view", json!({"path": "/memories/prefs.md"})),
        fake_gates::tool_call(
            "m2",
            "memory",
            json!({"command": "create", "path": "/memories/x"}),
        ),
        fake_gates::tool_call(
            "w1",
            "schedule_wake",
            json!({"in": "1h", "note": "check tea"}),
        ),
        fake_gates::text("You like tea."),
    ]);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let names: Vec<String> = s.gates.calls()[0].body["call"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names[6..], ["read_artifact", "memory", "schedule_wake"]);
    // How the memory works is in the instructions; the index is pinned at the head of the
    // session, taken through a journaled effect so that a replay shows the same one.
    let prompt = &s.gates.calls()[0].body["call"]["prompt"];
    assert!(
        prompt[0]["content"][0]["text"].as_str().unwrap().ends_with(
            "Use the memory tool's view command to read them. The list of your memories is given \
             at the start of the conversation."
        ),
        "{prompt}"
    );
    assert_eq!(
        prompt[1],
        json!({"kind": "message", "role": "user", "content": [{"type": "text", "text":
            "Your memories, newest first, as they stood when this session started or last \
             compacted its history (view /memories for the current state):\n- /memories/prefs.md \
             — likes tea"}]})
    );
    let tools: Vec<Value> = s
        .core
        .run_frames(s.conn, "run-1")
        .into_iter()
        .filter(|(m, p)| m == "effect.intent" && p["effect"]["kind"] == "tool")
        .map(|(_, p)| p["effect"].clone())
        .collect();
    let step = |n: u32| format!("step-0-{n}");
    assert_eq!(
        tools,
        [
            json!({"effectId": "turn_1:0:tool:memory-index", "sessionId": SESSION, "turnId": TURN,
                   "agentId": AGENT, "manifestHash": "mh_1", "kind": "tool", "toolName": "memory_index",
                   "target": {"kind": "harness"}, "input": {},
                   "context": {"invocationId": step(0), "stepId": step(0)}}),
            json!({"effectId": "turn_1:0:tool:s0.m1", "sessionId": SESSION, "turnId": TURN,
                   "agentId": AGENT, "manifestHash": "mh_1", "kind": "tool", "toolName": "memory.view",
                   "target": {"kind": "runtime", "operation": "memory"},
                   "input": {"command": "view", "path": "/memories/prefs.md"},
                   "context": {"invocationId": step(0), "callId": "m1", "stepId": step(0)}}),
            json!({"effectId": "turn_1:0:tool:s2.w1", "sessionId": SESSION, "turnId": TURN,
                   "agentId": AGENT, "manifestHash": "mh_1", "kind": "tool", "toolName": "schedule_wake",
                   "target": {"kind": "runtime", "operation": "schedule_wake"},
                   "input": {"in": "1h", "note": "check tea"},
                   "context": {"invocationId": step(2), "callId": "w1", "stepId": step(2)}}),
        ]
    );
    // A read-only memory refuses a write before it is sent; core's answers reach the model.
    let results: Vec<Value> = output["transcript"][0]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "tool-results")
        .map(|e| e["results"][0].clone())
        .collect();
    assert_eq!(
        results,
        [
            json!({"callId": "m1", "toolName": "memory.view", "kind": "completed",
                   "output": "core ran \"memory\" {\"command\":\"view\",\"path\":\"/memories/prefs.md\"}"}),
            json!({"callId": "m2", "toolName": "memory", "kind": "failed", "code": "memory.invalid_input",
                   "message": "memory has no command \"create\" here; the commands are: view."}),
            json!({"callId": "w1", "toolName": "schedule_wake", "kind": "completed",
                   "output": "core ran \"schedule_wake\" {\"in\":\"1h\",\"note\":\"check tea\"}"}),
        ]
    );
}

#[tokio::test]
async fn a_large_result_is_spilled_and_read_back_with_read_artifact() {
    let s = setup(CoreOptions::default()).await;
    s.gates.script([
        fake_gates::tool_call(
            "c1",
            "bash",
            json!({"command": "head -c 20000 /dev/zero | tr '\\0' a; printf END"}),
        ),
        fake_gates::tool_call(
            "c2",
            "read_artifact",
            json!({"artifactId": "art_0001", "offset": 19990, "length": 100}),
        ),
        fake_gates::text("It ends with END."),
    ]);
    let mut ts = turn_start(json!("Print a lot."));
    ts["limits"]["recordEntryBytes"] = json!(20_000);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let results: Vec<Value> = output["transcript"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|e| e["entries"].as_array().unwrap().clone())
        .filter(|e| e["kind"] == "tool-results")
        .map(|e| e["results"][0].clone())
        .collect();
    // The command's output was stored whole, keyed by the call; the record holds a stub.
    let stub = &results[0]["output"]["stdout"];
    assert_eq!(
        (&stub["truncated"], &stub["artifactId"], &stub["size"]),
        (&json!(true), &json!("art_0001"), &json!(20_003))
    );
    let tool_rows: Vec<_> = s
        .core
        .run_frames(s.conn, "run-1")
        .into_iter()
        .filter(|(m, p)| m == "effect.outcome" && p["effectId"] == "turn_1:0:tool:s0.c1")
        .collect();
    assert!(tool_rows[0].1["value"].to_string().len() < 20_000);
    // read_artifact ran as podhost's own call and read the stored bytes back.
    assert_eq!(results[1]["kind"], "completed", "{}", results[1]);
    assert!(
        results[1]["output"].to_string().contains("aaaaaaaaaaEND"),
        "{}",
        results[1]
    );
    let intent = s
        .core
        .run_frames(s.conn, "run-1")
        .into_iter()
        .find(|(m, p)| m == "effect.intent" && p["effect"]["toolName"] == "read_artifact")
        .unwrap();
    assert_eq!(intent.1["effect"]["target"], json!({"kind": "harness"}));
}

#[tokio::test]
async fn outputs_are_exported_when_a_turn_completes_and_an_empty_export_is_claimed() {
    let s = setup(CoreOptions::default()).await;
    s.gates.script([
        fake_gates::tool_call(
            "c1",
            "bash",
            json!({"command": "mkdir -p outputs && printf '# Report' > outputs/report.md"}),
        ),
        fake_gates::text("Saved."),
    ]);
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Report.")));
    assert_eq!(wait_end(&s.core, "run-1").await.0, "turn.completed");
    let folder = s
        .core
        .artifacts()
        .list(SESSION)
        .into_iter()
        .find(|a| a["name"] == "outputs")
        .expect("an outputs folder");
    let id = folder["artifactId"].as_str().unwrap();
    let files: Vec<(String, u64)> = s
        .core
        .artifacts()
        .folder_files(SESSION, id, 1)
        .into_iter()
        .map(|(p, n, _)| (p, n))
        .collect();
    assert_eq!(files, [("report.md".to_owned(), 8)]);
    assert!(s.core.journal().claims().is_empty());

    // The next turn leaves only a file past the per-file limit: nothing is stored, and the
    // turn claims why.
    s.core.artifacts().set_limits(1 << 20, 10, 1 << 20);
    s.gates.script([
        fake_gates::tool_call(
            "c1",
            "bash",
            json!({"command": "rm outputs/report.md && head -c 100 /dev/zero > outputs/big.bin"}),
        ),
        fake_gates::text("Replaced."),
    ]);
    let mut next = turn_start(json!("Replace it."));
    next["checkpoint"]["turnId"] = json!("turn_2");
    next["transcript"] = json!({"cursor": s.core.journal().transcript(SESSION).0});
    s.core.grant_turn("run-2", "run-token-2", next);
    assert_eq!(wait_end(&s.core, "run-2").await.0, "turn.completed");
    let claims = s.core.journal().claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(
        (claims[0].0.as_str(), claims[0].1.as_str()),
        ("run-2", "artifact.export.skipped")
    );
    assert_eq!(
        claims[0].2,
        json!({"name": "outputs", "reason": "file_too_large", "limit": 10, "path": "big.bin",
               "message": "no file of the outputs directory could be stored: 100 bytes is past \
                           the 10-byte limit of one file"})
    );
}

#[tokio::test]
async fn skills_are_mounted_named_to_the_model_and_on_the_calls_that_use_them() {
    let s = crate::turn::setup_with(CoreOptions::default(), |env| {
        let ws = env
            .iter()
            .find(|(k, _)| k == "PODHOST_WORKSPACE")
            .map(|(_, v)| std::path::PathBuf::from(v))
            .unwrap();
        let skills = ws.parent().unwrap().join("skills");
        std::fs::create_dir(&skills).unwrap();
        crate::set_env(env, "PODHOST_SKILLS", &skills.display().to_string());
    })
    .await;
    let digest = s
        .core
        .artifacts()
        .add_definition_file(b"# Greet\nSay hello warmly.\n");
    let files = std::collections::BTreeMap::from([("SKILL.md".to_owned(), digest.clone())]);
    let folder = format!(
        "/skills/greet@{}/",
        podhost::nylorun::artifacts::skills::skill_hash(&files)
    );
    s.gates.script([
        // Commands see the host's own `/skills` (in a pod, the real one); the file tools map it.
        fake_gates::tool_call("c1", "read", json!({"path": format!("{folder}SKILL.md")})),
        fake_gates::text("Hello!"),
    ]);
    let mut ts = turn_start(json!("Greet me."));
    ts["manifest"]["skills"] =
        json!([{"name": "greet", "description": "Greets people.", "files": {"SKILL.md": digest}}]);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let instructions = s.gates.calls()[0].body["call"]["prompt"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        instructions.contains(&format!(
            "Skills are mounted read-only in the sandbox. Each folder holds a skill's files; read \
             its SKILL.md before you use it:\n- greet ({folder}): Greets people."
        )),
        "{instructions}"
    );
    let intent = s
        .core
        .run_frames(s.conn, "run-1")
        .into_iter()
        .find(|(m, p)| m == "effect.intent" && p["effect"]["kind"] == "tool")
        .unwrap();
    assert_eq!(intent.1["effect"]["skill"], "greet");
    assert_eq!(
        output["transcript"][0]["entries"][2]["results"][0]["output"],
        "1\t# Greet\n2\tSay hello warmly."
    );
}

#[tokio::test]
async fn a_model_answer_past_the_record_entry_limit_fails_the_turn() {
    let s = setup(CoreOptions::default()).await;
    let call = fake_gates::tool_call(
        "c1",
        "write",
        json!({"path": "big.txt", "content": "x".repeat(4000)}),
    );
    let bytes = candidate_of(&call).to_string().len();
    s.gates.script([call]);
    let mut ts = turn_start(json!("Write a lot."));
    ts["limits"]["recordEntryBytes"] = json!(3000);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.failed");
    assert_eq!(
        output["error"],
        json!({"code": "model.answer_too_large", "message": format!(
            "The model's answer of step 0 is {bytes} bytes, past limits.recordEntryBytes (3000 bytes)")})
    );
    // Nothing core would refuse was sent, and the write did not run.
    let methods = s.core.run_methods(s.conn, "run-1");
    assert_eq!(methods, ["effect.intent", "turn.failed"]);
    assert!(!s.dirs.workspace.join("big.txt").exists());
}
