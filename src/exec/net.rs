//! A session's network on a pod or BYOH host: a network namespace of its own, in which the
//! host's loopback (podhost's API, a database, an evaluator's tools) and its interfaces have no
//! route, and podhost's side of the session's one way out.
//!
//! ```text
//!  session's network namespace            podhost (the host's network)
//!  command ──► 127.0.0.1:3128 ══listening══► accept ──► BYOH: an HTTP proxy (CONNECT and
//!              (made by the holder,  socket             absolute-form requests) that checks
//!               handed to podhost)                      every destination address
//!                                                   └─► pod: a relay to the egress proxy
//! ```
//!
//! The holder makes the namespace (`session::holder`), brings its loopback up and listens on
//! [`FORWARD_PORT`]; podhost serves that socket ([`serve`]) for as long as the session lives.
//! Commands find it through `HTTP_PROXY` and its siblings (`env`). With `--deny-network` there
//! is no socket: loopback only.
//!
//! Invariants:
//! * Through its exit a session reaches nothing of the host: the BYOH proxy resolves a name
//!   itself and connects only to an address that is not loopback, unspecified, link-local,
//!   multicast or one of the host's own interface addresses ([`refusal`]), each address checked
//!   and then connected to as checked (a name that resolves differently a moment later changes
//!   nothing); the pod's relay connects only to the egress proxy.
//! * Bounded: at most [`MAX_CONNECTIONS`] open per session, a request head of at most
//!   [`MAX_HEAD`] bytes read within [`HEAD_TIMEOUT`]; every task ends with its session.
//!
//! Non-goals: UDP (DNS included: the proxy resolves names for the command), SOCKS, TLS
//! interception, filtering by name (the egress proxy of a pod does that).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::env::Egress;
use super::sys;

/// The port a session's exit listens on, inside its namespace.
pub const FORWARD_PORT: u16 = 3128;
/// Connections one session may have open through its exit.
pub const MAX_CONNECTIONS: usize = 256;
/// The largest request head the proxy reads.
pub const MAX_HEAD: usize = 64 << 10;
/// How long a client may take to send its request head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a connection to a destination may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the host's own addresses are taken as known before they are read again.
const ADDRESSES_FRESH: Duration = Duration::from_secs(10);

/// What serves a session's way out.
#[derive(Clone, Debug)]
pub enum Exit {
    /// podhost's HTTP proxy (a BYOH session; a pod without an egress proxy).
    Proxy,
    /// Every connection relayed, byte for byte, to the pod's egress proxy.
    Relay(Egress),
}

/// Serves a session's listening socket (made by its holder, in its namespace) until `stop`.
pub fn serve(listener: OwnedFd, exit: Exit, stop: CancellationToken) -> io::Result<()> {
    let listener = std::net::TcpListener::from(listener);
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = stop.cancelled() => return,
            };
            let conn = match accepted {
                Ok((conn, _)) => conn,
                Err(e) => {
                    // Out of descriptors, say: let the pressure pass instead of spinning.
                    tracing::debug!(error = %e, "a session's exit could not accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let (exit, stop) = (exit.clone(), stop.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = handle(conn, &exit) => {}
                    () = stop.cancelled() => {}
                }
                drop(slot);
            });
        }
    });
    Ok(())
}

async fn handle(conn: TcpStream, exit: &Exit) {
    let _ = conn.set_nodelay(true);
    let result = match exit {
        Exit::Proxy => proxy(conn).await,
        Exit::Relay(egress) => relay(conn, egress).await,
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "a connection through a session's exit ended");
    }
}

/// The pod: the egress proxy, reached from here, sees the command's own bytes.
async fn relay(mut conn: TcpStream, egress: &Egress) -> io::Result<()> {
    let Some(proxy) = egress.proxy() else {
        return Ok(());
    };
    let url = url::Url::parse(&proxy).map_err(io::Error::other)?;
    let host = url
        .host_str()
        .ok_or_else(|| io::Error::other("the egress proxy's URL names no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = url.port_or_known_default().unwrap_or(80);
    let mut up = connect_timed(tokio::net::lookup_host((host.as_str(), port)).await?).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut up).await?;
    Ok(())
}

async fn connect_timed(addrs: impl IntoIterator<Item = SocketAddr>) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address");
    for addr in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = e,
            Err(_) => last = io::Error::new(io::ErrorKind::TimedOut, format!("{addr}")),
        }
    }
    Err(last)
}

