//! `podhost tool bash` runs its one command in a PID namespace of its own, whose init is
//! podhost's (where podhost builds the command's view: root, or a user namespace of its own),
//! else under a supervisor forked from its own process (no second program to load, no control
//! socket): what those paths own — killing the whole tree on a stop signal and on the timeout
//! (also a tree that ignores SIGTERM), killing what the command left behind before podhost
//! exits, the command's stdin at its end, and podhost's environment closed to the command.
//!
//! The pids a command prints are its own namespace's: the tests find its processes on the host
//! by their working directory, the workspace ([`running_in`]).

use std::process::Stdio;

use nix::sys::signal::Signal;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::harness::{alive, finish, podhost, running_in, signal, wait_for_line, wait_gone};

/// A command that ignores SIGTERM (so do its children), starts a background child that would
/// outlive it, records both pids and never exits.
const STUBBORN: &str = "trap '' TERM; sleep 300 & echo $! $$ > pids; while :; do sleep 1; done";

/// The failpoint that refuses a one-shot command its PID namespace: it runs under a forked
/// supervisor, as where the kernel gives no namespace.
const NO_PID_NAMESPACE: &str = "oneshot.pid_namespace_refused=fail";

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
    assert_eq!(
        pids(&wait_for_line(&dir.path().join("pids")).await).len(),
        2
    );
    // The shell, its `sleep 300` and its loop's `sleep 1`, at least.
    let started = running_in(dir.path());
    assert!(started.len() >= 2, "{started:?}");
    signal(&child, Signal::SIGTERM);
    let out = finish(child).await;
    // Killed before podhost exited: no deadline to wait for.
    let left: Vec<i32> = started.iter().copied().filter(|&p| alive(p)).collect();
    assert_eq!(
        (out.code, left, running_in(dir.path())),
        (143, vec![], vec![]),
        "{}",
        out.stderr
    );
    let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        outcome,
        json!({"kind": "failed", "code": "sandbox.cancelled",
               "message": "Stopped by SIGTERM: the call was cancelled and its processes killed."})
    );
}

/// `podhost tool bash` running `command` (one that ends by writing [`STUBBORN`]'s pids) in
/// `dir`, with `failpoint`, once those pids are written: the child, and the processes running
/// in `dir` then.
async fn start_stubborn(
    dir: &std::path::Path,
    command: &str,
    failpoint: Option<&str>,
) -> (tokio::process::Child, Vec<i32>) {
    let mut cmd = tool(dir, &json!({ "command": command }));
    if let Some(f) = failpoint {
        cmd.env("PODHOST_FAILPOINTS", f);
    }
    let child = cmd.spawn().unwrap();
    assert_eq!(pids(&wait_for_line(&dir.join("pids")).await).len(), 2);
    (child, running_in(dir))
}

/// podhost killed outright (SIGKILL: nothing of it runs again) takes the command's whole tree
/// with it: the kernel ends the namespace's init, which ends every process there; or the
/// supervisor's parent-death signal makes it kill the tree.
#[tokio::test]
async fn sigkill_of_podhost_tool_kills_the_whole_tree() {
    for failpoint in [None, Some(NO_PID_NAMESPACE)] {
        let dir = tempfile::tempdir().unwrap();
        let command = format!("setsid sleep 300 & {STUBBORN}");
        let (child, started) = start_stubborn(dir.path(), &command, failpoint).await;
        assert!(started.len() >= 3, "{failpoint:?}: {started:?}");
        signal(&child, Signal::SIGKILL);
        let out = finish(child).await;
        // Killed by a signal: no exit code.
        assert_eq!(out.code, -1, "{failpoint:?}");
        assert_eq!(
            wait_gone(&started).await,
            Vec::<i32>::new(),
            "{failpoint:?}"
        );
        assert_eq!(running_in(dir.path()), Vec::<i32>::new(), "{failpoint:?}");
    }
}

