//! Running a leased run's turn segment: the [`RunHandler`] of the pod host (v5 §3–§8).
//!
//! Owns: one segment from its `TurnStart` to its output — reading the transcript, offering
//! tools, driving the agent loop ([`agent::turn`](crate::agent::turn)) as its [`TurnHost`]:
//! every model and tool call journaled (or replayed) before it runs, model calls through the
//! Model Gate, sandbox calls through the pod's one [`Toolbox`], each outcome fitted to the record
//! and reported; then the output (`turn.completed`, `turn.failed`, `turn.waiting`, `checkpoint`)
//! with the transcript's edits and podhost's state — or nothing, when the run was taken away.
//!
//! Invariants:
//! * Nothing runs before core journaled it; a replayed outcome is never run again.
//! * Once the run's token fires, podhost reports no outcome: after `cancel`/`deadline` core
//!   discards them, and after `shutdown`/`ownership.lost` the next owner replays or rejoins.
//!   A model call in flight is cancelled at the gate only for `cancel`/`deadline`.
//! * Commands on the workspace run one at a time, with the workspace requests core sends (one
//!   lock for both); each tool call's token is a child of the run's.
//! * `state` is small (a version, the turn id, the pinned memory index, and for a waiting
//!   segment its input when it fits `harnessStateBytes`) and present in every output.
//! * The history is compacted by the loop ([`agent::compaction`](crate::agent::compaction),
//!   with this segment's side in `compaction`): each summary is a model effect with
//!   `purpose: "summary"` and an id from its step, trigger and part; the edit that replaced the
//!   history is marked `kind: "compaction"` with its facts. A fresh memory index is taken only
//!   through a journaled `harness` effect (at the session's first segment with memory, and at a
//!   compaction), so a replay shows the index the first attempt showed.
//!
//! Choices where the specs are silent (also in the report): the output of a completed turn is
//! the final answer's text; the state a waiting segment leaves is what an `approval.answer`
//! needs to run the segment again (its input); a turn's segment budget is the agent's
//! `loop.yieldAfter`, else core's `options.yieldAfter`, else 50 steps / 20 minutes; a call to a
//! tool podhost did not offer is answered `tool.unknown` without journaling it.
//!
//! MCP and HTTP tools run through the Tool Gate (`gate_calls`): the segment opens with their
//! catalog (discovering the servers when the session has none yet), offers them with the rest,
//! and sends each call once core journaled it.
//!
//! The segment is in parts, each with its methods in its own file: `clients` (the gates'
//! clients the pod's segments share), `run_state` (what the run holds for the whole segment),
//! `history` (the transcript, its files, the pinned index and the compactions), `step` (the step
//! in progress and its calls' budgets) and `budget` (when the segment yields, and the context
//! budget). `compaction`, `gate_calls` and `output` are the segment's work over them.
//!
//! Non-goals: compaction, `turn.paused` (core's engine only).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use futures_util::future::BoxFuture;
use reqwest::Url;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::agent::compaction::{Compaction, SummaryCall};
use crate::agent::context::Context;
use crate::agent::model::{
    Candidate, ModelAnswer, ModelFailure, ResultOutcome, ToolCallBlock, ToolResult,
};
use crate::agent::turn::{self as agent_turn, Effect, ToolEffect, TurnHost};
use crate::floor::backoff::Backoff;
use crate::floor::codes;
use crate::nylorun::artifacts::skills::{MountedSkill, mount_skills};
use crate::nylorun::artifacts::{Artifacts, read_for_model};
use crate::nylorun::link::lease::{RunEnd, RunHandle, RunHandler, StopReason};
use crate::nylorun::link::protocol::TurnLimits;
use crate::nylorun::turn::context::{self as pod_context, MemoryPin};
use crate::nylorun::turn::effects::{
    self, Decision, Intent, Journal, JournalError, Recorded, SegmentIds,
};
use crate::nylorun::turn::gates::{CallFate, ModelRequest};
use crate::nylorun::turn::instructions::{Offer, Route};
use crate::nylorun::turn::outcome::{self, Produced};
use crate::nylorun::turn::shaping::{ENTRY_ENVELOPE_BYTES, json_len};
use crate::nylorun::turn::spill::fit_outcome;
use crate::nylorun::turn::tool_search;
use crate::nylorun::turn::transcript::{self, Entry, Files};
use crate::nylorun::turn::turn_start::{Checkpoint, TurnInput, TurnStart, Unrunnable};
use crate::tools::{CallContext, ToolName, Toolbox, unknown_tool};

