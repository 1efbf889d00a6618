//! Confinement: what a command or a file tool can reach, and the hardening that keeps podhost's
//! own secrets away from processes of the same user.
//!
//! Owns: the [`Confinement`] policy of a front (built once from the settings, plus the paths the
//! front hides), its rules for one workspace ([`Confinement::for_workspace`]), the Landlock
//! ruleset those rules become ([`ruleset`]), the seccomp network filter, applying both in a
//! command's process ([`Prepared`], from the supervisor) or on a file tool's thread
//! ([`restrict_thread`]), the level reported at start-up and by the health endpoints ([`Level`]),
//! and the process hardening of podhost itself ([`harden_process`]).
//!
//! # What a command can reach
//!
//! * Read-only: the whole system (`/`), minus the hidden paths.
//! * Read-write: its own workspace roots (read-only roots such as `/skills` stay read-only), its
//!   temporary directory, and a few device files (`/dev/null`, `/dev/tty`, `/dev/pts`, …).
//! * Nothing at all: the hidden paths — podhost's state (in a pod the harness root and the join
//!   file; on a BYOH host the data directory, which holds the database and every session's
//!   workspace), and whatever `PODHOST_CONFINE_DENY` adds. A grant strictly beneath a hidden path
//!   is an explicit exception: the egress CA bundle in the harness root, the session's own
//!   workspace in the data directory.
//!
//! Landlock can only allow, never deny, so "all of `/` but the hidden paths" is built by
//! splitting: a grant on a directory that contains a hidden path becomes one rule per entry of
//! that directory that is not on the way to it, recursing into the one that is ([`expand`]).
//! Consequences, by design: an entry created in a split directory after the rules were built is
//! not reachable (rules are rebuilt for every command, so only for that command), and nothing
//! new can be created directly in a *writable* split directory.
//!
//! # Where temporary files go
//!
//! * Pod: `/tmp` is the pod's own (spec §9) and stays writable; so do `/var/tmp` and `/dev/shm`.
//! * BYOH: each session gets a private directory (the front passes it, `TMPDIR` points at it);
//!   `/tmp` and `/var/tmp` are read-only, so sessions cannot leave files for each other there.
//!   `/dev/shm` stays writable (POSIX semaphores, Python's multiprocessing need it): it is the
//!   one shared writable directory left, and it holds nothing of podhost's.
//! * Local (`podhost tool`): like the pod, unless `PODHOST_TMP_DIR` names a private directory.
//!
//! # Process hardening
//!
//! Every front but the supervisor marks podhost non-dumpable at start-up, so a process of the
//! same user cannot read `/proc/<podhost>/environ` or `/proc/<podhost>/mem`, nor ptrace it.
//! Secrets that arrive in podhost's environment (`PODHOST_TOKEN`, …) are overwritten in place
//! and removed once read. `/proc/<pid>/environ` shows the process's *initial* environment block,
//! which removing a variable does not change — overwriting it does, and non-dumpable protects it
//! either way. The supervisor stays dumpable: it holds only its command's request, nothing the
//! command does not get anyway, and a confined command cannot ptrace it (Landlock forbids
//! tracing a process outside the sandbox).
//!
//! # Isolation on a pod or BYOH host
//!
//! A front that serves others (`podhost pod`, `podhost serve`; [`Settings::isolate`]) asks for
//! more, each part reported in [`Level`]:
//!
//! * **A session's namespaces** (`exec::session`): where the kernel allows (podhost is root, or
//!   unprivileged user namespaces are allowed; found by trying, at start-up), a workspace's
//!   commands run in mount, IPC and PID namespaces of their own with a view of the file system
//!   in which the system is read-only (so `chmod`, `chown` and `utime` outside the workspace
//!   fail with `EROFS`), podhost's state and every other session are empty mounts, `/dev` holds
//!   only `null zero full random urandom tty pts shm`, `/run` and `/var/run` (host sockets) are
//!   empty, and `/proc` shows the session's own processes only. Landlock stays on top.
//! * **Where namespaces are refused** (most Kubernetes seccomp profiles): Landlock alone, with
//!   `/dev` limited to the same device nodes; and since Landlock cannot stop `chmod`, podhost
//!   checks the modes of its own state at each use and puts them back (`state`).
//! * **No root, no capabilities**: commands never run as root unless asked
//!   (`PODHOST_COMMAND_USER=root`); a root podhost runs them as an unprivileged user — on a BYOH
//!   host one uid per session from `PODHOST_UID_POOL` (`users`) — and the file tools take that
//!   uid as their file-system identity. Every capability set of a command is empty.
//! * **Limits that bind root**: a cgroup per session (`exec::cgroup`) where one can be made.
//!
//! Layout: this file holds the policy and its reporting; `rules` turns a policy into Landlock
//! rules and rulesets; `apply` applies them (and the network filter, and the command user) in a
//! command's process; `harden` hardens podhost's own process; `level` reports the level in
//! force; `isolation` finds what a pod or BYOH host can isolate with, and the view of a
//! session; `users` assigns pool uids; `state` guards the modes of podhost's state.
//!
//! Invariants:
//! * Confinement never silently weakens: a ruleset that cannot be built or enforced fails the
//!   command (or the file tool call) with the reason; the kernel lacking Landlock is reported at
//!   start-up and in [`Level`], and `PODHOST_REQUIRE_CONFINEMENT` refuses to start.
//! * A rule is opened without following symlinks (`openat2` with `RESOLVE_NO_SYMLINKS`), and a
//!   symlink met while splitting is granted by its canonical target, checked against the hidden
//!   paths: a symlink planted next to a hidden path cannot carry a grant onto it.
//!
//! Non-goals: hiding paths the kernel reaches by another name (a bind mount, a hard link made
//! before podhost started) from Landlock alone; isolating local use (`podhost tool`, `run`,
//! `mcp`), whose commands run as the person who started podhost.

