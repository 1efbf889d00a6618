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
    // The next command gets a new session (its shell is again the first process but one).
    let again = bash(&host, &tb, "echo $$").await;
    assert_eq!(again, first);
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
