//! What operators meet around `podhost serve`: the version and revision, completions and man
//! pages, configuration errors that name what was given, and the log settings.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::Value;

use crate::harness::KillOnDrop;
use crate::support::podhost_bin;

/// Runs podhost with `args` and only `env` (plus PATH); answers (exit code, stdout, stderr).
fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(podhost_bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PODHOST_DATA", dir.path().join("data"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn the_version_names_the_revision_it_was_built_from() {
    let want = format!(
        "podhost {} ({})\n",
        env!("CARGO_PKG_VERSION"),
        env!("BUILD_GIT_REVISION")
    );
    assert_eq!(run(&["--version"], &[]), (Some(0), want, String::new()));
    let rev = env!("BUILD_GIT_REVISION");
    assert!(
        rev == "unknown" || (rev.len() == 40 && rev.chars().all(|c| c.is_ascii_hexdigit())),
        "{rev}"
    );
}

#[test]
fn completions_and_man_pages_come_from_the_command_line_definitions() {
    let (code, script, err) = run(&["completions", "bash"], &[]);
    assert_eq!((code, err.as_str()), (Some(0), ""));
    assert!(script.contains("_podhost()"), "{script}");
    assert!(script.contains("--max-running"), "{script}");
    let (code, _, err) = run(&["completions", "tcsh"], &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.starts_with("error: invalid value 'tcsh' for '<SHELL>'"),
        "{err}"
    );

    let dir = tempfile::tempdir().unwrap();
    let man = dir.path().join("man1");
    let (code, listed, err) = run(&["man", "--dir", man.to_str().unwrap()], &[]);
    assert_eq!((code, err.as_str()), (Some(0), ""));
    assert_eq!(listed.lines().count(), 8, "{listed}");
    let page = std::fs::read_to_string(man.join("podhost-serve.1")).unwrap();
    assert!(page.starts_with(".ie \\n(.g .ds Aq \\(aq"), "{page}");
    assert!(page.contains("PODHOST_MAX_RUNNING"), "{page}");
}

#[test]
fn a_bad_setting_is_named_as_it_was_given_and_is_all_that_is_printed() {
    // From the environment: the variable.
    let (code, out, err) = run(&["serve"], &[("PODHOST_MAX_RUNNING", "0")]);
    assert_eq!(
        (code, out.as_str(), err.lines().next().unwrap_or_default()),
        (
            Some(2),
            "",
            "error: invalid value '0' for PODHOST_MAX_RUNNING: 0 is not in 1..=100000"
        )
    );
    // As a flag: the flag.
    let (code, _, err) = run(&["serve", "--max-running", "0"], &[]);
    assert_eq!(
        (code, err.lines().next().unwrap_or_default()),
        (
            Some(2),
            "error: invalid value '0' for '--max-running <MAX_RUNNING>': 0 is not in 1..=100000"
        )
    );
    // podhost's own checks, before any log line.
    let (code, _, err) = run(&["serve"], &[("PODHOST_LISTEN", "nowhere")]);
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "podhost serve: invalid serve configuration:\n  PODHOST_LISTEN: \"nowhere\" is not \
             host:port (such as 127.0.0.1:8080 or [::]:8080)\n"
        )
    );
    let (code, _, err) = run(&["serve", "--listen", "nowhere"], &[]);
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "podhost serve: invalid serve configuration:\n  --listen: \"nowhere\" is not \
             host:port (such as 127.0.0.1:8080 or [::]:8080)\n"
        )
    );
    let (code, _, err) = run(
        &["pod", "--ca-file", "/nonexistent/ca.pem"],
        &[("NYLORUN_SANDBOX_ID", "sbx")],
    );
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "podhost pod: invalid pod configuration:\n  NYLORUN_POD_UID: is not set\n  \
             NYLORUN_SANDBOX_JOIN_FILE: is not set\n  NYLORUN_HARNESS_URL: is not set\n  \
             NYLORUN_GATES_URL: is not set\n"
        )
    );
}

/// Starts `podhost serve` on a free loopback port with `env`; answers the child and its stderr
/// lines up to the one that says where it listens.
fn serve_until_listening(env: &[(&str, &str)]) -> (KillOnDrop, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(podhost_bin())
        .arg("serve")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_DATA", dir.path().join("data"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let child = KillOnDrop(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let done = line.contains("podhost serve listening on");
            lines.push(line);
            if done {
                break;
            }
        }
        let _ = tx.send(lines);
    });
    let lines = rx.recv_timeout(Duration::from_secs(20)).unwrap();
    // The directory must outlive the server; it is small.
    std::mem::forget(dir);
    (child, lines)
}

#[test]
fn log_settings_that_cannot_be_used_are_warned_about() {
    let (_child, lines) =
        serve_until_listening(&[("RUST_LOG", "podhost=loud"), ("PODHOST_LOG_FORMAT", "yaml")]);
    let text = lines.join("\n");
    assert!(
        text.contains("RUST_LOG \"podhost=loud\" is not a valid log filter"),
        "{text}"
    );
    assert!(
        text.contains("PODHOST_LOG_FORMAT \"yaml\" is neither json nor text; writing text"),
        "{text}"
    );
    // The start-up log names the version and the revision.
    assert!(
        text.contains(&format!(
            "podhost {} ({})",
            env!("CARGO_PKG_VERSION"),
            env!("BUILD_GIT_REVISION")
        )),
        "{text}"
    );
}

#[test]
fn json_log_lines_carry_their_fields_at_the_top_level() {
    let (_child, lines) = serve_until_listening(&[("PODHOST_LOG_FORMAT", "json")]);
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let start = parsed
        .iter()
        .find(|v| v["revision"].is_string())
        .unwrap_or_else(|| panic!("no start-up line: {lines:?}"));
    assert_eq!(start["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(start["revision"], env!("BUILD_GIT_REVISION"));
    assert_eq!(start["level"], "INFO");
    assert!(start.get("fields").is_none(), "{start}");
    let listening = parsed.last().unwrap();
    assert!(
        listening["addr"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:")
    );
    assert_eq!(listening["max_running"], 32);
}
