//! Integration tests of `podhost pod` against a fake Nylorun core, one module per area.
//!
//! Most tests spawn the real binary (`podhost pod`, environment pointing at the fake core, temp
//! directories, short intervals); the run-lifecycle tests run the pod task in-process with a
//! test [`RunHandler`] that holds runs until told otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/mod.rs"]
mod support;

#[path = "../support/fake_core/mod.rs"]
mod fake_core;

#[path = "../support/fake_artifacts/mod.rs"]
mod fake_artifacts;

#[path = "../support/fake_journal.rs"]
mod fake_journal;

#[path = "../support/fake_gates.rs"]
mod fake_gates;

#[path = "../support/fake_toolgate.rs"]
mod fake_toolgate;

#[path = "../support/mcp_servers.rs"]
mod mcp_servers;

#[path = "../support/turn_fixture.rs"]
mod turn_fixture;

#[path = "../support/pod_launch.rs"]
mod pod_launch;

#[path = "../support/driven_runs.rs"]
mod driven_runs;

#[path = "../support/prometheus.rs"]
mod prometheus;

#[path = "../support/tls_front.rs"]
mod tls_front;

mod artifacts;
mod artifacts_export;
mod artifacts_skills;
mod artifacts_spill;
mod channel;
mod config;
mod crash;
mod faults;
mod health;
mod join;
mod lease;
mod mcp;
mod mcp_approvals;
mod mcp_fakes;
mod mcp_faults;
mod mcp_results;
mod metrics;
mod model_gate_faults;
mod setup;
mod slow_peers;
mod tls;
mod turn;
mod turn_context;
mod turn_fakes;
mod turn_journal;
mod turn_replay;
mod turn_segments;
mod turn_stop;
mod workspace;

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fake_core::FakeCore;
use futures_util::future::BoxFuture;
pub use pod_launch::{PodDirs, pod_env, set_env, start_in_process};
use podhost::nylorun::link::lease::{RunEnd, RunHandle, RunHandler, StopReason};
use podhost::nylorun::link::protocol::{RunGrant, RunToken, methods};
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

pub const WAIT: Duration = Duration::from_secs(15);

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
