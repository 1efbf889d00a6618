//! Turns: tools, ask_user round trips and splits, unique call ids, parallel sessions,
//! generation settings.

use std::sync::Arc;

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Serve, T, resume, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};

fn tool_text(messages: &Value, call: &str) -> String {
    messages
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["tool_call_id"] == call)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no answer to {call}: {messages}"))
        .to_owned()
}

#[tokio::test]
async fn mixed_ask_user_and_bash_are_split_and_the_round_trip_completes() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.push([
        Reply::Calls {
            text: Some("Let me check, and ask you.".into()),
            calls: vec![
                (
                    "a1".into(),
                    "ask_user".into(),
                    json!({"question": "Name?"}).to_string(),
                ),
                (
                    "b1".into(),
                    "bash".into(),
                    json!({"command": "echo hello-from-bash"}).to_string(),
                ),
            ],
        },
        Reply::text("Thanks, Ada."),
    ]);
    let s = Serve::start(dir.path());
    let url = fake.base_url();
    s.submit(start("s", "i", "greet me", &url, Some("k"))).await;
    s.wait_status("i", "input_required", T).await;
    let (code, out) = s.collect("i").await;
    assert_eq!(code, StatusCode::OK);
    let msgs = out["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{out}");
    assert_eq!(
        msgs[0],
        json!({"role": "assistant", "content": "Let me check, and ask you.", "tool_calls": [
            {"id": "b1", "type": "function", "function": {"name": "bash",
             "arguments": "{\"command\":\"echo hello-from-bash\"}"}}]})
    );
    assert!(
        tool_text(&out["messages"], "b1").contains("hello-from-bash"),
        "{out}"
    );
    assert_eq!(
        msgs[2],
        json!({"role": "assistant", "tool_calls": [
            {"id": "a1", "type": "function", "function": {"name": "ask_user",
             "arguments": "{\"question\":\"Name?\"}"}}]})
    );
    assert_eq!(out["status"], "input_required");

    let (code, body) = s
        .submit(resume("s", "i", &[("a1", "Ada")], &url, "k"))
        .await;
    assert_eq!(
        (code, body),
        (StatusCode::ACCEPTED, status_obj("s", "i", "queued"))
    );
    s.wait_status("i", "completed", T).await;
    let (_, out) = s.collect("i").await;
    assert_eq!(
        out["messages"],
        json!([{"role": "assistant", "content": "Thanks, Ada."}])
    );
    // The model saw a transcript that keeps the chat rules (the fake enforces them) and the
    // answer to the question.
    let last = &fake.requests()[1].body["messages"];
    assert_eq!(
        last.as_array().unwrap().last().unwrap(),
        &json!({"role": "tool", "tool_call_id": "a1", "content": "Ada"})
    );
}

#[tokio::test]
async fn reused_call_ids_are_made_unique_and_bad_arguments_answered_as_errors() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([
        Reply::Calls {
            text: None,
            calls: vec![("call_0".into(), "read".into(), "{broken".into())],
        },
        Reply::Calls {
            text: None,
            calls: vec![("call_0".into(), "nosuchtool".into(), "{}".into())],
        },
        Reply::Calls {
            text: None,
            calls: vec![(String::new(), "glob".into(), "{}".into())],
        },
        Reply::text("gave up"),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "x", &fake.base_url(), None)).await;
    s.wait_status("i", "completed", T).await;
    let (_, out) = s.collect("i").await;
    let ids: Vec<&str> = out["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["tool_calls"][0]["id"].as_str())
        .collect();
    assert_eq!(ids, ["call_0", "call_0_2", "call_2_1"]);
    assert_eq!(
        tool_text(&out["messages"], "call_0"),
        r#"{"kind":"failed","code":"tool.invalid_input","message":"The arguments of this read call are not a JSON object: \"{broken\". Call the tool again with a JSON object as its arguments."}"#
    );
    assert_eq!(
        tool_text(&out["messages"], "call_0_2"),
        r#"{"kind":"failed","code":"tool.unknown","message":"There is no tool named \"nosuchtool\". The tools are bash, read, write, edit, grep, glob, bash_output, bash_kill and ask_user."}"#
    );
    // Malformed arguments are returned as the model wrote them.
    assert_eq!(
        out["messages"][0]["tool_calls"][0]["function"]["arguments"],
        "{broken"
    );
}

#[tokio::test]
async fn generation_settings_pass_through_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::text("ok")]);
    let s = Serve::start(dir.path());
    let settings = json!({"temperature": 0.3, "top_p": 0.9, "max_tokens": 123, "seed": 7,
                          "stop": ["END"], "extra_body_thing": {"nested": [1, 2]}});
    let mut body = start("s", "i", "x", &fake.base_url(), None);
    body["model_connection"]["generation_settings"] = settings.clone();
    s.submit(body).await;
    s.wait_status("i", "completed", T).await;
    let sent = &fake.requests()[0].body;
    for (k, v) in settings.as_object().unwrap() {
        assert_eq!(&sent[k], v, "{k}");
    }
    let mut keys: Vec<&str> = sent
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "extra_body_thing",
            "max_tokens",
            "messages",
            "model",
            "seed",
            "stop",
            "temperature",
            "tools",
            "top_p"
        ]
    );
}

