//! podhost as a child subreaper: nothing a command starts escapes to init.
//!
//! Owns: making podhost a child subreaper, the registry of live supervisors, and the task that
//! kills and reaps orphans re-parented to podhost.
//!
//! Orphans reach podhost only when a supervisor dies before its descendants (it crashed, or was
//! SIGKILLed after ignoring podhost's SIGTERM for too long; `exec::spawn` then sweeps
//! what it can find first). A subreaper must reap what it adopts, or zombies pile up.
//!
//! Invariants:
//! * A child of podhost is treated as an adopted orphan only if it is not a registered
//!   supervisor and not in podhost's own session: supervisors start a session of their own, so
//!   everything below them is in another session, while a process started in podhost's session
//!   by other code is never touched.
//! * A supervisor is registered under the same lock a sweep takes, from before `fork` returns
//!   until it has been reaped, so a sweep never mistakes a fresh supervisor for an orphan.
//!
//! Non-goals: reaping podhost's own registered children (tokio reaps the supervisors).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};

use nix::sys::prctl;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;

use super::procs;

/// Live supervisors by pid, with a count so that a reused pid registered again before the old
/// entry is removed stays registered.
static SUPERVISORS: Mutex<BTreeMap<i32, usize>> = Mutex::new(BTreeMap::new());

fn registry() -> MutexGuard<'static, BTreeMap<i32, usize>> {
    SUPERVISORS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `spawn` under the registry lock and registers the pid it returns.
pub(super) fn spawn_registered<T>(
    spawn: impl FnOnce() -> io::Result<T>,
    pid_of: impl Fn(&T) -> Option<u32>,
) -> io::Result<T> {
    let mut reg = registry();
    let child = spawn()?;
    if let Some(pid) = pid_of(&child) {
        *reg.entry(pid as i32).or_default() += 1;
    }
    Ok(child)
}

/// Forgets a supervisor once it has been reaped.
pub(super) fn deregister(pid: i32) {
    let mut reg = registry();
    if let Some(n) = reg.get_mut(&pid) {
        *n -= 1;
        if *n == 0 {
            reg.remove(&pid);
        }
    }
}

/// Makes podhost a child subreaper: orphans below it re-parent to it instead of to init.
pub fn become_subreaper() -> io::Result<()> {
    prctl::set_child_subreaper(true).map_err(io::Error::from)
}

/// Makes podhost a child subreaper and starts the task that kills and reaps the orphans it
/// adopts. Call once per process, inside the tokio runtime, before starting commands (the serve
/// and pod fronts; a one-shot `podhost tool` calls it too, it costs nothing).
pub fn start() -> io::Result<JoinHandle<()>> {
    become_subreaper()?;
    let mut sigchld = signal(SignalKind::child())?;
    // Nothing is adopted before a child has died, so the first sweep waits for a SIGCHLD.
    Ok(tokio::spawn(async move {
        while sigchld.recv().await.is_some() {
            // A sweep reads /proc: keep it off the async workers.
            if tokio::task::spawn_blocking(sweep).await.is_err() {
                break;
            }
        }
    }))
}

/// Kills every adopted orphan (and what is below it) and reaps those that have ended. Returns how
/// many adopted orphans were found.
pub fn sweep() -> usize {
    let me = std::process::id() as i32;
    let all = procs::all_processes();
    let Some(my_session) = all.iter().find(|p| p.pid == me).map(|p| p.session) else {
        return 0;
    };
    let reg = registry();
    let orphans: Vec<_> = all
        .iter()
        .filter(|p| p.ppid == me && p.session != my_session && !reg.contains_key(&p.pid))
        .collect();
    for orphan in &orphans {
        let below: Vec<_> = procs::descendants_in(&all, orphan.pid)
            .into_iter()
            .filter(|p| !p.is_zombie())
            .collect();
        procs::signal_all(&below, Signal::SIGKILL);
        if !orphan.is_zombie() {
            procs::signal(orphan, Signal::SIGKILL);
        }
        // Reaps it if it has ended; if not, its SIGCHLD brings the next sweep.
        let _ = waitpid(Pid::from_raw(orphan.pid), Some(WaitPidFlag::WNOHANG));
    }
    orphans.len()
}
