//! A scripted OpenAI-compatible model server on `127.0.0.1:0`.
//!
//! It answers `POST /v1/chat/completions` from a per-test script (or a responder function),
//! records every request (headers and body), and is strict like a real server: a wrong key is
//! answered 401 (echoing the key, as real servers do, so that tests check podhost scrubs it), an
//! unknown model 404, and a transcript that breaks the chat rules (a tool message without a
//! matching earlier call, a call left unanswered) 400.
//!
//! A request with `"stream": true` is answered with server-sent events, as OpenAI streams:
//! `chat.completion.chunk`s (text in pieces, tool-call arguments in pieces by `index`), the
//! finish reason, a usage chunk when `stream_options.include_usage` asks for it, and `[DONE]`.
//! [`FakeModel::stream_only`] makes it refuse requests that do not stream, as some servers do.
//! It counts each request's tokens with its own estimate ([`count_tokens`] over the messages
//! and tools as JSON, not podhost's), reports the count as `usage.prompt_tokens`, and with a
//! window ([`FakeModel::set_window`]) refuses a request whose count plus its `max_tokens` (or
//! `max_completion_tokens`) passes it, as OpenAI does: 400 with `code:
//! "context_length_exceeded"` and the numbers in the message. A text-only fake
//! ([`FakeModel::set_vision`]) refuses image parts with 400. `GET /v1/models` answers 401 (as a
//! key that authorizes only chat completions gets), or the listing the test set.
#![allow(dead_code)]

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// An answer without tool calls.
    Text(String),
    /// Tool calls `(id, name, arguments as written)`, with optional text.
    Calls {
        text: Option<String>,
        calls: Vec<(String, String, String)>,
    },
    /// An error status with a body, and an optional `Retry-After` in seconds.
    Status(u16, String, Option<u64>),
    /// Waits, then answers.
    Delay(Duration, Box<Reply>),
    /// Waits until [`FakeModel::release`], then answers with the inner reply.
    Hang(Box<Reply>),
    /// A raw 200 body.
    Raw(Value),
    /// Streamed requests only: the first chunks of the inner reply, then the stream closes
    /// without a finish reason or `[DONE]` (a server that died mid-answer).
    Broken(Box<Reply>),
    /// Streamed requests only: the inner reply with this pause before each chunk.
    Trickle(Duration, Box<Reply>),
}

impl Reply {
    pub fn text(t: &str) -> Reply {
        Reply::Text(t.to_owned())
    }

    pub fn call(id: &str, name: &str, args: Value) -> Reply {
        Reply::Calls {
            text: None,
            calls: vec![(id.to_owned(), name.to_owned(), args.to_string())],
        }
    }

    pub fn calls(calls: &[(&str, &str, Value)]) -> Reply {
        Reply::Calls {
            text: None,
            calls: calls
                .iter()
                .map(|(i, n, a)| (i.to_string(), n.to_string(), a.to_string()))
                .collect(),
        }
    }
}

/// A request as the fake received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub authorization: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: Value,
    pub at: Instant,
    /// The request's tokens as the fake counts them.
    pub tokens: u64,
}

/// The fake's own token estimate: each run of letters and digits counts one token per six
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

/// A request's tokens: its messages and tools.
pub fn request_tokens(body: &Value) -> u64 {
    count_tokens(&body["messages"].to_string()) + count_tokens(&body["tools"].to_string())
}

type Responder = Arc<dyn Fn(&Value) -> Reply + Send + Sync>;

struct Shared {
    model: String,
    keys: Mutex<HashSet<String>>,
    script: Mutex<VecDeque<Reply>>,
    responder: Mutex<Option<Responder>>,
    requests: Mutex<Vec<Recorded>>,
    count: watch::Sender<usize>,
    release: Notify,
    in_flight: AtomicUsize,
    in_flight_tx: watch::Sender<usize>,
    /// Whether requests are recorded (they are always counted).
    keep: std::sync::atomic::AtomicBool,
    stream_only: std::sync::atomic::AtomicBool,
    window: Mutex<Option<u64>>,
    vision: Mutex<bool>,
    listing: Mutex<Option<Value>>,
    /// Requests to the model listing (`GET /v1/models`), with their `Authorization`.
    listing_requests: Mutex<Vec<Option<String>>>,
    keep_messages: Mutex<bool>,
    /// The most requests answered at once since the start or the last reset.
    max_in_flight: AtomicUsize,
}

