//! The wire types of the Oumi harness protocol, version `1`, and their validation.
//!
//! Owns: the request bodies (`submit`, `cancel`), the response bodies (the status object, the
//! output object, error bodies), the chat message shape, and the rules a body must keep before
//! anything is stored (protocol version, session action, roles, tool-call shape).
//!
//! Invariants:
//! * Responses carry only protocol fields and never a `null`: absent values are omitted.
//! * Requests are strict where the protocol is: unknown top-level fields, a wrong version, an
//!   unknown action or role, a tool call without an id are refused with a message naming them.
//! * The model API key is an [`ApiKey`], whose `Debug` prints `[redacted]` and which is never
//!   serialized.
//!
//! Non-goals: deciding whether a resume fits the invocation's pending calls (that needs the
//! store; see `invocation`).

use std::collections::HashSet;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use url::Url;

use crate::chat::message::{ApiKey, ChatMessage, ModelEndpoint, Role, present};
use crate::floor::secret::{redacted_url, url_credentials};

/// The protocol version podhost speaks.
pub const PROTOCOL_VERSION: &str = "1";

/// The largest request body podhost reads, and the size every response stays under.
pub const MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// What a submission asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionAction {
    Start,
    Resume,
}

/// The model to call for a turn.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConnection {
    /// An OpenAI-compatible base URL; requests go to `{base_url}/chat/completions`.
    pub base_url: BaseUrl,
    /// The `model` parameter of every request.
    pub model: String,
    /// The key for this turn (absent for a local model that needs none).
    #[serde(default, deserialize_with = "present")]
    pub api_key: Option<ApiKey>,
    /// Settings merged into every request body as given (`temperature`, `seed`, …).
    #[serde(default, deserialize_with = "present")]
    pub generation_settings: Option<Map<String, Value>>,
}

/// A submission's base URL: its text as sent, which [`SubmitRequest::validate`] checks, and
/// the URL that text is, parsed once as the body is read (`None`: it is not one).
#[derive(Clone, Debug)]
pub struct BaseUrl {
    text: String,
    url: Option<Url>,
}

impl BaseUrl {
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        let url = Url::parse(&text).ok();
        BaseUrl { text, url }
    }

    /// The URL, when its text keeps the protocol's rules: `http://` or `https://`, a URI (RFC
    /// 3986: ASCII without spaces or the characters it excludes), and a URL.
    pub fn checked(&self) -> Result<&Url, RuleError> {
        if !(self.text.starts_with("http://") || self.text.starts_with("https://")) {
            return Err(rule(
                "model_connection.base_url must be an http:// or https:// URL",
            ));
        }
        let uri_char = |c: char| c.is_ascii_graphic() && !"\"<>\\^`{|}".contains(c);
        match &self.url {
            Some(url) if self.text.chars().all(uri_char) => Ok(url),
            _ => Err(rule(
                "model_connection.base_url is not a valid URL (RFC 3986: ASCII, no spaces)",
            )),
        }
    }
}

impl<'de> Deserialize<'de> for BaseUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(BaseUrl::new)
    }
}

impl ModelConnection {
    /// The connection with its base URL checked (see [`BaseUrl::checked`]): what a turn is
    /// given of it.
    pub fn checked(&self) -> Result<CheckedConnection<'_>, RuleError> {
        Ok(CheckedConnection {
            conn: self,
            base_url: self.base_url.checked()?,
        })
    }

    /// Every credential value of the submission: the API key, and the user, password and
    /// credential-named query values of the base URL (when it is one).
    pub fn credentials(&self) -> Credentials {
        let mut values: Vec<String> = self.api_key.iter().map(|k| k.expose().to_owned()).collect();
        values.extend(self.base_url.url.iter().flat_map(url_credentials));
        Credentials::new(values)
    }
}

