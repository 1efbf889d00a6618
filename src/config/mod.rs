//! The command line and environment, parsed and validated into what each front needs.
//!
//! Every setting is a flag with an environment variable (clap `env = …`), so one binary serves a
//! pod, a CI test and a laptop. The clap structs live here and only here; each converts into a
//! front's plain configuration (`byoh::ServeConfig`, `nylorun::host::settings::PodConfig`,
//! `local::RunConfig`, `local::ToolConfig`, `local::McpConfig`, with an `exec::ExecSettings`),
//! purely (`podhost run` reads the `OPENAI_*` variables through a function it is given). No
//! front imports this module. [`startup`] is what the binaries do before a front runs (logging,
//! the confinement report), and the whole of a `podhost tool` process.

mod exec;
mod http;
mod local;
mod origins;
mod pod;
mod serve;
pub mod startup;
mod tls;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

pub use exec::{BackgroundArgs, ConfineArgs, ExecArgs, Sessions};
pub use http::HttpArgs;
pub use local::{LocalEnvArgs, McpArgs, RunArgs, ToolArgs};
pub use origins::Origins;
pub use pod::{PodArgs, SettingsError};
pub use serve::{ModelLimitsArgs, ServeArgs};
pub use tls::TlsArgs;

/// `podhost --version`: the package version and the git revision it was built from.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("BUILD_GIT_REVISION"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "podhost",
    version = VERSION,
    about = "A sandboxed agent harness",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses `args` (the first is the program name), noting which settings came as flags so
    /// that errors name them as given. A clap error about a value from an environment variable
    /// names the variable; `--help` and `--version` are errors too, as with clap.
    pub fn parse_args(args: Vec<std::ffi::OsString>) -> Result<Cli, ParseError> {
        if args.get(1).is_some_and(|a| a == "tool") {
            return Cli::parse_tool(&args).map(|tool| Cli {
                command: Command::Tool(tool),
            });
        }
        let command = command();
        let matches = command
            .clone()
            .try_get_matches_from(&args)
            .map_err(|e| ParseError::new(e, &command, &args))?;
        let mut cli =
            Cli::from_arg_matches(&matches).map_err(|e| ParseError::new(e, &command, &args))?;
        if let Some((name, sub)) = matches.subcommand()
            && let Some(def) = command.find_subcommand(name)
        {
            cli.command.set_origins(Origins::from_matches(def, sub));
        }
        Ok(cli)
    }
}

impl Cli {
    /// `podhost tool …`: only the `tool` subcommand is built and parsed (building the whole
    /// command line costs a one-shot call more than its command), with the same names, help and
    /// errors as in the whole tree; the plainest calls skip even that ([`ToolArgs::plain`]).
    /// `args[1]` is `tool`. The `podhost` binary calls this alone, so the rest of the tree is
    /// not even linked into it.
    pub fn parse_tool(args: &[std::ffi::OsString]) -> Result<ToolArgs, ParseError> {
        if let Some(tool) = ToolArgs::plain(args, |name| std::env::var_os(name).is_some()) {
            return Ok(tool);
        }
        let command = shaped(ToolCli::command());
        let matches = command
            .clone()
            .try_get_matches_from(args)
            .map_err(|e| ParseError::new(e, &command, args))?;
        let ToolCli {
            command: ToolOnly::Tool(tool),
        } = ToolCli::from_arg_matches(&matches).map_err(|e| ParseError::new(e, &command, args))?;
        Ok(tool)
    }
}

/// [`Cli`] with the `tool` subcommand alone (see [`Cli::parse_tool`]); its attributes repeat
/// `Cli`'s and `Command::Tool`'s.
#[derive(Debug, Parser)]
#[command(
    name = "podhost",
    version = VERSION,
    about = "A sandboxed agent harness",
    propagate_version = true
)]
struct ToolCli {
    #[command(subcommand)]
    command: ToolOnly,
}

#[derive(Debug, Subcommand)]
enum ToolOnly {
    /// Run one workspace tool and print its outcome as JSON.
    Tool(ToolArgs),
}

/// A command line clap refused, or `--help`/`--version`.
#[derive(Debug)]
pub struct ParseError {
    /// What to print, worded to name the flag or variable the user gave.
    pub message: String,
    /// Whether it goes to stdout (help, version) with exit 0, or to stderr with exit 2.
    pub is_error: bool,
    error: clap::Error,
}

impl ParseError {
    fn new(error: clap::Error, command: &clap::Command, args: &[std::ffi::OsString]) -> Self {
        ParseError {
            message: origins::reword(&error, command, args),
            is_error: error.use_stderr(),
            error,
        }
    }

