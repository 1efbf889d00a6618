//! Every code podhost puts on a wire or returns as an exit status, in one registry.
//!
//! A code is part of the interface: models, core, evaluators and scripts match on it. Add one
//! here, never as a literal where it is used; each group says where it appears.

/// Process exit codes of the `podhost` binary. README.md has the table users read; keep the two
/// in step.
pub mod exit {
    /// The job ran: `podhost run` ended with an answer; `podhost tool` ran its tool (a tool that
    /// ran and failed is still a run).
    pub const OK: i32 = 0;
    /// A fault of podhost itself.
    pub const FAILURE: i32 = 1;
    /// Bad input or configuration (a missing model, a base URL without a scheme, bad JSON):
    /// nothing ran.
    pub const USAGE: i32 = 2;
    /// `podhost run`: the model call failed (after its retries), or the model ended without an
    /// answer.
    pub const MODEL_FAILED: i32 = 3;
    /// `podhost run`: the task used up `--max-steps` model calls without an answer.
    pub const STEP_LIMIT: i32 = 4;
    /// `podhost run`: the agent asked the user a question and there was no terminal to answer it.
    pub const INPUT_REQUIRED: i32 = 5;
    /// Stopped by SIGINT (Ctrl-C): 128 + 2, as shells report it.
    pub const INTERRUPTED: i32 = 130;
    /// Stopped by SIGTERM: 128 + 15, as shells report it.
    pub const TERMINATED: i32 = 143;
}

/// The `sandbox.*` failure codes podhost reports. The first group is Nylorun's own (v2 notes §7);
/// the rest name failures that runtime folded into `sandbox.error`.
pub mod sandbox {
    pub const NOT_FOUND: &str = "sandbox.not_found";
    pub const EDIT_NO_MATCH: &str = "sandbox.edit_no_match";
    pub const EDIT_NOT_UNIQUE: &str = "sandbox.edit_not_unique";
    pub const EDIT_NOOP: &str = "sandbox.edit_noop";
    pub const WRITE_FAILED: &str = "sandbox.write_failed";
    pub const GREP_FAILED: &str = "sandbox.grep_failed";
    pub const START_FAILED: &str = "sandbox.start_failed";
    pub const ERROR: &str = "sandbox.error";
    /// The input does not match the tool's schema.
    pub const INVALID_INPUT: &str = "sandbox.invalid_input";
    /// The path leaves the allowed roots, or names a read-only root for a write.
    pub const PATH_DENIED: &str = "sandbox.path_denied";
    /// The file holds NUL bytes (and no UTF-16 byte-order mark).
    pub const BINARY_FILE: &str = "sandbox.binary_file";
    /// A directory (or a device, FIFO, socket) where a regular file was expected.
    pub const NOT_A_FILE: &str = "sandbox.not_a_file";
    /// A file or result past a size limit.
    pub const TOO_LARGE: &str = "sandbox.too_large";
    /// The session's files are past its disk quota: delete files before writing more.
    pub const QUOTA_EXCEEDED: &str = "sandbox.quota_exceeded";
    /// The edit cannot be written back in the file's own encoding without loss.
    pub const ENCODING: &str = "sandbox.encoding";
    /// The call was cancelled before it could finish.
    pub const CANCELLED: &str = "sandbox.cancelled";
    /// The session already runs as many background processes as it may.
    pub const BACKGROUND_LIMIT: &str = "sandbox.background_limit";
}

/// Codes of a tool result the loop or a front gives the model instead of running the call
/// (`ResultOutcome::failed`).
pub mod tool {
    /// The call's arguments are not a JSON object, or do not match the tool's schema.
    pub const INVALID_INPUT: &str = "tool.invalid_input";
    /// The model called a tool it was not offered.
    pub const UNKNOWN: &str = "tool.unknown";
    /// The tool exists but cannot run here (no sandbox, no gate).
    pub const UNAVAILABLE: &str = "tool.unavailable";
    /// A sandbox call was interrupted between `execute` and its outcome: it may or may not have
    /// run (v5 §4).
    pub const UNCERTAIN: &str = "tool.uncertain";
    /// A person denied the call (v5 §5).
    pub const DENIED: &str = "tool.denied";
    /// The call's outcome does not fit its record entry even as a preview (v5 §5b).
    pub const RESULT_TOO_LARGE: &str = "tool.result-too-large";
}

/// Codes of an MCP or HTTP tool's outcome that the tool, its server or the Tool Gate gave
/// (v5 §5, §5b); the gate's own codes (`mcp.too-large`, `http.too-large`, …) pass through as it
/// sent them.
pub mod gate {
    /// The MCP tool answered `isError: true`.
    pub const MCP_TOOL_ERROR: &str = "mcp.tool_error";
    /// The gate answered `{ok: false}` for an MCP call without a code of its own.
    pub const MCP_ERROR: &str = "mcp.error";
    /// The same for an HTTP call.
    pub const HTTP_ERROR: &str = "http.error";
    /// The answer was past `limits.toolAnswerBytes` (the gate's code, or podhost's bound).
    pub const MCP_TOO_LARGE: &str = "mcp.too-large";
    pub const HTTP_TOO_LARGE: &str = "http.too-large";
    /// The gate refused the call before running it (`key_required`, `effect_not_journaled`, …).
    pub const REFUSED: &str = "tool.gate_refused";
}

/// Codes of a failed model call (`ModelFailure::code`, the Model Gate's `kind`s, v2 notes §4.3),
/// and of a turn ended by one (`model.<code>`).
pub mod model {
    /// The prefix of a turn failure caused by a model call: `model.<failure code>`.
    pub const TURN_PREFIX: &str = "model.";
    pub const AUTH: &str = "auth";
    pub const TRANSIENT: &str = "transient";
    pub const RATE_LIMITED: &str = "rate_limited";
    pub const INVALID_REQUEST: &str = "invalid_request";
    pub const INVALID_OUTPUT: &str = "invalid_output";
    /// The prompt is past the model's context window (the Model Gate's code; an
    /// OpenAI-compatible server's `context_length_exceeded` becomes it).
    pub const CONTEXT_OVERFLOW: &str = "context_overflow";
    /// The model or its API does not read a file's kind (the Model Gate's refusal).
    pub const UNSUPPORTED_INPUT: &str = "unsupported_input";
    /// The call was cancelled (the turn is being stopped).
    pub const CANCELLED: &str = "cancelled";
    /// Any other failure of an OpenAI-compatible server.
    pub const FAILED: &str = "failed";
    /// A turn failure: the model call is past `limits.modelCallBytes`.
    pub const CALL_TOO_LARGE: &str = "model.call_too_large";
    /// A turn failure: the model's answer is past the record entry limit.
    pub const ANSWER_TOO_LARGE: &str = "model.answer_too_large";
}

/// Codes of a Nylorun turn that cannot run at all (`turn.failed` before any effect).
pub mod turn {
    pub const START_UNSUPPORTED: &str = "turn_start.unsupported";
    pub const START_INVALID: &str = "turn_start.invalid";
}