/// The running fake. Stops when dropped.
pub struct FakeModel {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct InFlight(Arc<Shared>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let n = self.0.in_flight.fetch_sub(1, Ordering::SeqCst) - 1;
        self.0.in_flight_tx.send_replace(n);
    }
}

impl FakeModel {
    /// Starts a fake serving `model`, accepting `key` (no key check when `None`).
    pub async fn start(model: &str, key: Option<&str>) -> FakeModel {
        let shared = Arc::new(Shared {
            model: model.to_owned(),
            keys: Mutex::new(key.into_iter().map(str::to_owned).collect()),
            script: Mutex::new(VecDeque::new()),
            responder: Mutex::new(None),
            requests: Mutex::new(Vec::new()),
            count: watch::Sender::new(0),
            release: Notify::new(),
            in_flight: AtomicUsize::new(0),
            in_flight_tx: watch::Sender::new(0),
            keep: std::sync::atomic::AtomicBool::new(true),
            stream_only: std::sync::atomic::AtomicBool::new(false),
            window: Mutex::new(None),
            vision: Mutex::new(true),
            listing: Mutex::new(None),
            listing_requests: Mutex::new(Vec::new()),
            keep_messages: Mutex::new(true),
            max_in_flight: AtomicUsize::new(0),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/v1/models", get(models))
            .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeModel { addr, shared, task }
    }

    /// The base URL to give podhost.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) {
        self.shared.script.lock().unwrap().extend(replies);
    }

    /// Answers every request with `f(body)` instead of the script.
    pub fn respond_with(&self, f: impl Fn(&Value) -> Reply + Send + Sync + 'static) {
        *self.shared.responder.lock().unwrap() = Some(Arc::new(f));
    }

    /// Refuses requests past `window` tokens (as counted, with their answer's room).
    pub fn set_window(&self, window: Option<u64>) {
        *self.shared.window.lock().unwrap() = window;
    }

    /// Whether image parts are accepted (a text-only model refuses them).
    pub fn set_vision(&self, on: bool) {
        *self.shared.vision.lock().unwrap() = on;
    }

    /// Whether a recorded request keeps its messages (off: their count instead, so that a very
    /// long session's requests do not all stay in memory).
    pub fn set_keep_messages(&self, keep: bool) {
        *self.shared.keep_messages.lock().unwrap() = keep;
    }

    /// Answers `GET /v1/models` with `listing` (401 when `None`).
    pub fn set_listing(&self, listing: Option<Value>) {
        *self.shared.listing.lock().unwrap() = listing;
    }

    /// Replaces the accepted keys.
    pub fn accept_keys(&self, keys: &[&str]) {
        *self.shared.keys.lock().unwrap() = keys.iter().map(|k| k.to_string()).collect();
    }

    /// Refuses requests that do not ask for a stream (HTTP 400), as some servers do.
    pub fn stream_only(&self) {
        self.shared.stream_only.store(true, Ordering::SeqCst);
    }

    /// Lets every hanging request answer.
    pub fn release(&self) {
        self.shared.release.notify_waiters();
    }

    /// Stops recording requests (a long benchmark's bodies would fill the memory); they are
    /// still counted.
    pub fn forget_requests(&self) {
        self.shared.keep.store(false, Ordering::SeqCst);
    }

    /// How many requests arrived.
    pub fn count(&self) -> usize {
        *self.shared.count.borrow()
    }

    /// The model listing's requests so far (`GET /v1/models`), each its `Authorization`.
    pub fn listing_requests(&self) -> Vec<Option<String>> {
        self.shared.listing_requests.lock().unwrap().clone()
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests arrived.
    pub async fn wait_requests(&self, n: usize, timeout: Duration) -> Vec<Recorded> {
        let mut rx = self.shared.count.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c >= n))
            .await
            .unwrap_or_else(|_| panic!("the model did not receive {n} requests in {timeout:?}"))
            .unwrap();
        self.requests()
    }

    /// The most requests answered at once since the start or [`reset_max_in_flight`]
    /// (Self::reset_max_in_flight).
    pub fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::SeqCst)
    }

    pub fn reset_max_in_flight(&self) {
        let now = self.shared.in_flight.load(Ordering::SeqCst);
        self.shared.max_in_flight.store(now, Ordering::SeqCst);
    }

    /// Waits until no request is being answered (a hanging one was dropped by its client).
    pub async fn wait_idle(&self, timeout: Duration) {
        let mut rx = self.shared.in_flight_tx.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|c| *c == 0))
            .await
            .expect("a model request stayed open")
            .unwrap();
    }
}

fn error(status: u16, message: String) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, axum::Json(json!({"error": {"message": message}}))).into_response()
}

