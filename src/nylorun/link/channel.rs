//! The Harness API channel: one WebSocket to core, framed as v5 §1 says.
//!
//! Owns: the connection (upgrade headers, frame size caps), a reader task and a writer task, the
//! pending map of podhost's own requests (id → answer), and the requests core sends, each served
//! in its own tracked task under a child cancellation token.
//!
//! Invariants:
//! * Request ids are per sender and start at 1 on every connection.
//! * A caller that drops its request before the answer sends core an `abort` frame for its id.
//! * Core's `abort` cancels the handler of that request, and no answer is sent for it.
//! * A malformed `req` that has an id gets an `invalid` answer and the connection stays up; an
//!   unknown method gets `invalid` "Unknown request \<m>"; a malformed `msg` is dropped; any other
//!   malformed frame closes the connection (1002), and a binary or non-JSON message closes it with
//!   1007 (v2 notes §1.1–1.2).
//! * A connection silent for the silence timeout (no message, ping or pong) is dropped. On loss
//!   every pending request fails `unavailable` and every handler is cancelled.
//! * Nothing larger than [`MAX_PAYLOAD`] is sent: an answer that would be is replaced by a
//!   `limit_exceeded` error.
//! * Core's answers are parsed leniently ([`parse_answer`]): unknown fields are ignored and
//!   logged once; frames and the requests core sends stay strict.
//!
//! Non-goals: opening the socket (`connect`), what requests mean (`lease`, `workspace`),
//! reconnecting (`pod`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::nylorun::link::protocol::{ErrorCode, Frame, MAX_PAYLOAD};

/// Frames queued for the writer; senders wait when it is full.
const OUTBOX: usize = 256;
/// How long an aborted handler may take to end after its token is cancelled.
const HANDLER_WIND_DOWN: Duration = Duration::from_secs(2);

pub use crate::nylorun::link::connect::{ChannelConfig, ConnectError, WsStream, connect};

/// An error answer: `{code, message}`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct RemoteError {
    pub code: ErrorCode,
    pub message: String,
}

impl RemoteError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RemoteError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        RemoteError::new(ErrorCode::Invalid, message)
    }
}

/// Why one of podhost's own requests got no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("core answered {method} with {code}: {message}")]
    Remote {
        method: String,
        code: ErrorCode,
        message: String,
    },
    #[error("the Harness API connection closed: {reason}")]
    Closed { reason: String },
    #[error("{method} is {bytes} bytes as JSON, past the {limit}-byte frame limit")]
    TooLarge {
        method: String,
        bytes: usize,
        limit: usize,
    },
    #[error("core's answer to {method} does not match its schema: {message}")]
    BadAnswer { method: String, message: String },
}

impl CallError {
    /// The wire code this error stands for (`unavailable` when the connection closed).
    pub fn code(&self) -> ErrorCode {
        match self {
            CallError::Remote { code, .. } => *code,
            CallError::Closed { .. } => ErrorCode::Unavailable,
            CallError::TooLarge { .. } => ErrorCode::LimitExceeded,
            CallError::BadAnswer { .. } => ErrorCode::Invalid,
        }
    }
}

/// What serves the requests and messages core sends.
pub trait Incoming: Send + Sync + 'static {
    /// Starts serving `method`, or `None` when this harness has no such request. The future is
    /// dropped if core aborts the request or the connection closes; `cancel` fires first.
    fn request(
        &self,
        method: &str,
        params: Value,
        cancel: CancellationToken,
    ) -> Option<BoxFuture<'static, Result<Value, RemoteError>>>;

    /// A one-way message (`cancel`).
    fn message(&self, method: &str, params: Value);
}

struct Pending {
    map: HashMap<u64, oneshot::Sender<Result<Value, CallError>>>,
    /// Set once the connection is gone: no request can be added after.
    closed: Option<String>,
}

struct Shared {
    out: mpsc::Sender<Message>,
    pending: Mutex<Pending>,
    /// Core's requests in flight, by core's id.
    serving: Mutex<HashMap<u64, CancellationToken>>,
    next_id: AtomicU64,
    /// The connection's token: cancelled when it is gone.
    cancel: CancellationToken,
    /// Cancelled when the writer has stopped.
    writer_done: CancellationToken,
    tracker: TaskTracker,
}

