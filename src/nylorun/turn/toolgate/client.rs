//! The Tool Gate client (v5 §5): discovery requests, MCP and HTTP calls, and their cancel.
//!
//! Owns: `POST {gates}/nylorun/v1/{mcp/connect, mcp/list, mcp/close, tool-calls, http-calls}`
//! with the run token as bearer; for a call, the effect id as `Idempotency-Key`, the turn's
//! `traceparent` and a body serialized once (a re-send is the same bytes); reading each answer
//! within a bound; and sorting every answer into a [`GateReply`].
//!
//! Invariants:
//! * podhost never re-sends on its own here: the caller decides (a lost hop asks core the
//!   intent again first, v5 §4).
//! * An answer is read up to a bound ([`answer_bound`]): `limits.toolAnswerBytes` plus room for
//!   the envelope. Past it the call is [`GateReply::TooLarge`]; the connection is dropped, not
//!   drained.
//! * The run token is a header only; no error message or log line carries it (reqwest errors
//!   are shown without their URL, and the URL holds no secret anyway).
//!
//! Non-goals: what a result means to the model ([`super::results`]), retries.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::wire::{Envelope, ServerBody, ServerRef, routes};
use crate::nylorun::link::protocol::RunToken;
use crate::nylorun::turn::gates::GateHttp;

/// A tool call waits this long for its answer, as a model call does (v2 notes §4.3): the gate
/// holds the call; a re-send under the same key joins it.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(630);
/// Connect, list and close answer within this.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(60);
/// The cancel route answers at once.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);
/// Room for the envelope around a tool's answer (`{ok, result}`, escaping).
const ENVELOPE_ROOM: u64 = 64 * 1024;

/// The most answer bytes podhost reads for a tool whose answer the gate keeps within
/// `tool_answer_bytes`.
pub fn answer_bound(tool_answer_bytes: u64) -> u64 {
    tool_answer_bytes.saturating_add(ENVELOPE_ROOM)
}

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("could not build the Tool Gate HTTP client: {0}")]
pub struct ToolGateError(String);

/// How the gate answered one request.
#[derive(Clone, Debug, PartialEq)]
pub enum GateReply {
    /// `200 {ok: true, result}`.
    Ok(Value),
    /// `200 {ok: false, error}`: the tool or the server failed (an answer, not a gate error).
    Failed { code: String, message: String },
    /// A 4xx the gate answers before running anything (`key_required`, `effect_not_journaled`,
    /// `gate_unauthorized`, `invalid_request`, `gate_conflict`, …): the call did not run.
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    /// `409 run_stale`: the run is over.
    RunStale,
    /// No answer: the connection was lost, the call timed out, a 5xx, or a body that is not an
    /// envelope. The call may or may not have run.
    Lost(String),
    /// The answer was past [`answer_bound`].
    TooLarge { limit: u64 },
}

/// One call, ready to send.
pub struct CallRequest<'a> {
    pub token: Option<RunToken>,
    /// `tool-calls` or `http-calls`.
    pub route: &'a [&'a str],
    /// The effect id: `Idempotency-Key`.
    pub key: &'a str,
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
    pub body: &'a [u8],
    /// The most answer bytes to read.
    pub bound: u64,
}

/// The Tool Gate at `NYLORUN_GATES_URL`.
#[derive(Clone, Debug)]
pub struct ToolGate {
    gate: GateHttp,
}

impl ToolGate {
    /// `tls` is podhost's one client configuration ([`crate::floor::tls`]).
    pub fn new(base: Url, tls: &Arc<rustls::ClientConfig>) -> Result<Self, ToolGateError> {
        let gate =
            GateHttp::new(base, tls, CALL_TIMEOUT).map_err(|e| ToolGateError(e.to_string()))?;
        Ok(ToolGate { gate })
    }

