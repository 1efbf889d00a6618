//! The listener of every HTTP front (`podhost serve`, `podhost mcp --listen`): accepts TCP
//! connections and serves each with hyper's HTTP/1, with the defences a listener open to the
//! network needs.
//!
//! Owns: the accept loop, the table of open connections with their deadlines, the eviction of
//! connections at the cap, the ledger of body bytes held, the response bodies that keep a
//! connection inside its request while they stream, the open-file limit, and graceful shutdown
//! of the connections.
//!
//! A connection is *inside a request* from the end of the request's headers until its response
//! has been written whole: a streamed body (an MCP event stream, a long chunked answer) keeps
//! it inside for as long as it streams. The response body holds a guard ([`Inside`]) until it
//! ends or is dropped; the socket then marks the connection out of the request at hyper's next
//! flush, once the last byte has been handed to the kernel.
//!
//! Defences (each a setting of [`HttpLimits`]):
//! * **Header timeout.** A connection must finish a request's headers within `header_timeout`
//!   of being accepted, or of the first byte it sends after the previous response.
//! * **Idle timeout.** A kept-alive connection that sends nothing for `idle_timeout` after a
//!   response has been written whole is closed. A connection inside a request is never closed
//!   for idleness, however long its handler works or its response streams.
//! * **A client that stops reading.** A response whose writes have found the socket full for
//!   `idle_timeout` closes its connection: a client cannot hold a connection inside a request by
//!   not reading the answer.
//! * **Body timeout.** A body that has not arrived within `body_timeout` of its request's start
//!   closes the connection (see `body`).
//! * **A cap on the body bytes held** across all connections (`max_body_bytes_held`): a body
//!   whose next bytes would pass it closes its connection (see `body`).
//! * **A cap on open connections.** At the cap, one connection is closed to make room, the
//!   first of: the oldest connection not inside a request (it has not finished its headers, or
//!   it idles between requests); then the connection whose request body the handler still
//!   awaits and which has brought nothing for longest (a slow body waits on its client, it is
//!   not work done for it). So neither a flood of half-open connections nor one of slow bodies
//!   can keep `/healthz` from being served. A connection whose request body has arrived whole
//!   (or was dropped by its handler) while the handler works or the response is written is
//!   never closed for room; when every connection is such, the new one is closed at once.
//!   [`fit_open_files`] raises the open-file limit to hold the cap, or lowers the cap to what
//!   the limit holds.
//!
//! Invariants:
//! * A refusal for load is always a closed connection, never a `4xx` (Oumi retries a dropped
//!   connection and fails the row on a `4xx`).
//! * A response that streams is never cut by the idle sweep or by eviction; only its client
//!   (closing, or not reading for `idle_timeout`), the handler, or shutdown ends it.
//! * No lock is held across an `.await`; the table's lock guards a map and nothing else. The
//!   state eviction and the sweep read (inside a request, body awaited, writes blocked) is in
//!   atomics, written by the connection's own task.
//! * Every connection task is tracked; shutdown asks each connection to finish its request and
//!   waits a bounded time for them.
//!
//! Non-goals: TLS (put a proxy in front), HTTP/2, what a request means (the fronts' routes).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tracing::{debug, warn};

use super::body::{Arrival, Hold, Ledger, Metered};

/// The listener's limits; see the module doc for what each one does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpLimits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most bytes of request bodies held at once, across all connections.
    pub max_body_bytes_held: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(60),
            max_connections: 4096,
            max_body_bytes_held: 64 << 20,
        }
    }
}

/// How long shutdown waits for connections to finish the request they are in.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// "No byte since the last response."
const NONE: u64 = u64::MAX;

