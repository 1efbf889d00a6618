//! The pod's loopback health endpoint (v2 notes §6.1): `GET /health` on
//! `127.0.0.1:NYLORUN_HARNESS_HEALTH_PORT` answers `{status, service: "podhost", connected,
//! confinement, version, revision}` — 200 with `status: "ok"` while the Harness API connection
//! is up, 503 with `status: "disconnected"` otherwise — and `GET /metrics` answers the
//! process's metrics ([`crate::floor::metrics`]). `PODHOST_METRICS_LISTEN` adds a listener
//! serving `/metrics` alone, on an address a scraper outside the pod can reach.
//!
//! Non-goals: health outside the pod (the health port binds loopback only; the metrics
//! listener serves nothing but counts).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::floor::metrics;

/// Binds the listener (an error here stops the pod: its probes would fail anyway).
pub async fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await
}

/// Binds the metrics listener at `addr` (`host:port`, resolved here).
pub async fn bind_metrics(addr: &str) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// The routes, for serving and for tests without a socket.
pub fn router(connected: Arc<AtomicBool>) -> Router {
    metrics::serving("pod");
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .with_state(connected)
}

/// The metrics listener's one route.
pub fn metrics_router() -> Router {
    metrics::serving("pod");
    Router::new().route("/metrics", get(metrics_text))
}

async fn health(State(connected): State<Arc<AtomicBool>>) -> (StatusCode, Json<Value>) {
    let up = connected.load(Ordering::Relaxed);
    let (code, status) = if up {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "disconnected")
    };
    (
        code,
        Json(json!({
            "status": status,
            "service": "podhost",
            "connected": up,
            "confinement": crate::exec::confine::reported(),
            "version": env!("CARGO_PKG_VERSION"),
            "revision": env!("BUILD_GIT_REVISION"),
        })),
    )
}

/// `GET /metrics`: every metric of the process, in the text format `Accept` asks for.
pub async fn metrics_text(headers: HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (ctype, text) = metrics::answer(accept);
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(ctype))],
        text,
    )
        .into_response()
}

/// Serves the health routes until `cancel`.
pub async fn serve(listener: TcpListener, connected: Arc<AtomicBool>, cancel: CancellationToken) {
    serve_router(listener, router(connected), "health endpoint", cancel).await;
}

/// Serves `app` on `listener` until `cancel`; `what` names it in the logs.
pub async fn serve_router(
    listener: TcpListener,
    app: Router,
    what: &'static str,
    cancel: CancellationToken,
) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "{what} listening");
    }
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
    {
        tracing::error!(error = %e, "the {what} listener stopped");
    }
}
