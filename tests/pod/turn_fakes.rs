//! The fakes the turn tests lean on refuse what core and the gate refuse: each refusal here is
//! one a wrong podhost would meet, with the text it would get.

use podhost::nylorun::link::canonical::request_hash;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_gates::FakeGates;
use crate::fake_journal::Journal;
use crate::turn::{TOKEN, model_intent, tool_intent, turn_start};

fn journal() -> Journal {
    let j = Journal::default();
    let mut ts = turn_start(json!("hi"));
    ts["limits"]["recordEntryBytes"] = json!(200);
    ts["limits"]["harnessStateBytes"] = json!(50);
    j.start_run("run-1", TOKEN, &ts);
    j
}

fn ask(j: &Journal, m: &str, p: Value) -> Result<Value, (String, String)> {
    j.answer(m, p, |r| r == "run-1")
}

fn refusal(code: &str, message: &str) -> Result<Value, (String, String)> {
    Err((code.to_owned(), message.to_owned()))
}

fn intent(effect: &Value, hash: &str) -> Value {
    json!({"runId": "run-1", "effect": effect, "requestHash": hash})
}

#[test]
fn the_journal_refuses_what_core_refuses() {
    let j = journal();
    let bash = tool_intent(0, 0, "c1", "bash", json!({"command": "ls"}));
    let hash = request_hash(&bash);
    assert_eq!(
        j.answer("effect.intent", intent(&bash, &hash), |_| false),
        refusal("run_not_held", "Run run-1 is not held by this harness")
    );
    let mut extra = intent(&bash, &hash);
    extra["extra"] = json!(1);
    assert_eq!(
        ask(&j, "effect.intent", extra),
        refusal(
            "invalid",
            "Invalid effect.intent request: unknown field `extra`, expected one of `runId`, \
             `effect`, `requestHash`"
        )
    );
    let mut other = bash.clone();
    other["sessionId"] = json!("ses_other");
    assert_eq!(
        ask(&j, "effect.intent", intent(&other, &request_hash(&other))),
        refusal(
            "invalid",
            "Invalid effect.intent request: The effect is not of the run's session and turn"
        )
    );
    assert_eq!(
        ask(&j, "effect.intent", intent(&bash, &"a".repeat(64))),
        refusal("invalid", "The request hash does not match the request")
    );
    let mut model = model_intent(0, 0);
    model["input"] = json!({"prompt": []});
    assert_eq!(
        ask(&j, "effect.intent", intent(&model, &"a".repeat(64))),
        refusal(
            "invalid",
            "Invalid effect.intent request: A model intent carries no input"
        )
    );

    // A row: executed, completed, replayed; another request under its id is drift.
    assert_eq!(
        ask(&j, "effect.intent", intent(&bash, &hash)),
        Ok(json!({"status": "execute"}))
    );
    let big = json!({"kind": "completed", "output": "x".repeat(300)});
    assert_eq!(
        ask(
            &j,
            "effect.outcome",
            json!({"runId": "run-1", "effectId": bash["effectId"], "value": big})
        ),
        refusal(
            "limit_exceeded",
            "The outcome is 332 bytes, past recordEntryBytes (200 bytes)"
        )
    );
    let value = json!({"kind": "completed", "output": "a\n"});
    assert_eq!(
        ask(
            &j,
            "effect.outcome",
            json!({"runId": "run-1", "effectId": bash["effectId"], "value": value})
        ),
        Ok(json!({"status": "completed", "outcome": {"value": value}}))
    );
    assert_eq!(
        ask(&j, "effect.intent", intent(&bash, &hash)),
        Ok(json!({"status": "completed", "outcome": {"value": value}}))
    );
    let mut changed = bash.clone();
    changed["input"] = json!({"command": "rm -rf /"});
    assert_eq!(
        ask(
            &j,
            "effect.intent",
            intent(&changed, &request_hash(&changed))
        ),
        refusal("effect_drift", "Effect identity request drift")
    );
}