/// One open connection, as the table and its handlers see it.
#[derive(Debug)]
struct Conn {
    /// The order of acceptance (oldest first).
    id: u64,
    /// Milliseconds since the table's epoch when the current wait for headers began: the accept,
    /// or the end of the previous request.
    waiting_since: AtomicU64,
    /// Milliseconds since the epoch of the first byte read since then; [`NONE`] while none.
    first_byte: AtomicU64,
    /// Requests whose response body has not ended ([`Inside`] guards): 0 or 1, and 2 for the
    /// moment a finished response's body is dropped after the next request began.
    inside: AtomicU32,
    /// A response has ended but hyper may still hold some of it unwritten: the connection
    /// stays busy until the socket has taken all of it (the next flush).
    unflushed: AtomicBool,
    /// Milliseconds since the epoch when a write last found the socket full (the client is not
    /// reading); [`NONE`] while writes go through.
    write_blocked: AtomicU64,
    /// At least one request has been handled (later waits are idle waits).
    served: AtomicBool,
    /// The current request's body: whether it is still awaited from the client.
    body: Arc<Arrival>,
    /// Cancelled to close the connection at once.
    close: CancellationToken,
}

impl Conn {
    /// Inside a request: from its headers until its response has been written whole.
    fn busy(&self) -> bool {
        self.inside.load(Ordering::Acquire) > 0 || self.unflushed.load(Ordering::Acquire)
    }

    /// Inside a request whose body the handler still awaits from the client: since when it has
    /// brought nothing.
    fn stalled_since(&self) -> Option<u64> {
        self.body.stalled_since().filter(|_| self.busy())
    }
}

/// One request inside its connection: taken when its headers are complete, dropped when its
/// response body ends (or is dropped with the connection). The connection is busy while one is
/// held, and until the socket has taken the last of the response (see [`Watched`]).
struct Inside {
    conn: Arc<Conn>,
}

impl Inside {
    fn enter(conn: Arc<Conn>) -> Inside {
        conn.inside.fetch_add(1, Ordering::AcqRel);
        Inside { conn }
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        let c = &self.conn;
        c.served.store(true, Ordering::Release);
        // Before leaving: the sweep must never see the connection idle with the previous
        // request's (long past) wait start.
        c.unflushed.store(true, Ordering::Release);
        c.inside.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body holding its request's [`Inside`] until the body ends: a streamed answer
/// (an MCP event stream, a long chunked body) keeps its connection busy while it is written.
struct Answer {
    inner: Body,
    inside: Option<Inside>,
}

impl HttpBody for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            this.inside = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Every open connection, by id.
struct Table {
    epoch: Instant,
    limits: HttpLimits,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    /// The body bytes held by every connection's request.
    ledger: Arc<Ledger>,
}

impl Table {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new connection, first making room at the cap. `None`: every connection is
    /// doing work for its client (see [`evict`](Self::evict)), so the new one must be refused.
    fn admit(&self) -> Option<Arc<Conn>> {
        let mut map = self.map();
        if map.len() >= self.limits.max_connections && !Self::evict(&mut map) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            waiting_since: AtomicU64::new(self.now_ms()),
            first_byte: AtomicU64::new(NONE),
            inside: AtomicU32::new(0),
            unflushed: AtomicBool::new(false),
            write_blocked: AtomicU64::new(NONE),
            served: AtomicBool::new(false),
            body: Arc::new(Arrival::new(self.epoch)),
            close: CancellationToken::new(),
        });
        map.insert(id, conn.clone());
        Some(conn)
    }

    /// Closes one connection to make room: the oldest that is not inside a request, else the
    /// one whose request body has brought nothing for longest; false when every connection has
    /// its request whole and is handling it or writing its response.
    fn evict(map: &mut BTreeMap<u64, Arc<Conn>>) -> bool {
        let victim = match map.values().find(|c| !c.busy()) {
            Some(idle) => {
                debug!(
                    connection = idle.id,
                    "closing the oldest connection not inside a request to make room"
                );
                idle.clone()
            }
            None => {
                let Some((_, stalled)) = map
                    .values()
                    .filter_map(|c| Some(((c.stalled_since()?, c.id), c)))
                    .min_by_key(|(key, _)| *key)
                else {
                    return false;
                };
                debug!(
                    connection = stalled.id,
                    "closing the connection whose request body has stalled longest to make room"
                );
                stalled.clone()
            }
        };
        victim.close.cancel();
        map.remove(&victim.id);
        true
    }

