//! The run's artifacts over the Harness API: `artifact.read`, `artifact.write` and
//! `definition.file` (v5 §3, §4b).
//!
//! Owns: [`Artifacts`], one run's handle on its session's artifacts (the channel, the run id and
//! the turn's limits); chunked reads with the version pinned after the first chunk; file uploads
//! (one `begin` with the whole body when it fits a chunk, else `begin`/`chunk`…/`commit`); folder
//! uploads ([`FolderUpload`]: `file` and `chunk` ops, then `commit`); the skill files' bytes; and
//! the model's `read_artifact` tool ([`read_for_model`], in `model`).
//!
//! Invariants:
//! * Nothing sent or asked for passes `limits.chunkBytes`, nor the 64 MiB frame once base64 and
//!   JSON are added ([`Artifacts::chunk_bytes`]).
//! * A request whose answer is lost (no answer within the request timeout, or `unavailable`) is
//!   sent again as it was, a bounded number of times: core acknowledges a repeated chunk without
//!   taking it twice, and the next offset is always the `received` core answers. A commit whose
//!   answer was lost is reconciled by its key (a `begin` with a written key answers `written`).
//! * An upload podhost opened and cannot finish is aborted before the error is returned.
//! * `run_not_held` and `ownership_lost` are reported to the run's [`RunLoss`] (when given), which
//!   stops and releases the run: it is no longer podhost's.
//! * `not_found`, `limit_exceeded` and `invalid` from core become [`ArtifactError`] variants with
//!   core's own message; a commit past a total is [`Committed::Refused`] (or
//!   [`ArtifactError::Refused`] for a file).
//!
//! Non-goals: what to store (spilling is `spill`, the outputs folder `export`, skills `skills`);
//! claiming events.

use std::time::Duration;

use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde_json::Value;

mod folder;
mod model;

use super::wire::{
    ARTIFACT_READ, ARTIFACT_WRITE, ArtifactMeta, Begin, Chunk, DEFINITION_FILE,
    DefinitionFileAnswer, DefinitionFileParams, OpenAnswer, ReadAnswer, ReadParams, RefusedAnswer,
    UploadRef, WriteAnswer, WriteParams, WrittenAnswer,
};
pub use folder::{FolderFile, FolderStart, FolderTarget, FolderUpload};
pub use model::{READ_ARTIFACT_MAX_BYTES, read_artifact_definition, read_for_model};

use crate::nylorun::link::channel::{CallError, Channel, parse_answer};
use crate::nylorun::link::lease::RunLoss;
use crate::nylorun::link::protocol::{ErrorCode, MAX_PAYLOAD, TurnLimits};

/// How long one artifact request may wait for its answer before it counts as lost.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How many times a request whose answer was lost is sent in all.
pub const ATTEMPTS: u32 = 3;
/// Room left in a frame for the JSON around a chunk's base64.
const FRAME_ROOM: usize = 64 * 1024;

