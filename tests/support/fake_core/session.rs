//! Core's Harness API session on one WebSocket connection (v5 §1, §2, §8; v2 notes §1.2, §1.4,
//! §1.5): the frames both ways, `hello`, core's own requests and messages to the pod, and the
//! router that hands podhost's requests to the part of core that answers them.
//!
//! What it refuses, as core does: a binary frame or non-JSON text (close 1007); a frame whose
//! `t` is unknown, a request, answer or abort without a positive `id`, and an answer, message,
//! abort or ping with a field its `t` does not have (`req`: `t id m p`; `res`: `t id ok r e`;
//! `msg`: `t m p`; `abort`: `t id`; `ping`: `t`) (close 1002); a request with such a field
//! (`invalid` "Invalid frame"); a `hello` that is not `{api, name, version, features:
//! {workspace}}` exactly, whose `api` is not 5, whose `name` is not the credential's harness,
//! whose `version` is empty or that does not declare `features.workspace` (a pod's host serves
//! its workspace) (`invalid`); a method it does not know (`invalid`). An `abort` drops the
//! waiting lease it names and answers nothing.
//!
//! The test can script a refusal of the next `hello` or of the next request of any method (a
//! `run_not_held`/`ownership_lost` one also ends core's hold on the run), hold a method's
//! requests unanswered until it lets them go (a core slow to settle), make core fall silent on a
//! connection (no answers, no pings), have core's answers carry fields a later core might add,
//! look at each request before it is answered, send messages, requests, aborts and raw frames,
//! and close the connection.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use super::{Answer, CoreState, Event, FakeCore, WAIT, invalid};

/// One connection's writer, core's requests in flight on it, and its close.
pub(super) struct Conn {
    out: mpsc::UnboundedSender<Message>,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Value>>>,
    pub(super) close: CancellationToken,
}

/// A request held by [`FakeCore::slow_answers`]: `(conn, id, method, params)`.
pub(super) type SlowRequest = (u64, u64, String, Value);

impl FakeCore {
    /// The next hello is answered with this error.
    pub fn refuse_hello(&self, code: &str, message: &str) {
        self.state
            .hello_refusals
            .lock()
            .unwrap()
            .push_back((code.into(), message.into()));
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
}

impl CoreState {
    pub(super) fn send(&self, c: &Conn, conn: u64, frame: Value) {
        self.record(Event::ToPod {
            conn,
            frame: frame.clone(),
        });
        let _ = c.out.send(Message::text(frame.to_string()));
    }

    pub(super) async fn connection(
        self: Arc<Self>,
        ws: WebSocketStream<TcpStream>,
        stop: CancellationToken,
    ) {
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
        self.connection_lost(id);
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
            ("abort", true, Some(rid)) => self.lease_aborted(id, rid),
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

    /// Answers podhost's request, or hands it to the part of core that does: `None` when no
    /// answer is sent (a lease that waits, an answer scripted lost).
    fn answer(&self, conn: u64, rid: u64, m: &str, p: Value) -> Answer {
        match m {
            "hello" => Some(self.hello(p)),
            "lease" => self.lease(conn, rid, p),
            m if super::leases::RUN_METHODS.contains(&m) => Some(self.run_request(conn, m, p)),
            m if crate::fake_journal::METHODS.contains(&m) => {
                Some(self.journal.answer(m, p, |run| self.holds(conn, run)))
            }
            "artifact.read" | "artifact.write" | "definition.file" => {
                self.artifacts.answer(m, p, |run| self.holds(conn, run))
            }
            _ => Some(Err(("invalid".to_owned(), format!("Unknown request {m}")))),
        }
    }

    /// `hello {api: 5, name, version, features}` (v5 §2).
    fn hello(&self, p: Value) -> Result<Value, (String, String)> {
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
        let h: Hello = serde_json::from_value(p).map_err(|e| invalid("hello", e))?;
        if let Some(refusal) = self.hello_refusals.lock().unwrap().pop_front() {
            return Err(refusal);
        }
        if h.api != 5 {
            return Err(invalid("hello", format!("api {} is not 5", h.api)));
        }
        if h.name != self.opts.harness_id {
            return Err(invalid(
                "hello",
                format!("{} is not the credential's harness", h.name),
            ));
        }
        if h.version.is_empty() || !h.features.workspace {
            return Err(invalid("hello", "a pod's host serves its workspace"));
        }
        Ok(json!({
            "api": 5,
            "tenantId": self.opts.tenant_id,
            "sandbox": {"backend": null},
            "renewEveryMs": self.opts.renew_every_ms,
        }))
    }
}
