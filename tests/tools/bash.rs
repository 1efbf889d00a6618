//! The bash tool through `Toolbox::run` (with the test build of podhost as each command's
//! supervisor), and through the real binary (`podhost tool bash`) where the process itself is what
//! is being checked: its memory, its environment.
//!
//! Every failure mode of `shared/reference/tool-executors.md` §4.A–C and §4.K has a test here:
//! stdin readers, descendants that hold the pipes (background jobs, `setsid`, double forks,
//! `exec > >(tee f)`), gigabytes of output, hostile bytes, timeouts that keep the output.
//!
//! "Nothing left behind" is checked by a unique argument (`sleep 999.<pid><n>`) that no process
//! may carry once the call has returned.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use podhost::exec::{
    BaseEnv, CommandEnv, ExecConfig, ExecError, Executor, MAX_COMMAND_BYTES, ResourceLimits,
};
use podhost::floor::workspace::Workspace;
use podhost::tools::{CallContext, ToolError, ToolName, ToolOutcome, Toolbox};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::{TestWorkspace, podhost_bin, supervisor_bin};

const TIMED_OUT: &str = "Command timed out after 1s and was killed.";

async fn bash(ws: &TestWorkspace, input: Value) -> ToolOutcome {
    ws.run(ToolName::Bash, input).await
}

/// The output object of a completed call.
fn output(outcome: ToolOutcome) -> Value {
    match outcome {
        ToolOutcome::Completed { output } => output,
        other => panic!("expected a completed outcome, got {other:?}"),
    }
}

fn failed(code: &str, message: &str) -> ToolOutcome {
    ToolOutcome::failed(code, message)
}

/// A `sleep` argument no other test (and no other run of this test binary) uses.
fn marker() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "999.{}{:03}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Processes whose argv holds `arg` as a whole argument.
fn processes_with_arg(arg: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && cmdline.split(|&b| b == 0).any(|a| a == arg.as_bytes())
        {
            found.push(pid);
        }
    }
    found
}

