//! Starting a command's shell the way `posix_spawn` does — a child that shares the supervisor's
//! memory until it execs (`clone(CLONE_VM | CLONE_VFORK)`) — with the confinement steps run in
//! that child before the exec.
//!
//! Owns: the clone, the child's fixed steps (stdin from `/dev/null`, working directory, process
//! group or session, stdout and stderr), the caller's pre-exec steps, the exec, and getting the
//! child's failure back.
//!
//! Why not `std::process::Command`: with a pre-exec closure it forks, copying the supervisor's
//! page tables and turning every page either side writes next into a copy, then throws the copy
//! away at the exec. On a virtual machine that is a tenth of a command's cost; a shared address
//! space costs nothing of the kind (a supervisor forked from podhost itself, as `podhost tool`'s
//! is, has a large one).
//!
//! Invariants:
//! * The caller is single-threaded (every supervisor is; the unit tests' threads never touch
//!   what the child reads), so no lock of this process is held by a thread the child cannot
//!   see, and the parent is suspended while the child runs: the child may read the parent's
//!   memory freely, and writes only its own stack and [`Failure`].
//! * Everything the child needs is prepared before the clone: it allocates nothing and calls
//!   only async-signal-safe functions (raw system calls), the pre-exec steps included.
//! * The child has its own descriptor table, working directory, signal handlers and
//!   credentials (no `CLONE_FILES`, `CLONE_FS`, `CLONE_SIGHAND`, `CLONE_THREAD`): what it
//!   changes there is its own.
//! * Signal handlers are reset to their defaults before the signal mask is emptied, so no
//!   handler of the parent's can run on the child's stack.
//! * One thing the child does reaches the parent: the kernel keeps "dumpable" with the memory,
//!   so a child that changes its user makes the supervisor non-dumpable too (its `/proc` files
//!   then belong to root, and no process of the command's user may read them), which only
//!   narrows what a command can see.
//!
//! Non-goals: a general process API (stdout and stderr are inherited as they are).

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

/// The child's stack: its own steps and the kernel's exec need little; the pages it never
/// touches are never made.
const CHILD_STACK: usize = 256 * 1024;

/// What the child execs, prepared before the clone.
pub struct Image {
    pub(super) path: CString,
    /// The strings `argv_ptrs` points into, kept alive with it.
    _argv: Vec<CString>,
    pub(super) argv_ptrs: Vec<*const libc::c_char>,
    /// The strings `envp_ptrs` points into.
    _envp: Vec<CString>,
    pub(super) envp_ptrs: Vec<*const libc::c_char>,
    pub(super) cwd: CString,
    pub(super) stdin: OwnedFd,
    /// A session of the child's own (`setsid`), not only a process group.
    pub(super) session: bool,
    /// The child's stdout and stderr, when not the caller's own.
    pub(super) output: Option<[OwnedFd; 2]>,
}

impl Image {
    /// `program` run with `args` (`argv[0]` is `program` as given), exactly the environment `env`,
    /// in `cwd`, its stdin `/dev/null`. A NUL byte anywhere is refused here, as `exec` would.
    pub fn new<'a>(
        program: &Path,
        args: impl IntoIterator<Item = &'a OsStr>,
        env: impl IntoIterator<Item = (&'a OsStr, &'a OsStr)>,
        cwd: &Path,
    ) -> io::Result<Image> {
        let c = |bytes: &[u8]| {
            CString::new(bytes).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in an argument")
            })
        };
        let env: Vec<_> = env.into_iter().collect();
        let mut argv = vec![c(program.as_os_str().as_bytes())?];
        let path = c(search_path(program, &env).as_os_str().as_bytes())?;
        for a in args {
            argv.push(c(a.as_bytes())?);
        }
        let mut envp = Vec::new();
        for (k, v) in env {
            let mut pair = k.as_bytes().to_vec();
            pair.push(b'=');
            pair.extend_from_slice(v.as_bytes());
            envp.push(c(&pair)?);
        }
        let null_terminated = |strings: &[CString]| {
            let mut ptrs: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
            ptrs.push(std::ptr::null());
            ptrs
        };
        let argv_ptrs = null_terminated(&argv);
        let envp_ptrs = null_terminated(&envp);
        let stdin = std::fs::File::open("/dev/null")?.into();
        Ok(Image {
            path,
            _argv: argv,
            argv_ptrs,
            _envp: envp,
            envp_ptrs,
            cwd: c(cwd.as_os_str().as_bytes())?,
            stdin,
            session: false,
            output: None,
        })
    }

    /// The child's stdout and stderr are `stdout` and `stderr`, not the caller's own (this
    /// process's copies close with the image).
    pub fn with_output(mut self, stdout: OwnedFd, stderr: OwnedFd) -> Image {
        self.output = Some([stdout, stderr]);
        self
    }

    /// The child starts a session of its own (`setsid`: its own process group, no controlling
    /// terminal) instead of only a process group in the caller's session.
    pub fn in_own_session(mut self) -> Image {
        self.session = true;
        self
    }
}

