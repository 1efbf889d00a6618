//! The Harness API wire types (v5), and the pod host's join/renew HTTP bodies.
//!
//! Owns: frames (`req`/`res`/`msg`/`abort`/`ping`), error codes, method names, and the params
//! and results of every method the pod host sends or serves today, plus the token newtypes that
//! keep secrets out of logs.
//!
//! Invariants:
//! * What podhost sends, and the frames and requests core sends it, are strict (v5 §11: "v5's
//!   schemas are strict"): unknown fields refused, optional fields omitted, never `null`.
//! * Core's answers (`hello`, `lease`, `lease.renew`) accept and ignore fields podhost does not
//!   know ([`parse_answer`](super::channel::parse_answer) logs each once): v5 is frozen, so
//!   this is defence — a core that adds a field must not stop every lease. The fields podhost
//!   uses are checked (`check`).
//! * A token's `Debug` and `Display` print `[redacted]`; only [`Secret::expose`] gives its value,
//!   and only the code that puts it on the wire calls it.
//!
//! Non-goals: the turn's own types (`TurnStart`, effects, transcript, outputs). `lease` hands the
//! turn's input through as a `serde_json::Value` for the turn code to type.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::floor::secret::Secret;

/// The message version said in `hello` (v5 §11).
pub const HARNESS_API_VERSION: u32 = 5;
/// The transport version: the upgrade header's value (v5 §11).
pub const TRANSPORT_VERSION: &str = "1";
/// The upgrade header naming the transport version.
pub const API_HEADER: &str = "Nylorun-Harness-Api";
/// The Harness API path on core's listener.
pub const HARNESS_PATH: &str = "/nylorun/harness/v1";
/// The join and renew paths on the same listener (v5 §9).
pub const JOIN_PATH: &str = "/nylorun/harness/v1/host/join";
pub const RENEW_PATH: &str = "/nylorun/harness/v1/host/renew";
/// The largest frame either end sends or accepts (`HARNESS_MAX_PAYLOAD`, 64 MiB).
pub const MAX_PAYLOAD: usize = 64 * 1024 * 1024;

/// Method names, as they appear in `m`.
pub mod methods {
    pub const HELLO: &str = "hello";
    pub const LEASE: &str = "lease";
    pub const LEASE_RENEW: &str = "lease.renew";
    pub const LEASE_RELEASE: &str = "lease.release";
    pub const EVENT: &str = "event";
    pub const TURN_COMPLETED: &str = "turn.completed";
    pub const TURN_FAILED: &str = "turn.failed";
    pub const TURN_WAITING: &str = "turn.waiting";
    pub const TURN_PAUSED: &str = "turn.paused";
    pub const CHECKPOINT: &str = "checkpoint";
    pub const SESSION_MCP: &str = "session.mcp";
    /// Core → harness one-way message.
    pub const CANCEL: &str = "cancel";
    pub const WORKSPACE_READ: &str = "workspace.read";
    pub const WORKSPACE_WRITE: &str = "workspace.write";
    pub const WORKSPACE_EXEC: &str = "workspace.exec";
    pub const WORKSPACE_REPORT: &str = "workspace.report";
    pub const WORKSPACE_SWEEP: &str = "workspace.sweep";
    pub const WORKSPACE_REMOVE: &str = "workspace.remove";
}

/// One WebSocket text message (`FrameSchema`). Every variant is strict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "lowercase", deny_unknown_fields)]
pub enum Frame {
    /// A request; `id` is the sender's own, from 1 upward.
    Req {
        /// The request id, positive, numbered per sender.
        id: u64,
        /// The method.
        m: String,
        /// The params. A JavaScript sender drops an `undefined` `p`, so a missing one reads as
        /// `null` and each method decides what that means.
        #[serde(default)]
        p: Value,
    },
    /// An answer to the other side's request `id`.
    Res {
        /// The id of the request this answers.
        id: u64,
        /// Whether the request succeeded: `r` when it did, `e` when it did not.
        ok: bool,
        /// The result (`ok: true`). A handler that returned nothing answers `{}`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        r: Option<Value>,
        /// The error (`ok: false`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        e: Option<ErrorBody>,
    },
    /// A one-way message.
    Msg {
        /// The message name (`cancel`).
        m: String,
        /// Its params.
        #[serde(default)]
        p: Value,
    },
    /// The sender no longer wants the answer to its request `id`.
    Abort {
        /// The id of the sender's own request.
        id: u64,
    },
    /// A frame-level ping: valid and ignored (liveness is WebSocket-level).
    Ping {},
}

