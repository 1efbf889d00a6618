//! What this host lets podhost build, found by trying (never guessed from versions):
//! `podhost-exec __probe` makes the namespaces and mounts a session holder needs in throw-away
//! children and prints the strongest level that worked, as one JSON line.
//!
//! It runs in the exec'ed helper because podhost itself is non-dumpable, and a non-dumpable
//! process (and every child it forks) cannot write the id maps of a user namespace: the probe
//! must try from the same kind of process the holder is.
//!
//! Owns both sides: the helper's [`main`], and podhost's asking ([`probe_host`],
//! [`probe_namespaces`]) once per process. It sits below the confinement that reads the level
//! (`confine::isolation`) and the sessions that build at it (`session`), and imports neither.
//!
//! Levels, strongest first: mount + PID namespaces made as real root (`root`); the same inside
//! an unprivileged user namespace (`userns`); a user and mount namespace where a fresh `/proc`
//! is refused (Kubernetes' masked `/proc` paths), so no PID namespace (`userns-noproc`); none.

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::exec::protocol::CommandUser;
use crate::exec::sys::{self, StepError};

/// `argv[1]` that makes the supervisor binary print the probe.
pub const PROBE_ARG: &str = "__probe";

/// The namespaces podhost can give commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Namespaces {
    /// Mount, PID and IPC namespaces made by podhost as root.
    Root,
    /// The same inside an unprivileged user namespace.
    Userns,
    /// A user, mount and IPC namespace, without a PID namespace (a fresh `/proc` is refused).
    UsernsNoproc,
    /// None: Landlock alone.
    None,
}

impl Namespaces {
    pub fn as_str(self) -> &'static str {
        match self {
            Namespaces::Root => "root",
            Namespaces::Userns => "userns",
            Namespaces::UsernsNoproc => "userns-noproc",
            Namespaces::None => "none",
        }
    }

    pub fn any(self) -> bool {
        self != Namespaces::None
    }

    pub fn pid_namespace(self) -> bool {
        matches!(self, Namespaces::Root | Namespaces::Userns)
    }

    pub fn user_namespace(self) -> bool {
        matches!(self, Namespaces::Userns | Namespaces::UsernsNoproc)
    }
}

/// What the probe found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    pub namespaces: Namespaces,
    /// Why each stronger level was refused, in words.
    pub refused: Vec<String>,
    /// A network namespace can be made at that level (with its loopback up).
    pub network: bool,
    /// A session's disk can be made and mounted (see `exec::disk`), or why not.
    pub disk: Result<(), String>,
    /// A workspace can be an overlay of a template (see `exec::overlay`) at that level, or why
    /// not.
    #[serde(default = "not_probed")]
    pub overlay: Result<(), String>,
}

fn not_probed() -> Result<(), String> {
    Err("not probed".to_owned())
}

/// `argv[2]` that asks for the namespaces level alone ([`run_namespaces`]): what local use needs.
pub const NAMESPACES_ONLY: &str = "namespaces";

/// The probe's `main`: prints one JSON line.
pub fn main() -> ExitCode {
    sys::close_from(3);
    let mut args = std::env::args_os().skip(2);
    let line = match args.next() {
        Some(a) if a == NAMESPACES_ONLY => serde_json::to_string(&run_namespaces()),
        Some(a) if a == OVERLAY_IN => {
            let dir = args
                .next()
                .map(std::path::PathBuf::from)
                .unwrap_or_default();
            serde_json::to_string(&overlay_in(&dir))
        }
        _ => serde_json::to_string(&run()),
    };
    match line {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(_) => ExitCode::FAILURE,
    }
}

/// `argv[2]` that asks whether an overlay mounts with its upper layer in the directory
/// `argv[3]` ([`probe_overlay_in`]).
pub const OVERLAY_IN: &str = "overlay-in";

