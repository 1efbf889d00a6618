//! The context budget on a pod: sessions past the model's window compacted by summaries (v5
//! §6), an overflow answered by one compaction and a retry, a crash right after a summary (and
//! a kill at each compaction failpoint) replayed identically, the memory index pinned from the session's own record, and files the
//! model cannot read shown as notes (v5 §3, §5). The fake Model Gate counts tokens with its own
//! estimate and refuses a prompt past the window, as a gate does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::CoreOptions;
use crate::fake_gates::{self, GateCall, Reply};
use crate::turn::{SESSION, Setup, TOKEN, TURN, setup, setup_with, turn_start, wait_end};
use crate::{PodProcess, WAIT, pod_env, set_env};

/// The window the tests hold the model to, in the gate's tokens, and the answer's room.
const WINDOW: u64 = 12_000;
const ANSWER: u64 = 500;

/// A TurnStart with a small window and no segment budget to speak of.
fn windowed(input: Value) -> Value {
    let mut ts = turn_start(input);
    ts["model"]["contextWindow"] = json!(WINDOW);
    ts["model"]["maxOutputTokens"] = json!(ANSWER);
    ts["loop"] = json!({"yieldAfter": {"steps": 5000}});
    ts
}

fn is_summary(call: &Value) -> bool {
    call["tools"].as_array().is_some_and(Vec::is_empty)
}

const SUMMARY: &str =
    "Summary: the agent keeps reading notes.txt, the project's notes, for the user.";

/// A model that reads notes.txt `steps` times, then answers; a summary call gets a summary.
fn reader(steps: usize) -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    let n = AtomicUsize::new(0);
    move |call| {
        if is_summary(call) {
            return fake_gates::text(SUMMARY);
        }
        let k = n.fetch_add(1, Ordering::SeqCst);
        if k < steps {
            fake_gates::tool_call(&format!("c{k}"), "read", json!({"path": "notes.txt"}))
        } else {
            fake_gates::text("Done reading.")
        }
    }
}

/// Writes the notes every step reads: about 1.5 KB of prose.
fn write_notes(s: &Setup) {
    let line = "The build runs on two cores; tests must wait for events, not sleep.\n";
    std::fs::write(s.dirs.workspace.join("notes.txt"), line.repeat(22)).unwrap();
}

/// The room a call keeps for its answer, as the gate reads it.
fn reserve(c: &GateCall) -> u64 {
    c.body["call"]["model"]["controls"]["maxOutputTokens"]
        .as_u64()
        .unwrap_or(ANSWER)
}

fn effect_id(c: &GateCall) -> String {
    c.body["effectId"].as_str().unwrap_or_default().to_owned()
}

fn failed(c: &GateCall) -> bool {
    c.answer["outcome"]["kind"] == "failed"
}

