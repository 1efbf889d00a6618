//! [`Toolbox`]: the tools bound to one workspace (and, where a front offers them, a session's
//! background processes), and [`ToolboxBuilder`], the one way a front makes them.
//!
//! Owns: the executor and confinement rules of one workspace, the per-file locks, and the threads
//! file tools run on (each confined to the workspace's rules before it touches a file).
//!
//! On a pod or BYOH host ([`Confinement::isolation`]) a toolbox is also a session: its commands
//! run in the session's namespaces (a holder started at the first command), its cgroup, as its
//! uid (one per BYOH session when podhost is root; the file tools take it as their file-system
//! identity) and under its disk quota; and the modes of podhost's state are checked after each
//! command.
//!
//! Invariants:
//! * Every front builds its toolboxes with a [`ToolboxBuilder`], so commands and file tools get
//!   the same shell, limits, supervisor and confinement policy wherever they run.
//! * A confined file call runs on a fresh thread that restricts itself first; a pooled thread is
//!   never restricted.
//! * A workspace whose sandbox could not be made (no uid, a cgroup the host refuses) gets no
//!   toolbox at all: the front hears the [`SandboxError`], never a toolbox with less isolation
//!   nor one whose calls fail as if a tool had.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::background::{self, Jobs};
use super::{ToolError, ToolName, ToolOutcome, bash, codes, edit, glob, grep, parse, read, write};
use crate::exec::confine::{Confinement, WorkspaceRules};
use crate::exec::env::Egress;
use crate::exec::sandbox::{OverlaySpec, Sandbox, SandboxError, SandboxSpec};
use crate::exec::{BaseEnv, CommandEnv, ExecConfig, ExecSettings, Executor, find_shell};
use crate::floor::locks::FileLocks;
use crate::floor::workspace::Workspace;

/// Makes the toolboxes of one front: every workspace gets the same shell, limits, supervisor and
/// confinement policy (the front's own state hidden), and commands the same environment.
#[derive(Clone, Debug)]
pub struct ToolboxBuilder {
    settings: ExecSettings,
    supervisor: PathBuf,
    confinement: Confinement,
    egress: Option<Egress>,
    /// The base environment of commands; `None` for the clean one with `HOME` = the workspace.
    base_env: Option<BaseEnv>,
    one_at_a_time: bool,
}

impl ToolboxBuilder {
    /// Commands run under `supervisor` (see `exec::find_supervisor`), as `settings` say.
    pub fn new(settings: &ExecSettings, supervisor: PathBuf) -> Self {
        let mut confine = settings.confine.clone();
        // The supervisor binary is also the session holder and the namespace probe.
        confine.helper.get_or_insert_with(|| supervisor.clone());
        ToolboxBuilder {
            confinement: Confinement::new(&confine),
            settings: settings.clone(),
            supervisor,
            egress: None,
            base_env: None,
            one_at_a_time: false,
        }
    }

    /// Changes the front-wide policy (hides the front's state, allows a file back).
    pub fn confine(mut self, f: impl FnOnce(Confinement) -> Confinement) -> Self {
        self.confinement = f(self.confinement);
        self
    }

    /// Commands get the egress proxy's variables and CA bundle (a pod).
    pub fn egress(mut self, egress: Egress) -> Self {
        self.egress = Some(egress);
        self
    }

    /// Commands start from `base` (local use: the user's own environment and `HOME`, see
    /// `BaseEnv::inherited`) instead of the clean base with `HOME` = the workspace.
    pub fn base_env(mut self, base: BaseEnv) -> Self {
        self.base_env = Some(base);
        self
    }

    /// The front-wide confinement policy.
    pub fn confinement(&self) -> &Confinement {
        &self.confinement
    }

    /// Commands of each toolbox run one at a time (a pod's workspace, v2 notes §7.3: core's
    /// `workspace.exec`, the turns and the setup share it).
    pub fn one_command_at_a_time(mut self) -> Self {
        self.one_at_a_time = true;
        self
    }

