//! The environment a command gets, built in one place.
//!
//! Order, later wins: a clean base (`PATH`, `LANG=C.UTF-8`, `TERM=dumb`, `HOME`, and variables
//! that keep tools from prompting), then the call's own variables (the session's environment,
//! `TRACEPARENT`), then the egress proxy variables and CA bundle paths when configured, which a
//! session cannot override.
//!
//! Two bases. A pod's and the BYOH endpoint's commands start clean: nothing of podhost's own
//! process environment is inherited. Local use (`podhost tool`, `run`, `mcp`) runs commands for
//! the person at the keyboard, as that person: [`BaseEnv::inherited`] keeps their environment
//! (`PATH` with `~/.cargo/bin`, nvm, pyenv; `HOME`; the locale) minus every variable whose name
//! looks like a credential ([`is_credential_name`]) unless it is passed by name.
//!
//! Invariant: a `NYLORUN_*` or `PODHOST_*` name is never given to a command, from the call's
//! variables or an inherited environment: those are podhost's.

use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

/// The variables every command starts from.
#[derive(Clone, PartialEq, Eq)]
pub struct BaseEnv {
    pub path: String,
    pub home: PathBuf,
    /// Variables of the user's own environment (local use only), set before everything else.
    pub inherited: Vec<(String, String)>,
}

impl fmt::Debug for BaseEnv {
    /// Names only: an inherited value is the user's, and may be anything.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BaseEnv")
            .field("path", &self.path)
            .field("home", &self.home)
            .field(
                "inherited",
                &self.inherited.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Default for BaseEnv {
    fn default() -> Self {
        BaseEnv {
            path: DEFAULT_PATH.to_owned(),
            home: PathBuf::from("/tmp"),
            inherited: Vec::new(),
        }
    }
}

/// `PATH` when no other is given.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Words that make a variable's name look like a credential, in any case.
pub const CREDENTIAL_WORDS: [&str; 8] = [
    "KEY",
    "SECRET",
    "TOKEN",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "AUTH",
    "JWT",
];

/// Cloud and registry variables that carry access without one of [`CREDENTIAL_WORDS`] in their
/// names: connection strings with passwords, clients' password variables (MySQL's, sshpass's),
/// the cloud SDKs' session and profile settings, registry configuration that may embed a login.
pub const CREDENTIAL_NAMES: [&str; 16] = [
    "DATABASE_URL",
    "MYSQL_PWD",
    "SSHPASS",
    "REDIS_URL",
    "MONGODB_URI",
    "AMQP_URL",
    "SENTRY_DSN",
    "AWS_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AZURE_CLIENT_CERTIFICATE_PATH",
    "CLOUDSDK_CONFIG",
    "DOCKER_CONFIG",
    "NPM_CONFIG_USERCONFIG",
    "KUBECONFIG",
];

/// Whether a variable of this name is kept from commands in local use unless passed by name:
/// its name holds one of [`CREDENTIAL_WORDS`] (any case), or is one of [`CREDENTIAL_NAMES`] or
/// ends in `_DSN`, or is podhost's own (`PODHOST_*`, `NYLORUN_*`).
pub fn is_credential_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    CREDENTIAL_WORDS.iter().any(|w| upper.contains(w))
        || CREDENTIAL_NAMES.contains(&upper.as_str())
        || upper.ends_with("_DSN")
}

/// What [`BaseEnv::inherited`] kept back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Withheld {
    /// Names that look like credentials, not passed (sorted).
    pub credentials: Vec<String>,
    /// Names passed that are not set (sorted).
    pub unset: Vec<String>,
}

