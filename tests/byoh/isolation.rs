//! Sessions of `podhost serve` kept apart and bounded: each its own uid (a root podhost) and view
//! of the file system, a disk quota that stops a session filling the disk while another one
//! completes, and the level in force in the start-up log and `/healthz`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use pretty_assertions::assert_eq;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, T, start};
use crate::openai_fake::{FakeModel, Reply};

/// The content of the answer to `call` in a collected transcript.
fn answer(messages: &Value, call: &str) -> Value {
    let text = messages
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["tool_call_id"] == call)
        .and_then(|m| m["content"].as_str())
        .unwrap_or_else(|| panic!("no answer to {call}: {messages}"));
    serde_json::from_str(text).unwrap_or(Value::String(text.to_owned()))
}

/// A model that runs `steps` (tool, arguments) one after the other, then answers "done".
fn script(fake: &FakeModel, steps: Vec<(&'static str, Value)>) {
    let steps = Arc::new(steps);
    fake.respond_with(move |body| {
        let done = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .count();
        match steps.get(done) {
            Some((tool, args)) => Reply::call(&format!("c{done}"), tool, args.clone()),
            None => Reply::text("done"),
        }
    });
}

/// A size-limited tmpfs the test mounts for a data directory (unmounted when dropped), so that
/// filling it fills no real disk.
struct SmallDisk {
    path: PathBuf,
}

impl SmallDisk {
    /// `None` where this machine will not mount one (not root).
    fn new(under: &Path, mib: u64) -> Option<SmallDisk> {
        let path = under.join("data");
        std::fs::create_dir_all(&path).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={mib}m,mode=0755,nosuid,nodev"))
            .arg("tmpfs")
            .arg(&path)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        mounted.then_some(SmallDisk { path })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

#[tokio::test]
async fn a_session_filling_the_disk_is_stopped_at_its_quota_while_another_completes() {
    let dir = tempfile::tempdir().unwrap();
    let Some(disk) = SmallDisk::new(dir.path(), 64) else {
        // Never on the machine's disk: the quota's measurement is checked by the unit tests of
        // `exec::quota` instead.
        eprintln!(
            "cannot mount a size-limited tmpfs here (not root): the disk-filling attack is not \
             run; only the quota's measurement (unit tests) is checked"
        );
        return;
    };
    let filler = FakeModel::start("fake-model", None).await;
    script(
        &filler,
        vec![
            // One file past the quota: the kernel stops it (RLIMIT_FSIZE is at most the quota).
            (
                "bash",
                json!({"command": "dd if=/dev/zero of=one bs=1M count=40 2>/dev/null; stat -c %s one"}),
            ),
            // Deleting works past the quota (a command started past it may write nothing).
            ("bash", json!({"command": "rm one; echo deleted"})),
            // Many files, slowly: podhost measures the session and stops the command.
            (
                "bash",
                json!({"command": "for i in $(seq 1 200); do head -c 1048576 /dev/zero > f$i; sleep 0.05; done; echo never"}),
            ),
            ("write", json!({"path": "more.txt", "content": "more"})),
            ("bash", json!({"command": "rm f*; echo freed"})),
            ("write", json!({"path": "more.txt", "content": "more"})),
        ],
    );
    let calm = FakeModel::start("fake-model", None).await;
    script(
        &calm,
        vec![(
            "bash",
            json!({"command": "echo fine > mine.txt && cat mine.txt"}),
        )],
    );
    // The server lives in the small disk's parent: its data directory is the tmpfs.
    let s = Serve::start_with(
        dir.path(),
        Options::default()
            .env("PODHOST_SESSION_DISK_MB", "8")
            .env("PODHOST_SESSION_DISK_FS", "off")
            .env("PODHOST_MIN_FREE_MB", "1"),
    );
    assert_eq!(s.data, disk.path);
    s.submit(start("filler", "f1", "fill it", &filler.base_url(), None))
        .await;
    s.submit(start("calm", "c1", "be calm", &calm.base_url(), None))
        .await;
    s.wait_status("c1", "completed", T).await;
    let (_, calm_out) = s.collect("c1").await;
    assert_eq!(
        answer(&calm_out["messages"], "c0"),
        json!({"exitCode": 0, "stdout": "fine\n", "stderr": ""})
    );
    s.wait_status("f1", "completed", std::time::Duration::from_secs(60))
        .await;
    let (_, out) = s.collect("f1").await;
    let m = &out["messages"];
    // The kernel stops the file at the room the session had left (the quota less what its
    // directories take).
    let size: u64 = answer(m, "c0")["stdout"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("{}", answer(m, "c0")));
    assert!(
        ((8 << 20) - (64 << 10)..=8 << 20).contains(&size),
        "{size}: {}",
        answer(m, "c0")
    );
    assert_eq!(answer(m, "c1")["stdout"], json!("deleted\n"));
    let stopped = answer(m, "c2");
    let stderr = stopped["stderr"].as_str().unwrap().to_owned();
    assert_eq!(stopped["exitCode"], json!(137), "{stopped}");
    assert!(
        stderr.starts_with("The command was stopped: the session's files use ")
            && stderr.ends_with(" MiB, over its disk quota of 8.0 MiB. Delete files to go on."),
        "{stderr}"
    );
    assert_eq!(
        answer(m, "c3"),
        json!({"kind": "failed", "code": "sandbox.quota_exceeded", "message": answer(m, "c3")["message"]})
    );
    assert!(
        answer(m, "c3")["message"].as_str().unwrap().ends_with(
            " MiB, over its disk quota of 8.0 MiB. Delete files (with bash) before writing more."
        ),
        "{}",
        answer(m, "c3")
    );
    assert_eq!(answer(m, "c4")["stdout"], json!("freed\n"));
    // `write` answers a completed object (not a failure) once the session is back under.
    assert_eq!(answer(m, "c5").get("kind"), None, "{}", answer(m, "c5"));
    let (code, _) = s.call("GET", "/healthz", None).await;
    assert_eq!(code, reqwest::StatusCode::OK);
}

/// The measured quota's wall between two measurements: a command started while its session is
/// past the quota may write no byte to any file (it may still delete, and the next command has
/// room again), so three quick commands in a row — each done before podhost could measure —
/// grow the session by nothing.
#[tokio::test]
async fn a_session_past_a_measured_quota_can_grow_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_disk) = SmallDisk::new(dir.path(), 64) else {
        eprintln!("cannot mount a size-limited tmpfs here (not root): the attack is not run");
        return;
    };
    let model = FakeModel::start("fake-model", None).await;
    let quick = "head -c 20M /dev/zero > q$RANDOM 2>/dev/null; echo done";
    script(
        &model,
        vec![
            // Past the quota in one go: two files, each within the room left at the start.
            (
                "bash",
                json!({"command": "head -c 6M /dev/zero > a; head -c 6M /dev/zero > b; echo over"}),
            ),
            ("bash", json!({"command": quick})),
            ("bash", json!({"command": quick})),
            ("bash", json!({"command": quick})),
            (
                "bash",
                json!({"command": "find . -name 'q*' -size +0 | wc -l; rm a b q*"}),
            ),
            ("bash", json!({"command": "echo room again > c; cat c"})),
        ],
    );
    let s = Serve::start_with(
        dir.path(),
        Options::default()
            .env("PODHOST_SESSION_DISK_MB", "8")
            .env("PODHOST_SESSION_DISK_FS", "off")
            .env("PODHOST_MIN_FREE_MB", "1"),
    );
    s.submit(start("over", "v1", "x", &model.base_url(), None))
        .await;
    s.wait_status("v1", "completed", std::time::Duration::from_secs(60))
        .await;
    let (_, out) = s.collect("v1").await;
    let m = &out["messages"];
    for call in ["c1", "c2", "c3"] {
        assert_eq!(
            answer(m, call)["stdout"],
            json!("done\n"),
            "{}",
            answer(m, call)
        );
    }
    assert_eq!(
        answer(m, "c4")["stdout"],
        json!("0\n"),
        "{}",
        answer(m, "c4")
    );
    assert_eq!(
        answer(m, "c5")["stdout"],
        json!("room again\n"),
        "{}",
        answer(m, "c5")
    );
}

#[tokio::test]
async fn sessions_run_as_their_own_uids_and_cannot_reach_each_other() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("podhost is not root here: sessions share its uid (no uid pool to check)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let first = FakeModel::start("fake-model", None).await;
    script(
        &first,
        vec![(
            "bash",
            json!({"command": "id -u; touch mine && stat -c %u mine"}),
        )],
    );
    s.submit(start("one", "i1", "x", &first.base_url(), None))
        .await;
    s.wait_status("i1", "completed", T).await;
    let ws1 = s.workspace("one");
    let uid1 = std::fs::metadata(&ws1).unwrap().uid();
    let (_, out) = s.collect("i1").await;
    assert_eq!(
        answer(&out["messages"], "c0")["stdout"],
        json!(format!("{uid1}\n{uid1}\n"))
    );
    let second = FakeModel::start("fake-model", None).await;
    script(
        &second,
        vec![(
            "bash",
            json!({"command": format!(
                "id -u; chmod 777 {0} 2>&1 | sed 's/^.*: //'; ls {0} 2>&1 | sed 's/^.*: //'; \
                 echo alive",
                ws1.display()
            )}),
        )],
    );
    s.submit(start("two", "i2", "x", &second.base_url(), None))
        .await;
    s.wait_status("i2", "completed", T).await;
    let uid2 = std::fs::metadata(s.workspace("two")).unwrap().uid();
    assert_ne!(uid1, uid2);
    assert_ne!(uid1, 0);
    let (_, out) = s.collect("i2").await;
    // The other session's workspace is not in this session's view at all.
    assert_eq!(
        answer(&out["messages"], "c0"),
        json!({
            "exitCode": 0,
            "stdout": format!("{uid2}\nNo such file or directory\nNo such file or directory\nalive\n"),
            "stderr": ""
        })
    );
    assert_eq!(std::fs::metadata(&ws1).unwrap().mode() & 0o777, 0o700);
}

#[tokio::test]
async fn the_level_in_force_is_logged_at_start_and_reported_by_healthz() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let (_, health) = s.call("GET", "/healthz", None).await;
    let level = &health["confinement"];
    let line = s
        .logs()
        .lines()
        .find(|l| l.contains("commands and file tools are confined"))
        .unwrap_or_else(|| panic!("no level logged: {}", s.logs()))
        .to_owned();
    for (key, words) in [
        (
            "namespaces",
            format!("namespaces {}", level["namespaces"].as_str().unwrap()),
        ),
        (
            "cgroups",
            format!("cgroups {}", level["cgroups"].as_str().unwrap()),
        ),
        (
            "devices",
            format!("devices {}", level["devices"].as_str().unwrap()),
        ),
        (
            "network",
            format!("network {}", level["network"].as_str().unwrap()),
        ),
    ] {
        assert!(line.contains(&words), "{key}: {line}");
    }
    assert_eq!(level["command_capabilities"], json!("none"));
    let probe = podhost::exec::probe::probe_host(crate::support::supervisor_bin());
    assert_eq!(
        level["network"],
        json!(if probe.network { "namespace" } else { "host" })
    );
    assert_eq!(level["state_modes_checked"], json!(true));
    assert_eq!(
        level["disk_quota"],
        json!(if probe.disk.is_ok() {
            "filesystem"
        } else {
            "measured"
        })
    );
    if nix::unistd::geteuid().is_root() {
        assert_eq!(level["uid_pool"], json!("400000-465535"));
        assert!(
            line.contains("command user one uid per session from 400000-465535"),
            "{line}"
        );
    }
}