    /// Runs `f`, a reader of `workspace` outside any toolbox (a viewer of a session's files),
    /// where a file tool of that workspace runs: on a thread confined to the workspace's rules,
    /// so a symlink or a directory swapped in while it reads cannot lead it outside. The
    /// thread's grants are read-only: a reader never writes. Where each session's files belong
    /// to a uid of its own (the pool), the reader takes the identity of the workspace's owner,
    /// as that session's file tools do. `prepare`, if any, runs first on that thread, before it
    /// is confined (a view mounted for the thread alone); its error is the call's.
    pub async fn confined_reader<T, F>(
        &self,
        workspace: &Workspace,
        what: &'static str,
        prepare: Option<Prepare>,
        f: F,
    ) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let mut rules = self.confinement.for_workspace(workspace);
        read_only(&mut rules);
        if self.uid_pool().is_some() && rules.command.user.is_none() {
            use std::os::unix::fs::MetadataExt;
            let owner = std::fs::metadata(workspace.root()).map_err(|e| ToolError::Setup {
                what,
                message: format!("{}: {e}", workspace.root().display()),
            })?;
            rules.command.user = Some(crate::exec::protocol::CommandUser {
                uid: owner.uid(),
                gid: owner.gid(),
            })
            .filter(|u| u.uid != 0);
        }
        on_confined_thread(rules, Enter::Prepare(prepare), what, f).await
    }

    /// The toolbox of `workspace`. Commands get `HOME` = the workspace root unless a base
    /// environment was given; with `private_tmp`, their own temporary directory (`TMPDIR`),
    /// `/tmp` then read-only.
    pub fn build(
        &self,
        workspace: Workspace,
        private_tmp: Option<&Path>,
    ) -> Result<Toolbox, SandboxError> {
        self.build_as(workspace, private_tmp, None)
    }

    /// The uid pool sessions' commands run from, when there is one (a root BYOH host).
    pub fn uid_pool(&self) -> Option<crate::exec::confine::users::UidRange> {
        self.confinement
            .isolation()
            .and_then(|iso| iso.uid_pool.as_ref())
            .map(|pool| pool.range())
    }

    /// [`build`](Self::build), with the session's uid from the pool already chosen (`uid`: by
    /// the store, which hands out the pool's uids) rather than by this process.
    pub fn build_as(
        &self,
        workspace: Workspace,
        private_tmp: Option<&Path>,
        uid: Option<u32>,
    ) -> Result<Toolbox, SandboxError> {
        self.build_over(workspace, private_tmp, uid, None)
    }

    /// [`build_as`](Self::build_as), the workspace an overlay of a template when `overlay`
    /// says so (see `exec::overlay`).
    pub fn build_over(
        &self,
        workspace: Workspace,
        private_tmp: Option<&Path>,
        uid: Option<u32>,
        overlay: Option<OverlaySpec<'_>>,
    ) -> Result<Toolbox, SandboxError> {
        let base = self.base_env.clone().unwrap_or_else(|| BaseEnv {
            home: workspace.root().to_path_buf(),
            ..BaseEnv::default()
        });
        let config = ExecConfig {
            supervisor: self.supervisor.clone(),
            shell: find_shell(self.settings.shell.as_deref()),
            env: CommandEnv::new(base, self.egress.clone()),
            limits: self.settings.limits.clone(),
        };
        let spec = SandboxSpec {
            workspace: &workspace,
            private_tmp,
            uid,
            overlay,
        };
        let Sandbox { executor, rules } = Sandbox::for_workspace(config, &self.confinement, spec)?;
        Ok(Toolbox::with_rules(
            workspace,
            executor,
            rules,
            self.one_at_a_time,
        ))
    }
}

/// Per-call facts a front passes to a tool: cancellation and the call's own environment.
#[derive(Clone, Debug, Default)]
pub struct CallContext {
    /// Cancelled when the run, session or request that owns the call is cancelled.
    pub cancel: CancellationToken,
    /// Variables for commands of this call only (`TRACEPARENT`, the session's environment).
    pub env: Vec<(String, String)>,
}

impl CallContext {
    pub fn new(cancel: CancellationToken) -> Self {
        CallContext {
            cancel,
            env: Vec::new(),
        }
    }
}