mod budget;
mod clients;
mod compaction;
mod gate_calls;
mod history;
mod output;
mod run_state;
mod step;

use budget::SegmentBudget;
use clients::Clients;
pub use clients::RunnerError;
use gate_calls::GateEnd;
use history::History;
use output::{HarnessState, end_name, failed, stopped_or_thrown};
use run_state::RunState;
use step::Step;

/// The version of podhost's `state`.
const STATE_VERSION: u32 = 1;
/// The `toolName` of the journaled effect that takes a fresh memory index.
const MEMORY_INDEX_EFFECT: &str = "memory_index";
/// The most text one memory call carries (and at most the record entry limit less room).
const MEMORY_TEXT_BYTES: u64 = 256 * 1024;

/// Runs every granted run's turn segment on the pod's workspace.
#[derive(Clone)]
pub struct TurnRunner {
    clients: Arc<Clients>,
}

impl TurnRunner {
    /// `skills_root` is the host directory the sandbox's `/skills` maps onto.
    /// `tls` is podhost's one client configuration ([`crate::floor::tls`]); `gate_pacing`
    /// spaces a model call's re-sends to the Model Gate (the pod's backoff).
    pub fn new(
        toolbox: Toolbox,
        gates_url: Url,
        skills_root: PathBuf,
        tls: &Arc<rustls::ClientConfig>,
        gate_pacing: Backoff,
    ) -> Result<Self, RunnerError> {
        let clients = Clients::new(toolbox, gates_url, skills_root, tls, gate_pacing)?;
        Ok(TurnRunner {
            clients: Arc::new(clients),
        })
    }
}

impl RunHandler for TurnRunner {
    fn handle(&self, run: RunHandle) -> BoxFuture<'static, RunEnd> {
        let clients = self.clients.clone();
        Box::pin(async move { run_segment(clients, run).await })
    }
}

