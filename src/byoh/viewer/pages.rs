//! The viewer's pages: the list of sessions and one session's conversation, drawn on the
//! server from the store.
//!
//! Invariants: every text from a session or a request goes through [`esc`]/[`query`]; a page
//! reads the store only (any replica draws the same page); a list page is one query of at most
//! [`PAGE`] rows, starting at its cursor (see [`crate::byoh::store::Store::list_sessions`]).
//!
//! Non-goals: authentication (see `auth`), live updates (see `live`).

use std::collections::HashMap;
use std::fmt::Write;

use serde::Deserialize;

use super::html::{count, duration, esc, page, query, time};
use crate::byoh::protocol::Status;
use crate::byoh::store::{InvocationRow, ListQuery, SessionSummary, now_ms};
use crate::chat::context::ContextView;
use crate::chat::message::{ChatMessage, Role};

/// Rows on a page of the list.
pub const PAGE: u32 = 50;

/// Every status, in the order the filter offers them.
pub const STATUSES: [Status; 6] = [
    Status::Queued,
    Status::Running,
    Status::InputRequired,
    Status::Completed,
    Status::Failed,
    Status::Cancelled,
];

/// The list's query string: `status`, `q` (a part of an invocation or session id), and the
/// cursor of the page before (`before_ms`, `before_id`). All text (numbers too: the events'
/// query flattens these, and a flattened number would not parse).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ListParams {
    pub status: Option<String>,
    pub q: Option<String>,
    pub before_ms: Option<String>,
    pub before_id: Option<String>,
}

impl ListParams {
    /// The store's query for these parameters; an unknown status or an empty search is no
    /// filter.
    pub fn query(&self) -> ListQuery {
        ListQuery {
            status: self.status.as_deref().and_then(Status::parse),
            search: self.q.clone().filter(|q| !q.trim().is_empty()),
            before: (self.before_ms.as_deref())
                .and_then(|m| m.parse().ok())
                .zip(self.before_id.clone()),
            limit: PAGE,
        }
    }
}

/// How long a session has taken: to its end, or to now while its turn is open, or to its
/// last write while it waits for input.
pub fn took(s: &SessionSummary, now: i64) -> i64 {
    let end = match s.finished_ms {
        Some(f) => f,
        None if s.status == Status::InputRequired => s.updated_ms,
        None => now,
    };
    end - s.created_ms
}

/// One row of the list; `data-f` names the cells the live updates fill (the script draws a
/// row it adds with the same cells, in this order).
fn row(out: &mut String, s: &SessionSummary, now: i64) {
    let status = s.status.as_str();
    let _ = write!(
        out,
        "<tr data-id=\"{id}\"><td><a href=\"/ui/session?{link}\">{id}</a>\
         <div class=\"sub\">{session}</div></td>\
         <td data-f=\"status\" class=\"status st-{status}\">{status}</td>\
         <td data-f=\"started\">{started}</td><td data-f=\"duration\">{took}</td>\
         <td data-f=\"steps\">{steps}</td><td data-f=\"tool_calls\">{calls}</td>\
         <td data-f=\"tokens_in\">{tokens_in}</td><td data-f=\"tokens_out\">{tokens_out}</td>\
         <td data-f=\"error\" class=\"err\">{error}</td></tr>",
        id = esc(&s.invocation_id),
        link = query(&[("id", &s.invocation_id)]),
        session = esc(&s.session_id),
        started = time(s.created_ms),
        took = duration(took(s, now)),
        steps = s.steps,
        calls = s.tool_calls,
        tokens_in = count(s.tokens.input),
        tokens_out = count(s.tokens.output),
        error = esc(s.error.as_deref().unwrap_or("")),
    );
}

/// The filter form: a status and a search, sent as a GET.
fn filter(out: &mut String, p: &ListParams) {
    let chosen = p.status.as_deref().unwrap_or("");
    out.push_str(
        "<form class=\"filter\" method=\"get\" action=\"/ui/\"><label>Status \
         <select name=\"status\"><option value=\"\">any</option>",
    );
    for s in STATUSES {
        let sel = if s.as_str() == chosen {
            " selected"
        } else {
            ""
        };
        let _ = write!(out, "<option{sel}>{}</option>", s.as_str());
    }
    let _ = write!(
        out,
        "</select></label> <label>Id <input name=\"q\" value=\"{}\" \
         placeholder=\"part of an id\"></label> <button>Show</button></form>",
        esc(p.q.as_deref().unwrap_or(""))
    );
}