    /// Prints the message (in colour where clap would) and exits as clap does.
    pub fn exit(self) -> ! {
        if self.message == self.error.render().to_string() {
            self.error.exit()
        }
        eprint!("{}", self.message);
        std::process::exit(self.error.exit_code())
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one workspace tool and print its outcome as JSON.
    Tool(ToolArgs),
    /// Serve the Oumi BYOH endpoint (submit, get_status, collect_output, cancel).
    Serve(Box<ServeArgs>),
    /// Run one agent task in a local workspace against an OpenAI-compatible model.
    ///
    /// Activity goes to stderr and the answer to stdout (or JSON Lines events to stdout with
    /// --json); the exit code is 0 only with an answer.
    Run(Box<RunArgs>),
    /// Serve the six tools over the Model Context Protocol on a local workspace.
    ///
    /// Over stdio, or streamable HTTP at `/mcp` with --listen.
    Mcp(McpArgs),
    /// Be a Nylorun pod's harness: join core, serve the Harness API, lease runs.
    Pod(Box<PodArgs>),
    /// Ask the running pod host whether it is connected to core (a Kubernetes exec probe).
    ///
    /// Exit 0 when it answers `connected: true`, 1 otherwise; with `--live`, exit 0 for any
    /// answer.
    Health(HealthArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish or powershell) for podhost.
    Completions(CompletionsArgs),
    /// Print podhost's man page (podhost.1) to stdout, or, with --dir, write it and one per
    /// subcommand into a directory.
    Man(ManArgs),
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write podhost.1 and a page per subcommand (podhost-serve.1, …) into this directory
    /// (created if missing), and list them; without it, podhost.1 goes to stdout.
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

/// Help wraps at the terminal's width, and at most this many columns.
const HELP_WIDTH: usize = 100;

/// Settings that only a host serving others (a pod, a BYOH host) uses: hidden from the help and
/// completions of the local fronts, which accept and ignore them.
const HOST_ONLY: [&str; 6] = [
    "limit_memory_mb",
    "cpu_weight",
    "namespaces",
    "session_network",
    "session_allow_networks",
    "uid_pool",
];

/// Settings that only the local fronts use, hidden from `serve` and `pod`.
const LOCAL_ONLY: [&str; 1] = ["read_only_system"];

/// podhost's whole command line, as parsed, helped, completed and paged.
fn command() -> clap::Command {
    shaped(Cli::command())
}

/// `cli` with its help width and each subcommand's flags for other fronts hidden.
fn shaped(cli: clap::Command) -> clap::Command {
    let hide = |mut sub: clap::Command, ids: &[&str]| {
        for id in ids {
            if sub.get_arguments().any(|a| a.get_id() == id) {
                sub = sub.mut_arg(*id, |a| a.hide(true));
            }
        }
        sub
    };
    let names: Vec<String> = cli
        .get_subcommands()
        .map(|s| s.get_name().to_owned())
        .collect();
    let mut cli = cli.max_term_width(HELP_WIDTH);
    // Each one, in order: `mut_subcommand` moves the one it changes to the end.
    for name in names {
        let ids: &[&str] = match name.as_str() {
            "serve" | "pod" => &LOCAL_ONLY,
            "tool" | "run" | "mcp" => &HOST_ONLY,
            _ => &[],
        };
        cli = cli.mut_subcommand(name, |sub| hide(sub, ids));
    }
    cli
}

/// `cmd` without its hidden flags and subcommands, for a completion script: clap's generators
/// offer what `--help` hides.
fn visible(cmd: &clap::Command) -> clap::Command {
    let mut out = clap::Command::new(cmd.get_name().to_owned())
        .about(cmd.get_about().cloned().unwrap_or_default())
        .version(VERSION)
        .disable_help_flag(true)
        .disable_version_flag(true)
        .disable_help_subcommand(true)
        .args(cmd.get_arguments().filter(|a| !a.is_hide_set()).cloned());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        out = out.subcommand(visible(sub));
    }
    out
}

/// Writes the completion script of `shell` for podhost's whole command line to `out`.
pub fn completions(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    let mut cli = command();
    cli.build();
    clap_complete::generate(shell, &mut visible(&cli), "podhost", out);
}

/// Writes podhost's own page, `podhost.1`, to `out`.
pub fn man_page(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    clap_mangen::Man::new(command().version(VERSION)).render(out)
}

/// Writes `podhost.1` and a page per visible subcommand (`podhost-serve.1`, …) into `dir`;
/// returns the files written.
pub fn man_pages(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let cli = command().version(VERSION);
    let mut written = Vec::new();
    let mut write = |name: String, cmd: clap::Command| -> std::io::Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut file = std::fs::File::create(&path)?;
        clap_mangen::Man::new(cmd).render(&mut file)?;
        written.push(path);
        Ok(())
    };
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("podhost-{}", sub.get_name());
        write(name.clone(), sub.clone().name(name).version(VERSION))?;
    }
    write("podhost".to_owned(), cli)?;
    Ok(written)
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
            Command::Mcp(args) => Some(&args.exec),
            Command::Pod(args) => Some(&args.exec),
            // A probe, completions and man pages run no command.
            Command::Health(_) | Command::Completions(_) | Command::Man(_) => None,
        }
    }

    /// Notes which settings were given as flags (see [`Origins`]).
    fn set_origins(&mut self, origins: Origins) {
        match self {
            Command::Serve(args) => args.origins = origins,
            Command::Run(args) => args.origins = origins,
            Command::Pod(args) => args.origins = origins,
            Command::Mcp(args) => args.origins = origins,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::path::PathBuf;

    fn args(a: &[&str]) -> Vec<std::ffi::OsString> {
        a.iter().map(|s| s.into()).collect()
    }

    #[test]
    fn the_tool_subcommand_alone_helps_and_refuses_as_in_the_whole_tree() {
        let help = |mut c: clap::Command| {
            c.build();
            c.find_subcommand_mut("tool")
                .unwrap()
                .render_long_help()
                .to_string()
        };
        assert_eq!(help(shaped(ToolCli::command())), help(command()));
        for bad in [
            &["podhost", "tool", "bash"][..],
            &["podhost", "tool", "bash", "--input", "{}", "--bogus"],
            &["podhost", "tool", "--help"],
            &["podhost", "tool", "--version"],
        ] {
            let alone = Cli::parse_args(args(bad)).unwrap_err();
            let whole = command().try_get_matches_from(args(bad)).unwrap_err();
            assert_eq!(
                (alone.message, alone.is_error),
                (whole.render().to_string(), whole.use_stderr()),
                "{bad:?}"
            );
        }
        let cli = Cli::parse_args(args(&["podhost", "tool", "read", "--input", "{}"])).unwrap();
        let Command::Tool(tool) = cli.command else {
            panic!("not tool")
        };
        assert_eq!((tool.name.as_str(), tool.input.as_str()), ("read", "{}"));
    }

    /// The command lines `ToolArgs::plain` takes become what clap makes of them, field for
    /// field; any other is left to clap, as is every one while a variable of the subcommand's
    /// is set.
    #[test]
    fn the_plainest_tool_command_lines_skip_clap_and_get_what_clap_gives() {
        let set: Vec<_> = local::TOOL_ENV
            .iter()
            .filter(|v| std::env::var_os(v).is_some())
            .collect();
        assert!(
            set.is_empty(),
            "this test compares against clap with {set:?} unset"
        );
        let by_clap = |line: &[&str]| {
            let matches = ToolCli::command().try_get_matches_from(args(line)).unwrap();
            let ToolCli {
                command: ToolOnly::Tool(tool),
            } = ToolCli::from_arg_matches(&matches).unwrap();
            format!("{tool:?}")
        };
        let mut plain_lines: Vec<Vec<&str>> = crate::tools::ToolName::ALL
            .iter()
            .map(|n| vec!["podhost", "tool", n.as_str(), "--input", r#"{"a":1}"#])
            .collect();
        plain_lines.extend([
            vec!["podhost", "tool", "bash", r#"--input={"command":"x=1"}"#],
            vec!["podhost", "tool", "read", "--input", "-"],
            vec![
                "podhost",
                "tool",
                "glob",
                "--workspace",
                "/w",
                "--input",
                "{}",
            ],
            vec![
                "podhost",
                "tool",
                "grep",
                "--input",
                "{}",
                "--workspace=rel/dir",
            ],
            vec!["podhost", "tool", "write", "--input=--not-a-flag"],
        ]);
        for line in &plain_lines {
            let plain = ToolArgs::plain(&args(line), |_| false)
                .unwrap_or_else(|| panic!("{line:?} is plain"));
            assert_eq!(format!("{plain:?}"), by_clap(line), "{line:?}");
            let with_env = ToolArgs::plain(&args(line), |v| v == "PODHOST_SHELL");
            assert!(with_env.is_none(), "{line:?} with PODHOST_SHELL set");
        }
        for line in [
            &["podhost", "tool", "bash"][..],
            &["podhost", "tool", "bash", "--input"],
            &["podhost", "tool", "bash", "--input", "{}", "--input", "{}"],
            &["podhost", "tool", "bash", "--input", "-x"],
            &["podhost", "tool", "bash", "--input="],
            &["podhost", "tool", "bash", "--input", "{}", "--bogus", "x"],
            &["podhost", "tool", "bash", "--input", "{}", "extra"],
            &["podhost", "tool", "bash", "--input", "{}", "--", "x"],
            &["podhost", "tool", "bash", "--workspace", "/w"],
            &["podhost", "tool", "Bash", "--input", "{}"],
            &["podhost", "tool", "--input", "{}", "bash"],
            &[
                "podhost",
                "tool",
                "bash",
                "--input",
                "{}",
                "--limit-open-files",
                "9",
            ],
            &["podhost", "run", "bash", "--input", "{}"],
        ] {
            assert!(
                ToolArgs::plain(&args(line), |_| false).is_none(),
                "{line:?}"
            );
        }
        // Text that is not UTF-8, in a value or in place of the tool's name.
        use std::os::unix::ffi::OsStringExt;
        let not_utf8 = || std::ffi::OsString::from_vec(vec![b'{', 0xff, b'}']);
        let mut line = args(&["podhost", "tool", "bash", "--input"]);
        line.push(not_utf8());
        assert!(ToolArgs::plain(&line, |_| false).is_none());
        let mut line = args(&["podhost", "tool"]);
        line.extend([not_utf8(), "--input".into(), "{}".into()]);
        assert!(ToolArgs::plain(&line, |_| false).is_none());
    }

    /// `TOOL_ENV` is every variable the `tool` subcommand's flags read, and nothing else.
    #[test]
    fn the_plain_tool_path_knows_every_variable_of_the_tool_subcommand() {
        let mut command = ToolCli::command();
        command.build();
        let tool = command.find_subcommand("tool").unwrap();
        let mut read: Vec<String> = tool
            .get_arguments()
            .filter_map(|a| a.get_env())
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        read.sort();
        let mut known: Vec<String> = local::TOOL_ENV.iter().map(|v| v.to_string()).collect();
        known.sort();
        assert_eq!(known, read);
    }

    #[test]
    fn a_setting_given_as_a_flag_is_named_by_its_flag() {
        let cli = Cli::parse_args(args(&["podhost", "pod", "--health-port", "x"])).unwrap();
        let Command::Pod(pod) = cli.command else {
            panic!("not pod")
        };
        assert_eq!(
            pod.origins.name("NYLORUN_HARNESS_HEALTH_PORT"),
            "--health-port"
        );
        assert_eq!(pod.origins.name("NYLORUN_SANDBOX_ID"), "NYLORUN_SANDBOX_ID");
    }

    #[test]
    fn a_bad_flag_value_names_the_flag() {
        let e = Cli::parse_args(args(&["podhost", "serve", "--max-running", "0"])).unwrap_err();
        assert!(e.is_error);
        assert!(
            e.message
                .starts_with("error: invalid value '0' for '--max-running <MAX_RUNNING>': "),
            "{}",
            e.message
        );
    }

    #[test]
    fn man_pages_and_completions_come_from_the_definitions() {
        let dir = tempfile::tempdir().unwrap();
        let pages = man_pages(dir.path()).unwrap();
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "podhost-tool.1",
                "podhost-serve.1",
                "podhost-run.1",
                "podhost-mcp.1",
                "podhost-pod.1",
                "podhost-health.1",
                "podhost-completions.1",
                "podhost-man.1",
                "podhost.1"
            ]
        );
        let serve = std::fs::read_to_string(dir.path().join("podhost-serve.1")).unwrap();
        assert!(serve.contains("PODHOST_LISTEN"), "{serve}");
        let mut bash = Vec::new();
        completions(clap_complete::Shell::Bash, &mut bash);
        let bash = String::from_utf8(bash).unwrap();
        assert!(bash.contains("--max-running"), "{bash}");
    }

    /// The allow-list of a session's proxy: comma-separated networks, each parsed strictly; a
    /// bad one stops podhost at start-up with an error naming it.
    #[test]
    fn session_allow_networks_parse_strictly() {
        let cli = Cli::try_parse_from([
            "podhost",
            "serve",
            "--session-allow-networks",
            "10.20.0.0/16,fd00:1::/64",
        ])
        .unwrap();
        let s = cli.command.exec_args().unwrap().settings().confine;
        let nets: Vec<String> = s.allow_networks.iter().map(|n| n.to_string()).collect();
        assert_eq!(nets, ["10.20.0.0/16", "fd00:1::/64"]);
        let e = Cli::parse_args(args(&[
            "podhost",
            "serve",
            "--session-allow-networks",
            "10.20.0.0/16,10.30.0.1/16",
        ]))
        .unwrap_err();
        assert_eq!(
            e.message.lines().next().unwrap_or_default(),
            "error: invalid value '10.30.0.1/16' for '--session-allow-networks \
             <SESSION_ALLOW_NETWORKS>': \"10.30.0.1/16\" has address bits set past its prefix, or \
             is IPv4-mapped: write the network's first address (such as 10.20.0.0/16)"
        );
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
        let s = cli.command.exec_args().unwrap().settings().confine;
        assert_eq!(
            (s.enabled, s.deny_network, s.hidden),
            (false, true, vec![PathBuf::from("/a"), PathBuf::from("/b")])
        );
    }
}