/// One request through the BYOH proxy: `CONNECT host:port` becomes a tunnel; an absolute-form
/// `http://` request is sent on in origin form, the connection closed after its answer.
async fn proxy(mut conn: TcpStream) -> io::Result<()> {
    let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut conn)).await {
        Ok(Ok(Head::Read(head, rest))) => (head, rest),
        Ok(Ok(Head::Closed)) => return Ok(()),
        Ok(Ok(Head::TooLarge)) => {
            let why = format!("the request head is larger than {} KiB", MAX_HEAD >> 10);
            answer(&mut conn, 431, &why).await?;
            // Read what the client is still sending, so that closing does not reset the
            // connection before it has read the answer.
            let mut sink = [0u8; 8192];
            let drain = async { while conn.read(&mut sink).await.is_ok_and(|n| n > 0) {} };
            let _ = tokio::time::timeout(Duration::from_secs(2), drain).await;
            return Ok(());
        }
        Ok(Err(e)) => return Err(e),
        Err(_) => return answer(&mut conn, 408, "the request head took too long").await,
    };
    let request = match Request::parse(&head) {
        Ok(r) => r,
        Err(why) => return answer(&mut conn, 400, &why).await,
    };
    let addrs: Vec<SocketAddr> =
        match tokio::net::lookup_host((request.host.as_str(), request.port)).await {
            Ok(a) => a.collect(),
            Err(e) => {
                let why = format!("{} does not resolve: {e}", request.host);
                return answer(&mut conn, 502, &why).await;
            }
        };
    let own = host_addresses();
    let mut allowed = Vec::new();
    let mut refused = None;
    for addr in addrs {
        match refusal(addr.ip(), &own) {
            Some(why) => refused = Some((addr, why)),
            None => allowed.push(addr),
        }
    }
    if allowed.is_empty() {
        let why = match refused {
            Some((addr, why)) if request.host.parse::<IpAddr>().is_ok() => format!(
                "{} is {why}: a session's commands cannot reach the host's own services",
                addr.ip()
            ),
            Some((addr, why)) => format!(
                "{} is {why} ({}): a session's commands cannot reach the host's own services",
                request.host,
                addr.ip()
            ),
            None => format!("{} resolves to no address", request.host),
        };
        return answer(&mut conn, 403, &why).await;
    }
    let mut up = match connect_timed(allowed).await {
        Ok(up) => up,
        Err(e) => {
            let why = format!("could not connect to {}: {e}", request.host);
            return answer(&mut conn, 502, &why).await;
        }
    };
    let _ = up.set_nodelay(true);
    match &request.forward {
        None => {
            conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?
        }
        Some(head) => up.write_all(head).await?,
    }
    up.write_all(&rest).await?;
    tokio::io::copy_bidirectional(&mut conn, &mut up).await?;
    Ok(())
}

/// How reading a request head ended.
enum Head {
    /// The head, and what came after it in the same reads.
    Read(Vec<u8>, Vec<u8>),
    /// The client closed first.
    Closed,
    /// Past [`MAX_HEAD`] bytes without its end.
    TooLarge,
}

async fn read_head(conn: &mut TcpStream) -> io::Result<Head> {
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Head::Closed);
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = memchr::memmem::find(&buf[from..], b"\r\n\r\n") {
            let end = from + end + 4;
            let rest = buf.split_off(end);
            return Ok(Head::Read(buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Ok(Head::TooLarge);
        }
    }
}

/// A request the proxy understood.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    host: String,
    port: u16,
    /// The head to send on (a plain request); `None` for a tunnel.
    forward: Option<Vec<u8>>,
}

impl Request {
    fn parse(head: &[u8]) -> Result<Request, String> {
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => return Err("the request head is cut short".into()),
            Err(e) => return Err(format!("the request head is malformed: {e}")),
        }
        let (Some(method), Some(target)) = (req.method, req.path) else {
            return Err("the request line is incomplete".into());
        };
        if method.eq_ignore_ascii_case("CONNECT") {
            let (host, port) = split_authority(target, None)?;
            return Ok(Request {
                host,
                port,
                forward: None,
            });
        }
        let Some(after) = target
            .get(..7)
            .filter(|s| s.eq_ignore_ascii_case("http://"))
            .map(|_| &target[7..])
        else {
            return Err(format!(
                "{target:?} is not an absolute http:// URL (HTTPS goes through CONNECT)"
            ));
        };
        let (authority, path) = match after.find(['/', '?']) {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, "/"),
        };
        let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
        let (host, port) = split_authority(authority, Some(80))?;
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_owned()
        };
        let mut out = format!("{method} {path} HTTP/1.1\r\n").into_bytes();
        for h in req.headers.iter() {
            let hop = [
                "proxy-connection",
                "proxy-authorization",
                "connection",
                "keep-alive",
            ];
            if hop.iter().any(|n| h.name.eq_ignore_ascii_case(n)) {
                continue;
            }
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
        // One request per connection: the next may be for another host.
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        Ok(Request {
            host,
            port,
            forward: Some(out),
        })
    }
}

