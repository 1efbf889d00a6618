//! A fake Nylorun core on 127.0.0.1:0, as strict as the real one where podhost can tell.
//!
//! One listener serves what core's harness listener serves (v5 §1, §9; v2 notes §1.1, §6.3):
//! `POST …/host/join` and `POST …/host/renew` with their answers and refusals, and the
//! WebSocket upgrade with its refusal matrix (wrong path 404, missing or unknown bearer 401 with
//! `WWW-Authenticate: Bearer`, missing version header 426). On a connection it validates every
//! frame and every request's params with its own strict schemas (written here from the spec,
//! independently of podhost's types), answers `hello`, grants leases from a queue the test
//! fills, answers renewals as the test scripts them, refuses run requests naming a run the
//! connection does not hold (`run_not_held`), sends `cancel` messages and core→harness requests
//! on demand, and records every frame both ways so tests assert whole sequences.
//!
//! Built to grow: the turn work adds its methods (`effect.intent`, `effect.outcome`,
//! `transcript.read`, outputs, `artifact.*`) in [`CoreState::answer`], and the gates as more
//! routes in [`CoreState::http`]. `artifact.read`, `artifact.write` and `definition.file` are
//! served by [`fake_artifacts`].
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

#[path = "fake_artifacts.rs"]
pub mod fake_artifacts;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_util::sync::CancellationToken;

pub const HARNESS_PATH: &str = "/nylorun/harness/v1";
pub const JOIN_PATH: &str = "/nylorun/harness/v1/host/join";
pub const RENEW_PATH: &str = "/nylorun/harness/v1/host/renew";
pub const CA_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nRkFLRS1DT1JFLUNB\n-----END CERTIFICATE-----\n";
const WAIT: Duration = Duration::from_secs(15);

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

/// A refusal the test scripts for the next join or renew.
#[derive(Clone, Copy, Debug)]
pub enum Refusal {
    Unauthorized,
    Unavailable,
    Invalid,
}

struct Conn {
    out: mpsc::UnboundedSender<Message>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Value>>>,
    close: CancellationToken,
}

pub struct CoreState {
    opts: CoreOptions,
    join_token: Mutex<String>,
    join_script: Mutex<VecDeque<Refusal>>,
    renew_script: Mutex<VecDeque<Refusal>>,
    upgrade_script: Mutex<VecDeque<u16>>,
    hello_refusals: Mutex<VecDeque<(String, String)>>,
    host_tokens: Mutex<HashSet<String>>,
    volume_id: Mutex<Option<String>>,
    epoch: AtomicI64,
    egress_n: AtomicU64,
    setup: Mutex<Option<Value>>,
    events: Mutex<Vec<Event>>,
    changed: watch::Sender<usize>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    next_conn: AtomicU64,
    grants: Mutex<VecDeque<Value>>,
    waiting: Mutex<VecDeque<(u64, u64)>>,
    held: Mutex<HashMap<String, u64>>,
    renew_replies: Mutex<HashMap<String, VecDeque<Value>>>,
    silent: Mutex<HashSet<u64>>,
    /// Upgrades answered 503 while set (a closed Tenant).
    closed_tenant: std::sync::atomic::AtomicBool,
    /// The turn side: effects, transcripts, outputs, run tokens (`fake_journal`).
    pub journal: Arc<crate::fake_journal::Journal>,
    /// `artifact.read`, `artifact.write`, `definition.file`.
    pub artifacts: fake_artifacts::FakeArtifacts,
    /// Called with each request's method and params before it is answered.
    request_hook: Mutex<Option<RequestHook>>,
    /// Requests of these methods wait, unanswered and unsettled, until the test lets them go
    /// (a core slow to settle); `(conn, id, method, params)` of each waiting one.
    slow: Mutex<(HashSet<String>, Vec<SlowRequest>)>,
    /// Scripted refusals by method: `(code, message)` for the next requests of that method.
    refusals: Mutex<HashMap<String, VecDeque<(String, String)>>>,
}

