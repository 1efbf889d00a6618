//! `podhost-exec`: the command supervisor on its own (see `podhost::exec::supervise`), also the
//! session holder (`podhost-exec __session`, see `podhost::exec::session::holder`) and the
//! namespace probe (`podhost-exec __probe`).
//!
//! podhost starts one supervisor per command (or, in a session, the holder forks it). `podhost __exec` is the same supervisor, but
//! starting the full binary costs more than starting this one: the dynamic loader relocates all
//! of podhost (its servers, clients and store) before `main` runs, about half a millisecond per
//! command. podhost uses this binary when it lies beside its own executable
//! (`podhost::exec::find_supervisor`), and `podhost __exec` otherwise.

fn main() -> std::process::ExitCode {
    let arg = std::env::args_os().nth(1);
    podhost::exec::run_helper(arg.as_deref()).unwrap_or_else(podhost::exec::supervise::main)
}
