//! A command's child started ahead of its view (`podhost tool bash` in a PID namespace, see
//! `exec::oneshot`): it sheds on another CPU what the command must not have while podhost
//! builds the view and the Landlock ruleset, then takes the ruleset and execs the shell.
//!
//! Owns: starting the child ([`Ahead::start`]), what it does on its own, handing it the ruleset
//! ([`Ahead::go`]), and learning whether it exec'ed.
//!
//! How it works:
//! * podhost starts the child (`clone(CLONE_VM)`, beside it: not suspended as by `vfork`) once
//!   it is in the command's namespaces, before it builds the view, and moves it off its CPU (as
//!   the init, see `nsinit`).
//! * The child, on its own: a session of its own (`setsid`), every signal's default
//!   disposition and an empty mask, the resource limits, root's capabilities shed (the bounding,
//!   ambient and inheritable sets), `no_new_privs`, then the system-call filter. These are the
//!   steps and values `supervise::spawn_shell` applies in a `vfork` child, but for Landlock,
//!   and in an order that lets the filter go first: every later call of the child (`recvmsg`,
//!   `landlock_restrict_self`, `close`, `dup3`, `chdir`, `execve`, and `write` and `exit` on
//!   failure) is one the filter lets through.
//! * Meanwhile podhost builds the view and the command's Landlock ruleset, and sends the ruleset
//!   over a socket (`SCM_RIGHTS`), having given the child back every CPU it may run on: the
//!   child enforces the ruleset, takes its stdin, stdout and stderr, enters its working
//!   directory (in the view, now built) and execs the shell.
//! * A step that fails: the child writes which and the errno on a pipe and exits with 127; the
//!   pipe's end with nothing written is the exec (it is close-on-exec).
//!
//! Invariants:
//! * The child shares podhost's memory, its thread-local storage and `errno` included: it makes
//!   raw system calls only, as the init does, allocates nothing and runs nothing that may
//!   panic. It reads what podhost prepared ([`Ahead`] keeps it alive and unchanged until the
//!   child has exec'ed or ended) and writes its own stack only.
//! * The command gets the same walls as through `supervise::spawn_shell`: the same filter, the
//!   same capabilities, limits, signal state and Landlock ruleset, a session of its own, its
//!   descriptors above stderr closed at its exec.
//!
//! Non-goals: a command that runs as another user or without any capability (its credentials
//! change in ways the filter would refuse after it): those start through `spawn_shell`.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use seccompiler::sock_filter;

use super::confine::Shedding;
use super::nsinit::{Cpus, raw};
use super::sys::{CAP_V3, CapHeader};
use super::vspawn::Image;

/// The child's stack: its frames are a few hundred bytes.
const STACK: usize = 32 * 1024;

/// The child's steps, in order; on failure it writes the step's number first.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
enum Step {
    Session = 1,
    Signals,
    Limits,
    NoNewPrivs,
    Capabilities,
    Filter,
    Ruleset,
    Landlock,
    Descriptors,
    Cwd,
    Exec,
}

impl Step {
    /// The step numbered `n` (an exec's failure for a number the child never writes).
    fn numbered(n: i32) -> Step {
        let mut step = Step::Session;
        while (step as i32) < n && step != Step::Exec {
            step = step.next();
        }
        step
    }

    /// The step after this one (the exec is the last).
    fn next(self) -> Step {
        match self {
            Step::Session => Step::Signals,
            Step::Signals => Step::Limits,
            Step::Limits => Step::NoNewPrivs,
            Step::NoNewPrivs => Step::Capabilities,
            Step::Capabilities => Step::Filter,
            Step::Filter => Step::Ruleset,
            Step::Ruleset => Step::Landlock,
            Step::Landlock => Step::Descriptors,
            Step::Descriptors => Step::Cwd,
            Step::Cwd | Step::Exec => Step::Exec,
        }
    }

    /// What the step gives the child, for an error's words.
    fn name(self) -> &'static str {
        match self {
            Step::Session => "a session of its own",
            Step::Signals => "its signal dispositions",
            Step::Limits => "its resource limits",
            Step::NoNewPrivs => "no_new_privs",
            Step::Capabilities => "shedding capabilities",
            Step::Filter => "the system-call filter",
            Step::Ruleset => "receiving the Landlock ruleset",
            Step::Landlock => "the Landlock ruleset",
            Step::Descriptors => "its stdin, stdout and stderr",
            Step::Cwd => "its working directory",
            Step::Exec => "exec",
        }
    }
}