/// Why an artifact request did not do what was asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    /// Core's `not_found`: the artifact is not there for this run.
    #[error("{message}")]
    NotFound { message: String },
    /// Core's `limit_exceeded` (its message names the limit and its value).
    #[error("{message}")]
    LimitExceeded { op: &'static str, message: String },
    /// Core's `invalid`.
    #[error("core refused {op}: {message}")]
    Invalid { op: &'static str, message: String },
    /// A commit past the Tenant's or the Agent's total: nothing was stored.
    #[error("the store refused the write ({}): {}", .0.reason, .0.message)]
    Refused(Refusal),
    /// No answer after every attempt.
    #[error("core did not answer {op} after {attempts} attempts of {waited:?} each")]
    NoAnswer {
        op: &'static str,
        attempts: u32,
        waited: Duration,
    },
    /// An answer that does not fit the request (wrong offset, more bytes than asked, bad base64).
    #[error("core's answer to {op} does not add up: {message}")]
    BadAnswer { op: &'static str, message: String },
    /// Any other failure of the request (the connection is gone, the run is not held, …).
    #[error(transparent)]
    Call(CallError),
}

impl ArtifactError {
    fn from_call(op: &'static str, e: CallError) -> Self {
        match e {
            CallError::Remote {
                code: ErrorCode::NotFound,
                message,
                ..
            } => ArtifactError::NotFound { message },
            CallError::Remote {
                code: ErrorCode::LimitExceeded,
                message,
                ..
            } => ArtifactError::LimitExceeded { op, message },
            CallError::Remote {
                code: ErrorCode::Invalid,
                message,
                ..
            } => ArtifactError::Invalid { op, message },
            CallError::BadAnswer { message, .. } => ArtifactError::BadAnswer { op, message },
            other => ArtifactError::Call(other),
        }
    }

    fn bad(op: &'static str, message: impl Into<String>) -> Self {
        ArtifactError::BadAnswer {
            op,
            message: message.into(),
        }
    }
}

/// `{reason, message, limit}` of a refused commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `tenant_total` or `environment_total`.
    pub reason: String,
    pub message: String,
    pub limit: Option<u64>,
}

impl From<RefusedAnswer> for Refusal {
    fn from(r: RefusedAnswer) -> Self {
        Refusal {
            reason: r.reason,
            message: r.message,
            limit: r.limit,
        }
    }
}

/// A stored version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub artifact: ArtifactMeta,
    /// False when the key was already written (nothing new) or the folder was unchanged.
    pub created: bool,
    /// A folder version equal to the latest: nothing was added.
    pub unchanged: bool,
}

impl From<WrittenAnswer> for Written {
    fn from(w: WrittenAnswer) -> Self {
        Written {
            artifact: w.artifact,
            created: w.created,
            unchanged: w.unchanged.unwrap_or(false),
        }
    }
}

/// How a folder upload's commit ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Committed {
    Written(Written),
    Refused(Refusal),
}

/// One chunk read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadChunk {
    /// The version read: pass its `version` for the next chunks.
    pub meta: ArtifactMeta,
    pub offset: u64,
    pub bytes: Vec<u8>,
    pub eof: bool,
}

/// What a file write names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileTarget {
    /// The idempotency key.
    pub key: String,
    /// A new artifact with this name…
    pub name: Option<String>,
    /// …or a new version of this one.
    pub artifact_id: Option<String>,
    pub content_type: Option<String>,
    /// The tool effect the bytes come from.
    pub effect_id: Option<String>,
}

/// One run's handle on its session's artifacts. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Artifacts {
    channel: Channel,
    run_id: String,
    limits: TurnLimits,
    request_timeout: Duration,
    /// Told when core says the run is no longer held.
    loss: Option<RunLoss>,
}

impl Artifacts {
    pub fn new(channel: Channel, run_id: String, limits: TurnLimits) -> Self {
        Artifacts {
            channel,
            run_id,
            limits,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            loss: None,
        }
    }

    /// Reports `run_not_held` and `ownership_lost` answers to the run's lease, which stops the
    /// run and releases it.
    pub fn with_loss(mut self, loss: RunLoss) -> Self {
        self.loss = Some(loss);
        self
    }

