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
//! * Through its exit a session reaches nothing of the host and nothing that is not global: the
//!   BYOH proxy resolves a name itself and connects only to an address [`refusal`] lets
//!   through, each address checked and then connected to as checked (a name that resolves
//!   differently a moment later changes nothing); the pod's relay connects only to the egress
//!   proxy.
//! * [`refusal`] classifies every special range: an IPv6 address that carries an IPv4 one
//!   (IPv4-mapped, IPv4-compatible, NAT64, 6to4) is judged by the IPv4 address it reaches too.
//!   Two kinds of refusal:
//!   - never: loopback, unspecified, multicast, broadcast, link-local (`169.254.0.0/16`,
//!     `fe80::/10`, where cloud metadata answers), the cloud metadata addresses outside it
//!     (`168.63.129.16`, `100.100.100.200`, `fd00:ec2::254`) and the host's own addresses;
//!   - unless allowed: every other address that is not global (private, carrier-grade NAT,
//!     unique local, site-local, documentation, benchmarking, reserved, Teredo, local-use
//!     NAT64, …), which an operator lets through by naming its network in
//!     `PODHOST_SESSION_ALLOW_NETWORKS` ([`Network`]). The allow-list never lifts a "never".
//! * Bounded per session: at most [`MAX_CONNECTIONS`] open, a request head of at most
//!   [`MAX_HEAD`] bytes read within [`HEAD_TIMEOUT`]; every task ends with its session.
//! * Bounded per process: each proxied connection costs podhost two descriptors, so all
//!   sessions together hold at most [`Budget::process`] connections (a quarter of the soft
//!   open-file limit, two descriptors each, at least [`MIN_BUDGET`]), so that podhost's own
//!   listener, store and sandboxes keep theirs. Past it a new connection through any exit is
//!   refused at once — the proxy answers `503` with the reason, the relay closes it — and a
//!   warning is logged at most once per [`BUDGET_WARN_EVERY`]; nothing waits for room.
//!
//! Non-goals: UDP (DNS included: the proxy resolves names for the command), SOCKS, TLS
//! interception, filtering by name (the egress proxy of a pod does that), an allow-list by name
//! or port.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
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
/// The fewest connections all sessions together may hold through their exits, whatever the
/// open-file limit.
pub const MIN_BUDGET: usize = 64;
/// How often, at most, podhost warns that sessions hold all the connections it allows.
pub const BUDGET_WARN_EVERY: Duration = Duration::from_secs(60);
/// How long a request refused for the budget may take to arrive before it is answered.
const OVER_BUDGET_READ: Duration = Duration::from_secs(2);
/// How long a connection to a destination may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the host's own addresses are taken as known before they are read again.
const ADDRESSES_FRESH: Duration = Duration::from_secs(10);

/// What serves a session's way out.
#[derive(Clone, Debug)]
pub enum Exit {
    /// podhost's HTTP proxy (a BYOH session; a pod without an egress proxy), which also lets
    /// through the networks named (`PODHOST_SESSION_ALLOW_NETWORKS`).
    Proxy(Arc<[Network]>),
    /// Every connection relayed, byte for byte, to the pod's egress proxy.
    Relay(Egress),
}

/// The connections all sessions together may hold through their exits (see the module doc).
/// Cheap to clone; clones share the budget.
#[derive(Clone, Debug)]
pub struct Budget {
    inner: Arc<BudgetInner>,
}

#[derive(Debug)]
struct BudgetInner {
    slots: Arc<Semaphore>,
    size: usize,
    /// When podhost last warned that the budget was spent.
    warned: Mutex<Option<Instant>>,
}

impl Budget {
    /// A budget of `size` connections.
    pub fn new(size: usize) -> Budget {
        let size = size.min(Semaphore::MAX_PERMITS);
        Budget {
            inner: Arc::new(BudgetInner {
                slots: Arc::new(Semaphore::new(size)),
                size,
                warned: Mutex::new(None),
            }),
        }
    }