/// A second stop signal while the tree is being stopped kills it at once, without the rest of
/// its grace: nothing of the tree is left, in its PID namespace or under a supervisor, and the
/// outcome is the stop podhost read first (sent together, the two may be read in either
/// order), its exit code and its message agreeing.
#[tokio::test]
async fn a_second_stop_signal_kills_the_tree_and_keeps_the_first_ones_outcome() {
    for failpoint in [None, Some(NO_PID_NAMESPACE)] {
        let dir = tempfile::tempdir().unwrap();
        let (child, started) = start_stubborn(dir.path(), STUBBORN, failpoint).await;
        assert!(started.len() >= 2, "{failpoint:?}: {started:?}");
        signal(&child, Signal::SIGTERM);
        signal(&child, Signal::SIGINT);
        let out = finish(child).await;
        let left: Vec<i32> = started.iter().copied().filter(|&p| alive(p)).collect();
        assert_eq!(
            (left, running_in(dir.path())),
            (vec![], vec![]),
            "{failpoint:?}"
        );
        let first = match out.code {
            143 => "SIGTERM",
            130 => "SIGINT",
            other => panic!("{failpoint:?}: exit {other}: {}", out.stderr),
        };
        let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(
            outcome,
            json!({"kind": "failed", "code": "sandbox.cancelled", "message": format!(
                "Stopped by {first}: the call was cancelled and its processes killed."
            )}),
            "{failpoint:?}"
        );
    }
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
    // The tree was started, and nothing of it runs once podhost has answered.
    let started = pids(&std::fs::read_to_string(dir.path().join("pids")).unwrap());
    assert_eq!(
        (out.code, started.len(), running_in(dir.path())),
        (0, 2, vec![]),
        "{}",
        out.stderr
    );
    assert_eq!(
        output(&out.stdout),
        json!({
            "exitCode": 124, "stdout": "before\n",
            "stderr": "Command timed out after 1s and was killed.", "timedOut": true
        })
    );
}

/// What a command leaves behind is killed before podhost answers, in its PID namespace or
/// under a supervisor.
#[tokio::test]
async fn what_the_command_leaves_behind_does_not_outlive_podhost_tool() {
    for failpoint in [None, Some(NO_PID_NAMESPACE)] {
        let dir = tempfile::tempdir().unwrap();
        // A plain background child, one in a session of its own, and a double fork.
        let command = "sleep 100 & echo $! >> pids; setsid sleep 100 & echo $! >> pids; \
                       ( sleep 100 & echo $! >> pids ) ; echo started";
        let mut cmd = tool(dir.path(), &json!({"command": command}));
        if let Some(f) = failpoint {
            cmd.env("PODHOST_FAILPOINTS", f);
        }
        let out = finish(cmd.spawn().unwrap()).await;
        assert_eq!(out.code, 0, "{failpoint:?}: {}", out.stderr);
        assert_eq!(
            output(&out.stdout),
            json!({"exitCode": 0, "stdout": "started\n", "stderr": ""}),
            "{failpoint:?}"
        );
        let left = pids(&std::fs::read_to_string(dir.path().join("pids")).unwrap());
        assert_eq!(left.len(), 3, "{failpoint:?}");
        assert_eq!(running_in(dir.path()), Vec::<i32>::new(), "{failpoint:?}");
    }
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

/// podhost's environment is closed to the command: in a PID namespace of its own (its parent
/// podhost is outside it: `$PPID` is 0), the namespace's init shares podhost's memory and is
/// not dumpable; under a supervisor (a fork of podhost, its parent), so is the supervisor.
#[tokio::test]
async fn the_command_cannot_read_podhosts_environment() {
    const SECRET: &str = "oneshot-secret-51f0";
    for failpoint in [None, Some(NO_PID_NAMESPACE)] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = tool(
            dir.path(),
            &json!({"command": "p=$PPID; [ $p = 0 ] && p=1; echo $PPID; cat /proc/$p/comm; \
                                cut -d' ' -f4 /proc/$p/stat; tr '\\0' '\\n' < /proc/$p/environ; \
                                env | grep -c ONESHOT_TOKEN; true"}),
        );
        cmd.env("ONESHOT_TOKEN", SECRET);
        if let Some(f) = failpoint {
            cmd.env("PODHOST_FAILPOINTS", f);
        }
        let child = cmd.spawn().unwrap();
        let podhost_pid = child.id().unwrap();
        let out = finish(child).await;
        assert_eq!(out.code, 0, "{}", out.stderr);
        assert!(!out.stdout.contains(SECRET), "{}", out.stdout);
        let got = output(&out.stdout);
        let stdout = got["stdout"].as_str().unwrap();
        let parent = stdout.lines().next().unwrap();
        // The credential-like variable was withheld from the command's own environment too.
        let expected = if parent == "0" {
            // The init is pid 1; its parent, podhost, is outside the namespace (0).
            assert_eq!(failpoint, None, "{got}");
            json!({
                "exitCode": 0, "stdout": "0\npodhost\n0\n0\n",
                "stderr": "/bin/bash: line 1: /proc/1/environ: Permission denied\n"
            })
        } else {
            if failpoint.is_none() {
                println!("no PID namespace for podhost tool's command here: a supervisor runs it");
            }
            json!({
                "exitCode": 0, "stdout": format!("{parent}\npodhost\n{podhost_pid}\n0\n"),
                "stderr": format!("/bin/bash: line 1: /proc/{parent}/environ: Permission denied\n")
            })
        };
        assert_eq!(got, expected, "{failpoint:?}");
    }
}

