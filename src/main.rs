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
//! Non-goals: a command line of its own. `--help`, `--version` and every error about a command
//! other than `tool` are `podhost-full`'s.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use podhost::exec;
use podhost::floor::codes::exit;

/// The whole program's file name, beside this binary.
const FULL: &str = "podhost-full";

fn main() -> ExitCode {
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
