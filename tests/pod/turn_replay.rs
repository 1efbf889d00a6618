//! Turns started over: a crashed segment replayed from its journal, a call rejoined at the gate,
//! and drift.

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::fake_core::CoreOptions;
use crate::fake_gates::{self, Reply};
use crate::turn::{TOKEN, TURN, candidate_of, model_intent, setup, turn_start, wait_end};

fn fast_renewals() -> CoreOptions {
    CoreOptions {
        renew_every_ms: 100,
        ..CoreOptions::default()
    }
}

#[tokio::test]
async fn a_crashed_segment_replays_with_the_same_ids_and_runs_nothing_twice() {
    let s = setup(fast_renewals()).await;
    s.gates.script([
        fake_gates::tool_call("call_1", "bash", json!({"command": "echo ran >> log.txt"})),
        Reply::Hang,
    ]);
    let ts = turn_start(json!("Log it."));
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    // The second model call is at the gate when the run is lost.
    let hung = s.gates.wait_call(1).await;
    s.core.renew_reply("run-1", json!({"ok": false}));
    assert_eq!(
        wait_end(&s.core, "run-1").await,
        (
            "lease.release".to_owned(),
            json!({"runId": "run-1", "reason": "ownership.lost"})
        )
    );
    let first = s.core.run_frames(s.conn, "run-1");
    let methods: Vec<&str> = first.iter().map(|(m, _)| m.as_str()).collect();
    // Nothing reported for the call at the gate, and it is left there for the next owner.
    assert_eq!(
        methods,
        [
            "effect.intent",
            "effect.outcome",
            "effect.intent",
            "effect.outcome",
            "effect.intent",
            "lease.release"
        ]
    );
    assert!(s.gates.cancels().is_empty());

    // The same TurnStart again, with the outcomes the first run recorded.
    let mut replay = ts;
    replay["outcomes"] = json!(s.core.journal().completed_outcomes(TURN, 0));
    let ids: Vec<&str> = replay["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["effectId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["turn_1:0:model:s0", "turn_1:0:tool:s0.call_1"]);
    s.core.grant_turn("run-2", "run-token-2", replay);
    // Only the unfinished model call is asked for: the same id and hash; core says rejoin, and
    // podhost sends the same bytes under the same key with its own token.
    let rejoined = s.gates.wait_call(2).await;
    assert_eq!(rejoined.raw, hung.raw);
    assert_eq!(rejoined.key, hung.key);
    assert_eq!(rejoined.token.as_deref(), Some("run-token-2"));
    let answer = candidate_of(&fake_gates::text("Logged once."));
    s.gates.release("turn_1:0:model:s1", answer.clone());
    let (method, output) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{output}");
    let second = s.core.run_frames(s.conn, "run-2");
    assert_eq!(second[0], first[4].clone().with_run("run-2"));
    assert_eq!(second[0].1["effect"], model_intent(0, 1));
    assert_eq!(
        second[1],
        (
            "effect.outcome".to_owned(),
            json!({"runId": "run-2", "effectId": "turn_1:0:model:s1", "value": answer})
        )
    );
    assert_eq!(second.len(), 3);
    // The command ran once, and each model call reached the model once.
    assert_eq!(
        std::fs::read_to_string(s.dirs.workspace.join("log.txt")).unwrap(),
        "ran\n"
    );
    assert_eq!(s.gates.model_runs(), 2);
    // The replayed segment's edits are the whole turn.
    let kinds: Vec<&str> = output["transcript"][0]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["input", "candidate", "tool-results", "candidate", "final"]
    );
}

trait WithRun {
    fn with_run(self, run_id: &str) -> Self;
}

impl WithRun for (String, serde_json::Value) {
    fn with_run(mut self, run_id: &str) -> Self {
        self.1["runId"] = json!(run_id);
        self
    }
}

#[tokio::test]
async fn rejoin_collects_a_call_that_finished_with_no_owner() {
    let s = setup(fast_renewals()).await;
    s.gates.script([Reply::Hang]);
    let ts = turn_start(json!("Take your time."));
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let first = s.gates.wait_call(0).await;
    s.core.renew_reply("run-1", json!({"ok": false}));
    assert_eq!(wait_end(&s.core, "run-1").await.0, "lease.release");
    // The gate finishes the call while no one holds the run.
    s.gates.release(
        "turn_1:0:model:s0",
        candidate_of(&fake_gates::text("Late but here.")),
    );
    s.core.grant_turn("run-2", "run-token-2", ts);
    let (method, output) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{output}");
    assert_eq!(output["output"], "Late but here.");
    let again = s.gates.wait_call(1).await;
    assert_eq!((again.raw, again.status), (first.raw, 200));
    assert_eq!(s.gates.model_runs(), 1);
    assert_eq!(
        s.core.journal().row("turn_1:0:model:s0").unwrap().attempts,
        2
    );
}

#[tokio::test]
async fn drift_fails_the_turn() {
    let s = setup(CoreOptions::default()).await;
    // A replayed outcome whose hash is not the request's.
    let mut ts = turn_start(json!("Hello?"));
    ts["outcomes"] = json!([{"effectId": "turn_1:0:model:s0", "requestHash": "0".repeat(64),
                             "outcome": {"value": candidate_of(&fake_gates::text("old"))}}]);
    s.core.grant_turn("run-1", TOKEN, ts);
    let drift = |run: &str| {
        (
            "turn.failed".to_owned(),
            json!({"runId": run, "status": "failed", "state": {"v": 1},
                   "error": {"code": "effect_drift", "message": "Effect identity request drift"}}),
        )
    };
    assert_eq!(wait_end(&s.core, "run-1").await, drift("run-1"));
    assert_eq!(s.core.run_frames(s.conn, "run-1").len(), 1);

    // A journaled row of the same id with another hash: core answers effect_drift.
    s.core
        .grant_turn("run-2", "run-token-2", turn_start(json!("Hello?")));
    assert_eq!(wait_end(&s.core, "run-2").await.0, "turn.completed");
    let mut changed = turn_start(json!("Hello?"));
    changed["manifest"]["instructions"] = json!("Other instructions.");
    s.core.grant_turn("run-3", "run-token-3", changed);
    assert_eq!(wait_end(&s.core, "run-3").await, drift("run-3"));
    assert_eq!(s.gates.model_runs(), 1);
}
