//! The init of `podhost tool bash`'s PID namespace: a process that shares podhost's memory,
//! makes the command's mount and IPC namespaces and mounts its `/proc` while podhost prepares
//! the call, holds the namespaces open while the command runs, and takes every process of them
//! down with itself when podhost dies (see `exec::oneshot`).
//!
//! Owns: starting the init (`clone(CLONE_VM | CLONE_NEWPID)`: PID 1 of a new namespace), what
//! it does (make the namespaces, mount `/proc`, then nothing but wait), moving podhost into its
//! mount and IPC namespaces ([`Init::join`]) and podhost's next children into its PID namespace
//! ([`Init::enter`], only once the `/proc` is there: no way back is needed, which a user
//! namespace of podhost's own would not allow), and what podhost asks of it: SIGTERM to every
//! process of the namespace, whether any is left, whether the init still runs, and its end,
//! which kills them all.
//!
//! How it works:
//! * The kernel does the killing. When a namespace's init ends, every process in it gets
//!   SIGKILL, and the init is reaped only once they are all gone. `kill(-1, …)` from the init
//!   reaches every process of its namespace and no other. So the tree is whole however it was
//!   made (`setsid`, double forks, a process that ignores SIGTERM), and no `/proc` walk is
//!   needed to find the tree.
//! * The init's first work is on the other CPU. podhost starts it as soon as it knows its
//!   command gets a view (`oneshot::start_early`); the init then makes fresh mount and IPC
//!   namespaces (`unshare`, the copy of the host's mount tree included), makes every mount
//!   there private, and mounts a `/proc` of its PID namespace over the host's (read-only,
//!   `nosuid`, `nodev`, `noexec`), while podhost reads its configuration and prepares the
//!   call. podhost then joins those namespaces with one `setns` on the init's pidfd and builds
//!   the view there (`session::view`): the command sees its own processes with their own pids,
//!   and none of the host's.
//! * The init dies with podhost: its parent-death signal is SIGKILL. If podhost died before
//!   that was set, the init learns it from its command pipe, whose only writer was podhost: it
//!   reads the pipe's end and returns.
//! * Orphans of the command are re-parented to the init. Its SIGCHLD is ignored, so the kernel
//!   reaps them as they end: its list of children (`/proc/1/task/1/children`) is the list of
//!   what the command left that still runs.
//!
//! Invariants:
//! * The init shares podhost's memory and runs beside it, like a thread with no thread-local
//!   storage of its own: it makes raw system calls only (no C library call, which could write
//!   the shared `errno`), allocates nothing, and touches no memory but its own stack and
//!   constants. Its descriptors are its own (no `CLONE_FILES`): it closes all but its two
//!   pipes, so it holds neither podhost's standard streams nor any copy of the command's output
//!   pipes.
//! * It mounts nothing in a mount namespace it did not make: a refused `unshare`, or a refused
//!   private propagation, and it mounts no `/proc` (which would cover the host's, or reach it).
//! * Processes of the namespace cannot end it: the kernel drops every signal they send to their
//!   namespace's init that it has no handler for, SIGKILL included. Its memory is podhost's,
//!   which is not dumpable, so no command can trace it or read its `/proc` files of memory and
//!   environment.
//!
//! Non-goals: other architectures than x86-64 and AArch64 (elsewhere [`Init::start`] says it
//! cannot, and the command gets a forked supervisor instead); waiting for the shell (podhost's
//! own child, outside the init's reach).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// The init's stack: its frames are a few hundred bytes, and the pages it never touches are
/// never made.
const STACK: usize = 16 * 1024;

/// The byte that asks the init for SIGTERM to every process of its namespace.
const TERM_ALL: u8 = b'T';

/// The init of a PID namespace, started by [`Init::start`]; killed (and so the whole
/// namespace) when dropped.
pub struct Init {
    pid: libc::pid_t,
    /// The CPUs to give back before this process first waits for it (see [`elsewhere`]).
    cpus: Option<Cpus>,
    /// The init's pidfd (`CLONE_PIDFD`): how this process joins its namespaces and sees it end.
    pidfd: OwnedFd,
    /// The write end of the init's command pipe.
    commands: OwnedFd,
    /// The read end of the pipe the init reports on (a [`Report`]); its end is the init's (the
    /// kernel closes the init's descriptors as it starts to exit).
    reports: OwnedFd,
    /// The report, once read.
    report: Option<Report>,
    /// `/proc/1/task/1/children` of the namespace's `/proc`, once entered.
    children: Option<File>,
    /// The init's stack, freed only once the init is reaped.
    stack: Vec<u8>,
    reaped: bool,
}

