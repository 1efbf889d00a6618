//! Bounded capture of one output stream: the first and last characters, and a count of the rest.
//!
//! Owns: [`StreamCapture`], which keeps the head of a stream in a fixed buffer and its tail in a
//! bounded window, counting the characters that fall out of the middle, and turns that into valid
//! text cut with the omission marker ([`Captured`]); [`capture`], the task that reads a pipe
//! into it; and [`LiveOutput`], where a background command's streams go instead, to be read in
//! pieces while it runs.
//!
//! Invariants:
//! * Memory is bounded by the limit (4 bytes per kept character, three times: the head, and a
//!   tail window of twice the tail), however much the stream carries, newlines or not.
//! * The result is valid UTF-8 without NUL: invalid sequences and NULs become U+FFFD, exactly as
//!   [`lossy_text`] does, and are counted in bytes.
//! * When nothing fell out of the middle the result equals
//!   `truncate_middle(lossy_text(all bytes), limit)`; when something did, the head and tail are
//!   the same characters that call would keep, and the omitted count is exact for valid UTF-8.
//!
//! * A [`LiveOutput`] read is the text written since the previous read, each stream bounded as
//!   a capture is; a character split across two reads is held back whole for the later one.
//!
//! Non-goals: keeping the whole output anywhere (spilling to a file belongs to result shaping).

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use super::Captured;
use crate::floor::text::{lossy_text, omitted_marker};

/// Bytes kept per character: the longest UTF-8 sequence, so that `n` kept bytes always hold at
/// least `n / 4` whole characters.
const BYTES_PER_CHAR: usize = 4;

/// How much a capture reads at a time.
const READ_CHUNK: usize = 64 * 1024;

/// The head and tail of one stream, and what fell out between them.
#[derive(Debug)]
pub struct StreamCapture {
    limit_chars: usize,
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    /// The latest bytes after the head: at least the last `tail_cap` of them (all of them when
    /// fewer), at most `2 * tail_cap`.
    tail: Vec<u8>,
    /// Bytes that left the tail window for good.
    middle_bytes: u64,
    /// Characters among them, counted as UTF-8 lead bytes. Exact for valid UTF-8 whatever the
    /// chunk boundaries (a character is counted once, by its lead byte); for invalid input it is
    /// an approximation: stray continuation bytes count as nothing, where `lossy_text` would
    /// have made them one U+FFFD each.
    middle_chars: u64,
}

impl StreamCapture {
    /// A capture that keeps up to `limit_chars` characters (half head, half tail).
    pub fn new(limit_chars: usize) -> Self {
        let head_chars = limit_chars / 2;
        let tail_chars = limit_chars - head_chars;
        StreamCapture {
            limit_chars,
            head_cap: head_chars * BYTES_PER_CHAR,
            tail_cap: tail_chars * BYTES_PER_CHAR,
            head: Vec::new(),
            tail: Vec::new(),
            middle_bytes: 0,
            middle_chars: 0,
        }
    }

