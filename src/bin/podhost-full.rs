//! `podhost-full`, the whole program: parse the command line, set up logging, run one front, map
//! the result to an exit code.
//!
//! Users run `podhost`, a smaller binary beside this one (`src/main.rs`): it runs `podhost tool`
//! itself and becomes this program, by `exec`, for every other command, its arguments as given.
//! Run by its own name it does the same things, `tool` included.

use std::process::ExitCode;

use anyhow::Context;
use podhost::byoh::ServeConfig;
use podhost::config::startup::{self, confinement_ok, init_tracing};
use podhost::config::{self, Cli, Command, HealthArgs};
use podhost::exec;
use podhost::floor::codes::exit;
use podhost::floor::text::error_chain;
use podhost::local::{McpConfig, RunConfig, Stop, exit_code};
use podhost::nylorun::host::pod::PodConfig;
use tokio_util::sync::CancellationToken;

/// jemalloc, for Rust and C allocations alike (SQLite's page cache): under glibc's malloc, the
/// arenas of the runtime's blocking threads fragment, and a `serve` whose live heap stays flat
/// still grows in RSS turn after turn; jemalloc's decay gives the unused pages back (the soak
/// benchmark, `benches/soak.rs`, shows both).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // As a container's PID 1, podhost splits into a minimal init and itself (see exec::init).
    if let Some(code) = exec::init::split_if_pid1() {
        return code;
    }
    // A command's supervisor, a session holder, the probe: before clap, tracing or tokio,
    // which they must not start.
    if let Some(code) = exec::run_helper(std::env::args_os().nth(1).as_deref()) {
        return code;
    }
    let cli = match Cli::parse_args(std::env::args_os().collect()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // The configuration is checked before anything is logged: an error in it is the only thing
    // printed, naming the flag or variable it came from.
    let front = match Front::check(cli.command) {
        Ok(Front::Done(code)) => return ExitCode::from(code as u8),
        Ok(front) => front,
        Err((command, e)) => {
            eprintln!("podhost {command}: {e}");
            return ExitCode::from(exit::USAGE as u8);
        }
    };
    let (own_userns, hardened) = before_threads(&front);
    init_tracing();
    report_own_user_namespace(own_userns);
    if !hardened.non_dumpable {
        tracing::warn!(
            "could not make podhost non-dumpable: same-user processes can read its memory"
        );
    }
    if front.is_long_running() {
        tracing::info!(
            version = env!("CARGO_PKG_VERSION"),
            revision = env!("BUILD_GIT_REVISION"),
            "podhost {}",
            config::VERSION
        );
    }
    // One-shot fronts report their confinement now; long-running ones once their configuration
    // is valid (a configuration error stays the only thing they print).
    if let Some(exec) = front.exec()
        && !front.is_long_running()
        && !confinement_ok(exec, false)
    {
        return ExitCode::from(exit::FAILURE as u8);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("podhost: could not start the async runtime: {e}");
            return ExitCode::from(exit::FAILURE as u8);
        }
    };
    let code = match runtime.block_on(dispatch(front)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("podhost: {}", error_chain(e.as_ref()));
            exit::FAILURE
        }
    };
    ExitCode::from(code as u8)
}

/// A front with its configuration checked.
enum Front {
    Serve(ServeConfig),
    Run(RunConfig),
    Mcp(McpConfig),
    Pod(Box<PodConfig>),
    Health(HealthArgs),
    /// A command that already ran (completions, man pages), with its exit code.
    Done(i32),
}

impl Front {
    /// The front's configuration, or the command's name and what is wrong with it.
    fn check(command: Command) -> Result<Front, (&'static str, Box<dyn std::error::Error>)> {
        Ok(match command {
            // `podhost tool` is the `podhost` binary's; here when this one is run by its own
            // name. It runs at once, the same way (see `config::startup`).
            Command::Tool(args) => Front::Done(startup::run_tool(&args)),
            Command::Serve(args) => Front::Serve(args.config().map_err(|e| ("serve", e.into()))?),
            Command::Run(args) => Front::Run(
                args.config(|name| std::env::var(name).ok())
                    .map_err(|e| ("run", e.into()))?,
            ),
            Command::Mcp(args) => Front::Mcp(args.config().map_err(|e| ("mcp", e.into()))?),
            Command::Pod(args) => {
                Front::Pod(Box::new(args.validate().map_err(|e| ("pod", e.into()))?))
            }
            Command::Health(args) => Front::Health(args),
            Command::Completions(args) => {
                config::completions(args.shell, &mut std::io::stdout());
                Front::Done(exit::OK)
            }
            Command::Man(args) => match args.dir {
                None => match config::man_page(&mut std::io::stdout()) {
                    Ok(()) => Front::Done(exit::OK),
                    Err(e) => {
                        eprintln!("podhost man: {e}");
                        Front::Done(exit::FAILURE)
                    }
                },
                Some(dir) => match config::man_pages(&dir) {
                    Ok(pages) => {
                        for page in pages {
                            println!("{}", page.display());
                        }
                        Front::Done(exit::OK)
                    }
                    Err(e) => {
                        eprintln!("podhost man: {}: {e}", dir.display());
                        Front::Done(exit::FAILURE)
                    }
                },
            },
        })
    }

