//! Request bodies as the listener hands them to handlers: each must arrive within the body
//! timeout, and every byte a handler reads counts against one cap on the body bytes held across
//! all connections.
//!
//! A handler reads a body as it arrives (nothing is allocated from a declared length), so what a
//! request holds is what it has read. Slow senders used to hold up to a whole body each until
//! their timeout: a hundred stalled 10 MiB bodies pinned a gigabyte. Now every data frame is
//! taken from the [`Ledger`] before the handler sees it, and given back when the request is done.
//!
//! Invariants:
//! * The ledger never holds more than its cap: a frame that would pass it is refused as load is
//!   refused (the connection is closed, without an answer), and nothing of it is counted.
//! * A body that has not ended within the body timeout of its request's start closes the
//!   connection, without an answer.
//! * What a request took is given back once, when both its handler and its body are gone
//!   ([`Hold`]'s drop), however they end.
//! * A body's [`Arrival`] says it is still awaited from its start until its end is seen (the
//!   end of the stream, or the last byte of its `Content-Length`) or the handler drops it; each
//!   data frame in between is progress. The listener evicts, at its connection cap, the
//!   connection whose body has made no progress for longest (see `listener`).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::floor::metrics;

/// The body bytes held across all connections, and their cap.
#[derive(Debug)]
pub(super) struct Ledger {
    cap: usize,
    held: AtomicUsize,
}

impl Ledger {
    pub(super) fn new(cap: usize) -> Ledger {
        Ledger {
            cap,
            held: AtomicUsize::new(0),
        }
    }

    /// Takes `n` bytes; false (and nothing taken) when they would pass the cap.
    fn take(&self, n: usize) -> bool {
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(n).filter(|&total| total <= self.cap)
            })
            .is_ok();
        if taken {
            metrics::http_body_bytes_held(n as i64);
        }
        taken
    }

    fn give(&self, n: usize) {
        if n > 0 {
            self.held.fetch_sub(n, Ordering::AcqRel);
            metrics::http_body_bytes_held(-(n as i64));
        }
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// What one request holds of the ledger; given back when dropped.
#[derive(Debug)]
pub(super) struct Hold {
    ledger: Arc<Ledger>,
    bytes: AtomicUsize,
}

impl Hold {
    pub(super) fn new(ledger: Arc<Ledger>) -> Arc<Hold> {
        Arc::new(Hold {
            ledger,
            bytes: AtomicUsize::new(0),
        })
    }

    fn take(&self, n: usize) -> bool {
        let taken = self.ledger.take(n);
        if taken {
            self.bytes.fetch_add(n, Ordering::AcqRel);
        }
        taken
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.ledger.give(*self.bytes.get_mut());
    }
}

/// Whether a connection's current request body is still awaited from its client, and since
/// when it has made no progress; written by [`Metered`], read by the listener's eviction.
#[derive(Debug)]
pub(super) struct Arrival {
    /// The listener's epoch: times are milliseconds since it.
    epoch: Instant,
    /// When the awaited body started or last brought data; [`Arrival::NONE`] while no body is
    /// awaited.
    stalled_since: AtomicU64,
}

impl Arrival {
    const NONE: u64 = u64::MAX;

    pub(super) fn new(epoch: Instant) -> Arrival {
        Arrival {
            epoch,
            stalled_since: AtomicU64::new(Self::NONE),
        }
    }

    /// The body is awaited, and has just started or just brought data.
    fn progress(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.stalled_since.store(now, Ordering::Release);
    }

    /// The body has arrived whole, or is no longer read.
    fn arrived(&self) {
        self.stalled_since.store(Self::NONE, Ordering::Release);
    }

    /// Since when (milliseconds since the epoch) the awaited body has brought nothing; `None`
    /// when no body is awaited.
    pub(super) fn stalled_since(&self) -> Option<u64> {
        Some(self.stalled_since.load(Ordering::Acquire)).filter(|&t| t != Self::NONE)
    }

    #[cfg(test)]
    pub(super) fn set_stalled_since(&self, ms: Option<u64>) {
        self.stalled_since
            .store(ms.unwrap_or(Self::NONE), Ordering::Release);
    }
}

/// A request body, timed and counted (see the module doc).
pub(super) struct Metered {
    inner: Incoming,
    hold: Arc<Hold>,
    /// Told when the body makes progress and when it has arrived.
    arrival: Arc<Arrival>,
    /// Cancelled to close the connection.
    close: CancellationToken,
    connection: u64,
    /// When the body must have ended; `None` for a body that is empty from the start.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    timeout: Duration,
    /// The connection is being closed: the body yields nothing more.
    stopped: bool,
}

impl Metered {
    pub(super) fn new(
        inner: Incoming,
        hold: Arc<Hold>,
        arrival: Arc<Arrival>,
        close: CancellationToken,
        connection: u64,
        timeout: Duration,
    ) -> Metered {
        let deadline = (!inner.is_end_stream()).then(|| Box::pin(tokio::time::sleep(timeout)));
        if deadline.is_some() {
            arrival.progress();
        } else {
            arrival.arrived();
        }
        Metered {
            inner,
            hold,
            arrival,
            close,
            connection,
            deadline,
            timeout,
            stopped: false,
        }
    }

    /// Closes the connection; the handler gets no more of the body (and is dropped with the
    /// connection), so no answer is sent.
    fn stop(&mut self, reason: &'static str) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.stopped = true;
        self.close.cancel();
        metrics::http_body_refused(reason);
        Poll::Pending
    }
}

impl HttpBody for Metered {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if this.stopped {
            return Poll::Pending;
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, Bytes::len);
                if n > 0 && !this.hold.take(n) {
                    warn!(
                        connection = this.connection,
                        cap_bytes = this.hold.ledger.cap,
                        "a request body would pass the cap on body bytes held \
                         (PODHOST_HTTP_MAX_BODY_HELD_MB); closing its connection"
                    );
                    return this.stop("held");
                }
                // Hyper counts a `Content-Length` down as it hands out data: the last byte
                // ends the body before the stream says so.
                if this.inner.is_end_stream() {
                    this.arrival.arrived();
                } else if n > 0 {
                    this.arrival.progress();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                let late = this
                    .deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if late {
                    warn!(
                        connection = this.connection,
                        timeout_secs = this.timeout.as_secs(),
                        "a request body did not arrive in time; closing its connection"
                    );
                    return this.stop("timeout");
                }
                Poll::Pending
            }
            end => {
                this.arrival.arrived();
                end
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Metered {
    /// A body the handler no longer reads is not awaited from the client any more.
    fn drop(&mut self) {
        self.arrival.arrived();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn the_ledger_holds_at_most_its_cap_and_holds_are_given_back_once() {
        let ledger = Arc::new(Ledger::new(100));
        let a = Hold::new(ledger.clone());
        let b = Hold::new(ledger.clone());
        assert!(a.take(60));
        assert!(!b.take(41), "60 + 41 would pass 100");
        assert!(b.take(40));
        assert_eq!(ledger.held(), 100);
        assert!(!a.take(1));
        drop(a);
        assert_eq!(ledger.held(), 40);
        assert!(b.take(60));
        drop(b);
        assert_eq!(ledger.held(), 0);
    }
}
