//! `podhost pod`'s arguments, and their pure validation into a [`PodConfig`].
//!
//! Every setting is read as text and checked here rather than by clap, so that an error names
//! the *variable* a pod sets (`NYLORUN_HARNESS_URL: …`), not a flag nobody passed. Validation
//! reports every problem at once and does no I/O: whether the join file or the directories exist
//! is found out when they are used.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use reqwest::Url;

use super::exec::ExecArgs;
use super::origins::Origins;
use super::tls::TlsArgs;
use crate::nylorun::host::settings::{PodConfig, is_harness_id};
use crate::nylorun::link::protocol::HARNESS_PATH;

/// `podhost pod` arguments. Each has an environment variable; the variable is what a pod sets.
#[derive(Clone, Debug, Args)]
pub struct PodArgs {
    /// The sandbox to join as.
    #[arg(long, env = "NYLORUN_SANDBOX_ID")]
    pub sandbox_id: Option<String>,
    /// The pod's UID.
    #[arg(long, env = "NYLORUN_POD_UID")]
    pub pod_uid: Option<String>,
    /// The mounted join token file; read afresh at each join.
    #[arg(long, env = "NYLORUN_SANDBOX_JOIN_FILE")]
    pub join_file: Option<String>,
    /// Core's Harness API listener, `http://host:port` without the path.
    #[arg(long, env = "NYLORUN_HARNESS_URL")]
    pub harness_url: Option<String>,
    /// The gates (model, tools), for the runs' gate calls.
    #[arg(long, env = "NYLORUN_GATES_URL")]
    pub gates_url: Option<String>,
    /// The egress proxy every command must use (optional).
    #[arg(long, env = "NYLORUN_EGRESS_PROXY")]
    pub egress_proxy: Option<String>,
    /// podhost's state: volume-id, the CA bundle, the setup marker. Default
    /// `NYLORUN_HARNESS_ROOT`, else `/harness`.
    #[arg(long, env = "PODHOST_HARNESS_ROOT")]
    pub harness_root: Option<String>,
    /// The pod environment's name for the harness root (v2 §6.1).
    #[arg(long, env = "NYLORUN_HARNESS_ROOT", hide = true)]
    pub nylorun_harness_root: Option<String>,
    /// The directory the sandbox path `/workspace` maps onto.
    #[arg(long, env = "PODHOST_WORKSPACE")]
    pub workspace: Option<String>,
    /// The directory the sandbox path `/skills` maps onto, where skills are mounted (default
    /// `/skills`).
    #[arg(long, env = "PODHOST_SKILLS")]
    pub skills: Option<String>,
    /// The harness id said in `hello` (default `podhost`).
    #[arg(long, env = "PODHOST_HARNESS_ID")]
    pub harness_id: Option<String>,
    /// How many runs to hold at once: one `lease` waits per free slot (default 1).
    #[arg(long, env = "PODHOST_POD_CONCURRENCY")]
    pub concurrency: Option<String>,
    /// The loopback health port (`GET /health`); 0 turns it off (default 4300).
    #[arg(long, env = "NYLORUN_HARNESS_HEALTH_PORT")]
    pub health_port: Option<String>,
    /// How often to renew the host token, ms (default 300000: 5 minutes).
    #[arg(long, env = "PODHOST_POD_RENEW_INTERVAL_MS")]
    pub renew_interval_ms: Option<String>,
    /// Drop a connection silent this long (no message, ping or pong), ms (default 90000).
    #[arg(long, env = "PODHOST_POD_SILENCE_TIMEOUT_MS")]
    pub silence_timeout_ms: Option<String>,
    /// The first reconnect or retry delay, ms (default 500).
    #[arg(long, env = "PODHOST_POD_BACKOFF_BASE_MS")]
    pub backoff_base_ms: Option<String>,
    /// The longest reconnect or retry delay, ms (default 10000).
    #[arg(long, env = "PODHOST_POD_BACKOFF_CAP_MS")]
    pub backoff_cap_ms: Option<String>,
    /// The delay before joining again after core refused the join token (401), ms (default
    /// 30000): a reset writes a new token, which the next attempt reads.
    #[arg(long, env = "PODHOST_POD_JOIN_RETRY_MS")]
    pub join_retry_ms: Option<String>,
    /// How long SIGTERM may take: releases, kills, exit (default 7000, v2 §6.2).
    #[arg(long, env = "PODHOST_POD_SHUTDOWN_DEADLINE_MS")]
    pub shutdown_deadline_ms: Option<String>,
    /// Where the pod's metrics are also served (`GET /metrics`), e.g. `0.0.0.0:9464` to let
    /// Prometheus scrape the pod's own address; they are always on the loopback health port.
    #[arg(long, env = "PODHOST_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub exec: ExecArgs,
    /// Which settings were given as flags (filled in by `Cli::parse_args`).
    #[arg(skip)]
    pub origins: Origins,
}