impl Frame {
    pub fn ok(id: u64, r: Value) -> Frame {
        Frame::Res {
            id,
            ok: true,
            r: Some(r),
            e: None,
        }
    }

    pub fn err(id: u64, code: ErrorCode, message: impl Into<String>) -> Frame {
        Frame::Res {
            id,
            ok: false,
            r: None,
            e: Some(ErrorBody {
                code,
                message: message.into(),
            }),
        }
    }

    /// The frame's own consistency beyond its schema: a positive id, and a `res` carrying `r`
    /// exactly when `ok` and `e` exactly when not.
    pub fn check(&self) -> Result<(), CheckError> {
        match self {
            Frame::Req { id: 0, .. } | Frame::Res { id: 0, .. } | Frame::Abort { id: 0 } => {
                Err(CheckError::ZeroId)
            }
            Frame::Res {
                ok: true,
                e: Some(_),
                ..
            } => Err(CheckError::OkWithE),
            Frame::Res {
                ok: false, e: None, ..
            } => Err(CheckError::FailedWithoutE),
            Frame::Res {
                ok: false,
                r: Some(_),
                ..
            } => Err(CheckError::FailedWithR),
            _ => Ok(()),
        }
    }
}

/// Why a frame or an answer that fits its schema still cannot be used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error("id must be a positive integer")]
    ZeroId,
    #[error("a successful answer carries no e")]
    OkWithE,
    #[error("a failed answer needs e")]
    FailedWithoutE,
    #[error("a failed answer carries no r")]
    FailedWithR,
    #[error("hello's tenantId is empty")]
    NoTenant,
    #[error("hello's renewEveryMs is 0")]
    NoRenewal,
    /// A run id the grant must carry (`runId`, `sessionId`, `turnId`) is empty.
    #[error("the grant's {0} is empty")]
    EmptyGrantId(&'static str),
}

/// `{code, message}` of a failed answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// One of `HARNESS_ERROR_CODES`.
    pub code: ErrorCode,
    /// Text for a person; never a token.
    pub message: String,
}

/// `HARNESS_ERROR_CODES` (v5 §1), a closed set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    RunNotHeld,
    TurnCancelled,
    OwnershipLost,
    EffectDrift,
    Invalid,
    Unavailable,
    Internal,
    NotFound,
    LimitExceeded,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::RunNotHeld => "run_not_held",
            ErrorCode::TurnCancelled => "turn_cancelled",
            ErrorCode::OwnershipLost => "ownership_lost",
            ErrorCode::EffectDrift => "effect_drift",
            ErrorCode::Invalid => "invalid",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::NotFound => "not_found",
            ErrorCode::LimitExceeded => "limit_exceeded",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The host token: the WebSocket bearer and the renew bearer (JWT `nylorun-host+jwt`).
pub type HostToken = Secret;
/// The join token read from `NYLORUN_SANDBOX_JOIN_FILE`.
pub type JoinToken = Secret;
/// The egress proxy password (JWT `nylorun-egress+jwt`).
pub type EgressToken = Secret;
/// A run's gate token (JWT `nylorun-run+jwt`).
pub type RunToken = Secret;

/// `hello` params.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HelloParams {
    /// The message version: 5.
    pub api: u32,
    /// The harness id (`^[a-z][a-z0-9-]{1,62}$`), the one the credential is for.
    pub name: String,
    /// This harness's own version, for core's records.
    pub version: String,
    /// What this harness serves beyond runs.
    pub features: Features,
}

/// `hello.features`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Features {
    /// Serves `workspace.*` requests (v5 §10).
    pub workspace: bool,
}

