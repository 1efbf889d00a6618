//! Running BYOH turns in the background, taking up turns a restart interrupted, and sweeping
//! old sessions.
//!
//! Owns: the task body of a turn (`drive`): its workspace and toolbox (built per turn, never
//! held idle), the store-backed [`Front`], and the one status write that ends the turn; start-up
//! recovery; the retention sweeper.
//!
//! Invariants:
//! * A turn writes its end status only from `running`, so a cancellation that landed first
//!   stands, and a turn stopped by shutdown stays `running` in the store for the next start.
//! * A turn's end is written until it lands (a full disk empties), answered from memory
//!   meanwhile: a finished turn is never stranded `running`.
//! * A turn interrupted by a restart is resumed when it can call the model (no key needed, or a
//!   retried submission brought one); otherwise it fails with a message that says why.
//! * Each session's workspace is its own directory under the data directory, named from a hash
//!   of the session id (ids never become paths).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::engine::{Engine, Inner, Live};
use super::protocol::Status;
use super::store::{Store, now_ms};
use crate::agent::turn::{self, TurnEnd};
use crate::chat::message::{ApiKey, ChatMessage};
use crate::chat::session::{ChatTurn, Front, SessionError, Tail, repair_tail, step_limit_message};
use crate::floor::backoff::{Backoff, sleep_or_cancel};
use crate::floor::workspace::Workspace;
use crate::tools::Toolbox;

/// The workspace directory of a session.
pub fn workspace_dir(data_dir: &std::path::Path, session_id: &str) -> PathBuf {
    data_dir.join("sessions").join(session_dir_name(session_id))
}

/// The private tmp directory of a session's commands (`TMPDIR`), outside its workspace.
pub fn session_tmp_dir(data_dir: &std::path::Path, session_id: &str) -> PathBuf {
    data_dir.join("tmp").join(session_dir_name(session_id))
}

fn session_dir_name(session_id: &str) -> String {
    let digest = Sha256::digest(session_id.as_bytes());
    format!("s-{}", &hex::encode(digest)[..32])
}

/// The store as a turn's front: every message is committed as it is made.
struct StoreFront {
    store: Store,
    id: String,
    live: Arc<Live>,
}

impl Front for StoreFront {
    async fn appended(&mut self, messages: &[ChatMessage]) -> Result<(), SessionError> {
        // The model may echo a credential: nothing stored (and so nothing returned) holds one.
        let credentials = self.live.credentials();
        let mut stored = messages.to_vec();
        for m in &mut stored {
            credentials.scrub_message(m);
        }
        self.store
            .append(&self.id, stored)
            .await
            .map_err(|e| SessionError::Store(e.to_string()))
    }

    fn api_key(&self) -> Option<ApiKey> {
        self.live.key()
    }
}

const RUNNING: &[Status] = &[Status::Running];