/// What the child reads: prepared before it starts, unchanged until it has exec'ed or ended.
struct Plan {
    image: Image,
    /// `setrlimit` calls: resource and value (soft and hard).
    limits: Vec<(u32, u64)>,
    shedding: Shedding,
    /// The child's end of the socket the ruleset comes on.
    ruleset: RawFd,
    /// The write end of the pipe the child reports a failed step on.
    failed: RawFd,
    /// Act as if the kernel refused the working directory (the failpoint
    /// `oneshot.ahead_cwd_refused`): a step after the filter and the ruleset fails.
    refuse_cwd: bool,
}

/// A command's child started ahead of its view, until it has exec'ed.
pub struct Ahead {
    pid: libc::pid_t,
    /// The CPUs it gets back when it is sent on its way: those of this process.
    cpus: Option<Cpus>,
    /// podhost's end of the socket the ruleset goes on.
    ruleset: UnixStream,
    /// The read end of the pipe of failures; its end with nothing on it is the exec.
    failed: OwnedFd,
    /// This process's copies of the child's ends, closed once the ruleset is sent (then the
    /// child's own copy of the pipe is the only writer left).
    theirs: Option<[OwnedFd; 2]>,
    /// Read by the child; boxed so that it does not move. Freed after [`Drop`] has killed a
    /// child that is still there (fields drop after it).
    _plan: Box<Plan>,
    /// The child's stack, freed likewise.
    _stack: Vec<u8>,
}

impl Ahead {
    /// Starts the child of `image` (its stdin, stdout and stderr open, a session of its own),
    /// which applies `limits` and `shedding` on its own, then waits for [`go`](Self::go); it
    /// acts as if the kernel refused its working directory when `refuse_cwd`. The caller is
    /// single-threaded and already in the command's namespaces (the child is born in them).
    /// `Err`: nothing was started.
    #[allow(unsafe_code)]
    pub fn start(
        image: Image,
        limits: Vec<(u32, u64)>,
        shedding: Shedding,
        refuse_cwd: bool,
    ) -> io::Result<Ahead> {
        let (ours, theirs) = UnixStream::pair()?;
        let (failed, report) = super::sys::pipe()?;
        let theirs = OwnedFd::from(theirs);
        let plan = Box::new(Plan {
            image,
            limits,
            shedding,
            ruleset: theirs.as_raw_fd(),
            failed: report.as_raw_fd(),
            refuse_cwd,
        });
        let mut stack: Vec<u8> = Vec::with_capacity(STACK);
        let top = (stack.as_mut_ptr() as usize + STACK) & !15;
        // SAFETY: `entry` runs on `stack` and reads `plan`, both kept by the returned value
        // until the child has exec'ed or ended (see `Drop`); it makes raw system calls only
        // (see the module's invariants).
        let pid = unsafe {
            libc::clone(
                entry,
                top as *mut libc::c_void,
                libc::CLONE_VM | libc::SIGCHLD,
                (&raw const *plan).cast_mut().cast::<libc::c_void>(),
            )
        };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        let cpus = super::nsinit::elsewhere(pid);
        Ok(Ahead {
            pid,
            cpus,
            ruleset: ours,
            failed,
            theirs: Some([theirs, report]),
            _plan: plan,
            _stack: stack,
        })
    }

    /// Hands the child the command's Landlock ruleset (`None`: no Landlock) once the view is
    /// built; returns its pid once it has exec'ed the shell. `Err`: a step failed (the child is
    /// reaped then) or it could not be reached; the error names the step.
    pub fn go(mut self, ruleset: Option<&OwnedFd>) -> io::Result<libc::pid_t> {
        // Before this process waits for it: where the other CPUs are busy, it may run here.
        if let Some(cpus) = self.cpus.take() {
            super::nsinit::everywhere(self.pid, &cpus);
        }
        let sent = send(&self.ruleset, ruleset.map(AsRawFd::as_raw_fd));
        self.theirs = None;
        let words = super::sys::read_two_words(self.failed.as_raw_fd())?;
        let pid = std::mem::replace(&mut self.pid, 0);
        if words == Err(0) {
            // Exec'ed (having read the ruleset), or killed before it could say otherwise.
            if sent.is_err() {
                let _ = super::sys::wait(pid, 0);
            }
            return sent.map(|()| pid);
        }
        let _ = super::sys::wait(pid, 0);
        let (step, errno) = match words {
            Ok([step, errno]) => (Step::numbered(step), errno),
            Err(_) => (Step::Exec, libc::EIO),
        };
        let e = io::Error::from_raw_os_error(errno);
        if step == Step::Exec {
            return Err(e);
        }
        Err(io::Error::new(e.kind(), format!("{}: {e}", step.name())))
    }
}

