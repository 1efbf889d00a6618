//! The fake core's turn side: the journal of effects, the session transcripts and the outputs,
//! as strict as core where podhost can tell (v5 §4, §6, §7; v2 notes §1.3, §1.6, §3, §5).
//!
//! * `effect.intent`: strict params and intent (unknown fields refused), the effect's session
//!   and turn must be the run's, its id must carry the run's `<turnId>:<segment>:<kind>:`, a
//!   model intent must not carry `input`, and for every other effect the hash is recomputed
//!   (a mismatch is `invalid` "The request hash does not match the request"). Rows replay:
//!   `completed` for a finished row with the same hash, `effect_drift` for another hash,
//!   `execute` + `rejoin` for a model call still `invoking` or `uncertain` (its fate unknown),
//!   `completed` with `tool.interrupted` for a sandbox or harness call still `invoking` that
//!   another run asks for (a crash interrupted it), the re-send count for a tool.
//!   Runtime targets are answered `completed` in the intent (core runs them). An MCP target
//!   must name a tool the session discovered (`tool.unknown`) and the turn leaves enabled
//!   (`tool.disabled`); an HTTP target a tool the manifest declares (`tool.unavailable`). A gate
//!   call (MCP, HTTP) still `invoking` is a re-send: `execute` + `rejoin` up to three attempts,
//!   then `completed` with `tool.interrupted`. A call held for a person (`pending`) answers
//!   `execute` once approved and `completed` with `tool.denied` once denied ([`Journal::decide`]).
//! * `session.mcp`: strict params; the first snapshot a session records wins (checked as the
//!   fake's guess of `McpSnapshotSchema` v2, `fake_toolgate::shapes`); the answer is `{mcp?}`,
//!   the session's facts.
//! * `effect.outcome`: strict, one of `value` / `error`, only for an `invoking` row of the run,
//!   a value larger than `recordEntryBytes` refused with `limit_exceeded`.
//! * `transcript.read` answers the session's transcript at the run's cursor.
//! * Outputs: `TurnOutput` strict, the method must fit the status, `state` within
//!   `harnessStateBytes`, each transcript update strict and within `recordEntryBytes`, folded
//!   onto the stored transcript with its `length` checked; a failed or cancelled turn's edits
//!   are checked and then dropped (core reverts them).
//! * Compaction (v5 §6): an update marked `kind: "compaction"` carries strict facts `{trigger,
//!   tokensBefore, tokensAfter, summaryEffectIds}`, each id a completed summary call of the
//!   run's turn (a model row with `purpose: "summary"` and a candidate outcome), else `invalid`;
//!   after it the transcript starts with a `compaction` entry, and no `compaction` entry is ever
//!   anywhere but first. Each accepted compaction is kept for the test to read.
//! * A `purpose` is `summary`, and only on a model intent. A tool intent names `callId` unless
//!   its target is `harness` (v5 §4: without one, core journals it and writes no
//!   `tool.completed`).
//!
//! The test scripts intent answers per effect id (a scripted answer wins over a row's own, so a
//! re-send can be answered too), seeds transcripts, and reads rows, outputs and timings. The run tokens live here too, so the fake Model Gate can tell current, stale and
//! unknown ones apart.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use podhost::nylorun::link::canonical::request_hash;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::fake_core::FakeCore;

/// The journal's requests (the output methods are dispatched separately); `event` is a run's
/// claim.
pub const METHODS: [&str; 5] = [
    "effect.intent",
    "effect.outcome",
    "transcript.read",
    "event",
    "session.mcp",
];

type Refusal = (String, String);

fn refuse(code: &str, message: impl Into<String>) -> Refusal {
    (code.to_owned(), message.into())
}

/// A journal row's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Invoking,
    Completed,
    Pending,
    Uncertain,
    /// A person approved the held call: its next intent answers `execute`.
    Approved,
    /// A person denied the held call: its next intent answers `completed` with `tool.denied`.
    Denied,
}

/// One journaled effect.
#[derive(Clone, Debug)]
pub struct Row {
    pub run_id: String,
    pub session_id: String,
    pub turn_id: String,
    pub kind: String,
    /// The intent as podhost sent it.
    pub intent: Value,
    pub hash: String,
    pub status: Status,
    pub value: Option<Value>,
    /// Intents asked for this row (re-sends included).
    pub attempts: u32,
    /// The run an intent of this row last answered `execute` (cleared when the test sets the
    /// row, e.g. a person approving it).
    pub executing_run: Option<String>,
}

/// A run core granted.
#[derive(Clone, Debug)]
pub struct RunInfo {
    pub session_id: String,
    pub turn_id: String,
    pub segment: u64,
    pub cursor: i64,
    pub record_entry_bytes: usize,
    pub harness_state_bytes: usize,
    pub model_call_bytes: usize,
    pub tool_answer_bytes: usize,
    pub sandbox: bool,
    pub over: bool,
    pub manifest_hash: String,
    /// The manifest's `mcpServers`, as granted.
    pub mcp_servers: Value,
    /// The manifest's HTTP tools' names.
    pub http_tools: Vec<String>,
    /// `model.contextWindow` and `model.maxOutputTokens` of the TurnStart.
    pub context_window: Option<u64>,
    pub max_output_tokens: Option<u64>,
    /// `model.inputs`, when the TurnStart has a model.
    pub model_inputs: Option<Vec<String>>,
    pub model_file_bytes: u64,
}

