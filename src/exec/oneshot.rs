//! One command of `podhost tool bash`, which runs one command and exits: no supervisor program
//! to load, no control socket, no async runtime.
//!
//! Owns: running the command in one of two ways, plus what podhost's side of a command owns
//! elsewhere ([`spawn`](super::spawn)): the timeout, the stop signals (SIGINT, SIGTERM, SIGHUP,
//! SIGQUIT, waited for on a `signalfd`, never by handlers) and the bounded capture of stdout
//! and stderr ([`StreamCapture`], the same caps as the bash tool's).
//!
//! * **In a PID namespace**, where this process builds the command's view (see below): the
//!   init of a new PID namespace ([`nsinit`](super::nsinit), a process sharing this one's
//!   memory), started as soon as the call is known to need it ([`start_early`]), makes the
//!   command's mount and IPC namespaces and mounts the PID namespace's `/proc` (read-only) there,
//!   on another CPU, while this process prepares the call; this process then joins those
//!   namespaces and moves its next children into the PID namespace. It starts the command's
//!   child there before it builds the view ([`ahead`](super::ahead)): on another CPU the child
//!   sheds what a supervisor's child would (a session of its own, signals, limits, root's
//!   capabilities, the system-call filter) while this process builds the view and the Landlock
//!   ruleset, which it then hands the child to enforce before its exec. (A command that changes
//!   user or holds no capability starts as a supervisor would start it, once the view is
//!   built: `supervise::spawn_shell`.) It then does what the supervisor does: what the shell
//!   left gets a moment to end, then SIGTERM to every process of the namespace, a grace, and
//!   the init's end, which kills them all.
//! * **Under a forked supervisor** everywhere else (no view, the kernel refuses the PID
//!   namespace or its `/proc`, a request with cgroups): the supervisor runs the supervisor
//!   binary's own code (`supervise::in_fork`: the shell in a session of its own, confined, every
//!   descendant reaped and killed before it reports).
//!
//! ```text
//! podhost tool ──clone(VM, NEWPID)──► init (pid 1: makes the mount and IPC namespaces, mounts
//!   │                                   /proc; kill(-1) on request; its end ends the namespace)
//!   ├──setns(init: mount, IPC; then PID)
//!   ├──clone(VM)──► child (pid 2: sheds, filter; waits) ··· ruleset ──► Landlock, exec ──► <shell>
//!   └──builds the view and the ruleset, sends it (SCM_RIGHTS)
//!         -c <command> (pid 2) ──► …
//! podhost tool ──fork──► supervisor ──vspawn, confine, exec──► <shell> -c <command> ──► …
//!   │  poll: signalfd (SIGCHLD, stop signals), stdout and stderr pipes, the deadline
//!   └─ a stop (the timeout, a signal) → SIGTERM to the tree (by the init, or by the
//!      supervisor, which then reports); a second stop signal → SIGKILL to it
//! ```
//!
//! Invariants:
//! * The process is single-threaded when [`execute`] is called (no async runtime was started):
//!   the forked supervisor runs ordinary code, the init runs beside this process in its memory,
//!   and the blocked signals rely on it.
//! * The command's tree dies with podhost, however podhost dies. In a PID namespace the init's
//!   parent-death signal is SIGKILL, and the kernel kills every process of a namespace whose
//!   init ends. Under a supervisor, the supervisor gets SIGTERM from the kernel when podhost
//!   ends (its parent-death signal) and kills every descendant, as under the supervisor binary;
//!   podhost is a child subreaper, so what a supervisor killed outright left is re-parented to
//!   podhost, which kills it before it answers.
//! * podhost answers only once nothing of the command runs: the shell is reaped and the init
//!   has no child left (every orphan of the namespace is the init's), or the supervisor has
//!   reported. In a PID namespace the init itself is then left to end with podhost (its
//!   parent-death signal), so the teardown of what it shares with podhost is not on the call's
//!   path.
//! * The command gets the same walls either way, and as under the supervisor binary: the same
//!   request (built by `spawn::request`) run by the same code, a fresh session keyring,
//!   descriptors above stderr closed at its exec, and `oom_score_adj` 1000. podhost's own
//!   environment stays unreadable to it (podhost is non-dumpable, see
//!   `confine::harden_process`; the init and a forked supervisor are too).
//! * "The command exited 1" and "podhost failed to run it" cannot be confused: the first is
//!   the shell's status (reaped here, or on the report socket), the second an error.
//!
//! Local use's read-only system (a session whose holder would build a view alone: podhost is
//! root, or in a user namespace of its own, see `probe::assume_own_namespaces`): this process
//! enters fresh mount and IPC namespaces (the init's, or made here where there is no init) and
//! builds the same view itself (`session::view`) before it starts the command. In a user
//! namespace of its own a view that fails half-built is an error, not a fallback: the process
//! cannot go back to the host's mount namespace, which its user namespace does not own.
//!
//! Non-goals: sessions with a user namespace, a network, a disk, a cgroup or a quota (their
//! holder forks a supervisor; such an executor uses
//! [`Executor::execute`](super::Executor::execute)); more than one command.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

