//! An MCP or HTTP tool's answer, made into the outcome the model reads and core records
//! (v5 §5b).
//!
//! Owns: the step budget ([`StepBudget`]: 256 KiB held under `recordEntryBytes` less the 4 KiB
//! envelope, at most 32 KiB inline per result, 512-byte stubs once spent); the outcome of each
//! gate answer ([`outcome`]); storing binary parts (`image`, `audio`, blob `resource`) as
//! artifacts, always, and naming images in `files` so the media rule
//! ([`crate::agent::media`]) decides whether the model sees them; and fitting text parts
//! (and `structuredContent`) into the result's cap by storing the largest first, each replaced
//! by `{truncated: true, artifactId, size, preview}` (the first 4 KiB and the last 1 KiB).
//!
//! What the model reads for `{ok: true, result}` of an MCP call: one text part alone is the
//! output as a string; anything else is `{content: [...], structuredContent?}` with binary parts
//! as `{type, artifactId, version, contentType, size}`. `isError: true` is a failure
//! (`mcp.tool_error`, its text as the message). `{ok: false, error}` is a failure with the
//! gate's code (`mcp.too-large`, `http.too-large`, …). An HTTP call's result is the output as it
//! came.
//!
//! Invariants:
//! * Every store is keyed by the effect id, the part (`part<i>`, `structured`, `whole`) and the
//!   bytes' SHA-256, with `effectId` for provenance: a call the gate answers again with the same
//!   bytes (a replay after a crash, a rejoin) writes nothing new.
//! * A result of at most 1 KiB is never shaped. What is returned fits its cap, or is the
//!   failure `tool.result-too-large`; nothing here fails the turn.
//! * Pure given the store's answers: the same bytes and the same budget give the same outcome.
//!
//! Non-goals: sandbox results ([`crate::nylorun::turn::spill`]).

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::floor::codes;
use crate::nylorun::artifacts::{ArtifactError, Artifacts, FileTarget};
use crate::nylorun::turn::shaping::{
    ENTRY_ENVELOPE_BYTES, MIN_PREVIEW_BYTES, PREVIEW_HEAD_BYTES, PREVIEW_TAIL_BYTES, ShapeConfig,
    ShapeContext, SpillError, SpillRequest, SpillStore, json_len, preview, shape_outcome,
    spill_key,
};

/// One step's results share this much of their record entry (`stepBudgetBytes`).
pub const STEP_BUDGET_BYTES: usize = 256 * 1024;
/// The most one MCP or HTTP result keeps inline (`resultInlineBytes`).
pub const RESULT_INLINE_BYTES: usize = 32 * 1024;
/// A result once the step's budget is spent: a stub naming its artifact.
pub const STUB_BYTES: usize = 512;
/// A result this small is never shaped.
pub const NEVER_SHAPED_BYTES: usize = 1024;

/// One step's budget for its MCP and HTTP results.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepBudget {
    total: usize,
    spent: usize,
}

impl StepBudget {
    /// 256 KiB, held under `recordEntryBytes` less the envelope.
    pub fn new(record_entry_bytes: u64) -> Self {
        let record = usize::try_from(record_entry_bytes).unwrap_or(usize::MAX);
        StepBudget {
            total: STEP_BUDGET_BYTES.min(record.saturating_sub(ENTRY_ENVELOPE_BYTES)),
            spent: 0,
        }
    }

    /// The cap of the next result: 32 KiB or what is left, at least a stub; and never more than
    /// `room`, its share of the record entry.
    pub fn cap(&self, room: usize) -> usize {
        let left = self.total.saturating_sub(self.spent);
        RESULT_INLINE_BYTES.min(left).max(STUB_BYTES).min(room)
    }

    pub fn spend(&mut self, value: &Value) {
        self.spent = self.spent.saturating_add(json_len(value));
    }
}

/// Where a store went: the artifact and its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub artifact_id: String,
    pub version: u64,
}

/// Stores a part of a result.
#[allow(async_fn_in_trait)]
pub trait PartStore {
    /// Stores the bytes; the artifact and version, or why nothing was stored.
    async fn store(&self, req: SpillRequest<'_>) -> Result<Stored, ArtifactError>;
}

/// The run's artifacts, written with `artifact.write`.
pub struct ArtifactParts<'a>(pub &'a Artifacts);

