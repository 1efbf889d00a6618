//! MCP tools through the Tool Gate, against real MCP servers: discovery and `session.mcp`, the
//! tools offered and their names, later segments on the recorded facts. This module holds the
//! helpers; `mcp_*` hold the rest.

use podhost::nylorun::link::canonical::request_hash;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::fake_core::CoreOptions;
use crate::fake_gates;
use crate::mcp_servers::{PyServer, everything};
use crate::turn::{Setup, wait_end};

pub use crate::turn_fixture::*;

/// The credentials the fake gate holds for each server (never podhost's to see).
pub const EVERYTHING_KEY: &str = "sk-everything-3f9a61c2e8";
pub const PY_KEY: &str = "py-secret-7d21e0b4a6";

/// A pod, the fake core and gates, and the Python server; the gate reaches `everything`
/// (server-everything over stdio) and `py` (the Python SDK server over HTTP).
pub struct McpSetup {
    pub s: Setup,
    pub py: PyServer,
}

pub async fn mcp_setup() -> McpSetup {
    mcp_setup_with(|_| {}).await
}

/// [`mcp_setup`], with the pod's environment changed by `tweak`.
pub async fn mcp_setup_with(tweak: impl FnOnce(&mut Vec<(String, String)>)) -> McpSetup {
    let (py, s) = tokio::join!(
        PyServer::start(),
        crate::turn::setup_with(CoreOptions::default(), tweak)
    );
    s.gates
        .toolgate
        .add_server("everything", everything(EVERYTHING_KEY), EVERYTHING_KEY);
    s.gates.toolgate.add_server("py", py.spec(), PY_KEY);
    McpSetup { s, py }
}

/// The fixture turn with `servers` as the manifest's `mcpServers`.
pub fn mcp_turn_start(input: Value, servers: Value) -> Value {
    let mut ts = turn_start(input);
    ts["manifest"]["mcpServers"] = servers;
    ts
}

