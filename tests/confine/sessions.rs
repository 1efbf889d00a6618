//! The session holder of an isolated host: commands start inside it, a timeout or cancellation
//! still ends a command's whole tree (through the pidfd its supervisor sent), a holder that died
//! is started again, and nothing of a session outlives its toolbox.

use std::time::{Duration, Instant};

use podhost::tools::{CallContext, ToolName, ToolOutcome};
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::{Host, assert_still_works, bash, has_namespaces, marker, processes_with, run};

/// Waits (yielding) until `f` holds, for at most 20 s.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, r)| !r.starts_with('Z'))
    })
}

#[tokio::test]
async fn a_timeout_and_a_cancellation_end_the_whole_tree_inside_a_session() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    let tb = host.isolated(|_| {});
    let m = marker("timed-out");
    let out = run(
        &tb,
        ToolName::Bash,
        json!({"command": format!("(exec -a {m} sleep 100) & setsid bash -c 'exec -a {m} sleep 100' & echo started; wait"), "timeout": 1}),
    )
    .await;
    let ToolOutcome::Completed { output } = out else {
        panic!("{out:?}");
    };
    assert_eq!(
        (&output["exitCode"], &output["stdout"], &output["timedOut"]),
        (&json!(124), &json!("started\n"), &json!(true))
    );
    assert_eq!(processes_with(&m), Vec::<i32>::new());

    let m = marker("cancelled");
    let cancel = CancellationToken::new();
    let call = {
        let (tb, cancel, m) = (tb.clone(), cancel.clone(), m.clone());
        tokio::spawn(async move {
            tb.call(
                ToolName::Bash,
                &json!({"command": format!("exec -a {m} sleep 100")}),
                &CallContext::new(cancel),
            )
            .await
        })
    };
    until("the command never started", || {
        !processes_with(&m).is_empty()
    })
    .await;
    cancel.cancel();
    let out = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let ToolOutcome::Completed { output } = out else {
        panic!("{out:?}");
    };
    assert_eq!(output["exitCode"], json!(130));
    assert_eq!(processes_with(&m), Vec::<i32>::new());
    assert_still_works(&tb).await;
}

#[tokio::test]
async fn a_holder_that_died_is_started_again_and_none_outlives_its_toolbox() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    let tb = host.isolated(|_| {});
    assert_eq!(
        tb.executor().session_holder_pid(),
        None,
        "started at the first command"
    );
    let first = bash(&host, &tb, "echo $$").await;
    let holder = tb.executor().session_holder_pid().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(holder),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    until("the holder did not die", || !alive(holder)).await;
    // The next command gets a new session: a fresh PID namespace, where its shell is again one
    // of the first processes (after the holder, the supervisor and the one forked ahead, which
    // the holder forks as the shell starts).
    let fresh = |out: &serde_json::Value| matches!(out["stdout"].as_str(), Some("3\n" | "4\n"));
    assert!(fresh(&first), "{first}");
    let again = bash(&host, &tb, "echo $$").await;
    assert!(fresh(&again), "{again}");
    let second = tb.executor().session_holder_pid().unwrap();
    assert_ne!(second, holder);
    // Parallel commands share the session.
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let tb = tb.clone();
            tokio::spawn(async move {
                run(&tb, ToolName::Bash, json!({"command": format!("echo {i}")})).await
            })
        })
        .collect();
    for (i, c) in calls.into_iter().enumerate() {
        assert_eq!(
            c.await.unwrap(),
            ToolOutcome::completed(
                json!({"exitCode": 0, "stdout": format!("{i}\n"), "stderr": ""})
            )
        );
    }
    drop(tb);
    until("the holder outlived its toolbox", || !alive(second)).await;
}

/// The processes whose parent is `pid` (from each one's `/proc/<pid>/stat`).
fn children_of(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let parent = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<i32>().ok());
        if parent == Some(pid) && alive(child) {
            out.push(child);
        }
    }
    out
}

/// The supervisor a session's holder keeps forked ahead for the next command, killed while it
/// waits (twice, the second time at once), is replaced: the next commands run in the same
/// session, under a new supervisor.
#[tokio::test]
async fn a_supervisor_killed_while_it_waits_is_replaced_and_the_session_serves_on() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    let tb = host.isolated(|_| {});
    assert_eq!(bash(&host, &tb, "echo up").await["stdout"], json!("up\n"));
    let outer = tb.executor().session_holder_pid().unwrap();
    let holder = match children_of(outer)[..] {
        [h] => h,
        ref other => panic!("the session's outer process has children {other:?}"),
    };
    let mut killed = Vec::new();
    for _ in 0..2 {
        let ahead = || {
            let mut c = children_of(holder);
            c.retain(|p| !killed.contains(p));
            c
        };
        until("no supervisor waits ahead", || ahead().len() == 1).await;
        let waiting = ahead()[0];
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(waiting),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        until("the waiting supervisor did not die", || !alive(waiting)).await;
        killed.push(waiting);
    }
    for i in 0..3 {
        let out = bash(&host, &tb, &format!("echo {i}")).await;
        assert_eq!(
            out,
            json!({"exitCode": 0, "stdout": format!("{i}\n"), "stderr": ""})
        );
    }
    assert_eq!(
        tb.executor().session_holder_pid(),
        Some(outer),
        "same session"
    );
    assert!(alive(holder));
}

/// A session's commands run side by side: one waits for a file that a later one makes, and
/// both end (were they taken one after the other, the first would run into its timeout).
#[tokio::test]
async fn a_sessions_commands_run_side_by_side() {
    if !has_namespaces() {
        return crate::fallback::check_landlock_level(&Host::new()).await;
    }
    let host = Host::new();
    let tb = host.isolated(|_| {});
    let flag = marker("side-by-side");
    let waiting = {
        let (tb, flag) = (tb.clone(), flag.clone());
        tokio::spawn(async move {
            run(
                &tb,
                ToolName::Bash,
                json!({"command": format!("touch waiting; while [ ! -e {flag} ]; do sleep 0.01; done; echo seen"),
                       "timeout": 10}),
            )
            .await
        })
    };
    until("the first command never started", || {
        host.ws.join("waiting").exists()
    })
    .await;
    let out = bash(&host, &tb, &format!("touch {flag}; echo made")).await;
    assert_eq!(
        out,
        json!({"exitCode": 0, "stdout": "made\n", "stderr": ""})
    );
    assert_eq!(
        waiting.await.unwrap(),
        ToolOutcome::completed(json!({"exitCode": 0, "stdout": "seen\n", "stderr": ""}))
    );
}
