//! How the file tools turn a file's bytes into the text the model sees, and that text back into
//! bytes.
//!
//! Owns: byte-order-mark and binary sniffing, the per-line decoding rule that `read` shows, and
//! the whole-file decoding that `edit` works on and writes back.
//!
//! The rule, in one place so that `read` and `edit` cannot drift apart:
//! * A NUL byte in the first [`SNIFF_BYTES`] bytes, without a UTF-16 byte-order mark, makes the
//!   file binary: the tools refuse it.
//! * A UTF-16 LE/BE byte-order mark: the rest is UTF-16 in that byte order.
//! * Otherwise a UTF-8 byte-order mark is skipped, and each line (split on `\n`) is UTF-8 when it
//!   is valid UTF-8, else windows-1252. Files that are not UTF-8 are nearly always Latin-1 or
//!   CP1252; WHATWG's windows-1252 maps every one of the 256 bytes to a character (Latin-1 is a
//!   subset of it), so such a line reads `é` as `é`, never as U+FFFD. Deciding per line keeps a
//!   UTF-8 file with one stray Latin-1 line readable everywhere else.
//!
//! Invariants:
//! * [`decode`], then [`encode_into`] of each of its spans, gives back the original bytes exactly:
//!   UTF-8 and valid UTF-16 are bijective, and windows-1252 round-trips all 256 bytes (tested
//!   below). A UTF-16 file that is not valid UTF-16 cannot round-trip and is refused.
//! * Text is never written with U+FFFD standing in for a byte: a character the stored encoding
//!   cannot hold is an [`EncodingError`], not a replacement.
//!
//! Non-goals: guessing other legacy encodings (Shift-JIS, GBK, …) or UTF-16 without a BOM. Such
//! files read as windows-1252 (or are refused as binary) and round-trip byte for byte, so an edit
//! of their ASCII parts is still safe.

use std::borrow::Cow;
use std::ops::Range;

use encoding_rs::{UTF_16BE, UTF_16LE, WINDOWS_1252};

/// How many leading bytes are searched for a NUL to call a file binary.
pub const SNIFF_BYTES: usize = 8192;

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";
const UTF16LE_BOM: &[u8] = b"\xFF\xFE";
const UTF16BE_BOM: &[u8] = b"\xFE\xFF";

/// What the start of a file says about how to decode it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sniff {
    /// A NUL in the first [`SNIFF_BYTES`] bytes and no UTF-16 byte-order mark.
    Binary,
    /// A UTF-8 byte-order mark, then lines decoded by the per-line rule.
    Utf8Bom,
    /// UTF-16, little-endian, after its byte-order mark.
    Utf16Le,
    /// UTF-16, big-endian, after its byte-order mark.
    Utf16Be,
    /// No byte-order mark: lines decoded by the per-line rule.
    Plain,
}

impl Sniff {
    /// The byte-order mark's length: how many bytes to skip before the text.
    pub fn bom_len(self) -> usize {
        match self {
            Sniff::Utf8Bom => UTF8_BOM.len(),
            Sniff::Utf16Le | Sniff::Utf16Be => UTF16LE_BOM.len(),
            Sniff::Binary | Sniff::Plain => 0,
        }
    }

    /// The decoder for a UTF-16 file, `None` for the byte-oriented ones.
    pub fn utf16(self) -> Option<&'static encoding_rs::Encoding> {
        match self {
            Sniff::Utf16Le => Some(UTF_16LE),
            Sniff::Utf16Be => Some(UTF_16BE),
            _ => None,
        }
    }
}

/// Classifies a file by its first bytes (at least [`SNIFF_BYTES`] of them, or the whole file).
pub fn sniff(head: &[u8]) -> Sniff {
    if head.starts_with(UTF16LE_BOM) {
        return Sniff::Utf16Le;
    }
    if head.starts_with(UTF16BE_BOM) {
        return Sniff::Utf16Be;
    }
    let probe = &head[..head.len().min(SNIFF_BYTES)];
    if memchr::memchr(0, probe).is_some() {
        return Sniff::Binary;
    }
    if head.starts_with(UTF8_BOM) {
        Sniff::Utf8Bom
    } else {
        Sniff::Plain
    }
}

