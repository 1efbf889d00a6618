//! The session's transcript (v5 §6): its entries, the prompt a model call is built from, and the
//! edits a segment reports.
//!
//! Owns: the five entry kinds (`input`, `candidate`, `tool-results`, `final`, `compaction`) as
//! podhost writes them ([`Entry`], serialized once, where it joins the transcript), the
//! projection of instructions, the pinned memory index and the entries into a `ModelCall` prompt
//! (v2 notes §4.1) — each file part shown, inlined or noted as [`crate::agent::media`] decides —
//! and [`updates`]: `{keep, entries, length}` edits from the transcript a segment read to the one
//! it leaves, each filled up to `limits.recordEntryBytes`, the first edit of a compaction marked
//! `kind: "compaction"` with its facts (v5 §6).
//!
//! Invariants:
//! * Entries are kept as the JSON core stores (`serde_json::Value`), so an entry podhost did not
//!   write (or a field it does not know) passes through an edit unchanged; an [`Entry`] is the
//!   same JSON its hand-built form was, byte for byte.
//! * The projection is a pure function of its inputs: a replayed segment builds the same prompt,
//!   and so the same request hash.
//! * No edit is larger than the limit: an entry that cannot fit alone is an error, never sent
//!   (core would refuse it).
//!
//! Non-goals: deciding when to compact or what to keep (`agent::context`, with the pod's side in
//! `turn::context`).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use std::collections::HashMap;

use crate::agent::media::{self, FileFacts, ModelFiles, Shown};
use crate::agent::model::{Candidate, ResultOutcome, ToolResult};
use crate::nylorun::turn::shaping::json_len;
use crate::nylorun::turn::turn_start::{InputEvent, Message, ModelDescriptor};

/// One edit of the transcript: the first `keep` entries of the previous transcript, then
/// `entries`; the result has exactly `length` entries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranscriptUpdate {
    pub keep: usize,
    pub entries: Vec<Value>,
    pub length: usize,
    /// `"compaction"` on the first event of an edit that replaced the history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `{trigger, tokensBefore, tokensAfter, summaryEffectIds}` with `kind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Value>,
}

impl TranscriptUpdate {
    fn plain(keep: usize, entries: Vec<Value>, length: usize) -> Self {
        TranscriptUpdate {
            keep,
            entries,
            length,
            kind: None,
            compaction: None,
        }
    }
}

/// An entry that cannot fit in one record entry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "transcript entry {index} ({kind}) is {bytes} bytes as JSON, past limits.recordEntryBytes \
     ({limit} bytes)"
)]
pub struct EntryTooLarge {
    pub index: usize,
    pub kind: String,
    pub bytes: usize,
    pub limit: usize,
}

/// One transcript entry podhost writes: the five kinds of v5 §6 (`TranscriptEntrySchema`),
/// serialized once, where it joins the transcript ([`Entry::into_value`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(
    tag = "kind",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum Entry {
    /// `{kind: "input", turnId, event}`: one message of the turn's input.
    Input { turn_id: String, event: InputEvent },
    /// `{kind: "candidate", turnId, stepId, candidate}`: the model's answer of a step.
    Candidate {
        turn_id: String,
        step_id: String,
        candidate: Candidate,
    },
    /// `{kind: "tool-results", turnId, stepId, results}`: the step's tool results.
    ToolResults {
        turn_id: String,
        step_id: String,
        results: Vec<ToolResult>,
    },
    /// `{kind: "final", turnId, stepId, output}`: the turn's output.
    Final {
        turn_id: String,
        step_id: String,
        output: Value,
    },
    /// `{kind: "compaction", turnId, stepId, summary, trigger, tokensBefore, tokensAfter}`: a
    /// summary that replaced the older part (always first).
    Compaction {
        turn_id: String,
        step_id: String,
        summary: String,
        trigger: String,
        tokens_before: u64,
        tokens_after: u64,
    },
}

impl Entry {
    /// `input` for one message of the turn's input.
    pub fn input(turn_id: &str, message: &Message) -> Self {
        Entry::Input {
            turn_id: turn_id.to_owned(),
            event: InputEvent::UserMessage(message.clone()),
        }
    }

