//! A chat session's side of the agent loop: [`ChatTurn`] implements [`TurnHost`] over an
//! OpenAI-format transcript, the six workspace tools, the background processes' two and
//! `ask_user`.
//!
//! Owns: the transcript kept in memory for a turn, the tool list the model is offered, the
//! system message that tells the model its working directory (sent first, never stored or
//! returned), session-wide unique tool-call ids that keep the protocol's rules (no control
//! characters, at most 512 characters, a function name on every call; `ask_user` without a
//! question answered with an error, never a question for the user), the split of an answer
//! that mixes `ask_user` with other calls, the repair of a transcript whose tail a crash
//! interrupted, and the session's side of the context budget: what the model is sent of the
//! transcript (its [`ContextView`], compacted by the loop and handed to the front to keep), the
//! summary calls, and the files the model cannot read.
//!
//! Invariants:
//! * Every message is handed to the [`Front`] as soon as it exists (the BYOH store commits it,
//!   `podhost run` prints it), so a crash loses at most the effect in flight.
//! * In what the front sees, every answered call is answered before the next non-tool message,
//!   and an assistant message that ends a turn `input_required` holds only the unanswered
//!   questions.
//! * A tool call that a crash interrupted is answered as interrupted, never run again.
//! * A compaction changes what the model is sent, never the transcript: the front still has
//!   every message the turn made, and no summary podhost wrote for itself.
//!
//! Non-goals: statuses, keys' lifetimes and storage (the front's business; a turn asks its
//! [`KeySource`] for the key of each call).

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::client::{ModelClient, ModelError};
use super::context::{self, ContextView, Sent};
use super::message::{ChatMessage, KeySource, ModelEndpoint, Role, ToolCall};
use crate::agent::compaction::{Compaction, SummaryCall};
use crate::agent::context::{Budget, Context, DEFAULT_THRESHOLD, UnitKind, estimate_json};
use crate::agent::media::ModelFiles;
use crate::agent::model::ToolCallBlock;
use crate::agent::model::{Candidate, ModelAnswer, ModelFailure, ResultOutcome, ToolResult, Usage};
use crate::agent::turn::{Effect, ToolEffect, TurnHost, suffixed_call_id};
use crate::floor::codes;
use crate::tools::{CallContext, ToolName, Toolbox, unknown_tool};

/// The name of the tool whose calls are questions for the user.
pub const ASK_USER: &str = "ask_user";

/// The longest tool-call id kept as the model gave it (and the longest a suffix makes).
pub use crate::agent::turn::MAX_CALL_ID_CHARS;

/// The name given to a tool call the model made without a function name.
pub const NO_NAME: &str = "unnamed_tool_call";

/// The question of an `ask_user` call, when it has a non-empty one.
fn question_of(call: &ToolCallBlock) -> Option<&str> {
    call.args
        .get("question")
        .and_then(Value::as_str)
        .filter(|q| !q.trim().is_empty())
}

/// What a front does with a session's messages and questions. The model key is not a front's:
/// a turn gets it from its [`KeySource`], so it never passes through where messages are kept.
#[allow(async_fn_in_trait)]
pub trait Front {
    /// Keeps messages just appended to the transcript, in order.
    async fn appended(&mut self, messages: &[ChatMessage]) -> Result<(), SessionError>;
    /// Whether `ask` answers questions here; if not, they end the turn `input_required`.
    fn answers_questions(&self) -> bool {
        false
    }
    /// Answers a question of the model, when [`Front::answers_questions`].
    async fn ask(&mut self, _question: &str) -> Option<String> {
        None
    }
    /// Keeps the compacted view, so that later turns start from it.
    async fn compacted(&mut self, _view: &ContextView) -> Result<(), SessionError> {
        Ok(())
    }
    /// Counts the tokens a model call (an answer or a summary) reported in its usage.
    async fn used(&mut self, _usage: &Usage) -> Result<(), SessionError> {
        Ok(())
    }
}

