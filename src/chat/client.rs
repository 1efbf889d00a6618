//! The OpenAI-compatible model client: `POST {base_url}/chat/completions`.
//!
//! Owns: the request body (model, transcript, tools, generation settings merged in as given),
//! retries with backoff on `429`, `5xx` and transport errors (honouring `Retry-After` within a
//! cap), lenient parsing of the answer into a [`Candidate`], and failure messages that name the
//! cause.
//!
//! Invariants:
//! * The API key goes only into the `Authorization` header. Every text this module returns is
//!   scrubbed of it, so a server that echoes the key cannot leak it into a status or a log.
//! * A cancelled token aborts the call at once, also mid-request and mid-backoff.
//! * Attempts are bounded; the last failure is reported, not swallowed.
//!
//! Non-goals: streaming, and choosing what to send (the turn builds the transcript).

use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use super::message::{ApiKey, ChatMessage, ModelEndpoint};
use crate::agent::model::{Block, Candidate, FinishReason, ToolCallBlock, Usage};

/// How hard the client tries.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in all (the first one included).
    pub attempts: u32,
    /// The first backoff; it doubles per attempt up to `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// The longest `Retry-After` honoured.
    pub retry_after_cap: Duration,
    /// One attempt's time limit.
    pub request_timeout: Duration,
    /// The largest answer body read; a larger one fails the call.
    pub max_answer_bytes: usize,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(4),
            retry_after_cap: Duration::from_secs(30),
            request_timeout: Duration::from_secs(600),
            max_answer_bytes: 64 << 20,
        }
    }
}

/// Why a model call produced no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// The message names the cause and never holds the key.
    #[error("{0}")]
    Failed(String),
    /// The prompt is past the model's context window (`context_length_exceeded`, or a 4xx whose
    /// message says so); the message keeps the server's numbers.
    #[error("{0}")]
    Overflow(String),
    /// The server refused the request as invalid (HTTP 400, 413 or 422).
    #[error("{0}")]
    Invalid(String),
    #[error("the model call was cancelled")]
    Cancelled,
}

/// A shared, cheap-to-clone client.
#[derive(Clone, Debug)]
pub struct ModelClient {
    pub(super) http: reqwest::Client,
    policy: RetryPolicy,
}

/// One attempt's result, before the retry decision.
enum Attempt {
    Answer(Value),
    /// `head` names the cause ("The model endpoint returned HTTP 500"); `detail` quotes it.
    Retry {
        head: String,
        detail: String,
        after: Option<Duration>,
    },
    Fatal(String),
    /// A refusal of the request: an overflow when `overflow`, else an invalid request.
    Refused {
        why: String,
        overflow: bool,
    },
}

