//! Tool-call ids that podhost rewrites stay within the protocol's 512 characters
//! (`openapi.yaml`), however long the model's ids were and however often it reused them.

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::harness::{Serve, T, start};
use crate::openai_fake::{FakeModel, Reply};

fn glob_call(id: &str) -> (String, String, String) {
    (
        id.to_owned(),
        "glob".to_owned(),
        json!({"pattern": "*"}).to_string(),
    )
}

#[tokio::test]
async fn a_512_character_call_id_used_at_two_steps_stays_within_512_characters() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    let long = "x".repeat(512);
    fake.push([
        Reply::Calls {
            text: None,
            calls: vec![glob_call(&long)],
        },
        // The same id again, and twice within one answer.
        Reply::Calls {
            text: None,
            calls: vec![glob_call(&long), glob_call(&long)],
        },
        Reply::text("done"),
    ]);
    let s = Serve::start(dir.path());
    s.submit(start("s", "i", "look", &fake.base_url(), None))
        .await;
    s.wait_status("i", "completed", T).await;
    let (_, out) = s.collect("i").await;
    let messages = out["messages"].as_array().unwrap();
    let calls: Vec<&str> = messages
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().into_iter().flatten())
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    let answered: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["tool_call_id"].as_str())
        .collect();
    let cut = "x".repeat(510);
    let want = [long.clone(), format!("{cut}_2"), format!("{cut}_3")];
    assert_eq!(calls, want);
    assert_eq!(answered, want, "each call answered under its own id");
    assert!(calls.iter().all(|id| id.chars().count() <= 512));
    // The model was sent the same ids it is shown in the output.
    let sent = &fake.requests()[2].body["messages"];
    let sent_ids: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["tool_call_id"].as_str())
        .collect();
    assert_eq!(sent_ids, want);
}
