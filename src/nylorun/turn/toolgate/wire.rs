//! Every Tool Gate and manifest shape v5 does not pin, in one place (v5 §3, §5; v2 notes §4.3).
//!
//! v5 pins the routes, the `server: {agentId?, serverName}` reference, the `tool-calls` body
//! `{server, effectId, name, arguments}`, the answers `200 {ok: true, result}` /
//! `{ok: false, error}`, the error codes, and `session.mcp {runId, snapshot?, diagnostics}` →
//! `{mcp?}` (in `link::protocol`). The rest below is a guess, each marked **Guess**, so that the
//! day the real schema is known the change is this file (and its twin in the fake gate,
//! `shapes` in `tests/support/fake_toolgate.rs`). README.md lists the same guesses.
//!
//! Invariants: what a server listed passes through untouched (its `tools/list` tool objects go
//! into the snapshot verbatim, key for key); nothing here does I/O.
//!
//! Non-goals: the HTTP client ([`super::client`]), discovery's order of requests
//! ([`super::discovery`]).

use serde::Serialize;
use serde_json::{Map, Value, json};

/// The Tool Gate's routes, under `NYLORUN_GATES_URL` (v2 notes §4.3; v5 §5 names them).
pub mod routes {
    pub const CONNECT: [&str; 4] = ["nylorun", "v1", "mcp", "connect"];
    pub const LIST: [&str; 4] = ["nylorun", "v1", "mcp", "list"];
    pub const CLOSE: [&str; 4] = ["nylorun", "v1", "mcp", "close"];
    pub const TOOL_CALLS: [&str; 3] = ["nylorun", "v1", "tool-calls"];
    pub const HTTP_CALLS: [&str; 3] = ["nylorun", "v1", "http-calls"];
    /// `tool-calls/{key}/cancel` aborts an MCP or an HTTP call (v5 §5).
    pub fn cancel(key: &str) -> [&str; 5] {
        ["nylorun", "v1", "tool-calls", key, "cancel"]
    }
}

/// `server: {agentId?, serverName}` (v5 §5): a server the agent declares, never a URL.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerRef {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    pub server_name: String,
}

/// **Guess.** The body of `mcp/connect` and `mcp/close` is `{server}`; `mcp/list`'s adds the
/// `cursor` of the page to list. These carry no `Idempotency-Key`: they are not journaled
/// effects, so there is no effect id to send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ServerBody<'a> {
    pub server: &'a ServerRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursor: Option<&'a str>,
}

/// A `tool-calls` body (v5 §5): `{server, effectId, name, arguments}`, `name` the tool's raw name.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallBody<'a> {
    pub server: &'a ServerRef,
    pub effect_id: &'a str,
    pub name: &'a str,
    pub arguments: &'a Value,
}

/// **Guess.** An `http-calls` body: `{tool: {agentId?, toolName}, effectId, input}` — v2's
/// `{tool: {…capabilityId, toolName}, effectId, turnId, input}` with the tool named like an MCP
/// server (by the declaring agent and its name) and the turn taken from the run token, as the
/// Model Gate's body does.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpCallBody<'a> {
    pub tool: HttpToolRef<'a>,
    pub effect_id: &'a str,
    pub input: &'a Value,
}

/// **Guess.** `{agentId?, toolName}`: the manifest tool an `http-calls` body names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpToolRef<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<&'a str>,
    pub tool_name: &'a str,
}

/// Why a `200` answer of the gate is not what its route answers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("the answer has no boolean `ok`")]
    NoOk,
    #[error("the list has no `tools` array")]
    NoTools,
    /// The tool at this index of a `mcp/list` page has no `name`.
    #[error("tool {0} of the list has no name")]
    Unnamed(usize),
}

/// A `200` answer's envelope (v5 §5 for calls; **guess**: the same for connect, list, close).
#[derive(Clone, Debug, PartialEq)]
pub enum Envelope {
    /// `{ok: true, result}`.
    Ok(Value),
    /// `{ok: false, error: {code, message}}`: the tool (or server) failed; not a gate error.
    Err { code: String, message: String },
}

impl Envelope {
    /// Reads a `200` body; `Err` says why it is not an envelope.
    pub fn parse(body: &Value) -> Result<Envelope, AnswerError> {
        match body.get("ok").and_then(Value::as_bool) {
            Some(true) => Ok(Envelope::Ok(
                body.get("result").cloned().unwrap_or(Value::Null),
            )),
            Some(false) => {
                let error = body.get("error").unwrap_or(&Value::Null);
                let text = |k: &str| {
                    error
                        .get(k)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned()
                };
                Ok(Envelope::Err {
                    code: text("code"),
                    message: text("message"),
                })
            }
            None => Err(AnswerError::NoOk),
        }
    }
}