/// What a chat session knows of its model's limits.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatLimits {
    /// The context window in tokens; `None` when unknown (the history is then compacted only
    /// after a call overflows, to the window the server names).
    pub window: Option<u64>,
    /// `window` is a default, not the model's own (see [`Budget::assumed`]).
    pub assumed: bool,
    /// The share of the usable window (the window less the answer's room) past which the history
    /// is compacted.
    pub threshold: f64,
    /// The files the model reads.
    pub files: ModelFiles,
}

impl Default for ChatLimits {
    fn default() -> Self {
        ChatLimits {
            window: None,
            assumed: false,
            threshold: DEFAULT_THRESHOLD,
            files: ModelFiles::default(),
        }
    }
}

/// A fault of the harness that stops the turn.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the session store failed: {0}")]
    Store(String),
    /// podhost could not run a tool call: its sandbox, supervisor or session holder failed.
    /// A fault of the host, never a tool result the model reads.
    #[error(transparent)]
    Tool(#[from] crate::tools::ToolError),
    /// The session's sandbox could not be made (no uid, a cgroup the host refuses): the turn
    /// cannot run a tool, so it does not run at all.
    #[error("podhost could not make the session's sandbox: {0}")]
    Sandbox(String),
}

/// How often a tool call that failed before anything ran (the supervisor or the session holder
/// could not start) is made in all, and the first wait between tries.
const SANDBOX_TRIES: u32 = 3;
const SANDBOX_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(200);

/// What a transcript's tail says about where the turn stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Tail {
    /// The last message is an assistant answer without calls.
    Completed,
    /// The last assistant message holds only unanswered questions.
    InputRequired(Vec<String>),
    /// The model is to be asked next.
    Continue,
}

/// What a tool call interrupted by a crash is answered with.
pub const INTERRUPTED: &str = "This call was interrupted: podhost stopped while it ran, so it \
    may or may not have taken effect. It was not run again; check the workspace before \
    repeating it.";

/// Where the transcript stands, and the tool messages that answer calls a crash interrupted.
pub fn repair_tail(transcript: &[ChatMessage]) -> (Vec<ChatMessage>, Tail) {
    let Some(last) = transcript.iter().rposition(|m| m.role != Role::Tool) else {
        return (Vec::new(), Tail::Continue);
    };
    let msg = &transcript[last];
    if msg.role != Role::Assistant {
        return (Vec::new(), Tail::Continue);
    }
    if msg.calls().is_empty() {
        return (Vec::new(), Tail::Completed);
    }
    let answered: HashSet<&str> = transcript[last + 1..]
        .iter()
        .filter_map(|m| m.tool_call_id.as_deref())
        .collect();
    let open: Vec<&ToolCall> = msg
        .calls()
        .iter()
        .filter(|c| !answered.contains(c.id.as_str()))
        .collect();
    if answered.is_empty() && open.iter().all(|c| c.function.name == ASK_USER) {
        return (
            Vec::new(),
            Tail::InputRequired(open.iter().map(|c| c.id.clone()).collect()),
        );
    }
    let fill = open
        .iter()
        .map(|c| ChatMessage::tool(c.id.clone(), INTERRUPTED))
        .collect();
    (fill, Tail::Continue)
}

/// The tools offered to the model, in the OpenAI `tools` format: the six workspace tools, the
/// two of background processes (`bash_output`, `bash_kill`) and `ask_user`.
pub fn tool_specs() -> &'static Value {
    static SPECS: OnceLock<Value> = OnceLock::new();
    SPECS.get_or_init(|| {
        let mut tools: Vec<Value> = ToolName::WITH_BACKGROUND
            .iter()
            .map(|t| {
                let d = t.definition();
                json!({"type": "function", "function": {
                    "name": d.name, "description": d.description, "parameters": d.input_schema}})
            })
            .collect();
        tools.push(json!({"type": "function", "function": {
            "name": ASK_USER,
            "description": "Ask the user one question and wait for the answer. Use it only when \
                you cannot go on without information that only the user has; the turn pauses \
                until the answer comes.",
            "parameters": {
                "type": "object",
                "properties": {"question": {"type": "string", "minLength": 1,
                    "description": "The question, complete and self-contained."}},
                "required": ["question"],
                "additionalProperties": false
            }
        }}));
        Value::Array(tools)
    })
}

