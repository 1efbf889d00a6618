//! Context budget benchmark: a 1,000-step `podhost serve` session against a model with a small
//! window, measured against the same session with a window so large that nothing is compacted
//! (the baseline, in the same run):
//!
//! * tokens before and after each compaction (podhost's calibrated estimate, and the server's own
//!   count of the first request after it);
//! * the prompt's size over the session, as the server counts it, against the window: it stays
//!   bounded while the session grows to 2,001 messages;
//! * the time per step early and late in the session, compacted and not.
//!
//! Run with `cargo bench --bench context` (release build of podhost, scripted model on
//! loopback that counts tokens with its own estimate and refuses past its window).
//! `PODHOST_BENCH_SMOKE=1` runs one 80-step session of each kind, long enough to be compacted,
//! checked (see `benches/support/smoke.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "support/listen.rs"]
mod listen;

#[path = "../tests/support/openai_fake.rs"]
mod openai_fake;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openai_fake::{FakeModel, Recorded, Reply};
use serde_json::{Value, json};

const TOKEN: &str = "bench-token";
const WINDOW: u64 = 16_000;

/// Steps per session, and sessions of each kind.
fn scale() -> (usize, usize) {
    smoke::pick((1000, 3), (80, 1))
}

struct Server {
    child: Child,
    url: String,
    logs: Arc<Mutex<Vec<String>>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(data: &std::path::Path, window: u64) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_podhost"))
        .arg("serve")
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_DATA", data)
        .env("PODHOST_TOKEN", TOKEN)
        .env("PODHOST_MAX_STEPS", "5000")
        .env("PODHOST_CONTEXT_WINDOW", window.to_string())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let logs = Arc::new(Mutex::new(Vec::new()));
    let sink = logs.clone();
    let addr = listen::listening_addr(&mut child, Duration::from_secs(30), move |line| {
        sink.lock().unwrap().push(line)
    })
    .unwrap();
    Server {
        child,
        url: format!("http://{addr}"),
        logs,
    }
}

fn is_summary(body: &Value) -> bool {
    body.get("tools").is_none()
}

/// Writes notes.txt once, reads it `steps - 1` times, then answers.
fn reader(steps: usize) -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    let n = AtomicUsize::new(0);
    let notes = "The build runs on two cores; tests wait for events, never sleep.\n".repeat(24);
    move |body| {
        if is_summary(body) {
            return Reply::text(
                "Summary: the agent wrote notes.txt (the project's notes) and has been reading \
                 it back, step after step, as the user asked; nothing in it changed.",
            );
        }
        match n.fetch_add(1, Ordering::SeqCst) {
            0 => Reply::call(
                "w",
                "write",
                json!({"path": "notes.txt", "content": notes.clone()}),
            ),
            k if k < steps => Reply::call(&format!("r{k}"), "read", json!({"path": "notes.txt"})),
            _ => Reply::text("Read it all."),
        }
    }
}

