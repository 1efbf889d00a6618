//! `edit`: replace an exact piece of a file's text.
//!
//! Owns: matching `old_string` against the text `read` shows, line-ending carry-over, the
//! read-modify-write of one file under its lock, and the result: the path relative to the
//! workspace, the number of replacements, and a snippet of the edited text around the first
//! change, numbered as `read` numbers lines (so the model sees the change landed where it meant).
//!
//! Invariants:
//! * The file is decoded with [`encoding::decode`] — the rule `read` shows lines by — and written
//!   back in kind: byte-order mark, line endings, and every byte outside the replaced text stay
//!   as they were. Text the stored encoding cannot hold is refused (`sandbox.encoding`); U+FFFD is
//!   never written in place of a character. In a file with windows-1252 lines the new bytes are
//!   decoded again before anything is written, and must read as the intended text.
//! * A `\n` in `old_string` matches `\n` or `\r\n` in the file, line by line, so an LF string
//!   matches in CRLF and mixed files. The newlines of the replacement take the endings of the
//!   text they replace (the k-th newline the k-th ending; without any, the ending of the line the
//!   match sits on).
//! * Read, match and write happen under the file's lock, so concurrent edits and writes to one
//!   file all land. The write is atomic and keeps the file's permission bits
//!   (`write::replace_file`).
//! * Files over [`MAX_EDIT_BYTES`] are refused before they are read.
//!
//! Non-goals: fuzzy matching (whitespace- or indentation-insensitive), a staleness check against
//! an earlier read (the match is exact, so a stale `old_string` does not match).

use std::borrow::Cow;
use std::io::Read as _;
use std::ops::Range;
use std::os::unix::fs::PermissionsExt;

use memchr::{memchr, memchr_iter, memrchr};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::encoding::{self, EncodingError};
use super::{ToolOutcome, Toolbox, codes, read, write};
use crate::floor::text;
use crate::floor::workspace::{Access, Resolved};

/// The largest file `edit` reads into memory.
pub const MAX_EDIT_BYTES: u64 = 16 * 1024 * 1024;
/// Lines of unchanged text the result shows before and after the first change.
pub const SNIPPET_CONTEXT: usize = 3;
/// The most lines the result's snippet holds.
pub const SNIPPET_MAX_LINES: usize = 30;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EditInput {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    #[serde(default)]
    pub replace_all: bool,
}

pub fn edit(tb: &Toolbox, input: EditInput, cancel: &CancellationToken) -> ToolOutcome {
    if input.old_string.is_empty() {
        return ToolOutcome::failed(
            codes::INVALID_INPUT,
            "Invalid edit input: old_string must not be empty (use write to create a file).",
        );
    }
    let resolved = match tb.workspace().resolve(&input.path, Access::Write) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    if !resolved.exists {
        return read::not_found(&resolved.display);
    }
    if input.old_string == input.new_string {
        return ToolOutcome::failed(codes::EDIT_NOOP, "old_string and new_string are identical");
    }
    let shown = tb.workspace().relative(&resolved.display);
    let guard = tb.locks().lock(&resolved.host);
    guard.with(|| edit_locked(&resolved, &shown, &input, cancel))
}

