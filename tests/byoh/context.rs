//! The context budget in `podhost serve` and `podhost run`: a long turn compacted for the model
//! while `collect_output` keeps every message, the compacted view kept across a restart (and a
//! kill at each compaction failpoint), an
//! overflow answered by one compaction and a retry, and images a text-only model cannot read.
//! The fake server counts tokens with its own estimate and refuses past its window.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, resume, start};
use crate::openai_fake::{FakeModel, Recorded, Reply};

/// A long turn's time limit.
const LONG: Duration = Duration::from_secs(240);
const WINDOW: u64 = 9000;
const SUMMARY: &str = "Summary: the agent counted with seq many times for the user.";

fn is_summary(body: &Value) -> bool {
    body.get("tools").is_none()
}

/// A model that runs `seq 1 300` `steps` times, then answers; a summary request gets a summary.
fn counter(steps: usize) -> impl Fn(&Value) -> Reply + Send + Sync + 'static {
    let n = AtomicUsize::new(0);
    move |body| {
        if is_summary(body) {
            return Reply::text(SUMMARY);
        }
        let k = n.fetch_add(1, Ordering::SeqCst);
        if k < steps {
            Reply::call(&format!("c{k}"), "bash", json!({"command": "seq 1 300"}))
        } else {
            Reply::text("Counted.")
        }
    }
}

fn windowed() -> Options {
    Options::default()
        .env("PODHOST_CONTEXT_WINDOW", &WINDOW.to_string())
        .env("PODHOST_MAX_STEPS", "1000")
}

fn room(r: &Recorded) -> u64 {
    r.body["max_tokens"].as_u64().unwrap_or(0)
}

#[tokio::test]
async fn a_long_turn_is_compacted_for_the_model_and_collect_output_keeps_every_message() {
    const STEPS: usize = 120;
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.set_window(Some(WINDOW));
    fake.respond_with(counter(STEPS));
    let s = Serve::start_with(dir.path(), windowed());
    let mut body = start("s", "i", "Count a lot.", &fake.base_url(), None);
    body["model_connection"]["generation_settings"] = json!({"max_tokens": 400});
    s.submit(body).await;
    s.wait_status("i", "completed", LONG).await;

    let requests = fake.requests();
    let summaries = requests.iter().filter(|r| is_summary(&r.body)).count();
    assert!(summaries >= 2, "{summaries} summaries");
    for r in &requests {
        assert!(
            r.tokens + room(r) <= WINDOW,
            "a request of {} tokens (+{}) passed the window",
            r.tokens,
            room(r)
        );
    }
    // Every message the turn made, and none podhost wrote for itself.
    let (code, out) = s.collect("i").await;
    assert_eq!(code, StatusCode::OK);
    let messages = out["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 2 * STEPS + 1);
    assert!(messages.iter().all(|m| !m.to_string().contains(SUMMARY)));
    assert_eq!(messages.last().unwrap()["content"], "Counted.");
    // The model's last request: the system message, the summary joined with the task kept
    // verbatim, and the recent steps.
    let last = &requests.last().unwrap().body["messages"];
    assert_eq!(
        last[1]["content"],
        format!(
            "A summary of the conversation so far, which replaced its older part:\n\n{SUMMARY}\n\n\
             The user's latest message, as they wrote it:\n\nCount a lot."
        )
    );
    assert_eq!(last[2]["role"], "assistant");
}

#[tokio::test]
async fn the_compacted_view_survives_a_restart_and_the_next_turn_starts_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.set_window(Some(WINDOW));
    let count = counter(40);
    let asked = Arc::new(AtomicUsize::new(0));
    let seen = asked.clone();
    fake.respond_with(move |body| {
        let tools = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .count();
        // After the 40 steps, one question; after the answer, done.
        match count(body) {
            Reply::Text(t) if t == "Counted." => {
                if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                    Reply::call("q", "ask_user", json!({"question": "More?"}))
                } else {
                    Reply::text(&format!("Done after {tools} results."))
                }
            }
            other => other,
        }
    });
    let mut s = Serve::start_with(dir.path(), windowed());
    let url = fake.base_url();
    s.submit(start("s", "i", "Count, then ask.", &url, Some("k")))
        .await;
    s.wait_status("i", "input_required", LONG).await;
    let before = fake
        .requests()
        .iter()
        .filter(|r| is_summary(&r.body))
        .count();
    assert!(before >= 1);
    let _ = s.child.kill();
    let _ = s.child.wait();

    let s = Serve::start_with(dir.path(), windowed());
    s.submit(resume("s", "i", &[("q", "No.")], &url, "k")).await;
    s.wait_status("i", "completed", LONG).await;
    let requests = fake.requests();
    let after = requests.last().unwrap();
    assert!(!is_summary(&after.body));
    // The first request of the new turn is the compacted view, not the whole transcript.
    let messages = after.body["messages"].as_array().unwrap();
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .contains(&format!("{SUMMARY}\n\nThe user's latest message")),
        "{}",
        messages[1]
    );
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .ends_with("Count, then ask."),
        "{}",
        messages[1]
    );
    assert!(messages.len() < 40, "{} messages", messages.len());
    assert_eq!(
        messages.last().unwrap(),
        &json!({"role": "tool", "tool_call_id": "q", "content": "No."})
    );
    let (_, out) = s.collect("i").await;
    assert_eq!(out["messages"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn an_overflow_gets_one_compaction_and_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    // podhost believes the window is large; the server holds it to 6000.
    fake.set_window(Some(6000));
    fake.respond_with(counter(20));
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_CONTEXT_WINDOW", "200000"),
    );
    s.submit(start("s", "i", "Count.", &fake.base_url(), None))
        .await;
    s.wait_status("i", "completed", LONG).await;
    let requests = fake.requests();
    let over: Vec<usize> = (0..requests.len())
        .filter(|&i| requests[i].tokens > 6000)
        .collect();
    assert_eq!(over.len(), 1, "refused requests at {over:?}");
    let at = over[0];
    assert!(is_summary(&requests[at + 1].body));
    assert!(!is_summary(&requests[at + 2].body));
    assert!(requests[at + 2].tokens <= 6000);
    let (_, out) = s.collect("i").await;
    assert_eq!(out["messages"].as_array().unwrap().len(), 2 * 20 + 1);
}