#[tokio::test]
async fn ten_parallel_sessions_keep_their_workspaces_apart() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    // Each session writes its own marker with bash, then lists its directory.
    fake.respond_with(|body| {
        let msgs = body["messages"].as_array().unwrap();
        let task = msgs[1]["content"].as_str().unwrap().to_owned();
        match msgs.iter().filter(|m| m["role"] == "tool").count() {
            0 => Reply::call(
                "w",
                "bash",
                json!({"command": format!("echo {task} > mine.txt")}),
            ),
            1 => Reply::call("l", "bash", json!({"command": "ls; cat mine.txt"})),
            _ => Reply::text(&format!("done {task}")),
        }
    });
    let s = Arc::new(Serve::start(dir.path()));
    let url = fake.base_url();
    let tasks: Vec<_> = (0..10)
        .map(|n| {
            let (s, url) = (s.clone(), url.clone());
            tokio::spawn(async move {
                let (sid, iid) = (format!("s{n}"), format!("i{n}"));
                s.submit(start(&sid, &iid, &format!("marker{n}"), &url, None))
                    .await;
                s.wait_status(&iid, "completed", T * 3).await;
                s.collect(&iid).await.1
            })
        })
        .collect();
    for (n, t) in tasks.into_iter().enumerate() {
        let out = t.await.unwrap();
        assert!(
            tool_text(&out["messages"], "l").contains("mine.txt"),
            "{out}"
        );
        let listing = tool_text(&out["messages"], "l");
        for other in (0..10).filter(|o| *o != n) {
            assert!(!listing.contains(&format!("marker{other}")), "{listing}");
        }
        assert!(listing.contains(&format!("marker{n}")), "{listing}");
        let file = s.read_file(&format!("s{n}"), "mine.txt");
        assert_eq!(file, Some(format!("marker{n}\n")));
    }
    let mut dirs: Vec<_> = std::fs::read_dir(s.data.join("sessions"))
        .unwrap()
        .collect();
    dirs.retain(|d| d.is_ok());
    assert_eq!(dirs.len(), 10);
}

#[tokio::test]
async fn fields_past_the_protocol_in_submitted_messages_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::text("hello")]);
    let s = Serve::start(dir.path());
    let mut body = start("s", "i", "x", &fake.base_url(), None);
    // A dataset row's messages may carry more than the protocol's fields.
    body["input_messages"] = json!([
        {"role": "system", "content": "Be brief.", "name": "policy"},
        {"role": "user", "content": "Say hello.", "name": "alice", "weight": 1}
    ]);
    assert_eq!(s.submit(body).await.0, StatusCode::ACCEPTED);
    s.wait_status("i", "completed", T).await;
    // The model sees the messages without the extra fields.
    let sent = &fake.requests()[0].body["messages"];
    let theirs: Vec<&Value> = sent
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["content"] == "Be brief." || m["content"] == "Say hello.")
        .collect();
    assert_eq!(
        theirs,
        [
            &json!({"role": "system", "content": "Be brief."}),
            &json!({"role": "user", "content": "Say hello."})
        ]
    );
    let (code, out) = s.collect("i").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        out["messages"],
        json!([{"role": "assistant", "content": "hello"}])
    );
}

#[tokio::test]
async fn a_session_cannot_reach_another_sessions_files_or_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let s = Serve::start(dir.path());
    let url = fake.base_url();

    // Session a leaves a secret in its workspace.
    fake.push([
        Reply::call(
            "w",
            "bash",
            json!({"command": "echo secret-of-a > secret.txt"}),
        ),
        Reply::text("written"),
    ]);
    s.submit(start("a", "ia", "write", &url, None)).await;
    s.wait_status("ia", "completed", T).await;
    let theirs = s.workspace("a").join("secret.txt");
    assert_eq!(
        s.read_file("a", "secret.txt").as_deref(),
        Some("secret-of-a\n")
    );

    // Session b tries every way to it, and to the database.
    let data = s.data.canonicalize().unwrap();
    let db = data.join("podhost.sqlite");
    let (theirs, db) = (theirs.display().to_string(), db.display().to_string());
    fake.push([
        Reply::call(
            "b1",
            "bash",
            json!({"command": format!(
                "cat {theirs}; echo rc=$?; cat {db} >/dev/null; echo rc=$?; \
                 ls {data} >/dev/null; echo rc=$?; echo x > /tmp/podhost-leak-$$; echo rc=$?; \
                 echo mine > ok.txt && cat ok.txt; touch \"$TMPDIR/t\" && echo private-tmp-ok",
                data = data.display()
            )}),
        ),
        Reply::call("b2", "read", json!({"path": theirs})),
        Reply::text("tried"),
    ]);
    s.submit(start("b", "ib", "snoop", &url, None)).await;
    s.wait_status("ib", "completed", T).await;
    let (_, out) = s.collect("ib").await;
    let bash: Value = serde_json::from_str(&tool_text(&out["messages"], "b1")).unwrap();
    let stdout = bash["stdout"].as_str().unwrap();
    assert_eq!(
        stdout, "rc=1\nrc=1\nrc=2\nrc=1\nmine\nprivate-tmp-ok\n",
        "{bash}"
    );
    assert!(!stdout.contains("secret-of-a"));
    // The file tools refuse the other workspace by path before Landlock is even asked.
    let read: Value = serde_json::from_str(&tool_text(&out["messages"], "b2")).unwrap();
    assert_eq!(read["kind"], "failed", "{read}");
    assert_eq!(read["code"], "sandbox.path_denied", "{read}");
}
