//! Chat messages in the OpenAI format, the model endpoint, and the model API key.
//!
//! Owns: [`ChatMessage`] and its parts (the shape the BYOH protocol and OpenAI-compatible servers
//! share), [`ModelEndpoint`] (a base URL, a model and generation settings: what may be stored),
//! and [`ApiKey`], whose `Debug` prints `[redacted]` and which is never serialized.
//!
//! Non-goals: the BYOH protocol's rules for messages (`byoh::protocol` checks them).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

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
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: Role,
    /// The text; omitted (never `null`) when the message is only tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Assistant only: the calls the model made.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// Tool only: the id of the call this message answers.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    pub fn system(text: impl Into<String>) -> Self {
        ChatMessage {
            role: Role::System,
            content: Some(text.into()),
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
            tool_calls: (!calls.is_empty()).then_some(calls),
            tool_call_id: None,
        }
    }

    pub fn tool(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        ChatMessage {
            role: Role::Tool,
            content: Some(text.into()),
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelEndpoint {
    pub base_url: String,
    pub model: String,
    #[serde(default)]
    pub generation_settings: Map<String, Value>,
}
