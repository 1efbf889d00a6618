//! Streamed chat completions: server-sent events in, one chat completion out.
//!
//! Owns: the event-stream parser ([`SseParser`], the WHATWG rules servers follow: `data:` lines
//! joined by newlines, a blank line ending an event, comments and unknown fields skipped, LF or
//! CRLF line ends) and the accumulator ([`Accumulated`]) that folds `chat.completion.chunk`
//! deltas — text, reasoning, tool calls by `index` with their argument pieces, the finish reason
//! and the usage of the final chunk — into the body a non-streaming server would have sent, which
//! `client::parse_completion` then reads.
//!
//! Invariants: memory is bounded by the caller (it counts the bytes it feeds); a line holds at
//! most what was fed. The parser is written here rather than taken from a crate because servers
//! differ in what they send (comments as keep-alives, repeated fields, a last event without its
//! blank line) and every one of those must parse.
//!
//! Non-goals: reconnecting (`retry`, `Last-Event-ID`): a broken stream is a failed attempt that
//! the client retries whole.

use serde_json::{Map, Value, json};

use super::message::content_text;

/// One event of a stream: its `event` name (if any) and its data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Splits a byte stream into events.
#[derive(Debug, Default)]
pub struct SseParser {
    /// The unfinished line.
    line: Vec<u8>,
    event: Option<String>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds bytes; every event they complete is pushed to `out`.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) {
        let mut rest = bytes;
        while let Some(i) = memchr::memchr(b'\n', rest) {
            self.line.extend_from_slice(&rest[..i]);
            rest = &rest[i + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.line_done(&line, out);
        }
        self.line.extend_from_slice(rest);
    }

    /// Ends the stream: a last event without its blank line still counts.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.line_done(&line, out);
        }
        self.dispatch(out);
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.dispatch(out);
            return;
        }
        if line[0] == b':' {
            return;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "event" => self.event = Some(value.to_owned()),
            _ => {}
        }
    }

    fn dispatch(&mut self, out: &mut Vec<SseEvent>) {
        if self.has_data {
            out.push(SseEvent {
                event: self.event.take(),
                data: std::mem::take(&mut self.data),
            });
        }
        self.event = None;
        self.has_data = false;
    }
}

/// A tool call being streamed.
#[derive(Debug, Default)]
struct CallParts {
    id: String,
    name: String,
    arguments: String,
}

/// The chunks of one streamed completion, folded.
#[derive(Debug, Default)]
pub struct Accumulated {
    content: String,
    reasoning: String,
    calls: Vec<(u64, CallParts)>,
    finish_reason: Option<String>,
    usage: Option<Value>,
    /// Bytes of text, reasoning and arguments received: the progress a front shows.
    pub received: u64,
}

impl Accumulated {
    /// Folds one `chat.completion.chunk` in.
    pub fn add(&mut self, chunk: &Value) {
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        let Some(choice) = chunk.get("choices").and_then(|c| c.get(0)) else {
            return;
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_owned());
        }
        let Some(delta) = choice.get("delta").or_else(|| choice.get("message")) else {
            return;
        };
        let text = content_text(delta.get("content"));
        self.received += text.len() as u64;
        self.content.push_str(&text);
        for key in ["reasoning_content", "reasoning"] {
            if let Some(r) = delta.get(key).and_then(Value::as_str) {
                self.received += r.len() as u64;
                self.reasoning.push_str(r);
                break;
            }
        }
        let calls = delta.get("tool_calls").and_then(Value::as_array);
        for (position, call) in calls.into_iter().flatten().enumerate() {
            let index = call
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(position as u64);
            let slot = match self.calls.iter().position(|(i, _)| *i == index) {
                Some(p) => p,
                None => {
                    self.calls.push((index, CallParts::default()));
                    self.calls.len() - 1
                }
            };
            let parts = &mut self.calls[slot].1;
            let f = call.get("function");
            // Some servers repeat the id and name on every chunk: the first one stands.
            if let Some(id) = call.get("id").and_then(Value::as_str)
                && parts.id.is_empty()
            {
                parts.id = id.to_owned();
            }
            if let Some(name) = f.and_then(|f| f.get("name")).and_then(Value::as_str)
                && parts.name.is_empty()
            {
                parts.name = name.to_owned();
            }
            match f.and_then(|f| f.get("arguments")) {
                Some(Value::String(piece)) => {
                    self.received += piece.len() as u64;
                    parts.arguments.push_str(piece);
                }
                Some(Value::Object(o)) => parts.arguments = Value::Object(o.clone()).to_string(),
                _ => {}
            }
        }
    }

    /// Whether the stream said it was done (a finish reason arrived).
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// The completion a non-streaming server would have answered.
    pub fn into_completion(self) -> Value {
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), json!(self.content));
        if !self.reasoning.is_empty() {
            message.insert("reasoning_content".into(), json!(self.reasoning));
        }
        if !self.calls.is_empty() {
            let calls: Vec<Value> = self
                .calls
                .into_iter()
                .map(|(_, c)| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        let mut body = json!({"choices": [{"index": 0, "message": message,
                                           "finish_reason": self.finish_reason}]});
        if let Some(u) = self.usage {
            body["usage"] = u;
        }
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn events(chunks: &[&str]) -> Vec<SseEvent> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for c in chunks {
            p.feed(c.as_bytes(), &mut out);
        }
        p.finish(&mut out);
        out
    }

    fn data(d: &str) -> SseEvent {
        SseEvent {
            event: None,
            data: d.to_owned(),
        }
    }

    #[test]
    fn events_parse_across_chunk_boundaries_and_line_ends() {
        assert_eq!(
            events(&[
                "da",
                "ta: {\"a\":",
                "1}\r\n\r",
                "\n: keep-alive\n\ndata:x\ndata: y\n\n"
            ]),
            vec![data("{\"a\":1}"), data("x\ny")]
        );
        // Repeated and unknown fields, an event name, a last event without its blank line.
        assert_eq!(
            events(&["id: 1\nid: 2\nretry: 5\nevent: error\ndata: bad\n\ndata: [DONE]"]),
            vec![
                SseEvent {
                    event: Some("error".into()),
                    data: "bad".into()
                },
                data("[DONE]")
            ]
        );
        assert_eq!(events(&["\n\n: only comments\n\n"]), vec![]);
    }

    #[test]
    fn chunks_fold_into_one_completion() {
        let mut acc = Accumulated::default();
        for chunk in [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "hm"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Let me "}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "look."}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"comm"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "c1", "function": {"name": "bash", "arguments": "and\":\"ls\"}"}},
                {"index": 1, "id": "c2", "function": {"name": "read", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            json!({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}),
        ] {
            acc.add(&chunk);
        }
        assert!(acc.finished());
        assert_eq!(acc.received, 2 + 12 + 16 + 2);
        assert_eq!(
            acc.into_completion(),
            json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me look.", "reasoning_content": "hm",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\":\"ls\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "{}"}}
                ]}}],
                "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
        );
    }
}
