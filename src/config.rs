//! The command line and environment, parsed and validated into what each front needs.
//!
//! Every setting is a flag with an environment variable (clap `env = …`), so one binary serves a
//! pod, a CI test and a laptop. Parsing is pure; building the runtime pieces (a [`Toolbox`], an
//! executor) is a separate step that may touch the file system.

use std::path::{Path, PathBuf};

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand};

use crate::exec::confine::{Confinement, Settings};
use crate::exec::protocol::CommandUser;
use crate::exec::{BaseEnv, CommandEnv, ExecConfig, Executor, ResourceLimits};
use crate::floor::workspace::Workspace;
use crate::tools::Toolbox;

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

/// A credential given on the command line or in the environment; `Debug` never shows it.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// `podhost serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The address to listen on. Without a credential only a loopback address is allowed.
    #[arg(long, env = "PODHOST_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// The data directory: the session store and one workspace per session.
    #[arg(long, env = "PODHOST_DATA", default_value = "./podhost-data")]
    pub data: PathBuf,
    /// The credential callers send as `Authorization: Bearer …` (prefer the environment or a
    /// file: a flag shows in the process list).
    #[arg(long, env = "PODHOST_TOKEN", hide_env_values = true)]
    pub token: Option<Secret>,
    /// A file holding the credential (surrounding whitespace ignored).
    #[arg(long, env = "PODHOST_TOKEN_FILE", conflicts_with = "token")]
    pub token_file: Option<PathBuf>,
    /// Most turns running at once; past it, submit answers 409 and the caller retries.
    #[arg(long, env = "PODHOST_MAX_RUNNING", default_value_t = 32,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_running: u32,
    /// Seconds a finished session (and its workspace) is kept.
    #[arg(long, env = "PODHOST_RETENTION_SECS", default_value_t = 86_400)]
    pub retention_secs: u64,
    /// Seconds a turn interrupted by a restart waits for a retried submit to bring a fresh key
    /// before it is reported failed.
    #[arg(long, env = "PODHOST_ORPHAN_GRACE_SECS", default_value_t = 30)]
    pub orphan_grace_secs: u64,
    /// Model calls one submission may make before its turn is stopped as failed.
    #[arg(long, env = "PODHOST_MAX_STEPS", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_steps: u32,
    /// Attempts per model call (429, 5xx and transport errors are retried with backoff).
    #[arg(long, env = "PODHOST_MODEL_ATTEMPTS", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=20))]
    pub model_attempts: u32,
    #[command(flatten)]
    pub exec: ExecArgs,
}

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
    #[command(flatten)]
    pub confine: ConfineArgs,
}

/// How commands and file tools are confined (see `exec::confine`).
#[derive(Clone, Debug, Args)]
pub struct ConfineArgs {
    /// Confine commands and file tools with Landlock where the kernel has it: on or off.
    #[arg(long, env = "PODHOST_CONFINE", default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub confine: bool,
    /// Refuse to start unless commands and file tools can be confined (a kernel with Landlock).
    #[arg(long, env = "PODHOST_REQUIRE_CONFINEMENT", value_parser = BoolishValueParser::new())]
    pub require_confinement: bool,
    /// Deny commands the network: no socket but AF_UNIX (BYOH and local modes; a pod's egress
    /// goes through its proxy instead).
    #[arg(long, env = "PODHOST_DENY_NETWORK", value_parser = BoolishValueParser::new())]
    pub deny_network: bool,
    /// Paths commands and file tools may not reach, beyond podhost's own state (repeat the
    /// flag, or separate them with `:` in the environment).
    #[arg(
        long = "confine-deny",
        env = "PODHOST_CONFINE_DENY",
        value_delimiter = ':'
    )]
    pub confine_deny: Vec<PathBuf>,
    /// A private directory for commands' temporary files (`TMPDIR`); `/tmp` is then read-only.
    #[arg(long, env = "PODHOST_TMP_DIR")]
    pub tmp_dir: Option<PathBuf>,
    /// When podhost runs as root: the user commands run as (a name, or `uid[:gid]`), with no
    /// supplementary groups.
    #[arg(long, env = "PODHOST_COMMAND_USER", value_parser = command_user)]
    pub command_user: Option<CommandUser>,
    /// Testing only: use at most this Landlock ABI (0 behaves as a kernel without Landlock).
    #[arg(long, env = "PODHOST_LANDLOCK_ABI_MAX", hide = true)]
    pub landlock_abi_max: Option<u8>,
}

