//! Finding a process's descendants through `/proc`, and signalling them without hitting a stranger.
//!
//! Owns: parsing `/proc/<pid>/stat`, walking parent links down from a root, and sending a signal
//! to a process seen in a walk through a pidfd that is checked to be that same process.
//!
//! Invariants:
//! * A signal reaches only the process the walk saw: the pidfd is opened first and the process's
//!   start time is compared after, so a pid reused in between is left alone.
//! * Nothing here blocks for long: a walk reads each `/proc/<pid>/stat` once.
//!
//! Non-goals: waiting for processes (the caller reaps its own children), other systems than
//! Linux.

use std::fs;
use std::io::{self, Read};
use std::os::fd::{FromRawFd, OwnedFd};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// What the walk needs of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    pub ppid: i32,
    /// The session id (`setsid` makes a process the leader of a new one).
    pub session: i32,
    /// The state letter (`R`, `S`, `D`, `Z`, …).
    pub state: u8,
    /// Start time in clock ticks since boot: with the pid, it names one process for good.
    pub start_time: u64,
}

impl ProcStat {
    pub fn is_zombie(&self) -> bool {
        self.state == b'Z'
    }
}

/// Reads `/proc/<pid>/stat`; `None` when the process is gone or the file is not as expected.
pub fn read_stat(pid: i32) -> Option<ProcStat> {
    let mut buf = [0u8; 1024];
    let mut file = fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut len = 0;
    while len < buf.len() {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    parse_stat(pid, &buf[..len])
}

/// Parses a stat line: `pid (comm) state ppid … starttime …`. The command name may hold spaces
/// and parentheses, so fields are counted from the last `)`.
fn parse_stat(pid: i32, line: &[u8]) -> Option<ProcStat> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(line.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // Fields after `comm`: 3 state, 4 ppid, 5 pgrp, 6 session, …, 22 starttime.
    let state = *fields.next()?.as_bytes().first()?;
    let ppid = fields.next()?.parse().ok()?;
    let session = fields.nth(1)?.parse().ok()?;
    let start_time = fields.nth(15)?.parse().ok()?;
    Some(ProcStat {
        pid,
        ppid,
        session,
        state,
        start_time,
    })
}

/// Every process on the system (that could be read).
pub fn all_processes() -> Vec<ProcStat> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let name = entry.ok()?.file_name();
        let pid: i32 = name.to_str()?.parse().ok()?;
        read_stat(pid)
    })
    .collect()
}

/// The descendants of `root` (not `root` itself), parents before their children.
pub fn descendants(root: i32) -> Vec<ProcStat> {
    descendants_in(&all_processes(), root)
}

pub(crate) fn descendants_in(all: &[ProcStat], root: i32) -> Vec<ProcStat> {
    let mut out: Vec<ProcStat> = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for p in all.iter().filter(|p| p.ppid == parent && p.pid != root) {
            // A pid seen twice would mean a cycle in a torn read; never loop on it.
            if !out.iter().any(|q| q.pid == p.pid) {
                out.push(*p);
                frontier.push(p.pid);
            }
        }
    }
    out
}

/// Sends `signal` to the process `seen` describes, if it is still that process. Returns whether
/// the signal was sent.
pub fn signal(seen: &ProcStat, signal: Signal) -> bool {
    match pidfd_open(seen.pid) {
        Ok(fd) => {
            // The pidfd pins whatever process has the pid now; it is ours only if it started
            // when the one we saw did.
            match read_stat(seen.pid) {
                Some(now) if now.start_time == seen.start_time => pidfd_send_signal(&fd, signal),
                _ => false,
            }
        }
        // Kernels before 5.3: no pidfd. Check the start time and accept the tiny window.
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            read_stat(seen.pid).is_some_and(|now| now.start_time == seen.start_time)
                && kill(Pid::from_raw(seen.pid), signal).is_ok()
        }
        Err(_) => false,
    }
}

/// Sends `sig` to each of `procs`; returns how many were signalled.
pub fn signal_all(procs: &[ProcStat], sig: Signal) -> usize {
    procs.iter().filter(|p| signal(p, sig)).count()
}

#[allow(unsafe_code)]
fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new file descriptor or -1; it reads
    // no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[allow(unsafe_code)]
fn pidfd_send_signal(fd: &OwnedFd, sig: Signal) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid pidfd, a signal number, a null siginfo (meaning "as kill(2) would") and no
    // flags; the kernel reads nothing else.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn parses_a_name_with_spaces_and_parentheses() {
        let line = b"1234 (a (b) c) S 77 1230 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10 18446744073709551615\n";
        assert_eq!(
            parse_stat(1234, line),
            Some(ProcStat {
                pid: 1234,
                ppid: 77,
                session: 1234,
                state: b'S',
                start_time: 98765
            })
        );
        assert_eq!(parse_stat(1, b"1 (x) S"), None);
    }

    #[test]
    fn descendants_follow_parent_links_only_below_the_root() {
        let p = |pid, ppid| ProcStat {
            pid,
            ppid,
            session: 0,
            state: b'S',
            start_time: 0,
        };
        let all = [p(1, 0), p(10, 1), p(11, 10), p(12, 11), p(13, 10), p(20, 1)];
        let pids: Vec<i32> = descendants_in(&all, 10).iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![11, 13, 12]);
    }

    #[test]
    fn reads_this_process_and_finds_a_child() {
        let me = read_stat(std::process::id() as i32).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let found = descendants(std::process::id() as i32);
        let seen = found
            .iter()
            .find(|p| p.pid == child.id() as i32)
            .copied()
            .unwrap();
        // A stale start time is refused; the right one is signalled.
        let stale = ProcStat {
            start_time: seen.start_time + 1,
            ..seen
        };
        assert!(!signal(&stale, Signal::SIGKILL));
        assert!(signal(&seen, Signal::SIGKILL));
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
