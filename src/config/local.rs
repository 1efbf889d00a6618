//! The local front's flags (`podhost tool`, `podhost run`), into a [`ToolConfig`] and a
//! [`RunConfig`].

use std::path::PathBuf;

use clap::Args;

use super::exec::ExecArgs;
use super::serve::ModelLimitsArgs;
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
    /// Model calls the task may make before it is stopped as failed.
    #[arg(long, env = "PODHOST_MAX_STEPS", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_steps: u32,
    #[command(flatten)]
    pub limits: ModelLimitsArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
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
            max_steps: self.max_steps,
            limits: self.limits.limits(),
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
