//! The Model Gate client (v5 §4, §5; HTTP facts from v2 notes §4.3).
//!
//! Owns: `POST {gates}/nylorun/v1/model-calls` with the run token, the effect id as
//! `Idempotency-Key` and the turn's `traceparent`; what each send of a call comes to ([`Sent`]);
//! a model outcome or an unknown fate for every call; and the cancel route. Whether a call is
//! sent again, and its fate after its last send, are [`resend()`]'s.
//!
//! What one send comes to:
//! * The gate's word on the call, not sent again: `200 {outcome}` (a candidate, or a failure,
//!   also one the gate calls `retryable`: the loop decides what that means), or any other status
//!   but 429 and 5xx. `401` is an `auth` failure; `400`, `409` (`run_stale` too), `413` and `422`
//!   are `invalid_request`; the rest `transient`. A refusal ends the call even after a lost
//!   send: the same bytes and headers would be refused again.
//! * Not sent (no connection was made): sent again.
//! * `429`: refused without being taken (the gate lists no 429 among its errors; a proxy before
//!   it may answer one): sent again, after its `Retry-After`.
//! * Lost: a 5xx, a connection lost after sending, an answer cut off, a timeout. The request may
//!   have reached the gate, which may have run the call before the hop failed. Sent again, after
//!   a 5xx's `Retry-After` when it has one.
//!
//! Invariants:
//! * Every send of a call is the same bytes under the same key with the same headers (the run
//!   token the call started with). v5 makes that safe: a lost gate hop is asked again (§4), and
//!   the gate joins a re-send to the call it holds for the key — run and metered once — and
//!   answers it the same bytes (§5).
//! * A call some send of which may have reached the gate, and that no answer settled, has an
//!   unknown fate: [`CallFate::Unknown`], never a definite failure. The turn reports it as
//!   `effect.outcome {error}`, the model effect becomes `uncertain`, and the next owner rejoins
//!   it under the same key (v5 §4). A definite `transient` or `rate_limited` failure, which ends
//!   the turn, is left for a call none of whose sends can have run.
//! * The sends are bounded ([`resend()`]): a few, with pauses of seconds paced by the pod's
//!   backoff or the gate's `Retry-After` (under a minute of waiting in all), each send within
//!   [`MODEL_CALL_TIMEOUT`]. A cancellation ends a send or a pause at once ([`Stopped`]).
//! * A call counts once in `podhost_model_calls_total`, with its final result; each re-send
//!   counts in `podhost_model_retries_total`.
//! * The run token is sent as a header and appears in no error message or log line.
//!
//! Non-goals: the Tool Gate's calls (`toolgate`: a lost hop of a tool call asks core the intent
//! again first, so that core counts it).

use std::sync::Arc;
use std::time::Duration;

use reqwest::{RequestBuilder, StatusCode, Url};
use serde_json::Value;
use tokio_util::bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::agent::model::{ModelAnswer, ModelFailure};
use crate::floor::backoff::{Backoff, retry_after};
use crate::floor::{codes, metrics};
use crate::nylorun::link::channel::note_unknown_field;
use crate::nylorun::link::protocol::RunToken;

mod resend;

use resend::{Resends, Sent, resend};

/// The gate's own provider timeout is 600 s; the client waits a little longer (v2 notes §4.3).
pub const MODEL_CALL_TIMEOUT: Duration = Duration::from_secs(630);
/// The cancel route answers at once.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);
/// The `endpoint` label of these calls in the metrics.
const ENDPOINT: metrics::Endpoint = "model_gate";

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
    /// `{effectId, invocationId, call}`, serialized once so every send, and a rejoin, is the
    /// same bytes.
    pub body: &'a [u8],
}

/// A call that did not end with an answer because the run stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stopped;

/// What became of a model call.
#[derive(Clone, Debug, PartialEq)]
pub enum CallFate {
    /// The gate answered (a candidate or a failure), or no send of the call can have run.
    Answered(ModelAnswer),
    /// A send may have reached the gate and no answer came back: the gate may have run it. Why,
    /// for the record.
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
    resends: Resends,
}

