//! Every route and status code of the protocol, authentication and body limits.

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Serve, T, TOKEN, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};

fn err(msg: &str) -> Value {
    json!({"error": {"message": msg}})
}

#[tokio::test]
async fn a_text_answer_completes_and_its_output_is_collected() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k1")).await;
    fake.push([Reply::text("Paris.")]);
    let s = Serve::start(dir.path());

    let (code, body) = s
        .submit(start(
            "s1",
            "i1",
            "Capital of France?",
            &fake.base_url(),
            Some("k1"),
        ))
        .await;
    assert_eq!(
        (code, body),
        (StatusCode::ACCEPTED, status_obj("s1", "i1", "queued"))
    );
    let done = s.wait_status("i1", "completed", T).await;
    assert_eq!(done, status_obj("s1", "i1", "completed"));

    let (code, out) = s.collect("i1").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(
        out,
        json!({"protocol_version": "1", "session_id": "s1", "invocation_id": "i1",
               "status": "completed",
               "messages": [{"role": "assistant", "content": "Paris."}]})
    );
    // A retry of a terminal invocation answers 200 with its status.
    let (code, body) = s
        .submit(start(
            "s1",
            "i1",
            "Capital of France?",
            &fake.base_url(),
            Some("k2"),
        ))
        .await;
    assert_eq!(
        (code, body),
        (StatusCode::OK, status_obj("s1", "i1", "completed"))
    );

    // What the model got: our system message first, the transcript, nine tools, the key.
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    let b = &reqs[0].body;
    assert_eq!(b["model"], "fake-model");
    assert_eq!(b["messages"][0]["role"], "system");
    let ws = s.workspace("s1");
    assert!(
        b["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains(&ws.display().to_string()),
        "{}",
        b["messages"][0]
    );
    assert_eq!(
        b["messages"][1],
        json!({"role": "user", "content": "Capital of France?"})
    );
    assert_eq!(b["tools"].as_array().unwrap().len(), 9);
    assert_eq!(reqs[0].authorization.as_deref(), Some("Bearer k1"));
    assert!(
        reqs[0].headers.iter().all(|(k, _)| k != "accept-encoding")
            || reqs[0]
                .headers
                .iter()
                .any(|(k, v)| k == "accept-encoding" && v == "identity")
    );
}

#[tokio::test]
async fn unknown_invocations_are_404_and_output_is_409_until_it_exists() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::Hang(Box::new(Reply::text("late")))]);
    let s = Serve::start(dir.path());

    let never = err("no invocation \"nope\" was ever submitted");
    assert_eq!(
        s.status("nope").await,
        (StatusCode::NOT_FOUND, never.clone())
    );
    assert_eq!(
        s.collect("nope").await,
        (StatusCode::NOT_FOUND, never.clone())
    );
    assert_eq!(s.cancel("s", "nope").await, (StatusCode::NOT_FOUND, never));

    s.submit(start("s2", "i2", "wait", &fake.base_url(), None))
        .await;
    fake.wait_requests(1, T).await;
    assert_eq!(
        s.status("i2").await,
        (StatusCode::OK, status_obj("s2", "i2", "running"))
    );
    assert_eq!(
        s.collect("i2").await,
        (
            StatusCode::CONFLICT,
            err("output of invocation \"i2\" is not available yet (status running)")
        )
    );
    fake.release();
    s.wait_status("i2", "completed", T).await;
    assert_eq!(s.collect("i2").await.0, StatusCode::OK);
}

/// The confinement level `podhost serve` reports on this machine: the policy its default
/// settings give (namespaces, uid pool, cgroups as this machine allows), with podhost
/// non-dumpable (this test process is not).
fn serve_confinement() -> serde_json::Value {
    use clap::Parser;
    let cli = podhost::config::Cli::try_parse_from(["podhost", "serve"]).unwrap();
    let podhost::config::Command::Serve(args) = cli.command else {
        panic!("not serve")
    };
    let mut exec = args.config().unwrap().exec;
    exec.confine.helper = Some(crate::support::supervisor_bin().to_path_buf());
    let mut level =
        serde_json::to_value(podhost::exec::Confinement::new(&exec.confine).level()).unwrap();
    level["non_dumpable"] = json!(true);
    level
}