use super::ahead::Ahead;
use super::capture::StreamCapture;
use super::nsinit::{Init, NotJoined};
use super::protocol::{Request, SessionRequest, Status};
use super::session::view;
use super::spawn::{EXIT_CANCELLED, EXIT_TIMED_OUT};
use super::supervise::{self, LINGER, ShellParent, TERM_GRACE, handled_signals};
use super::{ExecConfig, ExecError, ExecOutput, ExecRequest};

/// How long the output pipes may stay open once no descendant is left (only a process stuck in
/// the kernel could hold them) before podhost stops reading, as on the supervisor's path.
const DRAIN_BOUND: Duration = Duration::from_secs(2);
/// How much one read of a pipe takes at most (a pipe's whole default capacity).
const READ_CHUNK: usize = 64 * 1024;
/// How much the first read takes: most commands print little, and each 4 KiB of a bigger
/// buffer is a page to fault in for nothing. The buffer doubles, up to [`READ_CHUNK`], each
/// time a read fills it.
const FIRST_READ: usize = 4 * 1024;
/// How long podhost keeps killing what a supervisor killed outright left (as the supervisor's
/// own cap: what is left then is stuck in the kernel and dies when it returns).
const KILL_CAP: Duration = Duration::from_secs(10);
/// The pause between those kills.
const SWEEP_PAUSE: Duration = Duration::from_millis(10);
/// How often podhost looks whether what a command left in its PID namespace has ended.
const POLL_STEP: Duration = Duration::from_millis(2);
/// Reads of one pipe per wake-up, so a writer that never pauses cannot starve the signals.
const READS_PER_WAKE: usize = 16;

/// How the one command ended, and the signal that stopped it, if one did.
#[derive(Debug)]
pub struct OneShot {
    pub output: ExecOutput,
    /// The stop signal that ended the command early (SIGINT, SIGTERM, SIGHUP or SIGQUIT).
    pub stopped_by: Option<Signal>,
}

/// Why the tree was killed before the shell's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    TimedOut,
    Signal(Signal),
}

/// Runs `req` to its end (see the module doc): in a PID namespace of its own where this
/// process built the view, else under a supervisor forked from this process. `req.cancel` is
/// not watched: the stop signals are. `Err` is a fault of podhost or a command that could not
/// start.
pub fn execute(
    config: &ExecConfig,
    view: Option<&SessionRequest>,
    req: ExecRequest,
) -> Result<OneShot, ExecError> {
    first_for_the_oom_killer();
    // The init of the command's namespaces: started ahead of the call (`start_early`), or now.
    let mut init = match (take_early(), view) {
        (early, None) => {
            drop(early);
            None
        }
        (Some(early), Some(_)) => Some(early),
        (None, Some(_)) => start_init(),
    };
    let request = super::spawn::request(config, &req)?;
    if !request.confine.cgroup_procs.is_empty() {
        // A supervisor moves such a command into its groups: the namespaces are made here.
        init = None;
    }
    default_dispositions();
    let signals = handled_signals();
    // From here on the stop signals wait to be read, so none is lost before the command
    // starts; a supervisor inherits them blocked and waits for them itself.
    signals.thread_block().map_err(io::Error::from)?;
    let signalfd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(io::Error::from)?;
    cloexec_stray_fds();
    // The read-only system of local use: this process enters it, as a session holder would.
    let walled = match view {
        Some(session) => enter_view(session, &request, &mut init)?,
        None => Walled::No,
    };
    // An init whose namespaces were not joined ends before the supervisor is forked: podhost's
    // only child is then the supervisor (see `leftovers`).
    drop(init);
    let mut watch = Watch::new(signalfd, &req);
    if let Walled::Beside(beside) = walled {
        let status = in_namespace(&request, &mut watch, *beside)?;
        return outcome(watch, Some(status), "");
    }
    // What a supervisor killed outright leaves comes here, to be killed (see `leftovers`).
    super::reaper::become_subreaper()?;
    let (out_r, out_w) = super::sys::pipe()?;
    let (err_r, err_w) = super::sys::pipe()?;
    let (report_r, report_w) = UnixStream::pair()?;
    let supervisor = fork_supervisor(&request, out_w, err_w, report_w, watch.signals.as_fd())?;
    watch.pipes = [Some(nonblocking(out_r)?), Some(nonblocking(err_r)?)];
    let ended = watch.supervised(supervisor);
    // podhost's only child was the supervisor; any other is an orphan it left.
    leftovers();
    watch.drain(DRAIN_BOUND);
    let status = read_status(report_r);
    outcome(watch, status, &ended.to_string())
}