#[tokio::test]
async fn a_300_step_session_compacts_and_every_prompt_fits_the_window() {
    let s = setup(CoreOptions::default()).await;
    write_notes(&s);
    s.gates.report_usage(true);
    s.gates.respond_with(reader(300));
    s.core
        .grant_turn("run-1", TOKEN, windowed(json!("Read the notes 300 times.")));
    let (method, output) = s
        .core
        .journal()
        .wait_output_within("run-1", Duration::from_secs(300))
        .await;
    assert_eq!(method, "turn.completed", "{output}");
    assert_eq!(output["output"], "Done reading.");

    let calls = s.gates.calls();
    for c in &calls {
        assert!(
            c.tokens + reserve(c) <= WINDOW,
            "{} sent {} tokens (+{} for the answer) to a {WINDOW}-token window",
            effect_id(c),
            c.tokens,
            reserve(c)
        );
        assert!(!failed(c), "{}: {}", effect_id(c), c.answer);
    }
    let steps = calls
        .iter()
        .filter(|c| !is_summary(&c.body["call"]))
        .count();
    let summaries: Vec<String> = calls
        .iter()
        .filter(|c| is_summary(&c.body["call"]))
        .map(effect_id)
        .collect();
    assert_eq!(steps, 301);

    // Core took each compaction: its facts name the completed summary calls, in order.
    let compactions = s.core.journal().compactions();
    assert!(compactions.len() >= 3, "{compactions:?}");
    let mut named = Vec::new();
    for (run, facts) in &compactions {
        assert_eq!(run, "run-1");
        assert_eq!(facts["trigger"], "threshold");
        assert!(facts["tokensAfter"].as_u64() < facts["tokensBefore"].as_u64());
        for id in facts["summaryEffectIds"].as_array().unwrap() {
            let row = s.core.journal().row(id.as_str().unwrap()).unwrap();
            assert_eq!(row.intent["purpose"], "summary");
            named.push(id.as_str().unwrap().to_owned());
        }
    }
    assert_eq!(named, summaries);
    // The session's transcript starts with the summary and stays small.
    let (_, transcript) = s.core.journal().transcript(SESSION);
    assert_eq!(transcript[0]["kind"], "compaction");
    assert_eq!(transcript[0]["summary"], SUMMARY);
    assert_eq!(transcript[1]["event"]["text"], "Read the notes 300 times.");
    assert!(transcript.len() < 80, "{}", transcript.len());
    assert_eq!(transcript.last().unwrap()["kind"], "final");
}

#[tokio::test]
async fn a_call_that_overflows_anyway_gets_one_compaction_and_a_retry() {
    let s = setup(CoreOptions::default()).await;
    write_notes(&s);
    s.gates.report_usage(true);
    s.gates.respond_with(reader(12));
    // Core says the window is 100,000 tokens; the gate holds prompts to 9,000.
    let mut ts = windowed(json!("Read the notes."));
    ts["model"]["contextWindow"] = json!(100_000);
    s.gates.set_window(Some(9_000));
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");

    let calls = s.gates.calls();
    let overflows: Vec<&GateCall> = calls.iter().filter(|c| failed(c)).collect();
    assert_eq!(overflows.len(), 1, "{calls:#?}");
    assert_eq!(overflows[0].answer["outcome"]["code"], "context_overflow");
    let at = calls.iter().position(failed).unwrap();
    let step = effect_id(&calls[at]);
    let n: u32 = step.rsplit(":s").next().unwrap().parse().unwrap();
    // The summary call, then the same step once more under its retry id, which fits.
    assert_eq!(
        effect_id(&calls[at + 1]),
        format!("{TURN}:0:model:s{n}.summary.overflow.0")
    );
    assert_eq!(effect_id(&calls[at + 2]), format!("{TURN}:0:model:s{n}.r1"));
    for c in &calls[at + 1..] {
        assert!(c.tokens + reserve(c) <= 9_000, "{}", effect_id(c));
    }
    let compactions = s.core.journal().compactions();
    assert_eq!(compactions[0].1["trigger"], "overflow");
    assert_eq!(
        compactions[0].1["summaryEffectIds"],
        json!([format!("{TURN}:0:model:s{n}.summary.overflow.0")])
    );
    // The transcript edit that replaced the history is marked, its facts on its first event.
    let first = &output["transcript"][0];
    assert_eq!(first["kind"], "compaction");
    assert_eq!(first["keep"], 0);
    assert_eq!(first["entries"][0]["kind"], "compaction");
    assert_eq!(first["entries"][0]["trigger"], "overflow");
}

