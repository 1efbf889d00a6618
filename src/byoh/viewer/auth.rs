//! Signing in to the viewer: a browser cannot send the bearer credential the API takes, so the
//! sign-in page takes it once and the answer sets a cookie the pages are then asked with.
//!
//! Invariants:
//! * The cookie holds no credential: its value is a one-way digest of it
//!   ([`Keys::cookie`]), so every replica sharing the credential accepts it (nothing is kept in
//!   a process) and changing the credential signs every browser out.
//! * The cookie is `HttpOnly` (no script reads it), `SameSite=Strict` (no other site's page
//!   sends it), `Path=/ui`, and `Secure` when the sign-in came over TLS (its `Origin` is
//!   `https://…`, or a TLS front said `X-Forwarded-Proto: https`).
//! * A wrong credential is refused with 401 and the API's error body; what was presented is
//!   never logged or echoed.
//! * The one mutation (cancel) needs a CSRF token, also a digest of the credential (of a key
//!   made at start when none is set), which pages carry and no other site can read.
//!
//! Non-goals: accounts, expiry (the cookie lasts as long as the browser keeps it, and as long
//! as the credential stays the same).

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::floor::secret::Secret;

/// The cookie's name.
pub const COOKIE: &str = "podhost_ui";

/// What the viewer derives from the credential.
#[derive(Clone)]
pub struct Keys {
    /// The credential, when one is set (without one, the endpoint answers loopback only and
    /// the viewer asks for no sign-in).
    token: Option<Arc<Secret>>,
    /// The cookie's value (empty without a credential).
    cookie: Arc<Secret>,
    /// The CSRF token pages carry for cancel.
    csrf: Arc<str>,
}

fn digest(label: &str, key: &str) -> String {
    let mut h = Sha256::new();
    h.update(label.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    hex::encode(h.finalize())
}

impl Keys {
    pub fn new(token: Option<Arc<Secret>>) -> Keys {
        let key = match &token {
            Some(t) => t.expose().to_owned(),
            None => uuid::Uuid::new_v4().to_string(),
        };
        Keys {
            cookie: Arc::new(Secret::new(match &token {
                Some(_) => digest("podhost viewer cookie", &key),
                None => String::new(),
            })),
            csrf: digest("podhost viewer csrf", &key).into(),
            token,
        }
    }

    /// Whether a sign-in is asked for at all.
    pub fn needed(&self) -> bool {
        self.token.is_some()
    }

    /// The CSRF token of cancel.
    pub fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Whether `presented` is the CSRF token, compared in constant time.
    pub fn csrf_matches(&self, presented: &str) -> bool {
        Secret::new(&*self.csrf).matches(presented)
    }

    /// Whether the request carries the viewer's cookie (always, without a credential).
    pub fn signed_in(&self, headers: &HeaderMap) -> bool {
        if !self.needed() {
            return true;
        }
        cookies(headers).any(|(name, value)| name == COOKIE && self.cookie.matches(value))
    }

    /// Checks a presented credential: the `Set-Cookie` value to answer with, or `None`.
    pub fn sign_in(&self, presented: &str, tls: bool) -> Option<String> {
        let token = self.token.as_ref()?;
        if !token.matches(presented) {
            return None;
        }
        let secure = if tls { "; Secure" } else { "" };
        Some(format!(
            "{COOKIE}={}; Path=/ui; HttpOnly; SameSite=Strict{secure}",
            self.cookie.expose()
        ))
    }
}

/// The `name=value` pairs of every `Cookie` header.
fn cookies(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
}

/// Whether the request came over TLS, as far as the server can tell: it listens on plain HTTP,
/// so only a TLS front says so (`X-Forwarded-Proto: https`), or the browser's `Origin`, which
/// the guard already checked names this server.
pub fn over_tls(headers: &HeaderMap) -> bool {
    let is = |name: &str, prefix: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().to_ascii_lowercase().starts_with(prefix))
    };
    is("x-forwarded-proto", "https") || is("origin", "https://")
}

/// The answer to a page asked for without the cookie: to the sign-in page.
pub fn to_sign_in() -> Response {
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, HeaderValue::from_static("/ui/signin"))],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_cookie_is_a_digest_with_the_flags_set() {
        let keys = Keys::new(Some(Arc::new(Secret::new("sesame"))));
        assert_eq!(keys.sign_in("wrong", false), None);
        let set = keys.sign_in("sesame", true).unwrap();
        assert!(!set.contains("sesame"), "{set}");
        assert!(
            set.ends_with("; Path=/ui; HttpOnly; SameSite=Strict; Secure"),
            "{set}"
        );
        let plain = keys.sign_in("sesame", false).unwrap();
        assert!(plain.ends_with("SameSite=Strict"), "{plain}");
        let value = set.split(';').next().unwrap();
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_str(&format!("a=b; {value}")).unwrap(),
        );
        assert!(keys.signed_in(&h));
        h.insert(header::COOKIE, HeaderValue::from_static("podhost_ui=00"));
        assert!(!keys.signed_in(&h));
        assert!(!keys.signed_in(&HeaderMap::new()));
    }
}