impl Drop for Ahead {
    /// A child never sent on its way is killed and reaped before its stack and plan are freed.
    fn drop(&mut self) {
        if self.pid > 0 {
            super::sys::kill_now(self.pid);
            let _ = super::sys::wait(self.pid, 0);
        }
    }
}

/// Sends the ruleset descriptor (or nothing: one byte alone says there is none) on `socket`.
#[allow(unsafe_code)]
fn send(socket: &UnixStream, fd: Option<RawFd>) -> io::Result<()> {
    let byte = [u8::from(fd.is_some())];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr().cast_mut().cast(),
        iov_len: 1,
    };
    // Room for one descriptor's control message, aligned as the kernel reads it.
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; every pointer in it names a live local of the right size.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        }
        if libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The child (see the module doc): its steps, a failure written on the pipe. Raw system calls
/// only, nothing that may panic (see the module's invariants).
#[allow(unsafe_code)]
extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the plan `Ahead::start` passed, alive and unchanged while the child runs.
    let plan = unsafe { &*arg.cast::<Plan>() };
    match steps(plan) {
        Ok(()) => 0,
        Err((step, ret)) => {
            let words: [i32; 2] = [step as i32, ret.wrapping_neg() as i32];
            raw::syscall(
                libc::SYS_write as usize,
                [
                    plan.failed as usize,
                    words.as_ptr() as usize,
                    size_of_val(&words),
                    0,
                    0,
                ],
            );
            127
        }
    }
}

/// The child's steps up to the exec, which returns only on failure: the step and the kernel's
/// (negative) return value.
fn steps(plan: &Plan) -> Result<(), (Step, isize)> {
    shed_ahead(plan)?;
    take_over(plan)
}

/// A failed step when the kernel's return value `ret` is negative.
fn check(step: Step, ret: isize) -> Result<isize, (Step, isize)> {
    if ret < 0 { Err((step, ret)) } else { Ok(ret) }
}

/// What the child sheds before its ruleset exists: its session, signal state, limits and
/// capabilities, then the system-call filter.
fn shed_ahead(plan: &Plan) -> Result<(), (Step, isize)> {
    if plan.image.session {
        check(
            Step::Session,
            raw::syscall(libc::SYS_setsid as usize, [0; 5]),
        )?;
    }
    // Every disposition the default (an all-zero kernel sigaction): an ignored one survives the
    // exec; then the mask empty (podhost's blocks the stop signals).
    let default_action = [0u64; 4];
    for sig in 1..=64usize {
        if sig != libc::SIGKILL as usize && sig != libc::SIGSTOP as usize {
            raw::syscall(
                libc::SYS_rt_sigaction as usize,
                [sig, default_action.as_ptr() as usize, 0, 8, 0],
            );
        }
    }
    let empty = 0u64;
    check(
        Step::Signals,
        raw::syscall(
            libc::SYS_rt_sigprocmask as usize,
            [
                libc::SIG_SETMASK as usize,
                (&raw const empty) as usize,
                0,
                8,
                0,
            ],
        ),
    )?;
    for &(resource, value) in &plan.limits {
        let limit = [value, value];
        check(
            Step::Limits,
            raw::syscall(
                libc::SYS_prlimit64 as usize,
                [0, resource as usize, limit.as_ptr() as usize, 0, 0],
            ),
        )?;
    }
    check(
        Step::NoNewPrivs,
        raw::syscall(
            libc::SYS_prctl as usize,
            [libc::PR_SET_NO_NEW_PRIVS as usize, 1, 0, 0, 0],
        ),
    )?;
    shed(&plan.shedding).map_err(|ret| (Step::Capabilities, ret))?;
    let filter: &[sock_filter] = &plan.shedding.filter;
    #[repr(C)]
    struct Fprog {
        len: libc::c_ushort,
        filter: *const sock_filter,
    }
    let program = Fprog {
        len: filter.len() as libc::c_ushort,
        filter: filter.as_ptr(),
    };
    check(
        Step::Filter,
        raw::syscall(
            libc::SYS_seccomp as usize,
            [
                libc::SECCOMP_SET_MODE_FILTER as usize,
                0,
                (&raw const program) as usize,
                0,
                0,
            ],
        ),
    )?;
    Ok(())
}

