//! Work: granted runs, renewals, cancel for each reason, release, shutdown.

use std::time::Duration;

use podhost::nylorun::link::lease::StopReason;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, Event, FakeCore};
use crate::{Holding, PodDirs, pod_env, recv, set_env, start_in_process, start_pod};

/// The params of the next `m` request from `from`.
async fn next_params(core: &FakeCore, from: usize, m: &str) -> (usize, Value) {
    let (i, _, f) = core.wait_request(from, m).await;
    (i, f["p"].clone())
}

#[tokio::test]
async fn a_granted_run_podhost_cannot_read_ends_in_turn_failed() {
    let (core, _dirs, pod, _conn) = start_pod(CoreOptions::default(), |_| {}).await;
    // The fake's plain grant carries a TurnStart without a checkpoint.
    core.grant("run-1", "run-token-secret-1");
    let (at, _, f) = core.wait_request(0, "turn.failed").await;
    assert_eq!(
        f["p"],
        json!({"runId": "run-1", "status": "failed", "state": {"v": 1},
               "error": {"code": "turn_start.invalid",
                         "message": "podhost cannot read this TurnStart: missing field `checkpoint`"}})
    );
    pod.wait_log(&["turn_start.invalid", "run-1"]).await;
    // The slot leases again.
    core.wait_request(at, "lease").await;
    assert_eq!(core.held(), Vec::<String>::new());
    assert!(
        pod.logs().iter().all(|l| !l.contains("run-token-secret")),
        "a run token in the logs"
    );
}

/// The fake core and an in-process pod with the holding handler.
pub(crate) async fn in_process(
    opts: CoreOptions,
    tweak: impl FnOnce(&mut Vec<(String, String)>),
) -> (
    FakeCore,
    PodDirs,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), podhost::nylorun::host::pod::PodError>>,
    tokio::sync::mpsc::UnboundedReceiver<crate::HeldRun>,
    tokio::sync::mpsc::UnboundedReceiver<(String, StopReason)>,
    u64,
) {
    let core = FakeCore::start(opts).await;
    let dirs = PodDirs::new(&core);
    let mut env = pod_env(&core, &dirs);
    tweak(&mut env);
    let (handler, runs, stops) = Holding::new();
    let (shutdown, task) = start_in_process(&env, handler);
    let (_, conn, _) = core.wait_request(0, "hello").await;
    (core, dirs, shutdown, task, runs, stops, conn)
}

