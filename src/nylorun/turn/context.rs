//! The pod's side of the context budget (v5 §3, §5, §6): the transcript as the units the loop
//! cuts between, the text a summary call reads, previews for a kept tail, the pinned memory
//! index, and what the prompt's files are.
//!
//! Owns: [`units`] (a compaction entry, a run of input entries, a step's candidate with its tool
//! results and final entry), [`render`] (entries as plain text for a summary), [`shrink`] (a
//! step's tool results as previews), [`MemoryPin`] (the index as the session pinned it, the text
//! of its prompt item, and where it lives in podhost's state), and [`learn_files`] (the size,
//! name and — for a text file within the cap — the text of each file a media part names).
//!
//! Invariants:
//! * Units, renderings and previews are pure functions of the entries: a replayed segment
//!   plans the same compaction and sends the same summary calls.
//! * The memory index shown is the session's own record (podhost's state), never the system
//!   text of each TurnStart: a re-run of a segment whose first attempt wrote a memory shows the
//!   same index. A fresh index is taken only through a journaled effect, so a replay gets the
//!   value the first attempt saw.
//!
//! Non-goals: when to compact (`agent::context`), journaling (`effects`).

use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::agent::context::{Unit, UnitKind, estimate_json, preview_text};
use crate::agent::media::InputKind;
use crate::agent::model::{ResultOutcome, ToolResult};
use crate::floor::text::{clip_chars, lossy_text};
use crate::nylorun::artifacts::Artifacts;
use crate::nylorun::turn::shaping::json_len;
use crate::nylorun::turn::transcript::{self, FileInfo, Files, file_key};
use crate::nylorun::turn::turn_start::TurnMemory;

/// A tool result larger than this, as JSON, becomes a preview when a kept tail shrinks.
const SHRINK_BYTES: usize = 2048;
/// How much of one tool result a summary call reads.
const RENDER_RESULT_CHARS: usize = 4000;
/// How much of one tool call's arguments a summary call reads.
const RENDER_ARGS_CHARS: usize = 1000;

/// The units of `entries`, in order, with the entries each covers.
pub fn units(entries: &[Value]) -> Vec<(UnitKind, Range<usize>)> {
    let mut out: Vec<(UnitKind, Range<usize>)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let kind = e.get("kind").and_then(Value::as_str).unwrap_or("");
        let last = out.last_mut();
        match (kind, last) {
            ("compaction", _) => out.push((UnitKind::Summary, i..i + 1)),
            ("input", Some((UnitKind::Input, r))) if r.end == i => r.end = i + 1,
            ("input", _) => out.push((UnitKind::Input, i..i + 1)),
            ("candidate", _) => out.push((UnitKind::Step, i..i + 1)),
            (_, Some((UnitKind::Step, r))) if r.end == i => r.end = i + 1,
            _ => out.push((UnitKind::Step, i..i + 1)),
        }
    }
    out
}

/// The units of `entries` with their estimated tokens as the prompt holds them (and with their
/// tool results shrunk).
pub fn sized_units(entries: &[Value], current_turn: &str, files: &Files) -> Vec<Unit> {
    units(entries)
        .into_iter()
        .map(|(kind, range)| {
            let slice = &entries[range];
            let tokens = tokens_of(&transcript::project(slice, current_turn, files));
            let shrunk = if kind == UnitKind::Step {
                let shrunk: Vec<Value> = slice.iter().map(shrink).collect();
                tokens_of(&transcript::project(&shrunk, current_turn, files))
            } else {
                tokens
            };
            Unit {
                kind,
                tokens,
                shrunk: shrunk.min(tokens),
            }
        })
        .collect()
}

/// Estimated tokens of prompt items.
pub fn tokens_of(items: &[Value]) -> u64 {
    items.iter().map(estimate_json).sum::<u64>() + 1
}

