//! One TLS configuration: a core and gates behind a private CA, trusted through
//! `PODHOST_CA_FILE` (or `SSL_CERT_FILE`, `SSL_CERT_DIR`) for join, the WebSocket and the model calls alike.

use pretty_assertions::assert_eq;
use serde_json::json;

use crate::fake_core::{CoreOptions, FakeCore};
use crate::fake_gates::{self, FakeGates};
use crate::tls_front::{PrivateCa, addr_of};
use crate::turn::{TOKEN, turn_start, wait_end};
use crate::{PodDirs, PodProcess, pod_env, set_env};

/// A core and gates each behind a TLS front of `ca`; the pod environment pointing at them
/// over https.
async fn behind_tls(ca: &PrivateCa) -> (FakeCore, FakeGates, PodDirs, Vec<(String, String)>) {
    let core = FakeCore::start(CoreOptions::default()).await;
    let gates = FakeGates::start(core.state.journal.clone()).await;
    let core_port = ca.front(addr_of(&core.url())).await;
    let gates_port = ca.front(addr_of(&gates.url())).await;
    let dirs = PodDirs::new(&core);
    let mut env = pod_env(&core, &dirs);
    set_env(
        &mut env,
        "NYLORUN_HARNESS_URL",
        &format!("https://127.0.0.1:{core_port}"),
    );
    set_env(
        &mut env,
        "NYLORUN_GATES_URL",
        &format!("https://localhost:{gates_port}"),
    );
    (core, gates, dirs, env)
}

#[tokio::test]
async fn a_core_behind_a_private_ca_joins_connects_and_runs_a_turn() {
    let ca = PrivateCa::new();
    let (core, gates, dirs, mut env) = behind_tls(&ca).await;
    let ca_file = ca.write_ca(dirs.dir.path());
    set_env(&mut env, "PODHOST_CA_FILE", ca_file.to_str().unwrap());
    let pod = PodProcess::spawn(&env);
    // Join (HTTPS) and the Harness API (WSS) both went through.
    core.wait_request(0, "hello").await;
    // And the Model Gate (HTTPS): a turn that calls the model completes.
    gates.script([fake_gates::text("Hello over TLS.")]);
    core.grant_turn("run-1", TOKEN, turn_start(json!("Say hello.")));
    let (method, output) = wait_end(&core, "run-1").await;
    assert_eq!(
        method,
        "turn.completed",
        "{output}\n{}",
        pod.logs().join("\n")
    );
    assert_eq!(gates.calls().len(), 1);
}

#[tokio::test]
async fn ssl_cert_file_adds_the_ca_too() {
    let ca = PrivateCa::new();
    let (core, _gates, dirs, mut env) = behind_tls(&ca).await;
    let ca_file = ca.write_ca(dirs.dir.path());
    set_env(&mut env, "SSL_CERT_FILE", ca_file.to_str().unwrap());
    let _pod = PodProcess::spawn(&env);
    core.wait_request(0, "hello").await;
}

/// OpenSSL's directory variable adds its certificates too (a directory as `openssl rehash`
/// leaves it: a file and a link to it by hash, beside a file that holds none).
#[tokio::test]
async fn ssl_cert_dir_adds_the_ca_too() {
    let ca = PrivateCa::new();
    let (core, _gates, dirs, mut env) = behind_tls(&ca).await;
    let certs = dirs.dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    let ca_file = ca.write_ca(&certs);
    std::os::unix::fs::symlink(&ca_file, certs.join("0123abcd.0")).unwrap();
    std::fs::write(certs.join("README"), "not a certificate\n").unwrap();
    let missing = dirs.dir.path().join("missing");
    let value = format!("{}:{}", missing.display(), certs.display());
    set_env(&mut env, "SSL_CERT_DIR", &value);
    let _pod = PodProcess::spawn(&env);
    core.wait_request(0, "hello").await;
}

#[tokio::test]
async fn without_the_ca_the_join_is_refused_by_podhost_and_retried() {
    let ca = PrivateCa::new();
    let (core, _gates, _dirs, env) = behind_tls(&ca).await;
    let pod = PodProcess::spawn(&env);
    let line = pod
        .wait_log(&["join or renew failed; retrying", "UnknownIssuer"])
        .await;
    assert!(line.contains("invalid peer certificate"), "{line}");
    // Nothing reached core, and podhost keeps trying.
    assert!(core.events().is_empty(), "{:?}", core.events());
    pod.wait_log(&[
        "join or renew failed; retrying",
        "UnknownIssuer",
        "retry_in",
    ])
    .await;
}

#[tokio::test]
async fn a_ca_file_that_cannot_be_read_is_a_setting_error() {
    let ca = PrivateCa::new();
    let (_core, _gates, dirs, mut env) = behind_tls(&ca).await;
    let missing = dirs.dir.path().join("no-such-ca.pem");
    set_env(&mut env, "PODHOST_CA_FILE", missing.to_str().unwrap());
    let mut pod = PodProcess::spawn(&env);
    let status = pod.wait_exit(crate::WAIT).await;
    assert_eq!(status.code(), Some(2), "{}", pod.logs().join("\n"));
    assert_eq!(
        pod.logs().last().unwrap(),
        &format!(
            "podhost pod: PODHOST_CA_FILE {}: could not read the CA file: No such file or \
             directory (os error 2)",
            missing.display()
        )
    );
}