/// A request held by [`FakeCore::slow_answers`]: `(conn, id, method, params)`.
type SlowRequest = (u64, u64, String, Value);

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
            hello_refusals: Mutex::default(),
            host_tokens: Mutex::default(),
            volume_id: Mutex::default(),
            epoch: AtomicI64::new(0),
            egress_n: AtomicU64::new(0),
            setup: Mutex::default(),
            events: Mutex::default(),
            changed: watch::Sender::new(0),
            conns: Mutex::default(),
            next_conn: AtomicU64::new(1),
            grants: Mutex::default(),
            waiting: Mutex::default(),
            held: Mutex::default(),
            renew_replies: Mutex::default(),
            silent: Mutex::default(),
            closed_tenant: std::sync::atomic::AtomicBool::new(false),
            journal: Arc::default(),
            artifacts: fake_artifacts::FakeArtifacts::default(),
            request_hook: Mutex::default(),
            slow: Mutex::default(),
            refusals: Mutex::default(),
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
    pub fn artifacts(&self) -> &fake_artifacts::FakeArtifacts {
        &self.state.artifacts
    }

    /// A reset: the join file must now hold `token`.
    pub fn set_join_token(&self, token: &str) {
        *self.state.join_token.lock().unwrap() = token.to_owned();
    }

    pub fn refuse_joins(&self, refusals: &[Refusal]) {
        self.state.join_script.lock().unwrap().extend(refusals);
    }

    pub fn refuse_renewals(&self, refusals: &[Refusal]) {
        self.state.renew_script.lock().unwrap().extend(refusals);
    }

    /// The next upgrades get these statuses (401 with `WWW-Authenticate: Bearer`).
    pub fn refuse_upgrades(&self, statuses: &[u16]) {
        self.state.upgrade_script.lock().unwrap().extend(statuses);
    }

    /// While set, every upgrade is answered 503 (the Tenant is closed).
    pub fn set_tenant_closed(&self, closed: bool) {
        self.state.closed_tenant.store(closed, Ordering::SeqCst);
    }

    /// The next hello is answered with this error.
    pub fn refuse_hello(&self, code: &str, message: &str) {
        self.state
            .hello_refusals
            .lock()
            .unwrap()
            .push_back((code.into(), message.into()));
    }

    /// The next successful join carries this (`setup` and/or `seeded`).
    pub fn set_join_extras(&self, extras: Value) {
        *self.state.setup.lock().unwrap() = Some(extras);
    }

    /// Core stops answering and pinging on `conn` (the connection stays open).
    pub fn set_silent(&self, conn: u64) {
        self.state.silent.lock().unwrap().insert(conn);
    }

    /// Runs `hook` on every request podhost sends, before core answers it: podhost is still
    /// waiting for the answer while it runs (e.g. to look at the pod as a release arrives).
    pub fn on_request(&self, hook: impl Fn(&str, &Value) + Send + Sync + 'static) {
        *self.state.request_hook.lock().unwrap() = Some(Arc::new(hook));
    }

    /// Requests of method `m` are held unanswered (and unsettled) until [`answer_slow`]
    /// (Self::answer_slow): a core slow to settle. Renewals meanwhile are answered as usual.
    pub fn slow_answers(&self, m: &str) {
        self.state.slow.lock().unwrap().0.insert(m.to_owned());
    }

    /// The requests held by [`slow_answers`](Self::slow_answers) so far: `(method, params)`.
    pub fn slow_pending(&self) -> Vec<(String, Value)> {
        let slow = self.state.slow.lock().unwrap();
        slow.1
            .iter()
            .map(|(_, _, m, p)| (m.clone(), p.clone()))
            .collect()
    }

    /// Answers every held request now (answers nothing to a connection that is gone), and stops
    /// holding new ones.
    pub fn answer_slow(&self) {
        let held = {
            let mut slow = self.state.slow.lock().unwrap();
            slow.0.clear();
            std::mem::take(&mut slow.1)
        };
        for (conn, rid, m, p) in held {
            let c = self.state.conns.lock().unwrap().get(&conn).cloned();
            if let (Some(c), Some(answer)) = (c, self.state.answer(conn, rid, &m, p)) {
                self.state.send_answer(&c, conn, rid, answer);
            }
        }
    }

    /// The next request of method `m` is refused with `code`. For `run_not_held` and
    /// `ownership_lost` core also stops holding the run the request names (another owner has
    /// it now): its later requests are `run_not_held`.
    pub fn refuse_next(&self, m: &str, code: &str, message: &str) {
        self.state
            .refusals
            .lock()
            .unwrap()
            .entry(m.to_owned())
            .or_default()
            .push_back((code.to_owned(), message.to_owned()));
    }

    /// Queues a grant for the next `lease`; returns the `RunGrant` sent.
    pub fn grant(&self, run_id: &str, token: &str) -> Value {
        let run = json!({
            "runId": run_id,
            "sessionId": format!("ses_{run_id}"),
            "turnId": format!("turn_{run_id}"),
            "epoch": 1,
            "token": token,
            "tokenExpiresAt": "2030-01-01T00:00:00.000Z",
        });
        self.grant_value(
            json!({"run": run.clone(), "input": {"type": "turn.start", "engine": "agent"}}),
        );
        run
    }

    /// Queues a raw lease answer.
    pub fn grant_value(&self, answer: Value) {
        self.state.grants.lock().unwrap().push_back(answer);
        self.state.serve_waiting();
    }

    /// The next renewal of `run_id` answers `reply`.
    pub fn renew_reply(&self, run_id: &str, reply: Value) {
        self.state
            .renew_replies
            .lock()
            .unwrap()
            .entry(run_id.to_owned())
            .or_default()
            .push_back(reply);
    }

    fn conn(&self, conn: u64) -> Arc<Conn> {
        self.state
            .conns
            .lock()
            .unwrap()
            .get(&conn)
            .cloned()
            .expect("no such connection")
    }

    /// Sends a one-way message.
    pub fn send_msg(&self, conn: u64, m: &str, p: Value) {
        self.state
            .send(&self.conn(conn), conn, json!({"t": "msg", "m": m, "p": p}));
    }

    /// Sends a text frame as is.
    pub fn send_text(&self, conn: u64, text: &str) {
        let c = self.conn(conn);
        let frame = serde_json::from_str(text).unwrap_or_else(|_| json!({"raw": text}));
        self.state.record(Event::ToPod { conn, frame });
        let _ = c.out.send(Message::text(text.to_owned()));
    }

    pub fn send_binary(&self, conn: u64, bytes: &[u8]) {
        let c = self.conn(conn);
        let _ = c.out.send(Message::binary(bytes.to_vec()));
    }

    /// Sends core's request `m` and waits for podhost's answer frame.
    pub async fn request(&self, conn: u64, m: &str, p: Value) -> Value {
        let (id, rx) = self.start_request(conn, m, p);
        let _ = id;
        tokio::time::timeout(WAIT, rx)
            .await
            .unwrap_or_else(|_| panic!("no answer to {m}"))
            .unwrap()
    }

    /// Sends core's request `m`; returns its id and the answer to come.
    pub fn start_request(&self, conn: u64, m: &str, p: Value) -> (u64, oneshot::Receiver<Value>) {
        let c = self.conn(conn);
        let id = c.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        c.pending.lock().unwrap().insert(id, tx);
        self.state
            .send(&c, conn, json!({"t": "req", "id": id, "m": m, "p": p}));
        (id, rx)
    }

    /// Sends `abort` for core's own request `id`.
    pub fn abort(&self, conn: u64, id: u64) {
        self.state
            .send(&self.conn(conn), conn, json!({"t": "abort", "id": id}));
    }

    pub fn close_conn(&self, conn: u64) {
        self.conn(conn).close.cancel();
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

    /// What podhost sent about `run_id` on `conn`, in order, renewals left out:
    /// `(method, params)`.
    pub fn run_frames(&self, conn: u64, run_id: &str) -> Vec<(String, Value)> {
        self.frames_from_pod(conn)
            .into_iter()
            .filter(|f| f["t"] == "req" && f["p"]["runId"] == run_id && f["m"] != "lease.renew")
            .map(|f| (f["m"].as_str().unwrap().to_owned(), f["p"].clone()))
            .collect()
    }

    /// The methods of [`run_frames`](Self::run_frames), in order.
    pub fn run_methods(&self, conn: u64, run_id: &str) -> Vec<String> {
        self.run_frames(conn, run_id)
            .into_iter()
            .map(|(m, _)| m)
            .collect()
    }

    /// Waits for the run's end (an output or a release) and for core's answer to it:
    /// `(the end's frame, core's answer)`.
    pub async fn wait_run_end(&self, run_id: &str) -> (Value, Value) {
        const ENDS: [&str; 6] = [
            "turn.completed",
            "turn.failed",
            "turn.waiting",
            "turn.paused",
            "checkpoint",
            "lease.release",
        ];
        let (_, (conn, frame)) = self
            .wait_from(0, &format!("the end of {run_id}"), |e| match e {
                Event::FromPod { conn, frame }
                    if frame["t"] == "req"
                        && frame["p"]["runId"] == run_id
                        && ENDS.contains(&frame["m"].as_str().unwrap_or("")) =>
                {
                    Some((*conn, frame.clone()))
                }
                _ => None,
            })
            .await;
        let id = frame["id"].clone();
        let (_, answer) = self
            .wait_from(0, "core's answer to the end", |e| match e {
                Event::ToPod { conn: c, frame: f }
                    if *c == conn && f["t"] == "res" && f["id"] == id =>
                {
                    Some(f.clone())
                }
                _ => None,
            })
            .await;
        (frame, answer)
    }

    /// Runs held on any connection.
    pub fn held(&self) -> Vec<String> {
        let mut v: Vec<_> = self.state.held.lock().unwrap().keys().cloned().collect();
        v.sort();
        v
    }
}

