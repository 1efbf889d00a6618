//! The six workspace tools: `bash`, `read`, `write`, `edit`, `grep`, `glob`; and, where a front
//! offers background processes (`serve`, `run`, `mcp`; never a pod), `bash_output` and
//! `bash_kill`.
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
//! record budget (`nylorun::turn::shaping`).

pub mod background;
pub(crate) mod bash;
pub mod edit;
pub(crate) mod encoding;
pub(crate) mod files;
pub mod glob;
pub mod grep;
pub mod read;
pub(crate) mod walk;
pub mod write;

mod toolbox;

use std::fmt;
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::floor::workspace::PathError;

pub use crate::floor::codes::sandbox as codes;
pub use toolbox::{CallContext, Prepare, Toolbox, ToolboxBuilder, unknown_tool};

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
    /// Background processes' output (not a workspace tool: see [`ToolName::BACKGROUND`]).
    #[serde(rename = "bash_output")]
    BashOutput,
    /// Stops a background process.
    #[serde(rename = "bash_kill")]
    BashKill,
}

impl ToolName {
    /// The two tools of background processes, offered beside [`ALL`](Self::ALL) by the fronts
    /// that offer `bash`'s `run_in_background` (`serve`, `run`, `mcp`), never by a pod. Their
    /// names do not parse with [`FromStr`] (the pod's names): [`ToolName::offered`] does.
    pub const BACKGROUND: [ToolName; 2] = [ToolName::BashOutput, ToolName::BashKill];

    /// Every tool of a front that offers background processes.
    pub const WITH_BACKGROUND: [ToolName; 8] = [
        ToolName::Bash,
        ToolName::Read,
        ToolName::Write,
        ToolName::Edit,
        ToolName::Grep,
        ToolName::Glob,
        ToolName::BashOutput,
        ToolName::BashKill,
    ];

    /// The tool `name` names among those of a front that offers background processes.
    pub fn offered(name: &str) -> Option<ToolName> {
        ToolName::WITH_BACKGROUND
            .into_iter()
            .find(|t| t.as_str() == name)
    }

    /// The six workspace tools: a pod's.
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
            ToolName::BashOutput => "bash_output",
            ToolName::BashKill => "bash_kill",
        }
    }

    /// The model-facing definition: `{name, description, input_schema}` from `tools/<name>.json`.
    pub fn definition(self) -> &'static ToolDefinition {
        definitions::get(self)
    }

    /// The definition where background processes are not offered (a pod): `bash` without its
    /// `run_in_background` input; the others as [`definition`](Self::definition) says.
    pub fn definition_without_background(self) -> &'static ToolDefinition {
        definitions::without_background(self)
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

impl ToolError {
    /// Whether the call certainly did nothing: it failed before its command or file operation
    /// began (the supervisor or the session holder could not start, the call's thread could not
    /// be confined), so making it again is safe.
    pub fn nothing_ran(&self) -> bool {
        use crate::exec::ExecError;
        match self {
            ToolError::Exec { fault, .. } => matches!(
                fault,
                ExecError::Spawn { .. } | ExecError::Session { .. } | ExecError::NoCwd(_)
            ),
            ToolError::Setup { .. } | ToolError::HostDiskFull { .. } => true,
            ToolError::Worker { .. } => false,
        }
    }
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

/// A fault of the harness itself (not of the call): the front reports it as such — a failed
/// turn, an error of the protocol — never as a tool result the model reads.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The executor failed (`fault`: how; its text is in this one's, so it is no source).
    #[error("podhost could not run {tool}: {fault}")]
    Exec {
        tool: ToolName,
        fault: crate::exec::ExecError,
    },
    /// A file tool (`what` names it) or a direct file operation could not be set up where it
    /// runs (the session's files, its thread, its confinement): nothing ran.
    #[error("podhost could not start {what}: {message}")]
    Setup { what: &'static str, message: String },
    /// The thread of a file tool or of a direct file operation ended without an answer.
    #[error("podhost's {what} worker failed: {message}")]
    Worker { what: &'static str, message: String },
    /// A write found the session's disk full while its quota had room: the host's disk, where
    /// the sessions' (sparse) disk images live, is full. Nothing was written.
    #[error(
        "the host's disk is full ({free_mib} MiB left in {dir}), where the sessions' disks live"
    )]
    HostDiskFull {
        dir: std::path::PathBuf,
        free_mib: u64,
    },
}

