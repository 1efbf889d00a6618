//! `podhost health`: the client side of the pod host's loopback health endpoint, for a
//! Kubernetes exec probe.
//!
//! The pod host answers `GET http://127.0.0.1:<port>/health` with `{status, service, connected}`
//! (200 while its Harness API connection is up, 503 otherwise; v2 notes §6.1). The endpoint
//! binds loopback only, so a kubelet's `httpGet` probe, which targets the pod's IP, cannot reach
//! it; an exec probe that runs `podhost health` inside the container can.
//!
//! Invariants: one request with one deadline for the whole exchange; the answer is read up to
//! [`MAX_ANSWER_BYTES`]; healthy means the body says exactly `connected: true`.
//!
//! Plain blocking std I/O on purpose: a probe runs every few seconds in every pod and needs no
//! runtime. Non-goals: TLS, redirects, keep-alive and chunked answers (the request is HTTP/1.0,
//! which the endpoint answers with a plain body and a closed connection).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde::Deserialize;

/// The most bytes of an answer (header and body) read before giving up on it.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Characters of an unexpected body quoted in an error.
const QUOTED_CHARS: usize = 200;

/// What the endpoint answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// The HTTP status code.
    pub http_status: u16,
    /// `status` of the body (`ok` while connected, `disconnected` otherwise).
    pub status: String,
    /// `service` of the body: who answered.
    pub service: String,
    /// `connected` of the body: whether the Harness API connection is up.
    pub connected: bool,
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    status: String,
    #[serde(default)]
    service: String,
    connected: bool,
}

/// Why there is no health answer to judge.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("could not connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("no answer from {addr} within {} ms", timeout.as_millis())]
    Timeout { addr: SocketAddr, timeout: Duration },
    #[error("talking to {addr}: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("the answer from {addr} is larger than {MAX_ANSWER_BYTES} bytes")]
    TooLarge { addr: SocketAddr },
    #[error("the answer from {addr} is not an HTTP response: {detail}")]
    NotHttp { addr: SocketAddr, detail: String },
    #[error(
        "the answer from {addr} (HTTP {http_status}) is not the health JSON ({detail}): {body}"
    )]
    BadBody {
        addr: SocketAddr,
        http_status: u16,
        detail: String,
        /// The start of the body, as text.
        body: String,
    },
}

/// Asks `GET /health` at `addr` and reads the answer, all within `timeout`.
pub fn check(addr: SocketAddr, timeout: Duration) -> Result<Health, ProbeError> {
    let deadline = Instant::now() + timeout;
    let timed_out = || ProbeError::Timeout { addr, timeout };
    let io_error = |source: io::Error| match source.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => timed_out(),
        _ => ProbeError::Io { addr, source },
    };
    // The time left, never zero: a zero timeout means "none" to the socket calls.
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };

    let mut stream = TcpStream::connect_timeout(&addr, timeout).map_err(|source| {
        if source.kind() == io::ErrorKind::TimedOut {
            timed_out()
        } else {
            ProbeError::Connect { addr, source }
        }
    })?;
    let request = format!(
        "GET /health HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\nUser-Agent: \
         podhost-health\r\n\r\n"
    );
    stream
        .set_write_timeout(Some(left().ok_or_else(timed_out)?))
        .map_err(io_error)?;
    stream.write_all(request.as_bytes()).map_err(io_error)?;

    let mut answer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        stream
            .set_read_timeout(Some(left().ok_or_else(timed_out)?))
            .map_err(io_error)?;
        let n = match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_error(e)),
        };
        if answer.len() + n > MAX_ANSWER_BYTES {
            return Err(ProbeError::TooLarge { addr });
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    parse(addr, &answer)
}

