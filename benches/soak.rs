//! Soak: does podhost hold steady over many turns? Reports, after a warm-up and at the end, the
//! process's resident memory, open file descriptors, threads, and zombie children, for
//!
//! * `podhost serve` through `SESSIONS` BYOH sessions of [`turns`] turns each (a turn: a submit,
//!   a model call that runs `bash`, a second that asks the user a question; the next turn is
//!   the resume that answers it; the last one completes), `CONCURRENCY` sessions at a time;
//! * `podhost pod` through `POD_TURNS` turns (each runs `bash` and answers) against the fake
//!   core and Model Gate of the tests.
//!
//! Flat means: RSS within +10 % of the warm-up's, the same descriptors and threads, no zombie.
//! The end/warm-up ratio is printed for each. Both figures are taken at rest, [`settle`] after the
//! last turn: the pools that grow to the load's peak and shrink after it (the runtime's blocking
//! threads, which exit after 10 s idle; jemalloc's dirty pages, given back over 10 s) are then
//! at their resting size, so what remains grown is what the turns left behind. Under load,
//! serve's RSS is also printed after each tenth of the sessions: a leak's straight line reads
//! differently from a cache filling to its bound. `cargo bench --bench soak` runs the full counts;
//! `SOAK_SCALE=0.1` runs a tenth of them, `SOAK_ONLY=pod|serve` one of the two.
//! `PODHOST_BENCH_SMOKE=1` runs 4 sessions of 3 turns and 4 pod turns, resting 1 s, checked (see
//! `benches/support/smoke.rs`): it judges nothing flat, a scale that small says nothing of
//! growth, but every turn must end as it should and no zombie be left.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "support/listen.rs"]
mod listen;

#[path = "../tests/support/openai_fake.rs"]
mod openai_fake;

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

#[path = "../tests/support/turn_fixture.rs"]
mod turn_fixture;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openai_fake::{FakeModel, Reply};
use serde_json::{Value, json};

const TOKEN: &str = "soak-token";
const SESSIONS: usize = 1000;
/// Turns per session (a smoke run's 3: a start, a resume that goes on, one that finishes).
fn turns() -> usize {
    smoke::pick(10, 3)
}
const CONCURRENCY: usize = 16;
const POD_TURNS: usize = 1000;
/// How long the process rests before a figure is taken: past the 10 s after which tokio's idle
/// blocking threads exit and jemalloc gives back unused pages (a smoke run takes no figure worth
/// the wait).
fn settle() -> Duration {
    smoke::pick(Duration::from_secs(12), Duration::from_secs(1))
}

/// `n` at `SOAK_SCALE` (a smoke run: 4).
fn scaled(n: usize) -> usize {
    if smoke::on() {
        return 4;
    }
    let scale: f64 = std::env::var("SOAK_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    ((n as f64 * scale).round() as usize).max(2)
}

/// One look at a process.
#[derive(Clone, Copy, Debug)]
struct Sample {
    rss_kib: u64,
    /// Open descriptors other than sockets: files, pipes, the store's connections.
    fds: usize,
    /// Sockets: the listener's and the HTTP clients' keep-alive connections, which their pools
    /// keep up to the load's peak and close after 90 s idle — reported, not judged.
    sockets: usize,
    threads: u64,
    zombies: usize,
}

fn sample(pid: u32) -> Sample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    };
    let (mut fds, mut sockets) = (0, 0);
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let target = std::fs::read_link(fd.unwrap().path()).unwrap_or_default();
        if target.to_string_lossy().starts_with("socket:") {
            sockets += 1;
        } else {
            fds += 1;
        }
    }
    // Zombies: children of the process (and of its children) in state Z.
    let zombies = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let after = stat.rsplit_once(") ").map(|(_, a)| a).unwrap_or("");
            let mut it = after.split_whitespace();
            let state = it.next();
            let ppid: Option<u32> = it.next().and_then(|p| p.parse().ok());
            state == Some("Z") && ppid == Some(pid)
        })
        .count();
    Sample {
        rss_kib: field("VmRSS:"),
        fds,
        sockets,
        threads: field("Threads:"),
        zombies,
    }
}

fn report(what: &str, warm: Sample, end: Sample, took: Duration, units: &str, n: usize) {
    smoke::check(
        end.zombies == 0,
        format_args!("{what}: {} zombies at the end", end.zombies),
    );
    let ratio = end.rss_kib as f64 / warm.rss_kib as f64;
    println!("{what}: {n} {units} in {:.1} s", took.as_secs_f64());
    println!(
        "  RSS        warm-up {:>8} KiB  end {:>8} KiB  end/warm-up {ratio:.3}  {}",
        warm.rss_kib,
        end.rss_kib,
        if ratio <= 1.10 { "flat" } else { "GROWS" }
    );
    println!(
        "  other fds  warm-up {:>8}      end {:>8}      {}",
        warm.fds,
        end.fds,
        if end.fds <= warm.fds { "flat" } else { "GROWS" }
    );
    println!(
        "  sockets    warm-up {:>8}      end {:>8}      (keep-alive pools)",
        warm.sockets, end.sockets
    );
    println!(
        "  threads    warm-up {:>8}      end {:>8}      {}",
        warm.threads,
        end.threads,
        if end.threads <= warm.threads {
            "flat"
        } else {
            "GROWS"
        }
    );
    println!(
        "  zombies    warm-up {:>8}      end {:>8}      {}",
        warm.zombies,
        end.zombies,
        if end.zombies == 0 { "none" } else { "ZOMBIES" }
    );
}

