//! The BYOH endpoint's shared state: the [`Engine`] the routes call and the turn tasks share.
//!
//! Owns: the store, the model client and the settings; this replica's identity and lease terms;
//! the in-memory table of the turns this replica runs (their cancellation token, the fence of
//! their lease, the latest [`Secrets`]: key, credential-bearing URL, the values to scrub); the
//! permits that bound the turns running here; each open invocation's background processes;
//! and the per-invocation lock that makes a
//! submission's check-and-insert atomic against its concurrent duplicates in this process
//! (across replicas, the store's keys and row locks do it).
//!
//! Invariants:
//! * A [`Live`] entry exists only for a turn this replica claimed; its fence goes with every
//!   write the turn makes, and it is dropped when the turn's task ends.
//! * A turn whose lease was lost is marked so before its token is cancelled, so its task writes
//!   nothing and releases nothing.
//!
//! Non-goals: what a route means (`invocation`), running a turn and keeping leases (`runner`).

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};
use url::Url;

use super::protocol::{CheckedConnection, Credentials};
use super::store::{Fence, InvocationRow, LeaseTerms, StatusRow, Store};
use crate::chat::client::ModelClient;
use crate::chat::message::ApiKey;
use crate::tools::background::Jobs;
use crate::tools::{Toolbox, ToolboxBuilder};

/// Settings of the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The data directory: the database and one workspace per session.
    pub data_dir: PathBuf,
    /// Most turns running at once; further submissions are answered busy.
    pub max_running: usize,
    /// How long terminal sessions are kept.
    pub retention: Duration,
    /// How long a turn interrupted by a restart waits for a retried submission to bring a key.
    pub orphan_grace: Duration,
    /// How long `cancel` waits for the turn to stop before answering.
    pub cancel_wait: Duration,
    /// How long a claim on a turn holds unless renewed; renewed every third of it.
    pub lease: Duration,
    /// Model calls one submission may make.
    pub max_steps: u32,
    /// The model's limits as configured (a window or inputs left unset are asked of the
    /// server's model listing at each turn).
    pub limits: crate::chat::session::ChatLimits,
    /// Each session's toolbox: commands and file tools reach nothing of the data directory (the
    /// database, every session's workspace) or the credential file; each session adds its own
    /// workspace and private tmp.
    pub tools: ToolboxBuilder,
    /// Most background processes one invocation runs at once.
    pub max_background: usize,
    /// The template every new session's workspace starts as a copy of.
    pub template: Option<crate::exec::template::Template>,
}

/// What a submission brought that is never stored: its key, its base URL when that carries a
/// credential, and every credential value (to scrub from what is stored).
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    pub key: Option<ApiKey>,
    /// The base URL as given, when it carries a credential (the store holds it redacted).
    pub base_url: Option<SecretUrl>,
    pub credentials: Credentials,
}

/// A base URL that carries a credential: its `Debug` prints `[redacted]`.
#[derive(Clone)]
pub struct SecretUrl(Url);

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Secrets {
    pub fn of(conn: &CheckedConnection<'_>) -> Self {
        Secrets {
            key: conn.conn.api_key.clone(),
            base_url: conn
                .url_has_credentials()
                .then(|| SecretUrl(conn.base_url.clone())),
            credentials: conn.credentials(),
        }
    }

    /// Whether a turn needs these to call the model (they are lost with a restart).
    pub fn needed(&self) -> bool {
        self.key.is_some() || self.base_url.is_some()
    }
}

/// A turn being run by a task of this process.
#[derive(Debug)]
pub struct Live {
    pub cancel: CancellationToken,
    /// This replica's claim on the turn.
    pub fence: Fence,
    /// Set (before `cancel`) when the lease was lost: the task then writes nothing more.
    lost: AtomicBool,
    /// The status `get_status` answers from memory: set only while the turn runs here and
    /// nothing but this task changes it; cleared before anything else may (the task's own end
    /// write, a cancellation, a lost lease), so that it never answers older than the store.
    status: Mutex<Option<StatusRow>>,
    /// The turn's end whose write has not landed yet (a full disk): what this replica answers
    /// for the whole row meanwhile. Set and cleared with `status`.
    end: Mutex<Option<InvocationRow>>,
    /// The latest secrets a submission brought.
    secrets: Mutex<Secrets>,
    /// Set to `true` when the task has stopped.
    pub done: watch::Sender<bool>,
}

impl Live {
    pub fn key(&self) -> Option<ApiKey> {
        self.secrets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .key
            .clone()
    }

    /// Stops the turn because its lease is no longer this replica's.
    pub(super) fn lose(&self) {
        self.remember(None);
        self.lost.store(true, Ordering::SeqCst);
        self.cancel.cancel();
    }

    /// Stops the turn because it was cancelled (the store holds `cancelled` already).
    pub(super) fn stop_cancelled(&self) {
        self.remember(None);
        self.cancel.cancel();
    }

