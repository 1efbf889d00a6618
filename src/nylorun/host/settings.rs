//! `podhost pod`'s settings, validated: the pod environment (v5 §9), podhost's own variables and
//! the intervals. The command line (`config`) checks them and builds a [`PodConfig`].

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;

use crate::exec::ExecSettings;
use crate::floor::tls::TlsSettings;

/// The harness id rule (`HARNESS_ID_PATTERN`, v5 §0): `^[a-z][a-z0-9-]{1,62}$`.
pub fn is_harness_id(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some('a'..='z'))
        && (2..=63).contains(&s.len())
        && chars.all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-'))
}

/// The validated settings of `podhost pod`.
#[derive(Clone, Debug)]
pub struct PodConfig {
    pub sandbox_id: String,
    pub pod_uid: String,
    pub join_file: PathBuf,
    /// `http(s)://host:port`, for join and renew.
    pub harness_http: Url,
    /// `ws(s)://host:port/nylorun/harness/v1`.
    pub harness_ws: Url,
    pub gates_url: Url,
    pub egress_proxy: Option<String>,
    pub harness_root: PathBuf,
    pub workspace: PathBuf,
    pub skills: PathBuf,
    pub harness_id: String,
    pub concurrency: usize,
    /// `None`: no health listener.
    pub health_port: Option<u16>,
    /// A second address serving `GET /metrics` (`host:port`), besides the health port.
    pub metrics_listen: Option<String>,
    /// Which CA certificates to trust besides the system's, for core and the gates.
    pub tls: TlsSettings,
    pub renew_interval: Duration,
    pub silence_timeout: Duration,
    pub backoff_base: Duration,
    pub backoff_cap: Duration,
    pub join_retry: Duration,
    pub shutdown_deadline: Duration,
    pub exec: ExecSettings,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harness_ids() {
        for ok in ["podhost", "ab", "a-1", &format!("a{}", "b".repeat(62))] {
            assert!(is_harness_id(ok), "{ok}");
        }
        for bad in [
            "a",
            "1a",
            "-a",
            "aB",
            "a_b",
            &format!("a{}", "b".repeat(63)),
        ] {
            assert!(!is_harness_id(bad), "{bad}");
        }
    }
}