/// Every problem found in a front's settings, each naming its flag or variable.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {front} configuration:\n{}", .problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"))]
pub struct SettingsError {
    /// The front: `pod`, `serve`.
    pub front: &'static str,
    /// `"<VARIABLE or --flag>: <what is wrong>"`, in the order of the settings.
    pub problems: Vec<String>,
}

impl SettingsError {
    pub fn new(front: &'static str, problems: Vec<String>) -> Self {
        SettingsError { front, problems }
    }
}

struct Check<'a> {
    problems: Vec<String>,
    origins: &'a Origins,
}

impl Check<'_> {
    /// A problem, named by the flag or the variable that gave the value.
    fn fail(&mut self, var: &str, message: impl std::fmt::Display) {
        self.problems
            .push(format!("{}: {message}", self.origins.name(var)));
    }

    /// A required, non-blank value.
    fn required(&mut self, var: &str, v: &Option<String>) -> Option<String> {
        match v.as_deref().map(str::trim) {
            Some(s) if !s.is_empty() => Some(s.to_owned()),
            _ => {
                self.fail(var, "is not set");
                None
            }
        }
    }

    fn optional(v: &Option<String>) -> Option<String> {
        v.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
    }

    fn number<T: std::str::FromStr>(
        &mut self,
        var: &str,
        v: &Option<String>,
        default: T,
        ok: impl Fn(&T) -> bool,
        rule: &str,
    ) -> T {
        let Some(s) = Check::optional(v) else {
            return default;
        };
        match s.parse::<T>() {
            Ok(n) if ok(&n) => n,
            _ => {
                self.fail(var, format!("{s:?} is not {rule}"));
                default
            }
        }
    }

    fn millis(&mut self, var: &str, v: &Option<String>, default_ms: u64) -> Duration {
        Duration::from_millis(self.number(
            var,
            v,
            default_ms,
            |n| *n > 0,
            "a positive number of milliseconds",
        ))
    }

    /// `host:port` with a port number (the host is resolved when listening).
    fn listen_address(&mut self, var: &str, s: &str) {
        if !is_listen_address(s) {
            self.fail(
                var,
                format!("{s:?} is not host:port (such as 0.0.0.0:9464 or [::]:9464)"),
            );
        }
    }

    fn url(&mut self, var: &str, s: &str, schemes: &[&str]) -> Option<Url> {
        match Url::parse(s) {
            Ok(u) if schemes.contains(&u.scheme()) && u.host_str().is_some() => Some(u),
            Ok(u) => {
                self.fail(
                    var,
                    format!(
                        "{s:?} must be a {} URL with a host (got scheme {:?})",
                        schemes.join("/"),
                        u.scheme()
                    ),
                );
                None
            }
            Err(e) => {
                self.fail(var, format!("{s:?} is not a URL: {e}"));
                None
            }
        }
    }
}

