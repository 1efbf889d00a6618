//! Folder versions (v5 §4b, `artifact.write` with `kind: "folder"`; v2 notes §7.4): a folder
//! upload file by file, and the checks on each file and on the version at commit.
//!
//! What it refuses, as core does: a folder `begin` with a bad name or a body (`invalid`), or an
//! `artifactId` that is not one of the session's folders (`not_found`); a `file` while another
//! is in progress, a path that is not relative and `/`-separated without `.` or `..`, a path
//! already in the folder, a `sha256` that is not 64 lowercase hex digits, a bad media type
//! (`invalid`); a file past `maxEntries`, `maxFileBytes` or the files' `maxBytes`, a chunk past
//! `chunkBytes` (`limit_exceeded`); a `chunk` with no file in progress or whose `sha256` does
//! not name it (`invalid`); a file whose bytes do not match its sha256 (`invalid`, and the
//! upload ends); a commit with a file incomplete (`invalid`). At commit, a version whose new
//! content (after dedupe) passes the Tenant's total is `refused` (`tenant_total`), and one whose
//! files are the folder's latest is `written` with `created: false, unchanged: true`. A repeat
//! of the last `file` op (its answer lost) is acknowledged. The test can fill the total between
//! begin and commit, and flip a byte of the next chunk taken (a file changed mid-send).

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::write::{Begin, LastChunk, Upload, UploadKind, media_type_ok, name_ok};
use super::{Answer, Artifact, FakeArtifacts, RunInfo, Store, Version, err, hex_sha, is_hex64};

#[derive(Debug)]
pub(super) struct InProgress {
    pub(super) path: String,
    pub(super) size: u64,
    pub(super) sha256: String,
    pub(super) data: Vec<u8>,
    pub(super) last: LastChunk,
}

impl FakeArtifacts {
    /// Other writes fill the total between the next folder upload's begin and its commit: the
    /// total becomes `bytes` just before that commit is checked.
    pub fn set_total_before_commit(&self, bytes: u64) {
        self.s.lock().unwrap().total_at_commit = Some(bytes);
    }

    /// The next folder chunk taken arrives with its first byte flipped, as if the file changed
    /// between hashing and sending.
    pub fn corrupt_next_folder_chunk(&self) {
        self.s.lock().unwrap().corrupt_folder_chunks += 1;
    }
}

fn path_ok(path: &str) -> bool {
    !path.is_empty()
        && !path.starts_with('/')
        && !path.contains('\\')
        && !path.chars().any(char::is_control)
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..")
}

impl Store {
    /// `begin` with `kind: "folder"`, its key not written yet.
    pub(super) fn begin_folder(&mut self, b: Begin, run: &RunInfo, run_id: &str) -> Answer {
        let session = self.sessions.entry(run.session.clone()).or_default();
        let Some(name) = b.name.filter(|n| name_ok(n)) else {
            return err("invalid", "A folder needs a valid name");
        };
        if b.base64.is_some() || b.size.is_some() || b.content_type.is_some() {
            return err("invalid", "A folder begin takes no body");
        }
        if let Some(id) = &b.artifact_id
            && !session.artifacts.iter().any(|a| a.id == *id && a.folder)
        {
            return err("not_found", format!("Folder {id} was not found"));
        }
        let max_bytes = self.folder_max_bytes.min(self.remaining_total());
        let id = self.new_id("up");
        self.uploads.insert(
            id.clone(),
            Upload {
                run: run_id.to_owned(),
                key: b.key,
                max_bytes,
                kind: UploadKind::Folder {
                    name,
                    artifact_id: b.artifact_id,
                    same_name: b.same_name.unwrap_or(false),
                    max_file_bytes: self.folder_file_limit,
                    max_entries: run.folder_entries,
                    files: BTreeMap::new(),
                    current: None,
                    last_file: None,
                },
            },
        );
        Some(Ok(json!({
            "status": "open", "uploadId": id, "maxBytes": max_bytes,
            "maxFileBytes": self.folder_file_limit, "maxEntries": run.folder_entries,
            "received": 0,
        })))
    }