mod apply;
mod harden;
mod isolation;
mod level;
mod rules;
pub mod state;
mod syscalls;
pub mod users;

pub use apply::{Prepared, ROOT_KEEPS, Shedding, shed_bounding_set_ahead};
pub use harden::{Hardened, harden_process, is_non_dumpable, take_secret_env};
pub use isolation::Isolation;
pub use level::{Level, report_startup, reported};
pub use rules::{Grant, Prebuilt, Rule, expand, restrict_thread, ruleset};
pub use state::Guard;
pub use syscalls::{
    build_ahead as build_filters_ahead, build_ahead_for as build_filter_ahead, confine_holder,
    join_session_keyring, split_filter, syscall_filter,
};
pub use users::{UidPool, UidRange};

use std::fs;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};

use landlock::RulesetStatus;

use super::cgroup::CgroupLimits;
use super::net::Network;
use super::protocol::{CommandUser, Confine, Landlock, View};
use crate::floor::workspace::Workspace;

/// The newest Landlock ABI whose features podhost uses: file rights of ABI 5 (device ioctls),
/// TCP rules of 4, signal and abstract-socket scoping of 6. A newer kernel is used at this level.
pub const TARGET_ABI: u8 = 6;

/// The most rules one ruleset may have: splitting around a hidden path in a huge directory
/// fails loudly instead of taking seconds per command.
pub const MAX_RULES: usize = 10_000;

/// Device files every command may open for writing.
const DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// Writable temporary directories shared by every command, unless the front gives each
/// workspace a private one (then only `/dev/shm` stays).
const SHARED_TMP: [&str; 3] = ["/tmp", "/var/tmp", "/dev/shm"];

/// Name parts of environment variables that hold secrets: podhost removes such `PODHOST_*` and
/// `NYLORUN_*` variables from its environment at start-up.
const SECRET_WORDS: [&str; 5] = ["TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL"];

