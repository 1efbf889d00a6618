//! `podhost run`'s exit codes, each one: 0 only with an answer; 1 a fault of podhost; 2 usage
//! and configuration (nothing is asked); 3 the model failed; 4 the step limit; 5 a question
//! without a terminal. (130 and 143: `signals.rs`.)

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::harness::{KEY, output, podhost, run_cmd};
use crate::openai_fake::{FakeModel, Reply};

/// The lines of `stderr` but the first (the model line) and the summary.
fn middle(stderr: &str) -> Vec<&str> {
    let lines: Vec<&str> = stderr.lines().collect();
    lines[1..lines.len().saturating_sub(1)].to_vec()
}

#[tokio::test]
async fn usage_errors_exit_2_and_ask_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    let ws = dir.path().to_str().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, "").unwrap();
    for (args, env, error) in [
        (
            vec!["run", "--base-url", "127.0.0.1:9/v1", "--model", "m", "go"],
            vec![],
            "podhost run: --base-url \"127.0.0.1:9/v1\" has no scheme; write it as \
             http://127.0.0.1:9/v1 (or https://)",
        ),
        (
            vec!["run", "--model", "m", "go"],
            vec![("OPENAI_BASE_URL", "localhost:11434/v1")],
            "podhost run: OPENAI_BASE_URL \"localhost:11434/v1\" has no scheme; write it as \
             http://localhost:11434/v1 (or https://)",
        ),
        (
            vec!["run", "--base-url", "http://127.0.0.1:9/v1", "go"],
            vec![],
            "podhost run: no model: pass --model NAME or set PODHOST_MODEL",
        ),
        (
            vec!["run", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
            vec![],
            "podhost run: no task: give it as an argument, or `-` to read it from stdin",
        ),
        (
            vec!["run", "--model", "m", "--api-key-env", "NOT_SET_HERE", "go"],
            vec![],
            "podhost run: the API key variable NOT_SET_HERE is not set",
        ),
        (
            vec![
                "run",
                "--model",
                "m",
                "--api-key-env",
                "MY_KEY",
                "--env",
                "MY_KEY",
                "go",
            ],
            vec![("MY_KEY", "k")],
            "podhost run: --env MY_KEY: that variable holds the model's API key, which \
             commands never get",
        ),
        (
            vec![
                "run",
                "--model",
                "m",
                "--allow-write",
                file.to_str().unwrap(),
                "go",
            ],
            vec![],
            &*format!(
                "podhost run: --allow-write {}: not a directory (name the directory to make \
                 writable)",
                file.display()
            ),
        ),
        (
            vec!["run", "--model", "m", "--env", "PODHOST_TOKEN", "go"],
            vec![],
            "podhost run: --env PODHOST_TOKEN: podhost's own variables are never given to \
             commands",
        ),
    ] {
        let mut cmd = podhost(&args);
        cmd.args(["--workspace", ws]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = output(cmd).await;
        assert_eq!(
            (out.code, out.stdout.as_str(), out.stderr.trim_end()),
            (2, "", error),
            "{args:?}"
        );
    }
    assert_eq!(fake.requests().len(), 0);
}

#[tokio::test]
async fn a_failed_model_call_exits_3_with_its_cause_and_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::Status(400, "bad request".into(), None)]);
    let out = output(run_cmd(&fake, dir.path(), &["x"])).await;
    assert_eq!((out.code, out.stdout.as_str()), (3, ""));
    assert_eq!(
        middle(&out.stderr),
        // Said once: the closing lines do not repeat it.
        [
            "✗ model call 1 failed: The model endpoint returned HTTP 400: {\"error\":{\"message\":\"bad request\"}}",
        ]
    );
    assert!(
        out.stderr
            .trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("podhost run: model failed (exit 3) · 1 model call(s)"),
        "{}",
        out.stderr
    );

    // A server that echoes a wrong key: the key is scrubbed.
    fake.accept_keys(&["another-key"]);
    let out = output(run_cmd(&fake, dir.path(), &["x"])).await;
    assert_eq!(out.code, 3);
    assert!(
        out.stderr
            .contains("Incorrect API key provided: [redacted]."),
        "{}",
        out.stderr
    );
    assert!(!out.stderr.contains(KEY));

    // An answer without text is no answer.
    fake.accept_keys(&[KEY]);
    fake.push([Reply::text("")]);
    let out = output(run_cmd(&fake, dir.path(), &["x"])).await;
    assert_eq!((out.code, out.stdout.as_str()), (3, ""));
    assert_eq!(
        middle(&out.stderr),
        ["podhost run: the model ended the task without an answer (its last message is empty)"]
    );
}

