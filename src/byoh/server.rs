//! The HTTP side of the BYOH endpoint: axum routes, authentication, body limits, the one mapping
//! from errors to status codes, and request logs.
//!
//! Routes (at the root): `POST /submit`, `GET /get_status`, `GET /collect_output`,
//! `POST /cancel`, and `GET /healthz`, `GET /openapi.yaml`. Every one of them needs
//! `Authorization: Bearer <credential>` when a credential is configured. The kubelet's probes
//! `GET /livez` and `GET /readyz` (up or not, nothing more) and `GET /metrics` (counts only)
//! need none. The session viewer's routes under `/ui/` (see [`super::viewer`]) take the same
//! credential through a sign-in cookie instead, as a browser sends no bearer header. Before any of their handlers (after the credential check), the floor's guard
//! ([`crate::floor::http::guard`]) refuses what a browser page could forge: a foreign `Host`
//! while no credential is set (403), a foreign `Origin` (403), a `POST` that is not
//! `application/json` (415).
//!
//! Invariants:
//! * Status codes are the protocol's: `202` for queued, running and input_required, `200` for
//!   terminal statuses and outputs, `404` only for an invocation never submitted, `409` from
//!   `collect_output` until output exists and from `submit` when busy (without an invocation
//!   id), `400` for bodies that cannot be read or are not JSON, `422` for JSON that is
//!   not the protocol's shape or breaks its rules, `413` past 10 MiB (at once when the
//!   declared length says so, before a byte of the body is read), `401` without the credential,
//!   `403` for a foreign `Host` or `Origin`, `415` for a `POST` that is not JSON,
//!   `503` for new work while the data directory is below its free-space floor or the host
//!   cannot make sandboxes (Oumi retries it), `404` and
//!   `405` for a path or method that is not a route. Every refusal has the same JSON body,
//!   `{"error": {"message": …}}`.
//! * Every body is JSON and under 10 MiB: `collect_output` shrinks the largest contents until
//!   its body fits. A request body is read as it arrives, never allocated from its declared
//!   length, and must arrive within the body timeout and the cap on body bytes held, or the
//!   connection is closed (see [`crate::floor::http::listener`]).
//! * The credential's scheme (`Bearer`) is matched without regard to case, as HTTP says.
//! * Logs name the route, invocation id, status and duration — never a body or a key.
//!
//! Non-goals: what a submission means (see `invocation`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use super::engine::Engine;
use super::invocation::ByohError;
use super::protocol::{
    CancelRequest, ErrorBody, ErrorDetail, MAX_BODY_BYTES, OutputBody, PROTOCOL_VERSION, Status,
    StatusBody, SubmitRequest,
};
use super::store::{InvocationRow, StatusRow, StoreError};
use crate::chat::message::ChatMessage;
use crate::exec::confine::{Guard as StateGuard, state};
use crate::floor::http::{Guard, auth};
use crate::floor::secret::Secret;
use crate::floor::text::truncate_middle;

/// The OpenAPI document of the routes, served at `/openapi.yaml`.
pub const OPENAPI: &str = include_str!("../../openapi.yaml");

#[derive(Clone)]
struct App {
    engine: Engine,
    token: Option<Arc<Secret>>,
    floor: Option<Arc<FreeSpaceFloor>>,
    /// podhost's own state, whose modes are checked at each submission.
    guards: Arc<[StateGuard]>,
}

/// The free space the data directory must keep for new work to be accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FreeSpaceFloor {
    pub dir: PathBuf,
    /// Bytes that must stay free.
    pub bytes: u64,
}

impl FreeSpaceFloor {
    /// `Err(message)` when the directory's file system has less than the floor free (for an
    /// unprivileged writer: `f_bavail`), or cannot be asked.
    pub fn check(&self) -> Result<(), FloorError> {
        let st = nix::sys::statvfs::statvfs(&self.dir).map_err(FloorError::Unreadable)?;
        let free = st.blocks_available().saturating_mul(st.fragment_size());
        if free >= self.bytes {
            return Ok(());
        }
        Err(FloorError::Low {
            free,
            floor: self.bytes,
        })
    }
}

