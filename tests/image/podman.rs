//! podman with a store and configuration of its own, and a bounded wait on every call.
//!
//! The store, the run root and podman's temp files live under one directory, so the tests never
//! touch the machine's global container state; `containers.conf` carries the two fixes this kind
//! of host needs (docs: /work/shared/reference/containers.md): runc instead of crun (hybrid
//! cgroups) and ulimits the process may actually set (no CAP_SYS_RESOURCE).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::resource::{Resource, getrlimit};

/// A podman client bound to one store.
#[derive(Debug)]
pub struct Podman {
    env: Vec<(&'static str, OsString)>,
}

impl Podman {
    /// Writes `storage.conf` and `containers.conf` under `dir` and points podman at them.
    pub fn new(dir: &Path) -> Podman {
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        let storage = dir.join("storage.conf");
        std::fs::write(
            &storage,
            format!(
                "[storage]\ndriver = \"overlay\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
                dir.join("graph").display(),
                dir.join("run").display()
            ),
        )
        .unwrap();
        // The hard limits: podman's defaults are higher than root without CAP_SYS_RESOURCE may
        // set, which fails every container start.
        let (_, nofile) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let (_, nproc) = getrlimit(Resource::RLIMIT_NPROC).unwrap();
        let nproc = nproc.min(32768);
        let containers = dir.join("containers.conf");
        std::fs::write(
            &containers,
            format!(
                "[containers]\ndefault_ulimits = [\"nofile={nofile}:{nofile}\", \
                 \"nproc={nproc}:{nproc}\"]\n\n[engine]\nruntime = \"runc\"\n"
            ),
        )
        .unwrap();
        Podman {
            env: vec![
                ("CONTAINERS_STORAGE_CONF", storage.into_os_string()),
                ("CONTAINERS_CONF", containers.into_os_string()),
                ("TMPDIR", tmp.into_os_string()),
            ],
        }
    }

    /// `podman ARGS` with this store's environment.
    pub fn command<I, S>(&self, args: I) -> tokio::process::Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = tokio::process::Command::new("podman");
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }

    /// Runs `podman ARGS` to its end, failing the test if it takes longer than `within`.
    pub async fn output<I, S>(&self, args: I, within: Duration) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().into()).collect();
        run(self.command(&args), within, &format!("podman {args:?}")).await
    }

    /// Like [`output`](Self::output), and fails the test unless podman succeeded; its stdout.
    pub async fn ok<I, S>(&self, args: I, within: Duration) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let args: Vec<OsString> = args.into_iter().map(|a| a.as_ref().into()).collect();
        let out = self.output(&args, within).await;
        assert!(
            out.status.success(),
            "podman {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The same call, blocking: for `Drop`, where there is no runtime to await on.
    pub fn blocking(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = std::process::Command::new("podman");
        cmd.args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }
}

/// Runs `cmd` to its end with its output captured, failing the test after `within`.
pub async fn run(mut cmd: tokio::process::Command, within: Duration, what: &str) -> Output {
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("could not start {what}: {e}"));
    match tokio::time::timeout(within, child.wait_with_output()).await {
        Ok(out) => out.unwrap(),
        Err(_) => panic!("{what} did not finish within {within:?}"),
    }
}

/// A name no other container of this test process has.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Where `program` is, searching `PATH` and the sbin directories a non-login root shell may
/// leave out of it.
pub fn find_program(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
