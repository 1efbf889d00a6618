//! A chat session's side of the context budget: what the model is shown of the transcript.
//!
//! Owns: [`ContextView`], the compacted view of a session (a summary of what the model no
//! longer sees verbatim, the messages kept, where the verbatim tail starts, which tool results
//! show as previews, whether files are still sent), stored by the front so that later turns
//! start from it; the model's messages built from the transcript and the view, each content part
//! shown, inlined or noted as [`crate::agent::media`] decides; and the view's units for the loop.
//!
//! Invariants:
//! * The transcript is never rewritten: every message stays as it was made (the BYOH front
//!   returns them all from `collect_output`); only what the model is sent changes. A summary is
//!   never a message of the transcript.
//! * A system message of the transcript (a dataset's) is always sent, never summarized.
//! * The view only ever points at messages that exist, and the units cut only between steps (an
//!   assistant message and the tool messages answering it).
//!
//! Non-goals: when to compact (`agent::context`), storage (the front's).

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::message::{ChatMessage, Role};
use crate::agent::context::{Unit, UnitKind, estimate_tokens, preview_text};
use crate::agent::media::{self, FileFacts, InputKind, ModelFiles, Shown};
use crate::floor::text::{clip_chars, lossy_text};

/// A tool message longer than this is shown as a preview once its step is shrunk.
const SHRINK_BYTES: usize = 2048;
/// How much of one message a summary call reads.
const RENDER_CHARS: usize = 4000;

/// What the model is shown of a session's transcript.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextView {
    /// The summary of everything the model no longer sees verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Messages before `from` still sent verbatim (system messages, the latest input).
    #[serde(default)]
    pub keep: Vec<usize>,
    /// The first message of the verbatim tail.
    #[serde(default)]
    pub from: usize,
    /// Tool messages below this index are sent as previews.
    #[serde(default)]
    pub preview_until: usize,
    /// The model refused a file: every file part is sent as a note.
    #[serde(default)]
    pub no_files: bool,
}

/// One message the model is sent: where it comes from in the transcript (`None`: the summary).
#[derive(Clone, Debug, PartialEq)]
pub struct Sent {
    pub index: Option<usize>,
    pub message: ChatMessage,
}

/// The text that carries a summary to the model.
pub fn summary_message(summary: &str) -> ChatMessage {
    ChatMessage::user(format!(
        "A summary of the conversation so far, which replaced its older part:\n\n{summary}"
    ))
}

/// The messages as the request carries them: the summary joined with the user message after
/// it, so that user and assistant messages still alternate (chat templates that require it
/// refuse two user messages in a row).
pub fn request_messages(sent: Vec<Sent>) -> Vec<ChatMessage> {
    let mut out: Vec<ChatMessage> = Vec::with_capacity(sent.len());
    let mut after_summary = false;
    for s in sent {
        let join = after_summary && s.message.role == Role::User;
        after_summary = s.index.is_none();
        match out.last_mut() {
            Some(summary) if join => join_user(summary, s.message),
            _ => out.push(s.message),
        }
    }
    out
}

/// Appends user message `next` to the summary message `summary`.
fn join_user(summary: &mut ChatMessage, next: ChatMessage) {
    const THEN: &str = "\n\nThe user's latest message, as they wrote it:\n\n";
    let head = summary.content.clone().unwrap_or_default();
    match next.parts {
        Some(parts) => {
            let mut joined =
                vec![json!({"type": "text", "text": format!("{head}{}", THEN.trim_end())})];
            joined.extend(parts);
            summary.content = Some(super::message::parts_text(&joined));
            summary.parts = Some(joined);
        }
        None => {
            summary.content = Some(format!("{head}{THEN}{}", next.content.unwrap_or_default()));
        }
    }
}

