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
//! Invariants:
//! * Confinement never silently weakens: a ruleset that cannot be built or enforced fails the
//!   command (or the file tool call) with the reason; the kernel lacking Landlock is reported at
//!   start-up and in [`Level`], and `PODHOST_REQUIRE_CONFINEMENT` refuses to start.
//! * A rule is opened without following symlinks (`openat2` with `RESOLVE_NO_SYMLINKS`), and a
//!   symlink met while splitting is granted by its canonical target, checked against the hidden
//!   paths: a symlink planted next to a hidden path cannot carry a grant onto it.
//!
//! Non-goals: hiding paths the kernel reaches by another name (a bind mount, a hard link made
//! before podhost started); per-command cgroups (limits are `setrlimit`, see `limits`).

use std::collections::{BTreeMap, HashSet};
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};
use serde::Serialize;

use super::protocol::{CommandUser, Confine, Landlock};
use crate::tools::paths::Workspace;

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
    #[error("the network filter: {0}")]
    Seccomp(String),
    #[error("confinement is required (PODHOST_REQUIRE_CONFINEMENT), but {0}; refusing to start")]
    Required(String),
    #[error("PODHOST_COMMAND_USER {spec:?}: {message}")]
    User { spec: String, message: String },
}

/// The settings confinement is built from (the configuration's `PODHOST_CONFINE*` values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
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

/// The confinement level in force: logged at start-up, reported by `/health` and `/healthz`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Level {
    /// The Landlock ABI commands and file tools are confined with; 0 for none (off, or the
    /// kernel has no Landlock).
    pub landlock_abi: u8,
    /// The Landlock ABI the kernel offers (0: none).
    pub kernel_landlock_abi: u8,
    /// Commands cannot signal (or connect to abstract sockets of) processes outside their
    /// sandbox: Landlock scoping, ABI ≥ 6.
    pub scoped_signals: bool,
    /// Commands can open no socket but `AF_UNIX`.
    pub network_filter: bool,
    /// podhost is non-dumpable: its memory and environment are closed to same-user processes.
    pub non_dumpable: bool,
    /// Commands start with `no_new_privs` (always).
    pub no_new_privs: bool,
    /// The uid commands run as, when podhost drops them to another user.
    pub command_uid: Option<u32>,
}

impl Level {
    /// Whether commands are confined by Landlock.
    pub fn is_confined(&self) -> bool {
        self.landlock_abi > 0
    }

    /// One line for logs.
    pub fn summary(&self) -> String {
        let landlock = if self.landlock_abi > 0 {
            format!(
                "Landlock ABI {} (kernel {})",
                self.landlock_abi, self.kernel_landlock_abi
            )
        } else if self.kernel_landlock_abi > 0 {
            format!(
                "no Landlock (off; kernel offers ABI {})",
                self.kernel_landlock_abi
            )
        } else {
            "no Landlock (the kernel has none)".to_owned()
        };
        let on = |b: bool| if b { "on" } else { "off" };
        format!(
            "{landlock}, signal scoping {}, network filter {}, non-dumpable {}, \
             no_new_privs {}, command user {}",
            on(self.scoped_signals),
            on(self.network_filter),
            on(self.non_dumpable),
            on(self.no_new_privs),
            self.command_uid
                .map_or_else(|| "podhost's own".to_owned(), |u| format!("uid {u}"))
        )
    }
}

/// The level this process reported at start-up ([`report_startup`]).
static REPORTED: OnceLock<Level> = OnceLock::new();

/// Logs the confinement level of a front starting up, remembers it for the health endpoints, and
/// refuses (`Err`) when `require` is set and commands would not be confined. A missing Landlock
/// is always a warning; a confined start is logged at `info` when `loud` (long-running fronts),
/// else at `debug` (one-shot `podhost tool`).
pub fn report_startup(
    confinement: &Confinement,
    require: bool,
    loud: bool,
) -> Result<Level, ConfineError> {
    let level = confinement.level();
    let _ = REPORTED.set(level.clone());
    confinement.check_required(require)?;
    if !level.is_confined() {
        tracing::warn!(
            confinement = %level.summary(),
            "commands and file tools are NOT confined: they can read everything podhost's user \
             can (set PODHOST_REQUIRE_CONFINEMENT to refuse to start instead)"
        );
    } else if loud {
        tracing::info!(confinement = %level.summary(), "commands and file tools are confined");
    } else {
        tracing::debug!(confinement = %level.summary(), "commands and file tools are confined");
    }
    Ok(level)
}

