//! `glob`: find files by glob pattern, newest first, over the parallel, ignore-aware walk of
//! [`super::walk`].
//!
//! Owns: the glob input's handling, the per-thread collection of the newest matches, and the
//! output text.
//!
//! Invariants:
//! * The walk is never sorted: each thread keeps its own [`MAX_FILES`] newest matches (a bounded
//!   heap, so memory does not grow with the tree), and the heaps are merged and sorted once at the
//!   end. The result is exactly the newest [`MAX_FILES`] matches of the whole tree, ordered by
//!   modification time, newest first, ties broken by path — the same for every thread schedule.
//! * Only regular files are listed (no directories, no symlinks, see `walk`), by their path
//!   relative to the workspace (`src/a.rs`), as every tool result names paths.
//! * Every match is counted, also past [`MAX_FILES`]: the output then says how many were left
//!   out and how many matched in all, never silently drops them.
//!
//! Non-goals: listing directories; following symlinks.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ignore::DirEntry;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::walk::{Ended, FileVisitor, Flow, PathGlob, SearchRoot};
use super::{ToolOutcome, Toolbox, codes};
use crate::floor::workspace as paths;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobInput {
    pub pattern: String,
    pub path: Option<String>,
    #[serde(default)]
    pub include_ignored: bool,
}

/// The most paths one call returns.
pub const MAX_FILES: usize = 500;
/// The line appended (after a newline) when `matched` files matched and only the newest [`MAX_FILES`] are listed:
/// how many were left out and how many matched in all, so the model knows the size of what it
/// did not see.
pub fn more_hint(matched: usize) -> String {
    let left = matched.saturating_sub(MAX_FILES);
    let files = if left == 1 { "file" } else { "files" };
    format!("… {left} more {files} omitted ({matched} matched in all); narrow the pattern.")
}
/// The whole output when nothing matched.
pub const NO_FILES: &str = "No files matched.";

pub fn find(tb: &Toolbox, input: GlobInput, cancel: &CancellationToken) -> ToolOutcome {
    match find_files(tb, &input, cancel) {
        Ok(out) => ToolOutcome::completed(out),
        Err(outcome) => outcome,
    }
}

/// The output text, or why the call could not run.
fn find_files(
    tb: &Toolbox,
    input: &GlobInput,
    cancel: &CancellationToken,
) -> Result<String, ToolOutcome> {
    let ws = tb.workspace();
    let invalid = |m: String| ToolOutcome::failed(codes::INVALID_INPUT, m);
    if input.pattern.is_empty() {
        return Err(invalid("pattern must not be empty.".to_owned()));
    }
    let root = SearchRoot::resolve(ws, input.path.as_deref())?;
    let glob = PathGlob::new(&input.pattern, &root.display).map_err(|e| invalid(e.to_string()))?;
    if !root.meta.is_dir() {
        return Err(invalid(format!(
            "path must be a directory; {} is {}.",
            root.display,
            paths::file_kind(&root.meta.file_type())
        )));
    }
    let (ended, visitors) = root.walk(input.include_ignored).visit(cancel, || Newest {
        glob: &glob,
        root: &root.host,
        matched: 0,
        kept: BinaryHeap::new(),
    });
    if ended == Ended::Cancelled || cancel.is_cancelled() {
        return Err(ToolOutcome::failed(
            codes::CANCELLED,
            "The file search was cancelled.",
        ));
    }

    let mut matched = 0usize;
    let mut all = Vec::new();
    for v in visitors {
        matched += v.matched;
        all.extend(v.kept.into_vec());
    }
    // `Ranked`'s order puts the newest first.
    all.sort_unstable();
    all.truncate(MAX_FILES);
    if all.is_empty() {
        return Ok(NO_FILES.to_owned());
    }
    let mut out = all
        .iter()
        .map(|r| ws.relative_display_of(&r.path))
        .collect::<Vec<_>>()
        .join("\n");
    if matched > MAX_FILES {
        out.push('\n');
        out.push_str(&more_hint(matched));
    }
    Ok(out)
}

/// A matching file, ordered best first: newer, then by path.
#[derive(Debug, PartialEq, Eq)]
struct Ranked {
    modified: SystemTime,
    path: PathBuf,
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .modified
            .cmp(&self.modified)
            .then_with(|| self.path.cmp(&other.path))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// One walk thread's matches: how many, and the newest [`MAX_FILES`] of them.
struct Newest<'a> {
    glob: &'a PathGlob,
    root: &'a Path,
    matched: usize,
    /// A max-heap by `Ranked`, so its top is the *worst* kept file, the one to drop.
    kept: BinaryHeap<Ranked>,
}

impl FileVisitor for Newest<'_> {
    fn file(&mut self, entry: &DirEntry) -> Flow {
        let path = entry.path();
        if !self.glob.is_match(self.root, path) {
            return Flow::Continue;
        }
        // Gone since it was listed: not a match any more.
        let Some(modified) = entry.metadata().ok().and_then(|m| m.modified().ok()) else {
            return Flow::Continue;
        };
        self.matched += 1;
        if self.kept.len() == MAX_FILES {
            let Some(worst) = self.kept.peek() else {
                return Flow::Continue;
            };
            // Cheap test first: most files lose on time alone, without copying their path.
            if modified < worst.modified || (modified == worst.modified && path >= &*worst.path) {
                return Flow::Continue;
            }
            self.kept.pop();
        }
        self.kept.push(Ranked {
            modified,
            path: path.to_path_buf(),
        });
        Flow::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn ranked_sorts_newest_first_then_by_path() {
        let t = SystemTime::UNIX_EPOCH;
        let r = |s: u64, p: &str| Ranked {
            modified: t + Duration::from_secs(s),
            path: PathBuf::from(p),
        };
        let mut v = [r(1, "/a"), r(3, "/b"), r(3, "/a"), r(2, "/c")];
        v.sort();
        let order: Vec<_> = v
            .iter()
            .map(|r| r.path.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(order, ["/a", "/b", "/c", "/a"]);
        assert_eq!(v[0].modified, t + Duration::from_secs(3));
    }
}
