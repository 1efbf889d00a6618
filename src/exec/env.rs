//! The environment a command gets, built in one place.
//!
//! Order, later wins: a clean base (`PATH`, `LANG=C.UTF-8`, `TERM=dumb`, `HOME`, and variables
//! that keep tools from prompting), then the call's own variables (the session's environment,
//! `TRACEPARENT`), then the egress proxy variables and CA bundle paths when configured, which a
//! session cannot override.
//!
//! Invariant: nothing of podhost's own process environment is inherited. A `NYLORUN_*` or
//! `PODHOST_*` name in the call's variables is dropped: those are podhost's, never a command's.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

/// The variables every command starts from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseEnv {
    pub path: String,
    pub home: PathBuf,
}

impl Default for BaseEnv {
    fn default() -> Self {
        BaseEnv {
            path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
            home: PathBuf::from("/tmp"),
        }
    }
}

/// Fixed variables that keep commands non-interactive.
const FIXED: [(&str, &str); 8] = [
    ("LANG", "C.UTF-8"),
    ("LC_ALL", "C.UTF-8"),
    ("TERM", "dumb"),
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GIT_TERMINAL_PROMPT", "0"),
    ("DEBIAN_FRONTEND", "noninteractive"),
    ("NO_COLOR", "1"),
];

/// Names of the trust-bundle variables pointed at the egress CA bundle.
pub const CA_BUNDLE_VARS: [&str; 6] = [
    "SSL_CERT_FILE",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "GIT_SSL_CAINFO",
    "AWS_CA_BUNDLE",
];

const PROXY_VARS: [&str; 4] = ["HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"];

/// The egress proxy and the current egress token, shared with whatever renews them, so that a
/// renewed token reaches the next command.
#[derive(Clone, Default)]
pub struct Egress {
    inner: Arc<RwLock<EgressState>>,
}

#[derive(Clone, Default)]
struct EgressState {
    /// `NYLORUN_EGRESS_PROXY`, e.g. `http://egress:4200`.
    proxy: Option<String>,
    /// The egress token: the proxy password (user `nylorun`).
    token: Option<String>,
    ca_bundle: Option<PathBuf>,
}

impl fmt::Debug for Egress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.inner.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Egress")
            .field("proxy", &s.proxy)
            .field("token", &s.token.as_ref().map(|_| "[redacted]"))
            .field("ca_bundle", &s.ca_bundle)
            .finish()
    }
}

impl Egress {
    pub fn new(proxy: Option<String>) -> Self {
        let e = Egress::default();
        e.inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .proxy = proxy;
        e
    }

    pub fn set_token(&self, token: Option<String>) {
        self.inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .token = token;
    }

    pub fn set_ca_bundle(&self, path: Option<PathBuf>) {
        self.inner
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .ca_bundle = path;
    }

    pub fn proxy(&self) -> Option<String> {
        self.inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .proxy
            .clone()
    }

    /// The proxy and trust variables for a command started now.
    pub fn vars(&self) -> Vec<(String, String)> {
        let s = self
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut out = Vec::new();
        if let Some(proxy) = s.proxy.as_deref() {
            let url = proxy_url(proxy, s.token.as_deref());
            for name in PROXY_VARS {
                out.push((name.to_owned(), url.clone()));
            }
            for name in ["NO_PROXY", "no_proxy"] {
                out.push((name.to_owned(), "localhost,127.0.0.1".to_owned()));
            }
        }
        if let Some(bundle) = s.ca_bundle {
            let bundle = bundle.to_string_lossy().into_owned();
            for name in CA_BUNDLE_VARS {
                out.push((name.to_owned(), bundle.clone()));
            }
        }
        out
    }
}

/// `http://nylorun:<token>@host:port` from the proxy URL (trailing `/` dropped). The token is
/// percent-encoded where it holds characters a URL's user-info cannot.
fn proxy_url(proxy: &str, token: Option<&str>) -> String {
    let proxy = proxy.trim_end_matches('/');
    let Some(token) = token else {
        return proxy.to_owned();
    };
    let (scheme, rest) = match proxy.split_once("://") {
        Some((s, r)) => (s, r),
        None => ("http", proxy),
    };
    // Drop any credentials the configured URL carried: the egress token is the password.
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://nylorun:{}@{rest}", encode_userinfo(token))
}

fn encode_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Builds each command's environment.
#[derive(Clone, Debug, Default)]
pub struct CommandEnv {
    pub base: BaseEnv,
    pub egress: Option<Egress>,
}

impl CommandEnv {
    pub fn new(base: BaseEnv, egress: Option<Egress>) -> Self {
        CommandEnv { base, egress }
    }

    /// The whole environment for one command, `call` being the call's own variables.
    pub fn build(&self, call: &[(String, String)]) -> Vec<(String, String)> {
        let mut vars: Vec<(String, String)> = Vec::with_capacity(16 + call.len());
        let mut set = |name: &str, value: String| {
            if let Some(slot) = vars.iter_mut().find(|(n, _)| n == name) {
                slot.1 = value;
            } else {
                vars.push((name.to_owned(), value));
            }
        };
        set("PATH", self.base.path.clone());
        set("HOME", self.base.home.to_string_lossy().into_owned());
        for (k, v) in FIXED {
            set(k, v.to_owned());
        }
        for (k, v) in call {
            if is_valid_name(k) && !is_reserved(k) {
                set(k, v.clone());
            }
        }
        if let Some(egress) = &self.egress {
            for (k, v) in egress.vars() {
                set(&k, v);
            }
        }
        vars
    }
}

/// Names a command never receives from a call: podhost's own configuration.
fn is_reserved(name: &str) -> bool {
    name.starts_with("NYLORUN_") || name.starts_with("PODHOST_")
}

/// A name `execve` can carry: non-empty, no `=` and no NUL.
fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.contains('\0')
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn get<'a>(vars: &'a [(String, String)], name: &str) -> Option<&'a str> {
        vars.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn base_then_call_then_egress() {
        let egress = Egress::new(Some("http://egress:4200/".to_owned()));
        egress.set_token(Some("tok/en".to_owned()));
        egress.set_ca_bundle(Some(PathBuf::from("/harness/egress-ca-bundle.pem")));
        let env = CommandEnv::new(BaseEnv::default(), Some(egress.clone()));
        let vars = env.build(&[
            ("FOO".into(), "bar".into()),
            ("HTTPS_PROXY".into(), "http://evil".into()),
            ("NYLORUN_HOST_TOKEN".into(), "x".into()),
            ("BAD=NAME".into(), "x".into()),
        ]);
        assert_eq!(get(&vars, "FOO"), Some("bar"));
        assert_eq!(get(&vars, "LANG"), Some("C.UTF-8"));
        assert_eq!(get(&vars, "TERM"), Some("dumb"));
        assert_eq!(
            get(&vars, "HTTPS_PROXY"),
            Some("http://nylorun:tok%2Fen@egress:4200")
        );
        assert_eq!(get(&vars, "no_proxy"), Some("localhost,127.0.0.1"));
        assert_eq!(
            get(&vars, "CURL_CA_BUNDLE"),
            Some("/harness/egress-ca-bundle.pem")
        );
        assert_eq!(get(&vars, "NYLORUN_HOST_TOKEN"), None);
        assert!(vars.iter().all(|(n, _)| !n.contains('=')));

        // A renewed token reaches the next command.
        egress.set_token(Some("renewed".to_owned()));
        assert_eq!(
            get(&env.build(&[]), "http_proxy"),
            Some("http://nylorun:renewed@egress:4200")
        );
        assert!(!format!("{egress:?}").contains("renewed"));
    }
}