/// What a run token is to the gates now.
#[derive(Clone, Debug, PartialEq)]
pub enum TokenState {
    Current { run_id: String, session_id: String },
    Stale,
    Unknown,
}

/// When an effect's intent and outcome arrived.
#[derive(Clone, Debug)]
pub struct Timing {
    pub effect_id: String,
    pub kind: String,
    pub intent_at: Instant,
    pub outcome_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    runs: HashMap<String, RunInfo>,
    /// token → (run id, current).
    tokens: HashMap<String, (String, bool)>,
    rows: HashMap<String, Row>,
    /// session → versions `(cursor, entries)`, oldest first.
    transcripts: HashMap<String, Vec<(i64, Vec<Value>)>>,
    next_cursor: i64,
    scripted: HashMap<String, VecDeque<Value>>,
    outputs: Vec<(String, String, Value)>,
    timings: Vec<Timing>,
    /// Claimed events: `(run id, type, payload)`.
    claims: Vec<(String, String, Value)>,
    /// session → the first snapshot recorded and the facts made from it.
    mcp: HashMap<String, (Value, Value)>,
    /// Every `session.mcp`: `(run id, params)`.
    mcp_reports: Vec<(String, Value)>,
    /// Accepted compactions: `(run id, facts)`.
    compactions: Vec<(String, Value)>,
}