/// What the init says once it has made its namespaces and mounted `/proc`: two errnos, 0 for
/// done.
#[derive(Clone, Copy, Debug)]
struct Report {
    /// The kernel's refusal of the mount and IPC namespaces, or of their private propagation.
    made: i32,
    /// Why there is no `/proc` of the namespace: the kernel's refusal of the mount (`made`'s
    /// errno when no mount was tried).
    proc_fs: i32,
}

/// Why this process is not in the init's mount and IPC namespaces ([`Init::join`]).
#[derive(Debug)]
pub enum NotJoined {
    /// The kernel refused to make them (its errno): it would refuse this process too.
    Refused(i32),
    /// The init ended before it said, or this kernel cannot join namespaces by a pidfd
    /// (before Linux 5.8): nothing changed for this process, which may make them itself.
    Failed(io::Error),
}

/// How the init's argument packs its two descriptors and one flag into a number: the command
/// pipe in the low [`FD_BITS`], the report pipe in the next, then the flag.
/// (31 bits on the 64-bit architectures the init runs on.)
const FD_BITS: u32 = usize::BITS / 2 - 1;
/// The flag: act as if the kernel refused the `/proc` mount (the failpoint
/// `oneshot.proc_refused`).
const REFUSE_PROC: usize = 1 << (2 * FD_BITS);

