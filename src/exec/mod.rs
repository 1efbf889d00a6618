//! Process execution: the one place podhost starts processes.
//!
//! Owns: spawning a command under a per-command supervisor (its own process group in a session
//! other than podhost's, stdin from `/dev/null`, a child subreaper that kills every descendant when
//! the command ends, times out or is cancelled), concurrent bounded capture of stdout and stderr,
//! resource limits, the command environment (`env`), the egress proxy variables and CA bundle
//! (`egress`), and the confinement that keeps commands away from podhost's secrets (`confine`).
//! Also the minimal init podhost splits off when it is a container's PID 1 (`init`).
//!
//! Invariants:
//! * A command never outlives its call: when the shell exits, times out or is cancelled, every
//!   process it started is killed — also those that called `setsid` or double-forked.
//! * A call returns on time even when a descendant holds the output pipes.
//! * Memory held for a command's output is bounded, whatever it prints.
//! * The environment is built from a clean base: nothing of podhost's own environment leaks.
//!
//! All `unsafe` in podhost lives in this module, each block with a `// SAFETY:` comment.
//!
//! # How a command runs
//!
//! ```text
//! podhost ──spawn (empty env)──► podhost-exec ──vspawn──► <shell> -c <command> ──► …
//!   │  stdin: control socket ──────► request (JSON) in, status line out      (own session,
//!   │  stdout/stderr pipes ◄──────── passed through to the shell              own group)
//! ```
//!
//! * `spawn` (podhost side, tokio): starts the supervisor, sends the [`protocol::Request`],
//!   captures both pipes concurrently ([`capture`]), owns the timeout and cancellation (SIGTERM
//!   to the supervisor), and bounds every wait so the call returns on time.
//! * [`supervise`] (the supervisor, plain std; the small `podhost-exec` binary, or
//!   `podhost __exec` where that is not installed, see [`find_supervisor`]): child subreaper,
//!   `setsid` (but in a session holder's session), starts the shell with the limits ([`limits`]), `PR_SET_NO_NEW_PRIVS` and the
//!   confinement ([`confine`]: Landlock, the network filter, the command user) applied in a child
//!   that shares its memory until the exec (`vspawn`, as `posix_spawn` does), reaps, and kills
//!   every descendant ([`procs`]) before reporting the shell's status and exiting.
//! * [`oneshot`]: `podhost tool bash`'s one command, with no async runtime and no supervisor
//!   program; it reads the pipes and keeps the timeout and the stop signals itself. Where it
//!   built the command's view, the shell is its own child in a PID namespace whose init
//!   ([`nsinit`]) shares its memory: the kernel kills the tree. That child is started before
//!   the view is built and sheds what it must on its own ([`ahead`]) while the view is built.
//!   Elsewhere its supervisor is a fork of podhost running the same code
//!   (`supervise::in_fork`), with no control socket:
//!
//! ```text
//! podhost tool ──clone(VM, NEWPID)──► init (pid 1), then setns into its namespace
//!      └──clone(VM): sheds, filter; Landlock, exec──► <shell> -c <command> (pid 2) ──► …
//! podhost tool ──fork──► supervisor ──vspawn, confine, exec──► <shell> -c <command> ──► …
//! ```
//!
//! * [`reaper`]: podhost itself as a child subreaper, reaping what a failed supervisor left.
//! * [`env`](mod@env): the command's environment; [`egress`]: the CA bundle file its trust
//!   variables name.
//!
//! On a pod or BYOH host, where the kernel allows, a workspace's commands run in a session
//! ([`session`]): a holder process made the session's namespaces and view of the file system
//! once, and forks each command's supervisor inside them (the supervisor is then not podhost's
//! child: it sends podhost its pidfd, which the timeout and cancellation use):
//!
//! ```text
//! podhost ──spawn once──► podhost-exec __session ──clone(NEWNS|NEWIPC|NEWPID)──► holder (pid 1)
//!   │  per command: control socket + stdout + stderr (SCM_RIGHTS) ──────────────►  │ fork
//!   └◄──────────── the supervisor's pidfd, then its status line ─── supervisor ◄──┘
//! ```
//!
//! A session's processes are limited by its cgroup ([`cgroup`]), and a BYOH session's files by
//! its disk quota ([`quota`]). What the host lets a session have (the namespace level, a network
//! namespace, a disk of its own) is found once by trying ([`probe`]). A new workspace may start
//! as a copy of a template ([`template`]),
//! or as a copy-on-write view of it ([`overlay`]). [`sys`] holds the raw system calls all of this needs.
//!
//! The files import one way: a session's holder forks supervisors ([`session`] →
//! [`supervise`]), a supervisor confines its command ([`supervise`] → [`confine`]), and the
//! confinement reads the probe's level ([`confine`] → [`probe`]), never the session that builds
//! at it.

