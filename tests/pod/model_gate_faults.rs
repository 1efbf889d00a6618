//! Model Gate faults (v5 §4, §5): a 5xx or a lost answer is sent again, the same bytes under
//! the same key, a bounded number of times; a call whose fate is still unknown after that is
//! reported `effect.outcome {error}` and becomes uncertain, never a definite failure; a cancel
//! during the pause between sends stops the run at once.

use std::collections::{BTreeMap, HashMap};

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::fake_core::CoreOptions;
use crate::fake_gates::{self, GateCall, Loss, Reply};
use crate::metrics::{entries, free_port, get};
use crate::prometheus::{counted, parse};
use crate::set_env;
use crate::turn::{TOKEN, TURN, candidate_of, setup, setup_with, turn_start, wait_end};

const EFFECT: &str = "turn_1:0:model:s0";

/// Each send as the gate saw it: whether it is the first send's bytes, its key, its bearer and
/// the status it was answered.
fn sends(calls: &[GateCall]) -> Vec<(bool, Option<&str>, Option<&str>, u16)> {
    calls
        .iter()
        .map(|c| {
            (
                c.raw == calls[0].raw,
                c.key.as_deref(),
                c.token.as_deref(),
                c.status,
            )
        })
        .collect()
}

#[tokio::test]
async fn a_gate_unavailable_twice_is_sent_again_and_the_turn_completes() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let health = free_port();
    let s = setup_with(CoreOptions::default(), |env| {
        set_env(env, "NYLORUN_HARNESS_HEALTH_PORT", &health.to_string());
    })
    .await;
    let answer = fake_gates::text("Answered on the third send.");
    s.gates.script([
        Reply::Unavailable(503),
        Reply::Unavailable(503),
        answer.clone(),
    ]);
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Answer me.")));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(
        (method, &output["output"]),
        (
            "turn.completed".to_owned(),
            &json!("Answered on the third send.")
        ),
        "{output}"
    );

    // Three sends of the same bytes under the same key; the model ran once.
    let sent = (true, Some(EFFECT), Some(TOKEN));
    assert_eq!(
        sends(&s.gates.calls()),
        [
            (sent.0, sent.1, sent.2, 503),
            (sent.0, sent.1, sent.2, 503),
            (sent.0, sent.1, sent.2, 200)
        ]
    );
    assert_eq!(
        s.gates.usage_rows(),
        HashMap::from([(EFFECT.to_owned(), 1)])
    );
    // One outcome journaled for the call: the answer.
    let frames = s.core.run_frames(s.conn, "run-1");
    let methods: Vec<&str> = frames.iter().map(|(m, _)| m.as_str()).collect();
    assert_eq!(
        methods,
        ["effect.intent", "effect.outcome", "turn.completed"]
    );
    assert_eq!(
        frames[1].1,
        json!({"runId": "run-1", "effectId": EFFECT, "value": candidate_of(&answer)})
    );

    // One model call with its final result; two re-sends after two 503s.
    s.pod.wait_log(&["run output sent"]).await;
    let (code, text) = get(&format!("http://127.0.0.1:{health}/metrics")).await;
    assert_eq!(code, 200, "{text}");
    let m = parse(&text);
    let metrics: BTreeMap<&str, BTreeMap<String, f64>> = [
        "podhost_model_calls_total",
        "podhost_model_retries_total",
        "podhost_model_http_errors_total",
    ]
    .into_iter()
    .map(|name| (name, counted(&m, name)))
    .collect();
    assert_eq!(
        metrics,
        BTreeMap::from([
            (
                "podhost_model_calls_total",
                entries(&[("endpoint=model_gate,outcome=ok", 1.0)])
            ),
            (
                "podhost_model_retries_total",
                entries(&[("endpoint=model_gate", 2.0)])
            ),
            (
                "podhost_model_http_errors_total",
                entries(&[("endpoint=model_gate,status=503", 2.0)])
            ),
        ])
    );
}

