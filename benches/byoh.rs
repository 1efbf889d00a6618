//! BYOH endpoint benchmark, against baselines measured in the same run:
//!
//! * `get_status` latency (p50/p99) with 1,000 sessions held (all idle in `input_required`),
//!   against `/healthz` on the same server and connection;
//! * the server's memory (RSS) with 1,000 sessions held, against the same server idle;
//! * submit-to-first-model-request latency (median of several), against a bare round trip to the
//!   fake model from the same client.
//!
//! Run with `cargo bench --bench byoh` (release build of podhost, scripted model on loopback).
//! `PODHOST_BENCH_SMOKE=1` holds 20 sessions and makes 100 calls of each kind, checked (see
//! `benches/support/smoke.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "support/listen.rs"]
mod listen;

#[path = "../tests/support/openai_fake.rs"]
mod openai_fake;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openai_fake::{FakeModel, Reply};
use serde_json::{Value, json};

const TOKEN: &str = "bench-token";
/// Sessions held, `get_status` calls (and as many `/healthz`), submissions timed one by one.
fn scale() -> (usize, usize, usize) {
    smoke::pick((1000, 5000, 21), (20, 100, 3))
}

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

fn start_server(data: &std::path::Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_podhost"))
        .arg("serve")
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_DATA", data)
        .env("PODHOST_TOKEN", TOKEN)
        .env("PODHOST_MAX_RUNNING", "64")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let addr = listen::listening_addr(&mut child, Duration::from_secs(30), |_| {}).unwrap();
    Server {
        child,
        url: format!("http://{addr}"),
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn start_body(session: &str, base_url: &str) -> Value {
    json!({
        "protocol_version": "1", "session_id": session, "invocation_id": format!("inv-{session}"),
        "session_action": "start",
        "input_messages": [{"role": "user", "content": format!("task of {session}")}],
        "model_connection": {"base_url": base_url, "model": "fake-model", "api_key": "k"}
    })
}

async fn wait_input_required(http: &reqwest::Client, url: &str, id: &str) {
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
        if v["status"] == "input_required" {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "{v}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

async fn timed_gets(http: &reqwest::Client, urls: &[String]) -> Vec<Duration> {
    let mut out = Vec::with_capacity(urls.len());
    for url in urls {
        let t = Instant::now();
        let resp = http.get(url).bearer_auth(TOKEN).send().await.unwrap();
        assert!(resp.status().is_success(), "{url}: {}", resp.status());
        resp.bytes().await.unwrap();
        out.push(t.elapsed());
    }
    out.sort();
    out
}

/// The median time of one fsync of a 4 KiB append in `dir`: what a durable commit costs here.
fn fsync_median(dir: &std::path::Path) -> Duration {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("fsync-probe")).unwrap();
    let mut times: Vec<Duration> = (0..21)
        .map(|_| {
            f.write_all(&[b'x'; 4096]).unwrap();
            let t = Instant::now();
            f.sync_data().unwrap();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (sessions, status_calls, latency_runs) = scale();
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    // Every session asks the user a question at once, then stays idle in input_required.
    fake.respond_with(|_| Reply::call("q", "ask_user", json!({"question": "continue?"})));
    let server = start_server(&dir.path().join("data"));
    let pid = server.child.id();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let base_url = fake.base_url();

    // Warm up the connection and the server.
    timed_gets(&http, &vec![format!("{}/healthz", server.url); 200]).await;
    let rss_idle = rss_kib(pid);

    // Submit → first model request, one at a time; baseline: a direct request to the fake.
    let mut submit_latency = Vec::new();
    let mut submit_answer = Vec::new();
    let mut direct = Vec::new();
    for n in 0..latency_runs {
        let before = fake.requests().len();
        let t = Instant::now();
        let resp = http
            .post(format!("{}/submit", server.url))
            .bearer_auth(TOKEN)
            .json(&start_body(&format!("lat{n}"), &base_url))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 202);
        submit_answer.push(t.elapsed());
        let reqs = fake
            .wait_requests(before + 1, Duration::from_secs(10))
            .await;
        submit_latency.push(reqs[before].at - t);
        // Let this turn settle, so the next submission does not queue behind its end.
        wait_input_required(&http, &server.url, &format!("inv-lat{n}")).await;

        let body = json!({"model": "fake-model", "messages": [{"role": "user", "content": "x"}]});
        let before = fake.requests().len();
        let t = Instant::now();
        let resp = http
            .post(format!("{base_url}/chat/completions"))
            .bearer_auth("k")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success());
        let reqs = fake.requests();
        direct.push(reqs[before].at - t);
        resp.bytes().await.unwrap();
    }
    submit_latency.sort();
    submit_answer.sort();
    direct.sort();
    let fsync = fsync_median(dir.path());

    // Hold 1,000 sessions (the latency ones count), 32 submissions in flight at a time.
    let started = Instant::now();
    let mut busy_retries = 0u32;
    let http = Arc::new(http);
    let ids: Vec<String> = (latency_runs..sessions).map(|n| format!("s{n}")).collect();
    for chunk in ids.chunks(32) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|s| {
                let (http, url, body) = (
                    http.clone(),
                    format!("{}/submit", server.url),
                    start_body(s, &base_url),
                );
                tokio::spawn(async move {
                    // Busy (409 without an invocation id) means retry later, as Oumi does.
                    let mut busy = 0u32;
                    loop {
                        let r = http.post(&url).bearer_auth(TOKEN).json(&body).send().await;
                        match r.unwrap().status().as_u16() {
                            202 => return busy,
                            409 => busy += 1,
                            other => panic!("submit answered {other}"),
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            busy_retries += t.await.unwrap();
        }
    }
    let all: Vec<String> = (0..latency_runs)
        .map(|n| format!("inv-lat{n}"))
        .chain(ids.iter().map(|s| format!("inv-{s}")))
        .collect();
    for id in &all {
        wait_input_required(&http, &server.url, id).await;
    }
    let settle = started.elapsed();
    let rss_held = rss_kib(pid);

    // get_status over the held sessions vs /healthz, interleaved in rounds.
    let status_urls: Vec<String> = (0..status_calls)
        .map(|i| {
            format!(
                "{}/get_status?invocation_id={}",
                server.url,
                all[(i * 7919) % all.len()]
            )
        })
        .collect();
    let health_urls = vec![format!("{}/healthz", server.url); status_calls];
    let mut status = Vec::new();
    let mut health = Vec::new();
    for round in 0..5 {
        let range = round * status_calls / 5..(round + 1) * status_calls / 5;
        health.extend(timed_gets(&http, &health_urls[range.clone()]).await);
        status.extend(timed_gets(&http, &status_urls[range]).await);
    }
    status.sort();
    health.sort();

    let (s50, s99) = (percentile(&status, 0.5), percentile(&status, 0.99));
    let (h50, h99) = (percentile(&health, 0.5), percentile(&health, 0.99));
    let sub = percentile(&submit_latency, 0.5);
    let dir50 = percentile(&direct, 0.5);
    smoke::check(
        status.len() == status_calls && health.len() == status_calls,
        "every get_status and /healthz answered",
    );
    println!(
        "byoh benchmark ({sessions} sessions held in input_required; {})",
        smoke::build()
    );
    println!(
        "  get_status   p50 {:8.1} µs  p99 {:8.1} µs   ({status_calls} calls)",
        us(s50),
        us(s99)
    );
    println!(
        "  /healthz     p50 {:8.1} µs  p99 {:8.1} µs   (baseline, same server)",
        us(h50),
        us(h99)
    );
    println!(
        "  ratio        p50 {:8.2}×     p99 {:8.2}×",
        us(s50) / us(h50),
        us(s99) / us(h99)
    );
    println!(
        "  RSS          idle {} KiB, {sessions} sessions held {} KiB: ×{:.2}, +{:.1} KiB per session",
        rss_idle,
        rss_held,
        rss_held as f64 / rss_idle as f64,
        (rss_held as f64 - rss_idle as f64) / sessions as f64
    );
    println!(
        "  submit → first model request: median {:.1} µs over {latency_runs} (direct request to \
         the model from the client: median {:.1} µs, ×{:.1})",
        us(sub),
        us(dir50),
        us(sub) / us(dir50)
    );
    println!(
        "  submit answered (202, after its durable commit): median {:.1} µs; one fsync in the \
         data directory: median {:.1} µs (×{:.2})",
        us(percentile(&submit_answer, 0.5)),
        us(fsync),
        us(percentile(&submit_answer, 0.5)) / us(fsync)
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "  load average during the run (2 cores): {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  {sessions} sessions submitted and settled in {:.2} s ({busy_retries} submits answered \
         busy and retried; PODHOST_MAX_RUNNING=64)",
        settle.as_secs_f64()
    );
    smoke::finish("byoh");
}