    /// `mcp/connect`, `mcp/list` or `mcp/close` for `server` (discovery: no key).
    pub async fn discovery(
        &self,
        token: Option<&RunToken>,
        route: &[&str],
        server: &ServerRef,
        cursor: Option<&str>,
        bound: u64,
        cancel: &CancellationToken,
    ) -> Option<GateReply> {
        let Some(token) = token else {
            return Some(GateReply::Refused {
                status: 0,
                code: "no_run_token".to_owned(),
                message: "podhost holds no run token for this run".to_owned(),
            });
        };
        let body = json_bytes(&ServerBody { server, cursor });
        let request = self
            .gate
            .http
            .post(self.gate.url(route))
            .bearer_auth(token.expose())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(DISCOVERY_TIMEOUT)
            .body(body);
        tokio::select! {
            r = exchange(request, bound) => Some(r),
            _ = cancel.cancelled() => None,
        }
    }

    /// Sends a call and waits for its answer, or until `cancel` fires (`None`: the caller
    /// decides whether to cancel it at the gate).
    pub async fn call(
        &self,
        req: CallRequest<'_>,
        cancel: &CancellationToken,
    ) -> Option<GateReply> {
        let Some(token) = req.token else {
            return Some(GateReply::Refused {
                status: 0,
                code: "no_run_token".to_owned(),
                message: "podhost holds no run token for this run, so it cannot call the Tool \
                          Gate"
                    .to_owned(),
            });
        };
        let mut builder = self
            .gate
            .http
            .post(self.gate.url(req.route))
            .bearer_auth(token.expose())
            .header("Idempotency-Key", req.key)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(req.body.to_vec());
        if let Some(tp) = req.traceparent {
            builder = builder.header("traceparent", tp);
        }
        if let Some(ts) = req.tracestate {
            builder = builder.header("tracestate", ts);
        }
        tokio::select! {
            r = exchange(builder, req.bound) => Some(r),
            _ = cancel.cancelled() => None,
        }
    }

    /// `POST /nylorun/v1/tool-calls/{key}/cancel`: aborts a call podhost started. Best effort:
    /// the result is logged.
    pub async fn cancel(&self, token: Option<RunToken>, key: &str) {
        let Some(token) = token else { return };
        let sent = self
            .gate
            .http
            .post(self.gate.url(&routes::cancel(key)))
            .bearer_auth(token.expose())
            .header("Idempotency-Key", key)
            .timeout(CANCEL_TIMEOUT)
            .send()
            .await;
        match sent {
            Ok(r) => {
                tracing::info!(effect_id = %key, status = r.status().as_u16(), "tool call cancelled at the gate")
            }
            Err(e) => {
                tracing::warn!(effect_id = %key, error = %e.without_url(), "could not cancel the tool call at the gate")
            }
        }
    }
}

fn json_bytes<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing plain structs of strings and values cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

/// Sends one request and reads its answer within `bound` bytes.
async fn exchange(request: reqwest::RequestBuilder, bound: u64) -> GateReply {
    let mut response = match request.send().await {
        Ok(r) => r,
        Err(e) => return GateReply::Lost(transport(e)),
    };
    let status = response.status();
    if response.content_length().is_some_and(|n| n > bound) {
        return GateReply::TooLarge { limit: bound };
    }
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() as u64 + chunk.len() as u64 > bound {
                    return GateReply::TooLarge { limit: bound };
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Err(e) => return GateReply::Lost(transport(e)),
        }
    }
    classify(status, &body)
}

/// What a lost request says.
fn transport(e: reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "could not be reached"
    } else {
        "lost the call"
    };
    format!("The Tool Gate {what}: {}", e.without_url())
}