/// Fails unless no process carries `arg` (polling up to 10 s, for a slow machine).
fn assert_none_left(arg: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_with_arg(arg);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes carrying {arg} survived the call: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A workspace whose executor is configured by `f` (the shared one uses the defaults).
fn workspace_with(f: impl FnOnce(&mut ExecConfig)) -> TestWorkspace {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("workspace");
    std::fs::create_dir(&root).unwrap();
    let ws = Workspace::new(&root, Some(Path::new("/workspace"))).unwrap();
    let mut config = ExecConfig {
        supervisor: supervisor_bin().to_path_buf(),
        shell: podhost::exec::find_shell(None),
        env: CommandEnv::new(
            BaseEnv {
                home: ws.root().to_path_buf(),
                ..BaseEnv::default()
            },
            None,
        ),
        limits: ResourceLimits::default(),
    };
    f(&mut config);
    let toolbox = Toolbox::new(ws, Executor::new(config));
    TestWorkspace { dir, toolbox }
}

/// `podhost tool bash --input <input>` in `workspace`; returns the outcome and the process.
fn podhost_tool(workspace: &Path, input: &Value, env: &[(&str, &str)]) -> (Value, i32) {
    let out = Command::new(podhost_bin())
        .args(["tool", "bash", "--workspace"])
        .arg(workspace)
        .arg("--input")
        .arg(input.to_string())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let outcome = serde_json::from_str(stdout.trim_end())
        .unwrap_or_else(|e| panic!("podhost printed no outcome ({e}): {stdout}"));
    (outcome, out.status.code().unwrap())
}

#[tokio::test]
async fn exit_code_and_both_streams() {
    let ws = TestWorkspace::new();
    let out = bash(&ws, json!({"command": "echo out; echo err >&2; exit 3"})).await;
    assert_eq!(
        out,
        ToolOutcome::completed(json!({"exitCode": 3, "stdout": "out\n", "stderr": "err\n"}))
    );
}

#[tokio::test]
async fn a_signal_is_128_plus_its_number() {
    let ws = TestWorkspace::new();
    for (command, code) in [
        ("kill -KILL $$", 137),
        ("kill -TERM $$", 143),
        ("exit 255", 255),
    ] {
        let out = output(bash(&ws, json!({ "command": command })).await);
        assert_eq!(
            out,
            json!({"exitCode": code, "stdout": "", "stderr": ""}),
            "{command}"
        );
    }
}

#[tokio::test]
async fn commands_reading_stdin_or_a_terminal_return_at_once() {
    let ws = TestWorkspace::new();
    let cases = [
        ("cat", json!({"exitCode": 0, "stdout": "", "stderr": ""})),
        (
            "read x; echo \"read=$? x=[$x]\"",
            json!({"exitCode": 0, "stdout": "read=1 x=[]\n", "stderr": ""}),
        ),
        (
            "cat /dev/tty",
            json!({"exitCode": 1, "stdout": "",
                   "stderr": "cat: /dev/tty: No such device or address\n"}),
        ),
    ];
    for (command, want) in cases {
        let out = output(bash(&ws, json!({ "command": command, "timeout": 10 })).await);
        assert_eq!(out, want, "{command}");
    }
    let out = output(
        bash(
            &ws,
            json!({"command": "python3 -c 'input()'", "timeout": 10}),
        )
        .await,
    );
    assert_eq!(out["exitCode"], 1);
    let stderr = out["stderr"].as_str().unwrap();
    assert!(
        stderr.ends_with("EOFError: EOF when reading a line\n"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_shell_starts_clean_in_the_workspace() {
    let ws = TestWorkspace::new();
    let out = output(
        bash(
            &ws,
            json!({"command": "pwd; grep -E '^(SigBlk|SigIgn|NoNewPrivs)' /proc/self/status"}),
        )
        .await,
    );
    let stdout = format!(
        "{}\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nNoNewPrivs:\t1\n",
        ws.root().display()
    );
    assert_eq!(out, json!({"exitCode": 0, "stdout": stdout, "stderr": ""}));
}

#[tokio::test]
async fn a_background_job_holding_the_pipes_is_killed_when_the_command_exits() {
    let ws = TestWorkspace::new();
    let (a, b, c) = (marker(), marker(), marker());
    let command =
        format!("sleep {a} & setsid sleep {b} & (setsid sh -c 'sleep {c}' &) & echo started");
    let out = output(bash(&ws, json!({ "command": command })).await);
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "started\n", "stderr": ""})
    );
    for m in [a, b, c] {
        assert_none_left(&m);
    }
}

#[tokio::test]
async fn process_substitution_output_is_flushed_and_tee_ends() {
    let ws = TestWorkspace::new();
    let file = format!("tee-{}.txt", marker());
    let command = format!("exec > >(tee {file}); echo hi");
    let out = output(bash(&ws, json!({ "command": command })).await);
    assert_eq!(out, json!({"exitCode": 0, "stdout": "hi\n", "stderr": ""}));
    assert_eq!(
        std::fs::read_to_string(ws.root().join(&file)).unwrap(),
        "hi\n"
    );
    assert_none_left(&file);
}

#[tokio::test]
async fn timeouts_return_on_time_and_kill_every_descendant() {
    let ws = TestWorkspace::new();
    let (a, b, c, d, e, f) = (marker(), marker(), marker(), marker(), marker(), marker());
    let tee_file = format!("tee-{}.txt", marker());
    let cases = [
        // A background job, and the foreground sleep.
        (format!("sleep {a} & sleep {b}"), ""),
        // A new session: not in the shell's process group.
        (format!("setsid --wait sleep {c}"), ""),
        // A double fork into a new session, re-parented away from the shell.
        (format!("(setsid sh -c 'sleep {d}' &) & sleep {e}"), ""),
        // tee holds the stdout pipe; what it wrote is kept.
        (
            format!("exec > >(tee {tee_file}); echo hi; sleep {f}"),
            "hi\n",
        ),
        // A shell that ignores SIGTERM gets SIGKILL.
        (format!("trap '' TERM; sleep {a}"), ""),
    ];
    for (command, stdout) in cases {
        let out = output(bash(&ws, json!({ "command": command, "timeout": 1 })).await);
        assert_eq!(
            out,
            json!({"exitCode": 124, "stdout": stdout, "stderr": TIMED_OUT, "timedOut": true}),
            "{command}"
        );
    }
    for m in [a, b, c, d, e, f, tee_file] {
        assert_none_left(&m);
    }
}

#[tokio::test]
async fn a_timeout_keeps_the_output_so_far() {
    let ws = TestWorkspace::new();
    let m = marker();
    let command = format!("echo before; printf partial; printf oops >&2; sleep {m}");
    let out = output(bash(&ws, json!({ "command": command, "timeout": 1 })).await);
    assert_eq!(
        out,
        json!({
            "exitCode": 124,
            "stdout": "before\npartial",
            "stderr": format!("oops\n{TIMED_OUT}"),
            "timedOut": true
        })
    );
    let command = format!("echo line >&2; sleep {m}");
    let out = output(bash(&ws, json!({ "command": command, "timeout": 1 })).await);
    assert_eq!(out["stderr"], format!("line\n{TIMED_OUT}"));
    assert_none_left(&m);
}

/// Waits (bounded) until `path` exists: the command has started.
async fn wait_for_file(path: &Path) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while !path.exists() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the command never started");
}

