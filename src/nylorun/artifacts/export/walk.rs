//! The walk of the outputs directory: its regular files in path order, and what is left out.
//!
//! Invariants: no symlink is followed (the directory itself included); FIFOs, sockets and
//! devices are listed as skipped, never opened; names that are not UTF-8 text are skipped (a
//! folder path is text); the walk is bounded in depth ([`MAX_DEPTH`]) and in the entries it looks
//! at (the file limit and [`WALK_SLACK`] more), and says when it stopped early.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{ExportProblem, problem};
use crate::floor::workspace::file_kind;

/// The deepest directory the walk enters below the outputs directory.
pub const MAX_DEPTH: usize = 64;
/// The walk looks at most this many entries (files, directories, links) past the file limit.
pub const WALK_SLACK: usize = 100_000;

/// A regular file the walk found.
#[derive(Clone, Debug)]
pub(super) struct WalkedFile {
    pub(super) rel: String,
    pub(super) host: PathBuf,
    pub(super) size: u64,
    pub(super) dev: u64,
    pub(super) ino: u64,
}

#[derive(Debug, Default)]
pub(super) struct Walked {
    /// In path order, at most the file limit.
    pub(super) files: Vec<WalkedFile>,
    /// Regular files past the limit.
    pub(super) extra_files: u64,
    /// The walk stopped at its entry budget.
    truncated: bool,
    pub(super) skipped: Vec<ExportProblem>,
    pub(super) failed: Vec<ExportProblem>,
}

/// Walks `root` without following symlinks: `None` when it does not exist.
pub(super) fn walk(root: &Path, max_files: usize) -> Option<Walked> {
    let mut w = Walked::default();
    let meta = match std::fs::symlink_metadata(root) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            w.failed.push(ExportProblem {
                path: None,
                reason: "unreadable".to_owned(),
                message: format!("the outputs directory could not be read: {e}"),
                limit: None,
            });
            return Some(w);
        }
    };
    let ft = meta.file_type();
    if !ft.is_dir() {
        let (reason, message) = if ft.is_symlink() {
            (
                "symlink",
                "the outputs directory is a symbolic link; links are not followed".to_owned(),
            )
        } else {
            (
                "not_a_file",
                format!("outputs is {}, not a directory", file_kind(&ft)),
            )
        };
        w.skipped.push(ExportProblem {
            path: None,
            reason: reason.to_owned(),
            message,
            limit: None,
        });
        return Some(w);
    }
    let mut budget = max_files.saturating_add(WALK_SLACK);
    walk_dir(root, "", 0, max_files, &mut budget, &mut w);
    if w.truncated {
        w.skipped.push(ExportProblem {
            path: None,
            reason: "too_many_files".to_owned(),
            message: format!(
                "the outputs directory holds more than {} entries; the rest were not looked at",
                max_files.saturating_add(WALK_SLACK)
            ),
            limit: Some(max_files as u64),
        });
    }
    Some(w)
}

/// Walks `dir` (at `prefix`, `depth` deep) into `w`, in name order, within `budget` entries.
/// Long: one branch per kind of entry (bad name, symlink, directory, file, other), each
/// recording its own problem.
fn walk_dir(
    dir: &Path,
    prefix: &str,
    depth: usize,
    max_files: usize,
    budget: &mut usize,
    w: &mut Walked,
) {
    let rel_of = |name: &str| {
        if prefix.is_empty() {
            name.to_owned()
        } else {
            format!("{prefix}/{name}")
        }
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            w.failed.push(ExportProblem {
                path: (!prefix.is_empty()).then(|| prefix.to_owned()),
                reason: "unreadable".to_owned(),
                message: format!("the directory could not be listed: {e}"),
                limit: None,
            });
            return;
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        if *budget == 0 {
            w.truncated = true;
            break;
        }
        *budget -= 1;
        match entry {
            Ok(e) => names.push(e),
            Err(e) => w.failed.push(ExportProblem {
                path: (!prefix.is_empty()).then(|| prefix.to_owned()),
                reason: "unreadable".to_owned(),
                message: format!("the directory could not be listed: {e}"),
                limit: None,
            }),
        }
    }
    names.sort_by(|a, b| a.file_name().as_bytes().cmp(b.file_name().as_bytes()));
    for entry in names {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| !n.chars().any(char::is_control)) else {
            w.skipped.push(ExportProblem {
                path: Some(rel_of(&String::from_utf8_lossy(name.as_bytes()))),
                reason: "bad_name".to_owned(),
                message: "its name is not UTF-8 text, or holds control characters".to_owned(),
                limit: None,
            });
            continue;
        };
        let rel = rel_of(name);
        // `DirEntry::metadata` does not follow a symlink.
        let meta = match entry.metadata() {
            Ok(m) => m,
            Err(e) => {
                w.failed
                    .push(problem(&rel, "unreadable", e.to_string(), None));
                continue;
            }
        };
        let ft = meta.file_type();
        if ft.is_symlink() {
            w.skipped.push(problem(
                &rel,
                "symlink",
                "a symbolic link; links are not followed".to_owned(),
                None,
            ));
        } else if ft.is_dir() {
            if depth + 1 >= MAX_DEPTH {
                w.skipped.push(problem(
                    &rel,
                    "too_deep",
                    format!("directories deeper than {MAX_DEPTH} levels are not saved"),
                    Some(MAX_DEPTH as u64),
                ));
            } else if !w.truncated {
                walk_dir(&entry.path(), &rel, depth + 1, max_files, budget, w);
            }
        } else if ft.is_file() {
            if w.files.len() < max_files {
                w.files.push(WalkedFile {
                    rel,
                    host: entry.path(),
                    size: meta.len(),
                    dev: meta.dev(),
                    ino: meta.ino(),
                });
            } else {
                w.extra_files += 1;
            }
        } else {
            w.skipped.push(problem(
                &rel,
                "not_a_file",
                format!("{}, not a regular file", file_kind(&ft)),
                None,
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::os::unix::fs::symlink;

    #[test]
    fn the_walk_is_sorted_skips_links_and_specials_and_stops_at_the_limit() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("outputs");
        std::fs::create_dir_all(root.join("b/c")).unwrap();
        std::fs::write(root.join("z.txt"), "z").unwrap();
        std::fs::write(root.join("b/c/deep.txt"), "deep").unwrap();
        std::fs::write(root.join("a.txt"), "aa").unwrap();
        symlink("/etc/passwd", root.join("link")).unwrap();
        nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let w = walk(&root, 2).unwrap();
        let files: Vec<(&str, u64)> = w.files.iter().map(|f| (f.rel.as_str(), f.size)).collect();
        assert_eq!(files, vec![("a.txt", 2), ("b/c/deep.txt", 4)]);
        assert_eq!(w.extra_files, 1);
        let skipped: Vec<(Option<&str>, &str)> = w
            .skipped
            .iter()
            .map(|p| (p.path.as_deref(), p.reason.as_str()))
            .collect();
        assert_eq!(
            skipped,
            vec![(Some("fifo"), "not_a_file"), (Some("link"), "symlink")]
        );
        assert!(walk(&d.path().join("missing"), 10).is_none());
        symlink(&root, d.path().join("alias")).unwrap();
        let w = walk(&d.path().join("alias"), 10).unwrap();
        assert!(w.files.is_empty());
        assert_eq!(w.skipped[0].reason, "symlink");
    }
}
