//! A workspace template (`PODHOST_WORKSPACE_TEMPLATE`): every new session's workspace starts
//! with its files, each session changes only its own copy, the template is never changed, and a
//! link in it that leads outside reads nothing there. Each level this host gives (overlay,
//! reflink, copy) runs the same checks, seen through the session's own tools.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::harness::{Options, Serve, T, resume, spawn, start};
use crate::openai_fake::{FakeModel, Reply};

const SESSIONS: usize = 20;
const SECRET: &str = "outside the workspace";

/// Every entry under `dir`: kind, mode, mtime (ns) and contents (a link's target).
fn tree(dir: &Path) -> BTreeMap<PathBuf, (String, u32, i128, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let (kind, body) = if m.is_symlink() {
                let to = std::fs::read_link(&p).unwrap();
                ("link", to.into_os_string().into_encoded_bytes())
            } else if m.is_dir() {
                stack.push(p.clone());
                ("dir", Vec::new())
            } else {
                ("file", std::fs::read(&p).unwrap())
            };
            let mtime = i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec());
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            out.insert(rel, (kind.to_owned(), m.mode(), mtime, body));
        }
    }
    out
}

/// The owners of everything under `dir` (links themselves).
fn owners(dir: &Path) -> std::collections::BTreeSet<u32> {
    let mut out = std::collections::BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            out.insert(m.uid());
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

/// A template: two files, a directory with an executable, and a link to a file outside it.
fn template(dir: &Path) -> PathBuf {
    let t = dir.join("template");
    std::fs::create_dir_all(t.join("src")).unwrap();
    std::fs::write(t.join("README"), "from the template\n").unwrap();
    std::fs::write(t.join("shared.txt"), "shared\n").unwrap();
    std::fs::write(t.join("src/run.sh"), "#!/bin/sh\necho run\n").unwrap();
    std::fs::set_permissions(
        t.join("src/run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(dir.join("secret.txt"), SECRET).unwrap();
    std::os::unix::fs::symlink(dir.join("secret.txt"), t.join("out")).unwrap();
    t
}

/// Session `n` (its task is its number): writes `bash-n` with bash and `write-n` with the write
/// tool, reads the link with bash and with the read tool; session 0 also deletes `shared.txt`.
/// Then it changes a template file (`src/run.sh`), lists its workspace and says whether it owns
/// the template's files (bash), finds every file (glob) and reads the changed file back.
fn model(fake: &FakeModel) {
    fake.respond_with(|body| {
        let messages = body["messages"].as_array().unwrap();
        let answered = messages.iter().filter(|m| m["role"] == "tool").count();
        let n: usize = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .and_then(|t| t.trim().parse().ok())
            .unwrap();
        let delete = if n == 0 { "rm shared.txt; " } else { "" };
        match answered {
            0 => Reply::calls(&[
                (
                    "c1",
                    "bash",
                    json!({"command": format!("{delete}echo {n} > bash-{n}; cat out > seen 2>&1; true")}),
                ),
                ("c2", "write", json!({"path": format!("write-{n}"), "content": format!("{n}\n")})),
                ("c3", "read", json!({"path": "out"})),
            ]),
            3 => Reply::calls(&[
                (
                    "c4",
                    "bash",
                    json!({"command": format!(
                        "echo changed-{n} >> src/run.sh; LC_ALL=C ls -A | tr '\\n' ' '; echo; \
                         test -O README && test -O src && echo mine"
                    )}),
                ),
                ("c5", "glob", json!({"pattern": "**/*"})),
                ("c6", "read", json!({"path": "src/run.sh"})),
            ]),
            _ => Reply::text("done"),
        }
    });
}

/// The answer to `call` in `messages` (a collected output), parsed when it is JSON.
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

/// Runs the sessions on a server with `env`; answers the level `/healthz` reports, and how the
/// disk quota is held.
async fn twenty_sessions(env: &[(&str, &str)]) -> (String, Value) {
    twenty_sessions_as(env, None).await
}

/// [`twenty_sessions`] on a server that runs as `user` (its directory made that user's).
async fn twenty_sessions_as(env: &[(&str, &str)], user: Option<u32>) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let t = template(dir.path());
    if let Some(id) = user {
        // The template is the server's user's, as an operator of an unprivileged podhost
        // leaves it: its sessions run as that user (files of others are read-only to them).
        let chown = std::process::Command::new("chown")
            .args(["-hR", &format!("{id}:{id}")])
            .arg(&t)
            .status()
            .unwrap();
        assert!(chown.success());
        std::os::unix::fs::chown(dir.path(), Some(id), Some(id)).unwrap();
        let open = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(dir.path(), open).unwrap();
    }
    let before = tree(&t);
    let fake = FakeModel::start("fake-model", None).await;
    model(&fake);
    let mut opts = Options {
        user,
        ..Options::default()
    }
    .env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap());
    for (k, v) in env {
        opts = opts.env(k, v);
    }
    let s = Serve::start_with(dir.path(), opts);
    let (code, health) = s.call("GET", "/healthz", None).await;
    assert_eq!(code, StatusCode::OK);
    let reported = &health["workspace_template"];
    assert_eq!(reported["path"], json!(std::fs::canonicalize(&t).unwrap()));
    let level = reported["level"].as_str().unwrap().to_owned();
    for n in 0..SESSIONS {
        let body = start(
            &format!("s{n}"),
            &format!("i{n}"),
            &n.to_string(),
            &fake.base_url(),
            None,
        );
        assert_eq!(s.submit(body).await.0, StatusCode::ACCEPTED);
    }
    for n in 0..SESSIONS {
        s.wait_status(&format!("i{n}"), "completed", T * 4).await;
    }
    for n in 0..SESSIONS {
        let (_, out) = s.collect(&format!("i{n}")).await;
        seen_by_the_session(&out["messages"], n, &level);
        if level != "overlay" {
            copied_on_the_host(&s, n);
        } else {
            // Nothing was copied: the host's directory holds what the session wrote alone.
            assert!(!s.workspace(&format!("s{n}")).join("README").exists());
        }
    }
    assert_eq!(tree(&t), before, "the template changed");
    (level, health["confinement"]["disk_quota"].clone())
}

/// What session `n`'s tools saw: its own files and changes, the template's files as its own,
/// nothing of another session's, nothing through the link.
fn seen_by_the_session(m: &Value, n: usize, level: &str) {
    let mut names = vec!["README", "out", "seen", "src"]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("bash-{n}"), format!("write-{n}")])
        .collect::<Vec<_>>();
    if n != 0 {
        names.push("shared.txt".to_owned());
    }
    names.sort();
    assert_eq!(
        answer(m, "c4"),
        json!({"exitCode": 0, "stdout": format!("{} \nmine\n", names.join(" ")), "stderr": ""}),
        "session {n} at {level}"
    );
    let mut files: Vec<String> = names
        .iter()
        .filter(|f| *f != "out" && *f != "src")
        .cloned()
        .chain(["src/run.sh".to_owned()])
        .collect();
    files.sort();
    let globbed = answer(m, "c5");
    let mut found: Vec<String> = globbed
        .as_str()
        .unwrap_or_else(|| panic!("{globbed}"))
        .lines()
        .map(str::to_owned)
        .collect();
    found.sort();
    assert_eq!(found, files, "session {n} at {level}");
    let changed = answer(m, "c6").to_string();
    assert!(
        changed.contains(&format!("changed-{n}")) && changed.contains("echo run"),
        "session {n} at {level}: {changed}"
    );
    let link = answer(m, "c3").to_string();
    assert!(!link.contains(SECRET), "{link}");
}