/// The level reported at start-up; before that (tests that build fronts in-process), the
/// default policy's.
pub fn reported() -> Level {
    REPORTED
        .get()
        .cloned()
        .unwrap_or_else(|| Confinement::default().level())
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confinement {
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
        let mut c = Confinement {
            abi,
            kernel_abi,
            deny_network: settings.deny_network,
            hidden: Vec::new(),
            names_visible: Vec::new(),
            readable: Vec::new(),
            tmp: settings.tmp.as_deref().map(canonical_lenient),
            user: settings.user,
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

    /// The level this policy gives, with the process's own state (non-dumpable) read now.
    pub fn level(&self) -> Level {
        Level {
            landlock_abi: self.abi,
            kernel_landlock_abi: self.kernel_abi,
            scoped_signals: self.abi >= 6,
            network_filter: self.deny_network,
            non_dumpable: is_non_dumpable(),
            no_new_privs: true,
            command_uid: self.user.map(|u| u.uid),
        }
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
        WorkspaceRules {
            command: Confine {
                landlock,
                deny_network: self.deny_network,
                user: self.user,
            },
            files,
            tmp: self.tmp.clone(),
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

/// What a rule allows beneath its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Grant {
    /// Open and list directories only (a split directory above names-visible hidden paths).
    List,
    /// Read, list, execute.
    Read,
    /// Everything.
    Write,
}

/// One Landlock rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub path: PathBuf,
    pub grant: Grant,
}

/// The rules of `spec`: each grant, split around the hidden paths beneath it.
pub fn expand(spec: &Landlock) -> Result<Vec<Rule>, ConfineError> {
    let mut x = Expander {
        hidden: &spec.hidden,
        names_visible: &spec.names_visible,
        out: Vec::new(),
        split: HashSet::new(),
    };
    for (paths, grant) in [(&spec.read, Grant::Read), (&spec.write, Grant::Write)] {
        for p in paths {
            x.grant(p, grant, true)?;
        }
    }
    Ok(x.out)
}

struct Expander<'a> {
    hidden: &'a [PathBuf],
    names_visible: &'a [PathBuf],
    out: Vec<Rule>,
    /// Directories already split (for each grant), so a symlink loop ends.
    split: HashSet<(PathBuf, Grant)>,
}

impl Expander<'_> {
    /// Grants `path`. An `explicit` grant (from the policy) beneath a hidden path is an
    /// exception and stays; a derived one (a symlink's target) is dropped.
    fn grant(&mut self, path: &Path, grant: Grant, explicit: bool) -> Result<(), ConfineError> {
        let hidden_at_or_above = |h: &PathBuf| h == path || (!explicit && path.starts_with(h));
        if self.hidden.iter().any(hidden_at_or_above) {
            return Ok(());
        }
        let below: Vec<&PathBuf> = self
            .hidden
            .iter()
            .filter(|h| h.starts_with(path) && h.as_path() != path)
            .collect();
        if below.is_empty() {
            return self.push(path, grant);
        }
        if !self.split.insert((path.to_path_buf(), grant)) {
            return Ok(());
        }
        if below.iter().all(|h| self.names_visible.contains(h)) {
            self.push(path, Grant::List)?;
        }
        // A directory that cannot be listed gets no rule: nothing beneath it is granted.
        let Ok(entries) = fs::read_dir(path) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let child = path.join(entry.file_name());
            if below.iter().any(|h| **h == child) {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_symlink() {
                // A rule on a symlink lands on its target: grant the target, as itself.
                if let Ok(target) = fs::canonicalize(&child) {
                    self.grant(&target, grant, false)?;
                }
            } else if below.iter().any(|h| h.starts_with(&child)) {
                self.grant(&child, grant, false)?;
            } else {
                self.push(&child, grant)?;
            }
        }
        Ok(())
    }

    fn push(&mut self, path: &Path, grant: Grant) -> Result<(), ConfineError> {
        if self.out.len() >= MAX_RULES {
            return Err(ConfineError::TooManyRules(
                path.parent().unwrap_or(path).to_path_buf(),
            ));
        }
        self.out.push(Rule {
            path: path.to_path_buf(),
            grant,
        });
        Ok(())
    }
}

/// Builds the Landlock ruleset of `spec` (every right of its ABI handled, so anything not
/// granted is denied), with every TCP bind and connect denied when `deny_network` (ABI ≥ 4).
pub fn ruleset(spec: &Landlock, deny_network: bool) -> Result<RulesetCreated, ConfineError> {
    let abi = ABI::from(i32::from(spec.abi.min(TARGET_ABI)));
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let file_rights = AccessFs::from_file(abi);
    // The ABI is already at most the kernel's: anything not enforced is an error, not a
    // silent downgrade.
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)?;
    if deny_network && spec.abi >= 4 {
        rs = rs.handle_access(AccessNet::from_all(abi))?;
    }
    if spec.scoped && spec.abi >= 6 {
        rs = rs.scope(Scope::from_all(abi))?;
    }
    let mut created = rs.create()?;
    for rule in expand(spec)? {
        // Gone since it was listed, or swapped for a symlink: no rule, so no access.
        let Ok(fd) = open_path(&rule.path) else {
            continue;
        };
        let mut access = match rule.grant {
            Grant::List => AccessFs::ReadDir.into(),
            Grant::Read => read,
            Grant::Write => all,
        };
        if !is_dir(&fd) {
            access &= file_rights;
        }
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    Ok(created)
}

/// Confines the calling thread (a fresh one: see `Toolbox`) to `spec`. Threads it spawns
/// afterwards inherit the restriction; the rest of the process is untouched.
pub fn restrict_thread(spec: &Landlock) -> Result<(), ConfineError> {
    let status = ruleset(spec, false)?.restrict_self()?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(()),
        other => Err(ConfineError::NotEnforced(other)),
    }
}