/// Why new work is refused for the data directory's free space; the text is the refusal's.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    #[error("could not read the free space of the data directory: {0}")]
    Unreadable(nix::errno::Errno),
    /// `free` and `floor` in bytes (shown in MiB, rounded down).
    #[error(
        "the data directory has {} MiB free, below the {} MiB podhost keeps free for its \
         store; new work is refused until space is freed",
        .free >> 20,
        .floor >> 20
    )]
    Low { free: u64, floor: u64 },
}

/// The invocation a response concerns, for the request log.
#[derive(Clone)]
struct Tag(String);

/// A refused request: a status code and the message of `{"error": {"message": …}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl From<ByohError> for ApiError {
    fn from(e: ByohError) -> Self {
        let status = match &e {
            ByohError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ByohError::NotFound(_) => StatusCode::NOT_FOUND,
            ByohError::Busy(_) | ByohError::NoOutput(_) => StatusCode::CONFLICT,
            ByohError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status.is_server_error() {
            warn!(error = %e, "request failed");
        }
        ApiError::new(status, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                message: self.message,
            },
        };
        let mut resp = json(self.status, &body);
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

fn json<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            bytes,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A refusal of the floor's guard, in the endpoint's error body.
fn refusal(status: StatusCode, message: String) -> Response {
    ApiError::new(status, message).into_response()
}

/// The router of the endpoint listening on `listen`; `token` is the credential callers must
/// send, if any; `floor`, the free space below which `submit` refuses new invocations.
pub fn router(
    engine: Engine,
    token: Option<String>,
    floor: Option<FreeSpaceFloor>,
    guards: Vec<StateGuard>,
    listen: SocketAddr,
) -> Router {
    let forgeries = Guard::new(listen, token.is_some(), refusal);
    crate::floor::metrics::serving("byoh");
    let token = token.map(|t| Arc::new(Secret::new(t)));
    let viewer = super::viewer::routes(engine.clone(), token.clone(), &forgeries);
    let app = App {
        engine,
        token,
        floor: floor.map(Arc::new),
        guards: guards.into(),
    };
    // The guard stands before every route's handler, the probes' too (inside the credential
    // check); the log covers its refusals.
    let guarded = |route| forgeries.wrap(route);
    Router::new()
        .route("/submit", guarded(post(submit)))
        .route("/get_status", guarded(get(get_status)))
        .route("/collect_output", guarded(get(collect_output)))
        .route("/cancel", guarded(post(cancel)))
        .route("/healthz", guarded(get(healthz)))
        .route("/openapi.yaml", guarded(get(openapi)))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), authenticate))
        .merge(open_routes(&forgeries))
        .merge(viewer)
        .layer(middleware::from_fn(log_request))
        .with_state(app)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("there is no route {}", req.uri().path()),
    )
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not accept {}", req.uri().path(), req.method()),
    )
}

async fn authenticate(State(app): State<App>, req: Request, next: Next) -> Response {
    let Some(token) = &app.token else {
        return next.run(req).await;
    };
    match auth::check(req.headers(), token) {
        Ok(()) => next.run(req).await,
        Err(why) => ApiError::new(StatusCode::UNAUTHORIZED, why.message()).into_response(),
    }
}

/// The routes a kubelet probes and Prometheus scrapes every few seconds: their answers are
/// logged at DEBUG when they succeed (at INFO they would fill the log with the same line);
/// every other request, and a probe that fails, at INFO.
const POLLED_ROUTES: [&str; 4] = ["/healthz", "/livez", "/readyz", "/metrics"];

async fn log_request(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let resp = next.run(req).await;
    let invocation_id = resp
        .extensions()
        .get::<Tag>()
        .map(|t| t.0.as_str())
        .unwrap_or("");
    let status = resp.status().as_u16();
    let duration_us = started.elapsed().as_micros() as u64;
    macro_rules! request {
        ($level:ident) => {
            tracing::$level!(
                method = %method,
                path,
                invocation_id,
                status,
                duration_us,
                "request"
            )
        };
    }
    if resp.status().is_success() && POLLED_ROUTES.contains(&path.as_str()) {
        request!(debug);
    } else {
        request!(info);
    }
    resp
}

