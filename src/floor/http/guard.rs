//! The guard every HTTP front puts before its routes' handlers, so that no request a web page
//! can make a browser send reaches one.
//!
//! A page the operator visits can make the browser send "simple" requests anywhere (a `POST`
//! with a `text/plain`, form or multipart body, or with none, and no preflight), and through DNS
//! rebinding it can point a name it controls at 127.0.0.1 and read the answers. The guard
//! refuses, in this order:
//!
//! * **A foreign `Host`** (403), while no credential is set: only `localhost`, `127.0.0.1`,
//!   `[::1]` and the address listened on (with any port, or none) name this server; a rebinding
//!   page's requests carry the page's own name. With a credential any name is accepted: a pod is
//!   reached by its IP and by service names, and the credential, which no page has, guards it.
//! * **A foreign `Origin`** (403), with or without a credential: a request that carries `Origin`
//!   must come from this server's own origin (`http://` or `https://` and the request's `Host`,
//!   the same port); `Origin: null` (sandboxed frames, local files) is foreign too. Server-side
//!   clients (Oumi's evaluator, the MCP SDKs) send no `Origin`. A browser's preflight for a
//!   cross-site JSON request carries `Origin`, so it is refused as well (or answered 405 where
//!   `OPTIONS` is no route).
//! * **A `POST` that is not `application/json`** (415; parameters such as `charset` allowed):
//!   the only bodies a page can send cross-site without a preflight are `text/plain`, form and
//!   multipart ones.
//!
//! Invariants: the check is a pure function of the method, the target and the headers
//! ([`Guard::check`]); a refusal never reads the body; each front words the response
//! ([`Refuse`]), so its refusals keep its one error body. The guard wraps each route's handlers
//! ([`Guard::wrap`]), not the answer for a method that is no route: that still gets its 405,
//! which runs no handler, rather than a refusal that would hide it. A service that answers
//! every method itself (rmcp's) is wrapped whole ([`Guard::around`]).
//!
//! Non-goals: authentication (see [`super::auth`]), CORS (podhost grants no page access).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::MethodRouter;
use tracing::debug;

use crate::floor::text::clip_chars;

/// How a front answers a refusal: the status and the message, in its own error body.
pub type Refuse = fn(StatusCode, String) -> Response;

/// Why the guard refused a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 403 for `Host` and `Origin`, 415 for the content type.
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    fn forbidden(message: String) -> Self {
        Refusal {
            status: StatusCode::FORBIDDEN,
            message,
        }
    }
}

/// The guard of one listener; see the module doc.
#[derive(Clone)]
pub struct Guard {
    /// The host names that name this server (lower case, IPv6 without brackets); `None` while
    /// a credential is set: any name.
    hosts: Option<Arc<[String]>>,
    refuse: Refuse,
}

/// A `Host` or an origin's authority: the name in lower case (IPv6 without brackets) and the
/// port, if given.
#[derive(Debug, PartialEq, Eq)]
struct Named {
    host: String,
    port: Option<u16>,
}

impl Named {
    fn of(authority: &Authority) -> Named {
        Named {
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase(),
            port: authority.port_u16(),
        }
    }
}

/// Header text as it is quoted in a refusal: at most 200 characters.
fn quoted(text: &str) -> String {
    format!("{:?}", clip_chars(text, 200))
}

impl Guard {
    /// The guard of a listener bound to `listen`; `credential`: whether callers must send one.
    pub fn new(listen: SocketAddr, credential: bool, refuse: Refuse) -> Guard {
        let hosts = (!credential).then(|| {
            let mut hosts = vec![
                "localhost".to_owned(),
                "127.0.0.1".to_owned(),
                "::1".to_owned(),
            ];
            let own = listen.ip().to_string();
            if !hosts.contains(&own) {
                hosts.push(own);
            }
            Arc::from(hosts)
        });
        Guard { hosts, refuse }
    }

