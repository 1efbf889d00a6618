//! `podhost health` as a Kubernetes exec probe runs it: the exit code and what it prints, against
//! a fake health endpoint on 127.0.0.1 (no container needed).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use pretty_assertions::assert_eq;

use crate::podman::free_port;
use crate::support::podhost_bin;

/// A one-shot HTTP server on 127.0.0.1 (which containers on the host's network reach too): it
/// answers the first request with `status` and `body`. Its port.
pub fn serve_once(status: &str, body: &'static str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let status = status.to_owned();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
            request.push(byte[0]);
        }
        let answer = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(answer.as_bytes()).unwrap();
    });
    port
}

/// (exit code, stdout, stderr) of `podhost health ARGS` with `env` added.
async fn health(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = tokio::process::Command::new(podhost_bin());
    cmd.arg("health")
        .args(args)
        .env_remove("NYLORUN_HARNESS_HEALTH_PORT")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(10), cmd.output())
        .await
        .expect("podhost health did not finish")
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn exit_0_when_the_pod_host_is_connected() {
    let port = serve_once(
        "200 OK",
        r#"{"status":"ok","service":"podhost","connected":true}"#,
    );
    // The port comes from the pod's environment, as in a pod.
    let got = health(&[], &[("NYLORUN_HARNESS_HEALTH_PORT", &port.to_string())]).await;
    assert_eq!(
        got,
        (
            0,
            format!("connected: podhost answered HTTP 200 on 127.0.0.1:{port}\n"),
            String::new()
        )
    );
}

#[tokio::test]
async fn exit_1_when_it_is_not_connected() {
    let port = serve_once(
        "503 Service Unavailable",
        r#"{"status":"disconnected","service":"podhost","connected":false}"#,
    );
    let got = health(&["--port", &port.to_string()], &[]).await;
    assert_eq!(
        got,
        (
            1,
            format!("not connected: podhost answered HTTP 503 on 127.0.0.1:{port}\n"),
            String::new()
        )
    );
}

#[tokio::test]
async fn live_exits_0_for_any_answer() {
    let port = serve_once(
        "503 Service Unavailable",
        r#"{"status":"disconnected","service":"podhost","connected":false}"#,
    );
    let got = health(&["--live", "--port", &port.to_string()], &[]).await;
    assert_eq!(
        got,
        (
            0,
            format!("alive: podhost answered HTTP 503 on 127.0.0.1:{port} (connected: false)\n"),
            String::new()
        )
    );
    let port = free_port();
    let got = health(&["--live", "--port", &port.to_string()], &[]).await;
    assert_eq!(
        got,
        (
            1,
            String::new(),
            format!(
                "podhost health: could not connect to 127.0.0.1:{port}: Connection refused (os \
                 error 111)\n"
            )
        )
    );
}

#[tokio::test]
async fn exit_1_when_nothing_answers() {
    let port = free_port();
    let got = health(&["--port", &port.to_string()], &[]).await;
    assert_eq!(
        got,
        (
            1,
            String::new(),
            format!(
                "podhost health: could not connect to 127.0.0.1:{port}: Connection refused (os \
                 error 111)\n"
            )
        )
    );
}

#[tokio::test]
async fn a_health_listener_turned_off_or_a_bad_port() {
    let got = health(&[], &[("NYLORUN_HARNESS_HEALTH_PORT", "0")]).await;
    assert_eq!(
        got,
        (
            1,
            String::new(),
            "podhost health: port 0: the pod host's health listener is off\n".to_owned()
        )
    );
    let got = health(&["--timeout-ms", "0"], &[]).await;
    assert_eq!(
        got,
        (
            2,
            String::new(),
            "error: invalid value '0' for '--timeout-ms <TIMEOUT_MS>': 0 is not in 1..18446744073709551615\n\n\
             For more information, try '--help'.\n"
                .to_owned()
        )
    );
    // A value from the environment is named by its variable, one from a flag by the flag.
    let got = health(&[], &[("NYLORUN_HARNESS_HEALTH_PORT", "health")]).await;
    assert_eq!(
        got,
        (
            2,
            String::new(),
            "error: invalid value 'health' for NYLORUN_HARNESS_HEALTH_PORT: invalid digit found \
             in string\n\n\
             For more information, try '--help'.\n"
                .to_owned()
        )
    );
    let got = health(&["--port", "health"], &[]).await;
    assert_eq!(
        got,
        (
            2,
            String::new(),
            "error: invalid value 'health' for '--port <PORT>': invalid digit found in string\n\n\
             For more information, try '--help'.\n"
                .to_owned()
        )
    );
}