fn tagged(mut resp: Response, id: &str) -> Response {
    resp.extensions_mut().insert(Tag(id.to_owned()));
    resp
}

/// Reads a request body of at most 10 MiB as it arrives. A declared length past the limit is
/// refused before a byte is read; memory grows with what has arrived, never with what was
/// declared. (The listener closes the connection of a body that does not arrive within the
/// body timeout, or would pass the cap on body bytes held.)
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {MAX_BODY_BYTES} bytes (10 MiB)"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return Err(too_large());
    }
    let mut stream = body.into_data_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("could not read the body: {e}"),
            )
        })?;
        if buf.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// Parses a JSON body: not JSON → 400; JSON of the wrong shape → 422.
fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        use serde_json::error::Category;
        let status = match e.classify() {
            Category::Data => StatusCode::UNPROCESSABLE_ENTITY,
            _ => StatusCode::BAD_REQUEST,
        };
        let what = if status == StatusCode::BAD_REQUEST {
            "the body is not valid JSON"
        } else {
            "the body does not match the protocol"
        };
        ApiError::new(status, format!("{what}: {e}"))
    })
}

fn status_body(invocation_id: &str, row: &StatusRow) -> StatusBody {
    StatusBody {
        protocol_version: PROTOCOL_VERSION.to_owned(),
        session_id: row.session_id.clone(),
        invocation_id: invocation_id.to_owned(),
        status: row.status,
        error: (row.status == Status::Failed).then(|| ErrorDetail {
            message: row
                .error
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| "the turn failed".to_owned()),
        }),
    }
}

/// `202` while the turn is in progress, `200` once terminal.
fn status_response(row: &InvocationRow) -> Response {
    let code = if row.status.is_terminal() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let body = status_body(&row.invocation_id, &row.status_row());
    tagged(json(code, &body), &row.invocation_id)
}

async fn submit(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&headers, body).await?;
        let req: SubmitRequest = parse(&bytes)?;
        req.validate()
            .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.0))?;
        if let Some(floor) = &app.floor
            && let Err(message) = floor.check()
        {
            refuse_new(&app, &req.invocation_id, message.to_string()).await?;
        }
        if let Some(fault) = app.engine.inner.sandboxes.fault() {
            let message = format!(
                "this host cannot make sandboxes for sessions right now ({fault}); retry later"
            );
            refuse_new(&app, &req.invocation_id, message).await?;
        }
        let guards = app.guards.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || state::check(&guards)).await {
            warn!(error = %e, "refusing a submission: podhost's state is exposed");
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("podhost's state is not safe: {e}"),
            ));
        }
        let action = req.session_action;
        let row = app.engine.submit(req).await?;
        info!(invocation_id = %row.invocation_id, ?action, status = %row.status, "submit");
        Ok::<_, ApiError>(status_response(&row))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// `503` (which Oumi retries) for a new invocation while the host cannot take new work (the
/// data directory below its free-space floor, or no sandbox can be made); a known invocation (a
/// retried submit) still gets its status.
async fn refuse_new(app: &App, invocation_id: &str, message: String) -> Result<(), ApiError> {
    if app.engine.status(invocation_id).await.is_ok() {
        return Ok(());
    }
    warn!(%message, "refusing a submission");
    Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message))
}

async fn cancel(State(app): State<App>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let bytes = read_body(&headers, body).await?;
        let req: CancelRequest = parse(&bytes)?;
        req.validate()
            .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.0))?;
        let row = app.engine.cancel(req).await?;
        // Cancel answers 200 whatever the status (the protocol's rule for this route).
        Ok::<_, ApiError>(tagged(
            json(
                StatusCode::OK,
                &status_body(&row.invocation_id, &row.status_row()),
            ),
            &row.invocation_id,
        ))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Deserialize)]
struct IdQuery {
    invocation_id: String,
}

fn query_id(q: Result<Query<IdQuery>, QueryRejection>) -> Result<String, ApiError> {
    q.map(|Query(q)| q.invocation_id).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the invocation_id query parameter is required: {e}"),
        )
    })
}

