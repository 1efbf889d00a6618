//! BYOH scale-out benchmark, against baselines measured in the same run:
//!
//! * **Reads under writes**: 500 sessions whose turns are all active (each step a model call
//!   of about 2 s, as a model takes, and a tool call, every step committed), on one replica;
//!   `get_status` p50/p99 against `/healthz` p50/p99 on the same server in the same rounds —
//!   SQLite, then PostgreSQL, where a second replica that owns none of the turns answers
//!   `get_status` from the database too, against its own `/healthz` and the owner's. Also what a
//!   step costs in CPU, the replica's and PostgreSQL's, measured with no reads running.
//! * **Turns per second** with a fast fake model (one model call per turn, no delay), the
//!   client submitting and polling as Oumi does: one replica on SQLite, one on PostgreSQL,
//!   three on PostgreSQL — each replica held to the same CPU share (a cgroup v1 CPU quota,
//!   `/sys/fs/cgroup/cpu`), so that the ratio shows the design rather than the machine's cores;
//!   and `get_status` p50/p99 under that load.
//!
//! The model, the client and PostgreSQL run outside the quota. Run with
//! `cargo bench --bench byoh_scale` (release build; a throwaway PostgreSQL cluster, as the
//! tests start it; as root for the cgroups — without them it says so and runs unlimited).
//! `BYOH_SCALE_ONLY=reads` or `=throughput` runs one part, `BYOH_SCALE_STEP_MS` sets the model's
//! time per step, `BYOH_SCALE_PODHOST` measures another build of `podhost` on the same load.
//! Without PostgreSQL its parts are skipped, and said so. `PODHOST_BENCH_SMOKE=1` runs every
//! part at a fiftieth of the counts, two rounds, 200 ms steps, checked (see
//! `benches/support/smoke.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "support/listen.rs"]
mod listen;

#[path = "../tests/support/openai_fake.rs"]
mod openai_fake;
#[path = "../tests/support/pg.rs"]
mod pg;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use openai_fake::{FakeModel, Reply};
use serde_json::{Value, json};

