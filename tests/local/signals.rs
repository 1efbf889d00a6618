//! Ctrl-C (SIGINT) and SIGTERM: exit 130 and 143 whether a model call or a command is in
//! flight; a command's whole process tree is killed first; `--json` still ends with
//! `run.finished`.

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::json;

use crate::harness::{
    KEY, T, alive, finish, podhost, run_cmd, running_in, schema_problems, signal, wait_for_line,
    wait_gone,
};
use crate::openai_fake::{FakeModel, Reply};

/// A command that starts a background child and records both pids.
const TREE: &str = "sleep 300 & echo $! $$ > pids; wait";

/// The processes of [`TREE`] run by `podhost tool` in `dir`, once it has started: found by their
/// working directory, since the pids it records are those of its own PID namespace there.
async fn started_in(dir: &std::path::Path) -> Vec<i32> {
    assert_eq!(pids(&wait_for_line(&dir.join("pids")).await).len(), 2);
    let started = running_in(dir);
    // The shell and its `sleep 300`.
    assert_eq!(started.len(), 2, "{started:?}");
    started
}

fn pids(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

async fn mid_model_call(sig: Signal, stream: bool) -> (i32, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::Hang(Box::new(Reply::text("never")))]);
    let mut args = vec!["--json"];
    if !stream {
        args.push("--no-stream");
    }
    args.push("go");
    let child = run_cmd(&fake, dir.path(), &args).spawn().unwrap();
    fake.wait_requests(1, T).await;
    signal(&child, sig);
    let out = finish(child).await;
    // The model request was dropped, not left open.
    fake.wait_idle(T).await;
    assert_eq!(schema_problems(&out.stdout).await, json!([]));
    let last = out.events().last().cloned().unwrap();
    (
        out.code,
        json!([last["status"], last["exit_code"], last["error"]]),
    )
}

#[tokio::test]
async fn ctrl_c_mid_model_call_exits_130() {
    assert_eq!(
        mid_model_call(Signal::SIGINT, true).await,
        (130, json!(["interrupted", 130, "stopped by SIGINT"]))
    );
}

#[tokio::test]
async fn sigterm_mid_model_call_exits_143() {
    assert_eq!(
        mid_model_call(Signal::SIGTERM, false).await,
        (143, json!(["terminated", 143, "stopped by SIGTERM"]))
    );
}

async fn mid_command(sig: Signal) -> (i32, String, Vec<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::call("c1", "bash", json!({"command": TREE}))]);
    let child = run_cmd(&fake, dir.path(), &["go"]).spawn().unwrap();
    let started = pids(&wait_for_line(&dir.path().join("pids")).await);
    assert!(started.iter().all(|&p| alive(p)));
    signal(&child, sig);
    let out = finish(child).await;
    let last = out
        .stderr
        .trim_end()
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    // Gone by the time podhost exited (checked with a deadline, in case of a slow reap).
    (out.code, last, wait_gone(&started).await)
}

#[tokio::test]
async fn ctrl_c_mid_command_kills_its_process_tree_and_exits_130() {
    let (code, last, left) = mid_command(Signal::SIGINT).await;
    assert_eq!((code, left), (130, vec![]));
    assert!(
        last.starts_with("podhost run: interrupted (exit 130) · 1 model call(s) · 1 tool call(s)"),
        "{last}"
    );
}

#[tokio::test]
async fn sigterm_mid_command_kills_its_process_tree_and_exits_143() {
    let (code, last, left) = mid_command(Signal::SIGTERM).await;
    assert_eq!((code, left), (143, vec![]));
    assert!(
        last.starts_with("podhost run: terminated (exit 143)"),
        "{last}"
    );
}

#[tokio::test]
async fn ctrl_c_stops_podhost_tool_with_130_and_its_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let input = json!({"command": TREE}).to_string();
    let mut cmd = podhost(&["tool", "bash", "--input", &input, "--workspace"]);
    cmd.arg(dir.path());
    let child = cmd.spawn().unwrap();
    let started = started_in(dir.path()).await;
    signal(&child, Signal::SIGINT);
    let out = finish(child).await;
    assert_eq!(out.code, 130, "{}", out.stderr);
    let outcome: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        (&outcome["kind"], &outcome["code"]),
        (&json!("failed"), &json!("sandbox.cancelled"))
    );
    let message = outcome["message"].as_str().unwrap();
    assert!(
        message.starts_with("Stopped by SIGINT: the call was cancelled and its processes killed."),
        "{message}"
    );
    assert_eq!(wait_gone(&started).await, Vec::<i32>::new());
}

/// SIGTERM likewise, and what the command printed before it is kept in the message.
#[tokio::test]
async fn sigterm_stops_podhost_tool_with_143_and_its_output_so_far() {
    let dir = tempfile::tempdir().unwrap();
    let command = format!("echo before-the-stop; {TREE}");
    let input = json!({ "command": command }).to_string();
    let mut cmd = podhost(&["tool", "bash", "--input", &input, "--workspace"]);
    cmd.arg(dir.path());
    let child = cmd.spawn().unwrap();
    let started = started_in(dir.path()).await;
    signal(&child, Signal::SIGTERM);
    let out = finish(child).await;
    assert_eq!(out.code, 143, "{}", out.stderr);
    let outcome: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(outcome["code"], json!("sandbox.cancelled"), "{outcome}");
    let message = outcome["message"].as_str().unwrap();
    assert!(message.starts_with("Stopped by SIGTERM: "), "{message}");
    assert!(
        message.contains("stdout so far:\nbefore-the-stop\n"),
        "{message}"
    );
    assert_eq!(wait_gone(&started).await, Vec::<i32>::new());
}