/// Why the loop stopped short of a turn end.
#[derive(Debug)]
enum Fault {
    /// A replayed or journaled effect has another request hash.
    Drift,
    /// The run stopped (its token fired, or core cancelled the turn).
    Stopped,
    /// A limit the turn cannot keep: `turn.failed` with this error.
    Failed { code: &'static str, message: String },
    /// A gate says the run is over (`409 run_stale`): give it back, report nothing.
    RunStale,
    /// podhost itself failed: `turn.failed` with `thrown`.
    Internal(String),
}

impl From<JournalError> for Fault {
    fn from(e: JournalError) -> Self {
        match e {
            JournalError::Drift { .. } => Fault::Drift,
            JournalError::TurnCancelled(_) | JournalError::Stopped => Fault::Stopped,
            JournalError::Call(crate::nylorun::link::channel::CallError::Closed { .. }) => {
                Fault::Stopped
            }
            other => Fault::Internal(other.to_string()),
        }
    }
}

async fn run_segment(clients: Arc<Clients>, run: RunHandle) -> RunEnd {
    let run_id = run.grant().run_id.clone();
    let mut ts = match TurnStart::parse(run.input())
        .and_then(|ts| ts.check(run.grant()).map(|()| ts))
    {
        Ok(ts) => ts,
        Err(u) => {
            tracing::warn!(%run_id, code = u.code, message = %u.message, "a TurnStart podhost cannot run");
            return failed(&run_id, u.code, &u.message, None);
        }
    };
    let started = Instant::now();
    let replayable = ts.outcomes.len();
    let journal = Journal::new(
        run.channel().clone(),
        run_id.clone(),
        std::mem::take(&mut ts.outcomes),
        run.cancelled(),
        Some(run.loss()),
    );
    let mut segment = match Segment::open(clients, run, ts, journal).await {
        Ok(s) => s,
        Err(end) => return end,
    };
    tracing::info!(
        %run_id,
        session_id = %segment.run.ids.session_id,
        turn_id = %segment.run.ids.turn_id,
        segment = segment.run.ids.segment,
        replayable,
        "turn segment starting"
    );
    let cancel = segment.run.cancel.clone();
    let running = crate::floor::metrics::turn_running("pod");
    let end = match segment.pin_first().await {
        Ok(()) => agent_turn::drive(&mut segment, 0, &cancel).await,
        Err(fault) => Err(fault),
    };
    let out = segment.finish(end).await;
    drop(running);
    crate::floor::metrics::turn_ended("pod", end_outcome(&out));
    tracing::info!(%run_id, took_ms = started.elapsed().as_millis() as u64, end = %end_name(&out), "turn segment ended");
    out
}

/// How a segment ended, as a metric label: `completed`, `failed`, `cancelled`, `waiting`,
/// `paused`, `checkpoint` or `released`.
fn end_outcome(end: &RunEnd) -> &'static str {
    use crate::nylorun::link::protocol::methods;
    match end {
        RunEnd::Output { method, output } => match *method {
            methods::TURN_COMPLETED => "completed",
            methods::TURN_FAILED
                if output.get("status").and_then(Value::as_str) == Some("cancelled") =>
            {
                "cancelled"
            }
            methods::TURN_FAILED => "failed",
            methods::TURN_WAITING => "waiting",
            methods::TURN_PAUSED => "paused",
            _ => "checkpoint",
        },
        RunEnd::Release(_) => "released",
    }
}

/// One segment of a turn, as the agent loop's host: its parts, each with its own methods.
struct Segment {
    /// The gates' clients, shared by the pod's segments.
    clients: Arc<Clients>,
    /// What the run holds for the whole segment.
    run: RunState,
    /// The transcript and its context.
    history: History,
    /// The step in progress.
    step: Step,
    /// How long the segment runs, and the model's context budget.
    budget: SegmentBudget,
}

/// The segment's input and its raw JSON: the TurnStart's, or for an approval the waiting
/// segment's own, saved in the state.
fn segment_input(
    raw: &Value,
    cp: &Checkpoint,
    state: Option<&HarnessState>,
) -> Result<(TurnInput, Value), Unrunnable> {
    let mut input_raw = raw.clone();
    let mut input = cp.input.clone();
    if let TurnInput::Approve { interaction_id, .. } = &input {
        let saved = state
            .filter(|s| s.turn_id.as_deref() == Some(cp.turn_id.as_str()))
            .and_then(|s| s.input.clone());
        let Some(saved) = saved else {
            return Err(Unrunnable {
                code: codes::turn::START_UNSUPPORTED,
                message: format!(
                    "podhost cannot pair the approval of {interaction_id}: its state holds no \
                     waiting segment of turn {}",
                    cp.turn_id
                ),
            });
        };
        match TurnInput::from_value(&saved) {
            Ok(i @ (TurnInput::Message(_) | TurnInput::Messages(_) | TurnInput::Continue)) => {
                input = i;
                input_raw = saved;
            }
            _ => {
                return Err(Unrunnable {
                    code: codes::turn::START_INVALID,
                    message: "the waiting segment's saved input is not a turn input".into(),
                });
            }
        }
    }
    Ok((input, input_raw))
}

/// A model effect's recorded outcome, as the loop takes it.
fn answer_of(effect_id: &str, value: &Value) -> Result<Effect<ModelAnswer>, Fault> {
    ModelAnswer::from_value(value)
        .map(Effect::Done)
        .map_err(|e| Fault::Internal(format!("the outcome of {effect_id}: {e}")))
}

