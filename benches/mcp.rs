//! One MCP call through podhost and the Tool Gate, against the same call made directly to the
//! server, measured in the same run.
//!
//! * **through podhost**: `podhost pod` (release) runs a turn whose model calls
//!   `everything__echo`; the time from the call's `effect.intent` reaching the fake core to its
//!   `effect.outcome` arriving — the intent's answer, the `tool-calls` hop to the fake Tool Gate,
//!   the gate's forward to `@modelcontextprotocol/server-everything` over stdio (rmcp client),
//!   the answer back, the result made into an outcome, and the outcome's request;
//! * **direct**: the same `tools/call echo` from an rmcp client to its own server-everything
//!   process over stdio.
//!
//! Reports the medians of 41 calls each (after 3 to warm up) and their ratio. Needs the MCP test
//! servers (`tests/mcp/install`; without them it is skipped, and says so). Run with
//! `cargo bench --bench mcp`; `PODHOST_BENCH_SMOKE=1` makes a few calls of each, checked (see
//! `benches/support/smoke.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "../tests/support/fake_core/mod.rs"]
mod fake_core;

#[path = "../tests/support/fake_artifacts/mod.rs"]
mod fake_artifacts;

#[path = "../tests/support/fake_journal.rs"]
mod fake_journal;

#[path = "../tests/support/fake_gates.rs"]
mod fake_gates;

#[path = "../tests/support/fake_toolgate.rs"]
mod fake_toolgate;

#[path = "../tests/support/mcp_servers.rs"]
mod mcp_servers;

#[path = "../tests/support/turn_fixture.rs"]
mod turn_fixture;

use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use serde_json::json;

/// Calls measured, and calls before them that warm the server up.
fn rounds() -> (usize, usize) {
    smoke::pick((41, 3), (3, 1))
}
const KEY: &str = "bench-everything-key";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `tools/call echo` straight to server-everything, `ROUNDS` times.
async fn direct() -> Vec<Duration> {
    let js = mcp_servers::everything_js();
    let cmd = tokio::process::Command::new("node").configure(|c| {
        c.arg(&js).arg("stdio").kill_on_drop(true);
    });
    let (child, _) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("bench", "0"),
    )
    .serve(child)
    .await
    .unwrap();
    let (rounds, warm_up) = rounds();
    let mut times = Vec::with_capacity(rounds);
    for i in 0..rounds + warm_up {
        let params: CallToolRequestParams = serde_json::from_value(json!({
            "name": "echo", "arguments": {"message": format!("round {i}")}
        }))
        .unwrap();
        let started = Instant::now();
        let result = client.call_tool(params).await.unwrap();
        let took = started.elapsed();
        smoke::check(
            result.is_error != Some(true)
                && serde_json::to_string(&result)
                    .unwrap()
                    .contains(&format!("round {i}")),
            format_args!("echo, round {i}, answered {result:?}"),
        );
        if i >= warm_up {
            times.push(took);
        }
    }
    let _ = client.cancel().await;
    times
}

/// The same call through `podhost pod` and the fake Tool Gate, one turn per round.
async fn through_podhost() -> Vec<Duration> {
    let core = fake_core::FakeCore::start(fake_core::CoreOptions::default()).await;
    let gates = fake_gates::FakeGates::start(core.state.journal.clone()).await;
    gates
        .toolgate
        .add_server("everything", mcp_servers::everything(KEY), KEY);
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let join = dir.path().join("join");
    std::fs::write(&join, &core.opts().join_token).unwrap();
    let o = core.opts();
    let mut pod = tokio::process::Command::new(support::podhost_bin())
        .arg("pod")
        .env_clear()
        .envs([
            ("NYLORUN_SANDBOX_ID", o.sandbox_id.clone()),
            ("NYLORUN_POD_UID", o.pod_uid.clone()),
            ("NYLORUN_SANDBOX_JOIN_FILE", join.display().to_string()),
            ("NYLORUN_HARNESS_URL", core.url()),
            ("NYLORUN_GATES_URL", gates.url()),
            ("HOME", dir.path().join("home").display().to_string()),
            (
                "PODHOST_HARNESS_ROOT",
                dir.path().join("harness").display().to_string(),
            ),
            ("PODHOST_WORKSPACE", workspace.display().to_string()),
            ("NYLORUN_HARNESS_HEALTH_PORT", "0".to_owned()),
            ("RUST_LOG", "warn".to_owned()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    core.wait_request(0, "hello").await;

    let (rounds, warm_up) = rounds();
    let mut times = Vec::with_capacity(rounds);
    for i in 0..rounds + warm_up {
        let turn = format!("turn_{i}");
        gates.script([
            fake_gates::tool_call(
                "c1",
                "everything__echo",
                json!({"message": format!("round {i}")}),
            ),
            fake_gates::text("Echoed."),
        ]);
        let mut ts = turn_fixture::turn_start(json!("Echo."));
        ts["checkpoint"]["turnId"] = json!(turn);
        ts["manifest"]["mcpServers"] = json!([{"name": "everything"}]);
        if let Some(facts) = core.journal().mcp_facts(turn_fixture::SESSION) {
            ts["mcp"] = facts;
        }
        let run = format!("run-{i}");
        core.grant_turn(&run, &format!("token-{i}"), ts);
        let (frame, _) = core.wait_run_end(&run).await;
        assert_eq!(frame["m"], "turn.completed", "{frame}");
        let effect = format!("{turn}:0:tool:s0.c1");
        let timing = core
            .journal()
            .timings()
            .into_iter()
            .find(|t| t.effect_id == effect)
            .unwrap();
        let outcome = core.journal().row(&effect).and_then(|r| r.value);
        smoke::check(
            outcome.as_ref().is_some_and(|v| {
                v["kind"] == "completed" && v.to_string().contains(&format!("round {i}"))
            }),
            format_args!("{effect}: the echo's outcome is {outcome:?}"),
        );
        if i >= warm_up {
            times.push(timing.outcome_at.unwrap() - timing.intent_at);
        }
    }
    let _ = pod.kill().await;
    times
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let installed = mcp_servers::install_dir()
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    if !installed.exists() {
        smoke::missing(
            "the mcp bench",
            &format!(
                "the MCP test servers are not installed ({} is missing)",
                installed.display()
            ),
            "run tests/mcp/install (node with npm, python3 with venv)",
        );
        smoke::finish("mcp");
        return;
    }
    let direct = median(direct().await);
    let through = median(through_podhost().await);
    smoke::check_positive("direct and through podhost", &[ms(direct), ms(through)]);
    println!("mcp call, median of {}:", rounds().0);
    println!(
        "  direct to server-everything over stdio:            {:8.3} ms",
        ms(direct)
    );
    println!(
        "  through podhost and the Tool Gate, intent→outcome: {:8.3} ms",
        ms(through)
    );
    println!(
        "  ratio: {:.2}x (overhead {:.3} ms per call)",
        through.as_secs_f64() / direct.as_secs_f64(),
        ms(through.saturating_sub(direct))
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    smoke::finish("mcp");
}
