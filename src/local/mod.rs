//! The local front: `podhost tool` runs one tool, `podhost run` one agent task, `podhost mcp`
//! serves the tools to an MCP client — for the person at the keyboard, in a local workspace.
//!
//! * [`tool`]: one tool call, its outcome as JSON on stdout.
//! * [`run`]: one agent task with an output contract (activity on stderr, the answer alone on
//!   stdout, or a JSON Lines event stream, [`events`]), exit codes a script can trust
//!   (`floor::codes::exit`), the conventions of model clients (`OPENAI_API_KEY`,
//!   `OPENAI_BASE_URL`, a task from stdin, `AGENTS.md`).
//! * [`mcp`]: the tools over the Model Context Protocol, on stdio or streamable HTTP.
//!
//! Owns: the toolbox of a local workspace ([`toolbox`]) and the [`Stop`] the binary's signal
//! handlers fire.
//!
//! Invariants:
//! * Commands run as the user would run them: they inherit the user's environment and `HOME`
//!   (`exec::BaseEnv::inherited`), minus every variable that looks like a credential unless it
//!   is passed by name (`--env NAME`), and never the model's API key. Confinement stays:
//!   writable are the workspace, the temporary directory and each `--allow-write` directory;
//!   the rest of the system, `HOME` included, is readable only.
//! * A stop (Ctrl-C, SIGTERM) cancels what is in flight — a model call or a command, whose whole
//!   process tree is killed — before the front returns.
//!
//! Non-goals: anything durable (the transcript lives in memory; `podhost serve` keeps sessions).

pub mod events;
pub mod mcp;
mod observe;
mod render;
pub mod run;
pub mod tool;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::exec::env::Withheld;
use crate::exec::{BaseEnv, ExecSettings};
use crate::floor::codes::exit;
use crate::floor::workspace::Workspace;
use crate::tools::{ToolError, Toolbox, ToolboxBuilder};

pub use mcp::McpConfig;
pub use run::RunConfig;
pub use tool::ToolConfig;

/// Why a local command could not run.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    /// Bad input or configuration: nothing ran (exit 2).
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Model(#[from] crate::chat::client::ModelError),
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("could not make the workspace's sandbox: {0}")]
    Sandbox(#[from] crate::exec::sandbox::SandboxError),
}

/// How commands of local use get their environment and where they may write, besides the
/// workspace and the temporary directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalEnv {
    /// Variables passed to commands although their names look like credentials (`--env`).
    pub pass: Vec<String>,
    /// Directories commands and the file tools may also write (`--allow-write`).
    pub allow_write: Vec<PathBuf>,
}

/// The signal that stopped a local command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    /// SIGINT (Ctrl-C).
    Interrupt,
    /// SIGTERM.
    Terminate,
}

impl StopSignal {
    /// 128 + the signal's number, as shells report it.
    pub fn exit_code(self) -> i32 {
        match self {
            StopSignal::Interrupt => exit::INTERRUPTED,
            StopSignal::Terminate => exit::TERMINATED,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Interrupt => "SIGINT",
            StopSignal::Terminate => "SIGTERM",
        }
    }
}

/// A local command's stop: a cancellation token and the signal that fired it. The binary
/// listens for the signals before the command starts and fires this.
#[derive(Clone, Debug, Default)]
pub struct Stop {
    token: CancellationToken,
    by: Arc<OnceLock<StopSignal>>,
}

impl Stop {
    pub fn new() -> Self {
        Stop::default()
    }

    /// Stops the command; the first signal is the one reported. Returns false when it was
    /// already stopped.
    pub fn stop(&self, signal: StopSignal) -> bool {
        let first = self.by.set(signal).is_ok();
        self.token.cancel();
        first
    }

    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// The signal that stopped the command, if one did.
    pub fn signal(&self) -> Option<StopSignal> {
        self.by.get().copied()
    }

    /// A stop that SIGINT or SIGTERM fires, listened for on the current tokio runtime (the
    /// command's whole process tree is then killed and it exits 130 or 143); a second signal
    /// exits the process at once.
    pub fn on_signals() -> std::io::Result<Stop> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &str| {
            signal(kind)
                .map_err(|e| std::io::Error::new(e.kind(), format!("listening for {name}: {e}")))
        };
        let mut int = listen(SignalKind::interrupt(), "SIGINT")?;
        let mut term = listen(SignalKind::terminate(), "SIGTERM")?;
        let stop = Stop::new();
        let on_signal = stop.clone();
        tokio::spawn(async move {
            loop {
                let which = tokio::select! {
                    Some(()) = int.recv() => StopSignal::Interrupt,
                    Some(()) = term.recv() => StopSignal::Terminate,
                    else => return,
                };
                if !on_signal.stop(which) {
                    std::process::exit(which.exit_code());
                }
            }
        });
        Ok(stop)
    }
}

/// The exit code of a local command (`command`: `tool`, `run`, `mcp`): its own code when it ran,
/// else 2 for bad input or configuration (nothing ran) and 1 for a fault of podhost, with the
/// error on stderr.
pub fn exit_code(command: &str, result: Result<i32, LocalError>) -> i32 {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("podhost {command}: {}", crate::floor::text::error_chain(&e));
            match e {
                LocalError::Usage(_) => exit::USAGE,
                _ => exit::FAILURE,
            }
        }
    }
}

/// The toolbox of a local workspace (paths are host paths) and the variable names its commands
/// do not get. Commands start from the user's own environment (see the module doc).
fn toolbox(
    workspace: &Path,
    exec: &ExecSettings,
    env: &LocalEnv,
) -> Result<(Toolbox, Withheld), LocalError> {
    let mut ws = Workspace::new(workspace, None)
        .map_err(|e| LocalError::Usage(format!("--workspace: {}: {e}", workspace.display())))?;
    for dir in &env.allow_write {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => ws = ws.with_root(dir, None, true),
            Ok(_) => {
                return Err(LocalError::Usage(format!(
                    "--allow-write {}: not a directory (name the directory to make writable)",
                    dir.display()
                )));
            }
            Err(e) => {
                return Err(LocalError::Usage(format!(
                    "--allow-write {}: {e}",
                    dir.display()
                )));
            }
        }
    }
    for name in &env.pass {
        if name.starts_with("PODHOST_") || name.starts_with("NYLORUN_") {
            return Err(LocalError::Usage(format!(
                "--env {name}: podhost's own variables are never given to commands"
            )));
        }
    }
    if let Some(tmp) = &exec.confine.tmp {
        std::fs::create_dir_all(tmp)
            .map_err(|e| LocalError::Usage(format!("--tmp-dir: {}: {e}", tmp.display())))?;
    }
    let supervisor = crate::exec::find_supervisor().map_err(|source| LocalError::Io {
        what: "could not find podhost's own executable".into(),
        source,
    })?;
    let (base, withheld) = BaseEnv::inherited(std::env::vars_os(), &env.pass);
    let toolbox = ToolboxBuilder::new(exec, supervisor)
        .base_env(base)
        .build(ws, None)?;
    Ok((toolbox, withheld))
}

/// One line saying which variables commands do not get, or `None` when none were held back.
fn withheld_note(withheld: &Withheld) -> Option<String> {
    let mut parts = Vec::new();
    if !withheld.credentials.is_empty() {
        parts.push(format!(
            "commands do not get {} (names that look like credentials; pass one with --env NAME)",
            withheld.credentials.join(", ")
        ));
    }
    if !withheld.unset.is_empty() {
        parts.push(format!("--env {}: not set", withheld.unset.join(", ")));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}
