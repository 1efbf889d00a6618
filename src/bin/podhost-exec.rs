//! `podhost-exec`: the command supervisor on its own (see `podhost::exec::supervise`).
//!
//! podhost starts one supervisor per command. `podhost __exec` is the same supervisor, but
//! starting the full binary costs more than starting this one: the dynamic loader relocates all
//! of podhost (its servers, clients and store) before `main` runs, about half a millisecond per
//! command. podhost uses this binary when it lies beside its own executable
//! (`podhost::exec::find_supervisor`), and `podhost __exec` otherwise.

fn main() -> std::process::ExitCode {
    podhost::exec::supervise::main()
}