impl ContextView {
    /// The messages of `transcript` the model is sent (before files are shown): system
    /// messages kept, the summary, the other kept messages, then the verbatim tail.
    pub fn messages(&self, transcript: &[ChatMessage]) -> Vec<Sent> {
        let mut out = Vec::new();
        let from = self.from.min(transcript.len());
        let kept = |want_system: bool| {
            self.keep
                .iter()
                .copied()
                .filter(move |&i| i < from)
                .filter(move |&i| (transcript[i].role == Role::System) == want_system)
        };
        for i in kept(true) {
            out.push(Sent {
                index: Some(i),
                message: transcript[i].clone(),
            });
        }
        if let Some(summary) = &self.summary {
            out.push(Sent {
                index: None,
                message: summary_message(summary),
            });
        }
        for i in kept(false) {
            out.push(Sent {
                index: Some(i),
                message: transcript[i].clone(),
            });
        }
        for (i, m) in transcript.iter().enumerate().skip(from) {
            let message = if i < self.preview_until {
                shrink(m)
            } else {
                m.clone()
            };
            out.push(Sent {
                index: Some(i),
                message,
            });
        }
        out
    }
}

/// A tool message past [`SHRINK_BYTES`] as a preview (other messages as they are).
pub fn shrink(m: &ChatMessage) -> ChatMessage {
    match (&m.role, &m.content) {
        (Role::Tool, Some(text)) if text.len() > SHRINK_BYTES => ChatMessage {
            content: Some(format!(
                "[This result ({} bytes) was shortened to fit the model's context window; run \
                 the call again to see it whole.]\n{}",
                text.len(),
                preview_text(text)
            )),
            ..m.clone()
        },
        _ => m.clone(),
    }
}

/// The units of the messages the model is sent, each with the positions it covers.
pub fn units(shown: &[Sent]) -> Vec<(UnitKind, Vec<usize>)> {
    let mut out: Vec<(UnitKind, Vec<usize>)> = Vec::new();
    for (pos, s) in shown.iter().enumerate() {
        let kind = match (s.index, s.message.role) {
            (None, _) => UnitKind::Summary,
            (_, Role::System) => UnitKind::Pinned,
            (_, Role::User) => UnitKind::Input,
            (_, Role::Assistant) => UnitKind::Step,
            (_, Role::Tool) => {
                if let Some((UnitKind::Step, p)) = out.last_mut() {
                    p.push(pos);
                    continue;
                }
                UnitKind::Step
            }
        };
        match out.last_mut() {
            Some((UnitKind::Input, p)) if kind == UnitKind::Input => p.push(pos),
            _ => out.push((kind, vec![pos])),
        }
    }
    out
}

/// The units with their estimated tokens (and shrunk: their tool messages as previews).
pub fn sized_units(shown: &[Sent]) -> Vec<Unit> {
    units(shown)
        .into_iter()
        .map(|(kind, positions)| {
            let tokens: u64 = positions
                .iter()
                .map(|&p| tokens_of(&shown[p].message))
                .sum();
            let shrunk: u64 = positions
                .iter()
                .map(|&p| tokens_of(&shrink(&shown[p].message)))
                .sum();
            Unit {
                kind,
                tokens,
                shrunk: shrunk.min(tokens),
            }
        })
        .collect()
}

/// Estimated tokens of one message as sent.
pub fn tokens_of(m: &ChatMessage) -> u64 {
    estimate_tokens(&serde_json::to_string(m).unwrap_or_default())
}

/// Messages as plain text, for a summary call.
pub fn render(messages: &[&ChatMessage]) -> String {
    let mut lines = Vec::new();
    for m in messages {
        let text = clip_chars(m.content.as_deref().unwrap_or(""), RENDER_CHARS).into_owned();
        match m.role {
            Role::System => lines.push(format!("System: {text}")),
            Role::User if text.starts_with("A summary of the conversation so far") => {
                lines.push(text)
            }
            Role::User => lines.push(format!("User: {text}")),
            Role::Assistant => {
                if !text.is_empty() {
                    lines.push(format!("Assistant: {text}"));
                }
                for c in m.calls() {
                    lines.push(format!(
                        "Assistant called {} with {}",
                        c.function.name,
                        clip_chars(&c.function.arguments, 1000)
                    ));
                }
            }
            Role::Tool => lines.push(format!(
                "Result of call {}: {text}",
                m.tool_call_id.as_deref().unwrap_or("?")
            )),
        }
    }
    lines.join("\n")
}

