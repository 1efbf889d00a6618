//! Where a run's events go: JSON lines on stdout (`--json`), or text for people on stderr.
//!
//! Owns: the [`Sink`] every part of a run emits through (it also keeps the run's totals), and
//! the text form of each event — tool calls by name with their inputs in words, short results
//! with real line breaks (never escaped JSON), a live progress line while the model answers when
//! stderr is a terminal, and the closing summary line.
//!
//! Invariants: stdout carries only the final answer (text mode) or only event lines (`--json`);
//! everything for people goes to stderr. A line is written whole under one lock, so events from
//! the progress task and the loop never interleave, and a model call's progress is written only
//! between its `started` and its `finished`. A model call's failure is said once in text mode.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde_json::Value;

use super::events::{Event, RunStatus, Summary, line};
use crate::floor::text::clip_chars;

/// Lines of a command's output (or a search result) shown under a tool call.
const SHOWN_LINES: usize = 6;
/// Characters of one shown line.
const SHOWN_CHARS: usize = 160;

/// The events of one run, and their totals. Cheap to clone.
#[derive(Clone)]
pub(super) struct Sink {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    json: bool,
    /// stderr is a terminal: a live progress line may be drawn (and must be cleared).
    live: bool,
    progress_drawn: bool,
    started: Instant,
    summary: Summary,
    /// The step of the model call between its `started` and its `finished`: progress is
    /// written for it only, so none ever follows its call's end.
    open_call: Option<u32>,
    /// The error of the last failed model call, as its line showed it (text mode): the run's
    /// closing lines do not say it again.
    shown_model_error: Option<String>,
}

impl Sink {
    pub fn new(json: bool) -> Self {
        Sink {
            inner: Arc::new(Mutex::new(Inner {
                json,
                live: !json && std::io::stderr().is_terminal(),
                progress_drawn: false,
                started: Instant::now(),
                summary: Summary::default(),
                open_call: None,
                shown_model_error: None,
            })),
        }
    }