/// `hello` result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HelloAnswer {
    /// The message version core speaks: 5.
    pub api: u32,
    /// The Tenant this connection works for; workspace keys start `nylorun-<tenantId>-`.
    pub tenant_id: String,
    /// The sandbox backend core chose for this harness (`null` for a pod's host).
    pub sandbox: SandboxInfo,
    /// How often to `lease.renew` each held run.
    pub renew_every_ms: u64,
}

impl HelloAnswer {
    /// The fields podhost relies on: the Tenant (workspace keys) and a renewal interval.
    pub fn check(&self) -> Result<(), CheckError> {
        if self.tenant_id.is_empty() {
            return Err(CheckError::NoTenant);
        }
        if self.renew_every_ms == 0 {
            return Err(CheckError::NoRenewal);
        }
        Ok(())
    }
}

/// `hello` result's `sandbox`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    /// The backend name, or `null`.
    pub backend: Option<String>,
}

/// `lease` params: `{}` (v2 allowed `slots`; v5 shows none and the reference sends `{}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseParams {}

/// `lease` result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseAnswer {
    /// The granted run.
    pub run: RunGrant,
    /// The `TurnStart`; typed by the turn code.
    pub input: Value,
}

/// `RunGrant` (v5 §2).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunGrant {
    /// Core's id of the run; every run request names it.
    pub run_id: String,
    pub session_id: String,
    pub turn_id: String,
    /// The session's ownership epoch.
    pub epoch: i64,
    /// The run token for the gates. v5 always sends it; optional here (as in v2) so that a grant
    /// without one can still be released rather than dropped as malformed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<RunToken>,
    /// When `token` expires (ISO 8601).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expires_at: Option<String>,
}

impl RunGrant {
    /// The ids every request of the run names: none may be empty.
    pub fn check(&self) -> Result<(), CheckError> {
        for (name, v) in [
            ("runId", &self.run_id),
            ("sessionId", &self.session_id),
            ("turnId", &self.turn_id),
        ] {
            if v.is_empty() {
                return Err(CheckError::EmptyGrantId(name));
            }
        }
        Ok(())
    }
}

/// `turn.start.limits` (`HarnessLimitsSchema`, v5 §3): the Tenant's Runtime limits a harness
/// must keep within, as the segment started. Parsed leniently: a limit podhost does not know is
/// dropped, and a missing one takes the spec's default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TurnLimits {
    /// One record entry as JSON: an `effect.outcome` value, a transcript update, a claimed
    /// event (default 960 KiB, its ceiling).
    pub record_entry_bytes: u64,
    /// A Model Gate call's body (default 32 MiB).
    pub model_call_bytes: u64,
    /// One file the Model Gate sends a model (default 8 MiB).
    pub model_file_bytes: u64,
    /// An MCP or HTTP tool's answer the Tool Gate keeps (default 8 MiB).
    pub tool_answer_bytes: u64,
    /// The harness's state as JSON (default 256 KiB).
    pub harness_state_bytes: u64,
    /// One `definition.file` range, `artifact.read` answer or `artifact.write` chunk (default
    /// 16 MiB).
    pub chunk_bytes: u64,
    /// The most files one folder version may hold (default 10,000).
    pub folder_entries: u64,
}

impl Default for TurnLimits {
    fn default() -> Self {
        TurnLimits {
            record_entry_bytes: 960 * 1024,
            model_call_bytes: 32 << 20,
            model_file_bytes: 8 << 20,
            tool_answer_bytes: 8 << 20,
            harness_state_bytes: 256 * 1024,
            chunk_bytes: 16 << 20,
            folder_entries: 10_000,
        }
    }
}

/// `lease.renew` params.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RunRef {
    pub run_id: String,
}

/// `lease.renew` result: `{ok: true, token?, tokenExpiresAt?}` or `{ok: false}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenewAnswer {
    /// False: the run is over; stop it.
    pub ok: bool,
    /// A new run token to switch to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<RunToken>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_expires_at: Option<String>,
}

