//! `TurnStart` (v5 §3): the input of a leased run, typed.
//!
//! Owns: the parse of everything core sends with a grant — type and engine, the loop manifest,
//! memory, the checkpoint and its input in every shape, the replayable outcomes, the transcript
//! cursor, routing (the session's sandbox and its environment), the Agent, options, trace context,
//! the Runtime limits and the model descriptor — and the check of whether podhost can run it.
//!
//! Invariants:
//! * Lenient on what core adds: unknown fields are ignored at every level (core's schema is
//!   strict towards a harness, but a field podhost does not know changes nothing it does).
//!   What podhost relies on is typed and required; a TurnStart without it does not parse, and
//!   the run ends in a `turn.failed` naming the problem.
//! * Nothing here does I/O: [`TurnStart::parse`] and [`TurnStart::check`] are pure.
//!
//! Non-goals: flows (v5 §11: a custom harness runs agent turns only), MCP discovery itself
//! (`toolgate::discovery`), pausing (`turn.paused` is core's engine's only).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::agent::context::{Budget, DEFAULT_THRESHOLD};
use crate::nylorun::link::protocol::{McpFacts, RunGrant, TurnLimits};

/// Core's default segment budget (v2 notes §2: `options.yieldAfter`, 50 steps / 20 minutes).
pub const DEFAULT_YIELD_STEPS: u32 = 50;
pub const DEFAULT_YIELD_AFTER: Duration = Duration::from_secs(20 * 60);

/// The input of one run.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnStart {
    /// `turn.start` or `approval.answer`.
    #[serde(rename = "type")]
    pub kind: StartKind,
    /// `agent` or `flow`.
    pub engine: Engine,
    /// The loop manifest: the agent's own instructions, tools, skills and MCP servers.
    #[serde(default)]
    pub manifest: Manifest,
    /// `{name, version}` of the agent manifest version, for the records.
    #[serde(default)]
    pub definition: Option<Value>,
    /// The harness section's `loop`: podhost's own settings (see [`LoopSettings`]).
    #[serde(default, rename = "loop")]
    pub loop_settings: Option<Value>,
    /// Agent memory, when the version sets `harness.memory`.
    #[serde(default)]
    pub memory: Option<TurnMemory>,
    pub checkpoint: Checkpoint,
    /// Completed outcomes of this segment, replayed without asking core.
    #[serde(default)]
    pub outcomes: Vec<RecordedOutcome>,
    /// Where the session's transcript stands.
    #[serde(default)]
    pub transcript: TranscriptCursor,
    /// The session's MCP discovery, once a run recorded it (`McpFactsSchema`); absent, podhost
    /// discovers the manifest's servers through the Tool Gate (`toolgate::discovery`).
    #[serde(default)]
    pub mcp: Option<McpFacts>,
    #[serde(default)]
    pub routing: Routing,
    /// The Agent the session runs on; absent for a flow.
    #[serde(default)]
    pub agent: Option<TurnAgent>,
    #[serde(default)]
    pub options: TurnOptions,
    /// W3C trace context for gate calls and commands.
    #[serde(default)]
    pub trace: Option<Trace>,
    /// The Runtime limits as the segment started.
    #[serde(default)]
    pub limits: TurnLimits,
    /// The model the Model Gate uses when a call names none.
    #[serde(default)]
    pub model: Option<ModelDescriptor>,
}

/// `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum StartKind {
    #[serde(rename = "turn.start")]
    TurnStart,
    #[serde(rename = "approval.answer")]
    ApprovalAnswer,
    #[serde(other)]
    Other,
}

/// `engine`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Agent,
    Flow,
    #[serde(other)]
    Other,
}

/// The loop manifest (agent manifest v7's harness section, flat).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// The manifest's `name`, or the variant a message named.
    #[serde(default)]
    pub id: Option<String>,
    /// The agent's own instructions (a string, or a list of paragraphs).
    #[serde(default, deserialize_with = "text_or_lines")]
    pub instructions: Option<String>,
    /// Manifest tools: the agent's HTTP tools, run through the Tool Gate (shape guessed in
    /// `toolgate::wire`).
    #[serde(default)]
    pub tools: Option<Value>,
    /// Skills: `[{name, description, files: {path: "sha256:<hex>"}, plugin?}]`, mounted by
    /// `skills::mount_skills`.
    #[serde(default)]
    pub skills: Option<Value>,
    /// The agent's MCP servers (shape guessed in `toolgate::wire`; podhost reads their names).
    #[serde(default)]
    pub mcp_servers: Option<Value>,
}

