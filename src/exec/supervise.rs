//! The per-command supervisor: `podhost-exec` (or `podhost __exec`, see
//! [`find_supervisor`](super::find_supervisor)), one process per command, between podhost and
//! the shell; or the same code forked from `podhost tool` without an exec ([`in_fork`], see
//! `exec::oneshot`).
//!
//! Owns: starting the shell in its own process group, in a session other than podhost's and without
//! a controlling terminal (its own; a session holder's, made for that), with the request's
//! environment, working directory, resource limits, `PR_SET_NO_NEW_PRIVS` and confinement (the
//! system-call filter last, on every command); a fresh session keyring for a command started
//! without a session holder; reaping; and killing every descendant when the shell ends or when
//! podhost asks (or dies).
//!
//! How it works: the supervisor makes itself a child subreaper, so every orphan of the command
//! (a `sleep &`, a `setsid` daemon, a double fork) is re-parented to it and stays findable. It
//! waits for signals synchronously (`sigtimedwait` with SIGCHLD, SIGTERM, SIGINT, SIGHUP and
//! SIGQUIT blocked), so there are no handlers and no races between them. When the shell exits it
//! gives the rest a moment to end on their own (`exec > >(tee f)` must get to flush), then
//! SIGTERMs every descendant found by walking `/proc`, waits a short grace, and SIGKILLs until
//! none is left. Then it reports the shell's status on the control socket and exits; since every
//! descendant is dead by then, every copy of the output pipes is closed and podhost sees EOF.
//!
//! Invariants:
//! * Single-threaded, plain std + libc/nix: no tokio, no clap, no tracing — it starts first thing
//!   in `main` and must be cheap.
//! * Its own environment is empty (podhost clears it) and the request arrives on the control
//!   socket, so a command reading `/proc/<supervisor>/{environ,cmdline}` learns nothing.
//! * It exits only when no descendant is left alive (or after a hard cap, when one is stuck in
//!   the kernel and cannot die yet).
//! * "The command exited 1" and "the supervisor failed" cannot be confused: the first is a status
//!   line, the second is no status line.
//!
//! Non-goals: timeouts (podhost owns them and sends SIGTERM), output capture (podhost reads the
//! pipes the supervisor passes through).

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::prctl;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpid, getppid, setsid};

use super::confine;
use super::limits::Prepared;
use super::procs;
use super::protocol::{MAX_REQUEST_BYTES, Request, Status};
use super::vspawn;

/// How long descendants left behind by the shell may take to end on their own.
pub(crate) const LINGER: Duration = Duration::from_millis(100);
/// How long SIGTERMed descendants get before SIGKILL.
pub(crate) const TERM_GRACE: Duration = Duration::from_millis(200);
/// The pause between SIGKILL sweeps (a SIGCHLD ends it early).
const SWEEP_PAUSE: Duration = Duration::from_millis(10);
/// After this long of SIGKILL sweeps the supervisor gives up: what is left is stuck in the
/// kernel, holds a pending SIGKILL and will die when it returns.
const KILL_CAP: Duration = Duration::from_secs(10);

/// Exit code of a supervisor that could not even report (no control socket, bad request).
const EXIT_BROKEN: u8 = 125;

/// The supervisor's `main`. Called by the binary's `main` before anything else when `argv[1]` is
/// [`SUPERVISOR_ARG`](super::SUPERVISOR_ARG).
pub fn main() -> ExitCode {
    let signals = handled_signals();
    // Block first: from here on, SIGTERM (podhost's timeout, or its death) waits to be handled.
    if signals.thread_block().is_err() {
        return ExitCode::from(EXIT_BROKEN);
    }
    close_stray_fds();
    ExitCode::from(run(signals, Start::Exec))
}

/// The supervisor of a command started by a session holder (see `session::holder`): forked
/// inside the session's namespaces, its control socket already on stdin and the output pipes on
/// stdout and stderr. Its first message is its own pidfd, since podhost is not its parent.
/// Returns the exit code.
pub(crate) fn forked() -> i32 {
    let signals = handled_signals();
    if signals.thread_block().is_err() {
        return i32::from(EXIT_BROKEN);
    }
    i32::from(run(signals, Start::Forked))
}