    /// The status to answer from memory, if any.
    pub fn remembered(&self) -> Option<StatusRow> {
        self.status
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn remember(&self, status: Option<StatusRow>) {
        *self.end.lock().unwrap_or_else(PoisonError::into_inner) = None;
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = status;
    }

    /// Answers `end` (the turn's end, whose write failed) from memory until the write lands or
    /// something else changes the turn ([`Live::remember`], a cancellation, a lost lease).
    pub(super) fn hold_end(&self, end: InvocationRow) {
        let status = end.status_row();
        *self.end.lock().unwrap_or_else(PoisonError::into_inner) = Some(end);
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = Some(status);
    }

    /// The end held by [`Live::hold_end`], if any.
    pub fn held_end(&self) -> Option<InvocationRow> {
        self.end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// The base URL to call when the submission's carries a credential.
    pub fn base_url(&self) -> Option<Url> {
        self.secrets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .base_url
            .as_ref()
            .map(|s| s.0.clone())
    }

    /// The latest secrets, whole.
    pub(super) fn secrets(&self) -> Secrets {
        self.secrets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Every credential value any submission of this turn brought.
    pub fn credentials(&self) -> Credentials {
        self.secrets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .credentials
            .clone()
    }

    /// A retried submission's secrets: its key and URL replace the old ones; its credential
    /// values join them.
    pub(super) fn set_secrets(&self, new: Secrets) {
        let mut s = self.secrets.lock().unwrap_or_else(PoisonError::into_inner);
        if new.key.is_some() {
            s.key = new.key;
        }
        if new.base_url.is_some() {
            s.base_url = new.base_url;
        }
        s.credentials.merge(&new.credentials);
    }
}

/// Whether this host can make sandboxes: the last fault, until a probe clears it.
#[derive(Debug, Default)]
pub struct SandboxHealth {
    pub(super) fault: Mutex<Option<String>>,
    /// Wakes the probe when a fault is recorded.
    pub(super) wake: Notify,
}

impl SandboxHealth {
    /// Why the host cannot make sandboxes now, if it cannot.
    pub fn fault(&self) -> Option<String> {
        self.fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records that a sandbox could not be made (or a command's session failed): new work is
    /// refused until a probe succeeds.
    pub fn failed(&self, why: &str) {
        let mut fault = self.fault.lock().unwrap_or_else(PoisonError::into_inner);
        if fault.is_none() {
            warn!(error = %why, "this host cannot make sandboxes: refusing new submissions until it can");
        }
        *fault = Some(why.to_owned());
        drop(fault);
        crate::floor::metrics::sandbox_fault(true);
        self.wake.notify_one();
    }

    pub(super) fn cleared(&self) {
        let was = self
            .fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if was.is_some() {
            info!("this host can make sandboxes again: taking new submissions");
        }
        crate::floor::metrics::sandbox_fault(false);
    }
}

/// The BYOH endpoint's core. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub store: Store,
    pub client: ModelClient,
    /// This replica's name in the store and how long its claims hold.
    pub terms: LeaseTerms,
    pub config: EngineConfig,
    pub live: Mutex<HashMap<String, Arc<Live>>>,
    pub permits: Arc<Semaphore>,
    pub tracker: TaskTracker,
    pub root: CancellationToken,
    /// Whether this host can make sandboxes (new work is refused while it cannot).
    pub sandboxes: SandboxHealth,
    /// The secrets of turns this replica stopped while cut off from the store, when they were
    /// put aside: to take those turns back should no other replica take them.
    stashed: Mutex<HashMap<String, (std::time::Instant, Secrets)>>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The toolbox of each invocation with a turn running here, or paused for input with
    /// background processes running: made at its first turn, ended with the invocation (see
    /// [`Inner::end_jobs`]).
    background: Mutex<HashMap<String, Toolbox>>,
}

impl Inner {
    /// The toolbox of invocation `id`'s turns, with its background processes: the one an
    /// earlier turn left processes running in (it asked for input meanwhile), else `make`'s,
    /// held from now on until the invocation ends (see [`Inner::end_jobs`]).
    pub(super) async fn toolbox_for<F, E>(&self, id: &str, make: F) -> Result<Option<Toolbox>, E>
    where
        F: std::future::Future<Output = Result<Option<Toolbox>, E>>,
    {
        if let Some(held) = self.held_toolbox(id) {
            return Ok(Some(held));
        }
        let Some(toolbox) = make.await? else {
            return Ok(None);
        };
        let toolbox = toolbox.with_background(Jobs::new(self.config.max_background));
        self.background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), toolbox.clone());
        Ok(Some(toolbox))
    }

    /// The toolbox invocation `id`'s turn runs with (or its pause keeps), if any.
    pub(super) fn held_toolbox(&self, id: &str) -> Option<Toolbox> {
        self.background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// Whether invocation `id` has background processes running.
    pub(super) fn has_jobs(&self, id: &str) -> bool {
        self.held_toolbox(id)
            .and_then(|tb| tb.background().map(Jobs::running))
            .is_some_and(|n| n > 0)
    }

    /// Kills the background processes of invocation `id` (it ended, was cancelled, or paused
    /// with none running) and waits until they are gone; its toolbox is no longer held.
    pub(super) async fn end_jobs(&self, id: &str) {
        let held = self
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        if let Some(jobs) = held.as_ref().and_then(Toolbox::background) {
            jobs.close().await;
        }
    }

    /// Kills every invocation's background processes (podhost stops).
    pub(super) async fn end_all_jobs(&self) {
        let all: Vec<Toolbox> = self
            .background
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, toolbox)| toolbox)
            .collect();
        for jobs in all.iter().filter_map(Toolbox::background) {
            jobs.close().await;
        }
    }
}

/// Holds one invocation's lock until dropped.
pub(super) struct IdGuard<'a> {
    engine: &'a Inner,
    id: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for IdGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut map = self
            .engine
            .locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if map.get(&self.id).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(&self.id);
        }
    }
}