/// The files the transcript's entries name, as the model may read them.
async fn learn_files(
    artifacts: &Artifacts,
    ts: &TurnStart,
    run: &RunHandle,
    entries: &[Value],
) -> Result<Files, RunEnd> {
    let mut files = Files::new(ts.model.as_ref(), ts.limits.model_file_bytes);
    pod_context::learn_files(artifacts, entries, &mut files).await;
    if run.cancelled().is_cancelled() {
        return Err(stopped_or_thrown(run, Fault::Stopped));
    }
    Ok(files)
}

/// The variables the routing's sandbox gives every command.
fn sandbox_env(ts: &TurnStart) -> Vec<(String, String)> {
    ts.routing
        .sandbox
        .as_ref()
        .map(|s| s.env_vars())
        .unwrap_or_default()
}

/// The session's transcript before this turn, from core's journal.
async fn read_before(journal: &Journal, run: &RunHandle) -> Result<Vec<Value>, RunEnd> {
    match journal.read_transcript().await {
        Ok((_, entries)) => Ok(entries),
        Err(e) => Err(stopped_or_thrown(run, Fault::from(e))),
    }
}

/// The ids every intent of the segment carries.
fn segment_ids(ts: &TurnStart) -> SegmentIds {
    let cp = &ts.checkpoint;
    SegmentIds {
        session_id: cp.session_id.clone(),
        turn_id: cp.turn_id.clone(),
        segment: cp.segment,
        agent_id: ts.agent_id(),
        manifest_hash: cp.manifest_hash.clone(),
    }
}

/// The agent's skills, mounted in the workspace; a failure ends the run.
async fn open_skills(
    clients: &Clients,
    run: &RunHandle,
    ts: &TurnStart,
    artifacts: &Artifacts,
) -> Result<Vec<MountedSkill>, RunEnd> {
    let skills_value = ts.manifest.skills.clone().unwrap_or(Value::Null);
    match mount_skills(
        artifacts,
        &clients.toolbox,
        &skills_value,
        &clients.skills_root,
    )
    .await
    {
        Ok(s) => Ok(s),
        Err(e) => {
            if run.cancelled().is_cancelled() {
                return Err(stopped_or_thrown(run, Fault::Stopped));
            }
            Err(failed(
                &run.grant().run_id,
                "skills.mount_failed",
                &format!("podhost could not mount the agent's skills: {e}"),
                None,
            ))
        }
    }
}

/// The transcript before this turn, with the turn's input, and the files it names.
async fn open_history(
    run: &RunHandle,
    ts: &TurnStart,
    journal: &Journal,
    input: &TurnInput,
    artifacts: &Artifacts,
    pin_at_start: Option<MemoryPin>,
) -> Result<History, RunEnd> {
    let before = if ts.transcript.cursor >= 0 {
        read_before(journal, run).await?
    } else {
        Vec::new()
    };
    let mut entries = before.clone();
    for m in input.messages() {
        entries.push(Entry::input(&ts.checkpoint.turn_id, m).into());
    }
    let files = learn_files(artifacts, ts, run, &entries).await?;
    Ok(History {
        before,
        entries,
        files,
        pin: pin_at_start.clone(),
        pin_at_start,
        compactions: Vec::new(),
        summary_ids: Vec::new(),
    })
}

