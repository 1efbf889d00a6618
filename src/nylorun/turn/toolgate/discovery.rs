//! MCP discovery (v5 §3 `mcp`): a turn whose TurnStart has no `mcp` facts connects and lists
//! each MCP server the manifest declares through the Tool Gate, records what they listed with
//! `session.mcp`, and runs with the facts core answers.
//!
//! Owns: the order of requests — for each server, concurrently: `mcp/connect`, `mcp/list` page
//! by page, `mcp/close`; then one `session.mcp {runId, snapshot?, diagnostics}` — and the
//! snapshot and diagnostics ([`super::wire`] has their shapes).
//!
//! Invariants:
//! * Servers are named `{serverName}` (the root agent's), never by URL.
//! * A server that fails to connect or list is a diagnostic; its tools are absent and the turn
//!   goes on. With no server connected, `session.mcp` carries diagnostics only (no snapshot), so
//!   a later turn discovers again.
//! * The facts core answers win over what this run listed (the first snapshot recorded wins):
//!   podhost offers tools from the answer only.
//! * Bounded: each answer is read within `toolAnswerBytes` (plus the envelope), at most
//!   [`MAX_PAGES`] pages a server; a run's stop ends discovery at once.
//!
//! Non-goals: reconnecting in later turns (the facts are recorded; the gate connects for calls
//! itself), servers of agents used as tools.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::client::{GateReply, ToolGate, answer_bound};
use super::wire::{
    ServerRef, SnapshotServer, connected_instructions, diagnostic, list_page, routes, snapshot,
};
use crate::nylorun::link::channel::{CallError, Channel};
use crate::nylorun::link::protocol::{
    ErrorCode, McpFacts, RunToken, SessionMcpAnswer, SessionMcpParams, methods,
};

/// The most `tools/list` pages read from one server.
pub const MAX_PAGES: usize = 100;
/// What core answers `session.mcp` within.
const SESSION_MCP_TIMEOUT: Duration = Duration::from_secs(60);

/// Why discovery did not give facts to run with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    /// The run stopped (its token fired, the connection closed, core cancelled the turn).
    #[error("the run stopped")]
    Stopped,
    /// The gate says the run is over (`409 run_stale`).
    #[error("the Tool Gate says the run is over (run_stale)")]
    RunStale,
    /// Core refused `session.mcp` or answered what podhost cannot use.
    #[error("core's session.mcp: {0}")]
    Core(String),
}

/// What one run needs for discovery.
pub struct DiscoveryRun<'a> {
    pub gate: &'a ToolGate,
    pub token: Option<RunToken>,
    pub channel: &'a Channel,
    pub run_id: &'a str,
    pub manifest_hash: &'a str,
    pub tool_answer_bytes: u64,
    pub cancel: &'a CancellationToken,
}

/// One server's discovery: what it said, or a diagnostic.
enum Found {
    Server(SnapshotServer),
    Diagnostic(Value),
}

/// Discovers `servers` and records them; returns the facts to run with (`None`: core answered
/// none, so no MCP tools).
pub async fn discover(
    run: &DiscoveryRun<'_>,
    servers: &[String],
) -> Result<Option<McpFacts>, DiscoveryError> {
    let found = join_all(servers.iter().map(|name| one_server(run, name))).await;
    let mut connected = Vec::new();
    let mut diagnostics = Vec::new();
    for f in found {
        match f? {
            Found::Server(s) => connected.push(s),
            Found::Diagnostic(d) => diagnostics.push(d),
        }
    }
    tracing::info!(
        run_id = %run.run_id,
        connected = connected.len(),
        failed = diagnostics.len(),
        tools = connected.iter().map(|s| s.tools.len()).sum::<usize>(),
        "MCP servers discovered"
    );
    let params = SessionMcpParams {
        run_id: run.run_id.to_owned(),
        snapshot: (!connected.is_empty()).then(|| snapshot(run.manifest_hash, &connected)),
        diagnostics,
    };
    let params = serde_json::to_value(&params)
        .map_err(|e| DiscoveryError::Core(format!("could not encode session.mcp: {e}")))?;
    let answer = tokio::select! {
        r = tokio::time::timeout(SESSION_MCP_TIMEOUT, async {
            let mut call = run.channel.call(methods::SESSION_MCP, params).await?;
            call.response().await
        }) => r,
        _ = run.cancel.cancelled() => return Err(DiscoveryError::Stopped),
    };
    let value = match answer {
        Err(_) => {
            return Err(DiscoveryError::Core(format!(
                "no answer within {} s",
                SESSION_MCP_TIMEOUT.as_secs()
            )));
        }
        Ok(Err(CallError::Closed { .. }))
        | Ok(Err(CallError::Remote {
            code: ErrorCode::TurnCancelled | ErrorCode::RunNotHeld | ErrorCode::OwnershipLost,
            ..
        })) => return Err(DiscoveryError::Stopped),
        Ok(Err(e)) => return Err(DiscoveryError::Core(e.to_string())),
        Ok(Ok(v)) => v,
    };
    let answer: SessionMcpAnswer = serde_json::from_value(value)
        .map_err(|e| DiscoveryError::Core(format!("its answer is not {{mcp?}}: {e}")))?;
    Ok(answer.mcp)
}

