//! The pod's `GET /metrics` (on the loopback health port, and on `PODHOST_METRICS_LISTEN`) after
//! a scripted turn, read with the Prometheus client's own parsers; `/health` says `status`
//! truthfully.

use std::collections::BTreeMap;

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::fake_core::CoreOptions;
use crate::fake_gates;
use crate::prometheus::{counted, family, parse};
use crate::set_env;
use crate::turn::{TOKEN, setup_with, turn_start, wait_end};

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) async fn get(url: &str) -> (u16, String) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = tokio::time::timeout(crate::WAIT, client.get(url).send())
        .await
        .unwrap()
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

pub(crate) fn entries(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[tokio::test]
async fn metrics_count_the_pods_connection_leases_effects_and_turns() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (health, metrics) = (free_port(), free_port());
    let s = setup_with(CoreOptions::default(), |env| {
        set_env(env, "NYLORUN_HARNESS_HEALTH_PORT", &health.to_string());
        set_env(
            env,
            "PODHOST_METRICS_LISTEN",
            &format!("127.0.0.1:{metrics}"),
        );
    })
    .await;
    s.pod.wait_log(&["metrics endpoint listening"]).await;
    let call = fake_gates::tool_call("call_1", "bash", json!({"command": "echo hi"}));
    s.gates.script([call, fake_gates::text("Done.")]);
    s.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Say hi.")));
    let (method, output) = wait_end(&s.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");
    // The lease ends just after the output is taken.
    s.pod.wait_log(&["run output sent"]).await;

    let (code, text) = get(&format!("http://127.0.0.1:{health}/metrics")).await;
    assert_eq!(code, 200, "{text}");
    let m = parse(&text);
    // What was recorded, without the label sets set up at 0.
    let f = |name: &str| counted(&m, name);
    assert_eq!(f("podhost_pod_connected"), entries(&[("", 1.0)]));
    assert_eq!(
        family(&m, "podhost_pod_reconnects_total"),
        entries(&[("", 0.0)])
    );
    assert_eq!(
        f("podhost_pod_effects_journaled_total"),
        entries(&[("kind=model", 2.0), ("kind=tool", 1.0)])
    );
    assert_eq!(
        f("podhost_model_calls_total"),
        entries(&[("endpoint=model_gate,outcome=ok", 2.0)])
    );
    assert_eq!(
        f("podhost_tool_calls_total"),
        entries(&[("outcome=completed,tool=bash", 1.0)])
    );
    assert_eq!(
        f("podhost_turns_total"),
        entries(&[("front=pod,outcome=completed", 1.0)])
    );
    assert_eq!(
        family(&m, "podhost_turns_running"),
        entries(&[("front=pod", 0.0)])
    );
    // The run's lease gauge went up and back down once the run ended.
    let deadline = std::time::Instant::now() + crate::WAIT;
    loop {
        let (_, text) = get(&format!("http://127.0.0.1:{metrics}/metrics")).await;
        let m = parse(&text);
        if family(&m, "podhost_pod_leases_held") == entries(&[("", 0.0)]) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The second listener serves the metrics only.
    assert_eq!(
        get(&format!("http://127.0.0.1:{metrics}/health")).await.0,
        404
    );

    // Connection lost: the gauge and `/health` say so, and the reconnect is counted.
    s.core.set_tenant_closed(true);
    s.core.close_conn(s.conn);
    s.pod
        .wait_log(&["could not open the Harness API connection"])
        .await;
    let (code, body) = get(&format!("http://127.0.0.1:{health}/health")).await;
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (code, &body["status"], &body["connected"]),
        (503, &json!("disconnected"), &json!(false))
    );
    assert_eq!(body["revision"], env!("BUILD_GIT_REVISION"));
    let (_, text) = get(&format!("http://127.0.0.1:{health}/metrics")).await;
    let m = parse(&text);
    assert_eq!(family(&m, "podhost_pod_connected"), entries(&[("", 0.0)]));
    assert!(
        family(&m, "podhost_pod_reconnects_total")[""] >= 1.0,
        "{text}"
    );
}