/// How the supervisor was started.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Exec'ed by podhost, which is its parent.
    Exec,
    /// Forked by a session holder.
    Forked,
}

fn run(signals: SigSet, start: Start) -> u8 {
    // Tell us when podhost (or the holder) dies. podhost's pid arrives with the request and is
    // compared below, which closes the race of podhost dying before this call.
    if prctl::set_pdeathsig(Signal::SIGTERM).is_err() {
        return EXIT_BROKEN;
    }
    let Ok(ctl) = control_socket() else {
        return EXIT_BROKEN;
    };
    if start == Start::Forked && send_own_pidfd(&ctl).is_err() {
        return EXIT_BROKEN;
    }
    let mut sup = Supervisor {
        me: getpid(),
        signals,
        ctl,
        shell: None,
        shell_status: None,
        start,
    };
    let req = match sup.read_request() {
        Ok(req) => req,
        Err(e) => {
            sup.report(&Status::Error(format!("bad request: {e}")));
            return EXIT_BROKEN;
        }
    };
    if start == Start::Exec && u32::try_from(getppid().as_raw()).ok() != Some(req.parent) {
        // podhost is gone already: nobody is waiting for this command.
        return EXIT_BROKEN;
    }
    // A command without a session holder gets a session keyring of its own, never podhost's
    // (a holder joined one for its whole session already).
    if start == Start::Exec
        && let Err(e) = confine::join_session_keyring()
    {
        sup.report(&Status::Error(format!(
            "could not join a fresh session keyring: {e}"
        )));
        return 0;
    }
    let status = sup.supervise(&req);
    if start == Start::Forked {
        step_aside();
    }
    sup.report(&status);
    0
}

/// Gives this process the lowest CPU priority: podhost answers a forked supervisor's command
/// from its status alone (see `spawn::control`), and when the report wakes podhost on this
/// CPU, podhost should run first, not this process's teardown (a forked address space's, some
/// hundred microseconds) that is all it has left to do.
#[allow(unsafe_code)]
fn step_aside() {
    // SAFETY: setpriority on this process only; raising one's own nice value needs no privilege,
    // and a refusal changes nothing but the order of the work.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, 19);
    }
}

/// The supervisor of `podhost tool`'s one command (see `exec::oneshot`): forked from podhost
/// without an exec, the request already in memory, the output pipes on stdout and stderr and
/// the status reported on `report`. The same walls as the supervisor binary's: SIGTERM when
/// podhost dies (what it left is then killed), a session keyring of the command's own. Returns
/// the exit code.
pub(crate) fn in_fork(req: &Request, parent: Pid, report: UnixStream) -> i32 {
    let signals = handled_signals();
    // Inherited blocked from podhost already; blocked again in case the caller did not.
    if signals.thread_block().is_err() || prctl::set_pdeathsig(Signal::SIGTERM).is_err() {
        return i32::from(EXIT_BROKEN);
    }
    if getppid() != parent {
        // podhost is gone already: nobody is waiting for this command.
        return i32::from(EXIT_BROKEN);
    }
    let mut sup = Supervisor {
        me: getpid(),
        signals,
        ctl: report,
        shell: None,
        shell_status: None,
        start: Start::Exec,
    };
    if let Err(e) = confine::join_session_keyring() {
        sup.report(&Status::Error(format!(
            "could not join a fresh session keyring: {e}"
        )));
        return 0;
    }
    let status = sup.supervise(req);
    sup.report(&status);
    0
}

/// Sends this process's pidfd on the control socket (one byte, `SCM_RIGHTS`).
fn send_own_pidfd(ctl: &UnixStream) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = super::sys::pidfd_open(getpid().as_raw())?;
    super::sys::send_with_fds(ctl.as_raw_fd(), PIDFD_MARK, &[fd.as_raw_fd()])
}

