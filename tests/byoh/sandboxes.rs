//! A host that cannot make sandboxes: its fault is never shown to the model as a tool result;
//! the turn fails with a message that says why, new work is refused with 503 (which Oumi
//! retries) until a probe makes a sandbox again, and known work is still answered. And the uid
//! pool at evaluation scale: once every uid is taken, the idle session that used its uid least
//! recently lends it, its workspace out of reach until it is resumed under a new uid.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, T, resume, start, status_obj};
use crate::openai_fake::{FakeModel, Reply};

/// `/healthz`'s `sandboxes`.
async fn sandboxes(s: &Serve) -> Value {
    let (code, body) = s.call("GET", "/healthz", None).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    body["sandboxes"].clone()
}

/// Waits until `/healthz` says the host can make sandboxes (`ok`) or cannot.
async fn until_sandboxes(s: &Serve, ok: bool) -> Value {
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let now = sandboxes(s).await;
        if now["ok"] == ok {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "sandboxes never became ok={ok}: {now}\n{}",
            s.log_tail()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The messages the model was sent by its last request, as roles.
fn roles(fake: &FakeModel) -> Vec<Vec<String>> {
    fake.requests()
        .iter()
        .map(|r| {
            r.body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["role"].as_str().unwrap().to_owned())
                .collect()
        })
        .collect()
}

/// A model that runs `command` once, then answers.
fn runs(fake: &FakeModel, command: &'static str) {
    fake.respond_with(move |body| {
        let ran = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if ran {
            Reply::text("done")
        } else {
            Reply::call("c1", "bash", json!({"command": command}))
        }
    });
}

#[tokio::test]
async fn a_host_that_cannot_make_sandboxes_fails_the_turn_and_refuses_new_work_until_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let refuse = dir.path().join("refuse");
    std::fs::write(&refuse, "").unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    runs(&fake, "echo ran > ran.txt");
    let s = Serve::start_with(
        dir.path(),
        Options::default().env(
            "PODHOST_FAILPOINTS",
            &format!("sandbox.refused=fail-while({})", refuse.display()),
        ),
    );
    assert_eq!(sandboxes(&s).await, json!({"ok": true}));
    let (code, _) = s
        .submit(start("s1", "i1", "go", &fake.base_url(), None))
        .await;
    assert_eq!(code, StatusCode::ACCEPTED);
    let failed = s.wait_status("i1", "failed", T).await;
    let message = "podhost could not make the session's sandbox: could not make the session's \
                   cgroup: refused (the failpoint sandbox.refused)";
    assert_eq!(
        failed,
        json!({"protocol_version": "1", "session_id": "s1", "invocation_id": "i1",
               "status": "failed", "error": {"message": message}})
    );
    // The model was never asked: no tool result stands for the host's fault.
    assert_eq!(fake.count(), 0);
    assert_eq!(
        sandboxes(&s).await,
        json!({"ok": false, "error": "could not make the session's cgroup: refused (the \
                                      failpoint sandbox.refused)"})
    );
    // New work is refused with 503; the failed invocation still answers its status.
    let (code, body) = s
        .submit(start("s2", "i2", "go", &fake.base_url(), None))
        .await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        body,
        json!({"error": {"message": "this host cannot make sandboxes for sessions right now \
               (could not make the session's cgroup: refused (the failpoint sandbox.refused)); \
               retry later"}})
    );
    let (code, body) = s
        .submit(start("s1", "i1", "go", &fake.base_url(), None))
        .await;
    assert_eq!((code, &body["status"]), (StatusCode::OK, &json!("failed")));
    let (code, _) = s.status("i2").await;
    assert_eq!(
        code,
        StatusCode::NOT_FOUND,
        "a refused submission starts nothing"
    );
    // The host heals: a probe makes a sandbox, and new work runs.
    std::fs::remove_file(&refuse).unwrap();
    until_sandboxes(&s, true).await;
    let (code, _) = s
        .submit(start("s2", "i2", "go", &fake.base_url(), None))
        .await;
    assert_eq!(code, StatusCode::ACCEPTED);
    s.wait_status("i2", "completed", T).await;
    assert_eq!(s.read_file("s2", "ran.txt").as_deref(), Some("ran\n"));
    // The probe left nothing behind but the two sessions' directories.
    let mut sessions: Vec<String> = std::fs::read_dir(s.data.join("sessions"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    sessions.sort();
    let mut want = vec![
        s.workspace("s1")
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned(),
        s.workspace("s2")
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned(),
    ];
    want.sort();
    assert_eq!(sessions, want);
}

#[tokio::test]
async fn a_command_whose_session_cannot_start_ends_the_turn_not_the_models_call() {
    let dir = tempfile::tempdir().unwrap();
    let refuse = dir.path().join("refuse");
    std::fs::write(&refuse, "").unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    runs(&fake, "true");
    let s = Serve::start_with(
        dir.path(),
        Options::default().env(
            "PODHOST_FAILPOINTS",
            &format!("sandbox.session_refused=fail-while({})", refuse.display()),
        ),
    );
    let (_, health) = s.call("GET", "/healthz", None).await;
    if health["confinement"]["namespaces"] == "none" {
        println!(
            "no namespaces on this host: commands run without a session holder, so a holder \
             that cannot start is not exercised (checked: the turn completes)"
        );
        s.submit(start("s1", "i1", "go", &fake.base_url(), None))
            .await;
        s.wait_status("i1", "completed", T).await;
        return;
    }
    s.submit(start("s1", "i1", "go", &fake.base_url(), None))
        .await;
    let failed = s.wait_status("i1", "failed", T).await;
    assert_eq!(
        failed["error"]["message"],
        "podhost could not run bash: could not start the command session: refused (the \
         failpoint sandbox.session_refused)"
    );
    // One model call made the tool call; no tool result ever reached the model.
    assert_eq!(
        roles(&fake),
        vec![vec!["system".to_owned(), "user".to_owned()]]
    );
    // The call was tried three times (a holder that cannot start ran nothing).
    let tries = s
        .logs()
        .matches("a tool call could not start; trying again")
        .count();
    assert_eq!(tries, 2, "{}", s.log_tail());
    until_sandboxes(&s, false).await;
    let (code, _) = s
        .submit(start("s2", "i2", "go", &fake.base_url(), None))
        .await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    std::fs::remove_file(&refuse).unwrap();
    until_sandboxes(&s, true).await;
    let (code, body) = s
        .submit(start("s2", "i2", "go", &fake.base_url(), None))
        .await;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    s.wait_status("i2", "completed", T).await;
}

/// The uid a session's commands last ran as, and what they read of their own file, from its
/// workspace's file `who`.
fn who(s: &Serve, session: &str) -> String {
    s.read_file(session, "who").unwrap()
}

fn owner(p: &Path) -> (u32, u32) {
    let m = std::fs::symlink_metadata(p).unwrap();
    (m.uid(), m.mode() & 0o777)
}

/// A model that, in each session, records who it runs as and leaves a file, asks the user a
/// question, and once answered records who it runs as again with what it reads of its file.
fn asks_between_two_commands(fake: &FakeModel) {
    fake.respond_with(|body| {
        let answered = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .count();
        match answered {
            0 => Reply::call(
                "c1",
                "bash",
                json!({"command": "id -u > who; echo mine > mine.txt"}),
            ),
            1 => Reply::call("q1", "ask_user", json!({"question": "Go on?"})),
            2 => Reply::call(
                "c2",
                "bash",
                json!({"command": "id -u > who; cat mine.txt >> who"}),
            ),
            _ => Reply::text("done"),
        }
    });
}

#[tokio::test]
async fn with_every_uid_taken_the_least_recently_used_idle_session_lends_its_own() {
    if !nix::unistd::geteuid().is_root() {
        println!("not root: sessions run as podhost's own user, with no uid pool to exercise");
        return;
    }
    // On the host's directories (the files' owners can be read there), then on disks of the
    // sessions' own where the host makes them.
    lending(false).await;
    lending(true).await;
}

async fn lending(disks: bool) {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    asks_between_two_commands(&fake);
    let s = Serve::start_with(
        dir.path(),
        Options::default()
            .env("PODHOST_UID_POOL", "431000-431001")
            .env("PODHOST_SESSION_DISK_FS", if disks { "on" } else { "off" }),
    );
    // Three sessions, each waiting for its user's answer: idle.
    for n in 1..=3 {
        let (code, body) = s
            .submit(start(
                &format!("s{n}"),
                &format!("i{n}"),
                "go",
                &fake.base_url(),
                None,
            ))
            .await;
        assert_eq!(code, StatusCode::ACCEPTED, "{body}");
        s.wait_status(&format!("i{n}"), "input_required", T).await;
    }
    assert_eq!(
        [who(&s, "s1"), who(&s, "s2"), who(&s, "s3")],
        ["431000\n", "431001\n", "431000\n"],
        "s3 runs as the uid s1 (idle, used least recently) lent"
    );
    assert!(
        s.logs()
            .contains("lent the uid of the idle session used least recently"),
        "{}",
        s.log_tail()
    );
    // s1's workspace is out of every pool uid's reach: podhost's own, 0700.
    assert_eq!(owner(&s.workspace("s1")), (0, 0o700));
    if !disks {
        assert_eq!(owner(&s.workspace("s1").join("mine.txt")).0, 431_000);
    }
    // Answered, s1 takes s2's uid (now the idle session used least recently), and its own
    // files are given to it.
    let (code, body) = s
        .submit(resume("s1", "i1", &[("q1", "yes")], &fake.base_url(), "k"))
        .await;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    assert_eq!(
        s.wait_status("i1", "completed", T).await,
        status_obj("s1", "i1", "completed")
    );
    assert_eq!(
        who(&s, "s1"),
        "431001\nmine\n",
        "s1 runs as s2's old uid and reads its own file"
    );
    assert_eq!(owner(&s.workspace("s1")), (431_001, 0o700));
    if !disks {
        assert_eq!(owner(&s.workspace("s1").join("mine.txt")).0, 431_001);
    }
    assert_eq!(owner(&s.workspace("s2")), (0, 0o700));
}

/// Fills the session's memory cgroup with System V shared memory (charged to the group, to no
/// process's size) up to `leave` MiB short of its limit, then writes into its `/dev/shm` until
/// the kernel's OOM killer takes a process of the session.
const OOM_ATTACK: &str = r#"python3 - <<'PY'
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmget.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
line = [l for l in open('/proc/self/cgroup') if ':memory:' in l or l.startswith('0::')][0]
path = line.split(':', 2)[2].strip()
v1 = '/sys/fs/cgroup/memory' + path
if __import__('os').path.exists(v1 + '/memory.limit_in_bytes'):
    limit, usage = v1 + '/memory.limit_in_bytes', v1 + '/memory.usage_in_bytes'
else:
    limit, usage = '/sys/fs/cgroup' + path + '/memory.max', '/sys/fs/cgroup' + path + '/memory.current'
lim = int(open(limit).read())
while int(open(usage).read()) < lim - (8 << 20):
    i = libc.shmget(0, 1 << 20, 0o1000 | 0o600)
    if i < 0:
        break
    p = libc.shmat(i, None, 0)
    ctypes.memset(p, 1, 1 << 20)
    libc.shmdt(ctypes.c_void_p(p))
PY
exec dd if=/dev/zero of=/dev/shm/f bs=64k"#;

/// A session that drives its own memory cgroup into the OOM killer (System V shared memory is
/// charged where no process's size shows it, so the killer may take the command's supervisor):
/// that is the command's end — a tool result the model reads, exit 137 with the memory limit
/// named — never a fault of the host, which keeps taking work.
#[tokio::test]
async fn a_session_that_exhausts_its_own_memory_gets_a_tool_result_and_the_host_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeModel::start("fake-model", None).await;
    runs(&fake, OOM_ATTACK);
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_LIMIT_MEMORY_MB", "96"),
    );
    let (_, health) = s.call("GET", "/healthz", None).await;
    if health["confinement"]["cgroups"] == "none" || health["confinement"]["cgroups"] == "off" {
        println!("no cgroups here: no session memory limit to exhaust (not exercised)");
        return;
    }
    s.submit(start("s1", "i1", "go", &fake.base_url(), None))
        .await;
    s.wait_status("i1", "completed", T * 3).await;
    let (_, out) = s.collect("i1").await;
    let result: Value =
        serde_json::from_str(out["messages"][1]["content"].as_str().unwrap_or_default())
            .unwrap_or_default();
    assert_eq!(result["exitCode"], 137, "{out}");
    assert!(
        result["stderr"]
            .as_str()
            .unwrap_or_default()
            .ends_with("A process was killed: the session reached its memory limit (96 MiB)."),
        "{result}"
    );
    assert_eq!(sandboxes(&s).await, json!({"ok": true}));
    let (code, body) = s
        .submit(start("s2", "i2", "go", &fake.base_url(), None))
        .await;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
}

