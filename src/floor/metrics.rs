//! podhost's metrics: the one registry, every metric family, the one-line calls that record
//! them, and the text `GET /metrics` answers: the OpenMetrics text format to a scraper whose
//! `Accept` asks for it (Prometheus does), else the classic Prometheus text format 0.0.4, which
//! every scraper reads ([`negotiate`]).
//!
//! It sits in the floor so that every layer that records — `exec` (commands killed), `tools`
//! (tool calls), `chat` (model calls), the fronts (turns, refusals, the store, the pod's
//! connection) — can reach it without importing anything above itself. The registry is
//! process-wide: one process is one scrape target.
//!
//! Invariants:
//! * Label values are `&'static str` (or a status code), so that the set of series is bounded
//!   by the code: no session, invocation, run or call id, no tool name a model made up (only
//!   the six tools reach a toolbox, which counts calls), no free text.
//! * Recording never fails and never blocks (atomics under the hood).
//! * Every label set the code can record is in the text from the start, at 0 (the common ones
//!   when the registry is made, a front's own when it starts serving, [`serving`]), so that
//!   `rate()` and `absent()` see a series before its first event. Only a model endpoint's HTTP
//!   statuses are open-ended: 429 and the usual 5xx are set up, others appear when answered.
//! * The conventional `process_*` series are read from `/proc/self` at each scrape, as the Go
//!   and Python clients do; they are left out where `/proc` cannot be read.
//!
//! Non-goals: serving (the fronts route `/metrics` to [`answer`]), tracing spans, push.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// A text format of the metrics, as [`negotiate`] picks it from a request's `Accept`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format, version 0.0.4: counters' `TYPE` lines name the `_total`
    /// series, no `# EOF`.
    Classic,
    /// OpenMetrics text, in the version asked for (`1.0.0` or `0.0.1`, the same text), ending
    /// with `# EOF`.
    OpenMetrics(&'static str),
}

impl Format {
    /// The `Content-Type` of the text in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Classic => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            Format::OpenMetrics("0.0.1") => {
                "application/openmetrics-text; version=0.0.1; charset=utf-8"
            }
            Format::OpenMetrics(_) => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The format a request's `Accept` header asks for, as Prometheus servers negotiate it: the
/// most preferred (highest `q`, then first) of `application/openmetrics-text` in version
/// 1.0.0, 0.0.1 or none, and `text/plain` or any other type, which get the classic format.
/// No header, or one that cannot be read, gets the classic format too.
pub fn negotiate(accept: Option<&str>) -> Format {
    let mut offers: Vec<(f64, Format)> = accept
        .unwrap_or_default()
        .split(',')
        .filter_map(offer)
        .filter(|(q, _)| *q > 0.0)
        .collect();
    // Stable: among equal weights the first offer wins.
    offers.sort_by(|a, b| b.0.total_cmp(&a.0));
    offers.first().map_or(Format::Classic, |(_, f)| *f)
}

/// One element of an `Accept` header: its weight and the format it would get (`None` for an
/// OpenMetrics version podhost does not write).
fn offer(element: &str) -> Option<(f64, Format)> {
    let mut parts = element.split(';').map(str::trim);
    let media = parts.next()?.to_ascii_lowercase();
    let (mut q, mut version) = (1.0, None);
    for param in parts {
        let Some((key, value)) = param.split_once('=') else {
            continue;
        };
        match key.trim().to_ascii_lowercase().as_str() {
            "q" => q = value.trim().parse().ok()?,
            "version" => version = Some(value.trim().trim_matches('"').to_owned()),
            _ => {}
        }
    }
    if media != "application/openmetrics-text" {
        return (!media.is_empty()).then_some((q, Format::Classic));
    }
    match version.as_deref() {
        None | Some("1.0.0") => Some((q, Format::OpenMetrics("1.0.0"))),
        Some("0.0.1") => Some((q, Format::OpenMetrics("0.0.1"))),
        Some(_) => None,
    }
}

/// Which front a turn or model call belongs to: `byoh`, `local` or `pod`.
pub type Front = &'static str;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FrontLabel {
    front: Front,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    front: Front,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabel {
    tool: &'static str,
}

