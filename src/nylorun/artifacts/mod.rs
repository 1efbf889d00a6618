//! The artifacts wing: a run's handle on its session's artifacts and what is stored through it.
//!
//! * [`client`]: `artifact.read`, `artifact.write` and `definition.file` over the Harness API
//!   (with [`wire`] types, chunked folder uploads and the model's `read_artifact`).
//! * [`export`] saves `/workspace/outputs` as the session's `outputs` folder at a completed
//!   turn's end; [`skills`] mounts the manifest's skills under `/skills`.

pub(crate) mod client;
pub mod export;
pub mod skills;
pub(crate) mod wire;

pub use client::*;
