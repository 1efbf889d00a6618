//! A fake Model Gate on 127.0.0.1:0 (what `NYLORUN_GATES_URL` names in the tests), as strict as
//! the gate (v5 §5, v2 notes §4.3), with a fixture model.
//!
//! `POST /nylorun/v1/model-calls`:
//! * the current run token as bearer (a token of a run that is over or was renewed away is
//!   `409 run_stale`; any other is `401 gate_unauthorized`);
//! * `Idempotency-Key` present (`400 key_required`), equal to the body's `effectId`, and that
//!   effect journaled `invoking` for the token's session with the request hash of exactly this
//!   call (else `409 effect_not_journaled`);
//! * a strict body `{effectId, invocationId, call: {prompt[], tools[], executionId, …}}` within
//!   the run's `modelCallBytes` (`400 invalid_request`);
//! * the same key with another body is `409 gate_conflict`; with the same body it joins the call
//!   (in flight or done) and gets the same answer.
//!
//! Before a call reaches the model, the gate refuses what a real gate refuses, as a failure
//! outcome: a media part of a text file or of a kind the run's `model.inputs` does not name
//! (`unsupported_input`), a file past `limits.modelFileBytes` (`invalid_request`, when the test
//! told the gate the files' sizes), and a prompt past the model's window as the gate counts it
//! with its own token estimate ([`count_tokens`], not podhost's), the answer's room
//! (`model.controls.maxOutputTokens`, else the descriptor's) included (`context_overflow`, with
//! the numbers in the message as providers give them).
//!
//! Calls are answered by a per-test script of [`Reply`]s, then by a responder when the test set
//! one, then by the v2 fixture model. A call scripted to hang outlives its client (as a gate's
//! call does) until the test releases it or the cancel route
//! `POST /nylorun/v1/model-calls/{key}/cancel` aborts it. With [`FakeGates::report_usage`], each
//! candidate's `usage.inputTokens` is the gate's own count of the prompt.
//!
//! Faults come only from the script, and only to a request that passed every check above: a 5xx
//! before the gate takes the call ([`Reply::Unavailable`]: nothing runs, and the next request
//! under the key is a new call), or an answer lost after the model ran ([`Reply::Lost`]: the
//! connection drops, or a 5xx stands in its place; a re-send collects the answer kept for the
//! key).
//!
//! The Tool Gate's routes (`mcp/*`, `tool-calls`, `http-calls`) are on the same listener:
//! [`FakeGates::toolgate`] (`fake_toolgate.rs`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use podhost::nylorun::link::canonical::request_hash;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::fake_journal::{Journal, Status, TokenState};
use crate::fake_toolgate::ToolGate;

/// How the gate answers one new call.
#[derive(Clone, Debug)]
pub enum Reply {
    /// `200 {outcome}`.
    Outcome(Value),
    /// No answer until the test releases it or the call is cancelled.
    Hang,
    /// An error status and body.
    Http(u16, Value),
    /// The fixture model.
    Fixture,
    /// The model runs and is metered, and `outcome` is kept for the key, but the first `times`
    /// requests under the key (this one included) lose it to `loss`: their caller cannot know
    /// the fate. A later request under the key with the same body collects the answer.
    Lost {
        outcome: Value,
        loss: Loss,
        times: u32,
    },
    /// This status (a 5xx) before the gate takes the call: nothing runs, is metered or kept for
    /// the key, and the next request under the key is a new call (it takes the next reply).
    Unavailable(u16),
}

/// How a request loses the answer of a call the gate ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The status line goes out, then the connection drops before the body.
    Drop,
    /// This error status (a 5xx) in the answer's place.
    Status(u16),
}

/// A candidate calling one tool.
pub fn tool_call(id: &str, name: &str, args: Value) -> Reply {
    Reply::Outcome(json!({
        "output": [{"type": "tool-call", "id": id, "name": name, "args": args}],
        "finishReason": "tool-calls",
        "usage": {"inputTokens": 10, "outputTokens": 5},
    }))
}

