//! Turns in the image, continued: SIGTERM to the container while a turn's command runs, and the
//! tokens a turn's commands must not see.
//!
//! The tests run as root on the host, so they look at the container's processes from outside,
//! in the host's `/proc` (every process in the container's PID namespace), where nothing the
//! container does can hide one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::Event;
use crate::fake_gates;
use crate::fake_journal::Status;
use crate::fixture::stdout;
use crate::pod_host::{JOIN_FILE, JOIN_TOKEN, SHUTDOWN_DEADLINE_MS};
use crate::turn::{TOKEN, TurnPod, of_run, turn_pod, turn_start, wait_end};

/// `(pid in the container, command line)` of each process of a pod.
type Processes = Vec<(i32, String)>;

/// The processes in the PID namespace of the container whose PID 1 is `init` on the host:
/// `(pid in the container, command line)`, by pid. A zombie shows with an empty command line.
fn pod_processes(init: i32) -> Processes {
    let ns = std::fs::read_link(format!("/proc/{init}/ns/pid")).unwrap();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap() {
        let Some(pid) = entry
            .ok()
            .and_then(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        else {
            continue;
        };
        // Any of these fails for a process that ended meanwhile: it is not there.
        if std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok() != Some(ns.clone()) {
            continue;
        }
        let (Ok(status), Ok(cmdline)) = (
            std::fs::read_to_string(format!("/proc/{pid}/status")),
            std::fs::read(format!("/proc/{pid}/cmdline")),
        ) else {
            continue;
        };
        // `NSpid: <on the host> … <in the container>`.
        let in_pod: i32 = status
            .lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .and_then(|ids| ids.split_whitespace().last()?.parse().ok())
            .unwrap();
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        found.push((in_pod, args.join(" ")));
    }
    found.sort();
    found
}

/// `(is PID 1, command line)` of each process: what does not change from run to run.
fn shape(processes: &[(i32, String)]) -> Vec<(bool, &str)> {
    processes
        .iter()
        .map(|(pid, args)| (*pid == 1, args.as_str()))
        .collect()
}

/// The command a turn runs: a `sleep` in the background, its pid written to a fifo in the
/// workspace (which blocks until the test reads it), then waiting for it.
const SLEEPER: &str = "sleep 300 & echo $! > started.fifo; wait";

#[tokio::test]
async fn sigterm_while_a_command_runs_releases_the_run_kills_the_command_and_exits_0() {
    // Two lease slots: one holds the run, the other is waiting for a lease when SIGTERM comes.
    let Some(t) = turn_pod(&[("PODHOST_POD_CONCURRENCY", "2")]).await else {
        return;
    };
    let TurnPod {
        core,
        gates,
        pod,
        conn,
    } = &t;
    let init = pod.container.host_pid().await;
    let (i, _, first) = core.wait_request(0, "lease").await;
    let (_, _, second) = core.wait_request(i + 1, "lease").await;
    stdout(
        &pod.container
            .exec(&["mkfifo", "/workspace/started.fifo"])
            .await,
    );
    gates.script([fake_gates::tool_call(
        "c1",
        "bash",
        json!({"command": SLEEPER}),
    )]);
    let run = core.grant_turn("run-1", TOKEN, turn_start(json!("Sleep.")));
    let sleep_pid: i32 = stdout(
        &pod.container
            .exec(&["cat", "/workspace/started.fifo"])
            .await,
    )
    .trim()
    .parse()
    .unwrap();
    // The lease that was not answered with the run is the one still waiting.
    let granted = core
        .wait("the grant", |e| match e {
            Event::ToPod { frame, .. } if frame["t"] == "res" && frame["r"]["run"] == run => {
                Some(frame["id"].clone())
            }
            _ => None,
        })
        .await;
    let waiting = if granted == first["id"] {
        second["id"].clone()
    } else {
        first["id"].clone()
    };

    // The command runs under its supervisor: seen from the host, before the signal.
    // Alone, under its supervisor; in an isolated session, under the session's holder (its
    // outer process, the session's init, the command's supervisor and the next command's,
    // forked ahead as this one started), whose PID namespace, when there is one, hides the rest
    // from the container's. In pid order, but for the one forked ahead, which may come before or
    // after the command's processes: it is taken out first.
    let before = pod_processes(init);
    let command = format!("/bin/bash -c {SLEEPER}");
    let pod_side = [
        (true, "/usr/local/bin/podhost pod"),
        (false, "/usr/local/bin/podhost pod"),
    ];
    let session = "/usr/local/bin/podhost-exec __session";
    let expected: Vec<(bool, &str)> = match pod.container.namespaces().await {
        (ns, _) if ns == "off" || ns == "none" => pod_side
            .into_iter()
            .chain([
                (false, "/usr/local/bin/podhost-exec __exec"),
                (false, &*command),
                (false, "sleep 300"),
            ])
            .collect(),
        (_, false) => pod_side
            .into_iter()
            .chain([
                (false, session),
                (false, session),
                (false, session),
                (false, &*command),
                (false, "sleep 300"),
            ])
            .collect(),
        (_, true) => pod_side.into_iter().chain([(false, session)]).collect(),
    };
    let mut seen = shape(&before);
    if expected.iter().filter(|p| **p == (false, session)).count() == 3 {
        let ahead = seen
            .iter()
            .enumerate()
            .filter(|(_, p)| **p == (false, session))
            .nth(3)
            .map(|(i, _)| i);
        seen.remove(ahead.unwrap_or_else(|| panic!("no supervisor forked ahead: {before:#?}")));
    }
    assert_eq!(seen, expected, "{before:#?}");
    if expected.last() == Some(&(false, "sleep 300")) {
        assert!(
            before.contains(&(sleep_pid, "sleep 300".to_owned())),
            "{before:#?}"
        );
    }

    // What is left in the container as core receives the release, while podhost waits for
    // core's answer to it (so the pod is certainly still up).
    let at_release: Arc<Mutex<Option<Processes>>> = Arc::default();
    let seen = at_release.clone();
    core.on_request(move |method, _| {
        if method == "lease.release" {
            *seen.lock().unwrap() = Some(pod_processes(init));
        }
    });
    pod.container.kill("TERM").await;
    assert_eq!(
        wait_end(core, "run-1").await,
        (
            "lease.release".to_owned(),
            json!({"runId": "run-1", "reason": "shutdown"})
        )
    );
    let at_release = at_release.lock().unwrap().clone().unwrap();
    // Nothing of the command is left; an isolated session's holder (its outer process, its
    // init and the supervisor forked ahead) stays for the pod's next command, and ends with
    // podhost.
    let holder: &[(bool, &str)] = match pod.container.namespaces().await {
        (ns, _) if ns == "off" || ns == "none" => &[],
        (_, false) => &[(false, session), (false, session), (false, session)],
        (_, true) => &[(false, session)],
    };
    assert_eq!(
        shape(&at_release),
        pod_side.iter().chain(holder).copied().collect::<Vec<_>>(),
        "the command's processes outlived the run: {at_release:#?}"
    );

    let code = pod.container.wait(Duration::from_secs(10)).await;
    let logs = pod.container.logs().await;
    assert_eq!(code, 0, "logs:\n{logs}");
    // podhost finished its shutdown within its deadline, on its own.
    assert!(logs.contains("podhost pod stopped"), "logs:\n{logs}");
    for late in [
        "the shutdown deadline passed",
        "runs did not all end before the deadline",
    ] {
        assert!(
            !logs.contains(late),
            "{late:?} with a {SHUTDOWN_DEADLINE_MS} ms deadline; logs:\n{logs}"
        );
    }

    // The run: its model call and the command's intent journaled, no outcome for the command
    // (the next owner runs it again) and no turn output; the waiting lease aborted.
    let methods = core.run_methods(*conn, "run-1");
    assert_eq!(
        methods,
        [
            "effect.intent",
            "effect.outcome",
            "effect.intent",
            "lease.release"
        ]
    );
    assert!(core.journal().outputs().is_empty());
    let status = |id: &str| core.journal().row(id).unwrap().status;
    assert_eq!(
        (status("turn_1:0:model:s0"), status("turn_1:0:tool:s0.c1")),
        (Status::Completed, Status::Invoking)
    );
    let frames = core.frames_from_pod(*conn);
    assert!(
        frames.contains(&json!({"t": "abort", "id": waiting})),
        "the waiting lease {waiting} was not aborted: {frames:#?}"
    );
    let closed = core
        .wait("the connection closed", |e| match e {
            Event::Closed { conn: c, code, .. } if c == conn => Some(*code),
            _ => None,
        })
        .await;
    assert_eq!(closed, Some(1001));
}

/// Looks for podhost from inside (the pod host is PID 1's child), then tries to read every
/// place a token could be.
fn snoop() -> String {
    format!(
        "env | sort; \
         podhost=$(ps -o pid=,args= --ppid 1 | awk '$2 == \"/usr/local/bin/podhost\" \
         {{ print $1 }}'); \
         cat /proc/1/environ; cat /proc/$podhost/environ; cat {JOIN_FILE}; \
         echo end"
    )
}

#[tokio::test]
async fn a_turns_command_sees_no_run_token_host_token_or_join_token() {
    let Some(t) = turn_pod(&[]).await else { return };
    let command = snoop();
    let call = fake_gates::tool_call("c1", "bash", json!({"command": command}));
    t.gates.script([call, fake_gates::text("Nothing to see.")]);
    t.core
        .grant_turn("run-1", TOKEN, turn_start(json!("Look around.")));
    let (method, output) = wait_end(&t.core, "run-1").await;
    assert_eq!(method, "turn.completed", "{output}");

    // The join file is an empty mount in an isolated session, refused by Landlock otherwise.
    let join_refusal = if t.pod.container.isolated().await {
        "No such file or directory"
    } else {
        "Permission denied"
    };
    // podhost's pid in the container, seen from the host.
    let processes = pod_processes(t.pod.container.host_pid().await);
    let podhost = processes
        .iter()
        .find(|(pid, args)| *pid != 1 && args == "/usr/local/bin/podhost pod")
        .map(|(pid, _)| *pid)
        .unwrap_or_else(|| panic!("no podhost in {processes:#?}"));
    let outcome = t
        .core
        .run_frames(t.conn, "run-1")
        .into_iter()
        .find(|(m, p)| m == "effect.outcome" && p["effectId"] == "turn_1:0:tool:s0.c1")
        .map(|(_, p)| p)
        .unwrap();
    // The command's whole environment: the base, the session's variable, the trace context and
    // the egress CA bundle, and nothing of podhost's. In a network namespace of the session's
    // own, also the proxy variables naming its one way out (podhost's proxy on the session's
    // loopback).
    let proxied = t.pod.container.network().await == "namespace";
    let proxy = |upper: bool| match (proxied, upper) {
        (false, _) => "",
        (true, true) => {
            "HTTPS_PROXY=http://127.0.0.1:3128\n\
             HTTP_PROXY=http://127.0.0.1:3128\n"
        }
        (true, false) => {
            "http_proxy=http://127.0.0.1:3128\n\
             https_proxy=http://127.0.0.1:3128\n\
             no_proxy=localhost,127.0.0.1,::1\n"
        }
    };
    let no_proxy = if proxied {
        "NO_PROXY=localhost,127.0.0.1,::1\n"
    } else {
        ""
    };
    let env = format!(
        "AWS_CA_BUNDLE=/harness/egress-ca-bundle.pem\n\
         CURL_CA_BUNDLE=/harness/egress-ca-bundle.pem\n\
         DEBIAN_FRONTEND=noninteractive\n\
         GIT_PAGER=cat\n\
         GIT_SSL_CAINFO=/harness/egress-ca-bundle.pem\n\
         GIT_TERMINAL_PROMPT=0\n\
         HOME=/workspace\n\
         {}\
         LANG=C.UTF-8\n\
         LC_ALL=C.UTF-8\n\
         NODE_EXTRA_CA_CERTS=/harness/egress-ca-bundle.pem\n\
         NO_COLOR=1\n\
         {no_proxy}\
         PAGER=cat\n\
         PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
         PWD=/workspace\n\
         REQUESTS_CA_BUNDLE=/harness/egress-ca-bundle.pem\n\
         SESSION_VAR=session-value\n\
         SHLVL=1\n\
         SSL_CERT_FILE=/harness/egress-ca-bundle.pem\n\
         TERM=dumb\n\
         TRACEPARENT=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\n\
         _=/usr/bin/env\n\
         {}",
        proxy(true),
        proxy(false)
    );
    assert_eq!(
        outcome,
        of_run(
            "run-1",
            json!({"effectId": "turn_1:0:tool:s0.c1", "value": {"kind": "completed", "output": {
                "exitCode": 0,
                "stdout": format!("{env}end\n"),
                "stderr": format!(
                    "cat: /proc/1/environ: Permission denied\n\
                     cat: /proc/{podhost}/environ: Permission denied\n\
                     cat: {JOIN_FILE}: {join_refusal}\n"
                ),
            }}})
        )
    );

    // Nor did a token reach anything else podhost sent: frames, model calls, logs.
    let host_token = "host-token-epoch-";
    let sent: Vec<String> = t
        .core
        .frames_from_pod(t.conn)
        .iter()
        .map(Value::to_string)
        .chain(t.gates.calls().iter().map(|c| c.raw.clone()))
        .chain([t.pod.container.logs().await])
        .collect();
    for secret in [TOKEN, host_token, JOIN_TOKEN] {
        let leaks: Vec<&String> = sent.iter().filter(|s| s.contains(secret)).collect();
        assert!(leaks.is_empty(), "{secret} in {leaks:#?}");
    }
}
