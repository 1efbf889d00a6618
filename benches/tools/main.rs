//! Tool benchmarks, each against a baseline measured in the same run: the grep tool vs `rg`, the
//! glob tool vs `fd`, the bash tool vs a bare `bash -c true`; the whole `podhost tool bash` process vs
//! `bash -c true` and `bwrap`, with and without 1,000 idle processes; what a child's exit costs the
//! reaper, with and without 1,000 idle processes on the host; and what a session's walls (its
//! network namespace, its disk's file system) cost its start and its commands, against today's
//! isolated session; and what the shipped binaries weigh once their symbols are split off.
//! Reports medians and their ratios.
//!
//! Run with `cargo bench --bench tools` (the search part needs `rg` and `fd`/`fdfind` on PATH;
//! without them it is skipped, and says so). `PODHOST_BENCH_SMOKE=1` runs every part at a tiny
//! scale, checked (see `benches/support/smoke.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/smoke.rs"]
mod smoke;

#[path = "../support/installed.rs"]
mod installed;

mod bash;
mod oneshot;
mod reaper;
mod search;
mod size;
mod walls;

fn main() {
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let wants = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    if wants("bash") {
        bash::main();
    } else if wants("syscall filter") {
        bash::syscall_filter_cost();
    }
    if wants("bash: podhost tool process") {
        oneshot::main();
    }
    if wants("reaper") {
        reaper::main();
    }
    if wants("session walls: network, disk") {
        walls::main();
    }
    if wants("grep") || wants("glob") || wants("search") {
        search::main();
    }
    if wants("shipped size") {
        size::main();
    }
    smoke::finish("tools");
}
