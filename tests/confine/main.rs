//! Adversarial tests of confinement: from `bash` and from the file tools, a command or a call
//! tries to reach podhost's secrets (its memory and environment, the join file, the harness
//! root, another session's workspace, the BYOH database), to escape through links, to take
//! podhost down (fork bomb, a 10 GB file, a signal, ptrace), to reach the network when it is
//! denied, or to make the calls the system-call filter refuses (keyrings, `bpf`, `io_uring`,
//! namespaces, mounts, …) and leave a key for a later session. Each test asserts that the
//! attempt fails AND that podhost keeps working: a following normal tool call succeeds.
//!
//! The layout every test gets ([`Host`]) mimics both fronts' state in one temporary directory:
//! a harness root with a host token and the egress CA bundle, a join file, and a BYOH data
//! directory holding a SQLite database and two sessions' workspaces and temporary directories.
//! Tests run the tools in-process (`Toolbox` on the test build of podhost as supervisor) or run
//! the real binary (`podhost tool`) where podhost's own process is the target.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::new_without_default)]

#[path = "../support/pg.rs"]
mod pg;
#[path = "../support/mod.rs"]
mod support;

mod degraded;
mod fallback;
mod limits;
mod namespaces;
mod network;
mod paths;
mod process;
mod session_network;
mod sessions;
mod syscalls;

use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use podhost::exec::cgroup::CgroupLimits;
use podhost::exec::confine::{Settings, UidRange};
use podhost::exec::{Confinement, ExecSettings, ResourceLimits};
use podhost::floor::workspace::Workspace;
use podhost::tools::{CallContext, ToolName, ToolOutcome, Toolbox, ToolboxBuilder};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::support::{executor, installed_bins, podhost_bin, supervisor_bin};

/// What every secret file holds; no output may ever contain it.
pub const SECRET: &str = "s3cr3t-host-token-7f3a";

/// One temporary directory laid out like a host running podhost.
pub struct Host {
    _dir: tempfile::TempDir,
    /// Canonical path of the temporary directory.
    pub root: PathBuf,
    /// A harness root (podhost's state in a pod): `host-token`, `egress-ca.pem`.
    pub harness: PathBuf,
    /// The join file.
    pub join: PathBuf,
    /// A BYOH data directory: `podhost.db`, `sessions/{a,b}/workspace`, `tmp/{a,b}`.
    pub data: PathBuf,
    /// Session a's workspace: the one the tools work in.
    pub ws: PathBuf,
    /// Session b's workspace, with `notes.txt` holding the secret.
    pub other_ws: PathBuf,
    /// Session a's private temporary directory.
    pub tmp: PathBuf,
}