/// `entry` with each tool result past [`SHRINK_BYTES`] made a preview (other entries as they
/// are).
pub fn shrink(entry: &Value) -> Value {
    if entry.get("kind").and_then(Value::as_str) != Some("tool-results") {
        return entry.clone();
    }
    let mut e = entry.clone();
    if let Some(results) = e.get_mut("results").and_then(Value::as_array_mut) {
        for r in results {
            if json_len(r) <= SHRINK_BYTES {
                continue;
            }
            if let Some(out) = r.get_mut("output") {
                *out = preview_value(out);
            }
            if let Some(Value::String(m)) = r.get_mut("message") {
                *m = preview_text(m);
            }
        }
    }
    e
}

/// A value as a preview the model can act on.
fn preview_value(v: &Value) -> Value {
    let text = match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = json!({
        "shortened": "This result was shortened to fit the model's context window; run the call \
                      again to see it whole.",
        "size": text.len(),
        "preview": preview_text(&text),
    });
    if let Some(id) = v.get("artifactId") {
        out["artifactId"] = id.clone();
        out["shortened"] = json!(
            "This result was shortened to fit the model's context window; read it whole with \
             read_artifact."
        );
    }
    out
}

/// `entries` as plain text, for a summary call.
pub fn render(entries: &[Value]) -> String {
    let mut out = String::new();
    let mut line = |s: String| {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&s);
    };
    for e in entries {
        match e.get("kind").and_then(Value::as_str).unwrap_or("") {
            "compaction" => line(format!(
                "Summary of the earlier conversation:\n{}",
                e.get("summary").and_then(Value::as_str).unwrap_or("")
            )),
            "input" => {
                if let Some(text) = input_text(e.get("event").unwrap_or(&Value::Null)) {
                    line(text);
                }
            }
            "candidate" => {
                let blocks = e
                    .get("candidate")
                    .and_then(|c| c.get("output"))
                    .and_then(Value::as_array);
                for b in blocks.into_iter().flatten() {
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => line(format!(
                            "Assistant: {}",
                            b.get("text").and_then(Value::as_str).unwrap_or("")
                        )),
                        Some("json") => line(format!(
                            "Assistant: {}",
                            b.get("value").cloned().unwrap_or_default()
                        )),
                        Some("tool-call") => line(format!(
                            "Assistant called {} with {}",
                            b.get("name").and_then(Value::as_str).unwrap_or("?"),
                            clip_chars(
                                &b.get("args").cloned().unwrap_or_default().to_string(),
                                RENDER_ARGS_CHARS
                            )
                        )),
                        _ => {}
                    }
                }
            }
            "tool-results" => {
                for r in e
                    .get("results")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let name = r.get("toolName").and_then(Value::as_str).unwrap_or("?");
                    let text = match ToolResult::deserialize(r) {
                        Ok(t) => match t.outcome {
                            ResultOutcome::Completed { .. } => t.outcome.model_text(),
                            other => format!("(not completed) {}", other.model_text()),
                        },
                        Err(_) => r.to_string(),
                    };
                    line(format!(
                        "Result of {name}: {}",
                        clip_chars(&text, RENDER_RESULT_CHARS)
                    ));
                }
            }
            _ => {}
        }
    }
    out
}

/// An input entry's event as a line of the conversation, if it says anything.
fn input_text(event: &Value) -> Option<String> {
    if let Some(text) = event.get("text").and_then(Value::as_str) {
        Some(format!("User: {text}"))
    } else if let Some(parts) = event.get("content").and_then(Value::as_array) {
        let text: Vec<String> = parts
            .iter()
            .map(|p| match p.get("text").and_then(Value::as_str) {
                Some(t) => t.to_owned(),
                None => format!(
                    "[file {}]",
                    p.get("reference")
                        .and_then(|r| r.get("name").or_else(|| r.get("artifactId")))
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                ),
            })
            .collect();
        Some(format!("User: {}", text.join(" ")))
    } else {
        event
            .get("kind")
            .and_then(Value::as_str)
            .map(|kind| format!("User ({kind}): {event}"))
    }
}

