//! Background processes in `serve`: a server started with `run_in_background` answers later
//! calls of the invocation, its output is read in disjoint pieces, the session's cap is
//! enforced, and nothing the invocation started — `setsid` and double-forked children included —
//! outlives its end, its cancellation, or a cancellation while it waits for input; while it
//! waits, its processes keep running for the resume.
//!
//! "Nothing left" is checked by unique arguments (`sleep 99<n>.<pid>`, the server's directory)
//! that no process may carry once the invocation ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, T, resume, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};

/// A number no other process carries in its arguments.
fn marker(n: u32) -> String {
    format!("99{n}.{}", std::process::id())
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

/// Waits until no process carries any of `markers`.
async fn assert_gone(markers: &[String], what: &str) {
    let deadline = Instant::now() + T;
    while let Some(left) = markers.iter().find(|m| process_with(m)) {
        assert!(Instant::now() < deadline, "{left} outlived {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a `sleep` process (not the shell whose command line names it) has `marker` as its
/// argument.
fn sleeping(marker: &str) -> bool {
    let wanted = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.ends_with(wanted.as_bytes()) && c.starts_with(b"sleep\0"))
        })
}

/// Waits until `sleep marker` runs: what its command did before it (an `echo`) is done, and
/// what it started with `setsid` or a fork is there to be killed.
async fn wait_alive(marker: &str, s: &Serve) {
    let deadline = Instant::now() + T;
    while !sleeping(marker) {
        assert!(
            Instant::now() < deadline,
            "{marker} never started:\n{}",
            s.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The last message of a request, when it is a tool result: (its call id, its content).
fn last_result(body: &Value) -> Option<(String, String)> {
    let last = body["messages"].as_array()?.last()?;
    (last["role"] == "tool").then(|| {
        (
            last["tool_call_id"].as_str().unwrap_or("").to_owned(),
            last["content"].as_str().unwrap_or("").to_owned(),
        )
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every tool result of the collected output whose call id starts with `prefix`.
fn results(out: &Value, prefix: &str) -> Vec<Value> {
    out["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter(|m| m["tool_call_id"].as_str().unwrap().starts_with(prefix))
        .map(|m| {
            serde_json::from_str(m["content"].as_str().unwrap()).unwrap_or(m["content"].clone())
        })
        .collect()
}

#[tokio::test]
async fn a_background_server_answers_later_calls_and_dies_with_the_invocation() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let port = free_port();
    let www = format!("www-{}", marker(0));
    let (a, b, c) = (marker(1), marker(2), marker(3));
    let server = format!(
        "mkdir -p {www} && echo one > {www}/one.txt && echo two > {www}/two.txt && \
         exec python3 -u -m http.server {port} --bind 127.0.0.1 --directory {www}"
    );
    // A job whose children leave its process group and session.
    let escapers = format!("(setsid sh -c 'sleep {a}' &); setsid sleep {b} & sleep {c}");
    let curl = move |file: &str| {
        format!(
            "for i in $(seq 200); do curl -sf http://127.0.0.1:{port}/{file} && exit 0; \
             sleep 0.05; done; exit 1"
        )
    };
    let markers = [www.clone(), a.clone(), b.clone(), c.clone()];
    let all_alive = Arc::new(AtomicBool::new(false));
    let seen = all_alive.clone();
    let watched = markers.clone();
    fake.respond_with(move |body| {
        let step = body["messages"].as_array().unwrap().len();
        let poll = |prefix: &str, id: &str| {
            Reply::call(
                &format!("{prefix}.{step}"),
                "bash_output",
                json!({"id": id}),
            )
        };
        let Some((call, content)) = last_result(body) else {
            return Reply::calls(&[
                (
                    "b1",
                    "bash",
                    json!({"command": server, "run_in_background": true}),
                ),
                (
                    "b2",
                    "bash",
                    json!({"command": escapers, "run_in_background": true}),
                ),
            ]);
        };
        match call.split('.').next().unwrap() {
            "b2" => Reply::call(
                "b3",
                "bash",
                json!({"command": "sleep 1", "run_in_background": true}),
            ),
            "b3" => Reply::call("c1", "bash", json!({"command": curl("one.txt")})),
            "c1" => poll("o1", "bg-1"),
            "o1" if !content.contains("GET /one.txt") => poll("o1", "bg-1"),
            "o1" => Reply::call("c2", "bash", json!({"command": curl("two.txt")})),
            "c2" => poll("o2", "bg-1"),
            "o2" if !content.contains("GET /two.txt") => poll("o2", "bg-1"),
            "o2" | "w" if !watched.iter().all(|m| process_with(m)) => poll("w", "bg-2"),
            _ => {
                seen.store(true, Ordering::SeqCst);
                Reply::text("done")
            }
        }
    });
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_MAX_BACKGROUND", "2"),
    );
    s.submit(start("s", "i", "serve", &fake.base_url(), None))
        .await;
    s.wait_status("i", "completed", Duration::from_secs(30))
        .await;
    assert!(all_alive.load(Ordering::SeqCst));
    // Gone before the end was written: no wait needed, but the kernel's reaping may lag.
    assert_gone(&markers, "the invocation's end").await;

    let (code, out) = s.collect("i").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        results(&out, "b"),
        [
            json!({"backgroundId": "bg-1"}),
            json!({"backgroundId": "bg-2"}),
            json!({"kind": "failed", "code": "sandbox.background_limit", "message":
                "2 background processes are running, the most this session may run at once. \
                 Stop one with bash_kill (or wait for one to end) before starting another."}),
        ]
    );
    assert_eq!(
        results(&out, "c"),
        [
            json!({"exitCode": 0, "stdout": "one\n", "stderr": ""}),
            json!({"exitCode": 0, "stdout": "two\n", "stderr": ""})
        ]
    );
    // Each read has only what came after the one before it.
    let text = |prefix: &str| -> String {
        results(&out, prefix)
            .iter()
            .map(|r| {
                assert_eq!(r["running"], true, "{r}");
                format!(
                    "{}{}",
                    r["stdout"].as_str().unwrap(),
                    r["stderr"].as_str().unwrap()
                )
            })
            .collect()
    };
    let (first, second) = (text("o1"), text("o2"));
    assert!(
        first.contains("GET /one.txt") && !first.contains("GET /two.txt"),
        "{first}"
    );
    assert!(
        second.contains("GET /two.txt") && !second.contains("GET /one.txt"),
        "{second}"
    );
}

/// Tool results the model received, as text, in order.
fn tool_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn background_processes_wait_for_the_resume_and_die_on_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    let (kept, cancelled) = (marker(4), marker(5));
    let read_after_resume = Arc::new(Mutex::new(None));
    let record = read_after_resume.clone();
    let (k, c) = (kept.clone(), cancelled.clone());
    fake.respond_with(move |body| {
        let texts = tool_texts(body);
        let task = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_owned();
        let job = if task.contains("first") { &k } else { &c };
        match texts.len() {
            0 => Reply::calls(&[
                (
                    "b1",
                    "bash",
                    json!({"command": format!("echo up; setsid sleep {job}"),
                           "run_in_background": true}),
                ),
                ("q1", "ask_user", json!({"question": "Go on?"})),
            ]),
            2 => Reply::call("o1", "bash_output", json!({"id": "bg-1"})),
            _ => {
                *record.lock().unwrap() = texts.last().cloned();
                Reply::text("done")
            }
        }
    });
    let s = Serve::start(dir.path());
    let url = fake.base_url();

    // Paused for input: the process runs on, and the resumed turn reads it.
    s.submit(start("s", "i1", "first", &url, Some("k"))).await;
    s.wait_status("i1", "input_required", T).await;
    wait_alive(&kept, &s).await;
    s.submit(resume("s", "i1", &[("q1", "yes")], &url, "k"))
        .await;
    s.wait_status("i1", "completed", T).await;
    let read: Value =
        serde_json::from_str(&read_after_resume.lock().unwrap().take().unwrap()).unwrap();
    assert_eq!(
        read,
        json!({"running": true, "stdout": "up\n", "stderr": ""})
    );
    assert_gone(&[kept], "the resumed invocation's end").await;

    // Cancelled while paused: its process dies.
    s.submit(start("s2", "i2", "second", &url, Some("k"))).await;
    s.wait_status("i2", "input_required", T).await;
    wait_alive(&cancelled, &s).await;
    assert_eq!(
        s.cancel("s2", "i2").await,
        (StatusCode::OK, status_obj("s2", "i2", "cancelled"))
    );
    assert_gone(&[cancelled], "the cancel while waiting for input").await;
}

#[tokio::test]
async fn cancelling_a_running_turn_kills_its_background_processes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let m = marker(6);
    fake.push([
        Reply::call(
            "b1",
            "bash",
            json!({"command": format!("(setsid sh -c 'sleep {m}' &); sleep 300"),
                   "run_in_background": true}),
        ),
        Reply::call("b2", "bash", json!({"command": "sleep 300"})),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), None)).await;
    wait_alive(&m, &s).await;
    assert_eq!(
        s.cancel("s", "i").await,
        (StatusCode::OK, status_obj("s", "i", "cancelled"))
    );
    assert_gone(&[m], "the cancel").await;
}

#[tokio::test]
async fn stopping_podhost_kills_the_processes_of_an_invocation_waiting_for_input() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    let (a, b) = (marker(7), marker(8));
    fake.push([Reply::calls(&[
        (
            "b1",
            "bash",
            json!({"command": format!("(setsid sh -c 'sleep {a}' &); sleep {b}"),
                   "run_in_background": true}),
        ),
        ("q1", "ask_user", json!({"question": "Go on?"})),
    ])]);
    let mut s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), Some("k")))
        .await;
    s.wait_status("i", "input_required", T).await;
    wait_alive(&a, &s).await;
    wait_alive(&b, &s).await;
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let deadline = Instant::now() + T;
    while s.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "podhost did not stop");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_gone(&[a, b], "podhost's stop").await;
}
