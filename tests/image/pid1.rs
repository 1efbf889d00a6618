//! podhost as the container's PID 1: the init split, orphans reaped, SIGTERM turned into the
//! pod host's shutdown, HOME made on the empty volume, and an environment commands cannot read.

use std::time::Duration;

use pretty_assertions::assert_eq;

use crate::fixture::{image, stdout};
use crate::pod_host::PodHost;
use crate::podman::free_port;

/// Core's address for pods that never reach it: nothing listens there, so podhost keeps
/// retrying its join, which is all these tests need of it.
fn no_core() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

#[tokio::test]
async fn podhost_pod_is_pid_1_and_runs_podhost_as_its_child() {
    let Some(image) = image().await else { return };
    let pod = PodHost::start(image, &no_core()).await;
    let ps = stdout(
        &pod.container
            .exec(&["ps", "-e", "-o", "pid=,ppid=,uid=,args="])
            .await,
    );
    // (is PID 1, parent, uid, command line) of every podhost process.
    let podhosts: Vec<(bool, u32, u32, String)> = ps
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let pid: u32 = words.next()?.parse().ok()?;
            let ppid: u32 = words.next()?.parse().ok()?;
            let uid: u32 = words.next()?.parse().ok()?;
            let args = words.collect::<Vec<_>>().join(" ");
            args.starts_with("/usr/local/bin/podhost")
                .then_some((pid == 1, ppid, uid, args))
        })
        .collect();
    assert_eq!(
        podhosts,
        vec![
            (true, 0, 1000, "/usr/local/bin/podhost pod".to_owned()),
            (false, 1, 1000, "/usr/local/bin/podhost pod".to_owned()),
        ],
        "ps:\n{ps}"
    );
}

#[tokio::test]
async fn an_orphan_is_reaped_by_pid_1() {
    let Some(image) = image().await else { return };
    let pod = PodHost::start(image, &no_core()).await;
    // The exec'd shell starts a child in the background and exits at once: the child is
    // orphaned, re-parented to PID 1 (the container's init), writes down its parent and
    // exits. Without an init that reaps it, it stays a zombie.
    let orphan = stdout(
        &pod.container
            .exec(&[
                "sh",
                "-c",
                "sh -c 'sleep 0.2; grep PPid /proc/$$/status > /tmp/orphan' >/dev/null 2>&1 & \
                 echo $!",
            ])
            .await,
    );
    let orphan = orphan.trim();
    // Wait (up to 10 s) for the orphan to be gone from the process table.
    let watch = "pid=$1; i=0; \
                 while [ -e /proc/$pid ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; \
                 if [ -e /proc/$pid ]; then echo \"still there: $(cat /proc/$pid/stat)\"; \
                 else cat /tmp/orphan; fi";
    let seen = stdout(&pod.container.exec(&["sh", "-c", watch, "sh", orphan]).await);
    assert_eq!(seen, "PPid:\t1\n");
}

#[tokio::test]
async fn sigterm_to_pid_1_is_podhosts_shutdown_and_the_container_exits_0() {
    let Some(image) = image().await else { return };
    let pod = PodHost::start(image, &no_core()).await;
    // From outside, as the runtime stops a pod.
    pod.container.kill("TERM").await;
    let code = pod.container.wait(Duration::from_secs(10)).await;
    let logs = pod.container.logs().await;
    assert_eq!(code, 0, "logs:\n{logs}");
    for line in ["SIGTERM: shutting down", "podhost pod stopped"] {
        assert!(logs.contains(line), "no {line:?} in the logs:\n{logs}");
    }
}

#[tokio::test]
async fn home_is_made_on_the_empty_harness_volume() {
    let Some(image) = image().await else { return };
    // /harness is an empty tmpfs (nothing of the image copied up), like an emptyDir.
    let pod = PodHost::start(image, &no_core()).await;
    let home = stdout(
        &pod.container
            .exec(&["sh", "-c", "echo \"$HOME\"; stat -c '%U %a' \"$HOME\""])
            .await,
    );
    assert_eq!(home, "/harness/home\nagent 700\n");
}

#[tokio::test]
async fn commands_cannot_read_the_environment_of_pid_1_or_podhost() {
    let Some(image) = image().await else { return };
    let pod = PodHost::start(image, &no_core()).await;
    // PID 1 and podhost hold the pod's environment; a command runs as the same uid.
    let outcome = pod
        .bash(
            "podhost=$(ps -o pid=,args= --ppid 1 | awk '$2 == \"/usr/local/bin/podhost\" \
             { print $1 }'); \
             for pid in 1 $podhost; do cat /proc/$pid/environ 2>&1 >/dev/null | sed 's/.*: //'; \
             done",
        )
        .await;
    assert_eq!(
        outcome,
        serde_json::json!({
            "kind": "completed",
            "output": {
                "exitCode": 0,
                "stdout": "Permission denied\nPermission denied\n",
                "stderr": "",
            }
        })
    );
}
