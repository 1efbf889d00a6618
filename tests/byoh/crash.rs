//! Crash anywhere: `podhost serve` is killed (SIGKILL) at each step boundary of a turn and
//! started again on the same data directory; the turn goes on from what was stored. The table
//! says what each boundary keeps: a tool call runs at most once (one interrupted before its
//! result was stored is answered as interrupted, never run again), and the model call whose
//! answer was not yet stored is the one step made again (the documented at-least-once step).

use std::os::unix::process::ExitStatusExt;

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, T, TOKEN, start};
use crate::openai_fake::{FakeModel, Reply};

/// One boundary and what holds after the restart.
struct Row {
    failpoint: &'static str,
    /// Lines the command appended to `log.txt`: never two.
    log_lines: usize,
    /// Requests the model got in all (the first process's included).
    model_requests: usize,
    /// The tool call was answered as interrupted (a crash between its start and its stored
    /// result).
    interrupted: bool,
}

const ROWS: &[Row] = &[
    Row {
        failpoint: "serve.after_accept",
        log_lines: 1,
        model_requests: 2,
        interrupted: false,
    },
    Row {
        failpoint: "serve.after_model",
        log_lines: 1,
        model_requests: 3,
        interrupted: false,
    },
    Row {
        failpoint: "serve.after_assistant_stored",
        log_lines: 0,
        model_requests: 2,
        interrupted: true,
    },
    Row {
        failpoint: "serve.after_tool",
        log_lines: 1,
        model_requests: 2,
        interrupted: true,
    },
    Row {
        failpoint: "serve.after_tool_stored",
        log_lines: 1,
        model_requests: 2,
        interrupted: false,
    },
    Row {
        failpoint: "serve.before_end",
        log_lines: 1,
        model_requests: 2,
        interrupted: false,
    },
];

async fn crash_at(row: &Row) {
    let what = row.failpoint;
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    // The model answers from the transcript, so a step made again gets the same answer.
    fake.respond_with(|body| {
        let last = body["messages"].as_array().and_then(|m| m.last()).cloned();
        match last {
            Some(m) if m["role"] == "tool" => Reply::text("Done."),
            _ => Reply::call("c1", "bash", json!({"command": "echo ran >> log.txt"})),
        }
    });
    let mut s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_FAILPOINTS", &format!("{what}=kill")),
    );
    // The submission may be what dies: its answer is then lost, as Oumi's would be.
    let _ = s
        .http
        .post(format!("{}/submit", s.url))
        .bearer_auth(TOKEN)
        .json(&start("s", "i", "Log it.", &fake.base_url(), None))
        .send()
        .await;
    let status = tokio::task::block_in_place(|| s.child.wait()).unwrap();
    assert_eq!(status.signal(), Some(9), "{what}: {}", s.log_tail());

    let s = Serve::start(dir.path());
    s.wait_status("i", "completed", T).await;
    let (code, out) = s.collect("i").await;
    assert_eq!(code, StatusCode::OK, "{what}: {out}");
    let messages = out["messages"].as_array().unwrap();
    let tool: Vec<&Value> = messages.iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tool.len(), 1, "{what}: {out}");
    let interrupted = tool[0]["content"]
        .as_str()
        .unwrap()
        .contains("This call was interrupted");
    assert_eq!(interrupted, row.interrupted, "{what}: {out}");
    assert_eq!(
        messages.last().unwrap(),
        &json!({"role": "assistant", "content": "Done."}),
        "{what}"
    );
    let lines = s
        .read_file("s", "log.txt")
        .map(|t| t.lines().count())
        .unwrap_or(0);
    assert_eq!(lines, row.log_lines, "{what}: the command's side effect");
    assert_eq!(fake.requests().len(), row.model_requests, "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_step_boundary_survives_a_kill() {
    let mut covered: Vec<&str> = ROWS.iter().map(|r| r.failpoint).collect();
    covered.sort();
    let mut all = podhost::failpoints::SERVE.to_vec();
    all.sort();
    assert_eq!(covered, all);
    for row in ROWS {
        crash_at(row).await;
    }
}