/// **Guess.** `mcp/connect`'s `result` is the server's `initialize` result, verbatim:
/// `{protocolVersion, capabilities, serverInfo, instructions?}` (a 2026-07-28 server's
/// `server/discover` result has the same fields).
pub fn connected_instructions(result: &Value) -> Option<String> {
    result
        .get("instructions")
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// **Guess.** `mcp/list`'s `result` is one page of the server's `tools/list` result, verbatim:
/// `{tools: [...], nextCursor?}`; podhost asks again with `cursor` until no `nextCursor` comes.
pub fn list_page(result: &Value) -> Result<(Vec<Value>, Option<String>), AnswerError> {
    let tools = result
        .get("tools")
        .and_then(Value::as_array)
        .ok_or(AnswerError::NoTools)?
        .clone();
    if let Some(bad) = tools
        .iter()
        .position(|t| t.get("name").and_then(Value::as_str).is_none())
    {
        return Err(AnswerError::Unnamed(bad));
    }
    let next = result
        .get("nextCursor")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    Ok((tools, next))
}

/// The snapshot's version.
pub const SNAPSHOT_SCHEMA_VERSION: u32 = 2;

/// One server of a snapshot: what it said when connected and every tool it listed.
#[derive(Clone, Debug, PartialEq)]
pub struct SnapshotServer {
    pub server: ServerRef,
    /// `mcp/connect`'s result, verbatim.
    pub initialize: Value,
    /// Every page's `tools`, in order, each tool object verbatim.
    pub tools: Vec<Value>,
}

/// **Guess.** `McpSnapshotSchema` v2: `{snapshotSchemaVersion: 2, manifestHash, servers:
/// [{agentId?, name, initialize, tools}]}` — v1's `{snapshotSchemaVersion, manifestHash,
/// mcpTools}` with the tools grouped by server, each server's own answers kept whole
/// (`initialize`: what connect answered; `tools`: what `tools/list` listed).
pub fn snapshot(manifest_hash: &str, servers: &[SnapshotServer]) -> Value {
    let servers: Vec<Value> = servers
        .iter()
        .map(|s| {
            let mut o = Map::new();
            if let Some(a) = &s.server.agent_id {
                o.insert("agentId".into(), a.clone().into());
            }
            o.insert("name".into(), s.server.server_name.clone().into());
            o.insert("initialize".into(), s.initialize.clone());
            o.insert("tools".into(), Value::Array(s.tools.clone()));
            Value::Object(o)
        })
        .collect();
    json!({
        "snapshotSchemaVersion": SNAPSHOT_SCHEMA_VERSION,
        "manifestHash": manifest_hash,
        "servers": servers,
    })
}

/// **Guess.** One diagnostic of `session.mcp`: `{server: {agentId?, serverName}, stage:
/// "connect" | "list", code, message}`, `code` the gate's (or `unavailable` for a lost hop).
pub fn diagnostic(server: &ServerRef, stage: &str, code: &str, message: &str) -> Value {
    json!({"server": server, "stage": stage, "code": code, "message": message})
}

/// **Guess.** The manifest's `mcpServers`: a list of `{name, …}`, or an object keyed by name.
/// podhost reads the names only (the gate holds the rest: URL, credentials); a server an
/// Agent Plugin brought has a name like any other. Names in manifest order, each once.
pub fn manifest_server_names(servers: Option<&Value>) -> Vec<String> {
    let mut names: Vec<String> = match servers {
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|s| match s {
                Value::String(n) => Some(n.clone()),
                other => other.get("name").and_then(Value::as_str).map(str::to_owned),
            })
            .collect(),
        Some(Value::Object(map)) => map.keys().cloned().collect(),
        _ => Vec::new(),
    };
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| !n.is_empty() && seen.insert(n.clone()));
    names
}

/// One HTTP tool the manifest declares.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpToolDecl {
    /// Its declared name: the target's `tool` and the `http-calls` body's `toolName`.
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    /// `enabled: false` in the manifest: not offered.
    pub enabled: bool,
    /// `deferred` in the manifest: a hint, as for MCP tools.
    pub deferred: Option<bool>,
}