    /// The process's budget, sized from its soft open-file limit when first asked for (after
    /// the fronts have raised it; see [`budget_for`]).
    pub fn process() -> Budget {
        static PROCESS: OnceLock<Budget> = OnceLock::new();
        PROCESS
            .get_or_init(|| {
                use nix::sys::resource::{Resource, getrlimit};
                let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(0, |(soft, _)| soft);
                Budget::new(budget_for(soft))
            })
            .clone()
    }

    /// How many connections it holds at most.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// How many more connections it has room for now.
    pub fn available(&self) -> usize {
        self.inner.slots.available_permits()
    }

    /// A connection's share, or `None` (and a warning, now and then) when none is left.
    fn take(&self) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.inner.slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        let mut warned = self
            .inner
            .warned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if warn_due(&mut warned, Instant::now()) {
            tracing::warn!(
                budget = self.inner.size,
                "sessions hold every connection podhost allows through their exits; refusing \
                 new ones until some close (raise the open-file limit for more)"
            );
        }
        None
    }
}

/// Whether a warning last given at `last` may be given again at `now` (and notes it if so).
fn warn_due(last: &mut Option<Instant>, now: Instant) -> bool {
    match *last {
        Some(at) if now.saturating_duration_since(at) < BUDGET_WARN_EVERY => false,
        _ => {
            *last = Some(now);
            true
        }
    }
}

/// The budget for a soft open-file limit of `open_files`: a quarter of it, two descriptors per
/// connection (the session's side and the destination's), at least [`MIN_BUDGET`].
pub fn budget_for(open_files: u64) -> usize {
    let budget = usize::try_from(open_files / 4 / 2).unwrap_or(usize::MAX);
    budget.max(MIN_BUDGET)
}

/// Serves a session's listening socket (made by its holder, in its namespace) until `stop`, each
/// connection counted against the session's cap and against `budget` (all sessions').
pub fn serve(
    listener: OwnedFd,
    exit: Exit,
    budget: Budget,
    stop: CancellationToken,
) -> io::Result<()> {
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
            let share = budget.take();
            if share.is_none() && matches!(exit, Exit::Relay(_)) {
                // Bytes of an unknown protocol: closing is the only answer.
                continue;
            }
            let (exit, stop, size) = (exit.clone(), stop.clone(), budget.size());
            tokio::spawn(async move {
                tokio::select! {
                    () = async {
                        match share {
                            Some(_share) => handle(conn, &exit).await,
                            None => over_budget(conn, size).await,
                        }
                    } => {}
                    () = stop.cancelled() => {}
                }
                drop(slot);
            });
        }
    });
    Ok(())
}

/// A proxy request past the process's budget: read (briefly) and answered with `503`, so the
/// client learns why instead of seeing a reset.
async fn over_budget(mut conn: TcpStream, size: usize) {
    if let Ok(Ok(Head::Closed) | Err(_)) =
        tokio::time::timeout(OVER_BUDGET_READ, read_head(&mut conn)).await
    {
        return;
    }
    let why = format!(
        "podhost's sessions hold all the {size} connections it allows through their exits; try \
         again when some have closed"
    );
    let _ = answer(&mut conn, 503, &why).await;
}

