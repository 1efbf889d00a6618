//! `grep`: search file contents with a regular expression, in process, with ripgrep's own engine
//! (grep-regex + grep-searcher) over the parallel, ignore-aware walk of [`super::walk`].
//!
//! Owns: the grep input's validation, the per-file sink, the shared result budget, and the output
//! text of the three modes (`content`, `files_with_matches`, `count`).
//!
//! Invariants:
//! * Memory is bounded by the budget: a line is stored only after it won a slot of `max_results`
//!   (an atomic counter shared by all walk threads), a stored line is at most
//!   [`text::LINE_CHARS`] characters, and the searcher's buffer is capped at [`HEAP_LIMIT`].
//! * The first line refused for lack of budget stops the walk, and only then is the "more
//!   matches omitted" hint added: with exactly `max_results` results there is no hint.
//! * Count mode walks the whole tree, whatever `max_results`: every listed count is the file's
//!   whole count, and the last line gives the total (matching lines and files) of all of it. Only
//!   the listing is cut, at the first `max_results` files by path (each thread keeps a bounded
//!   heap of them, so memory does not grow with the tree).
//! * Output is valid text (lossy UTF-8, NUL-free) and sorted by path, then line, so a given set of
//!   matches always prints the same way — whichever thread found them.
//! * Binary files (a NUL byte) are skipped, also when the NUL comes after some matches; UTF-16
//!   files with a byte-order mark are searched decoded.
//! * A file named as `path` is searched even when ignore files exclude it (the model asked for
//!   it); the `glob` filter applies to walked files only, like `rg --glob`.
//!
//! Non-goals: which files exist or are ignored (`walk`); shaping the result to a record budget
//! (`nylorun::turn::shaping`); PCRE features (look-around, backreferences) — the Rust regex syntax is the
//! one the tool description promises.

use std::collections::BinaryHeap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use ignore::DirEntry;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::walk::{Ended, FileVisitor, Flow, PathGlob, SearchRoot};
use super::{ToolOutcome, Toolbox, codes};
use crate::floor::text;
use crate::floor::workspace as paths;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrepInput {
    pub pattern: String,
    pub path: Option<String>,
    pub glob: Option<String>,
    #[serde(default)]
    pub ignore_case: bool,
    pub max_results: Option<u64>,
    pub output_mode: Option<String>,
    pub context: Option<u64>,
    #[serde(default)]
    pub multiline: bool,
    #[serde(default)]
    pub include_ignored: bool,
}

/// Result lines when the input names no `max_results`.
pub const DEFAULT_MAX_RESULTS: u64 = 200;
/// The largest `max_results` the schema allows.
pub const MAX_RESULTS_LIMIT: u64 = 1000;
/// The most context lines (before and after) the schema allows.
pub const MAX_CONTEXT: u64 = 20;
/// The searcher's buffer cap per thread: the longest line it will hold (or, in multiline mode,
/// the largest file). A file past it is reported as not searched.
pub const HEAP_LIMIT: usize = 64 << 20;
/// Appended (after a newline) when the budget ran out.
pub const MORE_HINT: &str = "… more matches omitted; narrow the search.";
/// The whole output when nothing matched.
pub const NO_MATCHES: &str = "No matches.";
/// How many bytes of a line to decode before clipping: a character is at most 4 bytes (and an
/// invalid sequence at most 3), so this many always hold more than `LINE_CHARS` characters.
const LINE_BYTES: usize = text::LINE_CHARS * 4 + 4;

/// What the output lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `path:line:text`, context lines `path-line-text`.
    Content,
    /// One path per matching file.
    FilesWithMatches,
    /// `path:N`, N matching lines, then the total.
    Count,
}

/// An `output_mode` grep does not know (as the model gave it).
#[derive(Debug, thiserror::Error)]
#[error("output_mode must be \"content\", \"files_with_matches\" or \"count\"; got {0:?}.")]
struct UnknownMode(String);

impl UnknownMode {
    /// The outcome's code: the input does not match the tool's schema.
    const CODE: &str = codes::INVALID_INPUT;
}

impl Mode {
    fn parse(s: Option<&str>) -> Result<Mode, UnknownMode> {
        match s {
            None | Some("content") => Ok(Mode::Content),
            Some("files_with_matches") => Ok(Mode::FilesWithMatches),
            Some("count") => Ok(Mode::Count),
            Some(other) => Err(UnknownMode(other.to_owned())),
        }
    }
}

