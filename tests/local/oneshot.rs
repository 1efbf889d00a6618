//! `podhost tool bash` runs its one command under a supervisor forked from its own process (no
//! second program to load, no control socket): what that path owns — killing the whole tree on a
//! stop signal and on the timeout (also a tree that ignores SIGTERM), killing what the command
//! left behind before podhost exits, the command's stdin at its end, and podhost's environment
//! closed to the command.

use std::process::Stdio;

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::harness::{alive, finish, podhost, signal, wait_for_line};

/// A command that ignores SIGTERM (so do its children), starts a background child that would
/// outlive it, records both pids and never exits.
const STUBBORN: &str = "trap '' TERM; sleep 300 & echo $! $$ > pids; while :; do sleep 1; done";

fn pids(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

fn tool(dir: &std::path::Path, input: &Value) -> tokio::process::Command {
    let input = input.to_string();
    let mut cmd = podhost(&["tool", "bash", "--input", &input, "--workspace"]);
    cmd.arg(dir);
    cmd
}

/// The outcome's `output`, with the parts that vary by timing left out.
fn output(stdout: &str) -> Value {
    let outcome: Value = serde_json::from_str(stdout).unwrap();
    assert_eq!(outcome["kind"], "completed", "{outcome}");
    outcome["output"].clone()
}

#[tokio::test]
async fn sigterm_kills_a_tree_that_ignores_sigterm_and_prints_the_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let child = tool(dir.path(), &json!({"command": STUBBORN}))
        .spawn()
        .unwrap();
    let started = pids(&wait_for_line(&dir.path().join("pids")).await);
    assert!(started.iter().all(|&p| alive(p)));
    signal(&child, Signal::SIGTERM);
    let out = finish(child).await;
    // Killed before podhost exited: no deadline to wait for.
    let left: Vec<i32> = started.iter().copied().filter(|&p| alive(p)).collect();
    assert_eq!((out.code, left), (143, vec![]), "{}", out.stderr);
    let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        outcome,
        json!({"kind": "failed", "code": "sandbox.cancelled",
               "message": "Stopped by SIGTERM: the call was cancelled and its processes killed."})
    );
}

#[tokio::test]
async fn the_timeout_kills_a_tree_that_ignores_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let command = format!("echo before; {STUBBORN}");
    let out = finish(
        tool(dir.path(), &json!({"command": command, "timeout": 1}))
            .spawn()
            .unwrap(),
    )
    .await;
    let started = pids(&std::fs::read_to_string(dir.path().join("pids")).unwrap());
    let left: Vec<i32> = started.iter().copied().filter(|&p| alive(p)).collect();
    assert_eq!((out.code, left), (0, vec![]), "{}", out.stderr);
    assert_eq!(
        output(&out.stdout),
        json!({
            "exitCode": 124, "stdout": "before\n",
            "stderr": "Command timed out after 1s and was killed.", "timedOut": true
        })
    );
}

#[tokio::test]
async fn what_the_command_leaves_behind_does_not_outlive_podhost_tool() {
    let dir = tempfile::tempdir().unwrap();
    // A plain background child, one in a session of its own, and a double fork.
    let command = "sleep 100 & echo $! >> pids; setsid sleep 100 & echo $! >> pids; \
                   ( sleep 100 & echo $! >> pids ) ; echo started";
    let out = finish(
        tool(dir.path(), &json!({"command": command}))
            .spawn()
            .unwrap(),
    )
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        output(&out.stdout),
        json!({"exitCode": 0, "stdout": "started\n", "stderr": ""})
    );
    let left = pids(&std::fs::read_to_string(dir.path().join("pids")).unwrap());
    assert_eq!(left.len(), 3);
    let alive_now: Vec<i32> = left.into_iter().filter(|&p| alive(p)).collect();
    assert_eq!(alive_now, Vec::<i32>::new());
}

#[tokio::test]
async fn a_command_reading_stdin_gets_its_end_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tool(
        dir.path(),
        &json!({"command": "cat; echo \"read $(wc -c) bytes\"", "timeout": 30}),
    );
    // podhost's own stdin stays open (the test holds it): the command must not wait on it.
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let held = child.stdin.take();
    let out = finish(child).await;
    drop(held);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        output(&out.stdout),
        json!({"exitCode": 0, "stdout": "read 0 bytes\n", "stderr": ""})
    );
}

#[tokio::test]
async fn the_command_cannot_read_podhosts_environment() {
    const SECRET: &str = "oneshot-secret-51f0";
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tool(
        dir.path(),
        &json!({"command": "echo $PPID; cat /proc/$PPID/comm; cut -d' ' -f4 /proc/$PPID/stat; \
                            tr '\\0' '\\n' < /proc/$PPID/environ; \
                            env | grep -c ONESHOT_TOKEN; true"}),
    );
    cmd.env("ONESHOT_TOKEN", SECRET);
    let child = cmd.spawn().unwrap();
    let podhost_pid = child.id().unwrap();
    let out = finish(child).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains(SECRET), "{}", out.stdout);
    // The command's parent is its supervisor, a fork of podhost (podhost its parent): its
    // environment, podhost's, is closed to the command, and the credential-like variable was
    // withheld from the command's own.
    let got = output(&out.stdout);
    let stdout = got["stdout"].as_str().unwrap();
    let supervisor = stdout.lines().next().unwrap();
    assert_eq!(
        got,
        json!({
            "exitCode": 0, "stdout": format!("{supervisor}\npodhost\n{podhost_pid}\n0\n"),
            "stderr": format!("/bin/bash: line 1: /proc/{supervisor}/environ: Permission denied\n")
        })
    );
}
