//! Core's `workspace.*` requests, served on the pod's workspace with the tools.

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::fake_core::{CoreOptions, FakeCore};
use crate::start_pod;

fn session() -> Value {
    json!({"ownerId": "ses_1", "activeTurnId": null})
}

/// Sends `m` and returns `r` (or the whole frame when it failed).
async fn ask(core: &FakeCore, conn: u64, m: &str, p: Value) -> Value {
    let res = core.request(conn, m, p).await;
    if res["ok"] == true {
        res["r"].clone()
    } else {
        res
    }
}

fn refused(message: &str) -> Value {
    json!({"code": "invalid", "message": message})
}

#[tokio::test]
async fn tools_on_their_methods_and_refused_on_others() {
    let (core, dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    std::fs::write(dirs.workspace.join("a.txt"), "hello\n").unwrap();
    let read = ask(
        &core,
        conn,
        "workspace.read",
        json!({"session": session(), "tool": "read", "input": {"path": "/workspace/a.txt"}}),
    )
    .await;
    assert_eq!(read, json!({"kind": "completed", "output": "1\thello"}));
    let write = ask(&core, conn, "workspace.write", json!({"session": session(), "spec": {"image": "img:1"}, "tool": "write", "input": {"path": "b.txt", "content": "hi"}})).await;
    assert_eq!(
        write,
        json!({"kind": "completed", "output": {"path": "b.txt", "bytes": 2}})
    );
    assert_eq!(
        std::fs::read_to_string(dirs.workspace.join("b.txt")).unwrap(),
        "hi"
    );
    let edit = ask(&core, conn, "workspace.write", json!({"session": session(), "tool": "edit", "input": {"path": "b.txt", "old_string": "hi", "new_string": "ho"}})).await;
    assert_eq!(
        edit,
        json!({"kind": "completed", "output": {"path": "b.txt", "replacements": 1, "snippet": "1\tho"}})
    );

    for (m, tool) in [
        ("workspace.read", "bash"),
        ("workspace.read", "write"),
        ("workspace.write", "read"),
        ("workspace.exec", "grep"),
    ] {
        let res = ask(
            &core,
            conn,
            m,
            json!({"session": session(), "tool": tool, "input": {}}),
        )
        .await;
        assert_eq!(
            res["e"],
            refused(&format!("{m} does not run {tool}")),
            "{m} {tool}"
        );
    }
}

#[tokio::test]
async fn unknown_fields_and_tools_are_invalid() {
    let (core, _dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    let res = ask(
        &core,
        conn,
        "workspace.read",
        json!({"session": session(), "tool": "read", "input": {"path": "a"}, "extra": 1}),
    )
    .await;
    assert_eq!(res["e"]["code"], "invalid");
    assert!(
        res["e"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid workspace.read request: unknown field `extra`"),
        "{res}"
    );
    let res = ask(&core, conn, "workspace.exec", json!({"session": {"ownerId": "s", "activeTurnId": null, "x": 1}, "tool": "bash", "input": {"command": "true"}})).await;
    assert!(
        res["e"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid workspace.exec request: unknown field `x`"),
        "{res}"
    );
    let res = ask(
        &core,
        conn,
        "workspace.exec",
        json!({"session": session(), "tool": "python", "input": {}}),
    )
    .await;
    assert!(
        res["e"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid workspace.exec request: unknown variant `python`"),
        "{res}"
    );
    let res = ask(
        &core,
        conn,
        "workspace.read",
        json!({"session": session(), "bytes": {"path": "a", "maxBytes": 1, "offset": 3}}),
    )
    .await;
    assert!(
        res["e"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid workspace.read request: unknown field `offset`"),
        "{res}"
    );
    let res = ask(&core, conn, "workspace.report", json!({"verbose": true})).await;
    assert!(
        res["e"]["message"]
            .as_str()
            .unwrap()
            .starts_with("Invalid workspace.report request: unknown field `verbose`"),
        "{res}"
    );
}

#[tokio::test]
async fn byte_reads_enforce_max_bytes_and_the_path_rules() {
    let (core, dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    std::fs::create_dir(dirs.workspace.join("outputs")).unwrap();
    std::fs::write(dirs.workspace.join("outputs/r.bin"), [0u8, 1, 2, 255]).unwrap();
    std::os::unix::fs::symlink("/etc", dirs.workspace.join("etc-link")).unwrap();
    let bytes = |path: &str, max: u64| json!({"session": session(), "bytes": {"path": path, "maxBytes": max}});
    assert_eq!(
        ask(
            &core,
            conn,
            "workspace.read",
            bytes("/workspace/outputs/r.bin", 4)
        )
        .await,
        json!({"kind": "read", "path": "/workspace/outputs/r.bin", "base64": "AAEC/w=="})
    );
    assert_eq!(
        ask(
            &core,
            conn,
            "workspace.read",
            bytes("/workspace/outputs/r.bin", 3)
        )
        .await,
        json!({"kind": "failed", "code": "sandbox.too_large", "message": "/workspace/outputs/r.bin is 4 bytes, past maxBytes 3."})
    );
    assert_eq!(
        ask(&core, conn, "workspace.read", bytes("outputs/none", 3)).await,
        json!({"kind": "missing", "path": "outputs/none"})
    );
    assert_eq!(
        ask(
            &core,
            conn,
            "workspace.read",
            bytes("/workspace/outputs", 3)
        )
        .await,
        json!({"kind": "failed", "code": "sandbox.not_a_file", "message": "/workspace/outputs is a directory, not a file."})
    );
    let escaped = ask(
        &core,
        conn,
        "workspace.read",
        bytes("etc-link/passwd", 1 << 20),
    )
    .await;
    assert_eq!(
        (escaped["kind"].clone(), escaped["code"].clone()),
        (json!("failed"), json!("sandbox.path_denied")),
        "{escaped}"
    );
    let outside = ask(&core, conn, "workspace.read", bytes("/etc/passwd", 1 << 20)).await;
    assert_eq!(
        outside,
        json!({"kind": "failed", "code": "sandbox.path_denied", "message": "/etc/passwd is outside the allowed directories (/workspace, /tmp)."})
    );
}

#[tokio::test]
async fn listings_are_sorted_files_only_and_truncated_past_max_entries() {
    let (core, dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    let out = dirs.workspace.join("outputs");
    std::fs::create_dir_all(out.join("sub/deeper")).unwrap();
    std::fs::write(out.join("b.txt"), "bb").unwrap();
    std::fs::write(out.join("a.txt"), "a").unwrap();
    std::fs::write(out.join("sub/c.txt"), "ccc").unwrap();
    std::fs::write(out.join("sub/deeper/d.txt"), "").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", out.join("link")).unwrap();
    std::os::unix::fs::symlink("/etc", out.join("dirlink")).unwrap();
    let list = |dir: &str, max: u64| json!({"session": session(), "list": {"dir": dir, "maxEntries": max}});
    assert_eq!(
        ask(
            &core,
            conn,
            "workspace.read",
            list("/workspace/outputs", 10)
        )
        .await,
        json!({"kind": "listed", "path": "/workspace/outputs", "listing": {"entries": [
            {"path": "a.txt", "size": 1},
            {"path": "b.txt", "size": 2},
            {"path": "sub/c.txt", "size": 3},
            {"path": "sub/deeper/d.txt", "size": 0},
        ], "truncated": false}})
    );
    assert_eq!(
        ask(&core, conn, "workspace.read", list("/workspace/outputs", 3)).await,
        json!({"kind": "listed", "path": "/workspace/outputs", "listing": {"entries": [
            {"path": "a.txt", "size": 1},
            {"path": "b.txt", "size": 2},
            {"path": "sub/c.txt", "size": 3},
        ], "truncated": true}})
    );
    assert_eq!(
        ask(&core, conn, "workspace.read", list("/workspace/none", 3)).await,
        json!({"kind": "missing", "path": "/workspace/none"})
    );
    assert_eq!(
        ask(
            &core,
            conn,
            "workspace.read",
            list("/workspace/outputs/a.txt", 3)
        )
        .await,
        json!({"kind": "missing", "path": "/workspace/outputs/a.txt"})
    );
    let escaped = ask(
        &core,
        conn,
        "workspace.read",
        list("/workspace/outputs/dirlink", 3),
    )
    .await;
    assert_eq!(escaped["code"], "sandbox.path_denied", "{escaped}");
}

#[tokio::test]
async fn report_sweep_and_remove() {
    let (core, dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    assert_eq!(
        ask(&core, conn, "workspace.report", json!({})).await,
        json!({"backend": "pod", "sandboxId": "sbx_test", "workspace": "/workspace",
               "harness": {"id": "podhost", "version": env!("CARGO_PKG_VERSION")}})
    );
    // No session has used the workspace yet.
    assert_eq!(
        ask(&core, conn, "workspace.sweep", json!({"now": 1})).await,
        json!({"workspaces": []})
    );
    std::fs::write(dirs.workspace.join("keep.txt"), "x").unwrap();
    ask(&core, conn, "workspace.read", json!({"session": session(), "spec": {"image": "img:1"}, "tool": "glob", "input": {"pattern": "*"}})).await;
    let swept = ask(&core, conn, "workspace.sweep", json!({})).await;
    let record = &swept["workspaces"][0];
    let key = record["key"].as_str().unwrap().to_owned();
    assert!(
        key.starts_with("nylorun-tn_test-sbx-") && key.len() == "nylorun-tn_test-sbx-".len() + 16,
        "{key}"
    );
    assert_eq!(
        swept,
        json!({"workspaces": [{
            "key": key, "sessionId": "ses_1", "sandboxId": "sbx_test", "backend": "pod",
            "image": "img:1", "state": "running",
            "createdAt": record["createdAt"], "updatedAt": record["updatedAt"],
        }]})
    );

    let res = ask(
        &core,
        conn,
        "workspace.remove",
        json!({"keys": ["nylorun-other-x"]}),
    )
    .await;
    assert_eq!(
        res["e"],
        refused(
            "Invalid workspace.remove request: key \"nylorun-other-x\" does not start with \"nylorun-tn_test-\""
        )
    );
    // Another key of the Tenant: not this pod's, nothing removed.
    assert_eq!(
        ask(
            &core,
            conn,
            "workspace.remove",
            json!({"keys": ["nylorun-tn_test-abc"]})
        )
        .await,
        json!({})
    );
    assert!(dirs.workspace.join("keep.txt").exists());
    assert_eq!(
        ask(&core, conn, "workspace.remove", json!({"keys": [key]})).await,
        json!({})
    );
    assert!(!dirs.workspace.join("keep.txt").exists());
    assert!(
        dirs.workspace.exists(),
        "the workspace directory itself stays"
    );
    assert_eq!(
        ask(&core, conn, "workspace.sweep", json!({})).await,
        json!({"workspaces": []})
    );
}

#[tokio::test]
async fn commands_get_the_egress_environment_and_nothing_of_podhost() {
    let (core, _dirs, _pod, conn) = start_pod(CoreOptions::default(), |env| {
        crate::set_env(env, "PODHOST_POD_RENEW_INTERVAL_MS", "300");
    })
    .await;
    let env_of = |out: &Value| -> Vec<(String, String)> {
        out["output"]["stdout"]
            .as_str()
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    let exec = json!({"session": session(), "tool": "bash", "input": {"command": "env"}});
    let out = ask(&core, conn, "workspace.exec", exec.clone()).await;
    let vars = env_of(&out);
    let get = |vars: &[(String, String)], k: &str| {
        vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    };
    let proxy = get(&vars, "HTTPS_PROXY").expect("HTTPS_PROXY");
    assert!(proxy.starts_with("http://nylorun:egress-token-"), "{proxy}");
    for name in ["HTTP_PROXY", "https_proxy", "http_proxy"] {
        assert_eq!(get(&vars, name).as_deref(), Some(proxy.as_str()), "{name}");
    }
    let bundle = get(&vars, "SSL_CERT_FILE").expect("SSL_CERT_FILE");
    for name in podhost::exec::egress::CA_BUNDLE_VARS {
        assert_eq!(get(&vars, name).as_deref(), Some(bundle.as_str()), "{name}");
    }
    let text = std::fs::read_to_string(&bundle).unwrap();
    assert!(text.ends_with(crate::fake_core::CA_PEM), "{text}");
    for (k, v) in &vars {
        assert!(
            !k.starts_with("NYLORUN_") && !k.starts_with("PODHOST_"),
            "{k} reached a command"
        );
        assert!(
            !v.contains("host-token") && !v.contains("join-token"),
            "{k}={v}"
        );
    }
    // Renewals hand out new egress tokens; a command started after one sees the new token.
    // (The renewal is recorded as core answers it; podhost applies it a moment later.)
    let mut renewed = proxy.clone();
    let mut from = core.mark();
    for _ in 0..5 {
        let (i, ()) = core
            .wait_from(from, "a renewal", |e| {
                matches!(e, crate::fake_core::Event::Renew { status: 200, .. }).then_some(())
            })
            .await;
        from = i + 1;
        let out = ask(&core, conn, "workspace.exec", exec.clone()).await;
        renewed = get(&env_of(&out), "HTTPS_PROXY").unwrap();
        if renewed != proxy {
            break;
        }
    }
    assert_ne!(renewed, proxy);
    assert!(
        renewed.starts_with("http://nylorun:egress-token-"),
        "{renewed}"
    );
}

/// A pod's commands run in a network namespace of their own: the egress proxy is reached
/// through the session's relay (the proxy variables name it on the session's loopback; the
/// proxy sees the command's request and the egress token), and nothing else on the host's
/// loopback — core's own port included — is reached at all.
#[tokio::test]
async fn commands_reach_the_egress_proxy_through_the_relay_and_nothing_else() {
    use std::io::{Read, Write};
    let network = podhost::exec::probe::probe_host(crate::support::supervisor_bin()).network;
    let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy_url = format!("http://{}", proxy.local_addr().unwrap());
    let seen = std::thread::spawn(move || {
        let (mut conn, _) = proxy.accept().unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
            head.push(byte[0]);
        }
        conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nvia proxy\n")
            .unwrap();
        String::from_utf8(head).unwrap()
    });
    let (core, _dirs, _pod, conn) = start_pod(CoreOptions::default(), |env| {
        crate::set_env(env, "NYLORUN_EGRESS_PROXY", &proxy_url);
    })
    .await;
    let command = format!(
        "printenv HTTP_PROXY | sed 's/egress-token-[^@]*@/TOKEN@/'; \
         curl -sS -m 10 http://example.test/page; \
         curl -sS -m 5 --noproxy '*' -o /dev/null {} 2>&1 | sed 's/ after .*//'",
        core.url()
    );
    let exec = json!({"session": session(), "tool": "bash", "input": {"command": command}});
    let out = ask(&core, conn, "workspace.exec", exec).await;
    let stdout = out["output"]["stdout"].as_str().unwrap().to_owned();
    if !network {
        eprintln!(
            "this machine gives sessions no network namespace: the pod's commands use the host's"
        );
        assert!(
            stdout.starts_with(&proxy_url.replace("http://", "http://nylorun:TOKEN@")),
            "{out}"
        );
        return;
    }
    let core_port = core.url().rsplit(':').next().unwrap().to_owned();
    assert_eq!(
        stdout,
        format!(
            "http://nylorun:TOKEN@127.0.0.1:3128\nvia proxy\n\
             curl: (7) Failed to connect to 127.0.0.1 port {core_port}\n"
        ),
        "{out}"
    );
    let head = seen.join().unwrap();
    assert!(
        head.starts_with("GET http://example.test/page HTTP/1.1\r\n"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-authorization: basic "),
        "the egress token reached the proxy: {head}"
    );
}

/// Whether a process whose command line contains `marker` is alive.
fn running(marker: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| {
                    String::from_utf8_lossy(&c)
                        .replace('\0', " ")
                        .contains(marker)
                })
                .unwrap_or(false)
        })
}

/// Waits (bounded) until no process carries `marker`.
async fn gone(marker: &str) -> bool {
    for _ in 0..100 {
        if !running(marker) {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn core_requests_run_concurrently_and_an_abort_kills_the_command_without_an_answer() {
    let (core, dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    std::fs::write(dirs.workspace.join("a.txt"), "a\n").unwrap();
    let marker = "sleep 29.4711";
    let (slow, mut slow_answer) = core.start_request(
        conn,
        "workspace.exec",
        json!({"session": session(), "tool": "bash", "input": {"command": marker}}),
    );
    // Wait until the command runs, then a read is served while it does.
    for _ in 0..200 {
        if running(marker) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(running(marker), "the command never started");
    let read = ask(
        &core,
        conn,
        "workspace.read",
        json!({"session": session(), "tool": "read", "input": {"path": "a.txt"}}),
    )
    .await;
    assert_eq!(read, json!({"kind": "completed", "output": "1\ta"}));
    core.abort(conn, slow);
    assert!(gone(marker).await, "the aborted command is still running");
    // The next command runs (the workspace's command lock was let go); the aborted request
    // never got an answer.
    let out = ask(
        &core,
        conn,
        "workspace.exec",
        json!({"session": session(), "tool": "bash", "input": {"command": "echo next"}}),
    )
    .await;
    assert_eq!(out["output"]["stdout"], "next\n");
    assert!(
        slow_answer.try_recv().is_err(),
        "an aborted request was answered"
    );
    assert!(
        !core
            .frames_from_pod(conn)
            .iter()
            .any(|f| f["t"] == "res" && f["id"] == slow),
        "an aborted request was answered"
    );
}

#[tokio::test]
async fn sigterm_kills_running_commands_and_exits_0() {
    let (core, _dirs, mut pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    let marker = "sleep 29.4712";
    let _pending = core.start_request(
        conn,
        "workspace.exec",
        json!({"session": session(), "tool": "bash", "input": {"command": marker}}),
    );
    for _ in 0..200 {
        if running(marker) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(running(marker), "the command never started");
    pod.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(
        pod.wait_exit(std::time::Duration::from_secs(5))
            .await
            .code(),
        Some(0)
    );
    assert!(gone(marker).await, "a command outlived podhost");
}

/// Confinement in a pod: a command cannot read the join file or anything in the harness root
/// but the egress CA bundle its trust variables name; the names stay listable (`ls /` works).
#[tokio::test]
async fn commands_cannot_read_the_join_file_or_the_harness_root() {
    let (core, dirs, _pod, conn) = start_pod(CoreOptions::default(), |_| {}).await;
    let command = format!(
        "cat {join}; cat {root}/volume-id; grep -c CERTIFICATE \"$SSL_CERT_FILE\" >/dev/null \
         && echo bundle readable; ls {root} >/dev/null && echo root listable; ls / >/dev/null \
         && echo / listable",
        join = dirs.join_file.display(),
        root = dirs.root.display()
    );
    let out = ask(
        &core,
        conn,
        "workspace.exec",
        json!({"session": session(), "tool": "bash", "input": {"command": command}}),
    )
    .await;
    let redact = |s: &str| s.replace(dirs.dir.path().to_str().unwrap(), "DIR");
    assert_eq!(
        (
            &out["output"]["exitCode"],
            redact(out["output"]["stdout"].as_str().unwrap()),
            redact(out["output"]["stderr"].as_str().unwrap())
        ),
        (
            &json!(0),
            "bundle readable\nroot listable\n/ listable\n".to_owned(),
            // In the session's view the harness root is an empty mount; without namespaces,
            // Landlock refuses its files.
            format!(
                "cat: DIR/join-token: Permission denied\ncat: DIR/harness/volume-id: {}\n",
                if podhost::exec::probe::probe_host(crate::support::supervisor_bin())
                    .namespaces
                    .any()
                {
                    "No such file or directory"
                } else {
                    "Permission denied"
                }
            )
        )
    );
}