/// A validated grep call, everything but the path.
struct Plan {
    matcher: RegexMatcher,
    searcher: SearcherBuilder,
    mode: Mode,
    context: usize,
    max_results: usize,
    glob: Option<PathGlob>,
}

impl Plan {
    /// Checks the input against the schema's limits and compiles the regex and the glob.
    /// `root_display` is the search root as the model knows it (for absolute globs).
    fn new(input: &GrepInput, root_display: &str) -> Result<Plan, ToolOutcome> {
        let invalid = |m: String| ToolOutcome::failed(codes::INVALID_INPUT, m);
        if input.pattern.is_empty() {
            return Err(invalid("pattern must not be empty.".to_owned()));
        }
        let mode = Mode::parse(input.output_mode.as_deref())
            .map_err(|e| ToolOutcome::failed(UnknownMode::CODE, e.to_string()))?;
        let max_results = input.max_results.unwrap_or(DEFAULT_MAX_RESULTS);
        if !(1..=MAX_RESULTS_LIMIT).contains(&max_results) {
            return Err(invalid(format!(
                "max_results must be between 1 and {MAX_RESULTS_LIMIT}; got {max_results}."
            )));
        }
        let context = input.context.unwrap_or(0);
        if context > MAX_CONTEXT {
            return Err(invalid(format!(
                "context must be between 0 and {MAX_CONTEXT}; got {context}."
            )));
        }
        if context > 0 && mode != Mode::Content {
            return Err(invalid(
                "context applies to output_mode \"content\" only.".to_owned(),
            ));
        }
        let glob = match input.glob.as_deref() {
            None => None,
            Some("") => return Err(invalid("glob must not be empty.".to_owned())),
            Some(g) => Some(PathGlob::new(g, root_display).map_err(|e| invalid(e.to_string()))?),
        };

        // The same matcher configuration as ripgrep's: `^`/`$` at line boundaries, and in
        // line mode a line terminator the regex can never match, which lets the searcher run
        // the regex over whole buffers instead of line by line.
        let mut mb = RegexMatcherBuilder::new();
        mb.multi_line(true)
            .unicode(true)
            .octal(false)
            .case_insensitive(input.ignore_case)
            // Binary detection stops at a NUL, so a pattern with one could never match.
            .ban_byte(Some(b'\0'));
        if input.multiline {
            mb.dot_matches_new_line(true);
        } else {
            mb.line_terminator(Some(b'\n')).dot_matches_new_line(false);
        }
        let matcher = mb
            .build(&input.pattern)
            .map_err(|e| invalid(regex_error(&input.pattern, input.ignore_case, e)))?;

        let mut searcher = SearcherBuilder::new();
        searcher
            // Counting lines costs a pass over every buffer; only content output shows them.
            .line_number(mode == Mode::Content)
            .multi_line(input.multiline)
            .before_context(context as usize)
            .after_context(context as usize)
            .binary_detection(BinaryDetection::quit(b'\0'))
            .heap_limit(Some(HEAP_LIMIT));
        Ok(Plan {
            matcher,
            searcher,
            mode,
            context: context as usize,
            max_results: max_results as usize,
            glob,
        })
    }
}

/// The message for a pattern that did not compile. grep-regex reports the pattern wrapped in
/// `(?:…)`, with the caret placed in the wrapper; the plain regex parser points into the pattern
/// as the model wrote it, so its message is preferred when it fails too.
fn regex_error(pattern: &str, ignore_case: bool, e: grep_regex::Error) -> String {
    match regex::RegexBuilder::new(pattern)
        .case_insensitive(ignore_case)
        .multi_line(true)
        .build()
    {
        Err(plain) => format!("Invalid regex: {plain}"),
        Ok(_) => format!("Invalid regex: {e}"),
    }
}

pub fn search(tb: &Toolbox, input: GrepInput, cancel: &CancellationToken) -> ToolOutcome {
    match search_files(tb, &input, cancel) {
        Ok(found) => {
            tracing::debug!(
                searched = found.searched,
                files = found.files.len(),
                more = found.over,
                "grep done"
            );
            let ws = tb.workspace();
            ToolOutcome::completed(found.render(|p| ws.relative_display_of(p)))
        }
        Err(outcome) => outcome,
    }
}