/// Session `n`'s copy on the host (copy and reflink levels): its files, owned by the session.
fn copied_on_the_host(s: &Serve, n: usize) {
    let ws = s.workspace(&format!("s{n}"));
    assert_eq!(
        s.read_file(&format!("s{n}"), &format!("bash-{n}")),
        Some(format!("{n}\n"))
    );
    assert_eq!(
        s.read_file(&format!("s{n}"), "README").as_deref(),
        Some("from the template\n")
    );
    // The copy is the session's, like its workspace: a uid of the pool on a root host.
    let owner = std::fs::metadata(&ws).unwrap().uid();
    assert_eq!(owners(&ws), [owner].into(), "session {n}");
    if nix::unistd::geteuid().is_root() {
        assert_ne!(owner, 0, "session {n}");
    }
    // The link stayed a link, and bash did not get through it.
    assert!(
        std::fs::symlink_metadata(ws.join("out"))
            .unwrap()
            .is_symlink()
    );
    let seen = s.read_file(&format!("s{n}"), "seen").unwrap();
    assert!(!seen.contains(SECRET), "bash read through the link: {seen}");
}

/// The levels to run: the one start-up finds with the host's defaults (a file system per
/// session on a root host), then each forced, without a file system per session (copy and
/// reflink cannot go into one). A level this host lacks is said, and its refusal checked.
#[tokio::test]
async fn sessions_from_one_template_each_see_only_their_own_changes_at_every_level() {
    let (found, quota) = twenty_sessions(&[]).await;
    let off = ("PODHOST_SESSION_DISK_FS", "off");
    let (found_off, _) = twenty_sessions(&[off]).await;
    if found_off == "overlay" {
        // Also over a file system per session, where the host gives one.
        assert_eq!(found, "overlay", "disk quota {quota}");
    }
    eprintln!("with the host's defaults: the {found} level, disk quota {quota}");
    let mut forced = vec!["copy"];
    match found_off.as_str() {
        "overlay" => forced.push("overlay"),
        other => {
            eprintln!("sessions cannot mount an overlay here ({other} found): its refusal is run");
            forced_overlay_is_refused().await;
        }
    }
    if reflink_here() {
        forced.push("reflink");
    } else {
        eprintln!("the data directory cannot clone files here: the reflink level is not run");
    }
    for level in forced {
        let env = [("PODHOST_WORKSPACE_TEMPLATE_LEVEL", level), off];
        assert_eq!(twenty_sessions(&env).await.0, level);
    }
    if found == "overlay" {
        let env = [("PODHOST_WORKSPACE_TEMPLATE_LEVEL", "overlay")];
        assert_eq!(twenty_sessions(&env).await.0, "overlay");
    }
}

