//! Retried and concurrent submissions: applied once, answered with the current status; a fresh
//! key from a retry or a resume is used for later model calls.

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{Serve, T, resume, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};

#[tokio::test]
async fn ten_identical_submits_at_once_make_one_turn() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.push([Reply::Delay(
        std::time::Duration::from_millis(200),
        Box::new(Reply::text("once")),
    )]);
    let s = std::sync::Arc::new(Serve::start(dir.path()));
    let body = start("s", "i", "do it once", &fake.base_url(), Some("k"));
    for (code, body) in s.submit_concurrently(body, 10).await {
        assert_eq!(code, StatusCode::ACCEPTED, "{body}");
        assert!(
            ["queued", "running"].contains(&body["status"].as_str().unwrap()),
            "{body}"
        );
        assert_eq!(body["invocation_id"], "i");
    }
    s.wait_status("i", "completed", T).await;
    let (_, out) = s.collect("i").await;
    assert_eq!(
        out["messages"],
        json!([{"role": "assistant", "content": "once"}])
    );
    assert_eq!(fake.requests().len(), 1);
    // The transcript holds the opening message once.
    assert_eq!(
        fake.requests()[0].body["messages"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn a_retried_start_brings_the_key_used_for_later_calls() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("old-key")).await;
    fake.push([
        Reply::Hang(Box::new(Reply::call("c1", "glob", json!({"pattern": "*"})))),
        Reply::text("done"),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "t", &fake.base_url(), Some("old-key")))
        .await;
    fake.wait_requests(1, T).await;
    // The retry's response was "lost"; Oumi retries with a fresh key.
    fake.accept_keys(&["new-key"]);
    let (code, body) = s
        .submit(start("s", "i", "t", &fake.base_url(), Some("new-key")))
        .await;
    assert_eq!(
        (code, body),
        (StatusCode::ACCEPTED, status_obj("s", "i", "running"))
    );
    fake.release();
    s.wait_status("i", "completed", T).await;
    let auth: Vec<_> = fake
        .requests()
        .iter()
        .map(|r| r.authorization.clone().unwrap())
        .collect();
    assert_eq!(auth, ["Bearer old-key", "Bearer new-key"]);
}

#[tokio::test]
async fn resumes_are_checked_applied_once_and_bring_their_key() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k1")).await;
    fake.push([
        Reply::call("q1", "ask_user", json!({"question": "Which city?"})),
        Reply::Hang(Box::new(Reply::call(
            "g1",
            "glob",
            json!({"pattern": "*.txt"}),
        ))),
        Reply::text("Lyon it is."),
    ]);
    let s = Serve::start(dir.path());
    let url = fake.base_url();
    s.submit(start("s", "i", "plan a trip", &url, Some("k1")))
        .await;
    s.wait_status("i", "input_required", T).await;

    let err = |m: &str| json!({"error": {"message": m}});
    assert_eq!(
        s.submit(resume("s", "i", &[("zz", "Lyon")], &url, "k2"))
            .await,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            err(
                "the resume answers tool call(s) [\"zz\"], which are not pending; the pending calls are [\"q1\"]"
            )
        )
    );
    assert_eq!(
        s.submit(resume("s", "i", &[("q1", "a"), ("q1", "b")], &url, "k2"))
            .await,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            err("input_messages[1] answers tool call \"q1\" a second time")
        )
    );
    assert_eq!(
        s.submit(resume("s", "other", &[("q1", "a")], &url, "k2"))
            .await,
        (
            StatusCode::NOT_FOUND,
            err("no invocation \"other\" was ever submitted")
        )
    );
    assert_eq!(
        s.submit(resume("x", "i", &[("q1", "a")], &url, "k2")).await,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            err("invocation \"i\" belongs to session \"s\", not \"x\"")
        )
    );

    fake.accept_keys(&["k2", "k3"]);
    let first = s
        .submit(resume("s", "i", &[("q1", "Lyon")], &url, "k2"))
        .await;
    assert_eq!(
        first,
        (StatusCode::ACCEPTED, status_obj("s", "i", "queued"))
    );
    fake.wait_requests(2, T).await;
    // Retried while the first is still being processed: the current status, applied once, and
    // its key is used from the next model call on.
    let again = s
        .submit(resume("s", "i", &[("q1", "Lyon")], &url, "k3"))
        .await;
    assert_eq!(
        again,
        (StatusCode::ACCEPTED, status_obj("s", "i", "running"))
    );
    fake.release();
    s.wait_status("i", "completed", T).await;
    let again = s
        .submit(resume("s", "i", &[("q1", "Lyon")], &url, "k3"))
        .await;
    assert_eq!(again, (StatusCode::OK, status_obj("s", "i", "completed")));

    let reqs = fake.requests();
    let auth: Vec<_> = reqs
        .iter()
        .map(|r| r.authorization.clone().unwrap())
        .collect();
    assert_eq!(auth, ["Bearer k1", "Bearer k2", "Bearer k3"]);
    let tools: Vec<_> = reqs[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect();
    assert_eq!(
        tools,
        [json!({"role": "tool", "tool_call_id": "q1", "content": "Lyon"})]
    );
    let (_, out) = s.collect("i").await;
    let msgs = out["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{out}");
    assert_eq!(msgs[0]["tool_calls"][0]["id"], "g1");
    assert_eq!(msgs[1]["tool_call_id"], "g1");
    assert_eq!(
        msgs[2],
        json!({"role": "assistant", "content": "Lyon it is."})
    );
}