impl Shared {
    /// Ends the connection: no new request, every pending one fails `unavailable`.
    fn end(&self, reason: &str) {
        let senders: Vec<_> = {
            let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            if p.closed.is_none() {
                p.closed = Some(reason.to_owned());
            }
            p.map.drain().map(|(_, tx)| tx).collect()
        };
        for tx in senders {
            let _ = tx.send(Err(CallError::Closed {
                reason: reason.to_owned(),
            }));
        }
        self.cancel.cancel();
    }

    fn close_reason(&self) -> Option<String> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .closed
            .clone()
    }

    async fn send_frame(&self, frame: &Frame) {
        match serde_json::to_string(frame) {
            Ok(text) => {
                let _ = self.out.send(Message::text(text)).await;
            }
            Err(e) => tracing::error!(error = %e, "could not encode a frame"),
        }
    }

    /// Sends `abort` for request `id` without waiting (used from `Drop`).
    fn send_abort_now(self: &Arc<Self>, id: u64) {
        let Ok(text) = serde_json::to_string(&Frame::Abort { id }) else {
            return;
        };
        match self.out.try_send(Message::text(text)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(msg)) => {
                if tokio::runtime::Handle::try_current().is_ok() {
                    let out = self.out.clone();
                    self.tracker.spawn(async move {
                        let _ = out.send(msg).await;
                    });
                }
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
}

/// A handle on one connection. Cheap to clone.
#[derive(Clone)]
pub struct Channel {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("closed", &self.shared.close_reason())
            .finish()
    }
}

impl Channel {
    /// Starts the reader and writer of `ws`. The connection's token is a child of `parent`.
    pub fn start(
        ws: WsStream,
        incoming: Arc<dyn Incoming>,
        cfg: &ChannelConfig,
        parent: &CancellationToken,
    ) -> Channel {
        let (sink, stream) = ws.split();
        let (out, rx) = mpsc::channel(OUTBOX);
        let shared = Arc::new(Shared {
            out,
            pending: Mutex::new(Pending {
                map: HashMap::new(),
                closed: None,
            }),
            serving: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            cancel: parent.child_token(),
            writer_done: CancellationToken::new(),
            tracker: TaskTracker::new(),
        });
        shared.tracker.spawn(writer(
            sink,
            rx,
            shared.cancel.clone(),
            shared.writer_done.clone(),
            cfg.write_timeout,
        ));
        shared.tracker.spawn(reader(
            stream,
            shared.clone(),
            incoming,
            cfg.silence_timeout,
        ));
        Channel { shared }
    }

    /// The connection's token: cancelled when it is gone. Runs and handlers hang off it.
    pub fn token(&self) -> &CancellationToken {
        &self.shared.cancel
    }

    /// Why the connection ended, once it has.
    pub fn close_reason(&self) -> Option<String> {
        self.shared.close_reason()
    }

    /// Waits until the connection is gone.
    pub async fn closed(&self) {
        self.shared.cancel.cancelled().await;
    }

    /// Sends request `method` and returns the call, whose answer can be awaited or aborted.
    pub async fn call(&self, method: &str, params: Value) -> Result<Call, CallError> {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame::Req {
            id,
            m: method.to_owned(),
            p: params,
        };
        let text = serde_json::to_string(&frame).map_err(|e| CallError::BadAnswer {
            method: method.to_owned(),
            message: format!("could not encode the request: {e}"),
        })?;
        if text.len() > MAX_PAYLOAD {
            return Err(CallError::TooLarge {
                method: method.to_owned(),
                bytes: text.len(),
                limit: MAX_PAYLOAD,
            });
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self
                .shared
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(reason) = &p.closed {
                return Err(CallError::Closed {
                    reason: reason.clone(),
                });
            }
            p.map.insert(id, tx);
        }
        let call = Call {
            id,
            method: method.to_owned(),
            rx,
            shared: self.shared.clone(),
            finished: false,
            aborted: false,
        };
        if self.shared.out.send(Message::text(text)).await.is_err() {
            return Err(CallError::Closed {
                reason: self
                    .close_reason()
                    .unwrap_or_else(|| "the writer stopped".to_owned()),
            });
        }
        Ok(call)
    }

