//! `podhost pod`: the pod host's main task.
//!
//! Owns the order of things: state under the harness root (volume id) → the workspace and its
//! toolbox (commands get the egress environment) → the health listener → join → the Agent's
//! setup → a connection, `hello`, the lease slots — and again after any loss, with jittered
//! backoff (500 ms to 10 s, reset after a connection that lasted 10 s) — until shutdown.
//!
//! Shutdown (the root token, cancelled on SIGTERM/SIGINT): stop leasing and abort the waiting
//! leases → stop the runs and release them (`shutdown`) → close the connection → cancel
//! everything left, which kills running commands → return, all within the shutdown deadline.
//!
//! Non-goals: turns (the [`TurnRunner`], or a test's [`RunHandler`], plugs in), signal handling (the binary maps signals to the
//! root token, so tests can run the pod in-process).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::exec::env::Egress;
use crate::floor::backoff::{Backoff, sleep_or_cancel};
use crate::floor::tls::{TlsError, client_config};
use crate::floor::workspace::Workspace;
use crate::nylorun::host::health;
use crate::nylorun::host::join::{HostClient, HostKeeper, StateError, volume_id};
pub use crate::nylorun::host::settings::PodConfig;
use crate::nylorun::host::setup;
use crate::nylorun::host::workspace::{TenantCell, WorkspaceServer};
use crate::nylorun::link::channel::{
    self, Channel, ChannelConfig, ConnectError, Incoming, RemoteError,
};
use crate::nylorun::link::lease::{LeaseConfig, Leaser, RunHandler, Runs, StopReason};
use crate::nylorun::link::protocol::{
    Features, HARNESS_API_VERSION, HelloAnswer, HelloParams, methods,
};
use crate::nylorun::turn::run::TurnRunner;
use crate::tools::{Toolbox, ToolboxBuilder};

