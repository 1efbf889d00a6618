//! The OpenAI-compatible model client: `POST {base_url}/chat/completions`.
//!
//! Owns: the request body (model, transcript, tools, generation settings merged in as given),
//! streaming or not ([`ModelClient::streaming`]), retries with backoff on `429`, `5xx`,
//! transport errors and broken streams (honouring `Retry-After` within a cap), lenient parsing
//! of the answer into a [`Candidate`], progress while an answer streams in, and failure messages
//! that name the cause.
//!
//! Streaming asks for `stream: true` (with the usage in the last chunk) and reads server-sent
//! events ([`super::stream`]): a long generation then shows progress and is bounded by the
//! silence between chunks ([`RetryPolicy::stream_idle`]), not by one timeout for the whole
//! answer. Either way the answer is read by what the server sent (`Content-Type`), so a server
//! that streams when not asked, or ignores `stream`, still works.
//!
//! Invariants:
//! * The API key goes only into the `Authorization` header. Every text this module returns is
//!   scrubbed of it, so a server that echoes the key cannot leak it into a status or a log.
//! * A cancelled token aborts the call at once, also mid-request, mid-stream and mid-backoff.
//! * Attempts are bounded; the last failure is reported, not swallowed.
//! * An answer, streamed or not, is at most [`RetryPolicy::max_answer_bytes`] on the wire.
//!
//! Non-goals: choosing what to send (the turn builds the transcript).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use url::Url;

use super::message::{ApiKey, ChatMessage, ModelEndpoint, content_text};
use super::stream::{Accumulated, SseParser};
use crate::agent::model::{Block, Candidate, FinishReason, ToolCallBlock, Usage};
use crate::floor::backoff::{Backoff, retry_after, sleep_or_cancel};
use crate::floor::metrics;
use crate::floor::text::error_chain;

/// The `endpoint` label of this client's model calls in the metrics.
const ENDPOINT: metrics::Endpoint = "openai";