    /// How long a request waits for its answer before it is sent again.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn limits(&self) -> &TurnLimits {
        &self.limits
    }

    /// The most bytes one chunk carries or one read asks for: `limits.chunkBytes`, held under
    /// the frame limit once base64'd, and at least 1.
    pub fn chunk_bytes(&self) -> usize {
        let frame_cap = (MAX_PAYLOAD - FRAME_ROOM) / 4 * 3;
        usize::try_from(self.limits.chunk_bytes)
            .unwrap_or(usize::MAX)
            .clamp(1, frame_cap)
    }

    /// Sends `params` as `method`, again as they were when the answer is lost (no answer in
    /// time, or `unavailable`), at most [`ATTEMPTS`] times. Returns the answer and whether an
    /// earlier attempt's answer was lost.
    async fn send<R: DeserializeOwned + serde::Serialize>(
        &self,
        method: &'static str,
        op: &'static str,
        params: Value,
    ) -> Result<(R, bool), ArtifactError> {
        let mut lost = false;
        for attempt in 1..=ATTEMPTS {
            let last = attempt == ATTEMPTS;
            let mut call = self
                .channel
                .call(method, params.clone())
                .await
                .map_err(|e| ArtifactError::from_call(op, e))?;
            match tokio::time::timeout(self.request_timeout, call.response()).await {
                Ok(Ok(v)) => {
                    let r = parse_answer(method, v).map_err(|e| ArtifactError::from_call(op, e))?;
                    return Ok((r, lost));
                }
                Ok(Err(CallError::Remote {
                    code: ErrorCode::Unavailable,
                    message,
                    ..
                })) if !last => {
                    tracing::warn!(run_id = %self.run_id, %method, op, %message, attempt, "core is unavailable; sending again");
                }
                Ok(Err(e)) => {
                    if let Some(loss) = &self.loss {
                        loss.check(method, &e);
                    }
                    return Err(ArtifactError::from_call(op, e));
                }
                Err(_) => {
                    call.abort().await;
                    tracing::warn!(run_id = %self.run_id, %method, op, attempt, timeout = ?self.request_timeout, "no answer in time; sending again");
                    if last {
                        return Err(ArtifactError::NoAnswer {
                            op,
                            attempts: ATTEMPTS,
                            waited: self.request_timeout,
                        });
                    }
                }
            }
            lost = true;
        }
        Err(ArtifactError::NoAnswer {
            op,
            attempts: ATTEMPTS,
            waited: self.request_timeout,
        })
    }

    async fn write(
        &self,
        op: &'static str,
        params: WriteParams,
    ) -> Result<(WriteAnswer, bool), ArtifactError> {
        let params = serde_json::to_value(&params)
            .map_err(|e| ArtifactError::bad(op, format!("could not encode the params: {e}")))?;
        self.send(ARTIFACT_WRITE, op, params).await
    }

    // ---- reading ----

    /// One `artifact.read`: at most `length` bytes (held to the chunk size; `Some(0)` for the
    /// metadata alone) from `offset` of `version` (the latest when `None`).
    pub async fn read_chunk(
        &self,
        artifact_id: &str,
        version: Option<u64>,
        offset: u64,
        length: Option<u64>,
    ) -> Result<ReadChunk, ArtifactError> {
        const OP: &str = "read";
        let chunk = self.chunk_bytes() as u64;
        let length = length.unwrap_or(chunk).min(chunk);
        let params = ReadParams {
            run_id: self.run_id.clone(),
            artifact_id: artifact_id.to_owned(),
            version,
            offset: (offset > 0).then_some(offset),
            length: Some(length),
        };
        let params = serde_json::to_value(&params)
            .map_err(|e| ArtifactError::bad(OP, format!("could not encode the params: {e}")))?;
        let (answer, _): (ReadAnswer, _) = self.send(ARTIFACT_READ, OP, params).await?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(answer.base64.as_bytes())
            .map_err(|e| ArtifactError::bad(OP, format!("base64: {e}")))?;
        if answer.offset != offset {
            return Err(ArtifactError::bad(
                OP,
                format!("asked from byte {offset}, answered from {}", answer.offset),
            ));
        }
        if bytes.len() as u64 > length {
            return Err(ArtifactError::bad(
                OP,
                format!("asked for {length} bytes, got {}", bytes.len()),
            ));
        }
        if version.is_some_and(|v| v != answer.artifact.version) {
            return Err(ArtifactError::bad(
                OP,
                format!(
                    "asked for version {}, got {}",
                    version.unwrap_or_default(),
                    answer.artifact.version
                ),
            ));
        }
        Ok(ReadChunk {
            meta: answer.artifact,
            offset,
            bytes,
            eof: answer.eof,
        })
    }

    /// The metadata of `version` (the latest when `None`).
    pub async fn metadata(
        &self,
        artifact_id: &str,
        version: Option<u64>,
    ) -> Result<ArtifactMeta, ArtifactError> {
        Ok(self
            .read_chunk(artifact_id, version, 0, Some(0))
            .await?
            .meta)
    }

    /// A whole file artifact, chunk by chunk, every chunk of the version the first one named.
    /// Refuses one larger than `max_bytes`.
    pub async fn read_to_end(
        &self,
        artifact_id: &str,
        version: Option<u64>,
        max_bytes: u64,
    ) -> Result<(ArtifactMeta, Vec<u8>), ArtifactError> {
        const OP: &str = "read";
        let first = self.read_chunk(artifact_id, version, 0, None).await?;
        if first.meta.size > max_bytes {
            return Err(ArtifactError::LimitExceeded {
                op: OP,
                message: format!(
                    "artifact {artifact_id} is {} bytes, past the {max_bytes}-byte limit of this read",
                    first.meta.size
                ),
            });
        }
        let meta = first.meta;
        let mut bytes = first.bytes;
        let mut eof = first.eof;
        while !eof {
            let next = self
                .read_chunk(artifact_id, Some(meta.version), bytes.len() as u64, None)
                .await?;
            if next.bytes.is_empty() && !next.eof {
                return Err(ArtifactError::bad(OP, "an empty chunk that is not the end"));
            }
            if (bytes.len() + next.bytes.len()) as u64 > meta.size {
                return Err(ArtifactError::bad(
                    OP,
                    format!("more bytes than the {} the artifact holds", meta.size),
                ));
            }
            bytes.extend_from_slice(&next.bytes);
            eof = next.eof;
        }
        Ok((meta, bytes))
    }

    // ---- writing a file ----

    /// Writes `bytes` as a file artifact: one `begin` carrying them when they fit a chunk, else
    /// an upload in chunks. A key already written answers that version (`created: false`).
    pub async fn write_file(
        &self,
        target: &FileTarget,
        bytes: &[u8],
    ) -> Result<Written, ArtifactError> {
        let inline = bytes.len() <= self.chunk_bytes();
        let mut begin = self.file_begin(target, bytes.len() as u64);
        if inline {
            begin.base64 = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        }
        let (answer, _) = self.write("begin", WriteParams::Begin(begin)).await?;
        let open = match answer {
            WriteAnswer::Written(w) => return Ok(w.into()),
            WriteAnswer::Refused(r) => return Err(ArtifactError::Refused(r.into())),
            WriteAnswer::Open(o) if !inline => {
                o.check()
                    .map_err(|m| ArtifactError::bad("begin", m.to_string()))?;
                o
            }
            WriteAnswer::Open(o) => {
                self.abort(&o.upload_id).await;
                return Err(ArtifactError::bad(
                    "begin",
                    "a begin with the whole body answered open",
                ));
            }
            WriteAnswer::Aborted {} => return Err(ArtifactError::bad("begin", "answered aborted")),
        };
        match self.upload_file(&open, bytes).await {
            Ok(()) => {}
            Err(e) => {
                self.abort(&open.upload_id).await;
                return Err(e);
            }
        }
        let recover = WriteParams::Begin(self.file_begin(target, bytes.len() as u64));
        match self.commit(&open.upload_id, recover).await? {
            Committed::Written(w) => Ok(w),
            Committed::Refused(r) => Err(ArtifactError::Refused(r)),
        }
    }

    fn file_begin(&self, target: &FileTarget, size: u64) -> Begin {
        Begin {
            run_id: self.run_id.clone(),
            key: target.key.clone(),
            name: target.name.clone(),
            artifact_id: target.artifact_id.clone(),
            content_type: target.content_type.clone(),
            size: Some(size),
            effect_id: target.effect_id.clone(),
            ..Begin::default()
        }
    }

    /// Sends `bytes` in chunks from what the upload has received, following `received`.
    async fn upload_file(&self, open: &OpenAnswer, bytes: &[u8]) -> Result<(), ArtifactError> {
        let size = bytes.len() as u64;
        if size > open.max_bytes {
            return Err(ArtifactError::LimitExceeded {
                op: "chunk",
                message: format!(
                    "the body is {size} bytes, past the {}-byte limit of the upload (limitBytes {})",
                    open.max_bytes, open.max_bytes
                ),
            });
        }
        let mut offset = open.received;
        let mut stalls = 0;
        while offset < size {
            crate::failpoint!("pod.mid_upload");
            let end = (offset as usize + self.chunk_bytes()).min(bytes.len());
            let chunk = Chunk {
                run_id: self.run_id.clone(),
                upload_id: open.upload_id.clone(),
                sha256: None,
                offset,
                base64: base64::engine::general_purpose::STANDARD
                    .encode(&bytes[offset as usize..end]),
            };
            let received = self.chunk(chunk).await?;
            offset = self.advance("chunk", offset, received, size, &mut stalls)?;
        }
        Ok(())
    }

    /// One `chunk`; returns what core has received.
    async fn chunk(&self, chunk: Chunk) -> Result<u64, ArtifactError> {
        match self.write("chunk", WriteParams::Chunk(chunk)).await?.0 {
            WriteAnswer::Open(o) => Ok(o.received),
            other => Err(ArtifactError::bad(
                "chunk",
                format!("answered {}", status_of(&other)),
            )),
        }
    }

    /// The next offset: core's `received`, which must lie within the body and move forward
    /// within a few answers.
    fn advance(
        &self,
        op: &'static str,
        offset: u64,
        received: u64,
        size: u64,
        stalls: &mut u32,
    ) -> Result<u64, ArtifactError> {
        if received > size {
            return Err(ArtifactError::bad(
                op,
                format!("received {received} bytes of {size}"),
            ));
        }
        if received <= offset {
            *stalls += 1;
            if *stalls >= ATTEMPTS {
                return Err(ArtifactError::bad(
                    op,
                    format!("received stays at {received} bytes of {size}"),
                ));
            }
        } else {
            *stalls = 0;
        }
        Ok(received)
    }

    /// `commit`. When an earlier attempt's answer was lost and the upload is gone, the commit
    /// landed: `recover` (a `begin` with the same key) answers the version it wrote.
    async fn commit(
        &self,
        upload_id: &str,
        recover: WriteParams,
    ) -> Result<Committed, ArtifactError> {
        let params = WriteParams::Commit(self.upload_ref(upload_id));
        let answer = match self.write("commit", params).await {
            Ok((answer, _)) => answer,
            Err(ArtifactError::Invalid { message, .. }) => {
                // Either a lost answer of a commit that landed, or a real refusal: the key
                // tells them apart.
                match self.write("begin", recover).await {
                    Ok((WriteAnswer::Written(w), _)) => {
                        tracing::info!(run_id = %self.run_id, "a commit whose answer was lost had landed");
                        return Ok(Committed::Written(w.into()));
                    }
                    Ok((WriteAnswer::Open(o), _)) => self.abort(&o.upload_id).await,
                    _ => {}
                }
                return Err(ArtifactError::Invalid {
                    op: "commit",
                    message,
                });
            }
            Err(e) => {
                self.abort(upload_id).await;
                return Err(e);
            }
        };
        match answer {
            WriteAnswer::Written(w) => Ok(Committed::Written(w.into())),
            WriteAnswer::Refused(r) => Ok(Committed::Refused(r.into())),
            other => Err(ArtifactError::bad(
                "commit",
                format!("answered {}", status_of(&other)),
            )),
        }
    }

    /// Ends an upload; best effort (core drops it with the run anyway).
    pub async fn abort(&self, upload_id: &str) {
        let params = WriteParams::Abort(self.upload_ref(upload_id));
        if let Err(e) = self.write("abort", params).await {
            tracing::warn!(run_id = %self.run_id, %upload_id, error = %e, "could not abort an upload");
        }
    }

    fn upload_ref(&self, upload_id: &str) -> UploadRef {
        UploadRef {
            run_id: self.run_id.clone(),
            upload_id: upload_id.to_owned(),
        }
    }

    // ---- definition files ----

    /// One range of a file the run's definition names (`sha256:<hex>`). Returns the bytes and
    /// core's `eof`, when it says one.
    pub async fn definition_chunk(
        &self,
        sha256: &str,
        offset: u64,
        length: u64,
    ) -> Result<(Vec<u8>, Option<bool>), ArtifactError> {
        const OP: &str = "definition.file";
        let length = length.min(self.chunk_bytes() as u64);
        let params = DefinitionFileParams {
            run_id: self.run_id.clone(),
            sha256: sha256.to_owned(),
            offset: (offset > 0).then_some(offset),
            length: Some(length),
        };
        let params = serde_json::to_value(&params)
            .map_err(|e| ArtifactError::bad(OP, format!("could not encode the params: {e}")))?;
        let (answer, _): (DefinitionFileAnswer, _) = self.send(DEFINITION_FILE, OP, params).await?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(answer.base64.as_bytes())
            .map_err(|e| ArtifactError::bad(OP, format!("base64: {e}")))?;
        if bytes.len() as u64 > length {
            return Err(ArtifactError::bad(
                OP,
                format!("asked for {length} bytes, got {}", bytes.len()),
            ));
        }
        Ok((bytes, answer.eof))
    }
}

