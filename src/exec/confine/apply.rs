//! Applying a command's confinement in its process: prepared in the supervisor before `fork`
//! ([`Prepared::new`]: the Landlock ruleset opened, the system-call filter built, see
//! `syscalls`), applied in the child with plain system calls only ([`Prepared::switch_user`],
//! [`Prepared::restrict`]).
//!
//! Invariants: every command, on every front, execs under the system-call filter, installed
//! last (after Landlock); nothing in the child allocates or takes a lock; a command asked to
//! hold no capabilities ([`Confine::no_capabilities`], every command on a pod or BYOH host)
//! execs with all five sets empty and the securebits locked, whatever its uid; otherwise a root
//! command sheds every capability but [`ROOT_KEEPS`] before its `exec`.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use seccompiler::BpfProgram;

use super::{ConfineError, Prebuilt, ruleset, syscalls};
use crate::exec::protocol::{CommandUser, Confine};
use crate::exec::sys::{CAP_V3, CapData, CapHeader, capget};

/// Takes `user`'s file-system identity on the calling thread only: no supplementary groups, its
/// fsgid and fsuid (which also drops the thread's file-system capabilities). Raw system calls:
/// glibc's wrappers would change every thread of podhost.
#[allow(unsafe_code)]
pub(super) fn become_user_on_thread(user: CommandUser) -> io::Result<()> {
    // SAFETY: plain system calls on integers and a null list (setgroups with size 0), affecting
    // only this thread's credentials.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0 {
            return Err(io::Error::last_os_error());
        }
        libc::syscall(libc::SYS_setfsgid, user.gid);
        libc::syscall(libc::SYS_setfsuid, user.uid);
        // setfs*id report the previous id, never an error: ask again to see that it took.
        let uid = libc::syscall(libc::SYS_setfsuid, u32::MAX);
        let gid = libc::syscall(libc::SYS_setfsgid, u32::MAX);
        if uid != i64::from(user.uid) || gid != i64::from(user.gid) {
            return Err(io::Error::from_raw_os_error(libc::EPERM));
        }
    }
    Ok(())
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

/// Drops from this process's bounding set every capability no command keeps (all but
/// [`ROOT_KEEPS`]), for a session's holder before its first command: every command it starts
/// drops them anyway (a root one keeps [`ROOT_KEEPS`] at most, a capability-less one none), and
/// each drop is a credentials copy the kernel makes and frees, about a microsecond and a half,
/// 32 of them a command; a command then finds them gone and skips them. The bounding set only
/// bounds what an `exec` may gain, so the holder's own work (mounts, forks) keeps what it had.
/// Without `CAP_SETPCAP` there is nothing to drop; each command then drops what it must.
#[allow(unsafe_code)]
pub fn shed_bounding_set_ahead() {
    for cap in (0..=cap_last_cap()).filter(|c| !ROOT_KEEPS.contains(c)) {
        // SAFETY: a plain prctl on integers; a refusal leaves the capability for each command.
        unsafe {
            libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
        }
    }
}

