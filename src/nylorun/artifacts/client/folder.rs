//! Folder versions: `begin {kind: "folder"}`, a `file` per file (inline when it fits a chunk),
//! `chunk`s for a larger one, then `commit` (v5 §4b "Folders").
//!
//! Invariants: a file's chunks follow core's `received`; what core answers past the file's size
//! is refused as a bad answer. Choosing the files, and what to do about a limit, is the caller's
//! (`export`).

use base64::Engine as _;

use super::super::wire::{Begin, Chunk, FileEntry, WriteAnswer, WriteParams};
use super::{ArtifactError, Artifacts, Committed, Written, status_of};

/// What a folder version names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FolderTarget {
    pub key: String,
    pub name: String,
    /// A new version of this folder of the session…
    pub artifact_id: Option<String>,
    /// …or of the newest folder named `name` (made when there is none).
    pub same_name: bool,
}

/// How a folder `begin` was answered.
pub enum FolderStart<'a> {
    /// The key was already written: nothing more is sent.
    Written(Written),
    Open(FolderUpload<'a>),
}

impl Artifacts {
    /// `begin` of a folder version.
    pub async fn begin_folder(
        &self,
        target: &FolderTarget,
    ) -> Result<FolderStart<'_>, ArtifactError> {
        let begin = self.folder_begin(target);
        match self.write("begin", WriteParams::Begin(begin)).await?.0 {
            WriteAnswer::Written(w) => Ok(FolderStart::Written(w.into())),
            WriteAnswer::Open(o) => {
                o.check()
                    .map_err(|m| ArtifactError::bad("begin", m.to_string()))?;
                let (Some(max_file_bytes), Some(max_entries)) = (o.max_file_bytes, o.max_entries)
                else {
                    self.abort(&o.upload_id).await;
                    return Err(ArtifactError::bad(
                        "begin",
                        "a folder upload opened without maxFileBytes and maxEntries",
                    ));
                };
                Ok(FolderStart::Open(FolderUpload {
                    artifacts: self,
                    target: target.clone(),
                    upload_id: o.upload_id,
                    max_bytes: o.max_bytes,
                    max_file_bytes,
                    max_entries,
                }))
            }
            other => Err(ArtifactError::bad(
                "begin",
                format!("answered {}", status_of(&other)),
            )),
        }
    }

    fn folder_begin(&self, target: &FolderTarget) -> Begin {
        Begin {
            run_id: self.run_id.clone(),
            key: target.key.clone(),
            kind: Some("folder".to_owned()),
            name: Some(target.name.clone()),
            artifact_id: target.artifact_id.clone(),
            same_name: target.same_name.then_some(true),
            ..Begin::default()
        }
    }
}

/// An open folder upload. Finish it with [`FolderUpload::commit`] or [`FolderUpload::abort`];
/// one dropped unfinished is dropped by core with the run.
pub struct FolderUpload<'a> {
    artifacts: &'a Artifacts,
    target: FolderTarget,
    upload_id: String,
    /// What the files may hold together.
    pub max_bytes: u64,
    /// The per-file limit.
    pub max_file_bytes: u64,
    /// The most files.
    pub max_entries: u64,
}

/// One file of a folder version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FolderFile {
    /// Relative, `/`-separated.
    pub path: String,
    pub size: u64,
    /// Lowercase hex SHA-256 of the bytes.
    pub sha256: String,
    pub content_type: Option<String>,
}

impl FolderUpload<'_> {
    pub fn upload_id(&self) -> &str {
        &self.upload_id
    }

    /// `file`; with `inline` (the whole file, when it fits a chunk) it is complete at once.
    /// Returns the bytes core has of it.
    pub async fn file(
        &mut self,
        file: &FolderFile,
        inline: Option<&[u8]>,
    ) -> Result<u64, ArtifactError> {
        crate::failpoint!("pod.mid_export");
        let a = self.artifacts;
        let entry = FileEntry {
            run_id: a.run_id.clone(),
            upload_id: self.upload_id.clone(),
            path: file.path.clone(),
            size: file.size,
            sha256: file.sha256.clone(),
            content_type: file.content_type.clone(),
            base64: inline.map(|b| base64::engine::general_purpose::STANDARD.encode(b)),
        };
        match a.write("file", WriteParams::File(entry)).await?.0 {
            WriteAnswer::Open(o) => Ok(o.received),
            other => Err(ArtifactError::bad(
                "file",
                format!("answered {}", status_of(&other)),
            )),
        }
    }

    /// `chunk` of the file in progress, from `offset` within it. Returns core's `received`
    /// (the next offset; a repeat of a chunk whose answer was lost is acknowledged).
    pub async fn chunk(
        &mut self,
        file: &FolderFile,
        offset: u64,
        bytes: &[u8],
    ) -> Result<u64, ArtifactError> {
        let a = self.artifacts;
        let received = a
            .chunk(Chunk {
                run_id: a.run_id.clone(),
                upload_id: self.upload_id.clone(),
                sha256: Some(file.sha256.clone()),
                offset,
                base64: base64::engine::general_purpose::STANDARD.encode(bytes),
            })
            .await?;
        if received > file.size {
            return Err(ArtifactError::bad(
                "chunk",
                format!("received {received} bytes of a {}-byte file", file.size),
            ));
        }
        Ok(received)
    }

    /// Writes the version (or learns it is unchanged, or refused).
    pub async fn commit(self) -> Result<Committed, ArtifactError> {
        let recover = WriteParams::Begin(self.artifacts.folder_begin(&self.target));
        self.artifacts.commit(&self.upload_id, recover).await
    }

    pub async fn abort(self) {
        self.artifacts.abort(&self.upload_id).await;
    }
}