/// The memory index as the session pinned it: kept in podhost's state, shown at the head of
/// every prompt, refreshed only at a compaction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryPin {
    /// One line per memory, newest first; `None` or empty when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<String>,
    /// Some memories were left out of the index.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl MemoryPin {
    /// The index a TurnStart carries.
    pub fn of(memory: &TurnMemory) -> MemoryPin {
        MemoryPin {
            index: memory
                .index
                .as_deref()
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .map(str::to_owned),
            truncated: memory.truncated == Some(true),
        }
    }

    /// The pin as recorded in an outcome value, if it reads as one.
    pub fn from_value(v: &Value) -> Option<MemoryPin> {
        let output = v.get("output")?;
        MemoryPin::deserialize(output).ok()
    }

    pub fn value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The text of the prompt item.
    pub fn text(&self) -> String {
        match &self.index {
            Some(index) => {
                let mut text = format!(
                    "Your memories, newest first, as they stood when this session started or \
                     last compacted its history (view /memories for the current state):\n{index}"
                );
                if self.truncated {
                    text.push_str(
                        "\n(Older memories are not listed; view /memories to see them all.)",
                    );
                }
                text
            }
            None => "You had no memories when this session started or last compacted its \
                     history; view /memories for the current state."
                .to_owned(),
        }
    }
}

/// The media parts of `entries`' input events, in order.
fn media_parts(entries: &[Value]) -> impl Iterator<Item = &Value> {
    entries
        .iter()
        .filter(|e| e.get("kind").and_then(Value::as_str) == Some("input"))
        .filter_map(|e| e.get("event")?.get("content")?.as_array())
        .flatten()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("media"))
}

/// Learns each file the entries' media parts name: its metadata, and the text of a text file
/// within the inline cap. A file that cannot be read stays unknown (the model gets a note).
pub async fn learn_files(artifacts: &Artifacts, entries: &[Value], files: &mut Files) {
    let parts: Vec<Value> = media_parts(entries).cloned().collect();
    for part in parts {
        let reference = part.get("reference").unwrap_or(&Value::Null);
        let (Some(key), Some(id)) = (
            file_key(reference),
            reference.get("artifactId").and_then(Value::as_str),
        ) else {
            continue;
        };
        if files.known.contains_key(&key) {
            continue;
        }
        let version = reference.get("version").and_then(Value::as_u64);
        let meta = match artifacts.metadata(id, version).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(artifact_id = %id, error = %e, "could not learn a file of the input");
                files.known.insert(key, FileInfo::default());
                continue;
            }
        };
        let media_type = part
            .get("mediaType")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or(meta.content_type.clone());
        let mut info = FileInfo {
            name: Some(meta.name.clone()),
            media_type: media_type.clone(),
            size: Some(meta.size),
            text: None,
        };
        let is_text = InputKind::of(media_type.as_deref().unwrap_or("")) == InputKind::Text;
        if is_text && meta.size <= files.model.inline_text_bytes {
            match artifacts
                .read_to_end(id, Some(meta.version), files.model.inline_text_bytes)
                .await
            {
                Ok((_, bytes)) => info.text = Some(lossy_text(&bytes).0),
                Err(e) => {
                    tracing::warn!(artifact_id = %id, error = %e, "could not read a text file of the input")
                }
            }
        }
        files.known.insert(key, info);
    }
}

