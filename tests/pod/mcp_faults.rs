//! MCP calls when something goes wrong: a hop lost after the gate ran the call, hops lost until
//! core gives up, a cancel mid-call, a shutdown mid-call, a stale run, a crash of podhost (also
//! killed exactly at each of the Tool Gate's crash boundaries).

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::json;

use crate::fake_gates;
use crate::mcp::{TOKEN, intents_of, mcp_setup, mcp_setup_with, mcp_turn_start, outcome_of};
use crate::turn::wait_end;
use crate::{PodProcess, WAIT, pod_env, set_env};

const EFFECT: &str = "turn_1:0:tool:s0.c1";

/// What `tick` answers the first time (the Python SDK adds the typed result as structured
/// content).
fn tick_1() -> serde_json::Value {
    json!({"kind": "completed", "output": {"content": [{"type": "text", "text": "tick 1"}],
           "structuredContent": {"result": "tick 1"}}})
}

fn py_turn(input: &str) -> serde_json::Value {
    mcp_turn_start(json!(input), json!([{"name": "py"}]))
}

#[tokio::test]
async fn a_lost_answer_is_asked_again_and_joins_the_call_that_ran() {
    let m = mcp_setup().await;
    let s = &m.s;
    s.gates.toolgate.lose_answers(1);
    s.gates.script([
        fake_gates::tool_call("c1", "py__tick", json!({})),
        fake_gates::text("Ticked."),
    ]);
    s.core.grant_turn("run-1", TOKEN, py_turn("Tick."));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");

    let calls = s.gates.toolgate.requests_of("tool-calls");
    assert_eq!(calls.len(), 2);
    assert!(calls[0].lost && !calls[1].lost);
    assert_eq!(calls[1].raw, calls[0].raw, "a re-send is the same bytes");
    assert_eq!(calls[1].key, calls[0].key);
    assert_eq!(s.gates.toolgate.executions(EFFECT), 1);
    // The intent was asked again (core counted the re-send) before the second send.
    let intents: Vec<_> = intents_of(s, s.conn, "run-1")
        .into_iter()
        .filter(|(id, _)| id == EFFECT)
        .collect();
    assert_eq!(intents.len(), 2);
    assert_eq!(intents[0], intents[1]);
    assert_eq!(s.core.journal().row(EFFECT).unwrap().attempts, 2);
    assert_eq!(outcome_of(s, s.conn, "run-1", EFFECT), tick_1());
    let ticks: Vec<String> =
        m.py.stderr()
            .into_iter()
            .filter(|l| l.starts_with("tick"))
            .collect();
    assert_eq!(ticks, ["tick 1"]);
}

#[tokio::test]
async fn hops_lost_until_the_attempts_are_used_up_end_interrupted() {
    let m = mcp_setup().await;
    let s = &m.s;
    s.gates.toolgate.lose_answers(10);
    s.gates.script([
        fake_gates::tool_call("c1", "py__tick", json!({})),
        fake_gates::text("It was interrupted."),
    ]);
    s.core.grant_turn("run-1", TOKEN, py_turn("Tick."));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    assert_eq!(s.gates.toolgate.requests_of("tool-calls").len(), 3);
    assert_eq!(s.gates.toolgate.executions(EFFECT), 1);
    // Core answered the fourth intent with the interrupted outcome; podhost reported none.
    assert!(
        !s.core
            .run_frames(s.conn, "run-1")
            .iter()
            .any(|(m, p)| m == "effect.outcome" && p["effectId"] == EFFECT)
    );
    assert_eq!(
        output["transcript"][0]["entries"][2]["results"],
        json!([{"callId": "c1", "toolName": "py__tick", "kind": "failed",
                "code": "tool.interrupted", "message": "The call was interrupted too often"}])
    );
}

#[tokio::test]
async fn a_call_whose_hops_keep_getting_lost_is_reported_unknown() {
    let m = mcp_setup().await;
    let s = &m.s;
    s.gates.toolgate.lose_answers(100);
    // Core keeps answering the re-sends `execute` (its attempts set high).
    let journal = s.core.journal();
    journal.script_intent(EFFECT, json!({"status": "execute"}));
    for _ in 0..9 {
        journal.script_intent(EFFECT, json!({"status": "execute", "rejoin": true}));
    }
    s.gates.script([
        fake_gates::tool_call("c1", "py__tick", json!({})),
        fake_gates::text("Unknown."),
    ]);
    s.core.grant_turn("run-1", TOKEN, py_turn("Tick."));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    // One send and five re-sends, one execution; then the fate is reported unknown.
    assert_eq!(s.gates.toolgate.requests_of("tool-calls").len(), 6);
    assert_eq!(s.gates.toolgate.executions(EFFECT), 1);
    let error = s
        .core
        .run_frames(s.conn, "run-1")
        .into_iter()
        .find(|(m, p)| m == "effect.outcome" && p["effectId"] == EFFECT)
        .unwrap()
        .1["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        error.ends_with(
            "podhost sent the call 6 times without an answer and cannot tell whether it ran."
        ),
        "{error}"
    );
    assert_eq!(
        output["transcript"][0]["entries"][2]["results"][0]["code"],
        "tool.uncertain"
    );
}

