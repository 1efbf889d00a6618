//! The command line and environment, parsed and validated into what each front needs.
//!
//! Every setting is a flag with an environment variable (clap `env = …`), so one binary serves a
//! pod, a CI test and a laptop. Parsing is pure; building the runtime pieces (a [`Toolbox`], an
//! executor) is a separate step that may touch the file system.

use std::path::{Path, PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::exec::{BaseEnv, CommandEnv, ExecConfig, Executor, ResourceLimits};
use crate::tools::Toolbox;
use crate::tools::paths::Workspace;

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
    /// Be a Nylorun pod's harness: join core, serve the Harness API, lease runs.
    Pod(Box<crate::nylorun::settings::PodArgs>),
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

/// How commands run: limits and the shell.
#[derive(Clone, Debug, Args)]
pub struct ExecArgs {
    /// Most open files per command (RLIMIT_NOFILE).
    #[arg(long, env = "PODHOST_LIMIT_OPEN_FILES", default_value_t = 4096)]
    pub limit_open_files: u64,
    /// Most processes of the command's user while it runs (RLIMIT_NPROC); 0 for no limit.
    #[arg(long, env = "PODHOST_LIMIT_PROCESSES", default_value_t = 4096)]
    pub limit_processes: u64,
    /// Largest file a command may write, in MiB (RLIMIT_FSIZE); 0 for no limit.
    #[arg(long, env = "PODHOST_LIMIT_FILE_SIZE_MB", default_value_t = 8192)]
    pub limit_file_size_mb: u64,
    /// CPU seconds per command (RLIMIT_CPU); 0 for no limit.
    #[arg(long, env = "PODHOST_LIMIT_CPU_SECONDS", default_value_t = 0)]
    pub limit_cpu_seconds: u64,
    /// The shell commands run with; default `bash`, or `sh` where bash is missing.
    #[arg(long, env = "PODHOST_SHELL")]
    pub shell: Option<PathBuf>,
}

impl ExecArgs {
    pub fn limits(&self) -> ResourceLimits {
        let nonzero = |v: u64| (v > 0).then_some(v);
        ResourceLimits {
            open_files: nonzero(self.limit_open_files),
            processes: nonzero(self.limit_processes),
            file_size: nonzero(self.limit_file_size_mb).map(|mb| mb.saturating_mul(1 << 20)),
            cpu_seconds: nonzero(self.limit_cpu_seconds),
        }
    }
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{name}: {message}")]
    Invalid { name: &'static str, message: String },
    #[error("could not find podhost's own executable: {0}")]
    CurrentExe(std::io::Error),
}

/// The shell to run commands with: `bash` on `PATH`-like locations, else `sh`.
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

/// An executor for the podhost binary at `supervisor`.
pub fn executor(args: &ExecArgs, supervisor: PathBuf, env: CommandEnv) -> Executor {
    Executor::new(ExecConfig {
        supervisor,
        shell: find_shell(args.shell.as_deref()),
        env,
        limits: args.limits(),
    })
}

/// The toolbox of a local workspace (`podhost tool`, `podhost run`): paths are host paths.
pub fn local_toolbox(workspace: &Path, args: &ExecArgs) -> Result<Toolbox, ConfigError> {
    let ws = Workspace::new(workspace, None).map_err(|e| ConfigError::Invalid {
        name: "--workspace",
        message: format!("{}: {e}", workspace.display()),
    })?;
    let supervisor = std::env::current_exe().map_err(ConfigError::CurrentExe)?;
    let base = BaseEnv {
        home: ws.root().to_path_buf(),
        ..BaseEnv::default()
    };
    let exec = executor(args, supervisor, CommandEnv::new(base, None));
    Ok(Toolbox::new(ws, exec))
}
