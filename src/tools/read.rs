//! `read`: a page of a text file as numbered lines.
//!
//! Owns: paging (`offset`, `limit`), the `N<TAB>text` format, the limits on what one answer holds,
//! and the failure texts shared by the file tools for a file that cannot be opened.
//!
//! Invariants:
//! * Lines are split on `\n`; one final empty line is dropped (a trailing newline does not make
//!   a line) and a trailing `\r` is stripped, so CRLF files read like LF files.
//! * Bytes are decoded by [`encoding`]'s rule, the same one `edit` matches against: what the
//!   model reads is what it can edit.
//! * Memory stays bounded whatever the file: it is streamed through a fixed buffer, only the
//!   requested window is kept, each kept line holds at most `LINE_BYTES_KEPT` bytes, and the
//!   whole answer at most [`MAX_OUTPUT_BYTES`]. Lines before and after the window are only
//!   counted.
//! * A FIFO, device or directory is refused without reading from it (`paths::open_regular`).
//!
//! A Jupyter notebook (`.ipynb`) is shown as its cells and outputs ([`notebook`]), paged like
//! any text.
//!
//! Non-goals: images, PDFs (bash can convert them); staleness tracking between a read and an edit
//! (edits match text exactly, under the file's lock).

use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};

use memchr::{memchr, memchr_iter};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::encoding::{self, Sniff, Utf8Check};
use super::{ToolOutcome, Toolbox, codes};
use crate::floor::text;
use crate::floor::workspace::{self as paths, Access, OpenError, Resolved};

pub mod notebook;

/// Lines shown when the call gives no `limit`.
pub const DEFAULT_LIMIT: u64 = 2000;
/// The largest `limit` a call may give.
pub const MAX_LIMIT: u64 = 5000;
/// The most bytes of numbered lines one answer holds (2000-character lines × 5000 would be up to
/// 40 MB). A page that reaches it stops early with the usual "read again with offset" hint.
pub const MAX_OUTPUT_BYTES: usize = 256 * 1024;
/// Bytes kept of one line: enough for [`text::LINE_CHARS`] + 1 characters of any width, so that
/// clipping still sees that the line was longer.
const LINE_BYTES_KEPT: usize = (text::LINE_CHARS + 1) * 4;
/// The read buffer; also the most the scan holds of the file at once.
const BUF_BYTES: usize = 64 * 1024;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadInput {
    pub path: String,
    pub offset: Option<u64>,
    pub limit: Option<u64>,
}

pub fn read(tb: &Toolbox, input: ReadInput, cancel: &CancellationToken) -> ToolOutcome {
    let first = input.offset.unwrap_or(1);
    if first == 0 {
        return ToolOutcome::failed(
            codes::INVALID_INPUT,
            "Invalid read input: offset is 1-based and must be at least 1 (got 0).",
        );
    }
    let limit = input.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return ToolOutcome::failed(
            codes::INVALID_INPUT,
            format!("Invalid read input: limit must be from 1 to {MAX_LIMIT} (got {limit})."),
        );
    }
    let resolved = match tb.workspace().resolve(&input.path, Access::Read) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    let file = match open(&resolved) {
        Ok(f) => f,
        Err(outcome) => return outcome,
    };
    let display = &resolved.display;
    let page = if notebook::is_notebook(display) {
        read_notebook(file, first, limit, cancel)
    } else {
        read_page(file, first, limit, cancel)
    };
    match page {
        Ok(page) => ToolOutcome::completed(page.render(display)),
        Err(ReadError::Binary) => binary(display, "read shows text only"),
        Err(ReadError::Cancelled) => {
            ToolOutcome::failed(codes::CANCELLED, "The read was cancelled.")
        }
        Err(ReadError::Io(e)) => {
            ToolOutcome::failed(codes::ERROR, format!("Could not read {display}: {e}"))
        }
    }
}