#[tokio::test]
async fn cancellation_exits_130_and_kills_the_tree() {
    let ws = TestWorkspace::new();
    let (a, b) = (marker(), marker());
    let cancel = CancellationToken::new();
    let command = format!("echo before; setsid sleep {a} & touch started; sleep {b}");
    let call = ws.run_with(
        ToolName::Bash,
        json!({ "command": command }),
        CallContext::new(cancel.clone()),
    );
    let canceller = async {
        wait_for_file(&ws.root().join("started")).await;
        cancel.cancel();
    };
    let (outcome, ()) = tokio::join!(call, canceller);
    assert_eq!(
        output(outcome),
        json!({"exitCode": 130, "stdout": "before\n", "stderr": "Command was cancelled and killed."})
    );
    assert_none_left(&a);
    assert_none_left(&b);
}

#[tokio::test]
async fn an_abandoned_call_still_kills_its_command() {
    let ws = TestWorkspace::new();
    let m = marker();
    let command = format!("setsid sleep {m} & touch started; wait");
    let input = json!({ "command": command });
    let ctx = CallContext::default();
    let call = ws.toolbox.call(ToolName::Bash, &input, &ctx);
    let started = ws.root().join("started");
    tokio::select! {
        _ = call => panic!("the command ended by itself"),
        () = wait_for_file(&started) => {}
    }
    // The call's future is dropped here.
    assert_none_left(&m);
}

#[tokio::test]
async fn many_background_processes_and_a_stopped_one_are_all_killed() {
    let ws = TestWorkspace::new();
    let (a, b) = (marker(), marker());
    let command =
        format!("for i in $(seq 30); do sleep {a} & done; sleep {b} & kill -STOP $!; echo done");
    let out = output(bash(&ws, json!({ "command": command })).await);
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "done\n", "stderr": ""})
    );
    assert_none_left(&a);
    assert_none_left(&b);
}

#[tokio::test]
async fn commands_run_concurrently() {
    let ws = TestWorkspace::new();
    let calls = (0..8).map(|i| bash(&ws, json!({ "command": format!("echo {i}") })));
    let outs = futures_util::future::join_all(calls).await;
    for (i, out) in outs.into_iter().enumerate() {
        assert_eq!(
            out,
            ToolOutcome::completed(
                json!({"exitCode": 0, "stdout": format!("{i}\n"), "stderr": ""})
            )
        );
    }
}

fn marker_text(omitted: u64) -> String {
    podhost::floor::text::omitted_marker(omitted)
}

#[tokio::test]
async fn each_stream_is_cut_to_30000_chars_independently() {
    let ws = TestWorkspace::new();
    let command = "{ head -c 20000 /dev/zero | tr '\\0' h; head -c 60000 /dev/zero | tr '\\0' m; \
                   head -c 20000 /dev/zero | tr '\\0' t; } ; \
                   { head -c 20000 /dev/zero | tr '\\0' H; head -c 20000 /dev/zero | tr '\\0' T; } >&2";
    let out = output(bash(&ws, json!({ "command": command })).await);
    let stdout = format!(
        "{}{}{}",
        "h".repeat(15000),
        marker_text(70000),
        "t".repeat(15000)
    );
    let stderr = format!(
        "{}{}{}",
        "H".repeat(15000),
        marker_text(10000),
        "T".repeat(15000)
    );
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": stdout, "stderr": stderr, "truncated": true})
    );
}

#[tokio::test]
async fn the_cut_starts_one_character_past_the_limit() {
    let ws = TestWorkspace::new();
    let out = output(bash(&ws, json!({"command": "printf 'é%.0s' $(seq 30000)"})).await);
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "é".repeat(30000), "stderr": ""})
    );
    let out = output(bash(&ws, json!({"command": "printf 'é%.0s' $(seq 30001) >&2"})).await);
    let stderr = format!(
        "{}{}{}",
        "é".repeat(15000),
        marker_text(1),
        "é".repeat(15000)
    );
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "", "stderr": stderr, "truncated": true})
    );
}

