//! How a test or a benchmark starts `podhost pod` against the fake core: the pod's directories,
//! its environment (v5 §9's variables, pointing at the fake core, with intervals short enough
//! for tests), and the pod task run in-process with a run handler of the caller's.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use podhost::nylorun::link::lease::RunHandler;
use tokio_util::sync::CancellationToken;

use crate::fake_core::FakeCore;

/// The directories one pod uses.
pub struct PodDirs {
    pub dir: tempfile::TempDir,
    pub workspace: PathBuf,
    pub root: PathBuf,
    pub join_file: PathBuf,
}

impl PodDirs {
    pub fn new(core: &FakeCore) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("workspace");
        let root = dir.path().join("harness");
        std::fs::create_dir_all(&workspace).unwrap();
        let join_file = dir.path().join("join-token");
        std::fs::write(&join_file, format!("{}\n", core.opts().join_token)).unwrap();
        PodDirs {
            dir,
            workspace: workspace.canonicalize().unwrap(),
            root,
            join_file,
        }
    }
}

/// The pod environment pointing at `core`, with intervals short enough for tests.
pub fn pod_env(core: &FakeCore, dirs: &PodDirs) -> Vec<(String, String)> {
    let o = core.opts();
    [
        ("NYLORUN_SANDBOX_ID", o.sandbox_id.clone()),
        ("NYLORUN_POD_UID", o.pod_uid.clone()),
        (
            "NYLORUN_SANDBOX_JOIN_FILE",
            dirs.join_file.display().to_string(),
        ),
        ("NYLORUN_HARNESS_URL", core.url()),
        ("NYLORUN_GATES_URL", "http://127.0.0.1:9".to_owned()),
        ("NYLORUN_EGRESS_PROXY", "http://egress.test:4200".to_owned()),
        ("HOME", dirs.root.join("home").display().to_string()),
        ("PODHOST_HARNESS_ROOT", dirs.root.display().to_string()),
        ("PODHOST_WORKSPACE", dirs.workspace.display().to_string()),
        ("NYLORUN_HARNESS_HEALTH_PORT", "0".to_owned()),
        ("PODHOST_POD_BACKOFF_BASE_MS", "50".to_owned()),
        ("PODHOST_POD_BACKOFF_CAP_MS", "300".to_owned()),
        ("PODHOST_POD_JOIN_RETRY_MS", "300".to_owned()),
        ("PODHOST_POD_SHUTDOWN_DEADLINE_MS", "3000".to_owned()),
        ("RUST_LOG", "info".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// Sets (or adds) `name` in an environment list.
pub fn set_env(env: &mut Vec<(String, String)>, name: &str, value: &str) {
    env.retain(|(k, _)| k != name);
    env.push((name.to_owned(), value.to_owned()));
}

/// Runs the pod task in this process with `handler`; returns its shutdown token and task.
pub fn start_in_process(
    env: &[(String, String)],
    handler: Arc<dyn RunHandler>,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), podhost::nylorun::host::pod::PodError>>,
) {
    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        pod: podhost::config::PodArgs,
    }
    let flag = |var: &str| -> Option<&'static str> {
        Some(match var {
            "NYLORUN_SANDBOX_ID" => "--sandbox-id",
            "NYLORUN_POD_UID" => "--pod-uid",
            "NYLORUN_SANDBOX_JOIN_FILE" => "--join-file",
            "NYLORUN_HARNESS_URL" => "--harness-url",
            "NYLORUN_GATES_URL" => "--gates-url",
            "NYLORUN_EGRESS_PROXY" => "--egress-proxy",
            "PODHOST_HARNESS_ROOT" => "--harness-root",
            "PODHOST_WORKSPACE" => "--workspace",
            "NYLORUN_HARNESS_HEALTH_PORT" => "--health-port",
            "PODHOST_POD_BACKOFF_BASE_MS" => "--backoff-base-ms",
            "PODHOST_POD_BACKOFF_CAP_MS" => "--backoff-cap-ms",
            "PODHOST_POD_JOIN_RETRY_MS" => "--join-retry-ms",
            "PODHOST_POD_SHUTDOWN_DEADLINE_MS" => "--shutdown-deadline-ms",
            "PODHOST_POD_CONCURRENCY" => "--concurrency",
            "PODHOST_POD_SILENCE_TIMEOUT_MS" => "--silence-timeout-ms",
            "PODHOST_POD_RENEW_INTERVAL_MS" => "--renew-interval-ms",
            _ => return None,
        })
    };
    let mut args = vec!["podhost".to_owned()];
    for (k, v) in env {
        if let Some(f) = flag(k) {
            args.push(f.to_owned());
            args.push(v.clone());
        }
    }
    let config = Wrap::parse_from(args).pod.validate().unwrap();
    // What `podhost`'s main does before it runs the pod: the TLS clients' crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(podhost::nylorun::host::pod::serve(
        config,
        crate::support::supervisor_bin().to_path_buf(),
        handler,
        shutdown.clone(),
    ));
    (shutdown, task)
}