/// Edits the file; `shown` is its path as the result names it (relative to the workspace).
fn edit_locked(
    resolved: &Resolved,
    shown: &str,
    input: &EditInput,
    cancel: &CancellationToken,
) -> ToolOutcome {
    let display = &resolved.display;
    let (decoded, mode) = match read_text(resolved) {
        Ok(read) => read,
        Err(outcome) => return outcome,
    };

    let old = fold_crlf(&input.old_string);
    let new = fold_crlf(&input.new_string);
    let folded = Folded::new(&decoded.text);
    let matches: Vec<Range<usize>> = folded
        .text
        .match_indices(old.as_ref())
        .map(|(i, _)| folded.original(i)..folded.original(i + old.len()))
        .collect();
    if let Err(outcome) = check_matches(matches.len(), input.replace_all, display) {
        return outcome;
    }

    // The new bytes must read back as the intended text. UTF-8 and UTF-16 hold any text
    // exactly; only a file with windows-1252 lines can fail, when an edit puts a UTF-8 line's
    // text and windows-1252 bytes on one line, which then decodes differently.
    let mut new_text = decoded
        .has_legacy_lines()
        .then(|| String::with_capacity(decoded.text.len() + new.len()));
    let new_bytes = match splice(&decoded, &matches, &new, new_text.as_mut()) {
        Ok(b) => b,
        Err(e) => return encoding_failed(display, &e),
    };
    if let Some(new_text) = new_text
        && encoding::decode(&new_bytes).map(|d| d.text).as_ref() != Ok(&new_text)
    {
        return ToolOutcome::failed(
            codes::ENCODING,
            format!(
                "After this edit {display} would not read back as the edited text: the file mixes \
                 UTF-8 lines with windows-1252 lines, and the edit puts both on one line. The file \
                 was left unchanged. Edit those lines separately, or convert the file to one \
                 encoding first (e.g. with iconv in bash)."
            ),
        );
    }
    if cancel.is_cancelled() {
        return ToolOutcome::failed(
            codes::CANCELLED,
            "The edit was cancelled; the file was left unchanged.",
        );
    }
    if let Err(e) = write::replace_file(&resolved.host, &new_bytes, mode) {
        return write::write_failed(display, &e);
    }
    let first = &matches[0];
    let replaced = with_endings(&new, &decoded.text, first.clone());
    let edited = edited_text(&decoded.text, &matches, &new);
    ToolOutcome::completed(json!({
        "path": shown,
        "replacements": matches.len(),
        "snippet": snippet(&edited, first.start..first.start + replaced.len()),
    }))
}

/// Whether `n` matches of `old_string` make an edit: one, or several with `replace_all`.
fn check_matches(n: usize, replace_all: bool, display: &str) -> Result<(), ToolOutcome> {
    match n {
        0 => Err(ToolOutcome::failed(
            codes::EDIT_NO_MATCH,
            format!(
                "old_string was not found in {display}. Read the file and copy the text exactly."
            ),
        )),
        1 => Ok(()),
        n if !replace_all => Err(ToolOutcome::failed(
            codes::EDIT_NOT_UNIQUE,
            format!(
                "old_string appears {n} times in {display}. Add surrounding context to make it \
                 unique, or set replace_all."
            ),
        )),
        _ => Ok(()),
    }
}

/// The file's text and its mode, read whole (up to [`MAX_EDIT_BYTES`]) and decoded.
fn read_text(resolved: &Resolved) -> Result<(encoding::Decoded, u32), ToolOutcome> {
    let display = &resolved.display;
    let file = read::open(resolved)?;
    let meta = match file.metadata() {
        Ok(m) => m,
        Err(e) => return Err(read_failed(display, &e)),
    };
    if meta.len() > MAX_EDIT_BYTES {
        return Err(too_large(display, meta.len()));
    }
    let mode = meta.permissions().mode() & 0o7777;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow after the size check: never read past the limit.
    if let Err(e) = file.take(MAX_EDIT_BYTES + 1).read_to_end(&mut bytes) {
        return Err(read_failed(display, &e));
    }
    if bytes.len() as u64 > MAX_EDIT_BYTES {
        return Err(too_large(display, bytes.len() as u64));
    }
    let decoded = match encoding::decode(&bytes) {
        Ok(d) => d,
        Err(EncodingError::Binary) => {
            return Err(read::binary(display, "edit changes text files only"));
        }
        Err(e) => return Err(encoding_failed(display, &e)),
    };
    Ok((decoded, mode))
}