/// A session's commands cannot reach `podhost serve` itself (its API on loopback: another
/// session's transcript, its cancel) — not directly, not through the session's proxy, not even
/// with the credential — while serve goes on serving both sessions.
#[tokio::test]
async fn a_sessions_commands_cannot_reach_serve_itself() {
    let probe = podhost::exec::probe::probe_host(crate::support::supervisor_bin());
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let port = s.url.rsplit(':').next().unwrap().to_owned();
    // The other session: asked a question, so its turn waits (input_required) with a transcript.
    let other = FakeModel::start("fake-model", None).await;
    script(
        &other,
        vec![(
            "ask_user",
            json!({"question": "the other session's secret question?"}),
        )],
    );
    s.submit(start("other", "o1", "x", &other.base_url(), None))
        .await;
    s.wait_status("o1", "input_required", T).await;
    let attacker = FakeModel::start("fake-model", None).await;
    let auth = format!("Authorization: Bearer {}", crate::harness::TOKEN);
    script(
        &attacker,
        vec![(
            "bash",
            json!({"command": format!(
                "ask() {{ curl -sS -m 5 \"$@\" -H '{auth}' \
                   'http://127.0.0.1:{port}/get_status?session_id=other&invocation_id=o1' 2>&1 \
                   | sed 's/ after .*//'; \
                   curl -sS -m 5 \"$@\" -H '{auth}' -H 'Content-Type: application/json' \
                   -d '{{\"session_id\":\"other\",\"invocation_id\":\"o1\"}}' \
                   http://127.0.0.1:{port}/cancel 2>&1 | sed 's/ after .*//'; }}; \
                 ask --noproxy '*'; ask --noproxy '' -x http://127.0.0.1:3128"
            )}),
        )],
    );
    s.submit(start("attacker", "a1", "x", &attacker.base_url(), None))
        .await;
    s.wait_status("a1", "completed", T).await;
    let (_, out) = s.collect("a1").await;
    let stdout = answer(&out["messages"], "c0")["stdout"]
        .as_str()
        .unwrap()
        .to_owned();
    if probe.network {
        let refused = format!("curl: (7) Failed to connect to 127.0.0.1 port {port}\n");
        let proxied = "podhost: 127.0.0.1 is the host's loopback: a session's commands cannot \
                       reach the host's own services\n";
        assert_eq!(
            stdout,
            format!("{refused}{refused}{proxied}{proxied}"),
            "{out}"
        );
    } else {
        eprintln!("no network namespace for sessions here: serve's port is reachable from them");
    }
    // The other session is untouched: still waiting, its question intact.
    let (_, st) = s.status("o1").await;
    assert_eq!(st["status"], json!("input_required"), "{st}");
    let (code, _) = s.call("GET", "/healthz", None).await;
    assert_eq!(code, reqwest::StatusCode::OK);
}

