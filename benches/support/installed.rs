//! The benches' podhost as an installation has it.

use std::path::{Path, PathBuf};

/// Copies of the built `podhost` and of `podhost-full` and `podhost-exec` beside it (each when
/// there is one: an older build may lack them) in `dir`.
/// Not the linker's output itself: how a binary sits in the page cache changes what each start
/// of it costs. Written in large writes (a copy, an installed package or an unpacked image
/// layer) or read in with `read`, it sits in large folios, of which one page fault maps many
/// pages; the linker's output, and a binary whose pages were evicted and then faulted back in by
/// `exec` alone, sit in small pages and each start takes more page faults: about 0.3 ms more of
/// a `podhost tool bash` call on a 2-core machine (the same copy measured both ways). These
/// copies are as installed.
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
