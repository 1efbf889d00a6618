//! What the binaries do once their command line is read and before a front runs: logging as
//! the environment asks for it, the report of the confinement commands will get, and the whole
//! of a `podhost tool` process ([`tool`]).
//!
//! Shared by `podhost`, which runs `podhost tool` itself and hands every other command to
//! `podhost-full`, and by `podhost-full`: a tool call parses, logs and refuses the same under
//! either.

use std::ffi::OsString;
use std::sync::OnceLock;

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
    if config.exec.confine.local_view_wanted()
        && (exec::probe::assume_root_namespaces() || exec::probe::assume_own_namespaces())
    {
        // The command's namespaces and their /proc are made on another CPU while the rest of
        // the call is prepared (see exec::oneshot::start_early).
        exec::oneshot::start_early();
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

/// The most verbose level the default filter lets through (its default; `rmcp` gets less).
const DEFAULT_MAX_LEVEL: tracing::level_filters::LevelFilter =
    tracing::level_filters::LevelFilter::INFO;

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
    let mut warnings = Vec::new();
    // rmcp reports every session at `info`; podhost says what matters itself.
    let default = || {
        Targets::new()
            .with_default(DEFAULT_MAX_LEVEL)
            .with_target("rmcp", LevelFilter::WARN)
    };
    let env_filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => match EnvFilter::try_new(&spec) {
            Ok(filter) => Some(filter),
            Err(e) => {
                warnings.push(format!(
                    "RUST_LOG {spec:?} is not a valid log filter ({e}); logging at info"
                ));
                None
            }
        },
        _ => None,
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
    match env_filter {
        Some(filter) => tracing_subscriber::registry()
            .with(filter)
            .with(fmt_layer(json))
            .init(),
        None => Deferred {
            filter: default(),
            build: Box::new(move || {
                tracing::Dispatch::new(
                    tracing_subscriber::registry()
                        .with(default())
                        .with(fmt_layer(json)),
                )
            }),
            built: OnceLock::new(),
        }
        .init(),
    }
    for w in warnings {
        tracing::warn!("{w}");
    }
}

/// The layer that writes the log to stderr: JSON lines with the event's fields at the top level,
/// or text (coloured on a terminal).
fn fmt_layer<S>(json: bool) -> Box<dyn tracing_subscriber::Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::{Layer, fmt};
    let layer = fmt::layer()
        .with_ansi(!json && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        layer.json().flatten_event(true).boxed()
    } else {
        layer.boxed()
    }
}

/// The subscriber [`init_tracing`] installs under the default filter: it answers which spans
/// and events pass from that filter alone, and builds the subscriber that writes them (`fmt`'s
/// layer on a registry, whose slab of span slots is pages to fault in and time a `podhost tool`
/// call would pay) at the first span or event that passes. A process that logs nothing never
/// builds it; one that does logs exactly what the built subscriber alone would.
struct Deferred {
    filter: tracing_subscriber::filter::Targets,
    build: Box<dyn Fn() -> tracing::Dispatch + Send + Sync>,
    built: OnceLock<tracing::Dispatch>,
}

impl Deferred {
    fn real(&self) -> &tracing::Dispatch {
        self.built.get_or_init(&self.build)
    }
}

impl tracing::Subscriber for Deferred {
    fn register_callsite(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if self.enabled(metadata) {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(DEFAULT_MAX_LEVEL)
    }

    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        self.filter
            .would_enable(metadata.target(), metadata.level())
    }

    fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        self.real().new_span(span)
    }

    fn record(&self, span: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        if let Some(real) = self.built.get() {
            real.record(span, values);
        }
    }

    fn record_follows_from(&self, span: &tracing::span::Id, follows: &tracing::span::Id) {
        if let Some(real) = self.built.get() {
            real.record_follows_from(span, follows);
        }
    }

    fn event(&self, event: &tracing::Event<'_>) {
        self.real().event(event);
    }

    fn enter(&self, span: &tracing::span::Id) {
        if let Some(real) = self.built.get() {
            real.enter(span);
        }
    }

    fn exit(&self, span: &tracing::span::Id) {
        if let Some(real) = self.built.get() {
            real.exit(span);
        }
    }

    fn clone_span(&self, id: &tracing::span::Id) -> tracing::span::Id {
        match self.built.get() {
            Some(real) => real.clone_span(id),
            None => id.clone(),
        }
    }

    fn try_close(&self, id: tracing::span::Id) -> bool {
        match self.built.get() {
            Some(real) => real.try_close(id),
            None => false,
        }
    }

    fn current_span(&self) -> tracing_core::span::Current {
        match self.built.get() {
            Some(real) => real.current_span(),
            None => tracing_core::span::Current::none(),
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts what reaches it.
    #[derive(Default)]
    struct Counted {
        events: AtomicUsize,
        spans: AtomicUsize,
    }

    struct Counter(Arc<Counted>);

    impl tracing::Subscriber for Counter {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let n = self.0.spans.fetch_add(1, Ordering::SeqCst) as u64;
            tracing::span::Id::from_u64(n + 1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {
            self.0.events.fetch_add(1, Ordering::SeqCst);
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    /// Under the default filter the writing subscriber is built at the first span or event that
    /// passes, not before (nothing that is filtered out builds it), and then gets everything
    /// that passes.
    #[test]
    fn the_default_subscriber_is_built_at_the_first_event_that_passes() {
        let counted = Arc::new(Counted::default());
        let builds = Arc::new(AtomicUsize::new(0));
        let deferred = Deferred {
            filter: tracing_subscriber::filter::Targets::new()
                .with_default(DEFAULT_MAX_LEVEL)
                .with_target("quiet", tracing::Level::WARN),
            build: Box::new({
                let (counted, builds) = (counted.clone(), builds.clone());
                move || {
                    builds.fetch_add(1, Ordering::SeqCst);
                    tracing::Dispatch::new(Counter(counted.clone()))
                }
            }),
            built: OnceLock::new(),
        };
        tracing::subscriber::with_default(deferred, || {
            tracing::debug!("below the default level");
            tracing::info!(target: "quiet", "below this target's level");
            tracing::trace!("far below");
            assert_eq!(builds.load(Ordering::SeqCst), 0, "built for nothing");
            tracing::info!("passes");
            tracing::warn!(target: "quiet", "passes too");
            tracing::debug!("still filtered");
            let span = tracing::info_span!("a span");
            span.in_scope(|| tracing::info!("inside"));
        });
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert_eq!(counted.events.load(Ordering::SeqCst), 3);
        assert_eq!(counted.spans.load(Ordering::SeqCst), 1);
    }
}