#[tokio::test]
async fn cancel_stops_the_run_for_each_reason() {
    let (core, _dirs, shutdown, task, mut runs, mut stops, conn) =
        in_process(CoreOptions::default(), |_| {}).await;
    let cases = [
        ("cancel", StopReason::Cancel),
        ("deadline", StopReason::Deadline),
        ("shutdown", StopReason::Shutdown),
        ("ownership.lost", StopReason::OwnershipLost),
    ];
    for (reason, stop) in cases {
        let run_id = format!("run-{}", reason.replace('.', "-"));
        let mark = core.mark();
        core.grant(&run_id, "tok");
        let held = recv(&mut runs, "the run").await;
        assert_eq!(held.grant.run_id, run_id);
        // A cancel for a run this pod does not hold is ignored.
        core.send_msg(
            conn,
            "cancel",
            json!({"runId": "run-elsewhere", "reason": reason}),
        );
        core.send_msg(
            conn,
            "cancel",
            json!({"runId": run_id, "reason": reason, "message": format!("{reason} by test")}),
        );
        assert_eq!(recv(&mut stops, "the stop").await, (run_id.clone(), stop));
        // What core hears back: cancel/deadline → the turn code's turn.failed (cancelled);
        // shutdown/ownership.lost → lease.release with that reason, whatever the turn code says.
        let sent: Vec<Value> = match reason {
            "cancel" | "deadline" => {
                let (_, p) = next_params(&core, mark, "turn.failed").await;
                vec![p]
            }
            _ => {
                let (_, p) = next_params(&core, mark, "lease.release").await;
                vec![p]
            }
        };
        let want = match reason {
            "cancel" | "deadline" => json!({
                "runId": run_id,
                "status": "cancelled",
                "error": {"message": format!("{reason} by test")},
            }),
            _ => json!({"runId": run_id, "reason": reason}),
        };
        assert_eq!(sent, vec![want]);
        // Nothing else about this run: no output after a release, no release after an output.
        let (_, _, next_lease) = core.wait_request(mark + 1, "lease").await;
        let _ = next_lease;
        let about_run: Vec<String> = core
            .frames_from_pod(conn)
            .iter()
            .filter(|f| f["p"]["runId"] == run_id.as_str())
            .map(|f| f["m"].as_str().unwrap_or("").to_owned())
            .collect();
        let expected_method = if matches!(reason, "cancel" | "deadline") {
            "turn.failed"
        } else {
            "lease.release"
        };
        assert_eq!(about_run, vec![expected_method.to_owned()]);
    }
    shutdown.cancel();
    tokio::time::timeout(crate::WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn renew_ok_false_releases_with_ownership_lost() {
    let opts = CoreOptions {
        renew_every_ms: 100,
        ..CoreOptions::default()
    };
    let (core, _dirs, shutdown, task, mut runs, mut stops, _conn) = in_process(opts, |_| {}).await;
    core.renew_reply("run-r", json!({"ok": true}));
    core.renew_reply("run-r", json!({"ok": false}));
    core.grant("run-r", "tok");
    let _held = recv(&mut runs, "the run").await;
    assert_eq!(
        recv(&mut stops, "the stop").await,
        ("run-r".to_owned(), StopReason::OwnershipLost)
    );
    let (_, p) = next_params(&core, 0, "lease.release").await;
    assert_eq!(p, json!({"runId": "run-r", "reason": "ownership.lost"}));
    let renewals = core
        .events()
        .iter()
        .filter(|e| matches!(e, Event::FromPod { frame, .. } if frame["m"] == "lease.renew"))
        .count();
    assert_eq!(renewals, 2);
    shutdown.cancel();
    tokio::time::timeout(crate::WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_renewal_with_a_token_switches_the_run_token() {
    let opts = CoreOptions {
        renew_every_ms: 100,
        ..CoreOptions::default()
    };
    let (core, _dirs, shutdown, task, mut runs, _stops, _conn) = in_process(opts, |_| {}).await;
    core.renew_reply(
        "run-t",
        json!({"ok": true, "token": "tok-2", "tokenExpiresAt": "2030-01-01T00:30:00.000Z"}),
    );
    core.grant("run-t", "tok-1");
    let mut held = recv(&mut runs, "the run").await;
    assert_eq!(
        held.tokens.borrow().as_ref().map(|t| t.expose().to_owned()),
        Some("tok-1".to_owned())
    );
    tokio::time::timeout(crate::WAIT, held.tokens.changed())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        held.tokens.borrow().as_ref().map(|t| t.expose().to_owned()),
        Some("tok-2".to_owned())
    );
    // The turn code ends the run: its output goes out as given.
    let output = json!({"runId": "run-t", "status": "completed", "output": "done"});
    held.finish
        .send(podhost::nylorun::link::lease::RunEnd::Output {
            method: "turn.completed",
            output: output.clone(),
        })
        .unwrap();
    let (_, p) = next_params(&core, 0, "turn.completed").await;
    assert_eq!(p, output);
    assert!(!held.cancelled.is_cancelled());
    shutdown.cancel();
    tokio::time::timeout(crate::WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn shutdown_aborts_the_waiting_lease_and_releases_held_runs() {
    let (core, _dirs, shutdown, task, mut runs, mut stops, conn) =
        in_process(CoreOptions::default(), |env| {
            set_env(env, "PODHOST_POD_CONCURRENCY", "2");
        })
        .await;
    core.grant("run-s", "tok");
    let _held = recv(&mut runs, "the run").await;
    // Two slots: one holds run-s, the other keeps a lease waiting.
    let (first_lease, _, _) = core.wait_request(0, "lease").await;
    let (_, _, waiting) = core.wait_request(first_lease + 1, "lease").await;
    let lease_id = waiting["id"].as_u64().unwrap();
    let mark = core.mark();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("the pod did not stop within its deadline")
        .unwrap()
        .unwrap();
    assert_eq!(
        recv(&mut stops, "the stop").await,
        ("run-s".to_owned(), StopReason::Shutdown)
    );
    let mut sent: Vec<Value> = core
        .events()
        .into_iter()
        .skip(mark)
        .filter_map(|e| match e {
            Event::FromPod { conn: c, frame } if c == conn => Some(frame),
            _ => None,
        })
        .map(|mut f| {
            if f["t"] == "req" {
                f["id"] = json!(0);
            }
            f
        })
        .collect();
    sent.sort_by_key(|f| f["t"].as_str().unwrap_or("").to_owned());
    assert_eq!(
        sent,
        vec![
            json!({"t": "abort", "id": lease_id}),
            json!({"t": "req", "id": 0, "m": "lease.release", "p": {"runId": "run-s", "reason": "shutdown"}}),
        ]
    );
    let closed = core
        .wait("the close", |e| match e {
            Event::Closed { conn: c, code, .. } if *c == conn => Some(*code),
            _ => None,
        })
        .await;
    assert_eq!(closed, Some(1001));
}

#[tokio::test]
async fn sigterm_with_a_lease_in_flight_aborts_it_and_exits_0() {
    let (core, _dirs, mut pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    let (_, _, lease) = core.wait_request(0, "lease").await;
    let lease_id = lease["id"].as_u64().unwrap();
    pod.signal(nix::sys::signal::Signal::SIGTERM);
    // The deadline is 3 s in these tests; allow the process a little more to be reaped.
    let status = pod.wait_exit(Duration::from_secs(5)).await;
    assert_eq!(status.code(), Some(0));
    let frames = core.frames_from_pod(conn);
    assert_eq!(frames.last(), Some(&json!({"t": "abort", "id": lease_id})));
    pod.wait_log(&["SIGTERM: shutting down"]).await;
}

#[tokio::test]
async fn losing_the_connection_stops_its_runs_without_a_release() {
    let (core, _dirs, shutdown, task, mut runs, mut stops, conn) =
        in_process(CoreOptions::default(), |_| {}).await;
    core.grant("run-l", "tok");
    let held = recv(&mut runs, "the run").await;
    let mark = core.mark();
    core.close_conn(conn);
    assert_eq!(
        recv(&mut stops, "the stop").await,
        ("run-l".to_owned(), StopReason::ConnectionLost)
    );
    assert!(held.cancelled.is_cancelled());
    // The pod reconnects and leases again; nothing about run-l was sent on either connection.
    core.wait_request(mark, "lease").await;
    let about_run = core
        .events()
        .iter()
        .filter(|e| matches!(e, Event::FromPod { frame, .. } if frame["p"]["runId"] == "run-l"))
        .count();
    assert_eq!(about_run, 0);
    shutdown.cancel();
    tokio::time::timeout(crate::WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