impl ModelClient {
    /// Needs a rustls crypto provider installed (the binary installs one in `main`).
    pub fn new(policy: RetryPolicy) -> Result<Self, ModelError> {
        let http = reqwest::Client::builder()
            .timeout(policy.request_timeout)
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ModelError::Failed(format!("could not build the HTTP client: {e}")))?;
        Ok(ModelClient { http, policy })
    }

    /// The request body: the generation settings as given, then the fields podhost owns.
    pub fn body(
        conn: &ModelEndpoint,
        system: &ChatMessage,
        transcript: &[ChatMessage],
        tools: &Value,
    ) -> Value {
        let mut body: Map<String, Value> = conn.generation_settings.clone();
        let messages: Vec<&ChatMessage> = std::iter::once(system).chain(transcript).collect();
        body.insert("model".into(), Value::String(conn.model.clone()));
        body.insert("messages".into(), json!(messages));
        body.insert("tools".into(), tools.clone());
        Value::Object(body)
    }

    /// Calls the model with retries, or fails with a message that names the cause.
    pub async fn complete(
        &self,
        conn: &ModelEndpoint,
        key: Option<&ApiKey>,
        body: &Value,
        cancel: &CancellationToken,
    ) -> Result<Candidate, ModelError> {
        let url = format!("{}/chat/completions", conn.base_url.trim_end_matches('/'));
        let attempts = self.policy.attempts.max(1);
        let mut last = (String::new(), String::new());
        for n in 1..=attempts {
            let attempt = tokio::select! {
                _ = cancel.cancelled() => return Err(ModelError::Cancelled),
                a = self.attempt(&url, key, body) => a,
            };
            match attempt {
                Attempt::Answer(v) => {
                    return parse_completion(&v).map_err(|e| ModelError::Failed(scrub(&e, key)));
                }
                Attempt::Fatal(why) => return Err(ModelError::Failed(scrub(&why, key))),
                Attempt::Refused { why, overflow } => {
                    let why = scrub(&why, key);
                    return Err(if overflow {
                        ModelError::Overflow(why)
                    } else {
                        ModelError::Invalid(why)
                    });
                }
                Attempt::Retry {
                    head,
                    detail,
                    after,
                } => {
                    last = (head, detail);
                    if n == attempts {
                        break;
                    }
                    let backoff = self
                        .policy
                        .base_delay
                        .saturating_mul(1 << (n - 1).min(16))
                        .min(self.policy.max_delay);
                    let delay = after
                        .map(|a| a.min(self.policy.retry_after_cap))
                        .unwrap_or(backoff);
                    tokio::select! {
                        _ = cancel.cancelled() => return Err(ModelError::Cancelled),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        let (head, detail) = last;
        Err(ModelError::Failed(scrub(
            &format!("{head} after {attempts} attempts: {detail}"),
            key,
        )))
    }

    async fn attempt(&self, url: &str, key: Option<&ApiKey>, body: &Value) -> Attempt {
        let mut req = self
            .http
            .post(url)
            .header(reqwest::header::ACCEPT_ENCODING, "identity")
            .json(body);
        if let Some(k) = key {
            req = req.bearer_auth(k.expose());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timed out"
                } else {
                    "could not be reached"
                };
                return Attempt::Retry {
                    head: format!("The model endpoint {kind}"),
                    detail: error_chain(&e),
                    after: None,
                };
            }
        };
        let status = resp.status();
        let after = retry_after(resp.headers());
        let text = match self.read_capped(resp).await {
            Ok(Some(t)) => t,
            Ok(None) => {
                return Attempt::Fatal(format!(
                    "The model endpoint's answer (HTTP {}) is larger than {} bytes",
                    status.as_u16(),
                    self.policy.max_answer_bytes
                ));
            }
            Err(e) => {
                return Attempt::Retry {
                    head: "The model endpoint's answer could not be read".to_owned(),
                    detail: error_chain(&e),
                    after: None,
                };
            }
        };
        if status.is_success() {
            return match serde_json::from_str(&text) {
                Ok(v) => Attempt::Answer(v),
                Err(e) => Attempt::Fatal(format!(
                    "The model endpoint's answer is not JSON ({e}): {}",
                    snippet(&text)
                )),
            };
        }
        let head = format!("The model endpoint returned HTTP {}", status.as_u16());
        let detail = snippet(&text);
        if status.as_u16() == 429 || status.is_server_error() {
            Attempt::Retry {
                head,
                detail,
                after,
            }
        } else if matches!(status.as_u16(), 400 | 413 | 422) {
            Attempt::Refused {
                overflow: is_overflow(&text),
                why: format!("{head}: {detail}"),
            }
        } else {
            Attempt::Fatal(format!("{head}: {detail}"))
        }
    }
}

impl ModelClient {
    /// The body as text, or `None` past `max_answer_bytes`.
    async fn read_capped(
        &self,
        mut resp: reqwest::Response,
    ) -> Result<Option<String>, reqwest::Error> {
        let mut buf = Vec::new();
        while let Some(chunk) = resp.chunk().await? {
            if buf.len() + chunk.len() > self.policy.max_answer_bytes {
                return Ok(None);
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
    }
}

/// Whether a refusal's body says the prompt is past the context window.
fn is_overflow(body: &str) -> bool {
    let b = body.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "maximum context length",
        "context window",
        "context length",
        "prompt is too long",
        "too many tokens",
        "reduce the length",
    ]
    .iter()
    .any(|p| b.contains(p))
}

/// An error and its sources, one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        out.push_str(": ");
        out.push_str(&s.to_string());
        src = s.source();
    }
    out
}

/// The start of an error body, on one line.
fn snippet(text: &str) -> String {
    let t: String = text.trim().chars().take(300).collect();
    let t = t.replace(['\n', '\r'], " ");
    if t.is_empty() {
        "(empty body)".to_owned()
    } else {
        t
    }
}

/// `Retry-After` in seconds (the HTTP-date form is rare from model servers and is ignored).
fn retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let v = h.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    let secs: f64 = v.parse().ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(86_400.0)))
}

/// `text` with every occurrence of the key replaced.
pub fn scrub(text: &str, key: Option<&ApiKey>) -> String {
    match key {
        Some(k) if !k.expose().is_empty() => text.replace(k.expose(), "[redacted]"),
        _ => text.to_owned(),
    }
}

