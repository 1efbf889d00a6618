//! The host wing: the pod's own life between the pod and core.
//!
//! * [`pod`] is the main task: settings → state under the harness root → setup → join →
//!   connect → `hello` → lease slots, reconnecting with backoff; SIGTERM/SIGINT → shutdown.
//! * [`join`] holds the host token (join, renew every 5 minutes, join again when refused) and
//!   feeds the egress token and CA bundle to every command.
//! * [`workspace`] serves core's `workspace.*` requests; [`setup`] runs the sandbox's setup.
//! * [`health`] is the loopback `GET /health`; [`settings`] the validated configuration.

pub(crate) mod health;
pub(crate) mod join;
pub mod pod;
pub(crate) mod settings;
pub(crate) mod setup;
pub(crate) mod workspace;

/// Now as ISO 8601 UTC with milliseconds (`2026-01-02T03:04:05.678Z`), as JavaScript's
/// `Date.toISOString` writes it.
pub fn iso_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    iso_from_millis(now.as_millis() as i64)
}

/// Milliseconds since the epoch as ISO 8601 UTC.
pub fn iso_from_millis(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{millis:03}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_dates_match_javascript() {
        assert_eq!(iso_from_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_from_millis(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(
            iso_from_millis(1_798_761_599_999),
            "2026-12-31T23:59:59.999Z"
        );
    }
}
