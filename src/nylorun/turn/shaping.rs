//! Fitting a tool's result into one record entry, for every front (v5 §5b).
//!
//! Owns: the caps ([`ShapeConfig`]), the preview (the first 4 KiB and the last 1 KiB, cut on
//! character boundaries), the spill key (the effect id and the bytes' hash), the stub the model
//! reads in place of what was stored (`{truncated: true, artifactId, size, preview}`), and
//! [`shape_outcome`], which decides what to store and builds the value that fits. Where the bytes
//! go is the front's: it implements [`SpillStore`] (Nylorun: `artifact.write`).
//!
//! What is stored, for an outcome past the cap:
//! * `{kind: "completed", output: "<text>"}` (read, grep, glob, …): the text, as a text file
//!   (`<tool>-result.txt`); `output` becomes the stub.
//! * `{kind: "completed", output: {…}}` (bash's `{exitCode, stdout, stderr, …}`): the largest
//!   string fields, each as its own text file (`<tool>-result-<field>.txt`), each replaced by its
//!   stub, until the rest fits — so `exitCode` and the flags stay in view and each stream reads
//!   back as plain text. When that cannot fit, the whole output as JSON (`<tool>-result.json`).
//! * Any other output, or a value of no known shape: the whole as JSON.
//! * `{kind: "failed", code, message}`: nothing is stored; the message keeps its start and end.
//!
//! Invariants:
//! * A value at most the cap is returned as it came.
//! * The same effect id and the same bytes give the same key, so a replayed call stores nothing
//!   new (the store answers the key's earlier version).
//! * A store that refuses keeps the preview and says why (`dropped`, with `size`).
//! * What is returned is at most the cap as JSON; when nothing fits, it is a failed outcome
//!   `tool.result-too-large`.
//!
//! Non-goals: a step's shared budget across several results (the turn's), binary MCP parts.

use crate::floor::codes;
use crate::nylorun::artifacts::ArtifactError;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// The head of a preview.
pub const PREVIEW_HEAD_BYTES: usize = 4096;
/// The tail of a preview.
pub const PREVIEW_TAIL_BYTES: usize = 1024;
/// Between a preview's head and tail.
pub const PREVIEW_MARKER: &str = "\n…\n";
/// Room kept under `recordEntryBytes` for what wraps the value (`entryEnvelopeBytes`).
pub const ENTRY_ENVELOPE_BYTES: usize = 4096;
/// A preview budget under this is no preview at all.
pub const MIN_PREVIEW_BYTES: usize = 64;
/// String fields at most this long (as JSON) are never stored on their own.
pub const SMALL_FIELD_BYTES: usize = 1024;
/// The failure code of a result that cannot be made to fit.
pub const RESULT_TOO_LARGE: &str = codes::tool::RESULT_TOO_LARGE;
/// The longest key; a longer one is hashed whole.
pub const MAX_KEY_CHARS: usize = 512;
/// The most characters of a store's refusal kept in `dropped`.
const DROPPED_CHARS: usize = 300;

/// The caps one outcome is shaped to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShapeConfig {
    /// The most bytes the value may hold as JSON.
    pub cap: usize,
    pub head: usize,
    pub tail: usize,
}

impl ShapeConfig {
    /// One `effect.outcome` value under `limits.recordEntryBytes`, with the envelope's room.
    pub fn for_record_entry(record_entry_bytes: u64) -> Self {
        let record = usize::try_from(record_entry_bytes).unwrap_or(usize::MAX);
        let cap = if record > 2 * ENTRY_ENVELOPE_BYTES {
            record - ENTRY_ENVELOPE_BYTES
        } else {
            record / 2
        };
        ShapeConfig {
            cap,
            head: PREVIEW_HEAD_BYTES,
            tail: PREVIEW_TAIL_BYTES,
        }
    }
}

/// The length of `v` as compact JSON, without building the text.
pub fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    // Writing a Value to a counter cannot fail.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// The first `head` and the last `tail` bytes of `text`, cut on character boundaries, joined by
/// [`PREVIEW_MARKER`]; the whole text when it is no longer than both.
pub fn preview(text: &str, head: usize, tail: usize) -> String {
    if text.len() <= head + tail {
        return text.to_owned();
    }
    let mut h = head;
    while !text.is_char_boundary(h) {
        h -= 1;
    }
    let mut t = text.len() - tail;
    while !text.is_char_boundary(t) {
        t += 1;
    }
    let mut out = String::with_capacity(h + PREVIEW_MARKER.len() + (text.len() - t));
    out.push_str(&text[..h]);
    out.push_str(PREVIEW_MARKER);
    out.push_str(&text[t..]);
    out
}