impl Segment {
    /// Everything before the first step: the input, the transcript, skills, the offer.
    async fn open(
        clients: Arc<Clients>,
        run: RunHandle,
        ts: TurnStart,
        journal: Journal,
    ) -> Result<Segment, RunEnd> {
        let run_id = run.grant().run_id.clone();
        let state: Option<HarnessState> = ts
            .checkpoint
            .state
            .as_ref()
            .and_then(|s| HarnessState::deserialize(s).ok());

        // An approval runs the waiting segment again: its intents now answer `execute` or
        // `completed` (denied). podhost needs the segment's own input for that.
        let (input, input_raw) = segment_input(
            &run.input()["checkpoint"]["input"],
            &ts.checkpoint,
            state.as_ref(),
        )
        .map_err(|u| failed(&run_id, u.code, &u.message, None))?;

        let artifacts = Artifacts::new(run.channel().clone(), run_id.clone(), ts.limits.clone())
            .with_loss(run.loss());
        let pin_at_start = state
            .as_ref()
            .and_then(|s| s.memory.clone())
            .filter(|_| ts.memory.is_some());
        let history = open_history(&run, &ts, &journal, &input, &artifacts, pin_at_start).await?;
        let skills = if ts.has_sandbox() && ts.manifest.has_skills() {
            open_skills(&clients, &run, &ts, &artifacts).await?
        } else {
            Vec::new()
        };
        let catalog = match gate_calls::open_catalog(&clients, &run, &ts).await {
            Ok(c) => c,
            Err(fault) => return Err(stopped_or_thrown(&run, fault)),
        };
        Ok(Segment {
            clients,
            history,
            step: Step::new(ts.limits.record_entry_bytes),
            budget: SegmentBudget::new(&ts),
            run: RunState {
                offer: Offer::new(&ts, &skills, catalog),
                run_id,
                cancel: run.cancelled(),
                handle: run,
                ids: segment_ids(&ts),
                journal,
                skills,
                env: sandbox_env(&ts),
                input_raw,
                uncertain: false,
                ts,
            },
        })
    }

