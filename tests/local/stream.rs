//! Streaming from the model server: streamed answers (text and tool calls in pieces), a server
//! that only streams, `--no-stream` for whole answers, a server that answers a stream request
//! with one JSON body, and a stream that breaks off (retried).

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::harness::{KEY, output, run_cmd};
use crate::openai_fake::{FakeModel, Reply};

fn streamed(fake: &FakeModel) -> Vec<Value> {
    fake.requests()
        .iter()
        .map(|r| r.body["stream"].clone())
        .collect()
}

#[tokio::test]
async fn a_server_that_only_streams_works() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.stream_only();
    fake.push([
        Reply::calls(&[
            (
                "c1",
                "write",
                json!({"path": "a.txt", "content": "streamed arguments\n"}),
            ),
            ("c2", "read", json!({"path": "a.txt"})),
        ]),
        Reply::text("All written, all read."),
    ]);
    let out = output(run_cmd(&fake, dir.path(), &["go"])).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "All written, all read.\n"),
        "{}",
        out.stderr
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "streamed arguments\n"
    );
    assert_eq!(streamed(&fake), [json!(true), json!(true)]);
    // The calls were assembled from their pieces and answered by id.
    let messages = &fake.requests()[1].body["messages"];
    assert_eq!(
        messages[2]["tool_calls"],
        json!([
            {"id": "c1", "type": "function", "function": {"name": "write",
             "arguments": json!({"path": "a.txt", "content": "streamed arguments\n"}).to_string()}},
            {"id": "c2", "type": "function", "function": {"name": "read",
             "arguments": json!({"path": "a.txt"}).to_string()}},
        ])
    );
    assert_eq!(
        messages[4],
        json!({"role": "tool", "tool_call_id": "c2", "content": "1\tstreamed arguments"})
    );

    // Asked for a whole answer, the same server refuses: exit 3 with its words.
    let out = output(run_cmd(&fake, dir.path(), &["--no-stream", "go"])).await;
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains(
            "✗ model call 1 failed: The model endpoint returned HTTP 400: \
             {\"error\":{\"message\":\"This server only streams: set \\\"stream\\\": true in the \
             request.\"}}"
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn no_stream_asks_for_whole_answers() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([
        Reply::call("c1", "glob", json!({"pattern": "*"})),
        Reply::text("Nothing here."),
    ]);
    let out = output(run_cmd(&fake, dir.path(), &["--no-stream", "go"])).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "Nothing here.\n"),
        "{}",
        out.stderr
    );
    assert_eq!(streamed(&fake), [Value::Null, Value::Null]);
}

#[tokio::test]
async fn a_server_that_ignores_stream_and_answers_json_works() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::Raw(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Plain JSON."},
                     "finish_reason": "stop"}]
    }))]);
    let out = output(run_cmd(&fake, dir.path(), &["go"])).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "Plain JSON.\n"),
        "{}",
        out.stderr
    );
    assert_eq!(streamed(&fake), [json!(true)]);
}

#[tokio::test]
async fn a_stream_that_breaks_off_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([
        Reply::Broken(Box::new(Reply::text("this answer never ends"))),
        Reply::text("Second try."),
    ]);
    let out = output(run_cmd(&fake, dir.path(), &["go"])).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "Second try.\n"),
        "{}",
        out.stderr
    );
    assert_eq!(fake.requests().len(), 2);
}
