//! What the binaries do once their command line is read and before a front runs: logging as
//! the environment asks for it, the report of the confinement commands will get, and the whole
//! of a `podhost tool` process ([`tool`]).
//!
//! Shared by `podhost`, which runs `podhost tool` itself and hands every other command to
//! `podhost-full`, and by `podhost-full`: a tool call parses, logs and refuses the same under
//! either.

use std::ffi::OsString;

use super::{Cli, ToolArgs};
use crate::exec;
use crate::floor::codes::exit;
use crate::floor::text::error_chain;
use crate::tools::ToolName;

/// The whole `podhost tool …` process from its arguments (`args[1]` is `tool`; a command line
/// clap refuses exits as clap does): no multi-threaded runtime, and of the command line only the
/// `tool` subcommand built ([`Cli::parse_tool`]). The exit code.
pub fn tool(args: &[OsString]) -> i32 {
    match Cli::parse_tool(args) {
        Ok(tool) => run_tool(&tool),
        Err(e) => e.exit(),
    }
}

/// `podhost tool` with its command line parsed: logging and hardened like every front, then
/// the call ([`crate::local::tool::main`]).
pub fn run_tool(args: &ToolArgs) -> i32 {
    let mut config = args.config();
    init_tracing();
    // The read-only system is a view for commands; the file tools run in this process, under
    // Landlock. A call that runs no command has no use for one, nor for the probe of the
    // namespaces it would need (forks and throw-away namespaces: most of such a call's time).
    if config.name != ToolName::Bash {
        config.exec.confine.read_only_system = false;
    }
    // A command that gets the read-only system: `podhost tool bash` makes its namespaces itself
    // and falls back where the kernel refuses them: the probe's forks and namespaces, or a
    // session holder, would be on the command's path. As root with CAP_SYS_ADMIN (see
    // exec::probe::assume_root_namespaces); else in a user namespace of its own, entered now,
    // while this process may still write its id maps (see exec::probe::assume_own_namespaces).
    if config.exec.confine.local_view_wanted() && !exec::probe::assume_root_namespaces() {
        exec::probe::assume_own_namespaces();
    }
    // Before the hardening: not as root, the confinement probes the namespaces of the read-only
    // system in forks of this process, which must write their user namespace's id maps, and
    // the forks of a non-dumpable process cannot (the answer is kept for the call).
    let confinement = exec::Confinement::new(&config.exec.confine);
    // From here on, secrets live only in podhost's memory, which no process of the same user may
    // read.
    let hardened = exec::confine::harden_process();
    if !hardened.non_dumpable {
        tracing::warn!(
            "could not make podhost non-dumpable: same-user processes can read its memory"
        );
    }
    // A one-shot front reports its confinement now, quietly unless it is missing.
    if !reported_ok(&confinement, &config.exec, false) {
        return exit::FAILURE;
    }
    crate::local::tool::main(config)
}

/// Logs to stderr: JSON lines with every field at the top level when `PODHOST_LOG_FORMAT=json`
/// (pods), text otherwise; filtered by `RUST_LOG` (default `info`). A filter or format that
/// cannot be used is warned about, once logging runs, and the default used instead.
///
/// The default filter is a plain table of levels: `RUST_LOG`'s directives are parsed with
/// regular expressions compiled at the first use, a cost every `podhost tool` call would pay.
pub fn init_tracing() {
    use tracing_subscriber::filter::{EnvFilter, LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, fmt};
    let mut warnings = Vec::new();
    // rmcp reports every session at `info`; podhost says what matters itself.
    let default = || {
        Targets::new()
            .with_default(LevelFilter::INFO)
            .with_target("rmcp", LevelFilter::WARN)
    };
    let (env_filter, targets) = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => match EnvFilter::try_new(&spec) {
            Ok(filter) => (Some(filter), None),
            Err(e) => {
                warnings.push(format!(
                    "RUST_LOG {spec:?} is not a valid log filter ({e}); logging at info"
                ));
                (None, Some(default()))
            }
        },
        _ => (None, Some(default())),
    };
    let json = match std::env::var("PODHOST_LOG_FORMAT") {
        Ok(f) if f == "json" => true,
        Ok(f) if f.is_empty() || f == "text" => false,
        Ok(f) => {
            warnings.push(format!(
                "PODHOST_LOG_FORMAT {f:?} is neither json nor text; writing text"
            ));
            false
        }
        Err(_) => false,
    };
    let layer = fmt::layer()
        .with_ansi(!json && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let layer = if json {
        layer.json().flatten_event(true).boxed()
    } else {
        layer.boxed()
    };
    tracing_subscriber::registry()
        .with(env_filter)
        .with(targets)
        .with(layer)
        .init();
    for w in warnings {
        tracing::warn!("{w}");
    }
}

/// Logs the confinement commands will get (a warning when there is none); false when
/// `PODHOST_REQUIRE_CONFINEMENT` asks for more than this kernel gives (the reason is printed).
pub fn confinement_ok(exec: &exec::ExecSettings, loud: bool) -> bool {
    reported_ok(&exec::Confinement::new(&exec.confine), exec, loud)
}

/// [`confinement_ok`] of a confinement already made.
fn reported_ok(confinement: &exec::Confinement, exec: &exec::ExecSettings, loud: bool) -> bool {
    match exec::confine::report_startup(confinement, exec.confine.require, loud) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("podhost: {}", error_chain(&e));
            false
        }
    }
}
