//! The system-call filter in front of every command, and the fresh session keyring each session
//! (or, without a session holder, each command) joins (`keyring`).
//!
//! Owns: building the filter ([`syscall_filter`], once per supervisor, before `fork`), installing
//! it ([`install`], in the command's process, last), splitting it between a session's holder and
//! its commands ([`confine_holder`]: the holder runs under all of it but the mounts it still
//! makes, and each command installs only the rest), and what the confinement level says of it
//! ([`filter_available`]).
//!
//! # The filter
//!
//! At least as strict as Docker's default seccomp profile for a container without
//! `CAP_SYS_ADMIN` (the call lists are in `table`): a call the profile allows passes, every
//! other call fails with `EPERM` — the keyring calls (`add_key`, `request_key`, `keyctl`),
//! `bpf`, `userfaultfd`, `perf_event_open`, `io_uring_*`, `kexec_*`, `open_by_handle_at`, the
//! module calls, `mount` and the new mount API, `umount2`, `pivot_root`, `swapon`/`swapoff`,
//! `reboot`, `acct`, `settimeofday`, `clock_settime`, `syslog`, `unshare`, `setns`, and on x86-64
//! `iopl`, `ioperm`, `uselib`, `ustat`, `sysfs`, among others. Like Docker's:
//!
//! * `clone` passes only without a `CLONE_NEW*` flag (the flags are its first argument on every
//!   architecture seccompiler knows; s390 alone puts them second), and `clone3`, whose flags sit
//!   in memory the filter cannot read, fails with `ENOSYS`, so that glibc falls back to `clone`;
//! * `personality` passes only for the values Docker allows (`PER_LINUX`, `PER_LINUX32`, each
//!   with or without `UNAME26`, and the query `0xffffffff`), so `ADDR_NO_RANDOMIZE` and the
//!   other flags that weaken a process are refused;
//! * `socket` passes for every family but `AF_ALG` and `AF_VSOCK`; with the network denied
//!   (`PODHOST_DENY_NETWORK`), `socket` and `socketpair` pass for `AF_UNIX` only;
//! * `adjtimex` and `clock_adjtime` pass (without `CAP_SYS_TIME` the kernel lets them read the
//!   clock only), `ptrace` passes (Landlock scopes it to the command's own processes);
//! * a call numbered above every call the profile knows fails with `ENOSYS`, as runc answers
//!   calls newer than its profile, so a later glibc falls back instead of failing.
//!
//! Calls of another architecture (32-bit x86 on x86-64, AArch32 on AArch64) and x32 calls kill
//! the process: the filter reads numbers of its own architecture only.
//!
//! The program is laid out for speed: the allowed calls are found by a binary search over the
//! ranges of allowed numbers (a few comparisons, not one per call), and the calls whose answer
//! depends on their arguments go on to seccompiler's checks. The kernel caches the calls the
//! filter always allows, so most calls of a command never run it at all.
//!
//! Invariants: the program is built before `fork` and installed with one system call (nothing
//! in the child allocates); a filter that cannot be built or installed fails the command.

mod keyring;
mod table;

pub use keyring::{join_session_keyring, keyrings_available};

use std::collections::BTreeMap;
use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use super::ConfineError;

/// The audit architecture of the calls the filter reads.
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH: u32 = 0xC000_00F3;
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
const AUDIT_ARCH: u32 = 0;

/// x32 calls share x86-64's audit architecture and carry this bit in their number.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The number a tracer sets to skip a call: nothing runs, so there is nothing to refuse.
const SKIPPED_CALL: u32 = u32::MAX;