/// One HTTP request head.
struct Head {
    method: String,
    path: String,
    headers: HashMap<String, String>,
}

async fn read_head(stream: &mut TcpStream) -> Option<Head> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if buf.len() > 64 * 1024 || stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&buf);
    let mut lines = text.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Some(Head {
        method,
        path,
        headers,
    })
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    extra: &[(&str, &str)],
    body: Option<&Value>,
) {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        426 => "Upgrade Required",
        503 => "Service Unavailable",
        _ => "Status",
    };
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-length: {}\r\nconnection: close\r\ncache-control: no-store\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("content-type: application/json\r\n");
    }
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JoinBody {
    sandbox_id: String,
    pod_uid: String,
    join_token: String,
    volume_id: Option<String>,
}

fn refusal_body(r: Refusal) -> (u16, Value) {
    match r {
        Refusal::Unauthorized => (
            401,
            json!({"error": {"code": "unauthorized", "message": "The join was refused"}}),
        ),
        Refusal::Unavailable => (
            503,
            json!({"error": {"code": "unavailable", "message": "Try again"}}),
        ),
        Refusal::Invalid => (
            400,
            json!({"error": {"code": "invalid", "message": "Malformed request"}}),
        ),
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

    fn send(&self, c: &Conn, conn: u64, frame: Value) {
        self.record(Event::ToPod {
            conn,
            frame: frame.clone(),
        });
        let _ = c.out.send(Message::text(frame.to_string()));
    }

    async fn http(self: Arc<Self>, mut stream: TcpStream, stop: CancellationToken) {
        let Some(head) = read_head(&mut stream).await else {
            return;
        };
        let is_host_path = head.path == JOIN_PATH || head.path == RENEW_PATH;
        if is_host_path && head.method != "POST" {
            return respond(&mut stream, 405, &[], None).await;
        }
        if head.path == JOIN_PATH {
            let len: usize = head
                .headers
                .get("content-length")
                .and_then(|l| l.parse().ok())
                .unwrap_or(0);
            if len > 8 * 1024 {
                let (s, b) = refusal_body(Refusal::Invalid);
                return respond(&mut stream, s, &[], Some(&b)).await;
            }
            let mut body = vec![0u8; len];
            if stream.read_exact(&mut body).await.is_err() {
                return;
            }
            let (status, answer) = self.join(&body);
            let body_json = serde_json::from_slice(&body)
                .unwrap_or_else(|_| json!({"raw": String::from_utf8_lossy(&body)}));
            self.record(Event::Join {
                body: body_json,
                status,
            });
            let extra: &[(&str, &str)] = if status == 401 {
                &[("www-authenticate", "Bearer")]
            } else {
                &[]
            };
            return respond(&mut stream, status, extra, Some(&answer)).await;
        }
        if head.path == RENEW_PATH {
            let bearer = head
                .headers
                .get("authorization")
                .and_then(|a| a.strip_prefix("Bearer "))
                .map(str::to_owned);
            let (status, answer) = self.renew(bearer.as_deref());
            self.record(Event::Renew { bearer, status });
            let extra: &[(&str, &str)] = if status == 401 {
                &[("www-authenticate", "Bearer")]
            } else {
                &[]
            };
            return respond(&mut stream, status, extra, Some(&answer)).await;
        }
        let is_upgrade = head
            .headers
            .get("upgrade")
            .is_some_and(|u| u.eq_ignore_ascii_case("websocket"));
        let scripted = self.upgrade_script.lock().unwrap().pop_front();
        let bearer_ok = head
            .headers
            .get("authorization")
            .and_then(|a| a.strip_prefix("Bearer "))
            .is_some_and(|t| self.host_tokens.lock().unwrap().contains(t));
        let status = if let Some(s) = scripted {
            s
        } else if self.closed_tenant.load(Ordering::SeqCst) {
            503
        } else if head.path != HARNESS_PATH {
            404
        } else if !bearer_ok {
            401
        } else if head.headers.get("nylorun-harness-api").map(String::as_str) != Some("1")
            || !is_upgrade
        {
            426
        } else {
            101
        };
        self.record(Event::Upgrade {
            path: head.path.clone(),
            status,
        });
        match status {
            101 => {}
            401 => return respond(&mut stream, 401, &[("www-authenticate", "Bearer")], None).await,
            426 => return respond(&mut stream, 426, &[("nylorun-harness-api", "1")], None).await,
            s => return respond(&mut stream, s, &[], None).await,
        }
        let key = head
            .headers
            .get("sec-websocket-key")
            .cloned()
            .unwrap_or_default();
        let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
        let resp = format!(
            "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n\r\n"
        );
        if stream.write_all(resp.as_bytes()).await.is_err() {
            return;
        }
        let config = WebSocketConfig::default()
            .max_message_size(Some(64 << 20))
            .max_frame_size(Some(64 << 20));
        let ws = WebSocketStream::from_raw_socket(stream, Role::Server, Some(config)).await;
        self.connection(ws, stop).await;
    }

    fn join(&self, body: &[u8]) -> (u16, Value) {
        let parsed: JoinBody = match serde_json::from_slice(body) {
            Ok(b) => b,
            Err(e) => {
                return (
                    400,
                    json!({"error": {"code": "invalid", "message": e.to_string()}}),
                );
            }
        };
        if let Some(r) = self.join_script.lock().unwrap().pop_front() {
            return refusal_body(r);
        }
        let unauthorized = || refusal_body(Refusal::Unauthorized);
        if parsed.join_token != *self.join_token.lock().unwrap()
            || parsed.sandbox_id != self.opts.sandbox_id
            || parsed.pod_uid != self.opts.pod_uid
        {
            return unauthorized();
        }
        {
            let mut vol = self.volume_id.lock().unwrap();
            match (&*vol, &parsed.volume_id) {
                (Some(known), Some(sent)) if known != sent => return unauthorized(),
                (None, Some(sent)) => *vol = Some(sent.clone()),
                _ => {}
            }
        }
        let epoch = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        let host = format!("host-token-epoch-{epoch}");
        {
            // A join bumps the epoch: older host tokens and connections end.
            let mut tokens = self.host_tokens.lock().unwrap();
            tokens.clear();
            tokens.insert(host.clone());
        }
        for c in self.conns.lock().unwrap().values() {
            c.close.cancel();
        }
        let mut answer = self.host_answer(&host, epoch);
        if let Some(Value::Object(extras)) = self.setup.lock().unwrap().take() {
            for (k, v) in extras {
                answer[k] = v;
            }
        }
        (200, answer)
    }

    fn host_answer(&self, host: &str, epoch: i64) -> Value {
        let n = self.egress_n.fetch_add(1, Ordering::SeqCst) + 1;
        json!({
            "hostToken": host,
            "egressToken": format!("egress-token-{n}"),
            "sandboxId": self.opts.sandbox_id,
            "epoch": epoch,
            "expiresAt": "2030-01-01T00:15:00.000Z",
            "caCertificate": CA_PEM,
        })
    }

    fn renew(&self, bearer: Option<&str>) -> (u16, Value) {
        let Some(token) = bearer.filter(|t| self.host_tokens.lock().unwrap().contains(*t)) else {
            return refusal_body(Refusal::Unauthorized);
        };
        if let Some(r) = self.renew_script.lock().unwrap().pop_front() {
            return refusal_body(r);
        }
        (
            200,
            self.host_answer(token, self.epoch.load(Ordering::SeqCst)),
        )
    }

    async fn connection(self: Arc<Self>, ws: WebSocketStream<TcpStream>, stop: CancellationToken) {
        let id = self.next_conn.fetch_add(1, Ordering::SeqCst);
        let (out, mut rx) = mpsc::unbounded_channel();
        let conn = Arc::new(Conn {
            out,
            next_id: AtomicU64::new(1),
            pending: Mutex::default(),
            close: stop.child_token(),
        });
        self.conns.lock().unwrap().insert(id, conn.clone());
        self.record(Event::Connected { conn: id });
        let (mut sink, mut stream) = ws.split();
        let close = conn.close.clone();
        let pings = self.opts.ping_every;
        let me = self.clone();
        let writer = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(pings.unwrap_or(Duration::from_secs(3600)));
            ticker.tick().await;
            loop {
                tokio::select! {
                    m = rx.recv() => match m {
                        Some(m) => {
                            let is_close = matches!(m, Message::Close(_));
                            if sink.send(m).await.is_err() || is_close { break }
                        }
                        None => break,
                    },
                    _ = ticker.tick(), if pings.is_some() => {
                        if !me.silent.lock().unwrap().contains(&id) && sink.send(Message::Ping(Vec::new().into())).await.is_err() {
                            break;
                        }
                    }
                    _ = close.cancelled() => {
                        let _ = sink.send(Message::Close(Some(CloseFrame { code: CloseCode::Away, reason: "core closed it".into() }))).await;
                        break;
                    }
                }
            }
        });
        let (code, reason) = loop {
            let msg = tokio::select! {
                m = stream.next() => m,
                _ = conn.close.cancelled() => break (None, "closed by core".to_owned()),
            };
            match msg {
                None => break (None, "eof".to_owned()),
                Some(Err(e)) => break (None, e.to_string()),
                Some(Ok(Message::Text(t))) => {
                    let frame: Value = match serde_json::from_str(t.as_str()) {
                        Ok(v) => v,
                        Err(_) => {
                            self.record(Event::FromPod {
                                conn: id,
                                frame: json!({"raw": t.as_str()}),
                            });
                            let _ = conn.out.send(Message::Close(Some(CloseFrame {
                                code: CloseCode::Invalid,
                                reason: "Harness API frames are JSON text".into(),
                            })));
                            break (Some(1007), "non-JSON text".to_owned());
                        }
                    };
                    self.record(Event::FromPod {
                        conn: id,
                        frame: frame.clone(),
                    });
                    if !self.silent.lock().unwrap().contains(&id) {
                        self.on_frame(&conn, id, frame);
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    self.record(Event::FromPod {
                        conn: id,
                        frame: json!({"raw": "binary"}),
                    });
                    let _ = conn.out.send(Message::Close(Some(CloseFrame {
                        code: CloseCode::Invalid,
                        reason: "Harness API frames are JSON text".into(),
                    })));
                    break (Some(1007), "binary".to_owned());
                }
                Some(Ok(Message::Pong(_))) => self.record(Event::Pong { conn: id }),
                Some(Ok(Message::Close(f))) => {
                    break (
                        f.as_ref().map(|f| u16::from(f.code)),
                        f.map(|f| f.reason.to_string()).unwrap_or_default(),
                    );
                }
                Some(Ok(_)) => {}
            }
        };
        conn.close.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
        self.conns.lock().unwrap().remove(&id);
        self.waiting.lock().unwrap().retain(|(c, _)| *c != id);
        let ended: Vec<String> = self
            .held
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, c)| **c == id)
            .map(|(r, _)| r.clone())
            .collect();
        for run in ended {
            self.artifacts.on_run_end(&run);
        }
        self.held.lock().unwrap().retain(|_, c| *c != id);
        self.record(Event::Closed {
            conn: id,
            code,
            reason,
        });
    }

    fn on_frame(&self, conn: &Arc<Conn>, id: u64, frame: Value) {
        let t = frame.get("t").and_then(Value::as_str).unwrap_or("");
        let keys: HashSet<&str> = frame
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let req_id = frame.get("id").and_then(Value::as_u64).filter(|i| *i > 0);
        let allowed: &[&str] = match t {
            "req" => &["t", "id", "m", "p"],
            "res" => &["t", "id", "ok", "r", "e"],
            "msg" => &["t", "m", "p"],
            "abort" => &["t", "id"],
            "ping" => &["t"],
            _ => &[],
        };
        let strict_ok = !allowed.is_empty() && keys.iter().all(|k| allowed.contains(k));
        match (t, strict_ok, req_id) {
            ("req", true, Some(rid)) => {
                let m = frame.get("m").and_then(Value::as_str).unwrap_or("").to_owned();
                let p = frame.get("p").cloned().unwrap_or(Value::Null);
                let hook = self.request_hook.lock().unwrap().clone();
                if let Some(hook) = hook {
                    hook(&m, &p);
                }
                let refusal = self
                    .refusals
                    .lock()
                    .unwrap()
                    .get_mut(&m)
                    .and_then(VecDeque::pop_front);
                if let Some((code, message)) = refusal {
                    if let Some(run_id) = p["runId"].as_str()
                        && ["run_not_held", "ownership_lost"].contains(&code.as_str())
                    {
                        self.held.lock().unwrap().remove(run_id);
                        self.journal.run_over(run_id);
                        self.artifacts.on_run_end(run_id);
                    }
                    self.send_answer(conn, id, rid, Err((code, message)));
                    return;
                }
                {
                    let mut slow = self.slow.lock().unwrap();
                    if slow.0.contains(&m) {
                        slow.1.push((id, rid, m, p));
                        return;
                    }
                }
                if let Some(mut answer) = self.answer(id, rid, &m, p) {
                    if self.opts.answer_extras
                        && let Ok(Value::Object(o)) = &mut answer
                    {
                        o.insert("laterField".to_owned(), json!({"added": "by a later core"}));
                        if let Some(Value::Object(sandbox)) = o.get_mut("sandbox") {
                            sandbox.insert("region".to_owned(), json!("eu"));
                        }
                    }
                    self.send_answer(conn, id, rid, answer);
                }
            }
            ("req", false, Some(rid)) => self.send(
                conn,
                id,
                json!({"t": "res", "id": rid, "ok": false, "e": {"code": "invalid", "message": "Invalid frame"}}),
            ),
            ("res", true, Some(rid)) => {
                if let Some(tx) = conn.pending.lock().unwrap().remove(&rid) {
                    let _ = tx.send(frame);
                }
            }
            ("abort", true, Some(rid)) => {
                // A waiting lease the harness gave up on: drop it, answer nothing.
                self.waiting.lock().unwrap().retain(|(c, l)| !(*c == id && *l == rid));
            }
            ("ping", true, _) | ("msg", true, _) => {}
            _ => {
                let _ = conn.out.send(Message::Close(Some(CloseFrame {
                    code: CloseCode::Protocol,
                    reason: "invalid frame".into(),
                })));
            }
        }
    }

    fn send_answer(&self, conn: &Conn, id: u64, rid: u64, answer: Result<Value, (String, String)>) {
        match answer {
            Ok(r) => self.send(conn, id, json!({"t": "res", "id": rid, "ok": true, "r": r})),
            Err((code, message)) => self.send(
                conn,
                id,
                json!({"t": "res", "id": rid, "ok": false, "e": {"code": code, "message": message}}),
            ),
        }
    }

    /// Answers podhost's request: `None` for a lease that waits.
    fn answer(
        &self,
        conn: u64,
        rid: u64,
        m: &str,
        p: Value,
    ) -> Option<Result<Value, (String, String)>> {
        let invalid = |e: String| {
            Some(Err((
                "invalid".to_owned(),
                format!("Invalid {m} request: {e}"),
            )))
        };
        let not_held = |run: &str| {
            Some(Err((
                "run_not_held".to_owned(),
                format!("Run {run} is not held by this harness"),
            )))
        };
        match m {
            "hello" => {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Features {
                    workspace: bool,
                }
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Hello {
                    api: u64,
                    name: String,
                    version: String,
                    features: Features,
                }
                let h: Hello = match serde_json::from_value(p) {
                    Ok(h) => h,
                    Err(e) => return invalid(e.to_string()),
                };
                if let Some((code, message)) = self.hello_refusals.lock().unwrap().pop_front() {
                    return Some(Err((code, message)));
                }
                if h.api != 5 {
                    return invalid(format!("api {} is not 5", h.api));
                }
                if h.name != self.opts.harness_id {
                    return invalid(format!("{} is not the credential's harness", h.name));
                }
                if h.version.is_empty() || !h.features.workspace {
                    return invalid("a pod's host serves its workspace".to_owned());
                }
                Some(Ok(json!({
                    "api": 5,
                    "tenantId": self.opts.tenant_id,
                    "sandbox": {"backend": null},
                    "renewEveryMs": self.opts.renew_every_ms,
                })))
            }
            "lease" => {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Lease {}
                if let Err(e) = serde_json::from_value::<Lease>(p) {
                    return invalid(e.to_string());
                }
                self.waiting.lock().unwrap().push_back((conn, rid));
                self.serve_waiting();
                None
            }
            "lease.renew" | "lease.release" | "turn.completed" | "turn.failed" | "turn.waiting"
            | "turn.paused" | "checkpoint" => {
                let run_id = match self.check_run_params(m, &p) {
                    Ok(r) => r,
                    Err(e) => return invalid(e),
                };
                if self.held.lock().unwrap().get(&run_id) != Some(&conn) {
                    return not_held(&run_id);
                }
                match m {
                    "lease.renew" => {
                        let reply = self
                            .renew_replies
                            .lock()
                            .unwrap()
                            .get_mut(&run_id)
                            .and_then(VecDeque::pop_front)
                            .unwrap_or_else(|| json!({"ok": true}));
                        if reply["ok"] == false {
                            self.held.lock().unwrap().remove(&run_id);
                            self.journal.run_over(&run_id);
                        } else if let Some(token) = reply["token"].as_str() {
                            self.journal.renewed(&run_id, token);
                        }
                        Some(Ok(reply))
                    }
                    "lease.release" => {
                        self.held.lock().unwrap().remove(&run_id);
                        self.journal.run_over(&run_id);
                        self.artifacts.on_run_end(&run_id);
                        Some(Ok(json!({})))
                    }
                    _ if self.journal.run(&run_id).is_some() => {
                        let settled = self.journal.output(&run_id, m, &p);
                        if settled.is_ok() {
                            self.held.lock().unwrap().remove(&run_id);
                            self.artifacts.on_run_end(&run_id);
                        }
                        Some(settled)
                    }
                    _ => {
                        self.held.lock().unwrap().remove(&run_id);
                        self.artifacts.on_run_end(&run_id);
                        Some(Ok(json!({"cursor": 7})))
                    }
                }
            }
            m if crate::fake_journal::METHODS.contains(&m) => {
                Some(self.journal.answer(m, p, |run| {
                    self.held.lock().unwrap().get(run) == Some(&conn)
                }))
            }
            "artifact.read" | "artifact.write" | "definition.file" => {
                let held = |run: &str| self.held.lock().unwrap().get(run) == Some(&conn);
                self.artifacts.answer(m, p, held)
            }
            _ => Some(Err(("invalid".to_owned(), format!("Unknown request {m}")))),
        }
    }

    /// Strict params of the run requests; returns the run id.
    fn check_run_params(&self, m: &str, p: &Value) -> Result<String, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Renew {
            run_id: String,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Release {
            run_id: String,
            reason: String,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Output {
            run_id: String,
            status: Option<String>,
            state: Option<Value>,
            output: Option<Value>,
            pending: Option<Value>,
            error: Option<Value>,
            effect_ids: Option<Vec<String>>,
            cancel_effect_ids: Option<Vec<String>>,
            transcript: Option<Vec<Value>>,
            thrown: Option<Value>,
        }
        let p = p.clone();
        let run_id = match m {
            "lease.renew" => {
                serde_json::from_value::<Renew>(p)
                    .map_err(|e| e.to_string())?
                    .run_id
            }
            "lease.release" => {
                let r: Release = serde_json::from_value(p).map_err(|e| e.to_string())?;
                if !["shutdown", "ownership.lost", "connection.lost"].contains(&r.reason.as_str()) {
                    return Err(format!("unknown reason {}", r.reason));
                }
                r.run_id
            }
            _ => {
                serde_json::from_value::<Output>(p)
                    .map_err(|e| e.to_string())?
                    .run_id
            }
        };
        if run_id.is_empty() {
            return Err("runId is empty".to_owned());
        }
        Ok(run_id)
    }

    /// Answers waiting leases from the grant queue.
    fn serve_waiting(&self) {
        loop {
            let pair = {
                let mut grants = self.grants.lock().unwrap();
                let mut waiting = self.waiting.lock().unwrap();
                if grants.is_empty() || waiting.is_empty() {
                    return;
                }
                (waiting.pop_front().unwrap(), grants.pop_front().unwrap())
            };
            let ((conn, rid), grant) = pair;
            let c = self.conns.lock().unwrap().get(&conn).cloned();
            let Some(c) = c else {
                self.grants.lock().unwrap().push_front(grant);
                continue;
            };
            if let Some(run_id) = grant["run"]["runId"].as_str() {
                self.held.lock().unwrap().insert(run_id.to_owned(), conn);
            }
            self.artifacts.on_grant(&grant);
            let mut grant = grant;
            if self.opts.answer_extras {
                grant["offeredAt"] = json!(1_700_000_000_000u64);
                grant["run"]["priority"] = json!("normal");
            }
            self.send(
                &c,
                conn,
                json!({"t": "res", "id": rid, "ok": true, "r": grant}),
            );
        }
    }
}