/// A [`ModelConnection`] whose base URL keeps the protocol's rules.
#[derive(Clone, Copy, Debug)]
pub struct CheckedConnection<'a> {
    pub conn: &'a ModelConnection,
    pub base_url: &'a Url,
}

impl CheckedConnection<'_> {
    /// What may be stored: the base URL with its own credentials replaced by `redacted`, and
    /// any other credential value of the submission (the key, wherever it sits) by
    /// `[redacted]`.
    pub fn stored(&self) -> ModelEndpoint {
        ModelEndpoint {
            base_url: self.stored_url(),
            model: self.conn.model.clone(),
            generation_settings: self.conn.generation_settings.clone().unwrap_or_default(),
        }
    }

    fn stored_url(&self) -> Url {
        let redacted = redacted_url(self.base_url);
        let scrubbed = self.credentials().scrub(redacted.as_str());
        if scrubbed == redacted.as_str() {
            return redacted;
        }
        // A credential sits in the URL's text beyond its user-info and query (its path, say):
        // the text without it, or, when that is no URL (it sat in the host), the scheme alone
        // and a host that says so.
        Url::parse(&scrubbed).unwrap_or_else(|_| {
            let mut u = redacted;
            let _ = u.set_host(Some("redacted.invalid"));
            let _ = u.set_port(None);
            u.set_path("/");
            u.set_query(None);
            u.set_fragment(None);
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u
        })
    }

    /// Whether the base URL carries a credential (then it is kept in memory only, like the
    /// key, and the store holds it redacted).
    pub fn url_has_credentials(&self) -> bool {
        self.stored_url() != *self.base_url
    }

    /// Every credential value of the submission (see [`ModelConnection::credentials`]).
    pub fn credentials(&self) -> Credentials {
        self.conn.credentials()
    }
}

/// A submission's credential values (kept in memory only): what is replaced by `[redacted]` in
/// everything podhost stores or returns, since a model may echo them. Values shorter than
/// [`Credentials::MIN_CHARS`] are not scrubbed (they would mangle ordinary text; no real key is
/// that short).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    values: Vec<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Credentials([{} redacted])", self.values.len())
    }
}

impl Credentials {
    /// The shortest value scrubbed.
    pub const MIN_CHARS: usize = 8;

    pub fn new(values: impl IntoIterator<Item = String>) -> Self {
        let mut values: Vec<String> = values
            .into_iter()
            .filter(|v| v.chars().count() >= Self::MIN_CHARS)
            .collect();
        // Longest first, so a value that contains another is replaced whole.
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Credentials { values }
    }

    /// Another submission's credentials join these (a resume brings a fresh key; the old one
    /// may still be echoed).
    pub fn merge(&mut self, other: &Credentials) {
        let all = self
            .values
            .iter()
            .chain(&other.values)
            .cloned()
            .collect::<Vec<_>>();
        *self = Credentials::new(all);
    }

    /// Whether `text` holds a credential value outside the `[redacted]` placeholders (the fuzz
    /// targets' check of what is stored).
    #[cfg(feature = "fuzzing")]
    pub fn leak_in(&self, text: &str) -> bool {
        let text = text.replace("[redacted]", "\u{0}");
        self.values.iter().any(|v| text.contains(v.as_str()))
    }

    /// `text` with every credential value replaced by `[redacted]`.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), "[redacted]");
            }
        }
        out
    }

    /// Scrubs every text a message carries: content, call ids, names and arguments.
    pub fn scrub_message(&self, m: &mut ChatMessage) {
        if self.values.is_empty() {
            return;
        }
        let s = |t: &mut String| *t = self.scrub(t);
        if let Some(c) = m.content.as_mut() {
            s(c);
        }
        if let Some(id) = m.tool_call_id.as_mut() {
            s(id);
        }
        for call in m.tool_calls.iter_mut().flatten() {
            s(&mut call.id);
            s(&mut call.function.name);
            s(&mut call.function.arguments);
        }
    }
}