    /// The entry as the transcript keeps it: the one place it becomes JSON.
    pub fn into_value(self) -> Value {
        // Every field is a string, a number or JSON already: encoding cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

impl From<Entry> for Value {
    fn from(entry: Entry) -> Value {
        entry.into_value()
    }
}

/// What podhost learned of one file a media part names (its artifact version's metadata, and
/// its text when it is a text file within the inline cap).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileInfo {
    pub name: Option<String>,
    pub media_type: Option<String>,
    pub size: Option<u64>,
    /// The text of a text file within the cap.
    pub text: Option<String>,
}

/// How file parts reach the model: the model's facts and what is known of each file, by
/// [`file_key`].
#[derive(Clone, Debug, Default)]
pub struct Files {
    pub model: ModelFiles,
    pub known: HashMap<String, FileInfo>,
}

/// The key of a media part's file: `artifactId@version` (`@latest` without a version).
pub fn file_key(reference: &Value) -> Option<String> {
    let id = reference.get("artifactId").and_then(Value::as_str)?;
    let version = match reference.get("version") {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) => s.clone(),
        _ => "latest".to_owned(),
    };
    Some(format!("{id}@{version}"))
}

impl Files {
    /// For a model descriptor and `limits.modelFileBytes`.
    pub fn new(model: Option<&ModelDescriptor>, model_file_bytes: u64) -> Self {
        Files {
            model: ModelFiles {
                inputs: model.map(|m| m.inputs.clone()),
                max_file_bytes: Some(model_file_bytes),
                ..ModelFiles::default()
            },
            known: HashMap::new(),
        }
    }

    /// How a media part is shown: as is, its text inlined, or a note.
    pub fn decide(&self, part: &Value) -> Shown {
        let reference = part.get("reference").unwrap_or(&Value::Null);
        let info = file_key(reference)
            .and_then(|k| self.known.get(&k))
            .cloned()
            .unwrap_or_default();
        let media_type = part
            .get("mediaType")
            .and_then(Value::as_str)
            .or(info.media_type.as_deref())
            .unwrap_or("application/octet-stream");
        let facts = self.facts(part, &info, media_type);
        match self.model.decide(&facts, &read_hint(reference)) {
            Shown::InlineText if info.text.is_none() => Shown::Note(media::note(
                &facts,
                "Its text could not be read here",
                &read_hint(reference),
            )),
            other => other,
        }
    }

    fn facts<'a>(&self, part: &'a Value, info: &'a FileInfo, media_type: &'a str) -> FileFacts<'a> {
        let reference = part.get("reference").unwrap_or(&Value::Null);
        let name = reference
            .get("name")
            .and_then(Value::as_str)
            .or(info.name.as_deref())
            .or_else(|| reference.get("artifactId").and_then(Value::as_str))
            .unwrap_or("?");
        FileFacts {
            name,
            media_type,
            size: info.size,
        }
    }

    /// A content part as the model gets it: media it can read as is; a text file's text; any
    /// other file as a note naming the artifact.
    fn part(&self, part: &Value) -> Value {
        if part.get("type").and_then(Value::as_str) != Some("media") {
            return part.clone();
        }
        match self.decide(part) {
            Shown::Media => part.clone(),
            Shown::Note(text) => json!({"type": "text", "text": text}),
            Shown::InlineText => {
                let reference = part.get("reference").unwrap_or(&Value::Null);
                let info = file_key(reference)
                    .and_then(|k| self.known.get(&k))
                    .cloned()
                    .unwrap_or_default();
                let media_type = part.get("mediaType").and_then(Value::as_str).unwrap_or("");
                let facts = self.facts(part, &info, media_type);
                json!({"type": "text", "text": format!(
                    "[Attached file {} ({media_type}), its text follows.]\n{}",
                    facts.name,
                    info.text.as_deref().unwrap_or("")
                )})
            }
        }
    }

    /// A tool result's `files` (`[{mediaType, reference}]`) as prompt parts, each through
    /// [`Files::part`].
    pub fn file_parts(&self, files: Option<&Value>) -> Vec<Value> {
        files
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|f| f.get("mediaType").is_some() && f.get("reference").is_some())
            .map(|f| {
                self.part(&json!({
                    "type": "media",
                    "mediaType": f["mediaType"],
                    "reference": f["reference"],
                }))
            })
            .collect()
    }

    /// The note for a file part the model refused.
    pub fn refused_note(&self, part: &Value) -> Value {
        let reference = part.get("reference").unwrap_or(&Value::Null);
        let info = file_key(reference)
            .and_then(|k| self.known.get(&k))
            .cloned()
            .unwrap_or_default();
        let media_type = part
            .get("mediaType")
            .and_then(Value::as_str)
            .unwrap_or("application/octet-stream");
        let facts = self.facts(part, &info, media_type);
        json!({"type": "text", "text": media::refused_note(&facts, &read_hint(reference))})
    }
}