    /// Sends `method` and waits for its typed answer.
    pub async fn request<P: Serialize, R: DeserializeOwned + Serialize>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<R, CallError> {
        let params = serde_json::to_value(params).map_err(|e| CallError::BadAnswer {
            method: method.to_owned(),
            message: format!("could not encode the params: {e}"),
        })?;
        let mut call = self.call(method, params).await?;
        let value = call.response().await?;
        parse_answer(method, value)
    }

    /// Closes the connection: `code` and `reason` go out after every frame already queued; then
    /// the connection ends. Waits at most `wait` for the writer.
    pub async fn close(&self, code: u16, reason: &str, wait: Duration) {
        let frame = Message::Close(Some(CloseFrame {
            code: CloseCode::from(code),
            reason: trim_reason(reason).into(),
        }));
        let _ = tokio::time::timeout(wait, async {
            if self.shared.out.send(frame).await.is_ok() {
                self.shared.writer_done.cancelled().await;
            }
        })
        .await;
        self.shared.end("closed by podhost");
    }

    /// Waits for the reader, the writer and every handler to finish (after the connection is
    /// gone), at most `wait`.
    pub async fn wait(&self, wait: Duration) -> bool {
        self.shared.tracker.close();
        tokio::time::timeout(wait, self.shared.tracker.wait())
            .await
            .is_ok()
    }
}

/// Parses core's answer into the method's type. Fields podhost does not know are accepted and
/// ignored — v5 is frozen, so this is defence: a core that adds a field must not stop every
/// lease or artifact operation — and each one is logged once per process (by method and path).
/// What podhost sends stays strict where the spec is.
pub fn parse_answer<R: DeserializeOwned + Serialize>(
    method: &str,
    value: Value,
) -> Result<R, CallError> {
    let parsed = R::deserialize(&value).map_err(|e| CallError::BadAnswer {
        method: method.to_owned(),
        message: e.to_string(),
    })?;
    if let Ok(known) = serde_json::to_value(&parsed) {
        for path in unknown_fields(&value, &known) {
            note_unknown_field("core", method, &path);
        }
    }
    Ok(parsed)
}

/// The paths of fields in `got` that the typed value `known` (parsed from `got` and serialized
/// back) does not carry: the fields the type ignored. A `null` is taken as an absent optional.
pub fn unknown_fields(got: &Value, known: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_unknown(got, known, "", &mut out);
    out
}

fn collect_unknown(got: &Value, known: &Value, at: &str, out: &mut Vec<String>) {
    match (got, known) {
        (Value::Object(g), Value::Object(k)) => {
            for (name, v) in g {
                let path = if at.is_empty() {
                    name.clone()
                } else {
                    format!("{at}.{name}")
                };
                match k.get(name) {
                    Some(kv) => collect_unknown(v, kv, &path, out),
                    None if v.is_null() => {}
                    None => out.push(path),
                }
            }
        }
        (Value::Array(g), Value::Array(k)) => {
            for (v, kv) in g.iter().zip(k) {
                collect_unknown(v, kv, &format!("{at}[]"), out);
            }
        }
        _ => {}
    }
}

/// Logs, once per process, that `peer`'s answer to `method` carries a field podhost ignores.
pub fn note_unknown_field(peer: &str, method: &str, path: &str) {
    if first_sighting(method, path) {
        tracing::warn!(%peer, %method, field = %path, "an answer carries a field podhost does not know; ignored");
    }
}

/// The unknown fields already logged: at most this many are remembered.
const UNKNOWN_FIELDS_KEPT: usize = 1024;

/// True the first time `method`'s `path` is seen (and while fewer than
/// [`UNKNOWN_FIELDS_KEPT`] are remembered, so a hostile peer cannot grow the set).
fn first_sighting(method: &str, path: &str) -> bool {
    static SEEN: std::sync::OnceLock<Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let key = format!("{method} {path}");
    if seen.contains(&key) || seen.len() >= UNKNOWN_FIELDS_KEPT {
        return false;
    }
    seen.insert(key)
}

