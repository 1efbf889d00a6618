//! The directory walk shared by `grep` and `glob`, and the glob patterns both use to pick files.
//!
//! Owns: the search root a call names ([`SearchRoot`]), one ignore policy for both tools, the
//! parallel walk (ripgrep's `ignore` crate, one visitor per thread, no sorting, a quit that stops
//! every thread; a tree of a few hundred entries is walked on the caller's thread instead), and
//! [`PathGlob`].
//!
//! Invariants:
//! * Ignore files are honoured from the allowed root down, never from above it: the workspace is
//!   the model's whole world, so a `.gitignore` it cannot see must not hide its files. To get
//!   that when the search starts in a subdirectory, the walk starts at the root and descends only
//!   along the path to the target, reading each ancestor's ignore files on the way. Should an
//!   ancestor itself be ignored (the model named an ignored directory), the walk runs again from
//!   the target alone, like `rg` searching an explicitly named path.
//! * `.gitignore`, `.ignore` and `.git/info/exclude` apply also outside a git repository; the
//!   user's global git excludes (host configuration) never do. `include_ignored` turns the ignore
//!   files off. Hidden files are walked. Anything named `.git` is always skipped.
//! * Symlinks are never followed and never reported: visitors see regular files only, so a link
//!   that leaves the workspace cannot lead a tool outside it.
//! * Ignored directories are pruned before they are read, never listed then filtered.
//! * Visitors run concurrently, one per thread; nothing is sorted during the walk. A visitor that
//!   returns [`Flow::Quit`], or a cancelled token, stops all threads within an entry or two.
//!
//! Non-goals: ordering results (each tool sorts what it collected), errors of the walk itself
//! (an unreadable directory or a malformed ignore file is skipped, as `rg` does without
//! `--messages`).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use ignore::{DirEntry, ParallelVisitor, ParallelVisitorBuilder, WalkBuilder, WalkState};
use tokio_util::sync::CancellationToken;

use super::{ToolOutcome, codes};
use crate::floor::workspace::{self as paths, Access, Workspace};

/// The file or directory a search starts from, as the call named it.
#[derive(Debug)]
pub struct SearchRoot {
    /// Host path, every symlink resolved.
    pub host: PathBuf,
    /// The path as the model knows it (`/workspace/src`).
    pub display: String,
    /// The allowed root that holds it (host path): ignore files are read from here down.
    pub base: PathBuf,
    pub meta: std::fs::Metadata,
}

impl SearchRoot {
    /// Resolves `path` (the workspace when `None`) for reading. Refused paths fail with the
    /// [`paths::PathError`] text; a path that does not exist is `sandbox.not_found`.
    pub fn resolve(ws: &Workspace, path: Option<&str>) -> Result<SearchRoot, ToolOutcome> {
        let path = path.map_or_else(|| paths::lossy(ws.display_root()), str::to_owned);
        let resolved = ws.resolve(&path, Access::Read)?;
        let not_found = || {
            ToolOutcome::failed(
                codes::NOT_FOUND,
                format!("No file or directory at {}.", resolved.display),
            )
        };
        if !resolved.exists {
            return Err(not_found());
        }
        let meta = match std::fs::metadata(&resolved.host) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(not_found()),
            Err(e) => {
                return Err(ToolOutcome::failed(
                    codes::ERROR,
                    format!("{} could not be read: {e}", resolved.display),
                ));
            }
        };
        // `resolve` only returns paths inside a root, so this always finds one.
        let base = ws
            .root_of(&resolved.host)
            .map(|r| r.host.clone())
            .ok_or_else(|| {
                ToolOutcome::failed(
                    codes::PATH_DENIED,
                    format!("{} is outside the allowed directories.", resolved.display),
                )
            })?;
        Ok(SearchRoot {
            host: resolved.host,
            display: resolved.display,
            base,
            meta,
        })
    }

    /// The walk of this root (a directory).
    pub fn walk(&self, include_ignored: bool) -> Walk<'_> {
        Walk {
            base: &self.base,
            target: &self.host,
            include_ignored,
        }
    }
}

/// What a visitor wants after a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop the whole walk (every thread): the visitor has what it needs.
    Quit,
}

/// Receives the regular files of a walk, on one walk thread.
pub trait FileVisitor: Send {
    fn file(&mut self, entry: &DirEntry) -> Flow;
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Every file was visited.
    Finished,
    /// A visitor returned [`Flow::Quit`].
    Quit,
    /// The token was cancelled.
    Cancelled,
}