/// An unprivileged `serve` (nobody) enters a user namespace of its own at start-up, so that its
/// file tools can join its sessions' views, which their own user namespaces own: its sessions
/// get the overlay level too, with the same checks as root's (each sees its own changes alone,
/// the template unchanged, nothing copied). Where the kernel gives no user namespace, the level
/// it falls back to is checked instead, and said.
#[tokio::test]
async fn an_unprivileged_serve_gives_its_sessions_the_overlay_too() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("the tests do not run as root: serve cannot be started as another user");
        return;
    }
    const NOBODY: u32 = 65534;
    let (level, _) = twenty_sessions_as(&[], Some(NOBODY)).await;
    let (root_level, _) = twenty_sessions(&[("PODHOST_SESSION_DISK_FS", "off")]).await;
    if root_level == "overlay" && user_namespaces_for(NOBODY) {
        assert_eq!(level, "overlay");
    } else {
        eprintln!("no overlay for an unprivileged podhost here: the {level} level was checked");
        assert_ne!(level, "overlay");
    }
}

/// Whether `uid` may make a user namespace here (`unshare --user`).
fn user_namespaces_for(uid: u32) -> bool {
    use std::os::unix::process::CommandExt;
    std::process::Command::new("unshare")
        .args(["--user", "--map-current-user", "true"])
        .uid(uid)
        .gid(uid)
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether a file clones (`cp --reflink=always`) in a temporary directory here.
fn reflink_here() -> bool {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a"), "a").unwrap();
    std::process::Command::new("cp")
        .arg("--reflink=always")
        .arg(dir.path().join("a"))
        .arg(dir.path().join("b"))
        .status()
        .is_ok_and(|s| s.success())
}

/// Where the kernel mounts no overlay in a session's view, asking for one stops `serve`.
async fn forced_overlay_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = template(dir.path());
    let opts = Options::default()
        .env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap())
        .env("PODHOST_WORKSPACE_TEMPLATE_LEVEL", "overlay")
        .env("PODHOST_TOKEN", "t0k3n");
    let err = spawn(&dir.path().join("data"), &opts).err().unwrap();
    assert!(err.starts_with("exit code Some(2)"), "{err}");
    assert!(
        err.contains("the overlay level was asked for, but sessions' views cannot mount one here"),
        "{err}"
    );
}