impl Manifest {
    /// Whether the manifest names at least one skill.
    pub fn has_skills(&self) -> bool {
        match &self.skills {
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(o)) => !o.is_empty(),
            _ => false,
        }
    }
}

/// `memory` (`TurnMemorySchema`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnMemory {
    pub access: MemoryAccess,
    /// The agent's own memory instructions, written after podhost's.
    #[serde(default, deserialize_with = "text_or_lines")]
    pub instructions: Option<String>,
    /// One line per memory, newest first.
    #[serde(default, deserialize_with = "text_or_lines")]
    pub index: Option<String>,
    /// Some memories were left out of the index.
    #[serde(default)]
    pub truncated: Option<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryAccess {
    ReadWrite,
    ReadOnly,
}

/// `checkpoint` (`HarnessCheckpointSchema`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    pub session_id: String,
    pub turn_id: String,
    pub segment: u32,
    #[serde(default)]
    pub manifest_hash: String,
    pub input: TurnInput,
    /// Podhost's own state, as its last output left it.
    #[serde(default)]
    pub state: Option<Value>,
}

/// The turn's message, or what the segment continues from.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnInput {
    /// One message.
    Message(Message),
    /// Messages that waited in the session's queue, in order.
    Messages(Vec<Message>),
    /// The next segment of a yielded turn.
    Continue,
    /// A person's answer to an approval (`{kind: "approve", interactionId, approved}`).
    Approve {
        interaction_id: String,
        approved: bool,
    },
    /// A person's answer to a question (`{kind: "respond", interactionId, value}`).
    Respond { interaction_id: String },
}

/// One message of the input: text or content parts, with optional metadata. Serialized, it is
/// the body of the transcript's `user-message` event (`{text | content, metadata?}`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Message {
    Text {
        text: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<Value>,
    },
    /// `[{type: "text", text} | {type: "media", mediaType, reference}]`.
    Content {
        content: Vec<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<Value>,
    },
}

/// Why a turn's `input` (or one of its messages) is not one podhost can run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("a message's text is not a string")]
    TextNotString,
    #[error("a message's content is not a list of parts")]
    ContentNotList,
    #[error("a message object has neither text nor content")]
    Empty,
    #[error("a message is neither a string nor an object")]
    NotAMessage,
    /// A field the input's kind needs is absent (`kind` as the input named it, if it did).
    #[error("a {kind:?} input has no {field}")]
    Missing {
        kind: Option<String>,
        field: &'static str,
    },
    /// A field of the wrong JSON type (`expected`: "a list", "a boolean", …).
    #[error("{field} is not {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
    },
    /// The message at `index` of a `messages` input.
    #[error("messages[{index}]: {source}")]
    Message {
        index: usize,
        source: Box<InputError>,
    },
    #[error("podhost does not know the input kind {0:?}")]
    UnknownKind(String),
}

/// The event of an `input` entry podhost writes.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum InputEvent {
    /// `{kind: "user-message", text | content, metadata?}`.
    UserMessage(Message),
}

impl Message {
    fn from_value(v: &Value) -> Result<Message, InputError> {
        match v {
            Value::String(s) => Ok(Message::Text {
                text: s.clone(),
                metadata: None,
            }),
            Value::Object(o) => {
                let metadata = o.get("metadata").cloned();
                if let Some(text) = o.get("text") {
                    let text = text.as_str().ok_or(InputError::TextNotString)?.to_owned();
                    Ok(Message::Text { text, metadata })
                } else if let Some(content) = o.get("content") {
                    let content = content
                        .as_array()
                        .ok_or(InputError::ContentNotList)?
                        .clone();
                    Ok(Message::Content { content, metadata })
                } else {
                    Err(InputError::Empty)
                }
            }
            _ => Err(InputError::NotAMessage),
        }
    }

    /// The transcript's input event: `{kind: "user-message", text | content, metadata?}`.
    pub fn event(&self) -> Value {
        serde_json::to_value(InputEvent::UserMessage(self.clone())).unwrap_or(Value::Null)
    }
}

