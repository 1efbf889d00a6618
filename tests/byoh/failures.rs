//! Failures, cancellation, backpressure and the output cap.

use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{Options, Serve, T, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};

const KEY: &str = "sk-live-SECRET-4242";

#[tokio::test]
async fn model_errors_fail_the_turn_without_the_key_anywhere() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    let echo = format!("upstream exploded while using key {KEY}");
    fake.push((0..4).map(|_| Reply::Status(500, echo.clone(), None)));
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), Some(KEY)))
        .await;
    let failed = s.wait_status("i", "failed", T).await;
    assert_eq!(
        failed,
        json!({"protocol_version": "1", "session_id": "s", "invocation_id": "i", "status": "failed",
               "error": {"message": "The model endpoint returned HTTP 500 after 4 attempts: {\"error\":{\"message\":\"upstream exploded while using key [redacted]\"}}"}})
    );
    assert_eq!(fake.requests().len(), 4);
    assert_eq!(
        s.collect("i").await,
        (
            StatusCode::CONFLICT,
            json!({"error": {"message":
            "output of invocation \"i\" is not available: the turn did not finish with output (status failed)"}})
        )
    );

    // A wrong key: the server echoes it; podhost scrubs it. Not retried (401).
    let fake2 = FakeModel::start("fake-model", Some("other")).await;
    s.submit(start("s2", "i2", "x", &fake2.base_url(), Some(KEY)))
        .await;
    let failed = s.wait_status("i2", "failed", T).await;
    assert_eq!(
        failed["error"]["message"],
        "The model endpoint returned HTTP 401: {\"error\":{\"message\":\"Incorrect API key provided: [redacted]. You can find your key online.\"}}"
    );
    assert_eq!(fake2.requests().len(), 1);
    // Neither responses nor logs hold the key.
    for id in ["i", "i2"] {
        assert!(!s.status(id).await.1.to_string().contains(KEY));
    }
    let logs = s.logs();
    assert!(logs.contains("status=failed"), "{logs}");
    assert!(!logs.contains(KEY), "{logs}");
    assert!(!logs.contains("SECRET"), "{logs}");
    // The store does not hold it either: its database (on PostgreSQL) or the files on disk.
    if crate::harness::on_postgres() {
        let url = crate::harness::store_url(&s.data).unwrap();
        let dump = crate::pg::TestPg::dump(&url).await;
        assert!(dump.contains("upstream exploded"), "{dump}");
        assert!(!dump.contains(KEY), "{dump}");
    }
    for entry in std::fs::read_dir(&s.data).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            assert!(
                !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
                "{path:?}"
            );
        }
    }
}

#[tokio::test]
async fn retry_after_is_honoured_and_a_later_success_completes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([
        Reply::Status(429, "slow down".into(), Some(1)),
        Reply::text("ok"),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), None)).await;
    s.wait_status("i", "completed", T).await;
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    let gap = reqs[1].at - reqs[0].at;
    assert!(gap >= Duration::from_millis(900), "{gap:?}");
}

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
async fn cancel_during_a_long_bash_kills_its_process_tree() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let marker = format!("podhost-cancel-marker-{}", std::process::id());
    fake.push([Reply::call(
        "b",
        "bash",
        json!({"command": format!("(sleep 300; echo {marker}) & sleep 301 # {marker}")}),
    )]);
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), None)).await;
    fake.wait_requests(1, T).await;
    let deadline = Instant::now() + T;
    while !process_with(&marker) {
        assert!(
            Instant::now() < deadline,
            "the command never started:\n{}",
            s.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let asked = Instant::now();
    let (code, body) = s.cancel("s", "i").await;
    assert_eq!(
        (code, body),
        (StatusCode::OK, status_obj("s", "i", "cancelled"))
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    let deadline = Instant::now() + T;
    while process_with(&marker) {
        assert!(Instant::now() < deadline, "the command outlived the cancel");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.status("i").await.1, status_obj("s", "i", "cancelled"));
    // Cancel again: still cancelled; no further model call was made.
    assert_eq!(
        s.cancel("s", "i").await.1,
        status_obj("s", "i", "cancelled")
    );
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn cancel_while_the_model_call_hangs_aborts_it() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::Hang(Box::new(Reply::text("too late")))]);
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), None)).await;
    fake.wait_requests(1, T).await;
    let (code, body) = s.cancel("s", "i").await;
    assert_eq!(
        (code, body),
        (StatusCode::OK, status_obj("s", "i", "cancelled"))
    );
    // The model request was dropped by podhost.
    fake.wait_idle(T).await;
    fake.release();
    assert_eq!(s.status("i").await.1, status_obj("s", "i", "cancelled"));
    assert_eq!(s.collect("i").await.0, StatusCode::CONFLICT);
}