/// Unmounts a test's file system when dropped, also when the test fails first.
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The sessions' disks are sparse, so their quotas together may exceed the host's disk: a session
/// within its quota whose write fails because the host's disk is full gets no tool result for
/// it — the turn fails with what podhost could not do, and new work is refused until there is
/// room — never `quota_exceeded` for a quota the session did not use.
#[tokio::test]
async fn a_write_the_hosts_full_disk_refuses_is_the_hosts_fault_not_the_sessions_quota() {
    if !nix::unistd::geteuid().is_root() {
        println!("not root: no session disks, no small file system to fill (not exercised)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let disks = dir.path().join("data/disks");
    std::fs::create_dir_all(&disks).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=96m", "tmpfs"])
        .arg(&disks)
        .status()
        .unwrap();
    assert!(mounted.success());
    let _unmount = Unmount(disks.clone());
    let fake = FakeModel::start("fake-model", None).await;
    fake.respond_with(|body| {
        let tools = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .count();
        match tools {
            0 => Reply::call(
                "fill",
                "bash",
                json!({"command": "head -c 150M /dev/urandom > big; sync; du -sm . | cut -f1"}),
            ),
            1 => Reply::call(
                "w",
                "write",
                json!({"path": "note.txt", "content": "x".repeat(4 << 20)}),
            ),
            _ => Reply::text("done"),
        }
    });
    let s = Serve::start_with(
        dir.path(),
        Options::default().env("PODHOST_SESSION_DISK_MB", "200"),
    );
    let (_, health) = s.call("GET", "/healthz", None).await;
    if health["confinement"]["disk_quota"] != "filesystem" {
        println!("no session disks here (e2fsprogs missing?): not exercised");
        return;
    }
    s.submit(start("s1", "i1", "go", &fake.base_url(), None))
        .await;
    let failed = s.wait_status("i1", "failed", T * 6).await;
    let message = failed["error"]["message"].as_str().unwrap();
    let tail = format!(
        " MiB left in {}), where the sessions' disks live",
        disks.display()
    );
    assert!(
        message.starts_with("the host's disk is full (") && message.ends_with(&tail),
        "{message}"
    );
    // The model saw the command's result, never a result for the write.
    let answered: Vec<Vec<String>> = fake
        .requests()
        .iter()
        .map(|r| {
            r.body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["tool_call_id"].as_str().map(str::to_owned))
                .collect()
        })
        .collect();
    assert_eq!(answered, [vec![], vec!["fill".to_owned()]]);
    until_sandboxes(&s, false).await;
    let (code, _) = s
        .submit(start("s2", "i2", "go", &fake.base_url(), None))
        .await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
}
