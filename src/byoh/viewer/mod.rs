//! The read-only session viewer of `podhost serve`, at `/ui/`: the list of sessions and each
//! session's conversation, drawn on the server from the store, with a little plain JavaScript
//! for the live parts (server-sent events) and the one mutation, cancel.
//!
//! Routes: `GET /ui/` (the list), `GET /ui/session?id=…` (one session), `GET /ui/files?id=…`
//! (its workspace's files; `&path=…`, one file), `GET /ui/events`
//! (server-sent events for either), `GET`/`POST /ui/signin`, `POST /ui/cancel`, and
//! `GET /ui/assets/{viewer.css,viewer.js}` (embedded in the binary).
//!
//! Invariants:
//! * Behind the same credential as the API, presented once at `/ui/signin` and then carried by
//!   a cookie (see [`auth`]); without a credential the endpoint answers loopback names only,
//!   and so does the viewer. The floor's guard stands before every route here too (foreign
//!   `Host` or `Origin`, a `POST` that is not JSON: refused), so sign-in and cancel post JSON.
//! * Everything a session holds is untrusted: escaped with one helper ([`html::esc`]), and
//!   every answer carries a Content-Security-Policy without `unsafe-inline` (scripts and
//!   styles come from `/ui/assets/` only), `X-Content-Type-Options: nosniff`, no framing, no
//!   referrer, no caching.
//! * State lives in the store only: any replica draws the same page, accepts the same cookie.
//!
//! Non-goals: changing anything but cancelling a turn; accounts.

mod auth;
mod files;
mod html;
mod image;
mod live;
mod pages;
mod timeline;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use std::sync::Arc;

use super::engine::Engine;
use super::invocation::ByohError;
use super::protocol::{CancelRequest, PROTOCOL_VERSION};
use crate::floor::http::Guard;
use crate::floor::secret::Secret;

/// The policy every viewer answer carries: nothing inline, nothing from elsewhere.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
    base-uri 'none'";

const CSS: &str = include_str!("assets/viewer.css");
const JS: &str = include_str!("assets/viewer.js");

/// The viewer's state: the engine (for its store) and the keys derived from the credential.
#[derive(Clone)]
pub struct Viewer {
    engine: Engine,
    keys: auth::Keys,
}

/// The viewer's routes, each behind `forgeries`, with their own state.
pub fn routes<S: Clone + Send + Sync + 'static>(
    engine: Engine,
    token: Option<Arc<Secret>>,
    forgeries: &Guard,
) -> Router<S> {
    let viewer = Viewer {
        engine,
        keys: auth::Keys::new(token),
    };
    let signed = Router::new()
        .route("/ui/", forgeries.wrap(get(list)))
        .route("/ui/session", forgeries.wrap(get(one)))
        .route("/ui/files", forgeries.wrap(get(workspace)))
        .route("/ui/events", forgeries.wrap(get(live::events)))
        .route("/ui/cancel", forgeries.wrap(post(cancel)))
        .route_layer(middleware::from_fn_with_state(viewer.clone(), signed_in));
    Router::new()
        .route("/ui", forgeries.wrap(get(|| async { redirect("/ui/") })))
        .route(
            "/ui/signin",
            forgeries.wrap(get(sign_in_page).post(sign_in)),
        )
        .route("/ui/assets/viewer.css", forgeries.wrap(get(css)))
        .route("/ui/assets/viewer.js", forgeries.wrap(get(js)))
        .merge(signed)
        .layer(middleware::from_fn(hardened))
        .with_state(viewer)
}

/// Adds the viewer's security headers to every answer.
async fn hardened(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    for (name, value) in [
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    resp
}

/// Pages need the cookie: without it, a page is sent to the sign-in page, and the rest
/// (events, cancel) are refused with 401.
async fn signed_in(State(v): State<Viewer>, req: Request, next: Next) -> Response {
    if v.keys.signed_in(req.headers()) {
        return next.run(req).await;
    }
    let page = matches!(req.uri().path(), "/ui/" | "/ui/session" | "/ui/files");
    if page && req.method() == axum::http::Method::GET {
        return auth::to_sign_in();
    }
    error(StatusCode::UNAUTHORIZED, "sign in at /ui/signin first")
}

fn redirect(to: &'static str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, HeaderValue::from_static(to))],
    )
        .into_response()
}

/// A refusal in the API's error body.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let body = serde_json::json!({"error": {"message": message.into()}});
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response()
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

/// A page that says what went wrong (escaped).
fn failure(status: StatusCode, message: &str) -> Response {
    let body = format!(
        "<h1>{}</h1><p class=\"err\">{}</p>",
        status,
        html::esc(message)
    );
    html(status, html::page("Error", &body))
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

fn asset(ctype: &'static str, text: &'static str) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static(ctype))],
        text,
    )
        .into_response()
}

async fn sign_in_page(State(v): State<Viewer>) -> Response {
    if !v.keys.needed() {
        return redirect("/ui/");
    }
    let body = "<h1>Sign in</h1><form id=\"signin\" method=\"post\" action=\"/ui/signin\">\
        <label>Credential <input type=\"password\" name=\"credential\" id=\"credential\" \
        autocomplete=\"current-password\" required></label> <button>Sign in</button></form>\
        <p id=\"signin-result\" class=\"err\"></p>\
        <p class=\"sub\">The credential podhost serve was started with (PODHOST_TOKEN).</p>";
    html(StatusCode::OK, html::page("Sign in", body))
}