/// `POST /submit`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    pub protocol_version: String,
    pub session_id: String,
    pub invocation_id: String,
    pub session_action: SessionAction,
    pub input_messages: Vec<ChatMessage>,
    pub model_connection: ModelConnection,
}

/// `POST /cancel`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelRequest {
    pub protocol_version: String,
    pub session_id: String,
    pub invocation_id: String,
}

/// An invocation's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Queued,
    Running,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl Status {
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Cancelled)
    }

    /// Whether `collect_output` has messages to return.
    pub fn has_output(self) -> bool {
        matches!(self, Status::InputRequired | Status::Completed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::InputRequired => "input_required",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        [
            Status::Queued,
            Status::Running,
            Status::InputRequired,
            Status::Completed,
            Status::Failed,
            Status::Cancelled,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `error` of a failed status, and of every error response.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A non-empty explanation.
    pub message: String,
}

/// The status object that `submit`, `get_status` and `cancel` answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusBody {
    pub protocol_version: String,
    pub session_id: String,
    pub invocation_id: String,
    pub status: Status,
    /// Present when, and only when, `status` is `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorDetail>,
}

/// What `collect_output` answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutputBody {
    pub protocol_version: String,
    pub session_id: String,
    pub invocation_id: String,
    /// `input_required` or `completed`.
    pub status: Status,
    /// The messages since the most recent submission, ending with an assistant message.
    pub messages: Vec<ChatMessage>,
}

/// The body of every error response: `{"error": {"message": …}}`, nothing else (a busy `409`
/// must not carry an `invocation_id`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// Why a well-formed JSON body breaks the protocol's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

fn rule(msg: impl Into<String>) -> RuleError {
    RuleError(msg.into())
}

/// Longest id podhost accepts (session, invocation, tool call): ids name rows and directories.
pub const MAX_ID_CHARS: usize = 512;

fn check_id(field: &str, id: &str) -> Result<(), RuleError> {
    if id.is_empty() {
        return Err(rule(format!("{field} must not be empty")));
    }
    if id.chars().count() > MAX_ID_CHARS {
        return Err(rule(format!(
            "{field} is longer than {MAX_ID_CHARS} characters"
        )));
    }
    if id.chars().any(char::is_control) {
        return Err(rule(format!("{field} must not hold control characters")));
    }
    Ok(())
}

fn check_version(v: &str) -> Result<(), RuleError> {
    if v != PROTOCOL_VERSION {
        return Err(rule(format!(
            "protocol_version must be \"{PROTOCOL_VERSION}\", not {v:?}"
        )));
    }
    Ok(())
}

impl CancelRequest {
    pub fn validate(&self) -> Result<(), RuleError> {
        check_version(&self.protocol_version)?;
        check_id("session_id", &self.session_id)?;
        check_id("invocation_id", &self.invocation_id)
    }
}

impl SubmitRequest {
    /// Checks the body against the protocol's rules for its action.
    pub fn validate(&self) -> Result<(), RuleError> {
        check_version(&self.protocol_version)?;
        check_id("session_id", &self.session_id)?;
        check_id("invocation_id", &self.invocation_id)?;
        let conn = &self.model_connection;
        conn.base_url.checked()?;
        if conn.model.is_empty() {
            return Err(rule("model_connection.model must not be empty"));
        }
        if self.input_messages.is_empty() {
            return Err(rule("input_messages must hold at least one message"));
        }
        match self.session_action {
            SessionAction::Start => self.validate_start(),
            SessionAction::Resume => self.validate_resume().map(|_| ()),
        }
    }