/// Runs the turn of invocation `id` to its end and records how it ended.
pub(super) async fn drive(inner: &Inner, id: &str, live: &Arc<Live>) {
    let store = &inner.store;
    let started = std::time::Instant::now();
    let (changed, row) = match store
        .transition(
            id,
            &[Status::Queued, Status::Running],
            Status::Running,
            None,
            vec![],
        )
        .await
    {
        Ok(r) => r,
        Err(e) => {
            warn!(invocation_id = id, error = %e, "could not start the turn");
            return;
        }
    };
    let Some(row) = row.filter(|_| changed) else {
        return;
    };
    info!(invocation_id = id, status = %Status::Running, "turn started");
    let mut conn = row.connection.clone();
    if let Some(url) = live.base_url() {
        conn.base_url = url;
    }
    let end = run_turn(inner, id, live, &row.session_id, conn).await;
    let (to, error, pending) = match end {
        Ok(Some(TurnEnd::Completed { .. })) => (Status::Completed, None, vec![]),
        Ok(Some(TurnEnd::InputRequired { calls })) => (
            Status::InputRequired,
            None,
            calls.into_iter().map(|c| c.id).collect(),
        ),
        // Cancelled by `cancel` (which wrote the status) or by shutdown (the status stays
        // `running`, for the next start to take up).
        _ if live.cancel.is_cancelled() => return,
        Ok(Some(TurnEnd::Failed { message, .. })) => (Status::Failed, Some(message), vec![]),
        Ok(Some(TurnEnd::Yielded)) => (
            Status::Failed,
            Some(step_limit_message(inner.config.max_steps)),
            vec![],
        ),
        Ok(Some(other)) => (
            Status::Failed,
            Some(format!("the turn ended unexpectedly ({other:?})")),
            vec![],
        ),
        Ok(None) => return,
        Err(e) => (Status::Failed, Some(e.to_string()), vec![]),
    };
    let error = error.map(|e| live.credentials().scrub(&e));
    crate::failpoint!("serve.before_end");
    // The end must land: until it does (a full disk), it is answered from memory and the write
    // is tried again. A shutdown meanwhile leaves `running` for the next start to take up.
    let mut backoff = Backoff::new(END_RETRY_FIRST, END_RETRY_CAP);
    let mut held = false;
    loop {
        match store
            .transition(id, RUNNING, to, error.clone(), pending.clone())
            .await
        {
            Ok((true, _)) => {
                info!(
                    invocation_id = id,
                    status = %to,
                    duration_ms = started.elapsed().as_millis() as u64,
                    "turn ended"
                );
                return;
            }
            Ok((false, row)) => {
                info!(
                    invocation_id = id,
                    status = %row.map(|r| r.status.as_str()).unwrap_or("gone"),
                    "turn ended after its status changed"
                );
                return;
            }
            Err(e) => {
                if !held {
                    held = true;
                    let mut end = row.clone();
                    end.status = to;
                    end.error = error.clone();
                    end.pending = pending.clone();
                    end.finished_ms = to.is_terminal().then(now_ms);
                    store.hold_end(end);
                }
                let delay = backoff.next_delay();
                warn!(invocation_id = id, status = %to, error = %e, retry_in = ?delay, "could not record the turn's end; answering it from memory and trying again");
                if !sleep_or_cancel(delay, &inner.root).await {
                    return;
                }
            }
        }
    }
}

/// The first wait before a failed end write is tried again, and the longest.
const END_RETRY_FIRST: Duration = Duration::from_millis(100);
const END_RETRY_CAP: Duration = Duration::from_secs(5);

/// Runs the loop over the stored transcript; `None` when the tail already said how it ended
/// (and the status was written).
async fn run_turn(
    inner: &Inner,
    id: &str,
    live: &Arc<Live>,
    session_id: &str,
    conn: crate::chat::message::ModelEndpoint,
) -> Result<Option<TurnEnd>, SessionError> {
    let store_err = |e: super::store::StoreError| SessionError::Store(e.to_string());
    let store = &inner.store;
    let mut transcript = store.messages(id, 0).await.map_err(store_err)?;
    let (fill, tail) = repair_tail(&transcript);
    if !fill.is_empty() {
        store.append(id, fill.clone()).await.map_err(store_err)?;
        transcript.extend(fill);
    }
    match tail {
        Tail::Completed => {
            return Ok(Some(TurnEnd::Completed {
                candidate: Default::default(),
            }));
        }
        Tail::InputRequired(ids) => {
            store
                .transition(id, RUNNING, Status::InputRequired, None, ids)
                .await
                .map_err(store_err)?;
            return Ok(None);
        }
        Tail::Continue => {}
    }
    let toolbox = toolbox(inner, session_id).map_err(SessionError::Store)?;
    let front = StoreFront {
        store: store.clone(),
        id: id.to_owned(),
        live: live.clone(),
    };
    let mut host = ChatTurn::new(front, inner.client.clone(), conn, toolbox, transcript)
        .with_max_steps(inner.config.max_steps);
    turn::drive(&mut host, 0, &live.cancel).await.map(Some)
}