/// Opens a resolved path as a regular file, or says why not in the words the file tools share.
pub(crate) fn open(resolved: &Resolved) -> Result<File, ToolOutcome> {
    let display = &resolved.display;
    if !resolved.exists {
        return Err(not_found(display));
    }
    paths::open_regular(&resolved.host).map_err(|e| match e {
        OpenError::NotFound => not_found(display),
        OpenError::NotAFile(kind) => not_a_file(display, kind),
        OpenError::Symlink => ToolOutcome::failed(
            codes::PATH_DENIED,
            format!("{display} was replaced by a symbolic link while it was being opened."),
        ),
        OpenError::Io(e) => {
            ToolOutcome::failed(codes::ERROR, format!("Could not open {display}: {e}"))
        }
    })
}

pub(crate) fn not_found(display: &str) -> ToolOutcome {
    ToolOutcome::failed(codes::NOT_FOUND, format!("No file at {display}"))
}

/// A directory, FIFO, socket or device where a regular file was expected.
pub(crate) fn not_a_file(display: &str, kind: &str) -> ToolOutcome {
    let message = if kind == "a directory" {
        format!(
            "{display} is a directory, not a file. List it with glob (path {display}) or with \
             bash (ls -la {display})."
        )
    } else {
        format!("{display} is {kind}, not a regular file; the file tools only open regular files.")
    };
    ToolOutcome::failed(codes::NOT_A_FILE, message)
}

/// The refusal of a binary file; `what` says what the tool handles instead.
pub(crate) fn binary(display: &str, what: &str) -> ToolOutcome {
    ToolOutcome::failed(
        codes::BINARY_FILE,
        format!(
            "{display} looks binary (it has NUL bytes near the start); {what}. Inspect it with \
             bash: `file {display}` or `xxd {display} | head`."
        ),
    )
}

#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("the file is binary")]
    Binary,
    #[error("cancelled")]
    Cancelled,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The lines one call shows, and how many lines the file has.
#[derive(Debug)]
struct Page {
    first: u64,
    limit: u64,
    /// Digits of the largest number this page could show. The cost of a line is counted with it
    /// before the last shown number (and so the real width) is known.
    width_bound: usize,
    lines: Vec<String>,
    bytes: usize,
    total: u64,
}

impl Page {
    fn new(first: u64, limit: u64) -> Self {
        Page {
            first,
            limit,
            width_bound: digits(first.saturating_add(limit - 1)),
            lines: Vec::new(),
            bytes: 0,
            total: 0,
        }
    }

    /// Offers the next line of the window; returns whether the page takes more lines. A line that
    /// would push the answer past [`MAX_OUTPUT_BYTES`] is left for the next call.
    fn offer(&mut self, line: String) -> bool {
        let cost = self.width_bound + 1 + line.len() + 1;
        if !self.lines.is_empty() && self.bytes + cost > MAX_OUTPUT_BYTES {
            return false;
        }
        self.bytes += cost;
        self.lines.push(line);
        (self.lines.len() as u64) < self.limit
    }