/// Which model endpoint a call went to: `openai` (an OpenAI-compatible server, for `serve`
/// and `run`) or `model_gate` (Nylorun's Model Gate, for the pod).
pub type Endpoint = &'static str;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabel {
    endpoint: Endpoint,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointOutcome {
    endpoint: Endpoint,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabels {
    endpoint: Endpoint,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

/// `podhost_build_info`'s labels: the crate's version and the git revision of the build.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    revision: &'static str,
}

/// The six tools' names, as [`tool_call`] is given them (the floor cannot name the tools
/// module's own list).
const TOOLS: [&str; 6] = ["bash", "read", "write", "edit", "grep", "glob"];
/// [`tool_call`]'s outcomes.
const TOOL_OUTCOMES: [&str; 4] = ["completed", "failed", "cancelled", "error"];
/// [`model_call`]'s outcomes.
const MODEL_OUTCOMES: [&str; 3] = ["ok", "failed", "cancelled"];
/// The statuses of a model endpoint set up at 0: the ones its answers usually carry.
const MODEL_STATUSES: [u16; 5] = [429, 500, 502, 503, 504];

/// Latency buckets from 1 ms to about 16 minutes (model calls and commands can be long).
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 11))
}

/// Store writes: 100 µs to about 1.6 s.
fn store_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 4.0, 8))
}

struct Metrics {
    registry: Registry,
    turns: Family<OutcomeLabels, Counter>,
    turns_running: Family<FrontLabel, Gauge>,
    model_calls: Family<EndpointOutcome, Counter>,
    model_call_seconds: Family<EndpointLabel, Histogram, fn() -> Histogram>,
    model_retries: Family<EndpointLabel, Counter>,
    model_http_errors: Family<StatusLabels, Counter>,
    tool_calls: Family<ToolLabels, Counter>,
    tool_call_seconds: Family<ToolLabel, Histogram, fn() -> Histogram>,
    commands_killed: Family<ReasonLabel, Counter>,
    busy_refusals: Counter,
    store_write_seconds: Histogram,
    pod_connected: Gauge,
    pod_reconnects: Counter,
    leases_held: Gauge,
    effects_journaled: Family<KindLabel, Counter>,
    http_body_bytes_held: Gauge,
    http_bodies_refused: Family<ReasonLabel, Counter>,
    sandbox_faulted: Gauge,
}

