//! The Nylorun pod host (`podhost pod`): everything between a pod and Nylorun core, the turns
//! it runs included.
//!
//! # Four wings
//!
//! * [`link`]: the WebSocket to core — connect, the channel (a reader and a writer task, the
//!   requests in flight each way), the lease slots and the granted runs they hold (renewals,
//!   stop, release), the wire types and the request hash.
//! * [`host`]: the pod's own life — the main task ([`host::pod`], which opens the lease slots),
//!   join and renew, the `workspace.*` server, setup, the loopback health endpoint, the validated
//!   settings.
//! * [`turn`]: one segment of a granted run — its TurnStart, the agent loop with every model and
//!   tool call journaled, the Model Gate, the transcript, instructions, result shaping and spill,
//!   the segment's output.
//! * [`artifacts`]: the run's artifacts — the client, its wire types, the outputs export and the
//!   skills mount.
//!
//! Imports run one way: `host` → `turn` → `artifacts` → `link` (and each wing → the layers below
//! the fronts); `tests/layers.rs` checks it.
//!
//! # Cancellation tree
//!
//! The pod's root token → each connection's token → each run's and each served request's token
//! → each tool call's. Cancelling a tool call's token kills its process group (exec).
//!
//! # Shutdown order
//!
//! Stop leasing (abort the waiting leases) → stop runs → release them → close the connection →
//! cancel everything left (commands are killed) → exit 0, all within the shutdown deadline.

pub mod artifacts;
pub mod host;
pub mod link;
pub mod turn;