/// Runs the search: what it found, or why it could not run.
fn search_files(
    tb: &Toolbox,
    input: &GrepInput,
    cancel: &CancellationToken,
) -> Result<Found, ToolOutcome> {
    let root = SearchRoot::resolve(tb.workspace(), input.path.as_deref())?;
    let plan = Plan::new(input, &root.display)?;
    let shared = Shared {
        plan: &plan,
        cancel,
        used: AtomicUsize::new(0),
        over: AtomicBool::new(false),
    };

    let visitors = if root.meta.is_dir() {
        let (ended, visitors) = root
            .walk(input.include_ignored)
            .visit(cancel, || Searching::new(&shared, &root.host));
        if ended == Ended::Cancelled {
            return Err(cancelled());
        }
        visitors
    } else if root.meta.is_file() {
        let mut one = Searching::new(&shared, &root.host);
        one.search(&root.host);
        vec![one]
    } else {
        return Err(ToolOutcome::failed(
            codes::NOT_A_FILE,
            format!(
                "{} is {}, not a file or directory.",
                root.display,
                paths::file_kind(&root.meta.file_type())
            ),
        ));
    };
    if cancel.is_cancelled() {
        return Err(cancelled());
    }
    Ok(Found::merge(visitors, &shared))
}

fn cancelled() -> ToolOutcome {
    ToolOutcome::failed(codes::CANCELLED, "The search was cancelled.")
}

/// State every walk thread shares.
struct Shared<'a> {
    plan: &'a Plan,
    cancel: &'a CancellationToken,
    /// Result slots handed out; may run past `max_results` by the refused attempts.
    used: AtomicUsize,
    /// A result was refused: the output is incomplete and the walk is stopping.
    over: AtomicBool,
}

impl Shared<'_> {
    /// Claims one result slot, or marks the output as incomplete.
    fn take(&self) -> bool {
        if self.used.fetch_add(1, Ordering::Relaxed) < self.plan.max_results {
            true
        } else {
            self.over.store(true, Ordering::Relaxed);
            false
        }
    }

    /// Returns slots of results that were dropped after all (a file turned out binary).
    fn give_back(&self, n: usize) {
        if n > 0 {
            self.used.fetch_sub(n, Ordering::Relaxed);
        }
    }

    fn stopping(&self) -> bool {
        self.over.load(Ordering::Relaxed) || self.cancel.is_cancelled()
    }
}

/// One line of content output.
#[derive(Debug)]
enum Line {
    Text {
        number: u64,
        /// A context line (`-` separators) rather than a match (`:`).
        context: bool,
        text: String,
    },
    /// `--` between groups that are not adjacent.
    Break,
}

/// What one file contributed.
#[derive(Debug)]
enum Hits {
    Lines(Vec<Line>),
    Matched,
    Count(u64),
}

#[derive(Debug)]
struct FileHits {
    path: PathBuf,
    hits: Hits,
}

/// One walk thread's searcher and what it found.
struct Searching<'a> {
    shared: &'a Shared<'a>,
    /// The search root (host path), for path globs.
    root: &'a Path,
    searcher: Searcher,
    matcher: RegexMatcher,
    found: Vec<FileHits>,
    /// Count mode: the totals, and the first `max_results` files by path.
    counted: Counted,
    failures: Failures,
    /// Files opened for searching.
    searched: usize,
}

impl<'a> Searching<'a> {
    fn new(shared: &'a Shared<'a>, root: &'a Path) -> Self {
        Searching {
            shared,
            root,
            searcher: shared.plan.searcher.build(),
            // A clone per thread, as ripgrep does: each gets its own regex caches.
            matcher: shared.plan.matcher.clone(),
            found: Vec::new(),
            counted: Counted::default(),
            failures: Failures::default(),
            searched: 0,
        }
    }

