//! [`Secret`]: a credential as text that never prints itself.

use std::fmt;

use serde::{Deserialize, Serialize};

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
