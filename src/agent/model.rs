//! What a model answers, in one shape for every front.
//!
//! The shape is Nylorun's `ModelCandidate` (v2 notes §4.2): a list of output blocks (text,
//! reasoning, JSON, tool calls), a finish reason and usage; or a failure outcome. The Model Gate
//! answers it directly; the OpenAI-compatible client converts its answers into it. Parsing is
//! lenient where models are sloppy (unknown finish reasons, missing fields, tool-call arguments
//! that are not a JSON object) and keeps what it could not parse, so that the loop can answer the
//! model with an error instead of crashing.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A model's answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// The answer's blocks, in order.
    pub output: Vec<Block>,
    /// Why the model stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Token counts, when the provider reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Provider facts (request id, resolved model), passed through unread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Value>,
}

/// One block of an answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Block {
    Text {
        text: String,
        #[serde(
            default,
            rename = "providerMetadata",
            skip_serializing_if = "Option::is_none"
        )]
        provider_metadata: Option<Value>,
    },
    Reasoning {
        text: String,
        #[serde(
            default,
            rename = "providerMetadata",
            skip_serializing_if = "Option::is_none"
        )]
        provider_metadata: Option<Value>,
    },
    Json {
        value: Value,
    },
    ToolCall(ToolCallBlock),
}

/// A call the model asked for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallBlock {
    /// The model's id for the call; results answer it by this id.
    pub id: String,
    /// The tool's name as the model was offered it.
    pub name: String,
    /// The arguments: a JSON object (`{}` when the model sent something that is not one; then
    /// `raw` holds what it sent).
    pub args: Value,
    /// The arguments as the model wrote them, when they were not a JSON object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_metadata: Option<Value>,
}

impl ToolCallBlock {
    /// Builds a call from arguments given as a JSON string (the OpenAI format): an object is
    /// kept; anything else is kept as `raw` so the loop can tell the model what was wrong.
    pub fn from_json_arguments(id: String, name: String, arguments: &str) -> Self {
        let trimmed = arguments.trim();
        let parsed = if trimmed.is_empty() {
            Ok(Value::Object(Default::default()))
        } else {
            serde_json::from_str::<Value>(trimmed)
        };
        match parsed {
            Ok(v @ Value::Object(_)) => ToolCallBlock {
                id,
                name,
                args: v,
                raw: None,
                provider_metadata: None,
            },
            _ => ToolCallBlock {
                id,
                name,
                args: Value::Object(Default::default()),
                raw: Some(arguments.to_owned()),
                provider_metadata: None,
            },
        }
    }

    /// Why the arguments cannot be used, if they cannot.
    pub fn argument_error(&self) -> Option<String> {
        self.raw.as_ref().map(|raw| {
            let shown: String = raw.chars().take(200).collect();
            format!(
                "The arguments of this {} call are not a JSON object: {shown:?}. Call the tool again \
                 with a JSON object as its arguments.",
                self.name
            )
        })
    }
}

/// Why a model stopped. Unknown reasons from a provider are kept as `other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    #[serde(other)]
    Other,
}

/// Token counts (every field optional: providers report different subsets).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

/// A model call that did not produce an answer (Nylorun's failure outcome).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelFailure {
    /// `"failed"`.
    pub kind: String,
    /// `context_overflow`, `rate_limited`, `overloaded`, `timeout`, `transient`, `content_policy`,
    /// `auth`, `invalid_request` or `invalid_output`.
    pub code: String,
    pub message: String,
    pub retryable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

impl ModelFailure {
    pub fn new(code: &str, message: impl Into<String>, retryable: bool) -> Self {
        ModelFailure {
            kind: "failed".to_owned(),
            code: code.to_owned(),
            message: message.into(),
            retryable,
            retry_after_ms: None,
        }
    }
}

/// A model effect's recorded value: an answer or a failure.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelAnswer {
    Candidate(Candidate),
    Failed(ModelFailure),
}

/// Why a recorded model outcome is not one podhost can read.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    #[error("a model failure outcome is malformed: {0}")]
    Failure(serde_json::Error),
    #[error("a model candidate is malformed: {0}")]
    Candidate(serde_json::Error),
}

impl ModelAnswer {
    /// Reads a recorded model outcome: a candidate, a bare string (one text block), or a failure.
    pub fn from_value(v: &Value) -> Result<Self, AnswerError> {
        match v {
            Value::String(s) => Ok(ModelAnswer::Candidate(Candidate::text(s.clone()))),
            Value::Object(o) if o.get("kind").and_then(Value::as_str) == Some("failed") => {
                ModelFailure::deserialize(v)
                    .map(ModelAnswer::Failed)
                    .map_err(AnswerError::Failure)
            }
            _ => Candidate::deserialize(v)
                .map(ModelAnswer::Candidate)
                .map_err(AnswerError::Candidate),
        }
    }

    pub fn to_value(&self) -> Value {
        match self {
            ModelAnswer::Candidate(c) => serde_json::to_value(c),
            ModelAnswer::Failed(f) => serde_json::to_value(f),
        }
        .unwrap_or(Value::Null)
    }
}