/// A candidate answering with text.
pub fn text(t: &str) -> Reply {
    Reply::Outcome(json!({
        "output": [{"type": "text", "text": t}],
        "finishReason": "stop",
        "usage": {"inputTokens": 12, "outputTokens": 3},
    }))
}

/// A candidate answering with text, as an outcome value (for [`FakeGates::release`]).
pub fn candidate_text(t: &str) -> Value {
    json!({
        "output": [{"type": "text", "text": t}],
        "finishReason": "stop",
        "usage": {"inputTokens": 12, "outputTokens": 3},
    })
}

/// One call as the gate saw it.
#[derive(Clone, Debug)]
pub struct GateCall {
    pub token: Option<String>,
    pub key: Option<String>,
    pub traceparent: Option<String>,
    /// The body as sent (raw, to compare re-sends byte for byte).
    pub raw: String,
    pub body: Value,
    /// The status answered (0 while in flight).
    pub status: u16,
    pub answer: Value,
    /// The prompt's tokens as the gate counts them (with the tools).
    pub tokens: u64,
}

/// The gate's own token estimate: each run of letters and digits counts one token per six
/// characters (at least one), and every other character but whitespace one token.
pub fn count_tokens(text: &str) -> u64 {
    let mut tokens = 0u64;
    let mut word = 0u64;
    for c in text.chars() {
        if c.is_alphanumeric() {
            word += 1;
            continue;
        }
        tokens += word.div_ceil(6);
        word = 0;
        if !c.is_whitespace() {
            tokens += 1;
        }
    }
    tokens + word.div_ceil(6)
}

/// The tokens of a call's prompt and tools, as the gate counts them.
pub fn call_tokens(call: &Value) -> u64 {
    count_tokens(&call["prompt"].to_string()) + count_tokens(&call["tools"].to_string())
}

type Responder = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;
type FileSizes = Arc<dyn Fn(&str) -> Option<u64> + Send + Sync>;

struct Entry {
    body: String,
    answer: watch::Sender<Option<(u16, Value)>>,
    /// How the next requests under the key lose the answer, and how many more do.
    losses: Mutex<Option<(Loss, u32)>>,
}

impl Entry {
    /// The loss of the request that collects the answer now, if it is one that loses it.
    fn lose(&self) -> Option<Loss> {
        let mut losses = self.losses.lock().unwrap();
        match losses.as_mut() {
            Some((loss, left)) if *left > 0 => {
                *left -= 1;
                Some(*loss)
            }
            _ => None,
        }
    }
}

#[derive(Default)]
struct Gate {
    calls: Vec<GateCall>,
    entries: HashMap<String, Arc<Entry>>,
    script: VecDeque<Reply>,
    cancels: Vec<(String, Option<String>)>,
    /// Calls the fixture model answered (not joins).
    model_runs: usize,
    responder: Option<Responder>,
    /// The window the gate holds prompts to instead of the run's `model.contextWindow`.
    window: Option<u64>,
    report_usage: bool,
    /// The size of an artifact a media part names, by artifact id.
    file_sizes: Option<FileSizes>,
    /// The gate's metering: `model_usage` rows per effect id (one per call the model ran).
    usage: HashMap<String, usize>,
}

pub struct GateState {
    journal: Arc<Journal>,
    gate: Mutex<Gate>,
    changed: watch::Sender<u64>,
}

/// The fake gates; dropped, they stop listening.
pub struct FakeGates {
    pub addr: SocketAddr,
    pub state: Arc<GateState>,
    /// The Tool Gate, on the same listener.
    pub toolgate: Arc<ToolGate>,
    stop: CancellationToken,
}