/// How the model can read a file it is not shown.
fn read_hint(reference: &Value) -> String {
    match reference.get("artifactId").and_then(Value::as_str) {
        Some(id) => format!("Call read_artifact with artifactId \"{id}\" to read it."),
        None => String::new(),
    }
}

/// The prompt: instructions, the pinned memory index (a user-role item at the head, where the
/// prefix stays cacheable), then the transcript's entries (v2 notes §4.1).
pub fn prompt(
    instructions: &str,
    pin: Option<&str>,
    entries: &[Value],
    current_turn: &str,
    files: &Files,
) -> Vec<Value> {
    let mut items = head(instructions, pin);
    items.extend(project(entries, current_turn, files));
    items
}

/// The items every prompt starts with: the instructions and the pinned memory index.
pub fn head(instructions: &str, pin: Option<&str>) -> Vec<Value> {
    let mut items = Vec::with_capacity(2);
    if !instructions.is_empty() {
        items.push(json!({
            "kind": "instructions",
            "role": "system",
            "content": [{"type": "text", "text": instructions}],
        }));
    }
    if let Some(pin) = pin {
        items.push(
            json!({"kind": "message", "role": "user", "content": [{"type": "text", "text": pin}]}),
        );
    }
    items
}

/// The prompt items of `entries`.
pub fn project(entries: &[Value], current_turn: &str, files: &Files) -> Vec<Value> {
    let mut items = Vec::with_capacity(entries.len());
    for entry in entries {
        project_entry(entry, current_turn, files, &mut items);
    }
    items
}

fn project_entry(entry: &Value, current_turn: &str, media: &Files, out: &mut Vec<Value>) {
    let kind = entry.get("kind").and_then(Value::as_str).unwrap_or("");
    match kind {
        "input" => {
            let event = entry.get("event").unwrap_or(&Value::Null);
            let event_kind = event.get("kind").and_then(Value::as_str).unwrap_or("");
            if !matches!(event_kind, "user-message" | "interrupt") {
                return;
            }
            let content: Vec<Value> = if let Some(text) = event.get("text").and_then(Value::as_str)
            {
                vec![json!({"type": "text", "text": text})]
            } else if let Some(parts) = event.get("content").and_then(Value::as_array) {
                parts.iter().map(|p| media.part(p)).collect()
            } else {
                return;
            };
            out.push(json!({"kind": "message", "role": "user", "content": content}));
        }
        "candidate" => {
            let turn = entry.get("turnId").and_then(Value::as_str).unwrap_or("");
            let blocks = entry
                .get("candidate")
                .and_then(|c| c.get("output"))
                .and_then(Value::as_array);
            let content: Vec<Value> = blocks
                .into_iter()
                .flatten()
                .filter_map(|b| assistant_part(b, turn == current_turn))
                .collect();
            if !content.is_empty() {
                out.push(json!({"kind": "message", "role": "assistant", "content": content}));
            }
        }
        "tool-results" => {
            let results = entry.get("results").and_then(Value::as_array);
            for r in results.into_iter().flatten() {
                out.push(tool_result_item(r, media));
            }
        }
        "compaction" => {
            let summary = entry.get("summary").and_then(Value::as_str).unwrap_or("");
            out.push(json!({
                "kind": "message",
                "role": "user",
                "content": [{"type": "text", "text": format!(
                    "A summary of the conversation so far, which replaced its older part:\n\n{summary}"
                )}],
            }));
        }
        // `final` repeats the last candidate's text; anything else is not for the model.
        _ => {}
    }
}