/// One walk: the files below `target`, with ignore files read from `base` down.
#[derive(Clone, Copy, Debug)]
pub struct Walk<'a> {
    /// The allowed root (host path) that holds `target`.
    pub base: &'a Path,
    /// The directory to walk (host path, canonical, inside `base`).
    pub target: &'a Path,
    /// Walk files that ignore files exclude as well.
    pub include_ignored: bool,
}

impl Walk<'_> {
    /// Walks in parallel, calling one visitor per thread (made by `make`) for each regular file,
    /// and returns how it ended with every visitor, so that the caller can merge what they
    /// collected.
    pub fn visit<V, F>(&self, cancel: &CancellationToken, make: F) -> (Ended, Vec<V>)
    where
        V: FileVisitor,
        F: Fn() -> V + Sync,
    {
        let chain = match self.target.strip_prefix(self.base) {
            Ok(rest) => {
                let mut dir = self.base.to_path_buf();
                rest.components()
                    .map(|c| {
                        dir.push(c);
                        dir.clone()
                    })
                    .collect()
            }
            Err(_) => Vec::new(),
        };
        if chain.is_empty() {
            let run = self.once(self.target, Vec::new(), cancel, &make);
            return (run.ended, run.visitors);
        }
        let run = self.once(self.base, chain, cancel, &make);
        if run.reached || run.ended != Ended::Finished {
            return (run.ended, run.visitors);
        }
        // The target (or a directory on the way to it) is ignored by a file above it. The model
        // named it, so search it with its own ignore files only.
        let run = self.once(self.target, Vec::new(), cancel, &make);
        (run.ended, run.visitors)
    }

    /// One parallel walk from `start`, descending only along `chain` (the directories from
    /// `start` to the target, each a full path) until the target is reached.
    fn once<V, F>(
        &self,
        start: &Path,
        chain: Vec<PathBuf>,
        cancel: &CancellationToken,
        make: &F,
    ) -> RunResult<V>
    where
        V: FileVisitor,
        F: Fn() -> V + Sync,
    {
        let target_depth = chain.len();
        let chain = Arc::new(chain);
        let honour = !self.include_ignored;
        let mut builder = WalkBuilder::new(start);
        builder
            .standard_filters(false)
            .hidden(false)
            .parents(false)
            .follow_links(false)
            .git_global(false)
            .require_git(false)
            .ignore(honour)
            .git_ignore(honour)
            .git_exclude(honour)
            .filter_entry(move |e| keep(e, &chain));
        let state = RunState {
            reached: AtomicBool::new(target_depth == 0),
            quit: AtomicBool::new(false),
            cancelled: AtomicBool::new(false),
            visitors: Mutex::new(Vec::new()),
        };
        if !self.small(&builder, &state, cancel, make, target_depth) {
            builder.build_parallel().visit(&mut Workers {
                make,
                state: &state,
                cancel,
                target_depth,
            });
        }
        let ended = if state.cancelled.load(Ordering::Relaxed) || cancel.is_cancelled() {
            Ended::Cancelled
        } else if state.quit.load(Ordering::Relaxed) {
            Ended::Quit
        } else {
            Ended::Finished
        };
        RunResult {
            ended,
            reached: state.reached.load(Ordering::Relaxed),
            visitors: state
                .visitors
                .into_inner()
                .unwrap_or_else(PoisonError::into_inner),
        }
    }
}

impl Walk<'_> {
    /// Walks a small tree on this thread, with one visitor: true when the tree had at most
    /// [`SMALL_WALK`] entries (or the walk was cancelled meanwhile) and `state` holds the
    /// outcome; false, having visited nothing, when it has more (the caller walks it in
    /// parallel, from the start). The parallel walk's threads cost a small tree more than its
    /// entries do, and it ends only once every idle thread wakes from its millisecond's nap:
    /// most of a `glob` or `grep` call in a workspace of a few files.
    fn small<V, F>(
        &self,
        builder: &WalkBuilder,
        state: &RunState<V>,
        cancel: &CancellationToken,
        make: &F,
        target_depth: usize,
    ) -> bool
    where
        V: FileVisitor,
        F: Fn() -> V + Sync,
    {
        let mut entries = Vec::new();
        for entry in builder.build() {
            if cancel.is_cancelled() {
                state.cancelled.store(true, Ordering::Relaxed);
                return true;
            }
            if entries.len() == SMALL_WALK {
                return false;
            }
            entries.push(entry);
        }
        let mut worker = Worker {
            visitor: Some(make()),
            state,
            cancel,
            target_depth,
        };
        for entry in entries {
            if let WalkState::Quit = worker.visit(entry) {
                break;
            }
        }
        true
    }
}