/// The journal; shared by the fake core and the fake gates.
pub struct Journal {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

impl Default for Journal {
    fn default() -> Self {
        Journal {
            state: Mutex::new(State {
                next_cursor: 100,
                ..State::default()
            }),
            changed: watch::Sender::new(0),
        }
    }
}

fn limit(ts: &Value, name: &str, default: usize) -> usize {
    ts["limits"][name].as_u64().map_or(default, |v| v as usize)
}

impl Journal {
    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// Registers a granted run of `turn_start` with its token.
    pub fn start_run(&self, run_id: &str, token: &str, ts: &Value) {
        let cp = &ts["checkpoint"];
        let info = RunInfo {
            session_id: cp["sessionId"].as_str().unwrap_or("").to_owned(),
            turn_id: cp["turnId"].as_str().unwrap_or("").to_owned(),
            segment: cp["segment"].as_u64().unwrap_or(0),
            cursor: ts["transcript"]["cursor"].as_i64().unwrap_or(-1),
            record_entry_bytes: limit(ts, "recordEntryBytes", 960 * 1024),
            harness_state_bytes: limit(ts, "harnessStateBytes", 256 * 1024),
            model_call_bytes: limit(ts, "modelCallBytes", 32 << 20),
            tool_answer_bytes: limit(ts, "toolAnswerBytes", 8 << 20),
            sandbox: !ts["agent"]["sandbox"].is_null(),
            over: false,
            manifest_hash: cp["manifestHash"].as_str().unwrap_or("").to_owned(),
            mcp_servers: ts["manifest"]["mcpServers"].clone(),
            http_tools: ts["manifest"]["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| matches!(t["type"].as_str(), None | Some("http")))
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect(),
            context_window: ts["model"]["contextWindow"].as_u64(),
            max_output_tokens: ts["model"]["maxOutputTokens"].as_u64(),
            model_inputs: ts["model"]["inputs"].as_array().map(|a| {
                a.iter()
                    .filter_map(|i| i.as_str().map(str::to_owned))
                    .collect()
            }),
            model_file_bytes: limit(ts, "modelFileBytes", 8 << 20) as u64,
        };
        let mut s = self.state.lock().unwrap();
        s.runs.insert(run_id.to_owned(), info);
        s.tokens.insert(token.to_owned(), (run_id.to_owned(), true));
    }

    /// A renewal handed `token`: the run's older tokens are stale.
    pub fn renewed(&self, run_id: &str, token: &str) {
        let mut s = self.state.lock().unwrap();
        for (_, (r, current)) in s.tokens.iter_mut() {
            if r == run_id {
                *current = false;
            }
        }
        s.tokens.insert(token.to_owned(), (run_id.to_owned(), true));
    }

    /// The run is over (released, output, or renewal refused): its tokens are stale.
    pub fn run_over(&self, run_id: &str) {
        let mut s = self.state.lock().unwrap();
        if let Some(r) = s.runs.get_mut(run_id) {
            r.over = true;
        }
        for (_, (r, current)) in s.tokens.iter_mut() {
            if r == run_id {
                *current = false;
            }
        }
    }

    pub fn token_state(&self, token: &str) -> TokenState {
        let s = self.state.lock().unwrap();
        match s.tokens.get(token) {
            None => TokenState::Unknown,
            Some((_, false)) => TokenState::Stale,
            Some((run_id, true)) => TokenState::Current {
                run_id: run_id.clone(),
                session_id: s.runs[run_id].session_id.clone(),
            },
        }
    }

    pub fn run(&self, run_id: &str) -> Option<RunInfo> {
        self.state.lock().unwrap().runs.get(run_id).cloned()
    }

    /// The next intent for `effect_id` gets `answer` (`{status: …}`) instead of the default.
    pub fn script_intent(&self, effect_id: &str, answer: Value) {
        self.state
            .lock()
            .unwrap()
            .scripted
            .entry(effect_id.to_owned())
            .or_default()
            .push_back(answer);
    }

    pub fn row(&self, effect_id: &str) -> Option<Row> {
        self.state.lock().unwrap().rows.get(effect_id).cloned()
    }

    /// Sets a row's status and value (a person approved a held call, a gate finished…).
    pub fn set_row(&self, effect_id: &str, status: Status, value: Option<Value>) {
        let mut s = self.state.lock().unwrap();
        let row = s.rows.get_mut(effect_id).expect("no such row");
        row.status = status;
        row.value = value;
        row.executing_run = None;
    }

    /// `TurnStart.outcomes` for a replay of `turn_id`'s segment: its completed rows.
    pub fn completed_outcomes(&self, turn_id: &str, segment: u64) -> Vec<Value> {
        let prefix = format!("{turn_id}:{segment}:");
        let s = self.state.lock().unwrap();
        let mut rows: Vec<_> = s
            .rows
            .iter()
            .filter(|(id, r)| id.starts_with(&prefix) && r.status == Status::Completed)
            .map(|(id, r)| {
                json!({"effectId": id, "requestHash": r.hash, "outcome": {"value": r.value}})
            })
            .collect();
        rows.sort_by(|a, b| a["effectId"].as_str().cmp(&b["effectId"].as_str()));
        rows
    }

    /// Seeds a session's transcript; returns its cursor.
    pub fn seed_transcript(&self, session_id: &str, entries: Vec<Value>) -> i64 {
        let mut s = self.state.lock().unwrap();
        let cursor = s.next_cursor;
        s.next_cursor += 1;
        s.transcripts
            .entry(session_id.to_owned())
            .or_default()
            .push((cursor, entries));
        cursor
    }

    /// The session's latest transcript and its cursor (`-1` and empty when none).
    pub fn transcript(&self, session_id: &str) -> (i64, Vec<Value>) {
        let s = self.state.lock().unwrap();
        s.transcripts
            .get(session_id)
            .and_then(|v| v.last().cloned())
            .unwrap_or((-1, Vec::new()))
    }

    /// Every output: `(run id, method, params)`.
    pub fn outputs(&self) -> Vec<(String, String, Value)> {
        self.state.lock().unwrap().outputs.clone()
    }

    /// Compactions core accepted: `(run id, facts)`.
    pub fn compactions(&self) -> Vec<(String, Value)> {
        self.state.lock().unwrap().compactions.clone()
    }

    /// Events the runs claimed: `(run id, type, payload)`.
    pub fn claims(&self) -> Vec<(String, String, Value)> {
        self.state.lock().unwrap().claims.clone()
    }

    pub fn timings(&self) -> Vec<Timing> {
        self.state.lock().unwrap().timings.clone()
    }

    /// Waits for `run_id`'s output: `(method, params)`.
    pub async fn wait_output(&self, run_id: &str) -> (String, Value) {
        self.wait_output_within(run_id, std::time::Duration::from_secs(20))
            .await
    }

    /// Waits up to `within` for `run_id`'s output (a long turn's): `(method, params)`.
    pub async fn wait_output_within(
        &self,
        run_id: &str,
        within: std::time::Duration,
    ) -> (String, Value) {
        let mut rx = self.changed.subscribe();
        let found = tokio::time::timeout(within, async {
            loop {
                if let Some((_, m, p)) = self.outputs().into_iter().find(|(r, _, _)| r == run_id) {
                    return (m, p);
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        found.unwrap_or_else(|_| panic!("no output for {run_id}"))
    }

    /// Waits until `pred` holds for the row of `effect_id`.
    pub async fn wait_row(&self, effect_id: &str, pred: impl Fn(&Row) -> bool) -> Row {
        let mut rx = self.changed.subscribe();
        let found = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            loop {
                if let Some(r) = self.row(effect_id).filter(|r| pred(r)) {
                    return r;
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!("row {effect_id} never got there: {:?}", self.row(effect_id))
        })
    }

    /// Answers a journal request of a held run (`held` says whether the connection holds it).
    pub fn answer(&self, m: &str, p: Value, held: impl Fn(&str) -> bool) -> Result<Value, Refusal> {
        let invalid = |e: String| refuse("invalid", format!("Invalid {m} request: {e}"));
        let run_id = p
            .get("runId")
            .and_then(Value::as_str)
            .filter(|r| !r.is_empty())
            .ok_or_else(|| invalid("runId is missing".into()))?
            .to_owned();
        if !held(&run_id) {
            return Err(refuse(
                "run_not_held",
                format!("Run {run_id} is not held by this harness"),
            ));
        }
        let r = match m {
            "effect.intent" => self.intent(&run_id, p).map_err(|e| e.or_invalid(m)),
            "effect.outcome" => self.outcome(&run_id, p).map_err(|e| e.or_invalid(m)),
            "transcript.read" => self.read(&run_id, p).map_err(|e| e.or_invalid(m)),
            "event" => self.event(&run_id, p).map_err(|e| e.or_invalid(m)),
            "session.mcp" => self.session_mcp(&run_id, p).map_err(|e| e.or_invalid(m)),
            _ => Err(refuse("invalid", format!("Unknown request {m}"))),
        };
        self.bump();
        r
    }

    fn intent(&self, run_id: &str, p: Value) -> Result<Value, Why> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Params {
            run_id: String,
            effect: Value,
            request_hash: String,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        #[allow(unused)]
        struct Effect {
            effect_id: String,
            session_id: String,
            turn_id: String,
            agent_id: String,
            manifest_hash: String,
            kind: String,
            agent: Option<Value>,
            capability_id: Option<String>,
            tool_name: Option<String>,
            path: Option<Value>,
            key: Option<Value>,
            iterations: Option<Value>,
            target: Option<Value>,
            skill: Option<String>,
            purpose: Option<String>,
            input: Option<Value>,
            context: serde_json::Map<String, Value>,
        }
        let params: Params = serde_json::from_value(p).map_err(Why::parse)?;
        let e: Effect = serde_json::from_value(params.effect.clone()).map_err(Why::parse)?;
        let hash = params.request_hash;
        if hash.len() != 64
            || !hash
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Why::invalid("requestHash is not 64 lowercase hex digits"));
        }
        let run = self.state.lock().unwrap().runs[run_id].clone();
        if e.session_id != run.session_id || e.turn_id != run.turn_id {
            return Err(Why::invalid(
                "The effect is not of the run's session and turn",
            ));
        }
        if !["model", "tool"].contains(&e.kind.as_str()) {
            return Err(Why::invalid(format!(
                "kind {} is not a custom harness's",
                e.kind
            )));
        }
        let prefix = format!("{}:{}:{}:", run.turn_id, run.segment, e.kind);
        if !e.effect_id.starts_with(&prefix) || e.effect_id.len() == prefix.len() {
            return Err(Why::invalid(format!(
                "effectId {} does not start with {prefix}",
                e.effect_id
            )));
        }
        if e.context
            .get("invocationId")
            .and_then(Value::as_str)
            .is_none()
        {
            return Err(Why::invalid("context.invocationId is missing"));
        }
        if let Some(p) = &e.purpose
            && (p != "summary" || e.kind != "model")
        {
            return Err(Why::invalid(format!(
                "purpose {p:?} is not one of a model intent's"
            )));
        }
        if e.kind == "model" {
            if e.input.is_some() {
                return Err(Why::invalid("A model intent carries no input"));
            }
        } else {
            let harness = e.target.as_ref().and_then(|t| t["kind"].as_str()) == Some("harness");
            if !harness && e.context.get("callId").and_then(Value::as_str).is_none() {
                return Err(Why::invalid("a tool effect needs context.callId"));
            }
            if e.tool_name.is_none() || e.target.is_none() || e.input.is_none() {
                return Err(Why::invalid(
                    "a tool effect needs toolName, target and input",
                ));
            }
            if request_hash(&params.effect) != hash {
                return Err(Why::invalid("The request hash does not match the request"));
            }
        }
        let mut s = self.state.lock().unwrap();
        s.timings.push(Timing {
            effect_id: e.effect_id.clone(),
            kind: e.kind.clone(),
            intent_at: Instant::now(),
            outcome_at: None,
        });
        if let Some(row) = s.rows.get_mut(&e.effect_id) {
            if row.hash != hash {
                return Err(Why::Code(refuse(
                    "effect_drift",
                    "Effect identity request drift",
                )));
            }
            row.attempts += 1;
            // A scripted answer wins over the row's own (the row keeps its status).
            if let Some(answer) = s
                .scripted
                .get_mut(&e.effect_id)
                .and_then(VecDeque::pop_front)
            {
                return Ok(answer);
            }
            let row = s.rows.get_mut(&e.effect_id).unwrap();
            return Ok(match row.status {
                Status::Completed => {
                    json!({"status": "completed", "outcome": {"value": row.value}})
                }
                Status::Pending => json!({"status": "pending"}),
                // A model call whose fate is unknown: the next owner rejoins it at the gate
                // (v5 §4), under the same key and body.
                Status::Uncertain if row.kind == "model" => {
                    row.status = Status::Invoking;
                    json!({"status": "execute", "rejoin": true})
                }
                Status::Uncertain => json!({"status": "uncertain"}),
                Status::Invoking if row.kind == "model" => {
                    json!({"status": "execute", "rejoin": true})
                }
                // A sandbox or harness call a crash interrupted (its run is gone, another
                // asks): `tool.interrupted` at once (v5 §4); it is never run again.
                Status::Invoking
                    if row.executing_run.as_deref().is_some_and(|r| r != run_id)
                        && matches!(
                            row.intent["target"]["kind"].as_str(),
                            Some("sandbox" | "harness")
                        ) =>
                {
                    let value = json!({"kind": "failed", "code": "tool.interrupted",
                                       "message": "The call was interrupted by a crash of its run"});
                    row.status = Status::Completed;
                    row.value = Some(value.clone());
                    json!({"status": "completed", "outcome": {"value": value}})
                }
                Status::Invoking if row.attempts > 3 => {
                    let value = json!({"kind": "failed", "code": "tool.interrupted",
                                       "message": "The call was interrupted too often"});
                    row.status = Status::Completed;
                    row.value = Some(value.clone());
                    json!({"status": "completed", "outcome": {"value": value}})
                }
                // A gate keeps a call running for the next owner: a re-send rejoins it.
                Status::Invoking
                    if ["mcp", "http"]
                        .contains(&row.intent["target"]["kind"].as_str().unwrap_or("")) =>
                {
                    json!({"status": "execute", "rejoin": true})
                }
                Status::Invoking => {
                    row.executing_run = Some(run_id.to_owned());
                    json!({"status": "execute"})
                }
                Status::Approved => {
                    row.status = Status::Invoking;
                    row.attempts = 1;
                    row.executing_run = Some(run_id.to_owned());
                    json!({"status": "execute"})
                }
                Status::Denied => {
                    let value = json!({"kind": "failed", "code": "tool.denied",
                                       "message": "A person denied this call."});
                    row.status = Status::Completed;
                    row.value = Some(value.clone());
                    json!({"status": "completed", "outcome": {"value": value}})
                }
            });
        }
        let target_kind = e
            .target
            .as_ref()
            .and_then(|t| t["kind"].as_str())
            .unwrap_or("");
        let scripted = s
            .scripted
            .get_mut(&e.effect_id)
            .and_then(VecDeque::pop_front);
        let sandbox_ok = run.sandbox
            && ["bash", "read", "write", "edit", "grep", "glob"]
                .contains(&e.tool_name.as_deref().unwrap_or(""));
        let gate_refusal = e
            .target
            .as_ref()
            .and_then(|t| self.gate_target_refusal(&s, &run, t));
        let answer = match (gate_refusal, scripted, target_kind) {
            (Some(refusal), _, _) => refusal,
            (None, Some(a), _) => a,
            (None, None, "sandbox") if !sandbox_ok => {
                json!({"status": "completed", "outcome": {"value":
                {"kind": "failed", "code": "tool.unavailable", "message": "The session has no sandbox"}}})
            }
            (None, None, "runtime") => json!({"status": "completed", "outcome": {"value":
                {"kind": "completed", "output": format!("core ran {} {}", e.target.as_ref().unwrap()["operation"], e.input.as_ref().unwrap())}}}),
            (None, None, _) => json!({"status": "execute"}),
        };
        let (status, value) = match answer["status"].as_str() {
            Some("execute") => (Status::Invoking, None),
            Some("pending") => (Status::Pending, None),
            Some("uncertain") => (Status::Uncertain, None),
            _ => (Status::Completed, Some(answer["outcome"]["value"].clone())),
        };
        s.rows.insert(
            e.effect_id.clone(),
            Row {
                run_id: run_id.to_owned(),
                session_id: e.session_id,
                turn_id: e.turn_id,
                kind: e.kind,
                intent: params.effect,
                hash,
                executing_run: (status == Status::Invoking).then(|| run_id.to_owned()),
                status,
                value,
                attempts: 1,
            },
        );
        Ok(answer)
    }

    fn outcome(&self, run_id: &str, p: Value) -> Result<Value, Why> {
        let o = p
            .as_object()
            .ok_or_else(|| Why::invalid("params are not an object"))?;
        if let Some(k) = o
            .keys()
            .find(|k| !["runId", "effectId", "value", "error"].contains(&k.as_str()))
        {
            return Err(Why::invalid(format!("unknown field `{k}`")));
        }
        let effect_id = o
            .get("effectId")
            .and_then(Value::as_str)
            .ok_or_else(|| Why::invalid("effectId is missing"))?;
        let (value, error) = (o.get("value"), o.get("error"));
        if value.is_some() == error.is_some() {
            return Err(Why::invalid("give exactly one of value and error"));
        }
        if error.is_some_and(|e| !e.is_string()) {
            return Err(Why::invalid("error is not a string"));
        }
        let mut s = self.state.lock().unwrap();
        let limit = s.runs[run_id].record_entry_bytes;
        let turn_id = s.runs[run_id].turn_id.clone();
        if let Some(t) = s
            .timings
            .iter_mut()
            .rev()
            .find(|t| t.effect_id == effect_id && t.outcome_at.is_none())
        {
            t.outcome_at = Some(Instant::now());
        }
        let row = s
            .rows
            .get_mut(effect_id)
            .filter(|r| r.turn_id == turn_id)
            .ok_or_else(|| {
                Why::invalid(format!("{effect_id} is not an effect of the run's turn"))
            })?;
        if row.status != Status::Invoking {
            return Err(Why::invalid(format!("{effect_id} is not invoking")));
        }
        if let Some(v) = value {
            let bytes = v.to_string().len();
            if bytes > limit {
                return Err(Why::Code(refuse(
                    "limit_exceeded",
                    format!("The outcome is {bytes} bytes, past recordEntryBytes ({limit} bytes)"),
                )));
            }
            row.status = Status::Completed;
            row.value = Some(v.clone());
            return Ok(json!({"status": "completed", "outcome": {"value": v}}));
        }
        if row.kind == "model" {
            row.status = Status::Uncertain;
            return Ok(json!({"status": "uncertain"}));
        }
        let value = json!({"kind": "failed", "code": "tool.uncertain",
                           "message": format!("The call's fate is unknown: {}", error.unwrap().as_str().unwrap())});
        row.status = Status::Completed;
        row.value = Some(value.clone());
        Ok(json!({"status": "completed", "outcome": {"value": value}}))
    }

    /// Core's answer to an MCP or HTTP target it would refuse (v5 §4): a malformed target is
    /// `tool.unavailable`, an MCP tool the session did not discover `tool.unknown`, one the turn
    /// disabled `tool.disabled`, an HTTP tool the manifest lacks `tool.unavailable`.
    fn gate_target_refusal(&self, s: &State, run: &RunInfo, target: &Value) -> Option<Value> {
        let fail = |code: &str, message: &str| {
            Some(json!({"status": "completed", "outcome": {"value":
                {"kind": "failed", "code": code, "message": message}}}))
        };
        let keys: Vec<&str> = target
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        match target["kind"].as_str() {
            Some("mcp") => {
                if keys.len() != 3 || !target["server"].is_string() || !target["tool"].is_string() {
                    return fail("tool.unavailable", "An MCP target is {kind, server, tool}");
                }
                let facts = s.mcp.get(&run.session_id).map(|(_, f)| f.clone());
                let tool = facts.as_ref().and_then(|f| {
                    f["servers"].as_array()?.iter().find(|sv| {
                            sv["name"] == target["server"] && sv.get("agentId").is_none()
                        })?["tools"]
                            .as_array()?
                            .iter()
                            .find(|t| t["name"] == target["tool"])
                            .cloned()
                });
                match tool {
                    None => fail("tool.unknown", "The session did not discover this MCP tool"),
                    Some(t) if t["enabled"] == false => {
                        fail("tool.disabled", "The turn's manifest disables this tool")
                    }
                    Some(_) => None,
                }
            }
            Some("http") => {
                if keys.len() != 2 || !target["tool"].is_string() {
                    return fail("tool.unavailable", "An HTTP target is {kind, tool}");
                }
                if !run.http_tools.iter().any(|t| target["tool"] == t.as_str()) {
                    return fail("tool.unavailable", "The agent declares no such HTTP tool");
                }
                None
            }
            _ => None,
        }
    }

    /// `session.mcp {runId, snapshot?, diagnostics}` → `{mcp?}`.
    fn session_mcp(&self, run_id: &str, p: Value) -> Result<Value, Why> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        #[allow(unused)]
        struct Params {
            run_id: String,
            snapshot: Option<Value>,
            diagnostics: Vec<Value>,
        }
        let params: Params = serde_json::from_value(p.clone()).map_err(Why::parse)?;
        let mut s = self.state.lock().unwrap();
        let run = s.runs[run_id].clone();
        s.mcp_reports.push((run_id.to_owned(), p));
        if let Some(snapshot) = params.snapshot {
            let facts = crate::fake_toolgate::shapes::facts_of(
                &snapshot,
                &run.manifest_hash,
                &run.mcp_servers,
            )
            .map_err(|e| Why::invalid(format!("snapshot: {e}")))?;
            s.mcp
                .entry(run.session_id.clone())
                .or_insert((snapshot, facts));
        }
        Ok(match s.mcp.get(&run.session_id) {
            Some((_, facts)) => json!({"mcp": facts}),
            None => json!({}),
        })
    }

    /// The session's MCP facts, for a later TurnStart's `mcp`.
    pub fn mcp_facts(&self, session_id: &str) -> Option<Value> {
        self.state
            .lock()
            .unwrap()
            .mcp
            .get(session_id)
            .map(|(_, f)| f.clone())
    }

    /// Every `session.mcp` a run sent: `(run id, params)`.
    pub fn mcp_reports(&self) -> Vec<(String, Value)> {
        self.state.lock().unwrap().mcp_reports.clone()
    }

    /// A person answers the held call `effect_id` (v5 §7): approved, its next intent answers
    /// `execute`; denied, `completed` with `tool.denied`.
    pub fn answer_approval(&self, effect_id: &str, approved: bool) {
        let mut s = self.state.lock().unwrap();
        let row = s.rows.get_mut(effect_id).expect("no such row");
        assert_eq!(row.status, Status::Pending, "{effect_id} is not held");
        row.status = if approved {
            Status::Approved
        } else {
            Status::Denied
        };
    }

    /// The TurnStart core sends once a person answered (v5 §7, and no more than v5 says): the
    /// waiting segment's own TurnStart typed `approval.answer` — the same segment, the same input
    /// — with the state its `turn.waiting` left and the segment's completed outcomes.
    pub fn approval_turn(&self, waiting_turn: &Value, waiting_output: &Value) -> Value {
        let mut ts = waiting_turn.clone();
        ts["type"] = json!("approval.answer");
        if let Some(state) = waiting_output.get("state") {
            ts["checkpoint"]["state"] = state.clone();
        }
        let turn = ts["checkpoint"]["turnId"].as_str().unwrap().to_owned();
        let segment = ts["checkpoint"]["segment"].as_u64().unwrap();
        ts["outcomes"] = json!(self.completed_outcomes(&turn, segment));
        ts
    }

    /// A claim of the run's session: a known type, within `recordEntryBytes`.
    fn event(&self, run_id: &str, p: Value) -> Result<Value, Why> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        #[allow(unused)]
        struct Params {
            run_id: String,
            session_id: String,
            turn_id: Option<String>,
            #[serde(rename = "type")]
            kind: String,
            payload: Value,
            record: Option<Value>,
        }
        let e: Params = serde_json::from_value(p).map_err(Why::parse)?;
        let mut s = self.state.lock().unwrap();
        let run = s.runs[run_id].clone();
        if e.session_id != run.session_id || e.turn_id.as_deref() != Some(run.turn_id.as_str()) {
            return Err(Why::invalid(
                "The event is not of the run's session and turn",
            ));
        }
        const TYPES: [&str; 4] = [
            "artifact.export.skipped",
            "artifact.export.failed",
            "sandbox.state",
            "sandbox.exec",
        ];
        if !TYPES.contains(&e.kind.as_str()) {
            return Err(Why::invalid(format!(
                "{} is not an event a harness claims",
                e.kind
            )));
        }
        let bytes = e.payload.to_string().len();
        if bytes > run.record_entry_bytes {
            return Err(Why::Code(refuse(
                "limit_exceeded",
                format!(
                    "The event is {bytes} bytes, past recordEntryBytes ({} bytes)",
                    run.record_entry_bytes
                ),
            )));
        }
        s.claims.push((run_id.to_owned(), e.kind, e.payload));
        Ok(json!({}))
    }

    fn read(&self, run_id: &str, p: Value) -> Result<Value, Why> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Params {
            #[allow(unused)]
            run_id: String,
        }
        let _: Params = serde_json::from_value(p).map_err(Why::parse)?;
        let s = self.state.lock().unwrap();
        let run = &s.runs[run_id];
        if run.cursor < 0 {
            return Ok(json!({"cursor": -1, "entries": []}));
        }
        let entries = s
            .transcripts
            .get(&run.session_id)
            .and_then(|v| v.iter().find(|(c, _)| *c == run.cursor))
            .map(|(_, e)| e.clone())
            .ok_or_else(|| Why::invalid(format!("no transcript at cursor {}", run.cursor)))?;
        Ok(json!({"cursor": run.cursor, "entries": entries}))
    }