impl Host {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let harness = root.join("harness");
        let data = root.join("data");
        let ws = data.join("sessions/a/workspace");
        let other_ws = data.join("sessions/b/workspace");
        let tmp = data.join("tmp/a");
        for d in [&harness, &ws, &other_ws, &tmp, &data.join("tmp/b")] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(harness.join("host-token"), SECRET).unwrap();
        std::fs::write(harness.join("egress-ca.pem"), "CA BUNDLE\n").unwrap();
        std::fs::write(root.join("join"), SECRET).unwrap();
        std::fs::write(other_ws.join("notes.txt"), SECRET).unwrap();
        std::fs::write(root.join("sibling.txt"), "a sibling of the hidden paths\n").unwrap();
        std::fs::write(ws.join("hello.txt"), "hello\n").unwrap();
        let db = rusqlite::Connection::open(data.join("podhost.db")).unwrap();
        db.execute_batch(&format!(
            "CREATE TABLE keys (k TEXT); INSERT INTO keys VALUES ('{SECRET}');"
        ))
        .unwrap();
        drop(db);
        Host {
            _dir: dir,
            join: root.join("join"),
            root,
            harness,
            data,
            ws,
            other_ws,
            tmp,
        }
    }

    /// podhost's policy for this host: the contents of the harness root and the join file hidden
    /// (as in a pod), the data directory hidden with its names (as on a BYOH host), the CA
    /// bundle readable, session a's private tmp.
    pub fn confinement(&self, settings: &Settings) -> Confinement {
        Confinement::new(settings)
            .hide_contents(&self.harness)
            .hide_contents(&self.join)
            .hide(&self.data)
            .allow_read(&self.harness.join("egress-ca.pem"))
            .private_tmp(&self.tmp)
    }

    /// Session a's toolbox under `confinement`.
    pub fn toolbox(&self, confinement: Confinement) -> Toolbox {
        let ws = Workspace::new(&self.ws, Some(Path::new("/workspace"))).unwrap();
        Toolbox::new(ws, executor(&self.ws).with_confinement(confinement))
    }

    pub fn confined(&self) -> Toolbox {
        self.toolbox(self.confinement(&Settings::default()))
    }

    /// Session a's toolbox isolated as on a root BYOH host (`podhost serve`): its commands in
    /// namespaces where the kernel allows, each session its own uid from a pool, a cgroup, no
    /// capabilities; `adjust` changes the settings first.
    pub fn isolated(&self, adjust: impl FnOnce(&mut Settings)) -> Toolbox {
        self.isolated_session(&self.ws, &self.tmp, adjust)
    }

    /// Like [`isolated`](Self::isolated), for the workspace `ws` with the temporary directory
    /// `tmp` (another session of this host).
    pub fn isolated_session(
        &self,
        ws: &Path,
        tmp: &Path,
        adjust: impl FnOnce(&mut Settings),
    ) -> Toolbox {
        let mut settings = isolated_settings();
        adjust(&mut settings);
        // The store hands a session its uid on a BYOH host; here each call's pool is its own,
        // so its first uid is this session's alone.
        let uid = settings.uid_pool.map(|p| p.first);
        let exec = ExecSettings {
            shell: None,
            limits: ResourceLimits::default(),
            confine: settings,
        };
        let builder = ToolboxBuilder::new(&exec, supervisor_bin().to_path_buf()).confine(|c| {
            c.hide_contents(&self.harness)
                .hide_contents(&self.join)
                .hide(&self.data)
                .allow_read(&self.harness.join("egress-ca.pem"))
        });
        let ws = Workspace::new(ws, Some(Path::new("/workspace"))).unwrap();
        builder.build_as(ws, Some(tmp), uid).unwrap()
    }

    /// `podhost tool` arguments for session a with this host's policy (the CA-bundle exception
    /// is the pod front's and has no flag).
    pub fn tool_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--workspace".into(), self.ws.clone().into()];
        for p in [&self.harness, &self.join, &self.data] {
            args.push("--confine-deny".into());
            args.push(p.clone().into());
        }
        args.push("--tmp-dir".into());
        args.push(self.tmp.clone().into());
        args
    }

    /// Replaces this host's root in `s` with `ROOT`, so outputs can be compared whole.
    pub fn redact(&self, s: &str) -> String {
        s.replace(self.root.to_str().unwrap(), "ROOT")
    }

    /// Makes the whole tree usable by nobody (tests that run podhost as nobody) and returns a
    /// podhost binary nobody can run: a link to (or copy of) the test build inside this tree,
    /// since the build directory may sit where nobody cannot reach it.
    pub fn open_to_everyone(&self) -> PathBuf {
        let bin = self.root.join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        for (from, name) in installed_bins() {
            let to = bin.join(name);
            if std::fs::hard_link(from, &to).is_err() {
                std::fs::copy(from, &to).unwrap();
            }
        }
        self.open_dirs();
        bin.join("podhost")
    }

    fn open_dirs(&self) {
        let mut p = self.ws.clone();
        loop {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
            if p == self.root || !p.pop() {
                break;
            }
        }
        std::fs::set_permissions(&self.tmp, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
}

/// Settings of a root BYOH host for tests: isolated, with a uid pool of its own (so that tests
/// running at once never share a uid) and small cgroup limits.
pub fn isolated_settings() -> Settings {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT_POOL: AtomicU32 = AtomicU32::new(0);
    let first = 430_000 + 100 * NEXT_POOL.fetch_add(1, Ordering::Relaxed);
    Settings {
        isolate: true,
        helper: Some(supervisor_bin().to_path_buf()),
        uid_pool: nix::unistd::geteuid().is_root().then_some(UidRange {
            first,
            last: first + 99,
        }),
        cgroup: CgroupLimits {
            pids: Some(256),
            memory_bytes: Some(512 << 20),
            cpu_weight: Some(100),
        },
        ..Settings::default()
    }
}

/// Whether this machine runs commands in namespaces (root, or user namespaces allowed); tests
/// that need them say so and check the fallback otherwise.
pub fn has_namespaces() -> bool {
    let ns = podhost::exec::probe::probe_host(supervisor_bin()).namespaces;
    if !ns.any() {
        eprintln!("this machine allows no namespaces: checking the Landlock-only level instead");
    }
    ns.any()
}

/// Processes whose command line holds `marker` (a command's own processes, found by a marker
/// only they carry).
pub fn processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // A zombie is dead already; it only waits for its parent to reap it.
            let zombie = stat
                .rsplit_once(") ")
                .is_some_and(|(_, r)| r.starts_with('Z'));
            (!zombie
                && cmdline
                    .split(|&b| b == 0)
                    .any(|a| a.windows(marker.len()).any(|w| w == marker.as_bytes())))
            .then_some(pid)
        })
        .collect()
}