/// The reply an HTTP answer stands for.
fn classify(status: StatusCode, body: &[u8]) -> GateReply {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    if status == StatusCode::OK {
        return match json.as_ref().map(Envelope::parse) {
            Some(Ok(Envelope::Ok(result))) => GateReply::Ok(result),
            Some(Ok(Envelope::Err { code, message })) => GateReply::Failed { code, message },
            Some(Err(why)) => {
                GateReply::Lost(format!("The Tool Gate's answer is unreadable: {why}"))
            }
            None => GateReply::Lost("The Tool Gate's answer is not JSON".to_owned()),
        };
    }
    let field = |k: &str| {
        json.as_ref()
            .and_then(|v| v.get("error"))
            .and_then(|e| e.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    let (code, message) = (field("code"), field("message"));
    match status.as_u16() {
        409 if code == "run_stale" => GateReply::RunStale,
        s @ 400..=499 => GateReply::Refused {
            status: s,
            code,
            message,
        },
        s => GateReply::Lost(if code.is_empty() {
            format!("The Tool Gate answered {s}")
        } else {
            format!("The Tool Gate answered {s} {code}: {message}")
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn reply(status: u16, body: Value) -> GateReply {
        classify(
            StatusCode::from_u16(status).unwrap(),
            body.to_string().as_bytes(),
        )
    }

    #[test]
    fn answers_sort_into_replies() {
        let err = |code: &str| json!({"error": {"code": code, "message": "no"}});
        assert_eq!(
            reply(200, json!({"ok": true, "result": {"content": []}})),
            GateReply::Ok(json!({"content": []}))
        );
        assert_eq!(
            reply(
                200,
                json!({"ok": false, "error": {"code": "mcp.too-large", "message": "big"}})
            ),
            GateReply::Failed {
                code: "mcp.too-large".into(),
                message: "big".into()
            }
        );
        assert_eq!(reply(409, err("run_stale")), GateReply::RunStale);
        assert_eq!(
            reply(409, err("effect_not_journaled")),
            GateReply::Refused {
                status: 409,
                code: "effect_not_journaled".into(),
                message: "no".into()
            }
        );
        assert_eq!(
            reply(400, err("key_required")),
            GateReply::Refused {
                status: 400,
                code: "key_required".into(),
                message: "no".into()
            }
        );
        assert_eq!(
            reply(502, json!("down")),
            GateReply::Lost("The Tool Gate answered 502".into())
        );
        assert_eq!(
            reply(200, json!({"result": 1})),
            GateReply::Lost(
                "The Tool Gate's answer is unreadable: the answer has no boolean `ok`".into()
            )
        );
    }

    #[tokio::test]
    async fn an_answer_past_the_bound_is_too_large_and_not_read() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let big = format!("{{\"ok\":true,\"result\":\"{}\"}}", "x".repeat(5000));
        let app = axum::Router::new().route(
            "/nylorun/v1/tool-calls",
            axum::routing::post(move || {
                let big = big.clone();
                async move { big }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = Url::parse(&format!("http://{}/", listener.local_addr().unwrap())).unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let tls = crate::floor::tls::client_config(&Default::default()).unwrap();
        let gate = ToolGate::new(base, &tls).unwrap();
        let send = |bound: u64| {
            let gate = gate.clone();
            async move {
                let req = CallRequest {
                    token: Some(RunToken::new("t")),
                    route: &routes::TOOL_CALLS,
                    key: "k",
                    traceparent: None,
                    tracestate: None,
                    body: b"{}",
                    bound,
                };
                tokio::time::timeout(
                    Duration::from_secs(10),
                    gate.call(req, &CancellationToken::new()),
                )
                .await
                .unwrap()
                .unwrap()
            }
        };
        assert_eq!(send(1000).await, GateReply::TooLarge { limit: 1000 });
        assert_eq!(send(6000).await, GateReply::Ok(json!("x".repeat(5000))));
    }

    #[test]
    fn routes_keep_the_base_path_and_encode_the_key() {
        let tls = crate::floor::tls::client_config(&Default::default()).unwrap();
        let g = ToolGate::new(Url::parse("http://gw:4100/base/").unwrap(), &tls).unwrap();
        assert_eq!(
            g.gate.url(&routes::cancel("t/1:0:tool:s0.c1")).as_str(),
            "http://gw:4100/base/nylorun/v1/tool-calls/t%2F1:0:tool:s0.c1/cancel"
        );
        assert_eq!(
            g.gate.url(&routes::CONNECT).as_str(),
            "http://gw:4100/base/nylorun/v1/mcp/connect"
        );
    }
}