#[tokio::test]
async fn nul_invalid_utf8_and_ansi_escapes_give_valid_json_text() {
    let ws = TestWorkspace::new();
    let command = "printf 'a\\0b\\377\\376c\\033[31mred\\033[0m'; printf '\\0' >&2";
    let outcome = bash(&ws, json!({ "command": command })).await;
    let want = json!({
        "exitCode": 0,
        "stdout": "a\u{FFFD}b\u{FFFD}\u{FFFD}c\u{1b}[31mred\u{1b}[0m",
        "stderr": "\u{FFFD}",
        "replacedBytes": 4
    });
    assert_eq!(output(outcome.clone()), want);
    let wire = serde_json::to_string(&outcome).unwrap();
    assert!(!wire.contains('\0') && !wire.contains('\u{1b}'), "{wire}");
    let back: ToolOutcome = serde_json::from_str(&wire).unwrap();
    assert_eq!(back, outcome);
}

#[tokio::test]
async fn the_environment_is_the_clean_base_plus_the_call_env() {
    let ws = TestWorkspace::new();
    let ctx = CallContext {
        env: vec![
            ("FOO".into(), "bar baz".into()),
            ("NYLORUN_HOST_TOKEN".into(), "secret".into()),
            ("PODHOST_TOKEN".into(), "secret".into()),
            ("NUL_VALUE".into(), "a\0b".into()),
        ],
        ..CallContext::default()
    };
    let out = ws
        .run_with(ToolName::Bash, json!({"command": "env | sort"}), ctx)
        .await;
    let root = ws.root().display();
    let want = format!(
        "DEBIAN_FRONTEND=noninteractive\nFOO=bar baz\nGIT_PAGER=cat\nGIT_TERMINAL_PROMPT=0\n\
         HOME={root}\nLANG=C.UTF-8\nLC_ALL=C.UTF-8\nNO_COLOR=1\nPAGER=cat\n\
         PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nPWD={root}\n\
         SHLVL=1\nTERM=dumb\n_=/usr/bin/env\n"
    );
    assert_eq!(
        output(out),
        json!({"exitCode": 0, "stdout": want, "stderr": ""})
    );
}

/// A request larger than the control socket's buffer (1 MB of call variables) still arrives
/// whole.
#[tokio::test]
async fn a_large_call_environment_arrives_whole() {
    let ws = TestWorkspace::new();
    let ctx = CallContext {
        env: (0..10)
            .map(|i| (format!("V{i}"), i.to_string().repeat(100_000)))
            .collect(),
        ..CallContext::default()
    };
    let command = "echo ${#V0} ${#V9} ${V9:0:3}";
    let out = ws
        .run_with(ToolName::Bash, json!({ "command": command }), ctx)
        .await;
    assert_eq!(
        output(out),
        json!({"exitCode": 0, "stdout": "100000 100000 999\n", "stderr": ""})
    );
}

/// An environment past the kernel's limit for `execve` (or past the supervisor's request limit)
/// is a start failure that says why.
#[tokio::test]
async fn an_environment_too_large_to_exec_is_a_start_failure() {
    let ws = TestWorkspace::new();
    let cases = [
        // 7 MB of variables: past the kernel's limit for arguments and environment together
        // (a quarter of the stack limit, and never more than 6 MiB).
        (
            70,
            "The command could not be started: could not start /bin/bash -c …: Argument list \
              too long (os error 7)",
        ),
        // 9 MB: past what a supervisor reads.
        (
            90,
            "The command could not be started: bad request: larger than 8388608 bytes",
        ),
    ];
    for (vars, message) in cases {
        let ctx = CallContext {
            env: (0..vars)
                .map(|i| (format!("V{i}"), "x".repeat(100_000)))
                .collect(),
            ..CallContext::default()
        };
        let out = ws
            .run_with(ToolName::Bash, json!({"command": "true"}), ctx)
            .await;
        assert_eq!(
            out,
            failed("sandbox.start_failed", message),
            "{vars} variables"
        );
    }
}

