//! The six workspace tools: `bash`, `read`, `write`, `edit`, `grep`, `glob`.
//!
//! Owns: the [`Toolbox`] every front calls, the [`ToolOutcome`] wire shape, input parsing, and the
//! model-facing definitions embedded from the top-level `tools/` directory.
//!
//! Invariants:
//! * A tool that ran and failed (no match, not unique, exit code ≠ 0, a path outside the roots)
//!   returns an outcome; `Err` means the harness itself failed.
//! * Every path goes through [`crate::floor::workspace::Workspace::resolve`]: relative paths resolve under the
//!   workspace, and symlinks or `..` that leave the allowed roots are refused.
//! * Every output is bounded and valid JSON text, whatever the files or commands hold.
//!
//! Non-goals: deciding *whether* a tool may run (the fronts and core decide), shaping results to a
//! record budget (`agent::shaping`).

pub mod bash;
pub mod edit;
pub mod encoding;
pub mod glob;
pub mod grep;
pub mod read;
pub mod walk;
pub mod write;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::exec::Executor;
use crate::exec::confine::WorkspaceRules;
use crate::floor::locks::FileLocks;
use crate::floor::workspace::{PathError, Workspace};

/// The tools podhost runs in a workspace, by their wire names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolName {
    Bash,
    Read,
    Write,
    Edit,
    Grep,
    Glob,
}

impl ToolName {
    pub const ALL: [ToolName; 6] = [
        ToolName::Bash,
        ToolName::Read,
        ToolName::Write,
        ToolName::Edit,
        ToolName::Grep,
        ToolName::Glob,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ToolName::Bash => "bash",
            ToolName::Read => "read",
            ToolName::Write => "write",
            ToolName::Edit => "edit",
            ToolName::Grep => "grep",
            ToolName::Glob => "glob",
        }
    }

    /// The model-facing definition: `{name, description, input_schema}` from `tools/<name>.json`.
    pub fn definition(self) -> &'static ToolDefinition {
        definitions::get(self)
    }
}

impl fmt::Display for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ToolName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ToolName::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| {
                format!("unknown tool {s:?}; the tools are bash, read, write, edit, grep, glob")
            })
    }
}

/// What a tool call produced, as it crosses every wire (Nylorun's `SandboxToolOutcome`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ToolOutcome {
    /// The tool ran. `output` is a string (read, grep, glob) or an object (bash, write, edit).
    Completed { output: Value },
    /// The tool ran and failed: a `sandbox.*` code and a message the model can act on.
    Failed {
        code: String,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retryable: Option<bool>,
    },
}

impl ToolOutcome {
    pub fn completed(output: impl Into<Value>) -> Self {
        ToolOutcome::Completed {
            output: output.into(),
        }
    }

    pub fn failed(code: &str, message: impl Into<String>) -> Self {
        ToolOutcome::Failed {
            code: code.to_owned(),
            message: message.into(),
            retryable: None,
        }
    }

    pub fn is_completed(&self) -> bool {
        matches!(self, ToolOutcome::Completed { .. })
    }
}

/// The `sandbox.*` failure codes podhost reports. The first group is Nylorun's own (v2 notes §7);
/// the rest name failures that runtime folded into `sandbox.error`.
pub mod codes {
    pub const NOT_FOUND: &str = "sandbox.not_found";
    pub const EDIT_NO_MATCH: &str = "sandbox.edit_no_match";
    pub const EDIT_NOT_UNIQUE: &str = "sandbox.edit_not_unique";
    pub const EDIT_NOOP: &str = "sandbox.edit_noop";
    pub const WRITE_FAILED: &str = "sandbox.write_failed";
    pub const GREP_FAILED: &str = "sandbox.grep_failed";
    pub const START_FAILED: &str = "sandbox.start_failed";
    pub const ERROR: &str = "sandbox.error";
    /// The input does not match the tool's schema.
    pub const INVALID_INPUT: &str = "sandbox.invalid_input";
    /// The path leaves the allowed roots, or names a read-only root for a write.
    pub const PATH_DENIED: &str = "sandbox.path_denied";
    /// The file holds NUL bytes (and no UTF-16 byte-order mark).
    pub const BINARY_FILE: &str = "sandbox.binary_file";
    /// A directory (or a device, FIFO, socket) where a regular file was expected.
    pub const NOT_A_FILE: &str = "sandbox.not_a_file";
    /// A file or result past a size limit.
    pub const TOO_LARGE: &str = "sandbox.too_large";
    /// The edit cannot be written back in the file's own encoding without loss.
    pub const ENCODING: &str = "sandbox.encoding";
    /// The call was cancelled before it could finish.
    pub const CANCELLED: &str = "sandbox.cancelled";
}

