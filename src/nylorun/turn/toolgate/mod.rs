//! MCP and HTTP tools through the Tool Gate (v5 §3 `mcp`, §4 targets, §5, §5b).
//!
//! * [`wire`]: every shape v5 does not pin (connect and list answers, the snapshot, the
//!   `http-calls` body, the manifest's servers and tools) — the one place to change when the
//!   real schema is known.
//! * [`client`]: the Tool Gate's routes, with the run token, the effect id as
//!   `Idempotency-Key` and `traceparent`; every answer sorted into a reply.
//! * [`discovery`]: `mcp/connect`, `mcp/list`, `mcp/close`, then `session.mcp`.
//! * [`catalog`]: the facts and the manifest made into the tools a turn offers, named
//!   ([`crate::nylorun::turn::naming`]) and split into loaded and deferred.
//! * [`results`]: a gate answer made into the outcome the model reads, within the step's budget,
//!   binary parts stored as artifacts.
//!
//! The call itself — intent, send, lost hops, cancel, outcome — is the turn's
//! (`turn::run`'s `gate_calls`), since it is one effect of the loop.
//!
//! Invariants: nothing is sent to the gate before core answered its intent `execute`; every
//! call carries its effect id as `Idempotency-Key`, so a re-send joins the first.
//!
//! Crash boundaries: [`boundary_after_intent`] and [`boundary_after_answer`] mark the two points
//! where a crash leaves a call in a state the journal alone cannot tell (each a failpoint,
//! `crate::failpoints::POD_TOOL_GATE`).

pub mod catalog;
pub mod client;
pub mod discovery;
pub mod results;
pub mod wire;

/// Crash boundary (failpoint `pod.toolgate_after_intent`): after the intent was answered
/// `execute`, before `tool-calls` / `http-calls`. A crash here leaves the intent journaled
/// `invoking` and nothing sent; the next owner's intent is answered `execute` again (a re-send)
/// and sends the call.
#[inline]
pub fn boundary_after_intent(effect_id: &str) {
    tracing::trace!(%effect_id, "crash boundary: after the intent, before the gate call");
    crate::failpoint!("pod.toolgate_after_intent");
}

/// Crash boundary (failpoint `pod.toolgate_after_answer`): after the gate answered, before
/// `effect.outcome`. A crash here leaves the call run at the gate with no outcome recorded; the
/// next owner rejoins it under the same key and gets the same bytes, running nothing twice.
#[inline]
pub fn boundary_after_answer(effect_id: &str) {
    tracing::trace!(%effect_id, "crash boundary: after the gate answered, before the outcome");
    crate::failpoint!("pod.toolgate_after_answer");
}
