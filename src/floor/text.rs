//! Text shaping shared by the tools: middle truncation, line clipping, and making arbitrary bytes
//! into valid text; and the one way an error is printed with its causes ([`error_chain`]).
//!
//! Invariants: every function returns valid UTF-8 without NUL characters, cut on character
//! boundaries, and says how much it left out.

/// Characters of a line the tools show before clipping it with `…`.
pub const LINE_CHARS: usize = 2000;

/// The replacement for a byte that is not UTF-8, or a NUL.
pub const REPLACEMENT: char = '\u{FFFD}';

/// An error and each of its causes, once, joined by `: ` on one line. A cause that an error
/// already shows in its own text (`"{what}: {source}"` with `#[source]`) is not repeated.
/// Every front prints errors through this, so a cause appears once whoever wrapped it.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !more.is_empty() && !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// The marker between the head and the tail of a middle-truncated text.
pub fn omitted_marker(omitted_chars: u64) -> String {
    format!("\n… [{omitted_chars} characters omitted] …\n")
}

/// Cuts `text` to at most `max_chars` characters (plus the marker), keeping the first and last
/// halves. Returns the text and how many characters were left out (0 when it fit).
pub fn truncate_middle(text: &str, max_chars: usize) -> (String, u64) {
    let total = text.chars().count();
    if total <= max_chars {
        return (text.to_owned(), 0);
    }
    let head_chars = max_chars / 2;
    let tail_chars = max_chars - head_chars;
    let omitted = (total - head_chars - tail_chars) as u64;
    let head_end = text
        .char_indices()
        .nth(head_chars)
        .map_or(text.len(), |(i, _)| i);
    let tail_start = text
        .char_indices()
        .nth(total - tail_chars)
        .map_or(text.len(), |(i, _)| i);
    let mut out = String::with_capacity(head_end + (text.len() - tail_start) + 48);
    out.push_str(&text[..head_end]);
    out.push_str(&omitted_marker(omitted));
    out.push_str(&text[tail_start..]);
    (out, omitted)
}

/// Clips one line to [`LINE_CHARS`] characters, marking a cut with `…`.
pub fn clip_line(line: &str) -> std::borrow::Cow<'_, str> {
    clip_chars(line, LINE_CHARS)
}

/// Clips `s` to `max` characters, marking a cut with `…`.
pub fn clip_chars(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    // Fast path: a string of at most `max` bytes has at most `max` characters.
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    match s.char_indices().nth(max) {
        None => std::borrow::Cow::Borrowed(s),
        Some((cut, _)) => {
            let mut out = String::with_capacity(cut + 3);
            out.push_str(&s[..cut]);
            out.push('…');
            std::borrow::Cow::Owned(out)
        }
    }
}

/// Makes bytes valid text: invalid UTF-8 sequences and NUL bytes become U+FFFD. Returns the text
/// and how many replacements were made.
pub fn lossy_text(bytes: &[u8]) -> (String, u64) {
    let mut out = String::with_capacity(bytes.len());
    let mut replaced = 0u64;
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        if valid.contains('\0') {
            for c in valid.chars() {
                if c == '\0' {
                    out.push(REPLACEMENT);
                    replaced += 1;
                } else {
                    out.push(c);
                }
            }
        } else {
            out.push_str(valid);
        }
        if !chunk.invalid().is_empty() {
            out.push(REPLACEMENT);
            replaced += 1;
        }
    }
    (out, replaced)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_middle_keeps_halves_on_char_boundaries() {
        assert_eq!(truncate_middle("short", 10), ("short".to_owned(), 0));
        let s = "é".repeat(10) + &"😀".repeat(10);
        let (out, omitted) = truncate_middle(&s, 6);
        assert_eq!(omitted, 14);
        assert_eq!(out, format!("ééé{}😀😀😀", omitted_marker(14)));
    }

    #[test]
    fn clip_line_marks_the_cut() {
        let long = "a".repeat(LINE_CHARS + 5);
        assert_eq!(clip_line(&long), format!("{}…", "a".repeat(LINE_CHARS)));
        let wide = "ü".repeat(LINE_CHARS);
        assert_eq!(clip_line(&wide), wide.as_str());
    }

    #[test]
    fn lossy_text_replaces_invalid_bytes_and_nuls() {
        let (t, n) = lossy_text(b"ok\0\xff\xfe done \xe2\x82");
        assert_eq!(t, "ok\u{FFFD}\u{FFFD}\u{FFFD} done \u{FFFD}");
        assert_eq!(n, 4);
    }
}