/// Whether a session's view can mount an overlay whose upper layer and work directory are in
/// `dir` (some file systems, NFS among them, cannot hold an upper layer), tried once in the
/// helper `helper` at the namespaces level this host allows; or why not.
pub fn probe_overlay_in(helper: &Path, dir: &Path) -> Result<(), String> {
    ask_helper(helper, &[OVERLAY_IN.as_ref(), dir.as_os_str()]).and_then(|answer| answer)
}

/// Runs the probe helper with `args` after its own argument, and reads its JSON answer.
fn ask_helper<T: serde::de::DeserializeOwned>(
    helper: &Path,
    args: &[&std::ffi::OsStr],
) -> Result<T, String> {
    let out = std::process::Command::new(helper)
        .arg(PROBE_ARG)
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => {
            serde_json::from_slice(&out.stdout).map_err(|e| format!("the probe's answer: {e}"))
        }
        Ok(out) => Err(format!("the probe ended with {}", out.status)),
        Err(e) => Err(format!("could not run {}: {e}", helper.display())),
    }
}

/// The helper's side of [`probe_overlay_in`].
fn overlay_in(dir: &Path) -> Result<(), String> {
    let level = run_namespaces().namespaces;
    if !level.any() {
        return Err("no namespaces".to_owned());
    }
    attempt_overlay(dir, level.user_namespace(), level.pid_namespace())
}

/// The level this host allows, asked once per process of the helper binary `helper`
/// (`podhost-exec`, see [`main`]). A helper that cannot be run counts as "no namespaces", with
/// the reason.
pub fn probe_host(helper: &Path) -> Probe {
    static PROBE: OnceLock<Probe> = OnceLock::new();
    PROBE.get_or_init(|| run_probe(helper, &[])).clone()
}

/// The namespaces level alone (no network, no disk: see [`run_namespaces`]), asked once
/// per process: what local use's read-only system needs. A single-threaded process that is
/// still dumpable (a one-shot `podhost tool`, which asks before it hardens itself) tries it in
/// forks of itself, without loading the helper; any other asks the helper, since only a
/// single-threaded process may run code in a fork, and the forks of a non-dumpable one cannot
/// write their user namespace's id maps (they would find none where the helper finds one).
pub fn probe_namespaces(helper: &Path) -> Probe {
    NAMESPACES_PROBE
        .get_or_init(|| {
            crate::failpoint!("probe.namespaces");
            let dumpable = nix::sys::prctl::get_dumpable().unwrap_or(false);
            if dumpable && sys::single_threaded() {
                run_namespaces()
            } else {
                run_probe(helper, &[NAMESPACES_ONLY])
            }
        })
        .clone()
}

/// The answer of [`probe_namespaces`] when it is already known (probed or assumed): what
/// it would return without needing the probe's helper.
pub fn namespaces_known() -> Option<Probe> {
    NAMESPACES_PROBE.get().cloned()
}

/// The answer of [`probe_namespaces`], or the level [`assume_root_namespaces`] set.
static NAMESPACES_PROBE: OnceLock<Probe> = OnceLock::new();
/// Whether [`assume_root_namespaces`] or [`assume_own_namespaces`] set the level.
static NAMESPACES_ASSUMED: AtomicBool = AtomicBool::new(false);

/// For a root process that makes its commands' namespaces itself, in this process, and falls
/// back to none where the kernel refuses them (`podhost tool`, see
/// [`oneshot`](super::oneshot)): the level of [`probe_namespaces`] is taken to be
/// [`Namespaces::Root`] without the probe, whose forks and throw-away namespaces would be on
/// the path of the one command. Returns whether it was; not once the level was probed, nor for
/// a process that is not root or lacks `CAP_SYS_ADMIN` (a container's root without it may still
/// be allowed a user namespace, which only the probe finds).
pub fn assume_root_namespaces() -> bool {
    let sys_admin =
        || sys::effective_capabilities().is_ok_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0);
    if !nix::unistd::geteuid().is_root() || !sys_admin() {
        return false;
    }
    assume(Namespaces::Root)
}