/// The file's text after the edit, as `read` would show it (decoded).
fn edited_text(text: &str, matches: &[Range<usize>], new: &str) -> String {
    let mut out = String::with_capacity(text.len() + new.len().saturating_mul(matches.len()));
    let mut cursor = 0;
    for m in matches {
        out.push_str(&text[cursor..m.start]);
        out.push_str(&with_endings(new, text, m.clone()));
        cursor = m.end;
    }
    out.push_str(&text[cursor..]);
    out
}

/// The lines of `text` around `change` (a byte range of it), numbered as `read` numbers them
/// (`N<TAB>text`): [`SNIPPET_CONTEXT`] lines before and after the changed lines, at most
/// [`SNIPPET_MAX_LINES`] in all (a longer change is cut, and the cut said).
fn snippet(text: &str, change: Range<usize>) -> String {
    let bytes = text.as_bytes();
    let line_start = |at: usize| memrchr(b'\n', &bytes[..at]).map_or(0, |i| i + 1);
    let mut from = line_start(change.start);
    for _ in 0..SNIPPET_CONTEXT {
        if from == 0 {
            break;
        }
        from = line_start(from - 1);
    }
    let first_number = memchr_iter(b'\n', &bytes[..from]).count() + 1;
    // The last changed line holds the change's last byte (its first, for a deletion).
    let last = change
        .end
        .max(change.start + 1)
        .min(bytes.len())
        .saturating_sub(1)
        .max(from);
    let wanted = memchr_iter(b'\n', &bytes[from..last]).count() + 1 + SNIPPET_CONTEXT;
    let lines: Vec<&str> = text[from..].split_inclusive('\n').take(wanted).collect();
    let shown = lines.len().min(SNIPPET_MAX_LINES);
    let width = (first_number + shown.saturating_sub(1)).to_string().len();
    let mut out = String::new();
    for (n, line) in (first_number..).zip(&lines[..shown]) {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let line = line.strip_suffix('\r').unwrap_or(line);
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!("{n:>width$}\t{}", text::clip_line(line)));
    }
    if lines.len() > shown {
        out.push_str(&format!(
            "\n… {} more line(s) of this change; read the file to see them.",
            lines.len() - shown
        ));
    }
    out
}

fn read_failed(display: &str, e: &std::io::Error) -> ToolOutcome {
    ToolOutcome::failed(codes::ERROR, format!("Could not read {display}: {e}"))
}

fn too_large(display: &str, len: u64) -> ToolOutcome {
    ToolOutcome::failed(
        codes::TOO_LARGE,
        format!(
            "{display} is {len} bytes; edit works on files of at most 16 MiB ({MAX_EDIT_BYTES} \
             bytes). Change it with bash instead (e.g. sed or a script)."
        ),
    )
}

fn encoding_failed(display: &str, e: &EncodingError) -> ToolOutcome {
    let message = match e {
        EncodingError::Unmappable { ch, encoding } => format!(
            "new_string has {ch:?} (U+{code:04X}), which {display} cannot hold there: that text is \
             stored in {encoding}. The file was left unchanged. Use characters {encoding} has, or \
             convert the file to UTF-8 first (e.g. with iconv in bash).",
            code = u32::from(*ch)
        ),
        EncodingError::InvalidUtf16(encoding) => format!(
            "{display} starts with a {encoding} byte-order mark but is not valid {encoding}, so \
             edit could not write it back unchanged. Inspect it with bash (`xxd {display} | head`)."
        ),
        EncodingError::Binary => format!("{display} is binary."),
    };
    ToolOutcome::failed(codes::ENCODING, message)
}

/// `s` with every `\r\n` made `\n`: a string the model sends matches lines whatever their ending.
fn fold_crlf(s: &str) -> Cow<'_, str> {
    if s.contains("\r\n") {
        Cow::Owned(s.replace("\r\n", "\n"))
    } else {
        Cow::Borrowed(s)
    }
}