#[tokio::test]
async fn core_refuses_compaction_facts_that_name_no_summary_call() {
    let s = setup(CoreOptions::default()).await;
    write_notes(&s);
    s.gates.respond_with(reader(1));
    s.core
        .grant_turn("run-1", TOKEN, windowed(json!("Read once.")));
    let (method, _) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed");
    let entry = json!({"kind": "compaction", "turnId": TURN, "stepId": "step-0-1",
                       "summary": "x", "trigger": "threshold", "tokensBefore": 9, "tokensAfter": 1});
    let output = |ids: Value, entries: Value| {
        json!({"runId": "run-1", "status": "completed", "output": "x", "state": {"v": 1},
               "transcript": [{"keep": 0, "entries": entries, "length": entries.as_array().unwrap().len(),
                               "kind": "compaction",
                               "compaction": {"trigger": "threshold", "tokensBefore": 9,
                                              "tokensAfter": 1, "summaryEffectIds": ids}}]})
    };
    let journal = s.core.journal();
    // A step's own model call is not a summary call.
    assert_eq!(
        journal.output(
            "run-1",
            "turn.completed",
            &output(json!([format!("{TURN}:0:model:s0")]), json!([entry]))
        ),
        Err((
            "invalid".to_owned(),
            format!(
                "Invalid turn.completed request: update 0: {TURN}:0:model:s0 is not a completed \
                 summary call of this turn"
            )
        ))
    );
    assert_eq!(
        journal.output(
            "run-1",
            "turn.completed",
            &output(json!([]), json!([entry]))
        ),
        Err((
            "invalid".to_owned(),
            "Invalid turn.completed request: update 0: a compaction names its summaryEffectIds"
                .to_owned()
        ))
    );
}

/// Kills the pod with SIGKILL and starts it again on the same disk; waits for its `hello`.
async fn respawn(s: &mut Setup) -> u64 {
    let (first, _, _) = s.core.wait_request(0, "hello").await;
    s.pod.signal(nix::sys::signal::Signal::SIGKILL);
    s.pod.wait_exit(WAIT).await;
    let mut env = pod_env(&s.core, &s.dirs);
    set_env(&mut env, "NYLORUN_GATES_URL", &s.gates.url());
    s.pod = PodProcess::spawn(&env);
    let (_, conn, _) = s.core.wait_request(first + 1, "hello").await;
    conn
}

/// Waits for the first gate call after a summary call that is a step's.
async fn first_step_after_a_summary(s: &Setup) -> GateCall {
    let mut summarized = false;
    for n in 0.. {
        let c = s.gates.wait_call(n).await;
        if is_summary(&c.body["call"]) {
            summarized = true;
        } else if summarized {
            return c;
        }
    }
    unreachable!()
}

#[tokio::test]
async fn a_kill_9_right_after_a_summary_replays_identically() {
    let mut s = setup(CoreOptions::default()).await;
    write_notes(&s);
    s.gates.report_usage(true);
    // The step after the first summary hangs at the gate: the pod is killed there.
    let summarized = Arc::new(AtomicBool::new(false));
    let hung = AtomicBool::new(false);
    let read = reader(60);
    let flag = summarized.clone();
    s.gates.respond_with(move |call| {
        if is_summary(call) {
            flag.store(true, Ordering::SeqCst);
        } else if flag.load(Ordering::SeqCst) && !hung.swap(true, Ordering::SeqCst) {
            return Reply::Hang;
        }
        read(call)
    });
    let ts = windowed(json!("Read the notes."));
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let stuck = first_step_after_a_summary(&s).await;
    let summaries: Vec<String> = s
        .gates
        .calls()
        .iter()
        .filter(|c| is_summary(&c.body["call"]))
        .map(effect_id)
        .collect();
    respawn(&mut s).await;

    let mut replay = ts;
    replay["outcomes"] = json!(s.core.journal().completed_outcomes(TURN, 0));
    let runs_before = s.gates.model_runs();
    s.core.grant_turn("run-2", "run-token-2", replay);
    // The replay rebuilds the same compaction: the stuck step is sent again byte for byte (the
    // gate joins it), and no summary runs again.
    let key = effect_id(&stuck);
    let rejoined = loop {
        let calls = s.gates.calls();
        if let Some(c) = calls
            .iter()
            .skip(1)
            .find(|c| c.token.as_deref() == Some("run-token-2"))
        {
            break c.clone();
        }
        s.gates.wait_call(calls.len()).await;
    };
    assert_eq!(effect_id(&rejoined), key);
    assert_eq!(rejoined.raw, stuck.raw);
    assert_eq!(s.gates.model_runs(), runs_before);
    s.gates
        .release(&key, fake_gates::candidate_text("Stopped reading."));
    let (method, output) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{output}");
    let compactions = s.core.journal().compactions();
    assert_eq!(compactions[0].1["summaryEffectIds"], json!(summaries[..1]));
    assert_eq!(output["transcript"][0]["kind"], "compaction");
}

