//! The BYOH endpoint's shared state: the [`Engine`] the routes call and the turn tasks share.
//!
//! Owns: the store, the model client and the settings; the in-memory table of live turns (their
//! cancellation token and the latest [`Secrets`]: key, credential-bearing URL, the values to
//! scrub); the permits that bound the turns running; and
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

use super::protocol::{Credentials, ModelConnection};
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
    /// Each session's toolbox: commands and file tools reach nothing of the data directory (the
    /// database, every session's workspace) or the credential file; each session adds its own
    /// workspace and private tmp.
    pub tools: ToolboxBuilder,
}

/// What a submission brought that is never stored: its key, its base URL when that carries a
/// credential, and every credential value (to scrub from what is stored).
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    pub key: Option<ApiKey>,
    /// The base URL as given, when it carries a credential (the store holds it redacted).
    pub base_url: Option<crate::floor::secret::Secret>,
    pub credentials: Credentials,
}

impl Secrets {
    pub fn of(conn: &ModelConnection) -> Self {
        Secrets {
            key: conn.api_key.clone(),
            base_url: conn
                .url_has_credentials()
                .then(|| crate::floor::secret::Secret::new(conn.base_url.clone())),
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

    /// The base URL to call when the submission's carries a credential.
    pub fn base_url(&self) -> Option<String> {
        self.secrets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .base_url
            .as_ref()
            .map(|s| s.expose().to_owned())
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
    pub(super) fn register(&self, id: &str, secrets: Secrets) -> Arc<Live> {
        let live = Arc::new(Live {
            cancel: self.root.child_token(),
            secrets: Mutex::new(secrets),
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
