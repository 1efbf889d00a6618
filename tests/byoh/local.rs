//! `podhost run`: one task, the transcript printed as it goes.

use std::process::Stdio;

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::openai_fake::{FakeModel, Reply};
use crate::support::podhost_bin;

async fn run(fake: &FakeModel, workspace: &std::path::Path, task: &str) -> (i32, String, String) {
    let child = tokio::process::Command::new(podhost_bin())
        .args([
            "run",
            "--base-url",
            &fake.base_url(),
            "--model",
            "fake-model",
        ])
        .args(["--api-key-env", "MODEL_API_KEY", "--workspace"])
        .arg(workspace)
        .arg(task)
        .env("MODEL_API_KEY", "local-key")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = tokio::time::timeout(crate::harness::T * 3, child.wait_with_output())
        .await
        .expect("podhost run timed out")
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn run_prints_the_transcript_and_ends_on_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("local-key")).await;
    fake.push([
        Reply::call("c1", "write", json!({"path": "note.txt", "content": "hi"})),
        Reply::text("Wrote note.txt."),
    ]);
    let (code, stdout, stderr) = run(&fake, dir.path(), "write a note").await;
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("[user]\nwrite a note\n"), "{stdout}");
    assert!(
        stdout.contains("[assistant calls write c1]\n{\"content\":\"hi\",\"path\":\"note.txt\"}"),
        "{stdout}"
    );
    assert!(stdout.contains("[tool c1]\n"), "{stdout}");
    assert!(
        stdout.trim_end().ends_with("[assistant]\nWrote note.txt."),
        "{stdout}"
    );
    assert_eq!(
        fake.requests()[0].authorization.as_deref(),
        Some("Bearer local-key")
    );
}

#[tokio::test]
async fn run_without_a_terminal_ends_at_a_question_and_reports_model_failures() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some("local-key")).await;
    fake.push([Reply::call(
        "q",
        "ask_user",
        json!({"question": "Which file?"}),
    )]);
    let (code, _, stderr) = run(&fake, dir.path(), "edit something").await;
    assert_eq!(code, 0);
    assert_eq!(
        stderr.trim_end(),
        "podhost run: the agent asked for input ({\"question\":\"Which file?\"}) and stdin is not a terminal"
    );

    fake.push([Reply::Status(400, "bad request".into(), None)]);
    let (code, _, stderr) = run(&fake, dir.path(), "x").await;
    assert_eq!(code, 1);
    assert_eq!(
        stderr.trim_end(),
        "podhost run: The model endpoint returned HTTP 400: {\"error\":{\"message\":\"bad request\"}}"
    );
}