#[tokio::test]
async fn a_template_that_does_not_exist_stops_serve_before_its_data_directory_is_made() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let missing = dir.path().join("missing");
    let opts = Options::default()
        .env("PODHOST_WORKSPACE_TEMPLATE", missing.to_str().unwrap())
        .env("PODHOST_TOKEN", "t0k3n");
    let err = spawn(&data, &opts).err().unwrap();
    assert!(err.starts_with("exit code Some(2)"), "{err}");
    assert!(
        err.contains(&format!(
            "podhost serve: PODHOST_WORKSPACE_TEMPLATE {}: No such file or directory (os error 2)",
            missing.display()
        )),
        "{err}"
    );
    assert!(!data.exists());
}

#[tokio::test]
async fn a_template_inside_the_data_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("t")).unwrap();
    let opts = Options::default()
        .env(
            "PODHOST_WORKSPACE_TEMPLATE",
            data.join("t").to_str().unwrap(),
        )
        .env("PODHOST_TOKEN", "t0k3n");
    let err = spawn(&data, &opts).err().unwrap();
    assert!(err.starts_with("exit code Some(2)"), "{err}");
    assert!(err.contains("overlaps the data directory"), "{err}");
}

#[tokio::test]
async fn without_a_template_healthz_says_nothing_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = Serve::start(dir.path());
    let (_, health) = s.call("GET", "/healthz", None).await;
    assert_eq!(health.get("workspace_template"), None, "{health}");
}

#[tokio::test]
async fn a_copied_template_with_a_file_system_per_session_is_refused_where_the_host_gives_one() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Serve::start(&dir.path().join("plain"));
    let (_, health) = plain.call("GET", "/healthz", None).await;
    let t = template(dir.path());
    let data = dir.path().join("data");
    let opts = Options::default()
        .env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap())
        .env("PODHOST_WORKSPACE_TEMPLATE_LEVEL", "copy")
        .env("PODHOST_TOKEN", "t0k3n");
    let started = spawn(&data, &opts);
    if health["confinement"]["disk_quota"] != "filesystem" {
        eprintln!("this host gives sessions no file system of their own: the refusal is not run");
        let (mut child, _, _) = started.unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        return;
    }
    let err = started.err().unwrap();
    assert!(err.starts_with("exit code Some(2)"), "{err}");
    assert!(
        err.contains(
            "PODHOST_WORKSPACE_TEMPLATE: cannot be copied into a file system per session, which \
             is mounted over the workspace, with the copy level; set PODHOST_SESSION_DISK_FS=off \
             (the quota is then measured) or PODHOST_SESSION_DISK_MB=0"
        ),
        "{err}"
    );
    assert!(!data.exists());
}