pub(crate) mod ahead;
pub(crate) mod capture;
pub mod cgroup;
pub mod confine;
pub mod disk;
pub mod egress;
pub(crate) mod env;
pub mod init;
pub(crate) mod limits;
pub mod net;
pub(crate) mod nsinit;
pub mod oneshot;
pub(crate) mod overlay;
pub mod probe;
pub(crate) mod procs;
pub mod protocol;
pub mod quota;
pub mod reaper;
pub mod sandbox;
pub mod session;
mod spawn;
pub mod supervise;
pub(crate) mod sys;
pub mod template;
mod vspawn;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

pub use capture::LiveOutput;
pub use confine::Confinement;
pub use env::{BaseEnv, CommandEnv};
pub use sys::enter_own_user_namespace;

/// `argv[1]` that makes the podhost binary a command supervisor (see [`supervise`]). The binary's
/// `main` checks for it before anything else; `podhost-exec` ignores it.
pub const SUPERVISOR_ARG: &str = "__exec";

/// The file name of the dedicated supervisor binary (`src/bin/podhost-exec.rs`).
pub const SUPERVISOR_BIN: &str = "podhost-exec";

/// Runs the helper `arg` names — a command's supervisor ([`SUPERVISOR_ARG`]), a session holder
/// (`__session`, see [`session::holder`]) or the namespace probe (`__probe`) — and returns its
/// exit code; `None` when `arg` names none. The binaries' `main` calls it before anything else
/// (no clap, no tracing, no tokio: a helper must start fast and single-threaded).
pub fn run_helper(arg: Option<&std::ffi::OsStr>) -> Option<std::process::ExitCode> {
    let arg = arg?.to_str()?;
    match arg {
        SUPERVISOR_ARG => {
            oom_first();
            Some(supervise::main())
        }
        session::holder::SESSION_ARG => {
            oom_first();
            Some(session::holder::main())
        }
        probe::PROBE_ARG => Some(probe::main()),
        _ => None,
    }
}

/// Makes this process (a supervisor or a session holder) and everything it starts the first the
/// kernel's OOM killer takes, before podhost itself or anything else on the host: a command's
/// memory is charged where the killer may not see it (System V shared memory counts in the
/// cgroup, not in any process's size), and without this the killer may take podhost. Raising
/// the score needs no privilege; a failure leaves the kernel's own choice.
fn oom_first() {
    let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
}

/// The supervisor for this process's commands: `podhost-exec` beside podhost's own executable
/// when it is there (it starts faster), else the running binary itself, as `<it> __exec`
/// (`podhost-full __exec` for `serve`, `pod`, `mcp` and `run`).
pub fn find_supervisor() -> std::io::Result<PathBuf> {
    let me = std::env::current_exe()?;
    Ok(supervisor_beside(&me).unwrap_or(me))
}

/// `podhost-exec` in the directory of `exe`, if it is an executable file there.
pub fn supervisor_beside(exe: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let candidate = exe.with_file_name(SUPERVISOR_BIN);
    let meta = std::fs::metadata(&candidate).ok()?;
    (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(candidate)
}

/// The longest command line: Linux refuses a single `execve` argument of 128 KiB or more
/// (`MAX_ARG_STRLEN`, counting the terminating NUL), and the command is one argument of `sh -c`.
pub const MAX_COMMAND_BYTES: usize = 128 * 1024 - 1;

/// Why a command cannot be run at all, in words for the caller (the model): it was never started.
pub fn validate_command(command: &str) -> Result<(), String> {
    if command.is_empty() {
        return Err("The command is empty.".to_owned());
    }
    if command.contains('\0') {
        return Err(
            "The command holds a NUL character, which a command line cannot carry.".to_owned(),
        );
    }
    if command.len() > MAX_COMMAND_BYTES {
        return Err(format!(
            "The command is {} bytes; a command can be at most {MAX_COMMAND_BYTES} bytes (the \
             kernel's limit for one argument). Write the script to a file in the workspace and \
             run that file instead.",
            command.len()
        ));
    }
    Ok(())
}

/// Per-command resource limits (`setrlimit`), each `None` for "inherit".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceLimits {
    /// `RLIMIT_NOFILE`: open files.
    pub open_files: Option<u64>,
    /// `RLIMIT_NPROC`: processes of the user (a fork bomb's ceiling).
    pub processes: Option<u64>,
    /// `RLIMIT_FSIZE`: the largest file a command may write, in bytes.
    pub file_size: Option<u64>,
    /// `RLIMIT_CPU`: CPU seconds.
    pub cpu_seconds: Option<u64>,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            open_files: Some(4096),
            processes: Some(4096),
            file_size: Some(8 << 30),
            cpu_seconds: None,
        }
    }
}