impl Drop for FakeGates {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

const WAIT: Duration = Duration::from_secs(20);

impl FakeGates {
    pub async fn start(journal: Arc<Journal>) -> FakeGates {
        let toolgate = ToolGate::new(journal.clone());
        let state = Arc::new(GateState {
            journal,
            gate: Mutex::default(),
            changed: watch::Sender::new(0),
        });
        let app = Router::new()
            .route("/nylorun/v1/model-calls", post(model_call))
            .route("/nylorun/v1/model-calls/{key}/cancel", post(cancel))
            .with_state(state.clone())
            .merge(toolgate.routes())
            .layer(DefaultBodyLimit::max(64 << 20));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move { s.cancelled().await })
                .await;
        });
        FakeGates {
            addr,
            state,
            toolgate,
            stop,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The next new calls are answered with these, in order; then the fixture model.
    pub fn script(&self, replies: impl IntoIterator<Item = Reply>) {
        self.state.gate.lock().unwrap().script.extend(replies);
    }

    pub fn calls(&self) -> Vec<GateCall> {
        self.state.gate.lock().unwrap().calls.clone()
    }

    /// Answers calls the script does not with `f(call)` (before the fixture model).
    pub fn respond_with(&self, f: impl Fn(&Value) -> Reply + Send + Sync + 'static) {
        self.state.gate.lock().unwrap().responder = Some(Arc::new(f));
    }

    /// Holds prompts to `window` tokens instead of the run's `model.contextWindow`.
    pub fn set_window(&self, window: Option<u64>) {
        self.state.gate.lock().unwrap().window = window;
    }

    /// Reports the gate's own count of each prompt as the candidate's `usage.inputTokens`.
    pub fn report_usage(&self, on: bool) {
        self.state.gate.lock().unwrap().report_usage = on;
    }

    /// Tells the gate how large the files media parts name are (by artifact id), so it refuses
    /// one past `limits.modelFileBytes`.
    pub fn file_sizes(&self, f: impl Fn(&str) -> Option<u64> + Send + Sync + 'static) {
        self.state.gate.lock().unwrap().file_sizes = Some(Arc::new(f));
    }

    /// Cancel route calls: `(key, bearer)`.
    pub fn cancels(&self) -> Vec<(String, Option<String>)> {
        self.state.gate.lock().unwrap().cancels.clone()
    }

    /// New calls the model answered (re-sends that joined are not counted).
    pub fn model_runs(&self) -> usize {
        self.state.gate.lock().unwrap().model_runs
    }

    /// `model_usage` rows by effect id: a re-send that joins a call adds none.
    pub fn usage_rows(&self) -> HashMap<String, usize> {
        self.state.gate.lock().unwrap().usage.clone()
    }

    /// Waits until `pred` holds of the gate's records.
    async fn wait_for<T>(&self, what: &str, pred: impl Fn(&Gate) -> Option<T>) -> T {
        let mut rx = self.state.changed.subscribe();
        let found = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(t) = pred(&self.state.gate.lock().unwrap()) {
                    return t;
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("timed out waiting for {what}; calls: {:#?}", self.calls()))
    }

    /// Waits for call number `n` (from 0) to arrive.
    pub async fn wait_call(&self, n: usize) -> GateCall {
        self.wait_for(&format!("gate call {n}"), |g| g.calls.get(n).cloned())
            .await
    }

    /// Waits for a cancel of `key`.
    pub async fn wait_cancel(&self, key: &str) -> Option<String> {
        self.wait_for(&format!("a cancel of {key}"), |g| {
            g.cancels
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, t)| t.clone())
        })
        .await
    }

    /// Answers the hung call of `key` with `outcome`.
    pub fn release(&self, key: &str, outcome: Value) {
        let entry = self.state.gate.lock().unwrap().entries.get(key).cloned();
        entry
            .expect("no call with that key")
            .answer
            .send_replace(Some((200, json!({"outcome": outcome}))));
    }
}

fn error(status: u16, code: &str, message: &str) -> (u16, Value) {
    (status, json!({"error": {"code": code, "message": message}}))
}