/// The system message podhost puts first in every model request.
pub fn system_message(workspace: &Path) -> ChatMessage {
    ChatMessage::system(format!(
        "You are an agent working in the directory {dir}. Use the tools to inspect and change \
         files and to run commands there; relative paths resolve under {dir}. When you need \
         information that only the user can give, call ask_user with one question. When the \
         task is done, give your final answer without calling a tool.",
        dir = workspace.display()
    ))
}

/// One turn of a chat session.
pub struct ChatTurn<F> {
    pub front: F,
    client: ModelClient,
    conn: ModelEndpoint,
    key: KeySource,
    system: ChatMessage,
    toolbox: Toolbox,
    /// The whole session so far (without the system message).
    pub transcript: Vec<ChatMessage>,
    /// Questions held back until the other calls of their answer are answered.
    deferred_asks: Option<ChatMessage>,
    /// Calls of the current step whose result is already in the transcript.
    answered: HashSet<String>,
    /// Model calls one submission may make before the turn is stopped.
    max_steps: u32,
    limits: ChatLimits,
    /// What the model is sent of the transcript.
    view: ContextView,
}

/// The context window assumed when neither the settings nor the server's model listing name
/// one: most served models have at least this much, and one with less says its window when a
/// call overflows, which the loop then holds to.
pub const DEFAULT_CONTEXT_WINDOW: u64 = 128_000;

impl ChatLimits {
    /// Fills what the settings left unset from the server's model listing, and the window,
    /// when neither names it, with [`DEFAULT_CONTEXT_WINDOW`] (assumed).
    pub fn complete(mut self, listing: super::listing::ModelFacts) -> ChatLimits {
        self.files.inputs = self.files.inputs.or(listing.inputs);
        if self.window.is_none() {
            self.window = listing.context_window;
        }
        if self.window.is_none() {
            self.window = Some(DEFAULT_CONTEXT_WINDOW);
            self.assumed = true;
        }
        self
    }

    /// Whether the server's model listing could add anything.
    pub fn needs_listing(&self) -> bool {
        self.window.is_none() || self.files.inputs.is_none()
    }
}

/// Model calls per submission unless configured otherwise.
pub const DEFAULT_MAX_STEPS: u32 = 500;

/// Why a turn that reached its step limit ended.
pub fn step_limit_message(max_steps: u32) -> String {
    format!(
        "the turn made {max_steps} model calls without finishing; podhost stops a turn there \
         (PODHOST_MAX_STEPS)"
    )
}

impl<F: Front> ChatTurn<F> {
    pub fn new(
        front: F,
        client: ModelClient,
        conn: ModelEndpoint,
        key: KeySource,
        toolbox: Toolbox,
        transcript: Vec<ChatMessage>,
    ) -> Self {
        let system = system_message(toolbox.workspace().root());
        ChatTurn {
            front,
            client,
            conn,
            key,
            system,
            toolbox,
            transcript,
            deferred_asks: None,
            answered: HashSet::new(),
            max_steps: DEFAULT_MAX_STEPS,
            limits: ChatLimits::default(),
            view: ContextView::default(),
        }
    }

    /// Appends `extra` to the system message (a workspace's `AGENTS.md`, the user's own
    /// instructions), after a blank line.
    pub fn with_instructions(mut self, extra: &str) -> Self {
        if !extra.trim().is_empty() {
            let base = self.system.content.take().unwrap_or_default();
            self.system = ChatMessage::system(format!("{base}\n\n{}", extra.trim_end()));
        }
        self
    }

    /// The model's limits, and the view a previous turn of the session left.
    pub fn with_context(mut self, limits: ChatLimits, view: ContextView) -> Self {
        self.limits = limits;
        self.view = view;
        self
    }

    /// The view as it stands (after the turn: what the front keeps).
    pub fn view(&self) -> &ContextView {
        &self.view
    }