impl From<PathError> for ToolOutcome {
    /// A refused path is a failed outcome the model can act on; an I/O fault while resolving is
    /// `sandbox.error`.
    fn from(e: PathError) -> Self {
        let code = match e {
            PathError::Io { .. } => codes::ERROR,
            PathError::Empty | PathError::Nul(_) => codes::INVALID_INPUT,
            _ => codes::PATH_DENIED,
        };
        ToolOutcome::failed(code, e.to_string())
    }
}

/// A fault of the harness itself (not of the call): the front reports it as such.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{tool} could not run")]
    Exec {
        tool: ToolName,
        #[source]
        source: crate::exec::ExecError,
    },
    #[error("{tool} worker failed: {message}")]
    Worker { tool: ToolName, message: String },
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

/// Parses a tool's input, or explains to the model what is wrong with it.
pub fn parse<I: DeserializeOwned>(tool: ToolName, input: &Value) -> Result<I, ToolOutcome> {
    I::deserialize(input).map_err(|e| {
        ToolOutcome::failed(codes::INVALID_INPUT, format!("Invalid {tool} input: {e}."))
    })
}

/// A model-facing tool definition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDefinition {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

pub mod definitions {
    //! The definitions in the top-level `tools/` directory, embedded at build time.
    use std::sync::OnceLock;

    use super::{ToolDefinition, ToolName};

    const SOURCES: [(ToolName, &str); 6] = [
        (ToolName::Bash, include_str!("../../tools/bash.json")),
        (ToolName::Read, include_str!("../../tools/read.json")),
        (ToolName::Write, include_str!("../../tools/write.json")),
        (ToolName::Edit, include_str!("../../tools/edit.json")),
        (ToolName::Grep, include_str!("../../tools/grep.json")),
        (ToolName::Glob, include_str!("../../tools/glob.json")),
    ];

    static PARSED: OnceLock<Vec<(ToolName, ToolDefinition)>> = OnceLock::new();

    fn all() -> &'static [(ToolName, ToolDefinition)] {
        PARSED.get_or_init(|| {
            SOURCES
                .iter()
                .filter_map(|(name, src)| {
                    serde_json::from_str::<ToolDefinition>(src)
                        .ok()
                        .map(|d| (*name, d))
                })
                .collect()
        })
    }

    /// The definition of `tool`. The files are checked by the test below, so every tool has one.
    pub fn get(tool: ToolName) -> &'static ToolDefinition {
        static FALLBACK: OnceLock<ToolDefinition> = OnceLock::new();
        all()
            .iter()
            .find(|(n, _)| *n == tool)
            .map(|(_, d)| d)
            .unwrap_or_else(|| {
                FALLBACK.get_or_init(|| ToolDefinition {
                    name: String::new(),
                    description: String::new(),
                    input_schema: serde_json::json!({"type": "object"}),
                })
            })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn every_definition_parses_and_names_its_tool() {
            for (name, src) in SOURCES {
                let def: ToolDefinition = serde_json::from_str(src).unwrap();
                assert_eq!(def.name, name.as_str());
                assert_eq!(def.input_schema["type"], "object", "{name}");
                assert_eq!(def.input_schema["additionalProperties"], false, "{name}");
                assert!(!def.description.is_empty());
            }
        }
    }
}