/// `program` as `execvp` would find it: a name without a slash is looked up in the `PATH` of
/// the environment it will run with (else the usual system directories); anything else, or a
/// name found nowhere (the exec then fails with `ENOENT`), is used as it is.
fn search_path(program: &Path, env: &[(&OsStr, &OsStr)]) -> std::path::PathBuf {
    if program.as_os_str().as_bytes().contains(&b'/') || program.as_os_str().is_empty() {
        return program.to_path_buf();
    }
    let path = env
        .iter()
        .find(|(k, _)| k.as_bytes() == b"PATH")
        .map_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"), |(_, v)| v);
    std::env::split_paths(path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| program.to_path_buf())
}

/// Where the child leaves its error before it exits: the step and the errno. The parent reads it
/// once the clone returns, which is after the child has exec'ed or exited.
struct Failure {
    step: AtomicI32,
    errno: AtomicI32,
}

/// The child's steps, in order; the number is [`Failure::step`].
const STEP_STDIN: i32 = 1;
const STEP_CWD: i32 = 2;
const STEP_GROUP: i32 = 3;
const STEP_PRE_EXEC: i32 = 4;
const STEP_EXEC: i32 = 5;
const STEP_OUTPUT: i32 = 6;

fn step_name(step: i32) -> &'static str {
    match step {
        STEP_STDIN => "stdin",
        STEP_CWD => "working directory",
        STEP_OUTPUT => "stdout and stderr",
        _ => "process group or session",
    }
}

/// What the child's entry point is handed.
struct Child<'a> {
    image: &'a Image,
    pre_exec: &'a mut dyn FnMut() -> io::Result<()>,
    failure: &'a Failure,
}

/// Starts `image` in a child that runs `pre_exec` (signal mask, limits, credentials,
/// confinement — async-signal-safe, allocating nothing) just before the exec. Returns the
/// child's pid once it has exec'ed; if a step failed, the child has been reaped and the error
/// has the step's errno (named after its step, but for `pre_exec`'s own and the exec's).
#[allow(unsafe_code)]
pub fn spawn(image: &Image, pre_exec: &mut dyn FnMut() -> io::Result<()>) -> io::Result<i32> {
    let failure = Failure {
        step: AtomicI32::new(0),
        errno: AtomicI32::new(0),
    };
    let mut child = Child {
        image,
        pre_exec,
        failure: &failure,
    };
    // Capacity, not zeroes: the child's stack needs no initial value, and only the pages it
    // reaches are ever made (zeroing would fault in all of them for every command).
    let mut stack: Vec<u8> = Vec::with_capacity(CHILD_STACK);
    // The stack grows down on every architecture Linux runs podhost on; 16-byte aligned.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK) & !15;
    // SAFETY: `entry` runs on `stack`, which outlives the child's use of it (CLONE_VFORK
    // suspends this thread until the child has exec'ed or exited); `child` is a live value the
    // child only reads (and its `failure` atomics, which it writes); no other thread exists to
    // observe the shared memory meanwhile (see the module's invariants).
    let pid = unsafe {
        libc::clone(
            entry,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&raw mut child).cast::<libc::c_void>(),
        )
    };
    drop(stack);
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    let step = failure.step.load(Ordering::Acquire);
    if step == 0 {
        return Ok(pid);
    }
    // It has exited already; reap it so that it is not mistaken for a command's process.
    let _ = super::sys::wait(pid, 0);
    let errno = failure.errno.load(Ordering::Acquire);
    let e = io::Error::from_raw_os_error(errno);
    if step == STEP_PRE_EXEC || step == STEP_EXEC {
        // The caller says what it was starting; the kernel's word for why is the message.
        return Err(e);
    }
    Err(io::Error::new(
        e.kind(),
        format!("{}: {e}", step_name(step)),
    ))
}