impl TurnInput {
    pub fn from_value(v: &Value) -> Result<TurnInput, InputError> {
        let kind = v.get("kind").and_then(Value::as_str);
        let field = |name: &'static str| {
            v.get(name).ok_or_else(|| InputError::Missing {
                kind: kind.map(str::to_owned),
                field: name,
            })
        };
        let wrong =
            |field: &'static str, expected: &'static str| InputError::WrongType { field, expected };
        match kind {
            Some("continue") => Ok(TurnInput::Continue),
            Some("messages") => {
                let list = field("messages")?
                    .as_array()
                    .ok_or(wrong("messages", "a list"))?;
                let messages = list
                    .iter()
                    .enumerate()
                    .map(|(index, m)| {
                        Message::from_value(m).map_err(|e| InputError::Message {
                            index,
                            source: Box::new(e),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(TurnInput::Messages(messages))
            }
            Some("approve") => Ok(TurnInput::Approve {
                interaction_id: id_field(field("interactionId")?)?,
                approved: field("approved")?
                    .as_bool()
                    .ok_or(wrong("approved", "a boolean"))?,
            }),
            Some("respond") => Ok(TurnInput::Respond {
                interaction_id: id_field(field("interactionId")?)?,
            }),
            Some(other) => Err(InputError::UnknownKind(other.to_owned())),
            None => Message::from_value(v).map(TurnInput::Message),
        }
    }

    /// The messages this input adds to the transcript, each its own `input` entry.
    pub fn messages(&self) -> &[Message] {
        match self {
            TurnInput::Message(m) => std::slice::from_ref(m),
            TurnInput::Messages(ms) => ms,
            _ => &[],
        }
    }
}

fn id_field(v: &Value) -> Result<String, InputError> {
    v.as_str().map(str::to_owned).ok_or(InputError::WrongType {
        field: "interactionId",
        expected: "a string",
    })
}

impl<'de> Deserialize<'de> for TurnInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        TurnInput::from_value(&v).map_err(serde::de::Error::custom)
    }
}

/// One entry of `outcomes`: `{effectId, requestHash, outcome: {value, statePatch?}}`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedOutcome {
    pub effect_id: String,
    pub request_hash: String,
    pub outcome: OutcomeBody,
}

/// A recorded outcome: the value, and the memory keys it changed (tools only; unused).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutcomeBody {
    #[serde(default)]
    pub value: Value,
    #[serde(default)]
    pub state_patch: Option<Value>,
}

/// `transcript: {cursor}`; `-1` means nothing to fold (and nothing to read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub struct TranscriptCursor {
    pub cursor: i64,
}

impl Default for TranscriptCursor {
    fn default() -> Self {
        TranscriptCursor { cursor: -1 }
    }
}

/// `routing`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Routing {
    #[serde(default)]
    pub root_manifest: Option<Value>,
    #[serde(default)]
    pub sandbox: Option<RoutingSandbox>,
}

/// `routing.sandbox`: the session's sandbox.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutingSandbox {
    #[serde(default)]
    pub owner_id: Option<String>,
    #[serde(default)]
    pub environment_id: Option<String>,
    #[serde(default)]
    pub spec: Option<Value>,
    /// The variables every command gets (secrets are the placeholder `nylorun_managed`).
    #[serde(default)]
    pub environment: BTreeMap<String, Value>,
}

impl RoutingSandbox {
    /// The environment as command variables; a value that is not a string is passed as its
    /// JSON text, `null` as empty.
    pub fn env_vars(&self) -> Vec<(String, String)> {
        self.environment
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                (k.clone(), v)
            })
            .collect()
    }
}

/// `agent` (`TurnAgentSchema`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnAgent {
    pub id: String,
    #[serde(default)]
    pub kind: Option<String>,
    /// Present when the session has a sandbox: offer the sandbox tools then only.
    #[serde(default)]
    pub sandbox: Option<AgentSandbox>,
    #[serde(default)]
    pub self_wake: Option<bool>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct AgentSandbox {
    /// The directory commands start in (`/workspace`).
    #[serde(default)]
    pub workspace: Option<String>,
}

/// `options`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnOptions {
    /// Informational: the Model Gate answers with the fixture model.
    #[serde(default)]
    pub fixture_model: Option<bool>,
    /// v2's segment budget, when core still sends one.
    #[serde(default)]
    pub yield_after: Option<YieldAfter>,
}

