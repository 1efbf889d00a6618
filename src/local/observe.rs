//! A chat turn watched: every model call and tool call of `podhost run` becomes events.
//!
//! Owns: [`Observed`], a [`TurnHost`] that runs a [`ChatTurn`] and reports around each effect —
//! `model_call.started`/`finished` (with the usage), `message`, `tool_call.started`/`finished` —
//! and the progress task that turns the model client's byte counter into progress events.
//!
//! Invariants:
//! * Every `tool_call.started` has its `tool_call.finished`: also a call whose arguments were
//!   not a JSON object (the loop answers it without running it), an `ask_user` left for the
//!   user (`input_required`), and a call the turn failed in.
//! * Progress goes through the sink, which writes it only while its model call is open: no
//!   `model_call.progress` follows its `model_call.finished`.
//! * A model endpoint that cannot be reached is reported with a hint to check the base URL.
//! * The wrapped turn's behaviour is unchanged.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::events::{Event, Tokens};
use super::render::Sink;
use crate::agent::compaction::{Compaction, SummaryCall};
use crate::agent::context::Context;
use crate::agent::model::{
    Candidate, FinishReason, ModelAnswer, ModelFailure, ResultOutcome, ToolCallBlock, ToolResult,
};
use crate::agent::turn::{Effect, ToolEffect, TurnHost};
use crate::chat::session::{ChatTurn, Front, SessionError};
use crate::floor::codes;

/// A [`ChatTurn`] whose effects are reported to a [`Sink`].
pub(super) struct Observed<F> {
    pub inner: ChatTurn<F>,
    sink: Sink,
    /// Where the model endpoint's URL came from, for the hint of a failure to reach it.
    endpoint: Endpoint,
    /// Calls of the current answer: id → arguments as the events show them.
    calls: HashMap<String, Value>,
    /// Calls whose `tool_call.finished` was emitted.
    reported: Vec<String>,
}

impl<F: Front> Observed<F> {
    pub fn new(inner: ChatTurn<F>, sink: Sink, endpoint: Endpoint) -> Self {
        Observed {
            inner,
            sink,
            endpoint,
            calls: HashMap::new(),
            reported: Vec::new(),
        }
    }

    /// Turns the client's byte counter into progress events, at most one a second per call
    /// (a terminal redraws its line ten times a second), until `stop`.
    pub fn watch_progress(
        &self,
        mut received: tokio::sync::watch::Receiver<u64>,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let sink = self.sink.clone();
        let every = if sink.is_json() {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(100)
        };
        tokio::spawn(async move {
            let mut last: Option<Instant> = None;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = received.changed() => if changed.is_err() { return },
                }
                // The call first, then its count: a count read after the call ended is
                // dropped by the sink rather than given to the next call.
                let step = sink.open_call();
                let bytes = *received.borrow_and_update();
                if bytes == 0 || last.is_some_and(|t| t.elapsed() < every) {
                    continue;
                }
                last = Some(Instant::now());
                if crate::failpoint_fails!("run.progress_late") {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                sink.progress(step, bytes);
            }
        })
    }

    fn finished(
        &mut self,
        step: u32,
        call_id: &str,
        tool: &str,
        outcome: &ResultOutcome,
        took: Duration,
    ) {
        let (status, output, code, error) = match outcome {
            ResultOutcome::Completed { output, .. } => {
                ("completed", Some(output.clone()), None, None)
            }
            ResultOutcome::Denied { reason } => (
                "denied",
                None,
                Some(codes::tool::DENIED.to_owned()),
                Some(reason.clone()),
            ),
            ResultOutcome::Failed { code, message, .. } => {
                ("failed", None, Some(code.clone()), Some(message.clone()))
            }
        };
        self.emit_finished(
            (step, call_id, tool),
            Ended {
                status,
                output,
                code,
                error,
            },
            took,
        );
    }

    /// Emits the `tool_call.finished` of call `(step, id, tool)`.
    fn emit_finished(
        &mut self,
        (step, call_id, tool): (u32, &str, &str),
        end: Ended,
        took: Duration,
    ) {
        self.reported.push(call_id.to_owned());
        self.sink.emit(Event::ToolCallFinished {
            step,
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            status: end.status,
            output: end.output,
            code: end.code,
            error: end.error,
            duration_ms: millis(took),
        });
    }
}

/// How a tool call ended, as `tool_call.finished` says it.
struct Ended {
    status: &'static str,
    output: Option<Value>,
    code: Option<String>,
    error: Option<String>,
}

/// The model endpoint a run talks to: its base URL and where that came from.
#[derive(Clone, Debug)]
pub(super) struct Endpoint {
    pub base_url: String,
    /// `--base-url`, `OPENAI_BASE_URL` or `default`.
    pub from: &'static str,
}

/// How the model client's message for an endpoint it could not connect to begins (a refused
/// connection, a name that does not resolve): the one failure a wrong `--base-url` makes.
const UNREACHABLE: &str = "The model endpoint could not be reached";

impl Endpoint {
    /// `message`, with a hint to check the base URL when it says the endpoint could not be
    /// reached (a timeout is not: the server is there, and slow).
    pub fn hinted(&self, message: &str) -> String {
        if !message.contains(UNREACHABLE) {
            return message.to_owned();
        }
        let from = match self.from {
            "default" => "the default",
            other => other,
        };
        format!(
            "{message} (is an OpenAI-compatible server listening at {}? The URL came from \
             {from}; check --base-url)",
            self.base_url
        )
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        FinishReason::ContentFilter => "content_filter",
        FinishReason::Other => "other",
    }
}

impl<F: Front> TurnHost for Observed<F> {
    type Error = SessionError;