/// A session's quota held by the kernel: its workspace and temporary directory are on a file
/// system of their own, sized to the quota. A writer past it gets ENOSPC at once — one large
/// file, and several quick commands that each finish between two of the measured level's
/// looks — and `write` is refused the same way; once files are deleted both work again, and
/// the file tools and `bash` see the same tree. Nothing of it shows on the host's directories.
#[tokio::test]
async fn a_session_past_its_quota_gets_enospc_from_a_file_system_of_its_own() {
    let probe = podhost::exec::probe::probe_host(crate::support::supervisor_bin());
    if let Err(why) = &probe.disk {
        eprintln!(
            "no file system per session here ({why}): the measured quota is checked by \
             a_session_filling_the_disk_is_stopped_at_its_quota_while_another_completes"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = FakeModel::start("fake-model", None).await;
    script(
        &model,
        vec![
            (
                "bash",
                json!({"command": "dd if=/dev/zero of=big bs=1M count=200 2>&1 | grep -o 'No space left on device' | head -1; \
                                   for i in 1 2 3; do head -c 100M /dev/zero > f$i 2>/dev/null || echo \"f$i: full\"; done; \
                                   [ \"$(du -sm . | cut -f1)\" -le 50 ] && echo 'at most the quota'"}),
            ),
            (
                "write",
                json!({"path": "note.txt", "content": "x".repeat(4096)}),
            ),
            (
                "bash",
                json!({"command": "rm -f big f1 f2 f3; echo from bash > hello.txt; head -c 1M /dev/zero > \"$TMPDIR/t\" && echo tmp ok"}),
            ),
            (
                "write",
                json!({"path": "from-write.txt", "content": "from write\n"}),
            ),
            ("bash", json!({"command": "cat from-write.txt"})),
            ("read", json!({"path": "hello.txt"})),
        ],
    );
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_SESSION_DISK_MB", "50"),
    );
    let (_, health) = s.call("GET", "/healthz", None).await;
    assert_eq!(health["confinement"]["disk_quota"], json!("filesystem"));
    s.submit(start("full", "q1", "fill it", &model.base_url(), None))
        .await;
    s.wait_status("q1", "completed", std::time::Duration::from_secs(60))
        .await;
    let (_, out) = s.collect("q1").await;
    let m = &out["messages"];
    assert_eq!(
        answer(m, "c0"),
        json!({
            "exitCode": 0,
            "stdout": "No space left on device\nf1: full\nf2: full\nf3: full\nat most the quota\n",
            "stderr": ""
        })
    );
    let refused = answer(m, "c1");
    assert_eq!(
        refused["code"],
        json!("sandbox.quota_exceeded"),
        "{refused}"
    );
    assert!(
        refused["message"].as_str().unwrap().ends_with(
            "note.txt: the session's disk is full (its quota). Delete files (with bash) before \
             writing more."
        ),
        "{refused}"
    );
    assert_eq!(
        answer(m, "c2")["stdout"],
        json!("tmp ok\n"),
        "{}",
        answer(m, "c2")
    );
    assert_eq!(answer(m, "c3").get("kind"), None, "{}", answer(m, "c3"));
    assert_eq!(answer(m, "c4")["stdout"], json!("from write\n"));
    let read = answer(m, "c5");
    assert!(
        read.to_string().contains("from bash"),
        "read sees what bash wrote: {read}"
    );
    // The files live on the session's disk, not in the host's directories.
    let ws = s.workspace("full");
    assert_eq!(
        std::fs::read_dir(&ws).unwrap().count(),
        0,
        "{}",
        ws.display()
    );
    // The session's image, beside the empty one it was copied from.
    let disks: Vec<_> = std::fs::read_dir(s.data.join("disks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !n.starts_with(".empty-"))
        .collect();
    assert_eq!(disks.len(), 1, "{disks:?}");
    assert!(disks[0].ends_with(".img"), "{disks:?}");
    let (code, _) = s.call("GET", "/healthz", None).await;
    assert_eq!(code, reqwest::StatusCode::OK);
}