    fn remove(&self, id: u64) {
        self.map().remove(&id);
    }

    /// Closes every connection past its header or idle deadline, and every connection whose
    /// client has not read its response for the idle timeout.
    fn sweep(&self) {
        self.sweep_at(self.now_ms());
    }

    /// [`sweep`](Self::sweep) at `now` (milliseconds since the epoch).
    fn sweep_at(&self, now: u64) {
        let header = self.limits.header_timeout.as_millis() as u64;
        let idle = self.limits.idle_timeout.as_millis() as u64;
        let mut map = self.map();
        map.retain(|_, c| {
            let blocked = c.write_blocked.load(Ordering::Acquire);
            if blocked != NONE && now >= blocked.saturating_add(idle) {
                debug!(
                    connection = c.id,
                    "closing a connection whose client stopped reading its response"
                );
                c.close.cancel();
                return false;
            }
            if c.busy() {
                return true;
            }
            let since = c.waiting_since.load(Ordering::Acquire);
            let first = c.first_byte.load(Ordering::Acquire);
            let deadline = if !c.served.load(Ordering::Acquire) {
                since.saturating_add(header)
            } else if first == NONE {
                since.saturating_add(idle)
            } else {
                first.saturating_add(header)
            };
            if now < deadline {
                return true;
            }
            debug!(connection = c.id, "closing a connection past its deadline");
            c.close.cancel();
            false
        });
    }

    fn len(&self) -> usize {
        self.map().len()
    }
}

/// How long a closing connection keeps reading (and dropping) what the client still sends, and
/// how much of it: a client still sending a body it was refused (a `413` answered before any of
/// it was read) then reads the answer instead of a reset.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 16 << 20;

/// The connection's socket, noting when a byte arrives while no request is being handled (the
/// start of the next request's headers), when the client stops taking what is written, and
/// when a finished response has been written whole (the start of the idle wait); lingering on
/// close (see [`LINGER`]).
struct Watched {
    io: TcpStream,
    conn: Arc<Conn>,
    table: Arc<Table>,
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
    drained: usize,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let c = &self.conn;
            if !c.busy() && c.first_byte.load(Ordering::Acquire) == NONE {
                c.first_byte.store(self.table.now_ms(), Ordering::Release);
            }
        }
        polled
    }
}

impl Watched {
    /// Notes whether a write found the socket full.
    fn wrote<T>(&self, polled: Poll<T>) -> Poll<T> {
        let blocked = &self.conn.write_blocked;
        if polled.is_pending() {
            if blocked.load(Ordering::Acquire) == NONE {
                blocked.store(self.table.now_ms(), Ordering::Release);
            }
        } else if blocked.load(Ordering::Acquire) != NONE {
            blocked.store(NONE, Ordering::Release);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        self.wrote(polled)
    }

    /// Hyper flushes its socket once it has written everything it holds: a response that has
    /// ended is then written whole, and the idle wait begins.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.io).poll_flush(cx);
        let c = &self.conn;
        if matches!(polled, Poll::Ready(Ok(()))) && c.unflushed.load(Ordering::Acquire) {
            if c.inside.load(Ordering::Acquire) == 0 {
                c.first_byte.store(NONE, Ordering::Release);
                c.waiting_since
                    .store(self.table.now_ms(), Ordering::Release);
            }
            c.unflushed.store(false, Ordering::Release);
        }
        self.wrote(polled)
    }