fn respond((status, body): (u16, Value)) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn bearer(h: &HeaderMap) -> Option<String> {
    header(h, "authorization").and_then(|a| a.strip_prefix("Bearer ").map(str::to_owned))
}

async fn model_call(State(st): State<Arc<GateState>>, headers: HeaderMap, body: Bytes) -> Response {
    let raw = String::from_utf8_lossy(&body).into_owned();
    let call = GateCall {
        token: bearer(&headers),
        key: header(&headers, "idempotency-key"),
        traceparent: header(&headers, "traceparent"),
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        raw: raw.clone(),
        status: 0,
        answer: Value::Null,
        tokens: 0,
    };
    let index = {
        let mut g = st.gate.lock().unwrap();
        g.calls.push(call.clone());
        g.calls.len() - 1
    };
    st.changed.send_modify(|n| *n += 1);
    let (status, answer, drop) = st.answer(&call, raw).await;
    st.gate.lock().unwrap().calls[index].status = status;
    st.gate.lock().unwrap().calls[index].answer = answer.clone();
    st.changed.send_modify(|n| *n += 1);
    if drop {
        // The status line goes out, then the body fails: hyper drops the connection.
        let body = axum::body::Body::from_stream(futures_util::stream::once(async {
            Err::<Bytes, std::io::Error>(std::io::Error::other("the gate's connection dropped"))
        }));
        return (StatusCode::OK, [("content-type", "application/json")], body).into_response();
    }
    respond((status, answer))
}

impl GateState {
    /// The answer, and whether this request's connection drops before its body.
    async fn answer(&self, call: &GateCall, raw: String) -> (u16, Value, bool) {
        let mut drop = false;
        let (status, value) = self.answer_inner(call, raw, &mut drop).await;
        (status, value, drop)
    }

