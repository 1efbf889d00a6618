//! Faults the BYOH store must survive: a full disk at a turn's end, a data directory that lost
//! its database, turns a restart interrupted, a model that echoes its credentials or breaks the
//! protocol's rules for tool calls.

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{KillOnDrop, Options, Serve, T, spawn, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};

/// The stored status of `id`, read from the database as a restart would.
async fn stored_status(s: &Serve, id: &str) -> String {
    if crate::harness::on_postgres() {
        let url = crate::harness::store_url(&s.data).unwrap();
        let (client, conn) =
            tokio::time::timeout(T, tokio_postgres::connect(&url, tokio_postgres::NoTls))
                .await
                .unwrap()
                .unwrap();
        let driver = tokio::spawn(conn);
        let row = client
            .query_one(
                "SELECT status FROM invocations WHERE invocation_id = $1",
                &[&id],
            )
            .await
            .unwrap();
        drop(client);
        let _ = driver.await;
        return row.get(0);
    }
    let db = rusqlite::Connection::open_with_flags(
        s.data.join("podhost.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    db.query_row(
        "SELECT status FROM invocations WHERE invocation_id = ?1",
        [id],
        |r| r.get(0),
    )
    .unwrap()
}

#[tokio::test]
async fn a_full_disk_at_a_turns_end_is_answered_from_memory_and_written_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let full = dir.path().join("disk-full");
    std::fs::write(&full, "").unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::text("All done.")]);
    let s = Serve::start_with(
        dir.path(),
        Options::default().env(
            "PODHOST_FAILPOINTS",
            &format!("serve.store_full=fail-while({})", full.display()),
        ),
    );
    s.submit(start("s", "i", "go", &fake.base_url(), None))
        .await;
    // The end could not be written, yet get_status and collect_output answer it.
    assert_eq!(
        s.wait_status("i", "completed", T).await,
        status_obj("s", "i", "completed")
    );
    assert_eq!(stored_status(&s, "i").await, "running");
    let (code, out) = s.collect("i").await;
    assert_eq!(code, StatusCode::OK, "{out}");
    assert_eq!(
        out["messages"],
        json!([{"role": "assistant", "content": "All done."}])
    );
    assert!(
        s.logs().contains("could not record the turn's end"),
        "{}",
        s.log_tail()
    );
    // Space returns: the write lands.
    std::fs::remove_file(&full).unwrap();
    let deadline = tokio::time::Instant::now() + T;
    while stored_status(&s, "i").await != "completed" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the end never landed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        s.status("i").await,
        (StatusCode::OK, status_obj("s", "i", "completed"))
    );
}

#[tokio::test]
async fn a_data_directory_that_lost_its_database_refuses_to_start_unless_told_to_start_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([Reply::text("done")]);
    let data = {
        let s = Serve::start(dir.path());
        s.submit(start("s", "i", "go", &fake.base_url(), None))
            .await;
        s.wait_status("i", "completed", T).await;
        s.data.clone()
    };
    // The database is lost: on SQLite its files are gone; on PostgreSQL the data directory now
    // names a new, empty database.
    let store = if crate::harness::on_postgres() {
        let url = crate::pg::TestPg::shared().unwrap().fresh_db();
        std::fs::write(data.with_extension("pg-url"), &url).unwrap();
        format!("PostgreSQL database {url}")
    } else {
        for f in ["podhost.sqlite", "podhost.sqlite-wal", "podhost.sqlite-shm"] {
            let _ = std::fs::remove_file(data.join(f));
        }
        "database podhost.sqlite".to_owned()
    };
    let opts = Options::default().env("PODHOST_TOKEN", crate::harness::TOKEN);
    let refusal = spawn(&data, &opts).map(|(c, _, _)| KillOnDrop(c)).err();
    let refusal = refusal.expect("podhost started without its database");
    let want = format!(
        "podhost serve: the data directory {} holds 1 session workspace(s), but its {store} is \
         missing or empty: every earlier invocation would be unknown (404), which fails a whole \
         evaluation. Restore the database, or start with --start-afresh \
         (PODHOST_START_AFRESH=true) to begin with an empty store",
        data.display()
    );
    assert!(refusal.contains(&want), "{refusal}");
    assert!(refusal.starts_with("exit code Some(2)"), "{refusal}");
    // An empty database is refused the same way (the refused start left one: on SQLite a file,
    // on PostgreSQL the schema).
    if !crate::harness::on_postgres() {
        assert_eq!(
            std::fs::metadata(data.join("podhost.sqlite"))
                .map(|m| m.len() > 0)
                .ok(),
            Some(true)
        );
    }
    let again = spawn(&data, &opts).map(|(c, _, _)| KillOnDrop(c)).err();
    assert!(again.expect("started").contains(&want));
    // Told to start afresh, it starts, and says so.
    let (child, url, logs) =
        spawn(&data, &opts.clone().env("PODHOST_START_AFRESH", "true")).unwrap();
    let _child = KillOnDrop(child);
    assert!(url.starts_with("http://127.0.0.1:"));
    assert!(
        logs.lock()
            .unwrap()
            .contains("starting afresh with an empty store")
    );
}