    /// Runs or replays a model effect (a step's call or a summary call) whose request body is
    /// `{effectId, invocationId, call: intent.input}`.
    async fn model_effect(
        &mut self,
        intent: Intent,
        invocation_id: String,
        step: u32,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, Fault> {
        let effect_id = intent.effect_id.clone();
        let body = serde_json::to_vec(&json!({
            "effectId": effect_id,
            "invocationId": invocation_id,
            "call": intent.input,
        }))
        .map_err(|e| Fault::Internal(format!("could not encode the model call: {e}")))?;
        let limit = self.run.limits().model_call_bytes;
        if body.len() as u64 > limit {
            return Err(Fault::Failed {
                code: codes::model::CALL_TOO_LARGE,
                message: format!(
                    "The model call of step {step} is {} bytes, past limits.modelCallBytes ({limit} \
                     bytes)",
                    body.len()
                ),
            });
        }
        let hash = intent.hash();
        let value = match self.run.journal.decide(&intent, &hash).await? {
            Decision::Known { value, replayed } => {
                tracing::debug!(%effect_id, replayed, "model outcome known");
                value
            }
            Decision::Wait { uncertain } => {
                self.run.uncertain |= uncertain;
                return Ok(Effect::Wait(effect_id));
            }
            Decision::Execute { rejoin, .. } => {
                return self
                    .call_model(effect_id, &body, step, rejoin, cancel)
                    .await;
            }
        };
        answer_of(&effect_id, &value)
    }

    /// Sends a model call through the gate and records its outcome (`rejoin`: a previous owner
    /// left it at the gate).
    async fn call_model(
        &mut self,
        effect_id: String,
        body: &[u8],
        step: u32,
        rejoin: bool,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, Fault> {
        if rejoin {
            tracing::info!(%effect_id, "rejoining a model call a previous owner left at the gate");
        }
        let started = Instant::now();
        let trace = self.run.ts.trace.clone().unwrap_or_default();
        let sent = self
            .clients
            .gates
            .model_call(
                ModelRequest {
                    token: self.run.current_token(),
                    effect_id: &effect_id,
                    traceparent: trace.traceparent.as_deref(),
                    tracestate: trace.tracestate.as_deref(),
                    body,
                },
                cancel,
            )
            .await;
        let answer = match sent {
            Ok(CallFate::Answered(a)) if !cancel.is_cancelled() => a,
            Ok(CallFate::Unknown(why)) if !cancel.is_cancelled() => {
                // The gate may have run it: the effect becomes uncertain, and the next owner
                // rejoins it under its key (v5 §4).
                tracing::warn!(%effect_id, %why, "the model call's fate is unknown");
                return match self.run.journal.outcome_error(&effect_id, &why).await? {
                    Recorded::Uncertain => {
                        self.run.uncertain = true;
                        Ok(Effect::Wait(effect_id))
                    }
                    Recorded::Completed(value) => answer_of(&effect_id, &value),
                };
            }
            _ => return Err(self.stopped_in_model_call(&effect_id).await),
        };
        tracing::debug!(%effect_id, ms = started.elapsed().as_secs_f64() * 1000.0, "model call answered");
        // Core records no outcome past the record entry limit, and a model's answer is
        // not podhost's to cut: the turn fails, saying so.
        let value = answer.to_value();
        let (bytes, limit) = (
            json_len(&value) as u64,
            self.run.limits().record_entry_bytes,
        );
        if bytes > limit {
            return Err(Fault::Failed {
                code: codes::model::ANSWER_TOO_LARGE,
                message: format!(
                    "The model's answer of step {step} is {bytes} bytes, past \
                     limits.recordEntryBytes ({limit} bytes)"
                ),
            });
        }
        match self.run.journal.outcome(&effect_id, value).await? {
            Recorded::Completed(v) => answer_of(&effect_id, &v),
            Recorded::Uncertain => {
                self.run.uncertain = true;
                Ok(Effect::Wait(effect_id))
            }
        }
    }

    /// The intent of a tool call and its arguments (a command tool's `command` put in), or the
    /// outcome of a memory call whose input is refused before it is asked.
    fn tool_intent(
        &self,
        step: u32,
        call: &ToolCallBlock,
        route: Route,
        command: Option<String>,
    ) -> Result<(Intent, Value), ToolEffect> {
        let mut args = call.args.clone();
        if let (Some(cmd), Some(o)) = (command, args.as_object_mut()) {
            o.insert("command".to_owned(), Value::String(cmd));
        }
        let memory_text = MEMORY_TEXT_BYTES.min(
            self.run
                .limits()
                .record_entry_bytes
                .saturating_sub(ENTRY_ENVELOPE_BYTES as u64),
        );
        if route == Route::Memory
            && let Err(message) = self.run.offer.check_memory(&args, memory_text)
        {
            return Err(ToolEffect::Done(ResultOutcome::failed(
                "memory.invalid_input",
                message,
            )));
        }
        let mut intent = Intent::tool(
            &self.run.ids,
            step,
            &call.id,
            &call.name,
            self.run.offer.target(route),
            args.clone(),
        );
        if matches!(route, Route::Sandbox(_)) {
            intent.skill = self.run.skill_of(&args);
        }
        Ok((intent, args))
    }

    /// Reads an artifact for the model.
    async fn read_artifact(&self, args: &Value) -> Result<Produced, Fault> {
        let outcome = read_for_model(&self.run.artifacts(self.run.limits().clone()), args).await;
        if self.run.cancel.is_cancelled() {
            return Err(Fault::Stopped);
        }
        Ok(Produced::Outcome(outcome.into()))
    }

    /// The outcome to record for a tool call: fitted to the record by the spill.
    async fn fit(&self, effect_id: &str, tool_name: &str, value: Value) -> Value {
        let limits = TurnLimits {
            record_entry_bytes: self.step.call_budget(self.run.limits().record_entry_bytes),
            ..self.run.limits().clone()
        };
        fit_outcome(&self.run.artifacts(limits), effect_id, tool_name, value).await
    }

    /// Runs a sandbox tool call: its outcome, or its fate unknown when podhost could not learn
    /// what the call did.
    async fn run_sandbox(
        &self,
        tool: ToolName,
        effect_id: &str,
        args: &Value,
        traceparent: Option<String>,
    ) -> Result<Produced, Fault> {
        let mut env = self.run.env.clone();
        if let Some(tp) = traceparent.or_else(|| self.run.ts.traceparent().map(str::to_owned)) {
            env.push(("TRACEPARENT".to_owned(), tp));
        }
        let ctx = CallContext {
            cancel: self.run.cancel.child_token(),
            env,
        };
        let started = Instant::now();
        let result = self.clients.toolbox.call(tool, args, &ctx).await;
        tracing::debug!(%effect_id, %tool, ms = started.elapsed().as_secs_f64() * 1000.0, "tool ran");
        if self.run.cancel.is_cancelled() {
            return Err(Fault::Stopped);
        }
        Ok(match result {
            Ok(outcome) => Produced::Outcome(outcome.into()),
            Err(e) => {
                tracing::error!(%effect_id, %tool, error = %e, "a tool call failed in podhost");
                Produced::Unknown(format!("podhost could not learn what the call did: {e}"))
            }
        })
    }

    /// Cancels a model call at the gate when the run was cancelled (not when it was taken
    /// away: the next owner rejoins the call then).
    async fn stopped_in_model_call(&self, effect_id: &str) -> Fault {
        match self.run.handle.stop_reason() {
            Some(StopReason::Cancel | StopReason::Deadline) => {
                self.clients
                    .gates
                    .cancel_model_call(self.run.current_token(), effect_id)
                    .await;
            }
            _ => {
                tracing::info!(%effect_id, "run stopped with a model call at the gate; left for the next owner")
            }
        }
        Fault::Stopped
    }
}

impl TurnHost for Segment {
    type Error = Fault;

    fn should_yield(&self, step: u32) -> bool {
        self.budget.should_yield(step)
    }

    async fn model(
        &mut self,
        step: u32,
        attempt: u32,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, Fault> {
        let pin = self.pin_text();
        let prompt = transcript::prompt(
            &self.run.offer.instructions,
            pin.as_deref(),
            &self.history.entries,
            &self.run.ids.turn_id,
            &self.history.files,
        );
        let call = json!({
            "prompt": prompt,
            "tools": self.run.offer.tools_for(&self.history.entries),
            "executionId": self.run.ids.session_id,
        });
        let mut intent = Intent::model(&self.run.ids, step, call);
        if attempt > 0 {
            intent.effect_id = self
                .run
                .ids
                .effect_id("model", &effects::retry_identity(step, attempt));
        }
        self.model_effect(intent, self.run.ids.step_id(step), step, cancel)
            .await
    }

    fn context(&self) -> Option<Context> {
        self.context_now()
    }

    fn unit_text(&self, unit: usize) -> String {
        self.history.unit_text(unit)
    }

    async fn summarize(
        &mut self,
        call: &SummaryCall,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, Fault> {
        self.summary_call(call, cancel).await
    }

    async fn compacted(&mut self, c: &Compaction) -> Result<(), Fault> {
        self.apply_compaction(c).await
    }

    async fn drop_files(&mut self, step: u32, failure: &ModelFailure) -> Result<bool, Fault> {
        self.drop_refused_files(step, failure)
    }

    async fn answered(&mut self, step: u32, candidate: &Candidate) -> Result<(), Fault> {
        let step_id = self.run.ids.step_id(step);
        self.history.entries.push(
            Entry::Candidate {
                turn_id: self.run.ids.turn_id.clone(),
                step_id,
                candidate: candidate.clone(),
            }
            .into(),
        );
        let record_entry_bytes = self.run.limits().record_entry_bytes;
        self.step.begin(step, candidate, record_entry_bytes);
        Ok(())
    }

    async fn tool(
        &mut self,
        step: u32,
        call: &ToolCallBlock,
        _cancel: &CancellationToken,
    ) -> Result<ToolEffect, Fault> {
        let Some((route, command)) = self.run.offer.route(&call.name) else {
            return Ok(ToolEffect::Done(
                unknown_tool(&call.name, &self.run.offer.names()).into(),
            ));
        };
        let (intent, args) = match self.tool_intent(step, call, route, command) {
            Ok(prepared) => prepared,
            Err(refused) => return Ok(refused),
        };
        let effect_id = intent.effect_id.clone();
        let hash = intent.hash();
        let (traceparent, rejoin) = match self.run.journal.decide(&intent, &hash).await? {
            Decision::Known { value, replayed } => {
                tracing::debug!(%effect_id, replayed, "tool outcome known");
                return Ok(ToolEffect::Done(self.remote_seen(route, value)));
            }
            Decision::Wait { uncertain } => {
                self.run.uncertain |= uncertain;
                return Ok(ToolEffect::Wait(effect_id));
            }
            Decision::Execute {
                traceparent,
                rejoin,
            } => (traceparent, rejoin),
        };
        crate::failpoint!("pod.after_execute");
        let produced = match route {
            Route::Sandbox(tool) => {
                self.run_sandbox(tool, &effect_id, &args, traceparent)
                    .await?
            }
            Route::ReadArtifact => self.read_artifact(&args).await?,
            Route::Remote(index) => {
                match self
                    .gate_call(index, &intent, &hash, rejoin, traceparent)
                    .await?
                {
                    GateEnd::Produced(produced) => produced,
                    GateEnd::Known(value) => {
                        return Ok(ToolEffect::Done(self.remote_seen(route, value)));
                    }
                    GateEnd::Wait { uncertain } => {
                        self.run.uncertain |= uncertain;
                        return Ok(ToolEffect::Wait(effect_id));
                    }
                }
            }
            Route::ToolSearch => {
                Produced::Outcome(tool_search::search(&self.run.offer.catalog, &args))
            }
            // Core runs these in the intent's own transaction; `execute` is not an answer
            // podhost can act on, so the call fails to the model.
            Route::Memory | Route::ScheduleWake => Produced::Exact(ResultOutcome::failed(
                codes::tool::UNAVAILABLE,
                format!("{} is run by core, which did not run it", call.name),
            )),
        };
        let to_record = self.to_record(&effect_id, &call.name, produced).await?;
        crate::failpoint!("pod.after_tool");
        let recorded = match to_record {
            Ok(value) => self.run.journal.outcome(&effect_id, value).await?,
            Err(error) => self.run.journal.outcome_error(&effect_id, &error).await?,
        };
        crate::failpoint!("pod.after_outcome");
        Ok(ToolEffect::Done(match recorded {
            Recorded::Completed(v) => self.remote_seen(route, v),
            Recorded::Uncertain => ResultOutcome::failed(
                codes::tool::UNCERTAIN,
                "podhost could not learn whether this call ran; check before running it again.",
            ),
        }))
    }

    async fn results(&mut self, step: u32, results: &[ToolResult]) -> Result<(), Fault> {
        let step_id = self.run.ids.step_id(step);
        self.history.entries.push(
            Entry::ToolResults {
                turn_id: self.run.ids.turn_id.clone(),
                step_id,
                results: results.to_vec(),
            }
            .into(),
        );
        Ok(())
    }
}

impl Segment {
    /// A recorded outcome of a call routed to `route`, as the model is told; an MCP or HTTP
    /// result spends the step's budget (replayed or run, the same bytes: the same budget).
    fn remote_seen(&mut self, route: Route, value: Value) -> ResultOutcome {
        if matches!(route, Route::Remote(_)) {
            self.step.budget.spend(&value);
        }
        outcome::recorded(value)
    }

    /// What a tool call produced as core records it: the one place its outcome becomes JSON,
    /// fitted to the call's share of the record when podhost made it; `Err` reports its fate
    /// unknown (`{error}`).
    async fn to_record(
        &self,
        effect_id: &str,
        tool_name: &str,
        produced: Produced,
    ) -> Result<Result<Value, String>, Fault> {
        Ok(Ok(match produced {
            Produced::Outcome(o) => {
                let value = outcome::to_value(&o).map_err(|e| Fault::Internal(e.to_string()))?;
                let fitted = self.fit(effect_id, tool_name, value).await;
                // The spill may have learned the run is no longer ours.
                if self.run.cancel.is_cancelled() {
                    return Err(Fault::Stopped);
                }
                fitted
            }
            Produced::Exact(o) => {
                outcome::to_value(&o).map_err(|e| Fault::Internal(e.to_string()))?
            }
            Produced::Shaped(value) => value,
            Produced::Unknown(error) => return Ok(Err(error)),
        }))
    }
}