/// A template bigger than a session's disk quota: the session starts and reads all of it, and
/// only what it writes counts, on the session's own file system (where the host gives one)
/// and with a measured quota.
#[tokio::test]
async fn the_quota_counts_what_a_session_writes_not_the_template() {
    for disk_fs in ["on", "off"] {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("big");
        std::fs::create_dir(&t).unwrap();
        std::fs::write(t.join("big.bin"), vec![7u8; 20 << 20]).unwrap();
        let fake = FakeModel::start("fake-model", None).await;
        fake.respond_with(|body| {
            let answered = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "tool")
                .count();
            match answered {
                0 => Reply::calls(&[
                    ("c1", "bash", json!({"command": "wc -c < big.bin"})),
                    (
                        "c2",
                        "bash",
                        json!({"command": "head -c 4M /dev/zero > small && wc -c < small"}),
                    ),
                    (
                        "c3",
                        "bash",
                        json!({"command": "head -c 12M /dev/zero > more"}),
                    ),
                ]),
                _ => Reply::text("done"),
            }
        });
        let opts = Options::default()
            .env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap())
            .env("PODHOST_SESSION_DISK_MB", "8")
            .env("PODHOST_SESSION_DISK_FS", disk_fs)
            .env("PODHOST_MIN_FREE_MB", "1");
        let s = Serve::start_with(dir.path(), opts);
        let (_, health) = s.call("GET", "/healthz", None).await;
        let level = health["workspace_template"]["level"].clone();
        let quota = health["confinement"]["disk_quota"].clone();
        if level != "overlay" {
            eprintln!(
                "no overlay here ({level}, disk quota {quota}): a copy of the template counts \
                 against the quota, which this test is not about; not run"
            );
            continue;
        }
        s.submit(start("q", "q1", "go", &fake.base_url(), None))
            .await;
        s.wait_status("q1", "completed", T * 4).await;
        let (_, out) = s.collect("q1").await;
        let m = &out["messages"];
        assert_eq!(
            answer(m, "c1"),
            json!({"exitCode": 0, "stdout": "20971520\n", "stderr": ""}),
            "disk quota {quota}"
        );
        assert_eq!(
            answer(m, "c2"),
            json!({"exitCode": 0, "stdout": "4194304\n", "stderr": ""}),
            "disk quota {quota}"
        );
        let past = answer(m, "c3");
        assert_ne!(past["exitCode"], json!(0), "disk quota {quota}: {past}");
    }
}

/// Session `change` deletes a template file and changes another, then (after its holder is
/// gone: a new turn, answering its question) and session `look`, started after it, list and
/// read their workspaces: `change` sees its own changes again, `look` the template as it is.
/// Returns the level.
async fn changes_outlive_the_holder(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let t = template(dir.path());
    let before = tree(&t);
    let fake = FakeModel::start("fake-model", None).await;
    fake.respond_with(|body| {
        let messages = body["messages"].as_array().unwrap();
        let answered = messages.iter().filter(|m| m["role"] == "tool").count();
        let look = messages
            .iter()
            .any(|m| m["role"] == "user" && m["content"] == "look");
        let see = || {
            Reply::calls(&[
                (
                    "c3",
                    "bash",
                    json!({"command": "LC_ALL=C ls -A | tr '\\n' ' '; cat README"}),
                ),
                ("c4", "read", json!({"path": "shared.txt"})),
                ("c5", "glob", json!({"pattern": "**/*"})),
            ])
        };
        match (look, answered) {
            (true, 0) | (false, 2) => see(),
            (false, 0) => Reply::call(
                "c1",
                "bash",
                json!({"command": "rm shared.txt src/run.sh && echo changed > README"}),
            ),
            (false, 1) => Reply::call("c2", "ask_user", json!({"question": "go on?"})),
            _ => Reply::text("done"),
        }
    });
    let mut opts = Options::default().env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap());
    for (k, v) in env {
        opts = opts.env(k, v);
    }
    let s = Serve::start_with(dir.path(), opts);
    let (_, health) = s.call("GET", "/healthz", None).await;
    let level = health["workspace_template"]["level"]
        .as_str()
        .unwrap()
        .to_owned();
    let url = fake.base_url();
    s.submit(start("change", "i1", "change", &url, None)).await;
    s.wait_status("i1", "input_required", T * 2).await;
    s.submit(resume("change", "i1", &[("c2", "yes")], &url, "k"))
        .await;
    s.wait_status("i1", "completed", T * 2).await;
    s.submit(start("look", "i3", "look", &url, None)).await;
    s.wait_status("i3", "completed", T * 2).await;
    let (_, changed) = s.collect("i1").await;
    let (_, looked) = s.collect("i3").await;
    let m = &changed["messages"];
    assert_eq!(
        answer(m, "c3"),
        json!({"exitCode": 0, "stdout": "README out src changed\n", "stderr": ""}),
        "{level}"
    );
    assert_eq!(answer(m, "c5"), json!("README"), "{level}");
    assert_eq!(
        answer(m, "c4")["kind"],
        json!("failed"),
        "{level}: {}",
        answer(m, "c4")
    );
    let m = &looked["messages"];
    assert_eq!(
        answer(m, "c3"),
        json!({"exitCode": 0, "stdout": "README out shared.txt src from the template\n", "stderr": ""}),
        "{level}"
    );
    assert_eq!(answer(m, "c4"), json!("1\tshared"), "{level}");
    let mut found: Vec<String> = answer(m, "c5")
        .as_str()
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    found.sort();
    assert_eq!(found, ["README", "shared.txt", "src/run.sh"], "{level}");
    assert_eq!(tree(&t), before, "the template changed");
    level
}

