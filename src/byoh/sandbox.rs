//! Each BYOH session's sandbox, and whether this host can make sandboxes at all.
//!
//! Owns: where a session's files live (its workspace, private tmp and disk image, named from a
//! hash of the session id: ids never become paths); making a turn's toolbox — its workspace (a
//! copy of the workspace template, when one is set, made whole before the workspace exists) and
//! private tmp, its uid from the store's pool
//! (an idle session's directories parked first when the pool lends that session's uid), the
//! sandbox exec assembles — tried again a few times when the host refuses; the host's sandbox
//! health: a fault recorded when a turn's sandbox or a command's session could not be made,
//! which makes `submit` refuse new work with 503 until a probe (a whole session's sandbox, made
//! and run like any other, then removed) succeeds; and the one-time adoption, into the store's
//! pool, of the uids that workspaces a store kept from before already belong to.
//!
//! Invariants:
//! * A fault of the host is never a tool result: a turn whose sandbox cannot be made fails with
//!   a message that says why (after its tries), and a command whose sandbox failed ends the turn
//!   the same way (`chat::session`); either marks the host faulted.
//! * The fault clears only when a probe made a sandbox and ran a command in it: the same steps a
//!   turn takes, so `submit` says 503 exactly while a turn would fail.
//! * A uid is handed out by the store alone, whatever the engine, so no two sessions hold one
//!   at once on any replica, and handing one out never scans the workspaces.
//!
//! Non-goals: the sandbox's parts (`exec::sandbox`), retention (`runner`'s sweeper gives a
//! swept session's uid back).

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::engine::Inner;
use super::store::{Park, StoreError, UidGrant};
use crate::chat::session::SessionError;
use crate::exec::confine::users;
use crate::exec::sandbox::OverlaySpec;
use crate::exec::template::{Level, Template};
use crate::floor::backoff::{Backoff, sleep_or_cancel};
use crate::floor::workspace::Workspace;
use crate::tools::{CallContext, ToolName, ToolOutcome, Toolbox};

/// How often a turn's sandbox is tried in all before the turn fails, and the first wait between
/// tries (doubling, jittered).
const TRIES: u32 = 4;
const RETRY_FIRST: Duration = Duration::from_millis(250);
/// How long a faulted host waits between probes.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// How long a probe's command may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// The workspace directory of a session.
pub fn workspace_dir(data_dir: &Path, session_id: &str) -> PathBuf {
    data_dir.join("sessions").join(session_dir_name(session_id))
}

/// The private tmp directory of a session's commands (`TMPDIR`), outside its workspace.
pub fn session_tmp_dir(data_dir: &Path, session_id: &str) -> PathBuf {
    data_dir.join("tmp").join(session_dir_name(session_id))
}

/// The kernel's work directory of a session's workspace overlay (see `exec::overlay`): beside
/// its tmp, on the workspace's file system, hidden from sessions as the data directory is.
pub fn overlay_work_dir(data_dir: &Path, session_id: &str) -> PathBuf {
    data_dir
        .join("tmp")
        .join(format!("{}.overlay", session_dir_name(session_id)))
}

/// Where sessions' disk images live (see `exec::disk`), beside their workspaces.
pub fn disks_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("disks")
}

/// A session's disk image, when the host gives it one.
pub fn session_disk_image(data_dir: &Path, session_id: &str) -> PathBuf {
    crate::exec::disk::image_path(&disks_dir(data_dir), &session_dir_name(session_id))
}

fn session_dir_name(session_id: &str) -> String {
    let digest = Sha256::digest(session_id.as_bytes());
    format!("s-{}", &hex::encode(digest)[..32])
}