/// The `clone` flags that make a namespace (Docker's mask; `CLONE_NEWTIME` is `clone3`'s and
/// `unshare`'s only: in `clone`'s flags that bit belongs to the exit signal).
const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// The `personality` values Docker allows: `PER_LINUX`, `PER_LINUX32`, `UNAME26`,
/// `PER_LINUX32|UNAME26`, and the query that changes nothing.
const PERSONALITIES: [u64; 5] = [0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// The argument of `clone` that holds its flags (s390, which seccompiler does not know, would
/// need 1).
const CLONE_FLAGS_ARG: u8 = 0;

/// The two filters, each built at most once per process: a session's holder builds both before
/// its first command (see [`build_ahead`]), so that each supervisor it forks finds them in the
/// memory it was forked with instead of spending a command's time building one.
static BUILT: [OnceLock<BpfProgram>; 2] = [OnceLock::new(), OnceLock::new()];

/// The calls a session's holder still makes under its own filter ([`confine_holder`]): before
/// each command it covers the host's sockets bound since the last one with read-only bind
/// mounts (`session::view`).
const HOLDER_KEEPS: [i64; 2] = [table::SYS_mount, table::SYS_mount_setattr];

/// Set in a session's holder once its own filter is installed; the supervisors it forks
/// inherit the filter and the flag, and give their commands [`rest_filter`] alone.
static UNDER_HOLDER_FILTER: AtomicBool = AtomicBool::new(false);

/// The rest filters (see [`rest_filter`]), built at most once per process, as [`BUILT`].
static RESTS: [OnceLock<BpfProgram>; 2] = [OnceLock::new(), OnceLock::new()];

/// `build` once per process in `slot`, copied after.
fn once(
    slot: &OnceLock<BpfProgram>,
    build: impl FnOnce() -> Result<BpfProgram, ConfineError>,
) -> Result<BpfProgram, ConfineError> {
    if let Some(built) = slot.get() {
        return Ok(built.clone());
    }
    let built = build()?;
    Ok(slot.get_or_init(|| built).clone())
}

/// [`syscall_filter`], built once per process and copied after.
pub fn filter_for(deny_network: bool) -> Result<BpfProgram, ConfineError> {
    once(&BUILT[usize::from(deny_network)], || {
        syscall_filter(deny_network)
    })
}

/// What a command installs on itself: the whole filter ([`filter_for`]), or, under a holder
/// that already runs under all of it but [`HOLDER_KEEPS`], the rest ([`rest_filter`]).
pub fn command_filter(deny_network: bool) -> Result<BpfProgram, ConfineError> {
    if UNDER_HOLDER_FILTER.load(Ordering::Relaxed) {
        once(&RESTS[usize::from(deny_network)], || {
            rest_filter(deny_network)
        })
    } else {
        filter_for(deny_network)
    }
}

/// Builds what the processes this one will fork install on their commands, now; an error is
/// left for the command that needs the filter to report.
pub fn build_ahead() {
    for deny_network in [false, true] {
        let _ = command_filter(deny_network);
    }
}

/// Builds what a command with `deny_network` installs, now, in a process about to fork the
/// command's supervisor (`podhost tool`'s): the fork finds it built instead of building it
/// after the fork, where every page its allocations touch is copied first.
pub fn build_ahead_for(deny_network: bool) {
    let _ = command_filter(deny_network);
}

/// Puts a session's holder under the whole filter but [`HOLDER_KEEPS`] (with the network
/// allowed), once its view and network are built: each command then installs only the rest
/// ([`rest_filter`]), a program of a few instructions that the kernel takes in a fraction of
/// the whole one's time (the kernel checks every call number against a new filter when it
/// installs it). The holder, its supervisors and their commands each run under it; the
/// command under both, which answer every call as the whole filter does (a unit test compares
/// them call by call). Needs `CAP_SYS_ADMIN` in the holder's user namespace, which a holder
/// has; where the kernel refuses, commands keep installing the whole filter.
pub fn confine_holder() -> io::Result<()> {
    let program = holder_filter().map_err(|e| io::Error::other(e.to_string()))?;
    install(&program)?;
    UNDER_HOLDER_FILTER.store(true, Ordering::Relaxed);
    Ok(())
}

/// A session holder's filter and what its commands add with the network denied or not
/// (`deny_network`), as [`confine_holder`] and [`command_filter`] split the whole filter: for
/// `benches/` (the two installations' costs) and tests.
pub fn split_filter(deny_network: bool) -> Result<(BpfProgram, BpfProgram), ConfineError> {
    Ok((holder_filter()?, rest_filter(deny_network)?))
}

/// The holder's filter: the whole filter with the network allowed, and [`HOLDER_KEEPS`].
fn holder_filter() -> Result<BpfProgram, ConfineError> {
    build(false, &HOLDER_KEEPS)
}

/// What a command under a holder's filter adds: `EPERM` for [`HOLDER_KEEPS`] and, with the
/// network denied, for `socket` and `socketpair` of any family but `AF_UNIX`; every other call
/// is left to the holder's filter.
fn rest_filter(deny_network: bool) -> Result<BpfProgram, ConfineError> {
    let err = |e: seccompiler::BackendError| ConfineError::Seccomp(e.to_string());
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(err)?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        HOLDER_KEEPS.iter().map(|nr| (*nr, Vec::new())).collect();
    if deny_network {
        let not_unix = || {
            SeccompCondition::new(
                0,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                libc::AF_UNIX as u64,
            )
            .and_then(|c| SeccompRule::new(vec![c]))
        };
        rules.insert(table::SYS_socket, vec![not_unix().map_err(err)?]);
        rules.insert(table::SYS_socketpair, vec![not_unix().map_err(err)?]);
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

/// Builds the filter for a command: Docker's default profile, plus the network denied when
/// `deny_network` (see the module doc).
pub fn syscall_filter(deny_network: bool) -> Result<BpfProgram, ConfineError> {
    build(deny_network, &[])
}

/// [`syscall_filter`], with the calls `also` allowed too.
fn build(deny_network: bool, also: &[i64]) -> Result<BpfProgram, ConfineError> {
    let err = |e: seccompiler::BackendError| ConfineError::Seccomp(e.to_string());
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(err)?;
    let mut allowed: Vec<u32> = table::ALLOWED
        .iter()
        .flat_map(|calls| calls.iter())
        .map(|(_, nr)| number(*nr))
        .chain(also.iter().map(|nr| number(*nr)))
        .collect();
    if !deny_network {
        allowed.push(number(table::SYS_socketpair));
    }
    allowed.sort_unstable();
    allowed.dedup();
    let checked = argument_rules(deny_network).map_err(err)?;
    let highest = table::ALLOWED
        .iter()
        .chain(table::REFUSED.iter())
        .flat_map(|calls| calls.iter())
        .map(|(_, nr)| number(*nr))
        .chain(checked.keys().map(|nr| number(*nr)))
        .chain([number(table::SYS_clone3)])
        .max()
        .unwrap_or(0);
    let rest = BpfProgram::try_from(
        SeccompFilter::new(
            checked,
            SeccompAction::Errno(libc::EPERM as u32),
            SeccompAction::Allow,
            arch,
        )
        .map_err(err)?,
    )
    .map_err(err)?;

    let mut program = vec![
        load(OFFSET_ARCH),
        jump(libc::BPF_JEQ, AUDIT_ARCH, 1, 0),
        ret(libc::SECCOMP_RET_KILL_PROCESS),
        load(OFFSET_NR),
        jump(libc::BPF_JEQ, SKIPPED_CALL, 0, 1),
        ret(libc::SECCOMP_RET_ALLOW),
    ];
    if cfg!(target_arch = "x86_64") {
        program.push(jump(libc::BPF_JGE, X32_SYSCALL_BIT, 0, 1));
        program.push(ret(libc::SECCOMP_RET_KILL_PROCESS));
    }
    program.extend([
        jump(libc::BPF_JEQ, number(table::SYS_clone3), 0, 1),
        ret(errno(libc::ENOSYS)),
        jump(libc::BPF_JGT, highest, 0, 1),
        ret(errno(libc::ENOSYS)),
    ]);
    program.extend(resolve(search(&segments(&allowed, highest))));
    program.extend(rest);
    if program.len() >= libc::BPF_MAXINSNS as usize {
        return Err(ConfineError::Seccomp(format!(
            "the filter has {} instructions, more than the kernel takes",
            program.len()
        )));
    }
    Ok(program)
}

/// The calls whose answer depends on their arguments, as seccompiler rules (any rule of a call
/// matching lets it through; every condition of a rule must hold).
fn argument_rules(
    deny_network: bool,
) -> Result<BTreeMap<i64, Vec<SeccompRule>>, seccompiler::BackendError> {
    let arg = |index: u8, op: SeccompCmpOp, value: u64| {
        SeccompRule::new(vec![SeccompCondition::new(
            index,
            SeccompCmpArgLen::Dword,
            op,
            value,
        )?])
    };
    let unix = libc::AF_UNIX as u64;
    let mut rules = BTreeMap::new();
    if deny_network {
        rules.insert(table::SYS_socket, vec![arg(0, SeccompCmpOp::Eq, unix)?]);
        rules.insert(table::SYS_socketpair, vec![arg(0, SeccompCmpOp::Eq, unix)?]);
    } else {
        // Every family but AF_ALG (38) and AF_VSOCK (40), as Docker's three rules say it.
        let (alg, vsock) = (libc::AF_ALG as u64, libc::AF_VSOCK as u64);
        rules.insert(
            table::SYS_socket,
            vec![
                arg(0, SeccompCmpOp::Lt, alg)?,
                arg(0, SeccompCmpOp::Eq, alg + 1)?,
                arg(0, SeccompCmpOp::Gt, vsock)?,
            ],
        );
    }
    // The kernel reads the low 32 bits of clone's flags only, which hold every CLONE_NEW* bit.
    rules.insert(
        table::SYS_clone,
        vec![arg(
            CLONE_FLAGS_ARG,
            SeccompCmpOp::MaskedEq(NAMESPACE_FLAGS),
            0,
        )?],
    );
    rules.insert(
        table::SYS_personality,
        PERSONALITIES
            .iter()
            .map(|p| arg(0, SeccompCmpOp::Eq, *p))
            .collect::<Result<_, _>>()?,
    );
    Ok(rules)
}

/// Offsets in the kernel's `struct seccomp_data`.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;

fn number(nr: i64) -> u32 {
    // System-call numbers are small and positive on every architecture.
    u32::try_from(nr).unwrap_or(u32::MAX)
}

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn load(offset: u32) -> sock_filter {
    stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, offset)
}

fn jump(op: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: (libc::BPF_JMP | op | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

fn ret(action: u32) -> sock_filter {
    stmt(libc::BPF_RET | libc::BPF_K, action)
}

fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA)
}

/// The numbers `0..=highest` as runs of allowed and not allowed numbers: `(first, allowed)`.
fn segments(allowed: &[u32], highest: u32) -> Vec<(u32, bool)> {
    let mut runs: Vec<(u32, bool)> = Vec::new();
    for nr in 0..=highest {
        let yes = allowed.binary_search(&nr).is_ok();
        if runs.last().map(|r| r.1) != Some(yes) {
            runs.push((nr, yes));
        }
    }
    runs
}

/// An instruction of the search, or a jump past its end (to the argument checks).
enum Step {
    Insn(sock_filter),
    ToArguments,
}

/// A binary search over `runs` (the loaded number lies within them): allowed runs return
/// `SECCOMP_RET_ALLOW`, the others jump to the argument checks.
fn search(runs: &[(u32, bool)]) -> Vec<Step> {
    match runs {
        [] => vec![Step::ToArguments],
        [(_, true)] => vec![Step::Insn(ret(libc::SECCOMP_RET_ALLOW))],
        [(_, false)] => vec![Step::ToArguments],
        _ => {
            let mid = runs.len() / 2;
            let (low, high) = (search(&runs[..mid]), search(&runs[mid..]));
            let boundary = runs[mid].0;
            let mut out = Vec::with_capacity(low.len() + high.len() + 2);
            match u8::try_from(low.len()) {
                // At or above the boundary: skip the lower half.
                Ok(skip) => out.push(Step::Insn(jump(libc::BPF_JGE, boundary, skip, 0))),
                Err(_) => {
                    out.push(Step::Insn(jump(libc::BPF_JGE, boundary, 0, 1)));
                    out.push(Step::Insn(stmt(
                        libc::BPF_JMP | libc::BPF_JA,
                        low.len() as u32,
                    )));
                }
            }
            out.extend(low);
            out.extend(high);
            out
        }
    }
}

/// The search's instructions, its jumps to the argument checks resolved.
fn resolve(steps: Vec<Step>) -> Vec<sock_filter> {
    let len = steps.len();
    steps
        .into_iter()
        .enumerate()
        .map(|(i, step)| match step {
            Step::Insn(insn) => insn,
            Step::ToArguments => stmt(libc::BPF_JMP | libc::BPF_JA, (len - i - 1) as u32),
        })
        .collect()
}

/// Installs `program` on the calling thread (`no_newprivs` must be set). One system call on a
/// program built earlier: safe in a child forked from a single-threaded process.
#[allow(unsafe_code)]
pub(super) fn install(program: &[sock_filter]) -> io::Result<()> {
    #[repr(C)]
    struct Fprog {
        len: libc::c_ushort,
        filter: *const sock_filter,
    }
    let len =
        u16::try_from(program.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let prog = Fprog {
        len,
        filter: program.as_ptr(),
    };
    // SAFETY: the kernel copies `len` instructions from `filter` during the call; `program` and
    // `prog` outlive it, and seccompiler's `sock_filter` has the kernel's layout (repr(C)).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0 as libc::c_uint,
            &prog as *const Fprog,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this kernel takes the filter: seccomp filters with `SECCOMP_RET_ERRNO`, on an
/// architecture the filter is built for. Asked once.
#[allow(unsafe_code)]
pub fn filter_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let action: u32 = libc::SECCOMP_RET_ERRNO;
        // SAFETY: SECCOMP_GET_ACTION_AVAIL reads one u32 from a live local and writes nothing.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_GET_ACTION_AVAIL,
                0 as libc::c_uint,
                &action as *const u32,
            )
        };
        // Built once: a forked supervisor finds it built (see `filter_for`).
        rc == 0 && filter_for(false).is_ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// The highest system-call number the tables list, allowed or refused.
    fn highest_listed() -> u32 {
        table::ALLOWED
            .iter()
            .chain(table::REFUSED.iter())
            .flat_map(|c| c.iter())
            .map(|(_, nr)| number(*nr))
            .max()
            .unwrap()
    }

    const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
    const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;

    #[test]
    fn a_filter_built_ahead_is_the_one_built_on_demand() {
        build_ahead();
        for deny_network in [false, true] {
            let once = filter_for(deny_network).unwrap();
            assert_eq!(once, syscall_filter(deny_network).unwrap());
            assert_eq!(filter_for(deny_network).unwrap(), once);
        }
        // The two differ (socketpair), so neither slot holds the other's.
        assert_ne!(filter_for(false).unwrap(), filter_for(true).unwrap());
    }

    /// Runs `program` as the kernel would on one call (the instructions the filter uses only).
    fn emulate(program: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let word = |offset: u32| -> u32 {
            match offset {
                OFFSET_NR => nr,
                OFFSET_ARCH => arch,
                16..=63 => {
                    let arg = args[(offset as usize - 16) / 8];
                    // Little-endian: the low half first.
                    if offset.is_multiple_of(8) {
                        arg as u32
                    } else {
                        (arg >> 32) as u32
                    }
                }
                _ => panic!("no field at offset {offset}"),
            }
        };
        let (mut acc, mut pc) = (0u32, 0usize);
        loop {
            let insn = &program[pc];
            pc += 1;
            let code = u32::from(insn.code);
            if code == libc::BPF_LD | libc::BPF_W | libc::BPF_ABS {
                acc = word(insn.k);
            } else if code == libc::BPF_ALU | libc::BPF_AND | libc::BPF_K {
                acc &= insn.k;
            } else if code == libc::BPF_JMP | libc::BPF_JA {
                pc += insn.k as usize;
            } else if code & 0x07 == libc::BPF_JMP && code & 0x08 == libc::BPF_K {
                let taken = match code & 0xf0 {
                    libc::BPF_JEQ => acc == insn.k,
                    libc::BPF_JGT => acc > insn.k,
                    libc::BPF_JGE => acc >= insn.k,
                    other => panic!("jump {other:#x} not emulated"),
                };
                pc += usize::from(if taken { insn.jt } else { insn.jf });
            } else if code == libc::BPF_RET | libc::BPF_K {
                return insn.k;
            } else {
                panic!("instruction {code:#x} not emulated");
            }
        }
    }

    fn call(program: &[sock_filter], nr: i64, args: [u64; 6]) -> u32 {
        emulate(program, AUDIT_ARCH, number(nr), args)
    }

    fn eperm() -> u32 {
        errno(libc::EPERM)
    }

    #[test]
    fn the_filter_compiles_on_this_architecture() {
        for deny_network in [false, true] {
            let program = syscall_filter(deny_network).unwrap();
            assert!(
                program.len() < libc::BPF_MAXINSNS as usize,
                "{}",
                program.len()
            );
        }
        assert!(filter_available());
    }

    /// Every number up to the highest the tables know, with all arguments zero: the allowed
    /// calls pass, `clone3` and unknown newer calls get ENOSYS, every other call EPERM.
    #[test]
    fn every_call_gets_the_answer_its_table_gives() {
        let program = syscall_filter(false).unwrap();
        let allowed: Vec<u32> = table::ALLOWED
            .iter()
            .flat_map(|c| c.iter())
            .map(|(_, nr)| number(*nr))
            .collect();
        // With zero arguments these pass their checks (family AF_UNSPEC, no flags, PER_LINUX).
        let checked_pass = [
            table::SYS_socket,
            table::SYS_socketpair,
            table::SYS_clone,
            table::SYS_personality,
        ]
        .map(number);
        let highest = highest_listed();
        for nr in 0..=highest + 50 {
            let want = if allowed.contains(&nr) || checked_pass.contains(&nr) {
                ALLOW
            } else if nr == number(table::SYS_clone3) || nr > highest {
                errno(libc::ENOSYS)
            } else {
                eperm()
            };
            assert_eq!(emulate(&program, AUDIT_ARCH, nr, [0; 6]), want, "call {nr}");
        }
        for (name, nr) in table::REFUSED.iter().flat_map(|c| c.iter()) {
            assert_eq!(call(&program, *nr, [0; 6]), eperm(), "{name}");
            assert!(
                !allowed.contains(&number(*nr)),
                "{name} is both allowed and refused"
            );
        }
    }

    #[test]
    fn clone_socket_and_personality_depend_on_their_arguments() {
        let open = syscall_filter(false).unwrap();
        let closed = syscall_filter(true).unwrap();
        let flags = |f: i32| [f as u32 as u64, 0, 0, 0, 0, 0];
        let thread = libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID;
        assert_eq!(call(&open, table::SYS_clone, flags(thread)), ALLOW);
        assert_eq!(call(&open, table::SYS_clone, flags(libc::SIGCHLD)), ALLOW);
        for ns in [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWUTS,
            libc::CLONE_NEWIPC,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWCGROUP,
        ] {
            assert_eq!(
                call(&open, table::SYS_clone, flags(ns | libc::SIGCHLD)),
                eperm(),
                "{ns:#x}"
            );
        }
        // High bits the kernel ignores neither hide a namespace flag nor refuse a plain fork.
        let high = 1u64 << 40;
        assert_eq!(
            call(
                &open,
                table::SYS_clone,
                [high | libc::CLONE_NEWNET as u64, 0, 0, 0, 0, 0]
            ),
            eperm()
        );
        assert_eq!(call(&open, table::SYS_clone, [high, 0, 0, 0, 0, 0]), ALLOW);

        let family = |f: i32| [f as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        for f in [
            libc::AF_UNIX,
            libc::AF_INET,
            libc::AF_INET6,
            libc::AF_NETLINK,
            39,
            41,
        ] {
            assert_eq!(
                call(&open, table::SYS_socket, family(f)),
                ALLOW,
                "family {f}"
            );
        }
        for f in [libc::AF_ALG, libc::AF_VSOCK] {
            assert_eq!(
                call(&open, table::SYS_socket, family(f)),
                eperm(),
                "family {f}"
            );
        }
        assert_eq!(
            call(&open, table::SYS_socketpair, family(libc::AF_INET)),
            ALLOW
        );
        for nr in [table::SYS_socket, table::SYS_socketpair] {
            assert_eq!(call(&closed, nr, family(libc::AF_UNIX)), ALLOW);
            for f in [
                libc::AF_INET,
                libc::AF_INET6,
                libc::AF_NETLINK,
                libc::AF_PACKET,
            ] {
                assert_eq!(call(&closed, nr, family(f)), eperm(), "{nr} family {f}");
            }
        }

        for p in PERSONALITIES {
            assert_eq!(
                call(&open, table::SYS_personality, [p, 0, 0, 0, 0, 0]),
                ALLOW
            );
        }
        const ADDR_NO_RANDOMIZE: u64 = 0x0040000;
        const READ_IMPLIES_EXEC: u64 = 0x0400000;
        for p in [
            ADDR_NO_RANDOMIZE,
            READ_IMPLIES_EXEC,
            0x20000 | ADDR_NO_RANDOMIZE,
        ] {
            assert_eq!(
                call(&open, table::SYS_personality, [p, 0, 0, 0, 0, 0]),
                eperm()
            );
        }
    }

    /// What the kernel answers a call under several filters (`stack`, first installed first):
    /// every filter runs and the answer of the highest precedence wins (the signed action
    /// value, lowest first: kill before errno before allow), the latest installed on a tie.
    fn stacked(stack: &[&[sock_filter]], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let precedence = |ret: u32| (ret & libc::SECCOMP_RET_ACTION_FULL) as i32;
        stack
            .iter()
            .rev()
            .map(|program| emulate(program, arch, nr, args))
            .reduce(|best, ret| {
                if precedence(ret) < precedence(best) {
                    ret
                } else {
                    best
                }
            })
            .unwrap()
    }

    /// A command under its holder's filter and the rest it installs is answered, call by call,
    /// as under the whole filter alone: every number up to past the highest known, of this
    /// architecture, of another and with the x32 bit, with the arguments the argument checks
    /// look at (each socket family, namespace and plain clone flags, each personality).
    #[test]
    fn a_holders_filter_and_a_commands_rest_answer_as_the_whole_filter() {
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        let holder = holder_filter().unwrap();
        let mut argument_sets: Vec<[u64; 6]> = (0..=50u64)
            .map(|family| [family, libc::SOCK_STREAM as u64, 0, 0, 0, 0])
            .collect();
        argument_sets.extend(
            [
                libc::SIGCHLD,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                libc::CLONE_NEWNS,
                libc::CLONE_NEWUSER | libc::SIGCHLD,
                libc::CLONE_NEWNET,
            ]
            .map(|f| [f as u32 as u64, 0, 0, 0, 0, 0]),
        );
        argument_sets.extend(PERSONALITIES.map(|p| [p, 0, 0, 0, 0, 0]));
        argument_sets.push([0x0040000, 0, 0, 0, 0, 0]);
        let highest = highest_listed();
        for deny_network in [false, true] {
            let whole = syscall_filter(deny_network).unwrap();
            let rest = rest_filter(deny_network).unwrap();
            assert!(rest.len() * 4 < whole.len(), "{} instructions", rest.len());
            let mut calls: Vec<(u32, u32)> =
                (0..=highest + 50).map(|nr| (AUDIT_ARCH, nr)).collect();
            calls.push((AUDIT_ARCH_I386, 20));
            if cfg!(target_arch = "x86_64") {
                calls.push((AUDIT_ARCH, X32_SYSCALL_BIT | number(libc::SYS_getpid)));
            }
            for (arch, nr) in calls {
                for args in &argument_sets {
                    assert_eq!(
                        stacked(&[&holder, &rest], arch, nr, *args),
                        emulate(&whole, arch, nr, *args),
                        "network denied {deny_network}, arch {arch:#x}, call {nr}, {args:?}"
                    );
                }
            }
            // Alone, the holder's filter lets the holder cover a socket.
            for nr in HOLDER_KEEPS {
                assert_eq!(call(&holder, nr, [0; 6]), ALLOW);
                assert_eq!(
                    stacked(&[&holder, &rest], AUDIT_ARCH, number(nr), [0; 6]),
                    eperm()
                );
            }
        }
    }

    #[test]
    fn calls_of_other_architectures_and_x32_calls_kill_the_process() {
        let program = syscall_filter(false).unwrap();
        const AUDIT_ARCH_I386: u32 = 0x4000_0003;
        const AUDIT_ARCH_ARM: u32 = 0x4000_0028;
        for arch in [AUDIT_ARCH_I386, AUDIT_ARCH_ARM] {
            assert_eq!(emulate(&program, arch, 20, [0; 6]), KILL);
        }
        if cfg!(target_arch = "x86_64") {
            let getpid = number(libc::SYS_getpid);
            assert_eq!(
                emulate(&program, AUDIT_ARCH, X32_SYSCALL_BIT | getpid, [0; 6]),
                KILL
            );
        }
        // A call a tracer skipped runs nothing.
        assert_eq!(emulate(&program, AUDIT_ARCH, SKIPPED_CALL, [0; 6]), ALLOW);
    }

    /// The kernel takes the program: installed on a thread of its own (the filter binds that
    /// thread only, which ends with the test), real calls get the answers the table gives.
    #[test]
    #[allow(unsafe_code)]
    fn the_kernel_enforces_the_filter_on_a_thread() {
        let program = syscall_filter(false).unwrap();
        let answers = std::thread::spawn(move || {
            nix::sys::prctl::set_no_new_privs().unwrap();
            install(&program).unwrap();
            let result = |rc: libc::c_long| {
                if rc < 0 {
                    Err(io::Error::last_os_error().raw_os_error().unwrap())
                } else {
                    Ok(())
                }
            };
            // SAFETY: each call gets integer arguments or null pointers; the filter answers the
            // refused ones before the kernel reads anything, and getppid reads nothing.
            unsafe {
                [
                    result(libc::syscall(libc::SYS_getppid)),
                    result(libc::syscall(
                        libc::SYS_keyctl,
                        keyring::KEYCTL_GET_KEYRING_ID,
                        -3,
                        0,
                    )),
                    result(libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER)),
                    result(libc::syscall(
                        libc::SYS_clone3,
                        std::ptr::null::<u8>(),
                        0usize,
                    )),
                    result(libc::syscall(
                        libc::SYS_io_uring_setup,
                        1,
                        std::ptr::null::<u8>(),
                    )),
                    result(libc::syscall(
                        libc::SYS_socket,
                        libc::AF_VSOCK,
                        libc::SOCK_STREAM,
                        0,
                    )),
                ]
            }
        })
        .join()
        .unwrap();
        assert_eq!(
            answers,
            [
                Ok(()),
                Err(libc::EPERM),
                Err(libc::EPERM),
                Err(libc::ENOSYS),
                Err(libc::EPERM),
                Err(libc::EPERM),
            ]
        );
    }
}