/// **Guess.** The manifest's `tools`: a list of `{name, description?, inputSchema |
/// input_schema | parameters, type | kind?, enabled?, deferred?, …}`. HTTP tools are those of
/// kind `http`, or of no kind at all; other kinds (agents used as tools, …) are not podhost's.
/// The request itself (URL, method, headers) is the gate's to know.
pub fn manifest_http_tools(tools: Option<&Value>) -> Vec<HttpToolDecl> {
    let list: Vec<&Value> = match tools {
        Some(Value::Array(list)) => list.iter().collect(),
        Some(Value::Object(map)) => map.values().collect(),
        _ => Vec::new(),
    };
    let mut named: Vec<(String, &Value)> = Vec::new();
    if let Some(Value::Object(map)) = tools {
        // An object keyed by name: the key names an entry that has none.
        for (k, v) in map {
            let name = v
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or(k)
                .to_owned();
            named.push((name, v));
        }
    } else {
        for v in list {
            if let Some(n) = v.get("name").and_then(Value::as_str) {
                named.push((n.to_owned(), v));
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    named
        .into_iter()
        .filter(|(_, v)| {
            let kind = v
                .get("type")
                .or_else(|| v.get("kind"))
                .and_then(Value::as_str);
            matches!(kind, None | Some("http"))
        })
        .filter(|(n, _)| !n.is_empty() && seen.insert(n.clone()))
        .map(|(name, v)| HttpToolDecl {
            description: v
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            input_schema: v
                .get("inputSchema")
                .or_else(|| v.get("input_schema"))
                .or_else(|| v.get("parameters"))
                .filter(|s| s.is_object())
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"})),
            enabled: v.get("enabled").and_then(Value::as_bool).unwrap_or(true),
            deferred: v.get("deferred").and_then(Value::as_bool),
            name,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn bodies_and_answers_in_their_shapes() {
        let root = ServerRef {
            agent_id: None,
            server_name: "docs".into(),
        };
        assert_eq!(
            serde_json::to_value(ServerBody {
                server: &root,
                cursor: Some("p2")
            })
            .unwrap(),
            json!({"server": {"serverName": "docs"}, "cursor": "p2"})
        );
        let args = json!({"q": 1});
        assert_eq!(
            serde_json::to_value(ToolCallBody {
                server: &root,
                effect_id: "t:0:tool:s0.c1",
                name: "search",
                arguments: &args
            })
            .unwrap(),
            json!({"server": {"serverName": "docs"}, "effectId": "t:0:tool:s0.c1",
                   "name": "search", "arguments": {"q": 1}})
        );
        assert_eq!(
            serde_json::to_value(HttpCallBody {
                tool: HttpToolRef {
                    agent_id: None,
                    tool_name: "weather"
                },
                effect_id: "e",
                input: &args
            })
            .unwrap(),
            json!({"tool": {"toolName": "weather"}, "effectId": "e", "input": {"q": 1}})
        );
        assert_eq!(
            Envelope::parse(&json!({"ok": true, "result": {"content": []}})),
            Ok(Envelope::Ok(json!({"content": []})))
        );
        assert_eq!(
            Envelope::parse(
                &json!({"ok": false, "error": {"code": "mcp.too-large", "message": "big"}})
            ),
            Ok(Envelope::Err {
                code: "mcp.too-large".into(),
                message: "big".into()
            })
        );
        assert_eq!(
            Envelope::parse(&json!({"result": 1})).map_err(|e| e.to_string()),
            Err("the answer has no boolean `ok`".into())
        );
        let page = json!({"tools": [{"name": "a", "x-odd": [1]}], "nextCursor": "n"});
        assert_eq!(
            list_page(&page).map_err(|e| e.to_string()),
            Ok((vec![json!({"name": "a", "x-odd": [1]})], Some("n".into())))
        );
        assert_eq!(
            list_page(&json!({"tools": [{}]})).map_err(|e| e.to_string()),
            Err("tool 0 of the list has no name".into())
        );
    }

    #[test]
    fn the_snapshot_keeps_what_servers_said() {
        let tools = vec![json!({"name": "echo", "title": "Echo", "inputSchema": {"$schema": "x"}})];
        let s = snapshot(
            "mh",
            &[SnapshotServer {
                server: ServerRef {
                    agent_id: None,
                    server_name: "everything".into(),
                },
                initialize: json!({"protocolVersion": "2025-11-25", "instructions": "Hi"}),
                tools: tools.clone(),
            }],
        );
        assert_eq!(
            s,
            json!({"snapshotSchemaVersion": 2, "manifestHash": "mh", "servers": [
                {"name": "everything", "initialize": {"protocolVersion": "2025-11-25",
                 "instructions": "Hi"}, "tools": tools}]})
        );
    }

    #[test]
    fn manifest_servers_and_http_tools_read_in_either_shape() {
        assert_eq!(
            manifest_server_names(Some(
                &json!([{"name": "b"}, {"name": "a"}, "c", {"name": "b"}])
            )),
            ["b", "a", "c"]
        );
        assert_eq!(
            manifest_server_names(Some(&json!({"x": {"url": "u"}, "y": {}}))),
            ["x", "y"]
        );
        assert_eq!(manifest_server_names(None), Vec::<String>::new());
        let tools = manifest_http_tools(Some(&json!([
            {"name": "weather", "description": "Weather.", "parameters": {"type": "object",
             "properties": {"city": {"type": "string"}}}, "type": "http"},
            {"name": "helper", "type": "agent"},
            {"name": "plain", "enabled": false, "deferred": true},
        ])));
        assert_eq!(
            tools,
            vec![
                HttpToolDecl {
                    name: "weather".into(),
                    description: "Weather.".into(),
                    input_schema: json!({"type": "object",
                                         "properties": {"city": {"type": "string"}}}),
                    enabled: true,
                    deferred: None,
                },
                HttpToolDecl {
                    name: "plain".into(),
                    description: String::new(),
                    input_schema: json!({"type": "object"}),
                    enabled: false,
                    deferred: Some(true),
                },
            ]
        );
    }
}
