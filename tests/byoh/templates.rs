//! A workspace template (`PODHOST_WORKSPACE_TEMPLATE`): every new session's workspace starts
//! with its files, each session changes only its own copy, the template is never changed, and a
//! link in it that leads outside reads nothing there. Each copy level this host gives runs the
//! same checks.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use pretty_assertions::assert_eq;
use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{Options, Serve, T, spawn, start};
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
fn model(fake: &FakeModel) {
    fake.respond_with(|body| {
        let messages = body["messages"].as_array().unwrap();
        if messages.iter().any(|m| m["role"] == "tool") {
            return Reply::text("done");
        }
        let n: usize = messages
            .iter()
            .find(|m| m["role"] == "user")
            .and_then(|m| m["content"].as_str())
            .and_then(|t| t.trim().parse().ok())
            .unwrap();
        let delete = if n == 0 { "rm shared.txt; " } else { "" };
        Reply::calls(&[
            (
                "c1",
                "bash",
                json!({"command": format!("{delete}echo {n} > bash-{n}; cat out > seen 2>&1; true")}),
            ),
            ("c2", "write", json!({"path": format!("write-{n}"), "content": format!("{n}\n")})),
            ("c3", "read", json!({"path": "out"})),
        ])
    });
}

/// The tool results session `n`'s model was sent.
fn tool_results(fake: &FakeModel, n: usize) -> Vec<String> {
    fake.requests()
        .iter()
        .filter_map(|r| {
            let messages = r.body["messages"].as_array()?;
            let user = messages.iter().find(|m| m["role"] == "user")?;
            (user["content"].as_str()?.trim() == n.to_string()).then_some(messages.clone())
        })
        .flatten()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect()
}

/// Runs the sessions on a server with `env`; answers the level `/healthz` reports.
async fn twenty_sessions(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let t = template(dir.path());
    let before = tree(&t);
    let fake = FakeModel::start("fake-model", None).await;
    model(&fake);
    let mut opts = Options::default()
        .env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap())
        .env("PODHOST_SESSION_DISK_FS", "off");
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
        let ws = s.workspace(&format!("s{n}"));
        let mut names: Vec<String> = std::fs::read_dir(&ws)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut want = vec!["README", "out", "seen", "src"]
            .into_iter()
            .map(str::to_owned)
            .chain([format!("bash-{n}"), format!("write-{n}")])
            .collect::<Vec<_>>();
        if n != 0 {
            want.push("shared.txt".to_owned());
        }
        want.sort();
        assert_eq!(names, want, "session {n}");
        assert_eq!(
            s.read_file(&format!("s{n}"), &format!("bash-{n}")),
            Some(format!("{n}\n"))
        );
        assert_eq!(
            s.read_file(&format!("s{n}"), &format!("write-{n}")),
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
        // The link stayed a link, and neither bash nor the read tool got through it.
        assert!(
            std::fs::symlink_metadata(ws.join("out"))
                .unwrap()
                .is_symlink()
        );
        let seen = s.read_file(&format!("s{n}"), "seen").unwrap();
        assert!(!seen.contains(SECRET), "bash read through the link: {seen}");
        let results = tool_results(&fake, n);
        assert_eq!(results.len(), 3, "{results:?}");
        assert!(!results.iter().any(|r| r.contains(SECRET)), "{results:?}");
    }
    assert_eq!(tree(&t), before, "the template changed");
    level
}

#[tokio::test]
async fn sessions_from_one_template_each_see_only_their_own_changes_at_every_level() {
    let found = twenty_sessions(&[]).await;
    let mut forced = vec!["copy"];
    if found == "reflink" {
        forced.push("reflink");
    } else {
        eprintln!("the data directory cannot clone files here: the reflink level is not run");
    }
    for level in forced {
        let env = [("PODHOST_WORKSPACE_TEMPLATE_LEVEL", level)];
        assert_eq!(twenty_sessions(&env).await, level);
    }
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
async fn a_template_with_a_file_system_per_session_is_refused_where_the_host_gives_one() {
    let dir = tempfile::tempdir().unwrap();
    let plain = Serve::start(&dir.path().join("plain"));
    let (_, health) = plain.call("GET", "/healthz", None).await;
    let t = template(dir.path());
    let data = dir.path().join("data");
    let opts = Options::default()
        .env("PODHOST_WORKSPACE_TEMPLATE", t.to_str().unwrap())
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
        err.contains("cannot be combined with a file system per session"),
        "{err}"
    );
    assert!(!data.exists());
}