/// The tools bound to one workspace. Cheap to clone; share one per workspace so that edits to a
/// file serialize on one lock and, where the front asks for it, commands run one at a time.
#[derive(Clone)]
pub struct Toolbox {
    inner: Arc<ToolboxInner>,
    /// The session's background processes, where the front offers them (see
    /// [`with_background`](Self::with_background)); `None` refuses them.
    jobs: Option<Jobs>,
}

struct ToolboxInner {
    workspace: Workspace,
    executor: Executor,
    locks: FileLocks,
    /// The executor's confinement made concrete for this workspace.
    rules: WorkspaceRules,
    /// Held by a running command when commands run one at a time (a pod's workspace, v2 notes
    /// §7.3); `None` lets them run side by side.
    commands: Option<tokio::sync::Mutex<()>>,
}

impl fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Toolbox")
            .field("workspace", &self.inner.workspace)
            .finish()
    }
}

impl Toolbox {
    /// The tools of `workspace`, confined as `executor`'s policy says (see `exec::confine`);
    /// commands run side by side.
    pub fn new(workspace: Workspace, executor: Executor) -> Self {
        Toolbox::with_commands(workspace, executor, false)
    }

    fn with_commands(workspace: Workspace, executor: Executor, one_at_a_time: bool) -> Self {
        let rules = executor.confinement().for_workspace(&workspace);
        Toolbox::with_rules(workspace, executor, rules, one_at_a_time)
    }

    fn with_rules(
        workspace: Workspace,
        executor: Executor,
        rules: WorkspaceRules,
        one_at_a_time: bool,
    ) -> Self {
        Toolbox {
            inner: Arc::new(ToolboxInner {
                workspace,
                executor,
                locks: FileLocks::default(),
                rules,
                commands: one_at_a_time.then(|| tokio::sync::Mutex::new(())),
            }),
            jobs: None,
        }
    }

    /// The same tools, with `bash`'s `run_in_background`, `bash_output` and `bash_kill` running
    /// the session's background processes in `jobs` (whose end kills them: the front ends it
    /// with its session).
    pub fn with_background(mut self, jobs: Jobs) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// The session's background processes, when this toolbox offers them.
    pub fn background(&self) -> Option<&Jobs> {
        self.jobs.as_ref()
    }

    pub fn workspace(&self) -> &Workspace {
        &self.inner.workspace
    }

    pub fn executor(&self) -> &Executor {
        &self.inner.executor
    }

    pub fn locks(&self) -> &FileLocks {
        &self.inner.locks
    }

    /// The confinement rules of this workspace's commands and file tools.
    pub fn rules(&self) -> &WorkspaceRules {
        &self.inner.rules
    }

    /// The one entry for a sandbox call, whatever the front. The front parsed the model's name
    /// into a [`ToolName`] where it arrived, and answered an unknown one itself (see
    /// [`unknown_tool`]): only podhost's own reach a toolbox.
    ///
    /// Input that does not match the tool's schema and a call cancelled before it ran are
    /// failed outcomes the model can act on; `Err` is a fault of podhost. Where
    /// commands run one at a time, a command waits here for the one before it (or for its
    /// cancellation).
    pub async fn call(
        &self,
        tool: ToolName,
        input: &Value,
        ctx: &CallContext,
    ) -> Result<ToolOutcome, ToolError> {
        let started = std::time::Instant::now();
        let result = self.dispatch(tool, input, ctx).await;
        crate::floor::metrics::tool_call(tool.as_str(), metric_outcome(&result), started.elapsed());
        result
    }