/// The child: its steps, then the exec; on any failure, the step and errno for the parent, and
/// exit 127.
#[allow(unsafe_code)]
extern "C" fn entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Child` `spawn` passed, alive while the parent is suspended.
    let child = unsafe { &mut *arg.cast::<Child<'_>>() };
    let (image, failure) = (child.image, child.failure);
    let fail = |step: i32, errno: i32| -> libc::c_int {
        failure.errno.store(errno, Ordering::Release);
        failure.step.store(step, Ordering::Release);
        // SAFETY: ends the child at once, running nothing of the parent's (no atexit, no
        // destructors of memory it shares).
        unsafe { libc::_exit(127) }
    };
    // SAFETY: dup2, chdir and setpgid or setsid on values the image owns.
    unsafe {
        if libc::dup2(image.stdin.as_raw_fd(), libc::STDIN_FILENO) < 0 {
            return fail(STEP_STDIN, super::sys::errno());
        }
        if let Some([out, err]) = &image.output
            && (libc::dup2(out.as_raw_fd(), libc::STDOUT_FILENO) < 0
                || libc::dup2(err.as_raw_fd(), libc::STDERR_FILENO) < 0)
        {
            return fail(STEP_OUTPUT, super::sys::errno());
        }
        if libc::chdir(image.cwd.as_ptr()) != 0 {
            return fail(STEP_CWD, super::sys::errno());
        }
        let grouped = if image.session {
            libc::setsid() >= 0
        } else {
            libc::setpgid(0, 0) == 0
        };
        if !grouped {
            return fail(STEP_GROUP, super::sys::errno());
        }
    }
    if let Err(e) = (child.pre_exec)() {
        return fail(STEP_PRE_EXEC, e.raw_os_error().unwrap_or(libc::EINVAL));
    }
    // SAFETY: the path, argv and envp are NUL-terminated strings in null-terminated arrays that
    // the image keeps alive; execve returns only on failure.
    unsafe {
        libc::execve(
            image.path.as_ptr(),
            image.argv_ptrs.as_ptr(),
            image.envp_ptrs.as_ptr(),
        );
    }
    fail(STEP_EXEC, super::sys::errno())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(program: &str, args: &[&str], cwd: &Path) -> Image {
        Image::new(
            Path::new(program),
            args.iter().map(OsStr::new),
            [(OsStr::new("MARK"), OsStr::new("vspawned"))],
            cwd,
        )
        .unwrap()
    }

    fn exit_code(pid: i32) -> i32 {
        let (_, status) = crate::exec::sys::wait(pid, 0).unwrap();
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn the_child_gets_its_arguments_environment_directory_and_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let script = format!(
            "printf '%s|%s|%s|%s|' \"$1\" \"$MARK\" \"${{HOME-unset}}\" \"$PWD\" > {0}; cat >> {0}",
            out.display()
        );
        let img = image("/bin/sh", &["-c", &script, "sh", "first arg"], dir.path());
        let pid = spawn(&img, &mut || Ok(())).unwrap();
        assert_eq!(exit_code(pid), 0);
        let got = std::fs::read_to_string(&out).unwrap();
        let canonical = dir.path().canonicalize().unwrap();
        // Only the given environment (this process's HOME is not passed on); stdin is
        // /dev/null, so cat adds nothing.
        assert_eq!(
            got,
            format!("first arg|vspawned|unset|{}|", canonical.display())
        );
    }

    #[test]
    fn a_pre_exec_error_comes_back_with_its_errno() {
        let dir = tempfile::tempdir().unwrap();
        let img = image("/bin/true", &[], dir.path());
        let err = spawn(&img, &mut || Err(io::Error::from_raw_os_error(libc::EPERM))).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn a_missing_program_is_its_errno_and_a_missing_directory_names_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let err = spawn(
            &image("/nonexistent/shell", &[], dir.path()),
            &mut || Ok(()),
        )
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        let gone = dir.path().join("gone");
        let err = spawn(&image("/bin/true", &[], &gone), &mut || Ok(())).unwrap_err();
        assert!(err.to_string().starts_with("working directory: "), "{err}");
    }

    #[test]
    fn a_name_without_a_slash_is_found_in_the_path_it_will_run_with() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let img = Image::new(
            Path::new("sh"),
            [OsStr::new("-c"), OsStr::new("echo found > out")],
            [(OsStr::new("PATH"), OsStr::new("/nonexistent:/bin"))],
            dir.path(),
        )
        .unwrap();
        assert_eq!(exit_code(spawn(&img, &mut || Ok(())).unwrap()), 0);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "found\n");
        // argv[0] stays the name the caller gave.
        assert_eq!(img._argv[0].as_bytes(), b"sh");
        let missing = Image::new(Path::new("no-such-shell"), [], [], dir.path()).unwrap();
        let err = spawn(&missing, &mut || Ok(())).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn a_child_in_its_own_session_writes_where_it_is_told() {
        let dir = tempfile::tempdir().unwrap();
        let (read, write) = crate::exec::sys::pipe().unwrap();
        let (err_read, err_write) = crate::exec::sys::pipe().unwrap();
        // Its pid, the session (field 6 of a stat) of a child of it and its own: all one in a
        // session of its own; on stdout, and a word on stderr.
        let script = "echo $$ $(cut -d' ' -f6 /proc/self/stat) $(cut -d' ' -f6 /proc/$$/stat); \
                      echo apart >&2";
        let img = image("/bin/sh", &["-c", script], dir.path())
            .in_own_session()
            .with_output(write, err_write);
        let pid = spawn(&img, &mut || Ok(())).unwrap();
        // This process's copies of the write ends close with the image.
        drop(img);
        assert_eq!(exit_code(pid), 0);
        let out = std::io::read_to_string(std::fs::File::from(read)).unwrap();
        let err = std::io::read_to_string(std::fs::File::from(err_read)).unwrap();
        let fields: Vec<&str> = out.split_whitespace().collect();
        // The shell's session is its pid, and its children's too; not this process's.
        assert_eq!(fields, [fields[0]; 3], "{out}");
        assert_ne!(fields[0], nix::unistd::getsid(None).unwrap().to_string());
        assert_eq!(err, "apart\n");
    }

    #[test]
    fn a_nul_byte_is_refused_before_any_process() {
        let err = Image::new(
            Path::new("/bin/sh"),
            [OsStr::new("a\0b")],
            [],
            Path::new("/"),
        )
        .err()
        .unwrap();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn the_pre_exec_steps_change_the_child_only() {
        let dir = tempfile::tempdir().unwrap();
        let before = nix::unistd::getpgrp();
        let img = image("/bin/sh", &["-c", "exit 7"], dir.path());
        // The child's own process group, its own rlimit: the parent keeps its own.
        let mut lowered = || {
            let lim = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            // SAFETY: setrlimit on a live struct.
            #[allow(unsafe_code)]
            let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        };
        let pid = spawn(&img, &mut lowered).unwrap();
        assert_eq!(exit_code(pid), 7);
        assert_eq!(nix::unistd::getpgrp(), before);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit into a live struct.
        #[allow(unsafe_code)]
        unsafe {
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim)
        };
        assert!(lim.rlim_cur > 64, "the parent's limit changed");
    }
}