    /// A `chunk` of a folder upload: bytes of the file in progress, checked against its sha256
    /// when complete. `upload_id` names an upload of the run.
    pub(super) fn folder_chunk(
        &mut self,
        upload_id: &str,
        offset: u64,
        sha256: Option<String>,
        bytes: Vec<u8>,
    ) -> Answer {
        let up = self.uploads.get_mut(upload_id).unwrap();
        let max_bytes = up.max_bytes;
        let UploadKind::Folder {
            current,
            files,
            max_file_bytes,
            max_entries,
            ..
        } = &mut up.kind
        else {
            return err("internal", "not a folder upload");
        };
        let Some(cur) = current.as_mut() else {
            return err("invalid", "No file is in progress");
        };
        if sha256.as_deref() != Some(cur.sha256.as_str()) {
            return err("invalid", "sha256 does not name the file in progress");
        }
        if let Err(a) = Self::take_chunk(&mut cur.data, &mut cur.last, offset, bytes, cur.size) {
            return a;
        }
        let received = cur.data.len() as u64;
        let (mfb, me) = (*max_file_bytes, *max_entries);
        if received == cur.size {
            if hex_sha(&cur.data) != cur.sha256 {
                let path = cur.path.clone();
                self.uploads.remove(upload_id);
                return err(
                    "invalid",
                    format!("The bytes of {path} do not match its sha256; the upload ended"),
                );
            }
            let done = current.take().unwrap();
            files.insert(done.path, (done.size, done.sha256, done.data));
        }
        Some(Ok(
            json!({"status": "open", "uploadId": upload_id, "maxBytes": max_bytes,
                "maxFileBytes": mfb, "maxEntries": me, "received": received}),
        ))
    }

