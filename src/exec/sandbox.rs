//! A workspace's sandbox: everything exec assembles so that one workspace's commands and file
//! tools run confined, made by one constructor ([`Sandbox::for_workspace`]).
//!
//! Owns: choosing the session's command user (a uid from the pool on a root BYOH host, the
//! workspace then given to it; a root pod's one command user), making its cgroup, describing its
//! holder (the namespaces and view of `session`), its disk quota, and the workspace's
//! confinement rules — in that order, each step's failure a [`SandboxError`].
//!
//! Invariants:
//! * A sandbox is whole or it is not made: a step that fails (no uid left in the pool, a cgroup
//!   the host refuses) is an error for the front, never a sandbox with less isolation.
//! * The rules and the executor come from the same policy (the front's, with the session's
//!   user and temporary directory set), so commands and file tools agree on what they reach.
//!
//! Non-goals: what a front hides (`Confinement`), the tools bound to the sandbox (`tools`).

use std::path::Path;
use std::sync::Arc;

use super::confine::{Confinement, Isolation, WorkspaceRules, users};
use super::protocol::{CommandUser, SessionRequest};
use super::quota::DiskQuota;
use super::session::SessionSlot;
use super::{ExecConfig, Executor};
use crate::floor::workspace::Workspace;

/// What a front asks of one workspace's sandbox.
#[derive(Clone, Copy, Debug)]
pub struct SandboxSpec<'a> {
    pub workspace: &'a Workspace,
    /// The commands' private temporary directory (`TMPDIR`; `/tmp` then read-only), which must
    /// exist.
    pub private_tmp: Option<&'a Path>,
    /// The session's uid from the pool, when a store replicas share allocated it (so that no uid
    /// serves two live sessions on any replica); `None` lets this process choose.
    pub uid: Option<u32>,
}

/// Why a workspace's sandbox could not be made: a fault of the host, never of a tool.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("could not give the session a uid: {0}")]
    Uid(String),
    #[error("could not give the workspace to uid {uid}: {message}")]
    Owner { uid: u32, message: String },
    #[error("could not make the session's cgroup: {0}")]
    Cgroup(String),
}

/// One workspace's executor and the rules its file tools follow.
#[derive(Debug)]
pub struct Sandbox {
    pub executor: Executor,
    pub rules: WorkspaceRules,
}

impl Sandbox {
    /// The sandbox of `spec.workspace` under `policy` (a front's confinement), its commands
    /// started as `config` says.
    pub fn for_workspace(
        mut config: ExecConfig,
        policy: &Confinement,
        spec: SandboxSpec<'_>,
    ) -> Result<Sandbox, SandboxError> {
        let mut confinement = match spec.private_tmp {
            Some(tmp) => policy.clone().private_tmp(tmp),
            None => policy.clone(),
        };
        let Some(iso) = confinement.isolation().cloned() else {
            let executor = Executor::new(config).with_confinement(confinement.clone());
            let rules = confinement.for_workspace(spec.workspace);
            return Ok(Sandbox { executor, rules });
        };
        if let Some(user) = session_user(&iso, &confinement, spec)? {
            confinement = confinement.command_user(user);
        }
        let group = match &iso.cgroups {
            Ok(cgroups) => Some(
                cgroups
                    .group()
                    .map_err(|e| SandboxError::Cgroup(e.to_string()))?,
            ),
            Err(_) => None,
        };
        let quota = iso.disk_quota.map(|bytes| {
            let mut dirs = vec![spec.workspace.root().to_path_buf()];
            dirs.extend(spec.private_tmp.map(Path::to_path_buf));
            // The kernel stops any one file at the quota, which no measurement can.
            let limits = &mut config.limits;
            limits.file_size = Some(limits.file_size.map_or(bytes, |f| f.min(bytes)));
            Arc::new(DiskQuota::new(bytes, dirs))
        });
        let mut rules = confinement.for_workspace(spec.workspace);
        let procs = group
            .as_ref()
            .map(super::cgroup::Group::procs_files)
            .unwrap_or_default();
        let session = match rules.view.clone() {
            Some(view) => Some(SessionSlot::new(
                iso.helper.clone(),
                SessionRequest {
                    parent: std::process::id(),
                    userns: iso.namespaces.user_namespace().then(|| CommandUser {
                        uid: nix::unistd::geteuid().as_raw(),
                        gid: nix::unistd::getegid().as_raw(),
                    }),
                    pid_namespace: iso.namespaces.pid_namespace(),
                    cgroup_procs: procs,
                    view,
                },
            )),
            // Without a holder, each command's supervisor joins the groups itself.
            None => {
                rules.command.cgroup_procs = procs;
                None
            }
        };
        let mut executor = Executor::new(config).with_confinement(confinement);
        if let Some(session) = session {
            executor = executor.with_session(session);
        }
        if let Some(group) = group {
            executor = executor.with_group(group);
        }
        if let Some(quota) = quota {
            executor = executor.with_quota(quota);
        }
        Ok(Sandbox { executor, rules })
    }
}

/// The user a session's commands run as, when the policy picks one per workspace: a uid from
/// the pool (a root BYOH host), the workspace then given to it. With one command user for every
/// workspace (a root pod's `nobody`, or root when asked for), the workspace is given to that user
/// when it belongs to another: commands hold no capabilities, so a workspace they do not own is
/// one they cannot write, root included.
fn session_user(
    iso: &Isolation,
    confinement: &Confinement,
    spec: SandboxSpec<'_>,
) -> Result<Option<CommandUser>, SandboxError> {
    let root = spec.workspace.root();
    if let Some(pool) = &iso.uid_pool {
        let extra: Vec<&Path> = spec.private_tmp.into_iter().collect();
        let assigned = match spec.uid {
            Some(uid) => pool.assign_given(root, &extra, uid),
            None => pool.assign(root, &extra),
        };
        return assigned
            .map(Some)
            .map_err(|e| SandboxError::Uid(e.to_string()));
    }
    let user = match confinement.user() {
        Some(user) => Some(user),
        None if iso.root_asked => Some(CommandUser { uid: 0, gid: 0 }),
        None => None,
    };
    if let Some(user) = user
        && nix::unistd::geteuid().is_root()
    {
        users::give_to(root, user).map_err(|e| SandboxError::Owner {
            uid: user.uid,
            message: e.to_string(),
        })?;
    }
    Ok(None)
}