/// Reads a chat completion leniently: missing fields are empty, unknown finish reasons are
/// `other`, arguments that are not a JSON string are kept for the loop to answer as an error.
pub fn parse_completion(v: &Value) -> Result<Candidate, String> {
    let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
        let detail = v
            .get("error")
            .map(|e| format!(": {}", snippet(&e.to_string())))
            .unwrap_or_default();
        return Err(format!(
            "The model endpoint answered without a choice{detail}"
        ));
    };
    let msg = choice.get("message").cloned().unwrap_or(Value::Null);
    let mut output = Vec::new();
    for key in ["reasoning_content", "reasoning"] {
        if let Some(text) = msg
            .get(key)
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            output.push(Block::Reasoning {
                text: text.to_owned(),
                provider_metadata: None,
            });
            break;
        }
    }
    let text = content_text(msg.get("content"));
    if !text.is_empty() {
        output.push(Block::Text {
            text,
            provider_metadata: None,
        });
    }
    for call in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
        let f = call.get("function").cloned().unwrap_or(Value::Null);
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        let arguments = match f.get("arguments") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => String::new(),
            Some(other) => other.to_string(),
        };
        output.push(Block::ToolCall(ToolCallBlock::from_json_arguments(
            id.to_owned(),
            name.to_owned(),
            &arguments,
        )));
    }
    let finish_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(|r| match r {
            "stop" => FinishReason::Stop,
            "length" => FinishReason::Length,
            "tool_calls" | "function_call" => FinishReason::ToolCalls,
            "content_filter" => FinishReason::ContentFilter,
            _ => FinishReason::Other,
        });
    let usage = v.get("usage").map(|u| Usage {
        input_tokens: u.get("prompt_tokens").and_then(Value::as_u64),
        output_tokens: u.get("completion_tokens").and_then(Value::as_u64),
        total_tokens: u.get("total_tokens").and_then(Value::as_u64),
        ..Usage::default()
    });
    Ok(Candidate {
        output,
        finish_reason,
        usage,
        evidence: None,
    })
}

/// `content` as a string, an array of text parts, or absent.
fn content_text(c: Option<&Value>) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn sloppy_answers_parse() {
        let v = json!({"choices": [{"message": {
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "tool_calls": [
                {"id": "1", "function": {"name": "bash", "arguments": {"command": "ls"}}},
                {"function": {"name": "read", "arguments": "{nope"}}
            ]}, "finish_reason": "weird"}]});
        let c = parse_completion(&v).unwrap();
        assert_eq!(c.text_output(), "ab");
        assert_eq!(c.finish_reason, Some(FinishReason::Other));
        let calls: Vec<_> = c.tool_calls().cloned().collect();
        assert_eq!(calls[0].args, json!({"command": "ls"}));
        assert_eq!(calls[1].raw.as_deref(), Some("{nope"));
        assert_eq!(calls[1].id, "");
        assert_eq!(
            parse_completion(&json!({"error": {"message": "x"}})).unwrap_err(),
            "The model endpoint answered without a choice: {\"message\":\"x\"}"
        );
    }

    #[test]
    fn settings_merge_in_but_do_not_replace_the_protocol_fields() {
        let mut settings = Map::new();
        settings.insert("temperature".into(), json!(0.25));
        settings.insert("model".into(), json!("other"));
        let conn = ModelEndpoint {
            base_url: "http://x".into(),
            model: "m".into(),
            generation_settings: settings,
        };
        let body = ModelClient::body(&conn, &ChatMessage::system("s"), &[], &json!([]));
        assert_eq!(body["temperature"], json!(0.25));
        assert_eq!(body["model"], json!("m"));
        assert_eq!(
            body["messages"],
            json!([{"role": "system", "content": "s"}])
        );
    }

    #[tokio::test]
    async fn answers_past_the_cap_fail_the_call() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(|| async { "x".repeat(2048) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = ModelClient::new(RetryPolicy {
            max_answer_bytes: 1024,
            ..RetryPolicy::default()
        })
        .unwrap();
        let conn = ModelEndpoint {
            base_url: format!("http://{addr}/v1"),
            model: "m".into(),
            generation_settings: Map::new(),
        };
        let err = client
            .complete(&conn, None, &json!({}), &CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ModelError::Failed(
                "The model endpoint's answer (HTTP 200) is larger than 1024 bytes".into()
            )
        );
    }

    #[test]
    fn overflows_are_told_from_other_refusals() {
        assert!(is_overflow(
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","code":"context_length_exceeded"}}"#
        ));
        assert!(!is_overflow(r#"{"error":{"message":"bad request"}}"#));
    }

    #[test]
    fn keys_are_scrubbed() {
        let k = ApiKey::new("sk-123");
        assert_eq!(scrub("bad key sk-123!", Some(&k)), "bad key [redacted]!");
    }
}
