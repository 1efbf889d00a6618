//! A segment's MCP and HTTP tools: the catalog it opens with (discovering the servers when the
//! session has no facts yet), and each call through the Tool Gate (v5 §4, §5, §5b).
//!
//! A call, once its intent is answered `execute` (or `execute, rejoin`):
//! 1. `tool-calls {server, effectId, name, arguments}` or `http-calls`, with the run token,
//!    `Idempotency-Key: <effect id>` and `traceparent`; the body is serialized once, so every
//!    re-send is the same bytes;
//! 2. the answer: `{ok: true, result}` and `{ok: false, error}` are outcomes, fitted to the
//!    step's budget (`toolgate::results`); a 4xx refusal is a failure the model reads (the call
//!    did not run); `run_stale` stops the run (released: the lease is no longer the session's);
//! 3. a lost hop (connection, timeout, 5xx) asks core the same intent again — a re-send core
//!    counts — and, answered `execute`, sends the same bytes under the same key: the gate
//!    answers what the first send ran. Answered `completed` (`tool.interrupted` once the
//!    attempts are used up), the model reads that; after [`MAX_LOST_HOPS`] podhost reports the
//!    call's fate unknown.
//!
//! A run stopped mid-call cancels it at the gate (`tool-calls/{key}/cancel`) for `cancel` and
//! `deadline` only; on shutdown and ownership loss the call stays at the gate for the next
//! owner to rejoin. Either way no outcome is reported.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Clients, Fault, Segment};
use crate::agent::model::ResultOutcome;
use crate::floor::codes;
use crate::nylorun::artifacts::Artifacts;
use crate::nylorun::link::lease::{RunHandle, StopReason};
use crate::nylorun::turn::effects::{Decision, Intent};
use crate::nylorun::turn::outcome::Produced;
use crate::nylorun::turn::toolgate::catalog::{Catalog, RemoteKind};
use crate::nylorun::turn::toolgate::client::{CallRequest, GateReply, answer_bound};
use crate::nylorun::turn::toolgate::discovery::{DiscoveryError, DiscoveryRun, discover};
use crate::nylorun::turn::toolgate::results::{self, Answer, ArtifactParts, ResultContext};
use crate::nylorun::turn::toolgate::wire::{
    HttpCallBody, HttpToolRef, ToolCallBody, manifest_server_names, routes,
};
use crate::nylorun::turn::toolgate::{boundary_after_answer, boundary_after_intent};
use crate::nylorun::turn::turn_start::TurnStart;

/// Lost hops of one call podhost re-sends after before it calls the fate unknown (core's own
/// `toolAttempts` usually ends it sooner, as `tool.interrupted`).
pub(super) const MAX_LOST_HOPS: u32 = 5;
/// The pause before asking the intent again after a lost hop; doubled each time.
const LOST_HOP_PAUSE: Duration = Duration::from_millis(100);

/// How a gate call ended, short of the segment stopping.
pub(super) enum GateEnd {
    /// What to report: the answer fitted to the step's budget, a refusal, or the call's fate
    /// unknown.
    Produced(Produced),
    /// The re-asked intent was answered `completed`: this is the call's outcome.
    Known(Value),
    /// The re-asked intent was answered `pending` or `uncertain`.
    Wait { uncertain: bool },
}

/// The turn's MCP and HTTP tools: from the TurnStart's facts, else from discovering the
/// manifest's servers now.
pub(super) async fn open_catalog(
    clients: &Clients,
    run: &RunHandle,
    ts: &TurnStart,
) -> Result<Catalog, Fault> {
    let facts = match &ts.mcp {
        Some(facts) => Some(facts.clone()),
        None => {
            let servers = manifest_server_names(ts.manifest.mcp_servers.as_ref());
            if servers.is_empty() {
                None
            } else {
                let cancel = run.cancelled();
                let discovery = DiscoveryRun {
                    gate: &clients.toolgate,
                    token: run.token(),
                    channel: run.channel(),
                    run_id: &run.grant().run_id,
                    manifest_hash: &ts.checkpoint.manifest_hash,
                    tool_answer_bytes: ts.limits.tool_answer_bytes,
                    cancel: &cancel,
                };
                match discover(&discovery, &servers).await {
                    Ok(facts) => facts,
                    Err(DiscoveryError::Stopped) => return Err(Fault::Stopped),
                    Err(DiscoveryError::RunStale) => return Err(Fault::RunStale),
                    Err(e @ DiscoveryError::Core(_)) => {
                        return Err(Fault::Internal(format!("MCP discovery failed: {e}")));
                    }
                }
            }
        }
    };
    let catalog = Catalog::build(facts.as_ref(), ts.manifest.tools.as_ref());
    for (agent, server) in &catalog.skipped_servers {
        tracing::info!(run_id = %run.grant().run_id, %agent, %server, "an agent used as a tool declares this MCP server; podhost runs no such agent, so its tools are not offered");
    }
    if !catalog.tools.is_empty() {
        tracing::info!(
            run_id = %run.grant().run_id,
            tools = catalog.tools.len(),
            deferred = catalog.tools.iter().filter(|t| t.deferred).count(),
            "MCP and HTTP tools offered"
        );
    }
    Ok(catalog)
}