#[tokio::test]
async fn past_max_running_submit_is_409_without_an_invocation_id() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::Hang(Box::new(Reply::text("a"))), Reply::text("b")]);
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_MAX_RUNNING", "1"),
    );
    s.submit(start("s1", "i1", "x", &fake.base_url(), None))
        .await;
    fake.wait_requests(1, T).await;
    let (code, body) = s
        .submit(start("s2", "i2", "x", &fake.base_url(), None))
        .await;
    assert_eq!(
        (code, body),
        (
            StatusCode::CONFLICT,
            json!({"error": {"message":
            "podhost is busy: 1 turns are running, the most it runs at once; retry later"}})
        )
    );
    // Nothing was stored for the refused submit.
    assert_eq!(s.status("i2").await.0, StatusCode::NOT_FOUND);
    // A retry of the running one is still answered with its status.
    assert_eq!(
        s.submit(start("s1", "i1", "x", &fake.base_url(), None))
            .await,
        (StatusCode::ACCEPTED, status_obj("s1", "i1", "running"))
    );
    fake.release();
    s.wait_status("i1", "completed", T).await;
    assert_eq!(
        s.submit(start("s2", "i2", "x", &fake.base_url(), None))
            .await
            .0,
        StatusCode::ACCEPTED
    );
    s.wait_status("i2", "completed", T).await;
}

#[tokio::test]
async fn collect_output_stays_under_10_mib() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let big = "y".repeat(6 * 1024 * 1024);
    fake.push([
        Reply::Calls {
            text: Some(big.clone()),
            calls: vec![(
                "g".into(),
                "glob".into(),
                json!({"pattern": "*"}).to_string(),
            )],
        },
        Reply::text(&big),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), None)).await;
    s.wait_status("i", "completed", T * 3).await;
    let resp = s
        .http
        .get(format!("{}/collect_output?invocation_id=i", s.url))
        .bearer_auth(crate::harness::TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let bytes = resp.bytes().await.unwrap();
    assert!(bytes.len() < 10 * 1024 * 1024, "{}", bytes.len());
    assert!(
        bytes.len() > 9 * 1024 * 1024,
        "cut too much: {}",
        bytes.len()
    );
    let out: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let msgs = out["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    for i in [0, 2] {
        let text = msgs[i]["content"].as_str().unwrap();
        assert!(text.contains("characters omitted] …"), "message {i}");
        assert!(text.starts_with("yyyy") && text.ends_with("yyyy"));
    }
    assert_eq!(msgs[1]["tool_call_id"], "g");
}

#[tokio::test]
async fn a_turn_that_never_stops_calling_tools_fails_at_the_step_limit() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.respond_with(|_| Reply::call("g", "glob", json!({"pattern": "*.none"})));
    let s = Serve::start_with(dir.path(), Options::default().env("PODHOST_MAX_STEPS", "3"));
    s.submit(start("s", "i", "x", &fake.base_url(), None)).await;
    let failed = s.wait_status("i", "failed", T).await;
    assert_eq!(
        failed["error"]["message"],
        "the turn made 3 model calls without finishing; podhost stops a turn there (PODHOST_MAX_STEPS)"
    );
    assert_eq!(fake.requests().len(), 3);
}