impl PartStore for ArtifactParts<'_> {
    async fn store(&self, req: SpillRequest<'_>) -> Result<Stored, ArtifactError> {
        let target = FileTarget {
            key: req.key,
            name: Some(req.name),
            artifact_id: None,
            content_type: Some(req.content_type.to_owned()),
            effect_id: Some(req.effect_id.to_owned()),
        };
        match self.0.write_file(&target, req.bytes).await {
            Ok(w) => {
                tracing::info!(
                    effect_id = %req.effect_id,
                    artifact_id = %w.artifact.artifact_id,
                    size = req.bytes.len(),
                    created = w.created,
                    "a tool result's part was stored"
                );
                Ok(Stored {
                    artifact_id: w.artifact.artifact_id,
                    version: w.artifact.version,
                })
            }
            Err(e) => {
                tracing::warn!(effect_id = %req.effect_id, size = req.bytes.len(), error = %e, "a tool result's part could not be stored");
                Err(e)
            }
        }
    }
}

/// The shaping's store interface on a part store (for HTTP results, shaped whole).
struct AsSpill<'a, S>(&'a S);

impl<S: PartStore> SpillStore for AsSpill<'_, S> {
    async fn store(&self, req: SpillRequest<'_>) -> Result<String, SpillError> {
        Ok(self.0.store(req).await?.artifact_id)
    }
}

/// What one result is made with.
#[derive(Clone, Copy, Debug)]
pub struct ResultContext<'a> {
    pub effect_id: &'a str,
    /// The model's name of the tool (file names).
    pub tool: &'a str,
    /// `server/tool` or `http/tool` (messages).
    pub label: &'a str,
    /// The most bytes the outcome may hold as JSON.
    pub cap: usize,
}