/// The key of a store: the call's effect id, which part of its result (`whole` or a field), and
/// the bytes' SHA-256. A replay of the call gives the same bytes, hence the same key.
pub fn spill_key(effect_id: &str, part: &str, bytes: &[u8]) -> String {
    let digest = hex::encode(Sha256::digest(bytes));
    let key = format!("{effect_id}:spill:{part}:{digest}");
    if key.chars().count() <= MAX_KEY_CHARS {
        key
    } else {
        format!("spill:{}", hex::encode(Sha256::digest(key.as_bytes())))
    }
}

/// A file name made from a tool's (or field's) name: letters, digits, `-` and `_` only.
fn name_part(s: &str) -> String {
    let clean: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if clean.is_empty() {
        "tool".to_owned()
    } else {
        clean
    }
}

/// One store a front makes for a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpillRequest<'a> {
    pub key: String,
    /// `<tool>-result.txt`, `<tool>-result-<field>.txt` or `<tool>-result.json`.
    pub name: String,
    /// `text/plain` or `application/json`.
    pub content_type: &'static str,
    /// The call, for provenance.
    pub effect_id: &'a str,
    pub bytes: &'a [u8],
}

/// Why a store kept nothing; its text is what `dropped` says.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    /// The run's artifact store failed or refused the write (core's message as it gave it).
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    /// A store that keeps nothing of this kind, and says why.
    #[error("{0}")]
    Declined(&'static str),
}

/// Where a front stores what does not fit.
#[allow(async_fn_in_trait)]
pub trait SpillStore {
    /// Stores the bytes; returns the artifact id, or why nothing was stored (for `dropped`).
    async fn store(&self, req: SpillRequest<'_>) -> Result<String, SpillError>;
}

/// What one result is shaped with.
#[derive(Clone, Copy, Debug)]
pub struct ShapeContext<'a> {
    pub effect_id: &'a str,
    /// The name the model called the tool by (for file names and messages).
    pub tool: &'a str,
    pub config: ShapeConfig,
}

/// A part of the result that is stored, and how it went.
struct Piece {
    text: String,
    stored: Result<String, String>,
}

impl Piece {
    fn stub(&self, budget: usize) -> Value {
        let (head, tail) = split_budget(budget);
        let preview = if budget < MIN_PREVIEW_BYTES {
            String::new()
        } else {
            preview(&self.text, head, tail)
        };
        let mut stub = Map::new();
        stub.insert("truncated".into(), true.into());
        match &self.stored {
            Ok(id) => {
                stub.insert("artifactId".into(), id.clone().into());
            }
            Err(why) => {
                stub.insert("dropped".into(), why.clone().into());
            }
        }
        stub.insert("size".into(), self.text.len().into());
        stub.insert("preview".into(), preview.into());
        Value::Object(stub)
    }
}

/// A preview budget split 4:1 between head and tail.
fn split_budget(budget: usize) -> (usize, usize) {
    let head = budget / 5 * 4;
    (head, budget - head)
}

/// Fits one tool outcome under `ctx.config.cap`, storing what does not fit (see the module
/// docs).
pub async fn shape_outcome<S: SpillStore>(
    value: Value,
    ctx: &ShapeContext<'_>,
    store: &S,
) -> Value {
    let cap = ctx.config.cap;
    let size = json_len(&value);
    if size <= cap {
        return value;
    }
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    let shaped = match (kind, value.get("output"), value.get("message")) {
        ("completed", Some(Value::String(_)), _) => {
            let Value::Object(mut outcome) = value else {
                return too_large(ctx, size, None);
            };
            let Some(Value::String(text)) = outcome.remove("output") else {
                return too_large(ctx, size, None);
            };
            let piece = store_piece(ctx, store, "whole", text, false).await;
            fit(ctx, &[piece], |stubs| {
                let mut o = outcome.clone();
                o.insert("output".into(), stubs[0].clone());
                Value::Object(o)
            })
        }
        ("completed", Some(Value::Object(_)), _) => shape_object_output(value, ctx, store).await,
        ("completed", Some(_), _) => {
            let Value::Object(mut outcome) = value else {
                return too_large(ctx, size, None);
            };
            let output = outcome.remove("output").unwrap_or(Value::Null);
            let piece = store_piece(ctx, store, "whole", output.to_string(), true).await;
            fit(ctx, &[piece], |stubs| {
                let mut o = outcome.clone();
                o.insert("output".into(), stubs[0].clone());
                Value::Object(o)
            })
        }
        ("failed", _, Some(Value::String(_))) => cut_message(value, ctx),
        _ => {
            let piece = store_piece(ctx, store, "whole", value.to_string(), true).await;
            fit(ctx, &[piece], |stubs| stubs[0].clone())
        }
    };
    shaped.unwrap_or_else(|why| too_large(ctx, size, why))
}