/// A connection that lasted this long resets the reconnect backoff (v2 notes §1.1).
const STABLE_CONNECTION: Duration = Duration::from_secs(10);
/// `hello` must be answered within this.
const HELLO_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the pod host could not start.
#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error(transparent)]
    State(#[from] StateError),
    #[error("PODHOST_WORKSPACE {path}: {source}")]
    Workspace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("NYLORUN_HARNESS_HEALTH_PORT {port}: could not listen on 127.0.0.1:{port}: {source}")]
    Health {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("PODHOST_METRICS_LISTEN {addr}: could not listen: {source}")]
    Metrics {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not build the HTTP client: {0}")]
    Http(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The workspace's sandbox could not be made (a cgroup the host refuses, a workspace that
    /// cannot be given to the command user): no turn may run without it.
    #[error("could not make the workspace's sandbox: {0}")]
    Sandbox(#[from] crate::exec::sandbox::SandboxError),
}

impl PodError {
    /// Whether a setting is at fault (the operator fixes the configuration, exit 2), rather
    /// than the machine or podhost.
    pub fn is_setting(&self) -> bool {
        matches!(self, PodError::Tls(_))
    }
}

/// What runs the granted runs.
pub enum Handler {
    /// The turn runner ([`TurnRunner`]) on the pod's workspace: what `podhost pod` runs.
    Turns,
    /// Another handler (tests that hold runs).
    Custom(Arc<dyn RunHandler>),
}

impl From<Arc<dyn RunHandler>> for Handler {
    fn from(h: Arc<dyn RunHandler>) -> Self {
        Handler::Custom(h)
    }
}

/// Runs the pod host until `shutdown` is cancelled. `supervisor` is the podhost binary each
/// command runs under.
/// Long: builds the host's parts in the order they depend on each other (TLS, toolbox, handler,
/// health, client), then runs it under the shutdown deadline.
pub async fn serve(
    config: PodConfig,
    supervisor: PathBuf,
    handler: impl Into<Handler>,
    shutdown: CancellationToken,
) -> Result<(), PodError> {
    // podhost must be a child subreaper so that orphans of its commands re-parent to it, not
    // to init. The binary does that for every front before it gets here (exec's reaper, called
    // from main); it is not done here because tests run this task inside the test process.

    // Before anything is logged or bound: a CA file that cannot be used is a setting's error.
    let tls = client_config(&config.tls)?;
    let volume = volume_id(&config.harness_root)?;
    // One egress handle: the commands' environment reads it, the join fills it in.
    let egress = Egress::new(config.egress_proxy.clone());
    let toolbox = pod_toolbox(&config, supervisor, &egress)?;
    let workspace = WorkspaceServer::new(
        toolbox.clone(),
        &config.sandbox_id,
        &config.harness_id,
        &config.harness_root,
    );
    // Turns share the workspace's toolbox, and so its command lock, with `workspace.*` serving.
    let handler: Arc<dyn RunHandler> = match handler.into() {
        Handler::Custom(h) => h,
        Handler::Turns => Arc::new(
            TurnRunner::new(
                toolbox.clone(),
                config.gates_url.clone(),
                config.skills.clone(),
                &tls,
                Backoff::new(config.backoff_base, config.backoff_cap),
            )
            .map_err(|e| PodError::Http(e.to_string()))?,
        ),
    };

    let tasks = TaskTracker::new();
    let connected = Arc::new(AtomicBool::new(false));
    if let Some(port) = config.health_port {
        let listener = health::bind(port)
            .await
            .map_err(|source| PodError::Health { port, source })?;
        tasks.spawn(health::serve(listener, connected.clone(), shutdown.clone()));
    }
    if let Some(addr) = &config.metrics_listen {
        let listener = health::bind_metrics(addr)
            .await
            .map_err(|source| PodError::Metrics {
                addr: addr.clone(),
                source,
            })?;
        let app = health::metrics_router();
        tasks.spawn(health::serve_router(
            listener,
            app,
            "metrics endpoint",
            shutdown.clone(),
        ));
    }

    let client = HostClient::new(
        &config.harness_http,
        &config.sandbox_id,
        &config.pod_uid,
        &config.join_file,
        Some(volume),
        &tls,
    )
    .map_err(|e| PodError::Http(e.to_string()))?;
    let keeper = Arc::new(HostKeeper::new(
        client,
        egress,
        &config.harness_root,
        (config.backoff_base, config.backoff_cap),
        config.join_retry,
    ));
    tracing::info!(
        sandbox = %config.sandbox_id,
        harness_id = %config.harness_id,
        url = %config.harness_ws,
        "podhost pod starting"
    );

    let host = Host {
        config,
        tls,
        keeper,
        workspace,
        handler,
        connected,
        shutdown: shutdown.clone(),
    };
    let deadline = host.config.shutdown_deadline;
    // Whatever hangs, the pod is gone within its deadline of a shutdown (v2 notes §6.2).
    tokio::select! {
        () = host.main_loop(&tasks) => {}
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(deadline).await;
        } => tracing::warn!(?deadline, "the shutdown deadline passed; stopping now"),
    }

    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(1), tasks.wait()).await;
    tracing::info!("podhost pod stopped");
    Ok(())
}

/// The toolbox of the pod's workspace: `/workspace` (read-write), `/tmp` (read-write) and
/// `/skills` (read-only) as the tools see them; commands get `HOME` = the workspace (v2 notes
/// §6.5) and the egress variables.
fn pod_toolbox(
    config: &PodConfig,
    supervisor: PathBuf,
    egress: &Egress,
) -> Result<Toolbox, PodError> {
    let werr = |source| PodError::Workspace {
        path: config.workspace.clone(),
        source,
    };
    std::fs::create_dir_all(&config.workspace).map_err(werr)?;
    // Skills are mounted here. It is not created: in a pod it is there (v5 §9), and a root that
    // does not exist at start is not one, so the file tools then see no `/skills`.
    let skills = config.skills.clone();
    let ws = Workspace::new(&config.workspace, Some(Path::new("/workspace")))
        .map_err(werr)?
        .with_root(Path::new("/tmp"), Some(Path::new("/tmp")), true)
        .with_root(&skills, Some(Path::new("/skills")), false);
    // The pod's state: contents hidden (their names say nothing, and `ls /` keeps working), the
    // CA bundle the trust variables name still readable. Egress goes through the proxy, so the
    // network filter does not apply in a pod.
    if config.exec.confine.deny_network {
        tracing::warn!("PODHOST_DENY_NETWORK is ignored in a pod: egress goes through its proxy");
    }
    let builder = ToolboxBuilder::new(&config.exec, supervisor)
        .one_command_at_a_time()
        .egress(egress.clone())
        .confine(|c| {
            c.hide_contents(&config.harness_root)
                .hide_contents(&config.join_file)
                .allow_read(&config.harness_root.join(crate::exec::egress::BUNDLE_FILE))
                .guard(crate::exec::confine::Guard::owned_dir(&config.harness_root))
                .deny_network(false)
        });
    Ok(builder.build(ws, None)?)
}

