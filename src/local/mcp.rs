//! `podhost mcp`: the six tools and background processes as a Model Context Protocol server, on
//! stdio or streamable HTTP, for the agents people already use (Claude Code, Codex, Cursor, any
//! MCP client).
//!
//! Owns: the tool list (built from the same `tools/*.json` definitions every front uses, with
//! honest annotations), each call's trip through [`Toolbox::call`] and back as an MCP result,
//! cancellation, and the two transports. The protocol itself is rmcp's (the official Rust SDK).
//!
//! Invariants:
//! * Calls run concurrently, as the client sends them; each `bash` call is its own process tree.
//! * A call the client cancels (`notifications/cancelled`, or a dropped HTTP request) is
//!   cancelled here: its command's whole process tree is killed. A stop (signal, stdin closed)
//!   cancels every call in flight and waits for them, with a deadline, before podhost exits.
//! * A tool that ran and failed is a result with `isError: true` and `code: message` as text,
//!   so the client's model reads it; only a call naming no tool is a JSON-RPC error.
//! * A tool whose definition has an `output_schema` (bash, write, edit) answers an object that
//!   follows it, as `structuredContent` and as the same JSON in a text block.
//! * Over HTTP podhost serves through the floor's hardened listener (the timeouts and caps of
//!   `podhost serve`) behind its guard against forged browser requests: a foreign `Origin` or a
//!   `POST` that is not JSON is refused; with a credential every request needs it (the
//!   `Bearer` scheme in any case); without one, podhost listens on loopback only and refuses a
//!   `Host` that is not a loopback name or the address it listens on (DNS rebinding).
//!
//! Non-goals: resources, prompts, sampling; sessions that outlive the process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{LocalEnv, LocalError, Stop, toolbox, withheld_note};
use crate::exec::ExecSettings;
use crate::floor::codes::exit;
use crate::floor::http::listener::fit_open_files;
use crate::floor::http::{Guard, HttpLimits, auth};
use crate::floor::secret::Secret;
use crate::tools::background::Jobs;
use crate::tools::{CallContext, ToolName, ToolOutcome, Toolbox};

/// How long calls in flight get to end once the server stops.
const DRAIN: Duration = Duration::from_secs(10);

/// `podhost mcp`'s configuration.
#[derive(Clone, Debug)]
pub struct McpConfig {
    pub workspace: PathBuf,
    /// Serve streamable HTTP on this address (`host:port`); `None` for stdio.
    pub listen: Option<String>,
    /// The bearer credential HTTP clients must send.
    pub token: Option<Secret>,
    /// A file holding the credential.
    pub token_file: Option<PathBuf>,
    /// The HTTP listener's timeouts and caps.
    pub http: HttpLimits,
    pub env: LocalEnv,
    pub exec: ExecSettings,
    /// Most background processes a client session runs at once.
    pub max_background: usize,
}

/// What a client is told about each tool: a title and honest hints.
fn annotations(tool: ToolName) -> (&'static str, ToolAnnotations) {
    let hints = |read_only, destructive, idempotent, open_world| {
        ToolAnnotations::new()
            .read_only(read_only)
            .destructive(destructive)
            .idempotent(idempotent)
            .open_world(open_world)
    };
    match tool {
        // A command may do anything the user could, network included.
        ToolName::Bash => ("Run a shell command", hints(false, true, false, true)),
        ToolName::Read => ("Read a file", hints(true, false, true, false)),
        // Overwrites a whole file; the same call twice leaves the same file.
        ToolName::Write => ("Write a file", hints(false, true, true, false)),
        // Replaces text; repeating it does not match again.
        ToolName::Edit => ("Edit a file", hints(false, true, false, false)),
        ToolName::Grep => ("Search file contents", hints(true, false, true, false)),
        ToolName::Glob => ("Find files by name", hints(true, false, true, false)),
        // Each read takes the text it returns: a second read returns only newer text.
        ToolName::BashOutput => (
            "Read a background process's output",
            hints(true, false, false, false),
        ),
        // Stopping a process already stopped changes nothing.
        ToolName::BashKill => ("Stop a background process", hints(false, true, true, false)),
    }
}