    /// Sends FIN, then drops what the client still sends until it closes its side too, or for
    /// at most [`LINGER`] and [`LINGER_BYTES`]: closing a socket with unread data makes the
    /// kernel answer with a reset, which can destroy the response before the client reads it.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.linger.is_none() {
            std::task::ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
            this.linger = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        let mut scratch = [0u8; 4096];
        while this.drained < LINGER_BYTES {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.io).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => this.drained += buf.filled().len(),
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => {
                    return match this.linger.as_mut().map(|s| s.as_mut().poll(cx)) {
                        Some(Poll::Pending) => Poll::Pending,
                        _ => Poll::Ready(Ok(())),
                    };
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.wrote(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets the open connections finish
/// their requests (at most [`SHUTDOWN_GRACE`]).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let table = Arc::new(Table {
        epoch: Instant::now(),
        limits,
        conns: Mutex::new(BTreeMap::new()),
        next_id: AtomicU64::new(0),
        ledger: Arc::new(Ledger::new(limits.max_body_bytes_held)),
    });
    let stop = CancellationToken::new();
    let tracker = TaskTracker::new();
    let tick = (limits.header_timeout.min(limits.idle_timeout) / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    {
        let (table, stop) = (table.clone(), stop.clone());
        tracker.spawn(async move {
            let mut every = tokio::time::interval(tick);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = every.tick() => table.sweep(),
                }
            }
        });
    };
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE) or a connection reset before it was
                // accepted: make room where possible and go on after a pause, so an error that
                // persists does not spin.
                warn!(error = %e, open = table.len(), "could not accept a connection");
                Table::evict(&mut table.map());
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let Some(conn) = table.admit() else {
            debug!("at the connection cap with every connection inside a request: refused");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        tracker.spawn(connection(
            stream,
            conn,
            table.clone(),
            app.clone(),
            stop.clone(),
        ));
    }
    drop(listener);
    stop.cancel();
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(1), tracker.wait())
        .await
        .is_err()
    {
        warn!("connections still open after the shutdown grace; closing them");
    }
}

/// Serves one connection until it ends, is closed by the table, or shutdown has waited long
/// enough.
async fn connection(
    stream: TcpStream,
    conn: Arc<Conn>,
    table: Arc<Table>,
    app: Router,
    stop: CancellationToken,
) {
    let body_timeout = table.limits.body_timeout;
    let io = TokioIo::new(Watched {
        io: stream,
        conn: conn.clone(),
        table: table.clone(),
        linger: None,
        drained: 0,
    });
    let svc = {
        let (conn, table) = (conn.clone(), table.clone());
        hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
            let (conn, table, app) = (conn.clone(), table.clone(), app.clone());
            async move {
                // Held by the response body until it ends, or dropped with this future.
                let inside = Inside::enter(conn.clone());
                // Dropped with this future: what the request's body took is given back when
                // the request is done, however it ends.
                let hold = Hold::new(table.ledger.clone());
                let (close, id, arrival) = (conn.close.clone(), conn.id, conn.body.clone());
                let req = req.map(|body| {
                    Body::new(Metered::new(
                        body,
                        hold.clone(),
                        arrival,
                        close,
                        id,
                        body_timeout,
                    ))
                });
                let resp = app.oneshot(req).await;
                drop(hold);
                resp.map(|resp| {
                    resp.map(|inner| Answer {
                        inner,
                        inside: Some(inside),
                    })
                })
            }
        })
    };
    let served = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .header_read_timeout(None)
        .serve_connection(io, svc);
    tokio::pin!(served);
    tokio::select! {
        r = &mut served => {
            if let Err(e) = r {
                debug!(connection = conn.id, error = %e, "connection ended with an error");
            }
        }
        _ = conn.close.cancelled() => {}
        _ = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            tokio::select! {
                _ = &mut served => {}
                _ = conn.close.cancelled() => {}
                _ = tokio::time::sleep(SHUTDOWN_GRACE) => {}
            }
        }
    }
    table.remove(conn.id);
}

/// Descriptors kept back from the connection cap for everything else the process opens (a
/// store, commands, model calls).
const FD_RESERVE: u64 = 512;