/// Once the view is built: the ruleset received and enforced, the standard descriptors and the
/// working directory taken, the exec.
fn take_over(plan: &Plan) -> Result<(), (Step, isize)> {
    let image = &plan.image;
    if let Some(ruleset) = receive(plan.ruleset).map_err(|ret| (Step::Ruleset, ret))? {
        check(
            Step::Landlock,
            raw::syscall(
                libc::SYS_landlock_restrict_self as usize,
                [ruleset as usize, 0, 0, 0, 0],
            ),
        )?;
        raw::syscall(libc::SYS_close as usize, [ruleset as usize, 0, 0, 0, 0]);
    }
    let dup = |from: RawFd, to: usize| {
        check(
            Step::Descriptors,
            raw::syscall(libc::SYS_dup3 as usize, [from as usize, to, 0, 0, 0]),
        )
    };
    dup(image.stdin.as_raw_fd(), 0)?;
    if let Some([out, err]) = &image.output {
        dup(out.as_raw_fd(), 1)?;
        dup(err.as_raw_fd(), 2)?;
    }
    let entered = if plan.refuse_cwd {
        -(libc::EPERM as isize)
    } else {
        raw::syscall(
            libc::SYS_chdir as usize,
            [image.cwd.as_ptr() as usize, 0, 0, 0, 0],
        )
    };
    check(Step::Cwd, entered)?;
    let ret = raw::syscall(
        libc::SYS_execve as usize,
        [
            image.path.as_ptr() as usize,
            image.argv_ptrs.as_ptr() as usize,
            image.envp_ptrs.as_ptr() as usize,
            0,
            0,
        ],
    );
    Err((Step::Exec, ret))
}

/// Sheds root's capabilities as `confine::Prepared` does for a root command: the bounding set
/// but what is kept (each capability read first: a drop copies the credentials), the ambient
/// set, then the inheritable set by `capset`. Nothing for a command that is not root.
fn shed(shedding: &Shedding) -> Result<(), isize> {
    let Some(caps) = &shedding.caps else {
        return Ok(());
    };
    let prctl = |option: libc::c_int, arg: usize| {
        raw::syscall(libc::SYS_prctl as usize, [option as usize, arg, 0, 0, 0])
    };
    for &cap in &shedding.bounding {
        if prctl(libc::PR_CAPBSET_READ, cap as usize) == 1 {
            let ret = prctl(libc::PR_CAPBSET_DROP, cap as usize);
            // EINVAL: a capability this kernel lacks.
            if ret < 0 && ret != -(libc::EINVAL as isize) {
                return Err(ret);
            }
        }
    }
    raw::syscall(
        libc::SYS_prctl as usize,
        [
            libc::PR_CAP_AMBIENT as usize,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as usize,
            0,
            0,
            0,
        ],
    );
    let header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let ret = raw::syscall(
        libc::SYS_capset as usize,
        [
            (&raw const header) as usize,
            caps.as_ptr() as usize,
            0,
            0,
            0,
        ],
    );
    if ret < 0 { Err(ret) } else { Ok(()) }
}

/// Waits for podhost's byte on `socket`, and the ruleset descriptor it carries when it is 1.
/// `Err`: the kernel's return value (0, podhost's end, as `EPIPE`).
#[allow(unsafe_code)]
fn receive(socket: RawFd) -> Result<Option<RawFd>, isize> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    // SAFETY: an all-zero msghdr is valid; its pointers then name live locals of the right sizes.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control) as _;
    let ret = loop {
        let ret = raw::syscall(
            libc::SYS_recvmsg as usize,
            [
                socket as usize,
                (&raw mut msg) as usize,
                libc::MSG_CMSG_CLOEXEC as usize,
                0,
                0,
            ],
        );
        if ret != -(libc::EINTR as isize) {
            break ret;
        }
    };
    match ret {
        1 => {}
        0 => return Err(-(libc::EPIPE as isize)),
        ret => return Err(ret),
    }
    if byte[0] == 0 {
        return Ok(None);
    }
    // SAFETY: the kernel filled `msg`'s control buffer; CMSG_FIRSTHDR and CMSG_DATA are pointer
    // arithmetic within it (no C library call), read only when the header says SCM_RIGHTS.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        if cmsg.is_null()
            || (*cmsg).cmsg_level != libc::SOL_SOCKET
            || (*cmsg).cmsg_type != libc::SCM_RIGHTS
        {
            return Err(-(libc::EBADMSG as isize));
        }
        Ok(Some(std::ptr::read_unaligned(
            libc::CMSG_DATA(cmsg).cast::<RawFd>(),
        )))
    }
}