async fn one_server(run: &DiscoveryRun<'_>, name: &str) -> Result<Found, DiscoveryError> {
    let server = ServerRef {
        agent_id: None,
        server_name: name.to_owned(),
    };
    let bound = answer_bound(run.tool_answer_bytes);
    let ask = |route: &'static [&'static str], cursor: Option<String>| {
        ask_gate(run, &server, route, cursor, bound)
    };
    let fail = |stage: &str, reply: GateReply| not_found(run, &server, stage, reply);
    let initialize = match ask(&routes::CONNECT, None).await? {
        GateReply::Ok(result) => result,
        other => return fail("connect", other),
    };
    let mut tools = Vec::new();
    let mut cursor = None;
    for page in 0.. {
        if page == MAX_PAGES {
            close(run, &server, bound).await;
            return fail(
                "list",
                GateReply::Failed {
                    code: "invalid".to_owned(),
                    message: format!("the server lists more than {MAX_PAGES} pages of tools"),
                },
            );
        }
        let result = match ask(&routes::LIST, cursor.take()).await? {
            GateReply::Ok(result) => result,
            other => {
                close(run, &server, bound).await;
                return fail("list", other);
            }
        };
        match list_page(&result) {
            Ok((page_tools, next)) => {
                tools.extend(page_tools);
                match next {
                    Some(n) => cursor = Some(n),
                    None => break,
                }
            }
            Err(why) => {
                close(run, &server, bound).await;
                return fail(
                    "list",
                    GateReply::Failed {
                        code: "invalid".to_owned(),
                        message: why.to_string(),
                    },
                );
            }
        }
    }
    close(run, &server, bound).await;
    tracing::info!(
        run_id = %run.run_id,
        server = %name,
        tools = tools.len(),
        instructions = connected_instructions(&initialize).map_or(0, |i| i.len()),
        "MCP server listed"
    );
    Ok(Found::Server(SnapshotServer {
        server,
        initialize,
        tools,
    }))
}

/// One discovery request to the gate for `server`; the run stopping ends the discovery.
async fn ask_gate(
    run: &DiscoveryRun<'_>,
    server: &ServerRef,
    route: &'static [&'static str],
    cursor: Option<String>,
    bound: u64,
) -> Result<GateReply, DiscoveryError> {
    run.gate
        .discovery(
            run.token.as_ref(),
            route,
            server,
            cursor.as_deref(),
            bound,
            run.cancel,
        )
        .await
        .ok_or(DiscoveryError::Stopped)
}

/// What a server that could not be discovered leaves: a diagnostic (`run_stale` ends the run).
fn not_found(
    run: &DiscoveryRun<'_>,
    server: &ServerRef,
    stage: &str,
    reply: GateReply,
) -> Result<Found, DiscoveryError> {
    let (code, message) = match reply {
        GateReply::RunStale => return Err(DiscoveryError::RunStale),
        GateReply::Failed { code, message } => (code, message),
        GateReply::Refused {
            status,
            code,
            message,
        } => (
            code,
            format!("the Tool Gate refused with {status}: {message}"),
        ),
        GateReply::Lost(why) => ("unavailable".to_owned(), why),
        GateReply::TooLarge { limit } => (
            "mcp.too-large".to_owned(),
            format!("the answer is past {limit} bytes"),
        ),
        GateReply::Ok(_) => (
            "invalid".to_owned(),
            "an answer podhost cannot read".to_owned(),
        ),
    };
    tracing::warn!(run_id = %run.run_id, server = %server.server_name, %stage, %code, %message, "an MCP server could not be discovered");
    Ok(Found::Diagnostic(diagnostic(
        server, stage, &code, &message,
    )))
}

/// `mcp/close`, best effort.
async fn close(run: &DiscoveryRun<'_>, server: &ServerRef, bound: u64) {
    let reply = run
        .gate
        .discovery(
            run.token.as_ref(),
            &routes::CLOSE,
            server,
            None,
            bound,
            run.cancel,
        )
        .await;
    if let Some(r @ (GateReply::Lost(_) | GateReply::Refused { .. } | GateReply::Failed { .. })) =
        reply
    {
        tracing::info!(run_id = %run.run_id, server = %server.server_name, reply = ?r, "mcp/close did not succeed");
    }
}
