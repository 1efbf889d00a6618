//! The image as a Nylorun pod against a fake core on the host's 127.0.0.1: join, hello,
//! `workspace.exec`, the health probe, shutdown on SIGTERM, and the tokens commands must not see.

use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, Event, FakeCore};
use crate::fixture::image;
use crate::pod_host::{JOIN_FILE, JOIN_TOKEN, PodHost};

fn session() -> Value {
    json!({"ownerId": "ses_1", "activeTurnId": null})
}

/// Runs `command` as core runs one (`workspace.exec` with the bash tool); the answer's result.
async fn exec(core: &FakeCore, conn: u64, command: &str) -> Value {
    let answer = core
        .request(
            conn,
            "workspace.exec",
            json!({"session": session(), "tool": "bash", "input": {"command": command}}),
        )
        .await;
    assert_eq!(answer["ok"], true, "{answer}");
    answer["r"].clone()
}

/// Starts the fake core and the pod against it; waits until podhost leases (it is connected).
async fn connected_pod() -> Option<(FakeCore, PodHost, u64)> {
    let image = image().await?;
    let core = FakeCore::start(CoreOptions::default()).await;
    let pod = PodHost::start(image, &core.url()).await;
    let (_, conn, _) = core.wait_request(0, "lease").await;
    Some((core, pod, conn))
}

#[tokio::test]
async fn the_pod_joins_serves_workspace_exec_and_stops_on_sigterm() {
    let Some((core, pod, conn)) = connected_pod().await else {
        return;
    };
    let mut join = core
        .wait("a join", |e| match e {
            Event::Join { body, status: 200 } => Some(body.clone()),
            _ => None,
        })
        .await;
    // The volume id is podhost's own UUID, kept on the /harness volume.
    let volume_id = join["volumeId"].take();
    assert_eq!(volume_id.as_str().map(str::len), Some(36), "{volume_id}");
    assert_eq!(
        join,
        json!({"sandboxId": "sbx_test", "podUid": "pod-uid-1", "joinToken": JOIN_TOKEN, "volumeId": null})
    );
    let (_, _, hello) = core.wait_request(0, "hello").await;
    assert_eq!(
        (&hello["p"]["name"], &hello["p"]["features"]),
        (&json!("podhost"), &json!({"workspace": true}))
    );

    let result = exec(
        &core,
        conn,
        "id -u; pwd; echo made > /workspace/by-core.txt; cat /workspace/by-core.txt",
    )
    .await;
    assert_eq!(
        result,
        json!({"kind": "completed", "output": {"exitCode": 0, "stdout": "1000\n/workspace\nmade\n", "stderr": ""}})
    );

    // The Kubernetes probe, from inside the container.
    let probe = pod.container.exec(&["podhost", "health"]).await;
    assert_eq!(
        (
            probe.status.code(),
            String::from_utf8_lossy(&probe.stdout).into_owned()
        ),
        (
            Some(0),
            format!(
                "connected: podhost answered HTTP 200 on 127.0.0.1:{}\n",
                pod.health_port
            )
        )
    );

    let (_, _, lease) = core.wait_request(0, "lease").await;
    pod.container.kill("TERM").await;
    let code = pod.container.wait(Duration::from_secs(10)).await;
    assert_eq!(code, 0, "logs:\n{}", pod.container.logs().await);
    // podhost gave back the lease it was waiting on and closed the connection as going away.
    let frames = core.frames_from_pod(conn);
    assert_eq!(
        frames.last(),
        Some(&json!({"t": "abort", "id": lease["id"]}))
    );
    let closed = core
        .wait("the connection closed", |e| match e {
            Event::Closed { conn: c, code, .. } if *c == conn => Some(*code),
            _ => None,
        })
        .await;
    assert_eq!(closed, Some(1001));
}

#[tokio::test]
async fn commands_see_neither_the_host_token_nor_the_join_token() {
    let Some((core, _pod, conn)) = connected_pod().await else {
        return;
    };
    // A command's own environment holds neither token, and the environments of PID 1 and
    // podhost are closed to it.
    let result = exec(
        &core,
        conn,
        &format!(
            "env | grep -c -e {JOIN_TOKEN} -e host-token; \
             podhost=$(ps -o pid=,args= --ppid 1 | awk '$2 == \"/usr/local/bin/podhost\" \
             {{ print $1 }}'); \
             for pid in 1 $podhost; do cat /proc/$pid/environ 2>&1 >/dev/null | sed 's/.*: //'; \
             done"
        ),
    )
    .await;
    assert_eq!(
        result,
        json!({"kind": "completed", "output": {"exitCode": 0, "stdout": "0\nPermission denied\nPermission denied\n", "stderr": ""}})
    );
}

#[tokio::test]
async fn commands_cannot_read_the_join_file() {
    let Some((core, pod, conn)) = connected_pod().await else {
        return;
    };
    // An empty mount over it in an isolated session; Landlock's refusal without one.
    let refusal = if pod.container.isolated().await {
        "No such file or directory"
    } else {
        "Permission denied"
    };
    let result = exec(
        &core,
        conn,
        &format!("cat {JOIN_FILE} 2>&1 | sed 's/.*: //'"),
    )
    .await;
    assert_eq!(
        result,
        json!({"kind": "completed", "output": {"exitCode": 0, "stdout": format!("{refusal}\n"), "stderr": ""}})
    );
}