/// Replaces the media parts a refused call was about with notes: those whose artifact id the
/// failure's message names, else every part shown as media. Returns how many were replaced.
pub fn drop_refused(entries: &mut [Value], files: &Files, message: &str) -> usize {
    let shown = |p: &Value| {
        p.get("type").and_then(Value::as_str) == Some("media")
            && files.decide(p) == crate::agent::media::Shown::Media
    };
    let named = |p: &Value| {
        p.get("reference")
            .and_then(|r| r.get("artifactId"))
            .and_then(Value::as_str)
            .is_some_and(|id| message.contains(id))
    };
    let any_named = media_parts(entries).any(|p| shown(p) && named(p));
    let mut dropped = 0;
    for e in entries.iter_mut() {
        if e.get("kind").and_then(Value::as_str) != Some("input") {
            continue;
        }
        let Some(parts) = e
            .get_mut("event")
            .and_then(|ev| ev.get_mut("content"))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for p in parts.iter_mut() {
            if shown(p) && (!any_named || named(p)) {
                *p = files.refused_note(p);
                dropped += 1;
            }
        }
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn e(kind: &str) -> Value {
        json!({"kind": kind, "turnId": "t"})
    }

    #[test]
    fn units_cut_only_between_steps() {
        let entries = [
            e("compaction"),
            e("input"),
            e("candidate"),
            e("tool-results"),
            e("candidate"),
            e("final"),
            e("input"),
            e("input"),
            e("candidate"),
            e("tool-results"),
        ];
        assert_eq!(
            units(&entries),
            vec![
                (UnitKind::Summary, 0..1),
                (UnitKind::Input, 1..2),
                (UnitKind::Step, 2..4),
                (UnitKind::Step, 4..6),
                (UnitKind::Input, 6..8),
                (UnitKind::Step, 8..10),
            ]
        );
    }

    #[test]
    fn a_shrunk_result_keeps_its_head_tail_and_artifact() {
        let big = "x".repeat(5000);
        let entry = json!({"kind": "tool-results", "turnId": "t", "stepId": "s", "results": [
            {"callId": "a", "toolName": "bash", "kind": "completed", "output": {"stdout": big}},
            {"callId": "b", "toolName": "read", "kind": "completed", "output": "small"},
            {"callId": "c", "toolName": "read", "kind": "completed",
             "output": {"truncated": true, "artifactId": "art_1", "size": 90000, "preview": big}},
        ]});
        let s = shrink(&entry);
        let r = &s["results"];
        assert_eq!(r[1], entry["results"][1]);
        assert_eq!(r[0]["output"]["size"], json!(5000 + 13));
        assert!(json_len(&r[0]) < SHRINK_BYTES, "{}", json_len(&r[0]));
        assert_eq!(r[2]["output"]["artifactId"], "art_1");
        assert_eq!(shrink(&e("candidate")), e("candidate"));
    }

    #[test]
    fn a_pin_reads_back_and_says_what_it_is() {
        let pin = MemoryPin {
            index: Some("- /memories/a.md — a".into()),
            truncated: true,
        };
        let recorded = json!({"kind": "completed", "output": pin.value()});
        assert_eq!(MemoryPin::from_value(&recorded), Some(pin.clone()));
        assert!(pin.text().ends_with(
            "- /memories/a.md — a\n(Older memories are not listed; view /memories to see them all.)"
        ));
        assert_eq!(MemoryPin::default().value(), json!({}));
    }

    #[test]
    fn rendering_is_plain_text() {
        let entries = [
            json!({"kind": "input", "turnId": "t", "event": {"kind": "user-message", "text": "Fix it."}}),
            json!({"kind": "candidate", "turnId": "t", "stepId": "s", "candidate": {"output": [
                {"type": "text", "text": "Looking."},
                {"type": "tool-call", "id": "c", "name": "bash", "args": {"command": "ls"}}]}}),
            json!({"kind": "tool-results", "turnId": "t", "stepId": "s", "results": [
                {"callId": "c", "toolName": "bash", "kind": "completed", "output": "a.txt"}]}),
        ];
        assert_eq!(
            render(&entries),
            "User: Fix it.\nAssistant: Looking.\nAssistant called bash with \
             {\"command\":\"ls\"}\nResult of bash: a.txt"
        );
    }
}
