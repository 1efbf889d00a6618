//! Integration tests of `podhost pod` against a fake Nylorun core, one module per area.
//!
//! Most tests spawn the real binary (`podhost pod`, environment pointing at the fake core, temp
//! directories, short intervals); the run-lifecycle tests run the pod task in-process with a
//! test [`RunHandler`] that holds runs until told otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/mod.rs"]
mod support;

#[path = "../support/fake_core.rs"]
mod fake_core;

#[path = "../support/fake_journal.rs"]
mod fake_journal;

#[path = "../support/fake_gates.rs"]
mod fake_gates;

#[path = "../support/turn_fixture.rs"]
mod turn_fixture;

mod artifacts;
mod artifacts_export;
mod artifacts_measure;
mod artifacts_skills;
mod artifacts_spill;
mod channel;
mod config;
mod crash;
mod faults;
mod health;
mod join;
mod lease;
mod measure;
mod setup;
mod slow_peers;
mod turn;
mod turn_fakes;
mod turn_measure;
mod turn_replay;
mod turn_segments;
mod turn_stop;
mod workspace;

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use fake_core::FakeCore;
use futures_util::future::BoxFuture;
use podhost::nylorun::link::lease::{RunEnd, RunHandle, RunHandler, StopReason};
use podhost::nylorun::link::protocol::{RunGrant, RunToken, methods};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

pub const WAIT: Duration = Duration::from_secs(15);

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

/// A running `podhost pod`, its stderr collected line by line.
pub struct PodProcess {
    pub child: tokio::process::Child,
    logs: Arc<Mutex<Vec<String>>>,
    changed: watch::Sender<usize>,
}

impl PodProcess {
    pub fn spawn(env: &[(String, String)]) -> PodProcess {
        let mut child = tokio::process::Command::new(support::podhost_bin())
            .arg("pod")
            .env_clear()
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let logs = Arc::new(Mutex::new(Vec::new()));
        let changed = watch::Sender::new(0);
        let stderr = child.stderr.take().unwrap();
        let (l, c) = (logs.clone(), changed.clone());
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let n = {
                    let mut logs = l.lock().unwrap();
                    logs.push(line);
                    logs.len()
                };
                c.send_replace(n);
            }
        });
        PodProcess {
            child,
            logs,
            changed,
        }
    }

    pub fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// Waits for a log line containing every one of `needles`.
    pub async fn wait_log(&self, needles: &[&str]) -> String {
        let mut rx = self.changed.subscribe();
        let found = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(l) = self
                    .logs
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|l| needles.iter().all(|n| l.contains(n)))
                {
                    return l.clone();
                }
                if rx.changed().await.is_err() {
                    // stderr closed: the process is gone; one last look.
                    return self
                        .logs
                        .lock()
                        .unwrap()
                        .iter()
                        .find(|l| needles.iter().all(|n| l.contains(n)))
                        .cloned()
                        .unwrap_or_default();
                }
            }
        })
        .await;
        match found {
            Ok(l) if !l.is_empty() => l,
            _ => panic!(
                "no log line with {needles:?}; logs:\n{}",
                self.logs().join("\n")
            ),
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id().unwrap() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(s) => s.unwrap(),
            Err(_) => panic!(
                "podhost did not exit within {within:?}; logs:\n{}",
                self.logs().join("\n")
            ),
        }
    }
}

/// Starts the fake core and `podhost pod` against it; waits for `hello`.
pub async fn start_pod(
    opts: fake_core::CoreOptions,
    tweak: impl FnOnce(&mut Vec<(String, String)>),
) -> (FakeCore, PodDirs, PodProcess, u64) {
    let core = FakeCore::start(opts).await;
    let dirs = PodDirs::new(&core);
    let mut env = pod_env(&core, &dirs);
    tweak(&mut env);
    let pod = PodProcess::spawn(&env);
    let (_, conn, _) = core.wait_request(0, methods::HELLO).await;
    (core, dirs, pod, conn)
}

/// Runs the pod task in this process with `handler`; returns its shutdown token and task.
pub fn start_in_process(
    env: &[(String, String)],
    handler: Arc<dyn RunHandler>,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<Result<(), podhost::nylorun::host::pod::PodError>>,
) {
    // The binary installs the TLS crypto provider in `main`; in process, the test does.
    let _ = rustls::crypto::ring::default_provider().install_default();
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
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(podhost::nylorun::host::pod::serve(
        config,
        support::supervisor_bin().to_path_buf(),
        handler,
        shutdown.clone(),
    ));
    (shutdown, task)
}

/// What the holding handler tells the test about one run.
pub struct HeldRun {
    pub grant: RunGrant,
    pub tokens: watch::Receiver<Option<RunToken>>,
    pub cancelled: CancellationToken,
    /// Ends the run with this, unless it was stopped first.
    pub finish: oneshot::Sender<RunEnd>,
}

/// A handler that holds each run until the test finishes it or the run is stopped; when stopped
/// it reports the reason and answers as turn code would: `turn.failed` with status `cancelled`.
pub struct Holding {
    runs: mpsc::UnboundedSender<HeldRun>,
    stops: mpsc::UnboundedSender<(String, StopReason)>,
}

impl Holding {
    pub fn new() -> (
        Arc<Self>,
        mpsc::UnboundedReceiver<HeldRun>,
        mpsc::UnboundedReceiver<(String, StopReason)>,
    ) {
        let (runs, runs_rx) = mpsc::unbounded_channel();
        let (stops, stops_rx) = mpsc::unbounded_channel();
        (Arc::new(Holding { runs, stops }), runs_rx, stops_rx)
    }
}

impl RunHandler for Holding {
    fn handle(&self, run: RunHandle) -> BoxFuture<'static, RunEnd> {
        let (finish, finished) = oneshot::channel();
        let _ = self.runs.send(HeldRun {
            grant: run.grant().clone(),
            tokens: run.token_updates(),
            cancelled: run.cancelled(),
            finish,
        });
        let stops = self.stops.clone();
        Box::pin(async move {
            let cancel = run.cancelled();
            tokio::select! {
                end = finished => end.unwrap_or(RunEnd::Release(podhost::nylorun::link::protocol::ReleaseReason::Shutdown)),
                _ = cancel.cancelled() => {
                    let reason = run.stop_reason().unwrap();
                    let _ = stops.send((run.grant().run_id.clone(), reason));
                    RunEnd::Output {
                        method: methods::TURN_FAILED,
                        output: json!({
                            "runId": run.grant().run_id,
                            "status": "cancelled",
                            "error": {"message": run.stop_message().unwrap_or_else(|| "Turn cancelled".into())},
                        }),
                    }
                }
            }
        })
    }
}

/// Receives the next item or fails the test after [`WAIT`].
pub async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>, what: &str) -> T {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .unwrap()
}

/// The params of request frame `f`.
pub fn params(f: &Value) -> Value {
    f["p"].clone()
}

/// True when `path` has mode bits `mode`.
pub fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}
