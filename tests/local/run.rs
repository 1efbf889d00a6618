//! `podhost run`'s output contract: activity on stderr, the answer alone on stdout, a summary
//! line; the task from stdin; instructions; the conventions of model clients.

use std::process::Stdio;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::harness::{KEY, finish, output, podhost, run_cmd};
use crate::openai_fake::{FakeModel, Reply};

/// The summary line without its wall time (which varies).
fn summary(stderr: &str) -> String {
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    last.rsplit_once(" · ")
        .map(|(head, time)| {
            assert!(time.ends_with(" s"), "{last}");
            head.to_owned()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn the_answer_alone_goes_to_stdout_and_activity_to_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([
        Reply::Calls {
            text: Some("I will write the note.".into()),
            calls: vec![(
                "c1".into(),
                "write".into(),
                json!({"path": "note.txt", "content": "hi"}).to_string(),
            )],
        },
        Reply::call(
            "c2",
            "bash",
            json!({"command": "printf 'a\\nb\\n'; cat note.txt"}),
        ),
        Reply::text("Wrote note.txt.\n"),
    ]);
    let out = output(run_cmd(&fake, dir.path(), &["write a note"])).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "Wrote note.txt.\n");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(
        lines[..lines.len() - 1],
        [
            format!(
                "podhost run: fake-model at {} (from --base-url; API key from MODEL_API_KEY)",
                fake.base_url()
            )
            .as_str(),
            "I will write the note.",
            "▸ write note.txt (2 bytes)",
            "  wrote 2 bytes to note.txt",
            "▸ bash printf 'a\\nb\\n'; cat note.txt",
            "  exit 0",
            "  │ a",
            "  │ b",
            "  │ hi",
        ]
    );
    // The fake reports its own count of each prompt; the summary adds them up.
    let prompt_tokens: u64 = fake.requests().iter().map(|r| r.tokens).sum();
    assert_eq!(
        summary(&out.stderr),
        format!(
            "podhost run: completed · 3 model call(s) · 2 tool call(s) · {prompt_tokens} tokens \
             in, 3 out"
        )
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("note.txt")).unwrap(),
        "hi"
    );
    assert_eq!(
        fake.requests()[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(!out.stderr.contains(KEY));
}

#[tokio::test]
async fn o_writes_the_answer_to_a_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let answer = dir.path().join("answer.md");
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::text("# Done\n\nAll good.")]);
    let out = output(run_cmd(
        &fake,
        dir.path(),
        &["-o", answer.to_str().unwrap(), "summarize"],
    ))
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "# Done\n\nAll good.\n");
    assert_eq!(
        std::fs::read_to_string(&answer).unwrap(),
        "# Done\n\nAll good."
    );
}

#[tokio::test]
async fn the_task_is_read_from_stdin_with_a_dash() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::text("ok")]);
    let mut cmd = run_cmd(&fake, dir.path(), &["-"]);
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all("list the files\nand say how many there are\n".as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let out = finish(child).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "ok\n"),
        "{}",
        out.stderr
    );
    let messages = &fake.requests()[0].body["messages"];
    assert_eq!(
        messages[1],
        json!({"role": "user", "content": "list the files\nand say how many there are\n"})
    );

    // An empty stdin is a usage error, and nothing is asked.
    let mut cmd = run_cmd(&fake, dir.path(), &["-"]);
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    drop(child.stdin.take());
    let out = finish(child).await;
    assert_eq!(
        (out.code, out.stderr.as_str()),
        (2, "podhost run: the task on stdin is empty\n")
    );
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn a_task_on_stdin_past_its_limit_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    let mut cmd = run_cmd(&fake, dir.path(), &["-"]);
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&vec![b'a'; (1 << 20) + 1]).await.unwrap();
    drop(stdin);
    let out = finish(child).await;
    assert_eq!(
        (out.code, out.stderr.as_str()),
        (
            2,
            "podhost run: the task on stdin is larger than 1048576 bytes\n"
        )
    );
    assert_eq!(fake.requests().len(), 0);
}

