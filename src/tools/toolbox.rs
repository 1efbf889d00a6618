//! [`Toolbox`]: the six tools bound to one workspace, and [`ToolboxBuilder`], the one way a front
//! makes them.
//!
//! Owns: the executor and confinement rules of one workspace, the per-file locks, and the threads
//! file tools run on (each confined to the workspace's rules before it touches a file).
//!
//! Invariants:
//! * Every front builds its toolboxes with a [`ToolboxBuilder`], so commands and file tools get
//!   the same shell, limits, supervisor and confinement policy wherever they run.
//! * A confined file call runs on a fresh thread that restricts itself first; a pooled thread is
//!   never restricted.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{ToolError, ToolName, ToolOutcome, bash, codes, edit, glob, grep, parse, read, write};
use crate::exec::confine::{Confinement, WorkspaceRules};
use crate::exec::env::Egress;
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
}

impl ToolboxBuilder {
    /// Commands run under `supervisor` (see `exec::find_supervisor`), as `settings` say.
    pub fn new(settings: &ExecSettings, supervisor: PathBuf) -> Self {
        ToolboxBuilder {
            confinement: Confinement::new(&settings.confine),
            settings: settings.clone(),
            supervisor,
            egress: None,
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

    /// The front-wide confinement policy.
    pub fn confinement(&self) -> &Confinement {
        &self.confinement
    }

    /// The toolbox of `workspace`. Commands get `HOME` = the workspace root; with `private_tmp`,
    /// their own temporary directory (`TMPDIR`), `/tmp` then read-only.
    pub fn build(&self, workspace: Workspace, private_tmp: Option<&Path>) -> Toolbox {
        let base = BaseEnv {
            home: workspace.root().to_path_buf(),
            ..BaseEnv::default()
        };
        let executor = Executor::new(ExecConfig {
            supervisor: self.supervisor.clone(),
            shell: find_shell(self.settings.shell.as_deref()),
            env: CommandEnv::new(base, self.egress.clone()),
            limits: self.settings.limits.clone(),
        });
        let confinement = match private_tmp {
            Some(tmp) => self.confinement.clone().private_tmp(tmp),
            None => self.confinement.clone(),
        };
        Toolbox::new(workspace, executor.with_confinement(confinement))
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
/// file serialize on one lock.
#[derive(Clone)]
pub struct Toolbox {
    inner: Arc<ToolboxInner>,
}

struct ToolboxInner {
    workspace: Workspace,
    executor: Executor,
    locks: FileLocks,
    /// The executor's confinement made concrete for this workspace.
    rules: WorkspaceRules,
}

impl fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Toolbox")
            .field("workspace", &self.inner.workspace)
            .finish()
    }
}

impl Toolbox {
    /// The tools of `workspace`, confined as `executor`'s policy says (see `exec::confine`).
    pub fn new(workspace: Workspace, executor: Executor) -> Self {
        let rules = executor.confinement().for_workspace(&workspace);
        Toolbox {
            inner: Arc::new(ToolboxInner {
                workspace,
                executor,
                locks: FileLocks::default(),
                rules,
            }),
        }
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

    /// Runs one tool call. Input that does not match the tool's schema is a failed outcome.
    pub async fn run(
        &self,
        tool: ToolName,
        input: &Value,
        ctx: &CallContext,
    ) -> Result<ToolOutcome, ToolError> {
        if ctx.cancel.is_cancelled() {
            return Ok(ToolOutcome::failed(
                codes::CANCELLED,
                "The call was cancelled before it ran.",
            ));
        }
        match tool {
            ToolName::Bash => match parse(tool, input) {
                Ok(i) => bash::run(self, i, ctx).await,
                Err(o) => Ok(o),
            },
            ToolName::Read => self.blocking(tool, input, ctx, read::run).await,
            ToolName::Write => self.blocking(tool, input, ctx, write::run).await,
            ToolName::Edit => self.blocking(tool, input, ctx, edit::run).await,
            ToolName::Grep => self.blocking(tool, input, ctx, grep::run).await,
            ToolName::Glob => self.blocking(tool, input, ctx, glob::run).await,
        }
    }

    /// Runs a file tool off the async workers: they do plain file-system I/O.
    ///
    /// Confined, each call gets a fresh thread that restricts itself with the workspace's
    /// Landlock rules (and takes the command user's file-system identity, if any) before it
    /// touches the file system (Landlock binds a thread and the threads
    /// it spawns, such as grep's walkers; a pooled thread must never be restricted, since it
    /// would carry the rules into unrelated work). Unconfined, the blocking pool is enough.
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
        let worker = |message: String| ToolError::Worker { tool, message };
        if !self.inner.rules.confines_files() {
            return tokio::task::spawn_blocking(move || f(&this, parsed, &cancel))
                .await
                .map_err(|e| worker(e.to_string()));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("podhost-{tool}"))
            .spawn(move || {
                let result = crate::exec::confine::confine_thread(this.rules())
                    .map(|()| f(&this, parsed, &cancel))
                    .map_err(|e| format!("could not confine the call: {e}"));
                let _ = tx.send(result);
            })
            .map_err(|e| worker(format!("could not start a thread: {e}")))?;
        match rx.await {
            Ok(result) => result.map_err(worker),
            Err(_) => Err(worker(
                "the tool's thread ended without an answer".to_owned(),
            )),
        }
    }
}