    /// Searches one file, keeping its results if it had any.
    fn search(&mut self, path: &Path) {
        let file = match open_listed(path) {
            Ok(f) => f,
            // Gone, or swapped for a symlink, since the walk listed it.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ELOOP)) => return,
            Err(e) => return self.failures.add(path, &e),
        };
        self.searched += 1;
        let mut sink = FileSink {
            shared: self.shared,
            lines: Vec::new(),
            count: 0,
            taken: 0,
            cut: false,
            binary: false,
        };
        let reader = Stoppable {
            inner: file,
            shared: self.shared,
        };
        let result = self
            .searcher
            .search_reader(&self.matcher, reader, &mut sink);
        let mode = self.shared.plan.mode;
        let stopped = self.shared.stopping();
        // Cut short for the budget or a cancel, lines already found are real; a partial count
        // is not (count mode is only ever cut by a cancel).
        let keep = match &result {
            _ if sink.binary => false,
            Ok(()) => !(sink.cut && mode == Mode::Count),
            Err(_) if stopped => mode != Mode::Count,
            Err(e) => {
                self.failures.add(path, e);
                false
            }
        };
        if keep && mode == Mode::Count && sink.count > 0 {
            self.counted
                .add(path, sink.count, self.shared.plan.max_results);
            return;
        }
        if !keep || sink.taken == 0 {
            self.shared.give_back(sink.taken);
            return;
        }
        let hits = match mode {
            Mode::Content => {
                if matches!(sink.lines.last(), Some(Line::Break)) {
                    sink.lines.pop();
                }
                Hits::Lines(sink.lines)
            }
            Mode::FilesWithMatches => Hits::Matched,
            // Counted above.
            Mode::Count => return,
        };
        self.found.push(FileHits {
            path: path.to_path_buf(),
            hits,
        });
    }
}

impl FileVisitor for Searching<'_> {
    fn file(&mut self, entry: &DirEntry) -> Flow {
        let path = entry.path();
        if let Some(glob) = &self.shared.plan.glob
            && !glob.is_match(self.root, path)
        {
            return Flow::Continue;
        }
        self.search(path);
        if self.shared.stopping() {
            Flow::Quit
        } else {
            Flow::Continue
        }
    }
}

/// Files that could not be searched (unreadable, a line past the heap limit).
#[derive(Debug, Default)]
struct Failures {
    count: u64,
    /// The first by path, for a deterministic message.
    first: Option<(PathBuf, String)>,
}

impl Failures {
    fn add(&mut self, path: &Path, e: &io::Error) {
        self.count += 1;
        if self.first.as_ref().is_none_or(|(p, _)| path < p.as_path()) {
            self.first = Some((path.to_path_buf(), describe(e)));
        }
    }

    fn merge(&mut self, other: Failures) {
        self.count += other.count;
        if let Some((p, m)) = other.first
            && self.first.as_ref().is_none_or(|(q, _)| p < *q)
        {
            self.first = Some((p, m));
        }
    }
}

/// Count mode's findings in one thread (or all of them, merged): the totals of every counted
/// file, and the first `max_results` of those files by path.
#[derive(Debug, Default)]
struct Counted {
    files: u64,
    lines: u64,
    /// A max-heap by path, so its top is the file to drop when one more is kept.
    first: BinaryHeap<(PathBuf, u64)>,
}

impl Counted {
    fn add(&mut self, path: &Path, count: u64, keep: usize) {
        self.files += 1;
        self.lines += count;
        if self.first.len() == keep {
            match self.first.peek() {
                Some((last, _)) if path < last.as_path() => {
                    self.first.pop();
                }
                _ => return,
            }
        }
        self.first.push((path.to_path_buf(), count));
    }

    fn merge(&mut self, other: Counted) {
        self.files += other.files;
        self.lines += other.lines;
        self.first.extend(other.first);
    }
}

/// An error as the model should read it. The searcher's own text for its heap limit names a
/// byte count and an allocation; what the model needs is what to do about it.
fn describe(e: &io::Error) -> String {
    let text = e.to_string();
    if text.starts_with("configured allocation limit") {
        format!(
            "a line (in multiline mode, the file) is longer than {} MiB",
            HEAP_LIMIT >> 20
        )
    } else {
        text
    }
}

/// Collects one file's results, claiming a budget slot per result.
struct FileSink<'a> {
    shared: &'a Shared<'a>,
    lines: Vec<Line>,
    /// Matching lines (count mode).
    count: u64,
    /// Budget slots this file holds.
    taken: usize,
    /// The search of this file was cut short (budget spent or cancelled).
    cut: bool,
    binary: bool,
}

impl FileSink<'_> {
    fn take(&mut self) -> bool {
        if self.shared.take() {
            self.taken += 1;
            true
        } else {
            self.cut = true;
            false
        }
    }

    fn push(&mut self, number: u64, context: bool, bytes: &[u8]) -> bool {
        if !self.take() {
            return false;
        }
        self.lines.push(Line::Text {
            number,
            context,
            text: line_text(bytes),
        });
        true
    }
}