    async fn answer_inner(&self, call: &GateCall, raw: String, drop: &mut bool) -> (u16, Value) {
        let session = match call.token.as_deref().map(|t| self.journal.token_state(t)) {
            Some(TokenState::Current { session_id, run_id }) => (session_id, run_id),
            Some(TokenState::Stale) => return error(409, "run_stale", "The run is over"),
            _ => return error(401, "gate_unauthorized", "Unknown run token"),
        };
        let Some(key) = call.key.clone() else {
            return error(400, "key_required", "Idempotency-Key is required");
        };
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Body {
            effect_id: String,
            #[allow(unused)]
            invocation_id: String,
            call: Value,
        }
        let body: Body = match serde_json::from_value(call.body.clone()) {
            Ok(b) => b,
            Err(e) => return error(400, "invalid_request", &e.to_string()),
        };
        let limit = self.journal.run(&session.1).unwrap().model_call_bytes;
        if raw.len() > limit {
            return error(400, "invalid_request", "The body is past modelCallBytes");
        }
        let c = &body.call;
        let tools_ok = c["tools"]
            .as_array()
            .is_some_and(|t| t.iter().all(|t| t["name"].is_string()));
        if !c["prompt"].is_array() || !tools_ok || !c["executionId"].is_string() {
            return error(
                400,
                "invalid_request",
                "call needs prompt[], tools[{name}] and executionId",
            );
        }
        if body.effect_id != key {
            return error(
                409,
                "effect_not_journaled",
                "Idempotency-Key is not the body's effectId",
            );
        }
        let existing = self.gate.lock().unwrap().entries.get(&key).cloned();
        let entry = match existing {
            Some(e) if e.body != raw => {
                return error(409, "gate_conflict", "Another request under this key");
            }
            Some(e) => e,
            None => {
                // Stricter than the gate, which cannot see a model call's hash: the row must
                // be this very call.
                let journaled = self.journal.row(&key).filter(|r| {
                    let mut intent = r.intent.clone();
                    intent["input"] = c.clone();
                    r.session_id == session.0
                        && r.kind == "model"
                        && r.status == Status::Invoking
                        && request_hash(&intent) == r.hash
                });
                if journaled.is_none() {
                    return error(
                        409,
                        "effect_not_journaled",
                        "The call is not journaled invoking as this request",
                    );
                }
                let run = self.journal.run(&session.1).unwrap();
                let tokens = call_tokens(c);
                let refused = self.refusal(c, &run, tokens);
                let (reply, report_usage) = {
                    let mut g = self.gate.lock().unwrap();
                    if let Some(call) = g
                        .calls
                        .iter_mut()
                        .rev()
                        .find(|g| g.key.as_deref() == Some(key.as_str()))
                    {
                        call.tokens = tokens;
                    }
                    let reply = match refused {
                        Some(failure) => Reply::Outcome(failure),
                        None => {
                            let reply = match g.script.pop_front() {
                                Some(r) => r,
                                None => g.responder.clone().map_or(Reply::Fixture, |f| f(c)),
                            };
                            // A gate that is unavailable takes nothing: no model runs.
                            if !matches!(reply, Reply::Unavailable(_)) {
                                g.model_runs += 1;
                                *g.usage.entry(key.clone()).or_default() += 1;
                            }
                            reply
                        }
                    };
                    (reply, g.report_usage)
                };
                let reply = match reply {
                    Reply::Outcome(mut o) if report_usage && o["kind"] != "failed" => {
                        o["usage"]["inputTokens"] = json!(tokens);
                        Reply::Outcome(o)
                    }
                    other => other,
                };
                if let Reply::Unavailable(status) = reply {
                    return error(status, "unavailable", "The gate is unavailable; try again");
                }
                let losses = match &reply {
                    Reply::Lost { loss, times, .. } => Some((*loss, *times)),
                    _ => None,
                };
                let entry = Arc::new(Entry {
                    body: raw,
                    answer: watch::Sender::new(None),
                    losses: Mutex::new(losses),
                });
                self.gate
                    .lock()
                    .unwrap()
                    .entries
                    .insert(key.clone(), entry.clone());
                match reply {
                    Reply::Outcome(o) => {
                        entry
                            .answer
                            .send_replace(Some((200, json!({"outcome": o}))));
                    }
                    Reply::Http(s, b) => {
                        entry.answer.send_replace(Some((s, b)));
                    }
                    Reply::Fixture => {
                        entry
                            .answer
                            .send_replace(Some((200, json!({"outcome": fixture(c)}))));
                    }
                    Reply::Hang => {}
                    Reply::Unavailable(_) => unreachable!("answered before the call was kept"),
                    Reply::Lost { outcome, .. } => {
                        entry
                            .answer
                            .send_replace(Some((200, json!({"outcome": outcome}))));
                    }
                }
                entry
            }
        };
        let mut rx = entry.answer.subscribe();
        let got = rx.wait_for(Option::is_some).await.unwrap().clone().unwrap();
        match entry.lose() {
            None => got,
            Some(Loss::Drop) => {
                *drop = true;
                got
            }
            Some(Loss::Status(status)) => error(
                status,
                "unavailable",
                "The gate failed before it could answer",
            ),
        }
    }
}

