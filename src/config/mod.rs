//! The command line and environment, parsed and validated into what each front needs.
//!
//! Every setting is a flag with an environment variable (clap `env = …`), so one binary serves a
//! pod, a CI test and a laptop. The clap structs live here and only here; each converts into a
//! front's plain configuration (`byoh::ServeConfig`, `nylorun::host::settings::PodConfig`,
//! `local::RunConfig`, `local::ToolConfig`, with an `exec::ExecSettings`), purely. No front
//! imports this module.

mod exec;
mod local;
mod pod;
mod serve;

use clap::{Args, Parser, Subcommand};

pub use exec::{ConfineArgs, ExecArgs, Sessions};
pub use local::{RunArgs, ToolArgs};
pub use pod::{PodArgs, SettingsError};
pub use serve::ServeArgs;

#[derive(Debug, Parser)]
#[command(
    name = "podhost",
    version,
    about = "A sandboxed agent harness",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one workspace tool and print its outcome as JSON.
    Tool(ToolArgs),
    /// Serve the Oumi BYOH endpoint (submit, get_status, collect_output, cancel).
    Serve(ServeArgs),
    /// Run one agent task in a local workspace against an OpenAI-compatible model.
    Run(RunArgs),
    /// Be a Nylorun pod's harness: join core, serve the Harness API, lease runs.
    Pod(Box<PodArgs>),
    /// Ask the running pod host whether it is connected to core (a Kubernetes exec probe):
    /// exit 0 when it answers `connected: true`, 1 otherwise; with `--live`, exit 0 for any
    /// answer.
    Health(HealthArgs),
}

#[derive(Debug, Args)]
pub struct HealthArgs {
    /// The pod host's loopback health port.
    #[arg(long, env = "NYLORUN_HARNESS_HEALTH_PORT", default_value_t = 4300)]
    pub port: u16,
    /// How long to wait for the answer, in milliseconds.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// Succeed for any answer, connected or not (a liveness probe: a pod host that is up and
    /// reconnecting to core must not be restarted).
    #[arg(long)]
    pub live: bool,
}

impl Command {
    /// How this front runs commands (each front that runs tools answers).
    pub fn exec_args(&self) -> Option<&ExecArgs> {
        match self {
            Command::Tool(args) => Some(&args.exec),
            Command::Serve(args) => Some(&args.exec),
            Command::Run(args) => Some(&args.exec),
            Command::Pod(args) => Some(&args.exec),
            // A probe runs no command.
            Command::Health(_) => None,
        }
    }

    /// Whether this front runs for long (and so reports its confinement at `info`).
    pub fn is_long_running(&self) -> bool {
        match self {
            Command::Tool(_) | Command::Run(_) | Command::Health(_) => false,
            Command::Serve(_) | Command::Pod(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::path::PathBuf;

    #[test]
    fn confinement_flags_parse_from_the_environment_names() {
        let cli = Cli::try_parse_from([
            "podhost",
            "tool",
            "bash",
            "--input",
            "{}",
            "--confine",
            "off",
            "--deny-network",
            "--confine-deny",
            "/a",
            "--confine-deny",
            "/b",
        ])
        .unwrap();
        let s = cli.command.exec_args().unwrap().settings().confine;
        assert_eq!(
            (s.enabled, s.deny_network, s.hidden),
            (false, true, vec![PathBuf::from("/a"), PathBuf::from("/b")])
        );
    }
}