/// A file's text with every `\r\n` folded to `\n`, and where the folded `\r`s were, to map a
/// match back onto the text.
struct Folded<'a> {
    text: Cow<'a, str>,
    /// Offsets in `text` of each `\n` that had a `\r` before it, ascending.
    crs: Vec<usize>,
}

impl<'a> Folded<'a> {
    fn new(text: &'a str) -> Self {
        if !text.contains("\r\n") {
            return Folded {
                text: Cow::Borrowed(text),
                crs: Vec::new(),
            };
        }
        let mut out = String::with_capacity(text.len());
        let mut crs = Vec::new();
        let mut last = 0;
        for (i, _) in text.match_indices("\r\n") {
            out.push_str(&text[last..i]);
            crs.push(out.len());
            out.push('\n');
            last = i + 2;
        }
        out.push_str(&text[last..]);
        Folded {
            text: Cow::Owned(out),
            crs,
        }
    }

    /// The offset in the original text of offset `x` of the folded text. A match that starts at a
    /// folded `\n` starts at its `\r`; one that ends before it leaves the `\r` alone.
    fn original(&self, x: usize) -> usize {
        x + self.crs.partition_point(|&p| p < x)
    }
}

/// The new file's bytes: the decoded text with `matches` replaced by `new`, each stretch in the
/// encoding it is stored in. The new text is also collected into `text_out` when given.
fn splice(
    decoded: &encoding::Decoded,
    matches: &[Range<usize>],
    new: &str,
    mut text_out: Option<&mut String>,
) -> Result<Vec<u8>, EncodingError> {
    let text = &decoded.text;
    let mut bytes = Vec::with_capacity(decoded.bom.len() + text.len() + new.len());
    bytes.extend_from_slice(decoded.bom);
    let mut push = |bytes: &mut Vec<u8>, piece: &str, stored| {
        if let Some(out) = text_out.as_deref_mut() {
            out.push_str(piece);
        }
        encoding::encode_into(bytes, piece, stored)
    };
    let mut cursor = 0;
    for m in matches {
        for (piece, stored) in decoded.pieces(cursor..m.start) {
            push(&mut bytes, &text[piece], stored)?;
        }
        let replacement = with_endings(new, text, m.clone());
        push(&mut bytes, &replacement, decoded.stored_in(m.clone()))?;
        cursor = m.end;
    }
    for (piece, stored) in decoded.pieces(cursor..text.len()) {
        push(&mut bytes, &text[piece], stored)?;
    }
    Ok(bytes)
}

