//! The Harness API channel: the upgrade matrix, strict frames both ways, liveness.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, Event, FakeCore};
use crate::{PodDirs, PodProcess, pod_env, set_env, start_pod};

fn upgrades(core: &FakeCore) -> Vec<u16> {
    core.events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Upgrade { status, .. } => Some(status),
            _ => None,
        })
        .collect()
}

/// The answer frame podhost sent for core's request `id` on `conn`.
async fn answer_to(core: &FakeCore, conn: u64, id: u64) -> Value {
    core.wait(&format!("the answer to {id}"), |e| match e {
        Event::FromPod { conn: c, frame }
            if *c == conn && frame["t"] == "res" && frame["id"] == id =>
        {
            Some(frame.clone())
        }
        _ => None,
    })
    .await
}

#[tokio::test]
async fn upgrade_refusals_are_reported_and_retried() {
    let core = FakeCore::start(CoreOptions::default()).await;
    core.refuse_upgrades(&[404, 426, 503]);
    let dirs = PodDirs::new(&core);
    let pod = PodProcess::spawn(&pod_env(&core, &dirs));
    core.wait_request(0, "hello").await;
    assert_eq!(upgrades(&core), vec![404, 426, 503, 101]);
    pod.wait_log(&[
        "HTTP 404",
        "wrong path: NYLORUN_HARNESS_URL may not point at core's harness listener",
    ])
    .await;
    pod.wait_log(&[
        "HTTP 426",
        "core wants another transport version (Nylorun-Harness-Api)",
    ])
    .await;
    pod.wait_log(&["HTTP 503", "the Tenant is closed or core is stopping"])
        .await;
}

#[tokio::test]
async fn an_upgrade_refused_401_joins_again() {
    let core = FakeCore::start(CoreOptions::default()).await;
    core.refuse_upgrades(&[401]);
    let dirs = PodDirs::new(&core);
    let pod = PodProcess::spawn(&pod_env(&core, &dirs));
    core.wait_request(0, "hello").await;
    assert_eq!(upgrades(&core), vec![401, 101]);
    let joins = core
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Join { status: 200, .. }))
        .count();
    assert_eq!(
        joins, 2,
        "a refused host token is dropped and the pod joins again"
    );
    pod.wait_log(&["HTTP 401", "the host token was refused; joining again"])
        .await;
}

