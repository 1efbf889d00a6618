//! A fake Tool Gate on the fake gates' listener (v5 §5; v2 notes §4.3), forwarding to real MCP
//! servers (`mcp_servers.rs`) with the official Rust SDK's client (rmcp), and to HTTP tools the
//! test names.
//!
//! Strict like the gate:
//! * every route wants the run's current token (`401 gate_unauthorized`, `409 run_stale` for a
//!   run that is over) and a strict body (`400 invalid_request`); a server the run's manifest
//!   does not declare is `400 invalid_request`;
//! * `tool-calls` / `http-calls` want `Idempotency-Key` (`400 key_required`) equal to the body's
//!   `effectId`, and that effect journaled `invoking` for the token's session with a target
//!   naming the same agent, server and tool (`409 effect_not_journaled` otherwise);
//! * the same key with another body is `409 gate_conflict`; with the same body it joins the call
//!   (in flight or done) and gets the same bytes — the tool runs once per key;
//! * the tool gets the key (`_meta["nylorun/idempotency-key"]` on `tools/call`,
//!   `Idempotency-Key` to an HTTP tool) and the credential the gate holds for it; an answer that
//!   echoes a credential has it replaced with `[redacted]`; an answer past the run's
//!   `toolAnswerBytes` is `{ok: false, error: {code: "mcp.too-large" | "http.too-large"}}`;
//! * `tool-calls/{key}/cancel` aborts the call (rmcp then sends `notifications/cancelled`).
//!
//! The test can lose the next answers after the call ran (the connection drops mid-body), hold
//! answers until released, and read every request, connect and execution.
//!
//! [`shapes`] holds every shape the fake guesses, as `turn::toolgate::wire` does in podhost.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{ConfigureCommandExt, StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Value, json};
use tokio::sync::{OnceCell, watch};
use tokio_util::sync::CancellationToken;

use crate::fake_journal::{Journal, Status, TokenState};

/// Every shape the fake guesses where v5 is silent (twin of podhost's `toolgate::wire`).
pub mod shapes {
    use serde::Deserialize;
    use serde_json::{Map, Value, json};