impl Init {
    /// Starts the init in a new PID namespace. Beside this process, it makes fresh mount and
    /// IPC namespaces and mounts its PID namespace's `/proc` there (see the module doc), or
    /// acts as if the kernel had refused the mount when `refuse_proc`; [`join`](Self::join)
    /// and [`enter`](Self::enter) take what it made. The caller is single-threaded (the init
    /// dies with the thread that started it). `Err` on another architecture or where the kernel
    /// refuses the namespace: nothing was started.
    #[allow(unsafe_code)]
    pub fn start(refuse_proc: bool) -> io::Result<Init> {
        if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        let (read, write) = super::sys::pipe()?;
        let (reports, report) = super::sys::pipe()?;
        let mut arg = read.as_raw_fd() as usize | (report.as_raw_fd() as usize) << FD_BITS;
        if refuse_proc {
            arg |= REFUSE_PROC;
        }
        let mut stack: Vec<u8> = Vec::with_capacity(STACK);
        // 16-byte aligned, growing down.
        let top = (stack.as_mut_ptr() as usize + STACK) & !15;
        let mut pidfd: libc::c_int = -1;
        // SAFETY: `entry` runs on `stack`, which this value keeps until the init is reaped; it
        // makes raw system calls only and touches no memory but its stack and constants (see
        // the module's invariants), so running beside this process in its address space is
        // sound. The argument is a number, not a pointer; the kernel writes the pidfd into
        // `pidfd` (the parent-tid argument, which CLONE_PIDFD takes) before clone returns.
        let pid = unsafe {
            libc::clone(
                entry,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::CLONE_NEWPID | libc::CLONE_PIDFD | libc::SIGCHLD,
                arg as *mut libc::c_void,
                &raw mut pidfd,
            )
        };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a close-on-exec descriptor the kernel just made for this process.
        let pidfd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(pidfd) };
        let cpus = elsewhere(pid);
        Ok(Init {
            pid,
            cpus,
            pidfd,
            commands: write,
            reports,
            report: None,
            children: None,
            stack,
            reaped: false,
        })
    }

    /// The init's report, waited for the first time.
    fn report(&mut self) -> io::Result<Report> {
        if let Some(report) = self.report {
            return Ok(report);
        }
        if let Some(cpus) = self.cpus.take() {
            everywhere(self.pid, &cpus);
        }
        let Ok([made, proc_fs]) = super::sys::read_two_words(self.reports.as_raw_fd())? else {
            return Err(io::Error::other(
                "the init ended before it made the command's namespaces",
            ));
        };
        let report = Report { made, proc_fs };
        self.report = Some(report);
        Ok(report)
    }

    /// Moves this process into the mount and IPC namespaces the init made, once it has said
    /// so (with its `/proc` mounted there, or refused): one `setns` on its pidfd. This
    /// process's root and working directory become the namespace's root. Needs a
    /// single-threaded caller (the kernel refuses a mount namespace to a process that shares
    /// its file-system context).
    #[allow(unsafe_code)]
    pub fn join(&mut self) -> Result<(), NotJoined> {
        let report = self.report().map_err(NotJoined::Failed)?;
        if report.made != 0 {
            return Err(NotJoined::Refused(report.made));
        }
        // SAFETY: setns on a descriptor owned here.
        let rc = unsafe {
            libc::setns(
                self.pidfd.as_raw_fd(),
                libc::CLONE_NEWNS | libc::CLONE_NEWIPC,
            )
        };
        if rc != 0 {
            return Err(NotJoined::Failed(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Makes this process's next children be born in the init's PID namespace (`setns`), once
    /// this process has [joined](Self::join) its mount namespace and the init has mounted the
    /// namespace's `/proc` there. `Err` with the kernel's refusal of the mount, of the list of
    /// the init's children (a kernel without such lists) or of the `setns`: nothing changed for
    /// this process then, and its `/proc` is the host's again.
    #[allow(unsafe_code)]
    pub fn enter(&mut self) -> io::Result<()> {
        let report = self.report()?;
        if report.proc_fs != 0 {
            return Err(io::Error::from_raw_os_error(report.proc_fs));
        }
        let entered = (|| {
            let children = File::open("/proc/1/task/1/children")?;
            // SAFETY: setns on a descriptor owned here.
            if unsafe { libc::setns(self.pidfd.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(children)
        })();
        match entered {
            Ok(children) => {
                self.children = Some(children);
                Ok(())
            }
            Err(e) => {
                // The host's /proc back, for the caller's fallback.
                let _ = super::sys::unmount_detached(c"/proc");
                Err(e)
            }
        }
    }

    /// Whether the init still runs: it ends only when podhost ends it, unless something outside
    /// killed it (then the kernel kills every process of the namespace). Asked only once its
    /// report was read ([`enter`](Self::enter)), which would look like its end before.
    pub fn alive(&self) -> bool {
        super::sys::poll_now(self.reports.as_raw_fd(), libc::POLLIN) == 0
    }

    /// SIGTERM to every process of the namespace but the init.
    pub fn term_all(&self) {
        let _ = super::sys::write_all(self.commands.as_raw_fd(), &[TERM_ALL]);
    }

    /// Whether any process the command started still runs (or has ended and is not reaped yet):
    /// the init's children are every orphan of the command. `true` when the list cannot be read.
    pub fn children_left(&self) -> bool {
        let mut buf = [0u8; 16];
        let Some(children) = &self.children else {
            return true;
        };
        !matches!(children.read_at(&mut buf, 0), Ok(0))
    }

    /// Leaves the init to end with this process (its parent-death signal), once nothing but
    /// the init runs in its namespace, and this process is about to exit (`podhost tool`
    /// answers and ends). The teardown of what the init shares with this process — its memory,
    /// its mount namespace — and of the PID namespace is then the init's, after this process
    /// has ended, instead of this process's before. Its stack and descriptors stay.
    pub fn detach(self) {
        std::mem::forget(self);
    }

    /// Ends the init, and with it every process of the namespace; returns once it is reaped (the
    /// namespace is empty then) or after `cap` (a process stuck in the kernel holds it: it dies
    /// when it returns). `reap_too`: a child of the caller in the namespace that may not be
    /// reaped yet (the shell): reaped here too, since the namespace cannot empty while its
    /// zombie holds a pid.
    pub fn end(&mut self, reap_too: Option<libc::pid_t>, cap: Duration) {
        if self.reaped {
            return;
        }
        super::sys::kill_now(self.pid);
        let mut other = reap_too;
        let until = Instant::now() + cap;
        loop {
            if let Some(pid) = other
                && matches!(super::sys::wait(pid, libc::WNOHANG), Ok((p, _)) if p == pid)
            {
                other = None;
            }
            match super::sys::wait(self.pid, libc::WNOHANG) {
                Ok((0, _)) => {}
                // Reaped, or not a child any more (cannot happen).
                _ => break,
            }
            let now = Instant::now();
            if now >= until {
                tracing::warn!("a command's PID namespace is still not empty after {cap:?}");
                // The init may still run on its stack: it stays allocated.
                std::mem::forget(std::mem::take(&mut self.stack));
                return;
            }
            // The shell's zombie holds a pid of the namespace until it is reaped: look again
            // soon while it is left.
            let step = match other {
                Some(_) => Duration::from_millis(1),
                None => until - now,
            };
            // Readable once the init has ended, which is once the namespace is empty.
            super::sys::poll_for(self.pidfd.as_raw_fd(), libc::POLLIN, step);
        }
        self.reaped = true;
    }
}

impl Drop for Init {
    fn drop(&mut self) {
        self.end(None, Duration::from_secs(10));
    }
}

/// CPUs a process may run on, as `sched_setaffinity` takes them.
pub(super) struct Cpus(libc::cpu_set_t);

/// Moves `pid` (a process just started beside this one) off this process's CPU, onto the
/// others it may run on: the kernel queues a new process on its parent's CPU, where it would
/// wait until this process sleeps, instead of doing its work beside it on an idle one. Returns
/// the CPUs it had, for [`everywhere`] to give back before this process waits for it: where
/// the other CPUs are busy, it may then run here, or on whichever CPU goes idle first. `None`
/// (nothing changed) where this process may run on one CPU only.
#[allow(unsafe_code)]
pub(super) fn elsewhere(pid: libc::pid_t) -> Option<Cpus> {
    // SAFETY: sched_getcpu reads the current CPU; the sets are plain bit arrays written by the
    // kernel, then read and passed back to it.
    unsafe {
        let here = libc::sched_getcpu();
        let mut all: libc::cpu_set_t = std::mem::zeroed();
        if here < 0 || libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut all) != 0 {
            return None;
        }
        let mut others = all;
        libc::CPU_CLR(here as usize, &mut others);
        if libc::CPU_COUNT(&others) == 0
            || libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), &others) != 0
        {
            return None;
        }
        Some(Cpus(all))
    }
}

/// Gives `pid` back the CPUs [`elsewhere`] took from it; a refusal (it has ended) is nothing.
#[allow(unsafe_code)]
pub(super) fn everywhere(pid: libc::pid_t, cpus: &Cpus) {
    // SAFETY: passes a plain bit array the kernel reads.
    unsafe {
        libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), &cpus.0);
    }
}