#[tokio::test]
async fn concurrent_resumes_apply_once_and_misplaced_submissions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([
        Reply::call("q1", "ask_user", json!({"question": "A?"})),
        Reply::Delay(
            std::time::Duration::from_millis(200),
            Box::new(Reply::call("q2", "ask_user", json!({"question": "B?"}))),
        ),
    ]);
    let s = std::sync::Arc::new(Serve::start(dir.path()));
    let url = fake.base_url();
    s.submit(start("s", "i", "x", &url, None)).await;
    s.wait_status("i", "input_required", T).await;

    // A second start in the same session under another invocation id.
    let err = |m: &str| json!({"error": {"message": m}});
    assert_eq!(
        s.submit(start("s", "other", "x", &url, None)).await,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            err("session \"s\" already holds invocation \"i\"; a session has one invocation")
        )
    );

    let body = resume("s", "i", &[("q1", "a")], &url, "k");
    for (code, body) in s.submit_concurrently(body, 10).await {
        assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    }
    s.wait_status("i", "input_required", T).await;
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    let answers = reqs[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .count();
    assert_eq!(answers, 1);
    let (_, out) = s.collect("i").await;
    assert_eq!(out["messages"][0]["tool_calls"][0]["id"], "q2");

    // A resume that is neither for the pending question nor a retry of the last one.
    assert_eq!(
        s.submit(resume("s", "i", &[("q9", "a")], &url, "k")).await,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            err(
                "the resume answers tool call(s) [\"q9\"], which are not pending; the pending calls are [\"q2\"]"
            )
        )
    );
    // Cancelling a turn that waits for input.
    assert_eq!(
        s.cancel("s", "i").await,
        (StatusCode::OK, status_obj("s", "i", "cancelled"))
    );
    assert_eq!(
        s.submit(resume("s", "i", &[("q2", "b")], &url, "k")).await,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            err(
                "invocation \"i\" is cancelled, not waiting for input; a resume answers the questions of an input_required turn"
            )
        )
    );
    // The retry of the last applied resume still answers the current status.
    assert_eq!(
        s.submit(resume("s", "i", &[("q1", "a")], &url, "k")).await,
        (StatusCode::OK, status_obj("s", "i", "cancelled"))
    );
}