/// One of podhost's requests in flight. Dropping it before its answer sends core `abort`.
pub struct Call {
    id: u64,
    method: String,
    rx: oneshot::Receiver<Result<Value, CallError>>,
    shared: Arc<Shared>,
    finished: bool,
    aborted: bool,
}

impl Call {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The answer (cancel-safe: it may be awaited again after a `select!` dropped it).
    pub async fn response(&mut self) -> Result<Value, CallError> {
        let result = match (&mut self.rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(CallError::Remote { code, message, .. })) => Err(CallError::Remote {
                method: self.method.clone(),
                code,
                message,
            }),
            Ok(Err(CallError::BadAnswer { message, .. })) => Err(CallError::BadAnswer {
                method: self.method.clone(),
                message,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(CallError::Closed {
                reason: self
                    .shared
                    .close_reason()
                    .unwrap_or_else(|| "the reader stopped".to_owned()),
            }),
        };
        self.finished = true;
        result
    }

    /// Tells core podhost no longer wants the answer, but keeps listening for one that was
    /// already on its way (a lease granted just before the abort must still be given back).
    pub async fn abort(&mut self) {
        if self.aborted || self.finished {
            return;
        }
        self.aborted = true;
        self.shared.send_frame(&Frame::Abort { id: self.id }).await;
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.shared
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .map
            .remove(&self.id);
        if !self.aborted && self.shared.close_reason().is_none() {
            self.shared.send_abort_now(self.id);
        }
    }
}

/// Close reasons are kept to 120 bytes (v2 notes §1.1), cut on a character boundary.
fn trim_reason(reason: &str) -> String {
    let mut end = reason.len().min(120);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason[..end].to_owned()
}

async fn writer(
    mut sink: futures_util::stream::SplitSink<WsStream, Message>,
    mut rx: mpsc::Receiver<Message>,
    cancel: CancellationToken,
    done: CancellationToken,
    write_timeout: Duration,
) {
    loop {
        let msg = tokio::select! {
            biased;
            m = rx.recv() => m,
            _ = cancel.cancelled() => None,
        };
        let Some(msg) = msg else { break };
        let is_close = matches!(msg, Message::Close(_));
        match tokio::time::timeout(write_timeout, sink.send(msg)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "the Harness API writer stopped");
                break;
            }
            Err(_) => {
                tracing::warn!(
                    ?write_timeout,
                    "a frame could not be written in time; dropping the connection"
                );
                break;
            }
        }
        if is_close {
            break;
        }
    }
    done.cancel();
    cancel.cancel();
}

async fn reader(
    mut stream: futures_util::stream::SplitStream<WsStream>,
    shared: Arc<Shared>,
    incoming: Arc<dyn Incoming>,
    silence: Duration,
) {
    let mut last_heard = Instant::now();
    let reason = loop {
        let msg = tokio::select! {
            _ = shared.cancel.cancelled() => break "closed by podhost".to_owned(),
            _ = tokio::time::sleep_until(last_heard + silence) => {
                tracing::warn!(?silence, "core was silent; dropping the connection");
                break format!("core was silent for {silence:?}");
            }
            m = stream.next() => m,
        };
        last_heard = Instant::now();
        match msg {
            None => break "core closed the connection".to_owned(),
            Some(Err(e)) => break format!("read error: {e}"),
            Some(Ok(Message::Text(text))) => {
                if let Err((code, why)) = on_text(&shared, &incoming, text.as_str()).await {
                    tracing::warn!(code, reason = %why, "closing the Harness API connection");
                    let close = Message::Close(Some(CloseFrame {
                        code: CloseCode::from(code),
                        reason: trim_reason(&why).into(),
                    }));
                    let _ = shared.out.send(close).await;
                    break why;
                }
            }
            Some(Ok(Message::Binary(_))) => {
                let why = "Harness API frames are JSON text";
                tracing::warn!("core sent a binary message; closing with 1007");
                let close = Message::Close(Some(CloseFrame {
                    code: CloseCode::Invalid,
                    reason: why.into(),
                }));
                let _ = shared.out.send(close).await;
                break why.to_owned();
            }
            Some(Ok(Message::Close(frame))) => {
                break match frame {
                    Some(f) => format!(
                        "core closed the connection ({} {})",
                        u16::from(f.code),
                        f.reason
                    ),
                    None => "core closed the connection".to_owned(),
                };
            }
            // Pings are answered by tungstenite; any of these counts as hearing from core.
            Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {}
        }
    };
    tracing::info!(%reason, "the Harness API connection ended");
    shared.end(&reason);
}