/// A gate answer, as [`outcome`] takes it.
pub enum Answer<'a> {
    /// An MCP call's `{ok: true, result}`: the server's `CallToolResult`.
    Mcp(&'a Value),
    /// An HTTP call's `{ok: true, result}`.
    Http(&'a Value),
    /// `{ok: false, error}`; `mcp` says which family the default code is of.
    Failed {
        code: &'a str,
        message: &'a str,
        mcp: bool,
    },
}

/// The outcome value to record for a gate answer, fitted to `ctx.cap`.
pub async fn outcome<S: PartStore>(
    answer: Answer<'_>,
    ctx: &ResultContext<'_>,
    store: &S,
) -> Value {
    match answer {
        Answer::Failed { code, message, mcp } => {
            let code = if code.is_empty() {
                if mcp {
                    codes::gate::MCP_ERROR
                } else {
                    codes::gate::HTTP_ERROR
                }
            } else {
                code
            };
            let message = if message.is_empty() {
                format!("The Tool Gate answered {code} for {}.", ctx.label)
            } else {
                message.to_owned()
            };
            fit_failure(
                json!({"kind": "failed", "code": code, "message": message}),
                ctx,
            )
            .await
        }
        Answer::Http(result) => {
            let value = json!({"kind": "completed", "output": result});
            if json_len(&value) <= ctx.cap.max(NEVER_SHAPED_BYTES) {
                return value;
            }
            let shape = ShapeContext {
                effect_id: ctx.effect_id,
                tool: ctx.tool,
                config: ShapeConfig {
                    cap: ctx.cap,
                    head: PREVIEW_HEAD_BYTES,
                    tail: PREVIEW_TAIL_BYTES,
                },
            };
            shape_outcome(value, &shape, &AsSpill(store)).await
        }
        Answer::Mcp(result) => mcp_outcome(result, ctx, store).await,
    }
}

/// A failure, its message cut to the cap.
async fn fit_failure(value: Value, ctx: &ResultContext<'_>) -> Value {
    if json_len(&value) <= ctx.cap.max(NEVER_SHAPED_BYTES) {
        return value;
    }
    struct Nothing;
    impl SpillStore for Nothing {
        async fn store(&self, _: SpillRequest<'_>) -> Result<String, SpillError> {
            Err(SpillError::Declined("failures are not stored"))
        }
    }
    let shape = ShapeContext {
        effect_id: ctx.effect_id,
        tool: ctx.tool,
        config: ShapeConfig {
            cap: ctx.cap,
            head: PREVIEW_HEAD_BYTES,
            tail: PREVIEW_TAIL_BYTES,
        },
    };
    shape_outcome(value, &shape, &Nothing).await
}

/// One part of an MCP result, as the model will read it.
enum Part {
    /// A text part, or a text resource (`extra` keeps its `uri` and `mimeType`).
    Text {
        kind: &'static str,
        text: String,
        extra: Map<String, Value>,
        stub: Option<Piece>,
    },
    /// Anything else, as it will be shown (a stored binary part, a resource link, …).
    Shown(Value),
}

/// A stored piece: its artifact (or why not), its size, and its text for previews.
struct Piece {
    stored: Result<Stored, ArtifactError>,
    text: String,
}

impl Piece {
    /// `{truncated, artifactId | dropped, size, preview}` with `budget` bytes of preview.
    fn stub(&self, budget: usize) -> Map<String, Value> {
        let mut stub = Map::new();
        stub.insert("truncated".into(), true.into());
        match &self.stored {
            Ok(s) => stub.insert("artifactId".into(), s.artifact_id.clone().into()),
            Err(why) => stub.insert("dropped".into(), why.to_string().into()),
        };
        stub.insert("size".into(), self.text.len().into());
        let shown = if budget < MIN_PREVIEW_BYTES {
            String::new()
        } else {
            let head = budget / 5 * 4;
            preview(&self.text, head, budget - head)
        };
        stub.insert("preview".into(), shown.into());
        stub
    }
}

async fn mcp_outcome<S: PartStore>(result: &Value, ctx: &ResultContext<'_>, store: &S) -> Value {
    let content: Vec<Value> = result
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        return mcp_error(&content, ctx).await;
    }
    let mut files = Vec::new();
    let mut parts = Vec::with_capacity(content.len());
    for (i, p) in content.iter().enumerate() {
        parts.push(read_part(i, p, ctx, store, &mut files).await);
    }
    let structured = result
        .get("structuredContent")
        .filter(|v| !v.is_null())
        .cloned();
    let mut shaped = Shaped {
        parts,
        structured: structured.map(|v| (v, None)),
        files,
    };
    let value = shaped.build(PREVIEW_HEAD_BYTES + PREVIEW_TAIL_BYTES);
    if json_len(&value) <= ctx.cap.max(NEVER_SHAPED_BYTES) {
        return value;
    }
    // Store the largest pieces first, until the outcome fits with full previews.
    let mut order: Vec<(usize, usize)> = shaped
        .parts
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            Part::Text { text, .. } if text.len() > NEVER_SHAPED_BYTES => Some((i, text.len())),
            _ => None,
        })
        .collect();
    if let Some((v, _)) = &shaped.structured
        && json_len(v) > NEVER_SHAPED_BYTES
    {
        order.push((usize::MAX, json_len(v)));
    }
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let full = PREVIEW_HEAD_BYTES + PREVIEW_TAIL_BYTES;
    for (i, _) in order {
        shaped.store_piece(i, ctx, store).await;
        if json_len(&shaped.build(full)) <= ctx.cap {
            return shaped.build(full);
        }
    }
    let mut budget = full / 2;
    while budget >= MIN_PREVIEW_BYTES {
        let v = shaped.build(budget);
        if json_len(&v) <= ctx.cap {
            return v;
        }
        budget /= 2;
    }
    let bare = shaped.build(0);
    if json_len(&bare) <= ctx.cap {
        return bare;
    }
    // Too many parts for the cap: the whole output, stored as one JSON piece.
    whole_piece(&shaped, ctx, store).await
}

/// The failed outcome of a call the MCP server answered `isError`: its text parts, joined.
async fn mcp_error(content: &[Value], ctx: &ResultContext<'_>) -> Value {
    let text: Vec<String> = content
        .iter()
        .map(|p| match p.get("text").and_then(Value::as_str) {
            Some(t) => t.to_owned(),
            None => format!(
                "[{} part]",
                p.get("type").and_then(Value::as_str).unwrap_or("a")
            ),
        })
        .collect();
    let message = if text.is_empty() {
        format!("{} failed and said nothing more.", ctx.label)
    } else {
        text.join("\n")
    };
    let value = json!({"kind": "failed", "code": codes::gate::MCP_TOOL_ERROR, "message": message});
    fit_failure(value, ctx).await
}

