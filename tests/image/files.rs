//! What a command run by `podhost tool bash` finds in a container of the image run as a pod runs
//! it: who it is, where it may write, and the tools agents reach for.

use crate::fixture::{Image, image};
use crate::health::serve_once;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

/// `podhost tool bash` as the container's own process (PID 1, so under the init), with the pod
/// flags; the tool's outcome.
async fn tool_bash(image: &Image, command: &str) -> Value {
    let input = json!({ "command": command }).to_string();
    let out = image
        .run(
            &["--entrypoint=/usr/local/bin/podhost".to_owned()],
            &["tool", "bash", "--input", &input],
        )
        .await;
    assert!(
        out.status.success(),
        "podhost tool bash failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn completed(stdout: &str) -> Value {
    json!({
        "kind": "completed",
        "output": {"exitCode": 0, "stdout": stdout, "stderr": ""}
    })
}

/// For each directory, `written` or why writing a file there failed.
const PROBE_WRITES: &str = "for dir in \"$@\"; do \
                              if err=$(touch \"$dir/.probe\" 2>&1); then echo \"$dir: written\"; \
                              else echo \"$dir: ${err##*: }\"; fi; \
                            done";

#[tokio::test]
async fn uid_1000_can_write_the_four_pod_paths_and_nothing_else() {
    let Some(image) = image().await else { return };
    // The container itself, as the pod flags make it (no podhost in between: what a command
    // run by podhost may do on top is the confinement's decision, tested with exec::confine).
    let out = image
        .run(
            &["--entrypoint=/bin/sh".to_owned()],
            &[
                "-c",
                &format!("id -u; id -g; {PROBE_WRITES}"),
                "sh",
                "/workspace",
                "/tmp",
                "/harness",
                "/skills",
                "/",
                "/usr",
                "/etc",
                "/var/tmp",
                "/run",
            ],
        )
        .await;
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
        ),
        (
            Some(0),
            "1000\n1000\n\
             /workspace: written\n/tmp: written\n/harness: written\n/skills: written\n\
             /: Read-only file system\n/usr: Read-only file system\n\
             /etc: Read-only file system\n/var/tmp: Read-only file system\n\
             /run: Read-only file system\n"
                .to_owned()
        )
    );
}

#[tokio::test]
async fn a_command_runs_as_uid_1000_in_the_workspace_on_a_read_only_root() {
    let Some(image) = image().await else { return };
    let outcome = tool_bash(
        image,
        &format!("id -u; id -g; pwd; set -- /workspace /tmp / /usr /etc; {PROBE_WRITES}"),
    )
    .await;
    assert_eq!(
        outcome,
        completed(
            "1000\n1000\n/workspace\n\
             /workspace: written\n/tmp: written\n\
             /: Read-only file system\n/usr: Read-only file system\n\
             /etc: Read-only file system\n"
        )
    );
}

#[tokio::test]
async fn the_tools_agents_reach_for_are_there() {
    let Some(image) = image().await else { return };
    // Something for curl to fetch, on the host's loopback, which the container shares.
    let port = serve_once("200 OK", "fetched by curl\n");
    let outcome = tool_bash(
        image,
        &format!(
            "command -v bash git curl python3 ps; \
             git init -q /tmp/repo && \
             git -C /tmp/repo -c user.name=a -c user.email=a@example.com \
               commit -q --allow-empty -m first && git -C /tmp/repo log --format=%s; \
             python3 -c 'import json, ssl; print(json.dumps({{\"answer\": 6 * 7}}))'; \
             test -s /etc/ssl/certs/ca-certificates.crt && echo 'CA certificates'; \
             curl -sS http://127.0.0.1:{port}/"
        ),
    )
    .await;
    assert_eq!(
        outcome,
        completed(
            "/usr/bin/bash\n/usr/bin/git\n/usr/bin/curl\n/usr/bin/python3\n/usr/bin/ps\n\
             first\n{\"answer\": 42}\nCA certificates\nfetched by curl\n"
        )
    );
}