/// One block of a recorded answer as a prompt part. Reasoning goes back only when the provider
/// gave metadata to replay it with (and, for `replay: "turn"`, only within its own turn).
fn assistant_part(block: &Value, same_turn: bool) -> Option<Value> {
    let pm = block.get("providerMetadata").filter(|v| !v.is_null());
    let with_pm = |mut part: Value| {
        if let Some(pm) = pm {
            part["providerMetadata"] = pm.clone();
        }
        part
    };
    match block.get("type").and_then(Value::as_str)? {
        "text" => Some(with_pm(
            json!({"type": "text", "text": block.get("text").cloned().unwrap_or_default()}),
        )),
        "reasoning" => {
            let pm = pm?;
            if pm.get("replay").and_then(Value::as_str) == Some("turn") && !same_turn {
                return None;
            }
            Some(with_pm(
                json!({"type": "reasoning", "text": block.get("text").cloned().unwrap_or_default()}),
            ))
        }
        "json" => Some(json!({
            "type": "text",
            "text": block.get("value").map(Value::to_string).unwrap_or_default(),
        })),
        "tool-call" => Some(with_pm(json!({
            "type": "tool-call",
            "id": block.get("id").cloned().unwrap_or_default(),
            "name": block.get("name").cloned().unwrap_or_default(),
            "args": block.get("args").cloned().unwrap_or_else(|| json!({})),
        }))),
        _ => None,
    }
}

/// A tool result as a `tool-result` prompt item: its payload as JSON text, then its files as
/// the media rule ([`Files::part`]) shows them.
fn tool_result_item(result: &Value, media: &Files) -> Value {
    let parsed = ToolResult::deserialize(result).ok();
    let (status, payload) = match parsed.as_ref().map(|r| &r.outcome) {
        Some(ResultOutcome::Completed { output, .. }) => ("completed", output.clone()),
        Some(ResultOutcome::Denied { reason }) => {
            ("denied", json!({"kind": "denied", "reason": reason}))
        }
        Some(f @ ResultOutcome::Failed { .. }) => {
            ("failed", serde_json::to_value(f).unwrap_or(Value::Null))
        }
        None => ("failed", result.clone()),
    };
    let mut content = vec![json!({"type": "text", "text": payload.to_string()})];
    content.extend(media.file_parts(result.get("files")));
    json!({
        "kind": "tool-result",
        "toolCallId": result.get("callId").cloned().unwrap_or_default(),
        "toolName": result.get("toolName").cloned().unwrap_or_default(),
        "status": status,
        "content": content,
    })
}

/// The edits that turn `before` into `after`, each at most `limit` bytes as JSON; with
/// `compaction` facts, the first is marked `kind: "compaction"` and carries them (v5 §6).
pub fn marked_updates(
    before: &[Value],
    after: &[Value],
    limit: usize,
    compaction: Option<&Value>,
) -> Result<Vec<TranscriptUpdate>, EntryTooLarge> {
    let Some(facts) = compaction else {
        return updates(before, after, limit);
    };
    let room = limit.saturating_sub(json_len(facts) + 36);
    let mut edits = updates(before, after, room)?;
    if let Some(first) = edits.first_mut() {
        first.kind = Some("compaction".to_owned());
        first.compaction = Some(facts.clone());
    }
    Ok(edits)
}

/// The edits that turn `before` into `after`, each at most `limit` bytes as JSON.
///
/// `keep` is the longest common prefix. Identical transcripts need no edit; a pure truncation is
/// one edit with no entries; otherwise the new tail is cut into edits filled greedily up to the
/// limit, applied in order (each `keep` is the previous edit's `length`).
pub fn updates(
    before: &[Value],
    after: &[Value],
    limit: usize,
) -> Result<Vec<TranscriptUpdate>, EntryTooLarge> {
    let keep = before.iter().zip(after).take_while(|(a, b)| a == b).count();
    if keep == before.len() && keep == after.len() {
        return Ok(Vec::new());
    }
    if keep == after.len() {
        return Ok(vec![TranscriptUpdate::plain(keep, Vec::new(), keep)]);
    }
    let mut out = Vec::new();
    let mut current = TranscriptUpdate::plain(keep, Vec::new(), keep);
    let mut bytes = 0usize;
    for (i, entry) in after.iter().enumerate().skip(keep) {
        let size = json_len(entry);
        let alone = update_bytes(current.length, current.length + 1, size);
        if current.entries.is_empty() && alone > limit {
            return Err(too_large(i, entry, alone, limit));
        }
        let n = current.entries.len();
        let grown = update_bytes(current.keep, current.keep + n + 1, bytes + size + n);
        if n > 0 && grown > limit {
            let next_keep = current.length;
            out.push(std::mem::replace(
                &mut current,
                TranscriptUpdate::plain(next_keep, Vec::new(), next_keep),
            ));
            bytes = 0;
            let alone = update_bytes(next_keep, next_keep + 1, size);
            if alone > limit {
                return Err(too_large(i, entry, alone, limit));
            }
        }
        current.entries.push(entry.clone());
        current.length += 1;
        bytes += size;
    }
    out.push(current);
    Ok(out)
}