/// An object output: its largest string fields stored one by one, else the whole as JSON.
async fn shape_object_output<S: SpillStore>(
    value: Value,
    ctx: &ShapeContext<'_>,
    store: &S,
) -> Result<Value, Option<String>> {
    let cap = ctx.config.cap;
    let Value::Object(mut outcome) = value else {
        return Err(None);
    };
    let Some(Value::Object(output)) = outcome.remove("output") else {
        return Err(None);
    };
    // Candidates, largest first.
    let mut fields: Vec<(String, usize)> = output
        .iter()
        .filter_map(|(k, v)| match v {
            Value::String(_) => Some((k.clone(), json_len(v))),
            _ => None,
        })
        .filter(|(_, len)| *len > SMALL_FIELD_BYTES)
        .collect();
    fields.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let with_stubs = |n: usize, budget: usize| {
        let mut out = output.clone();
        for (k, _) in &fields[..n] {
            let len = out.get(k).and_then(Value::as_str).map_or(0, str::len);
            let text = preview_placeholder(len, budget);
            out.insert(
                k.clone(),
                json!({"truncated": true, "artifactId": "x".repeat(64), "size": len, "preview": text}),
            );
        }
        let mut o = outcome.clone();
        o.insert("output".into(), Value::Object(out));
        json_len(&Value::Object(o))
    };
    let all = fields.len();
    let fields_fit = all > 0 && with_stubs(all, 0) <= cap;
    if !fields_fit {
        let whole = Value::Object(output).to_string();
        let piece = store_piece(ctx, store, "whole", whole, true).await;
        return fit(ctx, &[piece], |stubs| {
            let mut o = outcome.clone();
            o.insert("output".into(), stubs[0].clone());
            Value::Object(o)
        });
    }
    let full = ctx.config.head + ctx.config.tail;
    let n = (1..=all)
        .find(|n| with_stubs(*n, full) <= cap)
        .unwrap_or(all);
    let mut output = output;
    let mut pieces = Vec::with_capacity(n);
    let mut names = Vec::with_capacity(n);
    for (k, _) in &fields[..n] {
        if let Some(Value::String(text)) = output.remove(k) {
            pieces.push(store_piece(ctx, store, k, text, false).await);
            names.push(k.clone());
        }
    }
    fit(ctx, &pieces, |stubs| {
        let mut out = output.clone();
        for (k, stub) in names.iter().zip(stubs) {
            out.insert(k.clone(), stub.clone());
        }
        let mut o = outcome.clone();
        o.insert("output".into(), Value::Object(out));
        Value::Object(o)
    })
}

/// Text as long as a preview of a `len`-byte text with `budget` would be (for estimates).
fn preview_placeholder(len: usize, budget: usize) -> String {
    if budget < MIN_PREVIEW_BYTES {
        String::new()
    } else if len <= budget {
        "x".repeat(len)
    } else {
        "x".repeat(budget + PREVIEW_MARKER.len())
    }
}

async fn store_piece<S: SpillStore>(
    ctx: &ShapeContext<'_>,
    store: &S,
    part: &str,
    text: String,
    json: bool,
) -> Piece {
    let tool = name_part(ctx.tool);
    let (name, content_type) = match (part, json) {
        ("whole", false) => (format!("{tool}-result.txt"), "text/plain"),
        ("whole", true) => (format!("{tool}-result.json"), "application/json"),
        (field, _) => (
            format!("{tool}-result-{}.txt", name_part(field)),
            "text/plain",
        ),
    };
    let req = SpillRequest {
        key: spill_key(ctx.effect_id, part, text.as_bytes()),
        name,
        content_type,
        effect_id: ctx.effect_id,
        bytes: text.as_bytes(),
    };
    let stored = store.store(req).await.map_err(|why| {
        crate::floor::text::clip_chars(&why.to_string(), DROPPED_CHARS).into_owned()
    });
    Piece { text, stored }
}

