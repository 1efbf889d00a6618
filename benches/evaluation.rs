//! An Oumi evaluation's scale, against `podhost serve` as an evaluator runs it:
//!
//! * **Sessions**: 5,000 sessions through one replica with the default settings (SQLite; as
//!   root, each session a uid of the default pool, a disk and a network of its own), each a
//!   `write`, a `bash` that reads the file back with the uid it runs as, and an answer. Every
//!   tool call must succeed. Reports sessions per second, serve's CPU per session (its own, and
//!   its reaped children's: supervisors and session holders), what a session keeps on disk, and
//!   what taking a uid from the store's free list costs (its transaction's own time, from
//!   serve's debug log, not the wait for the store's writer) for the first and the last tenth
//!   of the sessions, with their ratio: flat is about 1.
//! * **Takeovers**: three replicas on PostgreSQL, one held to 0.05 of a core (a cgroup v1 CPU
//!   quota) and stopped twice for longer than its lease while turns run; the turns lost to
//!   takeovers, as a count (goal 0), and the turns that did not complete.
//!
//! Run with `cargo bench --bench evaluation` (root for the uid pool, the sessions' disks and
//! the quota; without them it says what it left out). `EVALUATION_SESSIONS` and
//! `EVALUATION_TAKEOVER_SESSIONS` set the counts; `EVALUATION_ONLY=sessions` or `=takeovers`
//! runs one part. `PODHOST_BENCH_SMOKE=1` runs both at a hundredth of the counts, checked.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "../tests/support/openai_fake.rs"]
mod openai_fake;
#[path = "../tests/support/pg.rs"]
mod pg;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openai_fake::{FakeModel, Reply};
use serde_json::{Value, json};

const TOKEN: &str = "bench-token";
/// Sessions submitted at once: the evaluator's concurrency.
const IN_FLIGHT: usize = 64;

fn count(var: &str, full: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(smoke::pick(full, full / 100))
}

/// A `podhost serve` replica; killed when dropped (and its CPU group removed).
struct Replica {
    child: Child,
    url: String,
    /// Every log line (JSON), as it came.
    logs: Arc<Mutex<Vec<String>>>,
    cgroup: Option<PathBuf>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(cg) = &self.cgroup {
            let _ = std::fs::remove_dir(cg);
        }
    }
}

impl Replica {
    fn start(data: &Path, env: &[(&str, &str)]) -> Replica {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_podhost"));
        cmd.arg("serve")
            .env("PODHOST_LISTEN", "127.0.0.1:0")
            .env("PODHOST_DATA", data)
            .env("PODHOST_TOKEN", TOKEN)
            .env("PODHOST_LOG_FORMAT", "json")
            .env("RUST_LOG", "warn,podhost=info,podhost::byoh::store=debug")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let logs = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let kept = logs.clone();
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
                kept.lock().unwrap().push(line);
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(60)).unwrap();
        Replica {
            child,
            url: format!("http://{addr}"),
            logs,
            cgroup: None,
        }
    }

    /// The log lines whose message is `message`, as JSON.
    fn events(&self, message: &str) -> Vec<Value> {
        self.logs
            .lock()
            .unwrap()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["message"] == message)
            .collect()
    }
}

/// Puts `pid` under a CPU quota of `share` of one core (cgroup v1); `None` where it cannot.
fn cpu_cgroup(pid: u32, share: f64) -> Option<PathBuf> {
    let dir = PathBuf::from(format!(
        "/sys/fs/cgroup/cpu/podhost-evaluation-{}",
        std::process::id()
    ));
    std::fs::create_dir(&dir).ok()?;
    let ok = std::fs::write(dir.join("cpu.cfs_period_us"), "100000").is_ok()
        && std::fs::write(
            dir.join("cpu.cfs_quota_us"),
            ((share * 100_000.0) as u64).to_string(),
        )
        .is_ok()
        && std::fs::write(dir.join("cgroup.procs"), pid.to_string()).is_ok();
    if !ok {
        let _ = std::fs::remove_dir(&dir);
        return None;
    }
    Some(dir)
}

fn start_body(id: &str, base_url: &str) -> Value {
    json!({
        "protocol_version": "1", "session_id": format!("s-{id}"), "invocation_id": id,
        "session_action": "start",
        "input_messages": [{"role": "user", "content": format!("task {id}")}],
        "model_connection": {"base_url": base_url, "model": "fake-model", "api_key": "k"}
    })
}