/// The names of the tools model call `n` offered.
pub fn offered(s: &Setup, n: usize) -> Vec<String> {
    s.gates.calls()[n].body["call"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The instructions model call `n` carried.
pub fn instructions_of(s: &Setup, n: usize) -> String {
    s.gates.calls()[n].body["call"]["prompt"][0]["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The intent of an MCP call.
pub fn mcp_intent(
    segment: u32,
    step: u32,
    call_id: &str,
    name: &str,
    server: &str,
    tool: &str,
    input: Value,
) -> Value {
    let mut intent = tool_intent(segment, step, call_id, name, input);
    intent["target"] = json!({"kind": "mcp", "server": server, "tool": tool});
    intent
}

/// The `(effect id, request hash)` of every intent a run sent.
pub fn intents_of(s: &Setup, conn: u64, run_id: &str) -> Vec<(String, String)> {
    s.core
        .run_frames(conn, run_id)
        .into_iter()
        .filter(|(m, _)| m == "effect.intent")
        .map(|(_, p)| {
            (
                p["effect"]["effectId"].as_str().unwrap().to_owned(),
                p["requestHash"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The outcome value a run reported for `effect_id`.
pub fn outcome_of(s: &Setup, conn: u64, run_id: &str, effect_id: &str) -> Value {
    s.core
        .run_frames(conn, run_id)
        .into_iter()
        .find(|(m, p)| m == "effect.outcome" && p["effectId"] == effect_id)
        .map(|(_, p)| p["value"].clone())
        .unwrap_or_else(|| panic!("no outcome for {effect_id}"))
}

/// The name podhost gives an MCP tool whose plain name clashes or is too long.
pub fn hashed_name(server: &str, tool: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let base = format!("{}__{}", clean(server), clean(tool));
    let hex = hex::encode(Sha256::digest(format!("mcp\0{server}\0{tool}").as_bytes()));
    format!("{}_{}", &base[..base.len().min(55)], &hex[..8])
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[tokio::test]
async fn discovery_records_what_the_servers_listed_and_a_call_runs_through_the_gate() {
    let m = mcp_setup().await;
    let s = &m.s;
    // A server the gate cannot start: a diagnostic, and the turn goes on.
    s.gates.toolgate.add_server(
        "broken",
        crate::fake_toolgate::ServerSpec::Stdio {
            program: "/nonexistent/mcp-server".into(),
            args: vec![],
            env: vec![],
        },
        "",
    );
    let add = json!({"a": 2, "b": 40});
    s.gates.script([
        fake_gates::tool_call("c1", "py__add", add.clone()),
        fake_gates::text("2 + 40 = 42."),
    ]);
    let servers = json!([{"name": "everything"}, {"name": "py"}, {"name": "broken"}]);
    let ts = mcp_turn_start(json!("Add 2 and 40."), servers);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");

    // Each server: connect, list, close — bearer, no key, named by the manifest's name.
    let gate = &s.gates.toolgate;
    let routes: Vec<(String, Value)> = gate
        .requests()
        .iter()
        .filter(|r| r.route.starts_with("mcp/"))
        .map(|r| (r.route.clone(), r.body.clone()))
        .collect();
    for name in ["everything", "py"] {
        let mine: Vec<&str> = routes
            .iter()
            .filter(|(_, b)| b["server"]["serverName"] == name)
            .map(|(r, _)| r.as_str())
            .collect();
        assert_eq!(
            mine,
            ["mcp/connect", "mcp/list", "mcp/close"],
            "{name}: {:#?}",
            gate.requests()
        );
    }
    for r in gate
        .requests()
        .iter()
        .filter(|r| r.route.starts_with("mcp/"))
    {
        assert_eq!(r.token.as_deref(), Some(TOKEN));
        assert_eq!(r.key, None);
        assert_eq!(
            r.body["server"].as_object().unwrap().len(),
            1,
            "{:?}",
            r.body
        );
    }

    // session.mcp: the snapshot keeps each server's own answers, verbatim.
    let reports = s.core.journal().mcp_reports();
    assert_eq!(reports.len(), 1);
    let report = &reports[0].1;
    let answer_of = |route: &str, server: &str| -> Value {
        let r = gate
            .requests()
            .into_iter()
            .find(|r| r.route == route && r.body["server"]["serverName"] == server)
            .unwrap();
        serde_json::from_str::<Value>(&r.answer).unwrap()["result"].clone()
    };
    let server_entry = |name: &str| {
        json!({"name": name, "initialize": answer_of("mcp/connect", name),
               "tools": answer_of("mcp/list", name)["tools"]})
    };
    assert_eq!(
        report["snapshot"],
        json!({"snapshotSchemaVersion": 2, "manifestHash": "mh_1",
               "servers": [server_entry("everything"), server_entry("py")]})
    );
    let diagnostics = report["diagnostics"].as_array().unwrap();
    assert_eq!(diagnostics.len(), 1);
    assert_eq!(diagnostics[0]["server"], json!({"serverName": "broken"}));
    assert_eq!(diagnostics[0]["stage"], "connect");
    assert_eq!(diagnostics[0]["code"], "mcp.unavailable");
    assert!(
        diagnostics[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("could not start broken"),
        "{diagnostics:?}"
    );
    let everything_tools = answer_of("mcp/list", "everything")["tools"].clone();
    assert_eq!(everything_tools.as_array().unwrap().len(), 13);
    assert_eq!(everything_tools[0]["title"], "Echo Tool");

    // The model got every tool of both servers, named server__tool, after podhost's own.
    let names = offered(s, 0);
    let mut expected: Vec<String> = sandbox_tools()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    for t in everything_tools.as_array().unwrap() {
        expected.push(format!("everything__{}", t["name"].as_str().unwrap()));
    }
    expected.extend(
        ["add", "slow", "fail", "big_text", "tick", "whoami"]
            .iter()
            .map(|t| format!("py__{t}")),
    );
    assert_eq!(names, expected);
    let tools = s.gates.calls()[0].body["call"]["tools"].clone();
    let py_add = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "py__add")
        .unwrap();
    let listed_add = &answer_of("mcp/list", "py")["tools"][0];
    assert_eq!(
        *py_add,
        json!({"name": "py__add", "description": listed_add["description"],
               "inputSchema": listed_add["inputSchema"]})
    );
    // And the servers' own instructions.
    let text = instructions_of(s, 0);
    let everything_says = answer_of("mcp/connect", "everything")["instructions"]
        .as_str()
        .unwrap()
        .trim()
        .to_owned();
    assert!(
        text.contains(&format!(
            "Instructions from the MCP server everything, whose tools you may call:\n{everything_says}"
        )),
        "{text}"
    );
    assert!(text.contains(
        "Instructions from the MCP server py, whose tools you may call:\nThe py-tools server adds \
         numbers and counts ticks. Call tick once per request."
    ));

    // The call: journaled with its MCP target, then sent with the key and trace context.
    let effect = "turn_1:0:tool:s0.c1";
    let intent = mcp_intent(0, 0, "c1", "py__add", "py", "add", add.clone());
    let frames = s.core.run_frames(s.conn, "run-1");
    let sent_intent = frames
        .iter()
        .find(|(m, p)| m == "effect.intent" && p["effect"]["effectId"] == effect)
        .unwrap();
    assert_eq!(
        sent_intent.1,
        json!({"runId": "run-1", "effect": intent, "requestHash": request_hash(&intent)})
    );
    let calls = gate.requests_of("tool-calls");
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].body,
        json!({"server": {"serverName": "py"}, "effectId": effect, "name": "add", "arguments": add})
    );
    assert_eq!(calls[0].key.as_deref(), Some(effect));
    assert_eq!(calls[0].token.as_deref(), Some(TOKEN));
    assert_eq!(calls[0].traceparent.as_deref(), Some(TRACEPARENT));
    let value = json!({"kind": "completed", "output": {
        "content": [{"type": "text", "text": "42"}], "structuredContent": {"result": 42}}});
    assert_eq!(outcome_of(s, s.conn, "run-1", effect), value);
    // The intent came before the call, and the outcome after the answer.
    let order: Vec<&str> = frames
        .iter()
        .filter(|(_, p)| p["effect"]["effectId"] == effect || p["effectId"] == effect)
        .map(|(m, _)| m.as_str())
        .collect();
    assert_eq!(order, ["effect.intent", "effect.outcome"]);
    assert_eq!(
        output["transcript"][0]["entries"][2]["results"],
        json!([{"callId": "c1", "toolName": "py__add", "kind": "completed",
                "output": value["output"]}])
    );
    assert!(
        s.pod
            .logs()
            .iter()
            .all(|l| !l.contains(TOKEN) && !l.contains(PY_KEY) && !l.contains(EVERYTHING_KEY)),
        "a secret reached a log line"
    );
}

#[tokio::test]
async fn a_later_segment_runs_on_the_recorded_facts_without_reconnecting() {
    let m = mcp_setup().await;
    let s = &m.s;
    s.gates.script([
        fake_gates::tool_call("c1", "everything__echo", json!({"message": "one"})),
        fake_gates::tool_call("c2", "everything__echo", json!({"message": "two"})),
        fake_gates::text("Echoed twice."),
    ]);
    let servers = json!([{"name": "everything"}, {"name": "py"}]);
    let mut ts = mcp_turn_start(json!("Echo twice."), servers);
    ts["loop"] = json!({"yieldAfter": {"steps": 1}});
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let (method, first) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "checkpoint", "{first}");
    let discovery = s.gates.toolgate.requests().len();

    // Core starts the next segment with the facts the session recorded.
    let facts = s.core.journal().mcp_facts(SESSION).unwrap();
    let (cursor, _) = s.core.journal().transcript(SESSION);
    let mut next = ts;
    next["checkpoint"]["segment"] = json!(1);
    next["checkpoint"]["input"] = json!({"kind": "continue"});
    next["checkpoint"]["state"] = first["state"].clone();
    next["transcript"] = json!({"cursor": cursor});
    next["mcp"] = facts;
    next["loop"] = json!({"yieldAfter": {"steps": 5}});
    s.core.grant_turn("run-2", "run-token-2", next);
    let (method, second) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{second}");

    let after: Vec<String> = s.gates.toolgate.requests()[discovery..]
        .iter()
        .map(|r| r.route.clone())
        .collect();
    assert_eq!(after, ["tool-calls"], "no discovery in the second segment");
    assert!(
        !s.core
            .run_methods(s.conn, "run-2")
            .contains(&"session.mcp".to_owned())
    );
    // The same tools under the same names, in the same order.
    assert_eq!(offered(s, 1), offered(s, 0));
    assert_eq!(instructions_of(s, 1), instructions_of(s, 0));
    assert_eq!(
        outcome_of(s, s.conn, "run-2", "turn_1:1:tool:s0.c2"),
        json!({"kind": "completed", "output": "Echo: two"})
    );
    let call = &s.gates.toolgate.requests_of("tool-calls")[1];
    assert_eq!(call.token.as_deref(), Some("run-token-2"));
    assert_eq!(call.key.as_deref(), Some("turn_1:1:tool:s0.c2"));
}

#[tokio::test]
async fn clashing_and_long_names_get_hash_suffixes_stable_across_turns() {
    let m = mcp_setup().await;
    let s = &m.s;
    let long = "a-server-name-long-enough-that-server-and-tool-pass-64-chars";
    for name in ["docs.v1", "docs_v1", long] {
        s.gates.toolgate.add_server(name, m.py.spec(), PY_KEY);
    }
    let clash = hashed_name("docs.v1", "add");
    s.gates.script([
        fake_gates::tool_call("c1", &clash, json!({"a": 1, "b": 2})),
        fake_gates::tool_call("c2", &hashed_name(long, "whoami"), json!({})),
        fake_gates::text("done"),
    ]);
    let servers = json!([{"name": "docs.v1"}, {"name": "docs_v1"}, {"name": long}]);
    let ts = mcp_turn_start(json!("Add."), servers);
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");

    let names = offered(s, 0);
    let own: Vec<Value> = sandbox_tools();
    let mcp_names: Vec<&String> = names
        .iter()
        .filter(|n| !own.iter().any(|t| t["name"] == n.as_str()))
        .collect();
    assert_eq!(mcp_names.len(), 18);
    let mut unique = mcp_names.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 18, "{names:?}");
    for n in &names {
        assert!(valid_name(n), "{n}");
    }
    for tool in ["add", "whoami"] {
        assert!(names.contains(&hashed_name("docs.v1", tool)), "{names:?}");
        assert!(names.contains(&hashed_name("docs_v1", tool)), "{names:?}");
        assert!(names.contains(&hashed_name(long, tool)), "{names:?}");
    }
    assert_eq!(hashed_name(long, "whoami").len(), 64);
    // The hashed name reaches the right server and raw tool.
    let calls = s.gates.toolgate.requests_of("tool-calls");
    assert_eq!(calls[0].body["server"], json!({"serverName": "docs.v1"}));
    assert_eq!(calls[0].body["name"], "add");
    assert_eq!(calls[1].body["server"], json!({"serverName": long}));
    assert_eq!(calls[1].body["name"], "whoami");

    // A new turn of the session on the recorded facts offers the same names.
    let facts = s.core.journal().mcp_facts(SESSION).unwrap();
    let (cursor, _) = s.core.journal().transcript(SESSION);
    let mut next = ts;
    next["checkpoint"]["turnId"] = json!("turn_2");
    next["checkpoint"]["input"] = json!("Again.");
    next["transcript"] = json!({"cursor": cursor});
    next["mcp"] = facts;
    s.gates.script([fake_gates::text("ok")]);
    s.core.grant_turn("run-2", "run-token-2", next);
    assert_eq!(wait_end(&s.core, "run-2").await.0, "turn.completed");
    assert_eq!(offered(s, 3), names);
}

#[tokio::test]
async fn disabled_tools_are_not_offered_and_no_facts_means_no_tools() {
    let m = mcp_setup().await;
    let s = &m.s;
    // Nothing declared: no discovery, no MCP tools.
    s.gates.script([fake_gates::text("Hi.")]);
    s.core.grant_turn("run-0", TOKEN, turn_start(json!("Hi.")));
    assert_eq!(wait_end(&s.core, "run-0").await.0, "turn.completed");
    assert!(s.gates.toolgate.requests().is_empty());
    assert!(s.core.journal().mcp_reports().is_empty());

    let servers = json!([{"name": "py", "tools": {"fail": {"enabled": false},
                                                  "slow": {"enabled": false}}}]);
    let mut ts = mcp_turn_start(json!("Go."), servers);
    ts["checkpoint"]["turnId"] = json!("turn_2");
    s.gates.script([fake_gates::text("Done.")]);
    s.core.grant_turn("run-1", "run-token-2", ts);
    assert_eq!(wait_end(&s.core, "run-1").await.0, "turn.completed");
    let py: Vec<String> = offered(s, 1)
        .into_iter()
        .filter(|n| n.starts_with("py__"))
        .collect();
    assert_eq!(py, ["py__add", "py__big_text", "py__tick", "py__whoami"]);
}

#[tokio::test]
async fn tools_are_listed_page_by_page_up_to_a_bound() {
    let m = mcp_setup().await;
    let s = &m.s;
    // Pages of one tool: every tool of every page is offered.
    s.gates.toolgate.page_tools(1, false);
    s.gates.script([fake_gates::text("Listed.")]);
    let ts = mcp_turn_start(json!("List."), json!([{"name": "py"}]));
    s.core.grant_turn("run-1", TOKEN, ts.clone());
    assert_eq!(wait_end(&s.core, "run-1").await.0, "turn.completed");
    let lists = s.gates.toolgate.requests_of("mcp/list");
    assert_eq!(lists.len(), 6);
    let cursors: Vec<Value> = lists.iter().map(|r| r.body["cursor"].clone()).collect();
    assert_eq!(
        cursors,
        [
            Value::Null,
            json!("1"),
            json!("2"),
            json!("3"),
            json!("4"),
            json!("5")
        ]
    );
    let py: Vec<String> = offered(s, 0)
        .into_iter()
        .filter(|n| n.starts_with("py__"))
        .collect();
    assert_eq!(py.len(), 6);

    // A server whose pages never end: podhost stops after 100 and says so.
    s.gates.toolgate.page_tools(1, true);
    let mut endless = ts;
    endless["checkpoint"]["sessionId"] = json!("ses_2");
    endless["checkpoint"]["turnId"] = json!("turn_2");
    s.gates.script([fake_gates::text("Nothing.")]);
    s.core.grant_turn("run-2", "run-token-2", endless);
    let (method, output) = wait_end(&s.core, "run-2").await;
    assert_eq!(method, "turn.completed", "{output}");
    let report = s.core.journal().mcp_reports()[1].1.clone();
    assert_eq!(
        report,
        json!({"runId": "run-2", "diagnostics": [{"server": {"serverName": "py"},
               "stage": "list", "code": "invalid",
               "message": "the server lists more than 100 pages of tools"}]})
    );
    assert_eq!(
        s.gates.toolgate.requests_of("mcp/list").len() - lists.len(),
        100
    );
    assert!(!offered(s, 1).iter().any(|n| n.starts_with("py__")));
}
