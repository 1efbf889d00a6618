//! Chat with an OpenAI-compatible model: what `podhost serve` and `podhost run` share.
//!
//! * [`message`]: chat messages in the OpenAI format, the model endpoint, the API key.
//! * [`client`]: the model client (`POST {base_url}/chat/completions`, streamed or not, retries
//!   with backoff); [`stream`]: server-sent events folded into one completion.
//! * [`session`]: a chat session's side of the agent loop — the transcript, the six tools and
//!   `ask_user` — behind a [`session::Front`] that keeps or prints each message.
//! * [`context`]: what the model is sent of a session (its compacted view, files it can read).
//! * [`listing`]: what a server's model listing says of a model's window and inputs.
//!
//! Imports run one way: `session` → `listing` → `client` → `stream` → `message`, and
//! `session` → `context` → `message`.
//!
//! Non-goals: storage, statuses and routes (the BYOH front), the terminal (the local front).

pub(crate) mod client;
pub mod context;
pub(crate) mod listing;
pub(crate) mod message;
pub mod session;
pub(crate) mod stream;