/// `new` (newlines folded to `\n`) with each newline given the ending of the text it replaces,
/// `text[range]`: its k-th newline the k-th ending there (the last one for any beyond), or, when
/// the replaced text has no newline, the ending of the line it sits on.
fn with_endings<'n>(new: &'n str, text: &str, range: Range<usize>) -> Cow<'n, str> {
    if !new.contains('\n') {
        return Cow::Borrowed(new);
    }
    let bytes = text.as_bytes();
    let ending_at = |i: usize| {
        if i > 0 && bytes[i - 1] == b'\r' {
            "\r\n"
        } else {
            "\n"
        }
    };
    let endings: Vec<&str> = memchr_iter(b'\n', &bytes[range.clone()])
        .map(|i| ending_at(range.start + i))
        .collect();
    let line_ending = memchr(b'\n', &bytes[range.end..])
        .map(|i| range.end + i)
        .or_else(|| memrchr(b'\n', &bytes[..range.start]))
        .map_or("\n", ending_at);
    if endings.iter().all(|&e| e == "\n") && (!endings.is_empty() || line_ending == "\n") {
        return Cow::Borrowed(new);
    }
    let mut out = String::with_capacity(new.len() + new.len() / 16);
    for (k, part) in new.split('\n').enumerate() {
        if k > 0 {
            let ending = endings
                .get(k - 1)
                .or(endings.last())
                .copied()
                .unwrap_or(line_ending);
            out.push_str(ending);
        }
        out.push_str(part);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn replace(file: &str, old: &str, new: &str) -> String {
        let decoded = encoding::decode(file.as_bytes()).unwrap();
        let folded = Folded::new(&decoded.text);
        let old = fold_crlf(old);
        let matches: Vec<_> = folded
            .text
            .match_indices(old.as_ref())
            .map(|(i, _)| folded.original(i)..folded.original(i + old.len()))
            .collect();
        let mut text = String::new();
        let bytes = splice(&decoded, &matches, &fold_crlf(new), Some(&mut text)).unwrap();
        assert_eq!(String::from_utf8(bytes).unwrap(), text);
        text
    }

    #[test]
    fn lf_strings_match_crlf_lines_and_take_their_endings() {
        assert_eq!(
            replace("a\r\nb\r\nc\r\n", "a\nb", "x\ny\nz"),
            "x\r\ny\r\nz\r\nc\r\n"
        );
        // A match inside one line: new lines take that line's ending.
        assert_eq!(replace("a\r\nbc\r\n", "b", "1\n2"), "a\r\n1\r\n2c\r\n");
        // The last line has no ending: the one before it counts.
        assert_eq!(replace("a\r\nbc", "c", "1\n2"), "a\r\nb1\r\n2");
        // A string that starts or ends with a newline takes the whole `\r\n` or leaves it alone.
        assert_eq!(replace("a\r\nb\r\n", "\nb", ""), "a\r\n");
        assert_eq!(replace("a\r\nb\r\n", "a", ""), "\r\nb\r\n");
        // A CRLF in the strings matches LF lines too.
        assert_eq!(replace("a\nb\n", "a\r\nb", "c\r\nd"), "c\nd\n");
    }

    #[test]
    fn mixed_endings_are_kept_line_by_line() {
        assert_eq!(
            replace("1\r\n2\n3\r\n4\n", "1\n2\n3\n", "one\ntwo\nthree\nfour\n"),
            "one\r\ntwo\nthree\r\nfour\r\n4\n"
        );
        assert_eq!(
            replace("k=1\r\nk=1\nk=1", "k=1", "k=\n2"),
            "k=\r\n2\r\nk=\n2\nk=\n2"
        );
    }

    #[test]
    fn the_snippet_shows_the_change_with_three_lines_around_it() {
        let text: String = (1..=12).map(|n| format!("line {n}\n")).collect();
        let at = text.find("line 6").unwrap();
        let edited = edited_text(
            &text,
            std::slice::from_ref(&(at..at + 6)),
            "six\nsix and a half",
        );
        let change = at..at + "six\nsix and a half".len();
        assert_eq!(
            snippet(&edited, change),
            " 3\tline 3\n 4\tline 4\n 5\tline 5\n 6\tsix\n 7\tsix and a half\n 8\tline 7\n \
             9\tline 8\n10\tline 9"
        );
        // At the top, a deletion, CRLF lines, and a file that ends in the change.
        assert_eq!(snippet("a\r\nb\r\n", 0..0), "1\ta\n2\tb");
        assert_eq!(snippet("a\nb", 2..3), "1\ta\n2\tb");
        assert_eq!(snippet("", 0..0), "");
        // A change longer than the snippet is cut, and the cut said.
        let long: String = (1..=50).map(|n| format!("{n}\n")).collect();
        let cut = snippet(&long, 0..long.len());
        assert_eq!(cut.lines().count(), SNIPPET_MAX_LINES + 1);
        assert!(
            cut.ends_with("30\t30\n… 20 more line(s) of this change; read the file to see them."),
            "{cut}"
        );
    }

    #[test]
    fn folding_maps_offsets_back() {
        let f = Folded::new("ab\r\ncd\r\n\r\ne");
        assert_eq!(f.text, "ab\ncd\n\ne");
        assert_eq!(
            [0, 2, 3, 5, 6, 7, 8].map(|x| f.original(x)),
            [0, 2, 4, 6, 8, 10, 11]
        );
    }
}