/// The byte that carries a forked supervisor's pidfd.
pub(crate) const PIDFD_MARK: &[u8] = b"p";

/// The signals a supervisor blocks and waits for: a child's end, and the requests to stop.
pub(crate) fn handled_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGQUIT,
    ] {
        set.add(sig);
    }
    set
}

/// A duplicate of stdin (the control socket), close-on-exec so the shell never inherits it.
fn control_socket() -> io::Result<UnixStream> {
    let fd = io::stdin().as_fd().try_clone_to_owned()?;
    Ok(UnixStream::from(fd))
}

/// Closes every descriptor above stderr: whatever podhost's own parent leaked into podhost
/// without close-on-exec must not reach commands.
#[allow(unsafe_code)]
fn close_stray_fds() {
    // SAFETY: close_range only closes descriptors; none above 2 is owned by anything in this
    // process yet (this runs first thing in the supervisor, before any file is opened).
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
    }
}

/// Points stdout and stderr (the command's output pipes) at `/dev/null`, or closes them where it
/// cannot be opened: a late write of this process must never reach a pipe, nor a descriptor
/// reused after a close.
#[allow(unsafe_code)]
fn release_output() {
    let null = std::fs::OpenOptions::new().write(true).open("/dev/null");
    for fd in [libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: dup2 and close on descriptors this process owns; nothing in it holds a Rust
        // handle to stdout's or stderr's descriptor (std's handles are re-lookups of 1 and 2).
        unsafe {
            match &null {
                Ok(null) => {
                    libc::dup2(null.as_raw_fd(), fd);
                }
                Err(_) => {
                    libc::close(fd);
                }
            }
        }
    }
}

/// What the request buffer holds before it grows: more than a usual request (2–4 KB).
const REQUEST_BUFFER: usize = 16 * 1024;

struct Supervisor {
    me: Pid,
    signals: SigSet,
    ctl: UnixStream,
    shell: Option<Pid>,
    shell_status: Option<Status>,
    /// How this supervisor was started (the one-shot path's counts as [`Start::Exec`]: podhost
    /// is its parent and it makes its own session).
    start: Start,
}

impl Supervisor {
    fn read_request(&mut self) -> Result<Request, String> {
        // Room for a usual request at once: from empty, `read_to_end` probes with 32 bytes and
        // doubles, eight reads for a request of a few kilobytes.
        let mut buf = Vec::with_capacity(REQUEST_BUFFER);
        (&self.ctl)
            .take(MAX_REQUEST_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(|e| e.to_string())?;
        if buf.len() as u64 > MAX_REQUEST_BYTES {
            return Err(format!("larger than {MAX_REQUEST_BYTES} bytes"));
        }
        Request::decode(&buf).map_err(|e| e.to_string())
    }

    /// Says how the command ended. Its output pipes are let go first: every writer of them
    /// is gone by now, so podhost sees their end with the status instead of waiting for this
    /// process's own exit to close them.
    fn report(&mut self, status: &Status) {
        release_output();
        // podhost may be gone; then nobody needs the answer.
        let _ = self.ctl.write_all(status.encode().as_bytes());
    }

    fn supervise(&mut self, req: &Request) -> Status {
        if let Err(e) = prctl::set_child_subreaper(true) {
            return Status::Error(format!("could not become a child subreaper: {e}"));
        }
        // The command's cgroups, joined here so that the shell and all it starts are counted
        // and limited there (a session holder joined them for its whole session already).
        for procs in &req.confine.cgroup_procs {
            if let Err(e) = std::fs::write(procs, "0") {
                return Status::Error(format!(
                    "could not join the cgroup {}: {e}",
                    procs.display()
                ));
            }
        }
        // A session other than podhost's (its reaper kills only what is outside its own) and
        // without a controlling terminal, so prompts that open /dev/tty fail at once. A session
        // holder's supervisor is in the holder's, made for that (and a new session per command
        // costs a scheduling group the kernel makes and frees); any other makes its own, which
        // fails only for a process-group leader, which podhost never makes us.
        if self.start != Start::Forked {
            let _ = setsid();
        }
        match spawn_shell(req, ShellParent::Supervisor(self.me), None) {
            Ok(pid) => self.shell = Some(pid),
            Err(e) => {
                return Status::Error(format!("could not start {} -c …: {e}", req.shell.display()));
            }
        }
        while self.shell_status.is_none() {
            self.reap();
            if self.shell_status.is_some() {
                break;
            }
            match wait_signal(&self.signals, None) {
                Some(libc::SIGCHLD) | None => {}
                Some(_) => {
                    self.kill_tree();
                    return Status::Killed;
                }
            }
        }
        // The shell is done; give whatever it left a moment to end by itself.
        let deadline = Instant::now() + LINGER;
        while self.reap() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match wait_signal(&self.signals, Some(deadline - now)) {
                Some(libc::SIGCHLD) | None => {}
                Some(_) => {
                    self.kill_tree();
                    return Status::Killed;
                }
            }
        }
        self.kill_tree();
        self.shell_status.clone().unwrap_or(Status::Killed)
    }