    /// A `bash` call under a supervisor forked from this process (see `exec::oneshot`):
    /// `podhost tool bash` in a single-threaded process, without an async runtime. `None` when
    /// this toolbox's commands cannot run that way (they run in a session, or are watched by a
    /// cgroup or a quota): then use [`call`](Self::call). Beside the outcome, the signal that
    /// stopped the command, if one did.
    pub fn bash_here(
        &self,
        input: &Value,
        ctx: &CallContext,
    ) -> Option<(
        Result<ToolOutcome, ToolError>,
        Option<nix::sys::signal::Signal>,
    )> {
        if !self.inner.executor.supervises_here() || self.inner.commands.is_some() {
            return None;
        }
        if ctx.cancel.is_cancelled() {
            let cancelled =
                ToolOutcome::failed(codes::CANCELLED, "The call was cancelled before it ran.");
            return Some((Ok(cancelled), None));
        }
        let input = match parse(ToolName::Bash, input) {
            Ok(i) => i,
            Err(refused) => return Some((Ok(refused), None)),
        };
        let ended = bash::execute_here(self, input, ctx);
        let guards = self.inner.executor.confinement().guards();
        if !guards.is_empty()
            && let Err(e) = crate::exec::confine::state::check(guards)
        {
            tracing::error!(error = %e, "podhost's state is exposed and could not be repaired");
        }
        Some(ended)
    }

    async fn dispatch(
        &self,
        tool: ToolName,
        input: &Value,
        ctx: &CallContext,
    ) -> Result<ToolOutcome, ToolError> {
        let cancelled =
            || ToolOutcome::failed(codes::CANCELLED, "The call was cancelled before it ran.");
        if ctx.cancel.is_cancelled() {
            return Ok(cancelled());
        }
        if matches!(tool, ToolName::Write | ToolName::Edit)
            && let Some(refused) = self.over_quota()
        {
            return Ok(refused);
        }
        match tool {
            ToolName::Bash => {
                let (input, in_background) = match &self.jobs {
                    Some(_) => match background::split_input(input) {
                        Ok(split) => split,
                        Err(o) => return Ok(o),
                    },
                    None => (std::borrow::Cow::Borrowed(input), false),
                };
                let input = match parse(tool, &input) {
                    Ok(i) => i,
                    Err(o) => return Ok(o),
                };
                if let Some(jobs) = self.jobs.as_ref().filter(|_| in_background) {
                    return Ok(background::start(self, jobs, input, ctx));
                }
                let _one_at_a_time = match &self.inner.commands {
                    Some(lock) => tokio::select! {
                        held = lock.lock() => Some(held),
                        () = ctx.cancel.cancelled() => return Ok(cancelled()),
                    },
                    None => None,
                };
                let outcome = bash::execute(self, input, ctx).await;
                self.check_state().await;
                outcome
            }
            ToolName::Read => self.blocking(tool, input, ctx, read::read).await,
            ToolName::Write => {
                let outcome = self.blocking(tool, input, ctx, write::write).await?;
                self.host_disk_or(outcome)
            }
            ToolName::Edit => {
                let outcome = self.blocking(tool, input, ctx, edit::edit).await?;
                self.host_disk_or(outcome)
            }
            ToolName::Grep => self.blocking(tool, input, ctx, grep::search).await,
            ToolName::Glob => self.blocking(tool, input, ctx, glob::find).await,
            ToolName::BashOutput | ToolName::BashKill => {
                let Some(jobs) = &self.jobs else {
                    return Ok(no_background());
                };
                let input = match parse(tool, input) {
                    Ok(i) => i,
                    Err(o) => return Ok(o),
                };
                Ok(match tool {
                    ToolName::BashKill => background::kill(jobs, input).await,
                    _ => background::output(jobs, input),
                })
            }
        }
    }

    /// A write that failed (its disk full, or an I/O error) when the session has a disk of its
    /// own: its image is sparse, so the disk may fail because the host's is full (the sessions'
    /// quotas together may exceed it), not because the session used its quota. That is a fault
    /// of the host, never the model's to read: below [`HOST_DISK_RESERVE`] free where the
    /// images live, the failed write is the host's fault.
    fn host_disk_or(&self, outcome: ToolOutcome) -> Result<ToolOutcome, ToolError> {
        // Full (ENOSPC), or the write-back into a backing file that could not grow (EIO).
        let full = matches!(&outcome, ToolOutcome::Failed { code, .. }
            if code == codes::QUOTA_EXCEEDED || code == codes::WRITE_FAILED);
        let Some(dir) = self
            .inner
            .executor
            .disk_image()
            .and_then(Path::parent)
            .filter(|_| full)
        else {
            return Ok(outcome);
        };
        let free = nix::sys::statvfs::statvfs(dir)
            .map(|v| v.blocks_available().saturating_mul(v.fragment_size()))
            .unwrap_or(u64::MAX);
        if free >= HOST_DISK_RESERVE {
            return Ok(outcome);
        }
        Err(ToolError::HostDiskFull {
            dir: dir.to_path_buf(),
            free_mib: free >> 20,
        })
    }

