//! The listener of every HTTP front (`podhost serve`, `podhost mcp --listen`): accepts TCP
//! connections and serves each with hyper's HTTP/1, with the defences a listener open to the
//! network needs.
//!
//! Owns: the accept loop, the table of open connections with their deadlines, the eviction of
//! connections at the cap, the ledger of body bytes held, the open-file limit, and graceful
//! shutdown of the connections.
//!
//! Defences (each a setting of [`HttpLimits`]):
//! * **Header timeout.** A connection must finish a request's headers within `header_timeout`
//!   of being accepted, or of the first byte it sends after the previous response.
//! * **Idle timeout.** A kept-alive connection that sends nothing for `idle_timeout` after a
//!   response is closed.
//! * **Body timeout.** A body that has not arrived within `body_timeout` of its request's start
//!   closes the connection (see `body`).
//! * **A cap on the body bytes held** across all connections (`max_body_bytes_held`): a body
//!   whose next bytes would pass it closes its connection (see `body`).
//! * **A cap on open connections.** At the cap, the oldest connection that is not inside a
//!   request (it has not finished its headers, or it idles between requests) is closed to make
//!   room, so a flood of half-open connections cannot keep `/healthz` from being served; when
//!   every connection is inside a request, the new one is closed at once. [`fit_open_files`]
//!   raises the open-file limit to hold the cap, or lowers the cap to what the limit holds.
//!
//! Invariants:
//! * A refusal for load is always a closed connection, never a `4xx` (Oumi retries a dropped
//!   connection and fails the row on a `4xx`).
//! * No lock is held across an `.await`; the table's lock guards a map and nothing else.
//! * Every connection task is tracked; shutdown asks each connection to finish its request and
//!   waits a bounded time for them.
//!
//! Non-goals: TLS (put a proxy in front), HTTP/2, what a request means (the fronts' routes).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tracing::{debug, warn};

use super::body::{Hold, Ledger, Metered};

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
    /// A request is being handled (its headers are complete).
    busy: AtomicBool,
    /// At least one request has been handled (later waits are idle waits).
    served: AtomicBool,
    /// Cancelled to close the connection at once.
    close: CancellationToken,
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
    /// inside a request, so the new one must be refused.
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
            busy: AtomicBool::new(false),
            served: AtomicBool::new(false),
            close: CancellationToken::new(),
        });
        map.insert(id, conn.clone());
        Some(conn)
    }

    /// Closes the oldest connection that is not inside a request; false when there is none.
    fn evict(map: &mut BTreeMap<u64, Arc<Conn>>) -> bool {
        let Some(victim) = map
            .values()
            .find(|c| !c.busy.load(Ordering::Acquire))
            .cloned()
        else {
            return false;
        };
        debug!(
            connection = victim.id,
            "closing the oldest connection not inside a request to make room"
        );
        victim.close.cancel();
        map.remove(&victim.id);
        true
    }

    fn remove(&self, id: u64) {
        self.map().remove(&id);
    }

    /// Closes every connection past its header or idle deadline.
    fn sweep(&self) {
        self.sweep_at(self.now_ms());
    }

    /// [`sweep`](Self::sweep) at `now` (milliseconds since the epoch).
    fn sweep_at(&self, now: u64) {
        let header = self.limits.header_timeout.as_millis() as u64;
        let idle = self.limits.idle_timeout.as_millis() as u64;
        let mut map = self.map();
        map.retain(|_, c| {
            if c.busy.load(Ordering::Acquire) {
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
/// start of the next request's headers), and lingering on close (see [`LINGER`]).
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
            if !c.busy.load(Ordering::Acquire) && c.first_byte.load(Ordering::Acquire) == NONE {
                c.first_byte.store(self.table.now_ms(), Ordering::Release);
            }
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
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
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
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
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
                conn.busy.store(true, Ordering::Release);
                // Dropped with this future: what the request's body took is given back when
                // the request is done, however it ends.
                let hold = Hold::new(table.ledger.clone());
                let (close, id) = (conn.close.clone(), conn.id);
                let req = req.map(|body| {
                    Body::new(Metered::new(body, hold.clone(), close, id, body_timeout))
                });
                let resp = app.oneshot(req).await;
                drop(hold);
                conn.first_byte.store(NONE, Ordering::Release);
                conn.waiting_since.store(table.now_ms(), Ordering::Release);
                conn.served.store(true, Ordering::Release);
                conn.busy.store(false, Ordering::Release);
                resp
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
    use pretty_assertions::assert_eq;

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

    #[test]
    fn at_the_cap_the_oldest_connection_not_inside_a_request_goes() {
        let t = table(3);
        let a = t.admit().unwrap();
        let b = t.admit().unwrap();
        let c = t.admit().unwrap();
        a.busy.store(true, Ordering::Release);
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
            x.busy.store(true, Ordering::Release);
        }
        assert!(t.admit().is_none(), "every connection is inside a request");
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
