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

use std::os::unix::fs::DirBuilderExt;

use super::confine::{Confinement, Isolation, WorkspaceRules, users};
use super::disk;
use super::net::{Exit, FORWARD_PORT, Network};
use super::probe::Namespaces;
use super::protocol::{
    CommandUser, Landlock, SessionDisk, SessionNetwork, SessionOverlay, SessionRequest,
};
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
    /// The session's uid from the pool, which the store hands out (so that no uid serves two
    /// sessions at once, on any replica); required where the policy has a pool.
    pub uid: Option<u32>,
    /// The workspace as a copy-on-write view of a template (see `exec::overlay`): made in the
    /// session's view, so only where the host gives sessions namespaces.
    pub overlay: Option<OverlaySpec<'a>>,
}

/// The template a workspace is an overlay of, and the kernel's work directory for it: an empty
/// directory, hidden from sessions, on the workspace's file system.
#[derive(Clone, Copy, Debug)]
pub struct OverlaySpec<'a> {
    pub template: &'a Path,
    pub work: &'a Path,
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
    #[error("could not make the session's disk: {0}")]
    Disk(String),
    #[error("could not make the workspace an overlay of the template: {0}")]
    Overlay(String),
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
    /// Long: each isolation the host allows adds its part (user, cgroup, disk, quota, network),
    /// in the order the session's holder needs them.
    pub fn for_workspace(
        mut config: ExecConfig,
        policy: &Confinement,
        spec: SandboxSpec<'_>,
    ) -> Result<Sandbox, SandboxError> {
        if crate::failpoint_fails!("sandbox.refused") {
            return Err(SandboxError::Cgroup(
                "refused (the failpoint sandbox.refused)".into(),
            ));
        }
        let mut confinement = match spec.private_tmp {
            Some(tmp) => policy.clone().private_tmp(tmp),
            None => policy.clone(),
        };
        let Some(iso) = confinement.isolation().cloned() else {
            // Local use: the user's own commands, in a read-only system where the host allows.
            let rules = confinement.for_workspace(spec.workspace);
            let mut executor = Executor::new(config).with_confinement(confinement.clone());
            if let (Some(view), Some(namespaces)) =
                (rules.view.clone(), confinement.local_namespaces())
            {
                let helper = executor.config().supervisor.clone();
                // Where this process makes the namespaces itself (root, or a one-shot call in a
                // user namespace of its own: see `probe::assume_own_namespaces`), the view needs
                // no user namespace of its own.
                let makes_them_itself = namespaces == Namespaces::Root
                    || (crate::exec::sys::in_own_user_namespace()
                        && crate::exec::probe::namespaces_assumed());
                let request = SessionRequest {
                    parent: std::process::id(),
                    userns: (!makes_them_itself).then(|| CommandUser {
                        uid: nix::unistd::geteuid().as_raw(),
                        gid: nix::unistd::getegid().as_raw(),
                    }),
                    pid_namespace: false,
                    cgroup_procs: Vec::new(),
                    network: None,
                    disk: None,
                    overlay: None,
                    view,
                    landlock: session_landlock(&rules),
                };
                executor = executor.with_session(SessionSlot::new(helper, request, None));
            }
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
        let disk = match (iso.disk_quota, confinement.disks()) {
            (Some(bytes), Some(dir)) if iso.disk_fs => {
                session_disk(dir, bytes, spec, disk_owner(&iso, &confinement))?
            }
            _ => None,
        };
        let measured = if disk.is_some() { None } else { iso.disk_quota };
        let quota = measured.map(|bytes| {
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
            Some(view) => {
                let (network, exit) = match iso.network {
                    true => network(&mut config, &mut rules, &iso.allow_networks),
                    false => (None, None),
                };
                let request = SessionRequest {
                    parent: std::process::id(),
                    userns: iso.namespaces.user_namespace().then(|| CommandUser {
                        uid: nix::unistd::geteuid().as_raw(),
                        gid: nix::unistd::getegid().as_raw(),
                    }),
                    pid_namespace: iso.namespaces.pid_namespace(),
                    cgroup_procs: procs,
                    network,
                    disk,
                    overlay: spec
                        .overlay
                        .map(|o| session_overlay(o, spec, disk_owner(&iso, &confinement)))
                        .transpose()?,
                    view,
                    landlock: session_landlock(&rules),
                };
                Some(SessionSlot::new(iso.helper.clone(), request, exit))
            }
            None if spec.overlay.is_some() => {
                return Err(SandboxError::Overlay(
                    "sessions get no mount namespace on this host".to_owned(),
                ));
            }
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

/// A session's own network namespace (see `exec::net`): loopback only when the network is
/// denied (inside it a command may still use loopback, so the socket filter is not needed);
/// else one way out, through the pod's egress proxy or podhost's own proxy, which the commands'
/// proxy variables name.
fn network(
    config: &mut ExecConfig,
    rules: &mut WorkspaceRules,
    allowed: &Arc<[Network]>,
) -> (Option<SessionNetwork>, Option<Exit>) {
    if rules.command.deny_network {
        rules.command.deny_network = false;
        return (Some(SessionNetwork { forward_port: None }), None);
    }
    let exit = match &config.env.egress {
        Some(egress) if egress.proxy().is_some() => Exit::Relay(egress.clone()),
        _ => Exit::Proxy(allowed.clone()),
    };
    config.env.forward = Some(FORWARD_PORT);
    let network = SessionNetwork {
        forward_port: Some(FORWARD_PORT),
    };
    (Some(network), Some(exit))
}

/// The overlay of `spec`'s workspace: on a root host, the template's owner is shown as `owner`
/// (the command user, who then owns its files as it would own a copy's).
fn session_overlay(
    overlay: OverlaySpec<'_>,
    spec: SandboxSpec<'_>,
    owner: CommandUser,
) -> Result<SessionOverlay, SandboxError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(overlay.template)
        .map_err(|e| SandboxError::Overlay(format!("{}: {e}", overlay.template.display())))?;
    let from = CommandUser {
        uid: meta.uid(),
        gid: meta.gid(),
    };
    let map_owner = (nix::unistd::geteuid().is_root() && from != owner).then_some((from, owner));
    Ok(SessionOverlay {
        lower: overlay.template.to_path_buf(),
        target: spec.workspace.root().to_path_buf(),
        work: overlay.work.to_path_buf(),
        map_owner,
    })
}

/// Who owns a session's disk's directories: its command user (a pool uid, or the one user of
/// every session), else root when asked for, else podhost's own user.
fn disk_owner(iso: &Isolation, confinement: &Confinement) -> CommandUser {
    match confinement.user() {
        Some(user) => user,
        None if iso.root_asked => CommandUser { uid: 0, gid: 0 },
        None => CommandUser {
            uid: nix::unistd::geteuid().as_raw(),
            gid: nix::unistd::getegid().as_raw(),
        },
    }
}

/// The disk of the session whose workspace `spec` names (see `exec::disk`): its image in `dir`,
/// named after the workspace's directory. `None` for a session that already keeps files on the
/// host's directories without an image (one from before disks, or from a host that could not
/// make them): its quota stays measured, so nothing it has is hidden.
fn session_disk(
    dir: &Path,
    bytes: u64,
    spec: SandboxSpec<'_>,
    owner: CommandUser,
) -> Result<Option<SessionDisk>, SandboxError> {
    let root = spec.workspace.root();
    let name = root
        .file_name()
        .ok_or_else(|| SandboxError::Disk(format!("{} has no name", root.display())))?;
    let image = disk::image_path(dir, &name.to_string_lossy());
    let mut targets = vec![root.to_path_buf()];
    targets.extend(spec.private_tmp.map(Path::to_path_buf));
    if !image.exists() {
        let holds_files = |d: &Path| std::fs::read_dir(d).is_ok_and(|mut e| e.next().is_some());
        if targets.iter().any(|t| holds_files(t)) {
            tracing::warn!(
                workspace = %root.display(),
                "a session's files are on the host without a disk of their own: its quota is \
                 measured"
            );
            return Ok(None);
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| SandboxError::Disk(format!("{}: {e}", dir.display())))?;
    }
    Ok(Some(SessionDisk {
        image,
        bytes,
        targets,
        owner,
    }))
}

/// The user a session's commands run as, when the policy picks one per workspace: the uid the
/// store handed the session from the pool (a root BYOH host), the workspace then given to it. With one command user for every
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
        let uid = spec.uid.ok_or_else(|| {
            SandboxError::Uid(format!(
                "the session was handed no uid of PODHOST_UID_POOL ({})",
                pool.range()
            ))
        })?;
        let extra: Vec<&Path> = spec.private_tmp.into_iter().collect();
        return pool
            .give(root, &extra, uid)
            .map(Some)
            .map_err(|e| SandboxError::Owner {
                uid,
                message: e.to_string(),
            });
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

/// What a session's holder builds its commands' ruleset from: their Landlock rules, as every
/// command of the session is sent them, and whether their network is denied.
fn session_landlock(rules: &WorkspaceRules) -> Option<(Landlock, bool)> {
    let command = &rules.command;
    command
        .landlock
        .clone()
        .map(|spec| (spec, command.deny_network))
}