/// The list of sessions: the filter, a page of rows, and the link to the next page. The first
/// page (no cursor) is marked `data-grow`: its script adds the rows its events bring that it
/// does not show yet (sessions submitted after it loaded), where they stand in the list.
pub fn sessions(p: &ListParams, rows: &[SessionSummary]) -> String {
    let now = now_ms();
    let mut out = String::with_capacity(4096 + rows.len() * 512);
    out.push_str("<h1>Sessions</h1>");
    filter(&mut out, p);
    let _ = write!(
        out,
        "<div class=\"scroll\"><table id=\"sessions\" data-live=\"/ui/events?{}\"{}><thead><tr>\
         <th>Invocation / session</th><th>Status</th><th>Started (UTC)</th><th>Duration</th>\
         <th>Steps</th><th>Tool calls</th><th>Tokens in</th><th>Tokens out</th>\
         <th>Failure</th></tr></thead><tbody>",
        query(&[
            ("status", p.status.as_deref().unwrap_or("")),
            ("q", p.q.as_deref().unwrap_or("")),
            ("before_ms", p.before_ms.as_deref().unwrap_or("")),
            ("before_id", p.before_id.as_deref().unwrap_or("")),
        ]),
        if p.query().before.is_none() {
            " data-grow"
        } else {
            ""
        }
    );
    for s in rows {
        row(&mut out, s, now);
    }
    out.push_str("</tbody></table></div>");
    if rows.is_empty() {
        out.push_str("<p class=\"empty\">No sessions.</p>");
    }
    if let Some(last) = rows.last().filter(|_| rows.len() as u32 == PAGE) {
        let _ = write!(
            out,
            "<p><a class=\"next\" href=\"/ui/?{}\">Older sessions</a></p>",
            query(&[
                ("status", p.status.as_deref().unwrap_or("")),
                ("q", p.q.as_deref().unwrap_or("")),
                ("before_ms", &last.created_ms.to_string()),
                ("before_id", &last.invocation_id),
            ])
        );
    }
    page("Sessions", &out)
}

/// A `<pre>` of text; JSON arguments are shown indented.
fn pre(out: &mut String, text: &str) {
    let pretty = serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .filter(|v| v.is_object())
        .and_then(|v| serde_json::to_string_pretty(&v).ok());
    let _ = write!(out, "<pre>{}</pre>", esc(pretty.as_deref().unwrap_or(text)));
}

/// A command's outcome (`{exitCode, stdout, stderr, timedOut?, truncated?}`) as its exit code
/// and its two outputs; `false` when `text` is not one.
fn command(out: &mut String, text: &str, took: Option<i64>) -> bool {
    let Ok(serde_json::Value::Object(o)) = serde_json::from_str(text) else {
        return false;
    };
    let Some(code) = o.get("exitCode").and_then(serde_json::Value::as_i64) else {
        return false;
    };
    let flag = |k: &str| o.get(k).and_then(serde_json::Value::as_bool) == Some(true);
    let _ = write!(
        out,
        "<p class=\"exit\">exit code {code}{}{}{}</p>",
        took.map(|ms| format!(", took {}", duration(ms)))
            .unwrap_or_default(),
        if flag("timedOut") { ", timed out" } else { "" },
        if flag("truncated") {
            ", output truncated"
        } else {
            ""
        }
    );
    for stream in ["stdout", "stderr"] {
        if let Some(text) = o.get(stream).and_then(serde_json::Value::as_str)
            && !text.is_empty()
        {
            let _ = write!(out, "<h4>{stream}</h4><pre>{}</pre>", esc(text));
        }
    }
    true
}

/// Call id → the tool's name and when the answer that made the call was stored.
type Calls = HashMap<String, (String, Option<i64>)>;

/// How long the call a tool message answers took: from when the answer that made it was
/// stored to when this result was (`None` when either time is unknown).
fn call_took(m: &ChatMessage, at: Option<i64>, calls: &Calls) -> Option<i64> {
    let (_, start) = calls.get(m.tool_call_id.as_deref()?)?;
    Some(at? - (*start)?)
}

/// One message of the conversation, stored at `at`; `calls` holds the calls made so far.
fn message(out: &mut String, m: &ChatMessage, at: Option<i64>, calls: &mut Calls) {
    let role = match m.role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    };
    let label = match (&m.role, m.tool_call_id.as_deref()) {
        (Role::Tool, Some(id)) => match calls.get(id).map(|(n, _)| n.as_str()) {
            Some("ask_user") => format!("answer to question {id} (resume)"),
            Some(name) => format!("result of {name} {id}"),
            None => format!("result of {id}"),
        },
        _ => role.to_owned(),
    };
    let _ = write!(
        out,
        "<section class=\"msg role-{role}\"><h3>{}</h3>",
        esc(&label)
    );
    if let Some(text) = m.content.as_deref().filter(|t| !t.is_empty())
        && !(m.role == Role::Tool && command(out, text, call_took(m, at, calls)))
    {
        pre(out, text);
    }
    for call in m.tool_calls.iter().flatten() {
        calls.insert(call.id.clone(), (call.function.name.clone(), at));
        let kind = if call.function.name == "ask_user" {
            "question"
        } else {
            "call"
        };
        let _ = write!(
            out,
            "<div class=\"{kind}\"><h4>{kind}: {} <span class=\"sub\">{}</span></h4>",
            esc(&call.function.name),
            esc(&call.id)
        );
        pre(out, &call.function.arguments);
        out.push_str("</div>");
    }
    out.push_str("</section>");
}