    /// `route` with the guard before each of its handlers (and not before its answer for a
    /// method it does not have). `route` must have a handler.
    pub fn wrap<S: Clone + Send + Sync + 'static>(
        &self,
        route: MethodRouter<S>,
    ) -> MethodRouter<S> {
        route.route_layer(middleware::from_fn_with_state(self.clone(), guard))
    }

    /// `router` with the guard before everything it answers: for routes that are services
    /// answering every method themselves (their 405 is theirs, and comes after the guard).
    pub fn around<S: Clone + Send + Sync + 'static>(&self, router: Router<S>) -> Router<S> {
        router.layer(middleware::from_fn_with_state(self.clone(), guard))
    }

    /// The names a request must use without a credential, as a refusal lists them.
    fn names(hosts: &[String]) -> String {
        let shown: Vec<String> = hosts
            .iter()
            .map(|h| {
                if h.contains(':') {
                    format!("[{h}]")
                } else {
                    h.clone()
                }
            })
            .collect();
        shown.join(", ")
    }

    /// Whether a request with this method, target and headers may reach the routes.
    pub fn check(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), Refusal> {
        let host = Self::host(uri, headers)?;
        if let Some(hosts) = &self.hosts {
            let names = Self::names(hosts);
            let Some(named) = &host else {
                return Err(Refusal::forbidden(format!(
                    "the request names no Host: without a credential podhost answers only \
                     requests addressed to {names}"
                )));
            };
            // An absolute target names the server too: both must be ours.
            let target = uri.authority().map(Named::of);
            for n in std::iter::once(named).chain(target.as_ref()) {
                if !hosts.contains(&n.host) {
                    return Err(Refusal::forbidden(format!(
                        "the Host {} does not name this server: without a credential podhost \
                         answers only requests addressed to {names} (set a credential to be \
                         reached by other names)",
                        quoted(&n.host)
                    )));
                }
            }
        }
        for origin in headers.get_all(header::ORIGIN) {
            let text = String::from_utf8_lossy(origin.as_bytes());
            if !host.as_ref().is_some_and(|h| same_origin(&text, h)) {
                return Err(Refusal::forbidden(format!(
                    "the Origin {} is not this server's: podhost answers no request that a page \
                     from another origin makes a browser send",
                    quoted(&text)
                )));
            }
        }
        if method == Method::POST {
            check_json(headers)?;
        }
        Ok(())
    }

    /// The request's `Host` (or, without one, its absolute target's authority).
    fn host(uri: &Uri, headers: &HeaderMap) -> Result<Option<Named>, Refusal> {
        let mut values = headers.get_all(header::HOST).iter();
        let Some(value) = values.next() else {
            return Ok(uri.authority().map(Named::of));
        };
        if values.next().is_some() {
            return Err(Refusal::forbidden(
                "the request names more than one Host".to_owned(),
            ));
        }
        let text = String::from_utf8_lossy(value.as_bytes());
        Authority::try_from(text.as_ref())
            .map(|a| Some(Named::of(&a)))
            .map_err(|_| {
                Refusal::forbidden(format!("the Host {} is not a host name", quoted(&text)))
            })
    }
}

/// The port a scheme implies when an origin or a `Host` omits it.
fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

/// Whether the `Origin` value `text` is the origin of a server reached as `host`.
fn same_origin(text: &str, host: &Named) -> bool {
    let Ok(uri) = text.trim().parse::<Uri>() else {
        return false;
    };
    let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        return false;
    };
    let scheme = scheme.to_ascii_lowercase();
    if !(scheme == "http" || scheme == "https") || !matches!(uri.path(), "" | "/") {
        return false;
    }
    let origin = Named::of(authority);
    let port = default_port(&scheme);
    origin.host == host.host && origin.port.unwrap_or(port) == host.port.unwrap_or(port)
}

/// A `POST` body must be declared `application/json` (parameters allowed), once.
fn check_json(headers: &HeaderMap) -> Result<(), Refusal> {
    let unsupported = |message: String| Refusal {
        status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
        message,
    };
    let mut values = headers.get_all(header::CONTENT_TYPE).iter();
    let Some(value) = values.next() else {
        return Err(unsupported(
            "a POST must send its body as JSON, with Content-Type: application/json (this one \
             has no Content-Type)"
                .to_owned(),
        ));
    };
    if values.next().is_some() {
        return Err(unsupported(
            "a POST must send its body as JSON, with one Content-Type: application/json (this \
             one has several)"
                .to_owned(),
        ));
    }
    let text = String::from_utf8_lossy(value.as_bytes());
    let essence = text.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    Err(unsupported(format!(
        "a POST must send its body as JSON, with Content-Type: application/json, not {}",
        quoted(&text)
    )))
}