#[tokio::test]
async fn every_route_but_the_probes_and_metrics_needs_the_credential() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    assert_eq!(
        s.call("GET", "/healthz", None).await,
        (
            StatusCode::OK,
            json!({"status": "ok", "protocol_version": "1", "running": 0,
                   "version": env!("CARGO_PKG_VERSION"),
                   "revision": env!("BUILD_GIT_REVISION"),
                   "store": {"writable": true}, "sandboxes": {"ok": true},
                   "confinement": serve_confinement()})
        )
    );
    let body = start("s", "i", "x", "http://127.0.0.1:9/v1", None);
    for (method, route) in [
        ("POST", "/submit"),
        ("GET", "/get_status?invocation_id=i"),
        ("GET", "/collect_output?invocation_id=i"),
        ("POST", "/cancel"),
        ("GET", "/healthz"),
        ("GET", "/openapi.yaml"),
    ] {
        let good = format!("Bearer {TOKEN}");
        for auth in [None, Some("Bearer wrong"), Some(good.as_str())] {
            let url = format!("{}{route}", s.url);
            let mut req = if method == "GET" {
                s.http.get(url)
            } else {
                s.http.post(url).json(&body)
            };
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let resp = req.send().await.unwrap();
            let code = resp.status();
            let text = resp.text().await.unwrap();
            let want = match auth {
                None => Some(
                    r#"{"error":{"message":"an Authorization: Bearer credential is required"}}"#,
                ),
                Some("Bearer wrong") => Some(r#"{"error":{"message":"the credential is wrong"}}"#),
                _ => None,
            };
            match want {
                Some(w) => assert_eq!(
                    (code, text.as_str()),
                    (StatusCode::UNAUTHORIZED, w),
                    "{route}"
                ),
                None => assert_ne!(code, StatusCode::UNAUTHORIZED, "{route}"),
            }
        }
    }
    let (code, spec) = s.call("GET", "/openapi.yaml", None).await;
    assert_eq!(code, StatusCode::OK);
    assert!(spec.as_str().unwrap().starts_with("openapi: 3.1"), "{spec}");
    // The probes and the metrics answer anyone, with or without a credential, right or wrong.
    for route in ["/livez", "/readyz", "/metrics"] {
        for auth in [None, Some("Bearer wrong")] {
            let mut req = s.http.get(format!("{}{route}", s.url));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            assert_eq!(
                req.send().await.unwrap().status(),
                StatusCode::OK,
                "{route}"
            );
        }
    }
}

#[tokio::test]
async fn bodies_over_10_mib_are_413_and_bad_bodies_are_400_or_422() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let huge = "x".repeat(10 * 1024 * 1024);
    let body = start("s", "i", &huge, "http://127.0.0.1:9/v1", None);
    assert_eq!(
        s.submit(body).await,
        (
            StatusCode::PAYLOAD_TOO_LARGE,
            err("the request body is larger than 10485760 bytes (10 MiB)")
        )
    );
    // Nothing was stored for it.
    assert_eq!(s.status("i").await.0, StatusCode::NOT_FOUND);

    let raw = s
        .http
        .post(format!("{}/submit", s.url))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    assert!(
        raw.text()
            .await
            .unwrap()
            .starts_with(r#"{"error":{"message":"the body is not valid JSON: "#)
    );

    let base = start("s", "i", "task", "http://127.0.0.1:9/v1", None);
    let with = |path: &str, v: Value| {
        let mut b = base.clone();
        let mut cur = &mut b;
        let parts: Vec<&str> = path.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            cur = &mut cur[*p];
        }
        cur[parts[parts.len() - 1]] = v;
        b
    };
    let cases = [
        (
            with("protocol_version", json!("2")),
            "protocol_version must be \"1\", not \"2\"",
        ),
        (
            with("session_id", json!("")),
            "session_id must not be empty",
        ),
        (
            with("invocation_id", json!("i".repeat(513))),
            "invocation_id is longer than 512 characters",
        ),
        (
            with("session_id", json!("a\u{7}b")),
            "session_id must not hold control characters",
        ),
        (
            with("input_messages", json!([])),
            "input_messages must hold at least one message",
        ),
        (
            with(
                "input_messages",
                json!([{"role": "assistant", "content": "hi"}]),
            ),
            "a start's input_messages must end with a user message",
        ),
        (
            with("model_connection.base_url", json!("ftp://x")),
            "model_connection.base_url must be an http:// or https:// URL",
        ),
    ];
    for (body, message) in cases {
        assert_eq!(
            s.submit(body).await,
            (StatusCode::UNPROCESSABLE_ENTITY, err(message))
        );
    }
    let (code, body) = s.submit(with("session_action", json!("restart"))).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown variant `restart`, expected `start` or `resume`"),
        "{body}"
    );
    let (code, body) = s
        .submit(with(
            "input_messages",
            json!([{"role": "user", "content": [null, null]}]),
        ))
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("content[0]: a content part is an object with a string `type`"),
        "{body}"
    );
    let (code, body) = s.submit(with("extra", json!(1))).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `extra`"),
        "{body}"
    );
    let (code, body) = s.call("GET", "/get_status", None).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("the invocation_id query parameter is required")
    );
    // None of it was stored.
    assert_eq!(s.status("i").await.0, StatusCode::NOT_FOUND);
}

/// The BYOH protocol's key authorizes one request: `POST …/chat/completions`. podhost sends it
/// nowhere else — not to the model listing, even on a server that would answer one — and every
/// model request carries it.
#[tokio::test]
async fn the_evaluators_key_goes_to_chat_completions_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("k1")).await;
    fake.set_listing(Some(
        json!({"data": [{"id": "fake-model", "context_length": 9000}]}),
    ));
    fake.push([
        Reply::call("c1", "bash", json!({"command": "true"})),
        Reply::text("done"),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start("s1", "i1", "go", &fake.base_url(), Some("k1")))
        .await;
    s.wait_status("i1", "completed", T).await;
    assert_eq!(fake.listing_requests(), Vec::<Option<String>>::new());
    let keys: Vec<Option<String>> = fake
        .requests()
        .into_iter()
        .map(|r| r.authorization)
        .collect();
    assert_eq!(keys, vec![Some("Bearer k1".to_owned()); 2]);
}