#[tokio::test]
async fn a_gate_failing_every_send_leaves_the_call_uncertain_not_failed() {
    let s = setup(CoreOptions::default()).await;
    // The gate runs the model (and meters it) but answers each of the first run's four sends
    // 503: a definite `transient` failure would be a lie.
    let answer = fake_gates::text("Ran once, answered late.");
    s.gates.script([Reply::Lost {
        outcome: candidate_of(&answer),
        loss: Loss::Status(503),
        times: 4,
    }]);
    let ts = turn_start(json!("Answer me."));
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let (method, waiting) = wait_end(&s.core, "run-1").await;
    assert_eq!(
        (method, waiting.clone()),
        (
            "turn.waiting".to_owned(),
            json!({"runId": "run-1", "status": "uncertain", "effectIds": [EFFECT],
                   "state": {"v": 1, "turnId": TURN, "input": "Answer me."}})
        )
    );
    let intent = s.core.run_frames(s.conn, "run-1")[0].clone();
    assert_eq!(
        s.core.run_frames(s.conn, "run-1"),
        [
            intent,
            (
                "effect.outcome".to_owned(),
                json!({"runId": "run-1", "effectId": EFFECT, "error":
                    "The Model Gate answered 503 unavailable: The gate failed before it could \
                     answer. podhost tried the call 4 times under its key and cannot tell \
                     whether it ran."})
            ),
            ("turn.waiting".to_owned(), waiting.clone()),
        ]
    );
    let sent = (true, Some(EFFECT), Some(TOKEN), 503);
    assert_eq!(sends(&s.gates.calls()), [sent, sent, sent, sent]);

    // The next run rejoins the call under its key and collects what the gate ran.
    let mut again = ts;
    again["checkpoint"]["state"] = waiting["state"].clone();
    s.core.grant_turn("run-2", "run-token-2", again);
    let (method, done) = wait_end(&s.core, "run-2").await;
    assert_eq!(
        (method, &done["output"]),
        (
            "turn.completed".to_owned(),
            &json!("Ran once, answered late.")
        ),
        "{done}"
    );
    assert_eq!(
        s.core.run_frames(s.conn, "run-2")[1],
        (
            "effect.outcome".to_owned(),
            json!({"runId": "run-2", "effectId": EFFECT, "value": candidate_of(&answer)})
        )
    );
    assert_eq!(
        sends(&s.gates.calls())[4],
        (true, Some(EFFECT), Some("run-token-2"), 200)
    );
    assert_eq!(
        s.gates.usage_rows(),
        HashMap::from([(EFFECT.to_owned(), 1)])
    );
}

#[tokio::test]
async fn a_cancel_during_the_pause_between_sends_stops_at_once() {
    // The first pause is drawn from 60 to 120 s, far past the test's wait for the run's end.
    let s = setup_with(CoreOptions::default(), |env| {
        set_env(env, "PODHOST_POD_BACKOFF_BASE_MS", "120000");
        set_env(env, "PODHOST_POD_BACKOFF_CAP_MS", "120000");
    })
    .await;
    s.gates.script([Reply::Unavailable(503)]);
    s.core.grant_turn("run-1", TOKEN, turn_start(json!("Hi")));
    s.pod
        .wait_log(&["sending the call again under its key", EFFECT])
        .await;
    s.core.send_msg(
        s.conn,
        "cancel",
        json!({"runId": "run-1", "reason": "cancel", "message": "Stopped by a person"}),
    );
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(
        (method, output),
        (
            "turn.failed".to_owned(),
            json!({
                "runId": "run-1", "status": "cancelled", "state": {"v": 1},
                "error": {"code": "cancelled", "message": "Stopped by a person"},
                "transcript": [{"keep": 0, "length": 1, "entries": [
                    {"kind": "input", "turnId": TURN, "event": {"kind": "user-message", "text": "Hi"}},
                ]}],
            })
        )
    );
    // No send after the cancel, no outcome reported, and the call cancelled at the gate.
    assert_eq!(s.gates.wait_cancel(EFFECT).await.as_deref(), Some(TOKEN));
    assert_eq!(
        sends(&s.gates.calls()),
        [(true, Some(EFFECT), Some(TOKEN), 503)]
    );
    assert_eq!(
        s.core.run_methods(s.conn, "run-1"),
        ["effect.intent", "turn.failed"]
    );
}