/// Drops `cap` from the bounding set unless it is gone already (reading it is cheap, dropping
/// copies the credentials); EINVAL (a capability this kernel lacks) is fine. Async-signal-safe.
#[allow(unsafe_code)]
fn drop_from_bounding_set(cap: u32) -> io::Result<()> {
    // SAFETY: plain prctls on integers.
    unsafe {
        if libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) == 0 {
            return Ok(());
        }
        let rc = libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
        if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A command's confinement, prepared in the supervisor before `fork` and applied in the child.
#[derive(Debug)]
pub struct Prepared {
    ruleset: Option<OwnedFd>,
    /// The system-call filter, with the network denied when the request says so.
    filter: BpfProgram,
    user: Option<CommandUser>,
    /// The highest capability number, when the command will run as root and must shed
    /// capabilities (`None`: it does not run as root).
    root_caps_up_to: Option<u32>,
    /// The highest capability number, when the command must hold none at all (and whether this
    /// process may change the bounding set and securebits: it holds `CAP_SETPCAP`).
    drop_all: Option<(u32, bool)>,
}

const CAP_SETPCAP: u32 = 8;
const SECBIT_NOROOT: u64 = 1 << 0;
const SECBIT_NOROOT_LOCKED: u64 = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: u64 = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: u64 = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: u64 = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: u64 = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: u64 = 1 << 7;

/// Sets the calling thread's capability sets.
#[allow(unsafe_code)]
fn capset(data: &[CapData; 2]) -> io::Result<()> {
    let mut header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    // SAFETY: capset reads the header and two `CapData` words; both are live.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Empties the calling thread's effective, permitted and inheritable sets (a file tool's
/// thread, or a command just before its `exec`). Async-signal-safe.
pub(super) fn drop_thread_capabilities() -> io::Result<()> {
    capset(&[CapData::default(); 2])
}

/// The highest capability number of this kernel: read once per process (a session's holder
/// reads it before its first command, see [`shed_bounding_set_ahead`], and every supervisor it
/// forks finds it in memory instead of opening `/proc` again).
fn cap_last_cap() -> u32 {
    static LAST: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LAST.get_or_init(|| {
        fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63)
    })
}

/// What a command's child started ahead of its view (`exec::ahead`) applies on its own, before
/// its Landlock ruleset exists: the system-call filter and, for a command that runs as root, the
/// capabilities it sheds (as [`Prepared`] would have it shed them).
#[derive(Debug)]
pub struct Shedding {
    /// The system-call filter, with the network denied when the request says so.
    pub filter: BpfProgram,
    /// The capabilities to drop from the bounding set (all but [`ROOT_KEEPS`]).
    pub bounding: Vec<u32>,
    /// The sets to `capset` once they are dropped (the inheritable set cut to [`ROOT_KEEPS`]);
    /// `None`: the command does not run as root, and sheds nothing.
    pub caps: Option<[CapData; 2]>,
}

impl Shedding {
    /// `c`'s shedding; `None` for a command that changes user or holds no capability at all,
    /// whose credentials change in ways its filter, installed first, would refuse.
    pub fn new(c: &Confine) -> Result<Option<Self>, ConfineError> {
        if c.user.is_some() || c.no_capabilities {
            return Ok(None);
        }
        let filter = syscalls::command_filter(c.deny_network)?;
        if !nix::unistd::geteuid().is_root() {
            return Ok(Some(Shedding {
                filter,
                bounding: Vec::new(),
                caps: None,
            }));
        }
        let mut caps = capget().map_err(|e| ConfineError::User {
            spec: "capabilities".to_owned(),
            message: format!("could not read this process's capabilities: {e}"),
        })?;
        for (d, m) in caps.iter_mut().zip(root_keeps_mask()) {
            d.inheritable &= m;
        }
        Ok(Some(Shedding {
            filter,
            bounding: (0..=cap_last_cap())
                .filter(|c| !ROOT_KEEPS.contains(c))
                .collect(),
            caps: Some(caps),
        }))
    }
}

/// [`ROOT_KEEPS`] as the two words of a capability set.
fn root_keeps_mask() -> [u32; 2] {
    let mut mask = [0u32; 2];
    for cap in ROOT_KEEPS {
        mask[(cap / 32) as usize] |= 1 << (cap % 32);
    }
    mask
}

impl Prepared {
    /// Builds the Landlock ruleset (opening every rule's path now) and the system-call filter.
    pub fn new(c: &Confine) -> Result<Self, ConfineError> {
        let ruleset = match &c.landlock {
            // In a session, the ruleset its holder built, when it is this command's.
            Some(spec) => {
                match Prebuilt::kept().and_then(|p| p.for_command(spec, c.deny_network)) {
                    Some(fd) => Some(fd),
                    None => Option::<OwnedFd>::from(ruleset(spec, c.deny_network)?),
                }
            }
            None => None,
        };
        let filter = syscalls::command_filter(c.deny_network)?;
        let root = nix::unistd::geteuid().is_root();
        let root_caps_up_to = (root && c.user.is_none() && !c.no_capabilities).then(cap_last_cap);
        let drop_all = c.no_capabilities.then(|| {
            let setpcap = capget().is_ok_and(|d| d[0].effective & (1 << CAP_SETPCAP) != 0);
            (cap_last_cap(), setpcap)
        });
        Ok(Prepared {
            ruleset,
            filter,
            user: c.user,
            root_caps_up_to,
            drop_all,
        })
    }

    /// Empties the bounding and ambient sets and locks the securebits so that no `exec` (of a
    /// setuid-root binary, or as uid 0) can give capabilities back. Needs `CAP_SETPCAP`, so it
    /// runs before the uid changes; without it (a non-root podhost outside a user namespace) the
    /// process holds no capabilities to lose, and `no_new_privs` keeps file capabilities and
    /// setuid bits from adding any. Async-signal-safe.
    #[allow(unsafe_code)]
    fn drop_bounding(&self, last: u32, setpcap: bool) -> io::Result<()> {
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
        if !setpcap {
            return Ok(());
        }
        for cap in 0..=last {
            drop_from_bounding_set(cap)?;
        }
        // Staying uid 0 (asked for): a later setuid must not bring capabilities back either.
        let stay_root = if self.user.is_none() {
            SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED
        } else {
            0
        };
        let bits = SECBIT_NOROOT
            | SECBIT_NOROOT_LOCKED
            | SECBIT_KEEP_CAPS_LOCKED
            | SECBIT_NO_CAP_AMBIENT_RAISE
            | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
            | stay_root;
        // SAFETY: a plain prctl on integers.
        if unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Drops to the command user: supplementary groups cleared, then gid, then uid (and, for a
    /// command that must hold no capabilities, the bounding set and securebits first). Runs in
    /// the forked child, before anything that a credential change resets (the parent-death
    /// signal).
    #[allow(unsafe_code)]
    pub fn switch_user(&self) -> io::Result<()> {
        if let Some((last, setpcap)) = self.drop_all {
            self.drop_bounding(last, setpcap)?;
        }
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
            drop_from_bounding_set(cap)?;
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
        let mut data = capget()?;
        for (d, m) in data.iter_mut().zip(root_keeps_mask()) {
            d.inheritable &= m;
        }
        capset(&data)
    }

    /// The Landlock ruleset, for a child started ahead of it (`exec::ahead`).
    pub fn ruleset(&self) -> Option<&OwnedFd> {
        self.ruleset.as_ref()
    }

    /// Sheds root's capabilities (see [`ROOT_KEEPS`]), then enforces the Landlock ruleset, then
    /// the system-call filter. Runs in the forked child, last, after `no_new_privs`.
    #[allow(unsafe_code)]
    pub fn restrict(&self) -> io::Result<()> {
        if let Some(last) = self.root_caps_up_to {
            Self::shed_root_capabilities(last)?;
        }
        if self.drop_all.is_some() {
            drop_thread_capabilities()?;
        }
        if let Some(fd) = &self.ruleset {
            // SAFETY: a plain system call on a descriptor this process owns.
            let rc =
                unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        syscalls::install(&self.filter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_gets_the_filter() {
        for deny_network in [false, true] {
            let p = Prepared::new(&Confine {
                deny_network,
                ..Confine::default()
            })
            .unwrap();
            assert_eq!(p.filter, syscalls::syscall_filter(deny_network).unwrap());
        }
    }
}