impl Metrics {
    /// Every metric, registered with its help text.
    /// Long: one registration per metric, each the metric's name and what it counts.
    fn new() -> Metrics {
        let mut m = Metrics {
            registry: Registry::default(),
            turns: Family::default(),
            turns_running: Family::default(),
            model_calls: Family::default(),
            model_call_seconds: Family::new_with_constructor(seconds_histogram),
            model_retries: Family::default(),
            model_http_errors: Family::default(),
            tool_calls: Family::default(),
            tool_call_seconds: Family::new_with_constructor(seconds_histogram),
            commands_killed: Family::default(),
            busy_refusals: Counter::default(),
            store_write_seconds: store_histogram(),
            pod_connected: Gauge::default(),
            pod_reconnects: Counter::default(),
            leases_held: Gauge::default(),
            effects_journaled: Family::default(),
            http_body_bytes_held: Gauge::default(),
            http_bodies_refused: Family::default(),
            sandbox_faulted: Gauge::default(),
        };
        m.registry.register_collector(Box::new(ProcessCollector));
        let r = m.registry.sub_registry_with_prefix("podhost");
        r.register(
            "build",
            "The version and git revision podhost was built from",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                revision: env!("BUILD_GIT_REVISION"),
            }),
        );
        r.register(
            "turns",
            "Turns ended, by front and outcome (completed, input_required, failed, cancelled)",
            m.turns.clone(),
        );
        r.register(
            "turns_running",
            "Turns running now, by front",
            m.turns_running.clone(),
        );
        r.register(
            "model_calls",
            "Model calls ended, by endpoint (openai, model_gate) and outcome (ok, failed, cancelled)",
            m.model_calls.clone(),
        );
        r.register(
            "model_call_seconds",
            "How long model calls took, retries included",
            m.model_call_seconds.clone(),
        );
        r.register(
            "model_retries",
            "Model call attempts retried after a 429, a 5xx or a transport error",
            m.model_retries.clone(),
        );
        r.register(
            "model_http_errors",
            "Model endpoint answers with HTTP 429 or 5xx, by status",
            m.model_http_errors.clone(),
        );
        r.register(
            "tool_calls",
            "Tool calls, by tool and outcome (completed, failed, cancelled, error)",
            m.tool_calls.clone(),
        );
        r.register(
            "tool_call_seconds",
            "How long tool calls took, by tool",
            m.tool_call_seconds.clone(),
        );
        r.register(
            "commands_killed",
            "Commands whose process group was killed, by reason (timeout, cancel)",
            m.commands_killed.clone(),
        );
        r.register(
            "busy_refusals",
            "Submissions refused with 409 because the most turns were running",
            m.busy_refusals.clone(),
        );
        r.register(
            "store_write_seconds",
            "How long writes to the BYOH store took, queueing included",
            m.store_write_seconds.clone(),
        );
        r.register(
            "pod_connected",
            "1 while the pod holds the Harness API connection (hello answered), else 0",
            m.pod_connected.clone(),
        );
        r.register(
            "pod_reconnects",
            "Harness API connections opened again after one was lost or refused",
            m.pod_reconnects.clone(),
        );
        r.register(
            "pod_leases_held",
            "Runs the pod holds leased now",
            m.leases_held.clone(),
        );
        r.register(
            "pod_effects_journaled",
            "Effects journaled with core, by kind (model, tool)",
            m.effects_journaled.clone(),
        );
        r.register(
            "http_body_bytes_held",
            "Bytes of request bodies read and held now, across all connections",
            m.http_body_bytes_held.clone(),
        );
        r.register(
            "http_bodies_refused",
            "Request bodies whose connection was closed, by reason (held: past the cap on body \
             bytes held; timeout: not arrived within the body timeout)",
            m.http_bodies_refused.clone(),
        );
        r.register(
            "sandbox_faulted",
            "1 while the host cannot make sandboxes (new BYOH submissions are refused with 503 \
             until a probe makes one), else 0",
            m.sandbox_faulted.clone(),
        );
        m.set_up_common();
        m
    }

    /// The label sets every process can record, at 0: the tools', the commands' and the
    /// request bodies'.
    fn set_up_common(&self) {
        for tool in TOOLS {
            let _ = self.tool_call_seconds.get_or_create(&ToolLabel { tool });
            for outcome in TOOL_OUTCOMES {
                let _ = self.tool_calls.get_or_create(&ToolLabels { tool, outcome });
            }
        }
        for reason in ["timeout", "cancel"] {
            let _ = self.commands_killed.get_or_create(&ReasonLabel { reason });
        }
        for reason in ["held", "timeout"] {
            let _ = self
                .http_bodies_refused
                .get_or_create(&ReasonLabel { reason });
        }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The BYOH front's turn outcomes (its statuses that end a turn).
const BYOH_OUTCOMES: [&str; 4] = ["completed", "input_required", "failed", "cancelled"];
/// The pod's turn outcomes.
const POD_OUTCOMES: [&str; 7] = [
    "completed",
    "failed",
    "cancelled",
    "waiting",
    "paused",
    "checkpoint",
    "released",
];

/// `front` serves its metrics from now on: the label sets it can record are set up at 0 —
/// its turns (`byoh` or `pod`), its model endpoint's calls (`openai` or `model_gate`), and the
/// pod's journaled effects.
pub fn serving(front: Front) {
    let (endpoint, outcomes): (Endpoint, &[&'static str]) = match front {
        "byoh" => ("openai", &BYOH_OUTCOMES),
        "pod" => ("model_gate", &POD_OUTCOMES),
        _ => return,
    };
    let m = &*METRICS;
    let _ = m.turns_running.get_or_create(&FrontLabel { front });
    for &outcome in outcomes {
        let _ = m.turns.get_or_create(&OutcomeLabels { front, outcome });
    }
    let _ = m
        .model_call_seconds
        .get_or_create(&EndpointLabel { endpoint });
    let _ = m.model_retries.get_or_create(&EndpointLabel { endpoint });
    for outcome in MODEL_OUTCOMES {
        let _ = m
            .model_calls
            .get_or_create(&EndpointOutcome { endpoint, outcome });
    }
    for status in MODEL_STATUSES {
        let _ = m
            .model_http_errors
            .get_or_create(&StatusLabels { endpoint, status });
    }
    if front == "pod" {
        for kind in ["model", "tool"] {
            let _ = m.effects_journaled.get_or_create(&KindLabel { kind });
        }
    }
}

/// Every metric as text in `format`.
pub fn encode(format: Format) -> String {
    let mut text = String::new();
    let written = match format {
        Format::Classic => {
            prometheus_client::encoding::prometheus_text::encode(&mut text, &METRICS.registry)
        }
        Format::OpenMetrics(_) => {
            prometheus_client::encoding::text::encode(&mut text, &METRICS.registry)
        }
    };
    if written.is_err() {
        // Writing to a String cannot fail; an empty but valid exposition if it ever did.
        return match format {
            Format::Classic => String::new(),
            Format::OpenMetrics(_) => "# EOF\n".to_owned(),
        };
    }
    text
}

/// The answer to `GET /metrics` with this `Accept` header: its `Content-Type` and its body.
pub fn answer(accept: Option<&str>) -> (&'static str, String) {
    let format = negotiate(accept);
    (format.content_type(), encode(format))
}

/// The conventional `process_*` series, read from `/proc/self` at each scrape.
#[derive(Debug)]
struct ProcessCollector;

/// The kernel's clock ticks per second in `/proc`'s times (`USER_HZ`: 100 on every Linux
/// architecture's user ABI, as the Go client's procfs also takes it).
const USER_HZ: f64 = 100.0;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let series = [
            (
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                MetricType::Counter,
                process_cpu_seconds(),
            ),
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                MetricType::Gauge,
                status_kib("VmRSS:").map(|k| k * 1024.0),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                MetricType::Gauge,
                status_kib("VmSize:").map(|k| k * 1024.0),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                MetricType::Gauge,
                std::fs::read_dir("/proc/self/fd")
                    .ok()
                    .map(|d| d.count() as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                MetricType::Gauge,
                nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                    .ok()
                    .map(|(soft, _)| soft as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                MetricType::Gauge,
                process_start_time(),
            ),
        ];
        for (name, help, kind, value) in series {
            let Some(value) = value else { continue };
            let metric = encoder.encode_descriptor(name, help, None, kind)?;
            if kind == MetricType::Counter {
                ConstCounter::new(value).encode(metric)?;
            } else {
                ConstGauge::new(value).encode(metric)?;
            }
        }
        Ok(())
    }
}

/// The fields of `/proc/self/stat` after the command's name, from field 3 (`state`) on.
fn self_stat() -> Option<Vec<String>> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The name is in parentheses and may hold spaces and parentheses itself.
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// `utime` + `stime` (fields 14 and 15), in seconds.
fn process_cpu_seconds() -> Option<f64> {
    let stat = self_stat()?;
    let ticks = |i: usize| stat.get(i - 3)?.parse::<f64>().ok();
    Some((ticks(14)? + ticks(15)?) / USER_HZ)
}

/// The boot time (`btime` of `/proc/stat`) plus the process's `starttime` (field 22).
fn process_start_time() -> Option<f64> {
    let boot = std::fs::read_to_string("/proc/stat").ok()?;
    let btime: f64 = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    let since_boot: f64 = self_stat()?.get(22 - 3)?.parse().ok()?;
    Some(btime + since_boot / USER_HZ)
}

/// A `kB` line of `/proc/self/status` (`VmRSS:`, `VmSize:`), in KiB.
fn status_kib(key: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix(key))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// Decrements a gauge when dropped: what is running stops counting however its task ends.
#[must_use = "the gauge goes back down when this is dropped"]
pub struct Running(Gauge);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Observes the time since its start into a histogram when dropped.
#[must_use = "the time is recorded when this is dropped"]
pub struct Timer(Histogram, Instant);

impl Drop for Timer {
    fn drop(&mut self) {
        self.0.observe(self.1.elapsed().as_secs_f64());
    }
}

/// A turn of `front` runs until the guard is dropped.
pub fn turn_running(front: Front) -> Running {
    let g = METRICS
        .turns_running
        .get_or_create(&FrontLabel { front })
        .clone();
    g.inc();
    Running(g)
}

/// A turn of `front` ended with `outcome`.
pub fn turn_ended(front: Front, outcome: &'static str) {
    METRICS
        .turns
        .get_or_create(&OutcomeLabels { front, outcome })
        .inc();
}

/// A model call to `endpoint` ended with `outcome` (`ok`, `failed`, `cancelled`) after `took`.
pub fn model_call(endpoint: Endpoint, outcome: &'static str, took: Duration) {
    METRICS
        .model_calls
        .get_or_create(&EndpointOutcome { endpoint, outcome })
        .inc();
    METRICS
        .model_call_seconds
        .get_or_create(&EndpointLabel { endpoint })
        .observe(took.as_secs_f64());
}

/// A model call attempt to `endpoint` is tried again.
pub fn model_retry(endpoint: Endpoint) {
    METRICS
        .model_retries
        .get_or_create(&EndpointLabel { endpoint })
        .inc();
}

/// A model endpoint answered `status`; only 429 and 5xx are counted.
pub fn model_http_status(endpoint: Endpoint, status: u16) {
    if status == 429 || (500..600).contains(&status) {
        METRICS
            .model_http_errors
            .get_or_create(&StatusLabels { endpoint, status })
            .inc();
    }
}

/// A tool call of `tool` (one of the six tools' names) ended with `outcome`.
pub fn tool_call(tool: &'static str, outcome: &'static str, took: Duration) {
    METRICS
        .tool_calls
        .get_or_create(&ToolLabels { tool, outcome })
        .inc();
    METRICS
        .tool_call_seconds
        .get_or_create(&ToolLabel { tool })
        .observe(took.as_secs_f64());
}

/// A command's process group was killed: `timeout` or `cancel`.
pub fn command_killed(reason: &'static str) {
    METRICS
        .commands_killed
        .get_or_create(&ReasonLabel { reason })
        .inc();
}

/// A submission was refused with 409: the most turns were running.
pub fn busy_refusal() {
    METRICS.busy_refusals.inc();
}

/// A store write runs until the timer is dropped.
pub fn store_write() -> Timer {
    Timer(METRICS.store_write_seconds.clone(), Instant::now())
}

/// Whether the pod holds the Harness API connection.
pub fn pod_connected(up: bool) {
    METRICS.pod_connected.set(i64::from(up));
}

/// The pod opens the Harness API connection again.
pub fn pod_reconnect() {
    METRICS.pod_reconnects.inc();
}

/// The pod holds a leased run until the guard is dropped.
pub fn lease_held() -> Running {
    let g = METRICS.leases_held.clone();
    g.inc();
    Running(g)
}

/// An effect of `kind` (`model`, `tool`) was journaled with core.
pub fn effect_journaled(kind: &'static str) {
    METRICS
        .effects_journaled
        .get_or_create(&KindLabel { kind })
        .inc();
}

/// Request bodies hold `delta` more bytes (fewer when negative).
pub fn http_body_bytes_held(delta: i64) {
    METRICS.http_body_bytes_held.inc_by(delta);
}

/// A request body's connection was closed: `held` (past the cap) or `timeout`.
pub fn http_body_refused(reason: &'static str) {
    METRICS
        .http_bodies_refused
        .get_or_create(&ReasonLabel { reason })
        .inc();
}

/// Whether the host cannot make sandboxes now.
pub fn sandbox_fault(faulted: bool) {
    METRICS.sandbox_faulted.set(i64::from(faulted));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_holds_what_was_recorded_and_ends_with_eof() {
        tool_call("read", "completed", Duration::from_millis(3));
        turn_ended("byoh", "completed");
        model_http_status("openai", 503);
        model_http_status("openai", 404);
        drop(turn_running("pod"));
        let text = encode(Format::OpenMetrics("1.0.0"));
        for name in [
            "# TYPE podhost_turns counter",
            "podhost_turns_total{front=\"byoh\",outcome=\"completed\"} 1",
            "podhost_turns_running{front=\"pod\"} 0",
            "podhost_model_http_errors_total{endpoint=\"openai\",status=\"503\"} 1",
            "# TYPE podhost_store_write_seconds histogram",
            "podhost_busy_refusals_total 0",
            "podhost_tool_call_seconds_bucket{le=\"0.004\",tool=\"read\"} 1",
            "podhost_tool_calls_total{tool=\"read\",outcome=\"completed\"} 1",
            "# TYPE process_cpu_seconds counter",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        // Only 429 and 5xx are counted.
        assert!(!text.contains("status=\"404\""), "{text}");
    }

    #[test]
    fn the_classic_text_names_the_counters_series_in_their_type_lines() {
        serving("byoh");
        let text = encode(Format::Classic);
        for line in [
            "# TYPE podhost_busy_refusals_total counter",
            "# TYPE podhost_turns_running gauge",
            // Its value is the process's: other tests here retry model calls.
            "podhost_model_retries_total{endpoint=\"openai\"} ",
            "# TYPE podhost_build_info gauge",
            "# TYPE process_cpu_seconds_total counter",
            "# TYPE process_open_fds gauge",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn accept_headers_get_the_format_prometheus_would() {
        use Format::*;
        for (accept, format) in [
            (None, Classic),
            (Some(""), Classic),
            (Some("*/*"), Classic),
            (Some("text/plain; version=0.0.4"), Classic),
            (Some("application/openmetrics-text"), OpenMetrics("1.0.0")),
            (
                Some("application/openmetrics-text; version=0.0.1"),
                OpenMetrics("0.0.1"),
            ),
            // What Prometheus 3 sends by default.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,\
                     application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;\
                     escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2",
                ),
                OpenMetrics("1.0.0"),
            ),
            // Preference by weight, not order; a version podhost does not write is skipped.
            (
                Some("text/plain;q=0.3, application/openmetrics-text;q=0.9"),
                OpenMetrics("1.0.0"),
            ),
            (Some("application/openmetrics-text;version=2.0.0"), Classic),
            (
                Some("application/openmetrics-text;q=0, text/plain"),
                Classic,
            ),
        ] {
            assert_eq!(negotiate(accept), format, "{accept:?}");
        }
    }
}