    /// Validates and settles an output of a held run; answers `{cursor}`.
    pub fn output(&self, run_id: &str, m: &str, p: &Value) -> Result<Value, Refusal> {
        let r = self.settle(run_id, m, p).map_err(|e| e.or_invalid(m));
        if r.is_ok() {
            self.state
                .lock()
                .unwrap()
                .outputs
                .push((run_id.to_owned(), m.to_owned(), p.clone()));
            self.run_over(run_id);
        }
        self.bump();
        r
    }

    fn settle(&self, run_id: &str, m: &str, p: &Value) -> Result<Value, Why> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        #[allow(unused)]
        struct Output {
            run_id: String,
            status: Option<String>,
            state: Option<Value>,
            output: Option<Value>,
            pending: Option<Value>,
            error: Option<ErrorBody>,
            effect_ids: Option<Vec<String>>,
            cancel_effect_ids: Option<Vec<String>>,
            transcript: Option<Vec<Update>>,
            thrown: Option<Thrown>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(unused)]
        struct ErrorBody {
            code: Option<String>,
            message: String,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(unused)]
        struct Thrown {
            code: Option<String>,
            message: String,
        }
        #[derive(Deserialize, serde::Serialize)]
        #[serde(deny_unknown_fields)]
        struct Update {
            keep: usize,
            entries: Vec<Value>,
            length: usize,
            #[serde(skip_serializing_if = "Option::is_none")]
            kind: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            compaction: Option<Facts>,
        }
        #[derive(Clone, Deserialize, serde::Serialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Facts {
            trigger: String,
            tokens_before: u64,
            tokens_after: u64,
            summary_effect_ids: Vec<String>,
        }
        let out: Output = serde_json::from_value(p.clone()).map_err(Why::parse)?;
        let fits = match (m, out.status.as_deref()) {
            (_, None) => m == "turn.failed" && out.thrown.is_some(),
            ("turn.completed", Some("completed")) => true,
            ("turn.failed", Some("failed" | "cancelled")) => true,
            ("turn.waiting", Some("waiting" | "uncertain")) => true,
            ("checkpoint", Some("yielded")) => true,
            _ => false,
        };
        if !fits {
            return Err(Why::invalid(format!(
                "status {:?} is not one of {m}'s",
                out.status
            )));
        }
        if m == "turn.waiting" && out.effect_ids.as_ref().is_none_or(Vec::is_empty) {
            return Err(Why::invalid("a waiting output names its effectIds"));
        }
        let mut s = self.state.lock().unwrap();
        let run = s.runs[run_id].clone();
        if let Some(state) = &out.state {
            let bytes = state.to_string().len();
            if bytes > run.harness_state_bytes {
                return Err(Why::Code(refuse(
                    "limit_exceeded",
                    format!(
                        "The state is {bytes} bytes, past harnessStateBytes ({} bytes)",
                        run.harness_state_bytes
                    ),
                )));
            }
        }
        let mut transcript = if run.cursor < 0 {
            Vec::new()
        } else {
            s.transcripts
                .get(&run.session_id)
                .and_then(|v| v.iter().find(|(c, _)| *c == run.cursor))
                .map(|(_, e)| e.clone())
                .unwrap_or_default()
        };
        let mut compactions = Vec::new();
        for (i, u) in out.transcript.iter().flatten().enumerate() {
            match (u.kind.as_deref(), &u.compaction) {
                (None, None) => {}
                (Some("compaction"), Some(facts)) => {
                    if !["threshold", "overflow"].contains(&facts.trigger.as_str()) {
                        return Err(Why::invalid(format!(
                            "update {i}: trigger {:?} is not threshold or overflow",
                            facts.trigger
                        )));
                    }
                    if facts.summary_effect_ids.is_empty() {
                        return Err(Why::invalid(format!(
                            "update {i}: a compaction names its summaryEffectIds"
                        )));
                    }
                    for id in &facts.summary_effect_ids {
                        let ok = s.rows.get(id).is_some_and(|r| {
                            r.turn_id == run.turn_id
                                && r.kind == "model"
                                && r.intent["purpose"] == "summary"
                                && r.status == Status::Completed
                                && r.value.as_ref().is_some_and(|v| v["kind"] != "failed")
                        });
                        if !ok {
                            return Err(Why::invalid(format!(
                                "update {i}: {id} is not a completed summary call of this turn"
                            )));
                        }
                    }
                    compactions.push(serde_json::to_value(facts).unwrap());
                }
                _ => {
                    return Err(Why::invalid(format!(
                        "update {i}: kind \"compaction\" and compaction come together"
                    )));
                }
            }
            let bytes = serde_json::to_string(u).unwrap().len();
            if bytes > run.record_entry_bytes {
                return Err(Why::Code(refuse(
                    "limit_exceeded",
                    format!(
                        "Transcript update {i} is {bytes} bytes, past recordEntryBytes ({} bytes)",
                        run.record_entry_bytes
                    ),
                )));
            }
            if u.keep > transcript.len() {
                return Err(Why::invalid(format!(
                    "update {i} keeps {} of {}",
                    u.keep,
                    transcript.len()
                )));
            }
            transcript.truncate(u.keep);
            transcript.extend(u.entries.iter().cloned());
            if transcript.len() != u.length {
                return Err(Why::invalid(format!(
                    "update {i} leaves {} entries, not length {}",
                    transcript.len(),
                    u.length
                )));
            }
            for e in &u.entries {
                let kind = e["kind"].as_str().unwrap_or("");
                if !["input", "candidate", "tool-results", "final", "compaction"].contains(&kind) {
                    return Err(Why::invalid(format!(
                        "entry kind {kind:?} is not a transcript entry"
                    )));
                }
            }
            if u.kind.is_some()
                && transcript.first().map(|e| &e["kind"]) != Some(&json!("compaction"))
            {
                return Err(Why::invalid(format!(
                    "update {i} is a compaction, but the transcript does not start with one"
                )));
            }
            if let Some(at) = transcript
                .iter()
                .skip(1)
                .position(|e| e["kind"] == "compaction")
            {
                return Err(Why::invalid(format!(
                    "update {i} leaves a compaction entry at {}; it is always first",
                    at + 1
                )));
            }
        }
        let keeps = matches!(out.status.as_deref(), Some("completed" | "yielded"));
        if keeps {
            s.compactions
                .extend(compactions.into_iter().map(|f| (run_id.to_owned(), f)));
        }
        let cursor = s.next_cursor;
        s.next_cursor += 1;
        if keeps {
            s.transcripts
                .entry(run.session_id.clone())
                .or_default()
                .push((cursor, transcript));
        }
        Ok(json!({"cursor": cursor}))
    }
}

