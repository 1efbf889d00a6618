//! The `podhost` binary: parse the command line, set up logging, run one front, map the result to
//! an exit code.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use podhost::config::{Cli, Command, HealthArgs};
use podhost::exec;
use podhost::floor::codes::exit;
use tokio_util::sync::CancellationToken;

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
    let cli = Cli::parse();
    // The configuration has been read: from here on, secrets live only in podhost's memory,
    // which no process of the same user may read. Before any thread starts.
    let hardened = exec::confine::harden_process();
    init_tracing();
    if !hardened.non_dumpable {
        tracing::warn!(
            "could not make podhost non-dumpable: same-user processes can read its memory"
        );
    }
    // One-shot fronts report their confinement now; long-running ones once their configuration
    // is valid (a configuration error stays the only thing they print).
    if let Some(exec) = cli.command.exec_args()
        && !cli.command.is_long_running()
        && !confinement_ok(&exec.settings(), false)
    {
        return ExitCode::from(exit::FAILURE as u8);
    }
    // reqwest and tungstenite are built without a default rustls provider: one, here, for all.
    let _ = rustls::crypto::ring::default_provider().install_default();
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
    let code = match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("podhost: {e:#}");
            exit::FAILURE
        }
    };
    ExitCode::from(code as u8)
}

/// Logs the confinement commands will get (a warning when there is none); false when
/// `PODHOST_REQUIRE_CONFINEMENT` asks for more than this kernel gives (the reason is printed).
fn confinement_ok(exec: &exec::ExecSettings, loud: bool) -> bool {
    let confinement = exec::Confinement::new(&exec.confine);
    match exec::confine::report_startup(&confinement, exec.confine.require, loud) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("podhost: {e}");
            false
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // JSON lines in pods (`PODHOST_LOG_FORMAT=json`), text elsewhere.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if std::env::var("PODHOST_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    // Orphans of commands whose supervisor died re-parent to podhost, which kills and reaps them.
    if let Err(e) = exec::reaper::start() {
        tracing::warn!("could not become a child subreaper: {e}");
    }
    match cli.command {
        Command::Tool(args) => Ok(local("tool", podhost::local::tool(args.config()).await)),
        Command::Serve(args) => {
            let config = args.config();
            if !confinement_ok(&config.exec, true) {
                return Ok(exit::FAILURE);
            }
            Ok(podhost::byoh::serve(config).await?)
        }
        Command::Run(args) => Ok(local("run", podhost::local::run(args.config()).await)),
        Command::Pod(args) => pod(&args).await,
        Command::Health(args) => Ok(health(&args)),
    }
}

/// The exit code of a local command: 2 for bad input or configuration (nothing ran), 1 for a
/// fault of podhost; its message on stderr.
fn local(command: &str, result: Result<i32, podhost::local::LocalError>) -> i32 {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("podhost {command}: {}", error_chain(&e));
            match e {
                podhost::local::LocalError::Usage(_) => exit::USAGE,
                _ => exit::FAILURE,
            }
        }
    }
}

/// An error and each of its causes, once, joined by `: `.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        // A variant that shows its source in its own text must not print it twice.
        if !text.ends_with(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
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

/// `podhost pod`: exit 0 after a clean shutdown (SIGTERM/SIGINT), 2 on bad configuration.
async fn pod(args: &podhost::config::PodArgs) -> anyhow::Result<i32> {
    use tokio::signal::unix::{SignalKind, signal};
    let config = match args.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("podhost pod: {e}");
            return Ok(exit::USAGE);
        }
    };
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
    podhost::nylorun::host::pod::serve(config, supervisor, handler, shutdown).await?;
    Ok(exit::OK)
}