/// Decodes one line (or a prefix of one) by the per-line rule: UTF-8 when valid, else
/// windows-1252. `valid_utf8` says whether the *whole* line is valid UTF-8 — the caller may hold
/// only a prefix of a long line, whose last character can be cut.
pub fn decode_line(bytes: &[u8], valid_utf8: bool) -> Cow<'_, str> {
    if valid_utf8 {
        match std::str::from_utf8(bytes) {
            Ok(s) => Cow::Borrowed(s),
            // A prefix cut inside a character: show the complete characters.
            Err(e) => {
                let valid = &bytes[..e.valid_up_to()];
                Cow::Borrowed(std::str::from_utf8(valid).unwrap_or_default())
            }
        }
    } else {
        WINDOWS_1252.decode_without_bom_handling(bytes).0
    }
}

/// Checks UTF-8 validity of a byte stream fed in pieces (a line too long to keep whole).
#[derive(Debug, Default)]
pub struct Utf8Check {
    /// The start of a character cut by the end of the last piece.
    carry: [u8; 4],
    carry_len: usize,
    invalid: bool,
}

impl Utf8Check {
    pub fn feed(&mut self, mut bytes: &[u8]) {
        if self.invalid {
            return;
        }
        while self.carry_len > 0 {
            let Some((&b, rest)) = bytes.split_first() else {
                return;
            };
            bytes = rest;
            self.carry[self.carry_len] = b;
            self.carry_len += 1;
            match std::str::from_utf8(&self.carry[..self.carry_len]) {
                Ok(_) => self.carry_len = 0,
                Err(e) if e.error_len().is_none() && self.carry_len < 4 => {}
                Err(_) => {
                    self.invalid = true;
                    return;
                }
            }
        }
        if let Err(e) = std::str::from_utf8(bytes) {
            if e.error_len().is_some() {
                self.invalid = true;
            } else {
                let tail = &bytes[e.valid_up_to()..];
                self.carry[..tail.len()].copy_from_slice(tail);
                self.carry_len = tail.len();
            }
        }
    }

    /// Whether everything fed so far is valid, complete UTF-8.
    pub fn is_valid(&self) -> bool {
        !self.invalid && self.carry_len == 0
    }
}

/// How a stretch of a file's text is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Utf8,
    Windows1252,
    Utf16Le,
    Utf16Be,
}

impl Stored {
    pub fn name(self) -> &'static str {
        match self {
            Stored::Utf8 => "UTF-8",
            Stored::Windows1252 => "windows-1252",
            Stored::Utf16Le => "UTF-16 LE",
            Stored::Utf16Be => "UTF-16 BE",
        }
    }
}

/// A whole file decoded: its byte-order mark, its text, and how each stretch of the text is
/// stored, so that it can be written back in kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    pub bom: &'static [u8],
    pub text: String,
    /// Consecutive stretches covering `text`, each with where it ends (a byte offset in `text`).
    pub spans: Vec<(usize, Stored)>,
}

