//! The store's write side (v5 §4b, `artifact.write`): uploads and file artifacts. Folder
//! versions, which are uploads too, are in [`super::folder`].
//!
//! What it refuses, as core does: params other than each `op`'s, or an unknown `op`
//! (`invalid`); a run the connection does not hold (`run_not_held`); an empty `key`, a bad name,
//! no name, both a name and an `artifactId`, a media type that is not `type/subtype`, an
//! `effectId` that is not a tool call of the run's turn, a body that is not base64
//! (`invalid`); an `artifactId` that is not one of the session's file artifacts (`not_found`);
//! a chunk past the run's `chunkBytes`, a declared `size` or bytes past the upload's `maxBytes`
//! (the file limit, or what is left of the Tenant's total), a commit past the total
//! (`limit_exceeded`, with `limitBytes` in the message); a chunk whose offset is not `received`,
//! except a repeat of the last chunk, which is acknowledged without being taken twice
//! (`invalid`); an unknown `uploadId` (`invalid`; `abort` answers `aborted` for it); a commit
//! whose bytes are not the declared `size` (`invalid`). A key already written answers
//! `written` with `created: false`.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};

use super::folder::InProgress;
use super::{
    Answer, Artifact, FakeArtifacts, RunInfo, Store, Version, content_type_of, err, hex_sha,
};

/// The last chunk taken, for acknowledging its repeat.
pub(super) type LastChunk = Option<(u64, Vec<u8>)>;

#[derive(Debug)]
pub(super) enum UploadKind {
    File {
        name: Option<String>,
        artifact_id: Option<String>,
        content_type: Option<String>,
        effect_id: Option<String>,
        size: Option<u64>,
        data: Vec<u8>,
        last: LastChunk,
    },
    Folder {
        name: String,
        artifact_id: Option<String>,
        same_name: bool,
        max_file_bytes: u64,
        max_entries: u64,
        files: BTreeMap<String, (u64, String, Vec<u8>)>,
        current: Option<InProgress>,
        /// The last `file` op's params, for acknowledging its repeat.
        last_file: Option<Value>,
    },
}

#[derive(Debug)]
pub(super) struct Upload {
    pub(super) run: String,
    pub(super) key: String,
    pub(super) max_bytes: u64,
    pub(super) kind: UploadKind,
}

/// `begin`'s params, for a file or a folder.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Begin {
    op: String,
    run_id: String,
    pub(super) key: String,
    kind: Option<String>,
    pub(super) name: Option<String>,
    pub(super) artifact_id: Option<String>,
    pub(super) same_name: Option<bool>,
    pub(super) content_type: Option<String>,
    pub(super) size: Option<u64>,
    effect_id: Option<String>,
    pub(super) base64: Option<String>,
}

impl FakeArtifacts {
    /// The per-file limit of file artifacts, and of folders' files, and folders' total.
    pub fn set_limits(&self, file: u64, folder_file: u64, folder_total: u64) {
        let mut s = self.s.lock().unwrap();
        s.file_limit = file;
        s.folder_file_limit = folder_file;
        s.folder_max_bytes = folder_total;
    }

    /// The Tenant's total, checked at commit.
    pub fn set_total(&self, bytes: Option<u64>) {
        self.s.lock().unwrap().total_limit = bytes;
    }

    /// Uploads still open.
    pub fn open_uploads(&self) -> usize {
        self.s.lock().unwrap().uploads.len()
    }

    /// Upload ids that ended with their run.
    pub fn dropped_at_run_end(&self) -> Vec<String> {
        self.s.lock().unwrap().dropped_at_run_end.clone()
    }
}

pub(super) fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control())
}