/// Opens `path` as an `O_PATH` descriptor without following any symlink on the way.
#[allow(unsafe_code)]
fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: open_how is plain integers, for which all zeros is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: `c` is NUL-terminated and `how` is a valid open_how of the size passed; both
    // outlive the call, which writes no memory.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(e);
        }
        // Before Linux 5.6: at least the last component is not followed.
        // SAFETY: as above; open with these flags takes no mode argument.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        i64::from(fd)
    } else {
        fd
    };
    // SAFETY: the descriptor was just opened here and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[allow(unsafe_code)]
fn is_dir(fd: &OwnedFd) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a stat into the live buffer; it is read only when the call succeeded.
    let rc = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: fstat succeeded, so `st` is initialized.
    let st = unsafe { st.assume_init() };
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// The seccomp filter that denies the network: `socket` and `socketpair` for any family but
/// `AF_UNIX`, and `io_uring` (which opens sockets without those calls) fail with `EPERM`.
/// Other architectures' system calls (32-bit x86 on x86-64) kill the process, since the filter
/// cannot see their numbers.
pub fn network_filter() -> Result<BpfProgram, ConfineError> {
    let err = |e: seccompiler::BackendError| ConfineError::Seccomp(e.to_string());
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(err)?;
    let not_unix = || -> Result<Vec<SeccompRule>, ConfineError> {
        Ok(vec![
            SeccompRule::new(vec![
                SeccompCondition::new(
                    0,
                    SeccompCmpArgLen::Dword,
                    SeccompCmpOp::Ne,
                    libc::AF_UNIX as u64,
                )
                .map_err(err)?,
            ])
            .map_err(err)?,
        ])
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut add = |nr: i64, r: Vec<SeccompRule>| {
        // x32 system calls share the x86-64 audit arch but carry this bit in their number.
        if cfg!(target_arch = "x86_64") {
            rules.insert(nr | 0x4000_0000, r.clone());
        }
        rules.insert(nr, r);
    };
    add(libc::SYS_socket, not_unix()?);
    add(libc::SYS_socketpair, not_unix()?);
    for nr in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        add(nr, Vec::new());
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(err)?;
    BpfProgram::try_from(filter).map_err(err)
}

/// The capabilities a command keeps when it runs as root: Docker's default set without
/// `CAP_MKNOD` and `CAP_NET_RAW`. Gone in particular: `CAP_SYS_PTRACE` (with it, root reads a
/// non-dumpable podhost's `/proc/<pid>/environ`, which Landlock does not stop for reads),
/// `CAP_DAC_READ_SEARCH` (`open_by_handle_at` opens files without a path), `CAP_MKNOD` (a block
/// device in the workspace reads the disk under every path rule), `CAP_SYS_RESOURCE` (raising the
/// limits back), `CAP_SYS_ADMIN`, `CAP_SYS_MODULE`, `CAP_SYS_RAWIO`, `CAP_NET_ADMIN`, `CAP_BPF`.
pub const ROOT_KEEPS: [u32; 12] = [
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    5,  // CAP_KILL (signals outside the sandbox are still scoped away)
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    8,  // CAP_SETPCAP
    10, // CAP_NET_BIND_SERVICE
    18, // CAP_SYS_CHROOT
    29, // CAP_AUDIT_WRITE
    31, // CAP_SETFCAP
];

/// A command's confinement, prepared in the supervisor before `fork` and applied in the child.
#[derive(Debug, Default)]
pub struct Prepared {
    ruleset: Option<OwnedFd>,
    filter: Option<BpfProgram>,
    user: Option<CommandUser>,
    /// The highest capability number, when the command will run as root and must shed
    /// capabilities (`None`: it does not run as root).
    root_caps_up_to: Option<u32>,
}

impl Prepared {
    /// Builds the Landlock ruleset (opening every rule's path now) and the seccomp filter.
    pub fn new(c: &Confine) -> Result<Self, ConfineError> {
        let ruleset = match &c.landlock {
            Some(spec) => Option::<OwnedFd>::from(ruleset(spec, c.deny_network)?),
            None => None,
        };
        let filter = if c.deny_network {
            Some(network_filter()?)
        } else {
            None
        };
        let root_caps_up_to = (nix::unistd::geteuid().is_root() && c.user.is_none()).then(|| {
            fs::read_to_string("/proc/sys/kernel/cap_last_cap")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(63)
        });
        Ok(Prepared {
            ruleset,
            filter,
            user: c.user,
            root_caps_up_to,
        })
    }

    /// Drops to the command user: supplementary groups cleared, then gid, then uid. Runs in the
    /// forked child, before anything that a credential change resets (the parent-death signal).
    #[allow(unsafe_code)]
    pub fn switch_user(&self) -> io::Result<()> {
        let Some(user) = self.user else {
            return Ok(());
        };
        // SAFETY: plain system calls on integers and a null list (setgroups with size 0);
        // async-signal-safe. Raw calls, not glibc's wrappers: the child has one thread, and
        // glibc's set*id broadcast machinery is not async-signal-safe.
        unsafe {
            if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, user.gid, user.gid, user.gid) != 0
                || libc::syscall(libc::SYS_setresuid, user.uid, user.uid, user.uid) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Sheds every capability but [`ROOT_KEEPS`] from the bounding, inheritable and ambient sets
    /// of a command that runs as root, so that its `exec` gets no more. Async-signal-safe.
    #[allow(unsafe_code)]
    fn shed_root_capabilities(last: u32) -> io::Result<()> {
        let keep = |cap: u32| ROOT_KEEPS.contains(&cap);
        for cap in (0..=last).filter(|c| !keep(*c)) {
            // SAFETY: a plain prctl on integers. EINVAL (a capability this kernel lacks) is fine.
            let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: a plain prctl on integers.
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
                0,
                0,
                0,
            );
        }
        // The kernel's version-3 header and two 32-bit words per set.
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        let mut header = Header {
            version: 0x2008_0522,
            pid: 0,
        };
        let mut data = [Data {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        // SAFETY: capget fills two `Data` words for a version-3 header; both are live.
        if unsafe {
            libc::syscall(
                libc::SYS_capget,
                &mut header as *mut Header,
                data.as_mut_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        let mut mask = [0u32; 2];
        for cap in ROOT_KEEPS {
            mask[(cap / 32) as usize] |= 1 << (cap % 32);
        }
        for (d, m) in data.iter_mut().zip(mask) {
            d.inheritable &= m;
        }
        // SAFETY: as above; capset reads the header and two `Data` words.
        if unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) }
            != 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sheds root's capabilities (see [`ROOT_KEEPS`]), then enforces the Landlock ruleset, then
    /// the seccomp filter. Runs in the forked child, last, after `no_new_privs`.
    #[allow(unsafe_code)]
    pub fn restrict(&self) -> io::Result<()> {
        if let Some(last) = self.root_caps_up_to {
            Self::shed_root_capabilities(last)?;
        }
        if let Some(fd) = &self.ruleset {
            // SAFETY: a plain system call on a descriptor this process owns.
            let rc =
                unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some(filter) = &self.filter {
            seccompiler::apply_filter(filter).map_err(io::Error::other)?;
        }
        Ok(())
    }
}

/// Whether this process is non-dumpable.
pub fn is_non_dumpable() -> bool {
    nix::sys::prctl::get_dumpable().is_ok_and(|d| !d)
}

/// What [`harden_process`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hardened {
    pub non_dumpable: bool,
    /// Names of the secret variables removed from podhost's environment.
    pub scrubbed: Vec<String>,
}

/// Makes podhost non-dumpable and removes secret variables (`PODHOST_*` and `NYLORUN_*` names
/// holding TOKEN, KEY, SECRET, PASSWORD or CREDENTIAL) from its environment, overwriting their
/// values in place first.
///
/// Call it in `main` of every front but the supervisor, after the configuration has been read
/// and before any other thread exists (changing the environment is not thread-safe).
pub fn harden_process() -> Hardened {
    let non_dumpable = nix::sys::prctl::set_dumpable(false).is_ok();
    let names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| is_secret_name(k))
        .collect();
    for name in &names {
        scrub_env(name);
    }
    Hardened {
        non_dumpable,
        scrubbed: names,
    }
}

/// Reads a secret from the environment and scrubs it (see [`harden_process`] for when this may
/// be called): for a variable a front names at run time, such as a model API key.
pub fn take_secret_env(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    scrub_env(name);
    value
}

fn is_secret_name(name: &str) -> bool {
    (name.starts_with("PODHOST_") || name.starts_with("NYLORUN_"))
        && SECRET_WORDS.iter().any(|w| name.contains(w))
}

/// Overwrites the variable's value where it lies (in the initial block `/proc/<pid>/environ`
/// shows, for a variable podhost was started with) and removes it.
#[allow(unsafe_code)]
fn scrub_env(name: &str) {
    let Ok(c) = CString::new(name) else {
        return;
    };
    // SAFETY: single-threaded by the caller's contract, so no one else reads or writes the
    // environment meanwhile. getenv returns a pointer to the NUL-terminated value inside the
    // environment (the initial block on the stack, or a setenv allocation), which is writable;
    // its bytes are overwritten up to, not including, the NUL, so the string stays terminated.
    unsafe {
        let value = libc::getenv(c.as_ptr());
        if !value.is_null() {
            let len = libc::strlen(value);
            std::ptr::write_bytes(value, b'*', len);
        }
        std::env::remove_var(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn spec(read: &[&Path], write: &[&Path], hidden: &[&Path]) -> Landlock {
        let v = |ps: &[&Path]| ps.iter().map(|p| p.to_path_buf()).collect();
        Landlock {
            abi: TARGET_ABI,
            read: v(read),
            write: v(write),
            hidden: v(hidden),
            names_visible: Vec::new(),
            scoped: false,
        }
    }

    fn sorted(rules: Vec<Rule>) -> Vec<(String, Grant)> {
        let mut v: Vec<_> = rules
            .into_iter()
            .map(|r| (r.path.to_string_lossy().into_owned(), r.grant))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_grant_above_a_hidden_path_is_split_around_it_and_exceptions_stay() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        for d in ["a", "data/sessions/mine", "data/sessions/other", "data/x"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        fs::write(root.join("data/db.sqlite"), "").unwrap();
        fs::write(root.join("f"), "").unwrap();
        let data = root.join("data");
        let mine = root.join("data/sessions/mine");
        let rules = expand(&spec(&[&root], &[&mine], &[&data])).unwrap();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        assert_eq!(
            sorted(rules),
            vec![
                (s(&root.join("a")), Grant::Read),
                (s(&mine), Grant::Write),
                (s(&root.join("f")), Grant::Read),
            ]
        );
    }

    #[test]
    fn a_symlink_next_to_a_hidden_path_does_not_carry_a_grant_onto_it() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(root.join("secret/inner")).unwrap();
        fs::create_dir_all(root.join("ok")).unwrap();
        std::os::unix::fs::symlink(root.join("secret/inner"), root.join("link-in")).unwrap();
        std::os::unix::fs::symlink(root.join("secret"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(&root, root.join("loop")).unwrap();
        std::os::unix::fs::symlink(root.join("ok"), root.join("link-ok")).unwrap();
        let secret = root.join("secret");
        let rules = expand(&spec(&[&root], &[], &[&secret])).unwrap();
        // `link-ok` is granted by its target (`ok`, already there); `loop` re-enters the split
        // root once and stops.
        assert_eq!(
            sorted(rules),
            vec![
                (root.join("ok").to_string_lossy().into_owned(), Grant::Read),
                (root.join("ok").to_string_lossy().into_owned(), Grant::Read),
            ]
        );
    }

    #[test]
    fn directories_above_names_visible_hidden_paths_stay_listable() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        for d in ["harness", "data", "etc"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        let harness = root.join("harness");
        let data = root.join("data");
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let mut visible = spec(&[&root], &[], &[&harness]);
        visible.names_visible = vec![harness.clone()];
        assert_eq!(
            sorted(expand(&visible).unwrap()),
            vec![
                (s(&root), Grant::List),
                (s(&root.join("data")), Grant::Read),
                (s(&root.join("etc")), Grant::Read),
            ]
        );
        // One strictly hidden directory beneath makes the parent unlistable.
        visible.hidden.push(data.clone());
        assert_eq!(
            sorted(expand(&visible).unwrap()),
            vec![(s(&root.join("etc")), Grant::Read)]
        );
    }

    #[test]
    fn nothing_hidden_means_one_rule_per_grant() {
        let rules = expand(&spec(&[Path::new("/")], &[Path::new("/tmp")], &[])).unwrap();
        assert_eq!(
            sorted(rules),
            vec![
                ("/".to_owned(), Grant::Read),
                ("/tmp".to_owned(), Grant::Write)
            ]
        );
    }

    #[test]
    fn a_hidden_path_that_does_not_exist_yet_is_hidden_when_it_appears() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        fs::create_dir(root.join("a")).unwrap();
        let later = canonical_lenient(&root.join("later/../later/join"));
        assert_eq!(later, root.join("later/join"));
        let rules = expand(&spec(&[&root], &[], &[&later])).unwrap();
        // `root` is split (`later` does not exist, so it gets no rule); when it appears, nothing
        // grants it.
        assert_eq!(
            sorted(rules),
            vec![(root.join("a").to_string_lossy().into_owned(), Grant::Read)]
        );
    }

    #[test]
    fn secret_names() {
        for name in [
            "PODHOST_TOKEN",
            "PODHOST_MODEL_API_KEY",
            "NYLORUN_HOST_TOKEN",
            "NYLORUN_JOIN_SECRET",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "PODHOST_WORKSPACE",
            "NYLORUN_SANDBOX_ID",
            "GITHUB_TOKEN",
            "PATH",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn the_network_filter_compiles() {
        assert!(!network_filter().unwrap().is_empty());
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
