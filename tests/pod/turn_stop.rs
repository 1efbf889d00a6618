//! Turns stopped: cancel and deadline (the process tree killed, the gate call cancelled), and a
//! run lost mid-turn; a renewed run token.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, Event};
use crate::fake_gates::{self, Reply};
use crate::turn::{Setup, TOKEN, candidate_of, setup, turn_start, wait_end};

/// Makes `started.fifo` in the workspace; the command writes its `sleep`'s pid there.
fn fifo(s: &Setup) -> std::path::PathBuf {
    let path = s.dirs.workspace.join("started.fifo");
    nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    path
}

/// Reads the pid the command wrote: the command is running.
async fn started(path: std::path::PathBuf) -> i32 {
    let read = tokio::task::spawn_blocking(move || std::fs::read_to_string(path).unwrap());
    tokio::time::timeout(crate::WAIT, read)
        .await
        .expect("the command did not start")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Whether no process runs `sleep <length>` any more. A command runs in its session's PID
/// namespace, where the pid it reports means nothing on the host, so each test's sleep carries
/// a length of its own as its marker.
fn gone(length: &str) -> bool {
    let wanted = format!("sleep\0{length}\0");
    !std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let zombie = std::fs::read_to_string(e.path().join("stat"))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')));
        !zombie && std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == wanted.as_bytes())
    })
}

/// A command that sleeps `length` seconds in the background and says it started.
fn sleeper(length: &str) -> String {
    format!("sleep {length} & echo $! > started.fifo; wait")
}

#[tokio::test]
async fn cancel_mid_sleep_kills_the_command_and_fails_cancelled() {
    let s = setup(CoreOptions::default()).await;
    let pipe = fifo(&s);
    let call = fake_gates::tool_call("c1", "bash", json!({"command": sleeper("300.1")}));
    s.gates.script([call.clone()]);
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Sleep.")));
    started(pipe).await;
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
                "transcript": [{"keep": 0, "length": 2, "entries": [
                    {"kind": "input", "turnId": "turn_1", "event": {"kind": "user-message", "text": "Sleep."}},
                    {"kind": "candidate", "turnId": "turn_1", "stepId": "step-0-0", "candidate": candidate_of(&call)},
                ]}],
            })
        )
    );
    assert!(gone("300.1"), "the command's sleep outlived the cancel");
    let methods = s.core.run_methods(s.conn, "run-1");
    assert_eq!(
        methods,
        [
            "effect.intent",
            "effect.outcome",
            "effect.intent",
            "turn.failed"
        ]
    );
}

#[tokio::test]
async fn deadline_during_a_model_call_cancels_it_at_the_gate() {
    let s = setup(CoreOptions::default()).await;
    s.gates.script([Reply::Hang]);
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Think hard.")));
    s.gates.wait_call(0).await;
    s.core.send_msg(
        s.conn,
        "cancel",
        json!({"runId": "run-1", "reason": "deadline"}),
    );
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.failed");
    assert_eq!(output["status"], "cancelled");
    assert_eq!(
        output["error"],
        json!({"code": "cancelled", "message": "The advance ran past its deadline"})
    );
    assert_eq!(
        s.gates.wait_cancel("turn_1:0:model:s0").await.as_deref(),
        Some(TOKEN)
    );
    let methods = s.core.run_methods(s.conn, "run-1");
    assert_eq!(methods, ["effect.intent", "turn.failed"]);
}

#[tokio::test]
async fn a_run_lost_mid_command_is_released_without_an_output() {
    let s = setup(CoreOptions {
        renew_every_ms: 100,
        ..CoreOptions::default()
    })
    .await;
    let pipe = fifo(&s);
    s.gates.script([fake_gates::tool_call(
        "c1",
        "bash",
        json!({"command": sleeper("300.2")}),
    )]);
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Sleep.")));
    started(pipe).await;
    s.core.renew_reply("run-1", json!({"ok": false}));
    assert_eq!(
        wait_end(&s.core, "run-1").await,
        (
            "lease.release".to_owned(),
            json!({"runId": "run-1", "reason": "ownership.lost"})
        )
    );
    assert!(gone("300.2"), "the command's sleep outlived the run");
    let methods = s.core.run_methods(s.conn, "run-1");
    assert_eq!(
        methods,
        [
            "effect.intent",
            "effect.outcome",
            "effect.intent",
            "lease.release"
        ]
    );
    assert!(s.core.journal().outputs().is_empty());
}

#[tokio::test]
async fn a_renewed_run_token_reaches_the_next_gate_call() {
    let s = setup(CoreOptions {
        renew_every_ms: 100,
        ..CoreOptions::default()
    })
    .await;
    s.gates.script([Reply::Hang, fake_gates::text("Done.")]);
    s.core.grant_turn("run-1", TOKEN, turn_start(json!("Go.")));
    s.gates.wait_call(0).await;
    let mark = s.core.mark();
    s.core.renew_reply(
        "run-1",
        json!({"ok": true, "token": "run-token-renewed", "tokenExpiresAt": "2030-01-01T01:00:00.000Z"}),
    );
    s.core
        .wait_from(mark, "the renewal with a new token", |e| match e {
            Event::ToPod { frame, .. } if frame["r"]["token"] == "run-token-renewed" => Some(()),
            _ => None,
        })
        .await;
    // One more renewal after it: podhost has read the answer that carried the new token.
    let after = s.core.mark();
    s.core.wait_request(after, "lease.renew").await;
    s.gates.release(
        "turn_1:0:model:s0",
        candidate_of(&fake_gates::tool_call(
            "c1",
            "bash",
            json!({"command": "true"}),
        )),
    );
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let tokens: Vec<Option<String>> = s.gates.calls().into_iter().map(|c| c.token).collect();
    assert_eq!(
        tokens,
        [Some(TOKEN.to_owned()), Some("run-token-renewed".to_owned())]
    );
    let _: Option<Value> = None;
}

#[tokio::test]
async fn shutdown_releases_the_run_and_leaves_its_gate_call_to_the_next_owner() {
    let mut s = setup(CoreOptions::default()).await;
    s.gates.script([Reply::Hang]);
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Think.")));
    s.gates.wait_call(0).await;
    s.pod.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        wait_end(&s.core, "run-1").await,
        (
            "lease.release".to_owned(),
            json!({"runId": "run-1", "reason": "shutdown"})
        )
    );
    assert!(s.pod.wait_exit(crate::WAIT).await.success());
    assert!(s.gates.cancels().is_empty());
    let methods = s.core.run_methods(s.conn, "run-1");
    assert_eq!(methods, ["effect.intent", "lease.release"]);
}