/// The most entries (files, directories, links) a walk takes on its own thread before it
/// walks in parallel instead (see [`Walk::small`]): a few hundred microseconds of walking at
/// most, done again when the tree turns out bigger.
const SMALL_WALK: usize = 512;

/// Whether the walk descends into (or reports) `e`: never `.git`; above the target, only the
/// directories on the way to it.
fn keep(e: &DirEntry, chain: &[PathBuf]) -> bool {
    if e.file_name() == OsStr::new(".git") {
        return false;
    }
    match e.depth().checked_sub(1).and_then(|i| chain.get(i)) {
        Some(on_the_way) => e.path() == on_the_way,
        None => true,
    }
}

struct RunResult<V> {
    ended: Ended,
    reached: bool,
    visitors: Vec<V>,
}

struct RunState<V> {
    /// The walk got to the target directory (it was not ignored on the way).
    reached: AtomicBool,
    quit: AtomicBool,
    cancelled: AtomicBool,
    /// Visitors hand themselves in here when their thread ends.
    visitors: Mutex<Vec<V>>,
}

struct Workers<'s, F, V> {
    make: &'s F,
    state: &'s RunState<V>,
    cancel: &'s CancellationToken,
    target_depth: usize,
}

impl<'s, F, V> ParallelVisitorBuilder<'s> for Workers<'s, F, V>
where
    V: FileVisitor + 's,
    F: Fn() -> V + Sync,
{
    fn build(&mut self) -> Box<dyn ParallelVisitor + 's> {
        Box::new(Worker {
            visitor: Some((self.make)()),
            state: self.state,
            cancel: self.cancel,
            target_depth: self.target_depth,
        })
    }
}

/// One thread's visitor, wrapped: filters entries down to the target's regular files, watches
/// the token, and hands the visitor in when the thread ends.
struct Worker<'s, V: FileVisitor> {
    visitor: Option<V>,
    state: &'s RunState<V>,
    cancel: &'s CancellationToken,
    target_depth: usize,
}

impl<V: FileVisitor> ParallelVisitor for Worker<'_, V> {
    fn visit(&mut self, entry: Result<DirEntry, ignore::Error>) -> WalkState {
        if self.cancel.is_cancelled() {
            self.state.cancelled.store(true, Ordering::Relaxed);
            return WalkState::Quit;
        }
        let Ok(entry) = entry else {
            return WalkState::Continue;
        };
        let depth = entry.depth();
        if depth < self.target_depth {
            return WalkState::Continue;
        }
        if depth == self.target_depth {
            // `keep` lets only the target itself through at this depth.
            self.state.reached.store(true, Ordering::Relaxed);
        }
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            return WalkState::Continue;
        }
        let Some(visitor) = self.visitor.as_mut() else {
            return WalkState::Continue;
        };
        match visitor.file(&entry) {
            Flow::Continue => WalkState::Continue,
            Flow::Quit => {
                self.state.quit.store(true, Ordering::Relaxed);
                WalkState::Quit
            }
        }
    }
}

impl<V: FileVisitor> Drop for Worker<'_, V> {
    fn drop(&mut self) {
        if let Some(v) = self.visitor.take() {
            self.state
                .visitors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(v);
        }
    }
}

/// A glob that picks files: a pattern without `/` matches the file name anywhere below the
/// search root; one with `/` matches the path relative to it, where `*` and `?` do not cross
/// `/` and `**` does.
#[derive(Clone, Debug)]
pub struct PathGlob {
    /// One glob, as a set: a set picks a fast strategy (extension, literal, prefix…) where a
    /// single compiled glob would always run a regex.
    set: GlobSet,
    whole_path: bool,
}

/// Why a glob pattern was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GlobError {
    #[error("Invalid glob pattern: {0}")]
    Syntax(String),
    #[error(
        "The glob pattern {pattern:?} is absolute; patterns match paths relative to {root}. Pass the directory as path and a relative pattern."
    )]
    Absolute { pattern: String, root: String },
}