async fn handle(conn: TcpStream, exit: &Exit) {
    let _ = conn.set_nodelay(true);
    let result = match exit {
        Exit::Proxy(allowed) => proxy(conn, allowed).await,
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
async fn proxy(mut conn: TcpStream, allowed: &[Network]) -> io::Result<()> {
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
        Err(why) => return answer(&mut conn, 400, &why.to_string()).await,
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
    let mut reachable = Vec::new();
    let mut refused = None;
    for addr in addrs {
        match refusal(addr.ip(), &own, allowed) {
            Some(why) => refused = Some((addr, why)),
            None => reachable.push(addr),
        }
    }
    if reachable.is_empty() {
        let why = match refused {
            Some((addr, why)) => {
                let named = match request.host.parse::<IpAddr>() {
                    Ok(_) => addr.ip().to_string(),
                    Err(_) => format!("{} ({})", request.host, addr.ip()),
                };
                let tail = match why.allowable {
                    false => "a session's commands cannot reach the host's own services",
                    true => {
                        "a session's commands reach a network that is not global only when \
                         the host's PODHOST_SESSION_ALLOW_NETWORKS names it"
                    }
                };
                format!("{named} is {}: {tail}", why.why)
            }
            None => format!("{} resolves to no address", request.host),
        };
        return answer(&mut conn, 403, &why).await;
    }
    let mut up = match connect_timed(reachable).await {
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

/// Why a request head is not one the proxy can forward (answered with a 400 saying so).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum RequestError {
    #[error("the request head is cut short")]
    CutShort,
    #[error("the request head is malformed: {0}")]
    Malformed(httparse::Error),
    #[error("the request line is incomplete")]
    Incomplete,
    /// A plain request's target (as sent) that is not `http://…`.
    #[error("{0:?} is not an absolute http:// URL (HTTPS goes through CONNECT)")]
    NotAbsolute(String),
    /// An authority (as sent) without a host and a port.
    #[error("{0:?} is not host:port")]
    NotHostPort(String),
}

impl Request {
    fn parse(head: &[u8]) -> Result<Request, RequestError> {
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => return Err(RequestError::CutShort),
            Err(e) => return Err(RequestError::Malformed(e)),
        }
        let (Some(method), Some(target)) = (req.method, req.path) else {
            return Err(RequestError::Incomplete);
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
            return Err(RequestError::NotAbsolute(target.to_owned()));
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
fn split_authority(authority: &str, default: Option<u16>) -> Result<(String, u16), RequestError> {
    let bad = || RequestError::NotHostPort(authority.to_owned());
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

/// Why a session may not connect to an address ([`refusal`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// What the address is, e.g. "a private address (10.0.0.0/8)".
    pub why: String,
    /// Whether naming its network in `PODHOST_SESSION_ALLOW_NETWORKS` lets it through.
    pub allowable: bool,
}

impl Refusal {
    fn never(why: &str) -> Refusal {
        Refusal {
            why: why.to_owned(),
            allowable: false,
        }
    }

    fn unless_allowed(why: &str) -> Refusal {
        Refusal {
            why: why.to_owned(),
            allowable: true,
        }
    }
}

/// Why a session may not connect to `ip`; `None` when it may: `ip` is global, or not global but
/// in one of the `allowed` networks and not of a kind refused always (see the module doc).
/// `own`: the host's addresses.
pub fn refusal(ip: IpAddr, own: &[IpAddr], allowed: &[Network]) -> Option<Refusal> {
    let ip = ip.to_canonical();
    let inner = match ip {
        IpAddr::V6(v6) => carried_v4(v6).map(|(v4, _)| IpAddr::V4(v4)),
        IpAddr::V4(_) => None,
    };
    let class = classify(ip);
    if let Some(never) = class.as_ref().filter(|c| !c.allowable) {
        return Some(never.clone());
    }
    let own_too = |a: IpAddr| own.iter().any(|o| o.to_canonical() == a);
    if own_too(ip) || inner.is_some_and(own_too) {
        return Some(Refusal::never("one of the host's own addresses"));
    }
    let class = class?;
    let named = |a: IpAddr| allowed.iter().any(|n| n.contains(a));
    if named(ip) || inner.is_some_and(named) {
        return None;
    }
    Some(class)
}

/// What `ip` is when it is not global; `None` for a global address.
fn classify(ip: IpAddr) -> Option<Refusal> {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(v4: Ipv4Addr) -> Option<Refusal> {
    let never = |why| Some(Refusal::never(why));
    let unless_allowed = |why| Some(Refusal::unless_allowed(why));
    match v4.octets() {
        [0, ..] => never("an unspecified address (0.0.0.0/8), which reaches the host itself"),
        [127, ..] => never("the host's loopback"),
        [169, 254, ..] => {
            never("a link-local address (169.254.0.0/16, where cloud metadata services answer)")
        }
        [224..=239, ..] => never("a multicast address (224.0.0.0/4)"),
        [255, 255, 255, 255] => never("the broadcast address"),
        [168, 63, 129, 16] => never("Azure's wireserver (168.63.129.16), a cloud metadata service"),
        [100, 100, 100, 200] => {
            never("Alibaba Cloud's metadata service (100.100.100.200), a cloud metadata service")
        }
        [10, ..] => unless_allowed("a private address (10.0.0.0/8)"),
        [172, 16..=31, ..] => unless_allowed("a private address (172.16.0.0/12)"),
        [192, 168, ..] => unless_allowed("a private address (192.168.0.0/16)"),
        [100, 64..=127, ..] => {
            unless_allowed("a shared address of carrier-grade NAT (100.64.0.0/10)")
        }
        [192, 0, 0, _] => unless_allowed("an IETF protocol address (192.0.0.0/24)"),
        [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => {
            unless_allowed("a documentation address")
        }
        [192, 88, 99, _] => unless_allowed("a 6to4 relay address (192.88.99.0/24)"),
        [198, 18..=19, ..] => unless_allowed("a benchmarking address (198.18.0.0/15)"),
        [240..=255, ..] => unless_allowed("a reserved address (240.0.0.0/4)"),
        _ => None,
    }
}

fn classify_v6(v6: Ipv6Addr) -> Option<Refusal> {
    let never = |why| Some(Refusal::never(why));
    let unless_allowed = |why| Some(Refusal::unless_allowed(why));
    let s = v6.segments();
    if v6.is_loopback() {
        return never("the host's loopback");
    }
    if v6.is_unspecified() {
        return never("an unspecified address, which reaches the host itself");
    }
    if s[0] & 0xff00 == 0xff00 {
        return never("a multicast address (ff00::/8)");
    }
    if s[0] & 0xffc0 == 0xfe80 {
        return never("a link-local address (fe80::/10, where cloud metadata services answer)");
    }
    if s == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] {
        return never("AWS's metadata service (fd00:ec2::254), a cloud metadata service");
    }
    if let Some((v4, wrapper)) = carried_v4(v6) {
        return match classify_v4(v4) {
            Some(inner) => Some(Refusal {
                why: format!("{wrapper} for {v4}, {}", inner.why),
                allowable: inner.allowable,
            }),
            // The well-known NAT64 prefix and 6to4 reach the IPv4 Internet.
            None if s[0] == 0x2002 || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] => None,
            None => unless_allowed(wrapper),
        };
    }
    match s {
        [0x2001, 0, ..] => unless_allowed("a Teredo address (2001::/32)"),
        [0x2001, 0xdb8, ..] => unless_allowed("a documentation address (2001:db8::/32)"),
        [0x3fff, 0..=0x0fff, ..] => unless_allowed("a documentation address (3fff::/20)"),
        [0x2001, 0..=0x01ff, ..] => unless_allowed("an IETF protocol address (2001::/23)"),
        [0x100, 0, 0, 0, ..] => unless_allowed("a discard-only address (100::/64)"),
        [0xfc00..=0xfdff, ..] => unless_allowed("a unique local address (fc00::/7)"),
        [0xfec0..=0xfeff, ..] => unless_allowed("a site-local address (fec0::/10)"),
        [0x2000..=0x3fff, ..] => None,
        _ => unless_allowed("a reserved address (outside 2000::/3, the global unicast range)"),
    }
}

/// The IPv4 address an IPv6 address stands for, and what kind of address carries it: an
/// IPv4-compatible address (`::/96`), NAT64 (`64:ff9b::/96`, the local-use `64:ff9b:1::/48` as
/// its `/96` form), 6to4 (`2002::/16`). IPv4-mapped addresses are canonical IPv4 by then.
fn carried_v4(v6: Ipv6Addr) -> Option<(Ipv4Addr, &'static str)> {
    let s = v6.segments();
    let low = Ipv4Addr::from(v6.to_bits() as u32);
    match s {
        [0, 0, 0, 0, 0, 0, ..] if !v6.is_loopback() && !v6.is_unspecified() => {
            Some((low, "an IPv4-compatible address (::/96, deprecated)"))
        }
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => Some((low, "a NAT64 address (64:ff9b::/96)")),
        [0x64, 0xff9b, 1, ..] => Some((low, "a local-use NAT64 address (64:ff9b:1::/48)")),
        [0x2002, hi, lo, ..] => Some((
            Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo)),
            "a 6to4 address (2002::/16)",
        )),
        _ => None,
    }
}

/// A network a session may reach although it is not global, one entry of
/// `PODHOST_SESSION_ALLOW_NETWORKS`: `address/prefix`, IPv4 or IPv6, with no bit set past the
/// prefix (`10.20.0.0/16`, `fd00:1::/64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// Whether `ip` lies in this network (an IPv4-mapped IPv6 address as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(ip) & mask == u32::from(net)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                ip.to_bits() & mask == net.to_bits()
            }
            _ => false,
        }
    }
}