/// A segment budget: yield after this many steps or this much time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct YieldAfter {
    #[serde(default)]
    pub steps: Option<u32>,
    #[serde(default)]
    pub ms: Option<u64>,
}

/// `trace`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Trace {
    #[serde(default)]
    pub traceparent: Option<String>,
    #[serde(default)]
    pub tracestate: Option<String>,
}

/// `model` (`ModelDescriptorSchema`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelDescriptor {
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    /// What the model reads: `text`, `image`, `pdf`, `office`, `audio`, `video`.
    #[serde(default)]
    pub inputs: Vec<String>,
    #[serde(default)]
    pub context_window: Option<u64>,
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
}

/// podhost's own `loop` settings (the manifest's harness section, which core passes on unread):
/// `{yieldAfter?: {steps?, ms?}, compactAt?}`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoopSettings {
    #[serde(default)]
    pub yield_after: Option<YieldAfter>,
    /// The share of the model's usable window (its context window less its output room) past
    /// which the history is compacted: above 0, at most 1 (default 0.8).
    #[serde(default)]
    pub compact_at: Option<f64>,
}

/// Why podhost cannot run a TurnStart: the `turn.failed` error it reports.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Unrunnable {
    pub code: &'static str,
    pub message: String,
}

impl Unrunnable {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Unrunnable {
            code,
            message: message.into(),
        }
    }
}

impl TurnStart {
    /// Parses a grant's input.
    pub fn parse(input: &Value) -> Result<TurnStart, Unrunnable> {
        TurnStart::deserialize(input).map_err(|e| {
            Unrunnable::new(
                "turn_start.invalid",
                format!("podhost cannot read this TurnStart: {e}"),
            )
        })
    }

    /// Whether podhost can run it for `grant`.
    pub fn check(&self, grant: &RunGrant) -> Result<(), Unrunnable> {
        match self.engine {
            Engine::Agent => {}
            Engine::Flow => {
                return Err(Unrunnable::new(
                    "turn_start.unsupported",
                    "podhost runs agent turns only; flows run in Nylorun's own harness",
                ));
            }
            Engine::Other => {
                return Err(Unrunnable::new(
                    "turn_start.unsupported",
                    "podhost does not know this TurnStart's engine",
                ));
            }
        }
        if self.kind == StartKind::Other {
            return Err(Unrunnable::new(
                "turn_start.unsupported",
                "podhost does not know this TurnStart's type",
            ));
        }
        let cp = &self.checkpoint;
        if cp.session_id != grant.session_id || cp.turn_id != grant.turn_id {
            return Err(Unrunnable::new(
                "turn_start.invalid",
                format!(
                    "the checkpoint names session {} turn {}, but the run was granted for session \
                     {} turn {}",
                    cp.session_id, cp.turn_id, grant.session_id, grant.turn_id
                ),
            ));
        }
        if let TurnInput::Respond { interaction_id } = &cp.input {
            return Err(Unrunnable::new(
                "turn_start.unsupported",
                format!(
                    "podhost asks no questions, so it cannot pair the response to {interaction_id}"
                ),
            ));
        }
        // An `approval.answer` runs the waiting segment again (v5 §7): its input is the
        // segment's own, of any kind v5 lists (an older `{kind: "approve"}` input is paired with
        // the input the waiting segment kept in its state).
        Ok(())
    }

    /// Whether the session has a sandbox: sandbox tools and the sandbox note only then.
    pub fn has_sandbox(&self) -> bool {
        self.agent.as_ref().is_some_and(|a| a.sandbox.is_some())
    }

    /// The root agent's id for every intent (`agent.id`, else the manifest's id).
    pub fn agent_id(&self) -> String {
        self.agent
            .as_ref()
            .map(|a| a.id.clone())
            .or_else(|| self.manifest.id.clone())
            .unwrap_or_default()
    }

    /// The model's context budget: `model.contextWindow`, with `maxOutputTokens` kept for the
    /// answer, compacting past `loop.compactAt` (a share of the rest; 0.8 when unset or out of
    /// range). `None` without a window.
    pub fn budget(&self) -> Option<Budget> {
        let model = self.model.as_ref()?;
        let window = model.context_window.filter(|w| *w > 0)?;
        let threshold = self
            .loop_settings
            .as_ref()
            .and_then(|l| LoopSettings::deserialize(l).ok())
            .and_then(|l| l.compact_at)
            .filter(|t| *t > 0.0 && *t <= 1.0)
            .unwrap_or(DEFAULT_THRESHOLD);
        Some(Budget::new(window, model.max_output_tokens, threshold))
    }

