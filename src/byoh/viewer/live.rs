//! Live updates of the viewer's pages: `GET /ui/events` is a stream of server-sent events
//! that says, every [`EVERY`], what the rows of a list page (or one session's facts) are now,
//! read from the store — so a turn running on any replica shows its progress.
//!
//! Invariants: one indexed read per tick per open page (the same query as the page's); the
//! data of an event is JSON (the script writes it into the page as text, never as markup); a
//! tick whose read fails sends nothing and the next one tries again.
//!
//! A list's first page also gains the rows its query finds that it did not show: a session
//! submitted after the page loaded appears on it (if the page's filter matches it), at its
//! place in the list, without a reload.
//!
//! Non-goals: adding rows to a later page (its rows are older than its cursor; a reload shows
//! what changed), removing rows that left the page's filter; pushing on change (the store has
//! no change feed on SQLite, so the stream polls it).

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use serde_json::{Value, json};

use super::Viewer;
use super::html::{count, duration, time};
use super::pages::{ListParams, took};
use crate::byoh::store::now_ms;

/// How often the stream reads the store.
pub const EVERY: Duration = Duration::from_secs(1);

/// What the stream follows: one session (`id`), else the list page of these parameters.
#[derive(Deserialize)]
pub struct Follow {
    id: Option<String>,
    #[serde(flatten)]
    list: ListParams,
}

/// `GET /ui/events?id=…` or `?status=…&q=…&before_ms=…&before_id=…`.
pub async fn events(State(v): State<Viewer>, q: Result<Query<Follow>, QueryRejection>) -> Response {
    let Ok(Query(follow)) = q else {
        return super::error(
            axum::http::StatusCode::BAD_REQUEST,
            "the events' query string is not one they take",
        );
    };
    Sse::new(ticks(v, follow))
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn ticks(v: Viewer, follow: Follow) -> impl Stream<Item = Result<Event, Infallible>> {
    let every = tokio::time::interval(EVERY);
    stream::unfold((v, follow, every), |(v, follow, mut every)| async move {
        loop {
            every.tick().await;
            if let Some(data) = read(&v, &follow).await {
                let event = Event::default().event("rows").data(data.to_string());
                return Some((Ok(event), (v, follow, every)));
            }
        }
    })
}

/// The rows as they are now: `[{"id", "status", "error"}]` for one session; for a list page,
/// `[{"id", "session", "started", "status", "error", "duration", "steps", "tool_calls",
/// "tokens_in", "tokens_out"}]`, newest first: all a script needs to draw a row it lacks.
async fn read(v: &Viewer, follow: &Follow) -> Option<Value> {
    let store = &v.engine.inner.store;
    if let Some(id) = &follow.id {
        let row = store.status(id).await.ok()??;
        return Some(json!([{
            "id": id,
            "status": row.status.as_str(),
            "error": row.error.unwrap_or_default(),
        }]));
    }
    let rows = store.list_sessions(&follow.list.query()).await.ok()?;
    let now = now_ms();
    Some(Value::Array(
        rows.iter()
            .map(|s| {
                json!({
                    "id": s.invocation_id,
                    "session": s.session_id,
                    "started": time(s.created_ms),
                    "status": s.status.as_str(),
                    "error": s.error.clone().unwrap_or_default(),
                    "duration": duration(took(s, now)),
                    "steps": s.steps.to_string(),
                    "tool_calls": s.tool_calls.to_string(),
                    "tokens_in": count(s.tokens.input),
                    "tokens_out": count(s.tokens.output),
                })
            })
            .collect(),
    ))
}