/// Raises the open-file limit to its hard limit (each connection holds a descriptor), and lowers
/// the connection cap, with a warning, when even that limit cannot hold it.
pub fn fit_open_files(mut limits: HttpLimits) -> HttpLimits {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let soft = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                warn!(error = %e, soft, hard, "could not raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(_) => return limits,
    };
    let room = soft.saturating_sub(FD_RESERVE).max(16);
    if (limits.max_connections as u64) > room {
        warn!(
            configured = limits.max_connections,
            open_file_limit = soft,
            "the open-file limit cannot hold PODHOST_HTTP_MAX_CONNECTIONS; lowering it to {room}"
        );
        limits.max_connections = room as usize;
    }
    limits
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::{get, post};
    use pretty_assertions::assert_eq;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::{Notify, mpsc};

    /// Every await on the server in these tests has this long.
    const T: Duration = Duration::from_secs(5);

    /// Serves `app` on a free loopback port until the returned sender is dropped.
    async fn start(app: Router, limits: HttpLimits) -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve(listener, app, limits, async {
            let _ = stopped.await;
        }));
        (addr, stop)
    }

    /// Connects to `addr` and sends `head`.
    async fn send(addr: &str, head: &str) -> TcpStream {
        let mut sock = TcpStream::connect(addr).await.unwrap();
        sock.write_all(head.as_bytes()).await.unwrap();
        sock
    }

    /// Reads from `sock` until what it sent contains `want`; returns all of it.
    async fn read_until(sock: &mut TcpStream, want: &str) -> String {
        let mut got = Vec::new();
        tokio::time::timeout(T, async {
            let mut buf = [0u8; 4096];
            while !String::from_utf8_lossy(&got).contains(want) {
                let n = sock.read(&mut buf).await.unwrap();
                assert!(
                    n > 0,
                    "closed before {want:?}: {:?}",
                    String::from_utf8_lossy(&got)
                );
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no {want:?} within {T:?}"));
        String::from_utf8_lossy(&got).into_owned()
    }

    /// Reads until the server closes `sock` (end of file or a reset); returns what was read.
    async fn closed(sock: &mut TcpStream) -> String {
        let mut got = Vec::new();
        tokio::time::timeout(T, async {
            let mut buf = [0u8; 4096];
            loop {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the connection is still open after {T:?}"));
        String::from_utf8_lossy(&got).into_owned()
    }

    /// Whether the server has not closed `sock` (nothing to read yet, no end of file).
    fn still_open(sock: &TcpStream) -> bool {
        let mut probe = [0u8; 1];
        matches!(sock.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

    /// The body of a `Connection: close` answer to [`HEALTHZ`].
    fn answered_ok(answer: &str) -> bool {
        answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.ends_with("\r\n\r\nok")
    }

    #[tokio::test]
    async fn a_streamed_response_outlasts_the_idle_timeout_and_new_connections_at_the_cap() {
        let (chunks, rx) = mpsc::channel::<&'static str>(4);
        let rx = Arc::new(Mutex::new(Some(rx)));
        let app = Router::new()
            .route(
                "/stream",
                get(move || {
                    let rx = rx.lock().unwrap().take().unwrap();
                    async move {
                        Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
                            let chunk = rx.recv().await?;
                            Some((Ok::<_, io::Error>(Bytes::from(chunk)), rx))
                        }))
                    }
                }),
            )
            .route("/healthz", get(|| async { "ok" }));
        let limits = HttpLimits {
            idle_timeout: Duration::from_millis(300),
            max_connections: 2,
            ..HttpLimits::default()
        };
        let (addr, _stop) = start(app, limits).await;
        let mut stream = send(&addr, "GET /stream HTTP/1.1\r\nHost: x\r\n\r\n").await;
        chunks.send("one,").await.unwrap();
        let mut streamed = read_until(&mut stream, "one,").await;
        // New connections fill the cap: each makes room by closing the one before it, never
        // the stream.
        let mut waiting = Vec::new();
        for _ in 0..3 {
            waiting.push(TcpStream::connect(&addr).await.unwrap());
        }
        let mut health = send(&addr, HEALTHZ).await;
        let answer = closed(&mut health).await;
        assert!(answered_ok(&answer), "{answer}");
        for sock in &mut waiting {
            assert_eq!(closed(sock).await, "");
        }
        // Silent for three idle timeouts, and still streaming.
        tokio::time::sleep(limits.idle_timeout * 3).await;
        assert!(still_open(&stream));
        chunks.send("two").await.unwrap();
        drop(chunks);
        // Delivered whole; then the idle wait starts, and ends the kept-alive connection.
        streamed += &closed(&mut stream).await;
        assert!(
            streamed.starts_with("HTTP/1.1 200 OK\r\n")
                && streamed.ends_with("\r\n\r\n4\r\none,\r\n3\r\ntwo\r\n0\r\n\r\n"),
            "{streamed}"
        );
    }

    #[tokio::test]
    async fn at_the_cap_a_stalled_body_makes_room_and_a_request_being_handled_does_not() {
        let (started_tx, mut started) = mpsc::channel::<&'static str>(8);
        let release = Arc::new(Notify::new());
        let work = {
            let (started_tx, release) = (started_tx.clone(), release.clone());
            move |body: Bytes| async move {
                started_tx.send("work").await.unwrap();
                release.notified().await;
                format!("worked on {} bytes", body.len())
            }
        };
        let echo = move |body: Body| async move {
            started_tx.send("echo").await.unwrap();
            match axum::body::to_bytes(body, usize::MAX).await {
                Ok(bytes) => format!("{} bytes", bytes.len()),
                Err(_) => String::new(),
            }
        };
        let app = Router::new()
            .route("/work", post(work))
            .route("/echo", post(echo))
            .route("/healthz", get(|| async { "ok" }));
        let limits = HttpLimits {
            max_connections: 3,
            ..HttpLimits::default()
        };
        let (addr, _stop) = start(app, limits).await;
        let head = |path: &str, len: usize| {
            format!(
                "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                 Content-Length: {len}\r\n\r\n"
            )
        };
        let next = async |started: &mut mpsc::Receiver<&'static str>| {
            tokio::time::timeout(T, started.recv())
                .await
                .unwrap()
                .unwrap()
        };
        // A request whose body has arrived whole, being handled.
        let mut worker = send(&addr, &(head("/work", 5) + "hello")).await;
        assert_eq!(next(&mut started).await, "work");
        // Two bodies that stall after a byte fill the cap.
        let mut slow = Vec::new();
        for _ in 0..2 {
            slow.push(send(&addr, &(head("/echo", 100) + "x")).await);
            assert_eq!(next(&mut started).await, "echo");
        }
        // A health check makes room by closing the body that has waited longest, unanswered.
        let mut health = send(&addr, HEALTHZ).await;
        let answer = closed(&mut health).await;
        assert!(answered_ok(&answer), "{answer}");
        assert_eq!(closed(&mut slow[0]).await, "");
        assert!(still_open(&slow[1]) && still_open(&worker));
        // The request being handled is answered, and so is the other body once it arrives.
        release.notify_one();
        let answer = closed(&mut worker).await;
        assert!(answer.ends_with("worked on 5 bytes"), "{answer}");
        slow[1].write_all(&[b'x'; 99]).await.unwrap();
        let answer = closed(&mut slow[1]).await;
        assert!(answer.ends_with("100 bytes"), "{answer}");
    }

    fn table(max: usize) -> Table {
        Table {
            epoch: Instant::now(),
            limits: HttpLimits {
                header_timeout: Duration::from_millis(100),
                idle_timeout: Duration::from_millis(300),
                max_connections: max,
                ..HttpLimits::default()
            },
            conns: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            ledger: Arc::new(Ledger::new(1 << 20)),
        }
    }

    /// Marks a connection inside a request whose body has arrived whole.
    fn working(c: &Conn) {
        c.inside.store(1, Ordering::Release);
    }

    #[test]
    fn at_the_cap_the_oldest_connection_not_inside_a_request_goes() {
        let t = table(3);
        let a = t.admit().unwrap();
        let b = t.admit().unwrap();
        let c = t.admit().unwrap();
        working(&a);
        let d = t.admit().unwrap();
        assert_eq!(
            (
                a.close.is_cancelled(),
                b.close.is_cancelled(),
                c.close.is_cancelled()
            ),
            (false, true, false)
        );
        assert_eq!(t.map().keys().copied().collect::<Vec<_>>(), vec![0, 2, 3]);
        for x in [&c, &d] {
            working(x);
        }
        assert!(t.admit().is_none(), "every connection is inside a request");
    }

    #[test]
    fn at_the_cap_idle_connections_go_then_the_longest_stalled_body_never_a_working_one() {
        let t = table(5);
        let conns: Vec<_> = (0..5).map(|_| t.admit().unwrap()).collect();
        let [_idle, slow, slower, worker, streamer] = &conns[..] else {
            unreachable!()
        };
        for c in [slow, slower, worker] {
            working(c);
        }
        slow.body.set_stalled_since(Some(40));
        slower.body.set_stalled_since(Some(10));
        // A response that has ended but is not all written yet.
        streamer.unflushed.store(true, Ordering::Release);
        let closed = || {
            conns
                .iter()
                .map(|c| c.close.is_cancelled())
                .collect::<Vec<_>>()
        };
        let new = t.admit().unwrap();
        assert_eq!(closed(), [true, false, false, false, false]);
        working(&new);
        let newer = t.admit().unwrap();
        assert_eq!(
            closed(),
            [true, false, true, false, false],
            "the body that has brought nothing for longest goes first"
        );
        working(&newer);
        t.admit().unwrap();
        assert_eq!(closed(), [true, true, true, false, false]);
        assert!(
            t.admit().is_some(),
            "the connection just admitted waits for its headers"
        );
        assert_eq!(t.len(), 5);
        for c in t.map().values() {
            working(c);
        }
        assert!(
            t.admit().is_none(),
            "working and writing connections are never closed"
        );
        assert_eq!(closed(), [true, true, true, false, false]);
    }

    #[test]
    fn a_response_being_written_outlives_the_idle_timeout_but_not_a_client_that_stops_reading() {
        let t = table(10);
        let streaming = t.admit().unwrap();
        streaming.served.store(true, Ordering::Release);
        working(&streaming);
        let written = t.admit().unwrap();
        written.served.store(true, Ordering::Release);
        written.unflushed.store(true, Ordering::Release);
        let unread = t.admit().unwrap();
        working(&unread);
        unread.write_blocked.store(100, Ordering::Release);
        t.sweep_at(390);
        assert_eq!(t.len(), 3);
        t.sweep_at(10_000);
        assert_eq!(
            (
                streaming.close.is_cancelled(),
                written.close.is_cancelled(),
                unread.close.is_cancelled()
            ),
            (false, false, true),
            "only the response its client has not read for the idle timeout is closed"
        );
    }

    #[test]
    fn deadlines_are_the_header_timeout_then_the_idle_timeout() {
        let t = table(10);
        let fresh = t.admit().unwrap();
        let idle = t.admit().unwrap();
        idle.served.store(true, Ordering::Release);
        let started = t.admit().unwrap();
        started.served.store(true, Ordering::Release);
        started.first_byte.store(20, Ordering::Release);
        t.sweep_at(110);
        assert_eq!(
            t.len(),
            2,
            "only the fresh connection is past its header deadline"
        );
        t.sweep_at(150);
        assert_eq!(
            (
                fresh.close.is_cancelled(),
                idle.close.is_cancelled(),
                started.close.is_cancelled()
            ),
            (true, false, true)
        );
        t.sweep_at(350);
        assert!(idle.close.is_cancelled());
        assert_eq!(t.len(), 0);
    }
}