    /// `server: {agentId?, serverName}` (v5).
    #[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct ServerRef {
        pub agent_id: Option<String>,
        pub server_name: String,
    }

    /// Guess: `mcp/connect` and `mcp/close` bodies are `{server}`, `mcp/list`'s `{server, cursor?}`.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ServerBody {
        pub server: ServerRef,
        pub cursor: Option<String>,
    }

    /// `tool-calls` body (v5).
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct ToolCallBody {
        pub server: ServerRef,
        pub effect_id: String,
        pub name: String,
        pub arguments: Map<String, Value>,
    }

    /// Guess: `http-calls` body `{tool: {agentId?, toolName}, effectId, input}`.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct HttpCallBody {
        pub tool: HttpToolRef,
        pub effect_id: String,
        pub input: Value,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct HttpToolRef {
        pub agent_id: Option<String>,
        pub tool_name: String,
    }

    /// Guess: an HTTP tool's result is `{status, body}`, the body JSON when it parses.
    pub fn http_result(status: u16, body: &str) -> Value {
        let body = serde_json::from_str::<Value>(body).unwrap_or_else(|_| body.into());
        json!({"status": status, "body": body})
    }

    /// Guess: the manifest's `mcpServers` is `[{name, tools?: {<raw>: {enabled?, deferred?}}}]`
    /// (or an object keyed by name); the settings of one server's tool.
    pub fn tool_settings(
        manifest_servers: &Value,
        server: &str,
        tool: &str,
    ) -> (bool, Option<bool>) {
        let entry = match manifest_servers {
            Value::Array(list) => list.iter().find(|s| s["name"] == server).cloned(),
            Value::Object(map) => map.get(server).cloned(),
            _ => None,
        }
        .unwrap_or(Value::Null);
        let t = &entry["tools"][tool];
        (
            t["enabled"].as_bool().unwrap_or(true),
            t["deferred"].as_bool(),
        )
    }

    /// The declared servers' names.
    pub fn server_names(manifest_servers: &Value) -> Vec<String> {
        match manifest_servers {
            Value::Array(list) => list
                .iter()
                .filter_map(|s| s["name"].as_str().map(str::to_owned))
                .collect(),
            Value::Object(map) => map.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// Checks a snapshot — guess: `McpSnapshotSchema` v2 is `{snapshotSchemaVersion: 2,
    /// manifestHash, servers: [{agentId?, name, initialize, tools: [tools/list tools]}]}` — and
    /// makes the facts a turn runs with (v5 `McpFactsSchema`): each server's instructions from
    /// its `initialize`, each tool as listed plus the manifest's `enabled` and `deferred`.
    pub fn facts_of(
        snapshot: &Value,
        manifest_hash: &str,
        manifest_servers: &Value,
    ) -> Result<Value, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Snapshot {
            snapshot_schema_version: u32,
            manifest_hash: String,
            servers: Vec<Server>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Server {
            agent_id: Option<String>,
            name: String,
            initialize: Map<String, Value>,
            tools: Vec<Map<String, Value>>,
        }
        let s: Snapshot = serde_json::from_value(snapshot.clone()).map_err(|e| e.to_string())?;
        if s.snapshot_schema_version != 2 {
            return Err(format!(
                "snapshotSchemaVersion {} is not 2",
                s.snapshot_schema_version
            ));
        }
        if s.manifest_hash != manifest_hash {
            return Err("manifestHash is not the turn's".to_owned());
        }
        let declared = server_names(manifest_servers);
        let mut servers = Vec::new();
        for server in s.servers {
            if !declared.contains(&server.name) {
                return Err(format!("the agent declares no MCP server {}", server.name));
            }
            let mut tools = Vec::new();
            for t in &server.tools {
                let Some(name) = t.get("name").and_then(Value::as_str) else {
                    return Err("a tool has no name".to_owned());
                };
                let (enabled, deferred) = tool_settings(manifest_servers, &server.name, name);
                let mut fact = Map::new();
                for k in [
                    "name",
                    "description",
                    "inputSchema",
                    "outputSchema",
                    "annotations",
                ] {
                    if let Some(v) = t.get(k) {
                        fact.insert(k.to_owned(), v.clone());
                    }
                }
                fact.insert("enabled".into(), enabled.into());
                if let Some(d) = deferred {
                    fact.insert("deferred".into(), d.into());
                }
                tools.push(Value::Object(fact));
            }
            let mut out = Map::new();
            if let Some(a) = server.agent_id {
                out.insert("agentId".into(), a.into());
            }
            out.insert("name".into(), server.name.into());
            if let Some(i) = server.initialize.get("instructions") {
                out.insert("instructions".into(), i.clone());
            }
            out.insert("tools".into(), Value::Array(tools));
            servers.push(Value::Object(out));
        }
        Ok(json!({"servers": servers}))
    }
}

/// How the gate reaches one MCP server.
#[derive(Clone, Debug)]
pub enum ServerSpec {
    /// A command it starts, speaking MCP on stdio.
    Stdio {
        program: PathBuf,
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
    /// A streamable HTTP endpoint.
    Http { url: String },
}

/// One server the gate knows, with the credential it holds for it (a variable of a stdio
/// server, a bearer for an HTTP one).
#[derive(Clone, Debug)]
struct KnownServer {
    spec: ServerSpec,
    credential: String,
}

/// One HTTP tool the gate knows.
#[derive(Clone, Debug)]
struct KnownHttpTool {
    url: String,
    credential: String,
}

/// One request as the gate saw it.
#[derive(Clone, Debug)]
pub struct ToolGateRequest {
    /// `mcp/connect`, `mcp/list`, `mcp/close`, `tool-calls`, `http-calls`, `cancel`.
    pub route: String,
    pub token: Option<String>,
    pub key: Option<String>,
    pub traceparent: Option<String>,
    pub raw: String,
    pub body: Value,
    /// The status answered (0 while in flight); `lost` when the answer was dropped.
    pub status: u16,
    pub answer: String,
    pub lost: bool,
}

type Client = RunningService<RoleClient, ClientConfig>;
/// A connection to a server, opened once: the client or why it could not be.
type Connection = Arc<OnceCell<Result<Arc<Client>, String>>>;

struct Entry {
    body: String,
    answer: watch::Sender<Option<(u16, String)>>,
    cancel: CancellationToken,
}

#[derive(Default)]
struct Inner {
    servers: HashMap<String, KnownServer>,
    http_tools: HashMap<String, KnownHttpTool>,
    requests: Vec<ToolGateRequest>,
    entries: HashMap<String, Arc<Entry>>,
    /// Calls forwarded to a tool, per key.
    executions: HashMap<String, u32>,
    /// `(session, server)` of each connection the gate opened to a server.
    connections: Vec<(String, String)>,
    /// Answers to drop after the call ran.
    lose: u32,
    /// `mcp/list` answers pages of this many tools (cursor: the next tool's index).
    page_size: Option<usize>,
    /// `mcp/list` always says there is a next page.
    endless_pages: bool,
    cancels: Vec<String>,
}

/// The fake Tool Gate's state; its routes join the fake gates' listener.
pub struct ToolGate {
    journal: Arc<Journal>,
    inner: Mutex<Inner>,
    clients: Mutex<HashMap<(String, String), Connection>>,
    hold: watch::Sender<bool>,
    changed: watch::Sender<u64>,
}

const WAIT: Duration = Duration::from_secs(30);

impl ToolGate {
    pub fn new(journal: Arc<Journal>) -> Arc<ToolGate> {
        // rmcp's HTTP client builds a reqwest client: rustls needs its provider first.
        let _ = rustls::crypto::ring::default_provider().install_default();
        Arc::new(ToolGate {
            journal,
            inner: Mutex::default(),
            clients: Mutex::default(),
            hold: watch::Sender::new(false),
            changed: watch::Sender::new(0),
        })
    }

    pub fn routes(self: &Arc<Self>) -> Router {
        Router::new()
            .route("/nylorun/v1/mcp/connect", post(connect))
            .route("/nylorun/v1/mcp/list", post(list))
            .route("/nylorun/v1/mcp/close", post(close))
            .route("/nylorun/v1/tool-calls", post(tool_call))
            .route("/nylorun/v1/http-calls", post(http_call))
            .route("/nylorun/v1/tool-calls/{key}/cancel", post(cancel))
            .with_state(self.clone())
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n += 1);
    }

    /// The gate reaches MCP server `name` (as the manifest names it) by `spec`, holding
    /// `credential` for it.
    pub fn add_server(&self, name: &str, spec: ServerSpec, credential: &str) {
        self.inner.lock().unwrap().servers.insert(
            name.to_owned(),
            KnownServer {
                spec,
                credential: credential.to_owned(),
            },
        );
    }

    /// The gate runs HTTP tool `name` as a POST of its input to `url`, with `credential` as bearer.
    pub fn add_http_tool(&self, name: &str, url: &str, credential: &str) {
        self.inner.lock().unwrap().http_tools.insert(
            name.to_owned(),
            KnownHttpTool {
                url: url.to_owned(),
                credential: credential.to_owned(),
            },
        );
    }

    /// The next `n` call answers are lost after the call ran: the connection drops mid-body.
    pub fn lose_answers(&self, n: u32) {
        self.inner.lock().unwrap().lose = n;
    }

    /// `mcp/list` answers pages of `size` tools; with `endless`, every page names a next one.
    pub fn page_tools(&self, size: usize, endless: bool) {
        let mut inner = self.inner.lock().unwrap();
        inner.page_size = Some(size);
        inner.endless_pages = endless;
    }

    /// While held, calls run but their answers wait.
    pub fn hold_answers(&self, hold: bool) {
        self.hold.send_replace(hold);
    }

    pub fn requests(&self) -> Vec<ToolGateRequest> {
        self.inner.lock().unwrap().requests.clone()
    }

    /// Requests of `route`.
    pub fn requests_of(&self, route: &str) -> Vec<ToolGateRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.route == route)
            .collect()
    }

    /// How many times the call under `key` reached its tool.
    pub fn executions(&self, key: &str) -> u32 {
        self.inner
            .lock()
            .unwrap()
            .executions
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// `(session, server)` of every connection opened to a server.
    pub fn connections(&self) -> Vec<(String, String)> {
        self.inner.lock().unwrap().connections.clone()
    }

    pub fn cancels(&self) -> Vec<String> {
        self.inner.lock().unwrap().cancels.clone()
    }

    /// Waits until `pred` holds.
    pub async fn wait_for<T>(&self, what: &str, pred: impl Fn(&ToolGate) -> Option<T>) -> T {
        let mut rx = self.changed.subscribe();
        let found = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(t) = pred(self) {
                    return t;
                }
                rx.changed().await.unwrap();
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!(
                "timed out waiting for {what}; requests: {:#?}",
                self.requests()
            )
        })
    }

    fn credentials(&self) -> Vec<String> {
        let inner = self.inner.lock().unwrap();
        inner
            .servers
            .values()
            .map(|s| s.credential.clone())
            .chain(inner.http_tools.values().map(|t| t.credential.clone()))
            .filter(|c| !c.is_empty())
            .collect()
    }

    /// Replaces every credential the gate holds with `[redacted]`.
    fn redact(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for c in self.credentials() {
            out = out.replace(&c, "[redacted]");
        }
        out
    }

    /// The connection of `session` to `server`, opened on first use.
    async fn client(&self, session: &str, server: &str) -> Result<Arc<Client>, String> {
        let cell = self
            .clients
            .lock()
            .unwrap()
            .entry((session.to_owned(), server.to_owned()))
            .or_default()
            .clone();
        cell.get_or_init(|| async {
            let known = self.inner.lock().unwrap().servers.get(server).cloned();
            let Some(known) = known else {
                return Err(format!("the gate cannot reach MCP server {server}"));
            };
            self.inner
                .lock()
                .unwrap()
                .connections
                .push((session.to_owned(), server.to_owned()));
            self.bump();
            let config = ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("fake-tool-gate", "0.0.0"),
            );
            let served = match known.spec {
                ServerSpec::Stdio { program, args, env } => {
                    let cmd = tokio::process::Command::new(program).configure(|c| {
                        c.args(&args).env_clear().envs(env).kill_on_drop(true);
                    });
                    let (child, _) = TokioChildProcess::builder(cmd)
                        .stderr(std::process::Stdio::null())
                        .spawn()
                        .map_err(|e| format!("could not start {server}: {e}"))?;
                    config.serve(child).await.map_err(|e| e.to_string())
                }
                ServerSpec::Http { url } => {
                    let t = StreamableHttpClientTransportConfig::with_uri(url)
                        .auth_header(known.credential.clone());
                    config
                        .serve(StreamableHttpClientTransport::from_config(t))
                        .await
                        .map_err(|e| e.to_string())
                }
            };
            served.map(Arc::new)
        })
        .await
        .clone()
    }

    /// Drops the connection of `session` to `server`.
    fn drop_client(&self, session: &str, server: &str) {
        self.clients
            .lock()
            .unwrap()
            .remove(&(session.to_owned(), server.to_owned()));
    }

    fn record(&self, req: ToolGateRequest) -> usize {
        let mut inner = self.inner.lock().unwrap();
        inner.requests.push(req);
        let i = inner.requests.len() - 1;
        drop(inner);
        self.bump();
        i
    }

    fn answered(&self, i: usize, status: u16, answer: &str, lost: bool) {
        {
            let mut inner = self.inner.lock().unwrap();
            let r = &mut inner.requests[i];
            r.status = status;
            r.answer = answer.to_owned();
            r.lost = lost;
        }
        self.bump();
    }

    /// The token's run: `(session, run id)`, or the refusal.
    fn authorize(&self, headers: &HeaderMap) -> Result<(String, String), (u16, String)> {
        match bearer(headers)
            .as_deref()
            .map(|t| self.journal.token_state(t))
        {
            Some(TokenState::Current { session_id, run_id }) => Ok((session_id, run_id)),
            Some(TokenState::Stale) => Err(error(409, "run_stale", "The run is over")),
            _ => Err(error(401, "gate_unauthorized", "Unknown run token")),
        }
    }
}