#[test]
fn the_journal_checks_outputs() {
    let j = journal();
    let out = |p: Value| {
        let mut p = p;
        p["runId"] = json!("run-1");
        p
    };
    assert_eq!(
        j.output(
            "run-1",
            "turn.completed",
            &out(json!({"status": "waiting"}))
        ),
        refusal(
            "invalid",
            "Invalid turn.completed request: status Some(\"waiting\") is not one of turn.completed's"
        )
    );
    assert_eq!(
        j.output(
            "run-1",
            "turn.completed",
            &out(json!({"status": "completed", "state": {"big": "x".repeat(60)}}))
        ),
        refusal(
            "limit_exceeded",
            "The state is 70 bytes, past harnessStateBytes (50 bytes)"
        )
    );
    let entry = json!({"kind": "final", "turnId": "turn_1", "stepId": "s", "output": "ok"});
    assert_eq!(
        j.output(
            "run-1",
            "turn.completed",
            &out(json!({"status": "completed",
                        "transcript": [{"keep": 0, "entries": [entry], "length": 2}]}))
        ),
        refusal(
            "invalid",
            "Invalid turn.completed request: update 0 leaves 1 entries, not length 2"
        )
    );
    assert!(j.outputs().is_empty());
    assert!(
        j.output(
            "run-1",
            "turn.completed",
            &out(json!({"status": "completed",
                        "transcript": [{"keep": 0, "entries": [entry], "length": 1}]}))
        )
        .is_ok()
    );
    assert_eq!(j.transcript(crate::turn::SESSION).1, vec![entry]);
}

#[tokio::test]
async fn the_gate_refuses_what_the_model_gate_refuses() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let journal = std::sync::Arc::new(journal());
    let gates = FakeGates::start(journal.clone()).await;
    let http = reqwest::Client::new();
    let url = format!("{}/nylorun/v1/model-calls", gates.url());
    let call = json!({"prompt": [], "tools": [], "executionId": "ses_1"});
    let body = json!({"effectId": "turn_1:0:model:s0", "invocationId": "step-0-0", "call": call});
    let send = |token: &str, key: Option<&str>, body: &Value| {
        let mut r = http.post(&url).bearer_auth(token).body(body.to_string());
        if let Some(k) = key {
            r = r.header("Idempotency-Key", k);
        }
        async move {
            let resp = r.send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let gate_error = |status: u16, code: &str, message: &str| {
        (status, json!({"error": {"code": code, "message": message}}))
    };
    let key = Some("turn_1:0:model:s0");
    assert_eq!(
        send("nope", key, &body).await,
        gate_error(401, "gate_unauthorized", "Unknown run token")
    );
    assert_eq!(
        send(TOKEN, None, &body).await,
        gate_error(400, "key_required", "Idempotency-Key is required")
    );
    assert_eq!(
        send(TOKEN, Some("other"), &body).await,
        gate_error(
            409,
            "effect_not_journaled",
            "Idempotency-Key is not the body's effectId"
        )
    );
    assert_eq!(
        send(TOKEN, key, &body).await,
        gate_error(
            409,
            "effect_not_journaled",
            "The call is not journaled invoking as this request"
        )
    );
    // Journaled as exactly this call: answered, and the same again under the same key.
    let hash = crate::turn::hash_with_input(&model_intent(0, 0), &call);
    journal
        .answer(
            "effect.intent",
            json!({"runId": "run-1", "effect": model_intent(0, 0), "requestHash": hash}),
            |_| true,
        )
        .unwrap();
    let first = send(TOKEN, key, &body).await;
    assert_eq!(first.0, 200);
    assert_eq!(
        first.1["outcome"]["output"][0]["text"],
        "Hello from the fixture model."
    );
    assert_eq!(send(TOKEN, key, &body).await, first);
    assert_eq!(gates.model_runs(), 1);
    let mut other = body.clone();
    other["invocationId"] = json!("step-0-9");
    assert_eq!(
        send(TOKEN, key, &other).await,
        gate_error(409, "gate_conflict", "Another request under this key")
    );
    journal.run_over("run-1");
    assert_eq!(
        send(TOKEN, key, &body).await,
        gate_error(409, "run_stale", "The run is over")
    );
}
