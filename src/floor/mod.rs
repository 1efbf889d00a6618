//! The floor: what every layer above stands on and that imports nothing of podhost's own.
//!
//! * [`workspace`]: the allowed roots, the mapping between the paths the model and core name and
//!   host paths, resolution that refuses escapes, and opens that follow no symlink.
//! * [`codes`]: every code podhost puts on a wire or returns as an exit status.
//! * [`locks`]: per-file locks, so that concurrent writes and edits of one file all land.
//! * [`backoff`]: jittered exponential backoff for retries and reconnects.
//! * [`secret`]: a credential that prints as `[redacted]`.
//! * [`text`]: making arbitrary bytes into bounded, valid text (middle truncation, clipping).
//! * [`tls`]: the one TLS client configuration of every outgoing connection.
//! * [`metrics`]: the Prometheus metrics every layer records, and their text.
//! * [`http`]: what every HTTP front stands on: the hardened listener, the guard against forged
//!   browser requests, the bearer credential.
//!
//! Invariant: nothing here imports a module of podhost (`exec` and `tools` both build on it); a
//! test in `tests/layers.rs` checks it.

pub(crate) mod backoff;
pub mod codes;
pub mod http;
pub(crate) mod locks;
pub mod metrics;
pub(crate) mod secret;
pub mod text;
pub mod tls;
pub mod workspace;
