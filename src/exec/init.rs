//! podhost as a container's PID 1: a minimal init in front of the real podhost.
//!
//! A pod runs its image's entrypoint, `podhost pod`, as PID 1 of the container's PID namespace.
//! PID 1 has two duties nobody else does: every orphan in the namespace becomes its child and
//! must be reaped, or it stays a zombie for the pod's lifetime; and the kernel drops any signal
//! PID 1 has no handler for, so the runtime's SIGTERM would never reach a default disposition.
//! A tokio process cannot reap arbitrary orphans (a `waitpid(-1)` would steal the statuses of
//! its own `tokio::process` children), so PID 1 splits: [`split_if_pid1`] forks before anything
//! else starts; the child continues as the ordinary podhost, and the parent stays a tiny loop
//! that reaps every child and forwards the termination signals to podhost.
//!
//! Invariants:
//! * The split happens before any thread exists (first thing in `main`, before tokio), so the
//!   fork copies a single-threaded process.
//! * No signal is lost: the signals the init waits for are blocked *before* the fork, so one
//!   that arrives between the fork and the first wait stays pending; the child restores the
//!   original mask before it runs anything.
//! * The init exits with podhost's status (its exit code, or 128 + the signal that killed it)
//!   as soon as podhost has ended; the kernel then kills whatever is left in the namespace.
//!
//! Two more things only PID 1 can do early enough:
//! * The init and podhost hold the pod's environment, and commands run as the same uid, which
//!   may read `/proc/<pid>/environ` (and more) of a dumpable process. The init makes itself
//!   non-dumpable before the fork, so both processes' `/proc` entries belong to root; `execve`
//!   resets the flag, so commands stay ordinary processes.
//! * The pod's `HOME` (`/harness/home`) lives on a volume that is mounted empty, so the init
//!   creates it when it is missing, before podhost or any command looks for it.
//!
//! Non-goals: job control, a controlling terminal, restarting podhost, signals other than
//! SIGTERM, SIGINT, SIGHUP and SIGQUIT (the rest are ignored, as a PID 1 without handlers does).

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::process::ExitCode;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid};

use crate::floor::codes::exit;

/// Signals the init passes on to podhost: what a container runtime, a kubelet or a terminal
/// sends to stop the pod.
pub const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// Signals the kernel raises for a fault of the process itself; blocking them would turn a crash
/// of the init into undefined behaviour, so they keep their default action.
const SYNCHRONOUS: [Signal; 7] = [
    Signal::SIGSEGV,
    Signal::SIGBUS,
    Signal::SIGFPE,
    Signal::SIGILL,
    Signal::SIGTRAP,
    Signal::SIGSYS,
    Signal::SIGABRT,
];

/// When this process is PID 1, splits it into the init (which returns `Some(exit code)` once
/// podhost has ended) and podhost (which returns `None` and carries on with `main`). Any other
/// process gets `None` at once.
#[allow(unsafe_code)]
pub fn split_if_pid1() -> Option<ExitCode> {
    if getpid() != Pid::from_raw(1) {
        return None;
    }
    ensure_home();
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("podhost init: could not make the pod host non-dumpable: {e}");
        return Some(ExitCode::from(exit::FAILURE as u8));
    }
    let waited = waited_signals();
    let original = match waited.thread_swap_mask(SigmaskHow::SIG_BLOCK) {
        Ok(mask) => mask,
        Err(e) => {
            eprintln!("podhost init: could not block signals: {e}");
            return Some(ExitCode::from(exit::FAILURE as u8));
        }
    };
    // SAFETY: this runs first thing in `main`, before the tokio runtime or any other thread is
    // started, so the process is single-threaded and the child may run arbitrary code after
    // the fork (no lock can be held by a thread that does not exist in the child).
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            if let Err(e) = original.thread_set_mask() {
                eprintln!("podhost init: could not restore the signal mask: {e}");
                return Some(ExitCode::from(exit::FAILURE as u8));
            }
            None
        }
        Ok(ForkResult::Parent { child }) => Some(ExitCode::from(supervise(child, &waited))),
        Err(e) => {
            eprintln!("podhost init: could not start podhost under an init (fork: {e})");
            Some(ExitCode::from(exit::FAILURE as u8))
        }
    }
}