    pub fn is_json(&self) -> bool {
        self.lock().json
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The run's totals so far, with the wall time until now.
    pub fn summary(&self) -> Summary {
        let inner = self.lock();
        Summary {
            duration_ms: ms(inner.started),
            ..inner.summary
        }
    }

    /// Writes `event` (and counts it in the totals).
    pub fn emit(&self, event: Event) {
        let mut inner = self.lock();
        match &event {
            Event::ModelCallStarted { step } => inner.open_call = Some(*step),
            Event::ModelCallFinished { tokens, .. } => {
                inner.open_call = None;
                inner.summary.model_calls += 1;
                inner.summary.input_tokens += tokens.input.unwrap_or(0);
                inner.summary.output_tokens += tokens.output.unwrap_or(0);
            }
            // A question left for the user was not answered.
            Event::ToolCallFinished { status, .. } if *status != "input_required" => {
                inner.summary.tool_calls += 1;
            }
            _ => {}
        }
        inner.write(event);
    }

    /// The step of the model call in flight, if one is.
    pub fn open_call(&self) -> Option<u32> {
        self.lock().open_call
    }

    /// Writes a `model_call.progress` of model call `step` (as [`Sink::open_call`] named it
    /// before the count was read) if that call is still in flight; nothing when it is not: its
    /// `finished` was written first, and the count came too late to say anything.
    pub fn progress(&self, step: Option<u32>, received_bytes: u64) {
        let mut inner = self.lock();
        if let Some(step) = step
            && inner.open_call == Some(step)
        {
            inner.write(Event::ModelCallProgress {
                step,
                received_bytes,
            });
        }
    }
}

impl Inner {
    /// Writes one event whole, under the sink's lock.
    fn write(&mut self, event: Event) {
        let elapsed = ms(self.started);
        if self.json {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", line(&event, elapsed));
            let _ = out.flush();
            return;
        }
        let text = match &event {
            Event::ModelCallFinished {
                error: Some(e),
                status: "failed",
                ..
            } => {
                self.shown_model_error = Some(e.clone());
                human(&event, self.live)
            }
            // A model call's failure was shown on its own line: the closing lines say how the
            // run ended without repeating it.
            Event::RunFinished {
                error: Some(e),
                status,
                exit_code,
                questions,
                summary,
                ..
            } if self
                .shown_model_error
                .as_ref()
                .is_some_and(|m| e.ends_with(m.as_str())) =>
            {
                Text::Lines(finished(
                    *status,
                    *exit_code,
                    None,
                    questions.as_deref(),
                    summary,
                ))
            }
            _ => human(&event, self.live),
        };
        let mut err = std::io::stderr().lock();
        if self.progress_drawn {
            let _ = write!(err, "\r\x1b[K");
            self.progress_drawn = false;
        }
        match text {
            Text::Lines(t) if !t.is_empty() => {
                let _ = writeln!(err, "{t}");
            }
            Text::Live(t) => {
                let _ = write!(err, "{t}");
                self.progress_drawn = true;
            }
            _ => {}
        }
        let _ = err.flush();
    }
}

fn ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// What an event shows on stderr.
enum Text {
    /// Whole lines.
    Lines(String),
    /// A progress line, redrawn in place (a terminal only).
    Live(String),
    Nothing,
}

fn human(event: &Event, live: bool) -> Text {
    match event {
        Event::RunStarted {
            model,
            base_url,
            base_url_from,
            api_key_from,
            instructions,
            ..
        } => Text::Lines(started(
            model,
            base_url,
            base_url_from,
            api_key_from.as_deref(),
            instructions,
        )),
        Event::ModelCallStarted { step } if live => {
            Text::Live(format!("⋯ model call {step}: waiting for the answer"))
        }
        Event::ModelCallProgress {
            step,
            received_bytes,
        } if live => Text::Live(format!(
            "⋯ model call {step}: {received_bytes} bytes received"
        )),
        Event::ModelCallFinished {
            step,
            status: "failed",
            error,
            ..
        } => Text::Lines(format!(
            "✗ model call {step} failed: {}",
            error.as_deref().unwrap_or("")
        )),
        Event::Message {
            text,
            is_final: false,
            ..
        } if !text.trim().is_empty() => Text::Lines(text.trim_end().to_owned()),
        Event::ToolCallStarted { tool, input, .. } => {
            Text::Lines(format!("▸ {tool} {}", describe_input(tool, input)))
        }
        Event::ToolCallFinished {
            tool,
            output,
            code,
            error,
            ..
        } => match (output, error) {
            (Some(out), _) => Text::Lines(describe_output(tool, out)),
            (None, Some(e)) => Text::Lines(indent(&format!(
                "✗ {}: {e}",
                code.as_deref().unwrap_or("failed")
            ))),
            (None, None) => Text::Nothing,
        },
        Event::RunFinished {
            status,
            exit_code,
            error,
            questions,
            summary,
            ..
        } => Text::Lines(finished(
            *status,
            *exit_code,
            error.as_deref(),
            questions.as_deref(),
            summary,
        )),
        _ => Text::Nothing,
    }
}

/// The line that opens a run: the model, where it is, where its key comes from.
fn started(
    model: &str,
    base_url: &str,
    base_url_from: &str,
    api_key_from: Option<&str>,
    instructions: &[String],
) -> String {
    let key = match api_key_from {
        Some(var) => format!("API key from {var}"),
        None => "no API key".to_owned(),
    };
    let from = match base_url_from {
        "default" => "the default".to_owned(),
        other => other.to_owned(),
    };
    let mut t = format!("podhost run: {model} at {base_url} (from {from}; {key})");
    if !instructions.is_empty() {
        t.push_str(&format!(
            "\npodhost run: instructions from {}",
            instructions.join(" and ")
        ));
    }
    t
}

/// The lines that close a run: its questions, its error, and a summary.
fn finished(
    status: RunStatus,
    exit_code: i32,
    error: Option<&str>,
    questions: Option<&[String]>,
    summary: &Summary,
) -> String {
    let mut t = String::new();
    if let Some(qs) = questions {
        for q in qs {
            t.push_str(&format!("podhost run: the agent asks: {q}\n"));
        }
    }
    if let Some(e) = error {
        t.push_str(&format!("podhost run: {e}\n"));
    }
    let word = match status {
        RunStatus::Completed => "completed".to_owned(),
        other => format!(
            "{} (exit {exit_code})",
            serde_json::to_value(other)
                .ok()
                .and_then(|v| v.as_str().map(|s| s.replace('_', " ")))
                .unwrap_or_default()
        ),
    };
    t.push_str(&format!(
        "podhost run: {word} · {} model call(s) · {} tool call(s) · {} tokens in, {} out · {:.1} s",
        summary.model_calls,
        summary.tool_calls,
        summary.input_tokens,
        summary.output_tokens,
        summary.duration_ms as f64 / 1000.0
    ));
    t
}

fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// A tool call's input in words: the command, the path, the pattern.
fn describe_input(tool: &str, input: &Value) -> String {
    let path = str_of(input, "path");
    let first_line = |s: &str| {
        let mut lines = s.lines();
        let first = clip_chars(lines.next().unwrap_or(""), SHOWN_CHARS).into_owned();
        if lines.next().is_some() {
            format!("{first} …")
        } else {
            first
        }
    };
    match tool {
        "bash" => first_line(str_of(input, "command").unwrap_or("")),
        "read" => match input.get("offset").and_then(Value::as_u64) {
            Some(o) => format!("{} from line {o}", path.unwrap_or("")),
            None => path.unwrap_or("").to_owned(),
        },
        "write" => format!(
            "{} ({} bytes)",
            path.unwrap_or(""),
            str_of(input, "content").map_or(0, str::len)
        ),
        "edit" => path.unwrap_or("").to_owned(),
        "grep" | "glob" => {
            let pattern = first_line(str_of(input, "pattern").unwrap_or(""));
            match path {
                Some(p) => format!("{pattern:?} in {p}"),
                None => format!("{pattern:?}"),
            }
        }
        "ask_user" => first_line(str_of(input, "question").unwrap_or("")),
        _ if input.is_null() => "(arguments that are not a JSON object)".to_owned(),
        _ => clip_chars(&input.to_string(), SHOWN_CHARS).into_owned(),
    }
}

/// A tool's output, short, indented under its call.
fn describe_output(tool: &str, out: &Value) -> String {
    match (tool, out) {
        ("bash", Value::Object(o)) => {
            let code = o.get("exitCode").and_then(Value::as_i64).unwrap_or(-1);
            let mut t = format!("exit {code}");
            if o.get("timedOut").and_then(Value::as_bool) == Some(true) {
                t.push_str(" (timed out)");
            }
            for stream in ["stdout", "stderr"] {
                let text = str_of(out, stream).unwrap_or("");
                if !text.trim().is_empty() {
                    t.push('\n');
                    t.push_str(&excerpt(text, if stream == "stderr" { "!" } else { "│" }));
                }
            }
            indent(&t)
        }
        ("write", _) => indent(&format!(
            "wrote {} bytes to {}",
            out.get("bytes").and_then(Value::as_u64).unwrap_or(0),
            str_of(out, "path").unwrap_or("")
        )),
        ("edit", _) => {
            let n = out.get("replacements").and_then(Value::as_u64).unwrap_or(0);
            let mut t = format!(
                "{n} replacement(s) in {}",
                str_of(out, "path").unwrap_or("")
            );
            if let Some(snippet) = str_of(out, "snippet").filter(|s| !s.is_empty()) {
                t.push('\n');
                t.push_str(&excerpt(snippet, "│"));
            }
            indent(&t)
        }
        ("read", Value::String(s)) => indent(&format!("{} line(s)", s.lines().count())),
        (_, Value::String(s)) => indent(&excerpt(s, "│")),
        _ => indent(&clip_chars(&out.to_string(), SHOWN_CHARS)),
    }
}

/// The first [`SHOWN_LINES`] lines of `text`, each clipped and marked, and how many were left.
fn excerpt(text: &str, mark: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let mut t: Vec<String> = lines
        .iter()
        .take(SHOWN_LINES)
        .map(|l| format!("{mark} {}", clip_chars(l, SHOWN_CHARS)))
        .collect();
    if lines.len() > SHOWN_LINES {
        t.push(format!(
            "{mark} … {} more line(s)",
            lines.len() - SHOWN_LINES
        ));
    }
    t.join("\n")
}

fn indent(t: &str) -> String {
    t.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn tool_calls_read_as_words_and_lines() {
        assert_eq!(
            describe_input("bash", &json!({"command": "cargo test\necho done"})),
            "cargo test …"
        );
        assert_eq!(
            describe_input("grep", &json!({"pattern": "fn main", "path": "src"})),
            "\"fn main\" in src"
        );
        let out = json!({"exitCode": 1, "stdout": "a\nb\n", "stderr": "boom\n"});
        assert_eq!(
            describe_output("bash", &out),
            "  exit 1\n  │ a\n  │ b\n  ! boom"
        );
        let many: String = (1..=9).map(|n| format!("{n}\n")).collect();
        assert_eq!(
            describe_output("glob", &json!(many)),
            "  │ 1\n  │ 2\n  │ 3\n  │ 4\n  │ 5\n  │ 6\n  │ … 3 more line(s)"
        );
    }
}
