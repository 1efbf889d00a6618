//! What MCP and HTTP results become (v5 §5b): a large text stored and read back, an image stored
//! and shown (or not) by the model's inputs, a tool error, an answer past `toolAnswerBytes`,
//! credentials the gate redacts, an HTTP tool, `tool_search` over deferred tools.

use std::sync::{Arc, Mutex};

use axum::Json;
use axum::http::HeaderMap;
use axum::routing::post;
use podhost::nylorun::link::canonical::request_hash;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::fake_gates;
use crate::mcp::{
    EVERYTHING_KEY, PY_KEY, SESSION, TOKEN, instructions_of, mcp_intent, mcp_setup, mcp_turn_start,
    offered, outcome_of, tool_intent,
};
use crate::turn::wait_end;

/// `<effect id>:spill:<part>:<sha256 of the bytes>`, the key podhost stores a part under.
fn spill_key(effect_id: &str, part: &str, bytes: &[u8]) -> String {
    format!(
        "{effect_id}:spill:{part}:{}",
        hex::encode(Sha256::digest(bytes))
    )
}

/// What `big_text(kib)` answers.
fn big_text(kib: usize) -> String {
    let mut out = String::new();
    let mut n = 0;
    while out.len() < kib * 1024 {
        out.push_str(&format!("line {n:06} of a long answer\n"));
        n += 1;
    }
    out.truncate(kib * 1024);
    out
}

fn preview(text: &str) -> String {
    format!("{}\n…\n{}", &text[..4096], &text[text.len() - 1024..])
}

#[tokio::test]
async fn a_large_text_result_is_stored_and_read_back() {
    let m = mcp_setup().await;
    let s = &m.s;
    let effect = "turn_1:0:tool:s0.c1";
    // The second step's answer waits for the artifact's id.
    s.gates.script([
        fake_gates::tool_call("c1", "py__big_text", json!({"kib": 100})),
        fake_gates::Reply::Hang,
        fake_gates::text("Read it."),
    ]);
    let ts = mcp_turn_start(json!("Get the long text."), json!([{"name": "py"}]));
    s.core.grant_turn("run-1", TOKEN, ts);
    // After the result, the model reads the stored text with read_artifact.
    let stub = s
        .core
        .journal()
        .wait_row(effect, |r| r.value.is_some())
        .await
        .value
        .unwrap();
    let text = big_text(100);
    // The SDK sends the text twice: as a text part and as the typed result. Each is stored
    // (largest first) and the model reads a preview of each.
    let structured = json!({"result": text}).to_string();
    let part = stub["output"]["content"][0]["artifactId"]
        .as_str()
        .unwrap()
        .to_owned();
    let whole = stub["output"]["structuredContent"]["artifactId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        stub,
        json!({"kind": "completed", "output": {
            "content": [{"type": "text", "truncated": true, "artifactId": part,
                         "size": 102_400, "preview": preview(&text)}],
            "structuredContent": {"truncated": true, "artifactId": whole,
                                  "size": structured.len(), "preview": preview(&structured)}}})
    );
    // Stored once each, keyed by the call, the part and the bytes, the call as provenance.
    let arts = s.core.artifacts();
    assert_eq!(arts.file_bytes(SESSION, &part, 1), text.as_bytes());
    assert_eq!(arts.file_bytes(SESSION, &whole, 1), structured.as_bytes());
    assert_eq!(arts.effect_of(SESSION, &part, 1).as_deref(), Some(effect));
    let names: Vec<Value> = arts
        .list(SESSION)
        .iter()
        .map(|a| a["name"].clone())
        .collect();
    assert_eq!(
        names,
        [
            json!("py__big_text-structured.json"),
            json!("py__big_text-part0.txt")
        ]
    );
    let keys: Vec<(Value, Value)> = s
        .core
        .run_frames(s.conn, "run-1")
        .into_iter()
        .filter(|(m, p)| m == "artifact.write" && p["op"] == "begin")
        .map(|(_, p)| (p["key"].clone(), p["effectId"].clone()))
        .collect();
    assert_eq!(
        keys,
        [
            (
                json!(spill_key(effect, "structured", structured.as_bytes())),
                json!(effect)
            ),
            (
                json!(spill_key(effect, "part0", text.as_bytes())),
                json!(effect)
            ),
        ]
    );
    let artifact = part;

    s.gates.wait_call(1).await;
    let read = fake_gates::tool_call("c2", "read_artifact", json!({"artifactId": artifact}));
    s.gates
        .release("turn_1:0:model:s1", crate::turn::candidate_of(&read));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let read = outcome_of(s, s.conn, "run-1", "turn_1:0:tool:s1.c2");
    let got = read["output"].as_str().unwrap();
    assert!(
        got.contains(&text[..30 * 1024]),
        "read_artifact did not give the text back: {}",
        &got[..200]
    );
}