/// The init's loop: reap every child that ended, forward termination signals to podhost, and
/// return podhost's exit status once it has ended.
fn supervise(podhost: Pid, waited: &SigSet) -> u8 {
    loop {
        match reap(podhost) {
            Ok(Some(code)) => return code,
            Ok(None) => {}
            Err(e) => {
                // Without waitpid the init cannot do its job; take podhost down with it so the
                // runtime sees the pod fail instead of a pod that silently stops reaping.
                eprintln!("podhost init: waitpid failed: {e}");
                let _ = kill(podhost, Signal::SIGKILL);
                return exit::FAILURE as u8;
            }
        }
        // Only signals of the set are blocked and waited for, so `wait` always returns one of
        // them; SIGCHLD (and any other) just brings the loop back to reaping.
        match waited.wait() {
            Ok(signal) if FORWARDED.contains(&signal) => {
                // ESRCH: podhost has just ended; the next reap collects its status.
                let _ = kill(podhost, signal);
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("podhost init: sigwait failed: {e}");
                let _ = kill(podhost, Signal::SIGKILL);
                return exit::FAILURE as u8;
            }
        }
    }
}

/// Reaps every child that has ended without blocking. `Some(code)` once podhost is among them.
fn reap(podhost: Pid) -> nix::Result<Option<u8>> {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => return Ok(None),
            Ok(status) if status.pid() == Some(podhost) => {
                if let Some(code) = exit_status(status) {
                    return Ok(Some(code));
                }
            }
            // An orphan reaped: nothing else to do with its status.
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            // No child at all: podhost's status was already collected, which `reap` never
            // lets happen without returning it; report it as a failure rather than spin.
            Err(Errno::ECHILD) => return Ok(Some(exit::FAILURE as u8)),
            Err(e) => return Err(e),
        }
    }
}

/// The status a shell would report for a process: its exit code, or 128 + the signal that
/// killed it. `None` for a status that is not an end (stopped, continued).
pub fn exit_status(status: WaitStatus) -> Option<u8> {
    match status {
        WaitStatus::Exited(_, code) => Some(code as u8),
        WaitStatus::Signaled(_, signal, _) => Some(128u8.wrapping_add(signal as u8)),
        _ => None,
    }
}

/// What the init blocks and waits for: every standard signal but the synchronous ones (and
/// SIGKILL and SIGSTOP, which cannot be blocked). Real-time signals are not in the set: as PID 1
/// without a handler, the kernel drops them.
pub fn waited_signals() -> SigSet {
    let mut set = SigSet::empty();
    for signal in Signal::iterator() {
        if !SYNCHRONOUS.contains(&signal) && !matches!(signal, Signal::SIGKILL | Signal::SIGSTOP) {
            set.add(signal);
        }
    }
    set
}

/// Creates `$HOME` (mode 0700) when it is an absolute path that does not exist: in a pod it lies
/// on the `/harness` volume, which starts empty. A failure is reported, not fatal: podhost runs
/// without a HOME, and the root may simply have no writable place for it.
fn ensure_home() {
    let Some(home) = std::env::var_os("HOME") else {
        return;
    };
    let home = Path::new(&home);
    if !home.is_absolute() || home.exists() {
        return;
    }
    let made = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home);
    if let Err(e) = made {
        eprintln!(
            "podhost init: HOME {} does not exist and could not be created: {e}",
            home.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn exit_status_is_the_code_or_128_plus_the_signal() {
        let pid = Pid::from_raw(7);
        assert_eq!(exit_status(WaitStatus::Exited(pid, 0)), Some(0));
        assert_eq!(exit_status(WaitStatus::Exited(pid, 3)), Some(3));
        assert_eq!(
            exit_status(WaitStatus::Signaled(pid, Signal::SIGTERM, false)),
            Some(143)
        );
        assert_eq!(
            exit_status(WaitStatus::Signaled(pid, Signal::SIGKILL, true)),
            Some(137)
        );
        assert_eq!(exit_status(WaitStatus::Stopped(pid, Signal::SIGSTOP)), None);
        assert_eq!(exit_status(WaitStatus::Continued(pid)), None);
    }

    #[test]
    fn the_init_waits_for_every_forwarded_signal_and_sigchld_but_no_fault() {
        let set = waited_signals();
        for signal in FORWARDED.iter().chain([&Signal::SIGCHLD, &Signal::SIGPIPE]) {
            assert!(set.contains(*signal), "{signal} is not waited for");
        }
        for signal in SYNCHRONOUS
            .iter()
            .chain([&Signal::SIGKILL, &Signal::SIGSTOP])
        {
            assert!(!set.contains(*signal), "{signal} is blocked");
        }
    }
}
