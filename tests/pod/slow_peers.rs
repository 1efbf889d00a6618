//! Slow and faulty peers: a core slow to settle a run's end keeps the run held until it
//! answers; a run lost meanwhile, or a shutdown, ends the wait.

use std::time::Duration;

use podhost::nylorun::link::lease::RunEnd;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, Event, FakeCore};
use crate::lease::in_process;
use crate::recv;

fn fast_renewals() -> CoreOptions {
    CoreOptions {
        renew_every_ms: 100,
        ..CoreOptions::default()
    }
}

/// Frames podhost sent from event `from` on: requests by method, and aborts.
fn sent_from(core: &FakeCore, from: usize) -> Vec<Value> {
    core.events()
        .into_iter()
        .skip(from)
        .filter_map(|e| match e {
            Event::FromPod { frame, .. } => Some(frame),
            _ => None,
        })
        .collect()
}

/// Waits for `n` renewals of `run_id` from event `from` on.
async fn renewals(core: &FakeCore, from: usize, run_id: &str, n: usize) -> usize {
    let mut at = from;
    for _ in 0..n {
        let (i, _, f) = core.wait_request(at, "lease.renew").await;
        assert_eq!(f["p"], json!({"runId": run_id}));
        at = i + 1;
    }
    at
}

#[tokio::test]
async fn a_slow_settle_keeps_the_run_held_until_core_answers_its_output() {
    // The shutdown deadline of these tests is 3 s: the old bound on an output was a quarter of
    // it. The settle here takes well past that, with the run renewed meanwhile.
    let (core, _dirs, shutdown, task, mut runs, _stops, _conn) =
        in_process(fast_renewals(), |_| {}).await;
    core.slow_answers("turn.completed");
    core.grant("run-slow", "tok");
    let held = recv(&mut runs, "the run").await;
    let output = json!({"runId": "run-slow", "status": "completed", "output": "done"});
    held.finish
        .send(RunEnd::Output {
            method: "turn.completed",
            output: output.clone(),
        })
        .unwrap();
    let (sent_at, _, frame) = core.wait_request(0, "turn.completed").await;
    assert_eq!(frame["p"], output);
    // Twenty renewals at 100 ms: two seconds of settling, well past 750 ms.
    let after = renewals(&core, sent_at, "run-slow", 20).await;
    assert_eq!(core.held(), vec!["run-slow".to_owned()]);
    core.answer_slow();
    // Core took the output; the slot leases again, and nothing was aborted or sent again.
    core.wait_request(after, "lease").await;
    let aborts: Vec<Value> = sent_from(&core, sent_at + 1)
        .into_iter()
        .filter(|f| f["t"] == "abort" || f["m"] == "turn.completed" || f["m"] == "lease.release")
        .collect();
    assert_eq!(aborts, Vec::<Value>::new());
    assert_eq!(core.held(), Vec::<String>::new());
    shutdown.cancel();
    tokio::time::timeout(crate::WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_slow_release_keeps_the_run_held_until_core_answers() {
    let (core, _dirs, shutdown, task, mut runs, _stops, _conn) =
        in_process(fast_renewals(), |_| {}).await;
    core.slow_answers("lease.release");
    core.grant("run-rel", "tok");
    let held = recv(&mut runs, "the run").await;
    held.finish
        .send(RunEnd::Release(
            podhost::nylorun::link::protocol::ReleaseReason::Shutdown,
        ))
        .unwrap();
    let (sent_at, _, frame) = core.wait_request(0, "lease.release").await;
    assert_eq!(
        frame["p"],
        json!({"runId": "run-rel", "reason": "shutdown"})
    );
    let after = renewals(&core, sent_at, "run-rel", 20).await;
    core.answer_slow();
    core.wait_request(after, "lease").await;
    assert!(
        sent_from(&core, sent_at).iter().all(|f| f["t"] != "abort"),
        "the release was given up"
    );
    shutdown.cancel();
    tokio::time::timeout(crate::WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_run_lost_while_its_output_waits_ends_the_wait() {
    let (core, _dirs, shutdown, task, mut runs, _stops, _conn) =
        in_process(fast_renewals(), |_| {}).await;
    core.slow_answers("turn.completed");
    core.grant("run-lost", "tok");
    let held = recv(&mut runs, "the run").await;
    held.finish
        .send(RunEnd::Output {
            method: "turn.completed",
            output: json!({"runId": "run-lost", "status": "completed", "output": "done"}),
        })
        .unwrap();
    let (sent_at, _, frame) = core.wait_request(0, "turn.completed").await;
    let id = frame["id"].as_u64().unwrap();
    let after = renewals(&core, sent_at, "run-lost", 2).await;
    core.renew_reply("run-lost", json!({"ok": false}));
    // The renewal is refused: podhost gives the output up (abort) and takes work again.
    let (abort_at, _) = core
        .wait_from(after, "the abort of the output", |e| match e {
            Event::FromPod { frame, .. } if frame == &json!({"t": "abort", "id": id}) => Some(()),
            _ => None,
        })
        .await;
    core.wait_request(abort_at, "lease").await;
    shutdown.cancel();
    tokio::time::timeout(crate::WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn shutdown_ends_the_wait_for_a_slow_settle_within_the_deadline() {
    let (core, _dirs, shutdown, task, mut runs, _stops, _conn) =
        in_process(fast_renewals(), |_| {}).await;
    core.slow_answers("turn.completed");
    core.grant("run-sd", "tok");
    let held = recv(&mut runs, "the run").await;
    held.finish
        .send(RunEnd::Output {
            method: "turn.completed",
            output: json!({"runId": "run-sd", "status": "completed", "output": "done"}),
        })
        .unwrap();
    let (sent_at, _, _) = core.wait_request(0, "turn.completed").await;
    renewals(&core, sent_at, "run-sd", 2).await;
    shutdown.cancel();
    // The deadline is 3 s in these tests.
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the pod did not stop within its deadline")
        .unwrap()
        .unwrap();
}