impl Inner {
    pub(super) async fn lock(&self, id: &str) -> IdGuard<'_> {
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(id.to_owned())
            .or_default()
            .clone();
        let guard = lock.lock_owned().await;
        IdGuard {
            engine: self,
            id: id.to_owned(),
            guard: Some(guard),
        }
    }

    pub(super) fn live(&self, id: &str) -> Option<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// Registers a turn this replica claimed under `fence`; call with the invocation's lock
    /// held.
    pub(super) fn register(&self, id: &str, secrets: Secrets, fence: Fence) -> Arc<Live> {
        let live = Arc::new(Live {
            cancel: self.root.child_token(),
            fence,
            lost: AtomicBool::new(false),
            status: Mutex::new(None),
            end: Mutex::new(None),
            secrets: Mutex::new(secrets),
            done: watch::Sender::new(false),
        });
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), live.clone());
        live
    }

    /// Drops the entry of `live`'s task (not a newer claim's that replaced it).
    pub(super) fn unregister(&self, id: &str, live: &Arc<Live>) {
        let mut map = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if map.get(id).is_some_and(|l| Arc::ptr_eq(l, live)) {
            map.remove(id);
        }
        drop(map);
        live.done.send_replace(true);
    }

    /// The turns this replica runs, with their fences.
    pub(super) fn held(&self) -> Vec<(String, Arc<Live>)> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(id, l)| (id.clone(), l.clone()))
            .collect()
    }

    /// Puts aside the secrets of turn `id`, which this replica stopped though the store may
    /// still name it the owner.
    pub(super) fn stash(&self, id: &str, secrets: Secrets) {
        self.stashed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), (std::time::Instant::now(), secrets));
    }

    /// The secrets put aside for turn `id`, taken.
    pub(super) fn unstash(&self, id: &str) -> Option<Secrets> {
        self.stashed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id)
            .map(|(_, s)| s)
    }

    /// Forgets secrets put aside longer ago than `older`: by then another replica took the
    /// turn, or it failed for want of a key.
    pub(super) fn prune_stashed(&self, older: Duration) {
        self.stashed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, (at, _)| at.elapsed() < older);
    }

    pub(super) fn running(&self) -> usize {
        self.config.max_running - self.permits.available_permits()
    }
}

/// A name for this replica in the store, unique per process: the host's name (a Kubernetes
/// pod's name), the pid and a random tail.
pub fn replica_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "podhost".to_owned());
    let tail = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}-{}", std::process::id(), &tail[..8])
}

impl Engine {
    /// This replica's name in the store.
    pub fn replica(&self) -> &str {
        &self.inner.terms.owner
    }

    pub fn new(store: Store, client: ModelClient, config: EngineConfig) -> Self {
        let permits = Arc::new(Semaphore::new(config.max_running));
        // An SQLite store is this process's alone (its data directory is locked): no other
        // replica can take a turn over, so its claims do not run out while it lives (a busy
        // writer queue must not cost a turn its lease); the next start ends them.
        let ttl = if store.is_shared() {
            config.lease
        } else {
            Duration::from_secs(100 * 365 * 86_400)
        };
        let terms = LeaseTerms {
            owner: replica_name().into(),
            ttl_ms: ttl.as_millis() as i64,
        };
        Engine {
            inner: Arc::new(Inner {
                store,
                client,
                terms,
                config,
                live: Mutex::new(HashMap::new()),
                permits,
                tracker: TaskTracker::new(),
                root: CancellationToken::new(),
                sandboxes: Default::default(),
                stashed: Mutex::new(HashMap::new()),
                locks: Mutex::new(HashMap::new()),
                background: Mutex::new(HashMap::new()),
            }),
        }
    }
}