#[tokio::test]
async fn a_memory_written_then_a_kill_replays_with_the_pinned_index() {
    let mut s = setup(CoreOptions::default()).await;
    let before = "- /memories/tea.md — likes tea";
    let after = "- /memories/coffee.md — coffee too\n- /memories/tea.md — likes tea";
    let mut ts = turn_start(json!("Remember I like coffee."));
    ts["memory"] = json!({"access": "read_write", "index": before});
    s.gates.script([
        fake_gates::tool_call(
            "m1",
            "memory",
            json!({"command": "create", "path": "/memories/coffee.md", "file_text": "coffee too"}),
        ),
        Reply::Hang,
    ]);
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let stuck = s.gates.wait_call(1).await;
    // The index is pinned at the head of the prompt, not in the instructions.
    let pin = |c: &GateCall| c.body["call"]["prompt"][1]["content"][0]["text"].clone();
    assert!(
        pin(&stuck).as_str().unwrap().ends_with(before),
        "{}",
        pin(&stuck)
    );
    respawn(&mut s).await;

    // Offered again: the memory was written, so core's index has changed.
    let mut replay = ts.clone();
    replay["memory"]["index"] = json!(after);
    replay["outcomes"] = json!(s.core.journal().completed_outcomes(TURN, 0));
    s.core.grant_turn("run-2", "run-token-2", replay);
    let rejoined = s.gates.wait_call(2).await;
    assert_eq!(rejoined.raw, stuck.raw);
    s.gates
        .release(&effect_id(&stuck), fake_gates::candidate_text("Noted."));
    let (method, output) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{output}");
    assert_eq!(
        output["state"]["memory"],
        json!({"index": before}),
        "{output}"
    );
    let pinned = s
        .core
        .journal()
        .row(&format!("{TURN}:0:tool:memory-index"))
        .unwrap();
    assert_eq!(pinned.intent["toolName"], "memory_index");
    assert_eq!(pinned.attempts, 1);

    // The next turn starts from the session's record: the same pin, whatever core's index says.
    let (cursor, _) = s.core.journal().transcript(SESSION);
    let mut next = turn_start(json!("And now?"));
    next["checkpoint"]["turnId"] = json!("turn_2");
    next["checkpoint"]["state"] = output["state"].clone();
    next["transcript"] = json!({"cursor": cursor});
    next["memory"] = json!({"access": "read_write", "index": after});
    s.gates.script([fake_gates::text("Coffee and tea.")]);
    s.core.grant_turn("run-3", "run-token-3", next);
    let (method, _) = wait_end(&s.core, "run-3").await;
    assert_eq!(method, "turn.completed");
    let last = s.gates.calls().last().unwrap().clone();
    assert_eq!(pin(&last), pin(&stuck));
}

/// Seeds `name` with `bytes` in the session; returns its artifact id.
fn seed(s: &Setup, name: &str, bytes: &[u8]) -> String {
    s.core.state.artifacts.seed_file(SESSION, name, bytes)
}