/// What a content part carries, when it carries a file.
struct PartFile {
    media_type: String,
    name: String,
    /// Decoded size, when the part holds the bytes.
    size: Option<u64>,
    /// The bytes, when the part holds them as base64.
    data: Option<Vec<u8>>,
}

/// The file an OpenAI content part carries: `image_url` (a data URL or a link), `input_audio`,
/// or `file`; `None` for text and unknown parts.
fn part_file(part: &Value) -> Option<PartFile> {
    let kind = part.get("type").and_then(Value::as_str)?;
    match kind {
        "image_url" => {
            let url = part
                .get("image_url")
                .and_then(|u| u.get("url").or(Some(u)))
                .and_then(Value::as_str)
                .unwrap_or("");
            Some(match data_url(url) {
                Some((mt, b64)) => PartFile {
                    media_type: mt,
                    name: "image".into(),
                    size: Some(b64_size(b64)),
                    data: None,
                },
                None => PartFile {
                    media_type: "image/*".into(),
                    name: clip_chars(url, 200).into_owned(),
                    size: None,
                    data: None,
                },
            })
        }
        "input_audio" => {
            let a = part.get("input_audio").unwrap_or(&Value::Null);
            let format = a.get("format").and_then(Value::as_str).unwrap_or("wav");
            let data = a.get("data").and_then(Value::as_str).unwrap_or("");
            Some(PartFile {
                media_type: format!("audio/{format}"),
                name: "audio clip".into(),
                size: Some(b64_size(data)),
                data: None,
            })
        }
        "file" => {
            let f = part.get("file").unwrap_or(&Value::Null);
            let name = f
                .get("filename")
                .or_else(|| f.get("file_id"))
                .and_then(Value::as_str)
                .unwrap_or("a file")
                .to_owned();
            let data = f.get("file_data").and_then(Value::as_str).unwrap_or("");
            let (media_type, b64) =
                data_url(data).unwrap_or(("application/octet-stream".into(), data));
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok();
            Some(PartFile {
                media_type,
                name,
                size: bytes.as_ref().map(|b| b.len() as u64),
                data: bytes,
            })
        }
        _ => None,
    }
}

/// `data:<media type>;base64,<data>` → (media type, data).
fn data_url(url: &str) -> Option<(String, &str)> {
    let rest = url.strip_prefix("data:")?;
    let (head, data) = rest.split_once(',')?;
    let media_type = head.strip_suffix(";base64").unwrap_or(head);
    Some((media_type.to_owned(), data))
}

fn b64_size(b64: &str) -> u64 {
    let n = b64.trim_end_matches('=').len() as u64;
    n * 3 / 4
}

/// What the model cannot read in a chat, and how to say so: the files are the user's message.
const CHAT_HINT: &str = "Ask the user for what it holds if you need it.";

/// `m` as the model is sent it: each file part shown, inlined as text, or a note, by
/// `files`; every file part a note when `no_files`.
pub fn show_files(m: &ChatMessage, files: &ModelFiles, no_files: bool) -> ChatMessage {
    let Some(parts) = &m.parts else {
        return m.clone();
    };
    let shown: Vec<Value> = parts
        .iter()
        .map(|p| {
            let Some(f) = part_file(p) else {
                return p.clone();
            };
            let facts = FileFacts {
                name: &f.name,
                media_type: &f.media_type,
                size: f.size,
            };
            if no_files {
                return json!({"type": "text", "text": media::refused_note(&facts, CHAT_HINT)});
            }
            match files.decide(&facts, CHAT_HINT) {
                Shown::Media => p.clone(),
                Shown::Note(text) => json!({"type": "text", "text": text}),
                Shown::InlineText => match &f.data {
                    Some(bytes) => json!({"type": "text", "text": format!(
                        "[Attached file {} ({}), its text follows.]\n{}",
                        f.name,
                        f.media_type,
                        lossy_text(bytes).0
                    )}),
                    None => json!({"type": "text", "text": media::note(
                        &facts, "Its text could not be read", CHAT_HINT)}),
                },
            }
        })
        .collect();
    ChatMessage {
        parts: Some(shown),
        ..m.clone()
    }
}

