//! Session viewer benchmark: how long `podhost serve` takes to answer the viewer's pages with
//! 10,000 sessions stored, against a baseline measured in the same run on the same server and
//! connection (the viewer's embedded style sheet: the same routing, guard, cookie check and
//! headers, no store).
//!
//! Measured (p50 and p99 of sequential requests, each page read whole): the first page of
//! `/ui/` (goal: under 100 ms), the 100th page (keyset cursor), a status filter, a search by a
//! part of an id that matches one session, and one session's page. On SQLite, then on
//! PostgreSQL (a throwaway cluster, `tests/support/pg.rs`): the store is filled while the server
//! is stopped (each session four messages: a task, a command call, its result, an answer), then
//! the server started on it.
//!
//! Run with `cargo bench --bench viewer`. `PODHOST_BENCH_SMOKE=1` stores 200 sessions and makes
//! a few requests of each kind, checked (see `benches/support/smoke.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "support/listen.rs"]
mod listen;

#[path = "../tests/support/pg.rs"]
mod pg;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rusqlite::{Connection, params};

const TOKEN: &str = "bench-token";
const STATUSES: [&str; 4] = ["completed", "failed", "cancelled", "input_required"];

/// Sessions stored, requests per kind.
fn scale() -> (usize, usize) {
    smoke::pick((10_000, 200), (200, 5))
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

fn start_server(data: &Path, store: Option<&str>) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_podhost"));
    if let Some(url) = store {
        cmd.env("PODHOST_STORE", url);
    }
    let mut child = cmd
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
    let addr = listen::listening_addr(&mut child, Duration::from_secs(60), |_| {}).unwrap();
    Server {
        child,
        url: format!("http://{addr}"),
    }
}

/// When the first stored session started (ms); each next one a second later.
const START_MS: i64 = 1_760_000_000_000;

/// Stores `n` finished sessions into PostgreSQL database `url`, whose schema the server made:
/// the same rows as [`fill_sqlite`], in four statements.
async fn fill_postgres(url: &str, n: usize) {
    let last = n - 1;
    let sql = format!(
        "INSERT INTO invocations (invocation_id, session_id, status, error, connection, \
         needs_key, output_start, created_ms, updated_ms, finished_ms) \
         SELECT 'inv-' || lpad(i::text, 6, '0'), 'ses-' || lpad(i::text, 6, '0'), \
         (ARRAY['completed', 'failed', 'cancelled', 'input_required'])[i % 4 + 1], \
         CASE WHEN i % 4 = 1 THEN 'the model answered 500 on step ' || i END, \
         '{{\"base_url\":\"http://127.0.0.1:9/v1\",\"model\":\"bench\"}}', FALSE, 1, \
         {START_MS} + i * 1000, {START_MS} + i * 1000 + 700, \
         CASE WHEN i % 4 <> 3 THEN {START_MS} + i * 1000 + 700 END \
         FROM generate_series(0, {last}) AS i; \
         INSERT INTO messages (invocation_id, seq, body, at_ms) \
         SELECT 'inv-' || lpad(i::text, 6, '0'), s, CASE s \
         WHEN 0 THEN '{{\"role\":\"user\",\"content\":\"task ' || i || '\"}}' \
         WHEN 1 THEN '{CALL}' WHEN 2 THEN '{RESULT}' \
         ELSE '{{\"role\":\"assistant\",\"content\":\"done ' || i || '\"}}' END, \
         {START_MS} + i * 1000 + s * 200 \
         FROM generate_series(0, {last}) AS i, generate_series(0, 3) AS s; ANALYZE;"
    );
    pg::TestPg::execute(url, &sql).await;
}

/// A command call and its result, as stored.
const CALL: &str = r#"{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"ls\"}"}}]}"#;
const RESULT: &str = r#"{"role":"tool","tool_call_id":"c1","content":"{\"exitCode\":0,\"stdout\":\"a\\nb\\n\",\"stderr\":\"\"}"}"#;