/// The outcome of `command` run by `podhost tool bash` with `failpoint`: the command's stdout.
async fn stdout_of(command: &str, failpoint: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tool(dir.path(), &json!({ "command": command }));
    if let Some(f) = failpoint {
        cmd.env("PODHOST_FAILPOINTS", f);
    }
    let out = finish(cmd.spawn().unwrap()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let got = output(&out.stdout);
    assert_eq!(got["exitCode"], 0, "{got}");
    got["stdout"].as_str().unwrap().to_owned()
}

/// The command and what it starts are the first the OOM killer takes (`oom_score_adj` 1000),
/// whichever way it runs; in a PID namespace its init too, which shares podhost's memory.
#[tokio::test]
async fn the_command_is_the_first_the_oom_killer_takes() {
    let got = stdout_of(
        "cat /proc/self/oom_score_adj; sh -c 'cat /proc/self/oom_score_adj'",
        None,
    )
    .await;
    assert_eq!(got, "1000\n1000\n");
    if nix::unistd::geteuid().is_root() {
        // pid 1 of the command's namespace is podhost's init.
        assert_eq!(stdout_of("cat /proc/1/oom_score_adj", None).await, "1000\n");
    }
    for f in [NO_PID_NAMESPACE, "oneshot.proc_refused=fail"] {
        assert_eq!(
            stdout_of("cat /proc/self/oom_score_adj", Some(f)).await,
            "1000\n",
            "{f}"
        );
    }
}

/// A root podhost tool (which builds the command's view itself) runs the command in a PID
/// namespace of its own: its `/proc` shows its own processes only, with their own pids, and
/// `kill` by a pid read there reaches the right process. Where the kernel refuses the namespace
/// or its `/proc`, a supervisor runs the command with the host's `/proc`, never a failed call.
#[tokio::test]
async fn a_root_podhost_tool_runs_its_command_in_a_pid_namespace_of_its_own() {
    let command = "echo $$ $PPID; cat /proc/1/comm; sleep 30 & \
                   pkill -x sleep; wait $!; echo sleep ended $?; ls -d /proc/[0-9]* | wc -l";
    if !nix::unistd::geteuid().is_root() {
        println!(
            "not root: podhost tool's command gets a PID namespace only where it builds a view"
        );
        return;
    }
    let got = stdout_of(command, None).await;
    let lines: Vec<&str> = got.lines().collect();
    // The shell is pid 2 (the init is 1), its parent outside; pkill found the sleep by its
    // namespace's /proc, and the processes there are the init, the shell and `ls` (and `wc`).
    assert_eq!(lines[..3], ["2 0", "podhost", "sleep ended 143"], "{got}");
    let listed: usize = lines[3].trim().parse().unwrap();
    assert!((3..=4).contains(&listed), "{got}");
    for f in [NO_PID_NAMESPACE, "oneshot.proc_refused=fail"] {
        let got = stdout_of("echo $PPID; ls -d /proc/[0-9]* | wc -l", Some(f)).await;
        let mut lines = got.lines();
        assert_ne!(lines.next(), Some("0"), "{f}: {got}");
        // The host's /proc: at least this test's own processes besides the command's.
        let listed: usize = lines.next().unwrap().trim().parse().unwrap();
        assert!(listed > 4, "{f}: {got}");
    }
}

/// The failpoint that starts the command's child only once its view is built, as through a
/// supervisor's code, instead of ahead of it (`exec::ahead`).
const NOT_AHEAD: &str = "oneshot.ahead_refused=fail";

/// A command's child started ahead of its view, which sheds its session, signals, limits,
/// capabilities and installs its filter before the Landlock ruleset exists, ends up exactly as
/// walled as one started after the view: the same credentials, filter, signal state, limits,
/// descriptors, CPUs, Landlock domain (it cannot signal its init) and system-call refusals.
#[tokio::test]
async fn a_child_started_ahead_of_its_view_is_walled_as_one_started_after() {
    let command = "echo $$ $PPID; \
        grep -E '^(Cap|NoNewPrivs|Seccomp|SigBlk|SigIgn|Cpus_allowed_list)' /proc/self/status; \
        ulimit -n -u -c -f; ls /proc/self/fd; \
        kill -0 1 2>/dev/null; echo signal the init: $?; \
        unshare -U true 2>/dev/null; echo unshare: $?; \
        touch /usr/x 2>/dev/null; echo write outside: $?; \
        touch ./inside && echo write inside: $?";
    let ahead = stdout_of(command, None).await;
    let after = stdout_of(command, Some(NOT_AHEAD)).await;
    assert_eq!(ahead, after);
    for line in [
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "CapAmb:\t0000000000000000",
        "CapInh:\t0000000000000000",
        "SigBlk:\t0000000000000000",
        "SigIgn:\t0000000000000000",
        "write inside: 0",
    ] {
        assert!(ahead.lines().any(|l| l == line), "{line:?} in {ahead}");
    }
    for refused in ["unshare: 0", "write outside: 0"] {
        assert!(
            !ahead.lines().any(|l| l == refused),
            "{refused:?} in {ahead}"
        );
    }
    if nix::unistd::geteuid().is_root() {
        // In its PID namespace; Landlock's scoping keeps it from signalling the init.
        assert!(ahead.starts_with("2 0\n"), "{ahead}");
        assert!(ahead.contains("signal the init: 1\n"), "{ahead}");
    }
}

/// A shell that cannot be started is the call's start failing, with the kernel's reason, the
/// same whether its child was started ahead of the view or after.
#[tokio::test]
async fn a_shell_that_cannot_start_fails_the_start_with_the_kernels_reason() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_program = dir.path().join("a-directory");
    std::fs::create_dir(&not_a_program).unwrap();
    for (shell, reason) in [
        (
            std::path::PathBuf::from("/nonexistent/sh"),
            "No such file or directory",
        ),
        (not_a_program, "Permission denied"),
    ] {
        let mut outcomes = Vec::new();
        for failpoint in [None, Some(NOT_AHEAD)] {
            let mut cmd = tool(dir.path(), &json!({"command": "true"}));
            cmd.arg("--shell").arg(&shell);
            if let Some(f) = failpoint {
                cmd.env("PODHOST_FAILPOINTS", f);
            }
            let out = finish(cmd.spawn().unwrap()).await;
            assert_eq!(out.code, 0, "{}", out.stderr);
            let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
            assert_eq!(outcome["code"], "sandbox.start_failed", "{outcome}");
            let message = outcome["message"].as_str().unwrap().to_owned();
            assert!(message.contains(reason), "{message}");
            outcomes.push(message);
        }
        assert_eq!(outcomes[0], outcomes[1]);
    }
}