#[derive(Deserialize)]
struct SignIn {
    credential: String,
}

/// `POST /ui/signin` with `{"credential": …}`: 204 and the cookie, or 401.
async fn sign_in(State(v): State<Viewer>, headers: HeaderMap, body: Body) -> Response {
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the sign-in body is over 64 KiB",
        );
    };
    let Ok(SignIn { credential }) = serde_json::from_slice(&bytes) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the body must be JSON: {\"credential\": \"…\"}",
        );
    };
    if !v.keys.needed() {
        return StatusCode::NO_CONTENT.into_response();
    }
    match v.keys.sign_in(&credential, auth::over_tls(&headers)) {
        Some(cookie) => match HeaderValue::from_str(&cookie) {
            Ok(c) => (StatusCode::NO_CONTENT, [(header::SET_COOKIE, c)]).into_response(),
            Err(_) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "could not set the cookie",
            ),
        },
        None => error(StatusCode::UNAUTHORIZED, "the credential is wrong"),
    }
}

async fn list(
    State(v): State<Viewer>,
    q: Result<Query<pages::ListParams>, QueryRejection>,
) -> Response {
    let Ok(Query(p)) = q else {
        return failure(
            StatusCode::BAD_REQUEST,
            "the page's query string is not one it takes",
        );
    };
    match v.engine.inner.store.list_sessions(&p.query()).await {
        Ok(rows) => html(StatusCode::OK, pages::sessions(&p, &rows)),
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[derive(Deserialize)]
struct One {
    id: String,
}

async fn one(State(v): State<Viewer>, q: Result<Query<One>, QueryRejection>) -> Response {
    let Ok(Query(One { id })) = q else {
        return failure(
            StatusCode::BAD_REQUEST,
            "the id query parameter is required",
        );
    };
    let store = &v.engine.inner.store;
    let row = match store.get(&id).await {
        Ok(Some(row)) => row,
        Ok(None) => return failure(StatusCode::NOT_FOUND, &format!("no invocation {id:?}")),
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let read = async {
        let messages = if row.swept {
            Vec::new()
        } else {
            store.messages(&id, 0).await?
        };
        let times = store.message_times(&id).await?;
        Ok::<_, super::store::StoreError>((messages, times, store.view(&id).await?))
    };
    match read.await {
        Ok((messages, times, view)) => {
            let drawn = timeline::svg(&timeline::bars(&messages, &times));
            html(
                StatusCode::OK,
                pages::session(&row, &messages, &times, &view, &drawn, v.keys.csrf()),
            )
        }
        Err(e) => failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[derive(Deserialize)]
struct FilesQuery {
    id: String,
    path: Option<String>,
}

/// The template directory, where sessions' workspaces are overlays of it.
fn overlay_template(
    template: &Option<crate::exec::template::Template>,
) -> Option<std::path::PathBuf> {
    template
        .as_ref()
        .filter(|t| t.level == crate::exec::template::Level::Overlay)
        .map(|t| t.dir.clone())
}

async fn workspace(
    State(v): State<Viewer>,
    q: Result<Query<FilesQuery>, QueryRejection>,
) -> Response {
    let Ok(Query(FilesQuery { id, path })) = q else {
        return failure(
            StatusCode::BAD_REQUEST,
            "the id query parameter is required",
        );
    };
    let row = match v.engine.inner.store.status(&id).await {
        Ok(Some(row)) => row,
        Ok(None) => return failure(StatusCode::NOT_FOUND, &format!("no invocation {id:?}")),
        Err(e) => return failure(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    };
    let data = &v.engine.inner.config.data_dir;
    let path = path.filter(|p| !p.is_empty());
    html(
        StatusCode::OK,
        files::page_of(
            &v.engine.inner.config.tools,
            v.engine.inner.held_toolbox(&id),
            overlay_template(&v.engine.inner.config.template),
            data,
            &id,
            &row.session_id,
            path,
        )
        .await,
    )
}

#[derive(Deserialize)]
struct CancelBody {
    invocation_id: String,
    session_id: String,
    csrf: String,
}

/// `POST /ui/cancel` with `{"invocation_id", "session_id", "csrf"}`: cancels the turn as the
/// API's `/cancel` does; 403 without the page's CSRF token.
async fn cancel(State(v): State<Viewer>, body: Body) -> Response {
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "the cancel body is over 64 KiB",
        );
    };
    let Ok(b) = serde_json::from_slice::<CancelBody>(&bytes) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the body must be JSON with invocation_id, session_id and csrf",
        );
    };
    if !v.keys.csrf_matches(&b.csrf) {
        return error(
            StatusCode::FORBIDDEN,
            "the CSRF token is wrong: reload the session's page and cancel from it",
        );
    }
    let req = CancelRequest {
        protocol_version: PROTOCOL_VERSION.to_owned(),
        session_id: b.session_id,
        invocation_id: b.invocation_id,
    };
    match v.engine.cancel(req).await {
        Ok(row) => {
            let body = serde_json::json!({"status": row.status.as_str()});
            (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                body.to_string(),
            )
                .into_response()
        }
        Err(e) => {
            let status = match e {
                ByohError::NotFound(_) => StatusCode::NOT_FOUND,
                ByohError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
                ByohError::Busy(_) | ByohError::NoOutput(_) => StatusCode::CONFLICT,
                ByohError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(status, e.to_string())
        }
    }
}