    fn render(&self, display: &str) -> String {
        if self.total == 0 {
            return format!("{display} is empty.");
        }
        if self.first > self.total {
            let lines = if self.total == 1 { "line" } else { "lines" };
            return format!(
                "{display} has {} {lines}; offset {} is past its end.",
                self.total, self.first
            );
        }
        let shown = self.lines.len() as u64;
        let width = digits(self.first + shown - 1);
        let mut out = String::with_capacity(self.bytes + 80);
        for (n, line) in (self.first..).zip(&self.lines) {
            if n > self.first {
                out.push('\n');
            }
            let _ = write!(out, "{n:>width$}\t{line}");
        }
        let next = self.first + shown;
        if next <= self.total {
            let more = self.total - next + 1;
            let _ = write!(
                out,
                "\n… {more} more line(s); read again with offset {next}."
            );
        }
        out
    }
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// A notebook's page of its rendered cells ([`notebook`]); a file too large to render, or that
/// is not a notebook after all, pages as the text it is.
fn read_notebook(
    file: File,
    first: u64,
    limit: u64,
    cancel: &CancellationToken,
) -> Result<Page, ReadError> {
    if file.metadata()?.len() > notebook::MAX_NOTEBOOK_BYTES {
        return read_page(file, first, limit, cancel);
    }
    let mut bytes = Vec::new();
    file.take(notebook::MAX_NOTEBOOK_BYTES + 1)
        .read_to_end(&mut bytes)?;
    match notebook::render(&bytes) {
        Some(text) => read_page(io::Cursor::new(text.into_bytes()), first, limit, cancel),
        None => read_page(io::Cursor::new(bytes), first, limit, cancel),
    }
}

/// Sniffs the file, then streams it into a [`Page`].
fn read_page<R: Read>(
    mut file: R,
    first: u64,
    limit: u64,
    cancel: &CancellationToken,
) -> Result<Page, ReadError> {
    let mut head = Vec::with_capacity(encoding::SNIFF_BYTES);
    (&mut file)
        .take(encoding::SNIFF_BYTES as u64)
        .read_to_end(&mut head)?;
    let sniffed = encoding::sniff(&head);
    if sniffed == Sniff::Binary {
        return Err(ReadError::Binary);
    }
    head.drain(..sniffed.bom_len());
    let raw = io::Cursor::new(head).chain(file);
    let mut page = Page::new(first, limit);
    match sniffed.utf16() {
        Some(encoding) => scan(
            BufReader::with_capacity(BUF_BYTES, Utf16Text::new(raw, encoding)),
            &mut page,
            cancel,
        )?,
        None => scan(BufReader::with_capacity(BUF_BYTES, raw), &mut page, cancel)?,
    }
    Ok(page)
}

/// Walks the lines of `reader`, offering those from `page.first` on to the page until it is full,
/// and counting all of them.
fn scan<R: BufRead>(
    mut reader: R,
    page: &mut Page,
    cancel: &CancellationToken,
) -> Result<(), ReadError> {
    // The number of the line being scanned, and whether it has begun (bytes since the last `\n`).
    let mut n: u64 = 1;
    let mut begun = false;
    let mut taking = true;
    let mut line = LineBuf::default();
    loop {
        if cancel.is_cancelled() {
            return Err(ReadError::Cancelled);
        }
        let buf = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        if buf.is_empty() {
            break;
        }
        let mut pos = 0;
        while pos < buf.len() {
            let rest = &buf[pos..];
            if taking && n >= page.first {
                match memchr(b'\n', rest) {
                    Some(i) => {
                        line.push(&rest[..i]);
                        pos += i + 1;
                        taking = page.offer(line.take_text());
                        n += 1;
                        begun = false;
                    }
                    None => {
                        line.push(rest);
                        pos = buf.len();
                        begun = true;
                    }
                }
            } else {
                // Only newlines matter here: pass up to the window's first line, or count to the
                // end once the page is full.
                let wanted = if taking { page.first - n } else { u64::MAX };
                let mut passed = 0u64;
                let mut last_newline = None;
                for i in memchr_iter(b'\n', rest) {
                    passed += 1;
                    last_newline = Some(i);
                    if passed == wanted {
                        break;
                    }
                }
                n += passed;
                match last_newline {
                    Some(i) if passed == wanted => {
                        pos += i + 1;
                        begun = false;
                    }
                    _ => {
                        begun = last_newline.is_none_or(|i| i + 1 < rest.len());
                        pos = buf.len();
                    }
                }
            }
        }
        let consumed = buf.len();
        reader.consume(consumed);
    }
    if begun {
        // The last line has no newline after it.
        if taking && n >= page.first {
            page.offer(line.take_text());
        }
        n += 1;
    }
    page.total = n - 1;
    Ok(())
}

/// One line being collected: a bounded prefix of its bytes, and whether all of it is UTF-8.
#[derive(Debug, Default)]
struct LineBuf {
    kept: Vec<u8>,
    cut: bool,
    utf8: Utf8Check,
}

impl LineBuf {
    fn push(&mut self, bytes: &[u8]) {
        self.utf8.feed(bytes);
        let room = LINE_BYTES_KEPT - self.kept.len();
        if bytes.len() > room {
            self.cut = true;
        }
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }

