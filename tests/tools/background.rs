//! Background processes at the toolbox: refused where the front offers none (a pod, `podhost
//! tool`: `run_in_background` is then an unknown field like any other), a job whose output is
//! read as it comes, and a registry whose last handle is dropped kills every job's tree.

use std::time::{Duration, Instant};

use podhost::tools::background::Jobs;
use podhost::tools::{CallContext, ToolName, ToolOutcome};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::support::TestWorkspace;

/// A `sleep` argument no other process carries.
fn marker(n: u32) -> String {
    format!("997.{}{n}", std::process::id())
}

/// Whether a process carries `arg` as a whole argument.
fn process_with(arg: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
        })
}

/// Waits (up to 10 s) until `check` holds.
async fn wait_until(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn without_background_processes_the_inputs_and_tools_are_refused() {
    let ws = TestWorkspace::new();
    assert_eq!(
        ws.run(
            ToolName::Bash,
            json!({"command": "true", "run_in_background": true})
        )
        .await,
        ToolOutcome::failed(
            "sandbox.invalid_input",
            "Invalid bash input: unknown field `run_in_background`, expected `command` or \
             `timeout`."
        )
    );
    for tool in ToolName::BACKGROUND {
        assert_eq!(
            ws.run(tool, json!({"id": "bg-1"})).await,
            ToolOutcome::failed(
                "sandbox.invalid_input",
                "Background processes are not offered here: run commands with bash, each of \
                 which ends with its call."
            )
        );
    }
}

#[tokio::test]
async fn dropping_the_last_handle_kills_every_job_tree() {
    let ws = TestWorkspace::new();
    let toolbox = ws.toolbox.clone().with_background(Jobs::new(4));
    let ctx = CallContext::default();
    let call = |tool: ToolName, input: Value| {
        let (toolbox, ctx) = (toolbox.clone(), ctx.clone());
        async move { toolbox.call(tool, &input, &ctx).await.unwrap() }
    };
    assert_eq!(
        call(
            ToolName::Bash,
            json!({"command": "true", "run_in_background": "yes"})
        )
        .await,
        ToolOutcome::failed(
            "sandbox.invalid_input",
            "Invalid bash input: run_in_background: \"yes\" is not true or false."
        )
    );
    let (a, b) = (marker(1), marker(2));
    let command = format!("echo up; (setsid sh -c 'exec sleep {a}' &); sleep {b}");
    assert_eq!(
        call(
            ToolName::Bash,
            json!({"command": command, "run_in_background": true})
        )
        .await,
        ToolOutcome::completed(json!({"backgroundId": "bg-1"}))
    );
    wait_until("the job never started", || {
        process_with(&a) && process_with(&b)
    })
    .await;
    // The output comes as the job writes it; each read takes what came since the last.
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen != "up\n" {
        assert!(Instant::now() < deadline, "{seen:?}");
        let ToolOutcome::Completed { output } =
            call(ToolName::BashOutput, json!({"id": "bg-1"})).await
        else {
            panic!("bash_output failed");
        };
        assert_eq!(output["running"], true);
        seen.push_str(output["stdout"].as_str().unwrap());
    }
    assert_eq!(
        call(ToolName::BashOutput, json!({"id": "bg-1"})).await,
        ToolOutcome::completed(json!({"running": true, "stdout": "", "stderr": ""}))
    );
    drop(toolbox);
    wait_until("the job outlived its registry", || {
        !process_with(&a) && !process_with(&b)
    })
    .await;
}
