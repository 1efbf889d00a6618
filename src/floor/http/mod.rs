//! What every HTTP front of podhost stands on (`podhost serve`, `podhost mcp --listen`): one
//! hardened listener, one guard against requests a browser can be made to send, and one reading
//! of the bearer credential.
//!
//! * [`listener`]: the accept loop, header, body and idle timeouts, the connection cap with the
//!   eviction of connections not inside a request, then of stalled request bodies (never of a
//!   request being handled or a response streaming), the open-file limit.
//! * [`body`] (private to the listener): request bodies timed and counted against the cap on the
//!   body bytes held across all connections.
//! * [`guard`]: refuses a foreign `Host` (without a credential), a foreign `Origin`, and a `POST`
//!   that is not `application/json`, before any route sees the request.
//! * [`auth`]: the `Authorization: Bearer …` credential, its scheme matched without regard to
//!   case.
//!
//! Each front keeps its own error body: the guard and the credential check say why they refuse,
//! and the front words the response.
//!
//! Invariant: nothing here imports a module of podhost outside the floor (only
//! [`super::metrics`]).
//!
//! Non-goals: routes, what a request means, TLS (put a proxy in front), HTTP/2.

pub mod auth;
mod body;
pub mod guard;
pub mod listener;

pub use guard::Guard;
pub use listener::{HttpLimits, serve};