/// Why confinement could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("Landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("Landlock did not fully enforce the ruleset ({0:?})")]
    NotEnforced(RulesetStatus),
    #[error(
        "more than {MAX_RULES} Landlock rules are needed to hide paths beneath {0}; hide a \
         directory closer to the root or move the hidden path"
    )]
    TooManyRules(PathBuf),
    #[error("the system-call filter: {0}")]
    Seccomp(String),
    #[error("confinement is required (PODHOST_REQUIRE_CONFINEMENT), but {0}; refusing to start")]
    Required(String),
    #[error("PODHOST_COMMAND_USER {spec:?}: {message}")]
    User { spec: String, message: String },
}

/// The bytes of a session's private `/dev/shm`.
const SHM_BYTES: u64 = 64 << 20;

/// The settings confinement is built from (the configuration's `PODHOST_CONFINE*` values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Isolate sessions (a pod or BYOH host): namespaces where the kernel allows, no
    /// capabilities, no root, cgroup limits, a limited `/dev` (see the module doc). Local use
    /// leaves it off.
    pub isolate: bool,
    /// Use namespaces when isolating (`PODHOST_NAMESPACES`, default on; off forces the
    /// Landlock-only level).
    pub namespaces: bool,
    /// Give each session a network namespace of its own where namespaces are used
    /// (`PODHOST_SESSION_NETWORK`, default on; off leaves commands on the host's network).
    pub session_network: bool,
    /// Networks a session's proxy reaches although they are not global
    /// (`PODHOST_SESSION_ALLOW_NETWORKS`; see `exec::net`).
    pub allow_networks: Vec<Network>,
    /// Local use: run commands in a mount namespace whose system is read-only outside the
    /// workspace, the temporary directory and the `--allow-write` directories, where the kernel
    /// allows one (`PODHOST_READ_ONLY_SYSTEM`).
    pub read_only_system: bool,
    /// The helper binary the namespace probe runs (`podhost-exec`); `None`: beside podhost.
    pub helper: Option<PathBuf>,
    /// A root podhost on a BYOH host: the uids sessions' commands run as, one each.
    pub uid_pool: Option<UidRange>,
    /// Commands run as root because the configuration asked (`PODHOST_COMMAND_USER=root`).
    pub root_asked: bool,
    /// The limits of a session's cgroup.
    pub cgroup: CgroupLimits,
    /// A BYOH session's disk quota, in bytes.
    pub disk_quota: Option<u64>,
    /// Hold the quota with a file system of the session's own where podhost can make one
    /// (`PODHOST_SESSION_DISK_FS`, default on; off: the quota is measured).
    pub session_disk_fs: bool,
    /// Use Landlock when the kernel has it (`PODHOST_CONFINE`, default on).
    pub enabled: bool,
    /// Refuse to start without Landlock (`PODHOST_REQUIRE_CONFINEMENT`).
    pub require: bool,
    /// Deny commands every socket but `AF_UNIX` (`PODHOST_DENY_NETWORK`).
    pub deny_network: bool,
    /// More paths to hide (`PODHOST_CONFINE_DENY`).
    pub hidden: Vec<PathBuf>,
    /// A private temporary directory for commands (`PODHOST_TMP_DIR`); `/tmp` is then read-only.
    pub tmp: Option<PathBuf>,
    /// The user commands run as when podhost runs as root (`PODHOST_COMMAND_USER`).
    pub user: Option<CommandUser>,
    /// Testing: use at most this Landlock ABI (0 behaves as a kernel without Landlock).
    pub abi_max: Option<u8>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            isolate: false,
            namespaces: true,
            session_network: true,
            allow_networks: Vec::new(),
            read_only_system: false,
            helper: None,
            uid_pool: None,
            root_asked: false,
            cgroup: CgroupLimits::default(),
            disk_quota: None,
            session_disk_fs: true,
            enabled: true,
            require: false,
            deny_network: false,
            hidden: Vec::new(),
            tmp: None,
            user: None,
            abi_max: None,
        }
    }
}

impl Settings {
    /// Whether commands get local use's read-only system where the kernel allows it (not
    /// isolated, the read-only system on, namespaces not turned off).
    pub fn local_view_wanted(&self) -> bool {
        !self.isolate && self.read_only_system && self.namespaces
    }
}