    /// The refusal of a `write` or `edit` while the session is past its disk quota (as last
    /// measured, after its latest command).
    fn over_quota(&self) -> Option<ToolOutcome> {
        let quota = self.inner.executor.quota()?;
        let usage = quota.last().filter(|u| quota.exceeded_by(*u))?;
        Some(ToolOutcome::failed(
            codes::QUOTA_EXCEEDED,
            quota.refused_message(usage),
        ))
    }

    /// Checks (and repairs) the modes of podhost's own state after a command, which could have
    /// changed them (see `exec::confine::state`).
    async fn check_state(&self) {
        let guards = self.inner.executor.confinement().guards().to_vec();
        if guards.is_empty() {
            return;
        }
        let checked =
            tokio::task::spawn_blocking(move || crate::exec::confine::state::check(&guards)).await;
        if let Ok(Err(e)) = checked {
            tracing::error!(error = %e, "podhost's state is exposed and could not be repaired");
        }
    }

    /// Holds the command lock (when commands run one at a time) while `f` runs, so that no
    /// command runs beside it; `None` when `cancel` fired first.
    pub(super) async fn without_commands<T>(
        &self,
        cancel: &CancellationToken,
        f: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let _held = match &self.inner.commands {
            Some(lock) => tokio::select! {
                held = lock.lock() => Some(held),
                () = cancel.cancelled() => return None,
            },
            None => None,
        };
        Some(f.await)
    }

    /// Runs a file tool off the async workers: they do plain file-system I/O.
    async fn blocking<I, F>(
        &self,
        tool: ToolName,
        input: &Value,
        ctx: &CallContext,
        f: F,
    ) -> Result<ToolOutcome, ToolError>
    where
        I: DeserializeOwned + Send + 'static,
        F: FnOnce(&Toolbox, I, &CancellationToken) -> ToolOutcome + Send + 'static,
    {
        let parsed: I = match parse(tool, input) {
            Ok(i) => i,
            Err(o) => return Ok(o),
        };
        let this = self.clone();
        let cancel = ctx.cancel.clone();
        self.confined_with(self.inner.rules.clone(), tool.as_str(), move || {
            f(&this, parsed, &cancel)
        })
        .await
    }

    /// Runs `f` where a file tool runs: confined to the workspace's rules, with `writable`
    /// directories (which must exist) also writable — the skills root, which the tools may only
    /// read. Every direct file operation of a front goes through here.
    pub async fn confined<T, F>(
        &self,
        what: &'static str,
        writable: &[&Path],
        f: F,
    ) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let mut rules = self.inner.rules.clone();
        if let Some(files) = &mut rules.files {
            for dir in writable {
                let dir = crate::exec::confine::canonical_lenient(dir);
                if !files.write.contains(&dir) {
                    files.write.push(dir);
                }
            }
        }
        self.confined_with(rules, what, f).await
    }

    /// Runs `f` where a file tool runs, as [`Toolbox::confined`] does, but with nothing
    /// writable: a reader of the session's files (the viewer's) while its turn runs.
    pub async fn confined_read<T, F>(&self, what: &'static str, f: F) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let mut rules = self.inner.rules.clone();
        read_only(&mut rules);
        self.confined_with(rules, what, f).await
    }

    /// Runs `f` on a thread confined by `rules`.
    ///
    /// Confined, each call gets a fresh thread that joins the session's mount namespace when its
    /// files live there alone (its own disk), then restricts itself with the Landlock rules (and
    /// takes the command user's file-system identity, if any) before it touches the file
    /// system (Landlock binds a thread and the threads it spawns, such as grep's walkers; a
    /// pooled thread must never be restricted, since it would carry the rules into unrelated
    /// work). Unconfined, the blocking pool is enough.
    async fn confined_with<T, F>(
        &self,
        rules: WorkspaceRules,
        what: &'static str,
        f: F,
    ) -> Result<T, ToolError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let setup = |message: String| ToolError::Setup { what, message };
        // Where the session's files live in its own mount namespace, the call joins it.
        let namespace = self
            .inner
            .executor
            .files_namespace()
            .await
            .map_err(|e| setup(format!("could not reach the session's files: {e}")))?;
        let enter = namespace.map_or(Enter::Prepare(None), Enter::Namespace);
        on_confined_thread(rules, enter, what, f).await
    }
}

