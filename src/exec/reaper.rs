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
//! * A child's exit costs what podhost's own threads and children cost, not what the host's
//!   processes do: a [`sweep`] reads podhost's children from its threads' `children` lists and
//!   walks all of `/proc` ([`sweep_all`]) only when one of them is an adopted orphan (a supervisor
//!   died without killing its tree), or where the kernel keeps no such lists.
//!
//! Non-goals: reaping podhost's own registered children (tokio reaps the supervisors).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

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

/// What a SIGCHLD brings: when one of podhost's children is an adopted orphan, [`sweep_all`];
/// otherwise nothing more (the exits of supervisors and of podhost's other children are their
/// waiters'). Returns how many adopted orphans were found.
pub fn sweep() -> usize {
    let Some(children) = own_children() else {
        return sweep_all();
    };
    let Some(session) = own_session() else {
        return 0;
    };
    let adopted = {
        let reg = registry();
        children.iter().any(|&pid| {
            !reg.contains_key(&pid) && procs::read_stat(pid).is_some_and(|p| p.session != session)
        })
    };
    if adopted { sweep_all() } else { 0 }
}

/// podhost's session (it never starts a new one).
fn own_session() -> Option<i32> {
    static SESSION: OnceLock<Option<i32>> = OnceLock::new();
    *SESSION.get_or_init(|| procs::read_stat(std::process::id() as i32).map(|p| p.session))
}

/// The pids of podhost's children, from each of its threads' `/proc/self/task/<tid>/children`
/// (a child belongs to the thread that forked it, an adopted orphan to one of them); `None`
/// where the kernel keeps no such list (built without `CONFIG_PROC_CHILDREN`).
fn own_children() -> Option<Vec<i32>> {
    static KEPT: OnceLock<bool> = OnceLock::new();
    if !*KEPT.get_or_init(|| Path::new("/proc/thread-self/children").exists()) {
        return None;
    }
    let tasks = fs::read_dir("/proc/self/task").ok()?;
    let mut pids = Vec::new();
    for task in tasks.flatten() {
        // A thread that ended meanwhile handed its children to another: the next SIGCHLD, or
        // a supervisor's death (which sweeps all), finds them.
        if let Ok(list) = fs::read_to_string(task.path().join("children")) {
            pids.extend(
                list.split_ascii_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    Some(pids)
}

/// Kills every adopted orphan (and what is below it) and reaps those that have ended, walking
/// all of `/proc`. Returns how many adopted orphans were found.
pub fn sweep_all() -> usize {
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

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::*;

    fn sleeper(own_session: bool) -> std::process::Child {
        // util-linux's `setsid`, not a group leader here, makes the new session itself and
        // execs `sleep`: the child keeps its pid.
        let mut cmd = if own_session {
            Command::new("sleep")
        } else {
            let mut c = Command::new("setsid");
            c.arg("sleep");
            c
        };
        cmd.arg("60").stdin(Stdio::null()).spawn().unwrap()
    }

    /// A child in podhost's own session is left alone and costs no walk of `/proc`; one in a
    /// session of its own that is no registered supervisor is taken for an adopted orphan and
    /// killed. Both are found through the threads' `children` lists where the kernel keeps them.
    #[test]
    fn a_sweep_finds_an_unregistered_child_of_another_session_and_kills_it() {
        let mut mine = sleeper(true);
        let mut stray = sleeper(false);
        let pid = stray.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        while procs::read_stat(pid).is_none_or(|p| p.session != pid) {
            assert!(
                Instant::now() < deadline,
                "the stray child made no session of its own"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(children) = own_children() {
            assert!(children.contains(&(mine.id() as i32)), "{children:?}");
            assert!(children.contains(&(stray.id() as i32)), "{children:?}");
        } else {
            eprintln!("this kernel keeps no children lists: sweep walks /proc");
        }
        let found = sweep();
        assert!(found >= 1, "the stray child was not found");
        // Killed, and maybe reaped by the sweep already: gone, or a zombie for us to reap.
        let deadline = Instant::now() + Duration::from_secs(10);
        while procs::read_stat(pid).is_some_and(|p| !p.is_zombie()) {
            assert!(Instant::now() < deadline, "the stray child still runs");
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = stray.try_wait();
        assert_eq!(
            mine.try_wait().unwrap(),
            None,
            "the child of podhost's session was killed"
        );
        mine.kill().unwrap();
        mine.wait().unwrap();
    }
}