/// The Landlock ABI of the running kernel (0 without Landlock), asked once.
#[allow(unsafe_code)]
pub fn kernel_abi() -> u8 {
    static ABI_CACHE: OnceLock<u8> = OnceLock::new();
    *ABI_CACHE.get_or_init(|| {
        const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
        // SAFETY: with a null attribute pointer, size 0 and the VERSION flag, the call only
        // returns the ABI version (or an error); it reads and writes no memory.
        let v = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                std::ptr::null::<u8>(),
                0usize,
                LANDLOCK_CREATE_RULESET_VERSION,
            )
        };
        u8::try_from(v).unwrap_or(0)
    })
}

/// A front's confinement policy. Cheap to clone; build it once, then [`hide`](Self::hide) the
/// front's own state.
#[derive(Clone, Debug)]
pub struct Confinement {
    /// Set on a pod or BYOH host (see [`Settings::isolate`]).
    isolation: Option<Arc<Isolation>>,
    /// podhost's own state, whose modes are checked at each use.
    guards: Vec<Guard>,
    /// The Landlock ABI to use; 0 for none.
    abi: u8,
    kernel_abi: u8,
    deny_network: bool,
    /// Canonical (the missing tail of a path that does not exist yet kept as given).
    hidden: Vec<PathBuf>,
    /// Hidden paths whose names may be listed (see [`hide_contents`](Self::hide_contents)).
    names_visible: Vec<PathBuf>,
    /// Read-only exceptions inside hidden paths.
    readable: Vec<PathBuf>,
    tmp: Option<PathBuf>,
    user: Option<CommandUser>,
    /// Where sessions' disk images live (a BYOH host's data directory; see `exec::disk`).
    disks: Option<PathBuf>,
    /// Local use with a read-only system: the namespaces this host allows for it.
    local_view: Option<crate::exec::probe::Namespaces>,
}

impl Default for Confinement {
    /// Landlock where the kernel has it, nothing hidden, network allowed, shared `/tmp`.
    fn default() -> Self {
        Confinement::new(&Settings::default())
    }
}

impl Confinement {
    pub fn new(settings: &Settings) -> Self {
        // The test knob stands for the kernel: 0 behaves (and reports) as a kernel without
        // Landlock.
        let kernel_abi = settings
            .abi_max
            .map_or(kernel_abi(), |max| kernel_abi().min(max));
        let mut abi = kernel_abi.min(TARGET_ABI);
        if !settings.enabled {
            abi = 0;
        }
        let isolation = settings
            .isolate
            .then(|| Arc::new(Isolation::find(settings)));
        let local_view = settings
            .local_view_wanted()
            .then(|| Isolation::local_namespaces(settings))
            .flatten();
        let mut c = Confinement {
            isolation,
            guards: Vec::new(),
            abi,
            kernel_abi,
            deny_network: settings.deny_network,
            hidden: Vec::new(),
            names_visible: Vec::new(),
            readable: Vec::new(),
            tmp: settings.tmp.as_deref().map(canonical_lenient),
            user: settings.user,
            disks: None,
            local_view,
        };
        for h in &settings.hidden {
            c = c.hide(h);
        }
        c
    }

    /// No confinement at all (only `no_new_privs` and the resource limits).
    pub fn off() -> Self {
        Confinement::new(&Settings {
            enabled: false,
            ..Settings::default()
        })
    }

    /// Hides `path` and everything beneath it from commands and file tools, names included: the
    /// directories above it cannot be listed either (Landlock's list right is inherited, so
    /// listing a parent would list the hidden directory too). For state whose file names are
    /// private too: a BYOH data directory, other sessions' workspaces.
    pub fn hide(mut self, path: &Path) -> Self {
        let p = canonical_lenient(path);
        self.names_visible.retain(|q| q != &p);
        if !self.hidden.contains(&p) {
            self.hidden.push(p);
        }
        self
    }