impl PathGlob {
    /// Compiles `pattern` for a search rooted at the directory the model knows as `root_display`.
    /// A leading `./` is dropped, and so is a leading `root_display/` (models often write
    /// `/workspace/**/*.rs`); any other absolute pattern is refused.
    pub fn new(pattern: &str, root_display: &str) -> Result<PathGlob, GlobError> {
        let mut pat = pattern.strip_prefix("./").unwrap_or(pattern);
        if pat.starts_with('/') {
            let root = root_display.trim_end_matches('/');
            pat = pat
                .strip_prefix(root)
                .and_then(|rest| rest.strip_prefix('/'))
                .filter(|rest| !rest.is_empty())
                .ok_or_else(|| GlobError::Absolute {
                    pattern: pattern.to_owned(),
                    root: root_display.to_owned(),
                })?;
        }
        let whole_path = pat.contains('/');
        let glob = GlobBuilder::new(pat)
            // A file name has no `/`, so only path patterns need `*` kept within a component;
            // leaving it off for names lets `*.rs` use the extension fast path.
            .literal_separator(whole_path)
            .build()
            .map_err(|e| GlobError::Syntax(e.to_string()))?;
        let set = GlobSetBuilder::new()
            .add(glob)
            .build()
            .map_err(|e| GlobError::Syntax(e.to_string()))?;
        Ok(PathGlob { set, whole_path })
    }

    /// Whether the file at host path `path` (below the search root `root`) matches.
    pub fn is_match(&self, root: &Path, path: &Path) -> bool {
        if self.whole_path {
            path.strip_prefix(root)
                .is_ok_and(|rel| self.set.is_match(rel))
        } else {
            path.file_name().is_some_and(|name| self.set.is_match(name))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the files it sees; `on_first` runs at the first one.
    struct Seen<'a> {
        files: Vec<PathBuf>,
        on_first: &'a (dyn Fn() -> Flow + Sync),
    }

    impl FileVisitor for Seen<'_> {
        fn file(&mut self, entry: &DirEntry) -> Flow {
            self.files.push(entry.path().to_path_buf());
            if self.files.len() == 1 {
                (self.on_first)()
            } else {
                Flow::Continue
            }
        }
    }