/// `podhost tool` runs commands in the user's environment (local use), but podhost's own
/// variables and credentials never reach a command, and its supervisor's environment is empty.
#[test]
fn nothing_of_podhosts_environment_reaches_a_command_or_its_supervisor() {
    // The supervisor's environment is empty; a confined command (or a root one, which has fewer
    // capabilities than its supervisor) cannot even open it, which prints nothing as well. In a
    // PID namespace of its own (its parent podhost outside, `$PPID` 0), the process above the
    // command is the namespace's init, pid 1, which shares podhost's memory: closed the same way.
    let dir = tempfile::tempdir().unwrap();
    let unique = format!("PODHOST_LEAK_CHECK_{}", std::process::id());
    let input = json!({
        "command": "env | cut -d= -f1 | sort | tr '\\n' ' '; \
                    echo; p=$PPID; [ $p = 0 ] && p=1; \
                    tr '\\0' '\\n' 2>/dev/null < /proc/$p/environ | wc -c"
    });
    let env = [
        (unique.as_str(), "leaked"),
        ("NYLORUN_HOST_TOKEN", "secret"),
        ("SOME_SETTING", "leaked"),
    ];
    let (outcome, code) = podhost_tool(dir.path(), &input, &env);
    assert_eq!(code, 0);
    let stdout = outcome["output"]["stdout"].as_str().unwrap();
    let (names, supervisor) = stdout.trim_end().split_once('\n').unwrap();
    let names: Vec<&str> = names.split_whitespace().collect();
    let reached = |n: &str| names.contains(&n);
    assert_eq!(
        (
            reached(&unique),
            reached("NYLORUN_HOST_TOKEN"),
            reached("SOME_SETTING"),
            supervisor
        ),
        (false, false, true, "0"),
        "{stdout}"
    );
}

/// podhost is a child subreaper: when a supervisor is killed outright, what it left is
/// re-parented to podhost (or to the session holder it runs under), which kills it before
/// answering; podhost says the command's supervisor failed, as a fault of its own (exit 1).
/// (The kill comes from here: a confined command cannot signal its supervisor, which is
/// outside its Landlock domain.) Once with the read-only system (a session holder forks the
/// supervisor, where the kernel allows a mount namespace; or `podhost tool` runs the command in
/// a PID namespace of its own, whose init is killed here instead: the kernel kills the rest),
/// once without.
#[test]
fn a_supervisor_killed_outright_leaves_nothing_behind() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    for read_only in ["on", "off"] {
        let dir = tempfile::tempdir().unwrap();
        let m = marker();
        let podhost = start_podhost_tool_with(
            dir.path(),
            &format!("echo $PPID > supervisor; setsid sleep {m} & touch started; wait"),
            &[("PODHOST_READ_ONLY_SYSTEM", read_only)],
        );
        let parent: i32 = std::fs::read_to_string(dir.path().join("supervisor"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // 0: the shell's parent, podhost, is outside its PID namespace.
        let supervisor = match parent {
            0 => namespace_init(podhost.id()),
            pid => pid,
        };
        let held = std::fs::read(format!("/proc/{supervisor}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("__session"));
        kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
        let out = podhost.wait_with_output().unwrap();
        // podhost reaps (and so knows the end of) its own child only.
        let ended = if parent == 0 {
            "the init of the command's PID namespace ended before the command did"
        } else if held {
            "it ended without reporting how the command ended"
        } else {
            "it ended (signal: 9 (SIGKILL)) without reporting how the command ended"
        };
        assert_eq!(
            (out.status.code(), String::from_utf8(out.stderr).unwrap()),
            (
                Some(1),
                format!(
                    "podhost tool: podhost could not run bash: the command supervisor failed: \
                     {ended}\n"
                )
            ),
            "read-only system {read_only}"
        );
        assert_none_left(&m);
    }
}

/// The init of the PID namespace a child of `podhost` (a pid) runs its command in: the child
/// that is pid 1 of its own namespace.
fn namespace_init(podhost: u32) -> i32 {
    let children =
        std::fs::read_to_string(format!("/proc/{podhost}/task/{podhost}/children")).unwrap();
    children
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .find(|pid: &i32| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap()
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .is_some_and(|ids| ids.split_whitespace().last() == Some("1"))
        })
        .unwrap_or_else(|| panic!("no child of podhost is a namespace's init: {children}"))
}

fn start_podhost_tool(workspace: &Path, command: &str) -> std::process::Child {
    start_podhost_tool_with(workspace, command, &[])
}

fn start_podhost_tool_with(
    workspace: &Path,
    command: &str,
    env: &[(&str, &str)],
) -> std::process::Child {
    let child = Command::new(podhost_bin())
        .envs(env.iter().copied())
        .args(["tool", "bash", "--workspace"])
        .arg(workspace)
        .arg("--input")
        .arg(json!({ "command": command }).to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !workspace.join("started").exists() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    child
}

/// The supervisor asked the kernel for SIGTERM when podhost dies: podhost killed outright still
/// takes its commands with it.
#[test]
fn commands_die_with_podhost() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (marker(), marker());
    let mut podhost = start_podhost_tool(
        dir.path(),
        &format!("setsid sleep {a} & touch started; sleep {b}"),
    );
    podhost.kill().unwrap();
    podhost.wait().unwrap();
    assert_none_left(&a);
    assert_none_left(&b);
}

/// Ctrl-C on `podhost tool` cancels the call: the outcome is still printed, exit code 130.
#[test]
fn interrupting_podhost_tool_cancels_the_command() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let m = marker();
    let podhost = start_podhost_tool(dir.path(), &format!("echo hi; touch started; sleep {m}"));
    kill(Pid::from_raw(podhost.id() as i32), Signal::SIGINT).unwrap();
    let out = podhost.wait_with_output().unwrap();
    let outcome: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (out.status.code(), outcome),
        (
            Some(130),
            json!({"kind": "failed", "code": "sandbox.cancelled",
                   "message": "Stopped by SIGINT: the call was cancelled and its processes \
                               killed.\nstdout so far:\nhi\n"})
        )
    );
    assert_none_left(&m);
}