/// `lease.release` params.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReleaseParams {
    pub run_id: String,
    pub reason: ReleaseReason,
}

/// Why a run is given back without an output (v5 §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseReason {
    #[serde(rename = "shutdown")]
    Shutdown,
    #[serde(rename = "ownership.lost")]
    OwnershipLost,
    #[serde(rename = "connection.lost")]
    ConnectionLost,
}

impl ReleaseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseReason::Shutdown => "shutdown",
            ReleaseReason::OwnershipLost => "ownership.lost",
            ReleaseReason::ConnectionLost => "connection.lost",
        }
    }
}

/// `cancel` message params (v5 §8).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CancelParams {
    pub run_id: String,
    pub reason: CancelReason,
    /// Text for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Why core cancels a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CancelReason {
    /// A person cancelled the turn: report `turn.failed` with status `cancelled`.
    #[serde(rename = "cancel")]
    Cancel,
    /// Core is stopping: `lease.release` with `shutdown`.
    #[serde(rename = "shutdown")]
    Shutdown,
    /// The advance ran past its deadline: report `turn.failed` with status `cancelled`.
    #[serde(rename = "deadline")]
    Deadline,
    /// Another owner holds the session: `lease.release` with `ownership.lost`.
    #[serde(rename = "ownership.lost")]
    OwnershipLost,
}

/// The session a workspace request acts for (v2 `WorkspaceSession`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkspaceSession {
    /// The session that owns the sandbox (`routing.sandbox.ownerId`).
    pub owner_id: String,
    /// The sandbox resource, when the session uses one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// The Agent whose sandbox it is (v5 `routing.sandbox.environmentId`; absent in v2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment_id: Option<String>,
    /// The turn in progress, or `null`. v2 requires the key; accepted missing as `null`.
    #[serde(default)]
    pub active_turn_id: Option<String>,
}

/// A sandbox tool call core forwards (`WorkspaceCall`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkspaceCall {
    pub session: WorkspaceSession,
    /// The session's sandbox spec; a pod serves its own pod and reads only `image` from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
    /// `bash`, `read`, `write`, `edit`, `grep` or `glob`.
    pub tool: crate::tools::ToolName,
    /// The tool's input, checked by the tool.
    pub input: Value,
}

/// A byte read (`WorkspaceBytesCall`): core's `save_artifact` and the outputs export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkspaceBytesCall {
    pub session: WorkspaceSession,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
    pub bytes: BytesRequest,
}

/// `bytes` of a [`WorkspaceBytesCall`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BytesRequest {
    /// The file, by the tools' path rules.
    pub path: String,
    /// The most bytes the file may hold; a larger file is a `sandbox.too_large` failure.
    pub max_bytes: u64,
}

/// A directory listing (`WorkspaceListCall`): the outputs export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkspaceListCall {
    pub session: WorkspaceSession,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
    pub list: ListRequest,
}

/// `list` of a [`WorkspaceListCall`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListRequest {
    pub dir: String,
    /// The most entries to return; past it the listing is `truncated`.
    pub max_entries: u64,
}

/// `workspace.report` params: `{}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportParams {}

/// `workspace.sweep` params.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepParams {
    /// Core's clock, ms since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub now: Option<f64>,
}

/// `workspace.remove` params.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RemoveParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_ids: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<bool>,
}

/// A workspace as core records it (`WorkspaceRecord`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkspaceRecord {
    /// `nylorun-<tenantId>-…`.
    pub key: String,
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    pub backend: String,
    pub image: String,
    /// `creating`, `running` or `stopped`.
    pub state: String,
    /// ISO 8601.
    pub created_at: String,
    pub updated_at: String,
}

/// `session.mcp` params (v5 §3): what a run's discovery listed. The snapshot's inside is not
/// pinned by v5 (`McpSnapshotSchema` v2); podhost's guess lives in `turn::toolgate::wire`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SessionMcpParams {
    pub run_id: String,
    /// The servers that connected and what they listed; absent when none did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Value>,
    /// One entry per server that could not be connected or listed.
    pub diagnostics: Vec<Value>,
}