/// How a front's commands run, as configured: the shell, the limits and the confinement
/// settings. Plain data (the command line builds it); [`ExecConfig`] adds what is found at
/// start-up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecSettings {
    /// The shell; `None` for [`find_shell`]'s choice.
    pub shell: Option<PathBuf>,
    pub limits: ResourceLimits,
    pub confine: confine::Settings,
}

/// The shell to run commands with: the explicit one, else `bash` where it is installed, else
/// `sh`.
pub fn find_shell(explicit: Option<&Path>) -> PathBuf {
    if let Some(p) = explicit {
        return p.to_path_buf();
    }
    for candidate in ["/bin/bash", "/usr/bin/bash", "/usr/local/bin/bash"] {
        if Path::new(candidate).is_file() {
            return PathBuf::from(candidate);
        }
    }
    PathBuf::from("/bin/sh")
}

/// How commands are started.
#[derive(Clone, Debug)]
pub struct ExecConfig {
    /// The podhost binary, re-executed as each command's supervisor.
    pub supervisor: PathBuf,
    /// The shell: `bash` if present, else `sh`.
    pub shell: PathBuf,
    pub env: CommandEnv,
    pub limits: ResourceLimits,
}

/// Starts commands. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Executor {
    config: Arc<ExecConfig>,
    confinement: Arc<Confinement>,
    /// The session commands run in, when they run in namespaces.
    session: Option<Arc<session::SessionSlot>>,
    /// The session's cgroup (kept while commands may run in it).
    group: Option<Arc<cgroup::Group>>,
    /// The session's disk quota.
    quota: Option<Arc<quota::DiskQuota>>,
}

/// Exit code reported for a command podhost stopped for a limit (as a SIGKILL would show).
pub const EXIT_STOPPED: i32 = 137;

impl Executor {
    /// An executor with the default confinement: Landlock where the kernel has it, nothing
    /// hidden, the network allowed (see [`confine`]).
    pub fn new(config: ExecConfig) -> Self {
        Executor {
            config: Arc::new(config),
            confinement: Arc::new(Confinement::default()),
            session: None,
            group: None,
            quota: None,
        }
    }

    /// Commands run in `session` (see [`session`]).
    pub fn with_session(mut self, session: session::SessionSlot) -> Self {
        self.session = Some(Arc::new(session));
        self
    }

    /// Commands run in (and are limited by) `group`.
    pub fn with_group(mut self, group: cgroup::Group) -> Self {
        self.group = Some(Arc::new(group));
        self
    }

    /// Commands are stopped past `quota`.
    pub fn with_quota(mut self, quota: Arc<quota::DiskQuota>) -> Self {
        self.quota = Some(quota);
        self
    }

    /// The disk quota, if any.
    /// The image of the session's own disk, when its files live on one (`disk`).
    pub fn disk_image(&self) -> Option<&Path> {
        self.session.as_ref()?.disk_image()
    }

    pub fn quota(&self) -> Option<&Arc<quota::DiskQuota>> {
        self.quota.as_ref()
    }

    /// The mount namespace a file tool must join to see the session's files as its commands
    /// do: `Some` where they live there alone (a session's disk, see [`disk`]), the session
    /// started first if need be; `None` where the host's directories are the session's.
    pub async fn files_namespace(&self) -> Result<Option<std::os::fd::OwnedFd>, ExecError> {
        let Some(slot) = self.session.as_ref().filter(|s| s.files_inside()) else {
            return Ok(None);
        };
        let session = slot.running().await?;
        Ok(Some(session.mount_namespace()?))
    }