/// A directory outside every path a session's view covers (the system's temporary directories
/// are covered on a BYOH host, and the test host lives in one): for files "elsewhere on the
/// system" that commands may see but must not change.
///
/// The build's own temporary directory, unless the checkout itself is under a temporary
/// directory (a clone in /tmp): then `/var/lib/podhost-tests` (world-traversable, so an
/// unprivileged podhost reaches it too), or a directory in HOME when that cannot be made.
pub fn elsewhere() -> tempfile::TempDir {
    let covered = ["/tmp", "/var/tmp", "/dev/shm", "/run"];
    let under_a_temporary_directory = |p: &std::path::Path| {
        let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        covered.iter().any(|c| p.starts_with(c))
    };
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    if !under_a_temporary_directory(target) {
        return tempfile::tempdir_in(target).unwrap();
    }
    let shared = std::path::Path::new("/var/lib/podhost-tests");
    if std::fs::create_dir_all(shared).is_ok()
        && std::fs::set_permissions(shared, std::fs::Permissions::from_mode(0o755)).is_ok()
    {
        return tempfile::tempdir_in(shared).unwrap();
    }
    let home = std::path::PathBuf::from(std::env::var_os("HOME").unwrap()).join(".podhost-tests");
    std::fs::create_dir_all(&home).unwrap();
    assert!(
        !under_a_temporary_directory(&home),
        "no directory outside the temporary ones for files elsewhere on the system"
    );
    tempfile::tempdir_in(home).unwrap()
}

/// A marker unique to this test run and `what`.
pub fn marker(what: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs one tool, failing the test after 30 s or on a harness fault.
pub async fn run(tb: &Toolbox, tool: ToolName, input: Value) -> ToolOutcome {
    let ctx = CallContext::new(CancellationToken::new());
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tb.call(tool, &input, &ctx),
    )
    .await
    .expect("tool call timed out")
    .expect("harness fault")
}

/// The output object of a completed bash call, with the host's root redacted in both streams.
pub async fn bash(host: &Host, tb: &Toolbox, command: &str) -> Value {
    match run(tb, ToolName::Bash, json!({ "command": command })).await {
        ToolOutcome::Completed { mut output } => {
            for stream in ["stdout", "stderr"] {
                if let Some(Value::String(s)) = output.get_mut(stream) {
                    *s = host.redact(s);
                }
            }
            output
        }
        other => panic!("expected a completed bash call, got {other:?}"),
    }
}

/// A normal call after an attack: bash runs and `read` reads a workspace file.
pub async fn assert_still_works(tb: &Toolbox) {
    let out = run(tb, ToolName::Bash, json!({"command": "echo still here"})).await;
    assert_eq!(
        out,
        ToolOutcome::completed(json!({"exitCode": 0, "stdout": "still here\n", "stderr": ""}))
    );
    let read = run(tb, ToolName::Read, json!({"path": "hello.txt"})).await;
    assert!(read.is_completed(), "{read:?}");
}

/// The user tests run an unprivileged podhost (or its commands) as.
pub const NOBODY: u32 = 65534;

/// Held by every test whose processes run as nobody: the fork bomb's process limit and its
/// "nothing of nobody is left" check count all of nobody's processes.
pub fn nobody_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The output of `podhost tool NAME` run with `args`, `env` and `input`: (outcome, stderr, exit
/// code). `as_nobody` runs that podhost binary (see [`Host::open_to_everyone`]) as nobody.
pub fn podhost_tool(
    name: &str,
    args: &[OsString],
    input: &Value,
    env: &[(&str, &str)],
    as_nobody: Option<&Path>,
) -> (Value, String, i32) {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(as_nobody.unwrap_or(podhost_bin()));
    cmd.args(["tool", name])
        .args(args)
        .arg("--input")
        .arg(input.to_string())
        .env_remove("RUST_LOG")
        .envs(env.iter().copied());
    if as_nobody.is_some() {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    let out = run_bounded(cmd);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let outcome = if stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(stdout.trim_end())
            .unwrap_or_else(|e| panic!("podhost printed no outcome ({e}): {stdout}"))
    };
    (
        outcome,
        String::from_utf8(out.stderr).unwrap(),
        out.status.code().unwrap_or(-1),
    )
}

/// Runs `cmd` to its end, killing it after 60 s.
fn run_bounded(mut cmd: Command) -> std::process::Output {
    use std::process::Stdio;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("podhost tool did not finish within 60 s");
        }
    }
}

/// The `output` object of a completed outcome printed by `podhost tool`.
pub fn completed(outcome: &Value) -> &Value {
    assert_eq!(outcome["kind"], "completed", "{outcome}");
    &outcome["output"]
}
