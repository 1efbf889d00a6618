//! The `podhost` binary: runs `podhost tool` itself and becomes `podhost-full`, the whole
//! program installed beside it, for every other command.
//!
//! A `podhost tool` process is one tool call, often one command, and a script may start
//! thousands: much of its cost is the start of the binary itself. The dynamic loader relocates
//! every pointer in a program's read-only data before `main`, each page of them a copy-on-write
//! fault: about 40,000 pointers in the whole program (its servers, clients and store), 18,000
//! here, where only the tools, their confinement and the command supervisor are. This binary is
//! also linked statically, at a fixed address (`.cargo/link-podhost`): no loader, no shared
//! library to map or resolve and no pointer to relocate, so its read-only data stay shared pages
//! of the file, and the command's supervisor, a fork of it, copies and tears down fewer
//! mappings. The price is the image's own address: its stack, heap and every mapping are still
//! placed at random, but its code and data are not. Only short-lived processes run from it (one
//! tool call, one command's supervisor); every server (`serve`, `mcp`, `pod`) runs from
//! `podhost-full`, which stays position-independent. `cargo bench --bench tools process`
//! measures a `podhost tool bash` call from here against one from the whole program in the same
//! loop.
//!
//! ```text
//! podhost tool …      → runs here (config::startup::tool)
//! podhost __exec …    → the supervisor's helpers, as in podhost-exec (exec::run_helper)
//! podhost <anything else> ──exec──► podhost-full <the same arguments>
//! ```
//!
//! Invariants:
//! * The hand-over is an `exec`, not a child: the same process (its pid, so a container's PID
//!   1 stays PID 1), the same arguments (`argv[0]` too), environment and descriptors; nothing
//!   is read, logged or started before it.
//! * `podhost-full` is found beside this binary's own executable (symbolic links resolved);
//!   when it is missing, `podhost tool` still works and every other command says where it
//!   looked.
//!
//! Its entry is the C library's `main`, not std's (`#![no_main]`): std's start-up reads
//! `/proc/self/maps` to find the main thread's stack guard, maps a signal stack and installs the
//! stack-overflow handler, some 40-60 µs of every tool call. What of it matters is done here: the
//! standard descriptors are opened on `/dev/null` when a parent left one closed (so no pipe or
//! file of podhost's takes their numbers), SIGPIPE is ignored (a write to a closed reader fails
//! with `EPIPE` instead of killing podhost), a panic ends the process with status 101, and
//! stdout is flushed at the end. A stack overflow is a plain SIGSEGV, without std's message.
//!
//! Non-goals: a command line of its own. `--help`, `--version` and every error about a command
//! other than `tool` are `podhost-full`'s.

#![no_main]

use std::ffi::{OsString, c_char, c_int};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use podhost::exec;
use podhost::floor::codes::exit;

/// The whole program's file name, beside this binary.
const FULL: &str = "podhost-full";

/// The process's entry, called by the C library's start-up (see the module doc for what std's
/// would have done).
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    if !standard_fds_open() {
        return exit::FAILURE;
    }
    // SAFETY: SIG_IGN installs no handler; no other thread exists yet.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigIgn,
        )
    };
    let code = std::panic::catch_unwind(run).unwrap_or(ExitCode::from(101));
    let _ = std::io::stdout().flush();
    status(code)
}

/// Opens `/dev/null` on each of stdin, stdout and stderr that is closed, as std's start-up does;
/// false when one cannot be (then nothing may be written: the number is free for anything).
#[allow(unsafe_code)]
fn standard_fds_open() -> bool {
    for fd in 0..=2 {
        // SAFETY: F_GETFD reads a descriptor's flags and changes nothing; the number may be
        // closed, which is what is asked.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1 {
            continue;
        }
        // SAFETY: a NUL-terminated path. The descriptor is left open on purpose: it is that
        // standard stream now (the lowest free number is `fd`, the lower ones being open).
        if unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } != fd {
            return false;
        }
    }
    true
}

/// Replaces the C library's own: where the running program lives, for `$ORIGIN` in the paths
/// of libraries it loads at run time. A static glibc asks it of every process before `main`
/// (`_dl_non_dynamic_init`), a `readlink` of `/proc/self/exe`, about 15 µs of each tool call,
/// for an answer this binary never uses: it loads no library by a path with `$ORIGIN` (its
/// only run-time loading is the C library's own NSS modules, by their plain names). The
/// answer here is the C library's own for "unknown" (a `$ORIGIN` in such a path then names
/// nothing). A static link takes this definition instead of the library's (whose object
/// defines nothing else); a dynamic one leaves it unused, the loader keeping its own.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
extern "C" fn _dl_get_origin() -> *const c_char {
    usize::MAX as *const c_char
}

/// The exit status `code` stands for: std keeps it private, so it is found by comparison.
fn status(code: ExitCode) -> c_int {
    (0..=u8::MAX)
        .find(|&n| ExitCode::from(n) == code)
        .map_or(exit::FAILURE, c_int::from)
}

/// What the binary does with its arguments (see the module doc).
fn run() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let first = args.get(1).map(OsString::as_os_str);
    if first.is_some_and(|a| a == "tool") {
        // As a container's PID 1, podhost splits into a minimal init and itself (see exec::init).
        if let Some(code) = exec::init::split_if_pid1() {
            return code;
        }
        return ExitCode::from(podhost::config::startup::tool(&args) as u8);
    }
    // A command's supervisor, a session holder, the probe: `podhost tool`'s own commands may
    // start them from this executable when `podhost-exec` is not beside it.
    if let Some(code) = exec::run_helper(first) {
        return code;
    }
    hand_over(&args)
}

/// Becomes `podhost-full` with `args` (see the module doc); returns only when that fails, with
/// the error on stderr.
fn hand_over(args: &[OsString]) -> ExitCode {
    let full = match std::env::current_exe() {
        Ok(me) => me.with_file_name(FULL),
        Err(e) => {
            eprintln!("podhost: cannot find its own executable to start {FULL} beside it: {e}");
            return ExitCode::from(exit::FAILURE as u8);
        }
    };
    let mut command = std::process::Command::new(&full);
    if let Some((arg0, rest)) = args.split_first() {
        command.arg0(arg0).args(rest);
    }
    let e = command.exec();
    eprintln!(
        "podhost: cannot start {}: {e} (every command but `podhost tool` runs in {FULL}, \
         installed beside podhost)",
        full.display()
    );
    ExitCode::from(exit::FAILURE as u8)
}
