//! The BYOH endpoint's shared state: the [`Engine`] the routes call and the turn tasks share.
//!
//! Owns: the store, the model client and the settings; the in-memory table of live turns (their
//! cancellation token and the latest API key); the permits that bound the turns running; and
//! the per-invocation lock that makes a submission's check-and-insert atomic against its
//! concurrent duplicates.
//!
//! Non-goals: what a route means (`invocation`), running a turn (`runner`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::store::Store;
use crate::chat::client::ModelClient;
use crate::chat::message::ApiKey;
use crate::tools::ToolboxBuilder;

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
    /// Model calls one submission may make.
    pub max_steps: u32,
    /// The model's limits as configured (a window or inputs left unset are asked of the
    /// server's model listing at each turn).
    pub limits: crate::chat::session::ChatLimits,
    /// Each session's toolbox: commands and file tools reach nothing of the data directory (the
    /// database, every session's workspace) or the credential file; each session adds its own
    /// workspace and private tmp.
    pub tools: ToolboxBuilder,
}

/// A turn being run by a task of this process.
#[derive(Debug)]
pub struct Live {
    pub cancel: CancellationToken,
    /// The latest key a submission brought.
    key: Mutex<Option<ApiKey>>,
    /// Set to `true` when the task has stopped.
    pub done: watch::Sender<bool>,
}

impl Live {
    pub fn key(&self) -> Option<ApiKey> {
        self.key
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_key(&self, key: Option<ApiKey>) {
        if key.is_some() {
            *self.key.lock().unwrap_or_else(PoisonError::into_inner) = key;
        }
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
    pub config: EngineConfig,
    pub live: Mutex<HashMap<String, Arc<Live>>>,
    pub permits: Arc<Semaphore>,
    pub tracker: TaskTracker,
    pub root: CancellationToken,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
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

    /// Registers a live turn; call with the invocation's lock held.
    pub(super) fn register(&self, id: &str, key: Option<ApiKey>) -> Arc<Live> {
        let live = Arc::new(Live {
            cancel: self.root.child_token(),
            key: Mutex::new(key),
            done: watch::Sender::new(false),
        });
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), live.clone());
        live
    }

    pub(super) fn unregister(&self, id: &str) {
        let removed = self
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        if let Some(live) = removed {
            live.done.send_replace(true);
        }
    }

    pub(super) fn running(&self) -> usize {
        self.config.max_running - self.permits.available_permits()
    }
}

impl Engine {
    pub fn new(store: Store, client: ModelClient, config: EngineConfig) -> Self {
        let permits = Arc::new(Semaphore::new(config.max_running));
        Engine {
            inner: Arc::new(Inner {
                store,
                client,
                config,
                live: Mutex::new(HashMap::new()),
                permits,
                tracker: TaskTracker::new(),
                root: CancellationToken::new(),
                locks: Mutex::new(HashMap::new()),
            }),
        }
    }
}