    /// Reaps every child that has ended, noting the shell's status. Returns whether any child is
    /// left (alive, or not yet reaped). No child left means no descendant left: as a subreaper
    /// every orphan below us becomes our child.
    fn reap(&mut self) -> bool {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return true,
                Ok(WaitStatus::Exited(pid, code)) if Some(pid) == self.shell => {
                    self.shell_status = Some(Status::Exited(code));
                }
                Ok(WaitStatus::Signaled(pid, sig, _)) if Some(pid) == self.shell => {
                    self.shell_status = Some(Status::Signaled(sig as i32));
                }
                Ok(_) | Err(Errno::EINTR) => {}
                Err(Errno::ECHILD) => return false,
                // Nothing else is documented; do not spin on it.
                Err(_) => return false,
            }
        }
    }

    /// Kills every descendant: SIGTERM, a short grace, then SIGKILL sweeps until none is left.
    fn kill_tree(&mut self) {
        if !self.reap() {
            return;
        }
        procs::signal_all(&procs::descendants(self.me.as_raw()), Signal::SIGTERM);
        let deadline = Instant::now() + TERM_GRACE;
        while self.reap() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            // A second SIGTERM from podhost changes nothing: the tree is being killed.
            wait_signal(&self.signals, Some(deadline - now));
        }
        let cap = Instant::now() + KILL_CAP;
        while self.reap() && Instant::now() < cap {
            let live: Vec<_> = procs::descendants(self.me.as_raw())
                .into_iter()
                .filter(|p| !p.is_zombie())
                .collect();
            procs::signal_all(&live, Signal::SIGKILL);
            wait_signal(&self.signals, Some(SWEEP_PAUSE));
        }
    }
}

/// Who starts a command's shell, and so what the shell does before its exec.
#[derive(Clone, Copy)]
pub(crate) enum ShellParent {
    /// A supervisor, this process (its pid): the shell is a process group in the supervisor's
    /// session and dies with it.
    Supervisor(Pid),
    /// podhost itself, outside the PID namespace it made for the shell (`podhost tool`, see
    /// `exec::nsinit`): the shell starts a session of its own; the namespace's init kills it if
    /// podhost dies.
    Namespace,
}