fn error(status: u16, code: &str, message: &str) -> (u16, String) {
    (
        status,
        json!({"error": {"code": code, "message": message}}).to_string(),
    )
}

fn ok(result: Value) -> (u16, String) {
    (200, json!({"ok": true, "result": result}).to_string())
}

fn failed(code: &str, message: &str) -> (u16, String) {
    (
        200,
        json!({"ok": false, "error": {"code": code, "message": message}}).to_string(),
    )
}

fn respond((status, body): (u16, String)) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json")],
        body,
    )
        .into_response()
}

/// A 200 whose body breaks off: the client sees the hop lost.
fn lost_response() -> Response {
    let stream = futures_util::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("the gate dropped the answer"))
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn bearer(h: &HeaderMap) -> Option<String> {
    header(h, "authorization").and_then(|a| a.strip_prefix("Bearer ").map(str::to_owned))
}

fn seen(route: &str, headers: &HeaderMap, body: &Bytes) -> ToolGateRequest {
    ToolGateRequest {
        route: route.to_owned(),
        token: bearer(headers),
        key: header(headers, "idempotency-key"),
        traceparent: header(headers, "traceparent"),
        raw: String::from_utf8_lossy(body).into_owned(),
        body: serde_json::from_slice(body).unwrap_or(Value::Null),
        status: 0,
        answer: String::new(),
        lost: false,
    }
}