async fn get_status(
    State(app): State<App>,
    q: Result<Query<IdQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = query_id(q)?;
    let resp = match app.engine.status(&id).await {
        // get_status answers 200 for every status (the protocol's rule for this route).
        Ok(row) => json(StatusCode::OK, &status_body(&id, &row)),
        Err(e) => ApiError::from(e).into_response(),
    };
    Ok(tagged(resp, &id))
}

async fn collect_output(
    State(app): State<App>,
    q: Result<Query<IdQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let id = query_id(q)?;
    let (row, messages) = match app.engine.collect(&id).await {
        Ok(r) => r,
        Err(e) => return Ok(tagged(ApiError::from(e).into_response(), &id)),
    };
    let mut body = OutputBody {
        protocol_version: PROTOCOL_VERSION.to_owned(),
        session_id: row.session_id,
        invocation_id: row.invocation_id,
        status: row.status,
        messages,
    };
    fit(&mut body, MAX_BODY_BYTES - 1024);
    Ok(tagged(json(StatusCode::OK, &body), &id))
}

/// How long a probe waits for the store's write lock (a kubelet probe's own timeout is 1 s).
const STORE_PROBE_WAIT: Duration = Duration::from_millis(500);

/// The routes without authentication, added after the credential check so it does not cover
/// them: the kubelet's probes (`/livez`, `/readyz`), which say nothing but up or not, and
/// `/metrics`, which holds counts only (no id, no body, no key).
fn open_routes(forgeries: &Guard) -> Router<App> {
    Router::new()
        .route("/livez", forgeries.wrap(get(livez)))
        .route("/readyz", forgeries.wrap(get(readyz)))
        .route("/metrics", forgeries.wrap(get(metrics_text)))
}

/// `GET /metrics`: every metric of the process, in the text format `Accept` asks for.
async fn metrics_text(headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (ctype, text) = crate::floor::metrics::answer(accept);
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(ctype))],
        text,
    )
        .into_response()
}

/// `GET /livez`: the process serves HTTP.
async fn livez() -> Response {
    json(StatusCode::OK, &serde_json::json!({"status": "ok"}))
}

/// `GET /readyz`: 200 while the store takes writes, 503 when it does not.
async fn readyz(State(app): State<App>) -> Response {
    match store_health(&app).await {
        Ok(()) => json(StatusCode::OK, &serde_json::json!({"status": "ok"})),
        Err(_) => json(
            StatusCode::SERVICE_UNAVAILABLE,
            &serde_json::json!({"status": "unavailable"}),
        ),
    }
}

/// Why the store would not take a write (`/healthz`'s `store.error`).
#[derive(Debug, thiserror::Error)]
enum Unhealthy {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The check did not end within this wait.
    #[error("no answer within {0:?}")]
    Silent(Duration),
}

/// Whether the store takes a write, within the probe's wait.
async fn store_health(app: &App) -> Result<(), Unhealthy> {
    let check = app.engine.inner.store.check_writable(STORE_PROBE_WAIT);
    match tokio::time::timeout(STORE_PROBE_WAIT * 2, check).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Unhealthy::Silent(STORE_PROBE_WAIT * 2)),
    }
}

async fn healthz(State(app): State<App>) -> Response {
    let store = match store_health(&app).await {
        Ok(()) => serde_json::json!({"writable": true}),
        Err(error) => serde_json::json!({"writable": false, "error": error.to_string()}),
    };
    let writable = store["writable"] == true;
    let fault = app.engine.inner.sandboxes.fault();
    let sandboxes = match &fault {
        None => serde_json::json!({"ok": true}),
        Some(error) => serde_json::json!({"ok": false, "error": error}),
    };
    let mut body = serde_json::json!({
        "status": if writable && fault.is_none() { "ok" } else { "degraded" },
        "sandboxes": sandboxes,
        "protocol_version": PROTOCOL_VERSION,
        "version": env!("CARGO_PKG_VERSION"),
        "revision": env!("BUILD_GIT_REVISION"),
        "running": app.engine.running(),
        "store": store,
        "confinement": crate::exec::confine::reported(),
    });
    if let Some(t) = &app.engine.inner.config.template {
        body["workspace_template"] = serde_json::json!({"path": t.dir, "level": t.level.name()});
    }
    // 200 either way: these are the details; `/readyz` is the probe that says 503.
    json(StatusCode::OK, &body)
}