#[tokio::test]
async fn resource_limits_apply_to_the_command() {
    let ws = workspace_with(|c| {
        c.limits = ResourceLimits {
            open_files: Some(123),
            processes: Some(555),
            file_size: Some(1 << 20),
            cpu_seconds: Some(77),
        }
    });
    let out = output(
        bash(
            &ws,
            json!({"command": "ulimit -n; ulimit -u; ulimit -f; ulimit -t; ulimit -Hn"}),
        )
        .await,
    );
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "123\n555\n1024\n77\n123\n", "stderr": ""})
    );
    // A write past the file-size limit fails: SIGXFSZ (25) kills the writer.
    let out = output(
        bash(
            &ws,
            json!({"command": "exec head -c 2000000 /dev/zero > big"}),
        )
        .await,
    );
    assert_eq!(
        out,
        json!({"exitCode": 128 + 25, "stdout": "", "stderr": ""})
    );
    assert_eq!(
        std::fs::metadata(ws.root().join("big")).unwrap().len(),
        1 << 20
    );
}

#[tokio::test]
async fn sh_is_used_when_configured() {
    let ws = workspace_with(|c| c.shell = "/bin/sh".into());
    let out = output(
        bash(
            &ws,
            json!({"command": "echo \"$0\" \"${BASH_VERSION:-no bash}\""}),
        )
        .await,
    );
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "/bin/sh no bash\n", "stderr": ""})
    );
}

#[tokio::test]
async fn invalid_inputs_are_refused_before_running() {
    let ws = TestWorkspace::new();
    let long = "x".repeat(MAX_COMMAND_BYTES + 1);
    let cases = [
        (json!({}), "Invalid bash input: missing field `command`."),
        (
            json!({"command": "true", "timeout": 0}),
            "Invalid bash input: timeout must be between 1 and 600 seconds, got 0.",
        ),
        (
            json!({"command": "true", "timeout": 601}),
            "Invalid bash input: timeout must be between 1 and 600 seconds, got 601.",
        ),
        (
            json!({"command": "true", "timeout": 1.5}),
            "Invalid bash input: timeout: invalid type: floating point `1.5`, expected u64.",
        ),
        (
            json!({"command": "true", "cwd": "/"}),
            "Invalid bash input: unknown field `cwd`, expected `command` or `timeout`.",
        ),
        (
            json!({"command": 7}),
            "Invalid bash input: command: invalid type: integer `7`, expected a string.",
        ),
        (json!({"command": ""}), "The command is empty."),
        (
            json!({"command": "echo a\u{0}b"}),
            "The command holds a NUL character, which a command line cannot carry.",
        ),
        (
            json!({ "command": long }),
            "The command is 131072 bytes; a command can be at most 131071 bytes (the kernel's \
             limit for one argument). Write the script to a file in the workspace and run that \
             file instead.",
        ),
    ];
    for (input, message) in cases {
        assert_eq!(
            bash(&ws, input.clone()).await,
            failed("sandbox.invalid_input", message),
            "{input}"
        );
    }
}