    /// The pid of the session holder commands run under, while one runs.
    pub fn session_holder_pid(&self) -> Option<i32> {
        self.session.as_ref()?.holder_pid()
    }

    /// Whether [`execute_here`](Self::execute_here) can run this executor's commands: no
    /// cgroup or disk quota to watch, and no session or one whose view this process can build
    /// in itself (local use with a read-only system, podhost root: see [`oneshot`]).
    pub fn supervises_here(&self) -> bool {
        self.group.is_none()
            && self.quota.is_none()
            && self
                .session
                .as_ref()
                .is_none_or(|s| s.view_only().is_some())
    }

    /// Runs one command under a supervisor forked from this process (`podhost tool`, see
    /// [`oneshot`]): no supervisor program, no async runtime. Only for a single-threaded process and an
    /// executor that [`supervises_here`](Self::supervises_here); otherwise an error that says
    /// to use [`execute`](Self::execute).
    pub fn execute_here(&self, req: ExecRequest) -> Result<oneshot::OneShot, ExecError> {
        if !self.supervises_here() {
            return Err(ExecError::Supervisor {
                message: "this executor's commands run in a session or are watched (a cgroup, \
                          a disk quota): run them with Executor::execute"
                    .to_owned(),
            });
        }
        let view = self.session.as_ref().and_then(|s| s.view_only());
        oneshot::execute(&self.config, view, req)
    }

    /// The same executor with another confinement policy.
    pub fn with_confinement(mut self, confinement: Confinement) -> Self {
        self.confinement = std::sync::Arc::new(confinement);
        self
    }

    pub fn config(&self) -> &ExecConfig {
        &self.config
    }

    /// The confinement policy; a toolbox turns it into rules for its workspace.
    pub fn confinement(&self) -> &Confinement {
        &self.confinement
    }

    /// Runs one command to its end: it exited, timed out or was cancelled, and every process it
    /// started is gone (or, if the supervisor itself failed, was killed from here). A command
    /// that ran and failed is an `Ok` with its exit code; `Err` is a fault of the executor.
    ///
    /// Await it from an async task, not inside `spawn_blocking`: the supervisor's parent-death
    /// signal is tied to the thread that spawns it, and blocking-pool threads exit when idle.
    pub async fn execute(&self, mut req: ExecRequest) -> Result<ExecOutput, ExecError> {
        let oom_before = self.group.as_ref().map(|g| g.oom_kills());
        let session = self.session.as_deref();
        let Some(quota) = self.quota.clone() else {
            let out = spawn::execute(&self.config, session, req).await;
            return self.oom_or(out, oom_before);
        };
        let measure = |q: Arc<quota::DiskQuota>| async move {
            tokio::task::spawn_blocking(move || q.measure())
                .await
                .unwrap_or_default()
        };
        let at_start = measure(quota.clone()).await;
        // No one file may take more than the room left (none at all for a session already
        // over, which may still delete): the kernel holds that between two measurements.
        req.file_size_cap = Some(quota.bytes().saturating_sub(at_start.bytes));
        let outer = req.cancel.clone();
        let stop = outer.child_token();
        req.cancel = stop.clone();
        let mut over = None;
        let watch = async {
            loop {
                tokio::time::sleep(quota::POLL).await;
                let now = measure(quota.clone()).await;
                // Past the quota and still growing: a command that deletes may run on.
                if quota.exceeded_by(now) && now.bytes > at_start.bytes {
                    return now;
                }
            }
        };
        let run = spawn::execute(&self.config, session, req);
        tokio::pin!(run, watch);
        let ended = tokio::select! {
            ended = &mut run => ended,
            usage = &mut watch => {
                over = Some(usage);
                stop.cancel();
                run.await
            }
        };
        let mut out = self.oom_or(ended, oom_before)?;
        match over {
            Some(usage) if !outer.is_cancelled() => {
                out.cancelled = false;
                out.exit_code = EXIT_STOPPED;
                out.limit_note = Some(quota.stopped_message(usage));
            }
            _ => {
                let after = measure(quota.clone()).await;
                if quota.exceeded_by(after) && out.limit_note.is_none() {
                    out.limit_note = Some(quota.over_message(after));
                }
            }
        }
        Ok(out)
    }