/// A call's route, its body (serialized once: every re-send is the same bytes), and whether it is
/// an MCP call.
fn call_body(
    kind: &RemoteKind,
    effect_id: &str,
    args: &Value,
) -> Result<(&'static [&'static str], Vec<u8>, bool), Fault> {
    let (route, body, mcp): (&'static [&'static str], _, bool) = match kind {
        RemoteKind::Mcp { server, tool: raw } => (
            &routes::TOOL_CALLS,
            serde_json::to_vec(&ToolCallBody {
                server,
                effect_id,
                name: raw,
                arguments: args,
            }),
            true,
        ),
        RemoteKind::Http { tool: name } => (
            &routes::HTTP_CALLS,
            serde_json::to_vec(&HttpCallBody {
                tool: HttpToolRef {
                    agent_id: None,
                    tool_name: name,
                },
                effect_id,
                input: args,
            }),
            false,
        ),
    };
    let body = body.map_err(|e| Fault::Internal(format!("could not encode a tool call: {e}")))?;
    Ok((route, body, mcp))
}

/// The failed outcome of a call the gate refused: it did not run.
fn refused(label: &str, status: u16, code: &str, message: &str) -> Produced {
    Produced::Exact(ResultOutcome::failed(
        codes::gate::REFUSED,
        format!(
            "The Tool Gate refused the call of {label} ({status} {code}: {message}); it did not run."
        ),
    ))
}

/// The failed outcome of an answer past its bound, of which podhost read nothing.
fn too_large(label: &str, limit: u64, mcp: bool) -> Produced {
    let code = if mcp {
        codes::gate::MCP_TOO_LARGE
    } else {
        codes::gate::HTTP_TOO_LARGE
    };
    Produced::Exact(ResultOutcome::failed(
        code,
        format!(
            "The answer of {label} is past {limit} bytes (limits.toolAnswerBytes \
             and its envelope); podhost read none of it."
        ),
    ))
}

impl Segment {
    /// Runs the catalog's tool `index` for `intent`, answered `execute` (`rejoin` when a
    /// previous owner left it at the gate).
    pub(super) async fn gate_call(
        &mut self,
        index: usize,
        intent: &Intent,
        hash: &str,
        mut rejoin: bool,
        traceparent: Option<String>,
    ) -> Result<GateEnd, Fault> {
        let Some(tool) = self.run.offer.catalog.tools.get(index).cloned() else {
            return Err(Fault::Internal(format!("no catalog tool {index}")));
        };
        let effect_id = intent.effect_id.as_str();
        let args = intent.input.clone().unwrap_or_else(|| json!({}));
        let (route, body, mcp) = call_body(&tool.kind, effect_id, &args)?;
        let trace = self.run.ts.trace.clone().unwrap_or_default();
        let traceparent = traceparent.or(trace.traceparent);
        let bound = answer_bound(self.run.limits().tool_answer_bytes);
        let label = tool.label();
        let mut lost = 0u32;
        loop {
            if rejoin {
                tracing::info!(%effect_id, "rejoining a tool call a previous owner left at the gate");
            }
            boundary_after_intent(effect_id);
            let started = Instant::now();
            let reply = self
                .send_call(CallRequest {
                    token: self.run.current_token(),
                    route,
                    key: effect_id,
                    traceparent: traceparent.as_deref(),
                    tracestate: trace.tracestate.as_deref(),
                    body: &body,
                    bound,
                })
                .await?;
            tracing::debug!(%effect_id, tool = %label, ms = started.elapsed().as_secs_f64() * 1000.0, "the Tool Gate answered");
            boundary_after_answer(effect_id);
            let answer = match &reply {
                GateReply::Ok(result) if mcp => Answer::Mcp(result),
                GateReply::Ok(result) => Answer::Http(result),
                GateReply::Failed { code, message } => Answer::Failed { code, message, mcp },
                GateReply::TooLarge { limit } => {
                    return Ok(GateEnd::Produced(too_large(&label, *limit, mcp)));
                }
                GateReply::Refused {
                    status,
                    code,
                    message,
                } => {
                    tracing::warn!(%effect_id, tool = %label, status, %code, %message, "the Tool Gate refused a call");
                    return Ok(GateEnd::Produced(refused(&label, *status, code, message)));
                }
                GateReply::RunStale => {
                    tracing::warn!(%effect_id, "the Tool Gate says the run is over (run_stale)");
                    return Err(Fault::RunStale);
                }
                GateReply::Lost(why) => {
                    lost += 1;
                    match self.after_lost_hop(intent, hash, &label, why, lost).await? {
                        Ok(r) => {
                            rejoin = r;
                            continue;
                        }
                        Err(end) => return Ok(end),
                    }
                }
            };
            let value = self.outcome(answer, effect_id, &tool.name, &label).await;
            if self.run.cancel.is_cancelled() {
                return Err(Fault::Stopped);
            }
            return Ok(GateEnd::Produced(Produced::Shaped(value)));
        }
    }