struct Host {
    config: PodConfig,
    /// The one TLS client configuration (join, the WebSocket, the gates).
    tls: Arc<rustls::ClientConfig>,
    keeper: Arc<HostKeeper>,
    workspace: WorkspaceServer,
    handler: Arc<dyn RunHandler>,
    connected: Arc<AtomicBool>,
    shutdown: CancellationToken,
}

/// How one connection ended.
enum Ended {
    Lost,
    Shutdown,
}

impl Host {
    async fn main_loop(&self, tasks: &TaskTracker) {
        let mut backoff = Backoff::new(self.config.backoff_base, self.config.backoff_cap);
        let mut setup_done = false;
        let mut renewing = false;
        let ch_cfg = ChannelConfig {
            silence_timeout: self.config.silence_timeout,
            ..ChannelConfig::default()
        };
        loop {
            let Some(token) = self.keeper.ensure(&self.shutdown).await else {
                return;
            };
            if !renewing {
                renewing = true;
                let keeper = self.keeper.clone();
                let interval = self.config.renew_interval;
                let cancel = self.shutdown.clone();
                tasks.spawn(async move { keeper.renew_loop(interval, cancel).await });
            }
            if !setup_done {
                setup_done = true;
                let first = self.keeper.take_first_join().unwrap_or_default();
                setup::apply_once(
                    &self.config.harness_root,
                    self.workspace.toolbox(),
                    first.setup,
                    first.seeded,
                    &self.shutdown,
                )
                .await;
                if self.shutdown.is_cancelled() {
                    return;
                }
            }
            let started = Instant::now();
            let connected = tokio::select! {
                c = channel::connect(&self.config.harness_ws, &token, &ch_cfg, &self.tls) => c,
                _ = self.shutdown.cancelled() => return,
            };
            match connected {
                Ok(ws) => {
                    tracing::info!("connected to the Harness API");
                    match self.serve(ws, &ch_cfg).await {
                        Ended::Shutdown => return,
                        Ended::Lost => {}
                    }
                    if started.elapsed() >= STABLE_CONNECTION {
                        backoff.reset();
                    }
                }
                Err(e) => {
                    if matches!(e, ConnectError::Refused { status: 401, .. }) {
                        self.keeper.forget();
                    }
                    tracing::warn!(error = %e, "could not open the Harness API connection");
                }
            }
            let delay = backoff.next_delay();
            tracing::info!(retry_in = ?delay, "reconnecting");
            crate::floor::metrics::pod_reconnect();
            if !sleep_or_cancel(delay, &self.shutdown).await {
                return;
            }
        }
    }

    /// One connection: `hello`, then lease until it is lost or podhost stops.
    async fn serve(&self, ws: channel::WsStream, ch_cfg: &ChannelConfig) -> Ended {
        let runs = Runs::default();
        let tenant: TenantCell = Arc::default();
        let incoming = Arc::new(PodIncoming {
            workspace: self.workspace.clone(),
            runs: runs.clone(),
            tenant: tenant.clone(),
        });
        let root = CancellationToken::new();
        let channel = Channel::start(ws, incoming, ch_cfg, &root);
        let ended = self.work(&channel, runs, &tenant).await;
        self.connected.store(false, Ordering::Relaxed);
        crate::floor::metrics::pod_connected(false);
        root.cancel();
        channel.wait(Duration::from_secs(2)).await;
        ended
    }