/// A child process (`podhost serve`, or `pod` without a URL), killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `podhost serve`; its log goes to `<data>/../serve.log` (printed when a session
/// stalls).
fn start_server(data: &std::path::Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_podhost"))
        .arg("serve")
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_DATA", data)
        .env("PODHOST_TOKEN", TOKEN)
        .env("PODHOST_MAX_RUNNING", "64")
        .env(
            "RUST_LOG",
            "warn,podhost::byoh::runner=info,podhost::byoh=info",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = std::fs::File::create(data.with_file_name("serve.log")).unwrap();
    let addr = listen::listening_addr(&mut child, Duration::from_secs(30), move |line| {
        use std::io::Write;
        let _ = writeln!(log, "{line}");
    })
    .unwrap();
    Server {
        child,
        url: format!("http://{addr}"),
    }
}

async fn wait_status(http: &reqwest::Client, url: &str, id: &str, want: &str) {
    let started = Instant::now();
    loop {
        let v: Value = http
            .get(format!("{url}/get_status?invocation_id={id}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if v["status"] == want {
            return;
        }
        if started.elapsed() > Duration::from_secs(600) {
            panic!("{id} stalled: {v}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One session of `turns` turns.
async fn session(http: reqwest::Client, url: String, base_url: String, n: usize, turns: usize) {
    let (sid, id) = (format!("s{n}"), format!("i{n}"));
    let conn = json!({"base_url": base_url, "model": "fake-model", "api_key": "k"});
    let start = json!({"protocol_version": "1", "session_id": sid, "invocation_id": id,
        "session_action": "start", "input_messages": [{"role": "user", "content": "work"}],
        "model_connection": conn});
    let mut body = start;
    for turn in 0..turns {
        loop {
            let resp = http
                .post(format!("{url}/submit"))
                .bearer_auth(TOKEN)
                .json(&body)
                .send()
                .await
                .unwrap();
            if resp.status() != 409 {
                assert!(resp.status().is_success(), "{}", resp.status());
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let last = turn + 1 == turns;
        wait_status(
            &http,
            &url,
            &id,
            if last { "completed" } else { "input_required" },
        )
        .await;
        if last {
            break;
        }
        let out: Value = http
            .get(format!("{url}/collect_output?invocation_id={id}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ask = out["messages"].as_array().unwrap().last().unwrap()["tool_calls"][0]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        body = json!({"protocol_version": "1", "session_id": sid, "invocation_id": id,
            "session_action": "resume",
            "input_messages": [{"role": "tool", "tool_call_id": ask,
                                "content": if turn + 2 == turns { "finish" } else { "go on" }}],
            "model_connection": conn});
    }
}

async fn soak_serve() {
    // Kept: its serve.log tells what a stalled session did. Remove it after reading.
    let dir = tempfile::tempdir().unwrap().keep();
    println!("podhost serve's data and log: {}", dir.display());
    let fake = FakeModel::start("fake-model", Some("k")).await;
    // A turn: run a command, then ask the user; "finish" ends the session.
    fake.respond_with(|body| {
        let msgs = body["messages"].as_array().unwrap();
        let last = msgs.last().unwrap();
        let n = msgs.len();
        if last["role"] == "tool" && last["content"] == "finish" {
            return Reply::text("Finished.");
        }
        if last["role"] == "tool" && msgs[n - 2]["tool_calls"][0]["function"]["name"] == "bash" {
            return Reply::call(&format!("q{n}"), "ask_user", json!({"question": "go on?"}));
        }
        Reply::call(
            &format!("b{n}"),
            "bash",
            json!({"command": "echo step >> log.txt; wc -l < log.txt"}),
        )
    });
    let server = start_server(&dir.join("data"));
    let pid = server.child.id();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let sessions = scaled(SESSIONS);
    // Past the warm-up every pooled connection and worker has been in use (two rounds at
    // least), and the store has outgrown its writer's page cache (SQLite's default, 2 MiB,
    // which fills as the store grows: around the 350th session here), so what grows after it
    // is not a cache filling.
    let warm_up = (sessions * 4 / 10).max(2 * CONCURRENCY).min(sessions - 1);
    let run = |from: usize, to: usize| {
        let (http, url, base) = (http.clone(), server.url.clone(), fake.base_url());
        async move {
            let sem = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
            let mut tasks = Vec::new();
            for n in from..to {
                let permit = sem.clone().acquire_owned().await.unwrap();
                let (http, url, base) = (http.clone(), url.clone(), base.clone());
                tasks.push(tokio::spawn(async move {
                    session(http, url, base, n, turns()).await;
                    drop(permit);
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
    };
    let started = Instant::now();
    run(0, warm_up).await;
    tokio::time::sleep(settle()).await;
    let warm = sample(pid);
    // The curve between warm-up and end, a tenth of the rest at a time: growth that levels
    // off (an allocator's or a cache's) reads differently from a leak's straight line.
    let step = ((sessions - warm_up) / 10).max(1);
    let mut from = warm_up;
    while from < sessions {
        let to = (from + step).min(sessions);
        run(from, to).await;
        let s = sample(pid);
        println!(
            "  under load after {to:>5} sessions: RSS {:>8} KiB ({:.3}× warm-up), other fds {}, \
             threads {}",
            s.rss_kib,
            s.rss_kib as f64 / warm.rss_kib as f64,
            s.fds,
            s.threads
        );
        from = to;
    }
    let took = started.elapsed();
    tokio::time::sleep(settle()).await;
    let end = sample(pid);
    report(
        &format!(
            "podhost serve, {} turns per session, {CONCURRENCY} at a time",
            turns()
        ),
        warm,
        end,
        took,
        "sessions",
        sessions,
    );
    // A smoke run that passed leaves nothing behind.
    if smoke::on() {
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

async fn soak_pod() {
    use turn_fixture::turn_start;
    let core = fake_core::FakeCore::start(fake_core::CoreOptions::default()).await;
    let gates = fake_gates::FakeGates::start(core.state.journal.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    let root = dir.path().join("harness");
    std::fs::create_dir_all(&workspace).unwrap();
    let join_file = dir.path().join("join-token");
    std::fs::write(&join_file, &core.opts().join_token).unwrap();
    let o = core.opts().clone();
    let child = Command::new(env!("CARGO_BIN_EXE_podhost"))
        .arg("pod")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("NYLORUN_SANDBOX_ID", &o.sandbox_id)
        .env("NYLORUN_POD_UID", &o.pod_uid)
        .env("NYLORUN_SANDBOX_JOIN_FILE", &join_file)
        .env("NYLORUN_HARNESS_URL", core.url())
        .env("NYLORUN_GATES_URL", gates.url())
        .env("HOME", root.join("home"))
        .env("PODHOST_HARNESS_ROOT", &root)
        .env("PODHOST_WORKSPACE", &workspace)
        .env("NYLORUN_HARNESS_HEALTH_PORT", "0")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed however this ends, a failed check included.
    let pod = Server {
        child,
        url: String::new(),
    };
    let pid = pod.child.id();
    core.wait_request(0, "hello").await;
    let turns = scaled(POD_TURNS);
    let warm_up = (turns / 10).max(1);
    let started = Instant::now();
    let mut warm = None;
    for n in 0..turns {
        if n == warm_up {
            tokio::time::sleep(settle()).await;
            warm = Some(sample(pid));
        }
        let mut ts = turn_start(json!(format!("turn {n}")));
        ts["checkpoint"]["sessionId"] = json!(format!("ses_{n}"));
        ts["checkpoint"]["turnId"] = json!(format!("turn_{n}"));
        ts["routing"]["sandbox"]["ownerId"] = json!(format!("ses_{n}"));
        gates.script([
            fake_gates::tool_call("c1", "bash", json!({"command": "echo step >> log.txt"})),
            fake_gates::text("Done."),
        ]);
        let run_id = format!("run-{n}");
        core.grant_turn(&run_id, &format!("token-{n}"), ts);
        let (frame, answer) = core.wait_run_end(&run_id).await;
        assert_eq!(frame["m"], "turn.completed", "{frame}");
        assert_eq!(answer["ok"], true, "{answer}");
    }
    let took = started.elapsed();
    tokio::time::sleep(settle()).await;
    let end = sample(pid);
    drop(pod);
    let log = std::fs::read_to_string(workspace.join("log.txt")).unwrap_or_default();
    smoke::check(
        log.lines().count() == turns,
        format_args!(
            "every turn's command ran: {} lines for {turns} turns",
            log.lines().count()
        ),
    );
    report("podhost pod", warm.unwrap(), end, took, "turns", turns);
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // `SOAK_ONLY=pod` or `SOAK_ONLY=serve` runs one of the two.
    let only = std::env::var("SOAK_ONLY").unwrap_or_default();
    if only != "serve" {
        soak_pod().await;
    }
    if only != "pod" {
        soak_serve().await;
    }
    smoke::finish("soak");
}