/// Handles one text message; `Err((close code, reason))` closes the connection.
async fn on_text(
    shared: &Arc<Shared>,
    incoming: &Arc<dyn Incoming>,
    text: &str,
) -> Result<(), (u16, String)> {
    let value: Value = serde_json::from_str(text)
        .map_err(|_| (1007, "Harness API frames are JSON text".to_owned()))?;
    let frame = serde_json::from_value::<Frame>(value.clone())
        .map_err(|e| e.to_string())
        .and_then(|f| f.check().map(|()| f).map_err(|e| e.to_string()));
    let frame = match frame {
        Ok(f) => f,
        Err(e) => return on_malformed(shared, &value, &e).await,
    };
    match frame {
        Frame::Req { id, m, p } => serve(shared, incoming, id, m, p).await,
        Frame::Res { id, ok, r, e } => {
            let tx = shared
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .map
                .remove(&id);
            let Some(tx) = tx else {
                tracing::debug!(id, "an answer to no pending request; ignored");
                return Ok(());
            };
            let result = match (ok, e) {
                (true, _) => Ok(r.unwrap_or(Value::Null)),
                (false, Some(e)) => Err(CallError::Remote {
                    method: String::new(),
                    code: e.code,
                    message: e.message,
                }),
                (false, None) => Err(CallError::BadAnswer {
                    method: String::new(),
                    message: "a failed answer without e".to_owned(),
                }),
            };
            let _ = tx.send(result);
        }
        Frame::Msg { m, p } => incoming.message(&m, p),
        Frame::Abort { id } => {
            let token = shared
                .serving
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
            match token {
                Some(t) => {
                    tracing::debug!(id, "core aborted its request");
                    t.cancel();
                }
                None => tracing::debug!(id, "abort for no request in flight; ignored"),
            }
        }
        Frame::Ping {} => {}
    }
    Ok(())
}

async fn on_malformed(
    shared: &Arc<Shared>,
    value: &Value,
    error: &str,
) -> Result<(), (u16, String)> {
    let t = value.get("t").and_then(Value::as_str);
    let id = value.get("id").and_then(Value::as_u64).filter(|id| *id > 0);
    match (t, id) {
        (Some("req"), Some(id)) => {
            tracing::warn!(id, %error, "core sent a malformed request");
            shared
                .send_frame(&Frame::err(
                    id,
                    ErrorCode::Invalid,
                    format!("Invalid frame: {error}"),
                ))
                .await;
            Ok(())
        }
        (Some("res"), Some(id)) => {
            let tx = shared
                .pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .map
                .remove(&id);
            tracing::warn!(id, %error, "core sent a malformed answer");
            if let Some(tx) = tx {
                let _ = tx.send(Err(CallError::BadAnswer {
                    method: String::new(),
                    message: format!("malformed answer frame: {error}"),
                }));
            }
            Ok(())
        }
        (Some("msg"), _) => {
            tracing::warn!(%error, "core sent a malformed message; dropped");
            Ok(())
        }
        _ => Err((1002, format!("invalid frame: {error}"))),
    }
}