fn image_task() -> Value {
    json!([{"role": "user", "content": [
        {"type": "text", "text": "What is in the picture?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg=="}},
    ]}])
}

#[tokio::test]
async fn images_for_a_text_only_model_are_notes_and_a_refused_one_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.set_vision(false);
    fake.push([
        Reply::text("No picture for me."),
        Reply::text("Still none."),
    ]);
    // Declared text-only: the image is a note from the first request on.
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_MODEL_INPUTS", "text"),
    );
    let mut body = start("s1", "i1", "x", &fake.base_url(), None);
    body["input_messages"] = image_task();
    s.submit(body).await;
    s.wait_status("i1", "completed", LONG).await;
    let sent = &fake.requests()[0].body["messages"][1]["content"];
    assert_eq!(
        sent,
        &json!([
            {"type": "text", "text": "What is in the picture?"},
            {"type": "text", "text": "[Attached file image (image/png, 16 bytes). This model cannot read image files, so it is not shown here. Ask the user for what it holds if you need it.]"},
        ])
    );
    // The input as stored and returned keeps its parts.
    drop(s);

    // Undeclared (serve asks no listing): the image is sent, refused, dropped, sent again.
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let mut body = start("s2", "i2", "x", &fake.base_url(), None);
    body["input_messages"] = image_task();
    s.submit(body).await;
    s.wait_status("i2", "completed", LONG).await;
    let requests = fake.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        requests[1].body["messages"][1]["content"][1]["type"],
        "image_url"
    );
    assert_eq!(
        requests[2].body["messages"][1]["content"][1]["text"],
        "[Attached file image (image/png, 16 bytes). The model refused this file, so it is not shown here. Ask the user for what it holds if you need it.]"
    );
}

#[tokio::test]
async fn podhost_run_compacts_with_the_same_loop() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.set_window(Some(WINDOW));
    fake.respond_with(counter(60));
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let url = fake.base_url();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::support::podhost_bin())
            .args(["run", "--base-url", &url, "--model", "fake-model"])
            .args(["--workspace", ws.to_str().unwrap()])
            .args(["--context-window", &WINDOW.to_string()])
            .arg("Count.")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    });
    let out = tokio::time::timeout(LONG, out).await.unwrap().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = fake.requests();
    assert!(requests.iter().any(|r| is_summary(&r.body)));
    assert!(requests.iter().all(|r| r.tokens <= WINDOW));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Counted."));
    assert!(!stdout.contains(SUMMARY));
}

/// `podhost serve` killed by its failpoint right after a summary was written, and right after
/// the compacted view changed in memory before it was stored: started again, the turn goes on
/// from what was stored, every request within the window, and `collect_output` has every
/// message the turn made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_at_each_compaction_boundary_loses_nothing() {
    use std::os::unix::process::ExitStatusExt;
    const STEPS: usize = 40;
    for fp in podhost::failpoints::COMPACTION
        .iter()
        .filter(|f| f.starts_with("serve."))
    {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeModel::start("fake-model", None).await;
        fake.set_window(Some(WINDOW));
        fake.respond_with(counter(STEPS));
        let mut s = Serve::start_with(
            dir.path(),
            windowed().env("PODHOST_FAILPOINTS", &format!("{fp}=kill")),
        );
        let mut body = start("s", "i", "Count a lot.", &fake.base_url(), None);
        body["model_connection"]["generation_settings"] = json!({"max_tokens": 400});
        s.submit(body).await;
        let status = tokio::task::block_in_place(|| s.child.wait()).unwrap();
        assert_eq!(status.signal(), Some(9), "{fp}: {}", s.log_tail());
        let summaries_before = fake
            .requests()
            .iter()
            .filter(|r| is_summary(&r.body))
            .count();
        assert_eq!(summaries_before, 1, "{fp}");

        let s = Serve::start_with(dir.path(), windowed());
        s.wait_status("i", "completed", LONG).await;
        for r in &fake.requests() {
            assert!(
                r.tokens + room(r) <= WINDOW,
                "{fp}: a request of {} tokens (+{}) passed the window",
                r.tokens,
                room(r)
            );
        }
        let (code, out) = s.collect("i").await;
        assert_eq!(code, StatusCode::OK, "{fp}");
        let messages = out["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 2 * STEPS + 1, "{fp}");
        assert!(messages.iter().all(|m| !m.to_string().contains(SUMMARY)));
        assert_eq!(messages.last().unwrap()["content"], "Counted.", "{fp}");
    }
}
