//! The local front's flags (`podhost tool`, `podhost run`), into a [`ToolConfig`] and a
//! [`RunConfig`].

use std::path::PathBuf;

use clap::Args;

use super::exec::ExecArgs;
use super::origins::Origins;
use super::tls::TlsArgs;
use crate::local::{RunConfig, ToolConfig};

/// `podhost run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The OpenAI-compatible base URL (requests go to `{base_url}/chat/completions`).
    #[arg(long)]
    pub base_url: String,
    /// The model name.
    #[arg(long)]
    pub model: String,
    /// The environment variable that holds the API key, if the model needs one.
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// The workspace directory.
    #[arg(long, default_value = ".")]
    pub workspace: PathBuf,
    /// The task for the agent.
    pub task: String,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
    /// Which settings were given as flags (filled in by `Cli::parse_args`).
    #[arg(skip)]
    pub origins: Origins,
}

#[derive(Debug, Args)]
pub struct ToolArgs {
    /// The tool: bash, read, write, edit, grep or glob.
    pub name: String,
    /// The tool's input as a JSON object, or `-` to read it from stdin.
    #[arg(long)]
    pub input: String,
    /// The workspace directory (relative paths resolve under it).
    #[arg(long, env = "PODHOST_WORKSPACE", default_value = ".")]
    pub workspace: PathBuf,
    #[command(flatten)]
    pub exec: ExecArgs,
}

impl RunArgs {
    /// The plain configuration; pure.
    pub fn config(&self) -> RunConfig {
        RunConfig {
            base_url: self.base_url.clone(),
            model: self.model.clone(),
            api_key_env: self.api_key_env.clone(),
            workspace: self.workspace.clone(),
            task: self.task.clone(),
            tls: self.tls.settings(&self.origins),
            exec: self.exec.settings(),
        }
    }
}

impl ToolArgs {
    /// The plain configuration; pure.
    pub fn config(&self) -> ToolConfig {
        ToolConfig {
            name: self.name.clone(),
            input: self.input.clone(),
            workspace: self.workspace.clone(),
            exec: self.exec.settings(),
        }
    }
}