    fn tree(files: usize) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..files {
            let d = dir.path().join(format!("d{}", i % 10));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(format!("f{i}")), "x").unwrap();
        }
        dir
    }

    fn walk(
        dir: &Path,
        cancel: &CancellationToken,
        on_first: &(dyn Fn() -> Flow + Sync),
    ) -> (Ended, Vec<PathBuf>) {
        let w = Walk {
            base: dir,
            target: dir,
            include_ignored: false,
        };
        let (ended, visitors) = w.visit(cancel, || Seen {
            files: Vec::new(),
            on_first,
        });
        let mut files: Vec<PathBuf> = visitors.into_iter().flat_map(|v| v.files).collect();
        files.sort();
        (ended, files)
    }

    #[test]
    fn every_regular_file_reaches_one_visitor_and_nothing_else_does() {
        let dir = tree(300);
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        std::os::unix::fs::symlink("d0/f0", dir.path().join("link")).unwrap();
        nix::unistd::mkfifo(&dir.path().join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let (ended, files) = walk(dir.path(), &CancellationToken::new(), &|| Flow::Continue);
        assert_eq!(ended, Ended::Finished);
        let mut want: Vec<PathBuf> = (0..300)
            .map(|i| dir.path().join(format!("d{}/f{i}", i % 10)))
            .collect();
        want.sort();
        assert_eq!(files, want);
    }

    /// The same files whichever way the tree is walked: on the caller's thread (one visitor)
    /// below `SMALL_WALK` entries, in parallel past it; ignore files and a hidden file alike.
    #[test]
    fn small_trees_are_walked_on_one_thread_and_big_ones_in_parallel_alike() {
        for files in [40, SMALL_WALK * 3] {
            let dir = tree(files);
            std::fs::write(dir.path().join(".gitignore"), "d1/\n*.log\n").unwrap();
            std::fs::write(dir.path().join(".hidden"), "x").unwrap();
            std::fs::write(dir.path().join("d2/skip.log"), "x").unwrap();
            let w = Walk {
                base: dir.path(),
                target: dir.path(),
                include_ignored: false,
            };
            let (ended, visitors) = w.visit(&CancellationToken::new(), || Seen {
                files: Vec::new(),
                on_first: &|| Flow::Continue,
            });
            assert_eq!(ended, Ended::Finished);
            if files < SMALL_WALK {
                assert_eq!(visitors.len(), 1, "a small tree is walked by one visitor");
            }
            let mut seen: Vec<PathBuf> = visitors.into_iter().flat_map(|v| v.files).collect();
            seen.sort();
            let mut want: Vec<PathBuf> = (0..files)
                .filter(|i| i % 10 != 1)
                .map(|i| dir.path().join(format!("d{}/f{i}", i % 10)))
                .chain([".gitignore", ".hidden"].map(|f| dir.path().join(f)))
                .collect();
            want.sort();
            assert_eq!(seen, want, "{files} files");
        }
    }

    #[test]
    fn a_quit_or_a_cancel_stops_a_small_walk_too() {
        let dir = tree(50);
        let (ended, files) = walk(dir.path(), &CancellationToken::new(), &|| Flow::Quit);
        assert_eq!((ended, files.len()), (Ended::Quit, 1));
        let cancel = CancellationToken::new();
        let (ended, files) = walk(dir.path(), &cancel, &|| {
            cancel.cancel();
            Flow::Continue
        });
        assert_eq!((ended, files.len()), (Ended::Cancelled, 1));
    }

    #[test]
    fn a_quit_stops_every_thread() {
        let dir = tree(3000);
        let (ended, files) = walk(dir.path(), &CancellationToken::new(), &|| Flow::Quit);
        assert_eq!(ended, Ended::Quit);
        // Each thread may finish the entry in hand; none goes on walking.
        assert!(files.len() < 100, "{} files after a quit", files.len());
    }

    #[test]
    fn a_cancel_during_the_walk_stops_it() {
        let dir = tree(3000);
        let cancel = CancellationToken::new();
        let (ended, files) = walk(dir.path(), &cancel, &|| {
            cancel.cancel();
            Flow::Continue
        });
        assert_eq!(ended, Ended::Cancelled);
        assert!(files.len() < 100, "{} files after a cancel", files.len());
    }

    #[test]
    fn name_patterns_match_the_file_name_anywhere() {
        let g = PathGlob::new("*.rs", "/workspace").unwrap();
        let root = Path::new("/w");
        assert!(g.is_match(root, Path::new("/w/a.rs")));
        assert!(g.is_match(root, Path::new("/w/src/deep/b.rs")));
        assert!(!g.is_match(root, Path::new("/w/src/b.rs.txt")));
        let g = PathGlob::new("{Cargo,package}.*", "/workspace").unwrap();
        assert!(g.is_match(root, Path::new("/w/x/Cargo.toml")));
        assert!(g.is_match(root, Path::new("/w/package.json")));
    }

    #[test]
    fn path_patterns_match_relative_to_the_root_and_star_stays_in_a_component() {
        let root = Path::new("/w");
        let g = PathGlob::new("src/*.rs", "/workspace").unwrap();
        assert!(g.is_match(root, Path::new("/w/src/a.rs")));
        assert!(!g.is_match(root, Path::new("/w/src/x/a.rs")));
        assert!(!g.is_match(root, Path::new("/w/lib/src/a.rs")));
        let g = PathGlob::new("./src/**/*.rs", "/workspace").unwrap();
        assert!(g.is_match(root, Path::new("/w/src/a.rs")));
        assert!(g.is_match(root, Path::new("/w/src/x/y/a.rs")));
        let g = PathGlob::new("/workspace/src/**/*.rs", "/workspace").unwrap();
        assert!(g.is_match(root, Path::new("/w/src/x/a.rs")));
    }

    #[test]
    fn bad_and_absolute_patterns_are_refused() {
        assert!(matches!(
            PathGlob::new("a{b", "/workspace"),
            Err(GlobError::Syntax(_))
        ));
        assert_eq!(
            PathGlob::new("/etc/*.conf", "/workspace").unwrap_err(),
            GlobError::Absolute {
                pattern: "/etc/*.conf".into(),
                root: "/workspace".into()
            }
        );
        assert!(PathGlob::new("/workspace/", "/workspace").is_err());
    }
}
