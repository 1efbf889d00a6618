//! The bearer credential of an HTTP request, the same for every front.
//!
//! Invariants: the scheme (`Bearer`) is matched without regard to case (RFC 9110 §11.1); the
//! credential is compared in time independent of where it differs; nothing here logs or returns
//! what was presented.

use axum::http::{HeaderMap, header};

use crate::floor::secret::Secret;

/// Why a request's credential is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unauthorized {
    /// No `Authorization: Bearer …` header.
    Missing,
    /// A bearer credential that is not the one set.
    Wrong,
}

impl Unauthorized {
    /// What the caller is told.
    pub fn message(self) -> &'static str {
        match self {
            Unauthorized::Missing => "an Authorization: Bearer credential is required",
            Unauthorized::Wrong => "the credential is wrong",
        }
    }
}

/// The credential of an `Authorization` header value: after the `Bearer` scheme, whose case
/// does not matter, and one or more spaces.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, rest) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// Whether `headers` carry `credential` as a bearer credential.
pub fn check(headers: &HeaderMap, credential: &Secret) -> Result<(), Unauthorized> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    match presented {
        Some(p) if credential.matches(p) => Ok(()),
        Some(_) => Err(Unauthorized::Wrong),
        None => Err(Unauthorized::Missing),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_bearer_scheme_is_matched_without_case() {
        for (value, want) in [
            ("Bearer abc", Some("abc")),
            ("bearer abc", Some("abc")),
            ("BEARER   abc ", Some("abc")),
            ("Basic abc", None),
            ("Bearerabc", None),
            ("abc", None),
        ] {
            assert_eq!(bearer(value), want, "{value}");
        }
    }

    #[test]
    fn the_credential_is_checked_whole() {
        let secret = Secret::new("abc");
        let with = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, HeaderValue::from_static(v));
            check(&h, &secret)
        };
        assert_eq!(with("bEaReR abc"), Ok(()));
        assert_eq!(with("Bearer abcd"), Err(Unauthorized::Wrong));
        assert_eq!(with("Basic abc"), Err(Unauthorized::Missing));
        assert_eq!(
            check(&HeaderMap::new(), &secret),
            Err(Unauthorized::Missing)
        );
    }
}
