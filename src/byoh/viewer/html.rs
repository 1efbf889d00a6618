//! The viewer's one escaping helper and the page frame every page is drawn in.
//!
//! Invariants: every text that comes from a session (ids, messages, tool arguments and results,
//! errors) or from a request reaches a page through [`esc`] (or [`query`], which escapes too); the
//! markup around it is literal. Pages load their style and script from `/ui/assets/` only, so the
//! Content-Security-Policy needs no `unsafe-inline`.
//!
//! Non-goals: templates; what a page shows (see `pages`).

use std::fmt::Write;

/// `text` with the five characters that mean something in HTML (`& < > " '`) replaced by their
/// entities: safe in element content and in a quoted attribute value.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A query string of `pairs` (form-encoded, then escaped for the attribute it goes in).
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut s = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        s.append_pair(k, v);
    }
    esc(&s.finish())
}

/// A whole page: the head with the embedded style and script, a header, then `body` (markup
/// made with [`esc`]).
pub fn page(title: &str, body: &str) -> String {
    let mut out = String::with_capacity(body.len() + 1024);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · podhost</title>\
         <link rel=\"stylesheet\" href=\"/ui/assets/viewer.css\">\
         <script src=\"/ui/assets/viewer.js\" defer></script></head>\
         <body><header><a class=\"home\" href=\"/ui/\">podhost sessions</a></header>\
         <main>{body}</main></body></html>\n",
        esc(title)
    );
    out
}

/// A time (ms since the epoch) as `YYYY-MM-DD HH:MM:SS` in UTC.
pub fn time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rest = secs.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// The date of a day number (days since 1970-01-01), by Howard Hinnant's algorithm.
fn civil(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A duration in ms, to a tenth of a second under a minute, then minutes and seconds.
pub fn duration(ms: i64) -> String {
    let ms = ms.max(0);
    if ms < 60_000 {
        return format!("{:.1} s", ms as f64 / 1000.0);
    }
    let s = ms / 1000;
    if s < 3600 {
        return format!("{} min {} s", s / 60, s % 60);
    }
    format!("{} h {} min", s / 3600, s / 60 % 60)
}

/// A count the model may not have reported: its digits, or `—` when unknown.
pub fn count(n: Option<u64>) -> String {
    n.map_or_else(|| "—".to_owned(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn markup_in_text_is_escaped() {
        assert_eq!(
            esc("<script>alert(1)</script>\"><img src=x onerror='a'>&"),
            "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x \
             onerror=&#39;a&#39;&gt;&amp;"
        );
        assert_eq!(query(&[("q", "a&b\"<")]), "q=a%26b%22%3C");
    }

    #[test]
    fn times_and_durations_read_as_people_write_them() {
        assert_eq!(time(0), "1970-01-01 00:00:00");
        assert_eq!(time(1_767_225_599_000), "2025-12-31 23:59:59");
        assert_eq!(time(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(duration(1234), "1.2 s");
        assert_eq!(duration(125_000), "2 min 5 s");
        assert_eq!(duration(7_380_000), "2 h 3 min");
        assert_eq!(
            (count(Some(1234)), count(None)),
            ("1234".into(), "—".into())
        );
    }
}