pub(super) fn status_of(a: &WriteAnswer) -> &'static str {
    match a {
        WriteAnswer::Open(_) => "open",
        WriteAnswer::Written(_) => "written",
        WriteAnswer::Refused(_) => "refused",
        WriteAnswer::Aborted {} => "aborted",
    }
}

/// A media type from a file name's extension, for what podhost writes.
pub fn content_type_of(name: &str) -> &'static str {
    let ext = name
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "json" => "application/json",
        "csv" => "text/csv",
        "html" | "htm" => "text/html",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "pdf" => "application/pdf",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "svg" => "image/svg+xml",
        "zip" => "application/zip",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The turn runs in a `Send` future (`RunHandler`): every entry point must be one.
    #[allow(dead_code)]
    fn entry_points_are_send(
        a: &Artifacts,
        t: &crate::tools::Toolbox,
        v: &Value,
        p: &std::path::Path,
    ) {
        fn send<T: Send>(_: T) {}
        send(a.write_file(&FileTarget::default(), b""));
        send(a.read_to_end("a", None, 1));
        send(read_for_model(a, v));
        send(crate::nylorun::artifacts::export::export_outputs(
            a, t, p, "t",
        ));
        send(crate::nylorun::artifacts::skills::mount_skills(a, t, v, p));
    }

    #[test]
    fn content_types_follow_the_extension() {
        assert_eq!(content_type_of("bash-result.txt"), "text/plain");
        assert_eq!(content_type_of("x.JSON"), "application/json");
        assert_eq!(content_type_of("noext"), "application/octet-stream");
    }

    #[test]
    fn limit_errors_keep_cores_message() {
        let e = ArtifactError::from_call(
            "chunk",
            CallError::Remote {
                method: "artifact.write".into(),
                code: ErrorCode::LimitExceeded,
                message: "chunk of 2048 bytes is past chunkBytes 1024".into(),
            },
        );
        assert_eq!(e.to_string(), "chunk of 2048 bytes is past chunkBytes 1024");
        let closed = ArtifactError::from_call(
            "read",
            CallError::Closed {
                reason: "gone".into(),
            },
        );
        assert_eq!(
            closed.to_string(),
            "the Harness API connection closed: gone"
        );
    }
}