impl Candidate {
    /// An answer of one text block.
    pub fn text(text: impl Into<String>) -> Self {
        Candidate {
            output: vec![Block::Text {
                text: text.into(),
                provider_metadata: None,
            }],
            finish_reason: Some(FinishReason::Stop),
            usage: None,
            evidence: None,
        }
    }

    /// The tool calls, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCallBlock> {
        self.output.iter().filter_map(|b| match b {
            Block::ToolCall(c) => Some(c),
            _ => None,
        })
    }

    /// The text blocks joined (JSON blocks rendered as JSON), reasoning left out.
    pub fn text_output(&self) -> String {
        let mut out = String::new();
        for b in &self.output {
            let piece = match b {
                Block::Text { text, .. } => text.clone(),
                Block::Json { value } => value.to_string(),
                _ => continue,
            };
            if !out.is_empty() && !piece.is_empty() {
                out.push('\n');
            }
            out.push_str(&piece);
        }
        out
    }
}

/// One tool call's result as the transcript keeps it (Nylorun's `ToolResult`, v2 notes §5.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// The model's id of the call this answers.
    pub call_id: String,
    /// The tool's name as the model called it.
    pub tool_name: String,
    #[serde(flatten)]
    pub outcome: ResultOutcome,
}

/// How a tool call ended, as the model is told.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ResultOutcome {
    Completed {
        output: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        files: Option<Value>,
    },
    Denied {
        reason: String,
    },
    Failed {
        code: String,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        details: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retryable: Option<bool>,
    },
}

impl ResultOutcome {
    pub fn failed(code: &str, message: impl Into<String>) -> Self {
        ResultOutcome::Failed {
            code: code.to_owned(),
            message: message.into(),
            details: None,
            retryable: None,
        }
    }

    /// The text the model reads for this result: a string output as is, anything else as JSON.
    pub fn model_text(&self) -> String {
        match self {
            ResultOutcome::Completed {
                output: Value::String(s),
                ..
            } => s.clone(),
            ResultOutcome::Completed { output, .. } => output.to_string(),
            other => serde_json::to_string(other).unwrap_or_default(),
        }
    }
}

impl From<crate::tools::ToolOutcome> for ResultOutcome {
    fn from(o: crate::tools::ToolOutcome) -> Self {
        match o {
            crate::tools::ToolOutcome::Completed { output } => ResultOutcome::Completed {
                output,
                files: None,
            },
            crate::tools::ToolOutcome::Failed {
                code,
                message,
                retryable,
            } => ResultOutcome::Failed {
                code,
                message,
                details: None,
                retryable,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn candidates_round_trip_in_the_wire_shape() {
        let v = json!({
            "output": [
                {"type": "reasoning", "text": "hmm"},
                {"type": "text", "text": "Let me look."},
                {"type": "tool-call", "id": "c1", "name": "bash", "args": {"command": "ls"}}
            ],
            "finishReason": "tool-calls",
            "usage": {"inputTokens": 10, "outputTokens": 3}
        });
        let a = ModelAnswer::from_value(&v).unwrap();
        assert_eq!(a.to_value(), v);
        let ModelAnswer::Candidate(c) = a else {
            panic!()
        };
        assert_eq!(
            c.tool_calls().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["bash"]
        );
        assert_eq!(c.text_output(), "Let me look.");
    }

    #[test]
    fn strings_failures_and_unknown_finish_reasons_parse() {
        assert_eq!(
            ModelAnswer::from_value(&json!("hi")).unwrap(),
            ModelAnswer::Candidate(Candidate::text("hi"))
        );
        let f = json!({"kind": "failed", "code": "rate_limited", "message": "slow down", "retryable": true});
        assert_eq!(
            ModelAnswer::from_value(&f).unwrap(),
            ModelAnswer::Failed(ModelFailure::new("rate_limited", "slow down", true))
        );
        let c = json!({"output": [], "finishReason": "something-new"});
        let ModelAnswer::Candidate(c) = ModelAnswer::from_value(&c).unwrap() else {
            panic!()
        };
        assert_eq!(c.finish_reason, Some(FinishReason::Other));
    }

    #[test]
    fn malformed_tool_arguments_are_kept_for_an_error() {
        let ok = ToolCallBlock::from_json_arguments("1".into(), "read".into(), r#"{"path":"a"}"#);
        assert_eq!((ok.args, ok.raw), (json!({"path": "a"}), None));
        let empty = ToolCallBlock::from_json_arguments("2".into(), "glob".into(), "");
        assert_eq!(empty.args, json!({}));
        let bad = ToolCallBlock::from_json_arguments("3".into(), "bash".into(), "{not json");
        assert_eq!(bad.raw.as_deref(), Some("{not json"));
        assert_eq!(
            bad.argument_error().unwrap(),
            "The arguments of this bash call are not a JSON object: \"{not json\". Call the tool \
             again with a JSON object as its arguments."
        );
    }
}
