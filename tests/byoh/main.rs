//! Integration tests of `podhost serve` (the Oumi BYOH endpoint), against the
//! real binary and a scripted OpenAI-compatible model server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/openai_fake.rs"]
mod openai_fake;
#[path = "../support/pg.rs"]
mod pg;
#[path = "../support/prometheus.rs"]
mod prometheus;
#[path = "../support/mod.rs"]
mod support;
#[path = "../support/tls_front.rs"]
mod tls_front;

mod harness;

mod background;
mod browsers;
mod call_ids;
mod context;
mod crash;
mod durability;
mod failures;
mod faults;
mod hardening;
mod idempotency;
mod isolation;
mod metrics;
mod operators;
mod replicas;
mod routes;
mod sandboxes;
mod store_config;
mod store_tls;
mod stress;
mod templates;
mod tls;
mod turns;
mod viewer;
mod viewer_browser;