/// Connect, list, close: the token's run, a strict body naming a server its manifest declares.
async fn discovery(
    gate: &ToolGate,
    route: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> (u16, String) {
    let (session, run_id) = match gate.authorize(headers) {
        Ok(s) => s,
        Err(e) => return e,
    };
    let b: shapes::ServerBody = match serde_json::from_slice(body) {
        Ok(b) => b,
        Err(e) => return error(400, "invalid_request", &e.to_string()),
    };
    if b.cursor.is_some() && route != "mcp/list" {
        return error(400, "invalid_request", "only mcp/list takes a cursor");
    }
    let run = gate.journal.run(&run_id).unwrap();
    if b.server.agent_id.is_some()
        || !shapes::server_names(&run.mcp_servers).contains(&b.server.server_name)
    {
        return error(
            400,
            "invalid_request",
            &format!("The agent declares no MCP server {}", b.server.server_name),
        );
    }
    let name = &b.server.server_name;
    let answer = match route {
        "mcp/close" => {
            gate.drop_client(&session, name);
            ok(json!({}))
        }
        _ => match gate.client(&session, name).await {
            Err(e) => failed("mcp.unavailable", &e),
            Ok(client) if route == "mcp/connect" => {
                ok(serde_json::to_value(client.peer_info()).unwrap())
            }
            Ok(client) => {
                let (size, endless) = {
                    let inner = gate.inner.lock().unwrap();
                    (inner.page_size, inner.endless_pages)
                };
                match size {
                    // The server's own pages.
                    None => {
                        let params = b
                            .cursor
                            .map(|c| serde_json::from_value(json!({"cursor": c})).unwrap());
                        match client.list_tools(params).await {
                            Ok(r) => ok(serde_json::to_value(r).unwrap()),
                            Err(e) => failed("mcp.error", &e.to_string()),
                        }
                    }
                    // Its whole list, cut into pages here.
                    Some(size) => match client.list_tools(None).await {
                        Ok(r) => {
                            let all = serde_json::to_value(r).unwrap()["tools"].clone();
                            let all = all.as_array().cloned().unwrap_or_default();
                            let from: usize =
                                b.cursor.as_deref().map_or(0, |c| c.parse().unwrap_or(0));
                            let page: Vec<Value> = all
                                .iter()
                                .skip(from % all.len().max(1))
                                .take(size)
                                .cloned()
                                .collect();
                            let next = from + size;
                            let mut result = json!({"tools": page});
                            if endless || next < all.len() {
                                result["nextCursor"] = json!(next.to_string());
                            }
                            ok(result)
                        }
                        Err(e) => failed("mcp.error", &e.to_string()),
                    },
                }
            }
        },
    };
    let (status, text) = answer;
    if text.len() > run.tool_answer_bytes {
        return failed(
            "mcp.too-large",
            &format!(
                "The answer is {} bytes, past limits.toolAnswerBytes ({} bytes)",
                text.len(),
                run.tool_answer_bytes
            ),
        );
    }
    (status, gate.redact(&text))
}

async fn connect(State(g): State<Arc<ToolGate>>, headers: HeaderMap, body: Bytes) -> Response {
    handle_discovery(&g, "mcp/connect", headers, body).await
}

async fn list(State(g): State<Arc<ToolGate>>, headers: HeaderMap, body: Bytes) -> Response {
    handle_discovery(&g, "mcp/list", headers, body).await
}

async fn close(State(g): State<Arc<ToolGate>>, headers: HeaderMap, body: Bytes) -> Response {
    handle_discovery(&g, "mcp/close", headers, body).await
}

async fn handle_discovery(g: &ToolGate, route: &str, headers: HeaderMap, body: Bytes) -> Response {
    let i = g.record(seen(route, &headers, &body));
    let (status, text) = discovery(g, route, &headers, &body).await;
    g.answered(i, status, &text, false);
    respond((status, text))
}

/// What a call names, checked against the journal.
struct Call {
    key: String,
    session: String,
    run_id: String,
    /// The journaled target it must match.
    target: Value,
}

/// The common checks of `tool-calls` and `http-calls`; the key and the token's run.
fn check_call(
    gate: &ToolGate,
    headers: &HeaderMap,
    effect_id: &str,
    target: Value,
) -> Result<Call, (u16, String)> {
    let (session, run_id) = gate.authorize(headers)?;
    let Some(key) = header(headers, "idempotency-key") else {
        return Err(error(400, "key_required", "Idempotency-Key is required"));
    };
    if effect_id != key {
        return Err(error(
            409,
            "effect_not_journaled",
            "Idempotency-Key is not the body's effectId",
        ));
    }
    Ok(Call {
        key,
        session,
        run_id,
        target,
    })
}

/// The journal's row for the call must be this very call, invoking.
fn journaled(gate: &ToolGate, call: &Call) -> Result<(), (u16, String)> {
    let row = gate.journal.row(&call.key);
    let Some(row) = row else {
        return Err(error(
            409,
            "effect_not_journaled",
            "No journaled call has this key",
        ));
    };
    if row.session_id != call.session || row.kind != "tool" || row.status != Status::Invoking {
        return Err(error(
            409,
            "effect_not_journaled",
            "The call is not journaled invoking for this session",
        ));
    }
    let agent_ok = row.intent.get("agent").is_none();
    if row.intent["target"] != call.target || !agent_ok {
        return Err(error(
            409,
            "effect_not_journaled",
            "The journaled call names another agent, server or tool",
        ));
    }
    Ok(())
}

/// Runs (or joins) the call under its key; the answer.
async fn run_once<F>(gate: &ToolGate, call: &Call, raw: &str, forward: F) -> (u16, String)
where
    F: FnOnce(CancellationToken) -> futures_util::future::BoxFuture<'static, (u16, String)>,
{
    let existing = gate.inner.lock().unwrap().entries.get(&call.key).cloned();
    let entry = match existing {
        Some(e) if e.body != raw => {
            return error(409, "gate_conflict", "Another request under this key");
        }
        Some(e) => e,
        None => {
            if let Err(e) = journaled(gate, call) {
                return e;
            }
            let entry = Arc::new(Entry {
                body: raw.to_owned(),
                answer: watch::Sender::new(None),
                cancel: CancellationToken::new(),
            });
            {
                let mut inner = gate.inner.lock().unwrap();
                inner.entries.insert(call.key.clone(), entry.clone());
                *inner.executions.entry(call.key.clone()).or_default() += 1;
            }
            gate.bump();
            // The call outlives the request that started it, as a gate's call does.
            let run = forward(entry.cancel.clone());
            let e = entry.clone();
            tokio::spawn(async move {
                let answer = run.await;
                e.answer.send_replace(Some(answer));
            });
            entry
        }
    };
    let mut rx = entry.answer.subscribe();
    let answer = rx.wait_for(Option::is_some).await.unwrap().clone().unwrap();
    let mut hold = gate.hold.subscribe();
    let _ = hold.wait_for(|h| !*h).await;
    answer
}

/// The answer's bytes: redacted, then held to the run's `toolAnswerBytes`.
fn finish(
    gate: &ToolGate,
    run_id: &str,
    family: &str,
    (status, text): (u16, String),
) -> (u16, String) {
    let limit = gate
        .journal
        .run(run_id)
        .map_or(8 << 20, |r| r.tool_answer_bytes);
    if status == 200 && text.len() > limit {
        return failed(
            &format!("{family}.too-large"),
            &format!(
                "The tool's answer is {} bytes, past limits.toolAnswerBytes ({limit} bytes)",
                text.len()
            ),
        );
    }
    (status, gate.redact(&text))
}

async fn tool_call(State(g): State<Arc<ToolGate>>, headers: HeaderMap, body: Bytes) -> Response {
    let i = g.record(seen("tool-calls", &headers, &body));
    let raw = String::from_utf8_lossy(&body).into_owned();
    let answer = async {
        let b: shapes::ToolCallBody = match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => {
                if let Err(e) = g.authorize(&headers) {
                    return e;
                }
                return error(400, "invalid_request", &e.to_string());
            }
        };
        let target = json!({"kind": "mcp", "server": b.server.server_name, "tool": b.name});
        let call = match check_call(&g, &headers, &b.effect_id, target) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if b.server.agent_id.is_some() {
            return error(
                409,
                "effect_not_journaled",
                "The journaled call names another agent, server or tool",
            );
        }
        let gate = g.clone();
        let (session, server, key) = (
            call.session.clone(),
            b.server.server_name.clone(),
            call.key.clone(),
        );
        let (name, args) = (b.name.clone(), b.arguments.clone());
        let answer = run_once(&g, &call, &raw, move |cancel| {
            Box::pin(async move {
                let client = match gate.client(&session, &server).await {
                    Ok(c) => c,
                    Err(e) => return failed("mcp.unavailable", &e),
                };
                let params: CallToolRequestParams = serde_json::from_value(json!({
                    "name": name,
                    "arguments": args,
                    "_meta": {"nylorun/idempotency-key": key},
                }))
                .unwrap();
                tokio::select! {
                    r = client.call_tool(params) => match r {
                        Ok(result) => ok(serde_json::to_value(result).unwrap()),
                        Err(rmcp::ServiceError::McpError(e)) => failed("mcp.error", &e.message),
                        Err(e) => failed("mcp.unavailable", &e.to_string()),
                    },
                    _ = cancel.cancelled() => failed("mcp.cancelled", "The call was cancelled"),
                }
            })
        })
        .await;
        finish(&g, &call.run_id, "mcp", answer)
    }
    .await;
    deliver(&g, i, answer)
}