/// Why a session's sandbox could not be made, its probe failed, or its files could not be
/// removed: faults of the host, never the model's.
#[derive(Debug, thiserror::Error)]
pub enum SandboxFault {
    /// A directory of the session could not be made.
    #[error("could not create the {what} {}: {source}", path.display())]
    Create {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The template could not be copied into the session's new workspace.
    #[error("could not copy the workspace template {} into {}: {source}", template.display(), path.display())]
    Template {
        template: PathBuf,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The session's workspace cannot be opened.
    #[error("the workspace {} is unusable: {source}", path.display())]
    Workspace {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The store could not hand the session a uid.
    #[error("could not take the session's uid: {0}")]
    Uid(StoreError),
    /// Every uid of the pool serves a session with a turn running.
    #[error(
        "every uid of PODHOST_UID_POOL ({0}) serves a session with a turn running; widen the \
         pool or lower --max-running"
    )]
    PoolSpent(users::UidRange),
    /// The session's confinement could not be assembled.
    #[error(transparent)]
    Build(#[from] crate::exec::sandbox::SandboxError),
    /// A probe's command could not run.
    #[error(transparent)]
    Tool(#[from] crate::tools::ToolError),
    /// A probe's `true` ran and did not succeed.
    #[error("a probe's `true` did not succeed: {0:?}")]
    Probe(ToolOutcome),
    /// A file of the session could not be removed.
    #[error("{}: {source}", path.display())]
    Remove {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The thread that removes a session's files ended without an answer.
    #[error("{0}")]
    Worker(tokio::task::JoinError),
}

/// The session's toolbox for a turn: its sandbox made, tried [`TRIES`] times in all while the
/// host refuses; the last refusal marks the host faulted and fails the turn. `None` when
/// `cancel` fired first.
pub(super) async fn for_turn(
    inner: &Inner,
    session_id: &str,
    cancel: &CancellationToken,
) -> Result<Option<Toolbox>, SessionError> {
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_FIRST * 8);
    let mut tries = 0;
    loop {
        tries += 1;
        match make(inner, session_id).await {
            Ok(toolbox) => return Ok(Some(toolbox)),
            Err(why) if tries < TRIES => {
                let delay = backoff.next_delay();
                warn!(error = %why, retry_in = ?delay, "could not make a session's sandbox; trying again");
                if !sleep_or_cancel(delay, cancel).await {
                    return Ok(None);
                }
            }
            Err(why) => {
                let why = why.to_string();
                inner.sandboxes.failed(&why);
                return Err(SessionError::Sandbox(why));
            }
        }
    }
}

/// The session's toolbox, on its workspace (created on first use), made once. Where sessions
/// run as uids of their own, the store hands the session its uid; it stays the session's until
/// the session is swept, or lent, once the pool has no other, while the session is idle.
async fn make(inner: &Inner, session_id: &str) -> Result<Toolbox, SandboxFault> {
    let data = &inner.config.data_dir;
    let dir = workspace_dir(data, session_id);
    let create = |what, path: &Path| {
        std::fs::create_dir_all(path).map_err(|source| SandboxFault::Create {
            what,
            path: path.to_owned(),
            source,
        })
    };
    let template = inner.config.template.as_ref();
    let overlay = template.filter(|t| t.level == Level::Overlay);
    if let Some(template) = template.filter(|_| overlay.is_none())
        && !dir.exists()
    {
        let (template, data, dir) = (template.clone(), data.clone(), dir.clone());
        tokio::task::spawn_blocking(move || start_from(&template, &data, &dir))
            .await
            .map_err(SandboxFault::Worker)??;
    }
    create("workspace", &dir)?;
    let ws = Workspace::new(&dir, None).map_err(|source| SandboxFault::Workspace {
        path: dir.clone(),
        source,
    })?;
    // Its own tmp (TMPDIR), next to the workspace and as hidden from other sessions as it is.
    let tmp = session_tmp_dir(data, session_id);
    create("session's tmp", &tmp)?;
    let work = overlay_work_dir(data, session_id);
    if overlay.is_some() {
        create("workspace overlay's work directory", &work)?;
    }
    let uid = match inner.config.tools.uid_pool() {
        Some(range) => {
            let data = data.clone();
            let park: Park = Arc::new(move |lender: &str| {
                let (ws, tmp) = (workspace_dir(&data, lender), session_tmp_dir(&data, lender));
                users::park(&[&ws, &tmp]).map_err(|e| e.to_string())
            });
            let grant = inner
                .store
                .take_uid(session_id, &inner.terms.owner, range, park)
                .await
                .map_err(SandboxFault::Uid)?
                .ok_or(SandboxFault::PoolSpent(range))?;
            if let UidGrant::Reclaimed { uid, .. } = &grant {
                info!(
                    uid,
                    "the uid pool is spent: lent the uid of the idle session used least recently"
                );
            }
            Some(grant.uid())
        }
        None => None,
    };
    let overlay = overlay.map(|t| OverlaySpec {
        template: &t.dir,
        work: &work,
    });
    Ok(inner
        .config
        .tools
        .build_over(ws, Some(&tmp), uid, overlay)?)
}

/// Makes the new workspace `dir` a copy of `template`: copied beside it (under the data
/// directory's `tmp/`, on the same file system) and renamed into place, so that a workspace
/// exists only whole. A copy an earlier start left half made is removed first.
fn start_from(template: &Template, data: &Path, dir: &Path) -> Result<(), SandboxFault> {
    let fault = |path: &Path| {
        let path = path.to_owned();
        move |source| SandboxFault::Template {
            template: template.dir.clone(),
            path,
            source,
        }
    };
    let name = dir.file_name().unwrap_or_default().to_string_lossy();
    let staging = data.join("tmp").join(format!("{name}.template"));
    match std::fs::remove_dir_all(&staging) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(fault(&staging)(e)),
        _ => {}
    }
    for parent in [staging.parent(), dir.parent()].into_iter().flatten() {
        std::fs::create_dir_all(parent).map_err(fault(parent))?;
    }
    crate::exec::template::copy_tree(template, &staging).map_err(fault(&staging))?;
    std::fs::rename(&staging, dir).map_err(fault(dir))
}

/// Sets the store's uid pool up, once per range: the sessions the store keeps whose workspaces
/// already belong to a uid of the pool keep it (a data directory from before the pool was the
/// store's). A range the store knows costs one query; adopting costs a `stat` per kept session,
/// at start only.
pub(super) async fn adopt_uids(inner: &Inner) -> Result<(), StoreError> {
    let Some(range) = inner.config.tools.uid_pool() else {
        return Ok(());
    };
    if inner.store.uid_range_known(range.first).await? {
        return Ok(());
    }
    let sessions = inner.store.kept_sessions().await?;
    let data = inner.config.data_dir.clone();
    let held = tokio::task::spawn_blocking(move || {
        use std::os::unix::fs::MetadataExt;
        sessions
            .into_iter()
            .filter_map(|s| {
                let uid = std::fs::symlink_metadata(workspace_dir(&data, &s))
                    .ok()?
                    .uid();
                range.contains(uid).then_some((s, uid))
            })
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| StoreError::Corrupt(e.to_string()))?;
    if !held.is_empty() {
        info!(
            sessions = held.len(),
            pool = %range,
            "the uid pool keeps the uids the kept sessions' workspaces belong to"
        );
    }
    inner
        .store
        .adopt_uids(range, &inner.terms.owner, held)
        .await
}

/// While the host is faulted: probes it every [`PROBE_EVERY`], until one probe succeeds (or
/// podhost stops).
pub(super) async fn probe_loop(inner: &Inner) {
    loop {
        if inner.sandboxes.fault().is_none() {
            tokio::select! {
                _ = inner.root.cancelled() => return,
                _ = inner.sandboxes.wake.notified() => {}
            }
        }
        if !sleep_or_cancel(PROBE_EVERY, &inner.root).await {
            return;
        }
        match probe(inner).await {
            Ok(()) => inner.sandboxes.cleared(),
            Err(why) => {
                warn!(error = %why, "this host still cannot make sandboxes");
                *inner
                    .sandboxes
                    .fault
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(why.to_string());
            }
        }
    }
}

/// Makes a session's sandbox as a turn would, for a session no evaluator can name (its id has a
/// control character), runs `true` in it, and removes it: its workspace, tmp, disk and uid.
async fn probe(inner: &Inner) -> Result<(), SandboxFault> {
    let id = format!("\u{1}podhost-probe {}", inner.terms.owner);
    let ran = async {
        let toolbox = make(inner, &id).await?;
        let ctx = CallContext::new(inner.root.child_token());
        let input = json!({"command": "true", "timeout": PROBE_TIMEOUT.as_secs()});
        match toolbox.call(ToolName::Bash, &input, &ctx).await {
            Ok(ToolOutcome::Completed { output }) if output["exitCode"] == 0 => Ok(()),
            Ok(other) => Err(SandboxFault::Probe(other)),
            Err(e) => Err(e.into()),
        }
    }
    .await;
    let data = inner.config.data_dir.clone();
    let gone = tokio::task::spawn_blocking({
        let id = id.clone();
        move || remove_session_files(&data, &id)
    })
    .await
    .map_err(SandboxFault::Worker)
    .and_then(|r| r);
    if let Err(e) = gone {
        warn!(error = %e, "could not remove a sandbox probe's files");
    }
    if inner.config.tools.uid_pool().is_some()
        && let Err(e) = inner.store.release_uid(&id).await
    {
        warn!(error = %e, "could not give a sandbox probe's uid back");
    }
    ran
}

/// Removes a session's workspace, tmp, overlay work directory and disk image; those already
/// gone are fine.
pub(super) fn remove_session_files(data: &Path, session: &str) -> Result<(), SandboxFault> {
    let gone = |r: std::io::Result<()>, p: &Path| match r {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SandboxFault::Remove {
            path: p.to_owned(),
            source,
        }),
    };
    for dir in [workspace_dir(data, session), session_tmp_dir(data, session)] {
        gone(std::fs::remove_dir_all(&dir), &dir)?;
    }
    let work = overlay_work_dir(data, session);
    gone(crate::exec::overlay::remove_work_dir(&work), &work)?;
    let image = session_disk_image(data, session);
    gone(std::fs::remove_file(&image), &image)
}