#[tokio::test]
async fn a_cancel_mid_call_cancels_it_at_the_gate_and_the_server() {
    let m = mcp_setup().await;
    let s = &m.s;
    s.gates.script([fake_gates::tool_call(
        "c1",
        "py__slow",
        json!({"seconds": 30}),
    )]);
    s.core.grant_turn("run-1", TOKEN, py_turn("Wait."));
    m.py.wait_stderr("slow(30.0) started").await;
    s.core.send_msg(
        s.conn,
        "cancel",
        json!({"runId": "run-1", "reason": "cancel", "message": "Stop, please."}),
    );
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.failed");
    assert_eq!(output["status"], "cancelled");
    assert_eq!(
        output["error"],
        json!({"code": "cancelled", "message": "Stop, please."})
    );
    m.py.wait_stderr("slow(30.0) cancelled").await;
    let cancels = s.gates.toolgate.requests_of("cancel");
    assert_eq!(cancels.len(), 1);
    assert_eq!(cancels[0].token.as_deref(), Some(TOKEN));
    assert_eq!(s.gates.toolgate.cancels(), [EFFECT]);
    assert!(
        !s.core
            .run_frames(s.conn, "run-1")
            .iter()
            .any(|(m, p)| m == "effect.outcome" && p["effectId"] == EFFECT)
    );
}

#[tokio::test]
async fn a_shutdown_or_ownership_loss_mid_call_leaves_the_call_at_the_gate() {
    let m = mcp_setup().await;
    let s = &m.s;
    for (i, reason) in ["ownership.lost", "shutdown"].into_iter().enumerate() {
        let (run, turn) = (format!("run-{i}"), format!("turn_{i}"));
        let effect = format!("{turn}:0:tool:s0.c1");
        s.gates.script([fake_gates::tool_call(
            "c1",
            "py__slow",
            json!({"seconds": 30 + i}),
        )]);
        let mut ts = py_turn("Wait.");
        ts["checkpoint"]["turnId"] = json!(turn);
        s.core.grant_turn(&run, &format!("token-{i}"), ts);
        m.py.wait_stderr(&format!("slow({}.0) started", 30 + i))
            .await;
        s.core
            .send_msg(s.conn, "cancel", json!({"runId": run, "reason": reason}));
        assert_eq!(
            wait_end(&s.core, &run).await,
            (
                "lease.release".to_owned(),
                json!({"runId": run, "reason": reason})
            )
        );
        assert!(s.gates.toolgate.cancels().is_empty());
        assert!(!m.py.stderr().iter().any(|l| l.contains("cancelled")));
        assert_eq!(s.gates.toolgate.executions(&effect), 1);
        assert!(
            !s.core
                .run_frames(s.conn, &run)
                .iter()
                .any(|(m, p)| m == "effect.outcome" && p["effectId"] == effect)
        );
    }
}

