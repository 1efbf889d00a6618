//! What a BYOH turn costs `podhost serve` in CPU, with a model that answers at once.
//!
//! Each turn is one session as an evaluator submits it: `submit`, a model call that asks for
//! `bash` `true`, the command (through the session's holder and a supervisor), a second model
//! call that answers, and the evaluator's `get_status` polls until the turn ended. Default
//! settings (SQLite; as root, each session a uid of the default pool, a disk and a network of
//! its own), `IN_FLIGHT` sessions at once.
//!
//! Reports, for every round (and the median of the rounds): serve's own CPU per turn (user and
//! system time of the process, `/proc/<pid>/stat`), its reaped children's (session holders,
//! supervisors and their commands), the part spent on the evaluator's polls (their count times
//! a `get_status`'s cost, measured alone after the rounds against the same server), and serve's
//! own CPU by thread (the store's writer, the runtime's threads, threads that have exited).
//!
//! Run with `cargo bench --bench turn_cpu`; `TURN_CPU_TURNS` sets the turns of a round (300)
//! and `TURN_CPU_ROUNDS` the rounds (5). `PODHOST_BENCH_SMOKE=1` runs two rounds of five
//! turns, checked. To profile: `TURN_CPU_PAUSE=1` prints serve's pid and waits for Enter
//! before the rounds (`perf record -g -p <pid>` meanwhile).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "../tests/support/openai_fake.rs"]
mod openai_fake;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openai_fake::{FakeModel, Reply};
use serde_json::{Value, json};

const TOKEN: &str = "bench-token";
/// Sessions submitted at once.
const IN_FLIGHT: usize = 8;
/// How often the evaluator asks whether a turn ended.
const POLL_EVERY: Duration = Duration::from_millis(50);

fn setting(var: &str, full: usize, smoke: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(smoke::pick(full, smoke))
}

