//! The Model Gate client (v5 §5; HTTP facts from v2 notes §4.3).
//!
//! Owns: `POST {gates}/nylorun/v1/model-calls` with the run token, the effect id as
//! `Idempotency-Key` and the turn's `traceparent`; turning every answer — a candidate, a failure
//! outcome, an HTTP error, a lost connection — into a model outcome; and the cancel route.
//!
//! Invariants:
//! * podhost never retries a call on its own: a call whose answer was lost is sent again only
//!   when core answers its intent `execute` with `rejoin` (same key, same bytes).
//! * Every failure the gate answered, or that happened before the call left podhost (the gate
//!   could not be reached), is an outcome with a code (`transient`, `auth`, `invalid_request`,
//!   …), never a Rust error: the loop fails the turn as `model.<code>`.
//! * A call whose fate is unknown — the connection dropped or timed out after the request was
//!   sent — is [`CallFate::Unknown`], never a definite failure: the gate may have run it (and
//!   metered it). The turn reports it as `effect.outcome {error}`, so the effect becomes
//!   `uncertain` and the next owner rejoins it under the same key (v5 §4).
//! * The run token is sent as a header and appears in no error message or log line.
//!
//! Non-goals: the Tool Gate (MCP and HTTP tools are not offered yet).

use std::sync::Arc;
use std::time::Duration;

use reqwest::{StatusCode, Url};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::agent::model::{ModelAnswer, ModelFailure};
use crate::floor::codes;
use crate::nylorun::link::channel::note_unknown_field;
use crate::nylorun::link::protocol::RunToken;

/// The gate's own provider timeout is 600 s; the client waits a little longer (v2 notes §4.3).
pub const MODEL_CALL_TIMEOUT: Duration = Duration::from_secs(630);
/// The cancel route answers at once.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the gates client could not be built.
#[derive(Debug, thiserror::Error)]
#[error("could not build the gates HTTP client: {0}")]
pub struct GatesError(String);

/// One model call, ready to send.
pub struct ModelRequest<'a> {
    /// The current run token (`RunHandle::token`); `None` fails the call as `transient`.
    pub token: Option<RunToken>,
    /// The effect id: `Idempotency-Key`.
    pub effect_id: &'a str,
    pub traceparent: Option<&'a str>,
    pub tracestate: Option<&'a str>,
    /// `{effectId, invocationId, call}`, serialized once so a rejoin sends the same bytes.
    pub body: &'a [u8],
}

/// A call that did not end with an answer because the run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped;

/// What became of a model call.
#[derive(Clone, Debug, PartialEq)]
pub enum CallFate {
    /// The gate answered (a candidate or a failure), or the call never left podhost.
    Answered(ModelAnswer),
    /// The request was sent and its answer lost: the gate may have run it. Why, for the record.
    Unknown(String),
}

/// An HTTP client for a gate at `NYLORUN_GATES_URL` (the Model Gate, the Tool Gate): podhost's
/// one TLS configuration ([`crate::floor::tls`]), a time limit per call, and URLs made by
/// appending path segments to the base.
#[derive(Clone, Debug)]
pub(crate) struct GateHttp {
    pub http: reqwest::Client,
    base: Url,
}

impl GateHttp {
    pub fn new(
        base: Url,
        tls: &Arc<rustls::ClientConfig>,
        timeout: Duration,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(rustls::ClientConfig::clone(tls))
            .timeout(timeout)
            .connect_timeout(Duration::from_secs(10))
            .tcp_keepalive(Duration::from_secs(30))
            .build()?;
        Ok(GateHttp { http, base })
    }

    /// The base with `segments` appended (each percent-encoded).
    pub fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }
}

/// The gates at `NYLORUN_GATES_URL`.
#[derive(Clone, Debug)]
pub struct Gates {
    gate: GateHttp,
}

impl Gates {
    /// `tls` is podhost's one client configuration ([`crate::floor::tls`]).
    pub fn new(base: Url, tls: &Arc<rustls::ClientConfig>) -> Result<Self, GatesError> {
        let gate =
            GateHttp::new(base, tls, MODEL_CALL_TIMEOUT).map_err(|e| GatesError(e.to_string()))?;
        Ok(Gates { gate })
    }

    /// Sends a model call and waits for its outcome, or until `cancel` fires (`Stopped`: the
    /// caller decides whether to cancel it at the gate).
    pub async fn model_call(
        &self,
        req: ModelRequest<'_>,
        cancel: &CancellationToken,
    ) -> Result<CallFate, Stopped> {
        let Some(token) = req.token else {
            return Ok(CallFate::Answered(ModelAnswer::Failed(ModelFailure::new(
                codes::model::TRANSIENT,
                "podhost holds no run token for this run, so it cannot call the Model Gate",
                true,
            ))));
        };
        let mut builder = self
            .gate
            .http
            .post(self.gate.url(&["nylorun", "v1", "model-calls"]))
            .bearer_auth(token.expose())
            .header("Idempotency-Key", req.effect_id)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(req.body.to_vec());
        if let Some(tp) = req.traceparent {
            builder = builder.header("traceparent", tp);
        }
        if let Some(ts) = req.tracestate {
            builder = builder.header("tracestate", ts);
        }
        let started = std::time::Instant::now();
        let call = async {
            let response = builder.send().await.map_err(transport)?;
            let status = response.status();
            crate::floor::metrics::model_http_status("model_gate", status.as_u16());
            let bytes = response.bytes().await.map_err(|e| {
                CallFate::Unknown(format!(
                    "The Model Gate's answer ({}) was lost: {}",
                    status.as_u16(),
                    e.without_url()
                ))
            })?;
            Ok::<_, CallFate>(answer(status, &bytes))
        };
        let result = tokio::select! {
            r = call => Ok(match r {
                Ok(a) => CallFate::Answered(a),
                Err(fate) => fate,
            }),
            _ = cancel.cancelled() => Err(Stopped),
        };
        crate::floor::metrics::model_call(
            "model_gate",
            match &result {
                Ok(CallFate::Answered(ModelAnswer::Failed(_)) | CallFate::Unknown(_)) => "failed",
                Ok(CallFate::Answered(_)) => "ok",
                Err(Stopped) => "cancelled",
            },
            started.elapsed(),
        );
        result
    }