#[tokio::test]
async fn an_oversized_image_and_a_pdf_for_a_text_only_model_are_notes() {
    let s = setup(CoreOptions::default()).await;
    let image = seed(&s, "photo.png", &[7u8; 2000]);
    let pdf = seed(&s, "report.pdf", b"%PDF-1.4 small");
    let notes = seed(&s, "notes.csv", b"a,b\n1,2\n");
    let sizes = [(image.clone(), 2000u64), (pdf.clone(), 14)];
    s.gates
        .file_sizes(move |id| sizes.iter().find(|(i, _)| i == id).map(|(_, n)| *n));
    let mut ts = turn_start(json!({"content": [
        {"type": "text", "text": "What do these say?"},
        {"type": "media", "mediaType": "image/png", "reference": {"artifactId": image, "version": 1}},
        {"type": "media", "mediaType": "application/pdf", "reference": {"artifactId": pdf, "version": 1}},
        {"type": "media", "mediaType": "text/csv", "reference": {"artifactId": notes, "version": 1}},
    ]}));
    ts["model"]["inputs"] = json!(["text"]);
    ts["limits"]["modelFileBytes"] = json!(1000);
    s.gates
        .script([fake_gates::text("I can read the table only.")]);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let calls = s.gates.calls();
    assert_eq!(calls.len(), 1);
    assert!(!failed(&calls[0]), "{}", calls[0].answer);
    assert_eq!(
        calls[0].body["call"]["prompt"][1]["content"],
        json!([
            {"type": "text", "text": "What do these say?"},
            {"type": "text", "text": format!("[Attached file photo.png (image/png, 2000 bytes). This model cannot read image files, so it is not shown here. Call read_artifact with artifactId \"{image}\" to read it.]")},
            {"type": "text", "text": format!("[Attached file report.pdf (application/pdf, 14 bytes). This model cannot read pdf files, so it is not shown here. Call read_artifact with artifactId \"{pdf}\" to read it.]")},
            {"type": "text", "text": "[Attached file notes.csv (text/csv), its text follows.]\na,b\n1,2\n"},
        ])
    );
}

#[tokio::test]
async fn a_file_the_gate_refuses_is_dropped_and_the_call_sent_again() {
    let s = setup(CoreOptions::default()).await;
    let small = seed(&s, "small.png", &[1u8; 100]);
    // An image whose metadata podhost cannot read, which the gate finds past the limit.
    s.gates
        .file_sizes(|id| (id == "art_gone").then_some(50 << 20));
    let ts = turn_start(json!({"content": [
        {"type": "text", "text": "Compare."},
        {"type": "media", "mediaType": "image/png", "reference": {"artifactId": small, "version": 1}},
        {"type": "media", "mediaType": "image/png", "reference": {"artifactId": "art_gone", "version": 1}},
    ]}));
    s.gates.script([fake_gates::text("One image.")]);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let calls = s.gates.calls();
    let ids: Vec<String> = calls.iter().map(effect_id).collect();
    assert_eq!(
        ids,
        [
            format!("{TURN}:0:model:s0"),
            format!("{TURN}:0:model:s0.r1")
        ]
    );
    assert_eq!(calls[0].answer["outcome"]["code"], "invalid_request");
    let parts = &calls[1].body["call"]["prompt"][1]["content"];
    assert_eq!(parts[1]["type"], "media");
    assert_eq!(
        parts[2],
        json!({"type": "text", "text": "[Attached file art_gone (image/png). The model refused this file, so it is not shown here. Call read_artifact with artifactId \"art_gone\" to read it.]"})
    );
    // The note stays in the session: later calls never send the file again.
    let (_, transcript) = s.core.journal().transcript(SESSION);
    assert_eq!(transcript[0]["event"]["content"][2], parts[2]);
}

