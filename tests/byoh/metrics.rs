//! `GET /metrics`, `/livez`, `/readyz` and the store's health in `/healthz`: a scripted
//! workload, then a scrape read with the Prometheus client's own parsers.

use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, T, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};
use crate::prometheus::{Parsed, Samples, counted, family, parse, parse_as, value};

/// GETs `route` without a credential: the status, the content type and the body.
async fn open_get(s: &Serve, route: &str) -> (StatusCode, String, String) {
    accepting(s, route, None).await
}

/// GETs `route` without a credential, with this `Accept` header if any.
async fn accepting(s: &Serve, route: &str, accept: Option<&str>) -> (StatusCode, String, String) {
    let mut req = s.http.get(format!("{}{route}", s.url));
    if let Some(accept) = accept {
        req = req.header("accept", accept);
    }
    let resp = tokio::time::timeout(T, req.send()).await.unwrap().unwrap();
    let status = resp.status();
    let ctype = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, ctype, resp.text().await.unwrap())
}

async fn scrape(s: &Serve) -> Samples {
    let (code, ctype, text) = accepting(s, "/metrics", Some(OPENMETRICS)).await;
    assert_eq!(code, StatusCode::OK, "{text}");
    assert_eq!(
        ctype,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    parse(&text)
}

/// The `Accept` of a scraper that reads OpenMetrics.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0";

/// Whether any process's command line holds `marker`.
fn process_with(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
}

#[tokio::test]
async fn metrics_count_turns_model_calls_tools_kills_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let marker = format!("podhost-metrics-marker-{}", std::process::id());
    fake.push([
        // Invocation i1: a 500 and a 429 retried, then four tool calls, then an answer.
        Reply::Status(500, "boom".into(), None),
        Reply::Status(429, "slow down".into(), Some(0)),
        Reply::calls(&[
            ("c1", "bash", json!({"command": "echo hi"})),
            ("c2", "read", json!({"path": "/workspace/missing.txt"})),
            ("c3", "no_such_tool", json!({})),
            ("c4", "bash", json!({"command": "sleep 30", "timeout": 1})),
        ]),
        Reply::text("done"),
        // Invocation i2: a command that runs until it is cancelled.
        Reply::call(
            "c5",
            "bash",
            // Two commands, so bash stays (and shows the marker) rather than exec'ing sleep.
            json!({"command": format!("sleep 300; echo {marker}")}),
        ),
    ]);
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_MAX_RUNNING", "1"),
    );
    let url = fake.base_url();
    s.submit(start("s1", "i1", "work", &url, None)).await;
    s.wait_status("i1", "completed", T).await;

    s.submit(start("s2", "i2", "wait", &url, None)).await;
    let deadline = Instant::now() + T;
    while !process_with(&marker) {
        assert!(
            Instant::now() < deadline,
            "the command never started: {:?}\n{}",
            s.status("i2").await,
            s.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // One turn runs, the most allowed: the next submission is refused with 409.
    let (code, _) = s.submit(start("s3", "i3", "x", &url, None)).await;
    assert_eq!(code, StatusCode::CONFLICT);
    let during = scrape(&s).await;
    assert_eq!(
        family(&during, "podhost_turns_running"),
        [("front=byoh".to_owned(), 1.0)].into()
    );
    assert_eq!(
        s.cancel("s2", "i2").await,
        (StatusCode::OK, status_obj("s2", "i2", "cancelled"))
    );
    let deadline = Instant::now() + T;
    while process_with(&marker) {
        assert!(Instant::now() < deadline, "the command outlived the cancel");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The turn task records its end just after the status changes: wait for it.
    let deadline = Instant::now() + T;
    let m = loop {
        let m = scrape(&s).await;
        if value(&m, "podhost_turns_total", "front=byoh,outcome=cancelled") == 1.0 {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "the cancelled turn was never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // What was recorded; the label sets set up at 0 are the next test's.
    let f = |name: &str| counted(&m, name);
    let entries = |pairs: &[(&str, f64)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(
        f("podhost_turns_total"),
        entries(&[
            ("front=byoh,outcome=cancelled", 1.0),
            ("front=byoh,outcome=completed", 1.0),
        ])
    );
    assert_eq!(
        family(&m, "podhost_turns_running"),
        entries(&[("front=byoh", 0.0)])
    );
    assert_eq!(
        f("podhost_model_calls_total"),
        entries(&[("endpoint=openai,outcome=ok", 3.0)])
    );
    assert_eq!(
        f("podhost_model_retries_total"),
        entries(&[("endpoint=openai", 2.0)])
    );
    assert_eq!(
        f("podhost_model_http_errors_total"),
        entries(&[
            ("endpoint=openai,status=429", 1.0),
            ("endpoint=openai,status=500", 1.0),
        ])
    );
    assert_eq!(
        f("podhost_model_call_seconds_count"),
        entries(&[("endpoint=openai", 3.0)])
    );
    assert_eq!(
        f("podhost_tool_calls_total"),
        entries(&[
            ("outcome=completed,tool=bash", 3.0),
            ("outcome=failed,tool=read", 1.0),
        ])
    );
    // A tool the model made up is answered by the session without reaching the toolbox.
    assert_eq!(
        f("podhost_tool_call_seconds_count"),
        entries(&[("tool=bash", 3.0), ("tool=read", 1.0)])
    );
    assert_eq!(
        f("podhost_commands_killed_total"),
        entries(&[("reason=cancel", 1.0), ("reason=timeout", 1.0)])
    );
    assert_eq!(f("podhost_busy_refusals_total"), entries(&[("", 1.0)]));
    assert!(
        value(&m, "podhost_store_write_seconds_count", "") >= 4.0,
        "{m:?}"
    );
    // No series is labelled with an id (a whole label value: the build's revision may start
    // with the hex digits of one).
    for key in m.keys() {
        for id in ["s1", "s2", "i1", "i2", "c1", "no_such_tool"] {
            let labelled = key.contains(&format!("={id},")) || key.contains(&format!("={id}}}"));
            assert!(!labelled, "{key}");
        }
    }
}

/// The label sets at 0 before any event: what `rate()` and `absent()` need from the start.
fn zeros(keys: &[String]) -> Samples {
    keys.iter().map(|k| (k.clone(), 0.0)).collect()
}

/// `(front, outcome)` and the like as `k=v,…` keys, in the parser's (sorted) label order.
fn keys(pairs: &[&[(&str, &str)]]) -> Vec<String> {
    pairs
        .iter()
        .map(|p| {
            let mut p = p.to_vec();
            p.sort();
            p.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

/// What both formats must hold before any event: every family typed as it is, the label sets
/// at 0, the process's series and the build's.
fn assert_fresh(format: &str, parsed: &Parsed) {
    let types = &parsed.types;
    let build = if format == "openmetrics" {
        ("podhost_build", "info")
    } else {
        ("podhost_build_info", "gauge")
    };
    for (name, kind) in [
        ("podhost_turns", "counter"),
        ("podhost_model_retries", "counter"),
        ("podhost_busy_refusals", "counter"),
        ("podhost_turns_running", "gauge"),
        ("podhost_sandbox_faulted", "gauge"),
        ("podhost_model_call_seconds", "histogram"),
        ("podhost_store_write_seconds", "histogram"),
        ("process_cpu_seconds", "counter"),
        ("process_resident_memory_bytes", "gauge"),
        ("process_virtual_memory_bytes", "gauge"),
        ("process_open_fds", "gauge"),
        ("process_max_fds", "gauge"),
        ("process_start_time_seconds", "gauge"),
        build,
    ] {
        assert_eq!(
            types.get(name).map(String::as_str),
            Some(kind),
            "{format}: {name} in {types:?}"
        );
    }
    let m = &parsed.samples;
    let f = |name: &str| family(m, name);
    let outcomes = ["cancelled", "completed", "failed", "input_required"];
    let turns: Vec<_> = outcomes
        .map(|o| vec![("front", "byoh"), ("outcome", o)])
        .into();
    let turns: Vec<&[_]> = turns.iter().map(Vec::as_slice).collect();
    assert_eq!(f("podhost_turns_total"), zeros(&keys(&turns)), "{format}");
    let calls = ["cancelled", "failed", "ok"].map(|o| format!("endpoint=openai,outcome={o}"));
    assert_eq!(f("podhost_model_calls_total"), zeros(&calls), "{format}");
    assert_eq!(
        f("podhost_model_retries_total"),
        zeros(&["endpoint=openai".into()]),
        "{format}"
    );
    let statuses = [429, 500, 502, 503, 504].map(|s| format!("endpoint=openai,status={s}"));
    assert_eq!(f("podhost_model_http_errors_total"), zeros(&statuses));
    assert_eq!(
        f("podhost_commands_killed_total"),
        zeros(&["reason=cancel".into(), "reason=timeout".into()])
    );
    assert_eq!(
        f("podhost_model_call_seconds_count"),
        zeros(&["endpoint=openai".into()])
    );
    let tool_calls = f("podhost_tool_calls_total");
    assert_eq!(tool_calls.len(), 6 * 4, "{tool_calls:?}");
    assert!(tool_calls.values().all(|v| *v == 0.0), "{tool_calls:?}");
    assert!(
        tool_calls.contains_key("outcome=error,tool=glob"),
        "{tool_calls:?}"
    );

    let one = |name: &str| value(m, name, "");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = one("process_start_time_seconds");
    assert!(
        now - 3600.0 < started && started <= now + 1.0,
        "{started} {now}"
    );
    let (rss, vsz) = (
        one("process_resident_memory_bytes"),
        one("process_virtual_memory_bytes"),
    );
    assert!(rss > 1e6 && vsz >= rss, "{rss} {vsz}");
    let (open, max) = (one("process_open_fds"), one("process_max_fds"));
    assert!(open >= 3.0 && max >= open, "{open} {max}");
    assert!(one("process_cpu_seconds_total") >= 0.0);
    assert_eq!(
        f("podhost_build_info"),
        [(
            format!(
                "revision={},version={}",
                env!("BUILD_GIT_REVISION"),
                env!("CARGO_PKG_VERSION")
            ),
            1.0
        )]
        .into()
    );
}

/// A scraper that asks for nothing (or `text/plain`) gets the classic text format, typed as the
/// classic parser reads it; one that asks for OpenMetrics gets OpenMetrics. Both hold every
/// family from the start.
#[tokio::test]
async fn metrics_answer_the_format_asked_for_with_every_series_from_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";
    let mut podhost_series = vec![];
    for (accept, ctype, parser) in [
        (None, CLASSIC, "classic"),
        (Some("text/plain"), CLASSIC, "classic"),
        (Some("*/*"), CLASSIC, "classic"),
        (
            Some(OPENMETRICS),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            "openmetrics",
        ),
    ] {
        let (code, got, text) = accepting(&s, "/metrics", accept).await;
        assert_eq!((code, got.as_str()), (StatusCode::OK, ctype), "{accept:?}");
        assert_eq!(text.ends_with("# EOF\n"), parser == "openmetrics", "{text}");
        let parsed = parse_as(parser, &text);
        assert_fresh(parser, &parsed);
        podhost_series.push(
            parsed
                .samples
                .into_iter()
                .filter(|(k, _)| k.starts_with("podhost_"))
                .collect::<Samples>(),
        );
    }
    // The same samples whichever the format (the process's own change between scrapes).
    assert!(podhost_series.windows(2).all(|w| w[0] == w[1]));
}

#[tokio::test]
async fn probes_need_no_credential_and_readiness_follows_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let ok = (
        StatusCode::OK,
        "application/json".to_owned(),
        json!({"status": "ok"}).to_string(),
    );
    assert_eq!(open_get(&s, "/livez").await, ok);
    assert_eq!(open_get(&s, "/readyz").await, ok);
    // The details stay behind the credential.
    assert_eq!(open_get(&s, "/healthz").await.0, StatusCode::UNAUTHORIZED);
    let (code, health) = s.call("GET", "/healthz", None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        (&health["status"], &health["store"], &health["version"]),
        (
            &json!("ok"),
            &json!({"writable": true}),
            &json!(env!("CARGO_PKG_VERSION"))
        )
    );
    assert_eq!(health["revision"], env!("BUILD_GIT_REVISION"));

    // Another process holds the store's write lock: not ready, and the details say why.
    let lock = WriteLock::take(&s).await;
    assert_eq!(
        open_get(&s, "/readyz").await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "application/json".to_owned(),
            json!({"status": "unavailable"}).to_string(),
        )
    );
    assert_eq!(open_get(&s, "/livez").await, ok);
    let (code, health) = s.call("GET", "/healthz", None).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        (&health["status"], &health["store"]),
        (
            &json!("degraded"),
            &json!({"writable": false, "error": lock.error()})
        )
    );
    // The lock is given back: ready again, and podhost served throughout.
    lock.release().await;
    assert_eq!(open_get(&s, "/readyz").await, ok);
    let (code, body) = s.status("nope").await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{body}");
    let _: Value = body;
}

/// The store's write lock, held by another process: SQLite's (`BEGIN IMMEDIATE`), or on
/// PostgreSQL a lock on the invocations table that every write conflicts with.
enum WriteLock {
    Sqlite(rusqlite::Connection),
    Postgres(tokio_postgres::Client, tokio::task::JoinHandle<()>),
}

impl WriteLock {
    async fn take(s: &Serve) -> WriteLock {
        if !crate::harness::on_postgres() {
            let lock = rusqlite::Connection::open(s.data.join("podhost.sqlite")).unwrap();
            lock.execute_batch("BEGIN IMMEDIATE;").unwrap();
            return WriteLock::Sqlite(lock);
        }
        let url = crate::harness::store_url(&s.data).unwrap();
        let (client, conn) =
            tokio::time::timeout(T, tokio_postgres::connect(&url, tokio_postgres::NoTls))
                .await
                .unwrap()
                .unwrap();
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        let lock = client.batch_execute("BEGIN; LOCK TABLE invocations IN EXCLUSIVE MODE;");
        tokio::time::timeout(T, lock).await.unwrap().unwrap();
        WriteLock::Postgres(client, driver)
    }

    /// The error the store's health names while the lock is held.
    fn error(&self) -> &'static str {
        match self {
            WriteLock::Sqlite(_) => "store query failed: database is locked",
            WriteLock::Postgres(..) => {
                "store query failed: ERROR: canceling statement due to lock timeout"
            }
        }
    }

    async fn release(self) {
        match self {
            WriteLock::Sqlite(lock) => lock.execute_batch("ROLLBACK;").unwrap(),
            WriteLock::Postgres(client, driver) => {
                tokio::time::timeout(T, client.batch_execute("ROLLBACK;"))
                    .await
                    .unwrap()
                    .unwrap();
                drop(client);
                tokio::time::timeout(T, driver).await.unwrap().unwrap();
            }
        }
    }
}

/// The kubelet's probes and Prometheus's scrapes, every few seconds, are logged at DEBUG when
/// they succeed; the API's requests stay at INFO.
#[tokio::test]
async fn probes_and_scrapes_are_not_logged_at_info() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    for _ in 0..3 {
        for route in ["/livez", "/readyz", "/metrics"] {
            let (code, _, text) = open_get(&s, route).await;
            assert_eq!(code, StatusCode::OK, "{route}: {text}");
        }
        let (code, body) = s.call("GET", "/healthz", None).await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    let (code, body) = s.call("GET", "/get_status?invocation_id=none", None).await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{body}");
    // The log is read from serve's stderr as it comes: wait for the last request's line.
    let deadline = Instant::now() + T;
    while !s.logs().contains("/get_status") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let logs = s.logs();
    let requests: Vec<&str> = logs.lines().filter(|l| l.contains("request")).collect();
    assert!(requests.iter().any(|l| l.contains("/get_status")), "{logs}");
    for route in ["/healthz", "/livez", "/readyz", "/metrics"] {
        assert!(
            !requests.iter().any(|l| l.contains(&format!("\"{route}\""))),
            "{route} logged at INFO:\n{logs}"
        );
    }
}