/// What a reader's thread does first, before it is confined ([`ToolboxBuilder::confined_reader`]).
pub type Prepare = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// Where a confined thread goes before it is confined.
enum Enter {
    /// Into the session's mount namespace, where its files live.
    Namespace(std::os::fd::OwnedFd),
    /// What a reader asks for, if anything.
    Prepare(Option<Prepare>),
}

/// Makes `rules` let a thread read what they let it write, and write nothing.
fn read_only(rules: &mut WorkspaceRules) {
    if let Some(files) = &mut rules.files {
        let write = std::mem::take(&mut files.write);
        files.read.extend(write);
    }
}

/// Runs `f` where a file tool runs: on the blocking pool when `rules` confine nothing and no
/// `namespace` is to be joined, else on a fresh thread that joins `namespace` and then
/// restricts itself by `rules` before `f` touches the file system. The one way every file
/// call, a toolbox's or a reader's without one ([`ToolboxBuilder::confined_reader`]), is run.
async fn on_confined_thread<T, F>(
    rules: WorkspaceRules,
    enter: Enter,
    what: &'static str,
    f: F,
) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let setup = |message: String| ToolError::Setup { what, message };
    let worker = |message: String| ToolError::Worker { what, message };
    // A pooled thread must never change its mounts either.
    if !rules.confines_files() && matches!(enter, Enter::Prepare(None)) {
        return tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| worker(e.to_string()));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("podhost-{what}"))
        .spawn(move || {
            let joined = match enter {
                Enter::Namespace(ns) => crate::exec::session::enter_mount_namespace(&ns)
                    .map_err(|e| format!("could not join the session's mount namespace: {e}")),
                Enter::Prepare(Some(prepare)) => prepare(),
                Enter::Prepare(None) => Ok(()),
            };
            // Err: the call could not be set up (nothing ran); Ok: what it returned.
            let result = joined.and_then(|()| {
                crate::exec::confine::confine_thread(&rules)
                    .map_err(|e| format!("could not confine the call: {e}"))
            });
            let _ = tx.send(result.map(|()| f()));
        })
        .map_err(|e| setup(format!("could not start a thread: {e}")))?;
    match rx.await {
        Ok(result) => result.map_err(setup),
        Err(_) => Err(worker("its thread ended without an answer".to_owned())),
    }
}

/// The refusal of `bash_output` or `bash_kill` where the front offers no background processes
/// (a pod, `podhost tool`).
fn no_background() -> ToolOutcome {
    ToolOutcome::failed(
        codes::INVALID_INPUT,
        "Background processes are not offered here: run commands with bash, each of which ends \
         with its call.",
    )
}

/// Free bytes below which a session's full disk is taken for the host's: a session's own image
/// fills with the host's disk when the host has less than this left.
pub const HOST_DISK_RESERVE: u64 = 64 << 20;

/// What the model is told when it calls a tool that does not exist: the tools it may call.
pub fn unknown_tool(name: &str, tools: &[&str]) -> ToolOutcome {
    let list = match tools {
        [] => "none".to_owned(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    };
    ToolOutcome::failed(
        crate::floor::codes::tool::UNKNOWN,
        format!("There is no tool named {name:?}. The tools are {list}."),
    )
}

/// A call's outcome as a metric label.
fn metric_outcome(result: &Result<ToolOutcome, ToolError>) -> &'static str {
    match result {
        Ok(ToolOutcome::Completed { .. }) => "completed",
        Ok(ToolOutcome::Failed { code, .. }) if code == codes::CANCELLED => "cancelled",
        Ok(ToolOutcome::Failed { .. }) => "failed",
        Err(_) => "error",
    }
}