/// The chat rules a real server enforces: every tool message answers an open call of the
/// assistant message before it; no call is left open before a non-tool message or at the end.
fn check_transcript(messages: &[Value]) -> Result<(), String> {
    let mut open: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap_or_default();
            let Some(p) = open.iter().position(|o| o == id) else {
                return Err(format!(
                    "messages[{i}]: a tool message must answer a preceding tool call; {id:?} is \
                     not open"
                ));
            };
            open.remove(p);
            continue;
        }
        if !open.is_empty() {
            return Err(format!(
                "messages[{i}]: tool calls {open:?} were not answered"
            ));
        }
        if let Some(calls) = m["tool_calls"].as_array() {
            for c in calls {
                open.push(c["id"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    if !open.is_empty() {
        return Err(format!("tool calls {open:?} were not answered"));
    }
    Ok(())
}

async fn models(State(s): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let auth = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    s.listing_requests.lock().unwrap().push(auth);
    match s.listing.lock().unwrap().clone() {
        Some(l) => axum::Json(l).into_response(),
        None => error(401, "This key authorizes chat completions only".into()),
    }
}

fn answer(reply: &Reply, tokens: u64) -> Response {
    let usage =
        json!({"prompt_tokens": tokens, "completion_tokens": 1, "total_tokens": tokens + 1});
    match reply {
        Reply::Text(t) => axum::Json(json!({
            "id": "chatcmpl-fake", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": t},
                         "finish_reason": "stop"}],
            "usage": usage
        }))
        .into_response(),
        Reply::Calls { text, calls } => {
            let calls: Vec<Value> = calls
                .iter()
                .map(|(id, name, args)| {
                    json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": args}})
                })
                .collect();
            axum::Json(json!({
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                             "tool_calls": calls}, "finish_reason": "tool_calls"}],
                "usage": usage
            }))
            .into_response()
        }
        Reply::Status(code, body, retry_after) => {
            let mut r = error(*code, body.clone());
            if let Some(s) = retry_after {
                r.headers_mut()
                    .insert("retry-after", s.to_string().parse().unwrap());
            }
            r
        }
        Reply::Raw(v) => axum::Json(v.clone()).into_response(),
        Reply::Delay(..) | Reply::Hang(_) => error(500, "fake: nested waits".into()),
        Reply::Broken(_) | Reply::Trickle(..) => error(
            500,
            "fake: a streamed reply for a request that does not stream".into(),
        ),
    }
}

async fn complete(
    State(s): State<Arc<Shared>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    s.max_in_flight.fetch_max(now, Ordering::SeqCst);
    s.in_flight_tx.send_modify(|n| *n += 1);
    let _guard = InFlight(s.clone());
    let body: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(400, format!("fake: body is not JSON: {e}")),
    };
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let tokens = request_tokens(&body);
    if s.keep.load(Ordering::SeqCst) {
        let recorded_body = if *s.keep_messages.lock().unwrap() {
            body.clone()
        } else {
            let mut b = body.clone();
            b["messages"] = json!(body["messages"].as_array().map_or(0, Vec::len));
            b
        };
        s.requests.lock().unwrap().push(Recorded {
            authorization: authorization.clone(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
                .collect(),
            body: recorded_body,
            at: Instant::now(),
            tokens,
        });
    }
    s.count.send_modify(|c| *c += 1);

    let keys = s.keys.lock().unwrap().clone();
    if !keys.is_empty() {
        let presented = authorization
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "))
            .unwrap_or_default();
        if !keys.contains(presented) {
            return error(
                401,
                format!("Incorrect API key provided: {presented}. You can find your key online."),
            );
        }
    }
    if body["model"].as_str() != Some(s.model.as_str()) {
        return error(404, format!("The model {} does not exist", body["model"]));
    }
    let streaming = body["stream"] == json!(true);
    if s.stream_only.load(Ordering::SeqCst) && !streaming {
        return error(
            400,
            "This server only streams: set \"stream\": true in the request.".into(),
        );
    }
    let usage_chunk = body["stream_options"]["include_usage"] == json!(true);
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    if let Err(e) = check_transcript(&messages) {
        return error(400, format!("Invalid transcript: {e}"));
    }
    let images = messages
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .any(|p| p["type"] == "image_url");
    if images && !*s.vision.lock().unwrap() {
        return error(
            400,
            "fake-model is not a multimodal model: image input is not supported".into(),
        );
    }
    let window = *s.window.lock().unwrap();
    if let Some(window) = window {
        let room = body["max_completion_tokens"]
            .as_u64()
            .or(body["max_tokens"].as_u64())
            .unwrap_or(0);
        if tokens + room > window {
            let message = format!(
                "This model's maximum context length is {window} tokens. However, you requested \
                 {} tokens ({tokens} in the messages, {room} in the completion). Please reduce \
                 the length of the messages or completion.",
                tokens + room
            );
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": {"message": message, "type": "invalid_request_error",
                                            "param": "messages", "code": "context_length_exceeded"}})),
            )
                .into_response();
        }
    }

    let responder = s.responder.lock().unwrap().clone();
    let mut reply = match responder {
        Some(f) => f(&body),
        None => match s.script.lock().unwrap().pop_front() {
            Some(r) => r,
            None => return error(400, "fake: no scripted reply left".into()),
        },
    };
    // An error status, or a server that ignores `stream` and answers one JSON body.
    if streaming && !matches!(reply, Reply::Status(..) | Reply::Raw(_)) {
        return stream(s.clone(), reply, usage_chunk.then_some(tokens), _guard);
    }
    loop {
        reply = match reply {
            Reply::Delay(d, inner) => {
                tokio::time::sleep(d).await;
                *inner
            }
            Reply::Hang(inner) => {
                s.release.notified().await;
                *inner
            }
            other => return answer(&other, tokens),
        };
    }
}