/// Stores `n` finished sessions, a second apart, into the store the server made at `db`.
fn fill_sqlite(db: &Path, n: usize) {
    let mut c = Connection::open(db).unwrap();
    let tx = c.transaction().unwrap();
    let start = START_MS;
    let conn = r#"{"base_url":"http://127.0.0.1:9/v1","model":"bench"}"#;
    let (call, result) = (CALL, RESULT);
    for i in 0..n {
        let id = format!("inv-{i:06}");
        let t = start + i as i64 * 1000;
        let status = STATUSES[i % STATUSES.len()];
        let error = (status == "failed").then(|| format!("the model answered 500 on step {i}"));
        let finished = (status != "input_required").then_some(t + 700);
        tx.execute(
            "INSERT INTO invocations (invocation_id, session_id, status, error, connection, \
             needs_key, output_start, created_ms, updated_ms, finished_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, 0, 1, ?6, ?7, ?8)",
            params![
                id,
                format!("ses-{i:06}"),
                status,
                error,
                conn,
                t,
                t + 700,
                finished
            ],
        )
        .unwrap();
        let task = format!(r#"{{"role":"user","content":"task {i}"}}"#);
        let answer = format!(r#"{{"role":"assistant","content":"done {i}"}}"#);
        for (seq, body) in [task.as_str(), call, result, answer.as_str()]
            .iter()
            .enumerate()
        {
            tx.execute(
                "INSERT INTO messages (invocation_id, seq, body, at_ms) VALUES (?1, ?2, ?3, ?4)",
                params![id, seq as i64, body, t + seq as i64 * 200],
            )
            .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// The viewer's cookie, from a sign-in.
async fn sign_in(http: &reqwest::Client, url: &str) -> String {
    let resp = http
        .post(format!("{url}/ui/signin"))
        .json(&serde_json::json!({ "credential": TOKEN }))
        .send()
        .await
        .unwrap();
    smoke::check(resp.status() == 204, "the sign-in was refused");
    let set = resp.headers()["set-cookie"].to_str().unwrap();
    set.split(';').next().unwrap().to_owned()
}

/// Times `n` sequential GETs of `route` (each body read whole); checks each answer is 200 and
/// holds `holds`. Answers the sorted times.
async fn time(
    http: &reqwest::Client,
    url: &str,
    cookie: &str,
    route: &str,
    holds: &str,
    n: usize,
) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let resp = http
            .get(format!("{url}{route}"))
            .header("cookie", cookie)
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let body = resp.text().await.unwrap();
        out.push(t.elapsed());
        smoke::check(status == 200, format_args!("{route} answered {status}"));
        smoke::check(
            body.contains(holds),
            format_args!("{route} lacks {holds:?}"),
        );
    }
    out.sort();
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Measures the pages on `server`, whose store holds `sessions` sessions.
async fn measure(engine: &str, server: &Server, sessions: usize, requests: usize, fill: Duration) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let cookie = sign_in(&http, &server.url).await;
    let newest = format!("inv-{:06}", sessions - 1);
    let deep = sessions.saturating_sub(100 * 50).max(50);
    let cursor = format!(
        "/ui/?before_ms={}&before_id=inv-{deep:06}",
        START_MS + deep as i64 * 1000
    );
    let found = format!("inv-{:06}", sessions / 2);
    let kinds: Vec<(&str, String, String)> = vec![
        (
            "baseline: /ui/assets/viewer.css",
            "/ui/assets/viewer.css".into(),
            "svg.timeline".into(),
        ),
        ("/ui/ (first page)", "/ui/".into(), newest),
        (
            "/ui/ (a page deep, by cursor)",
            cursor,
            format!("inv-{:06}", deep - 1),
        ),
        (
            "/ui/?status=failed",
            "/ui/?status=failed".into(),
            "the model answered 500".into(),
        ),
        ("/ui/?q=<one id>", format!("/ui/?q={found}"), found.clone()),
        (
            "/ui/session?id=<one>",
            format!("/ui/session?id={found}"),
            "exit code 0".into(),
        ),
    ];
    // Warm the connection and the store's caches once per kind.
    for (_, route, holds) in &kinds {
        time(&http, &server.url, &cookie, route, holds, 1).await;
    }
    println!(
        "viewer ({}, {engine}): {sessions} sessions stored in {:.1} s; {requests} sequential \
         requests of each",
        smoke::build(),
        fill.as_secs_f64()
    );
    let mut base = 0.0;
    for (i, (name, route, holds)) in kinds.iter().enumerate() {
        let t = time(&http, &server.url, &cookie, route, holds, requests).await;
        let (p50, p99) = (ms(pct(&t, 0.5)), ms(pct(&t, 0.99)));
        smoke::check_positive(name, &[p50, p99]);
        if i == 0 {
            base = p50;
        }
        println!(
            "  {name:<36} p50 {p50:8.2} ms  p99 {p99:8.2} ms  ({:.1}x the baseline's p50)",
            p50 / base
        );
        if i == 1 {
            println!(
                "  goal: the first page under 100 ms (p99): {}",
                if p99 < 100.0 { "met" } else { "NOT met" }
            );
        }
    }
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (sessions, requests) = scale();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The server makes the store (its schema), stops, and the sessions go in.
    drop(start_server(&data, None));
    let filled = Instant::now();
    fill_sqlite(&data.join("podhost.sqlite"), sessions);
    let fill = filled.elapsed();
    let server = start_server(&data, None);
    measure("SQLite", &server, sessions, requests, fill).await;
    drop(server);
    match pg::TestPg::shared() {
        Some(pg) => {
            let url = pg.fresh_db();
            let data = dir.path().join("data-pg");
            drop(start_server(&data, Some(&url)));
            let filled = Instant::now();
            fill_postgres(&url, sessions).await;
            let fill = filled.elapsed();
            let server = start_server(&data, Some(&url));
            measure("PostgreSQL", &server, sessions, requests, fill).await;
        }
        None => smoke::missing(
            "the viewer on a PostgreSQL store",
            "PostgreSQL is not installed",
            "apt-get install -y postgresql",
        ),
    }
    smoke::finish("viewer");
}