#[tokio::test]
async fn agents_md_and_system_are_appended_to_the_instructions() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("AGENTS.md"),
        "Use tabs.\nRun `make check`.\n",
    )
    .unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::text("ok")]);
    let out = output(run_cmd(
        &fake,
        dir.path(),
        &["--system", "Answer in French.", "go"],
    ))
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stderr.lines().nth(1),
        Some("podhost run: instructions from AGENTS.md and --system")
    );
    let system = fake.requests()[0].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(
        system,
        format!(
            "You are an agent working in the directory {dir}. Use the tools to inspect and \
             change files and to run commands there; relative paths resolve under {dir}. When \
             you need information that only the user can give, call ask_user with one \
             question. When the task is done, give your final answer without calling a tool.\n\n\
             The workspace's AGENTS.md says:\n\nUse tabs.\nRun `make check`.\n\nAnswer in French.",
            dir = root.display()
        )
    );
}

#[tokio::test]
async fn an_agents_md_past_its_limit_is_cut_and_the_cut_said() {
    let dir = tempfile::tempdir().unwrap();
    let limit = 64 * 1024;
    std::fs::write(dir.path().join("AGENTS.md"), "x".repeat(limit + 10)).unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::text("ok")]);
    let out = output(run_cmd(&fake, dir.path(), &["go"])).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "podhost run: AGENTS.md is larger than {limit} bytes; the instructions hold its \
             first {limit}\n"
        )),
        "{}",
        out.stderr
    );
    let system = fake.requests()[0].body["messages"][0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(system.ends_with(&format!(
        "{}\n\n[AGENTS.md is cut here, at {limit} bytes]",
        "x".repeat(100)
    )));
    let kept = system
        .split_once("AGENTS.md says:\n\n")
        .and_then(|(_, rest)| rest.split_once("\n\n[AGENTS.md is cut"))
        .unwrap()
        .0;
    assert_eq!(kept, "x".repeat(limit));
}

#[tokio::test]
async fn generation_settings_pass_through_and_answers_stream() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::text("ok")]);
    let out = output(run_cmd(
        &fake,
        dir.path(),
        &[
            "--temperature",
            "0.2",
            "--max-tokens",
            "50",
            "--reasoning-effort",
            "low",
            "go",
        ],
    ))
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let body = &fake.requests()[0].body;
    let settings: Vec<(&str, Value)> = [
        "temperature",
        "max_tokens",
        "reasoning_effort",
        "stream",
        "stream_options",
    ]
    .iter()
    .map(|k| (*k, body[*k].clone()))
    .collect();
    assert_eq!(
        settings,
        [
            ("temperature", json!(0.2)),
            ("max_tokens", json!(50)),
            ("reasoning_effort", json!("low")),
            ("stream", json!(true)),
            ("stream_options", json!({"include_usage": true})),
        ]
    );
}

#[tokio::test]
async fn openai_variables_are_used_when_no_flag_says_otherwise_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", Some(KEY)).await;
    fake.push([Reply::text("ok")]);
    let mut cmd = podhost(&["run", "--workspace"]);
    cmd.arg(dir.path())
        .arg("hello")
        .env("OPENAI_BASE_URL", fake.base_url())
        .env("OPENAI_API_KEY", KEY)
        .env("PODHOST_MODEL", "fake-model");
    let out = output(cmd).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "ok\n"),
        "{}",
        out.stderr
    );
    assert_eq!(
        out.stderr.lines().next(),
        Some(
            format!(
                "podhost run: fake-model at {} (from OPENAI_BASE_URL; API key from \
                 OPENAI_API_KEY)",
                fake.base_url()
            )
            .as_str()
        )
    );
    assert_eq!(
        fake.requests()[0].authorization.as_deref(),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(!out.stderr.contains(KEY) && !out.stdout.contains(KEY));
}

#[tokio::test]
async fn an_answer_into_a_closed_stdout_ends_quietly() {
    // `podhost run … | head -c 1`: the reader is gone before podhost writes a byte, so every
    // write to stdout fails with EPIPE; the run still ends as it would have, without a panic.
    for json in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let fake = FakeModel::start("fake-model", Some(KEY)).await;
        fake.push([Reply::text(&"All good.\n".repeat(10_000))]);
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut cmd = run_cmd(&fake, dir.path(), if json { &["--json"] } else { &[] });
        cmd.arg("summarize").stdout(writer);
        let out = output(cmd).await;
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
        assert_eq!(out.code, 0, "--json {json}: {}", out.stderr);
        assert_eq!(fake.requests().len(), 1);
    }
}