impl PodArgs {
    /// Checks every setting; pure.
    /// Long: one check per setting, each a line or a few, collecting every problem at once.
    pub fn validate(&self) -> Result<PodConfig, SettingsError> {
        let mut c = Check {
            problems: Vec::new(),
            origins: &self.origins,
        };
        let sandbox_id = c.required("NYLORUN_SANDBOX_ID", &self.sandbox_id);
        if let Some(id) = &sandbox_id
            && id.len() > 512
        {
            c.fail("NYLORUN_SANDBOX_ID", "is longer than 512 characters");
        }
        let pod_uid = c.required("NYLORUN_POD_UID", &self.pod_uid);
        if let Some(uid) = &pod_uid
            && !(uid.len() <= 64
                && uid
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '-'))
        {
            c.fail(
                "NYLORUN_POD_UID",
                format!("{uid:?} must be 1 to 64 letters, digits or '-'"),
            );
        }
        let join_file = c.required("NYLORUN_SANDBOX_JOIN_FILE", &self.join_file);
        let harness = c
            .required("NYLORUN_HARNESS_URL", &self.harness_url)
            .and_then(|s| harness_urls(&mut c, &s));
        let gates_url = c
            .required("NYLORUN_GATES_URL", &self.gates_url)
            .and_then(|s| c.url("NYLORUN_GATES_URL", &s, &["http", "https"]));
        let egress_proxy = Check::optional(&self.egress_proxy);
        if let Some(p) = &egress_proxy {
            c.url("NYLORUN_EGRESS_PROXY", p, &["http", "https"]);
        }
        let harness_root = Check::optional(&self.harness_root)
            .or_else(|| Check::optional(&self.nylorun_harness_root))
            .unwrap_or_else(|| "/harness".to_owned());
        let workspace = Check::optional(&self.workspace).unwrap_or_else(|| "/workspace".to_owned());
        let skills = Check::optional(&self.skills).unwrap_or_else(|| "/skills".to_owned());
        let harness_id = Check::optional(&self.harness_id).unwrap_or_else(|| "podhost".to_owned());
        if !is_harness_id(&harness_id) {
            c.fail(
                "PODHOST_HARNESS_ID",
                format!("{harness_id:?} does not match ^[a-z][a-z0-9-]{{1,62}}$"),
            );
        }
        let concurrency = c.number(
            "PODHOST_POD_CONCURRENCY",
            &self.concurrency,
            1usize,
            |n| (1..=64).contains(n),
            "a number from 1 to 64",
        );
        let health_port = c.number(
            "NYLORUN_HARNESS_HEALTH_PORT",
            &self.health_port,
            4300u16,
            |_| true,
            "a port number (0 turns the health listener off)",
        );
        let renew_interval = c.millis(
            "PODHOST_POD_RENEW_INTERVAL_MS",
            &self.renew_interval_ms,
            300_000,
        );
        let silence_timeout = c.millis(
            "PODHOST_POD_SILENCE_TIMEOUT_MS",
            &self.silence_timeout_ms,
            90_000,
        );
        let backoff_base = c.millis("PODHOST_POD_BACKOFF_BASE_MS", &self.backoff_base_ms, 500);
        let backoff_cap = c.millis("PODHOST_POD_BACKOFF_CAP_MS", &self.backoff_cap_ms, 10_000);
        if backoff_cap < backoff_base {
            let base = self.origins.name("PODHOST_POD_BACKOFF_BASE_MS");
            c.fail(
                "PODHOST_POD_BACKOFF_CAP_MS",
                format!("must not be below {base}"),
            );
        }
        let join_retry = c.millis("PODHOST_POD_JOIN_RETRY_MS", &self.join_retry_ms, 30_000);
        let metrics_listen = Check::optional(&self.metrics_listen);
        if let Some(addr) = &metrics_listen {
            c.listen_address("PODHOST_METRICS_LISTEN", addr);
        }
        let shutdown_deadline = c.millis(
            "PODHOST_POD_SHUTDOWN_DEADLINE_MS",
            &self.shutdown_deadline_ms,
            7_000,
        );