    /// Hides the contents of `path` (no file beneath it can be opened) but lets the directories
    /// above it, and so the names beneath it, be listed: for state whose names say nothing, such
    /// as a pod's harness root and join file, so that `ls /` still works in the pod.
    pub fn hide_contents(mut self, path: &Path) -> Self {
        let p = canonical_lenient(path);
        if !self.hidden.contains(&p) {
            self.hidden.push(p.clone());
            self.names_visible.push(p);
        }
        self
    }

    /// Keeps `path` readable even though it lies beneath a hidden path (the egress CA bundle).
    pub fn allow_read(mut self, path: &Path) -> Self {
        let p = canonical_lenient(path);
        if !self.readable.contains(&p) {
            self.readable.push(p);
        }
        self
    }

    /// Gives commands `dir` as their temporary directory; `/tmp` and `/var/tmp` become
    /// read-only. The caller points `TMPDIR` at it (see `BaseEnv::tmp`).
    pub fn private_tmp(mut self, dir: &Path) -> Self {
        self.tmp = Some(canonical_lenient(dir));
        self
    }

    /// Sessions' disk images live in `dir` (podhost's own, hidden from sessions): where the
    /// host allows, a session's workspace and temporary directory are on an image there.
    pub fn session_disks(mut self, dir: &Path) -> Self {
        self.disks = Some(canonical_lenient(dir));
        self
    }

    /// Where sessions' disk images live, when they have any.
    pub fn disks(&self) -> Option<&Path> {
        self.disks.as_deref()
    }

    /// Checks (and repairs) the mode of podhost's state at `guard.path` at each use.
    pub fn guard(mut self, guard: Guard) -> Self {
        self.guards.push(guard);
        self
    }

    /// The state whose modes are checked at each use.
    pub fn guards(&self) -> &[Guard] {
        &self.guards
    }

    /// Commands of this policy run as `user` (a session's uid from the pool).
    pub fn command_user(mut self, user: CommandUser) -> Self {
        self.user = Some(user);
        self
    }

    /// How sessions are isolated (`None` in local use).
    pub fn isolation(&self) -> Option<&Arc<Isolation>> {
        self.isolation.as_ref()
    }

    /// Local use: the namespaces commands run in for a read-only system, when they do.
    pub fn local_namespaces(&self) -> Option<crate::exec::probe::Namespaces> {
        self.local_view
    }

    /// Whether commands run in a session's namespaces.
    /// Whether a session's workspace can be an overlay of a template (see `exec::overlay`):
    /// sessions get a view of their own, in which the kernel mounts one, and podhost's file
    /// tools can join it: as root, or in a user namespace of its own (a thread of a process
    /// with other threads cannot join the user namespace that owns a session's view, and needs
    /// `CAP_SYS_CHROOT` where it is to join its mount namespace; see
    /// `sys::enter_own_user_namespace`); else why not.
    pub fn overlay(&self) -> Result<(), String> {
        match &self.isolation {
            Some(iso) if iso.namespaces == crate::exec::probe::Namespaces::Root => {
                iso.overlay.clone()
            }
            Some(iso) if iso.namespaces.any() && crate::exec::sys::in_own_user_namespace() => {
                iso.overlay.clone()
            }
            Some(iso) if iso.namespaces.any() => Err(
                "podhost is not root, nor in a user namespace of its own: its file tools cannot \
                 join a session's mount namespace, which a user namespace owns"
                    .to_owned(),
            ),
            Some(iso) => iso.overlay.clone(),
            None => Err("sessions are not isolated".to_owned()),
        }
    }

    pub fn uses_namespaces(&self) -> bool {
        self.isolation.as_ref().is_some_and(|i| i.namespaces.any())
    }

    pub fn deny_network(mut self, deny: bool) -> Self {
        self.deny_network = deny;
        self
    }

    pub fn hidden(&self) -> &[PathBuf] {
        &self.hidden
    }

    pub fn tmp(&self) -> Option<&Path> {
        self.tmp.as_deref()
    }