    fn validate_start(&self) -> Result<(), RuleError> {
        let mut open: Vec<&str> = Vec::new();
        let mut seen: HashSet<&str> = HashSet::new();
        for (i, m) in self.input_messages.iter().enumerate() {
            check_message_shape(i, m)?;
            match m.role {
                Role::Tool => {
                    let id = m.tool_call_id.as_deref().unwrap_or_default();
                    match open.iter().position(|o| *o == id) {
                        Some(p) => {
                            open.remove(p);
                        }
                        None => {
                            return Err(rule(format!(
                                "input_messages[{i}] answers tool call {id:?}, which no earlier \
                                 assistant message left open"
                            )));
                        }
                    }
                }
                _ => {
                    if let Some(id) = open.first() {
                        return Err(rule(format!(
                            "input_messages[{i}] comes before tool call {id:?} was answered"
                        )));
                    }
                    for c in m.calls() {
                        if !seen.insert(c.id.as_str()) {
                            return Err(rule(format!(
                                "input_messages[{i}] reuses tool call id {:?}",
                                c.id
                            )));
                        }
                        open.push(c.id.as_str());
                    }
                }
            }
        }
        match self.input_messages.last() {
            Some(m) if m.role == Role::User => Ok(()),
            _ => Err(rule(
                "a start's input_messages must end with a user message",
            )),
        }
    }

    /// The tool-call ids a resume answers, in order; every message must be a tool message and
    /// no id may repeat.
    pub fn validate_resume(&self) -> Result<Vec<String>, RuleError> {
        let mut ids = Vec::with_capacity(self.input_messages.len());
        let mut seen = HashSet::new();
        for (i, m) in self.input_messages.iter().enumerate() {
            check_message_shape(i, m)?;
            if m.role != Role::Tool {
                return Err(rule(format!(
                    "a resume holds only tool messages; input_messages[{i}] is a {} message",
                    role_name(m.role)
                )));
            }
            let id = m.tool_call_id.clone().unwrap_or_default();
            if !seen.insert(id.clone()) {
                return Err(rule(format!(
                    "input_messages[{i}] answers tool call {id:?} a second time"
                )));
            }
            ids.push(id);
        }
        Ok(ids)
    }
}