/// A `podhost serve`; killed when dropped.
struct Serve {
    child: Child,
    url: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_serve(data: &Path) -> Serve {
    let mut child = Command::new(env!("CARGO_BIN_EXE_podhost"))
        .arg("serve")
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_DATA", data)
        .env("PODHOST_TOKEN", TOKEN)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    // Drains serve's log (as a terminal or a collector would) and finds its address.
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on http://").nth(1)
                && let Some(tx) = tx.take()
            {
                let addr: String = rest
                    .chars()
                    .take_while(|c| !c.is_whitespace() && *c != '"')
                    .collect();
                let _ = tx.send(addr);
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    Serve {
        child,
        url: format!("http://{addr}"),
    }
}

/// The fields of a `/proc/…/stat` line after the command's name, and the name.
fn stat_fields(path: &str) -> Option<(String, Vec<f64>)> {
    let stat = std::fs::read_to_string(path).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_owned();
    let f = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    Some((name, f))
}

/// CPU of a process in ms: its own (user + system) and its reaped children's.
#[derive(Clone, Copy, Default)]
struct Cpu {
    own: f64,
    children: f64,
}

/// Clock ticks of 10 ms (USER_HZ is 100 on Linux): fields 14 to 17 of the line are utime,
/// stime, cutime, cstime, 11 to 14 after the name.
fn ticks_ms(f: &[f64], i: usize) -> f64 {
    f.get(i).copied().unwrap_or(0.0) * 10.0
}

fn cpu(pid: u32) -> Cpu {
    let (_, f) = stat_fields(&format!("/proc/{pid}/stat")).unwrap_or_default();
    Cpu {
        own: ticks_ms(&f, 11) + ticks_ms(&f, 12),
        children: ticks_ms(&f, 13) + ticks_ms(&f, 14),
    }
}

/// Serve's own CPU in ms by thread name (its live threads only).
fn threads(pid: u32) -> BTreeMap<String, f64> {
    let mut by = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return by;
    };
    for t in tasks.flatten() {
        let path = t.path().join("stat");
        if let Some((name, f)) = stat_fields(&path.to_string_lossy()) {
            *by.entry(name).or_insert(0.0) += ticks_ms(&f, 11) + ticks_ms(&f, 12);
        }
    }
    by
}

/// Submits session `id` and polls until its turn ended: its status and the polls made.
async fn one_turn(http: &reqwest::Client, url: &str, id: &str, base_url: &str) -> (String, usize) {
    let body = json!({
        "protocol_version": "1", "session_id": format!("s-{id}"), "invocation_id": id,
        "session_action": "start",
        "input_messages": [{"role": "user", "content": format!("task {id}")}],
        "model_connection": {"base_url": base_url, "model": "fake-model", "api_key": "k"}
    });
    let r = http
        .post(format!("{url}/submit"))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    assert!(
        code == 200 || code == 202,
        "submit answered {code}: {}",
        r.text().await.unwrap()
    );
    let mut polls = 0;
    loop {
        tokio::time::sleep(POLL_EVERY).await;
        polls += 1;
        let v: Value = http
            .get(format!("{url}/get_status?invocation_id={id}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        match v["status"].as_str().unwrap_or("") {
            "queued" | "running" => {}
            s => return (s.to_owned(), polls),
        }
    }
}

/// Runs turns `ids`, `IN_FLIGHT` at once: the statuses they ended with and the polls made.
async fn round(url: &str, base_url: &str, ids: Vec<String>) -> (Vec<String>, usize) {
    let http = reqwest::Client::new();
    let ids = Arc::new(ids);
    let next = Arc::new(AtomicUsize::new(0));
    let polls = Arc::new(AtomicUsize::new(0));
    let ends = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..IN_FLIGHT.min(ids.len()))
        .map(|_| {
            let (http, ids, next, polls, ends) = (
                http.clone(),
                ids.clone(),
                next.clone(),
                polls.clone(),
                ends.clone(),
            );
            let (url, base_url) = (url.to_owned(), base_url.to_owned());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(id) = ids.get(i) else { return };
                    let (end, n) = one_turn(&http, &url, id, &base_url).await;
                    polls.fetch_add(n, Ordering::Relaxed);
                    ends.lock().unwrap().push(end);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let ends = ends.lock().unwrap().clone();
    (ends, polls.load(Ordering::Relaxed))
}

/// Serve's own CPU per `get_status` of an ended turn, in ms, over `n` calls.
async fn status_cost(serve: &Serve, id: &str, n: usize) -> f64 {
    let http = reqwest::Client::new();
    let before = cpu(serve.child.id());
    for _ in 0..n {
        let r = http
            .get(format!("{}/get_status?invocation_id={id}", serve.url))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        smoke::check(r.status() == 200, "get_status answered");
        r.bytes().await.unwrap();
    }
    (cpu(serve.child.id()).own - before.own) / n as f64
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    println!("turn CPU benchmark ({})", smoke::build());
    let turns = setting("TURN_CPU_TURNS", 300, 5);
    let rounds = setting("TURN_CPU_ROUNDS", 5, 2);
    let root = nix::unistd::geteuid().is_root();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.set_keep_messages(false);
    fake.forget_requests();
    let wrong = Arc::new(AtomicUsize::new(0));
    let seen_wrong = wrong.clone();
    // Model → bash `true` → model: the command's result must be a success.
    fake.respond_with(move |body| {
        let messages = body["messages"].as_array().unwrap();
        match messages.iter().find(|m| m["role"] == "tool") {
            None => Reply::call("t", "bash", json!({"command": "true"})),
            Some(result) => {
                let out: Value = serde_json::from_str(result["content"].as_str().unwrap_or(""))
                    .unwrap_or_default();
                if out["exitCode"] != 0 {
                    seen_wrong.fetch_add(1, Ordering::Relaxed);
                }
                Reply::text("done")
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let serve = start_serve(&dir.path().join("data"));
    let pid = serve.child.id();
    println!(
        "{rounds} rounds of {turns} turns (a session each: model → bash `true` → model), \
         {IN_FLIGHT} at once, polled every {} ms; default settings ({})",
        POLL_EVERY.as_millis(),
        if root {
            "root: a uid of the default pool, a disk and a network of its own each"
        } else {
            "not root: podhost's own uid"
        }
    );
    // A first turn outside the rounds: what happens once per process (the runtime's threads,
    // the store's pages, the first sandbox) is not a turn's.
    let (warm, _) = round(&serve.url, &fake.base_url(), vec!["warm".to_owned()]).await;
    smoke::check(
        warm == ["completed"],
        format_args!("warm-up ended {warm:?}"),
    );
    if std::env::var_os("TURN_CPU_PAUSE").is_some() {
        println!("serve's pid is {pid}: press Enter to start the rounds");
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
    }
    let mut own = Vec::new();
    let mut children = Vec::new();
    let mut polls_per_turn = Vec::new();
    let threads_before = threads(pid);
    let cpu_before = cpu(pid);
    for r in 0..rounds {
        let ids: Vec<String> = (0..turns).map(|i| format!("r{r}-{i}")).collect();
        let before = cpu(pid);
        let started = Instant::now();
        let (ends, polls) = round(&serve.url, &fake.base_url(), ids).await;
        let took = started.elapsed();
        let after = cpu(pid);
        let completed = ends.iter().filter(|s| *s == "completed").count();
        smoke::check(
            completed == turns,
            format_args!("{completed} of {turns} turns completed: {ends:?}"),
        );
        let (o, c) = (
            (after.own - before.own) / turns as f64,
            (after.children - before.children) / turns as f64,
        );
        let p = polls as f64 / turns as f64;
        println!(
            "  round {}: {:.2} ms of serve's own CPU a turn, {:.2} ms of its children's; \
             {p:.1} polls a turn; {:.1} turns/s",
            r + 1,
            o,
            c,
            turns as f64 / took.as_secs_f64()
        );
        own.push(o);
        children.push(c);
        polls_per_turn.push(p);
    }
    let all = turns * rounds;
    let cpu_after = cpu(pid);
    let threads_after = threads(pid);
    smoke::check(wrong.load(Ordering::Relaxed) == 0, "every `true` succeeded");
    let per_status = status_cost(&serve, "warm", smoke::pick(2000, 20)).await;
    let (mo, mc, mp) = (median(&own), median(&children), median(&polls_per_turn));
    if !smoke::on() {
        smoke::check_positive("serve's own CPU a turn", &own);
    }
    println!(
        "median of {rounds} rounds: {mo:.2} ms of serve's own CPU a turn (goal ≤ 5), {mc:.2} ms \
         of its children's"
    );
    println!(
        "  of serve's own: the evaluator's polls {:.2} ms ({mp:.1} a turn at {per_status:.3} ms \
         each), the turn itself {:.2} ms",
        mp * per_status,
        mo - mp * per_status
    );
    let total = cpu_after.own - cpu_before.own;
    let mut named = 0.0;
    let mut parts = Vec::new();
    for (name, after) in &threads_after {
        let spent = after - threads_before.get(name).copied().unwrap_or(0.0);
        named += spent;
        parts.push(format!("{name} {:.2}", spent / all as f64));
    }
    parts.push(format!(
        "exited threads {:.2}",
        (total - named) / all as f64
    ));
    println!(
        "  by thread, ms a turn over every round: {}",
        parts.join(", ")
    );
    smoke::finish("turn_cpu");
}