    pub fn user(&self) -> Option<CommandUser> {
        self.user
    }

    /// Errors when `require` is set and commands would not be confined by Landlock.
    pub fn check_required(&self, require: bool) -> Result<(), ConfineError> {
        if !require || self.abi > 0 {
            return Ok(());
        }
        Err(ConfineError::Required(if self.kernel_abi == 0 {
            "this kernel has no Landlock".to_owned()
        } else {
            "confinement is turned off (PODHOST_CONFINE=off)".to_owned()
        }))
    }

    /// The rules for commands and file tools working in `ws`.
    pub fn for_workspace(&self, ws: &Workspace) -> WorkspaceRules {
        let landlock = (self.abi > 0).then(|| self.command_landlock(ws));
        let files = (self.abi > 0).then(|| {
            let mut l = Landlock {
                abi: self.abi,
                read: Vec::new(),
                write: Vec::new(),
                hidden: self.hidden.clone(),
                names_visible: self.names_visible.clone(),
                scoped: false,
            };
            for root in ws.roots() {
                push_unique(
                    if root.writable {
                        &mut l.write
                    } else {
                        &mut l.read
                    },
                    &root.host,
                );
            }
            l
        });
        let no_capabilities = self.isolation.is_some();
        WorkspaceRules {
            command: Confine {
                landlock,
                deny_network: self.deny_network,
                user: self.user.filter(|u| u.uid != 0),
                no_capabilities,
                cgroup_procs: Vec::new(),
            },
            files,
            tmp: self.tmp.clone(),
            view: if self.uses_namespaces() {
                Some(self.view(ws))
            } else {
                self.local_view.map(|_| self.local_view(ws))
            },
        }
    }

    fn command_landlock(&self, ws: &Workspace) -> Landlock {
        let mut l = Landlock {
            abi: self.abi,
            read: vec![PathBuf::from("/")],
            write: Vec::new(),
            hidden: self.hidden.clone(),
            names_visible: self.names_visible.clone(),
            scoped: self.abi >= 6,
        };
        if self.isolation.is_some() && !self.uses_namespaces() {
            // No view with a minimal /dev: Landlock opens only the listed nodes (no disk, no
            // loop device), whose names stay listable.
            push_unique(&mut l.hidden, Path::new("/dev"));
            push_unique(&mut l.names_visible, Path::new("/dev"));
        }
        for p in &self.readable {
            push_unique(&mut l.read, p);
        }
        for root in ws.roots() {
            let list = if root.writable {
                &mut l.write
            } else {
                &mut l.read
            };
            push_unique(list, &root.host);
        }
        for d in DEVICES {
            push_unique(&mut l.write, Path::new(d));
        }
        match &self.tmp {
            Some(tmp) => {
                push_unique(&mut l.write, tmp);
                push_unique(&mut l.write, Path::new("/dev/shm"));
            }
            None => {
                for d in SHARED_TMP {
                    push_unique(&mut l.write, &canonical_lenient(Path::new(d)));
                }
            }
        }
        l
    }
}

/// What [`Confinement::for_workspace`] gives one workspace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceRules {
    /// Sent with every command (the supervisor applies it).
    pub command: Confine,
    /// The file tools' thread ruleset: the workspace's roots and nothing else.
    pub files: Option<Landlock>,
    /// The commands' private temporary directory (`TMPDIR`), if the policy gives one.
    pub tmp: Option<PathBuf>,
    /// The view a session holder builds, when commands run in namespaces.
    pub view: Option<View>,
}

impl WorkspaceRules {
    /// Whether a file tool call needs a thread of its own ([`confine_thread`]).
    pub fn confines_files(&self) -> bool {
        self.files.is_some() || self.command.user.is_some() || self.command.no_capabilities
    }
}

