//! The timeline of a session's steps, drawn by the server as SVG: each model call and each tool
//! call a bar on its own row, on one time axis.
//!
//! A message is stored as it is made, with the time ([`crate::byoh::store::Store::message_times`]):
//! a model call ends when its answer is stored and started when the message before it was; a
//! tool call starts when the answer that made it was stored and ends when its result is. An
//! `ask_user` question is no bar (its answer comes with a resume). Messages stored before times
//! were kept draw no bar.
//!
//! Invariants: every text in the drawing (tool names, durations) goes through [`esc`]; colours
//! come from the style sheet (classes), never from inline style.
//!
//! Non-goals: what happened inside a call (see the conversation).

use std::collections::HashMap;
use std::fmt::Write;

use super::html::{duration, esc};
use crate::chat::message::{ChatMessage, Role};

/// One bar: what it was, its kind (`model` or `tool`), its start and end (ms).
#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub label: String,
    pub kind: &'static str,
    pub start: i64,
    pub end: i64,
}

/// The bars of a transcript whose messages were stored at `times`.
pub fn bars(messages: &[ChatMessage], times: &[Option<i64>]) -> Vec<Bar> {
    let mut out = Vec::new();
    // Call id → (tool name, when the answer that made it was stored).
    let mut calls: HashMap<&str, (&str, Option<i64>)> = HashMap::new();
    let mut steps = 0;
    for (i, m) in messages.iter().enumerate() {
        let at = times.get(i).copied().flatten();
        let before = i
            .checked_sub(1)
            .and_then(|p| times.get(p).copied().flatten());
        match m.role {
            Role::Assistant => {
                steps += 1;
                if let (Some(start), Some(end)) = (before, at) {
                    out.push(Bar {
                        label: format!("model call {steps}"),
                        kind: "model",
                        start,
                        end,
                    });
                }
                for c in m.tool_calls.iter().flatten() {
                    calls.insert(&c.id, (&c.function.name, at));
                }
            }
            Role::Tool => {
                let call = m.tool_call_id.as_deref().and_then(|id| calls.get(id));
                if let (Some((name, Some(start))), Some(end)) = (call, at)
                    && *name != "ask_user"
                {
                    out.push(Bar {
                        label: (*name).to_owned(),
                        kind: "tool",
                        start: *start,
                        end,
                    });
                }
            }
            Role::System | Role::User => {}
        }
    }
    out
}

/// Width of the drawing, and of the labels' column (in SVG units).
const WIDTH: i64 = 900;
const LABELS: i64 = 180;
const ROW: i64 = 18;

/// The SVG of `bars` (nothing when there are none).
pub fn svg(bars: &[Bar]) -> String {
    let (Some(t0), Some(t1)) = (
        bars.iter().map(|b| b.start).min(),
        bars.iter().map(|b| b.end).max(),
    ) else {
        return String::new();
    };
    let span = (t1 - t0).max(1);
    let x = |t: i64| LABELS + (t - t0) * (WIDTH - LABELS - 10) / span;
    let height = ROW * bars.len() as i64 + 24;
    let mut out = format!(
        "<svg class=\"timeline\" viewBox=\"0 0 {WIDTH} {height}\" role=\"img\" \
         aria-label=\"timeline of the steps\" xmlns=\"http://www.w3.org/2000/svg\">"
    );
    for (row, b) in bars.iter().enumerate() {
        let y = row as i64 * ROW;
        let took = duration(b.end - b.start);
        let _ = write!(
            out,
            "<g class=\"{kind}\"><title>{label}: {took}</title>\
             <text x=\"0\" y=\"{ty}\">{label}</text>\
             <rect x=\"{x0}\" y=\"{y}\" width=\"{w}\" height=\"{h}\"></rect></g>",
            kind = b.kind,
            label = esc(&b.label),
            ty = y + ROW - 5,
            x0 = x(b.start),
            w = (x(b.end) - x(b.start)).max(2),
            h = ROW - 4,
        );
    }
    let _ = write!(
        out,
        "<text class=\"axis\" x=\"{LABELS}\" y=\"{ay}\">0 s</text>\
         <text class=\"axis end\" x=\"{WIDTH}\" y=\"{ay}\">{total}</text></svg>",
        ay = height - 6,
        total = esc(&duration(span)),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::message::ToolCall;
    use pretty_assertions::assert_eq;

    #[test]
    fn model_and_tool_calls_become_bars_and_questions_do_not() {
        let messages = vec![
            ChatMessage::user("go"),
            ChatMessage::assistant(
                String::new(),
                vec![
                    ToolCall::new("b", "bash", "{}".into()),
                    ToolCall::new("q", "ask_user", "{}".into()),
                ],
            ),
            ChatMessage::tool("b", "ok"),
            ChatMessage::tool("q", "yes"),
            ChatMessage::assistant("done".into(), vec![]),
        ];
        let times = [Some(1000), Some(3000), Some(3500), Some(9000), Some(9400)];
        let bar = |label: &str, kind, start, end| Bar {
            label: label.into(),
            kind,
            start,
            end,
        };
        assert_eq!(
            bars(&messages, &times),
            vec![
                bar("model call 1", "model", 1000, 3000),
                bar("bash", "tool", 3000, 3500),
                bar("model call 2", "model", 9000, 9400),
            ]
        );
        // A transcript stored before times were kept draws nothing.
        assert_eq!(bars(&messages, &[None; 5]), vec![]);
        assert_eq!(svg(&[]), "");
    }

    #[test]
    fn the_drawing_escapes_its_labels() {
        let drawn = svg(&[Bar {
            label: "<script>x</script>".into(),
            kind: "tool",
            start: 0,
            end: 1000,
        }]);
        assert!(drawn.contains("<text x=\"0\" y=\"13\">&lt;script&gt;x&lt;/script&gt;</text>"));
        assert!(!drawn.contains("<script"), "{drawn}");
    }
}
