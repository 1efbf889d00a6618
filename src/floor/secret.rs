//! [`Secret`]: a credential as text that never prints itself.

use std::fmt;

use serde::{Deserialize, Serialize};
use url::Url;

/// A secret string: printed as `[redacted]` everywhere; [`Secret::expose`] is the only way out.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The value, for the one place that sends it (a header, a body, the proxy URL).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this secret, compared in time independent of where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), presented.as_bytes());
        let mut diff = (a.len() ^ b.len()) as u64;
        for i in 0..a.len().max(b.len()) {
            let x = a.get(i).copied().unwrap_or(0);
            let y = b.get(i).copied().unwrap_or(0);
            diff |= u64::from(x ^ y);
        }
        diff == 0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// Query parameters whose values are credentials, by a part of their name.
const CREDENTIAL_PARAMS: [&str; 7] = ["key", "token", "secret", "sig", "auth", "pass", "cred"];

/// The credential values a URL carries: its user and password, and the values of query
/// parameters named like a credential.
pub fn url_credentials(u: &Url) -> Vec<String> {
    let mut out = Vec::new();
    if !u.username().is_empty() {
        out.push(decode(u.username()));
    }
    if let Some(p) = u.password() {
        out.push(decode(p));
    }
    for (k, v) in u.query_pairs() {
        let k = k.to_ascii_lowercase();
        if CREDENTIAL_PARAMS.iter().any(|c| k.contains(c)) && !v.is_empty() {
            out.push(v.into_owned());
        }
    }
    out
}

/// Percent-decodes a URL's user-info, as a client sends it.
fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 2 < b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(byte) => {
                out.push(byte);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `url` with its credentials replaced by `redacted`.
pub fn redacted_url(url: &Url) -> Url {
    let mut u = url.clone();
    let secrets = url_credentials(url);
    if secrets.is_empty() {
        return u;
    }
    if !u.username().is_empty() {
        let _ = u.set_username("redacted");
    }
    if u.password().is_some() {
        let _ = u.set_password(Some("redacted"));
    }
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let lower = k.to_ascii_lowercase();
                let v = if CREDENTIAL_PARAMS.iter().any(|c| lower.contains(c)) {
                    "redacted".to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_never_prints_itself() {
        let s: Secret = "hunter2".parse().unwrap();
        assert_eq!(format!("{s} {s:?}"), "[redacted] [redacted]");
        assert_eq!(s.expose(), "hunter2");
        assert!(s.matches("hunter2"));
        for other in ["hunter3", "hunter", "hunter22", ""] {
            assert!(!s.matches(other), "{other}");
        }
    }
}