#[tokio::test]
async fn a_command_of_the_largest_length_runs() {
    let ws = TestWorkspace::new();
    let mut command = "echo ok #".to_owned();
    command.push_str(&"x".repeat(MAX_COMMAND_BYTES - command.len()));
    assert_eq!(command.len(), MAX_COMMAND_BYTES);
    let out = output(bash(&ws, json!({ "command": command })).await);
    assert_eq!(out, json!({"exitCode": 0, "stdout": "ok\n", "stderr": ""}));
}

#[tokio::test]
async fn a_missing_shell_is_a_start_failure() {
    let ws = workspace_with(|c| c.shell = "/nonexistent/sh".into());
    assert_eq!(
        bash(&ws, json!({"command": "true"})).await,
        failed(
            "sandbox.start_failed",
            "The command could not be started: could not start /nonexistent/sh -c …: No such \
             file or directory (os error 2)"
        )
    );
}

#[tokio::test]
async fn a_supervisor_that_reports_nothing_is_a_harness_fault() {
    let ws = workspace_with(|c| c.supervisor = "/bin/true".into());
    let err = ws
        .toolbox
        .call(
            ToolName::Bash,
            &json!({"command": "true"}),
            &CallContext::default(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            ToolError::Exec {
                fault: ExecError::Supervisor { .. },
                ..
            }
        ),
        "{err:?}"
    );
    // The whole reason in one message (a failed turn's `error.message`), and no source that
    // would say it twice in an error chain.
    let source = std::error::Error::source(&err).map(ToString::to_string);
    assert_eq!(
        (err.to_string(), source, err.nothing_ran()),
        (
            "podhost could not run bash: the command supervisor failed: it ended (exit status: \
             0) without reporting how the command ended"
                .to_owned(),
            None,
            false
        )
    );
}

/// 2 GiB without a newline through the real binary: the output keeps its exact shape and the
/// podhost process stays under a fixed memory bound.
///
/// The peak is measured in a fresh, small copy of this test binary ([`memory_probe`]): a child's
/// peak RSS as the kernel reports it includes the resident size of the process that spawned it
/// (taken over at `exec`), and this test process can be large while other tests run.
#[test]
fn gigabytes_without_newlines_stay_bounded_in_memory() {
    const BOUND_KIB: u64 = 64 * 1024;
    let probe = Command::new(std::env::current_exe().unwrap())
        .args(["bash::memory_probe", "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1", "-q"])
        .output()
        .unwrap();
    let stdout = String::from_utf8(probe.stdout).unwrap();
    let report = stdout
        .lines()
        .find_map(|l| l.strip_prefix("PROBE "))
        .unwrap_or_else(|| panic!("the probe reported nothing: {stdout}"));
    let (peak_kib, outcome) = report.split_once(' ').unwrap();
    let peak_kib: u64 = peak_kib.parse().unwrap();
    let outcome: Value = serde_json::from_str(outcome).unwrap();
    let total: u64 = 2 << 30;
    let want = format!(
        "{}{}{}",
        "a".repeat(15000),
        marker_text(total - 30000),
        "a".repeat(15000)
    );
    assert_eq!(
        outcome,
        json!({"kind": "completed", "output":
            {"exitCode": 0, "stdout": want, "stderr": "", "truncated": true}})
    );
    assert!(
        peak_kib < BOUND_KIB,
        "peak RSS {peak_kib} KiB is over the bound of {BOUND_KIB} KiB"
    );
}

/// Run by [`gigabytes_without_newlines_stay_bounded_in_memory`] in a process of its own: runs
/// the command through `podhost tool bash` and prints `PROBE <peak KiB> <outcome>`, the peak being
/// the largest resident set among this process's waited-for descendants.
#[test]
#[ignore = "a helper process of gigabytes_without_newlines_stay_bounded_in_memory"]
fn memory_probe() {
    use nix::sys::resource::{UsageWho, getrusage};
    let dir = tempfile::tempdir().unwrap();
    let input = json!({"command": "head -c 2G /dev/zero | tr '\\0' a"});
    let (outcome, code) = podhost_tool(dir.path(), &input, &[]);
    assert_eq!(code, 0);
    let peak_kib = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap().max_rss();
    println!("PROBE {peak_kib} {outcome}");
}