/// Parses a tool's input, or explains to the model what is wrong with it, naming the field
/// (`timeout: invalid type: …`) unless the explanation already names it.
pub fn parse<I: DeserializeOwned>(tool: ToolName, input: &Value) -> Result<I, ToolOutcome> {
    serde_path_to_error::deserialize(input).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner().to_string();
        let named = inner.starts_with(&path) || inner.contains(&format!("`{path}`"));
        let message = if path == "." || named {
            inner
        } else {
            format!("{path}: {inner}")
        };
        ToolOutcome::failed(
            codes::INVALID_INPUT,
            format!("Invalid {tool} input: {message}."),
        )
    })
}

/// A model-facing tool definition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolDefinition {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    /// The JSON Schema of a completed call's output, for a tool whose output is always an
    /// object (MCP's `outputSchema`); models are not shown it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
}

pub mod definitions {
    //! The definitions in the top-level `tools/` directory, embedded at build time.
    use std::sync::OnceLock;

    use super::{ToolDefinition, ToolName};

    const SOURCES: [(ToolName, &str); 8] = [
        (ToolName::Bash, include_str!("../../tools/bash.json")),
        (ToolName::Read, include_str!("../../tools/read.json")),
        (ToolName::Write, include_str!("../../tools/write.json")),
        (ToolName::Edit, include_str!("../../tools/edit.json")),
        (ToolName::Grep, include_str!("../../tools/grep.json")),
        (ToolName::Glob, include_str!("../../tools/glob.json")),
        (
            ToolName::BashOutput,
            include_str!("../../tools/bash_output.json"),
        ),
        (
            ToolName::BashKill,
            include_str!("../../tools/bash_kill.json"),
        ),
    ];

    /// The input only fronts that offer background processes take.
    pub const BACKGROUND_INPUT: &str = "run_in_background";

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
                    output_schema: None,
                })
            })
    }

    /// `bash` without [`BACKGROUND_INPUT`], made once; the others unchanged.
    pub fn without_background(tool: ToolName) -> &'static ToolDefinition {
        static BASH: OnceLock<ToolDefinition> = OnceLock::new();
        if tool != ToolName::Bash {
            return get(tool);
        }
        BASH.get_or_init(|| {
            let mut def = get(tool).clone();
            if let Some(props) = def
                .input_schema
                .get_mut("properties")
                .and_then(|p| p.as_object_mut())
            {
                props.remove(BACKGROUND_INPUT);
            }
            def
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn only_bash_loses_its_background_input_where_none_is_offered() {
            let full = get(ToolName::Bash);
            let plain = without_background(ToolName::Bash);
            assert!(full.input_schema["properties"][BACKGROUND_INPUT].is_object());
            let mut expected = full.clone();
            expected.input_schema["properties"]
                .as_object_mut()
                .unwrap()
                .remove(BACKGROUND_INPUT);
            assert_eq!(plain, &expected);
            assert!(!plain.description.contains(BACKGROUND_INPUT));
            for t in ToolName::ALL.into_iter().skip(1) {
                assert_eq!(without_background(t), get(t));
            }
        }

        #[test]
        fn every_definition_parses_and_names_its_tool() {
            for (name, src) in SOURCES {
                let def: ToolDefinition = serde_json::from_str(src).unwrap();
                assert_eq!(def.name, name.as_str());
                assert_eq!(def.input_schema["type"], "object", "{name}");
                assert_eq!(def.input_schema["additionalProperties"], false, "{name}");
                assert!(!def.description.is_empty());
                if let Some(output) = &def.output_schema {
                    assert_eq!(output["type"], "object", "{name}");
                    assert_eq!(output["additionalProperties"], false, "{name}");
                }
            }
        }
    }
}
