//! The benches' podhost as an installation has it.

use std::path::{Path, PathBuf};

/// Copies of the built `podhost` and of `podhost-exec` beside it (when there is one) in `dir`.
/// Not the linker's output itself: a file the linker has just written sits in the page cache in
/// small pages, and each start of it takes more page faults (about 0.5 ms more of a start,
/// measured on a 2-core machine) than a copied or installed one, or one read back from disk.
pub fn installed(built: &Path, dir: &Path) -> PathBuf {
    let podhost = dir.join("podhost");
    std::fs::copy(built, &podhost).unwrap();
    let exec = built.with_file_name("podhost-exec");
    if exec.exists() {
        std::fs::copy(&exec, dir.join("podhost-exec")).unwrap();
    }
    podhost
}
