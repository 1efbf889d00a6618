//! The fake Tool Gate and the fake core's MCP side refuse what the real ones refuse: each refusal
//! here is one a wrong podhost would meet, with the text it would get.

use std::sync::Arc;

use podhost::nylorun::link::canonical::request_hash;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_gates::FakeGates;
use crate::fake_journal::Journal;
use crate::mcp::{PY_KEY, TOKEN, mcp_intent, mcp_turn_start};
use crate::mcp_servers::PyServer;

fn journal() -> Arc<Journal> {
    let j = Journal::default();
    let mut ts = mcp_turn_start(json!("hi"), json!([{"name": "py"}]));
    ts["limits"]["toolAnswerBytes"] = json!(2048);
    j.start_run("run-1", TOKEN, &ts);
    Arc::new(j)
}

#[tokio::test]
async fn the_tool_gate_refuses_what_the_gate_refuses() {
    let journal = journal();
    let (py, gates) = tokio::join!(PyServer::start(), FakeGates::start(journal.clone()));
    gates.toolgate.add_server("py", py.spec(), PY_KEY);
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .unwrap();
    let post = |route: &str, token: Option<&str>, key: Option<&str>, body: Value| {
        let mut r = http
            .post(format!("{}/nylorun/v1/{route}", gates.url()))
            .body(body.to_string());
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        if let Some(k) = key {
            r = r.header("Idempotency-Key", k);
        }
        async move {
            let resp = r.send().await.unwrap();
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let gate_error = |status: u16, code: &str, message: &str| {
        (status, json!({"error": {"code": code, "message": message}}))
    };
    let effect = "turn_1:0:tool:s0.c1";
    let body = json!({"server": {"serverName": "py"}, "effectId": effect, "name": "tick",
                      "arguments": {}});
    let key = Some(effect);

    assert_eq!(
        post("tool-calls", Some("nope"), key, body.clone()).await,
        gate_error(401, "gate_unauthorized", "Unknown run token")
    );
    assert_eq!(
        post("tool-calls", Some(TOKEN), None, body.clone()).await,
        gate_error(400, "key_required", "Idempotency-Key is required")
    );
    assert_eq!(
        post("tool-calls", Some(TOKEN), Some("other"), body.clone()).await,
        gate_error(
            409,
            "effect_not_journaled",
            "Idempotency-Key is not the body's effectId"
        )
    );
    assert_eq!(
        post("tool-calls", Some(TOKEN), key, body.clone()).await,
        gate_error(
            409,
            "effect_not_journaled",
            "No journaled call has this key"
        )
    );
    let mut extra = body.clone();
    extra["url"] = json!("http://evil.test/mcp");
    assert_eq!(
        post("tool-calls", Some(TOKEN), key, extra).await.0,
        400,
        "a body naming a URL is refused"
    );

    // Journal the call as `add`: a body naming `tick` is another tool.
    let facts_ok = journal.answer(
        "session.mcp",
        json!({"runId": "run-1", "diagnostics": [], "snapshot": {
            "snapshotSchemaVersion": 2, "manifestHash": "mh_1", "servers": [
                {"name": "py", "initialize": {"instructions": "x"},
                 "tools": [{"name": "tick", "inputSchema": {"type": "object"}},
                           {"name": "add", "inputSchema": {"type": "object"}}]}]}}),
        |_| true,
    );
    assert!(facts_ok.is_ok(), "{facts_ok:?}");
    let intent = mcp_intent(0, 0, "c1", "py__add", "py", "add", json!({}));
    journal
        .answer(
            "effect.intent",
            json!({"runId": "run-1", "effect": intent, "requestHash": request_hash(&intent)}),
            |_| true,
        )
        .unwrap();
    assert_eq!(
        post("tool-calls", Some(TOKEN), key, body.clone()).await,
        gate_error(
            409,
            "effect_not_journaled",
            "The journaled call names another agent, server or tool"
        )
    );
    let mut as_sub = body.clone();
    as_sub["name"] = json!("add");
    as_sub["server"]["agentId"] = json!("helper");
    assert_eq!(
        post("tool-calls", Some(TOKEN), key, as_sub).await,
        gate_error(
            409,
            "effect_not_journaled",
            "The journaled call names another agent, server or tool"
        )
    );
    // The journaled call runs, once; the same key and bytes answer the same bytes.
    let mut add = body.clone();
    add["name"] = json!("add");
    add["arguments"] = json!({"a": 1, "b": 2});
    let first = post("tool-calls", Some(TOKEN), key, add.clone()).await;
    assert_eq!(first.0, 200);
    assert_eq!(first.1["result"]["structuredContent"], json!({"result": 3}));
    assert_eq!(
        post("tool-calls", Some(TOKEN), key, add.clone()).await,
        first
    );
    assert_eq!(gates.toolgate.executions(effect), 1);
    let mut other = add.clone();
    other["arguments"] = json!({"a": 5, "b": 5});
    assert_eq!(
        post("tool-calls", Some(TOKEN), key, other).await,
        gate_error(409, "gate_conflict", "Another request under this key")
    );

    // Discovery: a server the manifest does not declare.
    assert_eq!(
        post(
            "mcp/connect",
            Some(TOKEN),
            None,
            json!({"server": {"serverName": "other"}})
        )
        .await,
        gate_error(
            400,
            "invalid_request",
            "The agent declares no MCP server other"
        )
    );
    // toolAnswerBytes: the tool list of py is larger than 2 KiB.
    let list = post(
        "mcp/list",
        Some(TOKEN),
        None,
        json!({"server": {"serverName": "py"}}),
    )
    .await;
    assert_eq!(list.0, 200);
    assert_eq!(list.1["ok"], false);
    assert_eq!(list.1["error"]["code"], "mcp.too-large");

    journal.run_over("run-1");
    assert_eq!(
        post("tool-calls", Some(TOKEN), key, add).await,
        gate_error(409, "run_stale", "The run is over")
    );
}

#[test]
fn core_refuses_snapshots_and_targets_it_would_refuse() {
    let journal = journal();
    let ask = |m: &str, p: Value| journal.answer(m, p, |r| r == "run-1");
    let refusal = |message: &str| Err(("invalid".to_owned(), message.to_owned()));
    let snapshot = |v: u32, server: &str| {
        json!({"runId": "run-1", "diagnostics": [], "snapshot": {
            "snapshotSchemaVersion": v, "manifestHash": "mh_1",
            "servers": [{"name": server, "initialize": {}, "tools": [
                {"name": "add", "title": "Add", "inputSchema": {"type": "object"}}]}]}})
    };
    assert_eq!(
        ask("session.mcp", snapshot(1, "py")),
        refusal("Invalid session.mcp request: snapshot: snapshotSchemaVersion 1 is not 2")
    );
    assert_eq!(
        ask("session.mcp", snapshot(2, "other")),
        refusal("Invalid session.mcp request: snapshot: the agent declares no MCP server other")
    );
    assert_eq!(
        ask("session.mcp", json!({"runId": "run-1"})),
        refusal("Invalid session.mcp request: missing field `diagnostics`")
    );
    // Diagnostics alone record nothing; the first snapshot wins.
    assert_eq!(
        ask(
            "session.mcp",
            json!({"runId": "run-1", "diagnostics": [{"x": 1}]})
        ),
        Ok(json!({}))
    );
    let facts = json!({"mcp": {"servers": [{"name": "py", "tools": [
        {"name": "add", "inputSchema": {"type": "object"}, "enabled": true}]}]}});
    assert_eq!(ask("session.mcp", snapshot(2, "py")), Ok(facts.clone()));
    let mut later = snapshot(2, "py");
    later["snapshot"]["servers"][0]["tools"] = json!([]);
    assert_eq!(ask("session.mcp", later), Ok(facts));

    // Targets core refuses without running anything.
    let intent_answer = |intent: &Value| {
        ask(
            "effect.intent",
            json!({"runId": "run-1", "effect": intent, "requestHash": request_hash(intent)}),
        )
        .unwrap()
    };
    let unknown = mcp_intent(0, 0, "c1", "py__nope", "py", "nope", json!({}));
    assert_eq!(
        intent_answer(&unknown)["outcome"]["value"]["code"],
        "tool.unknown"
    );
    let mut http = crate::mcp::tool_intent(0, 0, "c2", "weather", json!({}));
    http["target"] = json!({"kind": "http", "tool": "weather"});
    assert_eq!(
        intent_answer(&http)["outcome"]["value"]["code"],
        "tool.unavailable"
    );
    let known = mcp_intent(0, 0, "c3", "py__add", "py", "add", json!({}));
    assert_eq!(intent_answer(&known), json!({"status": "execute"}));
}