async fn guard(State(g): State<Guard>, req: Request, next: Next) -> Response {
    match g.check(req.method(), req.uri(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            debug!(status = refusal.status.as_u16(), why = %refusal.message, "request refused");
            (g.refuse)(refusal.status, refusal.message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use axum::response::IntoResponse;
    use pretty_assertions::assert_eq;

    fn refuse(status: StatusCode, message: String) -> Response {
        (status, message).into_response()
    }

    fn guard(credential: bool) -> Guard {
        Guard::new("127.0.0.1:8080".parse().unwrap(), credential, refuse)
    }

    /// The status the guard answers for a request, or 200 when it lets it through.
    fn status(g: &Guard, method: Method, headers: &[(&str, &str)]) -> u16 {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let uri: Uri = "/submit".parse().unwrap();
        match g.check(&method, &uri, &h) {
            Ok(()) => 200,
            Err(r) => r.status.as_u16(),
        }
    }

    #[test]
    fn without_a_credential_only_loopback_names_and_the_listen_address_are_hosts() {
        let g = guard(false);
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.0.0.1:9",
            "[::1]",
            "[::1]:8080",
        ] {
            assert_eq!(status(&g, Method::GET, &[("host", host)]), 200, "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.2:8080",
            "10.0.0.5:8080",
            "",
        ] {
            assert_eq!(status(&g, Method::GET, &[("host", host)]), 403, "{host}");
        }
        assert_eq!(status(&g, Method::GET, &[]), 403, "no Host at all");
        assert_eq!(
            status(&g, Method::GET, &[("host", "localhost"), ("host", "evil")]),
            403
        );
        // Bound to another loopback address, that address names the server too.
        let other = Guard::new("127.0.0.2:80".parse().unwrap(), false, refuse);
        assert_eq!(status(&other, Method::GET, &[("host", "127.0.0.2")]), 200);
        // With a credential, any name.
        let g = guard(true);
        assert_eq!(status(&g, Method::GET, &[("host", "10.0.0.5:8080")]), 200);
        assert_eq!(status(&g, Method::GET, &[]), 200);
    }

    #[test]
    fn an_origin_must_be_the_servers_own_with_or_without_a_credential() {
        for credential in [false, true] {
            let g = guard(credential);
            let with = |origin: &str| {
                status(
                    &g,
                    Method::GET,
                    &[("host", "127.0.0.1:8080"), ("origin", origin)],
                )
            };
            for same in [
                "http://127.0.0.1:8080",
                "HTTP://127.0.0.1:8080/",
                "https://127.0.0.1:8080",
            ] {
                assert_eq!(with(same), 200, "{same}");
            }
            for foreign in [
                "https://evil.example",
                "http://localhost:8080",
                "http://127.0.0.1:8081",
                "http://127.0.0.1",
                "null",
                "file://",
                "ws://127.0.0.1:8080",
                "http://127.0.0.1:8080/page",
                "",
            ] {
                assert_eq!(with(foreign), 403, "{foreign}");
            }
        }
        // Default ports: a Host without a port is the origin's scheme's default.
        let g = guard(true);
        let h = |host: &str, origin: &str| {
            status(&g, Method::GET, &[("host", host), ("origin", origin)])
        };
        assert_eq!(h("podhost.example", "https://podhost.example"), 200);
        assert_eq!(h("podhost.example", "https://podhost.example:443"), 200);
        assert_eq!(h("podhost.example:443", "https://podhost.example"), 200);
        assert_eq!(h("podhost.example", "http://podhost.example:8080"), 403);
        assert_eq!(status(&g, Method::GET, &[("origin", "http://x")]), 403);
    }

    #[test]
    fn a_post_must_be_json() {
        let g = guard(true);
        let post = |ct: Option<&str>| {
            let mut h = vec![("host", "127.0.0.1:8080")];
            h.extend(ct.map(|c| ("content-type", c)));
            status(&g, Method::POST, &h)
        };
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON ;charset=UTF-8",
        ] {
            assert_eq!(post(Some(ok)), 200, "{ok}");
        }
        for refused in [
            "text/plain",
            "text/plain; charset=utf-8",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "application/json-patch+json",
            "",
        ] {
            assert_eq!(post(Some(refused)), 415, "{refused}");
        }
        assert_eq!(post(None), 415);
        // Other methods carry no body a page can forge.
        assert_eq!(status(&g, Method::GET, &[("host", "x")]), 200);
    }

    #[test]
    fn refusals_say_why_and_what_is_accepted() {
        let g = guard(false);
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("evil.example:8080"));
        let uri: Uri = "/".parse().unwrap();
        assert_eq!(
            g.check(&Method::GET, &uri, &h),
            Err(Refusal::forbidden(
                "the Host \"evil.example\" does not name this server: without a credential \
                 podhost answers only requests addressed to localhost, 127.0.0.1, [::1] (set a \
                 credential to be reached by other names)"
                    .to_owned()
            ))
        );
        h.insert(header::HOST, HeaderValue::from_static("localhost:8080"));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert_eq!(
            g.check(&Method::GET, &uri, &h).unwrap_err().message,
            "the Origin \"null\" is not this server's: podhost answers no request that a page \
             from another origin makes a browser send"
        );
        h.remove(header::ORIGIN);
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        assert_eq!(
            g.check(&Method::POST, &uri, &h),
            Err(Refusal {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                message: "a POST must send its body as JSON, with Content-Type: \
                          application/json, not \"text/plain\""
                    .to_owned()
            })
        );
    }
}
