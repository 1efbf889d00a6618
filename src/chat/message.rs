//! Chat messages in the OpenAI format, the model endpoint, and the model API key.
//!
//! Owns: [`ChatMessage`] and its parts (the shape the BYOH protocol and OpenAI-compatible servers
//! share; `content` as a string, or as OpenAI content parts — text, `image_url`, `input_audio`,
//! `file` — kept as given), [`ModelEndpoint`] (a base URL, a model and generation settings: what
//! may be stored), [`ApiKey`], whose `Debug` prints `[redacted]` and which is never
//! serialized, and [`KeySource`], where a session's calls get their key.
//!
//! Non-goals: the BYOH protocol's rules for messages (`byoh::protocol` checks them).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use url::Url;

/// A model API key. Kept in memory only; `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct ApiKey(String);

impl ApiKey {
    pub fn new(key: impl Into<String>) -> Self {
        ApiKey(key.into())
    }

    /// The key itself, for the `Authorization` header and for scrubbing text.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Where a session's model calls get their key: a key fixed for the session (local use), or
/// the latest one its front was given (a retried BYOH submission brings a fresh one). Apart
/// from the messages a front keeps, so that the key never passes through their sink.
#[derive(Clone)]
pub struct KeySource(Arc<dyn Fn() -> Option<ApiKey> + Send + Sync>);

impl KeySource {
    /// Always `key`.
    pub fn fixed(key: Option<ApiKey>) -> Self {
        KeySource(Arc::new(move || key.clone()))
    }

    /// Whatever `latest` answers at each call.
    pub fn latest(latest: impl Fn() -> Option<ApiKey> + Send + Sync + 'static) -> Self {
        KeySource(Arc::new(latest))
    }

    /// The key for the next model call.
    pub fn key(&self) -> Option<ApiKey> {
        (self.0)()
    }
}

impl fmt::Debug for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeySource([redacted])")
    }
}

/// An optional field that, when present, must not be `null` (Oumi omits null fields, so a null
/// is a malformed body).
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// One chat message, in the OpenAI format.
///
/// Fields past the protocol's (a dataset row's `name`, say) are accepted and dropped: rows
/// come from datasets, and refusing one would fail the row for nothing podhost reads. Only the
/// protocol's fields are ever sent back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "WireMessage", into = "WireMessage")]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: Role,
    /// The text (of content parts: their text parts joined); omitted (never `null`) when the
    /// message is only tool calls.
    pub content: Option<String>,
    /// The content parts, when the message came with parts rather than a string; sent back as
    /// parts.
    pub parts: Option<Vec<Value>>,
    /// Assistant only: the calls the model made.
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Tool only: the id of the call this message answers.
    pub tool_call_id: Option<String>,
}

/// A message as it crosses the wire: `content` a string or a list of parts.
#[derive(Serialize, Deserialize)]
struct WireMessage {
    role: Role,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<WireContent>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    tool_calls: Option<Vec<ToolCall>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    tool_call_id: Option<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum WireContent {
    Text(String),
    Parts(Vec<Value>),
}

/// Why a message's content parts cannot be taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
enum PartsError {
    /// Parts on a message of this role (its wire name).
    #[error(
        "content: a {0} message's content is a string; content parts are for system and user \
         messages"
    )]
    NotForRole(String),
    #[error("content: an empty list of content parts")]
    Empty,
    #[error("content[{0}]: a content part is an object with a string `type`")]
    Untyped(usize),
    #[error("content[{0}]: a text part's `text` is a string")]
    TextNotString(usize),
}

impl TryFrom<WireMessage> for ChatMessage {
    type Error = PartsError;

    /// Content parts are a system or user message's (as the OpenAI format has them for
    /// attachments): at least one, each an object with a string `type`, a `text` part with its
    /// text a string.
    fn try_from(w: WireMessage) -> Result<Self, PartsError> {
        let (content, parts) = match w.content {
            None => (None, None),
            Some(WireContent::Text(t)) => (Some(t), None),
            Some(WireContent::Parts(parts)) => {
                check_parts(w.role, &parts)?;
                (Some(parts_text(&parts)), Some(parts))
            }
        };
        Ok(ChatMessage {
            role: w.role,
            content,
            parts,
            tool_calls: w.tool_calls,
            tool_call_id: w.tool_call_id,
        })
    }
}

