//! What ships: `podhost`, `podhost-full` and `podhost-exec` as `image/strip-symbols` leaves them
//! for the image (debug info and symbol table split off into `.debug/<name>.debug`), against the
//! binaries as the build made them, against the goal of at most 25 MB for each of `podhost` and
//! `podhost-full`, and all three together.
//!
//! `cargo bench --bench tools size` measures the release build's binaries (the bench profile's);
//! a smoke run strips the test build's, checks the split happened, and judges no size.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::smoke;

/// The most a shipped `podhost` or `podhost-full` should weigh, in bytes.
const GOAL_BYTES: u64 = 25_000_000;

pub fn main() {
    let missing: Vec<&str> = ["objcopy", "readelf"]
        .into_iter()
        .filter(|t| {
            !Command::new(t)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    if !missing.is_empty() {
        smoke::missing(
            "the shipped size (image/strip-symbols)",
            &format!("it needs {} on PATH", missing.join(", ")),
            "apt-get install -y binutils",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let built = [
        ("podhost", PathBuf::from(env!("CARGO_BIN_EXE_podhost"))),
        (
            "podhost-full",
            PathBuf::from(env!("CARGO_BIN_EXE_podhost-full")),
        ),
        (
            "podhost-exec",
            PathBuf::from(env!("CARGO_BIN_EXE_podhost-exec")),
        ),
    ];
    for (name, path) in &built {
        std::fs::copy(path, dir.path().join(name)).unwrap();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("image/strip-symbols");
    let out = Command::new(&script).arg(dir.path()).output().unwrap();
    smoke::check(
        out.status.success(),
        format_args!(
            "image/strip-symbols failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    );
    println!(
        "shipped size ({}): as built → as shipped, and the symbols kept apart",
        smoke::build()
    );
    let mb = |b: u64| b as f64 / 1e6;
    let mut total = 0;
    for (name, path) in &built {
        let size = |p: &Path| std::fs::metadata(p).unwrap().len();
        let (before, shipped) = (size(path), size(&dir.path().join(name)));
        total += shipped;
        let symbols = size(&dir.path().join(".debug").join(format!("{name}.debug")));
        let linked = Command::new("readelf")
            .args(["-S", "-W"])
            .arg(dir.path().join(name))
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(" .gnu_debuglink "));
        smoke::check(
            linked && shipped < before,
            format_args!("{name}: not stripped ({before} → {shipped} bytes, debug link {linked})"),
        );
        let verdict = match (*name, smoke::on()) {
            (_, true) => String::new(),
            ("podhost" | "podhost-full", false) => format!(
                "; goal ≤ {:.0} MB: {}",
                mb(GOAL_BYTES),
                if shipped <= GOAL_BYTES {
                    "met"
                } else {
                    "MISSED"
                }
            ),
            _ => String::new(),
        };
        println!(
            "  {name:<13} {:>7.1} MB → {:>6.1} MB shipped ({:.2}× the build's), symbols {:.1} MB{verdict}",
            mb(before),
            mb(shipped),
            shipped as f64 / before as f64,
            mb(symbols),
        );
    }
    println!("  all three, installed side by side: {:.1} MB", mb(total));
}