/// The init [`start_early`] started, until [`execute`] takes it.
static EARLY: Mutex<Option<Init>> = Mutex::new(None);

/// Starts the init of the command's namespaces now (see `nsinit`), so that the kernel makes
/// them and mounts their `/proc` on another CPU while this process reads the rest of its
/// configuration and prepares the call; [`execute`] takes it. For `podhost tool bash` once it
/// knows its command gets a view this process builds itself (root, or a user namespace of its
/// own). Where the kernel refuses the init, nothing is started and [`execute`] makes the
/// namespaces itself. Call it single-threaded; a call with no use for the init ends it with
/// [`end_early`], or leaves it to end with podhost.
pub fn start_early() {
    first_for_the_oom_killer();
    if let Some(init) = start_init() {
        *EARLY.lock().unwrap_or_else(PoisonError::into_inner) = Some(init);
    }
}

/// Ends the init [`start_early`] started, if [`execute`] did not take it: the whole namespace
/// with it, and podhost's only children are then its own commands' supervisors.
pub fn end_early() {
    drop(take_early());
}

/// Makes this process, and so the command and all it starts, the first the OOM killer takes
/// (as under the supervisor binary); a failure leaves the kernel's own choice. Once, and before
/// the init is started: the kernel gives a new score to every process that shares the
/// writer's memory, which it finds by a walk of every process on the host (some 175 µs with
/// 1,000 idle ones) once the init shares it.
fn first_for_the_oom_killer() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if !DONE.swap(true, Ordering::Relaxed) {
        let _ = std::fs::write("/proc/self/oom_score_adj", "1000");
    }
}

fn take_early() -> Option<Init> {
    EARLY.lock().unwrap_or_else(PoisonError::into_inner).take()
}

/// The init of a command's namespaces, or `None` where the kernel (or a failpoint) refuses it:
/// a supervisor runs the command then.
fn start_init() -> Option<Init> {
    let refused = |why: &dyn std::fmt::Display| {
        tracing::debug!("no PID namespace for the command ({why}): a supervisor runs it");
        None
    };
    if crate::failpoint_fails!("oneshot.pid_namespace_refused") {
        return refused(&"the failpoint oneshot.pid_namespace_refused");
    }
    match Init::start(crate::failpoint_fails!("oneshot.proc_refused")) {
        Ok(init) => Some(init),
        Err(e) => refused(&e),
    }
}

/// The command's outcome from how it ended (`status`: the supervisor's report, `None` when it
/// made none; `ended`: how the supervisor itself ended) and what `watch` saw.
fn outcome(watch: Watch, status: Option<Status>, ended: &str) -> Result<OneShot, ExecError> {
    let stopped = watch.stopped;
    let [out, err] = watch.captures;
    let (exit_code, timed_out, cancelled) = match (status, stopped) {
        (Some(Status::Error(message)), _) => return Err(ExecError::Start { message }),
        // Killed at podhost's asking (a second stop signal kills the supervisor too, so it may
        // not have reported).
        (Some(Status::Killed) | None, Some(Stop::TimedOut)) => (EXIT_TIMED_OUT, true, false),
        (Some(Status::Killed) | None, Some(Stop::Signal(_))) => (EXIT_CANCELLED, false, true),
        // Someone else sent the supervisor SIGTERM: reported as that signal, as on the
        // supervisor binary's path.
        (Some(Status::Killed), None) => (128 + libc::SIGTERM, false, false),
        (Some(Status::Exited(code)), _) => (code, false, false),
        (Some(Status::Signaled(sig)), _) => (128 + sig, false, false),
        (None, None) => {
            return Err(ExecError::Supervisor {
                message: format!("it ended ({ended}) without reporting how the command ended"),
            });
        }
    };
    Ok(OneShot {
        output: ExecOutput {
            exit_code,
            stdout: out.finish(),
            stderr: err.finish(),
            timed_out,
            cancelled,
            limit_note: None,
        },
        stopped_by: match stopped {
            Some(Stop::Signal(sig)) => Some(sig),
            _ => None,
        },
    })
}

/// Whether, and how, the command got its view ([`enter_view`]).
enum Walled {
    /// None: a supervisor runs the command under Landlock alone.
    No,
    /// Built in namespaces this process made: a supervisor runs the command in them.
    Here,
    /// Built in the init's namespaces, its PID namespace entered: the command runs there.
    Beside(Box<Beside>),
}

/// What runs the command in the init's PID namespace (see `nsinit`), once this process has
/// joined its mount and IPC namespaces and moved its next children into its PID namespace.
struct Beside {
    init: Init,
    start: Start,
    /// The read ends of the command's stdout and stderr.
    output: [OwnedFd; 2],
}