/// A toolbox on the session's workspace, created on first use.
fn toolbox(inner: &Inner, session_id: &str) -> Result<Toolbox, String> {
    let dir = workspace_dir(&inner.config.data_dir, session_id);
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("could not create the workspace {}: {e}", dir.display()))?;
    let ws = Workspace::new(&dir, None)
        .map_err(|e| format!("the workspace {} is unusable: {e}", dir.display()))?;
    // Its own tmp (TMPDIR), next to the workspace and as hidden from other sessions as it is.
    let tmp = session_tmp_dir(&inner.config.data_dir, session_id);
    std::fs::create_dir_all(&tmp)
        .map_err(|e| format!("could not create the session's tmp {}: {e}", tmp.display()))?;
    Ok(inner.config.tools.build(ws, Some(&tmp)))
}

/// The message of a turn that a restart interrupted and no retried submission took up.
pub fn orphan_message(grace: Duration) -> String {
    format!(
        "podhost restarted while this turn was running. The model API key is never stored, so \
         the turn could not go on, and no retried submission brought a fresh key within {} s.",
        grace.as_secs()
    )
}

impl Engine {
    /// Takes up the turns a previous process left queued or running, and starts the sweeper.
    pub async fn recover(&self) -> Result<(), super::store::StoreError> {
        let inner = &self.inner;
        for row in inner.store.unfinished().await? {
            let id = row.invocation_id.clone();
            let _lock = inner.lock(&id).await;
            if !row.needs_key {
                info!(invocation_id = %id, "resuming a turn interrupted by a restart");
                let live = inner.register(&id, Default::default());
                // It waits for a slot like any other turn.
                self.spawn(id, live, None);
                continue;
            }
            let engine = self.inner.clone();
            inner.tracker.spawn(async move {
                let grace = engine.config.orphan_grace;
                tokio::select! {
                    _ = engine.root.cancelled() => return,
                    _ = tokio::time::sleep(grace) => {}
                }
                let _lock = engine.lock(&id).await;
                if engine.live(&id).is_some() {
                    return;
                }
                const OPEN: &[Status] = &[Status::Queued, Status::Running];
                match engine
                    .store
                    .transition(
                        &id,
                        OPEN,
                        Status::Failed,
                        Some(orphan_message(grace)),
                        vec![],
                    )
                    .await
                {
                    Ok((true, _)) => {
                        warn!(invocation_id = %id, status = %Status::Failed, "interrupted turn had no key")
                    }
                    Ok(_) => {}
                    Err(e) => warn!(invocation_id = %id, error = %e, "could not fail the turn"),
                }
            });
        }
        let engine = self.inner.clone();
        inner
            .tracker
            .spawn(async move { sweep_loop(&engine).await });
        Ok(())
    }
}

/// Removes terminal sessions older than the retention period, every so often.
async fn sweep_loop(inner: &Inner) {
    let retention = inner.config.retention;
    let every = (retention / 4).clamp(Duration::from_millis(100), Duration::from_secs(60));
    loop {
        tokio::select! {
            _ = inner.root.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let cutoff = now_ms() - retention.as_millis() as i64;
        match inner.store.sweep(cutoff).await {
            Ok(sessions) => {
                for session in sessions {
                    let dirs = [
                        workspace_dir(&inner.config.data_dir, &session),
                        session_tmp_dir(&inner.config.data_dir, &session),
                    ];
                    let removed = tokio::task::spawn_blocking(move || {
                        dirs.iter()
                            .try_for_each(|dir| match std::fs::remove_dir_all(dir) {
                                Ok(()) => Ok(()),
                                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                                Err(e) => Err(format!("{}: {e}", dir.display())),
                            })
                    })
                    .await;
                    if let Ok(Err(e)) = removed {
                        warn!(error = %e, "could not remove a swept workspace");
                    }
                }
            }
            Err(e) => warn!(error = %e, "the retention sweep failed"),
        }
    }
}
