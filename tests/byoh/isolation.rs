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
            // Many files, slowly: podhost measures the session and stops the command.
            (
                "bash",
                json!({"command": "rm one; for i in $(seq 1 200); do head -c 1048576 /dev/zero > f$i; sleep 0.05; done; echo never"}),
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
    assert_eq!(
        answer(m, "c0")["stdout"],
        json!(format!("{}\n", 8 << 20)),
        "{}",
        answer(m, "c0")
    );
    let stopped = answer(m, "c1");
    let stderr = stopped["stderr"].as_str().unwrap().to_owned();
    assert_eq!(stopped["exitCode"], json!(137), "{stopped}");
    assert!(
        stderr.starts_with("The command was stopped: the session's files use ")
            && stderr.ends_with(" MiB, over its disk quota of 8.0 MiB. Delete files to go on."),
        "{stderr}"
    );
    assert_eq!(
        answer(m, "c2"),
        json!({"kind": "failed", "code": "sandbox.quota_exceeded", "message": answer(m, "c2")["message"]})
    );
    assert!(
        answer(m, "c2")["message"].as_str().unwrap().ends_with(
            " MiB, over its disk quota of 8.0 MiB. Delete files (with bash) before writing more."
        ),
        "{}",
        answer(m, "c2")
    );
    assert_eq!(answer(m, "c3")["stdout"], json!("freed\n"));
    // `write` answers a completed object (not a failure) once the session is back under.
    assert_eq!(answer(m, "c4").get("kind"), None, "{}", answer(m, "c4"));
    let (code, _) = s.call("GET", "/healthz", None).await;
    assert_eq!(code, reqwest::StatusCode::OK);
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
    ] {
        assert!(line.contains(&words), "{key}: {line}");
    }
    assert_eq!(level["command_capabilities"], json!("none"));
    assert_eq!(level["state_modes_checked"], json!(true));
    assert_eq!(level["disk_quota"], json!("measured"));
    if nix::unistd::geteuid().is_root() {
        assert_eq!(level["uid_pool"], json!("400000-400999"));
        assert!(
            line.contains("command user one uid per session from 400000-400999"),
            "{line}"
        );
    }
}