pub(super) fn media_type_ok(t: &str) -> bool {
    let mut parts = t.splitn(2, '/');
    matches!((parts.next(), parts.next()), (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() && !b.contains('/'))
}

impl Store {
    pub(super) fn write(&mut self, p: Value, run_id: &str, held: &impl Fn(&str) -> bool) -> Answer {
        let op = p.get("op").and_then(Value::as_str).unwrap_or("").to_owned();
        let run = match self.run(run_id, held) {
            Ok(r) => r,
            Err(a) => return a,
        };
        match op.as_str() {
            "begin" => self.begin(p, &run, run_id),
            "chunk" => self.chunk(p, &run, run_id),
            "file" => self.file(p, &run, run_id),
            "commit" => self.commit(p, &run, run_id),
            "abort" => {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields, rename_all = "camelCase")]
                struct Abort {
                    op: String,
                    run_id: String,
                    upload_id: String,
                }
                let a: Abort = match serde_json::from_value(p) {
                    Ok(a) => a,
                    Err(e) => {
                        return err("invalid", format!("Invalid artifact.write request: {e}"));
                    }
                };
                let _ = (a.op, a.run_id);
                if self
                    .uploads
                    .get(&a.upload_id)
                    .is_some_and(|u| u.run == run_id)
                {
                    self.uploads.remove(&a.upload_id);
                }
                Some(Ok(json!({"status": "aborted"})))
            }
            other => err(
                "invalid",
                format!("Invalid artifact.write request: unknown op {other:?}"),
            ),
        }
    }

    fn begin(&mut self, p: Value, run: &RunInfo, run_id: &str) -> Answer {
        let b: Begin = match serde_json::from_value(p) {
            Ok(b) => b,
            Err(e) => return err("invalid", format!("Invalid artifact.write request: {e}")),
        };
        let _ = (&b.op, &b.run_id);
        if b.key.is_empty() {
            return err("invalid", "Invalid artifact.write request: key is empty");
        }
        let session = self.sessions.entry(run.session.clone()).or_default();
        if let Some((id, version)) = session.keys.get(&b.key).cloned() {
            let a = session.artifacts.iter().find(|a| a.id == id).unwrap();
            return Some(Ok(
                json!({"status": "written", "artifact": a.meta(version), "created": false}),
            ));
        }
        if let Some(e) = &b.effect_id {
            let parts: Vec<&str> = e.split(':').collect();
            if parts.len() < 4 || parts[0] != run.turn || parts[2] != "tool" {
                return err(
                    "invalid",
                    format!("{e} is not a tool call of the run's turn"),
                );
            }
        }
        if let Some(t) = &b.content_type
            && !media_type_ok(t)
        {
            return err("invalid", format!("{t:?} is not a media type"));
        }
        let folder = match b.kind.as_deref() {
            None | Some("file") => false,
            Some("folder") => true,
            Some(k) => return err("invalid", format!("Unknown kind {k:?}")),
        };
        if folder {
            return self.begin_folder(b, run, run_id);
        }
        match (&b.name, &b.artifact_id) {
            (Some(n), None) if name_ok(n) => {}
            (None, Some(id)) => {
                if !session.artifacts.iter().any(|a| a.id == *id && !a.folder) {
                    return err("not_found", format!("Artifact {id} was not found"));
                }
            }
            (None, None) => return err("invalid", "No name"),
            _ => return err("invalid", "A bad name, or both name and artifactId"),
        }
        let max_bytes = self.file_limit.min(self.remaining_total());
        if let Some(size) = b.size
            && size > max_bytes
        {
            return err(
                "limit_exceeded",
                format!("An artifact of {size} bytes is past the limit (limitBytes {max_bytes})"),
            );
        }
        let mut upload = Upload {
            run: run_id.to_owned(),
            key: b.key,
            max_bytes,
            kind: UploadKind::File {
                name: b.name,
                artifact_id: b.artifact_id,
                content_type: b.content_type,
                effect_id: b.effect_id,
                size: b.size,
                data: Vec::new(),
                last: None,
            },
        };
        if let Some(body) = b.base64 {
            let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(body) else {
                return err("invalid", "The body is not base64");
            };
            if bytes.len() as u64 > run.chunk_bytes {
                return err(
                    "limit_exceeded",
                    format!(
                        "A chunk of {} bytes is past chunkBytes {}",
                        bytes.len(),
                        run.chunk_bytes
                    ),
                );
            }
            if bytes.len() as u64 > max_bytes {
                return err(
                    "limit_exceeded",
                    format!(
                        "An artifact of {} bytes is past the limit (limitBytes {max_bytes})",
                        bytes.len()
                    ),
                );
            }
            if let UploadKind::File { data, .. } = &mut upload.kind {
                *data = bytes;
            }
            return self.commit_file(upload, run);
        }
        let id = self.new_id("up");
        self.uploads.insert(id.clone(), upload);
        Some(Ok(
            json!({"status": "open", "uploadId": id, "maxBytes": max_bytes, "received": 0}),
        ))
    }

    /// Takes a chunk at `offset` into `data` (or acknowledges a repeat of the last one).
    pub(super) fn take_chunk(
        data: &mut Vec<u8>,
        last: &mut LastChunk,
        offset: u64,
        bytes: Vec<u8>,
        limit: u64,
    ) -> Result<(), Answer> {
        let received = data.len() as u64;
        if let Some((at, prev)) = last
            && *at == offset
            && *prev == bytes
            && *at + prev.len() as u64 == received
        {
            return Ok(());
        }
        if offset != received {
            return Err(err(
                "invalid",
                format!("Offset {offset} is not the {received} bytes received"),
            ));
        }
        if received + bytes.len() as u64 > limit {
            return Err(err(
                "limit_exceeded",
                format!(
                    "{} bytes is past the upload's limit (limitBytes {limit})",
                    received + bytes.len() as u64
                ),
            ));
        }
        data.extend_from_slice(&bytes);
        *last = Some((offset, bytes));
        Ok(())
    }

    fn chunk(&mut self, p: Value, run: &RunInfo, run_id: &str) -> Answer {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Chunk {
            op: String,
            run_id: String,
            upload_id: String,
            sha256: Option<String>,
            offset: u64,
            base64: String,
        }
        let c: Chunk = match serde_json::from_value(p) {
            Ok(c) => c,
            Err(e) => return err("invalid", format!("Invalid artifact.write request: {e}")),
        };
        let _ = (c.op, c.run_id);
        let Some(up) = self
            .uploads
            .get_mut(&c.upload_id)
            .filter(|u| u.run == run_id)
        else {
            return err("invalid", format!("Unknown upload {}", c.upload_id));
        };
        let Ok(mut bytes) = base64::engine::general_purpose::STANDARD.decode(c.base64) else {
            return err("invalid", "The chunk is not base64");
        };
        if matches!(up.kind, UploadKind::Folder { .. })
            && self.corrupt_folder_chunks > 0
            && !bytes.is_empty()
        {
            self.corrupt_folder_chunks -= 1;
            bytes[0] ^= 0xff;
        }
        if bytes.len() as u64 > run.chunk_bytes {
            return err(
                "limit_exceeded",
                format!(
                    "A chunk of {} bytes is past chunkBytes {}",
                    bytes.len(),
                    run.chunk_bytes
                ),
            );
        }
        let max_bytes = up.max_bytes;
        match &mut up.kind {
            UploadKind::File {
                data, last, size, ..
            } => {
                if c.sha256.is_some() {
                    return err("invalid", "sha256 is for a folder's file");
                }
                let limit = size.unwrap_or(max_bytes).min(max_bytes);
                if let Err(a) = Self::take_chunk(data, last, c.offset, bytes, limit) {
                    return a;
                }
                Some(Ok(json!({"status": "open", "uploadId": c.upload_id,
                    "maxBytes": max_bytes, "received": data.len()})))
            }
            UploadKind::Folder { .. } => self.folder_chunk(&c.upload_id, c.offset, c.sha256, bytes),
        }
    }

    fn commit(&mut self, p: Value, run: &RunInfo, run_id: &str) -> Answer {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Commit {
            op: String,
            run_id: String,
            upload_id: String,
        }
        let c: Commit = match serde_json::from_value(p) {
            Ok(c) => c,
            Err(e) => return err("invalid", format!("Invalid artifact.write request: {e}")),
        };
        let _ = (c.op, c.run_id);
        if self
            .uploads
            .get(&c.upload_id)
            .is_none_or(|u| u.run != run_id)
        {
            return err("invalid", format!("Unknown upload {}", c.upload_id));
        }
        let up = self.uploads.remove(&c.upload_id).unwrap();
        match &up.kind {
            UploadKind::File { .. } => self.commit_file(up, run),
            UploadKind::Folder { .. } => self.commit_folder(up, run),
        }
    }

    fn commit_file(&mut self, up: Upload, run: &RunInfo) -> Answer {
        let UploadKind::File {
            name,
            artifact_id,
            content_type,
            effect_id,
            size,
            data,
            ..
        } = up.kind
        else {
            return err("internal", "not a file upload");
        };
        if size.is_some_and(|s| s != data.len() as u64) {
            return err(
                "invalid",
                format!(
                    "{} bytes received of the {} declared",
                    data.len(),
                    size.unwrap_or(0)
                ),
            );
        }
        let sha = hex_sha(&data);
        let new = self.new_content(&[(sha.clone(), data.len() as u64)]);
        if new > self.remaining_total() {
            return err(
                "limit_exceeded",
                format!(
                    "The Tenant's total is full (limitBytes {})",
                    self.total_limit.unwrap_or(0)
                ),
            );
        }
        self.stored_contents.insert(sha.clone(), data.len() as u64);
        let new_id = self.new_id("art");
        let session = self.sessions.entry(run.session.clone()).or_default();
        let content_type = content_type.or_else(|| {
            let n = name.clone().or_else(|| {
                artifact_id.as_ref().and_then(|id| {
                    session
                        .artifacts
                        .iter()
                        .find(|a| a.id == *id)
                        .map(|a| a.name.clone())
                })
            });
            n.map(|n| content_type_of(&n))
        });
        let version = Version {
            content_type,
            size: data.len() as u64,
            sha256: sha,
            bytes: data,
            files: BTreeMap::new(),
            effect_id,
        };
        let (id, v) = match artifact_id {
            Some(id) => {
                let a = session.artifacts.iter_mut().find(|a| a.id == id).unwrap();
                a.versions.push(version);
                (id, a.versions.len())
            }
            None => {
                session.artifacts.push(Artifact {
                    id: new_id.clone(),
                    folder: false,
                    name: name.unwrap_or_default(),
                    versions: vec![version],
                });
                (new_id, 1)
            }
        };
        session.keys.insert(up.key, (id.clone(), v));
        let a = session.artifacts.iter().find(|a| a.id == id).unwrap();
        Some(Ok(
            json!({"status": "written", "artifact": a.meta(v), "created": true}),
        ))
    }
}
