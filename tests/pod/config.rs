//! Missing or malformed configuration: a clear error naming each variable, exit code 2.

use pretty_assertions::assert_eq;

use crate::support::podhost_bin;

async fn run_pod(env: &[(&str, &str)]) -> (i32, String) {
    let out = tokio::time::timeout(
        crate::WAIT,
        tokio::process::Command::new(podhost_bin())
            .arg("pod")
            .env_clear()
            .envs(env.iter().copied())
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn missing_variables_are_each_named() {
    let (code, stderr) = run_pod(&[]).await;
    assert_eq!(code, 2);
    assert_eq!(
        stderr,
        "podhost pod: invalid pod configuration:\n\
         \x20 NYLORUN_SANDBOX_ID: is not set\n\
         \x20 NYLORUN_POD_UID: is not set\n\
         \x20 NYLORUN_SANDBOX_JOIN_FILE: is not set\n\
         \x20 NYLORUN_HARNESS_URL: is not set\n\
         \x20 NYLORUN_GATES_URL: is not set\n"
    );
}

#[tokio::test]
async fn malformed_variables_are_each_named() {
    let (code, stderr) = run_pod(&[
        ("NYLORUN_SANDBOX_ID", "sbx"),
        ("NYLORUN_POD_UID", "uid/1"),
        ("NYLORUN_SANDBOX_JOIN_FILE", "/run/join"),
        ("NYLORUN_HARNESS_URL", "ftp://core:4200"),
        ("NYLORUN_GATES_URL", "gates"),
        ("PODHOST_HARNESS_ID", "x"),
        ("NYLORUN_HARNESS_HEALTH_PORT", "70000"),
        ("PODHOST_POD_BACKOFF_BASE_MS", "0"),
    ])
    .await;
    assert_eq!(code, 2);
    assert_eq!(
        stderr,
        "podhost pod: invalid pod configuration:\n\
         \x20 NYLORUN_POD_UID: \"uid/1\" must be 1 to 64 letters, digits or '-'\n\
         \x20 NYLORUN_HARNESS_URL: \"ftp://core:4200\" must be a http/https/ws/wss URL with a host (got scheme \"ftp\")\n\
         \x20 NYLORUN_GATES_URL: \"gates\" is not a URL: relative URL without a base\n\
         \x20 PODHOST_HARNESS_ID: \"x\" does not match ^[a-z][a-z0-9-]{1,62}$\n\
         \x20 NYLORUN_HARNESS_HEALTH_PORT: \"70000\" is not a port number (0 turns the health listener off)\n\
         \x20 PODHOST_POD_BACKOFF_BASE_MS: \"0\" is not a positive number of milliseconds\n"
    );
}