/// The init's first work: fresh mount and IPC namespaces, every mount private, and its PID
/// namespace's `/proc` (or an `EPERM` for it when `refuse_proc`). The kernel's return values
/// (0 or a negative errno) for the namespaces and for `/proc`, which is not tried without them.
/// Raw system calls only (see the module's invariants).
fn make_namespaces(refuse_proc: bool) -> (isize, isize) {
    let mut made = raw::syscall(
        libc::SYS_unshare as usize,
        [
            (libc::CLONE_NEWNS | libc::CLONE_NEWIPC) as usize,
            0,
            0,
            0,
            0,
        ],
    );
    if made == 0 {
        // Before any mount: nothing mounted here may propagate to the namespace it came from.
        made = raw::syscall(
            libc::SYS_mount as usize,
            [
                0,
                c"/".as_ptr() as usize,
                0,
                (libc::MS_REC | libc::MS_PRIVATE) as usize,
                0,
            ],
        );
    }
    let mounted = if made != 0 {
        // Not in a mount namespace of its own: no mount at all.
        made
    } else if refuse_proc {
        -libc::EPERM as isize
    } else {
        raw::syscall(
            libc::SYS_mount as usize,
            [
                c"proc".as_ptr() as usize,
                c"/proc".as_ptr() as usize,
                c"proc".as_ptr() as usize,
                (libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC) as usize,
                0,
            ],
        )
    };
    (made, mounted)
}