/// Confines the calling thread (a fresh one, which dies with the call) for a file tool: as the
/// command user's file-system identity when there is one (so files it writes belong to that user
/// and permissions are checked as that user, like a command's), without capabilities when
/// commands hold none (the thread's own sets: the rest of podhost keeps its), then to the
/// Landlock rules.
pub fn confine_thread(rules: &WorkspaceRules) -> Result<(), ConfineError> {
    if let Some(user) = rules.command.user {
        apply::become_user_on_thread(user).map_err(|e| ConfineError::User {
            spec: format!("{}:{}", user.uid, user.gid),
            message: format!("could not take its file-system identity: {e}"),
        })?;
    }
    if rules.command.no_capabilities {
        apply::drop_thread_capabilities().map_err(|e| ConfineError::User {
            spec: "capabilities".to_owned(),
            message: format!("could not drop the thread's capabilities: {e}"),
        })?;
    }
    match &rules.files {
        Some(spec) => restrict_thread(spec),
        None => Ok(()),
    }
}

fn push_unique(list: &mut Vec<PathBuf>, p: &Path) {
    if !list.iter().any(|q| q == p) {
        list.push(p.to_path_buf());
    }
}

/// `path` made absolute and canonical as far as it exists; the missing tail is appended as
/// given (without `.` and `..`), so a hidden path that appears later is still hidden.
pub fn canonical_lenient(path: &Path) -> PathBuf {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut existing = abs.as_path();
    let mut tail = Vec::new();
    loop {
        if let Ok(c) = fs::canonicalize(existing) {
            let mut out = c;
            for part in tail.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                tail.push(name.to_owned());
                existing = parent;
            }
            _ => break,
        }
    }
    // Nothing exists (not even `/`): normalize lexically.
    let mut out = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// A session's workspace is an overlay only where podhost is root: at a user namespace's
    /// level its file tools could not join the view, whatever the kernel mounts.
    #[test]
    fn only_a_root_host_gives_overlay_workspaces() {
        let at = |namespaces: crate::exec::probe::Namespaces| {
            let iso = Isolation {
                namespaces,
                refused: Vec::new(),
                network: false,
                allow_networks: Vec::new().into(),
                helper: PathBuf::new(),
                uid_pool: None,
                cgroups: Err("none".to_owned()),
                disk_quota: None,
                disk_fs: false,
                root_asked: false,
                overlay: Ok(()),
            };
            Confinement {
                isolation: Some(Arc::new(iso)),
                ..Confinement::default()
            }
            .overlay()
        };
        use crate::exec::probe::Namespaces;
        assert_eq!(at(Namespaces::Root), Ok(()));
        for level in [Namespaces::Userns, Namespaces::UsernsNoproc] {
            assert_eq!(
                at(level),
                Err(
                    "podhost is not root, nor in a user namespace of its own: its file tools \
                     cannot join a session's mount namespace, which a user namespace owns"
                        .to_owned()
                )
            );
        }
        assert_eq!(
            Confinement::default().overlay(),
            Err("sessions are not isolated".to_owned())
        );
    }

    #[test]
    fn the_level_follows_the_settings() {
        let kernel = kernel_abi();
        assert!(kernel >= 1, "these tests expect a kernel with Landlock");
        let c = Confinement::new(&Settings {
            abi_max: Some(0),
            deny_network: true,
            ..Settings::default()
        });
        let level = c.level();
        assert_eq!(
            (
                level.landlock_abi,
                level.kernel_landlock_abi,
                level.scoped_signals,
                level.network_filter
            ),
            (0, 0, false, true)
        );
        assert_eq!(
            c.check_required(true).unwrap_err().to_string(),
            "confinement is required (PODHOST_REQUIRE_CONFINEMENT), but this kernel has no \
             Landlock; refusing to start"
        );
        let capped = Confinement::new(&Settings {
            abi_max: Some(2),
            ..Settings::default()
        });
        assert_eq!(capped.level().landlock_abi, kernel.min(2));
        assert!(
            c.check_required(true)
                .unwrap_err()
                .to_string()
                .contains("refusing to start")
        );
        assert!(c.check_required(false).is_ok());
        assert_eq!(Confinement::off().level().landlock_abi, 0);
    }
}