    /// The line as shown (decoded, `\r` stripped, clipped, NUL made visible), leaving the buffer
    /// empty for the next line.
    fn take_text(&mut self) -> String {
        let mut bytes = &self.kept[..];
        if !self.cut {
            bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
        }
        // A line that is not UTF-8 (a Latin-1 or CP1252 file) is decoded as windows-1252, which
        // maps every byte: `é` shows as `é`, never as U+FFFD.
        let decoded = encoding::decode_line(bytes, self.utf8.is_valid());
        let clipped = text::clip_line(&decoded);
        // A NUL past the sniffed head is shown as U+FFFD: the answer must stay valid text
        // everywhere it travels (JSON stores, transcripts).
        let shown = if clipped.contains('\0') {
            clipped.replace('\0', "\u{FFFD}")
        } else {
            clipped.into_owned()
        };
        self.kept.clear();
        self.cut = false;
        self.utf8 = Utf8Check::default();
        shown
    }
}

/// UTF-16 bytes in, UTF-8 bytes out, streaming, so that one scanner serves every file. Malformed
/// UTF-16 shows as U+FFFD (read only shows it; `edit` refuses such a file).
struct Utf16Text<R> {
    inner: R,
    decoder: encoding_rs::Decoder,
    input: Box<[u8]>,
    start: usize,
    end: usize,
    eof: bool,
    done: bool,
}

impl<R: Read> Utf16Text<R> {
    fn new(inner: R, encoding: &'static encoding_rs::Encoding) -> Self {
        Utf16Text {
            inner,
            decoder: encoding.new_decoder_without_bom_handling(),
            input: vec![0; BUF_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            done: false,
        }
    }
}

impl<R: Read> Read for Utf16Text<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        // The decoder may need 4 bytes of room for one character.
        if out.len() < 4 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "UTF-16 transcoding needs a buffer of at least 4 bytes",
            ));
        }
        while !self.done {
            if self.start == self.end && !self.eof {
                let n = self.inner.read(&mut self.input)?;
                self.start = 0;
                self.end = n;
                self.eof = n == 0;
            }
            let (result, read, written, _) =
                self.decoder
                    .decode_to_utf8(&self.input[self.start..self.end], out, self.eof);
            self.start += read;
            if self.eof && result == encoding_rs::CoderResult::InputEmpty {
                self.done = true;
            }
            if written > 0 {
                return Ok(written);
            }
        }
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn page_of(bytes: &[u8], first: u64, limit: u64) -> Page {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, bytes).unwrap();
        let file = File::open(&path).unwrap();
        read_page(file, first, limit, &CancellationToken::new()).unwrap()
    }

    #[test]
    fn lines_split_on_newlines_and_one_final_empty_line_is_dropped() {
        for (bytes, lines) in [
            (&b""[..], vec![]),
            (b"\n", vec![""]),
            (b"a", vec!["a"]),
            (b"a\n", vec!["a"]),
            (b"a\n\n", vec!["a", ""]),
            (b"a\r\nb\rc\r\r\n", vec!["a", "b\rc\r"]),
        ] {
            let page = page_of(bytes, 1, 10);
            assert_eq!(page.lines, lines, "{bytes:?}");
            assert_eq!(page.total, lines.len() as u64);
        }
    }

    #[test]
    fn the_window_is_taken_wherever_buffers_end() {
        // Lines that straddle many buffer boundaries, skipped, taken and counted.
        let line = "x".repeat(BUF_BYTES / 3 + 7);
        let file: String = (1..=20).map(|n| format!("{n} {line}\n")).collect();
        let page = page_of(file.as_bytes(), 7, 3);
        assert_eq!(page.total, 20);
        let clip = |n: u64| text::clip_line(&format!("{n} {line}")).into_owned();
        assert_eq!(page.lines, vec![clip(7), clip(8), clip(9)]);
    }

    #[test]
    fn utf16_is_transcoded_across_buffers() {
        let text: String = (1..=5000).map(|n| format!("línea {n}\r\n")).collect();
        let mut bytes = vec![0xFF, 0xFE];
        text.encode_utf16()
            .for_each(|u| bytes.extend_from_slice(&u.to_le_bytes()));
        let page = page_of(&bytes, 4999, 5);
        assert_eq!(page.lines, vec!["línea 4999", "línea 5000"]);
        assert_eq!(page.total, 5000);
    }

    #[test]
    fn digits_of_line_numbers() {
        assert_eq!(
            [0, 1, 9, 10, 99, 100, u64::MAX].map(digits),
            [1, 1, 1, 2, 2, 3, 20]
        );
    }
}