/// Whether `m`, as shown, still sends a file part.
pub fn sends_files(m: &ChatMessage) -> bool {
    m.parts
        .iter()
        .flatten()
        .filter_map(part_file)
        .any(|f| InputKind::of(&f.media_type) != InputKind::Text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::message::ToolCall;
    use pretty_assertions::assert_eq;

    fn transcript() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("Be precise."),
            ChatMessage::user("Count the files."),
            ChatMessage::assistant(String::new(), vec![ToolCall::new("a", "bash", "{}".into())]),
            ChatMessage::tool("a", "x".repeat(5000)),
            ChatMessage::assistant(String::new(), vec![ToolCall::new("b", "bash", "{}".into())]),
            ChatMessage::tool("b", "3"),
        ]
    }

    #[test]
    fn a_view_sends_system_summary_input_and_tail() {
        let t = transcript();
        let view = ContextView {
            summary: Some("Ran ls.".into()),
            keep: vec![0, 1],
            from: 4,
            preview_until: 0,
            no_files: false,
        };
        let shown = view.messages(&t);
        let idx: Vec<Option<usize>> = shown.iter().map(|s| s.index).collect();
        assert_eq!(idx, [Some(0), None, Some(1), Some(4), Some(5)]);
        assert_eq!(
            units(&shown),
            vec![
                (UnitKind::Pinned, vec![0]),
                (UnitKind::Summary, vec![1]),
                (UnitKind::Input, vec![2]),
                (UnitKind::Step, vec![3, 4]),
            ]
        );
        // The default view is the whole transcript; a shrunk step previews its big result.
        let all = ContextView {
            preview_until: 6,
            ..ContextView::default()
        };
        let shown = all.messages(&t);
        assert_eq!(shown.len(), 6);
        let text = shown[3].message.content.as_deref().unwrap();
        assert!(
            text.starts_with("[This result (5000 bytes) was shortened"),
            "{text}"
        );
        assert!(text.len() < 2000);
        let sized = sized_units(&ContextView::default().messages(&t));
        assert!(sized[2].shrunk < sized[2].tokens);
        // In the request, the summary and the input are one user message.
        let request = request_messages(view.messages(&t));
        assert_eq!(request.len(), 4);
        assert_eq!(
            request[1].content.as_deref(),
            Some(
                "A summary of the conversation so far, which replaced its older part:\n\nRan \
                 ls.\n\nThe user's latest message, as they wrote it:\n\nCount the files."
            )
        );
    }

    #[test]
    fn files_a_model_cannot_read_become_notes() {
        let m: ChatMessage = serde_json::from_value(json!({"role": "user", "content": [
            {"type": "text", "text": "Look:"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAAAAAA"}},
            {"type": "file", "file": {"filename": "a.txt", "file_data": "data:text/plain;base64,aGk="}},
        ]}))
        .unwrap();
        let text_only = ModelFiles {
            inputs: Some(vec!["text".into()]),
            ..ModelFiles::default()
        };
        let shown = show_files(&m, &text_only, false);
        assert_eq!(
            shown.parts.unwrap(),
            vec![
                json!({"type": "text", "text": "Look:"}),
                json!({"type": "text", "text": "[Attached file image (image/png, 6 bytes). This model cannot read image files, so it is not shown here. Ask the user for what it holds if you need it.]"}),
                json!({"type": "text", "text": "[Attached file a.txt (text/plain), its text follows.]\nhi"}),
            ]
        );
        let vision = ModelFiles {
            inputs: Some(vec!["text".into(), "image".into()]),
            ..ModelFiles::default()
        };
        let shown = show_files(&m, &vision, false);
        assert!(sends_files(&shown));
        assert!(!sends_files(&show_files(&m, &vision, true)));
    }
}