/// For a process that is not root and makes its commands' namespaces itself, in this process,
/// as a root one does ([`assume_root_namespaces`]; `podhost tool bash`): enters a user
/// namespace of its own that maps its uid and gid to themselves
/// ([`sys::enter_own_user_namespace`]), where it holds the capabilities to make a mount and an
/// IPC namespace, without the probe's forks or a session holder. The level of
/// [`probe_namespaces`] is then taken to be [`Namespaces::UsernsNoproc`] (a user, mount and
/// IPC namespace: local use makes no PID namespace) and assumed, so that the kernel's refusal
/// of the mount namespace is a fallback to Landlock alone, as for root. The command, run as the
/// same uid, starts without a capability (an `execve` by a uid other than 0 keeps none).
///
/// Returns whether it was. Not for root, nor once the level was probed, nor in a process that
/// has threads or is no longer dumpable (it could not write its id maps), nor where the kernel
/// refuses the user namespace: then the probe decides, as before.
pub fn assume_own_namespaces() -> bool {
    let dumpable = nix::sys::prctl::get_dumpable().unwrap_or(false);
    if nix::unistd::geteuid().is_root()
        || NAMESPACES_PROBE.get().is_some()
        || !dumpable
        || !sys::single_threaded()
        || sys::enter_own_user_namespace().is_err()
    {
        return false;
    }
    assume(Namespaces::UsernsNoproc)
}

/// Sets the level of [`probe_namespaces`] to `namespaces`, assumed rather than probed; whether
/// it was (not once the level was probed).
fn assume(namespaces: Namespaces) -> bool {
    let assumed = Probe {
        namespaces,
        refused: Vec::new(),
        network: false,
        disk: Err("not probed".to_owned()),
        overlay: not_probed(),
    };
    let set = NAMESPACES_PROBE.set(assumed).is_ok();
    if set {
        NAMESPACES_ASSUMED.store(true, Ordering::Relaxed);
    }
    set
}

/// The capability to make namespaces (and mount) as root, `<linux/capability.h>`.
const CAP_SYS_ADMIN: u32 = 21;

/// Whether the namespaces level was assumed rather than probed (see
/// [`assume_root_namespaces`], [`assume_own_namespaces`]): then the kernel's refusal to make
/// them is a fallback, not a fault.
pub fn namespaces_assumed() -> bool {
    NAMESPACES_ASSUMED.load(Ordering::Relaxed)
}

/// Runs the probe helper with `args` after its own argument.
fn run_probe(helper: &Path, args: &[&str]) -> Probe {
    let none = |why: String| Probe {
        namespaces: Namespaces::None,
        refused: vec![why.clone()],
        network: false,
        disk: Err(why.clone()),
        overlay: Err(why),
    };
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    ask_helper(helper, &args).unwrap_or_else(none)
}

/// The levels to try, strongest first: the level, whether in a user namespace, whether with a
/// PID namespace and `/proc`, and its name in a refusal.
fn levels() -> Vec<(Namespaces, bool, bool, &'static str)> {
    let mut levels = Vec::new();
    if nix::unistd::geteuid().is_root() {
        levels.push((Namespaces::Root, false, true, "namespaces as root"));
    }
    levels.push((Namespaces::Userns, true, true, "a user namespace"));
    levels.push((
        Namespaces::UsernsNoproc,
        true,
        false,
        "a user namespace without /proc",
    ));
    levels
}

/// Tries each level, strongest first, then a network namespace at the level found.
pub fn run() -> Probe {
    let mut refused = Vec::new();
    for (namespaces, userns, pid, what) in levels() {
        if let Err(e) = attempt(userns, pid, false) {
            refused.push(format!("{what}: {e}"));
            continue;
        }
        let network = match attempt(userns, pid, true) {
            Ok(()) => true,
            Err(e) => {
                refused.push(format!("a network namespace: {e}"));
                false
            }
        };
        let disk = if namespaces == Namespaces::Root {
            attempt_disk()
        } else {
            Err("podhost is not root".to_owned())
        };
        let overlay = attempt_overlay(&std::env::temp_dir(), userns, pid);
        return Probe {
            namespaces,
            refused,
            network,
            disk,
            overlay,
        };
    }
    Probe {
        namespaces: Namespaces::None,
        refused,
        network: false,
        disk: Err("no namespaces".to_owned()),
        overlay: Err("no namespaces".to_owned()),
    }
}