/// One session of `steps` steps: the requests the model saw, the compaction log lines, and when
/// each step request arrived (from the submit).
async fn session(
    steps: usize,
    window: u64,
    fake_window: Option<u64>,
) -> (Vec<Recorded>, Vec<String>, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.set_window(fake_window);
    fake.set_keep_messages(false);
    fake.respond_with(reader(steps));
    let server = start_server(&dir.path().join("data"), window);
    let http = reqwest::Client::new();
    let started = Instant::now();
    let resp = http
        .post(format!("{}/submit", server.url))
        .bearer_auth(TOKEN)
        .json(&json!({
            "protocol_version": "1", "session_id": "s", "invocation_id": "i",
            "session_action": "start",
            "input_messages": [{"role": "user", "content": format!("Write the notes, then read them back {} times.", steps - 1)}],
            "model_connection": {"base_url": fake.base_url(), "model": "fake-model",
                                 "generation_settings": {"max_tokens": 512}}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    loop {
        let v: Value = http
            .get(format!("{}/get_status?invocation_id=i", server.url))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        match v["status"].as_str() {
            Some("completed") => break,
            Some("failed") => panic!("{v}"),
            _ => {}
        }
        assert!(started.elapsed() < Duration::from_secs(900), "{v}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed();
    let out: Value = http
        .get(format!("{}/collect_output?invocation_id=i", server.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(out["messages"].as_array().unwrap().len(), 2 * steps + 1);
    let logs: Vec<String> = server
        .logs
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains("history compacted"))
        .cloned()
        .collect();
    (fake.requests(), logs, took)
}

fn field(line: &str, name: &str) -> u64 {
    line.split(&format!("{name}="))
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Milliseconds per step between step requests `from` and `to` (summary requests left out).
fn ms_per_step(steps: &[&Recorded], from: usize, to: usize) -> f64 {
    (steps[to].at - steps[from].at).as_secs_f64() * 1000.0 / (to - from) as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // The session's steps, and sessions of each kind.
    let (length, rounds) = scale();
    println!(
        "context benchmark ({length}-step session, window {WINDOW} tokens as the server counts; {})",
        smoke::build()
    );

    let mut compacted_runs = Vec::new();
    let mut baseline_runs = Vec::new();
    for _ in 0..rounds {
        compacted_runs.push(session(length, WINDOW, Some(WINDOW)).await);
        baseline_runs.push(session(length, 100_000_000, None).await);
    }

    // Tokens before and after each compaction (the first round; every round is the same).
    let (requests, logs, _) = &compacted_runs[0];
    let steps: Vec<&Recorded> = requests.iter().filter(|r| !is_summary(&r.body)).collect();
    let summaries = requests.len() - steps.len();
    println!(
        "  {} compactions, {summaries} summary calls, {} step requests",
        logs.len(),
        steps.len()
    );
    smoke::check(
        !logs.is_empty() && summaries == logs.len() && steps.len() == length + 1,
        format_args!(
            "a {length}-step session past its window is compacted: {} compactions, {summaries} \
             summary calls, {} step requests",
            logs.len(),
            steps.len()
        ),
    );
    let mut after_counts = Vec::new();
    let mut seen_summary = false;
    for r in requests {
        if is_summary(&r.body) {
            seen_summary = true;
        } else if seen_summary {
            after_counts.push(r.tokens);
            seen_summary = false;
        }
    }
    println!(
        "  compaction  step  before (est.)  after (est.)  ratio   first request after (server's count)"
    );
    for (i, line) in logs.iter().enumerate() {
        let (before, after) = (field(line, "before"), field(line, "after"));
        println!(
            "  {:>10}  {:>4}  {:>13}  {:>12}  {:>5.2}   {}",
            i + 1,
            field(line, "step"),
            before,
            after,
            after as f64 / before.max(1) as f64,
            after_counts.get(i).copied().unwrap_or(0)
        );
    }

    // The prompt's size over the session, against the window and the baseline.
    let (base_requests, _, _) = &baseline_runs[0];
    let base_steps: Vec<&Recorded> = base_requests.iter().collect();
    println!(
        "  step   messages in the session   prompt (server's count)   of the window   baseline prompt"
    );
    for k in (0..length).step_by(length / 10).chain([length]) {
        let r = steps[k];
        println!(
            "  {k:>4}   {:>23}   {:>23}   {:>12.0}%   {:>15}",
            2 * k + 1,
            r.tokens,
            100.0 * (r.tokens + 512) as f64 / WINDOW as f64,
            base_steps[k].tokens
        );
    }
    let max = steps.iter().map(|r| r.tokens + 512).max().unwrap();
    smoke::check(
        max <= WINDOW,
        format_args!("every prompt and its answer's room fit the window: {max} tokens"),
    );
    println!(
        "  largest prompt + answer room: {max} tokens = {:.0}% of the window (baseline at the \
         end: {} tokens, ×{:.1} the window)",
        100.0 * max as f64 / WINDOW as f64,
        base_steps[length].tokens,
        base_steps[length].tokens as f64 / WINDOW as f64
    );

    // Time per step early and late, compacted and not (medians of the rounds).
    let per_step = |runs: &[(Vec<Recorded>, Vec<String>, Duration)], from: usize, to: usize| {
        median(
            runs.iter()
                .map(|(reqs, _, _)| {
                    let s: Vec<&Recorded> = reqs.iter().filter(|r| !is_summary(&r.body)).collect();
                    ms_per_step(&s, from, to)
                })
                .collect(),
        )
    };
    // Early: the second tenth of the session; late: its last tenth.
    let (early, late) = ((length / 10, length / 5), (length * 9 / 10, length));
    let (c_early, c_late) = (
        per_step(&compacted_runs, early.0, early.1),
        per_step(&compacted_runs, late.0, late.1),
    );
    let (b_early, b_late) = (
        per_step(&baseline_runs, early.0, early.1),
        per_step(&baseline_runs, late.0, late.1),
    );
    smoke::check_positive("ms per step", &[c_early, c_late, b_early, b_late]);
    let total = |runs: &[(Vec<Recorded>, Vec<String>, Duration)]| {
        median(runs.iter().map(|r| r.2.as_secs_f64()).collect())
    };
    println!(
        "  ms per step (median of {rounds} rounds)   steps {:>4}-{:<4}   steps {:>4}-{:<4}   late/early",
        early.0, early.1, late.0, late.1
    );
    println!(
        "  compacted                           {c_early:>13.2}   {c_late:>14.2}   {:>10.2}",
        c_late / c_early
    );
    println!(
        "  baseline (never compacted)          {b_early:>13.2}   {b_late:>14.2}   {:>10.2}",
        b_late / b_early
    );
    println!(
        "  whole session: compacted {:.2} s, baseline {:.2} s (×{:.2})",
        total(&compacted_runs),
        total(&baseline_runs),
        total(&compacted_runs) / total(&baseline_runs)
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "  load average during the run (2 cores): {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    smoke::finish("context");
}
