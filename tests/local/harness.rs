//! Runs the real `podhost` binary for local use, and finds the real clients `.ci/test-clients`
//! installed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};

use crate::openai_fake::FakeModel;
use crate::support::podhost_bin;

/// The key the fake model accepts.
pub const KEY: &str = "local-key-5e1d";
/// The longest a run in these tests takes.
pub const T: Duration = Duration::from_secs(60);

/// What a finished command printed, and its exit code.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// The JSON events of a `--json` run.
    pub fn events(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

/// A `podhost` command with a clean slate: no `OPENAI_*`, `PODHOST_*` or credential-looking
/// variable of the test's own environment, warnings only, stdin empty.
pub fn podhost(args: &[&str]) -> Command {
    let mut cmd = Command::new(podhost_bin());
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, _) in std::env::vars() {
        let upper = name.to_ascii_uppercase();
        let credential = [
            "KEY",
            "SECRET",
            "TOKEN",
            "PASSWORD",
            "PASSWD",
            "CREDENTIAL",
            "AUTH",
            "JWT",
        ]
        .iter()
        .any(|w| upper.contains(w));
        // podhost would name these at start-up: tests that want them set them.
        if name.starts_with("OPENAI_") || name.starts_with("PODHOST_") || credential {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// `podhost run` against `fake` in `workspace`, the key in `MODEL_API_KEY`; `args` come before
/// the task.
pub fn run_cmd(fake: &FakeModel, workspace: &Path, args: &[&str]) -> Command {
    let mut cmd = podhost(&[
        "run",
        "--base-url",
        &fake.base_url(),
        "--model",
        "fake-model",
    ]);
    cmd.args(["--api-key-env", "MODEL_API_KEY", "--workspace"])
        .arg(workspace)
        .args(args)
        .env("MODEL_API_KEY", KEY);
    cmd
}

/// Waits for `child` to end (within [`T`]) and collects what it printed.
pub async fn finish(child: Child) -> Out {
    let out = tokio::time::timeout(T, child.wait_with_output())
        .await
        .expect("podhost did not end in time")
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Spawns `cmd` and waits for it.
pub async fn output(mut cmd: Command) -> Out {
    finish(cmd.spawn().unwrap()).await
}

/// Where `.ci/test-clients` installed the clients.
pub fn clients() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("test-clients");
    assert!(
        dir.join("venv/bin/python").is_file() && dir.join("node/node_modules").is_dir(),
        "the test clients are not installed in {}: run .ci/test-clients (it installs the \
         official MCP SDKs and jsonschema there)",
        dir.display()
    );
    dir
}

/// The Python of the clients' virtual environment.
pub fn python() -> PathBuf {
    clients().join("venv/bin/python")
}

/// A script of `tests/local/clients/`.
pub fn client_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/local/clients")
        .join(name)
}

/// Every line of `stdout` that does not follow `schemas/run-events.v1.json`, as the
/// `jsonschema` package sees it (an empty array when all do).
pub async fn schema_problems(stdout: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    std::fs::write(&events, stdout).unwrap();
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/run-events.v1.json");
    let mut cmd = Command::new(python());
    cmd.arg(client_script("validate_events.py"))
        .arg(schema)
        .arg(&events)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = output(cmd).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    serde_json::from_str(&out.stdout).unwrap()
}

/// Waits until `path` holds a whole line (a command in a test writes it), within [`T`].
pub async fn wait_for_line(path: &Path) -> String {
    tokio::time::timeout(T, async {
        loop {
            if let Ok(text) = std::fs::read_to_string(path)
                && text.ends_with('\n')
            {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{} was not written", path.display()))
}

/// Whether process `pid` is still running (a zombie has ended).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// The pids (in this test's PID namespace) of the processes running with `dir` as their
/// working directory: a command started there and what it started, whatever PID namespace
/// podhost gave them (the pids a command prints of itself are its namespace's).
pub fn running_in(dir: &Path) -> Vec<i32> {
    let dir = std::fs::canonicalize(dir).unwrap();
    let mut pids: Vec<i32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&pid: &i32| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir) && alive(pid)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Waits until none of `pids` runs, within [`T`]; returns those still running then.
pub async fn wait_gone(pids: &[i32]) -> Vec<i32> {
    let _ = tokio::time::timeout(T, async {
        while pids.iter().any(|&p| alive(p)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    pids.iter().copied().filter(|&p| alive(p)).collect()
}

/// Sends `signal` to `child`.
pub fn signal(child: &Child, signal: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, signal).unwrap();
}

/// The events of `out` without the progress ones (their number depends on timing), as
/// `type` names.
pub fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .filter(|t| t != "model_call.progress")
        .collect()
}