/// The init: makes its mount and IPC namespaces and mounts its PID namespace's `/proc` there,
/// says how that went, closes every descriptor but its two pipes, has its orphans reaped by the
/// kernel, dies with its parent, and runs each command it reads until the pipe's end. `arg`
/// packs its descriptors (see [`FD_BITS`]). Raw system calls only (see the module's
/// invariants).
extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
    let arg = arg as usize;
    let mask = (1 << FD_BITS) - 1;
    let (pipe, report) = (arg & mask, (arg >> FD_BITS) & mask);
    let (made, mounted) = make_namespaces(arg & REFUSE_PROC != 0);
    // 0, or the errno of the refusal, for each.
    let errno = |ret: isize| (-ret.min(0)) as i32;
    let words: [i32; 2] = [errno(made), errno(mounted)];
    raw::syscall(
        libc::SYS_write as usize,
        [report, words.as_ptr() as usize, size_of_val(&words), 0, 0],
    );
    // All descriptors but the two pipes: podhost's standard streams and anything else it held.
    // The report pipe stays open while the init lives: its end tells podhost the init ended.
    let (low, high) = (pipe.min(report), pipe.max(report));
    if low > 0 {
        raw::syscall(libc::SYS_close_range as usize, [0, low - 1, 0, 0, 0]);
    }
    if high > low + 1 {
        raw::syscall(libc::SYS_close_range as usize, [low + 1, high - 1, 0, 0, 0]);
    }
    raw::syscall(
        libc::SYS_close_range as usize,
        [high + 1, u32::MAX as usize, 0, 0, 0],
    );
    // An all-zero kernel sigaction but the handler: SIG_IGN (1), no flags, an empty mask.
    let ignore: [usize; 4] = [1, 0, 0, 0];
    raw::syscall(
        libc::SYS_rt_sigaction as usize,
        [libc::SIGCHLD as usize, ignore.as_ptr() as usize, 0, 8, 0],
    );
    raw::syscall(
        libc::SYS_prctl as usize,
        [
            libc::PR_SET_PDEATHSIG as usize,
            libc::SIGKILL as usize,
            0,
            0,
            0,
        ],
    );
    let mut byte = 0u8;
    loop {
        let n = raw::syscall(
            libc::SYS_read as usize,
            [pipe, (&raw mut byte) as usize, 1, 0, 0],
        );
        match n {
            1 if byte == TERM_ALL => {
                // -1: every process of this namespace but the init.
                raw::syscall(
                    libc::SYS_kill as usize,
                    [-1isize as usize, libc::SIGTERM as usize, 0, 0, 0],
                );
            }
            1 => {}
            n if n == -(libc::EINTR as isize) => {}
            // The end of the pipe (podhost closed it, or died), or an error: end, and the
            // kernel kills the namespace.
            _ => return 0,
        }
    }
}

/// System calls without the C library: its wrappers set `errno`, which the init would share
/// with podhost's main thread.
#[allow(unsafe_code)]
pub(super) mod raw {
    /// System call `nr` with five arguments; the kernel's return value (a negative errno on
    /// failure).
    #[cfg(target_arch = "x86_64")]
    pub fn syscall(nr: usize, args: [usize; 5]) -> isize {
        let ret: isize;
        // SAFETY: the `syscall` instruction with the kernel's calling convention; it clobbers
        // rcx and r11 only. Every call site passes arguments valid for its system call.
        unsafe {
            std::arch::asm!(
                "syscall",
                inlateout("rax") nr as isize => ret,
                in("rdi") args[0],
                in("rsi") args[1],
                in("rdx") args[2],
                in("r10") args[3],
                in("r8") args[4],
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    /// System call `nr` with five arguments; the kernel's return value (a negative errno on
    /// failure).
    #[cfg(target_arch = "aarch64")]
    pub fn syscall(nr: usize, args: [usize; 5]) -> isize {
        let ret: isize;
        // SAFETY: `svc 0` with the kernel's calling convention (number in x8, arguments and
        // result in x0–x4). Every call site passes arguments valid for its system call.
        unsafe {
            std::arch::asm!(
                "svc 0",
                in("x8") nr,
                inlateout("x0") args[0] as isize => ret,
                in("x1") args[1],
                in("x2") args[2],
                in("x3") args[3],
                in("x4") args[4],
                options(nostack),
            );
        }
        ret
    }

    /// Never called: [`Init::start`](super::Init::start) refuses other architectures first.
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    pub fn syscall(_nr: usize, _args: [usize; 5]) -> isize {
        -(libc::ENOSYS as isize)
    }
}
