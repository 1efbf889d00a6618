//! The agent loop, shared by every front.
//!
//! Owns: what a model answers and what a tool call returns to it ([`model`]), the loop that
//! turns answers into tool calls and tool results into the next model call ([`turn`]), the port
//! a front implements to run it ([`host`]), the context budget that keeps each prompt within the
//! model's window ([`context`], run by [`compaction`]), and the rule for which files a model is
//! shown and how ([`media`]).
//!
//! Imports run one way: `turn` → `compaction` → `host` → `context`, `model`.
//!
//! Non-goals: any wire format or storage. A front implements [`host::TurnHost`]: Nylorun journals
//! effects with core and calls the Model Gate; the BYOH endpoint keeps a durable store and calls
//! an OpenAI-compatible model.

pub(crate) mod compaction;
pub(crate) mod context;
pub(crate) mod host;
pub mod media;
pub(crate) mod model;
pub(crate) mod turn;