#[tokio::test]
async fn an_image_is_stored_and_shown_only_to_a_model_that_reads_images() {
    let m = mcp_setup().await;
    let s = &m.s;
    for (run, turn, inputs) in [
        ("run-1", "turn_1", json!(["text", "image"])),
        ("run-2", "turn_2", json!(["text"])),
    ] {
        s.gates.script([
            fake_gates::tool_call("c1", "everything__get-tiny-image", json!({})),
            fake_gates::text("A logo."),
        ]);
        let mut ts = mcp_turn_start(json!("Show me the image."), json!([{"name": "everything"}]));
        ts["checkpoint"]["turnId"] = json!(turn);
        ts["model"]["inputs"] = inputs;
        if run == "run-2" {
            ts["mcp"] = s.core.journal().mcp_facts(SESSION).unwrap();
        }
        s.core.grant_turn(run, &format!("token-{run}"), ts);
        assert_eq!(wait_end(&s.core, run).await.0, "turn.completed");
    }
    let value = outcome_of(s, s.conn, "run-1", "turn_1:0:tool:s0.c1");
    let artifact = value["output"]["content"][1]["artifactId"]
        .as_str()
        .unwrap()
        .to_owned();
    let png = s.core.artifacts().file_bytes(SESSION, &artifact, 1);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let file = json!({"mediaType": "image/png", "reference": {"artifactId": artifact, "version": 1,
                      "name": "everything__get-tiny-image-part1.png"}});
    assert_eq!(
        value,
        json!({"kind": "completed",
               "output": {"content": [
                   {"type": "text", "text": "Here's the image you requested:"},
                   {"type": "image", "contentType": "image/png", "size": png.len(),
                    "artifactId": artifact, "version": 1},
                   {"type": "text", "text": "The image above is the MCP logo."}]},
               "files": [file]})
    );
    // The model that reads images gets it as a file; the other one a note.
    let result_of = |n: usize| -> Value {
        let prompt = s.gates.calls()[n].body["call"]["prompt"].clone();
        prompt.as_array().unwrap().last().unwrap()["content"].clone()
    };
    let shown = result_of(1);
    assert_eq!(
        shown[1],
        json!({"type": "media", "mediaType": "image/png", "reference": file["reference"]})
    );
    // The second turn's call stored the same bytes under its own effect id.
    let second = outcome_of(s, s.conn, "run-2", "turn_2:0:tool:s0.c1");
    let artifact2 = second["output"]["content"][1]["artifactId"]
        .as_str()
        .unwrap();
    let note = result_of(3);
    assert_eq!(
        note[1],
        json!({"type": "text", "text": format!(
            "[Attached file everything__get-tiny-image-part1.png (image/png). This model cannot \
             read image files, so it is not shown here. Call read_artifact with artifactId \
             \"{artifact2}\" to read it.]")})
    );
}