fn too_large(index: usize, entry: &Value, bytes: usize, limit: usize) -> EntryTooLarge {
    EntryTooLarge {
        index,
        kind: entry
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_owned(),
        bytes,
        limit,
    }
}

/// `{"keep":K,"entries":[…],"length":L}` is 32 bytes plus the digits plus the entries (their
/// bytes and the commas between them, `entries_bytes`).
fn update_bytes(keep: usize, length: usize, entries_bytes: usize) -> usize {
    32 + digits(keep) + digits(length) + entries_bytes
}

fn digits(n: usize) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Why core would refuse an edit of a transcript.
#[cfg(test)]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FoldError {
    /// Edit `edit` keeps more entries than the transcript has.
    #[error("edit {edit} keeps {keep} entries of {len}")]
    KeepsTooMany {
        edit: usize,
        keep: usize,
        len: usize,
    },
    /// Edit `edit` leaves a transcript of another length than it states.
    #[error("edit {edit} leaves {len} entries, not its length {length}")]
    WrongLength {
        edit: usize,
        len: usize,
        length: usize,
    },
}

/// Applies edits to a transcript, as core folds them.
#[cfg(test)]
pub fn fold(transcript: &[Value], edits: &[TranscriptUpdate]) -> Result<Vec<Value>, FoldError> {
    let mut t = transcript.to_vec();
    for (edit, e) in edits.iter().enumerate() {
        if e.keep > t.len() {
            return Err(FoldError::KeepsTooMany {
                edit,
                keep: e.keep,
                len: t.len(),
            });
        }
        t.truncate(e.keep);
        t.extend(e.entries.iter().cloned());
        if t.len() != e.length {
            return Err(FoldError::WrongLength {
                edit,
                len: t.len(),
                length: e.length,
            });
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::model::{Block, ToolCallBlock};
    use pretty_assertions::assert_eq;

    fn entry(n: usize, pad: usize) -> Value {
        json!({"kind": "final", "turnId": "t", "stepId": format!("s{n}"), "output": "x".repeat(pad)})
    }

    /// Each kind as the hand-built JSON of earlier builds had it, byte for byte: a replayed
    /// segment's edits and request hashes depend on it.
    #[test]
    fn each_entry_kind_is_the_json_core_stores() {
        let candidate = Candidate::text("hi");
        let results = vec![ToolResult {
            call_id: "c1".into(),
            tool_name: "bash".into(),
            outcome: ResultOutcome::failed("sandbox.x", "no"),
        }];
        let ids = || ("t".to_owned(), "s0".to_owned());
        let cases = [
            (
                Entry::input(
                    "t",
                    &Message::Text {
                        text: "hello".into(),
                        metadata: Some(json!({"from": "web"})),
                    },
                ),
                json!({"kind": "input", "turnId": "t", "event":
                       {"kind": "user-message", "text": "hello", "metadata": {"from": "web"}}}),
            ),
            (
                Entry::input(
                    "t",
                    &Message::Content {
                        content: vec![json!({"type": "text", "text": "a"})],
                        metadata: None,
                    },
                ),
                json!({"kind": "input", "turnId": "t", "event":
                       {"kind": "user-message", "content": [{"type": "text", "text": "a"}]}}),
            ),
            (
                Entry::Candidate {
                    turn_id: ids().0,
                    step_id: ids().1,
                    candidate: candidate.clone(),
                },
                json!({"kind": "candidate", "turnId": "t", "stepId": "s0",
                       "candidate": serde_json::to_value(&candidate).unwrap()}),
            ),
            (
                Entry::ToolResults {
                    turn_id: ids().0,
                    step_id: ids().1,
                    results: results.clone(),
                },
                json!({"kind": "tool-results", "turnId": "t", "stepId": "s0", "results":
                       [{"callId": "c1", "toolName": "bash", "kind": "failed",
                         "code": "sandbox.x", "message": "no"}]}),
            ),
            (
                Entry::Final {
                    turn_id: ids().0,
                    step_id: ids().1,
                    output: json!("done"),
                },
                json!({"kind": "final", "turnId": "t", "stepId": "s0", "output": "done"}),
            ),
            (
                Entry::Compaction {
                    turn_id: ids().0,
                    step_id: ids().1,
                    summary: "so far".into(),
                    trigger: "threshold".into(),
                    tokens_before: 900,
                    tokens_after: 40,
                },
                json!({"kind": "compaction", "turnId": "t", "stepId": "s0", "summary": "so far",
                       "trigger": "threshold", "tokensBefore": 900, "tokensAfter": 40}),
            ),
        ];
        for (entry, expected) in cases {
            assert_eq!(
                serde_json::to_string(&entry.into_value()).unwrap(),
                serde_json::to_string(&expected).unwrap()
            );
        }
    }

    #[test]
    fn updates_fill_each_event_up_to_the_limit_and_fold_back() {
        let before: Vec<Value> = (0..3).map(|i| entry(i, 10)).collect();
        let mut after = before[..2].to_vec();
        after.extend((10..20).map(|i| entry(i, 100)));
        let limit = 400;
        let edits = updates(&before, &after, limit).unwrap();
        assert!(edits.len() > 1);
        assert_eq!(edits[0].keep, 2);
        for pair in edits.windows(2) {
            assert_eq!(pair[1].keep, pair[0].length);
        }
        for e in &edits {
            let size = serde_json::to_string(e).unwrap().len();
            assert!(size <= limit, "{size} > {limit}");
            assert!(!e.entries.is_empty());
        }
        // Greedy: no edit could have taken the next one's first entry.
        for pair in edits.windows(2) {
            let mut grown = pair[0].clone();
            grown.entries.push(pair[1].entries[0].clone());
            grown.length += 1;
            assert!(serde_json::to_string(&grown).unwrap().len() > limit);
        }
        assert_eq!(fold(&before, &edits).unwrap(), after);
    }

    #[test]
    fn identical_truncated_and_oversized_transcripts() {
        let t: Vec<Value> = (0..3).map(|i| entry(i, 1)).collect();
        assert_eq!(updates(&t, &t, 1000).unwrap(), vec![]);
        assert_eq!(
            updates(&t, &t[..1], 1000).unwrap(),
            vec![TranscriptUpdate::plain(1, vec![], 1)]
        );
        let big = vec![entry(0, 500)];
        let err = updates(&[], &big, 300).unwrap_err();
        assert_eq!(
            err.to_string(),
            "transcript entry 0 (final) is 589 bytes as JSON, past limits.recordEntryBytes (300 \
             bytes)"
        );
        // Exactly at the limit fits.
        let exact = updates(&[], &big, 589).unwrap();
        assert_eq!(serde_json::to_string(&exact[0]).unwrap().len(), 589);
    }

    #[test]
    fn the_prompt_projects_every_kind() {
        let candidate = Candidate {
            output: vec![
                Block::Reasoning {
                    text: "think".into(),
                    provider_metadata: None,
                },
                Block::Reasoning {
                    text: "signed".into(),
                    provider_metadata: Some(json!({"sig": "x"})),
                },
                Block::Text {
                    text: "Let me look.".into(),
                    provider_metadata: None,
                },
                Block::ToolCall(ToolCallBlock::from_json_arguments(
                    "c1".into(),
                    "bash".into(),
                    r#"{"command":"ls"}"#,
                )),
            ],
            ..Candidate::default()
        };
        let results = [ToolResult {
            call_id: "c1".into(),
            tool_name: "bash".into(),
            outcome: ResultOutcome::Completed {
                output: json!({"exitCode": 0}),
                files: None,
            },
        }];
        let entries = vec![
            Entry::input(
                "t",
                &Message::Content {
                    content: vec![
                        json!({"type": "text", "text": "see"}),
                        json!({"type": "media", "mediaType": "text/csv",
                               "reference": {"artifactId": "a1", "version": 2, "name": "d.csv"}}),
                        json!({"type": "media", "mediaType": "image/png",
                               "reference": {"artifactId": "a2", "version": 1}}),
                    ],
                    metadata: None,
                },
            )
            .into(),
            Entry::Candidate {
                turn_id: "t".into(),
                step_id: "s0".into(),
                candidate,
            }
            .into(),
            Entry::ToolResults {
                turn_id: "t".into(),
                step_id: "s0".into(),
                results: results.to_vec(),
            }
            .into(),
            Entry::Final {
                turn_id: "t".into(),
                step_id: "s1".into(),
                output: json!("done"),
            }
            .into(),
        ];
        let text_only = ModelDescriptor {
            inputs: vec!["text".into()],
            ..ModelDescriptor::default()
        };
        let mut files = Files::new(Some(&text_only), 8 << 20);
        files.known.insert(
            "a1@2".into(),
            FileInfo {
                size: Some(6),
                text: Some("a,b\n1,2".into()),
                ..FileInfo::default()
            },
        );
        files.known.insert(
            "a2@1".into(),
            FileInfo {
                size: Some(2048),
                name: Some("chart.png".into()),
                ..FileInfo::default()
            },
        );
        let p = prompt(
            "Be brief.",
            Some("Your memories: none."),
            &entries,
            "t",
            &files,
        );
        assert_eq!(
            p,
            vec![
                json!({"kind": "instructions", "role": "system",
                       "content": [{"type": "text", "text": "Be brief."}]}),
                json!({"kind": "message", "role": "user",
                       "content": [{"type": "text", "text": "Your memories: none."}]}),
                json!({"kind": "message", "role": "user", "content": [
                    {"type": "text", "text": "see"},
                    {"type": "text", "text": "[Attached file d.csv (text/csv), its text follows.]\na,b\n1,2"},
                    {"type": "text", "text": "[Attached file chart.png (image/png, 2048 bytes). This model cannot read image files, so it is not shown here. Call read_artifact with artifactId \"a2\" to read it.]"},
                ]}),
                json!({"kind": "message", "role": "assistant", "content": [
                    {"type": "reasoning", "text": "signed", "providerMetadata": {"sig": "x"}},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool-call", "id": "c1", "name": "bash", "args": {"command": "ls"}},
                ]}),
                json!({"kind": "tool-result", "toolCallId": "c1", "toolName": "bash",
                       "status": "completed", "content": [{"type": "text", "text": "{\"exitCode\":0}"}]}),
            ]
        );
        // Without a descriptor, media the gate may read pass through; a text file whose text
        // could not be read is a note.
        let p = prompt("", None, &entries[..1], "t", &Files::default());
        assert_eq!(
            p[0]["content"][2],
            json!({"type": "media", "mediaType": "image/png", "reference": {"artifactId": "a2", "version": 1}})
        );
        assert_eq!(
            p[0]["content"][1]["text"],
            "[Attached file d.csv (text/csv). Its text could not be read here, so it is not shown \
             here. Call read_artifact with artifactId \"a1\" to read it.]"
        );
        // An image past modelFileBytes is a note too.
        let vision = ModelDescriptor {
            inputs: vec!["text".into(), "image".into()],
            ..ModelDescriptor::default()
        };
        let mut small = Files::new(Some(&vision), 1024);
        small.known = files.known.clone();
        let p = prompt("", None, &entries[..1], "t", &small);
        assert_eq!(
            p[0]["content"][2]["text"],
            "[Attached file chart.png (image/png, 2048 bytes). It is past the 1024 bytes a model \
             may be shown, so it is not shown here. Call read_artifact with artifactId \"a2\" to \
             read it.]"
        );
    }

    #[test]
    fn a_tool_results_files_go_through_the_same_rule() {
        let files = json!([{"mediaType": "image/png",
                            "reference": {"artifactId": "a1", "version": 1, "name": "x.png"}}]);
        let vision = ModelDescriptor {
            inputs: vec!["text".into(), "image".into()],
            ..ModelDescriptor::default()
        };
        let text_only = ModelDescriptor {
            inputs: vec!["text".into()],
            ..ModelDescriptor::default()
        };
        let images = Files::new(Some(&vision), 8 << 20);
        assert_eq!(
            images.file_parts(Some(&files)),
            vec![json!({"type": "media", "mediaType": "image/png",
                        "reference": {"artifactId": "a1", "version": 1, "name": "x.png"}})]
        );
        assert_eq!(
            Files::new(Some(&text_only), 8 << 20).file_parts(Some(&files)),
            vec![
                json!({"type": "text", "text": "[Attached file x.png (image/png). This model \
                cannot read image files, so it is not shown here. Call read_artifact with \
                artifactId \"a1\" to read it.]"})
            ]
        );
        assert_eq!(images.file_parts(None), Vec::<Value>::new());
        // A text file a tool returned is never sent as media: the gate would refuse it.
        let csv = json!([{"mediaType": "text/csv", "reference": {"artifactId": "a3"}}]);
        assert_eq!(images.file_parts(Some(&csv))[0]["type"], "text");
    }
}