    /// The command's end, saying so when the session's memory limit killed a process during
    /// it. A supervisor that died without reporting while the session's memory limit killed
    /// processes was killed for the command's memory (the kernel picks any process of the
    /// group, and the commands' are the ones it prefers): that is the command's end, exit 137,
    /// never a fault of podhost's — a command must not be able to make its host look broken.
    fn oom_or(
        &self,
        ended: Result<ExecOutput, ExecError>,
        before: Option<u64>,
    ) -> Result<ExecOutput, ExecError> {
        let (Some(group), Some(before)) = (&self.group, before) else {
            return ended;
        };
        if group.oom_kills() <= before {
            return ended;
        }
        let note = format!(
            "A process was killed: the session reached its memory limit{}.",
            group
                .memory_limit()
                .map_or_else(String::new, |b| format!(" ({} MiB)", b >> 20))
        );
        match ended {
            Ok(mut out) => {
                out.limit_note = Some(note);
                Ok(out)
            }
            Err(ExecError::Supervisor { .. }) => Ok(ExecOutput {
                exit_code: 128 + libc::SIGKILL,
                stdout: Captured::default(),
                stderr: Captured::default(),
                timed_out: false,
                cancelled: false,
                limit_note: Some(note),
            }),
            Err(e) => Err(e),
        }
    }
}

/// One command to run.
#[derive(Clone, Debug)]
pub struct ExecRequest {
    pub command: String,
    pub cwd: PathBuf,
    /// Variables of this call, on top of the executor's environment.
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    pub cancel: CancellationToken,
    /// Characters of each stream the caller keeps (head and tail halves).
    pub stream_chars: usize,
    /// The command's confinement (a toolbox's rules for its workspace).
    pub confine: protocol::Confine,
    /// The largest file this command may write, when smaller than the executor's limit (the
    /// room left in a measured disk quota); set by the executor.
    pub file_size_cap: Option<u64>,
    /// Where the output goes while the command runs (a background command, read in pieces);
    /// the [`ExecOutput`]'s streams are then empty. `None`: captured for the output.
    pub live: Option<Arc<LiveOutput>>,
}

/// One captured stream, already cut to the requested size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Captured {
    /// Valid text: the first and last halves with the omission marker between them when cut.
    pub text: String,
    /// Characters left out of the middle.
    pub omitted_chars: u64,
    /// Bytes that were not UTF-8 (or were NUL) and were replaced with U+FFFD.
    pub replaced: u64,
}

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutput {
    /// The shell's exit code; 128+N for a signal; 124 on timeout; 130 on cancellation.
    pub exit_code: i32,
    pub stdout: Captured,
    pub stderr: Captured,
    pub timed_out: bool,
    pub cancelled: bool,
    /// A limit of the session the command met (its memory limit, its disk quota), in words
    /// for the caller; with [`EXIT_STOPPED`] when podhost stopped the command for it.
    pub limit_note: Option<String>,
}

/// A fault of the executor itself (the command could not be started or watched).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The command cannot be run (empty, a NUL, too long); the message is for the caller.
    #[error("{0}")]
    InvalidCommand(String),
    #[error("could not start the command supervisor {path}: {source}")]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the working directory {0} does not exist")]
    NoCwd(PathBuf),
    /// The supervisor ran but could not start the shell (missing shell, arguments too large).
    #[error("could not start the command: {message}")]
    Start { message: String },
    /// The supervisor ended without reporting how the command ended (it crashed or was killed).
    #[error("the command supervisor failed: {message}")]
    Supervisor { message: String },
    /// The session holder could not make the session's namespaces or view.
    #[error("could not start the command session: {message}")]
    Session { message: String },
    #[error("could not watch the command: {0}")]
    Io(#[from] std::io::Error),
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_supervisor_beside_podhost_must_be_an_executable_file() {
        let dir = tempfile::tempdir().unwrap();
        let me = dir.path().join("podhost");
        let beside = dir.path().join(SUPERVISOR_BIN);
        assert_eq!(supervisor_beside(&me), None, "nothing there");
        std::fs::create_dir(&beside).unwrap();
        assert_eq!(supervisor_beside(&me), None, "a directory");
        std::fs::remove_dir(&beside).unwrap();
        std::fs::write(&beside, "").unwrap();
        std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(supervisor_beside(&me), None, "not executable");
        std::fs::set_permissions(&beside, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(supervisor_beside(&me), Some(beside));
    }
}