/// Why a file's bytes cannot be turned into text, or text into the file's bytes, without loss.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodingError {
    #[error("the file is binary (it has NUL bytes)")]
    Binary,
    #[error("the file starts with a {0} byte-order mark but is not valid {0}")]
    InvalidUtf16(&'static str),
    #[error("{ch:?} (U+{code:04X}) cannot be stored in {encoding}", code = u32::from(*ch))]
    Unmappable { ch: char, encoding: &'static str },
}

/// Decodes a whole file by the module's rule.
pub fn decode(bytes: &[u8]) -> Result<Decoded, EncodingError> {
    let sniffed = sniff(bytes);
    let body = &bytes[sniffed.bom_len()..];
    let (bom, stored): (&'static [u8], Stored) = match sniffed {
        Sniff::Binary => return Err(EncodingError::Binary),
        Sniff::Utf16Le => (UTF16LE_BOM, Stored::Utf16Le),
        Sniff::Utf16Be => (UTF16BE_BOM, Stored::Utf16Be),
        Sniff::Utf8Bom => (UTF8_BOM, Stored::Utf8),
        Sniff::Plain => (b"", Stored::Utf8),
    };
    if let Some(encoding) = sniffed.utf16() {
        let text = encoding
            .decode_without_bom_handling_and_without_replacement(body)
            .ok_or(EncodingError::InvalidUtf16(stored.name()))?
            .into_owned();
        return Ok(Decoded {
            bom,
            spans: vec![(text.len(), stored)],
            text,
        });
    }
    if let Ok(text) = std::str::from_utf8(body) {
        return Ok(Decoded {
            bom,
            text: text.to_owned(),
            spans: vec![(text.len(), Stored::Utf8)],
        });
    }
    // Lines of mixed kinds. An ASCII line counts as windows-1252: it is the same bytes either
    // way, and text later put into it then stays in the file's legacy encoding instead of
    // planting UTF-8 in a windows-1252 file.
    let mut text = String::with_capacity(body.len() + body.len() / 8);
    let mut spans: Vec<(usize, Stored)> = Vec::new();
    for line in body.split_inclusive(|&b| b == b'\n') {
        let stored = match std::str::from_utf8(line) {
            Ok(s) if !s.is_ascii() => {
                text.push_str(s);
                Stored::Utf8
            }
            _ => {
                text.push_str(&WINDOWS_1252.decode_without_bom_handling(line).0);
                Stored::Windows1252
            }
        };
        match spans.last_mut() {
            Some((end, kind)) if *kind == stored => *end = text.len(),
            _ => spans.push((text.len(), stored)),
        }
    }
    Ok(Decoded { bom, text, spans })
}

impl Decoded {
    /// How the stretch `range` of `text` is stored: one encoding when every span it touches
    /// agrees, else windows-1252 (the only mixed files are UTF-8 lines among windows-1252 ones,
    /// and new text that straddles them belongs to the legacy side).
    pub fn stored_in(&self, range: Range<usize>) -> Stored {
        let mut kinds = self.pieces(range).map(|(_, kind)| kind);
        match kinds.next() {
            None => self.spans.last().map_or(Stored::Utf8, |&(_, kind)| kind),
            Some(first) if kinds.all(|k| k == first) => first,
            Some(_) => Stored::Windows1252,
        }
    }

    /// Whether some lines are stored as windows-1252 (a legacy file, or a mixed one).
    pub fn has_legacy_lines(&self) -> bool {
        self.spans
            .iter()
            .any(|&(_, kind)| kind == Stored::Windows1252)
    }

    /// The spans of `text[range]`, each with how it is stored.
    pub fn pieces(&self, range: Range<usize>) -> impl Iterator<Item = (Range<usize>, Stored)> {
        let first = self.spans.partition_point(|&(end, _)| end <= range.start);
        self.spans[first..]
            .iter()
            .scan(range.start, move |start, &(end, kind)| {
                if *start >= range.end {
                    return None;
                }
                let piece = *start..end.min(range.end);
                *start = end;
                Some((piece, kind))
            })
    }
}

/// Encodes `text` as `stored`, refusing characters the encoding cannot hold.
pub fn encode_into(out: &mut Vec<u8>, text: &str, stored: Stored) -> Result<(), EncodingError> {
    match stored {
        Stored::Utf8 => out.extend_from_slice(text.as_bytes()),
        Stored::Utf16Le => text
            .encode_utf16()
            .for_each(|u| out.extend_from_slice(&u.to_le_bytes())),
        Stored::Utf16Be => text
            .encode_utf16()
            .for_each(|u| out.extend_from_slice(&u.to_be_bytes())),
        Stored::Windows1252 => {
            let (bytes, _, unmappable) = WINDOWS_1252.encode(text);
            if unmappable {
                let ch = text
                    .chars()
                    .find(|c| WINDOWS_1252.encode(c.encode_utf8(&mut [0; 4])).2)
                    .unwrap_or(char::REPLACEMENT_CHARACTER);
                return Err(EncodingError::Unmappable {
                    ch,
                    encoding: stored.name(),
                });
            }
            out.extend_from_slice(&bytes);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// Re-encodes a decoded file span by span.
    fn encode_all(d: &Decoded) -> Vec<u8> {
        let mut out = d.bom.to_vec();
        for (range, kind) in d.pieces(0..d.text.len()) {
            encode_into(&mut out, &d.text[range], kind).unwrap();
        }
        out
    }

    #[test]
    fn windows_1252_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255u8).collect();
        let (text, _) = WINDOWS_1252.decode_without_bom_handling(&all);
        assert!(!text.contains(char::REPLACEMENT_CHARACTER));
        assert_eq!(text.chars().count(), 256);
        let mut back = Vec::new();
        encode_into(&mut back, &text, Stored::Windows1252).unwrap();
        assert_eq!(back, all);
        assert_eq!(
            decode_line(b"caf\xe9 \x80 \x81", false),
            "café € \u{81}".to_owned()
        );
    }

    #[test]
    fn sniff_finds_boms_and_binaries() {
        assert_eq!(sniff(b"\xFF\xFEa\0"), Sniff::Utf16Le);
        assert_eq!(sniff(b"\xFE\xFF\0a"), Sniff::Utf16Be);
        assert_eq!(sniff(b"\xEF\xBB\xBFa"), Sniff::Utf8Bom);
        assert_eq!(sniff(b"a\0b"), Sniff::Binary);
        assert_eq!(sniff(b"\xEF\xBB\xBFa\0"), Sniff::Binary);
        assert_eq!(sniff(b""), Sniff::Plain);
        let mut late = vec![b'a'; SNIFF_BYTES];
        late.push(0);
        assert_eq!(sniff(&late), Sniff::Plain);
    }

    #[test]
    fn decode_then_encode_gives_back_the_bytes() {
        let files: [&[u8]; 7] = [
            b"plain ascii\r\nlines\n",
            "utf-8 é\n".as_bytes(),
            b"\xEF\xBB\xBFbom\r\n",
            b"latin-1 caf\xe9\nascii\nutf-8 \xc3\xa9\n\x80\x81\x8d\x8f\x90\x9d\xff",
            b"\xFF\xFEa\0\r\0\n\0=\xd8\0\xde",
            b"\xFE\xFF\0a\0\n",
            b"",
        ];
        for bytes in files {
            let d = decode(bytes).unwrap();
            assert_eq!(encode_all(&d), bytes, "{:?}", d.text);
        }
        let d = decode(b"latin-1 caf\xe9\nascii\nutf-8 \xc3\xa9\n").unwrap();
        assert_eq!(d.text, "latin-1 café\nascii\nutf-8 é\n");
        assert_eq!(d.spans, vec![(20, Stored::Windows1252), (29, Stored::Utf8)]);
        let d = decode(b"\xFF\xFEa\0=\xd8\0\xde\r\0\n\0").unwrap();
        assert_eq!(d.text, "a😀\r\n");
    }

    #[test]
    fn invalid_utf16_and_unmappable_characters_are_errors() {
        assert_eq!(
            decode(b"\xFF\xFEa\0\0\xd8"),
            Err(EncodingError::InvalidUtf16("UTF-16 LE"))
        );
        assert_eq!(
            decode(b"\xFE\xFF\0a\0"),
            Err(EncodingError::InvalidUtf16("UTF-16 BE"))
        );
        assert_eq!(decode(b"x\0"), Err(EncodingError::Binary));
        let mut out = Vec::new();
        assert_eq!(
            encode_into(&mut out, "ok 中", Stored::Windows1252),
            Err(EncodingError::Unmappable {
                ch: '中',
                encoding: "windows-1252"
            })
        );
        assert_eq!(
            EncodingError::Unmappable {
                ch: '中',
                encoding: "windows-1252"
            }
            .to_string(),
            "'中' (U+4E2D) cannot be stored in windows-1252"
        );
    }

    #[test]
    fn utf8_check_follows_characters_across_pieces() {
        let text = "aé😀b".as_bytes();
        for cut in 0..=text.len() {
            let mut c = Utf8Check::default();
            c.feed(&text[..cut]);
            c.feed(&text[cut..]);
            assert!(c.is_valid(), "cut at {cut}");
        }
        let mut c = Utf8Check::default();
        c.feed(b"ab\xc3");
        assert!(!c.is_valid());
        c.feed(b"x");
        assert!(!c.is_valid());
        let mut c = Utf8Check::default();
        c.feed(b"\xff");
        c.feed(b"a");
        assert!(!c.is_valid());
    }

    #[test]
    fn stored_in_and_pieces_follow_the_spans() {
        let d = decode(b"caf\xe9\nna\xc3\xafve\nabc\n").unwrap();
        assert_eq!(d.text, "café\nnaïve\nabc\n");
        assert_eq!(
            d.spans,
            vec![
                (6, Stored::Windows1252),
                (13, Stored::Utf8),
                (17, Stored::Windows1252)
            ]
        );
        assert_eq!(d.stored_in(0..2), Stored::Windows1252);
        assert_eq!(d.stored_in(7..9), Stored::Utf8);
        assert_eq!(d.stored_in(7..15), Stored::Windows1252);
        assert_eq!(
            d.pieces(2..15).collect::<Vec<_>>(),
            vec![
                (2..6, Stored::Windows1252),
                (6..13, Stored::Utf8),
                (13..15, Stored::Windows1252)
            ]
        );
    }
}