/// Where podhost cannot join the namespaces its init made (an older kernel, or the init ended
/// first), it makes them itself: the command still gets its read-only view, under a supervisor,
/// and the unused init does not hold podhost up (its leftovers would, for seconds).
#[tokio::test]
async fn namespaces_podhost_cannot_join_are_made_here_with_the_view() {
    if !nix::unistd::geteuid().is_root() {
        println!(
            "not root: podhost tool's command gets a PID namespace only where it builds a view"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tool(
        dir.path(),
        &json!({"command": "echo $PPID; touch /usr/x 2>&1 | grep -c 'Read-only file system'"}),
    );
    cmd.env("PODHOST_FAILPOINTS", "oneshot.join_fails=fail");
    let out = finish(cmd.spawn().unwrap()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    // What the supervisor's leftovers sweep says of a process it waited for in vain.
    assert!(!out.stderr.contains("still alive"), "{}", out.stderr);
    let got = output(&out.stdout);
    let stdout = got["stdout"].as_str().unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_ne!(
        lines[0], "0",
        "a supervisor, not the init's namespace: {stdout}"
    );
    assert_eq!(lines[1], "1", "the view is read-only: {stdout}");
}

/// A step of the child started ahead that fails after its filter and ruleset (its working
/// directory) fails the call's start with the step and the kernel's reason; nothing of the
/// attempt is left running.
#[tokio::test]
async fn a_failed_step_of_the_child_started_ahead_fails_the_start_and_leaves_nothing() {
    if !nix::unistd::geteuid().is_root() {
        println!("not root: no PID namespace, so no child started ahead of the view");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = tool(dir.path(), &json!({"command": "echo ran"}));
    cmd.env("PODHOST_FAILPOINTS", "oneshot.ahead_cwd_refused=fail");
    let out = finish(cmd.spawn().unwrap()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let outcome: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(outcome["code"], "sandbox.start_failed", "{outcome}");
    let message = outcome["message"].as_str().unwrap();
    assert!(
        message.ends_with("-c …: its working directory: Operation not permitted (os error 1)"),
        "{message}"
    );
    assert_eq!(running_in(dir.path()), Vec::<i32>::new());
}