/// `session.mcp` result: `{mcp?}`, the facts this turn runs with (the first snapshot the
/// session recorded wins, so another owner's may come back).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionMcpAnswer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpFacts>,
}

/// `McpFactsSchema` (v5 §3): the session's MCP discovery as a turn sees it — facts, not tools.
/// Read leniently (unknown fields ignored), as the TurnStart that carries it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct McpFacts {
    /// Each server of the agent tree that connected.
    #[serde(default)]
    pub servers: Vec<McpServerFacts>,
}

/// One server of [`McpFacts`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpServerFacts {
    /// The agent used as a tool that declares it; absent for the root agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The server's name in the manifest.
    pub name: String,
    /// The server's own instructions, scrubbed and uncut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Vec<McpToolFacts>,
}

/// One tool of a server, as the server listed it, plus the manifest's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct McpToolFacts {
    /// Its raw name on the server, which it is called by.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default = "empty_object_schema")]
    pub input_schema: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Value>,
    /// False when the turn's manifest disables it: skip it (core refuses it as
    /// `tool.disabled`). Missing reads as enabled.
    #[serde(default = "enabled_default")]
    pub enabled: bool,
    /// The manifest's deferral setting, a hint; absent, podhost decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deferred: Option<bool>,
}

fn empty_object_schema() -> Value {
    serde_json::json!({"type": "object"})
}

fn enabled_default() -> bool {
    true
}

/// `POST /nylorun/harness/v1/host/join` body (`HostJoinRequestSchema`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostJoinRequest {
    pub sandbox_id: String,
    pub pod_uid: String,
    /// Read afresh from the join file at each join.
    pub join_token: JoinToken,
    /// The volume's id (`<harness root>/volume-id`), so a volume recreated empty is told apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
}

/// The join and renew answer (`HostJoinAnswerSchema`). Read leniently: unknown fields are
/// ignored, because v5 does not give the whole shape (its `setup` is described in words only).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostJoinAnswer {
    pub host_token: HostToken,
    pub egress_token: EgressToken,
    pub sandbox_id: String,
    /// Bumped by each join; core closes connections of older epochs.
    pub epoch: i64,
    /// When the host token expires (ISO 8601).
    pub expires_at: String,
    /// The egress proxy's CA (PEM), added to every command's trust bundle.
    pub ca_certificate: String,
    /// The Agent's setup, on a new disk (v5 §9 item 2; shape assumed, see [`Setup`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<Setup>,
    /// The disk starts from a disk version: no setup to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seeded: Option<bool>,
}

/// The Agent's setup as a join carries it. v5 says only "its input files and setup commands";
/// this shape is an assumption, read leniently: `{files?: [{path, base64? | content? | url?,
/// sha256?, mode?}], commands?: [string | {command, timeout?}]}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Setup {
    #[serde(default)]
    pub files: Vec<SetupFile>,
    #[serde(default)]
    pub commands: Vec<SetupCommand>,
}

/// One input file of the setup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SetupFile {
    /// By the write tool's path rules (relative paths under the workspace).
    pub path: String,
    /// The bytes, base64 (wins over `content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
    /// The text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Where to fetch the bytes from when neither `base64` nor `content` carries them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The bytes' SHA-256 (hex, optionally `sha256:`-prefixed), checked before the file is
    /// written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Permission bits: a number (`420`) or an octal string (`"0644"`, `"755"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Value>,
}

/// One setup command: a command line, or `{command, timeout?}` (seconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SetupCommand {
    Line(String),
    Full {
        command: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout: Option<u64>,
    },
}

/// A host/join or host/renew refusal body: `{error: {code, message}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostErrorBody {
    pub error: HostError,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostError {
    pub code: String,
    pub message: String,
}