        match (sandbox_id, pod_uid, join_file, harness, gates_url) {
            (Some(sandbox_id), Some(pod_uid), Some(join_file), Some((http, ws)), Some(gates))
                if c.problems.is_empty() =>
            {
                Ok(PodConfig {
                    sandbox_id,
                    pod_uid,
                    join_file: PathBuf::from(join_file),
                    harness_http: http,
                    harness_ws: ws,
                    gates_url: gates,
                    egress_proxy,
                    harness_root: PathBuf::from(harness_root),
                    workspace: PathBuf::from(workspace),
                    skills: PathBuf::from(skills),
                    harness_id,
                    concurrency,
                    health_port: (health_port != 0).then_some(health_port),
                    metrics_listen,
                    tls: self.tls.settings(&self.origins),
                    renew_interval,
                    silence_timeout,
                    backoff_base,
                    backoff_cap,
                    join_retry,
                    shutdown_deadline,
                    exec: self.exec.isolated_settings(super::exec::Sessions::One),
                })
            }
            _ => Err(SettingsError::new("pod", c.problems)),
        }
    }
}

/// Whether `s` has the form `host:port` (an IPv6 host in brackets) with a port number.
pub(super) fn is_listen_address(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty()
                && port.parse::<u16>().is_ok()
                && (!host.contains(':') || (host.starts_with('[') && host.ends_with(']')))
        }
        None => false,
    }
}

