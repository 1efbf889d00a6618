//! The benches' podhost as an installation has it.

use std::path::{Path, PathBuf};

/// Copies of the built `podhost` and of `podhost-full` and `podhost-exec` beside it (each when
/// there is one: an older build may lack them) in `dir`.
/// Not the linker's output itself: a file the linker has just written sits in the page cache in
/// small pages, and each start of it takes more page faults (about 0.5 ms more of a start,
/// measured on a 2-core machine) than a copied or installed one, or one read back from disk.
pub fn installed(built: &Path, dir: &Path) -> PathBuf {
    let podhost = dir.join("podhost");
    std::fs::copy(built, &podhost).unwrap();
    for name in ["podhost-full", "podhost-exec"] {
        let beside = built.with_file_name(name);
        if beside.exists() {
            std::fs::copy(&beside, dir.join(name)).unwrap();
        }
    }
    podhost
}