async fn http_call(State(g): State<Arc<ToolGate>>, headers: HeaderMap, body: Bytes) -> Response {
    let i = g.record(seen("http-calls", &headers, &body));
    let raw = String::from_utf8_lossy(&body).into_owned();
    let answer = async {
        let b: shapes::HttpCallBody = match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => {
                if let Err(e) = g.authorize(&headers) {
                    return e;
                }
                return error(400, "invalid_request", &e.to_string());
            }
        };
        let target = json!({"kind": "http", "tool": b.tool.tool_name});
        let call = match check_call(&g, &headers, &b.effect_id, target) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if b.tool.agent_id.is_some() {
            return error(
                409,
                "effect_not_journaled",
                "The journaled call names another agent, server or tool",
            );
        }
        let known = g
            .inner
            .lock()
            .unwrap()
            .http_tools
            .get(&b.tool.tool_name)
            .cloned();
        let Some(known) = known else {
            return error(
                400,
                "invalid_request",
                "The agent declares no such HTTP tool",
            );
        };
        let (key, input) = (call.key.clone(), b.input.clone());
        let answer = run_once(&g, &call, &raw, move |cancel| {
            Box::pin(async move {
                let sent = reqwest::Client::new()
                    .post(&known.url)
                    .bearer_auth(&known.credential)
                    .header("Idempotency-Key", &key)
                    .json(&input)
                    .send();
                tokio::select! {
                    r = sent => match r {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let text = resp.text().await.unwrap_or_default();
                            ok(shapes::http_result(status, &text))
                        }
                        Err(e) => failed("http.unavailable", &e.without_url().to_string()),
                    },
                    _ = cancel.cancelled() => failed("http.cancelled", "The call was cancelled"),
                }
            })
        })
        .await;
        finish(&g, &call.run_id, "http", answer)
    }
    .await;
    deliver(&g, i, answer)
}

/// Answers request `i`, or loses the answer when the test asked for it.
fn deliver(g: &ToolGate, i: usize, (status, text): (u16, String)) -> Response {
    let lose = {
        let mut inner = g.inner.lock().unwrap();
        if status == 200 && inner.lose > 0 {
            inner.lose -= 1;
            true
        } else {
            false
        }
    };
    g.answered(i, status, &text, lose);
    if lose {
        lost_response()
    } else {
        respond((status, text))
    }
}

async fn cancel(
    State(g): State<Arc<ToolGate>>,
    Path(key): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let i = g.record(seen("cancel", &headers, &body));
    let known = bearer(&headers).map(|t| g.journal.token_state(&t));
    if matches!(known, None | Some(TokenState::Unknown)) {
        let e = error(401, "gate_unauthorized", "Unknown run token");
        g.answered(i, e.0, &e.1, false);
        return respond(e);
    }
    let entry = {
        let mut inner = g.inner.lock().unwrap();
        inner.cancels.push(key.clone());
        inner.entries.get(&key).cloned()
    };
    if let Some(e) = entry {
        e.cancel.cancel();
    }
    g.answered(i, 204, "", false);
    StatusCode::NO_CONTENT.into_response()
}
