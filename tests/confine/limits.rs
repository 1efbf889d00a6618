//! Commands that try to take podhost down: a fork bomb under a process limit, a 10 GB file
//! under a file-size limit, a daemon that outlives its command.

use std::ffi::OsString;

use podhost::exec::confine::Settings;
use podhost::exec::{ExecConfig, Executor, ResourceLimits};
use podhost::floor::workspace::Workspace;
use podhost::tools::{ToolName, Toolbox};
use pretty_assertions::assert_eq;
use serde_json::json;

use crate::{Host, assert_still_works, bash, completed, marker, podhost_tool, processes_with, run};

/// RLIMIT_NPROC does not bind root, so podhost runs as nobody here (on a workspace nobody may
/// write): the bomb's forks fail at the limit, the timeout ends it, nothing of it is left (its
/// processes carry a marker in their command line, so other processes of nobody on the machine
/// do not count), and the next call runs.
#[test]
fn a_fork_bomb_stops_at_the_process_limit_and_podhost_survives() {
    let _nobody = crate::nobody_lock();
    let host = Host::new();
    let podhost = host.open_to_everyone();
    let mut args = host.tool_args();
    args.extend(["--limit-processes", "64"].map(OsString::from));
    let m = marker("nobody-bomb");
    let (outcome, stderr, code) = podhost_tool(
        "bash",
        &args,
        // The shell spins without forking once the bomb is lit, so the call ends by its timeout.
        &json!({
            "command": format!("bash -c 'bomb() {{ bomb | bomb & }}; bomb; while :; do :; done' {m}"),
            "timeout": 3
        }),
        &[],
        Some(&podhost),
    );
    assert_eq!(code, 0, "{stderr}");
    let out = completed(&outcome);
    assert_eq!(
        (&out["exitCode"], &out["timedOut"]),
        (&json!(124), &json!(true))
    );
    let err = out["stderr"].as_str().unwrap();
    assert!(
        err.contains("fork: retry: Resource temporarily unavailable"),
        "{err}"
    );
    assert!(
        err.ends_with("Command timed out after 3s and was killed."),
        "{err}"
    );
    assert_eq!(processes_with(&m), Vec::<i32>::new());
    let (outcome, _, code) = podhost_tool(
        "bash",
        &args,
        &json!({"command": "echo after the bomb"}),
        &[],
        Some(&podhost),
    );
    assert_eq!(
        (code, completed(&outcome).clone()),
        (
            0,
            json!({"exitCode": 0, "stdout": "after the bomb\n", "stderr": ""})
        )
    );
}

/// A sparse write 10 GB into a file (cheap on disk) under a 10 MiB file-size limit: the kernel
/// kills the writer with SIGXFSZ before a byte lands, and the next call runs.
#[tokio::test]
async fn a_ten_gigabyte_file_stops_at_the_file_size_limit() {
    let host = Host::new();
    let limits = ResourceLimits {
        file_size: Some(10 << 20),
        ..ResourceLimits::default()
    };
    let exec = Executor::new(ExecConfig {
        limits,
        ..crate::support::executor(&host.ws).config().clone()
    })
    .with_confinement(host.confinement(&Settings::default()));
    let ws = Workspace::new(&host.ws, Some(std::path::Path::new("/workspace"))).unwrap();
    let tb = Toolbox::new(ws, exec);
    let out = bash(
        &host,
        &tb,
        "dd if=/dev/zero of=big bs=1M seek=10240 count=1 2>/dev/null; echo \"dd $?\"; \
         stat -c %s big",
    )
    .await;
    let stderr = out["stderr"].as_str().unwrap().to_owned();
    // bash's job report: "line 1: <pid, padded> <status><command>"; the pid is cut.
    let stderr = stderr
        .split_once("line 1: ")
        .map(|(_, rest)| {
            rest.trim_start()
                .trim_start_matches(|c: char| c.is_ascii_digit())
                .trim_start()
        })
        .unwrap_or(&stderr);
    assert_eq!(
        (out["exitCode"].clone(), out["stdout"].clone(), stderr),
        (
            json!(0),
            json!("dd 153\n0\n"),
            // The status is padded to a width it already exceeds, hence no space.
            "File size limit exceededdd if=/dev/zero of=big bs=1M seek=10240 count=1 2> \
             /dev/null\n"
        )
    );
    assert_still_works(&tb).await;
}

/// A confined command's `setsid` daemon dies with the command: nothing outlives the call.
#[tokio::test]
async fn a_setsid_process_does_not_outlive_its_command() {
    let host = Host::new();
    let tb = host.confined();
    let marker = format!("999.{}777", std::process::id());
    let out = run(
        &tb,
        ToolName::Bash,
        json!({ "command": format!("setsid sleep {marker} & echo started") }),
    )
    .await;
    assert!(out.is_completed(), "{out:?}");
    let left: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == marker.as_bytes()))
        })
        .collect();
    assert_eq!(left.len(), 0, "the daemon outlived its command");
    assert_still_works(&tb).await;
}