/// Starts serving core's request `id`.
/// Long: the request's whole life (unknown method, duplicate id, the task, its cancellation
/// and its answer) in one place, as the channel's invariants describe it.
async fn serve(
    shared: &Arc<Shared>,
    incoming: &Arc<dyn Incoming>,
    id: u64,
    method: String,
    params: Value,
) {
    let cancel = shared.cancel.child_token();
    let Some(fut) = incoming.request(&method, params, cancel.clone()) else {
        tracing::warn!(%method, "core sent an unknown request");
        shared
            .send_frame(&Frame::err(
                id,
                ErrorCode::Invalid,
                format!("Unknown request {method}"),
            ))
            .await;
        return;
    };
    let duplicate = {
        let mut serving = shared
            .serving
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match serving.entry(id) {
            std::collections::hash_map::Entry::Occupied(_) => true,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(cancel.clone());
                false
            }
        }
    };
    if duplicate {
        shared
            .send_frame(&Frame::err(
                id,
                ErrorCode::Invalid,
                format!("Request id {id} is already in flight"),
            ))
            .await;
        return;
    }
    let task_shared = shared.clone();
    shared.tracker.spawn(async move {
        tokio::pin!(fut);
        let result = tokio::select! {
            r = &mut fut => Some(r),
            _ = cancel.cancelled() => {
                // Let the handler see its token and end in order (a command is killed and
                // reaped by the exec layer), but bounded: its answer is not wanted any more.
                let _ = tokio::time::timeout(HANDLER_WIND_DOWN, &mut fut).await;
                None
            }
        };
        task_shared
            .serving
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        let Some(result) = result else {
            tracing::debug!(id, %method, "request aborted; no answer sent");
            return;
        };
        let frame = match result {
            Ok(r) => Frame::ok(id, r),
            Err(e) => Frame::err(id, e.code, e.message),
        };
        let frame = match serde_json::to_string(&frame) {
            Ok(text) if text.len() <= MAX_PAYLOAD => Message::text(text),
            Ok(text) => {
                let err = Frame::err(
                    id,
                    ErrorCode::LimitExceeded,
                    format!(
                        "The answer to {method} is {} bytes, past the {MAX_PAYLOAD}-byte frame limit",
                        text.len()
                    ),
                );
                match serde_json::to_string(&err) {
                    Ok(t) => Message::text(t),
                    Err(_) => return,
                }
            }
            Err(e) => {
                tracing::error!(error = %e, %method, "could not encode an answer");
                return;
            }
        };
        let _ = task_shared.out.send(frame).await;
    });
}

/// Serializes params for [`Channel::call`], for callers that hold typed params.
pub fn to_params<P: Serialize>(method: &str, params: &P) -> Result<Value, CallError> {
    serde_json::to_value(params).map_err(|e| CallError::BadAnswer {
        method: method.to_owned(),
        message: format!("could not encode the params: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_reasons_are_cut_on_a_character_boundary() {
        let long = "é".repeat(100);
        let cut = trim_reason(&long);
        assert_eq!(cut.len(), 120);
        assert_eq!(trim_reason("short"), "short");
    }

    #[test]
    fn answers_accept_unknown_fields_and_name_them() {
        use crate::nylorun::link::protocol::RenewAnswer;
        use serde_json::json;
        let got = json!({"ok": true, "token": "t", "later": {"x": 1}, "tokenExpiresAt": null,
                         "also": [1]});
        let answer: RenewAnswer = parse_answer("lease.renew", got.clone()).unwrap();
        assert!(answer.ok);
        let known = serde_json::to_value(&answer).unwrap();
        let mut unknown = unknown_fields(&got, &known);
        unknown.sort();
        assert_eq!(unknown, vec!["also".to_owned(), "later".to_owned()]);
        let nested = json!({"a": [{"b": 1, "c": 2}]});
        let known = json!({"a": [{"b": 1}]});
        assert_eq!(unknown_fields(&nested, &known), vec!["a[].c".to_owned()]);
        // Each is logged once.
        assert!(first_sighting("m-test", "p"));
        assert!(!first_sighting("m-test", "p"));
        // A field podhost uses must still be right.
        assert!(parse_answer::<RenewAnswer>("lease.renew", json!({"ok": "yes"})).is_err());
    }

    #[test]
    fn call_errors_map_to_wire_codes() {
        assert_eq!(
            CallError::Closed { reason: "x".into() }.code(),
            ErrorCode::Unavailable
        );
        assert_eq!(
            CallError::Closed {
                reason: "gone".into()
            }
            .to_string(),
            "the Harness API connection closed: gone"
        );
    }
}
