//! Integration tests of local use — `podhost run`, `podhost tool`, `podhost mcp` — against the
//! real binary, a scripted OpenAI-compatible model server, and the real MCP clients and JSON
//! Schema validator `.ci/test-clients` installs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/openai_fake.rs"]
mod openai_fake;
#[path = "../support/mod.rs"]
mod support;

mod harness;

mod background;
mod environment;
mod events;
mod exits;
mod mcp;
mod mcp_snippets;
mod oneshot;
mod run;
mod signals;
mod stream;