fn role_name(r: Role) -> &'static str {
    match r {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

/// The per-message rules: content unless tool calls; tool calls only on assistant messages and
/// with ids; `tool_call_id` on, and only on, tool messages.
fn check_message_shape(i: usize, m: &ChatMessage) -> Result<(), RuleError> {
    let name = role_name(m.role);
    if let Some(calls) = &m.tool_calls {
        if m.role != Role::Assistant {
            return Err(rule(format!(
                "input_messages[{i}] is a {name} message with tool_calls; only assistant \
                 messages carry them"
            )));
        }
        for (j, c) in calls.iter().enumerate() {
            check_id(&format!("input_messages[{i}].tool_calls[{j}].id"), &c.id)?;
            if c.function.name.is_empty() {
                return Err(rule(format!(
                    "input_messages[{i}].tool_calls[{j}].function.name must not be empty"
                )));
            }
        }
    }
    if m.content.is_none() && m.calls().is_empty() {
        return Err(rule(format!(
            "input_messages[{i}] needs content (it has no tool_calls)"
        )));
    }
    match (m.role, &m.tool_call_id) {
        (Role::Tool, None) => Err(rule(format!(
            "input_messages[{i}] is a tool message without tool_call_id"
        ))),
        (Role::Tool, Some(id)) => check_id(&format!("input_messages[{i}].tool_call_id"), id),
        (_, Some(_)) => Err(rule(format!(
            "input_messages[{i}] is a {name} message with tool_call_id; only tool messages \
             carry it"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::message::ToolCall;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn submit(action: &str, messages: Value) -> Result<SubmitRequest, String> {
        serde_json::from_value::<SubmitRequest>(json!({
            "protocol_version": "1",
            "session_id": "s",
            "invocation_id": "i",
            "session_action": action,
            "input_messages": messages,
            "model_connection": {"base_url": "http://127.0.0.1:1/v1", "model": "m", "api_key": "k"}
        }))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn responses_omit_nulls_and_keys_never_print() {
        let body = StatusBody {
            protocol_version: "1".into(),
            session_id: "s".into(),
            invocation_id: "i".into(),
            status: Status::InputRequired,
            error: None,
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({"protocol_version": "1", "session_id": "s", "invocation_id": "i",
                   "status": "input_required"})
        );
        let m = ChatMessage::assistant(
            String::new(),
            vec![ToolCall::new("c", "ask_user", "{}".into())],
        );
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"role": "assistant", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "ask_user", "arguments": "{}"}}
            ]})
        );
        assert_eq!(format!("{:?}", ApiKey::new("sk-secret")), "[redacted]");
    }

    #[test]
    fn a_stored_base_url_keeps_no_credential() {
        let conn = |url: &str, key: &str| ModelConnection {
            base_url: BaseUrl::new(url),
            model: "m".into(),
            api_key: Some(ApiKey::new(key)),
            generation_settings: None,
        };
        let cases = [
            ("http://h/v1", "http://h/v1", false),
            (
                "https://user:pass-7788@h/v1?api-key=q-secret-9&x=1",
                "https://redacted:redacted@h/v1?api-key=redacted&x=1",
                true,
            ),
            ("http://h/sk-live-key-42/v1", "http://h/[redacted]/v1", true),
            (
                "https://sk-live-key-42.example:8443/v1?x=1",
                "https://redacted.invalid/",
                true,
            ),
        ];
        for (given, stored, secret) in cases {
            let c = conn(given, "sk-live-key-42");
            let c = c.checked().unwrap();
            assert_eq!(
                (c.stored().base_url.as_str(), c.url_has_credentials()),
                (stored, secret),
                "{given}"
            );
        }
    }

    #[test]
    fn starts_and_resumes_are_checked_against_the_rules() {
        let ok = submit(
            "start",
            json!([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}]),
        );
        assert_eq!(ok.unwrap().validate(), Ok(()));

        let cases = [
            (
                "start",
                json!([{"role": "assistant", "content": "x"}]),
                "a start's input_messages must end with a user message",
            ),
            (
                "start",
                json!([{"role": "tool", "tool_call_id": "a", "content": "x"}, {"role": "user", "content": "q"}]),
                "input_messages[0] answers tool call \"a\", which no earlier assistant message left open",
            ),
            (
                "start",
                json!([{"role": "user"}]),
                "input_messages[0] needs content (it has no tool_calls)",
            ),
            (
                "resume",
                json!([{"role": "user", "content": "x"}]),
                "a resume holds only tool messages; input_messages[0] is a user message",
            ),
            (
                "resume",
                json!([{"role": "tool", "tool_call_id": "a", "content": "1"}, {"role": "tool", "tool_call_id": "a", "content": "2"}]),
                "input_messages[1] answers tool call \"a\" a second time",
            ),
            (
                "resume",
                json!([]),
                "input_messages must hold at least one message",
            ),
        ];
        for (action, messages, want) in cases {
            let r = submit(action, messages).unwrap();
            assert_eq!(r.validate(), Err(RuleError(want.into())), "{action}");
        }
        let mut iri = submit("start", json!([{"role": "user", "content": "x"}])).unwrap();
        iri.model_connection.base_url = BaseUrl::new("https://\u{cf}/v1");
        assert_eq!(
            iri.validate(),
            Err(RuleError(
                "model_connection.base_url is not a valid URL (RFC 3986: ASCII, no spaces)".into()
            ))
        );
        assert!(
            submit("restart", json!([{"role": "user", "content": "x"}]))
                .unwrap_err()
                .contains("unknown variant `restart`")
        );
        assert!(
            submit(
                "start",
                json!([{"role": "user", "content": "x", "tool_calls": null}])
            )
            .unwrap_err()
            .contains("invalid type: null, expected a sequence")
        );
        assert!(
            submit("start", json!([{"role": "robot", "content": "x"}]))
                .unwrap_err()
                .contains("unknown variant `robot`")
        );
    }
}