async fn openapi() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/yaml"),
        )],
        OPENAPI,
    )
        .into_response()
}

/// Shrinks the largest contents and arguments of `body`, middle-truncated with a marker, until
/// its JSON is at most `limit` bytes. The cut is level: every text longer than a cap is cut to
/// it, and the cap is the highest one that fits, so big texts share the loss and small ones keep
/// theirs. A few passes at most (escapes and markers make the first estimate inexact).
pub fn fit(body: &mut OutputBody, limit: usize) {
    /// Room for a marker and the rounding of a cut, per text.
    const SLACK: usize = 96;
    for _ in 0..16 {
        let size = serde_json::to_vec(body).map(|v| v.len()).unwrap_or(0);
        if size <= limit {
            return;
        }
        let mut texts = texts(&mut body.messages);
        let lens: Vec<usize> = texts.iter().map(|t| encoded_len(t)).collect();
        let fixed = size - lens.iter().sum::<usize>();
        let Some(cap) = level(&lens, limit.saturating_sub(fixed), SLACK) else {
            return;
        };
        for (t, len) in texts.iter_mut().zip(&lens) {
            if *len > cap {
                let chars = t.chars().count();
                let keep = (chars as f64 * cap.saturating_sub(SLACK) as f64 / *len as f64) as usize;
                **t = truncate_middle(t, keep.min(chars.saturating_sub(1))).0;
            }
        }
    }
}

/// The largest cap such that the texts, each cut to at most `cap` (plus `slack` when cut), fit
/// in `budget`; `None` when even empty texts would not fit.
fn level(lens: &[usize], budget: usize, slack: usize) -> Option<usize> {
    let mut sorted = lens.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    // With the `k` largest cut to `cap`: total = k * (cap + slack) + sum(rest) <= budget.
    let mut rest: usize = sorted.iter().sum();
    for k in 1..=sorted.len() {
        rest -= sorted[k - 1];
        let Some(avail) = budget.checked_sub(rest) else {
            continue;
        };
        let cap = (avail / k).saturating_sub(slack);
        let next = sorted.get(k).copied().unwrap_or(0);
        if cap >= next {
            return Some(cap);
        }
    }
    None
}

fn encoded_len(s: &str) -> usize {
    serde_json::to_string(s).map_or(s.len(), |e| e.len())
}

/// Every content and arguments string of the messages.
fn texts(messages: &mut [ChatMessage]) -> Vec<&mut String> {
    let mut out = Vec::new();
    for m in messages.iter_mut() {
        let ChatMessage {
            content,
            tool_calls,
            ..
        } = m;
        out.extend(content.iter_mut());
        out.extend(
            tool_calls
                .iter_mut()
                .flatten()
                .map(|c| &mut c.function.arguments),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::message::ToolCall;

    #[test]
    fn outputs_are_shrunk_until_they_fit() {
        let big = "x".repeat(600_000);
        let mut body = OutputBody {
            protocol_version: "1".into(),
            session_id: "s".into(),
            invocation_id: "i".into(),
            status: Status::Completed,
            messages: vec![
                ChatMessage::assistant(big.clone(), vec![ToolCall::new("a", "write", big.clone())]),
                ChatMessage::tool("a", "\"".repeat(400_000)),
                ChatMessage::assistant("done".into(), vec![]),
            ],
        };
        fit(&mut body, 1_000_000);
        let size = serde_json::to_vec(&body).unwrap().len();
        assert!(size <= 1_000_000, "{size}");
        assert!(size > 900_000, "cut too much: {size}");
        assert!(
            body.messages[1]
                .content
                .as_ref()
                .unwrap()
                .contains("characters omitted")
        );
        assert_eq!(body.messages[2].content.as_deref(), Some("done"));
    }

    #[test]
    fn the_level_cuts_the_largest_first() {
        assert_eq!(level(&[100, 10, 10], 60, 0), Some(40));
        assert_eq!(level(&[100, 90, 10], 60, 0), Some(25));
        assert_eq!(level(&[100, 90, 10], 5, 0), Some(1));
    }
}
