//! Pod host benchmarks against the fake Nylorun core (the test fakes of `tests/support/`), each
//! with a baseline measured in the same run:
//!
//! * `start`: `podhost pod` from spawn to its `hello`, against spawning `podhost --version` to
//!   its exit; and the pod's idle RSS.
//! * `turn`: the journal's round trips per tool call, against the tool's own time; the memory a
//!   held run takes, against the same pod idle with as many leases waiting.
//! * `artifacts`: the outputs export of one 64 MiB file, against reading, hashing and
//!   base64-encoding it once; a 5 MiB spilled result read back in 32 KiB pages, against one
//!   chunk.
//!
//! Run with `cargo bench --bench pod` (podhost and this binary optimized, as `cargo bench`
//! builds them); `cargo bench --bench pod turn` runs the parts whose name contains `turn`.
//! `PODHOST_BENCH_SMOKE=1` runs every part at a tiny scale, checked (see
//! `benches/support/smoke.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/smoke.rs"]
mod smoke;

#[path = "../../tests/support/mod.rs"]
mod support;

#[path = "../../tests/support/fake_core/mod.rs"]
mod fake_core;

#[path = "../../tests/support/fake_artifacts/mod.rs"]
mod fake_artifacts;

#[path = "../../tests/support/fake_journal.rs"]
mod fake_journal;

#[path = "../../tests/support/fake_gates.rs"]
mod fake_gates;

#[path = "../../tests/support/fake_toolgate.rs"]
mod fake_toolgate;

#[path = "../../tests/support/turn_fixture.rs"]
mod turn_fixture;

#[path = "../../tests/support/pod_launch.rs"]
mod pod_launch;

#[path = "../../tests/support/driven_runs.rs"]
mod driven_runs;

mod artifacts;
mod start;
mod turn;

use std::future::Future;

/// A current-thread runtime, as `#[tokio::test]` gives.
fn current_thread<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Two worker threads: the export under measure and the fake core it talks to.
fn two_workers<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn main() {
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let wants = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    if wants("start") {
        current_thread(start::main());
    }
    if wants("turn") {
        current_thread(turn::main());
    }
    if wants("artifacts") {
        two_workers(artifacts::main());
    }
    smoke::finish("pod");
}