/// The facts of an invocation, and its cancel button while its turn is not over.
fn facts(out: &mut String, row: &InvocationRow, csrf: &str) {
    let status = row.status.as_str();
    let _ = write!(
        out,
        "<h1>Session {session}</h1><dl class=\"facts\" id=\"session\" \
         data-live=\"/ui/events?{live}\"><dt>Invocation</dt><dd>{id}</dd>\
         <dt>Status</dt><dd data-f=\"status\" class=\"status st-{status}\">{status}</dd>\
         <dt>Tokens in / out</dt><dd>{tokens_in} / {tokens_out}</dd>\
         <dt>Failure</dt><dd data-f=\"error\" class=\"err\">{error}</dd></dl>\
         <p><a href=\"/ui/files?{live}\">Workspace files</a></p>",
        session = esc(&row.session_id),
        live = query(&[("id", &row.invocation_id)]),
        id = esc(&row.invocation_id),
        tokens_in = count(row.tokens.input),
        tokens_out = count(row.tokens.output),
        error = esc(row.error.as_deref().unwrap_or("")),
    );
    if !row.status.is_terminal() {
        let _ = write!(
            out,
            "<p><button id=\"cancel\" data-invocation=\"{}\" data-session=\"{}\" \
             data-csrf=\"{}\">Cancel this turn</button> <span id=\"cancel-result\"></span></p>",
            esc(&row.invocation_id),
            esc(&row.session_id),
            esc(csrf)
        );
    }
}

/// One session (its messages stored at `times`): its facts, the timeline of its steps (`timeline`: SVG drawn by `timeline`,
/// escaped there), and the conversation as the model saw it, compaction marked.
pub fn session(
    row: &InvocationRow,
    messages: &[ChatMessage],
    times: &[Option<i64>],
    view: &ContextView,
    timeline: &str,
    csrf: &str,
) -> String {
    let mut out = String::with_capacity(8192);
    facts(&mut out, row, csrf);
    if !timeline.is_empty() {
        out.push_str("<h2>Timeline</h2><div class=\"scroll\">");
        out.push_str(timeline);
        out.push_str("</div>");
    }
    out.push_str("<h2>Conversation</h2>");
    if row.swept {
        out.push_str(
            "<p class=\"empty\">The transcript was removed after the retention period.</p>",
        );
    }
    let mut calls = Calls::new();
    for (i, m) in messages.iter().enumerate() {
        if view.summary.is_some() && i == view.from {
            out.push_str(
                "<details class=\"compaction\"><summary>Compacted here: the model was sent a \
                 summary instead of the messages above</summary>",
            );
            pre(&mut out, view.summary.as_deref().unwrap_or(""));
            out.push_str("</details>");
        }
        message(&mut out, m, times.get(i).copied().flatten(), &mut calls);
    }
    page(&format!("Session {}", row.session_id), &out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::message::{ModelEndpoint, ToolCall};

    #[test]
    fn questions_answers_and_the_compaction_are_marked() {
        let endpoint = ModelEndpoint {
            base_url: url::Url::parse("http://m/v1").unwrap(),
            model: String::new(),
            generation_settings: serde_json::Map::new(),
        };
        let row = InvocationRow::new("i", "s", endpoint);
        let messages = vec![
            ChatMessage::user("old task"),
            ChatMessage::assistant(
                String::new(),
                vec![ToolCall::new(
                    "q1",
                    "ask_user",
                    "{\"question\":\"Name?\"}".into(),
                )],
            ),
            ChatMessage::tool("q1", "Ada"),
        ];
        let view = ContextView {
            summary: Some("<b>the summary</b>".into()),
            from: 1,
            ..ContextView::default()
        };
        let page = session(&row, &messages, &[], &view, "", "t0k");
        let at = |needle: &str| {
            page.find(needle)
                .unwrap_or_else(|| panic!("no {needle:?} in {page}"))
        };
        assert!(at("<h3>user</h3>") < at("Compacted here"));
        assert!(at("Compacted here") < at("<h4>question: ask_user"));
        assert!(at("<h4>question: ask_user") < at("<h3>answer to question q1 (resume)</h3>"));
        assert!(
            page.contains("<pre>&lt;b&gt;the summary&lt;/b&gt;</pre>"),
            "{page}"
        );
        assert!(page.contains("data-csrf=\"t0k\""), "{page}");
        // No timeline section without bars.
        assert!(!page.contains("<h2>Timeline</h2>"), "{page}");
    }
}
