//! A fake Nylorun core on 127.0.0.1:0, as strict as the real one where podhost can tell.
//!
//! One listener serves what core's harness listener serves (v5 §1, §2, §8, §9; v2 notes §1.1,
//! §1.2, §6.3). Each part stands for one of core's components:
//!
//! * [`host`]: the pod host's HTTP side — `POST …/host/join`, `POST …/host/renew`, and the
//!   WebSocket upgrade with its refusal matrix.
//! * [`session`]: the Harness API session on one connection — frames checked both ways,
//!   `hello`, core's own requests and messages, and the router of podhost's requests.
//! * [`leases`]: the work — the grant queue, waiting leases, renewals, releases, and the run
//!   requests refused for a run the connection does not hold.
//! * The turn side (`effect.*`, `transcript.read`, outputs, run tokens) is
//!   [`crate::fake_journal`]; `artifact.*` and `definition.file` are [`crate::fake_artifacts`].
//!
//! Every part validates with its own strict schemas, written here from the spec independently of
//! podhost's types, and records into one event log (every frame both ways, every HTTP answer), so
//! tests assert whole sequences. This file holds the options, that log and the waits on it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

mod host;
mod leases;
mod session;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use host::Refusal;
use session::Conn;

const WAIT: Duration = Duration::from_secs(15);

/// The CA certificate core's host answers carry (`caCertificate`).
pub const CA_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nRkFLRS1DT1JFLUNB\n-----END CERTIFICATE-----\n";

/// What the fake core expects and answers.
#[derive(Clone, Debug)]
pub struct CoreOptions {
    pub tenant_id: String,
    pub sandbox_id: String,
    pub pod_uid: String,
    pub harness_id: String,
    pub join_token: String,
    pub renew_every_ms: u64,
    /// WebSocket pings to each connection at this interval.
    pub ping_every: Option<Duration>,
    /// Core's answers (hello, lease, renew, outputs) carry fields a later core might add.
    pub answer_extras: bool,
}

impl Default for CoreOptions {
    fn default() -> Self {
        CoreOptions {
            tenant_id: "tn_test".into(),
            sandbox_id: "sbx_test".into(),
            pod_uid: "pod-uid-1".into(),
            harness_id: "podhost".into(),
            join_token: "join-token-1".into(),
            renew_every_ms: 60_000,
            ping_every: None,
            answer_extras: false,
        }
    }
}

/// Everything that happened, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A join request and the status it got.
    Join {
        body: Value,
        status: u16,
    },
    Renew {
        bearer: Option<String>,
        status: u16,
    },
    /// An upgrade attempt and its answer (101 when accepted).
    Upgrade {
        path: String,
        status: u16,
    },
    Connected {
        conn: u64,
    },
    /// A frame podhost sent (text parsed as JSON; anything else as `{"raw": …}`).
    FromPod {
        conn: u64,
        frame: Value,
    },
    /// A frame the fake sent.
    ToPod {
        conn: u64,
        frame: Value,
    },
    Pong {
        conn: u64,
    },
    Closed {
        conn: u64,
        code: Option<u16>,
        reason: String,
    },
}

/// A request's answer: `None` when none is sent (a lease that waits, an answer scripted lost),
/// else the result or the error's `(code, message)`.
pub type Answer = Option<Result<Value, (String, String)>>;

/// The `invalid` refusal of a request `m` whose params are wrong.
fn invalid(m: &str, why: impl std::fmt::Display) -> (String, String) {
    ("invalid".to_owned(), format!("Invalid {m} request: {why}"))
}

pub struct CoreState {
    opts: CoreOptions,
    // ---- host (join, renew, upgrade) ----
    join_token: Mutex<String>,
    join_script: Mutex<VecDeque<Refusal>>,
    renew_script: Mutex<VecDeque<Refusal>>,
    upgrade_script: Mutex<VecDeque<u16>>,
    host_tokens: Mutex<HashSet<String>>,
    volume_id: Mutex<Option<String>>,
    epoch: AtomicI64,
    egress_n: AtomicU64,
    setup: Mutex<Option<Value>>,
    /// Upgrades answered 503 while set (a closed Tenant).
    closed_tenant: AtomicBool,
    // ---- session (connections, frames) ----
    hello_refusals: Mutex<VecDeque<(String, String)>>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_conn: AtomicU64,
    silent: Mutex<HashSet<u64>>,
    /// Called with each request's method and params before it is answered.
    request_hook: Mutex<Option<RequestHook>>,
    /// Requests of these methods wait, unanswered and unsettled, until the test lets them go
    /// (a core slow to settle); `(conn, id, method, params)` of each waiting one.
    slow: Mutex<(HashSet<String>, Vec<session::SlowRequest>)>,
    /// Scripted refusals by method: `(code, message)` for the next requests of that method.
    refusals: Mutex<HashMap<String, VecDeque<(String, String)>>>,
    // ---- leases ----
    grants: Mutex<VecDeque<Value>>,
    waiting: Mutex<VecDeque<(u64, u64)>>,
    held: Mutex<HashMap<String, u64>>,
    renew_replies: Mutex<HashMap<String, VecDeque<Value>>>,
    // ---- the record of it all ----
    events: Mutex<Vec<Event>>,
    changed: watch::Sender<usize>,
    /// The turn side: effects, transcripts, outputs, run tokens (`fake_journal`).
    pub journal: Arc<crate::fake_journal::Journal>,
    /// `artifact.read`, `artifact.write`, `definition.file`.
    pub artifacts: crate::fake_artifacts::FakeArtifacts,
}