    /// Says hello to core; its answer, or how the connection ended when core's answer is not
    /// one podhost can use (the connection is closed then, saying why).
    async fn hello(&self, channel: &Channel) -> Result<HelloAnswer, Ended> {
        let hello = HelloParams {
            api: HARNESS_API_VERSION,
            name: self.config.harness_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            features: Features { workspace: true },
        };
        let answer = tokio::select! {
            a = tokio::time::timeout(HELLO_TIMEOUT, channel.request::<_, HelloAnswer>(methods::HELLO, &hello)) => a,
            _ = self.shutdown.cancelled() => {
                channel.close(1001, "podhost is stopping", Duration::from_secs(1)).await;
                return Err(Ended::Shutdown);
            }
        };
        match answer {
            Ok(Ok(a)) if a.api == HARNESS_API_VERSION && a.check().is_ok() => Ok(a),
            Ok(Ok(a)) if a.api == HARNESS_API_VERSION => {
                let why = a.check().err().map(|e| e.to_string()).unwrap_or_default();
                tracing::error!(%why, "core's hello answer is not one podhost can use");
                channel
                    .close(1002, "unusable hello answer", Duration::from_secs(1))
                    .await;
                Err(Ended::Lost)
            }
            Ok(Ok(a)) => {
                tracing::error!(api = a.api, "core answered hello with another API version");
                channel
                    .close(
                        1002,
                        "unsupported Harness API version",
                        Duration::from_secs(1),
                    )
                    .await;
                Err(Ended::Lost)
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, harness_id = %self.config.harness_id, "core refused hello");
                channel
                    .close(1000, "hello refused", Duration::from_secs(1))
                    .await;
                Err(Ended::Lost)
            }
            Err(_) => {
                tracing::error!(timeout = ?HELLO_TIMEOUT, "core did not answer hello");
                channel
                    .close(1000, "hello timed out", Duration::from_secs(1))
                    .await;
                Err(Ended::Lost)
            }
        }
    }

    async fn work(&self, channel: &Channel, runs: Runs, tenant: &TenantCell) -> Ended {
        let answer = match self.hello(channel).await {
            Ok(a) => a,
            Err(ended) => return ended,
        };
        let _ = tenant.set(answer.tenant_id.clone());
        tracing::info!(
            tenant_id = %answer.tenant_id,
            backend = ?answer.sandbox.backend,
            renew_every_ms = answer.renew_every_ms,
            "hello answered"
        );
        self.connected.store(true, Ordering::Relaxed);
        crate::floor::metrics::pod_connected(true);

        let deadline = self.config.shutdown_deadline;
        let leaser = Leaser::new(
            channel.clone(),
            runs,
            self.handler.clone(),
            Duration::from_millis(answer.renew_every_ms),
            LeaseConfig {
                concurrency: self.config.concurrency,
                stop_grace: (deadline / 2).min(Duration::from_secs(5)),
                pause: self.config.backoff_base,
                abort_wait: (deadline / 4).min(Duration::from_secs(1)),
                request_timeout: (deadline / 4).min(Duration::from_secs(30)),
            },
        );
        leaser.start();
        tokio::select! {
            _ = channel.closed() => {
                tracing::warn!(reason = ?channel.close_reason(), "lost the Harness API connection; its runs stop");
                leaser.stop(StopReason::ConnectionLost, Duration::from_secs(5)).await;
                Ended::Lost
            }
            _ = self.shutdown.cancelled() => {
                let until = Instant::now() + deadline;
                tracing::info!(?deadline, "stopping: aborting leases, releasing runs");
                let left = |margin: Duration| until.saturating_duration_since(Instant::now()).saturating_sub(margin);
                if !leaser.stop(StopReason::Shutdown, left(Duration::from_millis(1500))).await {
                    tracing::warn!("runs did not all end before the deadline");
                }
                channel.close(1001, "podhost is stopping", left(Duration::from_millis(500)).min(Duration::from_secs(1))).await;
                Ended::Shutdown
            }
        }
    }
}

/// What core's requests and messages reach on one connection.
struct PodIncoming {
    workspace: WorkspaceServer,
    runs: Runs,
    tenant: TenantCell,
}

impl Incoming for PodIncoming {
    fn request(
        &self,
        method: &str,
        params: Value,
        cancel: CancellationToken,
    ) -> Option<BoxFuture<'static, Result<Value, RemoteError>>> {
        self.workspace
            .request(method, params, cancel, self.tenant.clone())
    }

    fn message(&self, method: &str, params: Value) {
        match method {
            methods::CANCEL => self.runs.on_cancel(params),
            other => tracing::warn!(method = %other, "unknown message from core; dropped"),
        }
    }
}