#[tokio::test]
async fn turns_resumed_after_a_restart_take_max_running_slots() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    fake.push((0..4).map(|_| Reply::Hang(Box::new(Reply::text("never")))));
    let mut s = Serve::start(dir.path());
    for i in 0..4 {
        // No key: after a restart they are taken up at once.
        let (code, _) = s
            .submit(start(
                &format!("s{i}"),
                &format!("i{i}"),
                "go",
                &fake.base_url(),
                None,
            ))
            .await;
        assert_eq!(code, StatusCode::ACCEPTED);
    }
    fake.wait_requests(4, T).await;
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    fake.wait_idle(T).await;
    fake.reset_max_in_flight();

    fake.push((0..4).map(|i| {
        Reply::Delay(
            std::time::Duration::from_millis(300),
            Box::new(Reply::text(&format!("done {i}"))),
        )
    }));
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_MAX_RUNNING", "2"),
    );
    for i in 0..4 {
        s.wait_status(&format!("i{i}"), "completed", T).await;
    }
    assert_eq!(fake.max_in_flight(), 2);
}

#[tokio::test]
async fn credentials_a_model_echoes_are_redacted_from_everything_stored_and_returned() {
    let dir = tempfile::tempdir().unwrap();
    let key = "sk-test-4f8a9c2e1b7d";
    let url_secret = "url-secret-77aa31";
    // No key check: the URL's user-info goes out as basic auth beside the bearer key.
    let fake = FakeModel::start("fake-model", None).await;
    fake.push([
        Reply::call(
            "c1",
            "bash",
            json!({"command": format!("echo {key} > k.txt; echo {url_secret}")}),
        ),
        Reply::text(&format!("The key is {key} and the URL says {url_secret}.")),
    ]);
    let s = Serve::start(dir.path());
    let base = fake
        .base_url()
        .replace("http://", &format!("http://model-user:{url_secret}@"));
    let mut body = start("s", "i", &format!("Use {key} please"), &base, Some(key));
    body["input_messages"][0]["content"] = json!(format!("Use {key} please"));
    let (code, _) = s.submit(body).await;
    assert_eq!(code, StatusCode::ACCEPTED);
    s.wait_status("i", "completed", T).await;
    let (_, out) = s.collect("i").await;
    let text = out.to_string();
    assert!(!text.contains(key) && !text.contains(url_secret), "{text}");
    assert_eq!(
        out["messages"][2]["content"],
        "The key is [redacted] and the URL says [redacted]."
    );
    assert_eq!(
        out["messages"][0]["tool_calls"][0]["function"]["arguments"],
        json!({"command": "echo [redacted] > k.txt; echo [redacted]"}).to_string()
    );
    // Nothing in the database either (the model was called with the real URL): its files, or
    // every row of a PostgreSQL store.
    let (db, wal) = if crate::harness::on_postgres() {
        let url = crate::harness::store_url(&s.data).unwrap();
        let dump = crate::pg::TestPg::dump(&url).await;
        assert!(dump.contains("[redacted]"), "{dump}");
        (dump.into_bytes(), Vec::new())
    } else {
        (
            std::fs::read(s.data.join("podhost.sqlite")).unwrap(),
            std::fs::read(s.data.join("podhost.sqlite-wal")).unwrap_or_default(),
        )
    };
    for bytes in [&db, &wal] {
        let found = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
        assert!(!found(key) && !found(url_secret), "a credential was stored");
    }
    assert_eq!(fake.requests().len(), 2);
    assert!(!s.logs().contains(key) && !s.logs().contains(url_secret));
}

#[tokio::test]
async fn tool_calls_that_break_the_protocols_rules_are_normalized() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let long = "x".repeat(600);
    fake.push([
        Reply::calls(&[
            ("call\u{7}bell", "glob", json!({"pattern": "*"})),
            (&long, "glob", json!({"pattern": "*"})),
            ("c3", "", json!({})),
            ("c4", "ask_user", json!({})),
        ]),
        Reply::text("done"),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "go", &fake.base_url(), None))
        .await;
    // ask_user without a question is an error for the model, not a question for the user.
    s.wait_status("i", "completed", T).await;
    let (_, out) = s.collect("i").await;
    let calls: Vec<(String, String)> = out["messages"][0]["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_owned(),
                c["function"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        vec![
            ("call_0_1".to_owned(), "glob".to_owned()),
            ("call_0_2".to_owned(), "glob".to_owned()),
            ("c3".to_owned(), "unnamed_tool_call".to_owned()),
            ("c4".to_owned(), "ask_user".to_owned()),
        ]
    );
    let answers: Vec<(Value, Value)> = out["messages"].as_array().unwrap()[1..5]
        .iter()
        .skip(2)
        .map(|m| {
            let content: Value = serde_json::from_str(m["content"].as_str().unwrap()).unwrap();
            (m["tool_call_id"].clone(), content)
        })
        .collect();
    let failed =
        |message: &str| json!({"kind": "failed", "code": "tool.invalid_input", "message": message});
    assert_eq!(
        answers[0],
        (
            json!("c3"),
            failed(
                "The tool call named no function. Call one of: bash, read, write, edit, grep, \
                 glob, bash_output, bash_kill, ask_user."
            )
        )
    );
    assert_eq!(
        answers[1],
        (
            json!("c4"),
            failed(
                "ask_user needs a non-empty `question`: the one question for the user, \
                 complete and self-contained."
            )
        )
    );
}