impl Sink for FileSink<'_> {
    type Error = io::Error;

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, io::Error> {
        match self.shared.plan.mode {
            Mode::Content => {
                let first = mat.line_number().unwrap_or(1);
                for (i, line) in mat.lines().enumerate() {
                    if !self.push(first + i as u64, false, line) {
                        return Ok(false);
                    }
                }
                Ok(true)
            }
            // One slot per file, and the first match is enough to know it.
            Mode::FilesWithMatches => {
                self.take();
                Ok(false)
            }
            // No budget: every file is counted whole, the listing is cut later.
            Mode::Count => {
                self.count += mat.lines().count() as u64;
                if self.shared.cancel.is_cancelled() {
                    self.cut = true;
                    return Ok(false);
                }
                Ok(true)
            }
        }
    }

    fn context(&mut self, _: &Searcher, ctx: &SinkContext<'_>) -> Result<bool, io::Error> {
        Ok(self.push(ctx.line_number().unwrap_or(0), true, ctx.bytes()))
    }

    fn context_break(&mut self, _: &Searcher) -> Result<bool, io::Error> {
        if matches!(self.lines.last(), Some(Line::Text { .. })) {
            self.lines.push(Line::Break);
        }
        Ok(true)
    }

    fn binary_data(&mut self, _: &Searcher, _offset: u64) -> Result<bool, io::Error> {
        self.binary = true;
        Ok(false)
    }
}

/// Opens a file the walk (or `run`) saw as a regular file. Unlike [`paths::open_regular`] it
/// does not `fstat` again — that costs a syscall per file, and rg does without. A file swapped
/// since it was listed cannot lead elsewhere (`O_NOFOLLOW`) or block (`O_NONBLOCK`); a directory
/// fails to read, and a device put in its place would be cut short by binary detection and the
/// heap limit.
fn open_listed(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

/// A file reader that fails once the search is stopping, so that a long file does not keep a
/// thread busy after the budget is spent or the call was cancelled.
struct Stoppable<'a> {
    inner: std::fs::File,
    shared: &'a Shared<'a>,
}

impl Read for Stoppable<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.shared.stopping() {
            return Err(io::Error::other("search stopped"));
        }
        self.inner.read(buf)
    }
}

/// Count mode's last line: the total of the whole tree, and how many files the listing left out.
fn count_total(lines: u64, files: u64, listed: u64) -> String {
    let plural = |n: u64, one: &'static str, many: &'static str| if n == 1 { one } else { many };
    let total = format!(
        "{lines} matching {} in {files} {}",
        plural(lines, "line", "lines"),
        plural(files, "file", "files")
    );
    match files.saturating_sub(listed) {
        0 => format!("{total}."),
        left => format!(
            "… {left} more {} not listed; {total} in all. Narrow the search to list them.",
            plural(left, "file", "files")
        ),
    }
}

/// A matched or context line as text: terminator dropped, valid UTF-8, clipped.
fn line_text(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let head = &bytes[..bytes.len().min(LINE_BYTES)];
    let (text, _) = text::lossy_text(head);
    match text::clip_line(&text) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(clipped) => clipped,
    }
}

/// Everything the threads found, merged.
#[derive(Debug)]
struct Found {
    files: Vec<FileHits>,
    failures: Failures,
    /// The budget ran out: there were more results.
    over: bool,
    /// Context lines asked for (groups of different files are then separated).
    context: usize,
    /// Files searched, all threads together.
    searched: usize,
    /// Count mode: matching lines and files in the whole tree, listed or not.
    totals: Option<(u64, u64)>,
}

impl Found {
    fn merge(visitors: Vec<Searching<'_>>, shared: &Shared<'_>) -> Found {
        let mut files = Vec::new();
        let mut failures = Failures::default();
        let mut counted = Counted::default();
        let mut searched = 0;
        for v in visitors {
            files.extend(v.found);
            counted.merge(v.counted);
            failures.merge(v.failures);
            searched += v.searched;
        }
        let totals = (shared.plan.mode == Mode::Count).then_some((counted.lines, counted.files));
        let mut first = counted.first.into_vec();
        first.sort_unstable();
        first.truncate(shared.plan.max_results);
        files.extend(first.into_iter().map(|(path, n)| FileHits {
            path,
            hits: Hits::Count(n),
        }));
        // Each file's lines are already in order; sorting the files makes the output
        // independent of which thread found what.
        files.sort_unstable_by(|a, b| a.path.cmp(&b.path));
        Found {
            files,
            failures,
            over: shared.over.load(Ordering::Relaxed),
            context: shared.plan.context,
            searched,
            totals,
        }
    }