#[tokio::test]
async fn a_sessions_deletions_and_changes_outlive_its_holder_and_stay_its_own() {
    let found = changes_outlive_the_holder(&[]).await;
    eprintln!("with the host's defaults: the {found} level");
    let env = [
        ("PODHOST_WORKSPACE_TEMPLATE_LEVEL", "copy"),
        ("PODHOST_SESSION_DISK_FS", "off"),
    ];
    assert_eq!(changes_outlive_the_holder(&env).await, "copy");
}

/// An overlay mounted on the host for a test, detached when dropped.
struct HostOverlay(PathBuf);

impl Drop for HostOverlay {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("--lazy")
            .arg(&self.0)
            .status();
    }
}

/// A data directory the kernel refuses as an overlay's upper layer (itself on an overlay, as
/// one on NFS would be): a found overlay level falls back to a copy, and sessions still start
/// from the template; a forced one stops `serve` and says why.
#[tokio::test]
async fn a_data_directory_that_cannot_hold_an_upper_layer_falls_back_to_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let t = template(dir.path());
    let base = dir.path().join("base");
    for d in ["l", "u", "w", "merged"] {
        std::fs::create_dir_all(base.join(d)).unwrap();
    }
    let options = format!(
        "lowerdir={0}/l,upperdir={0}/u,workdir={0}/w",
        base.display()
    );
    let mounted = std::process::Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(base.join("merged"))
        .output()
        .unwrap();
    if !mounted.status.success() {
        eprintln!(
            "cannot mount an overlay on the host here ({}): the fallback is not run",
            String::from_utf8_lossy(&mounted.stderr).trim()
        );
        return;
    }
    let _overlay = HostOverlay(base.join("merged"));
    let opts = || {
        Options::default()
            .env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap())
            .env("PODHOST_SESSION_DISK_FS", "off")
    };
    let data = base.join("merged/data");
    let forced = opts()
        .env("PODHOST_WORKSPACE_TEMPLATE_LEVEL", "overlay")
        .env("PODHOST_TOKEN", "t0k3n");
    let err = spawn(&data, &forced).err().unwrap();
    assert!(err.starts_with("exit code Some(2)"), "{err}");
    assert!(
        err.contains(&format!(
            "PODHOST_WORKSPACE_TEMPLATE: the overlay level was asked for, but the data directory \
             {} cannot hold a session's upper layer: ",
            data.display()
        )),
        "{err}"
    );
    let s = Serve::start_with(&base.join("merged"), opts());
    let (_, health) = s.call("GET", "/healthz", None).await;
    assert_eq!(health["workspace_template"]["level"], json!("copy"));
    let fake = FakeModel::start("fake-model", None).await;
    fake.respond_with(|body| {
        let messages = body["messages"].as_array().unwrap();
        match messages.iter().any(|m| m["role"] == "tool") {
            false => Reply::call("c1", "bash", json!({"command": "cat README"})),
            true => Reply::text("done"),
        }
    });
    s.submit(start("s", "i", "go", &fake.base_url(), None))
        .await;
    s.wait_status("i", "completed", T * 2).await;
    let (_, out) = s.collect("i").await;
    assert_eq!(
        answer(&out["messages"], "c1"),
        json!({"exitCode": 0, "stdout": "from the template\n", "stderr": ""})
    );
}