#[tokio::test]
async fn tool_errors_and_oversized_answers_are_outcomes_the_model_reads() {
    let m = mcp_setup().await;
    let s = &m.s;
    s.gates.script([
        fake_gates::tool_call("c1", "py__fail", json!({"message": "boom"})),
        fake_gates::tool_call("c2", "py__big_text", json!({"kib": 64})),
        fake_gates::tool_call("c3", "py__add", json!({"a": "not a number", "b": 1})),
        fake_gates::text("Two failures."),
    ]);
    let mut ts = mcp_turn_start(json!("Try."), json!([{"name": "py"}]));
    ts["limits"]["toolAnswerBytes"] = json!(16384);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    assert_eq!(
        outcome_of(s, s.conn, "run-1", "turn_1:0:tool:s0.c1"),
        json!({"kind": "failed", "code": "mcp.tool_error", "message": "Error executing tool fail"})
    );
    let too_large = outcome_of(s, s.conn, "run-1", "turn_1:0:tool:s1.c2");
    assert_eq!(too_large["kind"], "failed");
    assert_eq!(too_large["code"], "mcp.too-large");
    assert!(
        too_large["message"]
            .as_str()
            .unwrap()
            .ends_with("past limits.toolAnswerBytes (16384 bytes)"),
        "{too_large}"
    );
    let invalid = outcome_of(s, s.conn, "run-1", "turn_1:0:tool:s2.c3");
    assert_eq!(invalid["kind"], "failed");
    assert_eq!(invalid["code"], "mcp.tool_error");
    // The model read each as a failure.
    let last = s.gates.calls()[3].body["call"]["prompt"].clone();
    let statuses: Vec<&str> = last
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "tool-result")
        .map(|i| i["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["failed", "failed", "failed"]);
}

#[tokio::test]
async fn echoed_credentials_are_redacted_and_the_tool_gets_the_key() {
    let m = mcp_setup().await;
    let s = &m.s;
    s.gates.script([
        fake_gates::tool_call("c1", "py__whoami", json!({})),
        fake_gates::tool_call("c2", "everything__get-env", json!({})),
        fake_gates::text("Done."),
    ]);
    let ts = mcp_turn_start(
        json!("Who am I?"),
        json!([{"name": "py"}, {"name": "everything"}]),
    );
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    let who = outcome_of(s, s.conn, "run-1", "turn_1:0:tool:s0.c1");
    let said: Value =
        serde_json::from_str(who["output"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(
        said,
        json!({"authorization": "Bearer [redacted]", "idempotencyKey": "turn_1:0:tool:s0.c1"})
    );
    let env = outcome_of(s, s.conn, "run-1", "turn_1:0:tool:s1.c2").to_string();
    assert!(env.contains("EVERYTHING_API_KEY"), "{env}");
    assert!(env.contains("[redacted]"), "{env}");
    let transcript = output.to_string();
    for secret in [PY_KEY, EVERYTHING_KEY, TOKEN] {
        assert!(
            !transcript.contains(secret),
            "{secret} reached the transcript"
        );
        assert!(!env.contains(secret));
    }
}

#[tokio::test]
async fn an_http_tool_runs_through_http_calls() {
    let m = mcp_setup().await;
    let s = &m.s;
    // The tool itself: echoes what it got, headers included.
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let log = seen.clone();
    let app = axum::Router::new().route(
        "/weather",
        post(move |headers: HeaderMap, Json(input): Json<Value>| {
            let log = log.clone();
            async move {
                let h = |n: &str| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let echo = json!({"input": input, "authorization": h("authorization"),
                                  "idempotencyKey": h("idempotency-key"), "forecast": "sun"});
                log.lock().unwrap().push(echo.clone());
                Json(echo)
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/weather", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let credential = "weather-api-key-55aa";
    s.gates.toolgate.add_http_tool("weather", &url, credential);

    s.gates.script([
        fake_gates::tool_call("c1", "weather", json!({"city": "Oslo"})),
        fake_gates::text("Sunny."),
    ]);
    let mut ts = mcp_turn_start(json!("Weather?"), json!([]));
    ts["manifest"]["tools"] = json!([{"name": "weather", "type": "http",
        "description": "Today's weather in a city.",
        "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]}}]);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");

    let tools = s.gates.calls()[0].body["call"]["tools"].clone();
    assert_eq!(
        tools.as_array().unwrap().last().unwrap(),
        &json!({"name": "weather", "description": "Today's weather in a city.",
                "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}})
    );
    let effect = "turn_1:0:tool:s0.c1";
    let mut intent = tool_intent(0, 0, "c1", "weather", json!({"city": "Oslo"}));
    intent["target"] = json!({"kind": "http", "tool": "weather"});
    let frames = s.core.run_frames(s.conn, "run-1");
    assert!(frames.iter().any(|(m, p)| m == "effect.intent"
        && *p
            == json!({"runId": "run-1", "effect": intent, "requestHash": request_hash(&intent)})));
    let calls = s.gates.toolgate.requests_of("http-calls");
    assert_eq!(
        calls[0].body,
        json!({"tool": {"toolName": "weather"}, "effectId": effect, "input": {"city": "Oslo"}})
    );
    assert_eq!(calls[0].key.as_deref(), Some(effect));
    assert_eq!(
        outcome_of(s, s.conn, "run-1", effect),
        json!({"kind": "completed", "output": {"status": 200, "body": {
            "input": {"city": "Oslo"}, "authorization": "Bearer [redacted]",
            "idempotencyKey": effect, "forecast": "sun"}}})
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(!output.to_string().contains(credential));
}

#[tokio::test]
async fn deferred_tools_are_loaded_with_tool_search() {
    let m = mcp_setup().await;
    let s = &m.s;
    s.gates.script([
        fake_gates::tool_call("c1", "tool_search", json!({"query": "echo"})),
        fake_gates::tool_call("c2", "everything__echo", json!({"message": "found"})),
        fake_gates::text("Echoed."),
    ]);
    let servers = json!([{"name": "everything", "tools": {
        "echo": {"deferred": true}, "get-sum": {"deferred": true}, "get-env": {"enabled": false}}}]);
    let ts = mcp_turn_start(json!("Echo something."), servers);
    s.core.grant_turn("run-1", TOKEN, ts);
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");

    let first = offered(s, 0);
    assert!(!first.contains(&"everything__echo".to_owned()));
    assert!(!first.contains(&"everything__get-sum".to_owned()));
    assert!(!first.contains(&"everything__get-env".to_owned()));
    assert_eq!(first.last().unwrap(), "tool_search");
    assert!(instructions_of(s, 0).contains(
        "More tools are available but not loaded: everything__echo, everything__get-sum. Call \
         tool_search to load the ones you need; you can call them from your next step."
    ));
    // The search is a journaled harness call; its result loads echo for the next step.
    let search = tool_intent(0, 0, "c1", "tool_search", json!({"query": "echo"}));
    let mut search = search;
    search["target"] = json!({"kind": "harness"});
    let frames = s.core.run_frames(s.conn, "run-1");
    assert!(frames.iter().any(|(m, p)| m == "effect.intent"
        && p["requestHash"] == request_hash(&search)
        && p["effect"] == search));
    let found = outcome_of(s, s.conn, "run-1", "turn_1:0:tool:s0.c1");
    let tools = found["output"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0]["name"], "everything__echo");
    let second = offered(s, 1);
    assert_eq!(second.last().unwrap(), "everything__echo");
    assert_eq!(second[..second.len() - 1], first[..]);
    let echo = mcp_intent(
        0,
        1,
        "c2",
        "everything__echo",
        "everything",
        "echo",
        json!({"message": "found"}),
    );
    assert!(frames.iter().any(|(m, p)| m == "effect.intent"
        && p["effect"] == echo
        && p["requestHash"] == request_hash(&echo)));
    assert_eq!(
        outcome_of(s, s.conn, "run-1", "turn_1:0:tool:s1.c2"),
        json!({"kind": "completed", "output": "Echo: found"})
    );
}