/// How hard the client tries.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in all (the first one included).
    pub attempts: u32,
    /// The first backoff; it doubles per attempt up to `max_delay`, each pause drawn from the
    /// upper half of its step (the pacing of [`Backoff`], shared with reconnects).
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// The longest `Retry-After` honoured.
    pub retry_after_cap: Duration,
    /// One attempt's time limit.
    pub request_timeout: Duration,
    /// The largest answer body read; a larger one fails the call.
    pub max_answer_bytes: usize,
    /// The longest silence between two chunks of a streamed answer.
    pub stream_idle: Duration,
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
            stream_idle: Duration::from_secs(300),
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
    /// Ask for a streamed answer.
    stream: bool,
    /// Bytes of the answer received so far in the current attempt (text, reasoning, tool-call
    /// arguments), for a front to show.
    progress: Option<tokio::sync::watch::Sender<u64>>,
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
    /// `tls` is podhost's one client configuration ([`crate::floor::tls`]).
    pub fn new(policy: RetryPolicy, tls: Arc<rustls::ClientConfig>) -> Result<Self, ModelError> {
        // No overall timeout on the client: a streamed answer may take long, and is bounded by
        // the silence between chunks instead; a plain answer gets `request_timeout` per request.
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(rustls::ClientConfig::clone(&tls))
            .connect_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| ModelError::Failed(format!("could not build the HTTP client: {e}")))?;
        Ok(ModelClient {
            http,
            policy,
            stream: false,
            progress: None,
        })
    }

    /// Asks for streamed answers (server-sent events) instead of one JSON body.
    pub fn streaming(mut self, on: bool) -> Self {
        self.stream = on;
        self
    }

    /// Reports the bytes of the answer received so far on `tx` (0 when an attempt starts).
    pub fn with_progress(mut self, tx: tokio::sync::watch::Sender<u64>) -> Self {
        self.progress = Some(tx);
        self
    }

    fn report(&self, received: u64) {
        if let Some(tx) = &self.progress {
            tx.send_replace(received);
        }
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
        let started = std::time::Instant::now();
        let result = self.complete_with_retries(conn, key, body, cancel).await;
        metrics::model_call(
            ENDPOINT,
            match &result {
                Ok(_) => "ok",
                Err(ModelError::Cancelled) => "cancelled",
                Err(_) => "failed",
            },
            started.elapsed(),
        );
        result
    }

    async fn complete_with_retries(
        &self,
        conn: &ModelEndpoint,
        key: Option<&ApiKey>,
        body: &Value,
        cancel: &CancellationToken,
    ) -> Result<Candidate, ModelError> {
        let url = conn.url("chat/completions");
        let body = if self.stream {
            let mut b = body.clone();
            if let Value::Object(o) = &mut b {
                o.insert("stream".into(), Value::Bool(true));
                o.insert("stream_options".into(), json!({"include_usage": true}));
            }
            b
        } else {
            body.clone()
        };
        let body = serde_json::to_vec(&body)
            .map_err(|e| ModelError::Failed(format!("could not encode the request: {e}")))?;
        let attempts = self.policy.attempts.max(1);
        let mut backoff = Backoff::new(self.policy.base_delay, self.policy.max_delay);
        let mut last = (String::new(), String::new());
        for n in 1..=attempts {
            self.report(0);
            let attempt = tokio::select! {
                _ = cancel.cancelled() => return Err(ModelError::Cancelled),
                a = self.attempt(&url, key, &body) => a,
            };
            match attempt {
                Attempt::Answer(v) => {
                    return parse_completion(&v)
                        .map_err(|e| ModelError::Failed(scrub(&e.to_string(), key)));
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
                    metrics::model_retry(ENDPOINT);
                    let pause = backoff.next_delay();
                    let delay = after
                        .map(|a| a.min(self.policy.retry_after_cap))
                        .unwrap_or(pause);
                    if !sleep_or_cancel(delay, cancel).await {
                        return Err(ModelError::Cancelled);
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

    /// One request: sends it, then reads what came back.
    async fn attempt(&self, url: &Url, key: Option<&ApiKey>, body: &[u8]) -> Attempt {
        match self.send(url, key, body).await {
            Ok(resp) => self.receive(resp).await,
            Err(failed) => failed,
        }
    }

    /// Sends the request and waits for the answer's headers; a failure is the attempt's outcome.
    async fn send(
        &self,
        url: &Url,
        key: Option<&ApiKey>,
        body: &[u8],
    ) -> Result<reqwest::Response, Attempt> {
        use reqwest::header;
        let mut req = self
            .http
            .post(url.clone())
            .header(header::ACCEPT_ENCODING, "identity")
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.to_vec());
        req = if self.stream {
            req.header(header::ACCEPT, "text/event-stream")
        } else {
            req.timeout(self.policy.request_timeout)
        };
        if let Some(k) = key {
            req = req.bearer_auth(k.expose());
        }
        let timed_out = || Attempt::Retry {
            head: "The model endpoint timed out".to_owned(),
            detail: format!(
                "no answer within {} s",
                self.policy.request_timeout.as_secs()
            ),
            after: None,
        };
        // Until the headers arrive, a streamed request has the plain request's time limit too.
        let sent = match tokio::time::timeout(self.policy.request_timeout, req.send()).await {
            Ok(sent) => sent,
            Err(_) => return Err(timed_out()),
        };
        // reqwest's errors name the URL, query and all, where a key may sit: every one here is
        // told without it (the run says which endpoint, redacted).
        match sent {
            Ok(r) => Ok(r),
            Err(e) => {
                let kind = if e.is_timeout() {
                    "timed out"
                } else {
                    "could not be reached"
                };
                Err(Attempt::Retry {
                    head: format!("The model endpoint {kind}"),
                    detail: error_chain(&e.without_url()),
                    after: None,
                })
            }
        }
    }

    /// Reads an answer: a stream, a JSON body, or an HTTP error sorted into retry, refusal or
    /// failure.
    async fn receive(&self, resp: reqwest::Response) -> Attempt {
        use reqwest::header;
        let status = resp.status();
        metrics::model_http_status(ENDPOINT, status.as_u16());
        let after = resp
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(retry_after);
        let event_stream = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
        if status.is_success() && event_stream {
            return self.read_stream(resp).await;
        }
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
                    detail: error_chain(&e.without_url()),
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
    /// Reads a streamed answer to its end, folding its chunks into one completion.
    async fn read_stream(&self, mut resp: reqwest::Response) -> Attempt {
        let mut parser = SseParser::default();
        let mut acc = Accumulated::default();
        let mut events = Vec::new();
        let mut total = 0usize;
        let mut done = false;
        while !done {
            let chunk = match tokio::time::timeout(self.policy.stream_idle, resp.chunk()).await {
                Err(_) => {
                    return Attempt::Retry {
                        head: "The model endpoint's stream stalled".to_owned(),
                        detail: format!("no data for {} s", self.policy.stream_idle.as_secs_f64()),
                        after: None,
                    };
                }
                Ok(Err(e)) => {
                    return Attempt::Retry {
                        head: "The model endpoint's stream broke off".to_owned(),
                        detail: error_chain(&e.without_url()),
                        after: None,
                    };
                }
                Ok(Ok(None)) => {
                    parser.finish(&mut events);
                    done = true;
                    None
                }
                Ok(Ok(Some(bytes))) => Some(bytes),
            };
            if let Some(bytes) = chunk {
                total += bytes.len();
                if total > self.policy.max_answer_bytes {
                    return Attempt::Fatal(format!(
                        "The model endpoint's streamed answer is larger than {} bytes",
                        self.policy.max_answer_bytes
                    ));
                }
                parser.feed(&bytes, &mut events);
            }
            for event in events.drain(..) {
                let data = event.data.trim();
                if data == "[DONE]" {
                    return Attempt::Answer(std::mem::take(&mut acc).into_completion());
                }
                let chunk: Value = match serde_json::from_str(data) {
                    Ok(v) => v,
                    Err(e) => {
                        return Attempt::Fatal(format!(
                            "An event of the model endpoint's stream is not JSON ({e}): {}",
                            snippet(data)
                        ));
                    }
                };
                if let Some(err) = chunk.get("error").filter(|e| !e.is_null()) {
                    return Attempt::Fatal(format!(
                        "The model endpoint reported an error in its stream: {}",
                        snippet(&err.to_string())
                    ));
                }
                if event.event.as_deref() == Some("error") {
                    return Attempt::Fatal(format!(
                        "The model endpoint reported an error in its stream: {}",
                        snippet(data)
                    ));
                }
                acc.add(&chunk);
                self.report(acc.received);
            }
        }
        if acc.finished() {
            return Attempt::Answer(acc.into_completion());
        }
        Attempt::Retry {
            head: "The model endpoint's stream ended early".to_owned(),
            detail: "the stream closed before a finish reason or [DONE]".to_owned(),
            after: None,
        }
    }

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

/// `text` with every occurrence of the key replaced.
pub fn scrub(text: &str, key: Option<&ApiKey>) -> String {
    match key {
        Some(k) if !k.expose().is_empty() => text.replace(k.expose(), "[redacted]"),
        _ => text.to_owned(),
    }
}

/// Why a completion body holds no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompletionError {
    #[error("The model endpoint answered without a choice")]
    NoChoice,
    /// No choice, and an `error` (its JSON, cut to a snippet).
    #[error("The model endpoint answered without a choice: {0}")]
    Refused(String),
}

/// Reads a chat completion leniently: missing fields are empty, unknown finish reasons are
/// `other`, arguments that are not a JSON string are kept for the loop to answer as an error.
pub fn parse_completion(v: &Value) -> Result<Candidate, CompletionError> {
    let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
        return Err(match v.get("error") {
            Some(e) => CompletionError::Refused(snippet(&e.to_string())),
            None => CompletionError::NoChoice,
        });
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
            parse_completion(&json!({"error": {"message": "x"}}))
                .unwrap_err()
                .to_string(),
            "The model endpoint answered without a choice: {\"message\":\"x\"}"
        );
    }

    #[test]
    fn settings_merge_in_but_do_not_replace_the_protocol_fields() {
        let mut settings = Map::new();
        settings.insert("temperature".into(), json!(0.25));
        settings.insert("model".into(), json!("other"));
        let conn = ModelEndpoint {
            base_url: Url::parse("http://x").unwrap(),
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
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(|| async { "x".repeat(2048) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let tls = crate::floor::tls::client_config(&Default::default()).unwrap();
        let client = ModelClient::new(
            RetryPolicy {
                max_answer_bytes: 1024,
                ..RetryPolicy::default()
            },
            tls,
        )
        .unwrap();
        let conn = ModelEndpoint {
            base_url: Url::parse(&format!("http://{addr}/v1")).unwrap(),
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

    /// A server streaming `chunks` (each after `pause`), then holding the stream open.
    async fn streaming_server(chunks: Vec<String>, pause: Duration) -> ModelEndpoint {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move || {
                let chunks = chunks.clone();
                async move {
                    let body = futures_util::stream::unfold(
                        chunks.into_iter(),
                        move |mut it| async move {
                            match it.next() {
                                Some(c) => {
                                    tokio::time::sleep(pause).await;
                                    Some((Ok::<_, std::convert::Infallible>(c), it))
                                }
                                None => {
                                    std::future::pending::<()>().await;
                                    None
                                }
                            }
                        },
                    );
                    (
                        [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                        axum::body::Body::from_stream(body),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        ModelEndpoint {
            base_url: Url::parse(&format!("http://{addr}/v1")).unwrap(),
            model: "m".into(),
            generation_settings: Map::new(),
        }
    }

    #[tokio::test]
    async fn a_streamed_answer_past_the_cap_fails_the_call() {
        let chunk = |t: &str| {
            format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": {"content": t}}]})
            )
        };
        let conn = streaming_server(vec![chunk(&"x".repeat(600)); 3], Duration::ZERO).await;
        let tls = crate::floor::tls::client_config(&Default::default()).unwrap();
        let client = ModelClient::new(
            RetryPolicy {
                max_answer_bytes: 1024,
                ..RetryPolicy::default()
            },
            tls,
        )
        .unwrap()
        .streaming(true);
        let err = client
            .complete(&conn, None, &json!({}), &CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ModelError::Failed(
                "The model endpoint's streamed answer is larger than 1024 bytes".into()
            )
        );
    }

    #[tokio::test]
    async fn a_stream_silent_past_its_idle_limit_is_retried_then_fails() {
        let first = format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": "thinking"}}]})
        );
        let conn = streaming_server(vec![first], Duration::ZERO).await;
        let (tx, rx) = tokio::sync::watch::channel(0);
        let tls = crate::floor::tls::client_config(&Default::default()).unwrap();
        let client = ModelClient::new(
            RetryPolicy {
                attempts: 2,
                base_delay: Duration::from_millis(1),
                stream_idle: Duration::from_millis(200),
                ..RetryPolicy::default()
            },
            tls,
        )
        .unwrap()
        .streaming(true)
        .with_progress(tx);
        let err = client
            .complete(&conn, None, &json!({}), &CancellationToken::new())
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ModelError::Failed(
                "The model endpoint's stream stalled after 2 attempts: no data for 0.2 s".into()
            )
        );
        // What came before the silence was reported as progress.
        assert_eq!(*rx.borrow(), 8);
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