/// How the command's shell starts.
enum Start {
    /// Its child, started before the view is built, waits for the Landlock ruleset (see
    /// `exec::ahead`).
    Ahead(Ahead),
    /// From `supervise::spawn_shell` once the view is built (a command that changes user or
    /// holds no capability), with these write ends of its stdout and stderr.
    Here([OwnedFd; 2]),
}

impl Beside {
    /// In the init's namespaces, before the view is built: a session keyring of the command's
    /// own, its output pipes, the init's PID namespace for this process's next children, and
    /// the command's child started ahead. `None` where the kernel refuses the namespace's
    /// `/proc` or the namespace itself (`init` has ended then, and nothing else changed: the
    /// caller's supervisor runs the command).
    fn enter(request: &Request, mut init: Init) -> Result<Option<Beside>, ExecError> {
        // A session keyring of the command's own, never podhost's: this process has no use for
        // its caller's.
        super::confine::join_session_keyring().map_err(|e| ExecError::Start {
            message: format!("could not join a fresh session keyring: {e}"),
        })?;
        let (out_r, out_w) = super::sys::pipe()?;
        let (err_r, err_w) = super::sys::pipe()?;
        if let Err(e) = init.enter() {
            drop(init);
            tracing::debug!(
                "no PID namespace for the command (its /proc, or joining it: {e}): a supervisor \
                 runs it"
            );
            return Ok(None);
        }
        let failed = |e: &dyn std::fmt::Display| ExecError::Start {
            message: format!("could not start {} -c …: {e}", request.shell.display()),
        };
        let shedding = if crate::failpoint_fails!("oneshot.ahead_refused") {
            None
        } else {
            super::confine::Shedding::new(&request.confine)
                .map_err(|e| failed(&format_args!("could not confine the command: {e}")))?
        };
        let start = match shedding {
            Some(shedding) => {
                let image = supervise::shell_image(request)
                    .map_err(|e| failed(&e))?
                    .in_own_session()
                    .with_output(out_w, err_w);
                let limits = super::limits::Prepared::new(&request.limits).calls();
                let refuse_cwd = crate::failpoint_fails!("oneshot.ahead_cwd_refused");
                Start::Ahead(
                    Ahead::start(image, limits, shedding, refuse_cwd).map_err(|e| failed(&e))?,
                )
            }
            None => Start::Here([out_w, err_w]),
        };
        Ok(Some(Beside {
            init,
            start,
            output: [out_r, err_r],
        }))
    }

