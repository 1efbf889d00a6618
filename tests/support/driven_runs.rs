//! An in-process pod that hands each granted run to its caller: `podhost pod`'s task runs in
//! this process against the fake core, and a run handler gives the test (or benchmark) each
//! run's channel, so it drives `podhost::nylorun::artifacts` against the fake core's store
//! directly.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use podhost::nylorun::artifacts::Artifacts;
use podhost::nylorun::link::channel::Channel;
use podhost::nylorun::link::lease::{RunEnd, RunHandle, RunHandler};
use podhost::nylorun::link::protocol::TurnLimits;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::fake_core::{CoreOptions, Event, FakeCore};
use crate::pod_launch::{PodDirs, pod_env, set_env, start_in_process};

const WAIT: Duration = Duration::from_secs(15);

/// Awaits `f`, failing the test after [`WAIT`].
pub async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("timed out waiting for an artifact call")
}

/// One granted run, handed to the test.
pub struct Driven {
    pub run_id: String,
    pub turn: String,
    pub input: Value,
    pub channel: Channel,
    finish: Option<oneshot::Sender<RunEnd>>,
}

impl Driven {
    /// The run's artifacts with the limits of its `TurnStart`.
    pub fn artifacts(&self) -> Artifacts {
        let limits: TurnLimits =
            serde_json::from_value(self.input["limits"].clone()).unwrap_or_default();
        Artifacts::new(self.channel.clone(), self.run_id.clone(), limits)
    }

    /// A tool effect id of this run's turn.
    pub fn effect(&self, call: &str) -> String {
        format!("{}:0:tool:{call}", self.turn)
    }

    /// Ends the run with `turn.completed`.
    pub fn finish(mut self) {
        if let Some(tx) = self.finish.take() {
            let _ = tx.send(RunEnd::Output {
                method: "turn.completed",
                output: json!({"runId": self.run_id, "status": "completed", "output": "done"}),
            });
        }
    }
}

struct Driving {
    runs: mpsc::UnboundedSender<Driven>,
}

impl RunHandler for Driving {
    fn handle(&self, run: RunHandle) -> BoxFuture<'static, RunEnd> {
        let (finish, finished) = oneshot::channel();
        let g = run.grant();
        let _ = self.runs.send(Driven {
            run_id: g.run_id.clone(),
            turn: g.turn_id.clone(),
            input: run.input().clone(),
            channel: run.channel().clone(),
            finish: Some(finish),
        });
        Box::pin(async move {
            let cancel = run.cancelled();
            tokio::select! {
                end = finished => end.unwrap_or(RunEnd::Release(podhost::nylorun::link::protocol::ReleaseReason::Shutdown)),
                _ = cancel.cancelled() => RunEnd::Release(podhost::nylorun::link::protocol::ReleaseReason::Shutdown),
            }
        })
    }
}

/// The fake core and an in-process pod that hands runs to the test.
pub struct Pod {
    pub core: FakeCore,
    pub dirs: PodDirs,
    shutdown: CancellationToken,
    runs: mpsc::UnboundedReceiver<Driven>,
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Pod {
    pub async fn start() -> Pod {
        let core = FakeCore::start(CoreOptions::default()).await;
        let dirs = PodDirs::new(&core);
        let mut env = pod_env(&core, &dirs);
        // Several runs at once: a test may hold one while it starts the next.
        set_env(&mut env, "PODHOST_POD_CONCURRENCY", "4");
        let (tx, runs) = mpsc::unbounded_channel();
        let (shutdown, _task) = start_in_process(&env, Arc::new(Driving { runs: tx }));
        core.wait_request(0, "hello").await;
        Pod {
            core,
            dirs,
            shutdown,
            runs,
        }
    }

    /// A toolbox on the pod's workspace, confined as the pod host's is: what the outputs export
    /// and the skills mount touch files through.
    pub fn toolbox(&self) -> podhost::tools::Toolbox {
        let ws = podhost::floor::workspace::Workspace::new(
            &self.dirs.workspace,
            Some(std::path::Path::new("/workspace")),
        )
        .unwrap();
        podhost::tools::Toolbox::new(ws, crate::support::executor(&self.dirs.workspace))
    }

    /// Grants run `run_id` of `session` with these limits and manifest; returns it.
    pub async fn run(
        &mut self,
        run_id: &str,
        session: &str,
        limits: Value,
        manifest: Value,
    ) -> Driven {
        self.core.grant_value(json!({
            "run": {
                "runId": run_id, "sessionId": session, "turnId": format!("turn_{run_id}"),
                "epoch": 1, "token": "run-token", "tokenExpiresAt": "2030-01-01T00:00:00.000Z",
            },
            "input": {"type": "turn.start", "engine": "agent", "limits": limits, "manifest": manifest},
        }));
        tokio::time::timeout(WAIT, self.runs.recv())
            .await
            .expect("timed out waiting for the run")
            .expect("the pod task ended")
    }

    /// Waits (from `mark`) until core has answered a run's output: the run has ended there.
    pub async fn output_answered(&self, mark: usize) {
        self.core
            .wait_from(mark, "the output's answer", |e| match e {
                Event::ToPod { frame, .. } if frame["r"]["cursor"] == 7 => Some(()),
                _ => None,
            })
            .await;
    }

    /// `artifact.write` params podhost sent, in order.
    pub fn writes(&self) -> Vec<Value> {
        self.requests("artifact.write")
    }

    /// Params of every request `m` podhost sent, in order.
    pub fn requests(&self, m: &str) -> Vec<Value> {
        self.core
            .events()
            .into_iter()
            .filter_map(|e| match e {
                Event::FromPod { frame, .. } if frame["t"] == "req" && frame["m"] == m => {
                    Some(frame["p"].clone())
                }
                _ => None,
            })
            .collect()
    }

    /// Each write as `op` (and `@offset` for a chunk).
    pub fn write_ops(&self) -> Vec<String> {
        self.writes()
            .iter()
            .map(|p| match p["op"].as_str().unwrap_or("") {
                "chunk" => format!("chunk@{}", p["offset"]),
                op => op.to_owned(),
            })
            .collect()
    }
}