impl BaseEnv {
    /// The base of local use: `vars` (the user's environment) without the names that look like
    /// credentials ([`is_credential_name`]) unless `pass` names them, without podhost's own
    /// (`PODHOST_*`, `NYLORUN_*`, never passed), and without names or values a command line
    /// cannot carry. `PATH` and `HOME` are the user's (their defaults when unset).
    pub fn inherited(
        vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
        pass: &[String],
    ) -> (BaseEnv, Withheld) {
        let mut base = BaseEnv::default();
        let mut withheld = Withheld::default();
        let mut seen = Vec::new();
        for (name, value) in vars {
            let (Ok(name), Ok(value)) = (name.into_string(), value.into_string()) else {
                continue;
            };
            if !is_valid_name(&name) || value.contains('\0') || is_reserved(&name) {
                continue;
            }
            seen.push(name.clone());
            if is_credential_name(&name) && !pass.contains(&name) {
                withheld.credentials.push(name);
                continue;
            }
            match name.as_str() {
                "PATH" => base.path = value,
                "HOME" => base.home = PathBuf::from(value),
                _ => base.inherited.push((name, value)),
            }
        }
        withheld.unset = pass.iter().filter(|p| !seen.contains(p)).cloned().collect();
        withheld.credentials.sort();
        withheld.unset.sort();
        (base, withheld)
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

    /// The proxy and trust variables for a command started now; `forward`: the port of the
    /// session's exit in its own network namespace, which relays to the proxy (see
    /// `exec::net`), so the variables name it instead of the proxy's own address.
    pub fn vars(&self, forward: Option<u16>) -> Vec<(String, String)> {
        let s = self
            .inner
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut out = Vec::new();
        if let Some(proxy) = s.proxy.as_deref() {
            let proxy = match forward {
                Some(port) => local_authority(proxy, port),
                None => proxy.to_owned(),
            };
            proxy_vars(&mut out, &proxy_url(&proxy, s.token.as_deref()));
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

/// The proxy variables naming `url`; loopback stays direct.
fn proxy_vars(out: &mut Vec<(String, String)>, url: &str) {
    for name in PROXY_VARS {
        out.push((name.to_owned(), url.to_owned()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        out.push((name.to_owned(), "localhost,127.0.0.1,::1".to_owned()));
    }
}

/// `proxy` with its host and port replaced by `127.0.0.1:<port>`, its scheme and credentials
/// kept.
fn local_authority(proxy: &str, port: u16) -> String {
    let (scheme, rest) = proxy.split_once("://").unwrap_or(("http", proxy));
    let (userinfo, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (format!("{u}@"), r),
        None => (String::new(), rest),
    };
    let path = rest.find('/').map_or("", |i| &rest[i..]);
    format!("{scheme}://{userinfo}127.0.0.1:{port}{path}")
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
    /// The port of the session's exit in its network namespace (see `exec::net`): the proxy
    /// variables name it.
    pub forward: Option<u16>,
}

impl CommandEnv {
    pub fn new(base: BaseEnv, egress: Option<Egress>) -> Self {
        CommandEnv {
            base,
            egress,
            forward: None,
        }
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
        for (k, v) in &self.base.inherited {
            set(k, v.clone());
        }
        set("PATH", self.base.path.clone());
        set("HOME", self.base.home.to_string_lossy().into_owned());
        let user_locale = self
            .base
            .inherited
            .iter()
            .any(|(k, _)| k == "LANG" || k.starts_with("LC_"));
        for (k, v) in FIXED {
            // The user's own locale stays theirs; the rest keeps commands from waiting on a
            // terminal that is not there.
            if user_locale && (k == "LANG" || k == "LC_ALL") {
                continue;
            }
            set(k, v.to_owned());
        }
        for (k, v) in call {
            if is_valid_name(k) && !is_reserved(k) {
                set(k, v.clone());
            }
        }
        let mut egress = match &self.egress {
            Some(egress) => egress.vars(self.forward),
            None => Vec::new(),
        };
        if let Some(port) = self.forward
            && !egress.iter().any(|(k, _)| k == "HTTP_PROXY")
        {
            // podhost's own proxy, the session's one way out.
            proxy_vars(&mut egress, &format!("http://127.0.0.1:{port}"));
        }
        for (k, v) in egress {
            set(&k, v);
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
        assert_eq!(get(&vars, "no_proxy"), Some("localhost,127.0.0.1,::1"));
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

    #[test]
    fn an_inherited_base_keeps_the_users_environment_but_not_credentials() {
        let vars = [
            ("PATH", "/home/u/.cargo/bin:/usr/bin"),
            ("HOME", "/home/u"),
            ("LANG", "de_DE.UTF-8"),
            ("NVM_DIR", "/home/u/.nvm"),
            ("OPENAI_API_KEY", "sk-1"),
            ("GH_TOKEN", "gh"),
            ("aws_secret_access_key", "s"),
            ("PGPASSWORD", "p"),
            ("MYSQL_PWD", "p"),
            ("SSHPASS", "p"),
            ("SSH_AUTH_SOCK", "/run/ssh"),
            ("DATABASE_URL", "postgres://u:p@h/db"),
            ("SENTRY_DSN", "https://k@sentry"),
            ("AWS_PROFILE", "prod"),
            ("PODHOST_TOKEN", "t"),
            ("NYLORUN_HOST_TOKEN", "t"),
            ("PODHOST_WORKSPACE", "/w"),
            ("NPM_TOKEN", "n"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let (base, withheld) = BaseEnv::inherited(
            vars,
            &["NPM_TOKEN".to_owned(), "NOT_SET_ANYWHERE".to_owned()],
        );
        assert_eq!(base.path, "/home/u/.cargo/bin:/usr/bin");
        assert_eq!(base.home, PathBuf::from("/home/u"));
        assert_eq!(
            withheld,
            Withheld {
                credentials: [
                    "AWS_PROFILE",
                    "DATABASE_URL",
                    "GH_TOKEN",
                    "MYSQL_PWD",
                    "OPENAI_API_KEY",
                    "PGPASSWORD",
                    "SENTRY_DSN",
                    "SSHPASS",
                    "SSH_AUTH_SOCK",
                    "aws_secret_access_key",
                ]
                .map(String::from)
                .to_vec(),
                unset: vec!["NOT_SET_ANYWHERE".to_owned()],
            }
        );
        let vars = CommandEnv::new(base.clone(), None).build(&[("X".into(), "1".into())]);
        let names: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "LANG",
                "NVM_DIR",
                "NPM_TOKEN",
                "PATH",
                "HOME",
                "TERM",
                "PAGER",
                "GIT_PAGER",
                "GIT_TERMINAL_PROMPT",
                "DEBIAN_FRONTEND",
                "NO_COLOR",
                "X"
            ]
        );
        assert_eq!(get(&vars, "LANG"), Some("de_DE.UTF-8"));
        assert_eq!(get(&vars, "NPM_TOKEN"), Some("n"));
        // Values never show in the debug form.
        assert!(!format!("{base:?}").contains("/home/u/.nvm"));
    }
}
