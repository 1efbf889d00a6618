//! The link wing: the Harness API WebSocket and what crosses it.
//!
//! * [`connect`] opens the WebSocket; [`channel`] is one connection: a reader task, a writer
//!   task, podhost's pending requests and core's requests in flight.
//! * [`lease`] keeps one `lease` waiting per free run slot and holds each granted run (renewals,
//!   stop, release); the turn code plugs in through [`lease::RunHandler`].
//! * [`protocol`] holds the wire types; [`canonical`] the canonical JSON and the request hash
//!   (`testdata/request-hash-vectors.json` is the oracle).
//!
//! Non-goals: what a request means (the host, turn and artifact wings decide).

pub mod canonical;
pub mod channel;
pub(crate) mod connect;
pub mod lease;
pub mod protocol;
