//! Workspace template benchmark: how long a session takes to start — from `submit` to its first
//! command's result reaching the model — with a template of 10 MB and of 1 GB (1 MiB files), at
//! each level this host gives (overlay, reflink, copy), as a ratio to the same server starting a
//! session on an empty workspace (no template), measured in the same run. Medians of several
//! rounds, each round a new session.
//!
//! Run with `cargo bench --bench templates` (release build of podhost, scripted model on
//! loopback; root or an unprivileged user namespace for the overlay level). Every level runs
//! without a file system per session (copy and reflink cannot go into one); the overlay level
//! runs with one too where the host gives it, and, run as root, once more from a server that runs
//! as `nobody` (an unprivileged podhost, in a user namespace of its own: see
//! `exec::enter_own_user_namespace`). `PODHOST_BENCH_SMOKE=1` runs 1 MiB templates, one round
//! each.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/smoke.rs"]
mod smoke;

#[path = "support/listen.rs"]
mod listen;

#[path = "../tests/support/openai_fake.rs"]
mod openai_fake;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use openai_fake::{FakeModel, Reply};
use serde_json::{Value, json};

const TOKEN: &str = "bench-token";

/// Template sizes in MiB, and rounds per measurement.
fn scale() -> (Vec<u64>, usize) {
    smoke::pick((vec![10, 1024], 5), (vec![1], 1))
}

struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server, once it listens, running as `user` when given; `None` when it exits first (a
/// level this host refuses).
fn start_server(data: &Path, env: &[(&str, String)], user: Option<u32>) -> Option<Server> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_podhost"));
    if let Some(id) = user {
        use std::os::unix::process::CommandExt;
        cmd.uid(id).gid(id);
    }
    cmd.arg("serve")
        .env("PODHOST_LISTEN", "127.0.0.1:0")
        .env("PODHOST_DATA", data)
        .env("PODHOST_TOKEN", TOKEN)
        .env("PODHOST_MIN_FREE_MB", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let Some(addr) = listen::listening_addr(&mut child, Duration::from_secs(60), |_| {}) else {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    };
    Some(Server {
        child,
        url: format!("http://{addr}"),
    })
}

/// A template of `mib` files of 1 MiB each (distinct bytes, nothing sparse) in `dir`.
fn make_template(dir: &Path, mib: u64) {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    for i in 0..mib {
        let block: Vec<u8> = (0..1 << 20).map(|b: u64| (b * 31 + i) as u8).collect();
        std::fs::write(dir.join(format!("src/f{i:05}.bin")), block).unwrap();
    }
}

async fn status(http: &reqwest::Client, url: &str, id: &str) -> Value {
    http.get(format!("{url}/get_status?invocation_id={id}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The start of `rounds` new sessions on a server with `env`, one at a time: from `submit` to
/// the model's request that carries the first command's result. Sorted; with the level the
/// server reports. `None` when the server refuses to start.
async fn session_starts(
    dir: &Path,
    fake: &FakeModel,
    env: &[(&str, String)],
    rounds: usize,
    user: Option<u32>,
) -> Option<(Vec<Duration>, String)> {
    if let Some(id) = user {
        std::os::unix::fs::chown(dir, Some(id), Some(id)).unwrap();
    }
    let server = start_server(&dir.join("data"), env, user)?;
    let http = reqwest::Client::new();
    let health: Value = http
        .get(format!("{}/healthz", server.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let level = health["workspace_template"]["level"]
        .as_str()
        .unwrap_or("none")
        .to_owned();
    let mut out = Vec::new();
    for n in 0..rounds {
        let id = format!("inv-{n}");
        let body = json!({
            "protocol_version": "1", "session_id": format!("s{n}"), "invocation_id": id,
            "session_action": "start",
            "input_messages": [{"role": "user", "content": "start"}],
            "model_connection": {"base_url": fake.base_url(), "model": "fake-model", "api_key": "k"}
        });
        let before = fake.requests().len();
        let t = Instant::now();
        let resp = http
            .post(format!("{}/submit", server.url))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        smoke::check(
            resp.status() == 202,
            format_args!("submit: {}", resp.status()),
        );
        let reqs = fake
            .wait_requests(before + 2, Duration::from_secs(600))
            .await;
        out.push(reqs[before + 1].at - t);
        let answered = reqs[before + 1].body["messages"].to_string();
        smoke::check(
            answered.contains("exitCode\\\":0"),
            format_args!("the first command ran: {answered}"),
        );
        loop {
            let s = status(&http, &server.url, &id).await;
            if s["status"] == "completed" {
                break;
            }
            smoke::check(s["status"] != "failed", format_args!("{s}"));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    out.sort();
    Some((out, level))
}

/// Whether a file clones (`cp --reflink=always`) in `dir`.
fn reflink_here(dir: &Path) -> bool {
    std::fs::write(dir.join("clone-a"), "a").unwrap();
    Command::new("cp")
        .arg("--reflink=always")
        .arg(dir.join("clone-a"))
        .arg(dir.join("clone-b"))
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (sizes, rounds) = scale();
    let fake = FakeModel::start("fake-model", Some("k")).await;
    fake.respond_with(|body| {
        let answered = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["role"] == "tool");
        if answered {
            Reply::text("done")
        } else {
            Reply::call("c1", "bash", json!({"command": "test -d . && echo ready"}))
        }
    });
    let root = tempfile::tempdir().unwrap();
    // Open to the unprivileged server's user (its data directories are made its own).
    std::fs::set_permissions(
        root.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let templates: Vec<(u64, std::path::PathBuf)> = sizes
        .iter()
        .map(|&mib| {
            let t = root.path().join(format!("template-{mib}"));
            make_template(&t, mib);
            (mib, t)
        })
        .collect();
    // Written back now: a gigabyte of dirty pages otherwise goes to disk during the first
    // level's sessions, which would measure the template's writeback, not their start.
    nix::unistd::sync();
    println!(
        "workspace template benchmark: submit → first command's result, median of {rounds} \
         sessions ({})",
        smoke::build()
    );
    const NOBODY: Option<u32> = Some(65534);
    let mut runs: Vec<(&str, &str, Option<u32>)> = vec![
        ("overlay", "off", None),
        ("reflink", "off", None),
        ("copy", "off", None),
    ];
    if nix::unistd::geteuid().is_root() {
        runs.insert(1, ("overlay", "on", None));
        runs.insert(2, ("overlay", "off", NOBODY));
    }
    for (level, disk_fs, user) in runs {
        let who = if user.is_some() { "nobody" } else { "" };
        if level == "reflink" && !reflink_here(root.path()) {
            smoke::skipped(
                "the reflink level",
                "the file system here cannot clone files",
            );
            continue;
        }
        let base_env = vec![("PODHOST_SESSION_DISK_FS", disk_fs.to_owned())];
        let dir = tempfile::tempdir_in(root.path()).unwrap();
        let (empty, _) = session_starts(dir.path(), &fake, &base_env, rounds, user)
            .await
            .expect("serve starts without a template");
        let empty_median = empty[empty.len() / 2];
        for (mib, t) in &templates {
            let mut env = base_env.clone();
            env.push(("PODHOST_WORKSPACE_TEMPLATE", t.display().to_string()));
            env.push(("PODHOST_WORKSPACE_TEMPLATE_LEVEL", level.to_owned()));
            let dir = tempfile::tempdir_in(root.path()).unwrap();
            let Some((starts, got)) = session_starts(dir.path(), &fake, &env, rounds, user).await
            else {
                smoke::skipped(
                    &format!("the {level} level (file system per session {disk_fs}) {who}"),
                    "serve refuses it on this host",
                );
                break;
            };
            smoke::check(got == level, format_args!("{got} reported, {level} forced"));
            let median = starts[starts.len() / 2];
            smoke::check_positive("a session's start", &[ms(median), ms(empty_median)]);
            println!(
                "  {level:<8} disk fs {disk_fs:<3} {who:<6} {mib:>5} MiB template: {:9.1} ms  \
                 empty workspace {:7.1} ms  ×{:.2}",
                ms(median),
                ms(empty_median),
                ms(median) / ms(empty_median)
            );
        }
    }
    smoke::finish("templates");
}