/// Why a request was refused: a parse error, another check, or a code of its own.
enum Why {
    Invalid(String),
    Code(Refusal),
}

impl Why {
    fn parse(e: serde_json::Error) -> Why {
        Why::Invalid(e.to_string())
    }

    fn invalid(m: impl Into<String>) -> Why {
        Why::Invalid(m.into())
    }

    fn or_invalid(self, m: &str) -> Refusal {
        match self {
            // Core's own checks answer with their own text; a schema failure names the method.
            Why::Invalid(e) if e == "The request hash does not match the request" => {
                refuse("invalid", e)
            }
            Why::Invalid(e) => refuse("invalid", format!("Invalid {m} request: {e}")),
            Why::Code(r) => r,
        }
    }
}

impl FakeCore {
    /// The journal behind the fake core.
    pub fn journal(&self) -> &Journal {
        &self.state.journal
    }

    /// Queues a grant of `turn_start` for run `run_id` with run token `token`; returns the
    /// `RunGrant` sent.
    pub fn grant_turn(&self, run_id: &str, token: &str, turn_start: Value) -> Value {
        let cp = &turn_start["checkpoint"];
        let run = json!({
            "runId": run_id,
            "sessionId": cp["sessionId"],
            "turnId": cp["turnId"],
            "epoch": 1,
            "token": token,
            "tokenExpiresAt": "2030-01-01T00:00:00.000Z",
        });
        self.journal().start_run(run_id, token, &turn_start);
        self.grant_value(json!({"run": run.clone(), "input": turn_start}));
        run
    }
}