    pub(super) fn file(&mut self, p: Value, run: &RunInfo, run_id: &str) -> Answer {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct File {
            op: String,
            run_id: String,
            upload_id: String,
            path: String,
            size: u64,
            sha256: String,
            content_type: Option<String>,
            base64: Option<String>,
        }
        let params = p.clone();
        let f: File = match serde_json::from_value(p) {
            Ok(f) => f,
            Err(e) => return err("invalid", format!("Invalid artifact.write request: {e}")),
        };
        let _ = (f.op, f.run_id);
        let Some(up) = self
            .uploads
            .get_mut(&f.upload_id)
            .filter(|u| u.run == run_id)
        else {
            return err("invalid", format!("Unknown upload {}", f.upload_id));
        };
        let max_bytes = up.max_bytes;
        let UploadKind::Folder {
            files,
            current,
            max_file_bytes,
            max_entries,
            last_file,
            ..
        } = &mut up.kind
        else {
            return err("invalid", "file is for a folder upload");
        };
        let (mfb, me) = (*max_file_bytes, *max_entries);
        let open = |received: u64| {
            Some(Ok(
                json!({"status": "open", "uploadId": f.upload_id, "maxBytes": max_bytes,
                "maxFileBytes": mfb, "maxEntries": me, "received": received}),
            ))
        };
        if last_file.as_ref() == Some(&params) {
            let received = match current {
                Some(c) if c.path == f.path => c.data.len() as u64,
                _ => f.size,
            };
            return open(received);
        }
        if let Some(c) = current {
            return err(
                "invalid",
                format!("The file in progress {} is not complete", c.path),
            );
        }
        if !path_ok(&f.path) {
            return err("invalid", format!("Invalid path {:?}", f.path));
        }
        if files.contains_key(&f.path) {
            return err("invalid", format!("{} is already in the folder", f.path));
        }
        if !is_hex64(&f.sha256) {
            return err("invalid", "sha256 must be 64 lowercase hex digits");
        }
        if let Some(t) = &f.content_type
            && !media_type_ok(t)
        {
            return err("invalid", format!("{t:?} is not a media type"));
        }
        if files.len() as u64 >= me {
            return err(
                "limit_exceeded",
                format!("A folder holds at most {me} files (maxEntries)"),
            );
        }
        if f.size > mfb {
            return err(
                "limit_exceeded",
                format!(
                    "A file of {} bytes is past maxFileBytes (limitBytes {mfb})",
                    f.size
                ),
            );
        }
        let total: u64 = files.values().map(|(n, _, _)| n).sum();
        if total + f.size > max_bytes {
            return err(
                "limit_exceeded",
                format!("The files are past maxBytes (limitBytes {max_bytes})"),
            );
        }
        *last_file = Some(params);
        match f.base64 {
            Some(body) => {
                let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(body) else {
                    return err("invalid", "The file is not base64");
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
                if bytes.len() as u64 != f.size || hex_sha(&bytes) != f.sha256 {
                    self.uploads.remove(&f.upload_id);
                    return err(
                        "invalid",
                        format!(
                            "The bytes of {} do not match its sha256; the upload ended",
                            f.path
                        ),
                    );
                }
                files.insert(f.path, (f.size, f.sha256, bytes));
                open(f.size)
            }
            None if f.size == 0 => {
                if hex_sha(b"") != f.sha256 {
                    self.uploads.remove(&f.upload_id);
                    return err(
                        "invalid",
                        "An empty file's sha256 is wrong; the upload ended",
                    );
                }
                files.insert(f.path, (0, f.sha256, Vec::new()));
                open(0)
            }
            None => {
                *current = Some(InProgress {
                    path: f.path,
                    size: f.size,
                    sha256: f.sha256,
                    data: Vec::new(),
                    last: None,
                });
                open(0)
            }
        }
    }

    pub(super) fn commit_folder(&mut self, up: Upload, run: &RunInfo) -> Answer {
        let UploadKind::Folder {
            name,
            artifact_id,
            same_name,
            files,
            current,
            ..
        } = up.kind
        else {
            return err("internal", "not a folder upload");
        };
        if let Some(c) = current {
            return err("invalid", format!("The file {} is not complete", c.path));
        }
        if let Some(total) = self.total_at_commit.take() {
            self.total_limit = Some(total);
        }
        let listing: BTreeMap<String, (u64, String)> = files
            .iter()
            .map(|(p, (n, h, _))| (p.clone(), (*n, h.clone())))
            .collect();
        let contents: Vec<(String, u64)> = listing.values().map(|(n, h)| (h.clone(), *n)).collect();
        let new = self.new_content(&contents);
        let remaining = self.remaining_total();
        let session = self.sessions.entry(run.session.clone()).or_default();
        let target = match (&artifact_id, same_name) {
            (Some(id), _) => session.artifacts.iter().position(|a| a.id == *id),
            (None, true) => session
                .artifacts
                .iter()
                .rposition(|a| a.folder && a.name == name),
            (None, false) => None,
        };
        if let Some(i) = target {
            let a = &session.artifacts[i];
            if a.versions.last().is_some_and(|v| v.files == listing) {
                let v = a.versions.len();
                let meta = a.meta(v);
                let id = a.id.clone();
                session.keys.insert(up.key, (id, v));
                return Some(Ok(
                    json!({"status": "written", "artifact": meta, "created": false, "unchanged": true}),
                ));
            }
        }
        if new > remaining {
            return Some(Ok(json!({
                "status": "refused", "reason": "tenant_total",
                "message": format!("The version adds {new} bytes; the Tenant has {remaining} left"),
                "limit": self.total_limit.unwrap_or(0),
            })));
        }
        for (h, n) in contents {
            self.stored_contents.insert(h, n);
        }
        let mut digest = Sha256::new();
        for (p, (_, h)) in &listing {
            digest.update(format!("{p}\0{h}\n"));
        }
        let version = Version {
            content_type: None,
            size: listing.values().map(|(n, _)| n).sum(),
            sha256: hex::encode(digest.finalize()),
            bytes: Vec::new(),
            files: listing,
            effect_id: None,
        };
        let new_id = self.new_id("art");
        let session = self.sessions.entry(run.session.clone()).or_default();
        let i = match target {
            Some(i) => {
                session.artifacts[i].versions.push(version);
                i
            }
            None => {
                session.artifacts.push(Artifact {
                    id: new_id,
                    folder: true,
                    name,
                    versions: vec![version],
                });
                session.artifacts.len() - 1
            }
        };
        let a = &session.artifacts[i];
        let v = a.versions.len();
        let meta = a.meta(v);
        session.keys.insert(up.key, (a.id.clone(), v));
        Some(Ok(
            json!({"status": "written", "artifact": meta, "created": true}),
        ))
    }
}