    /// The output text; `display` names a host path for the model.
    fn render(&self, display: impl Fn(&Path) -> String) -> String {
        let mut out = String::new();
        let mut push = |line: &str| {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(line);
        };
        for (i, file) in self.files.iter().enumerate() {
            let name = display(&file.path);
            match &file.hits {
                Hits::Lines(lines) => {
                    // Like rg: with context, groups of different files are separated too.
                    if self.context > 0 && i > 0 {
                        push("--");
                    }
                    for line in lines {
                        match line {
                            Line::Break => push("--"),
                            Line::Text {
                                number,
                                context,
                                text,
                            } => {
                                let sep = if *context { '-' } else { ':' };
                                push(&format!("{name}{sep}{number}{sep}{text}"));
                            }
                        }
                    }
                }
                Hits::Matched => push(&name),
                Hits::Count(n) => push(&format!("{name}:{n}")),
            }
        }
        if out.is_empty() {
            out.push_str(NO_MATCHES);
        } else if let Some((lines, files)) = self.totals {
            out.push('\n');
            out.push_str(&count_total(lines, files, self.files.len() as u64));
        }
        if self.over {
            out.push('\n');
            out.push_str(MORE_HINT);
        }
        if let Some((path, err)) = &self.failures.first {
            let n = self.failures.count;
            let files = if n == 1 { "file" } else { "files" };
            out.push_str(&format!(
                "\n({n} {files} could not be searched; {}: {err})",
                display(path)
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::{BaseEnv, CommandEnv, ExecConfig, Executor, ResourceLimits};
    use crate::floor::workspace::Workspace;

    fn toolbox(dir: &Path) -> Toolbox {
        let ws = Workspace::new(dir, Some(Path::new("/workspace"))).unwrap();
        Toolbox::new(
            ws,
            Executor::new(ExecConfig {
                supervisor: PathBuf::from("/bin/false"),
                shell: PathBuf::from("/bin/sh"),
                env: CommandEnv::new(BaseEnv::default(), None),
                limits: ResourceLimits::default(),
            }),
        )
    }

    fn input(v: serde_json::Value) -> GrepInput {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_walk_stops_once_the_budget_is_spent() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..2000 {
            let d = dir.path().join(format!("d{}", i % 20));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join(format!("f{i}.txt")), "needle\n").unwrap();
        }
        let tb = toolbox(dir.path());
        let cancel = CancellationToken::new();
        let all = search_files(
            &tb,
            &input(serde_json::json!({"pattern": "absent"})),
            &cancel,
        )
        .unwrap();
        assert_eq!((all.searched, all.files.len(), all.over), (2000, 0, false));
        for mode in ["content", "files_with_matches"] {
            let few = input(
                serde_json::json!({"pattern": "needle", "max_results": 5, "output_mode": mode}),
            );
            let found = search_files(&tb, &few, &cancel).unwrap();
            assert_eq!((found.files.len(), found.over), (5, true), "{mode}");
            // The sixth match stops every thread: a few files in flight, not the tree.
            assert!(found.searched < 50, "{mode}: searched {}", found.searched);
        }
        // Count mode counts the whole tree and lists the first five files by path.
        let few = input(
            serde_json::json!({"pattern": "needle", "max_results": 5, "output_mode": "count"}),
        );
        let found = search_files(&tb, &few, &cancel).unwrap();
        assert_eq!(
            (found.searched, found.totals, found.over),
            (2000, Some((2000, 2000)), false)
        );
        let listed: Vec<_> = found.files.iter().map(|f| f.path.clone()).collect();
        let mut want: Vec<_> = (0..2000)
            .map(|i| dir.path().join(format!("d{}/f{i}.txt", i % 20)))
            .collect();
        want.sort();
        assert_eq!(listed, want[..5]);
    }

    #[test]
    fn line_text_drops_terminators_and_clips_long_lines() {
        assert_eq!(line_text(b"abc\r\n"), "abc");
        assert_eq!(line_text(b"a\xffb\n"), "a\u{FFFD}b");
        let long = "é".repeat(text::LINE_CHARS * 3);
        assert_eq!(
            line_text(long.as_bytes()),
            format!("{}…", "é".repeat(text::LINE_CHARS))
        );
    }
}