/// The outcome when its parts cannot fit even bare: the whole output stored as one JSON piece,
/// else a failure saying how large it was.
async fn whole_piece<S: PartStore>(shaped: &Shaped, ctx: &ResultContext<'_>, store: &S) -> Value {
    let full = PREVIEW_HEAD_BYTES + PREVIEW_TAIL_BYTES;
    let output = shaped.output(full);
    let text = output.to_string();
    let piece = Piece {
        stored: store
            .store(request(
                ctx,
                "whole",
                &format!("{}-result.json", name_part(ctx.tool)),
                "application/json",
                text.as_bytes(),
            ))
            .await,
        text,
    };
    let mut budget = full;
    loop {
        let mut value = json!({"kind": "completed", "output": Value::Object(piece.stub(budget))});
        if !shaped.files.is_empty() {
            value["files"] = Value::Array(shaped.files.clone());
        }
        if json_len(&value) <= ctx.cap {
            return value;
        }
        if budget == 0 {
            break;
        }
        budget = if budget / 2 < MIN_PREVIEW_BYTES {
            0
        } else {
            budget / 2
        };
    }
    let mut message = format!(
        "The result of {} is {} bytes as JSON, past the {}-byte limit of one record entry, and \
         could not be made to fit",
        ctx.label,
        json_len(&shaped.build(full)),
        ctx.cap
    );
    match &piece.stored {
        Err(why) => message.push_str(&format!(" (storing it failed: {why})")),
        Ok(_) => message.push('.'),
    }
    let value =
        json!({"kind": "failed", "code": codes::tool::RESULT_TOO_LARGE, "message": message});
    if json_len(&value) <= ctx.cap {
        value
    } else {
        json!({"kind": "failed", "code": codes::tool::RESULT_TOO_LARGE, "message": ""})
    }
}

/// The parts of a result as they are being fitted.
struct Shaped {
    parts: Vec<Part>,
    /// `structuredContent`, and its stored piece once stored.
    structured: Option<(Value, Option<Piece>)>,
    files: Vec<Value>,
}

impl Shaped {
    /// The output with every stored piece as its stub, previews of `budget` bytes.
    fn output(&self, budget: usize) -> Value {
        let lone_text = self.structured.is_none()
            && matches!(self.parts.as_slice(), [Part::Text { kind: "text", extra, .. }] if extra.is_empty());
        if lone_text && let [Part::Text { text, stub, .. }] = self.parts.as_slice() {
            return match stub {
                Some(p) => Value::Object(p.stub(budget)),
                None => Value::String(text.clone()),
            };
        }
        let content: Vec<Value> = self
            .parts
            .iter()
            .map(|p| match p {
                Part::Shown(v) => v.clone(),
                Part::Text {
                    kind,
                    text,
                    extra,
                    stub,
                } => {
                    let mut o = Map::new();
                    o.insert("type".into(), (*kind).into());
                    o.extend(extra.clone());
                    match stub {
                        Some(piece) => o.extend(piece.stub(budget)),
                        None => {
                            o.insert("text".into(), text.clone().into());
                        }
                    }
                    Value::Object(o)
                }
            })
            .collect();
        let mut out = json!({"content": content});
        if let Some((v, piece)) = &self.structured {
            out["structuredContent"] = match piece {
                Some(p) => Value::Object(p.stub(budget)),
                None => v.clone(),
            };
        }
        out
    }

    fn build(&self, budget: usize) -> Value {
        let mut value = json!({"kind": "completed", "output": self.output(budget)});
        if !self.files.is_empty() {
            value["files"] = Value::Array(self.files.clone());
        }
        value
    }

    /// Stores part `i` (`usize::MAX`: `structuredContent`).
    async fn store_piece<S: PartStore>(&mut self, i: usize, ctx: &ResultContext<'_>, store: &S) {
        let tool = name_part(ctx.tool);
        if i == usize::MAX {
            if let Some((v, piece @ None)) = &mut self.structured {
                let text = v.to_string();
                let stored = store
                    .store(request(
                        ctx,
                        "structured",
                        &format!("{tool}-structured.json"),
                        "application/json",
                        text.as_bytes(),
                    ))
                    .await;
                *piece = Some(Piece { stored, text });
            }
            return;
        }
        if let Some(Part::Text {
            text,
            stub: stub @ None,
            ..
        }) = self.parts.get_mut(i)
        {
            let stored = store
                .store(request(
                    ctx,
                    &format!("part{i}"),
                    &format!("{tool}-part{i}.txt"),
                    "text/plain",
                    text.as_bytes(),
                ))
                .await;
            *stub = Some(Piece {
                stored,
                text: text.clone(),
            });
        }
    }
}

