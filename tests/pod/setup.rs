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

/// The largest setup file podhost fetches (32 MiB, as the README says).
const FETCH_MAX: usize = 32 << 20;

/// Where setup files given by URL live, as the tests name them: reached through the egress
/// proxy (a pod's commands reach nothing else).
const FILES: &str = "http://files.test";

/// The egress proxy for setup files given by URL, on 127.0.0.1:0: it answers the absolute-form
/// requests a proxy gets (`GET http://files.test/data.csv`) by their path; `/big` answers one
/// byte past the fetch limit. Answers its URL, for `NYLORUN_EGRESS_PROXY`.
async fn file_server() -> (String, tokio_util::sync::CancellationToken) {
    use axum::routing::get;
    let app = axum::Router::new()
        .route("/data.csv", get(|| async { "a,b\n1,2\n" }))
        .route("/big", get(|| async { vec![b'x'; FETCH_MAX + 1] }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { s.cancelled().await })
            .await;
    });
    (url, stop)
}

/// The pod's environment with `proxy` as its egress proxy.
fn proxied_env(core: &FakeCore, dirs: &PodDirs, proxy: &str) -> Vec<(String, String)> {
    let mut env = pod_env(core, dirs);
    crate::set_env(&mut env, "NYLORUN_EGRESS_PROXY", proxy);
    env
}

#[tokio::test]
async fn a_setup_file_without_bytes_is_fetched_from_its_url_and_checked() {
    let (proxy, _stop) = file_server().await;
    let url = FILES;
    let core = FakeCore::start(CoreOptions::default()).await;
    let sha = "sha256:d1dcbc7ac6b8a6a1f4c2ca4bdb5f4d7a6ac9f1f4f25f1b2f9b6e53cb8f8fd3a1";
    let good = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(b"a,b\n1,2\n"))
    };
    core.set_join_extras(json!({"setup": {"files": [
        {"path": "in/data.csv", "url": format!("{url}/data.csv"), "sha256": good},
        {"path": "in/other.csv", "url": format!("{url}/data.csv"), "sha256": sha},
    ], "commands": ["touch never"]}}));
    let dirs = PodDirs::new(&core);
    let _pod = PodProcess::spawn(&proxied_env(&core, &dirs, &proxy));
    core.wait_request(0, "lease").await;
    assert_eq!(
        std::fs::read_to_string(dirs.workspace.join("in/data.csv")).unwrap(),
        "a,b\n1,2\n"
    );
    // The second file's bytes are not the ones the setup names: nothing is written, and the
    // setup stops there.
    assert!(!dirs.workspace.join("in/other.csv").exists());
    assert!(!dirs.workspace.join("never").exists());
    assert_eq!(
        marker(&dirs),
        json!({
            "status": "failed",
            "step": "file 2 (in/other.csv)",
            "message": format!(
                "the bytes of in/other.csv have SHA-256 {good}, not the {} the setup names; no \
                 file was written",
                sha.trim_start_matches("sha256:")
            ),
        })
    );
}

#[tokio::test]
async fn a_setup_file_with_no_bytes_and_no_url_fails_the_setup_and_writes_nothing() {
    let (proxy, _stop) = file_server().await;
    let url = FILES;
    let core = FakeCore::start(CoreOptions::default()).await;
    core.set_join_extras(json!({"setup": {"files": [
        {"path": "in/empty.txt", "content": ""},
        {"path": "in/config.json", "mode": "0644"},
        {"path": "in/big.bin", "url": format!("{url}/big")},
    ]}}));
    let dirs = PodDirs::new(&core);
    let _pod = PodProcess::spawn(&pod_env(&core, &dirs));
    core.wait_request(0, "lease").await;
    // An empty file given as such is written; one that names no bytes is not.
    assert_eq!(
        std::fs::read(dirs.workspace.join("in/empty.txt")).unwrap(),
        b""
    );
    assert!(!dirs.workspace.join("in/config.json").exists());
    assert_eq!(
        marker(&dirs),
        json!({
            "status": "failed",
            "step": "file 2 (in/config.json)",
            "message": "in/config.json carries no bytes (base64 or content) and no url to fetch \
                        them from; no file was written",
        })
    );

    // A fetch past the limit fails with the limit named.
    let core = FakeCore::start(CoreOptions::default()).await;
    core.set_join_extras(json!({"setup": {"files": [
        {"path": "in/big.bin", "url": format!("{url}/big?token=secret-in-query")},
    ]}}));
    let dirs = PodDirs::new(&core);
    let pod = PodProcess::spawn(&proxied_env(&core, &dirs, &proxy));
    core.wait_request(0, "lease").await;
    assert!(!dirs.workspace.join("in/big.bin").exists());
    assert_eq!(
        marker(&dirs),
        json!({
            "status": "failed",
            "step": "file 1 (in/big.bin)",
            "message": format!(
                "could not fetch {url}/big: it is past {} bytes",
                FETCH_MAX
            ),
        })
    );
    assert!(pod.logs().iter().all(|l| !l.contains("secret-in-query")));
}
