//! Integration tests of the six tools and `podhost tool`, one module per area.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/mod.rs"]
mod support;

mod background;
mod bash;
mod cli;
mod cli_pipe;
mod files;
mod search;