/// `host:port` (or `[v6]:port`), the port defaulting to `default`.
fn split_authority(authority: &str, default: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("{authority:?} is not host:port");
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match (port, default) {
        (Some(p), _) => p.parse().map_err(|_| bad())?,
        (None, Some(d)) => d,
        (None, None) => return Err(bad()),
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

/// Why a session may not connect to `ip`; `None` when it may. `own`: the host's addresses.
pub fn refusal(ip: IpAddr, own: &[IpAddr]) -> Option<&'static str> {
    let ip = ip.to_canonical();
    if ip.is_loopback() {
        return Some("the host's loopback");
    }
    if ip.is_unspecified() || matches!(ip, IpAddr::V4(v4) if v4.octets()[0] == 0) {
        return Some("an unspecified address, which reaches the host itself");
    }
    if ip.is_multicast() {
        return Some("a multicast address");
    }
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    };
    if link_local {
        return Some("a link-local address (where cloud metadata services answer)");
    }
    if own.iter().any(|o| o.to_canonical() == ip) {
        return Some("one of the host's own addresses");
    }
    None
}

/// The addresses of the host's interfaces, read again when older than [`ADDRESSES_FRESH`].
fn host_addresses() -> Vec<IpAddr> {
    static CACHE: Mutex<Option<(Instant, Vec<IpAddr>)>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    match &*cache {
        Some((at, addrs)) if at.elapsed() < ADDRESSES_FRESH => addrs.clone(),
        _ => {
            let addrs = sys::interface_addresses();
            *cache = Some((Instant::now(), addrs.clone()));
            addrs
        }
    }
}

/// Answers the client with `status` and `why` as plain text, and closes.
async fn answer(conn: &mut TcpStream, status: u16, why: &str) -> io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Bad Gateway",
    };
    let body = format!("podhost: {why}\n");
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_host_and_its_neighbours_are_refused_and_the_world_is_not() {
        let own: Vec<IpAddr> = vec!["10.1.2.3".parse().unwrap()];
        let refused = |s: &str| refusal(s.parse().unwrap(), &own).is_some();
        for addr in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "::",
            "169.254.169.254",
            "fe80::1",
            "224.0.0.1",
            "255.255.255.255",
            "10.1.2.3",
            "::ffff:10.1.2.3",
        ] {
            assert!(refused(addr), "{addr} was let through");
        }
        for addr in ["10.1.2.4", "192.168.1.1", "8.8.8.8", "2001:db8::1"] {
            assert!(!refused(addr), "{addr} was refused");
        }
    }

    #[test]
    fn requests_are_parsed_and_sent_on_in_origin_form() {
        let tunnel = Request::parse(b"CONNECT pypi.org:443 HTTP/1.1\r\nHost: pypi.org\r\n\r\n");
        assert_eq!(
            tunnel,
            Ok(Request {
                host: "pypi.org".into(),
                port: 443,
                forward: None
            })
        );
        let plain = Request::parse(
            b"GET http://user:pw@example.com:8080?q=1 HTTP/1.1\r\nHost: example.com:8080\r\n\
              Proxy-Connection: keep-alive\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        assert_eq!((plain.host.as_str(), plain.port), ("example.com", 8080));
        assert_eq!(
            String::from_utf8(plain.forward.unwrap()).unwrap(),
            "GET /?q=1 HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\n\
             Connection: close\r\n\r\n"
        );
        let v6 = Request::parse(b"CONNECT [2001:db8::1]:22 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((v6.host.as_str(), v6.port), ("2001:db8::1", 22));
        for bad in [
            &b"GET /relative HTTP/1.1\r\n\r\n"[..],
            b"GET https://example.com/ HTTP/1.1\r\n\r\n",
            b"CONNECT example.com HTTP/1.1\r\n\r\n",
            b"CONNECT :443 HTTP/1.1\r\n\r\n",
            b"\x00\x01 garbage\r\n\r\n",
        ] {
            assert!(
                Request::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