/// The tool list: every definition in `tools/`, as MCP tools.
pub fn tool_list() -> Vec<Tool> {
    ToolName::WITH_BACKGROUND
        .iter()
        .map(|&t| {
            let d = t.definition();
            let schema: JsonObject = match &d.input_schema {
                Value::Object(o) => o.clone(),
                _ => JsonObject::new(),
            };
            let (title, hints) = annotations(t);
            let tool = Tool::new(d.name.clone(), d.description.clone(), Arc::new(schema))
                .with_title(title)
                .with_annotations(hints);
            match &d.output_schema {
                Some(Value::Object(o)) => tool.with_raw_output_schema(Arc::new(o.clone())),
                _ => tool,
            }
        })
        .collect()
}

/// The server: one per stdio connection, one per HTTP session (they share the toolbox; each
/// has background processes of its own, see [`Tools::session`]).
#[derive(Clone)]
struct Tools {
    toolbox: Toolbox,
    /// Most background processes of a session.
    max_background: usize,
    /// Every session's background processes, for the wait at the end.
    jobs: TaskTracker,
    tools: Arc<Vec<Tool>>,
    /// Cancelled when the server stops: every call in flight is cancelled.
    root: CancellationToken,
    calls: TaskTracker,
}

/// A tool's outcome as an MCP result: text the client's model reads, and an object output
/// (bash's, write's, edit's) also as `structuredContent`, the value its text holds — what the
/// tool's `outputSchema` describes.
fn result(outcome: ToolOutcome) -> CallToolResult {
    match outcome {
        ToolOutcome::Completed { output } => {
            let (text, structured) = match output {
                Value::String(s) => (s, None),
                object @ Value::Object(_) => (object.to_string(), Some(object)),
                other => (other.to_string(), None),
            };
            let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
            result.structured_content = structured;
            result
        }
        ToolOutcome::Failed { code, message, .. } => {
            CallToolResult::error(vec![ContentBlock::text(format!("{code}: {message}"))])
        }
    }
}

impl Tools {
    /// The server of one client session: the shared toolbox with background processes of the
    /// session's own, killed when the session ends (this server is dropped).
    fn session(&self) -> Tools {
        let jobs = Jobs::tracked(self.max_background, self.jobs.clone());
        Tools {
            toolbox: self.toolbox.clone().with_background(jobs),
            ..self.clone()
        }
    }
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        let root = self.toolbox.workspace().root().display().to_string();
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("podhost", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "podhost's tools work in the workspace {root}: bash runs a command there (each \
                 call its own process tree, killed when the call is cancelled or times out; \
                 with run_in_background it runs on, read with bash_output and stopped with \
                 bash_kill, until this session ends); read, write, edit, grep and glob work on \
                 its files. Relative paths resolve \
                 under the workspace and results name paths relative to it. Commands and file \
                 tools are confined: they may write only the workspace, the temporary directory \
                 and the directories the user allowed."
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = ToolName::offered(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "There is no tool named {:?}. The tools are bash, read, write, edit, grep, \
                     glob, bash_output and bash_kill.",
                    request.name.as_ref()
                ),
                None,
            ));
        };
        let input = Value::Object(request.arguments.unwrap_or_default());
        let cancel = CancellationToken::new();
        // The call is cancelled by the client (its request's token) or by the server stopping.
        let watch = {
            let cancel = cancel.clone();
            let client = context.ct.clone();
            let root = self.root.clone();
            async move {
                tokio::select! {
                    () = client.cancelled() => {}
                    () = root.cancelled() => {}
                }
                cancel.cancel();
                // The call itself ends once its command is killed: wait for it, not here.
                std::future::pending::<std::convert::Infallible>().await
            }
        };
        let ctx = CallContext::new(cancel);
        let call = self
            .calls
            .track_future(self.toolbox.call(tool, &input, &ctx));
        let outcome = tokio::select! {
            outcome = call => outcome,
            never = watch => match never {},
        };
        // A fault of podhost (its supervisor or session could not run the call) is an error of
        // the protocol, never a tool result the client's model would take for the tool's own.
        let outcome = outcome.map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(result(outcome).into())
    }
}