    /// `POST /nylorun/v1/model-calls/{key}/cancel`: aborts a call podhost started. Best effort:
    /// the result is logged.
    pub async fn cancel_model_call(&self, token: Option<RunToken>, effect_id: &str) {
        let Some(token) = token else { return };
        let url = self
            .gate
            .url(&["nylorun", "v1", "model-calls", effect_id, "cancel"]);
        let sent = self
            .gate
            .http
            .post(url)
            .bearer_auth(token.expose())
            .header("Idempotency-Key", effect_id)
            .timeout(CANCEL_TIMEOUT)
            .send()
            .await;
        match sent {
            Ok(r) => {
                tracing::info!(%effect_id, status = r.status().as_u16(), "model call cancelled at the gate")
            }
            Err(e) => {
                tracing::warn!(%effect_id, error = %e.without_url(), "could not cancel the model call at the gate")
            }
        }
    }
}

/// A call that failed in transport. Not connected: nothing was sent, a definite `transient`
/// failure (v2 notes §4.3). Anything later (a dropped connection, a timeout): the request may
/// have reached the gate, so its fate is unknown.
fn transport(e: reqwest::Error) -> CallFate {
    if e.is_connect() {
        return CallFate::Answered(ModelAnswer::Failed(ModelFailure::new(
            codes::model::TRANSIENT,
            format!("The Model Gate could not be reached: {}", e.without_url()),
            true,
        )));
    }
    let what = if e.is_timeout() {
        "timed out"
    } else {
        "lost the call"
    };
    CallFate::Unknown(format!("The Model Gate {what}: {}", e.without_url()))
}

/// The outcome an HTTP answer stands for.
fn answer(status: StatusCode, body: &[u8]) -> ModelAnswer {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    // The gate may add fields to its answers: ignored, each logged once.
    for key in json
        .iter()
        .filter_map(Value::as_object)
        .flat_map(|o| o.keys())
    {
        if key != "outcome" && key != "error" {
            note_unknown_field("the Model Gate", "model-calls", key);
        }
    }
    if status == StatusCode::OK {
        let outcome = json.as_ref().and_then(|v| v.get("outcome"));
        return match outcome.map(ModelAnswer::from_value) {
            Some(Ok(a)) => a,
            Some(Err(e)) => ModelAnswer::Failed(ModelFailure::new(
                codes::model::INVALID_OUTPUT,
                format!("The Model Gate's answer is not a model outcome: {e}"),
                false,
            )),
            None => ModelAnswer::Failed(ModelFailure::new(
                codes::model::INVALID_OUTPUT,
                "The Model Gate answered 200 without an outcome",
                false,
            )),
        };
    }
    let (code, message) = json
        .as_ref()
        .and_then(|v| v.get("error"))
        .map(|e| {
            (
                e.get("code")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                e.get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            )
        })
        .unwrap_or_default();
    let text = if code.is_empty() {
        format!("The Model Gate answered {}", status.as_u16())
    } else {
        format!(
            "The Model Gate answered {} {code}: {message}",
            status.as_u16()
        )
    };
    let (kind, retryable) = match status.as_u16() {
        401 => (codes::model::AUTH, false),
        400 | 409 | 413 | 422 => (codes::model::INVALID_REQUEST, false),
        _ => (codes::model::TRANSIENT, true),
    };
    ModelAnswer::Failed(ModelFailure::new(kind, text, retryable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn failed(status: u16, body: Value) -> ModelFailure {
        match answer(
            StatusCode::from_u16(status).unwrap(),
            body.to_string().as_bytes(),
        ) {
            ModelAnswer::Failed(f) => f,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn http_errors_map_to_failure_outcomes() {
        let err = |code: &str| json!({"error": {"code": code, "message": "no"}});
        assert_eq!(
            failed(401, err("gate_unauthorized")),
            ModelFailure::new(
                "auth",
                "The Model Gate answered 401 gate_unauthorized: no",
                false
            )
        );
        assert_eq!(failed(409, err("run_stale")).code, "invalid_request");
        assert_eq!(failed(400, err("invalid_request")).code, "invalid_request");
        let f = failed(503, json!("not json at all"));
        assert_eq!(
            f,
            ModelFailure::new("transient", "The Model Gate answered 503", true)
        );
        assert_eq!(failed(200, json!({"nothing": 1})).code, "invalid_output");
        assert_eq!(
            answer(
                StatusCode::OK,
                json!({"outcome": {"output": [{"type": "text", "text": "hi"}]}})
                    .to_string()
                    .as_bytes()
            ),
            ModelAnswer::Candidate(crate::agent::model::Candidate {
                finish_reason: None,
                ..crate::agent::model::Candidate::text("hi")
            })
        );
    }

    #[test]
    fn routes_keep_the_base_path_and_encode_the_key() {
        let tls = crate::floor::tls::client_config(&Default::default()).unwrap();
        let g = Gates::new(Url::parse("http://gw:4100/base/").unwrap(), &tls).unwrap();
        assert_eq!(
            g.gate
                .url(&["nylorun", "v1", "model-calls", "t/1:0:model:s0", "cancel"])
                .as_str(),
            "http://gw:4100/base/nylorun/v1/model-calls/t%2F1:0:model:s0/cancel"
        );
    }
}