    /// Adds the next bytes of the stream.
    pub fn push(&mut self, mut data: &[u8]) {
        if self.head.len() < self.head_cap {
            let take = (self.head_cap - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        if data.is_empty() {
            return;
        }
        if data.len() >= self.tail_cap {
            // The whole window and the front of `data` fall out of the middle.
            let dropped = count_chars(&self.tail);
            self.drop_middle(self.tail.len(), dropped);
            self.tail.clear();
            let cut = data.len() - self.tail_cap;
            self.drop_middle(cut, count_chars(&data[..cut]));
            self.tail.extend_from_slice(&data[cut..]);
            return;
        }
        self.tail.extend_from_slice(data);
        // The window may grow to twice the tail before its front is dropped, so each byte is
        // moved at most once (bulk copies, no per-byte ring arithmetic).
        if self.tail.len() >= 2 * self.tail_cap {
            let excess = self.tail.len() - self.tail_cap;
            let dropped = count_chars(&self.tail[..excess]);
            self.drop_middle(excess, dropped);
            self.tail.copy_within(excess.., 0);
            self.tail.truncate(self.tail_cap);
        }
    }

    fn drop_middle(&mut self, bytes: usize, chars: u64) {
        self.middle_bytes += bytes as u64;
        self.middle_chars += chars;
    }

    /// The kept text, cut in the middle with the omission marker when the stream was longer than
    /// the limit.
    pub fn finish(self) -> Captured {
        let head_chars = self.limit_chars / 2;
        let tail_chars = self.limit_chars - head_chars;
        let mut head = self.head;
        // Only the last `tail_cap` bytes of the window are the tail; what is before them is the
        // middle.
        let extra = self.tail.len().saturating_sub(self.tail_cap);
        let middle_bytes = self.middle_bytes + extra as u64;
        let middle_chars = self.middle_chars + count_chars(&self.tail[..extra]);
        let tail = &self.tail[extra..];
        if middle_bytes == 0 {
            // Head and tail are contiguous: the whole stream is in memory.
            head.extend_from_slice(tail);
            return cut_whole(&head, head_chars, tail_chars);
        }
        // A character split between the head buffer and the bytes after it belongs to the
        // middle; so do continuation bytes at the start of the tail (their lead byte was
        // counted where it fell).
        let (head_region, split_lead) = trim_incomplete_end(&head);
        let tail_region = skip_leading_continuations(tail);
        let head_units = units(head_region);
        let tail_units = units(tail_region);
        let kept_head = head_units.len().min(head_chars);
        let kept_tail = tail_units.len().min(tail_chars);
        let head_end: usize = head_units[..kept_head]
            .iter()
            .map(|u| usize::from(u.len))
            .sum();
        let tail_start: usize = tail_units[..tail_units.len() - kept_tail]
            .iter()
            .map(|u| usize::from(u.len))
            .sum();
        let omitted = (head_units.len() - kept_head) as u64
            + u64::from(split_lead)
            + middle_chars
            + (tail_units.len() - kept_tail) as u64;
        let replaced = replaced_bytes(&head_units[..kept_head])
            + replaced_bytes(&tail_units[tail_units.len() - kept_tail..]);
        Captured {
            text: join(
                &head_region[..head_end],
                omitted,
                &tail_region[tail_start..],
            ),
            omitted_chars: omitted,
            replaced,
        }
    }
}

/// Reads `reader` to its end (or until `stop`) into `cap` — or, with `live` (a background
/// command's output and which of its streams this is), into that instead, leaving `cap` empty.
/// A read error ends the stream: what was read so far is kept.
pub async fn capture<R: AsyncRead + Unpin>(
    mut reader: R,
    mut cap: StreamCapture,
    stop: CancellationToken,
    live: Option<(&LiveOutput, OutStream)>,
) -> StreamCapture {
    // Read into spare capacity: a zeroed buffer would cost every command 64 KiB of memset and
    // the page faults behind it, although most write a few bytes or nothing.
    let mut buf = Vec::with_capacity(READ_CHUNK);
    loop {
        buf.clear();
        tokio::select! {
            // Stop first: a writer that never pauses must not keep the capture alive.
            biased;
            _ = stop.cancelled() => break,
            n = reader.read_buf(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => match live {
                    None => cap.push(&buf[..n]),
                    Some((out, which)) => out.push(which, &buf[..n]),
                },
            },
        }
    }
    if let Some((out, which)) = live {
        out.flush(which);
    }
    cap
}

/// One of a command's two output streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutStream {
    Stdout,
    Stderr,
}

/// A background command's output while it runs: each stream's text since the last
/// [`take`](Self::take), head and tail kept within the limit as a [`StreamCapture`] keeps them.
#[derive(Debug)]
pub struct LiveOutput {
    limit_chars: usize,
    streams: std::sync::Mutex<[LiveStream; 2]>,
}

#[derive(Debug)]
struct LiveStream {
    cap: StreamCapture,
    /// The start of a character whose remaining bytes have not arrived yet (at most 3 bytes).
    carry: Vec<u8>,
}

impl LiveOutput {
    /// Keeps up to `limit_chars` characters of each stream between two reads.
    pub fn new(limit_chars: usize) -> Self {
        let stream = || LiveStream {
            cap: StreamCapture::new(limit_chars),
            carry: Vec::new(),
        };
        LiveOutput {
            limit_chars,
            streams: std::sync::Mutex::new([stream(), stream()]),
        }
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, [LiveStream; 2]> {
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds the next bytes of a stream; an incomplete character at their end waits for the rest.
    pub fn push(&self, which: OutStream, data: &[u8]) {
        let mut streams = self.streams();
        let s = &mut streams[which as usize];
        let mut joined;
        let bytes = if s.carry.is_empty() {
            data
        } else {
            joined = std::mem::take(&mut s.carry);
            joined.extend_from_slice(data);
            &joined[..]
        };
        let (whole, _) = trim_incomplete_end(bytes);
        s.cap.push(whole);
        s.carry = bytes[whole.len()..].to_vec();
    }

    /// The stream ended: a held-back incomplete character is taken as it is.
    pub fn flush(&self, which: OutStream) {
        let mut streams = self.streams();
        let s = &mut streams[which as usize];
        let carry = std::mem::take(&mut s.carry);
        s.cap.push(&carry);
    }

    /// What each stream (stdout, stderr) wrote since the previous call, cut in the middle
    /// when longer than the limit.
    pub fn take(&self) -> (Captured, Captured) {
        let mut streams = self.streams();
        let [out, err] = &mut *streams;
        let cut = |s: &mut LiveStream| {
            std::mem::replace(&mut s.cap, StreamCapture::new(self.limit_chars)).finish()
        };
        (cut(out), cut(err))
    }
}

/// The whole stream, cut to `head_chars + tail_chars` characters when longer.
fn cut_whole(bytes: &[u8], head_chars: usize, tail_chars: usize) -> Captured {
    let all = units(bytes);
    if all.len() <= head_chars + tail_chars {
        return Captured {
            text: lossy_text(bytes).0,
            omitted_chars: 0,
            replaced: replaced_bytes(&all),
        };
    }
    let omitted = (all.len() - head_chars - tail_chars) as u64;
    let head_end: usize = all[..head_chars].iter().map(|u| usize::from(u.len)).sum();
    let tail_start: usize = all[..all.len() - tail_chars]
        .iter()
        .map(|u| usize::from(u.len))
        .sum();
    Captured {
        text: join(&bytes[..head_end], omitted, &bytes[tail_start..]),
        omitted_chars: omitted,
        replaced: replaced_bytes(&all[..head_chars])
            + replaced_bytes(&all[all.len() - tail_chars..]),
    }
}

fn join(head: &[u8], omitted: u64, tail: &[u8]) -> String {
    let (head, _) = lossy_text(head);
    let (tail, _) = lossy_text(tail);
    let mut text = head;
    text.push_str(&omitted_marker(omitted));
    text.push_str(&tail);
    text
}

/// One character of the lossy text and the bytes it came from.
#[derive(Clone, Copy, Debug)]
struct Unit {
    /// 1 to 4 bytes (an invalid sequence is at most 3).
    len: u8,
    /// Became U+FFFD (a NUL, or an invalid sequence).
    replaced: bool,
}

/// The characters `lossy_text` makes of `bytes`, one unit each. Decoding from any unit boundary
/// gives the same units, so a prefix or suffix cut on a boundary decodes to the same text.
fn units(bytes: &[u8]) -> Vec<Unit> {
    let mut out = Vec::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            out.push(Unit {
                len: c.len_utf8() as u8,
                replaced: c == '\0',
            });
        }
        if !chunk.invalid().is_empty() {
            out.push(Unit {
                len: chunk.invalid().len() as u8,
                replaced: true,
            });
        }
    }
    out
}

fn replaced_bytes(units: &[Unit]) -> u64 {
    units
        .iter()
        .filter(|u| u.replaced)
        .map(|u| u64::from(u.len))
        .sum()
}

/// Characters in `bytes`, counted as the bytes that are not UTF-8 continuation bytes.
///
/// Every byte of a command's output passes through here, so it looks at 32 bytes per step (and
/// stays fast enough in unoptimized test builds, where per-byte iterators are not).
fn count_chars(bytes: &[u8]) -> u64 {
    // A continuation byte is 0b10xx_xxxx: bit 7 set and bit 6 clear. Shifting left by one moves
    // each byte's bit 6 under its bit 7 (bits crossing into the next byte land on bit 0).
    const HIGH: u64 = 0x8080_8080_8080_8080;
    fn continuations(w: u64) -> u32 {
        (w & !(w << 1) & HIGH).count_ones()
    }
    let (blocks, rest) = bytes.as_chunks::<32>();
    let mut count = 0u64;
    for b in blocks {
        let [a, b, c, d] = [
            u64::from_ne_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
            u64::from_ne_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
            u64::from_ne_bytes([b[16], b[17], b[18], b[19], b[20], b[21], b[22], b[23]]),
            u64::from_ne_bytes([b[24], b[25], b[26], b[27], b[28], b[29], b[30], b[31]]),
        ];
        count +=
            u64::from(continuations(a) + continuations(b) + continuations(c) + continuations(d));
    }
    count += rest.iter().filter(|&&b| b & 0xC0 == 0x80).count() as u64;
    bytes.len() as u64 - count
}

/// `bytes` without a trailing UTF-8 sequence that is incomplete (its lead byte promises more
/// bytes than follow), and whether one was cut.
fn trim_incomplete_end(bytes: &[u8]) -> (&[u8], bool) {
    let start = bytes.len().saturating_sub(BYTES_PER_CHAR - 1);
    for i in (start..bytes.len()).rev() {
        let b = bytes[i];
        if b & 0xC0 == 0x80 {
            continue;
        }
        let want = match b {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => 1,
        };
        return if i + want > bytes.len() {
            (&bytes[..i], true)
        } else {
            (bytes, false)
        };
    }
    (bytes, false)
}

/// `bytes` without the continuation bytes (at most three) of a character that began before it.
fn skip_leading_continuations(bytes: &[u8]) -> &[u8] {
    let skip = bytes
        .iter()
        .take(BYTES_PER_CHAR - 1)
        .take_while(|&&b| b & 0xC0 == 0x80)
        .count();
    &bytes[skip..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::floor::text::truncate_middle;
    use pretty_assertions::assert_eq;

    fn captured(chunks: &[&[u8]], limit: usize) -> Captured {
        let mut cap = StreamCapture::new(limit);
        for c in chunks {
            cap.push(c);
        }
        cap.finish()
    }

    /// What the capture must equal when the whole stream is known.
    fn reference(all: &[u8], limit: usize) -> (String, u64) {
        truncate_middle(&lossy_text(all).0, limit)
    }

    #[test]
    fn live_reads_are_disjoint_and_never_split_a_character() {
        let live = LiveOutput::new(10);
        live.push(OutStream::Stdout, b"one \xC3");
        live.push(OutStream::Stderr, b"err");
        let (out, err) = live.take();
        assert_eq!((out.text.as_str(), err.text.as_str()), ("one ", "err"));
        live.push(OutStream::Stdout, b"\xA9 two");
        assert_eq!(live.take().0.text, "\u{e9} two");
        assert_eq!(live.take(), (Captured::default(), Captured::default()));
        live.push(OutStream::Stdout, "0123456789abcdef".as_bytes());
        let long = live.take().0;
        assert_eq!(long, captured(&[b"0123456789abcdef"], 10));
        assert_eq!(long.omitted_chars, 6);
        live.push(OutStream::Stdout, b"\xE2\x82");
        live.flush(OutStream::Stdout);
        assert_eq!(live.take().0.replaced, 2);
    }

    #[test]
    fn short_output_is_kept_whole() {
        let c = captured(&[b"hello ", b"world\n"], 100);
        assert_eq!(
            c,
            Captured {
                text: "hello world\n".to_owned(),
                omitted_chars: 0,
                replaced: 0
            }
        );
    }

    #[test]
    fn matches_truncate_middle_for_every_split_of_mixed_text() {
        // 1-, 2-, 3- and 4-byte characters so that buffer edges fall inside characters.
        let text = "aé€😀".repeat(40);
        let bytes = text.as_bytes();
        for limit in [2, 3, 7, 10, 31, 64] {
            let (want_text, want_omitted) = reference(bytes, limit);
            for chunk in [1, 2, 3, 5, 7, 64, bytes.len()] {
                let chunks: Vec<&[u8]> = bytes.chunks(chunk).collect();
                let c = captured(&chunks, limit);
                assert_eq!(
                    (c.text.as_str(), c.omitted_chars, c.replaced),
                    (want_text.as_str(), want_omitted, 0),
                    "limit {limit}, chunk {chunk}"
                );
            }
        }
    }

    #[test]
    fn long_ascii_keeps_exact_head_tail_and_count() {
        let mut cap = StreamCapture::new(10);
        cap.push(b"0123456789");
        for _ in 0..1000 {
            cap.push(&[b'x'; 1000]);
        }
        cap.push(b"abcdefghij");
        let c = cap.finish();
        assert_eq!(c.omitted_chars, 1_000_010);
        assert_eq!(c.text, format!("01234{}fghij", omitted_marker(1_000_010)));
    }

    #[test]
    fn count_chars_counts_lead_bytes_in_any_alignment() {
        let text = "aé€😀\u{7f}\u{80}".repeat(20);
        for start in 0..40 {
            let bytes = &text.as_bytes()[start..];
            let want = bytes.iter().filter(|&&b| b & 0xC0 != 0x80).count() as u64;
            assert_eq!(count_chars(bytes), want, "from byte {start}");
        }
        assert_eq!(count_chars(&[0xff; 17]), 17);
    }

    #[test]
    fn memory_stays_bounded() {
        let mut cap = StreamCapture::new(100);
        let chunk = vec![b'a'; 100_000];
        for _ in 0..50 {
            cap.push(&chunk);
            assert!(cap.head.len() + cap.tail.len() <= 600);
        }
    }

    #[test]
    fn invalid_bytes_and_nuls_become_replacements_counted_in_bytes() {
        let c = captured(&[b"ok\0\xff\xfe done \xe2\x82"], 100);
        assert_eq!(
            c,
            Captured {
                text: "ok\u{FFFD}\u{FFFD}\u{FFFD} done \u{FFFD}".to_owned(),
                omitted_chars: 0,
                replaced: 5
            }
        );
    }

    #[test]
    fn replacements_in_the_omitted_middle_are_not_counted() {
        let mut bytes = b"head".to_vec();
        bytes.extend_from_slice(&[0xff; 50]);
        bytes.extend_from_slice(b"tail");
        let c = captured(&[&bytes], 8);
        assert_eq!(c.text, format!("head{}tail", omitted_marker(50)));
        assert_eq!(c.replaced, 0);
    }

    #[test]
    fn a_character_split_across_the_head_edge_is_counted_once() {
        // limit 2: head keeps 1 char in 4 bytes, tail keeps 1 char in 4 bytes.
        let stream = "abc€€€€€€€z".as_bytes();
        let (want, omitted) = reference(stream, 2);
        let c = captured(&[stream], 2);
        assert_eq!((c.text, c.omitted_chars), (want, omitted));
    }
}
