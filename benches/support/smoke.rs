//! What every bench shares: its smoke mode, and how it says what it left out.
//!
//! `PODHOST_BENCH_SMOKE=1` runs a bench at a tiny scale: every code path it measures, once or
//! a few times, each result checked for sense (counts that match, answers that are not
//! errors), in a few seconds. It measures nothing worth reading; it keeps the bench from
//! rotting (`.ci/run` runs every bench so, in the test profile `cargo test` already built).
//!
//! A part that needs what this machine lacks (a tool, PostgreSQL, root) is left out and said so,
//! loudly, on stderr and in the last line. Under CI (`CI` set), a missing thing `.ci/run`
//! installs fails the run instead.
//!
//! Shared by the bench binaries through `#[path]`; not a bench of its own.
#![allow(dead_code)]

use std::fmt::Display;
use std::sync::Mutex;

static SKIPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Whether this is a smoke run (`PODHOST_BENCH_SMOKE` set, not empty, not `0`).
pub fn on() -> bool {
    std::env::var_os("PODHOST_BENCH_SMOKE").is_some_and(|v| !v.is_empty() && v != "0")
}

/// `full` in a measurement, `smoke` in a smoke run.
pub fn pick<T>(full: T, smoke: T) -> T {
    if on() { smoke } else { full }
}

/// Which build this is (the bench's and the podhost it runs): `cargo bench` builds `release`.
pub fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug build"
    } else {
        "release build"
    }
}

/// Fails the run unless `ok`: a bench that measured something that did not happen (a count
/// short, an error answered) measured nothing.
#[track_caller]
pub fn check(ok: bool, what: impl Display) {
    assert!(ok, "bench check failed: {what}");
}

/// Fails the run unless every value is a finite, positive measurement.
#[track_caller]
pub fn check_positive(what: &str, values: &[f64]) {
    for v in values {
        check(
            v.is_finite() && *v > 0.0,
            format_args!("{what}: {v} is no measurement"),
        );
    }
}

/// Says that `what` is left out because of `why`, loudly; the last line repeats it.
pub fn skipped(what: &str, why: &str) {
    eprintln!("SKIPPED: {what}: {why}");
    SKIPPED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(format!("{what} ({why})"));
}

/// [`skipped`] for what `.ci/run` installs (`fix` says how): under CI, a failure.
pub fn missing(what: &str, why: &str, fix: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{what}: {why}; {fix} (.ci/run installs it)"
    );
    skipped(what, &format!("{why}; {fix}"));
}

/// The last line of a run: what was left out, or that nothing was.
pub fn finish(bench: &str) {
    let skipped = SKIPPED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let mode = if on() { "smoke run" } else { "run" };
    if skipped.is_empty() {
        println!("{bench}: {mode} done, nothing skipped");
    } else {
        println!(
            "{bench}: {mode} done, SKIPPED {}: {}",
            skipped.len(),
            skipped.join("; ")
        );
    }
}
