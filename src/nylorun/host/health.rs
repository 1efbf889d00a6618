//! The pod's loopback health endpoint (v2 notes §6.1): `GET /health` on
//! `127.0.0.1:NYLORUN_HARNESS_HEALTH_PORT` answers `{status: "ok", service: "podhost",
//! connected, confinement}` (the level `exec::confine` reported at start-up), 200 while the
//! Harness API connection is up and 503 otherwise.
//!
//! Non-goals: anything a probe outside the pod can reach (it binds loopback only).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Binds the listener (an error here stops the pod: its probes would fail anyway).
pub async fn bind(port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await
}

/// The routes, for serving and for tests without a socket.
pub fn router(connected: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/health", get(health))
        .with_state(connected)
}

async fn health(State(connected): State<Arc<AtomicBool>>) -> (StatusCode, Json<Value>) {
    let up = connected.load(Ordering::Relaxed);
    let status = if up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({
            "status": "ok",
            "service": "podhost",
            "connected": up,
            "confinement": crate::exec::confine::reported(),
        })),
    )
}

/// Serves until `cancel`.
pub async fn serve(listener: TcpListener, connected: Arc<AtomicBool>, cancel: CancellationToken) {
    let app = router(connected);
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "health endpoint listening");
    }
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
    {
        tracing::error!(error = %e, "the health listener stopped");
    }
}