#[tokio::test]
async fn a_history_past_the_window_is_summarized_in_parts() {
    let s = setup(CoreOptions::default()).await;
    s.gates.report_usage(true);
    s.gates.respond_with(reader(0));
    // An earlier turn left a history several windows long.
    let page =
        "An old result line that the summary has to fold in, one of very many.\n".repeat(160);
    let mut entries = vec![json!({"kind": "input", "turnId": "turn_0",
                                  "event": {"kind": "user-message", "text": "Read the old pages."}})];
    for k in 0..8 {
        let step = format!("step-0-{k}");
        entries.push(
            json!({"kind": "candidate", "turnId": "turn_0", "stepId": step,
            "candidate": {"output": [{"type": "tool-call", "id": format!("o{k}"), "name": "read",
                                      "args": {"path": "old.txt"}}]}}),
        );
        entries.push(
            json!({"kind": "tool-results", "turnId": "turn_0", "stepId": step,
            "results": [{"callId": format!("o{k}"), "toolName": "read", "kind": "completed",
                         "output": page}]}),
        );
    }
    entries
        .push(json!({"kind": "final", "turnId": "turn_0", "stepId": "step-0-8", "output": "ok"}));
    let cursor = s.core.journal().seed_transcript(SESSION, entries);
    let mut ts = windowed(json!("What did the pages say?"));
    ts["transcript"] = json!({"cursor": cursor});
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let calls = s.gates.calls();
    for c in &calls {
        assert!(c.tokens + reserve(c) <= WINDOW, "{}", effect_id(c));
    }
    let parts: Vec<String> = calls
        .iter()
        .filter(|c| is_summary(&c.body["call"]))
        .map(effect_id)
        .collect();
    assert!(parts.len() >= 2, "{parts:?}");
    let expected: Vec<String> = (0..parts.len())
        .map(|k| format!("{TURN}:0:model:s0.summary.threshold.{k}"))
        .collect();
    assert_eq!(parts, expected);
    // Each part after the first carries the summary so far.
    assert!(
        calls[1].body["call"]["prompt"][1]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with(&format!("The summary so far:\n\n{SUMMARY}")),
    );
    let compactions = s.core.journal().compactions();
    assert_eq!(compactions.len(), 1);
    assert_eq!(compactions[0].1["summaryEffectIds"], json!(parts));
    let (_, transcript) = s.core.journal().transcript(SESSION);
    let kinds: Vec<&str> = transcript
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["compaction", "input", "candidate", "final"]);
}

#[tokio::test]
async fn a_kept_step_past_its_room_is_shrunk_to_a_preview() {
    let s = setup(CoreOptions::default()).await;
    s.gates.report_usage(true);
    let line = "A long line of the big file, which the model read whole in one step.\n";
    std::fs::write(s.dirs.workspace.join("big.txt"), line.repeat(330)).unwrap();
    s.gates.script([
        fake_gates::tool_call("b", "read", json!({"path": "big.txt"})),
        fake_gates::text("It is long."),
    ]);
    s.core
        .grant_turn("run-1", TOKEN, windowed(json!("Read big.txt.")));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let calls = s.gates.calls();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    let result = calls[1].body["call"]["prompt"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        result.contains("This result was shortened to fit the model's context window"),
        "{result}"
    );
    assert!(result.contains("bytes omitted"), "{result}");
    assert!(calls[1].tokens + ANSWER <= WINDOW);
    // Nothing was summarized: no compaction facts, only the shrunk result in the transcript.
    assert_eq!(s.core.journal().compactions(), vec![]);
}

