//! The Agent's setup from a join on a new disk: run once, recorded, never blocking turns.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, FakeCore};
use crate::{PodDirs, PodProcess, mode_of, pod_env};

fn marker(dirs: &PodDirs) -> Value {
    let text = std::fs::read_to_string(dirs.root.join("setup-done")).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("at");
    v
}

#[tokio::test]
async fn setup_files_and_commands_run_once_before_turns() {
    let core = FakeCore::start(CoreOptions::default()).await;
    let setup = json!({"setup": {
        "files": [
            {"path": "in/data.txt", "content": "data\n"},
            {"path": "/workspace/bin/run.sh", "base64": "IyEvYmluL3NoCmVjaG8gaGkK", "mode": "0755"},
        ],
        "commands": ["echo one > one.txt", {"command": "cat in/data.txt > two.txt", "timeout": 30}],
    }});
    core.set_join_extras(setup.clone());
    let dirs = PodDirs::new(&core);
    let env = pod_env(&core, &dirs);
    let mut pod = PodProcess::spawn(&env);
    core.wait_request(0, "hello").await;
    let ws = &dirs.workspace;
    assert_eq!(
        std::fs::read_to_string(ws.join("in/data.txt")).unwrap(),
        "data\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("bin/run.sh")).unwrap(),
        "#!/bin/sh\necho hi\n"
    );
    assert_eq!(mode_of(&ws.join("bin/run.sh")), 0o755);
    assert_eq!(
        std::fs::read_to_string(ws.join("one.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("two.txt")).unwrap(),
        "data\n"
    );
    assert_eq!(
        marker(&dirs),
        json!({"status": "done", "files": 2, "commands": 2})
    );
    pod.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(pod.wait_exit(crate::WAIT).await.success());

    // A restart whose join carries the setup again does not run it again.
    std::fs::remove_file(ws.join("one.txt")).unwrap();
    core.set_join_extras(setup);
    let mark = core.mark();
    let pod = PodProcess::spawn(&env);
    core.wait_request(mark, "hello").await;
    pod.wait_log(&["the setup ran before (setup-done); not running it again"])
        .await;
    assert!(!ws.join("one.txt").exists());
}

#[tokio::test]
async fn a_failing_setup_command_is_logged_recorded_and_turns_go_on() {
    let core = FakeCore::start(CoreOptions::default()).await;
    core.set_join_extras(
        json!({"setup": {"commands": ["echo broken >&2; exit 3", "touch never"]}}),
    );
    let dirs = PodDirs::new(&core);
    let pod = PodProcess::spawn(&pod_env(&core, &dirs));
    core.wait_request(0, "lease").await;
    pod.wait_log(&["a setup command failed", "exit_code=3", "broken"])
        .await;
    assert!(!dirs.workspace.join("never").exists());
    assert_eq!(
        marker(&dirs),
        json!({
            "status": "failed",
            "step": "command 1 (echo broken >&2; exit 3)",
            "message": "exit code 3; stderr ends: broken\n",
        })
    );
}

#[tokio::test]
async fn a_seeded_disk_runs_nothing_and_is_recorded() {
    let core = FakeCore::start(CoreOptions::default()).await;
    core.set_join_extras(json!({"seeded": true, "setup": {"commands": ["touch never"]}}));
    let dirs = PodDirs::new(&core);
    let _pod = PodProcess::spawn(&pod_env(&core, &dirs));
    core.wait_request(0, "hello").await;
    assert_eq!(marker(&dirs), json!({"status": "seeded"}));
    assert!(!dirs.workspace.join("never").exists());
}