    /// The model's budget: the window, with the room the generation settings give the answer.
    fn budget(&self) -> Option<Budget> {
        let answer = ["max_completion_tokens", "max_tokens"]
            .iter()
            .find_map(|k| self.conn.generation_settings.get(*k)?.as_u64());
        self.limits.window.map(|w| {
            let b = Budget::new(w, answer, self.limits.threshold);
            if self.limits.assumed { b.assumed() } else { b }
        })
    }

    /// The messages the model is sent, with their files as it can read them.
    fn sent(&self) -> Vec<Sent> {
        let mut sent = self.view.messages(&self.transcript);
        for s in &mut sent {
            s.message = context::show_files(&s.message, &self.limits.files, self.view.no_files);
        }
        sent
    }

    /// Ends the turn (as [`crate::agent::turn::TurnEnd::Yielded`]) before model call
    /// `max_steps + 1`.
    pub fn with_max_steps(mut self, max_steps: u32) -> Self {
        self.max_steps = max_steps.max(1);
        self
    }

    async fn push(&mut self, messages: Vec<ChatMessage>) -> Result<(), SessionError> {
        self.front.appended(&messages).await?;
        self.transcript.extend(messages);
        Ok(())
    }

    /// Runs one of the toolbox's tools. A fault of podhost's own is the turn's, never the model's: a
    /// call that failed before anything ran is made again (a new session holder, a new
    /// supervisor) a few times, then ends the turn, as does any other fault at once.
    async fn call_tool(
        &self,
        call: &ToolCallBlock,
        cancel: &CancellationToken,
    ) -> Result<ResultOutcome, SessionError> {
        let Some(tool) = ToolName::offered(&call.name) else {
            let mut tools = ToolName::WITH_BACKGROUND.map(ToolName::as_str).to_vec();
            tools.push(ASK_USER);
            return Ok(unknown_tool(&call.name, &tools).into());
        };
        let mut backoff =
            crate::floor::backoff::Backoff::new(SANDBOX_RETRY_FIRST, SANDBOX_RETRY_FIRST * 8);
        let mut tries = 0;
        loop {
            tries += 1;
            let ctx = CallContext::new(cancel.child_token());
            match self.toolbox.call(tool, &call.args, &ctx).await {
                Ok(outcome) => return Ok(outcome.into()),
                Err(e) if e.nothing_ran() && tries < SANDBOX_TRIES => {
                    let delay = backoff.next_delay();
                    tracing::warn!(tool = %call.name, error = %e, retry_in = ?delay, "a tool call could not start; trying again");
                    if !crate::floor::backoff::sleep_or_cancel(delay, cancel).await {
                        return Ok(ResultOutcome::failed(
                            codes::sandbox::CANCELLED,
                            "The call was cancelled before it ran.",
                        ));
                    }
                }
                Err(e) => {
                    tracing::error!(tool = %call.name, error = %e, "podhost could not run a tool call; the turn ends");
                    return Err(e.into());
                }
            }
        }
    }
}

impl<F: Front> ChatTurn<F> {
    /// Hands the usage an answer reported, if any, to the front.
    async fn count_usage(&mut self, answer: &ModelAnswer) -> Result<(), SessionError> {
        match answer {
            ModelAnswer::Candidate(Candidate {
                usage: Some(usage), ..
            }) => self.front.used(usage).await,
            _ => Ok(()),
        }
    }

    /// One completion: its answer, or its failure as the loop reads it.
    async fn complete(&self, body: &serde_json::Value, cancel: &CancellationToken) -> ModelAnswer {
        let key = self.key.key();
        match self
            .client
            .complete(&self.conn, key.as_ref(), body, cancel)
            .await
        {
            Ok(c) => ModelAnswer::Candidate(c),
            Err(e @ ModelError::Cancelled) => ModelAnswer::Failed(ModelFailure::new(
                codes::model::CANCELLED,
                e.to_string(),
                false,
            )),
            Err(ModelError::Overflow(m)) => {
                ModelAnswer::Failed(ModelFailure::new(codes::model::CONTEXT_OVERFLOW, m, false))
            }
            Err(ModelError::Invalid(m)) => {
                ModelAnswer::Failed(ModelFailure::new(codes::model::INVALID_REQUEST, m, false))
            }
            Err(ModelError::Failed(m)) => {
                ModelAnswer::Failed(ModelFailure::new(codes::model::FAILED, m, false))
            }
        }
    }
}

