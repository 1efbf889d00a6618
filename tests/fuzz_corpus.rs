//! Replays the fuzz targets' corpora (`fuzz/corpus/<target>/`) and the inputs that once failed
//! (`fuzz/regressions/<target>/`) through the same bodies the fuzzer runs
//! (`podhost::fuzzing`), so `cargo test` keeps every one of them passing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut n = 0;
    for sub in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(sub).join(target)) else {
            continue;
        };
        let mut paths: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        paths.sort();
        for p in paths {
            let data = std::fs::read(&p).unwrap();
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                panic!("fuzz input {} panicked", p.display());
            }
            n += 1;
        }
    }
    assert!(n > 0, "no corpus for fuzz target {target}");
}

#[test]
fn frame() {
    replay("frame", podhost::fuzzing::frame);
}

#[test]
fn canonical_hash() {
    replay("canonical_hash", podhost::fuzzing::canonical_hash);
}

#[test]
fn core_answers() {
    replay("core_answers", podhost::fuzzing::core_answers);
}

#[test]
fn byoh_bodies() {
    replay("byoh_bodies", podhost::fuzzing::byoh_bodies);
}

#[test]
fn paths() {
    replay("paths", podhost::fuzzing::paths);
}

#[test]
fn tool_inputs() {
    replay("tool_inputs", podhost::fuzzing::tool_inputs);
}

#[test]
fn edit() {
    replay("edit", podhost::fuzzing::edit);
}
