//! The loopback health endpoint: 503 and `disconnected` while not connected, 200 and `ok` once
//! `hello` is answered.

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::fake_core::{CoreOptions, FakeCore};
use crate::{PodDirs, PodProcess, pod_env, set_env};

async fn get(port: u16) -> (u16, serde_json::Value) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = tokio::time::timeout(
        crate::WAIT,
        client.get(format!("http://127.0.0.1:{port}/health")).send(),
    )
    .await
    .unwrap()
    .unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

#[tokio::test]
async fn health_says_whether_the_pod_is_connected() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let core = FakeCore::start(CoreOptions::default()).await;
    core.set_tenant_closed(true);
    let dirs = PodDirs::new(&core);
    let mut env = pod_env(&core, &dirs);
    set_env(&mut env, "NYLORUN_HARNESS_HEALTH_PORT", &port.to_string());
    let pod = PodProcess::spawn(&env);
    pod.wait_log(&["health endpoint listening", &format!("127.0.0.1:{port}")])
        .await;
    pod.wait_log(&["HTTP 503"]).await;
    assert_eq!(
        get(port).await,
        (
            503,
            json!({"status": "disconnected", "service": "podhost", "connected": false,
                   "confinement": pod_confinement(), "version": env!("CARGO_PKG_VERSION"),
                   "revision": env!("BUILD_GIT_REVISION")})
        )
    );
    core.set_tenant_closed(false);
    // `lease` goes out only after the pod counts itself connected.
    core.wait_request(0, "lease").await;
    assert_eq!(
        get(port).await,
        (
            200,
            json!({"status": "ok", "service": "podhost", "connected": true,
                   "confinement": pod_confinement(), "version": env!("CARGO_PKG_VERSION"),
                   "revision": env!("BUILD_GIT_REVISION")})
        )
    );
}

/// The confinement level a pod on this machine reports: the default policy's, with podhost
/// non-dumpable (this test process is not).
fn pod_confinement() -> serde_json::Value {
    let mut level = serde_json::to_value(podhost::exec::Confinement::default().level()).unwrap();
    level["non_dumpable"] = json!(true);
    level
}