/// Submits (a busy 409 or 503 is retried, as Oumi does) and waits for the turn's end; its status.
async fn run_one(http: &reqwest::Client, url: &str, id: &str, base_url: &str) -> String {
    let body = start_body(id, base_url);
    loop {
        let r = http
            .post(format!("{url}/submit"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            202 | 200 => break,
            409 | 503 => tokio::time::sleep(Duration::from_millis(20)).await,
            other => panic!("submit answered {other}: {}", r.text().await.unwrap()),
        }
    }
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Ok(r) = http
            .get(format!("{url}/get_status?invocation_id={id}"))
            .bearer_auth(TOKEN)
            .timeout(Duration::from_secs(30))
            .send()
            .await
        else {
            continue;
        };
        let v: Value = r.json().await.unwrap();
        match v["status"].as_str().unwrap_or("") {
            "queued" | "running" => {}
            s => return s.to_owned(),
        }
    }
}

/// Runs `n` sessions through the replicas `urls` (round robin), `IN_FLIGHT` at once; the
/// statuses they ended with.
async fn run_all(urls: &[String], n: usize, base_url: &str) -> Vec<String> {
    let http = reqwest::Client::new();
    let next = Arc::new(AtomicUsize::new(0));
    let ends = Arc::new(Mutex::new(Vec::with_capacity(n)));
    let workers: Vec<_> = (0..IN_FLIGHT.min(n))
        .map(|_| {
            let (http, next, ends, urls) =
                (http.clone(), next.clone(), ends.clone(), urls.to_vec());
            let base_url = base_url.to_owned();
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return;
                    }
                    let url = &urls[i % urls.len()];
                    let end = run_one(&http, url, &format!("i{i}"), &base_url).await;
                    ends.lock().unwrap().push(end);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    // Every worker has ended: this is the last handle.
    Arc::try_unwrap(ends).unwrap().into_inner().unwrap()
}

/// CPU time of a process (user and system, in ms): its own, and its reaped children's.
#[derive(Clone, Copy)]
struct Cpu(f64, f64);

impl Cpu {
    fn delta(self, before: Cpu) -> (f64, f64) {
        (self.0 - before.0, self.1 - before.1)
    }
}

fn cpu_ms(pid: u32) -> Cpu {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's name (which may hold spaces): the state is the first.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    // Clock ticks of 10 ms (USER_HZ is 100 on Linux).
    let at = |i: usize| f.get(i).copied().unwrap_or(0.0) * 10.0;
    // utime, stime, cutime, cstime: fields 14 to 17 of the line, 11 to 14 after the name.
    Cpu(at(11) + at(12), at(13) + at(14))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn du_kib(dir: &Path) -> u64 {
    let out = Command::new("du").arg("-sk").arg(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|k| k.parse().ok())
        .unwrap_or(0)
}

async fn sessions() {
    let n = count("EVALUATION_SESSIONS", 5000).max(20);
    let root = nix::unistd::geteuid().is_root();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.forget_requests();
    // Each session: write a file, read it back in bash with the uid it runs as, answer. The
    // bash result the model is sent must show the file's content.
    let read_back = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let (seen, failed) = (read_back.clone(), failures.clone());
    fake.respond_with(move |body| {
        let messages = body["messages"].as_array().unwrap();
        let tools: Vec<&Value> = messages.iter().filter(|m| m["role"] == "tool").collect();
        match tools.len() {
            0 => Reply::call(
                "w",
                "write",
                json!({"path": "answer.txt", "content": "forty-two"}),
            ),
            1 => Reply::call(
                "b",
                "bash",
                json!({"command": "cat answer.txt; echo; id -u"}),
            ),
            _ => {
                let out: Value = serde_json::from_str(tools[1]["content"].as_str().unwrap_or(""))
                    .unwrap_or_default();
                let stdout = out["stdout"].as_str().unwrap_or("");
                if out["exitCode"] == 0 && stdout.starts_with("forty-two\n") {
                    seen.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.lock().unwrap().push(format!("{tools:?}"));
                }
                Reply::text("done")
            }
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let replica = Replica::start(&data, &[]);
    println!(
        "sessions: {n} through one replica, default settings ({}), {IN_FLIGHT} in flight",
        if root {
            "root: a uid of the default pool, a disk and a network of its own each"
        } else {
            "not root: podhost's own uid"
        }
    );
    let started = Instant::now();
    let cpu_before = cpu_ms(replica.child.id());
    let ends = run_all(std::slice::from_ref(&replica.url), n, &fake.base_url()).await;
    let took = started.elapsed();
    let (own, children) = cpu_ms(replica.child.id()).delta(cpu_before);
    let completed = ends.iter().filter(|s| *s == "completed").count();
    let read = read_back.load(Ordering::Relaxed);
    println!(
        "  {completed}/{n} completed in {:.1} s ({:.1} sessions/s); {read} read their file back \
         with bash; {} tool results wrong",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64(),
        failures.lock().unwrap().len()
    );
    println!(
        "  serve's own CPU: {:.2} ms a session (three model calls, a write, a bash); its reaped \
         children's (supervisors, session holders, their commands): {:.2} ms a session",
        own / n as f64,
        children / n as f64
    );
    smoke::check(
        completed == n,
        format_args!("{completed} of {n} sessions completed: {ends:?}"),
    );
    smoke::check(
        read == n,
        format_args!(
            "{read} of {n} read back: {:?}",
            failures.lock().unwrap().first()
        ),
    );
    let sessions_kib = du_kib(&data);
    println!(
        "  the data directory holds {:.1} MiB: {:.1} KiB a session",
        sessions_kib as f64 / 1024.0,
        sessions_kib as f64 / n as f64
    );
    if !root {
        smoke::skipped(
            "evaluation's uid takes",
            "not root: sessions run as podhost's own uid, with no pool",
        );
        return;
    }
    let takes: Vec<(u64, f64)> = replica
        .events("took a uid from the pool")
        .iter()
        .map(|e| (e["uid"].as_u64().unwrap(), e["took_us"].as_f64().unwrap()))
        .collect();
    let mut uids: Vec<u64> = takes.iter().map(|t| t.0).collect();
    uids.sort_unstable();
    uids.dedup();
    smoke::check(
        takes.len() == n && uids.len() == n,
        format_args!(
            "{} takes, {} uids, for {n} sessions",
            takes.len(),
            uids.len()
        ),
    );
    let tenth = (n / 10).max(1);
    let mut first: Vec<f64> = takes[..tenth].iter().map(|t| t.1).collect();
    let mut last: Vec<f64> = takes[n - tenth..].iter().map(|t| t.1).collect();
    let (a, b) = (median(&mut first), median(&mut last));
    smoke::check_positive("uid takes", &[a, b]);
    println!(
        "  taking a uid: median {a:.0} µs for sessions 1–{tenth}, {b:.0} µs for sessions {}–{n}: \
         {:.2}× (flat is about 1)",
        n - tenth + 1,
        b / a
    );
}

async fn takeovers() {
    let Some(pg) = pg::TestPg::shared() else {
        smoke::missing(
            "evaluation's takeovers (three replicas on PostgreSQL)",
            "PostgreSQL is not installed",
            "apt-get install -y postgresql",
        );
        return;
    };
    let n = count("EVALUATION_TAKEOVER_SESSIONS", 1000).max(20);
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.forget_requests();
    // A turn takes about a second of the model's time, so turns are running when the starved
    // replica stops.
    fake.respond_with(|_| Reply::Delay(Duration::from_millis(1000), Box::new(Reply::text("done"))));
    let dir = tempfile::tempdir().unwrap();
    let url = pg.fresh_db();
    let env = [("PODHOST_STORE", url.as_str()), ("PODHOST_LEASE_SECS", "3")];
    let data = dir.path().join("data");
    let mut replicas: Vec<Replica> = (0..3).map(|_| Replica::start(&data, &env)).collect();
    replicas[1].cgroup = cpu_cgroup(replicas[1].child.id(), 0.05);
    let quota = if replicas[1].cgroup.is_some() {
        "held to 0.05 of a core and"
    } else {
        smoke::skipped(
            "evaluation's CPU quota",
            "cgroup v1's CPU controller cannot be written here: the starved replica is only \
             stopped",
        );
        ""
    };
    println!(
        "takeovers: {n} sessions on three replicas (PostgreSQL, 3 s leases), one {quota} \
         stopped twice for 4.5 s"
    );
    let starved = nix::unistd::Pid::from_raw(replicas[1].child.id() as i32);
    let pauses = tokio::spawn(async move {
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let _ = nix::sys::signal::kill(starved, nix::sys::signal::Signal::SIGSTOP);
            tokio::time::sleep(Duration::from_millis(4500)).await;
            let _ = nix::sys::signal::kill(starved, nix::sys::signal::Signal::SIGCONT);
        }
    });
    let urls: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    let started = Instant::now();
    let ends = run_all(&urls, n, &fake.base_url()).await;
    pauses.await.unwrap();
    let completed = ends.iter().filter(|s| *s == "completed").count();
    let lost: usize = replicas
        .iter()
        .map(|r| {
            [
                "resuming a turn whose replica stopped",
                "taking up a turn whose replica stopped",
                "the lease was lost: stopping the turn",
                "a turn whose replica stopped had no key",
            ]
            .iter()
            .map(|m| r.events(m).len())
            .sum::<usize>()
        })
        .sum();
    println!(
        "  {completed}/{n} completed in {:.1} s; turns lost to takeovers: {lost} (goal 0)",
        started.elapsed().as_secs_f64()
    );
    smoke::check(completed == n, format_args!("{completed} of {n} completed"));
    smoke::check(lost == 0, format_args!("{lost} turns taken over"));
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    println!("evaluation benchmark ({})", smoke::build());
    let only = std::env::var("EVALUATION_ONLY").ok();
    if only.as_deref() != Some("takeovers") {
        sessions().await;
    }
    if only.as_deref() != Some("sessions") {
        takeovers().await;
    }
    smoke::finish("evaluation");
}