/// Starts `<shell> -c <command>` as `parent` asks, stdin from /dev/null, stdout and stderr
/// `output` or else ours (podhost's pipes), with the request's environment, directory and
/// limits. The shell is started as `posix_spawn` would (see `vspawn`): no copy of this process
/// is made only to be replaced.
pub(crate) fn spawn_shell(
    req: &Request,
    parent: ShellParent,
    output: Option<[OwnedFd; 2]>,
) -> Result<Pid, String> {
    let limits = Prepared::new(&req.limits);
    // Opened and compiled here, before the clone: the child only makes system calls.
    let confine = confine::Prepared::new(&req.confine)
        .map_err(|e| format!("could not confine the command: {e}"))?;
    let mut image = shell_image(req).map_err(|e| e.to_string())?;
    if let ShellParent::Namespace = parent {
        image = image.in_own_session();
    }
    if let Some([stdout, stderr]) = output {
        image = image.with_output(stdout, stderr);
    }
    // Runs in the child before the exec: system calls only (rt_sigaction, sigprocmask,
    // setrlimit, set*id, prctl, getppid, capset, landlock_restrict_self, seccomp) on values
    // prepared above, nothing allocated (see `vspawn`'s invariants).
    let mut pre_exec = || {
        // Defaults first, then the mask: no handler may run on the child's borrowed stack.
        reset_signal_dispositions();
        // The supervisor blocks the signals it waits for; the shell must not inherit that
        // (a blocked SIGTERM would make every command ignore the first kill).
        SigSet::empty().thread_set_mask()?;
        limits.apply()?;
        // Before the parent-death signal: a credential change clears it.
        confine.switch_user()?;
        if let ShellParent::Supervisor(supervisor) = parent {
            // If the supervisor is killed outright, take the shell with it.
            prctl::set_pdeathsig(Signal::SIGKILL)?;
            if getppid() != supervisor {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        prctl::set_no_new_privs()?;
        // Last: the seccomp filter needs no_new_privs, and nothing after it may need what
        // Landlock or the filter forbids.
        confine.restrict()
    };
    let pid = vspawn::spawn(&image, &mut pre_exec).map_err(|e| e.to_string())?;
    Ok(Pid::from_raw(pid))
}

/// `<shell> -c <command>` of `req`: its environment and working directory, its stdin
/// `/dev/null`.
pub(crate) fn shell_image(req: &Request) -> std::io::Result<vspawn::Image> {
    vspawn::Image::new(
        &req.shell,
        [OsStr::new("-c"), OsStr::new(&req.command)],
        req.env.iter().map(|(k, v)| (OsStr::new(k), OsStr::new(v))),
        &req.cwd,
    )
}

/// Sets every signal's disposition to the default, as a freshly started program expects: an
/// ignored disposition survives `exec`, and glibc's `posix_spawn` (how podhost starts the
/// supervisor) leaves its two internal signals (32, 33) ignored. In the shell's child it also
/// keeps any handler of the supervisor's from running on the child's stack. glibc's own
/// `sigaction` refuses to touch those two, hence the raw system call. Async-signal-safe.
#[allow(unsafe_code)]
fn reset_signal_dispositions() {
    // An all-zero kernel `struct sigaction` is SIG_DFL with no flags and an empty mask, whatever
    // the architecture's layout of it; 32 bytes cover it on every 64-bit one.
    let default_action = [0u64; 4];
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads a kernel sigaction (all zeros: SIG_DFL) from a live buffer
        // of sufficient size and writes nothing (old action pointer is null); the last argument
        // is the kernel's sigset size (8 bytes on Linux).
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                default_action.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            );
        }
    }
}

/// Waits for one of `set` (blocked) to be pending, at most `timeout`; returns the signal number,
/// or `None` on timeout or interruption (callers re-check their deadlines).
#[allow(unsafe_code)]
fn wait_signal(set: &SigSet, timeout: Option<Duration>) -> Option<i32> {
    let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::uninit();
    let rc = match timeout {
        Some(d) => {
            let ts = libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                tv_nsec: d.subsec_nanos() as libc::c_long,
            };
            // SAFETY: `set` is a valid sigset, `info` is writable siginfo storage and `ts` a
            // valid timespec; all outlive the call.
            unsafe { libc::sigtimedwait(set.as_ref(), info.as_mut_ptr(), &ts) }
        }
        // SAFETY: as above, without a timeout.
        None => unsafe { libc::sigwaitinfo(set.as_ref(), info.as_mut_ptr()) },
    };
    (rc > 0).then_some(rc)
}