/// What [`FakeCore::on_request`] runs.
pub type RequestHook = Arc<dyn Fn(&str, &Value) + Send + Sync>;

/// The fake core; dropped, it stops listening and closes its connections.
pub struct FakeCore {
    pub addr: SocketAddr,
    pub state: Arc<CoreState>,
    stop: CancellationToken,
}

impl Drop for FakeCore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl FakeCore {
    pub async fn start(opts: CoreOptions) -> FakeCore {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(CoreState {
            join_token: Mutex::new(opts.join_token.clone()),
            opts,
            join_script: Mutex::default(),
            renew_script: Mutex::default(),
            upgrade_script: Mutex::default(),
            host_tokens: Mutex::default(),
            volume_id: Mutex::default(),
            epoch: AtomicI64::new(0),
            egress_n: AtomicU64::new(0),
            setup: Mutex::default(),
            closed_tenant: AtomicBool::new(false),
            hello_refusals: Mutex::default(),
            conns: Mutex::default(),
            next_conn: AtomicU64::new(1),
            silent: Mutex::default(),
            request_hook: Mutex::default(),
            slow: Mutex::default(),
            refusals: Mutex::default(),
            grants: Mutex::default(),
            waiting: Mutex::default(),
            held: Mutex::default(),
            renew_replies: Mutex::default(),
            events: Mutex::default(),
            changed: watch::Sender::new(0),
            journal: Arc::default(),
            artifacts: crate::fake_artifacts::FakeArtifacts::default(),
        });
        let stop = CancellationToken::new();
        let (s, st) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = st.cancelled() => break,
                };
                let Ok((stream, _)) = accepted else { continue };
                let (s, st) = (s.clone(), st.clone());
                tokio::spawn(async move { s.http(stream, st).await });
            }
            for c in s.conns.lock().unwrap().values() {
                c.close.cancel();
            }
        });
        FakeCore { addr, state, stop }
    }

    /// `http://127.0.0.1:<port>`: what `NYLORUN_HARNESS_URL` says.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn opts(&self) -> &CoreOptions {
        &self.state.opts
    }

    /// The artifact store.
    pub fn artifacts(&self) -> &crate::fake_artifacts::FakeArtifacts {
        &self.state.artifacts
    }

    pub fn events(&self) -> Vec<Event> {
        self.state.events.lock().unwrap().clone()
    }

    /// The number of events so far: a mark to wait from.
    pub fn mark(&self) -> usize {
        self.state.events.lock().unwrap().len()
    }

    /// Waits for the first event from `from` on that `pred` picks; returns its index and it.
    pub async fn wait_from<T>(
        &self,
        from: usize,
        what: &str,
        pred: impl Fn(&Event) -> Option<T>,
    ) -> (usize, T) {
        let mut rx = self.state.changed.subscribe();
        let found = tokio::time::timeout(WAIT, async {
            loop {
                {
                    let events = self.state.events.lock().unwrap();
                    for (i, e) in events.iter().enumerate().skip(from) {
                        if let Some(t) = pred(e) {
                            return (i, t);
                        }
                    }
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        match found {
            Ok(f) => f,
            Err(_) => panic!(
                "timed out waiting for {what}; events:\n{:#?}",
                self.events()
            ),
        }
    }

    pub async fn wait<T>(&self, what: &str, pred: impl Fn(&Event) -> Option<T>) -> T {
        self.wait_from(0, what, pred).await.1
    }

    /// The next connection from `from`.
    pub async fn wait_connected(&self, from: usize) -> u64 {
        self.wait_from(from, "a connection", |e| match e {
            Event::Connected { conn } => Some(*conn),
            _ => None,
        })
        .await
        .1
    }

    /// The next request podhost sends with method `m` (from `from`): (index, conn, frame).
    pub async fn wait_request(&self, from: usize, m: &str) -> (usize, u64, Value) {
        let (i, (conn, f)) = self
            .wait_from(from, &format!("a {m} request"), |e| match e {
                Event::FromPod { conn, frame } if frame["t"] == "req" && frame["m"] == m => {
                    Some((*conn, frame.clone()))
                }
                _ => None,
            })
            .await;
        (i, conn, f)
    }

    /// Frames podhost sent on `conn`, in order.
    pub fn frames_from_pod(&self, conn: u64) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::FromPod { conn: c, frame } if c == conn => Some(frame),
                _ => None,
            })
            .collect()
    }
}

impl CoreState {
    fn record(&self, e: Event) {
        let n = {
            let mut events = self.events.lock().unwrap();
            events.push(e);
            events.len()
        };
        self.changed.send_replace(n);
    }
}