    pub fn traceparent(&self) -> Option<&str> {
        self.trace.as_ref().and_then(|t| t.traceparent.as_deref())
    }

    /// The segment budget: the agent's `loop.yieldAfter`, else core's `options.yieldAfter`,
    /// else 50 steps / 20 minutes; each part separately.
    pub fn yield_after(&self) -> (u32, Duration) {
        let from_loop = self
            .loop_settings
            .as_ref()
            .and_then(|l| LoopSettings::deserialize(l).ok())
            .and_then(|l| l.yield_after);
        let pick = |f: &dyn Fn(&YieldAfter) -> Option<u64>| {
            from_loop
                .as_ref()
                .and_then(f)
                .or_else(|| self.options.yield_after.as_ref().and_then(f))
        };
        let steps = pick(&|y| y.steps.map(u64::from))
            .and_then(|s| u32::try_from(s).ok())
            .unwrap_or(DEFAULT_YIELD_STEPS)
            .max(1);
        let ms = pick(&|y| y.ms)
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_YIELD_AFTER);
        (steps, ms)
    }
}

/// A string, or a list of strings joined by blank lines.
fn text_or_lines<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let v = Option::<Value>::deserialize(d)?;
    Ok(match v {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .map(|i| match i {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        Some(other) => Some(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn grant() -> RunGrant {
        RunGrant {
            run_id: "r".into(),
            session_id: "ses".into(),
            turn_id: "t1".into(),
            epoch: 1,
            token: None,
            token_expires_at: None,
        }
    }

    fn start(input: Value) -> Value {
        json!({
            "type": "turn.start", "engine": "agent", "future": {"x": 1},
            "manifest": {"id": "helper", "instructions": ["Be brief.", "Be kind."], "skills": []},
            "checkpoint": {"sessionId": "ses", "turnId": "t1", "segment": 0,
                           "manifestHash": "mh", "input": input},
            "outcomes": [{"effectId": "t1:0:model:s0", "requestHash": "ab",
                          "outcome": {"value": "hi"}}],
            "transcript": {"cursor": 4},
            "routing": {"rootManifest": {}, "sandbox": {"ownerId": "ses", "environmentId": "ag",
                        "environment": {"FOO": "bar", "N": 3}}},
            "agent": {"id": "ag", "kind": "pod", "sandbox": {"workspace": "/workspace"}},
            "options": {"fixtureModel": true},
            "trace": {"traceparent": "00-abc-def-01"},
            "limits": {"recordEntryBytes": 1000, "unknownLimit": 5},
            "loop": {"yieldAfter": {"steps": 3}},
        })
    }

    #[test]
    fn a_full_turn_start_parses_and_ignores_unknown_fields() {
        let ts = TurnStart::parse(&start(json!("hello"))).unwrap();
        ts.check(&grant()).unwrap();
        assert_eq!(
            ts.manifest.instructions.as_deref(),
            Some("Be brief.\nBe kind.")
        );
        assert_eq!(
            ts.checkpoint.input,
            TurnInput::Message(Message::Text {
                text: "hello".into(),
                metadata: None
            })
        );
        assert_eq!(ts.outcomes[0].outcome.value, json!("hi"));
        assert_eq!(ts.transcript.cursor, 4);
        assert!(ts.has_sandbox());
        assert_eq!(ts.agent_id(), "ag");
        assert_eq!(ts.limits.record_entry_bytes, 1000);
        assert_eq!(ts.traceparent(), Some("00-abc-def-01"));
        assert_eq!(
            ts.routing.sandbox.as_ref().unwrap().env_vars(),
            vec![("FOO".into(), "bar".into()), ("N".into(), "3".into())]
        );
        assert_eq!(ts.yield_after(), (3, DEFAULT_YIELD_AFTER));
        assert_eq!(ts.budget(), None);
    }

    #[test]
    fn the_budget_comes_from_the_model_and_the_loop_settings() {
        let mut v = start(json!("x"));
        v["model"] = json!({"provider": "p", "id": "m", "inputs": ["text"],
                            "contextWindow": 10000, "maxOutputTokens": 1000});
        let ts = TurnStart::parse(&v).unwrap();
        assert_eq!(ts.budget(), Some(Budget::new(10000, Some(1000), 0.8)));
        v["loop"] = json!({"compactAt": 0.5});
        assert_eq!(
            TurnStart::parse(&v).unwrap().budget().unwrap().threshold,
            0.5
        );
        v["loop"] = json!({"compactAt": 7});
        assert_eq!(
            TurnStart::parse(&v).unwrap().budget().unwrap().threshold,
            0.8
        );
    }

    #[test]
    fn every_input_shape_parses() {
        let parse = |v: Value| TurnInput::from_value(&v).map_err(|e| e.to_string());
        assert_eq!(parse(json!({"kind": "continue"})), Ok(TurnInput::Continue));
        assert_eq!(
            parse(json!({"text": "hi", "metadata": {"a": 1}})),
            Ok(TurnInput::Message(Message::Text {
                text: "hi".into(),
                metadata: Some(json!({"a": 1}))
            }))
        );
        let parts = json!([{"type": "text", "text": "see"},
                           {"type": "media", "mediaType": "image/png", "reference": {"artifactId": "a", "version": 1}}]);
        let TurnInput::Messages(ms) =
            parse(json!({"kind": "messages", "messages": ["one", {"content": parts}]})).unwrap()
        else {
            panic!()
        };
        assert_eq!(ms.len(), 2);
        assert_eq!(
            ms[1].event(),
            json!({"kind": "user-message", "content": parts})
        );
        assert_eq!(
            parse(json!({"kind": "approve", "interactionId": "t:0:tool:x", "approved": true})),
            Ok(TurnInput::Approve {
                interaction_id: "t:0:tool:x".into(),
                approved: true
            })
        );
        assert_eq!(
            parse(json!({"kind": "settle"})),
            Err("podhost does not know the input kind \"settle\"".to_owned())
        );
        assert_eq!(
            parse(json!(3)),
            Err("a message is neither a string nor an object".to_owned())
        );
    }

    #[test]
    fn an_unreadable_input_names_the_field_and_the_message() {
        let why = |v: Value| TurnInput::from_value(&v).unwrap_err().to_string();
        assert_eq!(
            why(json!({"kind": "messages", "messages": ["a", {"text": 1}]})),
            "messages[1]: a message's text is not a string"
        );
        assert_eq!(
            why(json!({"kind": "approve", "approved": true})),
            "a Some(\"approve\") input has no interactionId"
        );
        assert_eq!(
            why(json!({"kind": "approve", "interactionId": 7, "approved": true})),
            "interactionId is not a string"
        );
        assert_eq!(
            why(json!({"kind": "messages", "messages": {}})),
            "messages is not a list"
        );
        assert_eq!(
            why(json!({"metadata": {}})),
            "a message object has neither text nor content"
        );
    }

    #[test]
    fn what_podhost_cannot_run_is_named() {
        let mut flow = start(json!("x"));
        flow["engine"] = json!("flow");
        assert_eq!(
            TurnStart::parse(&flow)
                .unwrap()
                .check(&grant())
                .unwrap_err()
                .message,
            "podhost runs agent turns only; flows run in Nylorun's own harness"
        );
        let mut other_turn = start(json!("x"));
        other_turn["checkpoint"]["turnId"] = json!("t2");
        assert_eq!(
            TurnStart::parse(&other_turn)
                .unwrap()
                .check(&grant())
                .unwrap_err()
                .message,
            "the checkpoint names session ses turn t2, but the run was granted for session ses \
             turn t1"
        );
        let mut approval = start(json!("the segment's own input"));
        approval["type"] = json!("approval.answer");
        assert_eq!(TurnStart::parse(&approval).unwrap().check(&grant()), Ok(()));
        let respond = start(json!({"kind": "respond", "interactionId": "i1", "value": 1}));
        assert_eq!(
            TurnStart::parse(&respond)
                .unwrap()
                .check(&grant())
                .unwrap_err()
                .code,
            "turn_start.unsupported"
        );
        let err = TurnStart::parse(&json!({"type": "turn.start", "engine": "agent"})).unwrap_err();
        assert_eq!(
            err.message,
            "podhost cannot read this TurnStart: missing field `checkpoint`"
        );
    }
}