/// Reads an HTTP/1.x answer read to its end: the status code and the health body.
fn parse(addr: SocketAddr, answer: &[u8]) -> Result<Health, ProbeError> {
    let not_http = |detail: String| ProbeError::NotHttp { addr, detail };
    let head_end = memchr::memmem::find(answer, b"\r\n\r\n")
        .ok_or_else(|| not_http(format!("no end of the header in {} bytes", answer.len())))?;
    let head = std::str::from_utf8(&answer[..head_end])
        .map_err(|_| not_http("the header is not UTF-8".to_owned()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let http_status = match status_line.split(' ').collect::<Vec<_>>().as_slice() {
        [version, code, ..] if version.starts_with("HTTP/1.") => code.parse::<u16>().ok(),
        _ => None,
    }
    .ok_or_else(|| not_http(format!("the status line is {status_line:?}")))?;

    let mut body = &answer[head_end + 4..];
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        if name.eq_ignore_ascii_case("transfer-encoding") && !value.eq_ignore_ascii_case("identity")
        {
            return Err(not_http(format!("a {value} body is not supported")));
        }
        if name.eq_ignore_ascii_case("content-length") {
            let len: usize = value
                .parse()
                .map_err(|_| not_http(format!("Content-Length is {value:?}")))?;
            if body.len() < len {
                return Err(not_http(format!(
                    "the body ends after {} of its {len} bytes",
                    body.len()
                )));
            }
            body = &body[..len];
        }
    }

    let parsed: Body = serde_json::from_slice(body).map_err(|e| ProbeError::BadBody {
        addr,
        http_status,
        // serde quotes the offending value: cut it like the body.
        detail: quote(&e.to_string()),
        body: quote(&String::from_utf8_lossy(body)),
    })?;
    Ok(Health {
        http_status,
        status: parsed.status,
        service: parsed.service,
        connected: parsed.connected,
    })
}

/// The start of `text`, for an error message.
fn quote(text: &str) -> String {
    let mut quoted: String = text.chars().take(QUOTED_CHARS).collect();
    if quoted.len() < text.len() {
        quoted.push('…');
    }
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::net::TcpListener;
    use std::thread::JoinHandle;

    /// A one-shot server on 127.0.0.1:0 that reads the request's header, answers `answer` and
    /// closes; the join handle gives back the request it read.
    fn serve_once(answer: Vec<u8>) -> (SocketAddr, JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handle = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut byte = [0u8; 1];
            while !request.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap() == 1 {
                request.push(byte[0]);
            }
            // The client may already have given up (an answer too large): ignore a reset.
            let _ = conn.write_all(&answer);
            String::from_utf8(request).unwrap()
        });
        (addr, handle)
    }

    fn http(status: &str, body: &str) -> Vec<u8> {
        format!(
            "HTTP/1.0 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    }

    const TIMEOUT: Duration = Duration::from_secs(5);

    #[test]
    fn connected_answer() {
        let (addr, server) = serve_once(http(
            "200 OK",
            r#"{"status":"ok","service":"podhost","connected":true}"#,
        ));
        let health = check(addr, TIMEOUT).unwrap();
        assert_eq!(
            health,
            Health {
                http_status: 200,
                status: "ok".into(),
                service: "podhost".into(),
                connected: true,
            }
        );
        assert_eq!(
            server.join().unwrap(),
            format!(
                "GET /health HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\
                 User-Agent: podhost-health\r\n\r\n"
            )
        );
    }

    #[test]
    fn disconnected_answer_without_content_length() {
        let body = r#"{"status":"ok","service":"nylorun-harness","connected":false}"#;
        let (addr, _server) = serve_once(
            format!("HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\n{body}")
                .into_bytes(),
        );
        assert_eq!(
            check(addr, TIMEOUT).unwrap(),
            Health {
                http_status: 503,
                status: "ok".into(),
                service: "nylorun-harness".into(),
                connected: false,
            }
        );
    }

    #[test]
    fn a_body_that_is_not_the_health_json_is_quoted() {
        let (addr, _server) = serve_once(http("404 Not Found", "no such route"));
        assert_eq!(
            check(addr, TIMEOUT).unwrap_err().to_string(),
            format!(
                "the answer from {addr} (HTTP 404) is not the health JSON (expected ident at \
                 line 1 column 2): no such route"
            )
        );
        // Both the body and serde's message (which quotes the value) are cut.
        let long = format!("{{\"connected\": \"{}\"}}", "y".repeat(300));
        let (addr, _server) = serve_once(http("200 OK", &long));
        let message = check(addr, TIMEOUT).unwrap_err().to_string();
        let detail: String = format!("invalid type: string \"{}", "y".repeat(300))
            .chars()
            .take(QUOTED_CHARS)
            .collect();
        let body: String = long.chars().take(QUOTED_CHARS).collect();
        assert_eq!(
            message,
            format!(
                "the answer from {addr} (HTTP 200) is not the health JSON ({detail}…): {body}…"
            )
        );
    }

    #[test]
    fn answers_that_are_not_http() {
        let (addr, _server) = serve_once(b"SSH-2.0-OpenSSH_9.2\r\n\r\n".to_vec());
        assert_eq!(
            check(addr, TIMEOUT).unwrap_err().to_string(),
            format!(
                "the answer from {addr} is not an HTTP response: the status line is \
                 \"SSH-2.0-OpenSSH_9.2\""
            )
        );
        let (addr, _server) = serve_once(b"HTTP/1.0 200 OK\r\n".to_vec());
        assert_eq!(
            check(addr, TIMEOUT).unwrap_err().to_string(),
            format!(
                "the answer from {addr} is not an HTTP response: no end of the header in 17 bytes"
            )
        );
        let (addr, _server) = serve_once(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                .to_vec(),
        );
        assert_eq!(
            check(addr, TIMEOUT).unwrap_err().to_string(),
            format!(
                "the answer from {addr} is not an HTTP response: a chunked body is not supported"
            )
        );
        let (addr, _server) =
            serve_once(b"HTTP/1.0 200 OK\r\ncontent-length: 50\r\n\r\n{}".to_vec());
        assert_eq!(
            check(addr, TIMEOUT).unwrap_err().to_string(),
            format!(
                "the answer from {addr} is not an HTTP response: the body ends after 2 of its \
                 50 bytes"
            )
        );
    }

    #[test]
    fn an_answer_over_the_limit_is_refused() {
        let body = format!(
            r#"{{"connected":true,"pad":"{}"}}"#,
            "x".repeat(MAX_ANSWER_BYTES)
        );
        let (addr, _server) = serve_once(http("200 OK", &body));
        assert_eq!(
            check(addr, TIMEOUT).unwrap_err().to_string(),
            format!("the answer from {addr} is larger than 65536 bytes")
        );
    }

    #[test]
    fn nothing_listening() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        // The listener is dropped: the port refuses connections.
        assert_eq!(
            check(addr, TIMEOUT).unwrap_err().to_string(),
            format!("could not connect to {addr}: Connection refused (os error 111)")
        );
    }

    #[test]
    fn a_listener_that_never_answers_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // The kernel accepts the connection into the backlog; nobody ever reads or answers.
        assert_eq!(
            check(addr, Duration::from_millis(200))
                .unwrap_err()
                .to_string(),
            format!("no answer from {addr} within 200 ms")
        );
        drop(listener);
    }
}