/// `podhost mcp`: serves until the client disconnects (stdio) or a signal stops it.
pub async fn mcp(cfg: McpConfig, stop: Stop) -> Result<i32, LocalError> {
    let token = credential(&cfg)?;
    let (toolbox, withheld) = toolbox(&cfg.workspace, &cfg.exec, &cfg.env)?;
    if let Some(note) = withheld_note(&withheld) {
        eprintln!("podhost mcp: {note}");
    }
    let tools = Tools {
        toolbox,
        max_background: cfg.max_background,
        jobs: TaskTracker::new(),
        tools: Arc::new(tool_list()),
        root: CancellationToken::new(),
        calls: TaskTracker::new(),
    };
    match &cfg.listen {
        None => {
            let session = tools.session();
            let jobs = session.toolbox.background().cloned();
            stdio(session, &stop).await?;
            if let Some(jobs) = jobs {
                jobs.close().await;
            }
        }
        Some(listen) => http(tools.clone(), listen, token, cfg.http, &stop).await?,
    }
    // Stop every call still running and wait for their process trees to be gone.
    tools.root.cancel();
    tools.calls.close();
    if tokio::time::timeout(DRAIN, tools.calls.wait())
        .await
        .is_err()
    {
        tracing::warn!("calls still running {} s after the stop", DRAIN.as_secs());
    }
    // The sessions ended, and their background processes with them: wait until they are gone.
    tools.jobs.close();
    if tokio::time::timeout(DRAIN, tools.jobs.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "background processes still running {} s after the stop",
            DRAIN.as_secs()
        );
    }
    Ok(exit::OK)
}

async fn stdio(tools: Tools, stop: &Stop) -> Result<(), LocalError> {
    let io_error = |what: &str, e: std::io::Error| LocalError::Io {
        what: what.to_owned(),
        source: e,
    };
    let running = tools
        .serve(rmcp::transport::stdio_pipes())
        .await
        .map_err(|e| {
            io_error(
                "the MCP client did not start a session",
                std::io::Error::other(e.to_string()),
            )
        })?;
    let ct = running.cancellation_token();
    let stopped = stop.token().clone();
    let on_stop = tokio::spawn(async move {
        stopped.cancelled().await;
        ct.cancel();
    });
    let reason = running.waiting().await;
    on_stop.abort();
    tracing::debug!(?reason, "the MCP session ended");
    Ok(())
}