/// The chunks of a streamed answer, as `data:` payloads.
/// The chunks of a streamed answer; `usage`: the prompt's tokens, when the request asked for a
/// usage chunk.
fn chunks(reply: &Reply, usage: Option<u64>) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        .to_string()
    };
    let pieces = |t: &str| -> Vec<String> {
        let chars: Vec<char> = t.chars().collect();
        let size = chars.len().div_ceil(3).max(1);
        chars.chunks(size).map(|c| c.iter().collect()).collect()
    };
    let mut out = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    let finish = match reply {
        Reply::Text(t) => {
            for p in pieces(t) {
                out.push(chunk(json!({"content": p}), Value::Null));
            }
            "stop"
        }
        Reply::Calls { text, calls } => {
            if let Some(t) = text {
                out.push(chunk(json!({"content": t}), Value::Null));
            }
            for (i, (id, name, args)) in calls.iter().enumerate() {
                out.push(chunk(
                    json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                                           "function": {"name": name, "arguments": ""}}]}),
                    Value::Null,
                ));
                for p in pieces(args) {
                    out.push(chunk(
                        json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]}),
                        Value::Null,
                    ));
                }
            }
            "tool_calls"
        }
        other => panic!("fake: {other:?} cannot be streamed"),
    };
    out.push(chunk(json!({}), json!(finish)));
    if let Some(tokens) = usage {
        out.push(
            json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "choices": [],
                   "usage": {"prompt_tokens": tokens, "completion_tokens": 1,
                             "total_tokens": tokens + 1}})
            .to_string(),
        );
    }
    out.push("[DONE]".to_owned());
    out
}

/// Answers with server-sent events: each chunk as it is ready, the request counted in flight
/// until the stream ends or the client drops it.
fn stream(s: Arc<Shared>, reply: Reply, usage: Option<u64>, guard: InFlight) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<String, std::convert::Infallible>>(4);
    tokio::spawn(async move {
        let _guard = guard;
        let mut reply = reply;
        let mut pause = None;
        let mut broken = false;
        let mut hang = false;
        loop {
            match reply {
                Reply::Delay(d, inner) => {
                    tokio::time::sleep(d).await;
                    reply = *inner;
                }
                Reply::Hang(inner) => {
                    hang = true;
                    reply = *inner;
                }
                Reply::Broken(inner) => {
                    broken = true;
                    reply = *inner;
                }
                Reply::Trickle(d, inner) => {
                    pause = Some(d);
                    reply = *inner;
                }
                other => {
                    reply = other;
                    break;
                }
            }
        }
        let all = chunks(&reply, usage);
        let n = all.len();
        for (i, data) in all.into_iter().enumerate() {
            if broken && i == n / 2 {
                return;
            }
            if i == 1 && hang {
                // The answer has begun; the rest waits for `release` (or the client to leave).
                tokio::select! {
                    () = s.release.notified() => {}
                    () = tx.closed() => return,
                }
            }
            if let Some(d) = pause {
                tokio::time::sleep(d).await;
            }
            if tx.send(Ok(format!("data: {data}\n\n"))).await.is_err() {
                return;
            }
        }
    });
    let body =
        axum::body::Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    (
        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
        body,
    )
        .into_response()
}
