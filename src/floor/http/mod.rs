//! What every HTTP front of podhost stands on (`podhost serve`, `podhost mcp --listen`): one
//! hardened listener.
//!
//! * [`listener`]: the accept loop, header, body and idle timeouts, the connection cap with the
//!   eviction of connections not inside a request, the open-file limit.
//! * [`body`] (private to the listener): request bodies timed and counted against the cap on the
//!   body bytes held across all connections.
//!
//! Invariant: nothing here imports a module of podhost outside the floor (only
//! [`super::metrics`]).
//!
//! Non-goals: routes, what a request means, TLS (put a proxy in front), HTTP/2.

mod body;
pub mod listener;

pub use listener::{HttpLimits, serve};