fn request<'a>(
    ctx: &ResultContext<'a>,
    part: &str,
    name: &str,
    content_type: &'static str,
    bytes: &'a [u8],
) -> SpillRequest<'a> {
    SpillRequest {
        key: spill_key(ctx.effect_id, part, bytes),
        name: name.to_owned(),
        content_type,
        effect_id: ctx.effect_id,
        bytes,
    }
}

/// Reads part `i`: text as text; a binary part stored (and an image named in `files`); anything
/// else as it came.
async fn read_part<S: PartStore>(
    i: usize,
    p: &Value,
    ctx: &ResultContext<'_>,
    store: &S,
    files: &mut Vec<Value>,
) -> Part {
    let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "text" => Part::Text {
            kind: "text",
            text: p
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            extra: Map::new(),
            stub: None,
        },
        "image" | "audio" => {
            let mime = p
                .get("mimeType")
                .and_then(Value::as_str)
                .unwrap_or("application/octet-stream");
            let data = p.get("data").and_then(Value::as_str).unwrap_or("");
            Part::Shown(store_binary(i, kind, mime, data, None, ctx, store, files).await)
        }
        "resource" => {
            let r = p.get("resource").unwrap_or(&Value::Null);
            let uri = r.get("uri").and_then(Value::as_str).map(str::to_owned);
            let mime = r.get("mimeType").and_then(Value::as_str);
            if let Some(text) = r.get("text").and_then(Value::as_str) {
                let mut extra = Map::new();
                if let Some(u) = &uri {
                    extra.insert("uri".into(), u.clone().into());
                }
                if let Some(m) = mime {
                    extra.insert("mimeType".into(), m.into());
                }
                return Part::Text {
                    kind: "resource",
                    text: text.to_owned(),
                    extra,
                    stub: None,
                };
            }
            if let Some(blob) = r.get("blob").and_then(Value::as_str) {
                let mime = mime.unwrap_or("application/octet-stream");
                return Part::Shown(
                    store_binary(i, "resource", mime, blob, uri, ctx, store, files).await,
                );
            }
            Part::Shown(p.clone())
        }
        _ => Part::Shown(p.clone()),
    }
}

/// Stores one base64 part; what the model reads in its place.
#[allow(clippy::too_many_arguments)]
async fn store_binary<S: PartStore>(
    i: usize,
    kind: &str,
    mime: &str,
    data: &str,
    uri: Option<String>,
    ctx: &ResultContext<'_>,
    store: &S,
    files: &mut Vec<Value>,
) -> Value {
    let mut shown = Map::new();
    shown.insert("type".into(), kind.into());
    if let Some(u) = uri {
        shown.insert("uri".into(), u.into());
    }
    shown.insert("contentType".into(), mime.into());
    let bytes = match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
        Ok(b) => b,
        Err(e) => {
            shown.insert(
                "dropped".into(),
                format!("its data is not base64: {e}").into(),
            );
            return Value::Object(shown);
        }
    };
    shown.insert("size".into(), bytes.len().into());
    let name = format!("{}-part{i}.{}", name_part(ctx.tool), extension(mime));
    match store
        .store(request(
            ctx,
            &format!("part{i}"),
            &name,
            static_type(mime),
            &bytes,
        ))
        .await
    {
        Ok(s) => {
            shown.insert("artifactId".into(), s.artifact_id.clone().into());
            shown.insert("version".into(), s.version.into());
            if mime.starts_with("image/") {
                files.push(json!({
                    "mediaType": mime,
                    "reference": {"artifactId": s.artifact_id, "version": s.version, "name": name},
                }));
            }
        }
        Err(why) => {
            shown.insert("dropped".into(), why.to_string().into());
        }
    }
    Value::Object(shown)
}