    /// Sends one hop of a call; the run stopping meanwhile ends the call (see
    /// [`Self::stopped_in_gate_call`]).
    async fn send_call(&self, request: CallRequest<'_>) -> Result<GateReply, Fault> {
        let effect_id = request.key;
        match self.clients.toolgate.call(request, &self.run.cancel).await {
            Some(r) if !self.run.cancel.is_cancelled() => Ok(r),
            _ => Err(self.stopped_in_gate_call(effect_id).await),
        }
    }

    /// After a lost hop: past [`MAX_LOST_HOPS`] the call's fate is unknown; else, after a pause,
    /// asks core the intent again. `Ok(rejoin)` sends the same bytes again.
    async fn after_lost_hop(
        &self,
        intent: &Intent,
        hash: &str,
        label: &str,
        why: &str,
        lost: u32,
    ) -> Result<Result<bool, GateEnd>, Fault> {
        let effect_id = intent.effect_id.as_str();
        tracing::warn!(%effect_id, tool = %label, lost, error = %why, "a Tool Gate hop was lost; asking the intent again");
        if lost > MAX_LOST_HOPS {
            return Ok(Err(GateEnd::Produced(Produced::Unknown(format!(
                "{why}. podhost sent the call {lost} times without an answer and \
                 cannot tell whether it ran."
            )))));
        }
        let pause = LOST_HOP_PAUSE * 2u32.pow(lost - 1);
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = self.run.cancel.cancelled() => return Err(self.stopped_in_gate_call(effect_id).await),
        }
        Ok(match self.run.journal.decide(intent, hash).await? {
            Decision::Execute { rejoin, .. } => Ok(rejoin),
            Decision::Known { value, .. } => Err(GateEnd::Known(value)),
            Decision::Wait { uncertain } => Err(GateEnd::Wait { uncertain }),
        })
    }

    /// The outcome the model reads of a gate's answer, fitted to the step's budget.
    async fn outcome(&self, answer: Answer<'_>, effect_id: &str, tool: &str, label: &str) -> Value {
        let ctx = ResultContext {
            effect_id,
            tool,
            label,
            cap: self
                .step
                .budget
                .cap(self.step.call_budget(self.run.limits().record_entry_bytes) as usize),
        };
        let artifacts = Artifacts::new(
            self.run.handle.channel().clone(),
            self.run.run_id.clone(),
            self.run.limits().clone(),
        );
        results::outcome(answer, &ctx, &ArtifactParts(&artifacts)).await
    }

    /// Cancels a tool call at the gate when the run was cancelled (not when it was taken away:
    /// the next owner rejoins the call then).
    async fn stopped_in_gate_call(&self, effect_id: &str) -> Fault {
        match self.run.handle.stop_reason() {
            Some(StopReason::Cancel | StopReason::Deadline) => {
                self.clients
                    .toolgate
                    .cancel(self.run.current_token(), effect_id)
                    .await;
            }
            _ => {
                tracing::info!(%effect_id, "run stopped with a tool call at the gate; left for the next owner")
            }
        }
        Fault::Stopped
    }
}