#[tokio::test]
async fn the_step_limit_exits_4() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.respond_with(|body| {
        let n = body["messages"].as_array().unwrap().len();
        Reply::call(&format!("c{n}"), "bash", json!({"command": "true"}))
    });
    let out = output(run_cmd(&fake, dir.path(), &["--max-steps", "2", "loop"])).await;
    assert_eq!((out.code, out.stdout.as_str()), (4, ""));
    assert_eq!(fake.requests().len(), 2);
    assert!(
        out.stderr.contains(
            "podhost run: the turn made 2 model calls without finishing; podhost stops a turn \
             there (--max-steps)\n"
        ),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn a_question_without_a_terminal_exits_5() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::call(
        "q",
        "ask_user",
        json!({"question": "Which file?"}),
    )]);
    let out = output(run_cmd(&fake, dir.path(), &["edit something"])).await;
    assert_eq!((out.code, out.stdout.as_str()), (5, ""));
    assert_eq!(
        middle(&out.stderr),
        [
            "▸ ask_user Which file?",
            "podhost run: the agent asks: Which file?",
            "podhost run: the agent asked a question, and there is no terminal to answer it \
             (stdin is not a terminal, or held the task)",
        ]
    );
}

#[tokio::test]
async fn an_answer_that_cannot_be_written_exits_1_and_is_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let taken = dir.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::text("the answer")]);
    let out = output(run_cmd(
        &fake,
        dir.path(),
        &["-o", taken.to_str().unwrap(), "x"],
    ))
    .await;
    assert_eq!((out.code, out.stdout.as_str()), (1, "the answer\n"));
    assert_eq!(
        middle(&out.stderr),
        [format!(
            "podhost run: could not write the answer to {}: Is a directory (os error 21)",
            taken.display()
        )
        .as_str()]
    );
}

/// A model endpoint nothing listens at: the failure is said once, with a hint to check the
/// base URL, in text and in the events.
#[tokio::test]
async fn an_endpoint_that_cannot_be_reached_says_to_check_the_base_url() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // The listener is closed: connections to the port are refused.
    let url = format!("http://127.0.0.1:{port}/v1");
    let ws = dir.path().to_str().unwrap();
    let run = |json: bool| {
        let mut args = vec!["run", "--base-url", &url, "--model", "m", "--workspace", ws];
        if json {
            args.push("--json");
        }
        args.push("x");
        crate::harness::podhost(&args)
    };
    let hint = format!(
        " (is an OpenAI-compatible server listening at {url}? The URL came from --base-url; \
         check --base-url)"
    );
    let out = output(run(false)).await;
    assert_eq!((out.code, out.stdout.as_str()), (3, ""));
    let lines = middle(&out.stderr);
    assert_eq!(lines.len(), 1, "{}", out.stderr);
    assert!(
        lines[0].starts_with(
            "✗ model call 1 failed: The model endpoint could not be reached after 4 attempts: "
        ) && lines[0].ends_with(&hint),
        "{}",
        out.stderr
    );

    let out = output(run(true)).await;
    assert_eq!(out.code, 3, "{}", out.stderr);
    let events = out.events();
    let last = events.last().unwrap();
    let error = last["error"].as_str().unwrap();
    assert!(
        error.starts_with("the model call failed: The model endpoint could not be reached")
            && error.ends_with(&hint),
        "{error}"
    );
}

/// A base URL that carries credentials (user-info, a key in the query): neither the run's
/// events nor its messages show them, not even in the hint that names the URL.
#[tokio::test]
async fn credentials_in_the_base_url_are_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://someone:pw-in-url-8d1f@127.0.0.1:{port}/v1?api-key=key-in-url-77c2");
    let ws = dir.path().to_str().unwrap();
    for json in [false, true] {
        let mut args = vec!["run", "--base-url", &url, "--model", "m", "--workspace", ws];
        if json {
            args.push("--json");
        }
        args.push("x");
        let out = output(crate::harness::podhost(&args)).await;
        assert_eq!(out.code, 3, "{}", out.stderr);
        let all = format!("{}{}", out.stdout, out.stderr);
        for secret in ["pw-in-url-8d1f", "key-in-url-77c2"] {
            assert!(!all.contains(secret), "{secret} printed:\n{all}");
        }
        assert!(all.contains("could not be reached"), "{all}");
    }
}