#[tokio::test]
async fn the_pinned_index_is_refreshed_at_a_compaction_only() {
    let s = setup(CoreOptions::default()).await;
    write_notes(&s);
    s.gates.report_usage(true);
    s.gates.respond_with(reader(30));
    let (old, new) = (
        "- /memories/a.md — old",
        "- /memories/b.md — new\n- /memories/a.md — old",
    );
    let mut ts = windowed(json!("Read the notes."));
    ts["checkpoint"]["state"] = json!({"v": 1, "memory": {"index": old}});
    ts["memory"] = json!({"access": "read_only", "index": new});
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let pin = |c: &GateCall| {
        c.body["call"]["prompt"][1]["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let calls: Vec<GateCall> = s
        .gates
        .calls()
        .into_iter()
        .filter(|c| !is_summary(&c.body["call"]))
        .collect();
    // The session's pin until the first compaction, core's index after it.
    let first = calls.iter().position(|c| pin(c).ends_with(new)).unwrap();
    assert!(first > 0);
    assert!(calls[..first].iter().all(|c| pin(c).ends_with(old)));
    assert!(calls[first..].iter().all(|c| pin(c).ends_with(new)));
    let step = effect_id(&calls[first]);
    let n = step.rsplit(":s").next().unwrap();
    let refresh = s
        .core
        .journal()
        .row(&format!("{TURN}:0:tool:memory-index.s{n}.threshold"))
        .unwrap();
    assert_eq!(refresh.value.unwrap()["output"]["index"], new);
    assert_eq!(output["state"]["memory"], json!({"index": new}));
}

/// podhost killed by its failpoint right after a summary call's answer was recorded, and right
/// after the compaction was applied in memory (before the edit that reports it): the next
/// podhost asks for every effect with the same id and hash, runs no summary again, and the turn
/// completes with the compaction's facts naming the summary that ran.
#[tokio::test]
async fn a_kill_at_each_compaction_boundary_replays_identically() {
    for fp in podhost::failpoints::COMPACTION
        .iter()
        .filter(|f| f.starts_with("pod."))
    {
        let mut s = setup_with(CoreOptions::default(), |env| {
            set_env(env, "PODHOST_FAILPOINTS", &format!("{fp}=kill"))
        })
        .await;
        write_notes(&s);
        s.gates.report_usage(true);
        s.gates.respond_with(reader(60));
        let ts = windowed(json!("Read the notes."));
        s.core.grant_turn("run-1", TOKEN, ts.clone());
        let status = s.pod.wait_exit(WAIT).await;
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{fp}: {status:?}"
        );
        let summary_calls = |s: &Setup| -> Vec<String> {
            s.gates
                .calls()
                .iter()
                .filter(|c| is_summary(&c.body["call"]))
                .map(effect_id)
                .collect()
        };
        let summarized = summary_calls(&s);
        assert_eq!(summarized.len(), 1, "{fp}: {summarized:?}");
        let first = crate::mcp::intents_of(&s, s.conn, "run-1");

        let mark = s.core.mark();
        let mut env = pod_env(&s.core, &s.dirs);
        set_env(&mut env, "NYLORUN_GATES_URL", &s.gates.url());
        s.pod = PodProcess::spawn(&env);
        let (_, conn, _) = s.core.wait_request(mark, "hello").await;
        let mut replay = ts;
        replay["outcomes"] = json!(s.core.journal().completed_outcomes(TURN, 0));
        s.core.grant_turn("run-2", "run-token-2", replay);
        let (method, output) = wait_end(&s.core, "run-2").await;
        assert_eq!(method, "turn.completed", "{fp}: {output}");

        // What both runs asked for, they asked for with the same hash.
        let second = crate::mcp::intents_of(&s, conn, "run-2");
        for (id, hash) in &second {
            if let Some((_, before)) = first.iter().find(|(i, _)| i == id) {
                assert_eq!(hash, before, "{fp}: {id}");
            }
        }
        // The summary ran once; the compaction names it.
        assert_eq!(summary_calls(&s)[..1], summarized[..], "{fp}");
        let mut runs: Vec<String> = summary_calls(&s);
        runs.sort();
        runs.dedup();
        assert_eq!(
            runs.len(),
            summary_calls(&s).len(),
            "{fp}: a summary ran twice"
        );
        let compactions = s.core.journal().compactions();
        assert_eq!(
            compactions[0].1["summaryEffectIds"],
            json!(summarized),
            "{fp}"
        );
        assert_eq!(output["transcript"][0]["kind"], "compaction", "{fp}");
    }
}