#[tokio::test]
async fn a_stale_run_at_the_gate_stops_the_run() {
    let m = mcp_setup().await;
    let s = &m.s;
    let journal = s.core.state.journal.clone();
    // Another owner takes the session as the call is journaled: the token goes stale.
    s.core.on_request(move |method, p| {
        if method == "effect.intent" && p["effect"]["effectId"] == EFFECT {
            journal.renewed("run-1", "someone-elses-token");
        }
    });
    s.gates
        .script([fake_gates::tool_call("c1", "py__tick", json!({}))]);
    s.core.grant_turn("run-1", TOKEN, py_turn("Tick."));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(
        (method, output),
        (
            "lease.release".to_owned(),
            json!({"runId": "run-1", "reason": "ownership.lost"})
        )
    );
    let calls = s.gates.toolgate.requests_of("tool-calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].status, 409);
    assert_eq!(s.gates.toolgate.executions(EFFECT), 0);
}

/// A new podhost on the same disk, and core offering the first turn's segment again with what it
/// recorded (outcomes and the session's MCP facts) as run 2; `(connection, end method, end
/// params)`.
async fn replay_after_crash(
    s: &mut crate::turn::Setup,
    ts: serde_json::Value,
) -> (u64, String, serde_json::Value) {
    let mark = s.core.mark();
    let mut env = pod_env(&s.core, &s.dirs);
    set_env(&mut env, "NYLORUN_GATES_URL", &s.gates.url());
    s.pod = PodProcess::spawn(&env);
    let (_, conn, _) = s.core.wait_request(mark, "hello").await;
    let mut again = ts;
    again["outcomes"] = json!(s.core.journal().completed_outcomes("turn_1", 0));
    again["mcp"] = s.core.journal().mcp_facts(crate::mcp::SESSION).unwrap();
    s.core.grant_turn("run-2", "run-token-2", again);
    let (method, output) = wait_end(&s.core, "run-2").await;
    (conn, method, output)
}

#[tokio::test]
async fn a_crash_replays_with_the_same_ids_and_hashes_and_runs_the_call_once() {
    let mut m = mcp_setup().await;
    let s = &mut m.s;
    s.gates.script([
        fake_gates::tool_call("c1", "py__tick", json!({})),
        fake_gates::text("Ticked once."),
    ]);
    let ts = py_turn("Tick.");
    s.gates.toolgate.hold_answers(true);
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    // The gate ran the call; its answer waits; podhost dies before it has it.
    s.gates
        .toolgate
        .wait_for("the call to run", |g| {
            (g.executions(EFFECT) == 1).then_some(())
        })
        .await;
    m.py.wait_stderr("tick 1").await;
    let s = &mut m.s;
    s.pod.signal(Signal::SIGKILL);
    s.pod.wait_exit(WAIT).await;
    s.gates.toolgate.hold_answers(false);
    let first = intents_of(s, s.conn, "run-1");

    // A new podhost; core offers the segment again with what it recorded.
    let (conn, method, output) = replay_after_crash(s, ts).await;
    assert_eq!(method, "turn.completed", "{output}");

    // The model call replayed; the tool call was asked with the same id and hash, rejoined
    // under the same key with the same bytes, and ran once.
    let second = intents_of(s, conn, "run-2");
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(second[0], first[1]);
    assert_eq!(second.len(), 2);
    assert_eq!(second[1].0, "turn_1:0:model:s1");
    let calls = s.gates.toolgate.requests_of("tool-calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].raw, calls[0].raw);
    assert_eq!(calls[1].token.as_deref(), Some("run-token-2"));
    assert_eq!(s.gates.toolgate.executions(EFFECT), 1);
    assert_eq!(outcome_of(s, conn, "run-2", EFFECT), tick_1());
    let ticks: Vec<String> =
        m.py.stderr()
            .into_iter()
            .filter(|l| l.starts_with("tick"))
            .collect();
    assert_eq!(ticks, ["tick 1"]);
    // Discovery was not run again: core's TurnStart carried the facts.
    assert_eq!(s.core.journal().mcp_reports().len(), 1);
}

/// podhost killed (SIGKILL, by its failpoint) at each Tool Gate crash boundary: right after
/// core answered the call's intent `execute` (nothing sent yet), and right after the gate
/// answered (the call ran, no outcome recorded). The next podhost asks for the call with the
/// same id and hash, sends it under the same key with the same bytes, and it runs once.
#[tokio::test]
async fn a_kill_at_each_tool_gate_boundary_runs_the_call_once() {
    for fp in podhost::failpoints::POD_TOOL_GATE {
        let mut m =
            mcp_setup_with(|env| set_env(env, "PODHOST_FAILPOINTS", &format!("{fp}=kill"))).await;
        let s = &mut m.s;
        s.gates.script([
            fake_gates::tool_call("c1", "py__tick", json!({})),
            fake_gates::text("Ticked once."),
        ]);
        let ts = py_turn("Tick.");
        s.core.grant_turn("run-1", TOKEN, ts.clone());
        let status = s.pod.wait_exit(WAIT).await;
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9),
            "{fp}: {status:?}"
        );
        let first = intents_of(s, s.conn, "run-1");
        let sent_before = s.gates.toolgate.requests_of("tool-calls").len();
        assert_eq!(
            (sent_before, s.gates.toolgate.executions(EFFECT)),
            if *fp == "pod.toolgate_after_intent" {
                (0, 0)
            } else {
                (1, 1)
            },
            "{fp}"
        );

        let (conn, method, output) = replay_after_crash(s, ts).await;
        assert_eq!(method, "turn.completed", "{fp}: {output}");

        let second = intents_of(s, conn, "run-2");
        assert_eq!(first.len(), 2, "{fp}: {first:?}");
        assert_eq!(second[0], first[1], "{fp}");
        let calls = s.gates.toolgate.requests_of("tool-calls");
        assert_eq!(calls.len(), sent_before + 1, "{fp}");
        assert_eq!(calls.last().unwrap().raw, calls[0].raw, "{fp}");
        assert_eq!(s.gates.toolgate.executions(EFFECT), 1, "{fp}");
        assert_eq!(outcome_of(s, conn, "run-2", EFFECT), tick_1(), "{fp}");
        let ticks: Vec<String> =
            m.py.stderr()
                .into_iter()
                .filter(|l| l.starts_with("tick"))
                .collect();
        assert_eq!(ticks, ["tick 1"], "{fp}");
    }
}