/// Builds the value with every piece's stub, shrinking the previews until it fits the cap.
fn fit(
    ctx: &ShapeContext<'_>,
    pieces: &[Piece],
    build: impl Fn(&[Value]) -> Value,
) -> Result<Value, Option<String>> {
    let mut budget = ctx.config.head + ctx.config.tail;
    loop {
        let stubs: Vec<Value> = pieces.iter().map(|p| p.stub(budget)).collect();
        let value = build(&stubs);
        if json_len(&value) <= ctx.config.cap {
            return Ok(value);
        }
        if budget == 0 {
            return Err(pieces.iter().find_map(|p| p.stored.as_ref().err().cloned()));
        }
        budget = if budget / 2 < MIN_PREVIEW_BYTES {
            0
        } else {
            budget / 2
        };
    }
}

/// A failed outcome whose message is too long: its start and end, and how long it was.
fn cut_message(value: Value, ctx: &ShapeContext<'_>) -> Result<Value, Option<String>> {
    let Value::Object(mut outcome) = value else {
        return Err(None);
    };
    let Some(Value::String(message)) = outcome.remove("message") else {
        return Err(None);
    };
    let note = format!(
        "\n(The message was {} bytes; its middle is not shown.)",
        message.len()
    );
    let mut budget = ctx.config.head + ctx.config.tail;
    loop {
        let (head, tail) = split_budget(budget);
        let mut o = outcome.clone();
        o.insert(
            "message".into(),
            format!("{}{note}", preview(&message, head, tail)).into(),
        );
        let v = Value::Object(o);
        if json_len(&v) <= ctx.config.cap {
            return Ok(v);
        }
        if budget < MIN_PREVIEW_BYTES {
            return Err(None);
        }
        budget /= 2;
    }
}