const TOKEN: &str = "bench-token";
/// Active sessions for the reads-under-writes measurement.
const ACTIVE: usize = 500;
/// Calls of each kind per round, and rounds (interleaved; a smoke run's 2).
const CALLS: usize = 400;
fn rounds() -> usize {
    smoke::pick(5, 2)
}
/// The pause before each set of calls in the reads-under-writes rounds.
const PACE: Duration = Duration::from_millis(5);
/// Turns per throughput run, and the client's submissions in flight.
const TURNS: usize = 600;
/// `BYOH_SCALE_QUICK=1` divides the counts by ten, a smoke run by fifty: a check that the
/// benchmark runs, not a measurement.
fn scaled(n: usize) -> usize {
    if smoke::on() {
        n / 50
    } else if std::env::var_os("BYOH_SCALE_QUICK").is_some() {
        n / 10
    } else {
        n
    }
}
const IN_FLIGHT: usize = 96;
/// How often the client polls a turn's status.
const POLL: Duration = Duration::from_millis(100);
/// Each replica's CPU share in the throughput runs (of one core), small enough that the quota
/// binds before the machine does (at half a core, three replicas on a 2-core machine shared with
/// PostgreSQL, the model and the client measure the machine); `BYOH_SCALE_CPU_SHARE` overrides
/// it.
fn cpu_share() -> f64 {
    std::env::var("BYOH_SCALE_CPU_SHARE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.2)
}

/// The binary under test: this build's, or `BYOH_SCALE_PODHOST` (another build to compare, run
/// on the same load in the same way).
fn podhost() -> PathBuf {
    std::env::var_os("BYOH_SCALE_PODHOST")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_podhost")))
}

/// How long the model takes over each step of the active sessions. A model's answer takes
/// seconds; at 2 s, 500 sessions make 250 steps a second, a load that one replica keeps up with
/// on this machine, so that the load stays the same over the run (a replica that falls behind
/// slows every request, `/healthz` included, and the ratio then measures the machine).
/// `BYOH_SCALE_STEP_MS` overrides it.
fn step() -> Duration {
    Duration::from_millis(
        std::env::var("BYOH_SCALE_STEP_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(smoke::pick(2000, 200)),
    )
}

/// How long the replica's and the database's CPU is counted with no reads running.
fn cpu_window() -> Duration {
    smoke::pick(Duration::from_secs(4), Duration::from_millis(600))
}

struct Replica {
    child: Child,
    url: String,
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

/// Puts `pid` under a CPU quota of `share` of one core; `None` when cgroup v1's CPU controller
/// cannot be written here.
fn cpu_cgroup(pid: u32, share: f64, n: usize) -> Option<PathBuf> {
    let dir = PathBuf::from(format!(
        "/sys/fs/cgroup/cpu/podhost-bench-{}-{n}",
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

fn start_replica(
    data: &Path,
    store: Option<&str>,
    max_running: usize,
    share: Option<(f64, usize)>,
) -> Replica {
    let mut cmd = Command::new(podhost());
    cmd.arg("serve")
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_DATA", data)
        .env("PODHOST_TOKEN", TOKEN)
        .env("PODHOST_MAX_RUNNING", max_running.to_string())
        .env("RUST_LOG", "warn,podhost::byoh=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(url) = store {
        cmd.env("PODHOST_STORE", url);
    }
    let mut child = cmd.spawn().unwrap();
    let cgroup = share.and_then(|(s, n)| cpu_cgroup(child.id(), s, n));
    let addr = listen::listening_addr(&mut child, Duration::from_secs(60), |_| {}).unwrap();
    Replica {
        child,
        url: format!("http://{addr}"),
        cgroup,
    }
}

fn start_body(id: &str, base_url: &str) -> Value {
    json!({
        "protocol_version": "1", "session_id": format!("s-{id}"), "invocation_id": id,
        "session_action": "start",
        "input_messages": [{"role": "user", "content": format!("task {id}")}],
        "model_connection": {"base_url": base_url, "model": "fake-model", "api_key": "k"}
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn timed_get(http: &reqwest::Client, url: &str) -> (Duration, Value) {
    let t = Instant::now();
    let resp = http.get(url).bearer_auth(TOKEN).send().await.unwrap();
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
    let v: Value = resp.json().await.unwrap();
    (t.elapsed(), v)
}

/// Submits until accepted (a busy 409 is retried, as Oumi does).
async fn submit(http: &reqwest::Client, url: &str, body: &Value) {
    loop {
        let r = http
            .post(format!("{url}/submit"))
            .bearer_auth(TOKEN)
            .json(body)
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            202 | 200 => return,
            409 => tokio::time::sleep(Duration::from_millis(10)).await,
            other => panic!("submit answered {other}: {}", r.text().await.unwrap()),
        }
    }
}

/// CPU time (user and system, in clock ticks) used so far by each process that `pick` chooses
/// by pid and command name.
fn cpu_ticks(pick: impl Fn(u32, &str) -> bool) -> HashMap<u32, u64> {
    let mut ticks = HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid … utime stime: the fields after the command's closing paren.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !pick(pid, &stat[open + 1..close]) {
            continue;
        }
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let used = rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap();
        ticks.insert(pid, used);
    }
    ticks
}

/// The CPU ticks used between two readings of [`cpu_ticks`] by the processes in both (one that
/// started or exited in between is left out).
fn ticks_between(before: &HashMap<u32, u64>, after: &HashMap<u32, u64>) -> u64 {
    after
        .iter()
        .filter_map(|(pid, t)| before.get(pid).map(|b| t.saturating_sub(*b)))
        .sum()
}

/// 500 active sessions on one replica: get_status against /healthz, interleaved rounds.
async fn reads_under_writes(label: &str, store: Option<String>, fake: &FakeModel) {
    let dir = tempfile::tempdir().unwrap();
    let replica = start_replica(
        &dir.path().join("data"),
        store.as_deref(),
        scaled(ACTIVE) + 16,
        None,
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let base = fake.base_url();
    let ids: Vec<String> = (0..scaled(ACTIVE))
        .map(|n| format!("{label}-a{n}"))
        .collect();
    for chunk in ids.chunks(50) {
        let calls: Vec<_> = chunk
            .iter()
            .map(|id| {
                let (http, url, body) = (http.clone(), replica.url.clone(), start_body(id, &base));
                tokio::spawn(async move { submit(&http, &url, &body).await })
            })
            .collect();
        for c in calls {
            c.await.unwrap();
        }
    }
    // Wait until every turn is running (each is busy calling the model and a tool).
    for id in &ids {
        loop {
            let (_, v) = timed_get(
                &http,
                &format!("{}/get_status?invocation_id={id}", replica.url),
            )
            .await;
            if v["status"] == "running" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // What a step costs, over a few seconds with no reads: the replica's CPU, and the
    // database's (every PostgreSQL process; with SQLite the store is inside the replica).
    let owner = replica.child.id();
    let replica_cpu = || cpu_ticks(|pid, _| pid == owner);
    let store_cpu = || cpu_ticks(|_, comm| comm == "postgres");
    let (r0, d0, s0) = (replica_cpu(), store_cpu(), fake.count());
    tokio::time::sleep(cpu_window()).await;
    let (r1, d1, s1) = (replica_cpu(), store_cpu(), fake.count());
    smoke::check(
        s1 > s0,
        format_args!("{label}: the turns step while the CPU is counted"),
    );
    // Clock ticks are 10 ms (USER_HZ 100 on Linux).
    let per_step = |ticks: u64| ticks as f64 * 10.0 / (s1 - s0).max(1) as f64;
    let (replica_ms, store_ms) = (
        per_step(ticks_between(&r0, &r1)),
        per_step(ticks_between(&d0, &d1)),
    );
    // On PostgreSQL, a second replica that runs none of these turns answers from the store.
    let other = store
        .as_deref()
        .map(|url| start_replica(&dir.path().join("data"), Some(url), 16, None));
    if let Some(o) = &other {
        timed_get(&http, &format!("{}/healthz", o.url)).await;
    }
    let writes_before = fake.count();
    let t = Instant::now();
    let mut status = Vec::new();
    let mut health = Vec::new();
    let mut elsewhere = Vec::new();
    let mut elsewhere_health = Vec::new();
    for round in 0..rounds() {
        for i in 0..scaled(CALLS) {
            // Spread over several steps' time, so the calls sample the load rather than one
            // moment of it.
            tokio::time::sleep(PACE).await;
            health.push(
                timed_get(&http, &format!("{}/healthz", replica.url))
                    .await
                    .0,
            );
            let id = &ids[(round * scaled(CALLS) + i * 7919) % ids.len()];
            status.push(
                timed_get(
                    &http,
                    &format!("{}/get_status?invocation_id={id}", replica.url),
                )
                .await
                .0,
            );
            if let Some(o) = &other {
                elsewhere_health.push(timed_get(&http, &format!("{}/healthz", o.url)).await.0);
                elsewhere.push(
                    timed_get(&http, &format!("{}/get_status?invocation_id={id}", o.url))
                        .await
                        .0,
                );
            }
        }
    }
    let steps = fake.count() - writes_before;
    let elapsed = t.elapsed();
    status.sort();
    health.sort();
    elsewhere.sort();
    elsewhere_health.sort();
    let (s50, s99) = (percentile(&status, 0.5), percentile(&status, 0.99));
    let (h50, h99) = (percentile(&health, 0.5), percentile(&health, 0.99));
    println!(
        "  {label:<10} get_status p50 {:6.2} ms p99 {:6.2} ms | /healthz p50 {:6.2} ms p99 {:6.2} ms \
         | p99 ratio {:4.2}× | {:.0} turn steps/s committed meanwhile",
        ms(s50),
        ms(s99),
        ms(h50),
        ms(h99),
        ms(s99) / ms(h99),
        steps as f64 / elapsed.as_secs_f64()
    );
    let database = match &store {
        Some(_) => format!(", PostgreSQL {store_ms:5.2} ms"),
        None => String::new(),
    };
    println!(
        "  {label:<10} CPU per turn step, with no reads: replica {replica_ms:5.2} ms{database} \
         ({:.0} steps/s, of the {:.0} the sessions ask for)",
        (s1 - s0) as f64 / cpu_window().as_secs_f64(),
        scaled(ACTIVE) as f64 / step().as_secs_f64()
    );
    if !elsewhere.is_empty() {
        let (e50, e99) = (percentile(&elsewhere, 0.5), percentile(&elsewhere, 0.99));
        let eh99 = percentile(&elsewhere_health, 0.99);
        println!(
            "  {label:<10} get_status from another replica (the store's read pool) p50 {:6.2} ms \
             p99 {:6.2} ms | p99 ratio to the owner's /healthz {:4.2}×, to its own \
             (p99 {:6.2} ms) {:4.2}×",
            ms(e50),
            ms(e99),
            ms(e99) / ms(h99),
            ms(eh99),
            ms(e99) / ms(eh99),
        );
    }
}

/// Turns per second across `replicas`, and get_status latency under that load.
async fn throughput(label: &str, replicas: &[Replica], fake: &FakeModel) {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(IN_FLIGHT * 2)
        .build()
        .unwrap();
    let base = fake.base_url();
    let urls: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
    let gate = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..scaled(TURNS) {
        let id = format!("{label}-t{n}");
        let (http, gate, base) = (http.clone(), gate.clone(), base.clone());
        let submit_url = urls[n % urls.len()].clone();
        let poll_url = urls[(n + 1) % urls.len()].clone();
        tasks.push(tokio::spawn(async move {
            let _permit = gate.acquire().await.unwrap();
            submit(&http, &submit_url, &start_body(&id, &base)).await;
            let mut lat = Vec::new();
            loop {
                let (d, v) =
                    timed_get(&http, &format!("{poll_url}/get_status?invocation_id={id}")).await;
                lat.push(d);
                match v["status"].as_str() {
                    Some("completed") => return lat,
                    Some("queued" | "running") => {}
                    other => panic!("{id}: {other:?}"),
                }
                tokio::time::sleep(POLL).await;
            }
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let elapsed = t.elapsed();
    lat.sort();
    let quota = replicas.iter().filter(|r| r.cgroup.is_some()).count();
    println!(
        "  {label:<12} {:7.1} turns/s ({} turns in {:5.2} s; {} replica(s), {quota} under a \
         {}-core quota) | get_status under load p50 {:6.2} ms p99 {:6.2} ms",
        scaled(TURNS) as f64 / elapsed.as_secs_f64(),
        scaled(TURNS),
        elapsed.as_secs_f64(),
        replicas.len(),
        cpu_share(),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
    );
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let pg = pg::TestPg::shared();
    if pg.is_none() {
        smoke::missing(
            "byoh_scale's PostgreSQL parts (reads from a second replica, one and three replicas)",
            "PostgreSQL is not installed",
            "apt-get install -y postgresql",
        );
    }
    let load = |when: &str| {
        let l = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "  load average {when} (2 cores): {}",
            l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        );
    };
    println!("byoh_scale benchmark");
    load("at the start");

    // Reads under writes: every turn keeps stepping (a model call of `step()`, then a glob) while
    // the rounds run; afterwards the turns are let finish.
    let stepping = Arc::new(AtomicBool::new(true));
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.forget_requests();
    let on = stepping.clone();
    let answered = std::sync::atomic::AtomicU64::new(0);
    fake.respond_with(move |_| {
        if on.load(Ordering::SeqCst) {
            // Between half and one and a half steps, spread evenly: sessions submitted together
            // drift apart instead of stepping in waves, so the writes come at a steady rate.
            let n = answered.fetch_add(1, Ordering::Relaxed) * 7919 % 1000;
            Reply::Delay(
                step().mul_f64(0.5 + n as f64 / 1000.0),
                Box::new(Reply::call("g", "glob", json!({"pattern": "*.none"}))),
            )
        } else {
            Reply::text("done")
        }
    });
    // BYOH_SCALE_ONLY=throughput skips this part.
    if std::env::var("BYOH_SCALE_ONLY").as_deref() != Ok("throughput") {
        println!(
            "reads under writes: {} active sessions on one replica, each step a {:?} model \
             call and a glob; {}×{} calls of each",
            scaled(ACTIVE),
            step(),
            rounds(),
            scaled(CALLS)
        );
        reads_under_writes("sqlite", None, &fake).await;
        if let Some(pg) = pg {
            reads_under_writes("postgres", Some(pg.fresh_db()), &fake).await;
        }
    }
    stepping.store(false, Ordering::SeqCst);
    load("after the reads");
    // BYOH_SCALE_ONLY=reads skips the rest.
    if std::env::var("BYOH_SCALE_ONLY").as_deref() == Ok("reads") {
        smoke::finish("byoh_scale");
        return;
    }

    // Throughput with a fast model.
    let fast = FakeModel::start("fake-model", Some("k")).await;
    fast.forget_requests();
    fast.respond_with(|_| Reply::text("done"));
    println!(
        "turns per second, each replica held to {} of a core:",
        cpu_share()
    );
    let dir = tempfile::tempdir().unwrap();
    let one = [start_replica(
        &dir.path().join("sqlite"),
        None,
        128,
        Some((cpu_share(), 0)),
    )];
    if one[0].cgroup.is_none() {
        smoke::skipped(
            "byoh_scale's CPU quota",
            "cgroup v1's CPU controller (/sys/fs/cgroup/cpu) cannot be written here: every \
             replica runs unlimited, and the ratios measure the machine",
        );
    }
    throughput("sqlite×1", &one, &fast).await;
    drop(one);
    let Some(pg) = pg else {
        load("at the end");
        smoke::finish("byoh_scale");
        return;
    };
    let url = pg.fresh_db();
    let one = [start_replica(
        &dir.path().join("pg1"),
        Some(&url),
        128,
        Some((cpu_share(), 1)),
    )];
    throughput("postgres×1", &one, &fast).await;
    drop(one);
    let url = pg.fresh_db();
    let three: Vec<Replica> = (0..3)
        .map(|n| {
            start_replica(
                &dir.path().join("pg3"),
                Some(&url),
                128,
                Some((cpu_share(), 2 + n)),
            )
        })
        .collect();
    throughput("postgres×3", &three, &fast).await;
    drop(three);
    load("at the end");
    smoke::finish("byoh_scale");
}