impl GateState {
    /// What the gate refuses before a call reaches the model: a failure outcome.
    fn refusal(
        &self,
        call: &Value,
        run: &crate::fake_journal::RunInfo,
        tokens: u64,
    ) -> Option<Value> {
        let failed = |code: &str, message: String| {
            Some(json!({"kind": "failed", "code": code, "message": message, "retryable": false}))
        };
        let (window, file_sizes) = {
            let g = self.gate.lock().unwrap();
            (g.window.or(run.context_window), g.file_sizes.clone())
        };
        for item in call["prompt"].as_array().into_iter().flatten() {
            for part in item["content"].as_array().into_iter().flatten() {
                if part["type"] != "media" {
                    continue;
                }
                let media_type = part["mediaType"].as_str().unwrap_or("");
                let kind = match media_type.split('/').next().unwrap_or("") {
                    "image" => "image",
                    "audio" => "audio",
                    "video" => "video",
                    "text" => "text",
                    _ if media_type.ends_with("/pdf") => "pdf",
                    _ => "file",
                };
                if kind == "text" {
                    return failed(
                        "unsupported_input",
                        format!(
                            "A text file ({media_type}) cannot be a media part; inline its text"
                        ),
                    );
                }
                if let Some(inputs) = &run.model_inputs
                    && !inputs.iter().any(|i| i == kind)
                {
                    return failed(
                        "unsupported_input",
                        format!("The model does not read {kind} input ({media_type})"),
                    );
                }
                let id = part["reference"]["artifactId"].as_str().unwrap_or("");
                if let Some(size) = file_sizes.as_ref().and_then(|f| f(id))
                    && size > run.model_file_bytes
                {
                    return failed(
                        "invalid_request",
                        format!(
                            "The reference {id} is {size} bytes, past limits.modelFileBytes ({})",
                            run.model_file_bytes
                        ),
                    );
                }
            }
        }
        let window = window?;
        let reserve = call["model"]["controls"]["maxOutputTokens"]
            .as_u64()
            .or(run.max_output_tokens)
            .unwrap_or(0);
        if tokens + reserve > window {
            return failed(
                "context_overflow",
                format!(
                    "This model's maximum context length is {window} tokens. However, you \
                     requested {} tokens ({tokens} in the messages, {reserve} in the completion).",
                    tokens + reserve
                ),
            );
        }
        None
    }
}

async fn cancel(
    State(st): State<Arc<GateState>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    let token = bearer(&headers);
    if token.as_deref().map(|t| st.journal.token_state(t)) == Some(TokenState::Unknown)
        || token.is_none()
    {
        return respond(error(401, "gate_unauthorized", "Unknown run token"));
    }
    let entry = {
        let mut g = st.gate.lock().unwrap();
        g.cancels.push((key.clone(), token));
        g.entries.get(&key).cloned()
    };
    if let Some(e) = entry
        && e.answer.borrow().is_none()
    {
        e.answer.send_replace(Some((
            200,
            json!({"outcome": {"kind": "failed", "code": "transient", "message": "The call was cancelled", "retryable": true}}),
        )));
    }
    st.changed.send_modify(|n| *n += 1);
    StatusCode::NO_CONTENT.into_response()
}

/// The text of a prompt item's parts.
fn text_of(item: &Value) -> String {
    item["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The v2 fixture model (`runtime/src/core/provider.ts`): a tool result last → "Order lookup
/// complete: …"; more than one user message → "I remember: <first>"; no `lookup_order` tool →
/// "Hello from the fixture model."; else a `lookup_order` call.
pub fn fixture(call: &Value) -> Value {
    let prompt = call["prompt"].as_array().cloned().unwrap_or_default();
    let users: Vec<&Value> = prompt
        .iter()
        .filter(|i| i["kind"] == "message" && i["role"] == "user")
        .collect();
    let has_lookup = call["tools"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["name"] == "lookup_order"));
    let text = match prompt.last() {
        Some(last) if last["kind"] == "tool-result" => {
            format!("Order lookup complete: {}", text_of(last))
        }
        _ if users.len() > 1 => format!("I remember: {}", text_of(users[0])),
        _ if !has_lookup => "Hello from the fixture model.".to_owned(),
        _ => {
            return json!({
                "output": [{"type": "tool-call", "id": "fixture_lookup", "name": "lookup_order",
                            "args": {"orderId": "demo-123"}}],
                "finishReason": "tool-calls",
            });
        }
    };
    json!({"output": [{"type": "text", "text": text}], "finishReason": "stop",
           "usage": {"inputTokens": prompt.len() * 10, "outputTokens": 4}})
}