impl Gates {
    /// `tls` is podhost's one client configuration ([`crate::floor::tls`]); `pacing` spaces a
    /// call's re-sends (the pod's backoff).
    pub fn new(
        base: Url,
        tls: &Arc<rustls::ClientConfig>,
        pacing: Backoff,
    ) -> Result<Self, GatesError> {
        let gate =
            GateHttp::new(base, tls, MODEL_CALL_TIMEOUT).map_err(|e| GatesError(e.to_string()))?;
        Ok(Gates {
            gate,
            resends: Resends::new(pacing),
        })
    }

    /// Sends a model call, again while its hops fail (within the bound), and waits for its
    /// outcome, or until `cancel` fires (`Stopped`: the caller decides whether to cancel it at
    /// the gate).
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
        let url = self.gate.url(&["nylorun", "v1", "model-calls"]);
        // Copied once and shared by every send: the same bytes each time.
        let body = Bytes::copy_from_slice(req.body);
        let send = || {
            let mut builder = self
                .gate
                .http
                .post(url.clone())
                .bearer_auth(token.expose())
                .header("Idempotency-Key", req.effect_id)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let Some(tp) = req.traceparent {
                builder = builder.header("traceparent", tp);
            }
            if let Some(ts) = req.tracestate {
                builder = builder.header("tracestate", ts);
            }
            send_once(builder)
        };
        let started = std::time::Instant::now();
        let result = resend(&self.resends, req.effect_id, cancel, send).await;
        metrics::model_call(
            ENDPOINT,
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

/// One send: what it came to.
async fn send_once(builder: RequestBuilder) -> Sent {
    let response = match builder.send().await {
        Ok(r) => r,
        Err(e) => return transport(e),
    };
    let status = response.status();
    metrics::model_http_status(ENDPOINT, status.as_u16());
    let after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(retry_after);
    match response.bytes().await {
        Ok(body) => classify(status, &body, after),
        Err(e) => Sent::Lost {
            timed_out: e.is_timeout(),
            why: format!(
                "The Model Gate's answer ({}) was lost: {}",
                status.as_u16(),
                e.without_url()
            ),
            after: None,
        },
    }
}

/// A send that failed in transport. Not connected: nothing was sent (v2 notes §4.3). Anything
/// later (a dropped connection, a timeout): the request may have reached the gate.
fn transport(e: reqwest::Error) -> Sent {
    if e.is_connect() {
        return Sent::Unsent(format!(
            "The Model Gate could not be reached: {}",
            e.without_url()
        ));
    }
    let timed_out = e.is_timeout();
    let what = if timed_out {
        "timed out"
    } else {
        "lost the call"
    };
    Sent::Lost {
        why: format!("The Model Gate {what}: {}", e.without_url()),
        timed_out,
        after: None,
    }
}

/// What an HTTP answer says of the call. A 5xx says nothing: the gate may have run the call
/// before it failed, and a re-send under the key collects what it ran.
fn classify(status: StatusCode, body: &[u8], after: Option<Duration>) -> Sent {
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
    let json = json.as_ref();
    if status == StatusCode::TOO_MANY_REQUESTS {
        return Sent::Throttled {
            why: error_text(status, json),
            after,
        };
    }
    if status.is_server_error() {
        return Sent::Lost {
            why: error_text(status, json),
            timed_out: false,
            after,
        };
    }
    Sent::Answered(answer(status, json))
}

/// The outcome a definite HTTP answer stands for.
fn answer(status: StatusCode, json: Option<&Value>) -> ModelAnswer {
    if status == StatusCode::OK {
        let outcome = json.and_then(|v| v.get("outcome"));
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
    let (kind, retryable) = match status.as_u16() {
        401 => (codes::model::AUTH, false),
        400 | 409 | 413 | 422 => (codes::model::INVALID_REQUEST, false),
        _ => (codes::model::TRANSIENT, true),
    };
    ModelAnswer::Failed(ModelFailure::new(kind, error_text(status, json), retryable))
}

/// An error answer in words: its status, and its `{error: {code, message}}` when it has one.
fn error_text(status: StatusCode, json: Option<&Value>) -> String {
    let field = |name: &str| {
        json.and_then(|v| v.get("error"))
            .and_then(|e| e.get(name))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let (code, message) = (field("code"), field("message"));
    if code.is_empty() {
        format!("The Model Gate answered {}", status.as_u16())
    } else {
        format!(
            "The Model Gate answered {} {code}: {message}",
            status.as_u16()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::model::Candidate;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    fn sent(status: u16, body: Value) -> Sent {
        classify(
            StatusCode::from_u16(status).unwrap(),
            body.to_string().as_bytes(),
            None,
        )
    }

    fn error(code: &str) -> Value {
        json!({"error": {"code": code, "message": "no"}})
    }

    fn failed(code: &str, message: &str, retryable: bool) -> ModelAnswer {
        ModelAnswer::Failed(ModelFailure::new(code, message, retryable))
    }

    fn lost(why: &str) -> Sent {
        Sent::Lost {
            why: why.to_owned(),
            timed_out: false,
            after: None,
        }
    }

    #[test]
    fn definite_answers_are_kept_and_the_others_sent_again() {
        // The gate's word on the call: never sent again.
        assert_eq!(
            sent(401, error("gate_unauthorized")),
            Sent::Answered(failed(
                "auth",
                "The Model Gate answered 401 gate_unauthorized: no",
                false
            ))
        );
        for (status, code) in [
            (400, "invalid_request"),
            (409, "run_stale"),
            (409, "gate_conflict"),
            (413, "invalid_request"),
            (422, "invalid_request"),
        ] {
            assert_eq!(
                sent(status, error(code)),
                Sent::Answered(failed(
                    "invalid_request",
                    &format!("The Model Gate answered {status} {code}: no"),
                    false
                ))
            );
        }
        assert_eq!(
            sent(404, json!("not json at all")),
            Sent::Answered(failed("transient", "The Model Gate answered 404", true))
        );
        assert_eq!(
            sent(200, json!({"nothing": 1})),
            Sent::Answered(failed(
                "invalid_output",
                "The Model Gate answered 200 without an outcome",
                false
            ))
        );
        assert_eq!(
            sent(
                200,
                json!({"outcome": {"output": [{"type": "text", "text": "hi"}]}})
            ),
            Sent::Answered(ModelAnswer::Candidate(Candidate {
                finish_reason: None,
                ..Candidate::text("hi")
            }))
        );
        // A failure outcome the gate calls retryable is an answer too.
        let slow = json!({"kind": "failed", "code": "rate_limited", "message": "Slow down.",
                          "retryable": true, "retryAfterMs": 1000});
        assert_eq!(
            sent(200, json!({ "outcome": slow })),
            Sent::Answered(ModelAnswer::from_value(&slow).unwrap())
        );

        // The gate may have run the call: sent again, the gate's Retry-After kept.
        for status in [500, 502, 503, 504] {
            assert_eq!(
                sent(status, json!("not json at all")),
                lost(&format!("The Model Gate answered {status}"))
            );
        }
        assert_eq!(
            classify(
                StatusCode::SERVICE_UNAVAILABLE,
                error("unavailable").to_string().as_bytes(),
                Some(Duration::from_secs(2)),
            ),
            Sent::Lost {
                why: "The Model Gate answered 503 unavailable: no".to_owned(),
                timed_out: false,
                after: Some(Duration::from_secs(2)),
            }
        );
        // Refused, and nothing taken: sent again after its Retry-After.
        assert_eq!(
            classify(
                StatusCode::TOO_MANY_REQUESTS,
                b"",
                Some(Duration::from_secs(3))
            ),
            Sent::Throttled {
                why: "The Model Gate answered 429".to_owned(),
                after: Some(Duration::from_secs(3)),
            }
        );
    }

    #[test]
    fn routes_keep_the_base_path_and_encode_the_key() {
        let tls = crate::floor::tls::client_config(&Default::default()).unwrap();
        let pacing = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
        let g = Gates::new(Url::parse("http://gw:4100/base/").unwrap(), &tls, pacing).unwrap();
        assert_eq!(
            g.gate
                .url(&["nylorun", "v1", "model-calls", "t/1:0:model:s0", "cancel"])
                .as_str(),
            "http://gw:4100/base/nylorun/v1/model-calls/t%2F1:0:model:s0/cancel"
        );
    }
}