/// `NYLORUN_HARNESS_URL` → (the HTTP base for join/renew, the WebSocket URL). `http`↔`ws` and
/// `https`↔`wss` are accepted either way round. The spec gives the URL "without the path", so a
/// path is refused rather than guessed at.
fn harness_urls(c: &mut Check, s: &str) -> Option<(Url, Url)> {
    const VAR: &str = "NYLORUN_HARNESS_URL";
    let url = c.url(VAR, s, &["http", "https", "ws", "wss"])?;
    if url.path() != "/" && !url.path().is_empty() {
        c.fail(
            VAR,
            format!(
                "{s:?} must be http(s)://host:port without a path (podhost adds {})",
                HARNESS_PATH
            ),
        );
        return None;
    }
    if url.query().is_some() || url.fragment().is_some() {
        c.fail(VAR, format!("{s:?} must not carry a query or fragment"));
        return None;
    }
    let (http_scheme, ws_scheme) = match url.scheme() {
        "http" | "ws" => ("http", "ws"),
        _ => ("https", "wss"),
    };
    let mut http = url.clone();
    let mut ws = url;
    // `set_scheme` refuses some special↔special changes; rebuilding from text never does.
    let rebuild = |u: &mut Url, scheme: &str, path: &str| -> Option<Url> {
        let host = u.host_str()?.to_owned();
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let port = u.port().map(|p| format!(":{p}")).unwrap_or_default();
        Url::parse(&format!("{scheme}://{host}{port}{path}")).ok()
    };
    let h = rebuild(&mut http, http_scheme, "");
    let w = rebuild(&mut ws, ws_scheme, HARNESS_PATH);
    match (h, w) {
        (Some(h), Some(w)) => Some((h, w)),
        _ => {
            c.fail(
                VAR,
                format!("{s:?} could not be turned into a WebSocket URL"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[derive(clap::Parser)]
    struct Wrap {
        #[command(flatten)]
        pod: PodArgs,
    }

    /// Nothing set (the flags, not the environment, so the test process's variables do not
    /// matter).
    fn empty() -> PodArgs {
        let mut a = <Wrap as clap::Parser>::parse_from(["t"]).pod;
        a.sandbox_id = None;
        a.pod_uid = None;
        a.join_file = None;
        a.harness_url = None;
        a.gates_url = None;
        a.egress_proxy = None;
        a.harness_root = None;
        a.nylorun_harness_root = None;
        a.workspace = None;
        a.harness_id = None;
        a.concurrency = None;
        a.health_port = None;
        a.renew_interval_ms = None;
        a.silence_timeout_ms = None;
        a.backoff_base_ms = None;
        a.backoff_cap_ms = None;
        a.join_retry_ms = None;
        a.shutdown_deadline_ms = None;
        a.metrics_listen = None;
        a.tls.ca_file = None;
        a.tls.ssl_cert_file = None;
        a
    }

    fn good() -> PodArgs {
        let mut a = empty();
        a.sandbox_id = Some("sbx_1".into());
        a.pod_uid = Some("0b6c-11ee".into());
        a.join_file = Some("/var/run/join".into());
        a.harness_url = Some("http://core:4200".into());
        a.gates_url = Some("http://gates:4100".into());
        a
    }

    #[test]
    fn defaults_follow_the_spec() {
        let c = good().validate().unwrap();
        assert_eq!(c.harness_http.as_str(), "http://core:4200/");
        assert_eq!(c.harness_ws.as_str(), "ws://core:4200/nylorun/harness/v1");
        assert_eq!(c.harness_root, PathBuf::from("/harness"));
        assert_eq!(c.workspace, PathBuf::from("/workspace"));
        assert_eq!(c.skills, PathBuf::from("/skills"));
        assert_eq!(c.harness_id, "podhost");
        assert_eq!(c.concurrency, 1);
        assert_eq!(c.health_port, Some(4300));
        assert_eq!(c.renew_interval, Duration::from_secs(300));
        assert_eq!(c.silence_timeout, Duration::from_secs(90));
        assert_eq!(c.shutdown_deadline, Duration::from_secs(7));
        let mut a = good();
        a.harness_url = Some("https://core.example:443/".into());
        a.nylorun_harness_root = Some("/vol".into());
        a.health_port = Some("0".into());
        let c = a.validate().unwrap();
        assert_eq!(
            c.harness_ws.as_str(),
            "wss://core.example/nylorun/harness/v1"
        );
        assert_eq!(c.harness_root, PathBuf::from("/vol"));
        assert_eq!(c.health_port, None);
    }

    #[test]
    fn a_problem_names_the_flag_when_the_flag_was_given() {
        let mut a = good();
        a.health_port = Some("x".into());
        a.metrics_listen = Some("9464".into());
        a.origins = <Wrap as clap::CommandFactory>::command()
            .try_get_matches_from(["t", "--health-port", "x"])
            .map(|m| Origins::from_matches(&<Wrap as clap::CommandFactory>::command(), &m))
            .unwrap();
        let e = a.validate().unwrap_err();
        assert_eq!(
            e.problems,
            vec![
                "--health-port: \"x\" is not a port number (0 turns the health listener off)",
                "PODHOST_METRICS_LISTEN: \"9464\" is not host:port (such as 0.0.0.0:9464 or [::]:9464)",
            ]
        );
    }

    #[test]
    fn every_problem_names_its_variable() {
        let e = empty().validate().unwrap_err();
        assert_eq!(
            e.problems,
            vec![
                "NYLORUN_SANDBOX_ID: is not set",
                "NYLORUN_POD_UID: is not set",
                "NYLORUN_SANDBOX_JOIN_FILE: is not set",
                "NYLORUN_HARNESS_URL: is not set",
                "NYLORUN_GATES_URL: is not set",
            ]
        );
        let mut a = good();
        a.pod_uid = Some("has space".into());
        a.harness_url = Some("http://core:4200/nylorun/harness/v1".into());
        a.egress_proxy = Some("not a url".into());
        a.harness_id = Some("Podhost".into());
        a.concurrency = Some("0".into());
        a.silence_timeout_ms = Some("soon".into());
        let e = a.validate().unwrap_err();
        assert_eq!(
            e.problems,
            vec![
                "NYLORUN_POD_UID: \"has space\" must be 1 to 64 letters, digits or '-'",
                "NYLORUN_HARNESS_URL: \"http://core:4200/nylorun/harness/v1\" must be http(s)://host:port without a path (podhost adds /nylorun/harness/v1)",
                "NYLORUN_EGRESS_PROXY: \"not a url\" is not a URL: relative URL without a base",
                "PODHOST_HARNESS_ID: \"Podhost\" does not match ^[a-z][a-z0-9-]{1,62}$",
                "PODHOST_POD_CONCURRENCY: \"0\" is not a number from 1 to 64",
                "PODHOST_POD_SILENCE_TIMEOUT_MS: \"soon\" is not a positive number of milliseconds",
            ]
        );
    }
}