    /// Gives the attempt up when the view cannot be built: the command's child and the init
    /// end (and with them the PID namespace), and this process's next children are born in its
    /// own PID namespace again.
    #[allow(unsafe_code)]
    fn abandon(self) -> io::Result<()> {
        drop(self.start);
        drop(self.init);
        let own = super::sys::pidfd_open(std::process::id() as libc::pid_t)?;
        // SAFETY: setns on a descriptor owned here.
        if unsafe { libc::setns(own.as_raw_fd(), libc::CLONE_NEWPID) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Runs the command in the init's PID namespace (see [`Beside`]): no supervisor process, the
/// kernel kills the tree. How it ended.
fn in_namespace(request: &Request, watch: &mut Watch, beside: Beside) -> Result<Status, ExecError> {
    let Beside {
        init,
        start,
        output: [out_r, err_r],
    } = beside;
    let failed = |e: &dyn std::fmt::Display| ExecError::Start {
        message: format!("could not start {} -c …: {e}", request.shell.display()),
    };
    let shell = match start {
        Start::Ahead(ahead) => {
            // Now that the view is built: the rules hold the files they were opened on.
            let confine = super::confine::Prepared::new(&request.confine)
                .map_err(|e| failed(&format_args!("could not confine the command: {e}")))?;
            Pid::from_raw(ahead.go(confine.ruleset()).map_err(|e| failed(&e))?)
        }
        Start::Here(output) => {
            supervise::spawn_shell(request, ShellParent::Namespace, Some(output))
                .map_err(|e| failed(&e))?
        }
    };
    watch.pipes = [Some(nonblocking(out_r)?), Some(nonblocking(err_r)?)];
    let status = watch.namespaced(shell, init);
    watch.drain(DRAIN_BOUND);
    status
}

/// Forks the command's supervisor: it runs `supervise::in_fork` with the output pipes as its
/// stdout and stderr and the report socket, and never returns here. Returns its pid.
#[allow(unsafe_code)]
fn fork_supervisor(
    request: &super::protocol::Request,
    stdout: OwnedFd,
    stderr: OwnedFd,
    report: UnixStream,
    signalfd: BorrowedFd<'_>,
) -> Result<Pid, ExecError> {
    let parent = nix::unistd::getpid();
    crate::exec::confine::build_filter_ahead(request.confine.deny_network);
    // SAFETY: this process is single-threaded (see the module's invariants), so the child is a
    // whole copy of it: no lock can be held by a thread that did not survive the fork, and the
    // child may run ordinary code. It ends with `_exit`, never returning into the caller.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => Ok(child),
        nix::unistd::ForkResult::Child => {
            let code = match in_child(&stdout, &stderr, signalfd) {
                Ok(()) => supervise::in_fork(request, parent, report),
                Err(_) => 125,
            };
            // SAFETY: ends the forked child without running podhost's exit handlers or
            // flushing buffers that belong to the parent.
            unsafe { libc::_exit(code) }
        }
    }
}

/// The forked supervisor's descriptors: the output pipes become its stdout and stderr (for the
/// shell to inherit); podhost's signalfd is closed.
#[allow(unsafe_code)]
fn in_child(stdout: &OwnedFd, stderr: &OwnedFd, signalfd: BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    for (from, to) in [(stdout.as_raw_fd(), 1), (stderr.as_raw_fd(), 2)] {
        // SAFETY: dup2 onto the standard descriptors; both are plain integers owned by this
        // (child) process.
        if unsafe { libc::dup2(from, to) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: closes this child's copy of podhost's signalfd; nothing here uses it again.
    unsafe { libc::close(signalfd.as_raw_fd()) };
    Ok(())
}

/// Kills and reaps whatever this process adopted (the tree of a supervisor killed outright),
/// until none is left; only a child's presence makes it walk `/proc`.
fn leftovers() {
    let cap = Instant::now() + KILL_CAP;
    loop {
        match nix::sys::wait::waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            Err(nix::errno::Errno::ECHILD) => return,
            Ok(nix::sys::wait::WaitStatus::StillAlive) => {
                if Instant::now() >= cap {
                    tracing::warn!("processes a command left are still alive after {KILL_CAP:?}");
                    return;
                }
                super::reaper::sweep_all();
                std::thread::sleep(SWEEP_PAUSE);
            }
            // Reaped one; look again.
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

/// The supervisor's report: its status line, or `None` when it ended without one.
fn read_status(report: UnixStream) -> Option<Status> {
    let mut line = Vec::new();
    let _ = (&report)
        .take(super::protocol::MAX_STATUS_BYTES)
        .read_to_end(&mut line);
    Status::decode(&line)
}

/// Ends this process by `sig` as if it had never been blocked (SIGHUP, SIGQUIT, once the
/// command's tree was killed): its disposition as podhost was started with.
pub fn die_of(sig: Signal) -> ! {
    let _ = nix::sys::signal::raise(sig);
    let mut only = SigSet::empty();
    only.add(sig);
    let _ = only.thread_unblock();
    // Reached when that disposition ignores it.
    std::process::exit(128 + sig as i32)
}

/// SIGINT, SIGTERM and SIGCHLD at their default disposition, whatever podhost inherited (a
/// script's background job starts with SIGINT ignored): blocked, they are then queued for the
/// `signalfd` rather than discarded, as the async fronts' handlers catch them too.
#[allow(unsafe_code)]
fn default_dispositions() {
    use nix::sys::signal::{SigHandler, signal};
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGCHLD] {
        // SAFETY: SIG_DFL installs no handler, and this single-threaded process has none of its
        // own for these signals.
        let _ = unsafe { signal(sig, SigHandler::SigDfl) };
    }
}

/// Moves this process into fresh mount and IPC namespaces and builds the session's view there
/// (see `session::view`), before the command's Landlock rules are opened in it. The namespaces
/// are `init`'s, made beside this process (see `nsinit`), or made here where there is no init
/// or this process cannot join its namespaces. In the init's, before the view is built, this
/// process enters its PID namespace and starts the command's child ([`Beside::enter`]), which
/// sheds what the command must not have while the view is built.
///
/// Where the level was assumed rather than probed (`probe::assume_root_namespaces`), this
/// is the probe: if the kernel refuses the namespaces or a step of the view, this process
/// goes back to the namespaces it came from (and its working directory), and the command runs
/// without the view, as where a probe had found none. Where the level was probed, a failure
/// is the command's start failing.
fn enter_view(
    session: &SessionRequest,
    request: &Request,
    init: &mut Option<Init>,
) -> Result<Walled, ExecError> {
    let failed = |e: super::sys::StepError| ExecError::Session {
        message: format!("could not build the command view: {e}"),
    };
    // In a user namespace of this process's own, device nodes can only be bound, not made.
    let prepared =
        view::prepare(&session.view, false, super::sys::in_own_user_namespace()).map_err(failed)?;
    let build = || {
        if crate::failpoint_fails!("oneshot.view_fails") {
            return Err(super::sys::StepError::new(
                "build the view (the failpoint oneshot.view_fails)",
                libc::ENOSYS,
            ));
        }
        prepared.build()
    };
    let assumed = super::probe::namespaces_assumed();
    let refused = |e: super::sys::StepError| {
        tracing::debug!(
            "no read-only system for the command: {e}; Landlock alone confines its writes"
        );
    };
    // In a user namespace of its own, this process could not go back to the host's mount
    // namespace, which that user namespace does not own: nothing to note.
    let home = if !assumed || super::sys::in_own_user_namespace() {
        None
    } else {
        Some(Home::here().map_err(|e| ExecError::Session {
            message: format!("could not note this process's namespaces: {e}"),
        })?)
    };
    match make(init) {
        Ok(()) => {}
        // Refused at once: nothing changed.
        Err(e) if assumed => {
            refused(e);
            return Ok(Walled::No);
        }
        Err(e) => return Err(failed(e)),
    }
    let beside = match init.take() {
        Some(init) => Beside::enter(request, init)?,
        None => None,
    };
    let Err(e) = build() else {
        return Ok(match beside {
            Some(beside) => Walled::Beside(Box::new(beside)),
            None => Walled::Here,
        });
    };
    let abandoned = beside.map_or(Ok(()), Beside::abandon);
    if !assumed {
        return Err(failed(e));
    }
    let Some(home) = home else {
        return Err(ExecError::Session {
            message: format!(
                "could not build the command view ({e}); in a user namespace of its own, \
                 podhost cannot return to the host's mount namespace"
            ),
        });
    };
    abandoned
        .and_then(|()| home.go_back())
        .map_err(|back| ExecError::Session {
            message: format!(
                "could not build the command view ({e}), nor return to podhost's namespaces: {back}"
            ),
        })?;
    refused(e);
    Ok(Walled::No)
}

/// Moves this process into fresh mount and IPC namespaces: `init`'s, or, where there is none
/// or this process cannot join its namespaces, made here (`init` is emptied then). `Err`: the
/// kernel refused them, and nothing changed.
fn make(init: &mut Option<Init>) -> Result<(), super::sys::StepError> {
    const STEP: &str = "make the command's namespaces";
    if crate::failpoint_fails!("oneshot.view_refused") {
        return Err(super::sys::StepError::new(
            "make the command's namespaces (the failpoint oneshot.view_refused)",
            libc::EPERM,
        ));
    }
    if let Some(beside) = init.as_mut() {
        let joined = if crate::failpoint_fails!("oneshot.join_fails") {
            Err(NotJoined::Failed(io::Error::from_raw_os_error(
                libc::EINVAL,
            )))
        } else {
            beside.join()
        };
        match joined {
            Ok(()) => return Ok(()),
            Err(NotJoined::Refused(errno)) => return Err(super::sys::StepError::new(STEP, errno)),
            Err(NotJoined::Failed(e)) => {
                tracing::debug!(
                    "could not join the namespaces of the command's init ({e}): made here"
                );
                *init = None;
            }
        }
    }
    super::sys::unshare(STEP, libc::CLONE_NEWNS | libc::CLONE_NEWIPC)
}

/// The mount and IPC namespaces and the working directory this process had before
/// [`enter_view`], to go back to when the view cannot be built.
struct Home {
    mount: OwnedFd,
    ipc: OwnedFd,
    cwd: OwnedFd,
}

impl Home {
    fn here() -> io::Result<Home> {
        let open = |path: &str, dir: bool| {
            let mut options = std::fs::OpenOptions::new();
            options.read(true);
            if dir {
                std::os::unix::fs::OpenOptionsExt::custom_flags(
                    &mut options,
                    libc::O_DIRECTORY | libc::O_PATH,
                );
            }
            options.open(path).map(OwnedFd::from)
        };
        Ok(Home {
            mount: open("/proc/self/ns/mnt", false)?,
            ipc: open("/proc/self/ns/ipc", false)?,
            cwd: open(".", true)?,
        })
    }

    /// Enters the namespaces noted and the working directory (this process is
    /// single-threaded, as `setns` into a mount namespace demands).
    #[allow(unsafe_code)]
    fn go_back(self) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        // SAFETY: plain system calls on descriptors this value owns.
        unsafe {
            if libc::setns(self.mount.as_raw_fd(), libc::CLONE_NEWNS) != 0
                || libc::setns(self.ipc.as_raw_fd(), libc::CLONE_NEWIPC) != 0
                || libc::fchdir(self.cwd.as_raw_fd()) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// A shell's exit status as a supervisor reports it.
fn shell_status(status: ExitStatus) -> Status {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => Status::Exited(code),
        (None, Some(sig)) => Status::Signaled(sig),
        (None, None) => Status::Killed,
    }
}

/// The supervisor's exit status, once it has ended (and is reaped).
#[allow(unsafe_code)]
fn try_wait(pid: Pid) -> Option<ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let mut status = 0;
    loop {
        // SAFETY: waitpid writes the status into a live local.
        let rc = unsafe { libc::waitpid(pid.as_raw(), &mut status, libc::WNOHANG) };
        match rc {
            0 => return None,
            r if r == pid.as_raw() => return Some(ExitStatus::from_raw(status)),
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            // Not our child any more (cannot happen): treat it as ended without a status.
            _ => return Some(ExitStatus::from_raw(status)),
        }
    }
}

/// A pipe's read end, non-blocking.
fn nonblocking(fd: OwnedFd) -> io::Result<File> {
    let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let flags = nix::fcntl::OFlag::from_bits_retain(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    Ok(File::from(fd))
}

/// Marks every descriptor above stderr close-on-exec: whatever podhost's own parent leaked into
/// podhost must not reach the command (the supervisor binary closes them at its start).
#[allow(unsafe_code)]
fn cloexec_stray_fds() {
    const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it reads
    // and writes no memory.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if rc == 0 {
        return;
    }
    // A kernel before 5.11: one at a time.
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on a descriptor number; a closed one (the directory's own) fails.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

/// podhost tool's wait: the signals (on a `signalfd`), the output pipes and the deadline, all
/// in one `poll`.
struct Watch {
    signals: SignalFd,
    /// stdout and stderr, `None` once at their end.
    pipes: [Option<File>; 2],
    captures: [StreamCapture; 2],
    deadline: Instant,
    /// The first reason the tree was stopped.
    stopped: Option<Stop>,
    /// A stop signal came after the tree was already being stopped: no grace.
    hurried: bool,
    /// Where a read lands: [`FIRST_READ`] bytes at first, doubled by each read that fills it.
    buf: Vec<u8>,
}

impl Watch {
    /// Watches `signals` and `req`'s deadline; the pipes are set once the command starts.
    fn new(signals: SignalFd, req: &ExecRequest) -> Watch {
        Watch {
            signals,
            pipes: [None, None],
            captures: [
                StreamCapture::new(req.stream_chars),
                StreamCapture::new(req.stream_chars),
            ],
            deadline: Instant::now() + req.timeout,
            stopped: None,
            hurried: false,
            buf: vec![0; FIRST_READ],
        }
    }

    /// Reads the output and keeps the deadline and the stop signals until nothing of the
    /// command runs in its PID namespace (`init`'s), as a supervisor would: what the shell
    /// leaves gets [`LINGER`] to end by itself; then, or at the first stop, SIGTERM to every
    /// process there, and [`TERM_GRACE`] (cut short by a second stop signal) before the init's
    /// end kills them all. How the shell ended (`Killed` when a stop came while it or what it
    /// left still ran); `Err` when the init ended before podhost ended it (something outside
    /// killed it, and the kernel the whole namespace): a fault, not the command's end.
    fn namespaced(&mut self, shell: Pid, mut init: Init) -> Result<Status, ExecError> {
        let mut status = None;
        let (mut linger, mut termed, mut by_stop) = (None, None, false);
        loop {
            if status.is_none() {
                status = try_wait(shell).map(shell_status);
            }
            // The init still running after the list showed no child means the list was true
            // (its death would have killed the command too).
            if let Some(status) = status.take_if(|_| !init.children_left() && init.alive()) {
                // Nothing of the command is left: the init ends with this process.
                init.detach();
                return Ok(if by_stop { Status::Killed } else { status });
            }
            if !init.alive() {
                init.end(status.is_none().then_some(shell.as_raw()), KILL_CAP);
                return Err(ExecError::Supervisor {
                    message: "the init of the command's PID namespace ended before the command \
                              did"
                    .to_owned(),
                });
            }
            let now = Instant::now();
            if status.is_some() && linger.is_none() {
                linger = Some(now + LINGER);
            }
            if termed.is_none() && (self.stopped.is_some() || linger.is_some_and(|l| now >= l)) {
                by_stop = self.stopped.is_some();
                init.term_all();
                termed = Some(now);
            }
            if self.hurried || termed.is_some_and(|t| now >= t + TERM_GRACE) {
                break;
            }
            // The shell's end wakes the wait (SIGCHLD); what it left is looked at every
            // `POLL_STEP`.
            self.wait((status.is_some() || termed.is_some()).then_some(POLL_STEP));
        }
        init.end(status.is_none().then_some(shell.as_raw()), KILL_CAP);
        Ok(match (by_stop, status) {
            (false, Some(status)) => status,
            _ => Status::Killed,
        })
    }

    /// Reads the output and keeps the deadline and the stop signals until the supervisor has
    /// ended: SIGTERM to it at the first stop (it kills the tree and reports), SIGKILL at a
    /// second stop signal. How it ended.
    fn supervised(&mut self, supervisor: Pid) -> ExitStatus {
        let (mut termed, mut killed) = (false, false);
        loop {
            if let Some(status) = try_wait(supervisor) {
                return status;
            }
            if self.stopped.is_some() && !termed {
                termed = true;
                let _ = kill(supervisor, Signal::SIGTERM);
            }
            if self.hurried && !killed {
                killed = true;
                let _ = kill(supervisor, Signal::SIGKILL);
            }
            self.wait(None);
        }
    }

    /// Waits once for a signal, output or the deadline (for at most `cap`), and takes what
    /// came.
    fn wait(&mut self, cap: Option<Duration>) {
        let now = Instant::now();
        if self.stopped.is_none() && now >= self.deadline {
            self.stopped = Some(Stop::TimedOut);
            return;
        }
        let limit = self.stopped.is_none().then(|| self.deadline - now);
        let limit = match (limit, cap) {
            (Some(l), Some(c)) => Some(l.min(c)),
            (l, c) => l.or(c),
        };
        let (signalled, ready) = self.poll(limit, true);
        self.read_ready(ready);
        if signalled {
            self.take_signals();
        }
    }

    /// Polls the signalfd (when `signals`) and the open pipes for at most `timeout`: whether a
    /// signal is pending, and which pipes are readable (or at their end).
    fn poll(&mut self, timeout: Option<Duration>, signals: bool) -> (bool, [bool; 2]) {
        let mut fds = Vec::with_capacity(3);
        let mut which = Vec::with_capacity(3);
        if signals {
            fds.push(PollFd::new(self.signals.as_fd(), PollFlags::POLLIN));
            which.push(None);
        }
        for (i, pipe) in self.pipes.iter().enumerate() {
            if let Some(p) = pipe {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
                which.push(Some(i));
            }
        }
        let timeout = match timeout {
            None => PollTimeout::NONE,
            // Rounded up, so a wait never ends just before its deadline and spins.
            Some(d) => {
                PollTimeout::try_from(d.as_micros().div_ceil(1000)).unwrap_or(PollTimeout::MAX)
            }
        };
        let (mut signalled, mut ready) = (false, [false; 2]);
        match poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return (false, ready),
            Err(_) => {
                // Nothing else is documented; do not spin on it.
                std::thread::sleep(Duration::from_millis(10));
                return (false, ready);
            }
        }
        for (fd, w) in fds.iter().zip(&which) {
            if fd.revents().is_some_and(|r| !r.is_empty()) {
                match w {
                    None => signalled = true,
                    Some(i) => ready[*i] = true,
                }
            }
        }
        (signalled, ready)
    }

    /// Reads what the ready pipes hold into their captures, closing a pipe at its end.
    fn read_ready(&mut self, ready: [bool; 2]) {
        for (i, r) in ready.into_iter().enumerate() {
            if !r {
                continue;
            }
            let Some(pipe) = self.pipes[i].as_mut() else {
                continue;
            };
            let mut ended = false;
            for _ in 0..READS_PER_WAKE {
                match pipe.read(&mut self.buf) {
                    Ok(0) => {
                        ended = true;
                        break;
                    }
                    Ok(n) => {
                        self.captures[i].push(&self.buf[..n]);
                        if n == self.buf.len() && n < READ_CHUNK {
                            self.buf.resize((2 * n).min(READ_CHUNK), 0);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // A read error ends the stream: what was read so far is kept.
                    Err(_) => {
                        ended = true;
                        break;
                    }
                }
            }
            if ended {
                self.pipes[i] = None;
            }
        }
    }

    /// Reads every pending signal: a stop signal notes the stop (a second one hurries it);
    /// SIGCHLD only wakes the caller.
    fn take_signals(&mut self) {
        while let Ok(Some(info)) = self.signals.read_signal() {
            let Ok(sig) = Signal::try_from(info.ssi_signo as i32) else {
                continue;
            };
            if sig != Signal::SIGCHLD {
                // A second stop signal (as after a first Ctrl-C) kills what is left at once.
                self.hurried |= self.stopped.is_some();
                self.stopped.get_or_insert(Stop::Signal(sig));
            }
        }
    }

    /// Reads the pipes to their end, for at most `bound` (no descendant is left, so only a
    /// process stuck in the kernel could still hold them).
    fn drain(&mut self, bound: Duration) {
        let end = Instant::now() + bound;
        while self.pipes.iter().any(Option::is_some) {
            let now = Instant::now();
            if now >= end {
                tracing::warn!("command output still open after its tree was killed");
                self.pipes = [None, None];
                return;
            }
            let (_, ready) = self.poll(Some(end - now), false);
            self.read_ready(ready);
        }
    }
}