fn to_wire(call: &ToolCallBlock) -> ToolCall {
    let arguments = match &call.raw {
        Some(raw) => raw.clone(),
        None => call.args.to_string(),
    };
    ToolCall::new(call.id.clone(), call.name.clone(), arguments)
}

/// An `ask_user` call that asks something: the only calls that end a turn `input_required`.
fn is_question(call: &ToolCallBlock) -> bool {
    call.name == ASK_USER && call.raw.is_none() && question_of(call).is_some()
}

impl<F: Front> TurnHost for ChatTurn<F> {
    type Error = SessionError;

    fn should_yield(&self, step: u32) -> bool {
        step >= self.max_steps
    }

    async fn model(
        &mut self,
        _step: u32,
        _attempt: u32,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, SessionError> {
        let messages = context::request_messages(self.sent());
        let body = ModelClient::body(&self.conn, &self.system, &messages, tool_specs());
        let answer = self.complete(&body, cancel).await;
        self.count_usage(&answer).await?;
        crate::failpoint!("serve.after_model");
        Ok(Effect::Done(answer))
    }

    fn context(&self) -> Option<Context> {
        let fixed = context::tokens_of(&self.system) + estimate_json(tool_specs());
        Some(Context {
            budget: self.budget(),
            fixed,
            units: context::sized_units(&self.sent()),
        })
    }

    fn unit_text(&self, unit: usize) -> String {
        let sent = self.sent();
        context::units(&sent)
            .get(unit)
            .map(|(_, positions)| {
                let messages: Vec<&ChatMessage> =
                    positions.iter().map(|&p| &sent[p].message).collect();
                context::render(&messages)
            })
            .unwrap_or_default()
    }

    async fn summarize(
        &mut self,
        call: &SummaryCall,
        cancel: &CancellationToken,
    ) -> Result<Effect<ModelAnswer>, SessionError> {
        let mut conn = self.conn.clone();
        let settings = &mut conn.generation_settings;
        let room = serde_json::Value::from(call.max_tokens);
        if settings.contains_key("max_completion_tokens") {
            settings.insert("max_completion_tokens".into(), room);
        } else {
            settings.insert("max_tokens".into(), room);
        }
        let mut body = ModelClient::body(
            &conn,
            &ChatMessage::system(call.instructions),
            &[ChatMessage::user(call.text.clone())],
            &json!([]),
        );
        if let Some(o) = body.as_object_mut() {
            o.remove("tools");
        }
        tracing::info!(
            step = call.step,
            part = call.part,
            parts = call.parts,
            "summarizing the history"
        );
        let answer = self.complete(&body, cancel).await;
        self.count_usage(&answer).await?;
        // The summary is written; the view is not yet changed or stored.
        crate::failpoint!("serve.compaction_after_summary");
        Ok(Effect::Done(answer))
    }

    async fn compacted(&mut self, c: &Compaction) -> Result<(), SessionError> {
        let sent = self.view.messages(&self.transcript);
        let units = context::units(&sent);
        let mut view = ContextView {
            summary: c.summary.clone().or_else(|| self.view.summary.clone()),
            keep: Vec::new(),
            from: self.transcript.len(),
            preview_until: self.view.preview_until,
            no_files: self.view.no_files,
        };
        for &u in &c.kept {
            let Some((kind, positions)) = units.get(u) else {
                continue;
            };
            let indices = positions.iter().filter_map(|&p| sent[p].index);
            match kind {
                UnitKind::Step => {
                    if let Some(first) = indices.min() {
                        view.from = view.from.min(first);
                    }
                }
                UnitKind::Summary => {}
                UnitKind::Pinned | UnitKind::Input => view.keep.extend(indices),
            }
        }
        view.keep.retain(|&i| i < view.from);
        view.keep.sort_unstable();
        if c.shrink {
            view.preview_until = self.transcript.len();
        }
        tracing::info!(
            step = c.step,
            trigger = c.trigger.as_str(),
            before = c.tokens_before,
            after = c.tokens_after,
            parts = c.parts,
            "history compacted"
        );
        self.view = view;
        // The view is changed in memory; the front has not stored it yet.
        crate::failpoint!("serve.compaction_before_report");
        self.front.compacted(&self.view).await
    }

    async fn drop_files(
        &mut self,
        _step: u32,
        _failure: &ModelFailure,
    ) -> Result<bool, SessionError> {
        if self.view.no_files || !self.sent().iter().any(|s| context::sends_files(&s.message)) {
            return Ok(false);
        }
        self.view.no_files = true;
        self.front.compacted(&self.view).await?;
        Ok(true)
    }

    /// Makes every call fit the protocol's rules (see [`keep_call_rules`]).
    fn prepare(&mut self, step: u32, candidate: &mut Candidate) {
        let taken: HashSet<String> = self
            .transcript
            .iter()
            .flat_map(|m| m.calls().iter().map(|c| c.id.clone()))
            .collect();
        keep_call_rules(taken, step, candidate);
    }

    async fn answered(&mut self, _step: u32, candidate: &Candidate) -> Result<(), SessionError> {
        let text = candidate.text_output();
        let calls: Vec<&ToolCallBlock> = candidate.tool_calls().collect();
        let split = !self.front.answers_questions()
            && calls.iter().any(|c| is_question(c))
            && calls.iter().any(|c| !is_question(c));
        let message = if split {
            let (asks, others): (Vec<_>, Vec<_>) = calls.into_iter().partition(|c| is_question(c));
            self.deferred_asks = Some(ChatMessage::assistant(
                String::new(),
                asks.into_iter().map(to_wire).collect(),
            ));
            ChatMessage::assistant(text, others.into_iter().map(to_wire).collect())
        } else {
            ChatMessage::assistant(text, calls.into_iter().map(to_wire).collect())
        };
        self.answered.clear();
        self.push(vec![message]).await?;
        crate::failpoint!("serve.after_assistant_stored");
        Ok(())
    }

    async fn tool(
        &mut self,
        _step: u32,
        call: &ToolCallBlock,
        cancel: &CancellationToken,
    ) -> Result<ToolEffect, SessionError> {
        let outcome = if call.name == NO_NAME {
            let mut tools = ToolName::WITH_BACKGROUND.map(ToolName::as_str).to_vec();
            tools.push(ASK_USER);
            ResultOutcome::failed(
                codes::tool::INVALID_INPUT,
                format!(
                    "The tool call named no function. Call one of: {}.",
                    tools.join(", ")
                ),
            )
        } else if call.name == ASK_USER && question_of(call).is_none() {
            ResultOutcome::failed(
                codes::tool::INVALID_INPUT,
                "ask_user needs a non-empty `question`: the one question for the user, complete \
                 and self-contained.",
            )
        } else if call.name == ASK_USER {
            if !self.front.answers_questions() {
                return Ok(ToolEffect::Ask);
            }
            let question = question_of(call).unwrap_or_default();
            match self.front.ask(question).await {
                Some(answer) => ResultOutcome::Completed {
                    output: Value::String(answer),
                    files: None,
                },
                None => return Ok(ToolEffect::Ask),
            }
        } else {
            self.call_tool(call, cancel).await?
        };
        crate::failpoint!("serve.after_tool");
        self.push(vec![ChatMessage::tool(
            call.id.clone(),
            outcome.model_text(),
        )])
        .await?;
        crate::failpoint!("serve.after_tool_stored");
        self.answered.insert(call.id.clone());
        Ok(ToolEffect::Done(outcome))
    }

    async fn results(&mut self, _step: u32, results: &[ToolResult]) -> Result<(), SessionError> {
        let mut rest: Vec<ChatMessage> = results
            .iter()
            .filter(|r| !self.answered.contains(&r.call_id))
            .map(|r| ChatMessage::tool(r.call_id.clone(), r.outcome.model_text()))
            .collect();
        if let Some(asks) = self.deferred_asks.take() {
            rest.push(asks);
        }
        self.answered.clear();
        if rest.is_empty() {
            return Ok(());
        }
        self.push(rest).await
    }
}

/// Makes every call of `candidate` (at `step`) fit the protocol's rules: an id with a control
/// character or past [`MAX_CALL_ID_CHARS`] is replaced by `call_<step>_<n>`, a call without a
/// function name is named [`NO_NAME`] (and answered with an error), and an id already `taken`
/// (by the transcript) gets a suffix that keeps it within [`MAX_CALL_ID_CHARS`]. Depends only on
/// what was taken and the answer, so a replayed answer gets the same ids.
fn keep_call_rules(mut taken: HashSet<String>, step: u32, candidate: &mut Candidate) {
    let mut index = 0;
    for block in &mut candidate.output {
        let crate::agent::model::Block::ToolCall(call) = block else {
            continue;
        };
        index += 1;
        if call.id.chars().any(char::is_control) || call.id.chars().count() > MAX_CALL_ID_CHARS {
            call.id = format!("call_{step}_{index}");
        }
        if call.name.trim().is_empty() {
            call.name = NO_NAME.to_owned();
        }
        let base = call.id.clone();
        let mut n = 1;
        while !taken.insert(call.id.clone()) {
            n += 1;
            call.id = suffixed_call_id(&base, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn ids_the_transcript_holds_get_a_suffix_within_512_characters_the_same_on_replay() {
        let long = "y".repeat(512);
        let taken: HashSet<String> = [long.clone(), format!("{}_2", "y".repeat(510))].into();
        let answer = || Candidate {
            output: [long.as_str(), long.as_str(), "ok\u{7}", &"z".repeat(513)]
                .iter()
                .map(|id| {
                    crate::agent::model::Block::ToolCall(ToolCallBlock::from_json_arguments(
                        id.to_string(),
                        "read".into(),
                        "{}",
                    ))
                })
                .collect(),
            ..Candidate::default()
        };
        let mut first = answer();
        keep_call_rules(taken.clone(), 7, &mut first);
        let ids: Vec<String> = first.tool_calls().map(|c| c.id.clone()).collect();
        assert_eq!(
            ids,
            [
                format!("{}_3", "y".repeat(510)),
                format!("{}_4", "y".repeat(510)),
                "call_7_3".to_owned(),
                "call_7_4".to_owned(),
            ]
        );
        let mut replayed = answer();
        keep_call_rules(taken, 7, &mut replayed);
        assert_eq!(replayed, first);
    }

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall::new(id, name, "{}".into())
    }

    #[test]
    fn a_tail_tells_where_the_turn_stands() {
        let user = ChatMessage::user("go");
        assert_eq!(
            repair_tail(std::slice::from_ref(&user)),
            (vec![], Tail::Continue)
        );
        let done = ChatMessage::assistant("ok".into(), vec![]);
        assert_eq!(
            repair_tail(&[user.clone(), done]),
            (vec![], Tail::Completed)
        );
        let ask = ChatMessage::assistant(String::new(), vec![call("q", ASK_USER)]);
        assert_eq!(
            repair_tail(&[user.clone(), ask]),
            (vec![], Tail::InputRequired(vec!["q".into()]))
        );
        let two = ChatMessage::assistant(String::new(), vec![call("a", "bash"), call("b", "read")]);
        assert_eq!(
            repair_tail(&[user, two, ChatMessage::tool("a", "done")]),
            (vec![ChatMessage::tool("b", INTERRUPTED)], Tail::Continue)
        );
    }

    #[test]
    fn the_model_is_offered_nine_tools() {
        let names: Vec<&str> = tool_specs()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "bash",
                "read",
                "write",
                "edit",
                "grep",
                "glob",
                "bash_output",
                "bash_kill",
                "ask_user"
            ]
        );
    }
}