/// `tool.result-too-large`, itself held under the cap.
fn too_large(ctx: &ShapeContext<'_>, size: usize, why: Option<String>) -> Value {
    let mut message = format!(
        "The result of {} is {size} bytes as JSON, past the {}-byte limit of one record entry, \
         and could not be made to fit",
        ctx.tool, ctx.config.cap
    );
    match why {
        Some(w) => message.push_str(&format!(" (storing it failed: {w})")),
        None => message.push('.'),
    }
    let value = json!({"kind": "failed", "code": RESULT_TOO_LARGE, "message": message});
    if json_len(&value) <= ctx.config.cap {
        value
    } else {
        json!({"kind": "failed", "code": RESULT_TOO_LARGE, "message": ""})
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::sync::Mutex;

    /// (key, name, content type, bytes) of one store.
    type Stored = (String, String, &'static str, Vec<u8>);

    /// Stores in memory, or refuses with a reason.
    #[derive(Default)]
    struct Memory {
        refuse: Option<String>,
        stored: Mutex<Vec<Stored>>,
    }

    impl SpillStore for Memory {
        async fn store(&self, req: SpillRequest<'_>) -> Result<String, SpillError> {
            if let Some(why) = &self.refuse {
                return Err(ArtifactError::LimitExceeded {
                    op: "artifact.write",
                    message: why.clone(),
                }
                .into());
            }
            let mut s = self.stored.lock().unwrap();
            s.push((req.key, req.name, req.content_type, req.bytes.to_vec()));
            Ok(format!("art_{}", s.len()))
        }
    }

    fn ctx(cap: usize) -> ShapeContext<'static> {
        ShapeContext {
            effect_id: "turn_1:0:tool:call_1",
            tool: "bash",
            config: ShapeConfig {
                cap,
                head: PREVIEW_HEAD_BYTES,
                tail: PREVIEW_TAIL_BYTES,
            },
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn previews_cut_on_character_boundaries() {
        assert_eq!(preview("short", 4, 1), "short");
        let s = "é".repeat(10); // 20 bytes
        assert_eq!(preview(&s, 5, 3), format!("éé{PREVIEW_MARKER}é"));
        let big = "a".repeat(6000);
        let p = preview(&big, PREVIEW_HEAD_BYTES, PREVIEW_TAIL_BYTES);
        assert_eq!(p.len(), 4096 + PREVIEW_MARKER.len() + 1024);
    }

    #[test]
    fn keys_name_the_call_the_part_and_the_bytes() {
        let k = spill_key("t:0:tool:c", "whole", b"abc");
        assert_eq!(
            k,
            "t:0:tool:c:spill:whole:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(k, spill_key("t:0:tool:c", "whole", b"abd"));
        assert_ne!(k, spill_key("t:0:tool:c", "stdout", b"abc"));
        let long = spill_key(&"e".repeat(600), "whole", b"abc");
        assert!(long.starts_with("spill:") && long.len() == 6 + 64, "{long}");
    }

    #[test]
    fn small_values_pass_unchanged() {
        let v = json!({"kind": "completed", "output": "hi"});
        let store = Memory::default();
        assert_eq!(block_on(shape_outcome(v.clone(), &ctx(100), &store)), v);
        assert!(store.stored.lock().unwrap().is_empty());
    }

    #[test]
    fn bash_streams_are_stored_one_by_one_and_exit_code_stays() {
        let stdout = "o".repeat(20_000);
        let stderr = "e".repeat(9_000);
        let v = json!({"kind": "completed", "output": {"exitCode": 2, "stdout": stdout, "stderr": stderr}});
        let store = Memory::default();
        let out = block_on(shape_outcome(v, &ctx(16_000), &store));
        // stdout alone is enough: 9 KB of stderr stays inline.
        assert_eq!(
            out,
            json!({"kind": "completed", "output": {
                "exitCode": 2,
                "stdout": {"truncated": true, "artifactId": "art_1", "size": 20_000,
                           "preview": preview(&stdout, 4096, 1024)},
                "stderr": stderr,
            }})
        );
        let stored = store.stored.lock().unwrap();
        assert_eq!(stored.len(), 1);
        assert_eq!(stored[0].1, "bash-result-stdout.txt");
        assert_eq!(stored[0].2, "text/plain");
        assert_eq!(stored[0].3, stdout.as_bytes());
    }

    #[test]
    fn a_refused_store_keeps_the_preview_and_says_why() {
        let text = "x".repeat(50_000);
        let v = json!({"kind": "completed", "output": text});
        let store = Memory {
            refuse: Some("limit_exceeded: past the file limit".into()),
            ..Memory::default()
        };
        let out = block_on(shape_outcome(v, &ctx(8_000), &store));
        assert_eq!(
            out,
            json!({"kind": "completed", "output": {"truncated": true,
                "dropped": "limit_exceeded: past the file limit", "size": 50_000,
                "preview": preview(&text, 4096, 1024)}})
        );
    }

    #[test]
    fn previews_shrink_to_a_small_cap_and_then_fail_clearly() {
        let text = "y".repeat(50_000);
        let v = json!({"kind": "completed", "output": text});
        let store = Memory::default();
        let out = block_on(shape_outcome(v.clone(), &ctx(1_500), &store));
        assert!(json_len(&out) <= 1_500, "{}", json_len(&out));
        assert_eq!(out["output"]["truncated"], true);
        assert_eq!(out["output"]["preview"], preview(&text, 1024, 256));
        // Tiny: an empty preview still fits.
        let out = block_on(shape_outcome(v, &ctx(120), &store));
        assert_eq!(out["output"]["preview"], "");
        assert!(json_len(&out) <= 120);
        // What is not the output cannot be stored: the failure, which fits.
        let v = json!({"kind": "completed", "output": text, "meta": "m".repeat(5_000)});
        let out = block_on(shape_outcome(v, &ctx(2_000), &store));
        assert_eq!(
            out,
            json!({"kind": "failed", "code": RESULT_TOO_LARGE, "message":
                "The result of bash is 55042 bytes as JSON, past the 2000-byte limit of one \
                 record entry, and could not be made to fit."})
        );
    }

    #[test]
    fn long_failure_messages_keep_start_and_end() {
        let message = format!("{}{}", "s".repeat(10_000), "e".repeat(10_000));
        let v = json!({"kind": "failed", "code": "sandbox.error", "message": message});
        let out = block_on(shape_outcome(v, &ctx(8_000), &Memory::default()));
        assert_eq!(
            out,
            json!({"kind": "failed", "code": "sandbox.error", "message": format!(
                "{}{PREVIEW_MARKER}{}\n(The message was 20000 bytes; its middle is not shown.)",
                "s".repeat(4096), "e".repeat(1024))})
        );
    }

    #[test]
    fn record_limits_leave_the_envelope() {
        assert_eq!(ShapeConfig::for_record_entry(960 * 1024).cap, 956 * 1024);
        assert_eq!(ShapeConfig::for_record_entry(4000).cap, 2000);
    }
}