impl FromStr for Network {
    type Err = String;

    fn from_str(s: &str) -> Result<Network, String> {
        let s = s.trim();
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a network such as 10.20.0.0/16 (no /prefix)"))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{s:?}: {addr:?} is not an IP address"))?;
        let bits = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= bits)
            .ok_or_else(|| format!("{s:?}: the prefix must be a number from 0 to {bits}"))?;
        let network = Network { addr, prefix };
        // An IPv4-mapped network contains nothing: addresses are compared as IPv4.
        if !network.contains(addr) {
            return Err(format!(
                "{s:?} has address bits set past its prefix, or is IPv4-mapped: write the \
                 network's first address (such as 10.20.0.0/16)"
            ));
        }
        Ok(network)
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
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
        503 => "Service Unavailable",
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

    /// Every class of address, the reason it is refused with, and whether the allow-list can
    /// lift it; then the global addresses that pass.
    #[test]
    fn only_global_addresses_pass_each_refused_with_its_class() {
        let own: Vec<IpAddr> = vec!["10.1.2.3".parse().unwrap(), "2a01:4f8::7".parse().unwrap()];
        let never = |why: &str| Some(Refusal::never(why));
        let unless = |why: &str| Some(Refusal::unless_allowed(why));
        let loopback = never("the host's loopback");
        let link_local_v4 =
            "a link-local address (169.254.0.0/16, where cloud metadata services answer)";
        let table = [
            // The host itself, and what is never reachable.
            ("127.0.0.1", loopback.clone()),
            ("127.9.9.9", loopback.clone()),
            ("::1", loopback.clone()),
            ("::ffff:127.0.0.1", loopback.clone()),
            (
                "0.0.0.0",
                never("an unspecified address (0.0.0.0/8), which reaches the host itself"),
            ),
            (
                "0.1.2.3",
                never("an unspecified address (0.0.0.0/8), which reaches the host itself"),
            ),
            (
                "::",
                never("an unspecified address, which reaches the host itself"),
            ),
            ("169.254.169.254", never(link_local_v4)),
            (
                "fe80::1",
                never("a link-local address (fe80::/10, where cloud metadata services answer)"),
            ),
            ("224.0.0.1", never("a multicast address (224.0.0.0/4)")),
            ("ff02::1", never("a multicast address (ff00::/8)")),
            ("255.255.255.255", never("the broadcast address")),
            (
                "168.63.129.16",
                never("Azure's wireserver (168.63.129.16), a cloud metadata service"),
            ),
            (
                "100.100.100.200",
                never(
                    "Alibaba Cloud's metadata service (100.100.100.200), a cloud metadata service",
                ),
            ),
            (
                "fd00:ec2::254",
                never("AWS's metadata service (fd00:ec2::254), a cloud metadata service"),
            ),
            ("10.1.2.3", never("one of the host's own addresses")),
            ("::ffff:10.1.2.3", never("one of the host's own addresses")),
            ("2a01:4f8::7", never("one of the host's own addresses")),
            ("64:ff9b::a01:203", never("one of the host's own addresses")),
            // Carried IPv4 addresses, judged by what they reach.
            (
                "64:ff9b::7f00:1",
                never("a NAT64 address (64:ff9b::/96) for 127.0.0.1, the host's loopback"),
            ),
            (
                "64:ff9b::a9fe:a9fe",
                never(&format!(
                    "a NAT64 address (64:ff9b::/96) for 169.254.169.254, {link_local_v4}"
                )),
            ),
            (
                "64:ff9b::a00:1",
                unless(
                    "a NAT64 address (64:ff9b::/96) for 10.0.0.1, a private address (10.0.0.0/8)",
                ),
            ),
            (
                "64:ff9b:1::a00:1",
                unless(
                    "a local-use NAT64 address (64:ff9b:1::/48) for 10.0.0.1, a private \
                     address (10.0.0.0/8)",
                ),
            ),
            (
                "64:ff9b:1::808:808",
                unless("a local-use NAT64 address (64:ff9b:1::/48)"),
            ),
            (
                "::127.0.0.1",
                never(
                    "an IPv4-compatible address (::/96, deprecated) for 127.0.0.1, the host's loopback",
                ),
            ),
            (
                "::8.8.8.8",
                unless("an IPv4-compatible address (::/96, deprecated)"),
            ),
            ("::ffff:10.0.0.1", unless("a private address (10.0.0.0/8)")),
            (
                "2002:c0a8:101::1",
                unless(
                    "a 6to4 address (2002::/16) for 192.168.1.1, a private address \
                     (192.168.0.0/16)",
                ),
            ),
            (
                "2002:7f00:1::1",
                never("a 6to4 address (2002::/16) for 127.0.0.1, the host's loopback"),
            ),
            // Not global: refused unless allowed.
            ("10.1.2.4", unless("a private address (10.0.0.0/8)")),
            ("172.16.0.1", unless("a private address (172.16.0.0/12)")),
            (
                "172.31.255.255",
                unless("a private address (172.16.0.0/12)"),
            ),
            ("192.168.1.1", unless("a private address (192.168.0.0/16)")),
            (
                "100.64.0.1",
                unless("a shared address of carrier-grade NAT (100.64.0.0/10)"),
            ),
            (
                "100.127.255.254",
                unless("a shared address of carrier-grade NAT (100.64.0.0/10)"),
            ),
            (
                "192.0.0.8",
                unless("an IETF protocol address (192.0.0.0/24)"),
            ),
            ("192.0.2.1", unless("a documentation address")),
            ("198.51.100.1", unless("a documentation address")),
            ("203.0.113.1", unless("a documentation address")),
            (
                "192.88.99.1",
                unless("a 6to4 relay address (192.88.99.0/24)"),
            ),
            (
                "198.18.0.1",
                unless("a benchmarking address (198.18.0.0/15)"),
            ),
            (
                "198.19.255.1",
                unless("a benchmarking address (198.18.0.0/15)"),
            ),
            ("240.0.0.1", unless("a reserved address (240.0.0.0/4)")),
            (
                "255.255.255.254",
                unless("a reserved address (240.0.0.0/4)"),
            ),
            ("fc00::1", unless("a unique local address (fc00::/7)")),
            ("fd12:3456::1", unless("a unique local address (fc00::/7)")),
            ("fec0::1", unless("a site-local address (fec0::/10)")),
            ("2001::1", unless("a Teredo address (2001::/32)")),
            (
                "2001:db8::1",
                unless("a documentation address (2001:db8::/32)"),
            ),
            ("3fff::1", unless("a documentation address (3fff::/20)")),
            ("2001:2::1", unless("an IETF protocol address (2001::/23)")),
            ("100::1", unless("a discard-only address (100::/64)")),
            (
                "4000::1",
                unless("a reserved address (outside 2000::/3, the global unicast range)"),
            ),
            (
                "::ffff:0:a00:1",
                unless("a reserved address (outside 2000::/3, the global unicast range)"),
            ),
            // Global.
            ("8.8.8.8", None),
            ("1.1.1.1", None),
            ("172.32.0.1", None),
            ("100.128.0.1", None),
            ("::ffff:8.8.8.8", None),
            ("64:ff9b::808:808", None),
            ("2002:808:808::1", None),
            ("2606:4700::1111", None),
            ("2001:4860::8888", None),
        ];
        for (addr, expected) in table {
            assert_eq!(
                refusal(addr.parse().unwrap(), &own, &[]),
                expected,
                "{addr}"
            );
        }
    }

    /// Allowing every network lifts every refusal but the ones that are never lifted.
    #[test]
    fn the_allow_list_lifts_private_networks_only() {
        let own: Vec<IpAddr> = vec!["10.1.2.3".parse().unwrap()];
        let all: Vec<Network> = vec!["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()];
        for addr in [
            "127.0.0.1",
            "::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
            "::",
            "169.254.169.254",
            "fe80::1",
            "224.0.0.1",
            "ff02::1",
            "255.255.255.255",
            "168.63.129.16",
            "100.100.100.200",
            "fd00:ec2::254",
            "10.1.2.3",
            "64:ff9b::7f00:1",
            "64:ff9b::a01:203",
        ] {
            let refused = refusal(addr.parse().unwrap(), &own, &all);
            assert!(
                refused.is_some_and(|r| !r.allowable),
                "{addr} was let through"
            );
        }
        for addr in [
            "10.1.2.4",
            "192.168.1.1",
            "100.64.0.1",
            "fd12::1",
            "2001:db8::1",
            "240.0.0.1",
        ] {
            assert_eq!(refusal(addr.parse().unwrap(), &own, &all), None, "{addr}");
        }
        // A narrow allow-list lifts its own network and nothing beside it; a NAT64 or mapped
        // address reaching it counts as in it.
        let some: Vec<Network> = vec![
            "10.20.0.0/16".parse().unwrap(),
            "fd00:1::/64".parse().unwrap(),
        ];
        for (addr, passes) in [
            ("10.20.7.8", true),
            ("::ffff:10.20.7.8", true),
            ("64:ff9b::a14:708", true),
            ("10.21.0.1", false),
            ("fd00:1::9", true),
            ("fd00:2::9", false),
        ] {
            let got = refusal(addr.parse().unwrap(), &own, &some).is_none();
            assert_eq!(got, passes, "{addr}");
        }
    }

    #[test]
    fn networks_parse_strictly() {
        let net: Network = " 10.20.0.0/16".parse().unwrap();
        assert_eq!(net.to_string(), "10.20.0.0/16");
        assert_eq!(
            "fd00:1::/64".parse::<Network>().map(|n| n.to_string()),
            Ok("fd00:1::/64".to_owned())
        );
        for (bad, why) in [
            (
                "10.20.0.0",
                "\"10.20.0.0\" is not a network such as 10.20.0.0/16 (no /prefix)",
            ),
            (
                "10.20.0.0/33",
                "\"10.20.0.0/33\": the prefix must be a number from 0 to 32",
            ),
            (
                "fd00::/129",
                "\"fd00::/129\": the prefix must be a number from 0 to 128",
            ),
            (
                "10.20.0.0/x",
                "\"10.20.0.0/x\": the prefix must be a number from 0 to 32",
            ),
            (
                "intranet/8",
                "\"intranet/8\": \"intranet\" is not an IP address",
            ),
            (
                "10.20.0.1/16",
                "\"10.20.0.1/16\" has address bits set past its prefix, or is IPv4-mapped: \
                 write the network's first address (such as 10.20.0.0/16)",
            ),
            (
                "::ffff:10.0.0.0/104",
                "\"::ffff:10.0.0.0/104\" has address bits set past its prefix, or is \
                 IPv4-mapped: write the network's first address (such as 10.20.0.0/16)",
            ),
        ] {
            assert_eq!(bad.parse::<Network>(), Err(why.to_owned()), "{bad}");
        }
    }

    #[test]
    fn the_budget_follows_the_open_file_limit_and_warns_now_and_then() {
        assert_eq!(budget_for(10_240), 1280);
        assert_eq!(budget_for(1 << 20), 131_072);
        assert_eq!(budget_for(256), MIN_BUDGET);
        assert_eq!(budget_for(0), MIN_BUDGET);
        let mut last = None;
        let t0 = Instant::now();
        assert!(warn_due(&mut last, t0));
        assert!(!warn_due(&mut last, t0 + Duration::from_secs(1)));
        assert!(warn_due(&mut last, t0 + BUDGET_WARN_EVERY));
    }

    /// A fake egress proxy that echoes what it reads, for relayed connections to reach.
    async fn echo_server() -> Egress {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        Egress::new(Some(format!("http://127.0.0.1:{port}")))
    }

    /// A session's exit of `exit` on a loopback port, counted against `budget`.
    fn exit_on_loopback(exit: Exit, budget: &Budget, stop: &CancellationToken) -> SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        serve(OwnedFd::from(listener), exit, budget.clone(), stop.clone()).unwrap();
        addr
    }

    /// Writes `data` and reads its echo.
    async fn echoes(conn: &mut TcpStream, data: &[u8]) -> bool {
        let step = async {
            conn.write_all(data).await?;
            let mut back = vec![0u8; data.len()];
            conn.read_exact(&mut back).await?;
            io::Result::Ok(back == data)
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(5), step).await,
            Ok(Ok(true))
        )
    }

    /// Everything `conn` is sent until it is closed.
    async fn read_all(conn: &mut TcpStream) -> String {
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut out));
        match read.await {
            Ok(Ok(_)) => String::from_utf8(out).unwrap(),
            Ok(Err(e)) => format!("{:?}", e.kind()),
            Err(_) => "still open".to_owned(),
        }
    }

    /// Two exits share a budget of two: once two relayed connections hold it, a CONNECT through
    /// the proxy gets a 503 that says why and a third relayed connection is closed, while the
    /// first two keep working; once they close, both exits serve again.
    #[tokio::test]
    async fn past_the_process_budget_new_connections_are_refused_and_old_ones_work() {
        let budget = Budget::new(2);
        let stop = CancellationToken::new();
        let relay = exit_on_loopback(Exit::Relay(echo_server().await), &budget, &stop);
        let proxy = exit_on_loopback(Exit::Proxy(Arc::from(Vec::new())), &budget, &stop);
        let mut first = TcpStream::connect(relay).await.unwrap();
        let mut second = TcpStream::connect(relay).await.unwrap();
        assert!(echoes(&mut first, b"one").await);
        assert!(echoes(&mut second, b"two").await);
        assert_eq!(budget.available(), 0);

        let mut refused = TcpStream::connect(proxy).await.unwrap();
        refused
            .write_all(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
            .await
            .unwrap();
        let why = "podhost: podhost's sessions hold all the 2 connections it allows through \
                   their exits; try again when some have closed\n";
        assert_eq!(
            read_all(&mut refused).await,
            format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{why}",
                why.len()
            )
        );
        let mut closed = TcpStream::connect(relay).await.unwrap();
        let _ = closed.write_all(b"three").await;
        assert!(
            ["", "ConnectionReset"].contains(&read_all(&mut closed).await.as_str()),
            "a relayed connection past the budget stayed open"
        );
        assert!(echoes(&mut first, b"still one").await);

        drop((first, second, refused, closed));
        let back = tokio::time::timeout(Duration::from_secs(5), budget.inner.slots.acquire_many(2));
        drop(
            back.await
                .expect("the closed connections gave their share back"),
        );
        let mut again = TcpStream::connect(proxy).await.unwrap();
        again
            .write_all(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        let answer = read_all(&mut again).await;
        assert!(answer.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{answer}");
        assert!(
            answer.ends_with(
                "podhost: 127.0.0.1 is the host's loopback: a session's commands \
                 cannot reach the host's own services\n"
            ),
            "{answer}"
        );
        let mut relayed = TcpStream::connect(relay).await.unwrap();
        assert!(echoes(&mut relayed, b"four").await);
        stop.cancel();
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
        // The 400's text names what is wrong with the request.
        let why = |head: &[u8]| Request::parse(head).unwrap_err().to_string();
        assert_eq!(
            why(b"GET /relative HTTP/1.1\r\n\r\n"),
            "\"/relative\" is not an absolute http:// URL (HTTPS goes through CONNECT)"
        );
        assert_eq!(
            why(b"CONNECT example.com HTTP/1.1\r\n\r\n"),
            "\"example.com\" is not host:port"
        );
        assert_eq!(
            why(b"GET http://example.com/ HTTP/1.1\r\n"),
            "the request head is cut short"
        );
    }
}
