//! Crash anywhere: `podhost pod` is killed (SIGKILL) at each effect boundary of a turn, started
//! again against the same fake core, and the turn replayed; what v5 §4 says of each boundary is
//! the table below.
//!
//! The turn: the model calls `bash` (append a line to `log.txt`, write `outputs/report.txt`,
//! print 60 kB, of which 30 000 characters are kept and spilled in chunks), then answers. Every row checks that the restarted run asks
//! for the same effect ids with the same request hashes, that no model call reached the model
//! twice (one usage row per effect id), and how often the command ran.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, FakeCore};
use crate::fake_gates::{self, FakeGates, Reply};
use crate::turn::{TOKEN, TURN, turn_start, wait_end};
use crate::{PodDirs, PodProcess, pod_env, set_env};

const COMMAND: &str = "echo ran >> log.txt && mkdir -p outputs && echo report > \
                       outputs/report.txt && head -c 60000 /dev/zero | tr '\\0' a";
const TOOL: &str = "turn_1:0:tool:s0.c1";

/// What the command's outcome is after the restart.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Tool {
    /// Ran before the crash and recorded: replayed, not run again.
    Replayed,
    /// Journaled `execute` and then lost: core answers `tool.interrupted`, never re-run.
    Interrupted,
    /// Nothing journaled before the crash: it runs in the restarted run.
    Ran,
}

/// One boundary: where the first process dies, and what must hold after the restart.
struct Row {
    /// The failpoint killed at, or `None` when the test kills the pod itself (a model call at
    /// the gate).
    failpoint: Option<&'static str>,
    /// Lines in `log.txt` at the end: the command's side effect, never twice.
    log_lines: usize,
    tool: Tool,
    /// Effects the restarted run asks core for (the rest are replayed from `outcomes`).
    asked: &'static [&'static str],
}

const ROWS: &[Row] = &[
    Row {
        failpoint: Some("pod.before_intent"),
        log_lines: 1,
        tool: Tool::Ran,
        asked: &["turn_1:0:model:s0", TOOL, "turn_1:0:model:s1"],
    },
    Row {
        failpoint: Some("pod.after_execute"),
        log_lines: 0,
        tool: Tool::Interrupted,
        asked: &[TOOL, "turn_1:0:model:s1"],
    },
    Row {
        failpoint: Some("pod.after_tool"),
        log_lines: 1,
        tool: Tool::Interrupted,
        asked: &[TOOL, "turn_1:0:model:s1"],
    },
    Row {
        failpoint: Some("pod.mid_upload"),
        log_lines: 1,
        tool: Tool::Interrupted,
        asked: &[TOOL, "turn_1:0:model:s1"],
    },
    Row {
        failpoint: Some("pod.after_outcome"),
        log_lines: 1,
        tool: Tool::Replayed,
        asked: &["turn_1:0:model:s1"],
    },
    Row {
        failpoint: None,
        log_lines: 1,
        tool: Tool::Replayed,
        asked: &["turn_1:0:model:s1"],
    },
    Row {
        failpoint: Some("pod.mid_export"),
        log_lines: 1,
        tool: Tool::Replayed,
        asked: &[],
    },
    Row {
        failpoint: Some("pod.after_output_sent"),
        log_lines: 1,
        tool: Tool::Replayed,
        asked: &[],
    },
];