/// Why content parts cannot be taken, if they cannot.
fn check_parts(role: Role, parts: &[Value]) -> Result<(), PartsError> {
    if !matches!(role, Role::System | Role::User) {
        return Err(PartsError::NotForRole(
            serde_json::to_value(role)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        ));
    }
    if parts.is_empty() {
        return Err(PartsError::Empty);
    }
    for (i, part) in parts.iter().enumerate() {
        let kind = part.get("type").and_then(Value::as_str);
        match kind {
            None => return Err(PartsError::Untyped(i)),
            Some("text") if !part.get("text").is_some_and(Value::is_string) => {
                return Err(PartsError::TextNotString(i));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

impl From<ChatMessage> for WireMessage {
    fn from(m: ChatMessage) -> Self {
        let content = match (m.parts, m.content) {
            (Some(parts), _) => Some(WireContent::Parts(parts)),
            (None, Some(t)) => Some(WireContent::Text(t)),
            (None, None) => None,
        };
        WireMessage {
            role: m.role,
            content,
            tool_calls: m.tool_calls,
            tool_call_id: m.tool_call_id,
        }
    }
}

/// The text parts of content parts, joined by newlines.
pub fn parts_text(parts: &[Value]) -> String {
    parts
        .iter()
        .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of a model's `content` — a string, an array of text parts, or absent — as the
/// client reads it from an answer and the stream reads it from each delta: leniently (a part
/// that is a bare string counts) and joined without a separator, as a stream's pieces are.
pub(crate) fn content_text(c: Option<&Value>) -> String {
    match c {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str).or_else(|| p.as_str()))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

impl ChatMessage {
    pub fn system(text: impl Into<String>) -> Self {
        ChatMessage {
            role: Role::System,
            content: Some(text.into()),
            parts: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }

    pub fn user(text: impl Into<String>) -> Self {
        ChatMessage {
            role: Role::User,
            ..ChatMessage::system(text)
        }
    }

    /// An assistant message: `content` is omitted when there are calls and no text, and is `""`
    /// when there is neither (the protocol requires content unless `tool_calls` is set).
    pub fn assistant(text: String, calls: Vec<ToolCall>) -> Self {
        let content = if text.is_empty() && !calls.is_empty() {
            None
        } else {
            Some(text)
        };
        ChatMessage {
            role: Role::Assistant,
            content,
            parts: None,
            tool_calls: (!calls.is_empty()).then_some(calls),
            tool_call_id: None,
        }
    }

    pub fn tool(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        ChatMessage {
            role: Role::Tool,
            content: Some(text.into()),
            parts: None,
            tool_calls: None,
            tool_call_id: Some(call_id.into()),
        }
    }

    /// The calls of an assistant message (none for other roles).
    pub fn calls(&self) -> &[ToolCall] {
        self.tool_calls.as_deref().unwrap_or_default()
    }
}

/// A message's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// One tool call of an assistant message.
///
/// Fields past the protocol's (a dataset row's `name`, say) are accepted and dropped: rows
/// come from datasets, and refusing one would fail the row for nothing podhost reads. Only the
/// protocol's fields are ever sent back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Non-empty, unique within the session.
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: FunctionCall,
}

/// The only kind of tool call: `"function"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    Function,
}

/// The function a tool call names.
///
/// Fields past the protocol's (a dataset row's `name`, say) are accepted and dropped: rows
/// come from datasets, and refusing one would fail the row for nothing podhost reads. Only the
/// protocol's fields are ever sent back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as a JSON string.
    pub arguments: String,
}

impl ToolCall {
    pub fn new(id: impl Into<String>, name: impl Into<String>, arguments: String) -> Self {
        ToolCall {
            id: id.into(),
            kind: FunctionKind::Function,
            function: FunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

/// Where and what to ask: an OpenAI-compatible base URL, the model, and the settings merged
/// into every request. Everything of a connection but its key, so it may be stored.
///
/// The base URL was parsed where it entered podhost (a submission, a flag); stored, it is its
/// text, parsed again only when a stored row is read back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelEndpoint {
    #[serde(with = "url_text")]
    pub base_url: Url,
    pub model: String,
    #[serde(default)]
    pub generation_settings: Map<String, Value>,
}

impl ModelEndpoint {
    /// `{base_url}/{path}`: the base URL's path without its trailing slashes, then `path`; its
    /// query stays where it is.
    pub fn url(&self, path: &str) -> Url {
        let mut url = self.base_url.clone();
        let joined = format!("{}/{path}", url.path().trim_end_matches('/'));
        url.set_path(&joined);
        url
    }
}

/// A URL as its text (how a stored endpoint holds it).
mod url_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use url::Url;

    pub fn serialize<S: Serializer>(url: &Url, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(url.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Url, D::Error> {
        let text = String::deserialize(d)?;
        Url::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn a_key_source_answers_the_latest_key_and_never_prints_it() {
        let fixed = KeySource::fixed(Some(ApiKey::new("sk-fixed")));
        assert_eq!(fixed.key(), Some(ApiKey::new("sk-fixed")));
        let latest = Arc::new(std::sync::Mutex::new(None));
        let source = {
            let latest = latest.clone();
            KeySource::latest(move || latest.lock().unwrap().clone())
        };
        assert_eq!(source.key(), None);
        *latest.lock().unwrap() = Some(ApiKey::new("sk-fresh"));
        assert_eq!(source.key(), Some(ApiKey::new("sk-fresh")));
        assert_eq!(format!("{fixed:?}"), "KeySource([redacted])");
    }

    #[test]
    fn an_endpoint_url_joins_the_base_path_and_keeps_the_query() {
        let at = |base: &str| ModelEndpoint {
            base_url: Url::parse(base).unwrap(),
            model: "m".into(),
            generation_settings: Map::new(),
        };
        let cases = [
            ("http://h/v1", "http://h/v1/chat/completions"),
            ("http://h/v1//", "http://h/v1/chat/completions"),
            ("http://h", "http://h/chat/completions"),
            ("https://h:8443/a/b/", "https://h:8443/a/b/chat/completions"),
            (
                "https://h/v1?api-version=2",
                "https://h/v1/chat/completions?api-version=2",
            ),
        ];
        for (base, want) in cases {
            assert_eq!(at(base).url("chat/completions").as_str(), want, "{base}");
        }
        let stored = serde_json::to_value(at("http://u:p@h/v1")).unwrap();
        assert_eq!(stored["base_url"], "http://u:p@h/v1");
        let back: ModelEndpoint = serde_json::from_value(stored).unwrap();
        assert_eq!(back, at("http://u:p@h/v1"));
    }

    #[test]
    fn content_parts_round_trip_and_read_as_text() {
        let wire = json!({"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "Be brief."},
        ]});
        let m: ChatMessage = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(m.content.as_deref(), Some("What is this?\nBe brief."));
        assert_eq!(m.parts.as_ref().map(Vec::len), Some(3));
        assert_eq!(serde_json::to_value(&m).unwrap(), wire);
        let plain = json!({"role": "user", "content": "hi"});
        let m: ChatMessage = serde_json::from_value(plain.clone()).unwrap();
        assert_eq!((m.content.as_deref(), m.parts), (Some("hi"), None));
        assert_eq!(
            serde_json::to_value(ChatMessage::user("hi")).unwrap(),
            plain
        );
        let null: ChatMessage =
            serde_json::from_value(json!({"role": "assistant", "content": null})).unwrap();
        assert_eq!(null.content, None);
    }

    #[test]
    fn content_parts_that_are_not_parts_are_refused() {
        let refused = |content: serde_json::Value, role: &str| {
            serde_json::from_value::<ChatMessage>(json!({"role": role, "content": content}))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            refused(json!([null, null]), "user"),
            "content[0]: a content part is an object with a string `type`"
        );
        assert_eq!(
            refused(json!([{"text": "no type"}]), "user"),
            "content[0]: a content part is an object with a string `type`"
        );
        assert_eq!(
            refused(
                json!([{"type": "text", "text": "ok"}, {"type": "text", "text": 3}]),
                "user"
            ),
            "content[1]: a text part's `text` is a string"
        );
        assert_eq!(
            refused(json!([]), "system"),
            "content: an empty list of content parts"
        );
        assert_eq!(
            refused(json!([{"type": "text", "text": "x"}]), "tool"),
            "content: a tool message's content is a string; content parts are for system and \
             user messages"
        );
    }
}