async fn http(
    tools: Tools,
    listen: &str,
    token: Option<String>,
    limits: HttpLimits,
    stop: &Stop,
) -> Result<(), LocalError> {
    let usage = |why: String| LocalError::Usage(format!("--listen {listen:?}: {why}"));
    let addr: SocketAddr = tokio::net::lookup_host(listen)
        .await
        .map_err(|e| usage(e.to_string()))?
        .next()
        .ok_or_else(|| usage("resolves to no address".into()))?;
    if token.is_none() && !addr.ip().is_loopback() {
        return Err(LocalError::Usage(format!(
            "refusing to serve the tools on {addr} without a credential: set PODHOST_TOKEN or \
             PODHOST_TOKEN_FILE, or listen on a loopback address"
        )));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| LocalError::Io {
            what: format!("could not listen on {addr}"),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| LocalError::Io {
        what: "could not read the listening address".into(),
        source,
    })?;
    let sessions = tools.root.child_token();
    // The guard below checks Host and Origin as for every front; rmcp's own Host check on top
    // would know neither the listen address nor whether a credential is set, and answers in
    // plain text.
    let config = StreamableHttpServerConfig::default()
        .with_cancellation_token(sessions.clone())
        .disable_allowed_hosts();
    let root = tools.toolbox.workspace().root().display().to_string();
    let service = StreamableHttpService::new(
        move || Ok(tools.session()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    // The credential check, then the guard (as for serve), then rmcp.
    let guard = Guard::new(local, token.is_some(), refuse);
    let app = guard
        .around(
            axum::Router::new()
                .route_service("/mcp", service)
                .layer(middleware::from_fn(session_ended)),
        )
        .layer(middleware::from_fn_with_state(
            token.map(|t| Arc::new(Secret::new(t))),
            require_bearer,
        ));
    let limits = fit_open_files(limits);
    eprintln!("podhost mcp: serving the tools of {root} at http://{local}/mcp");
    let stopped = stop.token().clone();
    let shutdown = async move {
        stopped.cancelled().await;
        // Ends every session, so open event streams close and the connections can drain.
        sessions.cancel();
    };
    crate::floor::http::serve(listener, app, limits, shutdown).await;
    Ok(())
}

/// The credential from `PODHOST_TOKEN`/`--token` or the token file; an empty one is refused.
fn credential(cfg: &McpConfig) -> Result<Option<String>, LocalError> {
    let token = match (&cfg.token, &cfg.token_file) {
        (Some(t), _) => Some(t.expose().trim().to_owned()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| {
                    LocalError::Usage(format!(
                        "could not read the token file {}: {e}",
                        path.display()
                    ))
                })?
                .trim()
                .to_owned(),
        ),
        (None, None) => None,
    };
    if token.as_deref() == Some("") {
        return Err(LocalError::Usage(
            "the credential is empty: set PODHOST_TOKEN or PODHOST_TOKEN_FILE to a non-empty value"
                .into(),
        ));
    }
    // On stdio the client that started podhost is the only one it serves: no credential.
    Ok(token.filter(|_| cfg.listen.is_some()))
}

/// A session ended with `DELETE /mcp` answers 204 No Content: rmcp answers 202 Accepted,
/// which the official SDKs' clients take for a failure to end it (and warn of).
async fn session_ended(req: Request, next: Next) -> Response {
    let delete = req.method() == axum::http::Method::DELETE;
    let mut resp = next.run(req).await;
    if delete && resp.status() == StatusCode::ACCEPTED {
        *resp.status_mut() = StatusCode::NO_CONTENT;
        *resp.body_mut() = axum::body::Body::empty();
        resp.headers_mut().remove(header::CONTENT_LENGTH);
        resp.headers_mut().remove(header::CONTENT_TYPE);
    }
    resp
}

async fn require_bearer(
    State(token): State<Option<Arc<Secret>>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(token) = token else {
        return next.run(req).await;
    };
    match auth::check(req.headers(), &token) {
        Ok(()) => next.run(req).await,
        Err(why) => {
            let mut resp = refuse(StatusCode::UNAUTHORIZED, why.message().to_owned());
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            resp
        }
    }
}

/// A refusal of the HTTP front, as `{"error": message}`.
fn refuse(status: StatusCode, message: String) -> Response {
    (status, axum::Json(serde_json::json!({"error": message}))).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_tool_list_is_the_definitions_with_honest_hints() {
        let tools = tool_list();
        assert_eq!(tools.len(), ToolName::WITH_BACKGROUND.len());
        for (tool, name) in tools.iter().zip(ToolName::WITH_BACKGROUND) {
            let d = name.definition();
            assert_eq!(tool.name.as_ref(), d.name);
            assert_eq!(tool.description.as_deref(), Some(d.description.as_str()));
            assert_eq!(Value::Object((*tool.input_schema).clone()), d.input_schema);
        }
        let read_only: Vec<&str> = tools
            .iter()
            .filter(|t| t.annotations.as_ref().and_then(|a| a.read_only_hint) == Some(true))
            .map(|t| t.name.as_ref())
            .collect();
        assert_eq!(read_only, ["read", "grep", "glob", "bash_output"]);
        let destructive: Vec<&str> = tools
            .iter()
            .filter(|t| t.annotations.as_ref().and_then(|a| a.destructive_hint) == Some(true))
            .map(|t| t.name.as_ref())
            .collect();
        assert_eq!(destructive, ["bash", "write", "edit", "bash_kill"]);
        let structured: Vec<&str> = tools
            .iter()
            .filter(|t| t.output_schema.is_some())
            .map(|t| t.name.as_ref())
            .collect();
        assert_eq!(
            structured,
            ["bash", "write", "edit", "bash_output", "bash_kill"]
        );
    }

    #[test]
    fn an_object_output_is_also_structured_content_and_a_failure_only_text() {
        let output = serde_json::json!({"exitCode": 0, "stdout": "hi\n", "stderr": ""});
        let done = result(ToolOutcome::completed(output.clone()));
        assert_eq!(
            serde_json::to_value(&done).unwrap(),
            serde_json::json!({
                "content": [{"type": "text", "text": output.to_string()}],
                "structuredContent": output,
                "isError": false,
                "resultType": "complete",
            })
        );
        let text = result(ToolOutcome::completed(Value::String("1\thi".into())));
        assert_eq!(text.structured_content, None);
        let failed = result(ToolOutcome::failed("sandbox.not_found", "gone".to_owned()));
        assert_eq!(
            serde_json::to_value(&failed).unwrap(),
            serde_json::json!({
                "content": [{"type": "text", "text": "sandbox.not_found: gone"}],
                "isError": true,
                "resultType": "complete",
            })
        );
    }
}