impl ConfineArgs {
    /// The settings, with the command user dropped (and a warning) unless podhost is root.
    pub fn settings(&self) -> Settings {
        let user = self.command_user.filter(|_| {
            let root = nix::unistd::geteuid().is_root();
            if !root {
                tracing::warn!("PODHOST_COMMAND_USER is ignored: podhost is not running as root");
            }
            root
        });
        Settings {
            enabled: self.confine,
            require: self.require_confinement,
            deny_network: self.deny_network,
            hidden: self.confine_deny.clone(),
            tmp: self.tmp_dir.clone(),
            user,
            abi_max: self.landlock_abi_max,
        }
    }

    /// The confinement policy these settings give.
    pub fn confinement(&self) -> Confinement {
        Confinement::new(&self.settings())
    }
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

/// `uid[:gid]` (the gid defaults to the uid), or a user name (its primary group).
fn command_user(s: &str) -> Result<CommandUser, String> {
    let number = |v: &str| {
        v.parse::<u32>()
            .map_err(|_| format!("{v:?} is not a uid or gid"))
    };
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        let (uid, gid) = match s.split_once(':') {
            Some((u, g)) => (number(u)?, number(g)?),
            None => (number(s)?, number(s)?),
        };
        if uid == 0 {
            return Err("the command user must not be root".to_owned());
        }
        return Ok(CommandUser { uid, gid });
    }
    match nix::unistd::User::from_name(s) {
        Ok(Some(u)) if u.uid.is_root() => Err("the command user must not be root".to_owned()),
        Ok(Some(u)) => Ok(CommandUser {
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        }),
        Ok(None) => Err(format!("no user named {s:?}")),
        Err(e) => Err(format!("could not look up the user {s:?}: {e}")),
    }
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

/// An executor for the podhost binary at `supervisor`, confined as `args` say. A front hides its
/// own state on top (`Executor::with_confinement`, `Confinement::hide`).
pub fn executor(args: &ExecArgs, supervisor: PathBuf, env: CommandEnv) -> Executor {
    Executor::new(ExecConfig {
        supervisor,
        shell: find_shell(args.shell.as_deref()),
        env,
        limits: args.limits(),
    })
    .with_confinement(args.confine.confinement())
}

/// The toolbox of a local workspace (`podhost tool`, `podhost run`): paths are host paths.
pub fn local_toolbox(workspace: &Path, args: &ExecArgs) -> Result<Toolbox, ConfigError> {
    let ws = Workspace::new(workspace, None).map_err(|e| ConfigError::Invalid {
        name: "--workspace",
        message: format!("{}: {e}", workspace.display()),
    })?;
    let supervisor = crate::exec::find_supervisor().map_err(ConfigError::CurrentExe)?;
    if let Some(tmp) = &args.confine.tmp_dir {
        std::fs::create_dir_all(tmp).map_err(|e| ConfigError::Invalid {
            name: "--tmp-dir",
            message: format!("{}: {e}", tmp.display()),
        })?;
    }
    let base = BaseEnv {
        home: ws.root().to_path_buf(),
        ..BaseEnv::default()
    };
    let exec = executor(args, supervisor, CommandEnv::new(base, None));
    Ok(Toolbox::new(ws, exec))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn command_users_parse_and_root_is_refused() {
        assert_eq!(
            command_user("65534"),
            Ok(CommandUser {
                uid: 65534,
                gid: 65534
            })
        );
        assert_eq!(
            command_user("1000:100"),
            Ok(CommandUser {
                uid: 1000,
                gid: 100
            })
        );
        assert_eq!(
            command_user("nobody"),
            Ok(CommandUser {
                uid: 65534,
                gid: 65534
            })
        );
        for (bad, message) in [
            ("0", "the command user must not be root"),
            ("root", "the command user must not be root"),
            ("12x", "\"12x\" is not a uid or gid"),
            ("no-such-user-here", "no user named \"no-such-user-here\""),
        ] {
            assert_eq!(command_user(bad), Err(message.to_owned()), "{bad}");
        }
    }

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
        let s = cli.command.exec_args().unwrap().confine.settings();
        assert_eq!(
            (s.enabled, s.deny_network, s.hidden),
            (false, true, vec![PathBuf::from("/a"), PathBuf::from("/b")])
        );
    }
}
