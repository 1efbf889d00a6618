//! The journal's cost per tool call: a turn of 60 calls of one tool, with the round trips of
//! `effect.intent` and `effect.outcome` against the tool's own time, as podhost logs them; and
//! the memory a held run takes (a model call in flight at the gate), against the same pod idle
//! with as many leases waiting.

use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;

use crate::fake_core::{CoreOptions, FakeCore};
use crate::fake_gates::{self, FakeGates, Reply};
use crate::pod_launch::{PodDirs, pod_env, set_env};
use crate::smoke;
use crate::turn_fixture::turn_start;

fn bin() -> &'static std::path::Path {
    crate::support::podhost_bin()
}

struct Pod {
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<Value>>>,
}

/// `podhost pod` with JSON logs collected, the gates at `gates`.
async fn spawn(core: &FakeCore, gates: &FakeGates, dirs: &PodDirs, extra: &[(&str, &str)]) -> Pod {
    let mut env = pod_env(core, dirs);
    set_env(&mut env, "NYLORUN_GATES_URL", &gates.url());
    set_env(&mut env, "PODHOST_LOG_FORMAT", "json");
    for (k, v) in extra {
        set_env(&mut env, k, v);
    }
    let mut child = tokio::process::Command::new(bin())
        .arg("pod")
        .env_clear()
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let l = lines.clone();
    let stderr = child.stderr.take().unwrap();
    tokio::spawn(async move {
        let mut r = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = r.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                l.lock().unwrap().push(v);
            }
        }
    });
    core.wait_request(0, "hello").await;
    Pod { child, lines }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap()
}

/// Runs one turn of 60 calls (a smoke run: 4) of `tool` with `args`, and prints the journal's
/// round trips against the tool's own time, as podhost logged them.
async fn overhead(tool: &str, args: Value) {
    let calls = smoke::pick(60, 4);
    let core = FakeCore::start(CoreOptions::default()).await;
    let gates = FakeGates::start(core.state.journal.clone()).await;
    let dirs = PodDirs::new(&core);
    std::fs::write(dirs.workspace.join("small.txt"), "one\ntwo\nthree\n").unwrap();
    let pod = spawn(
        &core,
        &gates,
        &dirs,
        &[(
            "RUST_LOG",
            "info,podhost::nylorun::turn::effects=debug,podhost::nylorun::turn::run=debug",
        )],
    )
    .await;
    let mut script: Vec<Reply> = (0..calls)
        .map(|i| fake_gates::tool_call(&format!("c{i}"), tool, args.clone()))
        .collect();
    script.push(fake_gates::text("done"));
    gates.script(script);
    let mut ts = turn_start(json!("Run a tool many times."));
    ts["loop"] = json!({"yieldAfter": {"steps": 1000}});
    core.grant_turn("run-1", "tok", ts);
    let (end, answer) = core.wait_run_end("run-1").await;
    assert_eq!(end["m"], "turn.completed", "{end}");
    assert_eq!(answer["ok"], true, "core refused {end}: {answer}");

    let lines = pod.lines.lock().unwrap().clone();
    // The JSON log is flat: an event's fields beside its message.
    let field = |l: &Value, k: &str| l[k].clone();
    let ms_of = |method: &str| -> Vec<f64> {
        lines
            .iter()
            .filter(|l| field(l, "message") == "journal request answered")
            .filter(|l| {
                field(l, "what")
                    .as_str()
                    .is_some_and(|w| w.contains(":tool:"))
            })
            .filter(|l| field(l, "method") == method)
            .filter_map(|l| field(l, "ms").as_f64())
            .collect()
    };
    let (intent, outcome) = (ms_of("effect.intent"), ms_of("effect.outcome"));
    let ran: Vec<f64> = lines
        .iter()
        .filter(|l| field(l, "message") == "tool ran")
        .filter_map(|l| field(l, "ms").as_f64())
        .collect();
    // From core's side: an intent's arrival to its outcome's arrival.
    let core_side: Vec<f64> = core
        .journal()
        .timings()
        .iter()
        .filter(|t| t.kind == "tool")
        .filter_map(|t| {
            t.outcome_at
                .map(|o| (o - t.intent_at).as_secs_f64() * 1000.0)
        })
        .collect();
    assert_eq!(
        (intent.len(), outcome.len(), ran.len()),
        (calls, calls, calls)
    );
    let (i, o, t) = (median(intent), median(outcome), median(ran));
    smoke::check_positive(
        &format!("{tool}: the journal's round trips and the tool"),
        &[i, o, t],
    );
    println!(
        "{tool} x{calls} ({}): effect.intent round trip median {i:.3} ms, effect.outcome round \
         trip median {o:.3} ms, the tool alone median {t:.3} ms; (intent + outcome) / tool = \
         {:.2}; core sees intent→outcome median {:.3} ms",
        bin().display(),
        (i + o) / t,
        median(core_side)
    );
}

pub async fn main() {
    overhead("bash", json!({"command": "true"})).await;
    overhead("read", json!({"path": "small.txt"})).await;
    memory_per_held_run().await;
}

async fn memory_per_held_run() {
    // The pauses let start-up settle before RSS is read; they wait for no event.
    let pause = std::time::Duration::from_millis(smoke::pick(500, 100));
    for n in smoke::pick(vec![1usize, 10, 50], vec![1, 2]) {
        let core = FakeCore::start(CoreOptions::default()).await;
        let gates = FakeGates::start(core.state.journal.clone()).await;
        let dirs = PodDirs::new(&core);
        let mut pod = spawn(
            &core,
            &gates,
            &dirs,
            &[("PODHOST_POD_CONCURRENCY", &n.to_string())],
        )
        .await;
        // Idle: every slot's lease waiting.
        let mark = core.mark();
        for _ in 0..n {
            core.wait_request(mark, "lease").await;
        }
        tokio::time::sleep(pause).await;
        let pid = pod.child.id().unwrap();
        let idle = kib(pid, "VmRSS:");
        // Hold n runs, each with a model call in flight at the gate.
        gates.script((0..n).map(|_| Reply::Hang));
        for r in 0..n {
            let mut ts = turn_start(json!("Wait at the gate."));
            ts["checkpoint"]["sessionId"] = json!(format!("ses_{r}"));
            ts["checkpoint"]["turnId"] = json!(format!("turn_{r}"));
            core.grant_turn(&format!("run-{r}"), &format!("tok-{r}"), ts);
        }
        gates.wait_call(n - 1).await;
        tokio::time::sleep(pause).await;
        let held = kib(pid, "VmRSS:");
        println!(
            "{n} runs held (model call in flight each): RSS {held} KiB vs {idle} KiB idle with {n} \
             leases waiting: {:.1} KiB per run",
            (held as f64 - idle as f64) / n as f64
        );
        pod.child.kill().await.unwrap();
    }
}