/// The content types a part is stored as (the store takes a static string).
fn static_type(mime: &str) -> &'static str {
    match mime {
        "image/png" => "image/png",
        "image/jpeg" => "image/jpeg",
        "image/gif" => "image/gif",
        "image/webp" => "image/webp",
        "image/svg+xml" => "image/svg+xml",
        "audio/wav" | "audio/x-wav" => "audio/wav",
        "audio/mpeg" => "audio/mpeg",
        "audio/ogg" => "audio/ogg",
        "application/pdf" => "application/pdf",
        "application/gzip" => "application/gzip",
        "application/json" => "application/json",
        "text/plain" => "text/plain",
        _ => "application/octet-stream",
    }
}

fn extension(mime: &str) -> &'static str {
    match static_type(mime) {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/svg+xml" => "svg",
        "audio/wav" => "wav",
        "audio/mpeg" => "mp3",
        "audio/ogg" => "ogg",
        "application/pdf" => "pdf",
        "application/gzip" => "gz",
        "application/json" => "json",
        "text/plain" => "txt",
        _ => "bin",
    }
}

/// A file name part: letters, digits, `-` and `_` only, at most 64 characters.
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

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use std::sync::Mutex;

    /// (key, name, content type, bytes) of one store.
    type Stored = (String, String, &'static str, Vec<u8>);

    #[derive(Default)]
    struct Memory {
        refuse: bool,
        stored: Mutex<Vec<Stored>>,
    }

    impl PartStore for Memory {
        async fn store(&self, req: SpillRequest<'_>) -> Result<super::Stored, ArtifactError> {
            if self.refuse {
                return Err(ArtifactError::LimitExceeded {
                    op: "artifact.write",
                    message: "limit_exceeded: no room".into(),
                });
            }
            let mut s = self.stored.lock().unwrap();
            s.push((req.key, req.name, req.content_type, req.bytes.to_vec()));
            Ok(super::Stored {
                artifact_id: format!("art_{}", s.len()),
                version: 1,
            })
        }
    }

    fn ctx(cap: usize) -> ResultContext<'static> {
        ResultContext {
            effect_id: "t:0:tool:s0.c1",
            tool: "srv__echo",
            label: "srv/echo",
            cap,
        }
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn the_step_budget_caps_each_result_then_stubs() {
        let mut b = StepBudget::new(960 * 1024);
        assert_eq!(b.cap(usize::MAX), RESULT_INLINE_BYTES);
        assert_eq!(b.cap(10_000), 10_000);
        b.spend(&json!("x".repeat(STEP_BUDGET_BYTES - 1000)));
        assert_eq!(b.cap(usize::MAX), 1000 - 2);
        b.spend(&json!("x".repeat(2000)));
        assert_eq!(b.cap(usize::MAX), STUB_BYTES);
        // A small record entry holds the budget under it.
        assert_eq!(StepBudget::new(20 * 1024).cap(usize::MAX), 16 * 1024);
    }

    #[test]
    fn one_text_part_is_the_output_and_small_results_pass() {
        let store = Memory::default();
        let r = json!({"content": [{"type": "text", "text": "Echo: hi"}]});
        assert_eq!(
            run(outcome(Answer::Mcp(&r), &ctx(100), &store)),
            json!({"kind": "completed", "output": "Echo: hi"})
        );
        let r = json!({"content": [{"type": "text", "text": "42"}], "structuredContent": {"result": 42}, "isError": false});
        assert_eq!(
            run(outcome(Answer::Mcp(&r), &ctx(100), &store)),
            json!({"kind": "completed", "output": {"content": [{"type": "text", "text": "42"}],
                                                    "structuredContent": {"result": 42}}})
        );
        assert!(store.stored.lock().unwrap().is_empty());
    }

    #[test]
    fn a_large_text_is_stored_by_part_and_the_model_gets_a_preview() {
        let store = Memory::default();
        let text = "abcdefghij".repeat(10_000);
        let r = json!({"content": [{"type": "text", "text": text}]});
        let out = run(outcome(Answer::Mcp(&r), &ctx(RESULT_INLINE_BYTES), &store));
        assert_eq!(
            out,
            json!({"kind": "completed", "output": {"truncated": true, "artifactId": "art_1",
                   "size": 100_000, "preview": preview(&text, 4096, 1024)}})
        );
        let stored = store.stored.lock().unwrap();
        assert_eq!(
            stored[0].0,
            spill_key("t:0:tool:s0.c1", "part0", text.as_bytes())
        );
        assert_eq!(stored[0].1, "srv__echo-part0.txt");
        assert_eq!(stored[0].3, text.as_bytes());
        drop(stored);
        // Once the budget is spent: a stub within 512 bytes.
        let out = run(outcome(Answer::Mcp(&r), &ctx(STUB_BYTES), &store));
        assert!(json_len(&out) <= STUB_BYTES, "{out}");
        assert_eq!(out["output"]["artifactId"], "art_2");
    }

    #[test]
    fn images_are_stored_and_named_as_files() {
        let store = Memory::default();
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG fake");
        let r = json!({"content": [
            {"type": "text", "text": "Here:"},
            {"type": "image", "data": png, "mimeType": "image/png"},
            {"type": "resource_link", "uri": "test://x", "name": "x"},
        ]});
        let out = run(outcome(Answer::Mcp(&r), &ctx(RESULT_INLINE_BYTES), &store));
        assert_eq!(
            out,
            json!({"kind": "completed",
                   "output": {"content": [
                       {"type": "text", "text": "Here:"},
                       {"type": "image", "contentType": "image/png", "size": 9, "artifactId": "art_1", "version": 1},
                       {"type": "resource_link", "uri": "test://x", "name": "x"}]},
                   "files": [{"mediaType": "image/png", "reference":
                       {"artifactId": "art_1", "version": 1, "name": "srv__echo-part1.png"}}]})
        );
        let refused = Memory {
            refuse: true,
            ..Memory::default()
        };
        let out = run(outcome(
            Answer::Mcp(&r),
            &ctx(RESULT_INLINE_BYTES),
            &refused,
        ));
        assert_eq!(
            out["output"]["content"][1],
            json!({"type": "image", "contentType": "image/png", "size": 9, "dropped": "limit_exceeded: no room"})
        );
        assert!(out.get("files").is_none());
    }

    #[test]
    fn errors_and_failures_are_failed_outcomes() {
        let store = Memory::default();
        let r = json!({"content": [{"type": "text", "text": "Error executing tool fail"}], "isError": true});
        assert_eq!(
            run(outcome(Answer::Mcp(&r), &ctx(RESULT_INLINE_BYTES), &store)),
            json!({"kind": "failed", "code": "mcp.tool_error", "message": "Error executing tool fail"})
        );
        assert_eq!(
            run(outcome(
                Answer::Failed {
                    code: "mcp.too-large",
                    message: "",
                    mcp: true
                },
                &ctx(RESULT_INLINE_BYTES),
                &store
            )),
            json!({"kind": "failed", "code": "mcp.too-large",
                   "message": "The Tool Gate answered mcp.too-large for srv/echo."})
        );
        let long = "e".repeat(50_000);
        let r = json!({"content": [{"type": "text", "text": long}], "isError": true});
        let out = run(outcome(Answer::Mcp(&r), &ctx(8_000), &store));
        assert!(json_len(&out) <= 8_000);
        assert!(
            out["message"]
                .as_str()
                .unwrap()
                .ends_with("(The message was 50000 bytes; its middle is not shown.)")
        );
        assert!(store.stored.lock().unwrap().is_empty());
    }

    #[test]
    fn many_parts_fall_back_to_the_whole_or_fail_clearly() {
        let store = Memory::default();
        let parts: Vec<Value> = (0..40)
            .map(|i| json!({"type": "text", "text": format!("{i}").repeat(2000)}))
            .collect();
        let r = json!({"content": parts});
        let out = run(outcome(Answer::Mcp(&r), &ctx(1500), &store));
        assert!(json_len(&out) <= 1500, "{}", json_len(&out));
        assert_eq!(out["output"]["truncated"], true);
        let last = store.stored.lock().unwrap().last().unwrap().1.clone();
        assert_eq!(last, "srv__echo-result.json");
        let refused = Memory {
            refuse: true,
            ..Memory::default()
        };
        let out = run(outcome(Answer::Mcp(&r), &ctx(600), &refused));
        assert_eq!(out["output"]["dropped"], "limit_exceeded: no room");
        assert!(json_len(&out) <= 600);
        // Not even a bare stub fits: a failure, itself within the cap.
        assert_eq!(
            run(outcome(Answer::Mcp(&r), &ctx(90), &refused)),
            json!({"kind": "failed", "code": "tool.result-too-large", "message": ""})
        );
    }
}
