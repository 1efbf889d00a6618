//! Faults from peers during a turn: a model call whose fate is unknown, a run taken away as
//! one of its requests is answered, answers that carry fields podhost does not know.

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::fake_core::CoreOptions;
use crate::fake_gates::{self, Loss, Reply};
use crate::turn::{TOKEN, TURN, candidate_of, setup, turn_start, wait_end};

#[tokio::test]
async fn a_model_call_whose_answer_every_send_lost_is_uncertain_and_rejoined_once() {
    let s = setup(CoreOptions::default()).await;
    let answer = fake_gates::text("Answered once.");
    // The gate runs the call once; each of the first run's sends (podhost sends a call at most
    // four times) loses its answer to a dropped connection.
    s.gates.script([Reply::Lost {
        outcome: candidate_of(&answer),
        loss: Loss::Drop,
        times: 4,
    }]);
    let ts = turn_start(json!("Answer me."));
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let effect = "turn_1:0:model:s0";
    // The gate ran the call, but its answer never arrived: the fate is unknown, recorded as an
    // error, and the segment waits uncertain (v5 §4).
    let (method, waiting) = wait_end(&s.core, "run-1").await;
    assert_eq!(
        (method, waiting.clone()),
        (
            "turn.waiting".to_owned(),
            json!({"runId": "run-1", "status": "uncertain", "effectIds": [effect],
                   "state": {"v": 1, "turnId": TURN, "input": "Answer me."}})
        )
    );
    let frames = s.core.run_frames(s.conn, "run-1");
    assert_eq!(frames[1].0, "effect.outcome");
    let error = frames[1].1["error"].as_str().unwrap().to_owned();
    // The connection dropped before the answer's head or in its body: either way, lost.
    assert!(
        (error.starts_with("The Model Gate lost the call")
            || error.starts_with("The Model Gate's answer (200) was lost"))
            && error.ends_with(
                ". podhost tried the call 4 times under its key and cannot tell whether it ran."
            ),
        "{error}"
    );
    assert_eq!(
        frames[1].1,
        json!({"runId": "run-1", "effectId": effect, "error": error})
    );

    // The next run asks the same intent; core answers `execute, rejoin`; the same bytes under
    // the same key collect the first call's outcome.
    let mut again = ts;
    again["checkpoint"]["state"] = waiting["state"].clone();
    s.core.grant_turn("run-2", "run-token-2", again);
    let (method, done) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{done}");
    assert_eq!(done["output"], "Answered once.");
    // Five sends of the same bytes under the same key: four from the first run, one rejoin.
    let calls = s.gates.calls();
    let sends: Vec<_> = calls
        .iter()
        .map(|c| (c.raw == calls[0].raw, c.key.as_deref(), c.token.as_deref()))
        .collect();
    let first = (true, Some(effect), Some(TOKEN));
    assert_eq!(
        sends,
        [
            first,
            first,
            first,
            first,
            (true, Some(effect), Some("run-token-2"))
        ]
    );
    // One model call, one usage row.
    assert_eq!(s.gates.model_runs(), 1);
    assert_eq!(
        s.gates.usage_rows(),
        [(effect.to_owned(), 1)].into_iter().collect()
    );
    assert_eq!(
        s.core.run_frames(s.conn, "run-2")[1],
        (
            "effect.outcome".to_owned(),
            json!({"runId": "run-2", "effectId": effect, "value": candidate_of(&answer)})
        )
    );
}

#[tokio::test]
async fn ownership_lost_answering_a_journal_request_releases_the_run() {
    let s = setup(CoreOptions::default()).await;
    s.gates.script([fake_gates::tool_call(
        "c1",
        "bash",
        json!({"command": "echo once >> log.txt"}),
    )]);
    // Another owner took the session as the model call's outcome was reported.
    s.core.refuse_next(
        "effect.outcome",
        "ownership_lost",
        "Another owner holds the session",
    );
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Log it.")));
    assert_eq!(
        wait_end(&s.core, "run-1").await,
        (
            "lease.release".to_owned(),
            json!({"runId": "run-1", "reason": "ownership.lost"})
        )
    );
    assert_eq!(
        s.core.run_methods(s.conn, "run-1"),
        ["effect.intent", "effect.outcome", "lease.release"]
    );
    s.pod.wait_log(&["no longer held", "run-1"]).await;
    assert!(!s.dirs.workspace.join("log.txt").exists());
}

#[tokio::test]
async fn run_not_held_answering_an_artifact_request_releases_the_run() {
    let s = setup(CoreOptions::default()).await;
    // A result past the record entry: it is spilled with `artifact.write`.
    s.gates.script([fake_gates::tool_call(
        "c1",
        "bash",
        json!({"command": "head -c 60000 /dev/zero | tr '\\\\0' a"}),
    )]);
    s.core.refuse_next(
        "artifact.write",
        "run_not_held",
        "Run run-1 is not held by this harness",
    );
    let mut ts = turn_start(json!("Print a lot."));
    ts["limits"]["recordEntryBytes"] = json!(40_000);
    s.core.grant_turn("run-1", TOKEN, ts);
    assert_eq!(
        wait_end(&s.core, "run-1").await,
        (
            "lease.release".to_owned(),
            json!({"runId": "run-1", "reason": "ownership.lost"})
        )
    );
    // Nothing was reported for the call after core said the run is not held.
    assert_eq!(
        s.core.run_methods(s.conn, "run-1"),
        [
            "effect.intent",
            "effect.outcome",
            "effect.intent",
            "artifact.write",
            "lease.release"
        ]
    );
}

#[tokio::test]
async fn answers_with_fields_podhost_does_not_know_are_taken_and_logged_once() {
    let s = setup(CoreOptions {
        answer_extras: true,
        ..CoreOptions::default()
    })
    .await;
    s.gates.script([fake_gates::text("Fine.")]);
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Hello?")));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    s.pod
        .wait_log(&["hello", "laterField", "does not know"])
        .await;
    s.pod
        .wait_log(&["hello", "sandbox.region", "does not know"])
        .await;
    s.pod
        .wait_log(&["lease", "run.priority", "does not know"])
        .await;
    // Each unknown field is logged once, however many answers carry it.
    let hello_logs = s
        .pod
        .logs()
        .iter()
        .filter(|l| l.contains("laterField") && l.contains("does not know"))
        .count();
    assert!(hello_logs >= 1);
}