/// `(method, effect id, request hash)` of every intent in `frames`.
fn intents(frames: &[(String, Value)]) -> BTreeMap<String, String> {
    frames
        .iter()
        .filter(|(m, _)| m == "effect.intent")
        .map(|(_, p)| {
            (
                p["effect"]["effectId"].as_str().unwrap().to_owned(),
                p["requestHash"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn crash_at(row: &Row) {
    let what = row.failpoint.unwrap_or("a model call at the gate");
    let core = FakeCore::start(CoreOptions::default()).await;
    let gates = FakeGates::start(core.state.journal.clone()).await;
    let dirs = PodDirs::new(&core);
    let mut env = pod_env(&core, &dirs);
    set_env(&mut env, "NYLORUN_GATES_URL", &gates.url());
    let answer = fake_gates::text("Done.");
    let second = match row.failpoint {
        Some(_) => answer.clone(),
        None => Reply::Hang,
    };
    gates.script([
        fake_gates::tool_call("c1", "bash", json!({"command": COMMAND})),
        second,
    ]);
    let mut ts = turn_start(json!("Log it."));
    // Past the record entry, the output (30 000 characters kept) is spilled in 8 KiB chunks.
    ts["limits"]["recordEntryBytes"] = json!(20_000);
    ts["limits"]["chunkBytes"] = json!(8_192);

    // The first process dies at the boundary.
    let mut first_env = env.clone();
    if let Some(fp) = row.failpoint {
        set_env(&mut first_env, "PODHOST_FAILPOINTS", &format!("{fp}=kill"));
    }
    let mut pod = PodProcess::spawn(&first_env);
    let (_, conn1, _) = core.wait_request(0, "hello").await;
    core.grant_turn("run-1", TOKEN, ts.clone());
    if row.failpoint.is_none() {
        gates.wait_call(1).await;
        pod.signal(nix::sys::signal::Signal::SIGKILL);
    }
    let status = pod.wait_exit(crate::WAIT).await;
    assert_eq!(status.signal(), Some(9), "{what}: {:?}", pod.logs());
    let first = core.run_frames(conn1, "run-1");
    let settled = core
        .journal()
        .outputs()
        .iter()
        .any(|(r, m, _)| r == "run-1" && m == "turn.completed");

    // The same core, a new process: core offers the segment again with what it recorded.
    let mark = core.mark();
    let _pod = PodProcess::spawn(&env);
    let (_, conn2, _) = core.wait_request(mark, "hello").await;
    if !settled {
        let mut replay = ts.clone();
        replay["outcomes"] = json!(core.journal().completed_outcomes(TURN, 0));
        core.grant_turn("run-2", "run-token-2", replay);
        if row.failpoint.is_none() {
            gates.release("turn_1:0:model:s1", crate::turn::candidate_of(&answer));
        }
        let (method, output) = wait_end(&core, "run-2").await;
        assert_eq!(
            (method.as_str(), &output["output"]),
            ("turn.completed", &json!("Done.")),
            "{what}: {output}"
        );
        let second = core.run_frames(conn2, "run-2");
        let (i1, i2) = (intents(&first), intents(&second));
        // The same ids ask with the same hashes.
        for (id, hash) in &i2 {
            if let Some(h) = i1.get(id) {
                assert_eq!(h, hash, "{what}: {id} drifted");
            }
        }
        let asked: Vec<&str> = i2.keys().map(String::as_str).collect();
        let mut want = row.asked.to_vec();
        want.sort();
        assert_eq!(asked, want, "{what}");
    } else {
        // Core took the output before the crash: nothing is offered again (v5: the turn is
        // settled), and the pod simply leases.
        assert_eq!(row.asked, &[] as &[&str], "{what}");
        core.wait_request(mark, "lease").await;
    }
    let lines = std::fs::read_to_string(dirs.workspace.join("log.txt"))
        .map(|t| t.lines().count())
        .unwrap_or(0);
    assert_eq!(lines, row.log_lines, "{what}: the command's side effect");
    let tool = core.journal().row(TOOL).expect("the tool was journaled");
    let interrupted = tool.value.as_ref().map(|v| v["code"] == "tool.interrupted");
    assert_eq!(
        interrupted,
        Some(row.tool == Tool::Interrupted),
        "{what}: {:?}",
        tool.value
    );
    // No model call reached the model twice: a rejoin joined the first one.
    let usage = gates.usage_rows();
    assert!(usage.values().all(|n| *n == 1), "{what}: {usage:?}");
    assert_eq!(usage.len(), 2, "{what}: {usage:?}");
}

#[tokio::test]
async fn every_effect_boundary_survives_a_kill_as_v5_says() {
    // Every failpoint of the pod host has its row.
    let covered: Vec<&str> = ROWS.iter().filter_map(|r| r.failpoint).collect();
    let mut all = podhost::failpoints::POD.to_vec();
    all.sort();
    let mut sorted = covered.clone();
    sorted.sort();
    assert_eq!(sorted, all);
    for row in ROWS {
        crash_at(row).await;
    }
}