/// The strongest level alone, tried as [`run`] tries it, without the network namespace and the
/// disk that only isolated sessions use (local use's read-only system needs neither, and the
/// disk's `mkfs` costs a one-shot `podhost tool` more than its command does).
pub fn run_namespaces() -> Probe {
    let mut refused = Vec::new();
    let not_tried = || Err("not probed".to_owned());
    for (namespaces, userns, pid, what) in levels() {
        match attempt(userns, pid, false) {
            Ok(()) => {
                return Probe {
                    namespaces,
                    refused,
                    network: false,
                    disk: not_tried(),
                    overlay: not_tried(),
                };
            }
            Err(e) => refused.push(format!("{what}: {e}")),
        }
    }
    Probe {
        namespaces: Namespaces::None,
        refused,
        network: false,
        disk: not_tried(),
        overlay: not_tried(),
    }
}

/// Makes a small disk image and mounts it, detached, in a throw-away mount namespace, as a
/// session holder would; the first step that fails, in words.
fn attempt_disk() -> Result<(), String> {
    if !crate::exec::disk::tools_present() {
        return Err("mkfs.ext4 or e2fsck is not installed (e2fsprogs)".to_owned());
    }
    let dir = std::env::temp_dir().join(format!("podhost-probe-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let image = dir.join("probe.img");
    let tried = crate::exec::disk::make_image(&image, 8 << 20)
        .map_err(|e| e.to_string())
        .and_then(|()| in_child(0, "fork", "the probe died", || mount_image(&image)));
    let _ = std::fs::remove_dir_all(&dir);
    tried
}

/// Mounts an overlay of two temporary directories in `base`, as a session holder would, in
/// throw-away namespaces of the level found (as root, with the lower layer idmapped, as the
/// holder maps a template's owner); the first step that fails, in words.
fn attempt_overlay(base: &Path, userns: bool, pid: bool) -> Result<(), String> {
    let dir = base.join(format!(".podhost-probe-overlay-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let made = ["lower", "upper", "work"]
        .iter()
        .try_for_each(|d| std::fs::create_dir(dir.join(d)))
        .map_err(|e| format!("{}: {e}", dir.display()));
    let tried = made.and_then(|()| {
        let (uid, gid) = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let idmap = if userns {
            None
        } else {
            let from = CommandUser { uid, gid };
            let to = CommandUser {
                uid: 65534,
                gid: 65534,
            };
            Some(crate::exec::overlay::idmap(from, to).map_err(|e| e.to_string())?)
        };
        in_child(0, "fork", "the probe died", || {
            if userns {
                sys::enter_user_namespace(uid, gid).map_err(|e| e.to_string())?;
            }
            let mut flags = libc::CLONE_NEWNS;
            if pid {
                flags |= libc::CLONE_NEWPID;
            }
            in_child(
                flags,
                "clone(CLONE_NEWNS)",
                "the namespaced child died",
                || mount_overlay(&dir, idmap.as_ref(), userns),
            )
        })
    });
    let _ = crate::exec::overlay::remove_work_dir(&dir.join("work"));
    let _ = std::fs::remove_dir_all(&dir);
    tried
}

fn mount_overlay(dir: &Path, idmap: Option<&OwnedFd>, userns: bool) -> Result<(), StepError> {
    use crate::exec::overlay;
    sys::mount(
        "make / private",
        None,
        c"/",
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let c = |d: &str| sys::cpath(&dir.join(d));
    let lower = overlay::lower_tree(&c("lower")?, idmap)?;
    let upper = overlay::open_dir("open the upper layer", &c("upper")?)?;
    let work = overlay::open_dir("open the work directory", &c("work")?)?;
    overlay::mount(&lower, &upper, &work, userns).map(drop)
}

fn mount_image(image: &Path) -> Result<(), StepError> {
    sys::unshare("unshare(CLONE_NEWNS)", libc::CLONE_NEWNS)?;
    sys::mount(
        "make / private",
        None,
        c"/",
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| StepError::new("open the image", e.raw_os_error().unwrap_or(libc::EIO)))?;
    let (_device, path) = sys::loop_attach(&std::os::fd::OwnedFd::from(file))?;
    sys::fsmount_ext4(&path, &[c"discard", c"noinit_itable"]).map(drop)
}

/// Runs `f` in a child forked with the clone `flags` (0: a plain fork), `what` naming the fork
/// in its error; `f`'s error, in words, or `died` when the child ended without one.
fn in_child<E: std::fmt::Display>(
    flags: libc::c_int,
    what: &str,
    died: &str,
    f: impl FnOnce() -> Result<(), E>,
) -> Result<(), String> {
    let (rd, wr) = sys::pipe().map_err(|e| format!("pipe: {e}"))?;
    let child = sys::fork_with(what, flags).map_err(|e| e.to_string())?;
    if child == 0 {
        drop(rd);
        let code = match f() {
            Ok(()) => 0,
            Err(e) => {
                let _ = sys::write_all(wr.as_raw_fd(), e.to_string().as_bytes());
                1
            }
        };
        sys::exit_now(code);
    }
    drop(wr);
    let mut why = String::new();
    let _ = std::fs::File::from(rd).read_to_string(&mut why);
    let status = sys::wait(child, 0).map(|(_, s)| s).unwrap_or(-1);
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else if why.is_empty() {
        Err(died.to_owned())
    } else {
        Err(why)
    }
}

/// Makes the namespaces in a child and, in a grandchild inside them, the mounts a view needs
/// (and, with `net`, a network namespace with its loopback up); the first step that fails, in
/// words.
fn attempt(userns: bool, pid: bool, net: bool) -> Result<(), String> {
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    in_child(0, "fork", "the probe died", || {
        in_namespaces(userns, pid, net, uid, gid)
    })
}

fn in_namespaces(userns: bool, pid: bool, net: bool, uid: u32, gid: u32) -> Result<(), String> {
    if userns {
        sys::enter_user_namespace(uid, gid).map_err(|e| e.to_string())?;
    }
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWIPC;
    if pid {
        flags |= libc::CLONE_NEWPID;
    }
    if net {
        flags |= libc::CLONE_NEWNET;
    }
    in_child(
        flags,
        "clone(CLONE_NEWNS|CLONE_NEWPID)",
        "the namespaced child died",
        || mounts(pid).and_then(|()| if net { sys::loopback_up() } else { Ok(()) }),
    )
}

/// The mounts of a view, in miniature: private propagation, a detached copy of a tree, the
/// whole root read-only, a tmpfs, and a fresh `/proc`.
fn mounts(pid: bool) -> Result<(), StepError> {
    sys::mount(
        "make / private",
        None,
        c"/",
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;
    let tree = sys::open_tree("open_tree", c"/etc", true)?;
    sys::mount_setattr(
        "mount_setattr(/, read-only)",
        c"/",
        true,
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
    )?;
    sys::mount(
        "mount tmpfs",
        Some(c"tmpfs"),
        c"/dev",
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(c"size=64k"),
    )?;
    drop(tree);
    if pid {
        sys::mount(
            "mount /proc",
            Some(c"proc"),
            c"/proc",
            Some(c"proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The effective set read with `capget` is the kernel's `CapEff` line for this process.
    #[test]
    fn the_effective_capabilities_are_the_ones_proc_shows() {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .unwrap();
        assert_eq!(
            crate::exec::sys::effective_capabilities().unwrap(),
            u64::from_str_radix(hex.trim(), 16).unwrap()
        );
    }
}
