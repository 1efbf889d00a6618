//! podhost's metrics: the one registry, every metric family, the one-line calls that record
//! them, and the text `GET /metrics` answers (the OpenMetrics text format, which Prometheus
//! scrapes).
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
//!
//! Non-goals: serving (the fronts route `/metrics` to [`encode`]), tracing spans, push.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The `Content-Type` of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
            registry: Registry::with_prefix("podhost"),
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
        let r = &mut m.registry;
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
        m
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// Every metric as OpenMetrics text (ends with `# EOF`).
pub fn encode() -> String {
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &METRICS.registry).is_err() {
        // Writing to a String cannot fail; an empty but valid exposition if it ever did.
        return "# EOF\n".to_owned();
    }
    text
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
        let text = encode();
        for name in [
            "# TYPE podhost_turns counter",
            "podhost_turns_total{front=\"byoh\",outcome=\"completed\"} 1",
            "podhost_turns_running{front=\"pod\"} 0",
            "podhost_model_http_errors_total{endpoint=\"openai\",status=\"503\"} 1",
            "# TYPE podhost_store_write_seconds histogram",
            "podhost_busy_refusals_total 0",
            "podhost_tool_call_seconds_bucket{le=\"0.004\",tool=\"read\"} 1",
            "podhost_tool_calls_total{tool=\"read\",outcome=\"completed\"} 1",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        // Only 429 and 5xx are counted.
        assert!(!text.contains("status=\"404\""), "{text}");
    }
}