    fn should_yield(&self, step: u32) -> bool {
        self.inner.should_yield(step)
    }

    async fn model(
        &mut self,
        step: u32,
        attempt: u32,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, SessionError> {
        let shown = step + 1;
        self.sink.emit(Event::ModelCallStarted { step: shown });
        let started = Instant::now();
        let answer = match self.inner.model(step, attempt, cancel).await {
            Ok(answer) => answer,
            Err(e) => {
                // The turn fails here; its call still ends.
                self.sink.emit(Event::ModelCallFinished {
                    step: shown,
                    status: "failed",
                    finish_reason: None,
                    tokens: Tokens::default(),
                    tool_calls: 0,
                    error: Some(e.to_string()),
                    duration_ms: millis(started.elapsed()),
                });
                return Err(e);
            }
        };
        let (status, finish, tokens, calls, error) = match &answer {
            Effect::Done(ModelAnswer::Candidate(c)) => {
                let tokens = c.usage.as_ref().map_or(Tokens::default(), |u| Tokens {
                    input: u.input_tokens,
                    output: u.output_tokens,
                });
                let calls = u32::try_from(c.tool_calls().count()).unwrap_or(u32::MAX);
                (
                    "ok",
                    c.finish_reason.map(finish_reason),
                    tokens,
                    calls,
                    None,
                )
            }
            Effect::Done(ModelAnswer::Failed(f)) if f.code == codes::model::CANCELLED => {
                ("cancelled", None, Tokens::default(), 0, None)
            }
            Effect::Done(ModelAnswer::Failed(f)) => (
                "failed",
                None,
                Tokens::default(),
                0,
                Some(self.endpoint.hinted(&f.message)),
            ),
            Effect::Wait(_) => ("failed", None, Tokens::default(), 0, None),
        };
        self.sink.emit(Event::ModelCallFinished {
            step: shown,
            status,
            finish_reason: finish.map(str::to_owned),
            tokens,
            tool_calls: calls,
            error,
            duration_ms: millis(started.elapsed()),
        });
        Ok(answer)
    }

    fn prepare(&mut self, step: u32, candidate: &mut Candidate) {
        self.inner.prepare(step, candidate);
    }

    async fn answered(&mut self, step: u32, candidate: &Candidate) -> Result<(), SessionError> {
        self.inner.answered(step, candidate).await?;
        self.calls = candidate
            .tool_calls()
            .map(|c| {
                let input = if c.raw.is_some() {
                    Value::Null
                } else {
                    c.args.clone()
                };
                (c.id.clone(), input)
            })
            .collect();
        self.reported.clear();
        let text = candidate.text_output();
        let is_final = self.calls.is_empty();
        if !text.is_empty() || is_final {
            self.sink.emit(Event::Message {
                step: step + 1,
                role: "assistant",
                text,
                is_final,
            });
        }
        Ok(())
    }

    async fn tool(
        &mut self,
        step: u32,
        call: &ToolCallBlock,
        cancel: &CancellationToken,
    ) -> Result<ToolEffect, SessionError> {
        self.sink.emit(Event::ToolCallStarted {
            step: step + 1,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            input: call.args.clone(),
        });
        let started = Instant::now();
        let ended = |status, error: Option<String>| Ended {
            status,
            output: None,
            code: None,
            error,
        };
        let id = (step + 1, call.id.as_str(), call.name.as_str());
        match self.inner.tool(step, call, cancel).await {
            Ok(ToolEffect::Done(outcome)) => {
                self.finished(step + 1, &call.id, &call.name, &outcome, started.elapsed());
                Ok(ToolEffect::Done(outcome))
            }
            // A question there is no terminal to answer: the run ends asking it.
            Ok(ToolEffect::Ask) => {
                self.emit_finished(id, ended("input_required", None), started.elapsed());
                Ok(ToolEffect::Ask)
            }
            Ok(ToolEffect::Wait(effect)) => {
                let why = "the call waits on an approval, which a local run cannot give";
                self.emit_finished(id, ended("failed", Some(why.into())), started.elapsed());
                Ok(ToolEffect::Wait(effect))
            }
            Err(e) => {
                self.emit_finished(id, ended("failed", Some(e.to_string())), started.elapsed());
                Err(e)
            }
        }
    }

    async fn results(&mut self, step: u32, results: &[ToolResult]) -> Result<(), SessionError> {
        // Calls the loop answered without running them (arguments that are not an object).
        for r in results {
            if !self.reported.contains(&r.call_id) {
                self.sink.emit(Event::ToolCallStarted {
                    step: step + 1,
                    call_id: r.call_id.clone(),
                    tool: r.tool_name.clone(),
                    input: self.calls.get(&r.call_id).cloned().unwrap_or(Value::Null),
                });
                self.finished(
                    step + 1,
                    &r.call_id,
                    &r.tool_name,
                    &r.outcome,
                    Duration::ZERO,
                );
            }
        }
        self.inner.results(step, results).await
    }

    // The context budget is the session's: observing a run must not turn compaction off.
    fn context(&self) -> Option<Context> {
        self.inner.context()
    }

    fn unit_text(&self, unit: usize) -> String {
        self.inner.unit_text(unit)
    }

    async fn summarize(
        &mut self,
        call: &SummaryCall,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, SessionError> {
        self.inner.summarize(call, cancel).await
    }

    async fn compacted(&mut self, compaction: &Compaction) -> Result<(), SessionError> {
        self.inner.compacted(compaction).await
    }

    async fn drop_files(
        &mut self,
        step: u32,
        failure: &ModelFailure,
    ) -> Result<bool, SessionError> {
        self.inner.drop_files(step, failure).await
    }
}