#[cfg(test)]
mod tests {
    #[test]
    fn limits_take_defaults_and_drop_unknown_ones() {
        let l: super::TurnLimits =
            serde_json::from_value(serde_json::json!({"chunkBytes": 1024, "futureLimit": 7}))
                .unwrap();
        assert_eq!(
            l,
            super::TurnLimits {
                chunk_bytes: 1024,
                ..super::TurnLimits::default()
            }
        );
    }

    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn frames_round_trip_and_refuse_unknown_fields() {
        let req: Frame =
            serde_json::from_value(json!({"t":"req","id":1,"m":"lease","p":{}})).unwrap();
        assert_eq!(
            req,
            Frame::Req {
                id: 1,
                m: "lease".into(),
                p: json!({})
            }
        );
        let err = Frame::err(3, ErrorCode::Invalid, "x");
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            json!({"t":"res","id":3,"ok":false,"e":{"code":"invalid","message":"x"}})
        );
        assert_eq!(
            serde_json::to_value(Frame::Ping {}).unwrap(),
            json!({"t":"ping"})
        );
        assert!(
            serde_json::from_value::<Frame>(json!({"t":"req","id":1,"m":"x","p":{},"extra":1}))
                .is_err()
        );
        assert!(serde_json::from_value::<Frame>(json!({"t":"ping","x":1})).is_err());
        assert!(serde_json::from_value::<Frame>(json!({"t":"nope"})).is_err());
        let bad: Frame =
            serde_json::from_value(json!({"t":"res","id":1,"ok":false,"r":{}})).unwrap();
        assert!(bad.check().is_err());
        let zero: Frame = serde_json::from_value(json!({"t":"abort","id":0})).unwrap();
        assert!(zero.check().is_err());
    }

    #[test]
    fn core_answers_ignore_unknown_fields_and_check_what_podhost_uses() {
        let grant: LeaseAnswer = serde_json::from_value(json!({
            "run": {"runId": "r", "sessionId": "s", "turnId": "t", "epoch": 1, "token": "x",
                    "priority": "high"},
            "input": {}, "offeredAt": 5,
        }))
        .unwrap();
        assert_eq!(grant.run.check(), Ok(()));
        let empty: RunGrant = serde_json::from_value(
            json!({"runId": "", "sessionId": "s", "turnId": "t", "epoch": 1}),
        )
        .unwrap();
        assert_eq!(
            empty.check().map_err(|e| e.to_string()),
            Err("the grant's runId is empty".to_owned())
        );
        let hello: HelloAnswer = serde_json::from_value(json!({
            "api": 5, "tenantId": "tn", "sandbox": {"backend": null, "region": "x"},
            "renewEveryMs": 0, "motd": "hi",
        }))
        .unwrap();
        assert_eq!(
            hello.check().map_err(|e| e.to_string()),
            Err("hello's renewEveryMs is 0".to_owned())
        );
        let renew: RenewAnswer =
            serde_json::from_value(json!({"ok": false, "reason": "settled"})).unwrap();
        assert!(!renew.ok);
    }

    #[test]
    fn secrets_never_print() {
        let g = RunGrant {
            run_id: "r".into(),
            session_id: "s".into(),
            turn_id: "t".into(),
            epoch: 1,
            token: Some(Secret::new("eyJsecret")),
            token_expires_at: None,
        };
        let dbg = format!("{g:?}");
        assert!(!dbg.contains("eyJsecret"), "{dbg}");
        assert!(dbg.contains("[redacted]"));
        assert_eq!(serde_json::to_value(&g).unwrap()["token"], "eyJsecret");
    }

    #[test]
    fn setup_is_read_leniently() {
        let a: HostJoinAnswer = serde_json::from_value(json!({
            "hostToken":"h","egressToken":"e","sandboxId":"s","epoch":2,
            "expiresAt":"2026-01-01T00:00:00Z","caCertificate":"PEM","later":1,
            "setup":{"files":[{"path":"a","content":"x","mode":"0755"}],
                     "commands":["make", {"command":"npm i","timeout":300}]}
        }))
        .unwrap();
        let setup = a.setup.unwrap();
        assert_eq!(setup.files[0].mode, Some(json!("0755")));
        assert_eq!(
            setup.commands,
            vec![
                SetupCommand::Line("make".into()),
                SetupCommand::Full {
                    command: "npm i".into(),
                    timeout: Some(300)
                }
            ]
        );
    }
}
