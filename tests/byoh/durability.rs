//! Crashes, restarts, retention, and refusing to run open on a public address.

use std::time::Duration;

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{KillOnDrop, Options, Serve, T, spawn, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};

#[tokio::test]
async fn kill_9_mid_turn_then_restart_answers_failed_not_404() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.push([Reply::Hang(Box::new(Reply::text("never")))]);
    let mut s = Serve::start(dir.path());
    let (code, _) = s
        .submit(start("s", "i", "x", &fake.base_url(), Some("k")))
        .await;
    assert_eq!(code, StatusCode::ACCEPTED);
    fake.wait_requests(1, T).await;
    s.child.kill().unwrap();
    s.child.wait().unwrap();

    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_ORPHAN_GRACE_SECS", "0"),
    );
    let failed = s.wait_status("i", "failed", T).await;
    assert_eq!(
        failed,
        json!({"protocol_version": "1", "session_id": "s", "invocation_id": "i", "status": "failed",
               "error": {"message": "the podhost replica running this turn stopped (a restart, a crash, or a lost lease). The model API key is never stored, so the turn could not go on, and no retried submission brought a fresh key within 0 s."}})
    );
}

#[tokio::test]
async fn a_retried_submit_after_a_restart_brings_the_key_and_the_turn_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k1")).await;
    fake.push([Reply::Hang(Box::new(Reply::text("never")))]);
    let mut s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), Some("k1")))
        .await;
    fake.wait_requests(1, T).await;
    s.child.kill().unwrap();
    s.child.wait().unwrap();

    fake.accept_keys(&["k2"]);
    fake.push([Reply::text("back again")]);
    let s = Serve::start(dir.path());
    assert_eq!(
        s.status("i").await,
        (StatusCode::OK, status_obj("s", "i", "running"))
    );
    let (code, _) = s
        .submit(start("s", "i", "x", &fake.base_url(), Some("k2")))
        .await;
    assert_eq!(code, StatusCode::ACCEPTED);
    s.wait_status("i", "completed", T).await;
    assert_eq!(
        s.collect("i").await.1["messages"],
        json!([{"role": "assistant", "content": "back again"}])
    );
    assert_eq!(
        fake.requests().last().unwrap().authorization.as_deref(),
        Some("Bearer k2")
    );
}

#[tokio::test]
async fn a_turn_without_a_key_resumes_after_kill_9_and_its_tool_is_not_run_again() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([
        Reply::call(
            "b",
            "bash",
            json!({"command": "echo ran >> runs.txt; sleep 30"}),
        ),
        Reply::text("recovered"),
    ]);
    let mut s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), None)).await;
    let deadline = std::time::Instant::now() + T;
    // `>>` creates the file before `echo` writes to it: wait for the line itself.
    while s.read_file("s", "runs.txt").is_none_or(|r| r != "ran\n") {
        assert!(
            std::time::Instant::now() < deadline,
            "bash never ran:\n{}",
            s.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.child.kill().unwrap();
    s.child.wait().unwrap();

    let s = Serve::start(dir.path());
    s.wait_status("i", "completed", T).await;
    let (_, out) = s.collect("i").await;
    assert_eq!(
        out["messages"],
        json!([
            {"role": "assistant", "tool_calls": [{"id": "b", "type": "function", "function":
                {"name": "bash", "arguments": "{\"command\":\"echo ran >> runs.txt; sleep 30\"}"}}]},
            {"role": "tool", "tool_call_id": "b", "content": podhost::chat::session::INTERRUPTED},
            {"role": "assistant", "content": "recovered"}
        ])
    );
    assert_eq!(s.read_file("s", "runs.txt").as_deref(), Some("ran\n"));
}

#[tokio::test]
async fn finished_sessions_are_swept_and_keep_a_tombstone() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([
        Reply::call("w", "bash", json!({"command": "echo x > f.txt"})),
        Reply::text("done"),
        Reply::call("q", "ask_user", json!({"question": "?"})),
    ]);
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_RETENTION_SECS", "1"),
    );
    s.submit(start("s", "i", "x", &fake.base_url(), None)).await;
    s.wait_status("i", "completed", T).await;
    s.submit(start("s2", "i2", "x", &fake.base_url(), None))
        .await;
    s.wait_status("i2", "input_required", T).await;
    let ws = s.workspace("s");
    assert!(ws.exists());
    // Where sessions have disks of their own, the image goes with the workspace.
    let image = podhost::byoh::sandbox::session_disk_image(&s.data, "s");
    let deadline = std::time::Instant::now() + T;
    while ws.exists() || image.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the workspace was never swept"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        s.status("i").await,
        (StatusCode::OK, status_obj("s", "i", "completed"))
    );
    assert_eq!(
        s.collect("i").await,
        (
            StatusCode::CONFLICT,
            json!({"error": {"message":
            "the output of invocation \"i\" was removed 1 s after it finished (the retention period); its status is kept"}})
        )
    );
    // An active (input_required) session is kept.
    assert!(s.workspace("s2").exists() || s.collect("i2").await.0 == StatusCode::OK);
    assert_eq!(s.collect("i2").await.0, StatusCode::OK);
}

#[tokio::test]
async fn without_a_credential_it_refuses_a_non_loopback_address() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default().env("PODHOST_LISTEN", "0.0.0.0:0");
    let Err(err) = spawn(&dir.path().join("data"), &opts) else {
        panic!("it started without a credential on 0.0.0.0");
    };
    assert!(
        err.contains("podhost serve: refusing to listen on 0.0.0.0:0 without a credential: set PODHOST_TOKEN or PODHOST_TOKEN_FILE, or listen on a loopback address"),
        "{err}"
    );
    assert!(err.starts_with("exit code Some(2)"), "{err}");
    // On loopback it runs open, and says so.
    let (child, _, logs) = spawn(&dir.path().join("data"), &Options::default()).unwrap();
    drop(KillOnDrop(child));
    let logs = logs.lock().unwrap().clone();
    assert!(logs.contains("no credential is configured"), "{logs}");
}

#[tokio::test]
async fn the_credential_can_come_from_a_file_and_must_not_be_empty() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "  from-a-file\n").unwrap();
    let opts = Options::default().env("PODHOST_TOKEN_FILE", file.to_str().unwrap());
    let (child, url, _) = spawn(&dir.path().join("data"), &opts).unwrap();
    let child = KillOnDrop(child);
    let http = reqwest::Client::new();
    let code = |auth: &'static str| {
        let req = http.get(format!("{url}/healthz")).bearer_auth(auth);
        async move { req.send().await.unwrap().status() }
    };
    assert_eq!(code("from-a-file").await, StatusCode::OK);
    assert_eq!(code("from-a-file2").await, StatusCode::UNAUTHORIZED);
    assert_eq!(code(crate::harness::TOKEN).await, StatusCode::UNAUTHORIZED);
    drop(child);

    std::fs::write(&file, "\n").unwrap();
    let Err(err) = spawn(&dir.path().join("data"), &opts) else {
        panic!("it started with an empty credential");
    };
    assert!(
        err.contains("podhost serve: the credential is empty: set PODHOST_TOKEN or PODHOST_TOKEN_FILE to a non-empty value"),
        "{err}"
    );
}