#[tokio::test]
async fn malformed_requests_get_invalid_and_the_connection_stays_up() {
    let (core, _dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    core.send_text(
        conn,
        r#"{"t":"req","id":41,"m":"workspace.report","p":{},"extra":1}"#,
    );
    let res = answer_to(&core, conn, 41).await;
    assert_eq!(
        (res["ok"].clone(), res["e"]["code"].clone()),
        (json!(false), json!("invalid"))
    );
    let message = res["e"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("Invalid frame: unknown field `extra`"),
        "{message}"
    );

    core.send_text(conn, r#"{"t":"req","id":42,"m":"workspace.report","p":{}}"#);
    let ok = answer_to(&core, conn, 42).await;
    assert_eq!(ok["ok"], true);

    let unknown = core.request(conn, "frobnicate", json!({})).await;
    assert_eq!(
        unknown,
        json!({"t": "res", "id": unknown["id"], "ok": false, "e": {"code": "invalid", "message": "Unknown request frobnicate"}})
    );
    // A malformed message without an id is dropped; the connection is still up.
    core.send_text(conn, r#"{"t":"msg","m":"cancel","p":{"runId":1}}"#);
    let report = core.request(conn, "workspace.report", json!({})).await;
    assert_eq!(report["ok"], true);
    assert!(
        !core
            .events()
            .iter()
            .any(|e| matches!(e, Event::Closed { .. })),
        "the connection closed"
    );
}

#[tokio::test]
async fn binary_and_non_json_messages_close_with_1007_and_podhost_reconnects() {
    let (core, _dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    let mark = core.mark();
    core.send_binary(conn, b"\x00\x01");
    let code = core
        .wait_from(mark, "the close", |e| match e {
            Event::Closed { conn: c, code, .. } if *c == conn => Some(*code),
            _ => None,
        })
        .await
        .1;
    assert_eq!(code, Some(1007));
    let conn2 = core.wait_connected(mark).await;
    core.wait_request(mark, "hello").await;

    let mark = core.mark();
    core.send_text(conn2, "not json");
    let code = core
        .wait_from(mark, "the close", |e| match e {
            Event::Closed { conn: c, code, .. } if *c == conn2 => Some(*code),
            _ => None,
        })
        .await
        .1;
    assert_eq!(code, Some(1007));
    core.wait_request(mark, "hello").await;
}

#[tokio::test]
async fn a_silent_core_is_dropped_and_the_pod_reconnects() {
    let (core, _dirs, _pod, conn) = start_pod(CoreOptions::default(), |env| {
        set_env(env, "PODHOST_POD_SILENCE_TIMEOUT_MS", "700");
    })
    .await;
    core.wait_request(0, "lease").await;
    core.set_silent(conn);
    let mark = core.mark();
    let (_, reason) = core
        .wait_from(mark, "podhost dropping the connection", |e| match e {
            Event::Closed {
                conn: c, reason, ..
            } if *c == conn => Some(reason.clone()),
            _ => None,
        })
        .await;
    let _ = reason;
    let conn2 = core.wait_connected(mark).await;
    assert_ne!(conn2, conn);
    core.wait_request(mark, "lease").await;
}

#[tokio::test]
async fn pings_keep_a_quiet_connection_up() {
    let opts = CoreOptions {
        ping_every: Some(Duration::from_millis(150)),
        ..CoreOptions::default()
    };
    let (core, _dirs, _pod, conn) = start_pod(opts, |env| {
        set_env(env, "PODHOST_POD_SILENCE_TIMEOUT_MS", "500");
    })
    .await;
    // Ten pongs span well over the silence timeout, with nothing but pings from core.
    let mut from = 0;
    for _ in 0..10 {
        let (i, ()) = core
            .wait_from(from, "a pong", |e| {
                matches!(e, Event::Pong { conn: c } if *c == conn).then_some(())
            })
            .await;
        from = i + 1;
    }
    assert!(
        !core
            .events()
            .iter()
            .any(|e| matches!(e, Event::Closed { .. })),
        "a pinged connection was dropped"
    );
}

#[tokio::test]
async fn a_refused_hello_is_reported_and_retried() {
    let core = FakeCore::start(CoreOptions::default()).await;
    core.refuse_hello("invalid", "podhost is not the credential's harness");
    let dirs = PodDirs::new(&core);
    let pod = PodProcess::spawn(&pod_env(&core, &dirs));
    pod.wait_log(&[
        "core refused hello",
        "core answered hello with invalid: podhost is not the credential's harness",
    ])
    .await;
    core.wait_request(0, "lease").await;
    let connections = core
        .events()
        .iter()
        .filter(|e| matches!(e, Event::Connected { .. }))
        .count();
    assert_eq!(connections, 2);
    // Request ids are per connection, from 1: each connection's hello is request 1.
    let hello_ids: Vec<Value> = core
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::FromPod { frame, .. } if frame["m"] == "hello" => Some(frame["id"].clone()),
            _ => None,
        })
        .collect();
    assert_eq!(hello_ids, vec![json!(1), json!(1)]);
}

#[tokio::test]
async fn logs_are_json_lines_when_asked() {
    let (_core, _dirs, pod, _conn) = start_pod(CoreOptions::default(), |env| {
        set_env(env, "PODHOST_LOG_FORMAT", "json");
    })
    .await;
    let line = pod.wait_log(&["joined core"]).await;
    let v: Value = serde_json::from_str(&line).unwrap();
    // Every field at the top level, none nested under `fields`.
    assert_eq!(
        (&v["message"], &v["sandbox"], &v["level"], v.get("fields")),
        (
            &json!("joined core"),
            &json!("sbx_test"),
            &json!("INFO"),
            None
        )
    );
    for l in pod.logs() {
        assert!(serde_json::from_str::<Value>(&l).is_ok(), "not JSON: {l}");
    }
}

#[tokio::test]
async fn a_frame_past_64_mib_drops_the_connection() {
    let (core, _dirs, pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    let mark = core.mark();
    let big = format!(
        r#"{{"t":"msg","m":"cancel","p":{{"pad":"{}"}}}}"#,
        "x".repeat(64 << 20)
    );
    core.send_text(conn, &big);
    core.wait_from(mark, "the drop", |e| {
        matches!(e, Event::Closed { conn: c, .. } if *c == conn).then_some(())
    })
    .await;
    core.wait_request(mark, "hello").await;
    pod.wait_log(&["the Harness API connection ended", "Message too long"])
        .await;
}

#[tokio::test]
async fn an_answer_past_64_mib_is_refused_as_limit_exceeded() {
    let (core, dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    let size: usize = 49 << 20;
    std::fs::write(dirs.workspace.join("big.bin"), vec![0u8; size]).unwrap();
    let res = core
        .request(
            conn,
            "workspace.read",
            json!({"session": {"ownerId": "s", "activeTurnId": null}, "bytes": {"path": "big.bin", "maxBytes": 50 << 20}}),
        )
        .await;
    let id = res["id"].as_u64().unwrap();
    let b64 = size.div_ceil(3) * 4;
    let frame_len = format!(
        r#"{{"t":"res","id":{id},"ok":true,"r":{{"base64":"","kind":"read","path":"big.bin"}}}}"#
    )
    .len()
        + b64;
    assert_eq!(
        res,
        json!({"t": "res", "id": id, "ok": false, "e": {
            "code": "limit_exceeded",
            "message": format!("The answer to workspace.read is {frame_len} bytes, past the 67108864-byte frame limit"),
        }})
    );
}

#[tokio::test]
async fn no_token_reaches_a_log_line() {
    let (core, _dirs, pod, _conn) = start_pod(CoreOptions::default(), |env| {
        set_env(env, "RUST_LOG", "debug");
        set_env(env, "PODHOST_POD_RENEW_INTERVAL_MS", "100");
    })
    .await;
    // A turn whose model call fails at a gate that is not there: the run token was sent.
    core.grant_turn(
        "run-x",
        "run-token-secret",
        crate::turn::turn_start(serde_json::json!("hi")),
    );
    core.wait_request(0, "turn.failed").await;
    let mark = core.mark();
    core.wait_from(mark, "a renewal", |e| {
        matches!(e, Event::Renew { status: 200, .. }).then_some(())
    })
    .await;
    let logs = pod.logs();
    assert!(
        logs.len() > 5,
        "too few log lines to mean anything: {logs:?}"
    );
    for line in &logs {
        for secret in [
            "host-token",
            "egress-token",
            "join-token",
            "run-token-secret",
        ] {
            assert!(!line.contains(secret), "{secret} in a log line: {line}");
        }
    }
    let _: Option<Value> = None;
}
