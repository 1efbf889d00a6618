//! podhost: a sandboxed agent harness.
//!
//! # Architecture
//!
//! podhost runs an agent's loop — call the model, run tools, report what happened — and executes
//! six workspace tools in a confined workspace. Three fronts share one core:
//!
//! * **Nylorun pod host** (`podhost pod`, [`nylorun`]): joins core, holds the Harness API
//!   WebSocket, leases runs, journals every effect, serves core's `workspace.*` requests.
//! * **Oumi BYOH endpoint** (`podhost serve`, [`byoh`]): four HTTP routes over a durable store,
//!   calling an OpenAI-compatible model, and a read-only session viewer for a browser (`/ui/`).
//! * **Local** (`podhost tool`, `podhost run`, `podhost mcp`, [`local`]): one tool, one agent
//!   task, or the tools served to an MCP client, for the person at the keyboard.
//! * **Probe** (`podhost health`, [`probe`]): asks a running pod host's loopback health endpoint,
//!   for a Kubernetes exec probe.
//!
//! Above the fronts, [`config`] is the command line and the environment: the clap structs, each
//! validated into one front's plain configuration. The binaries use it; no front imports it.
//! `podhost` (`main.rs`) runs `podhost tool` itself and hands every other command, by `exec`,
//! to `podhost-full` (`bin/podhost-full.rs`), the whole program; `podhost-exec` is the command
//! supervisor alone.
//!
//! Below the fronts:
//!
//! * [`chat`] is chat with an OpenAI-compatible model — the messages, the model client (streamed
//!   or not, with retries), and a chat session's side of the agent loop — what `podhost serve`
//!   and `podhost run` share.
//! * [`agent`] is the one loop; it talks to a model port and a journal port and knows nothing of
//!   WebSockets or HTTP.
//! * [`tools`] are functions of (workspace, input) → outcome; a tool that ran and failed returns
//!   an outcome, never `Err`. A toolbox of `serve`, `run` or `mcp` also holds its session's
//!   background processes (`tools::background`), which end with the session.
//! * [`failpoints`]: named crash and fault boundaries, compiled into test builds only; any layer
//!   marks one, and it imports nothing of podhost. (`fuzzing`, also test builds only, holds the
//!   fuzz targets' bodies: like the CLI, it calls into every layer, and nothing calls it.)
//! * [`exec`] is the only place that starts processes (process groups, capture, timeouts, limits,
//!   environment, confinement). All `unsafe` lives there.
//! * [`floor`] is under everything and imports nothing of podhost: workspace paths, codes,
//!   text — and the things several layers or fronts share without importing upward: the one
//!   metrics registry ([`floor::metrics`], where `exec`, `tools`, `chat` and the fronts record
//!   with one-line calls), the one TLS client configuration ([`floor::tls`]), and the one
//!   hardened HTTP listener with its guard against forged browser requests ([`floor::http`]),
//!   which `serve` and `mcp --listen` both stand on.
//!
//! # Layers
//!
//! Each layer imports only from the layers below it: the CLI (the binaries, [`config`]) → the
//! fronts ([`local`], [`nylorun`], [`byoh`]; [`probe`] imports only [`floor`]) → [`chat`] →
//! [`agent`] → [`tools`] → [`exec`] → [`floor`], with [`failpoints`] beside `floor`, importable
//! from every layer. A front never imports another front or the CLI. Inside [`nylorun`] the wings
//! run `host` → `turn` → `artifacts` → `link`. No two units import each other, nor do two files
//! of one front. `tests/layers.rs` checks all of it from the source text.
//!
//! # Who owns what
//!
//! One root cancellation token per process, with a child per connection, run and tool call. Every
//! spawned task is tracked. Shutdown order: stop accepting work → cancel tokens → kill process
//! groups → release leases / flush writers → wait for tasks with a deadline.
//!
//! # Trust boundary
//!
//! Commands run by the tools are untrusted. In a pod and on the BYOH endpoint they get a clean
//! environment (no tokens, no `NYLORUN_*`); in local use they get the user's own, minus every
//! variable that looks like a credential. They start in their own session under a supervisor
//! that kills their whole tree (for `podhost tool bash`, podhost itself, see
//! [`exec::oneshot`]), and never see the host token, join token, run tokens or model
//! API keys.
//! They and the file tools run under Landlock ([`exec::confine`]): the system read-only, their
//! workspace writable, podhost's state and other sessions' workspaces out of reach; podhost
//! itself is non-dumpable, so its memory and environment are closed to them. On a pod or BYOH
//! host each session's commands also run, where the kernel allows, in namespaces of their own
//! with a read-only view of the system ([`exec::session`]), never as root unless asked, without
//! capabilities, and under a cgroup ([`exec::cgroup`]).

pub(crate) mod agent;
pub mod byoh;
pub mod chat;
pub mod config;
pub mod exec;
pub mod failpoints;
pub mod floor;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod local;
pub mod nylorun;
pub mod probe;
pub mod tools;