    /// How this front runs commands (each front that runs tools answers).
    fn exec(&self) -> Option<&exec::ExecSettings> {
        match self {
            Front::Serve(c) => Some(&c.exec),
            Front::Run(c) => Some(&c.exec),
            Front::Mcp(c) => Some(&c.exec),
            Front::Pod(c) => Some(&c.exec),
            Front::Health(_) | Front::Done(_) => None,
        }
    }

    /// Whether this front runs for long (and so reports its confinement at `info`). `podhost
    /// mcp` runs for long, but as a client's child: its start-up stays quiet.
    fn is_long_running(&self) -> bool {
        matches!(self, Front::Serve(_) | Front::Pod(_))
    }
}

async fn dispatch(front: Front) -> anyhow::Result<i32> {
    // Orphans of commands whose supervisor died re-parent to podhost, which kills and reaps them.
    if let Err(e) = exec::reaper::start() {
        tracing::warn!("could not become a child subreaper: {e}");
    }
    match front {
        Front::Serve(config) => {
            if !confinement_ok(&config.exec, true) {
                return Ok(exit::FAILURE);
            }
            match podhost::byoh::serve(config).await {
                Ok(code) => Ok(code),
                Err(e) => {
                    eprintln!("podhost serve: {}", error_chain(&e));
                    Ok(exit::FAILURE)
                }
            }
        }
        Front::Run(config) => {
            let stop = Stop::on_signals()?;
            Ok(exit_code(
                "run",
                podhost::local::run::run(config, stop).await,
            ))
        }
        Front::Mcp(config) => {
            let stop = Stop::on_signals()?;
            Ok(exit_code(
                "mcp",
                podhost::local::mcp::mcp(config, stop).await,
            ))
        }
        Front::Pod(config) => pod(*config).await,
        Front::Health(args) => Ok(health(&args)),
        Front::Done(code) => Ok(code),
    }
}

/// `podhost health`: exit 0 when the pod host answers `connected: true` (with `--live`: when it
/// answers at all), 1 for anything else (not connected, nothing listening, no answer in time, an
/// answer that is not the health JSON).
fn health(args: &HealthArgs) -> i32 {
    if args.port == 0 {
        eprintln!("podhost health: port 0: the pod host's health listener is off");
        return exit::FAILURE;
    }
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], args.port));
    let timeout = std::time::Duration::from_millis(args.timeout_ms);
    match podhost::probe::check(addr, timeout) {
        Ok(h) if args.live => {
            println!(
                "alive: {} answered HTTP {} on {addr} (connected: {})",
                h.service, h.http_status, h.connected
            );
            exit::OK
        }
        Ok(h) => {
            let verdict = if h.connected {
                "connected"
            } else {
                "not connected"
            };
            println!(
                "{verdict}: {} answered HTTP {} on {addr}",
                h.service, h.http_status
            );
            if h.connected { exit::OK } else { exit::FAILURE }
        }
        Err(e) => {
            eprintln!("podhost health: {e}");
            exit::FAILURE
        }
    }
}

/// `podhost pod`: exit 0 after a clean shutdown (SIGTERM/SIGINT), 2 on a setting that cannot
/// be used (a CA file), 1 when podhost itself fails.
async fn pod(config: PodConfig) -> anyhow::Result<i32> {
    use tokio::signal::unix::{SignalKind, signal};
    if !confinement_ok(&config.exec, true) {
        return Ok(exit::FAILURE);
    }
    let supervisor = exec::find_supervisor().context("finding podhost's own executable")?;
    let shutdown = CancellationToken::new();
    let mut term = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        on_signal.cancel();
    });
    let handler = podhost::nylorun::host::pod::Handler::Turns;
    match podhost::nylorun::host::pod::serve(config, supervisor, handler, shutdown).await {
        Ok(()) => Ok(exit::OK),
        Err(e) => {
            eprintln!("podhost pod: {}", error_chain(&e));
            Ok(if e.is_setting() {
                exit::USAGE
            } else {
                exit::FAILURE
            })
        }
    }
}

/// What the process does once its configuration is read, before any thread starts: a user
/// namespace of its own where `front` wants one ([`own_user_namespace`]), then the hardening:
/// from here on, secrets live only in podhost's memory, which no process of the same user may
/// read.
fn before_threads(front: &Front) -> (Option<std::io::Result<()>>, exec::confine::Hardened) {
    let own_userns = own_user_namespace(front);
    (own_userns, exec::confine::harden_process())
}

/// A non-root `serve` with a workspace template whose overlay level the configuration does not
/// rule out enters a user namespace of its own, while it is single-threaded and still dumpable
/// (a non-dumpable process cannot write its id maps): its file tools can then join its sessions'
/// views, where the template's overlay is (see `exec::enter_own_user_namespace`). `None`:
/// not tried.
fn own_user_namespace(front: &Front) -> Option<std::io::Result<()>> {
    use podhost::exec::template::Level;
    let Front::Serve(config) = front else {
        return None;
    };
    let wanted = !nix::unistd::geteuid().is_root()
        && config.template.is_some()
        && matches!(config.template_level, None | Some(Level::Overlay));
    wanted.then(exec::enter_own_user_namespace)
}

/// Logs why `serve` stays outside a user namespace of its own, when it tried one.
fn report_own_user_namespace(tried: Option<std::io::Result<()>>) {
    if let Some(Err(e)) = tried {
        tracing::info!(
            error = %e,
            "podhost could not enter a user namespace of its own: sessions' workspaces cannot \
             be overlays of the template"
        );
    }
}
