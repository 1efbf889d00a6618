//! The turn wing: one segment of a run, from its TurnStart to its output.
//!
//! * [`run`] drives the agent loop for a granted run, every model and tool call journaled
//!   ([`effects`]); its `output` part ends the segment (`turn.completed`, `turn.failed`,
//!   `turn.waiting`, `checkpoint`) and releases the run.
//! * [`turn_start`] reads what core granted; [`transcript`] builds the prompt and the
//!   transcript's edits; [`instructions`] says what the model reads and may call; [`context`]
//!   is the pod's side of the context budget (units, summaries' text, previews, the pinned
//!   memory index, the prompt's files).
//! * [`outcome`] is a tool call's outcome, typed until it is journaled.
//! * [`gates`] calls the Model Gate; [`shaping`] and [`spill`] fit a tool's result into one
//!   record entry (v5 §5b), storing what does not fit as an artifact.
//! * [`toolgate`] runs MCP and HTTP tools through the Tool Gate (discovery, the catalog, the
//!   client, their results); [`naming`] names them for the model; [`tool_search`] loads the
//!   deferred ones.
//! * [`crate::agent::media`] is the one rule for which files a model is shown.

pub(crate) mod context;
pub mod effects;
pub(crate) mod gates;
pub(crate) mod instructions;
pub mod naming;
pub(crate) mod outcome;
pub mod run;
pub(crate) mod shaping;
pub mod spill;
pub(crate) mod tool_search;
pub mod toolgate;
pub(crate) mod transcript;
pub mod turn_start;
