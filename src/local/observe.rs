//! A chat turn watched: every model call and tool call of `podhost run` becomes events.
//!
//! Owns: [`Observed`], a [`TurnHost`] that runs a [`ChatTurn`] and reports around each effect —
//! `model_call.started`/`finished` (with the usage), `message`, `tool_call.started`/`finished` —
//! and the progress task that turns the model client's byte counter into progress events.
//!
//! Invariants: every tool call the model made gets a `tool_call.finished`, also one whose
//! arguments were not a JSON object (the loop answers it without running it); the wrapped
//! turn's behaviour is unchanged.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::events::{Event, Tokens};
use super::render::Sink;
use crate::agent::model::{
    Candidate, FinishReason, ModelAnswer, ResultOutcome, ToolCallBlock, ToolResult,
};
use crate::agent::turn::{Effect, ToolEffect, TurnHost};
use crate::chat::session::{ChatTurn, Front, SessionError};
use crate::floor::codes;

/// A [`ChatTurn`] whose effects are reported to a [`Sink`].
pub(super) struct Observed<F> {
    pub inner: ChatTurn<F>,
    sink: Sink,
    /// The step whose model call is running (for progress events).
    step: tokio::sync::watch::Sender<u32>,
    /// Calls of the current answer: id → arguments as the events show them.
    calls: HashMap<String, Value>,
    /// Calls whose `tool_call.finished` was emitted.
    reported: Vec<String>,
}

impl<F: Front> Observed<F> {
    pub fn new(inner: ChatTurn<F>, sink: Sink) -> Self {
        Observed {
            inner,
            sink,
            step: tokio::sync::watch::Sender::new(0),
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
        let step = self.step.subscribe();
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
                let bytes = *received.borrow_and_update();
                if bytes == 0 || last.is_some_and(|t| t.elapsed() < every) {
                    continue;
                }
                last = Some(Instant::now());
                sink.emit(Event::ModelCallProgress {
                    step: *step.borrow(),
                    received_bytes: bytes,
                });
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
        self.reported.push(call_id.to_owned());
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
        self.sink.emit(Event::ToolCallFinished {
            step,
            call_id: call_id.to_owned(),
            tool: tool.to_owned(),
            status,
            output,
            code,
            error,
            duration_ms: millis(took),
        });
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
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, SessionError> {
        let shown = step + 1;
        self.step.send_replace(shown);
        self.sink.emit(Event::ModelCallStarted { step: shown });
        let started = Instant::now();
        let answer = self.inner.model(step, cancel).await?;
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
                Some(f.message.clone()),
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
        let effect = self.inner.tool(step, call, cancel).await?;
        if let ToolEffect::Done(outcome) = &effect {
            self.finished(step + 1, &call.id, &call.name, outcome, started.elapsed());
        }
        Ok(effect)
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
}
