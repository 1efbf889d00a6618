//! Integration tests of `podhost serve` (the Oumi BYOH endpoint) and `podhost run`, against the
//! real binary and a scripted OpenAI-compatible model server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/openai_fake.rs"]
mod openai_fake;
#[path = "../support/mod.rs"]
mod support;

mod harness;

mod crash;
mod durability;
mod failures;
mod faults;
mod idempotency;
mod local;
mod routes;
mod turns;
