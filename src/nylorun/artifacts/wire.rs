//! The wire types of `artifact.read`, `artifact.write` and `definition.file` (v5 §3, §4b).
//!
//! Invariants: what podhost sends is strict (unknown fields refused, optional fields omitted,
//! never `null`), as v5 §11 says of every v5 message. What core answers is read leniently:
//! unknown fields are ignored (and logged once, by `parse_answer`) — v5 is frozen, so this is
//! defence, not conformance: a core that adds a field must not stop every artifact operation.
//! The fields podhost uses are typed and required, and checked where a wrong value would
//! mislead (`OpenAnswer::check`). `definition.file`'s answer: v5 gives its params but not its
//! answer (v2 answered `{base64}`), so [`DefinitionFileAnswer`] reads `base64` and `eof`.
//!
//! Assumption: v5 names the `sha256` fields of `artifact.write` and of an artifact's metadata
//! without their format. podhost sends lowercase hex; the manifest's skill
//! files and `definition.file` use the `sha256:<hex>` form v5 and v2 show.

use serde::{Deserialize, Serialize};

/// Method names.
pub const ARTIFACT_READ: &str = "artifact.read";
pub const ARTIFACT_WRITE: &str = "artifact.write";
pub const DEFINITION_FILE: &str = "definition.file";

/// `artifact.read` params.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReadParams {
    pub run_id: String,
    pub artifact_id: String,
    /// The version to read; the latest when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u64>,
    /// The first byte (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// At most this many bytes (default and ceiling `limits.chunkBytes`); 0 asks for the
    /// metadata alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
}

/// `artifact.read` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadAnswer {
    /// The version read.
    pub artifact: ArtifactMeta,
    /// Where `base64` starts.
    pub offset: u64,
    /// The bytes from `offset`.
    pub base64: String,
    /// No bytes are left past this chunk.
    pub eof: bool,
}

/// `ArtifactMetaSchema`: one version of an artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactMeta {
    pub artifact_id: String,
    /// `file` or `folder`.
    pub kind: String,
    pub name: String,
    pub version: u64,
    /// The media type. Accepted missing or `null` (a folder may have none).
    #[serde(default)]
    pub content_type: Option<String>,
    /// Bytes (a folder: its files' bytes together).
    pub size: u64,
    /// The content digest. Accepted missing or `null` (a folder may have none).
    #[serde(default)]
    pub sha256: Option<String>,
    /// A Tenant-wide artifact a message of the session named.
    pub tenant_wide: bool,
}

impl ArtifactMeta {
    pub fn is_folder(&self) -> bool {
        self.kind == "folder"
    }
}

/// `artifact.write` params, one per `op`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum WriteParams {
    Begin(Begin),
    Chunk(Chunk),
    File(FileEntry),
    Commit(UploadRef),
    Abort(UploadRef),
}

/// `begin`: a new artifact (`name`), a new version (`artifactId`), or a folder version.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Begin {
    pub run_id: String,
    /// Makes the write idempotent within the session.
    pub key: String,
    /// `folder` for a folder version; absent for a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A new artifact's name (a folder's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A new version of this artifact of the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<String>,
    /// Folders: a new version of the session's newest folder named `name`, made when none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub same_name: Option<bool>,
    /// The media type (default: from the name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The whole body's size, checked against the limits before any byte is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The tool effect of the run's turn this write comes from (provenance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect_id: Option<String>,
    /// The whole body, written and committed at once (it fits one chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

/// `chunk`: the next bytes of a file upload, or of a folder's file in progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Chunk {
    pub run_id: String,
    pub upload_id: String,
    /// Folders: the digest of the file in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Must be what the upload (or the file) has `received`.
    pub offset: u64,
    pub base64: String,
}

/// `file`: one file of a folder version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileEntry {
    pub run_id: String,
    pub upload_id: String,
    /// Relative, `/`-separated, no `.` or `..`.
    pub path: String,
    pub size: u64,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The whole file, when it fits one chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base64: Option<String>,
}

/// `commit` and `abort` params.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UploadRef {
    pub run_id: String,
    pub upload_id: String,
}

/// Every `artifact.write` answer, by `status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum WriteAnswer {
    Open(OpenAnswer),
    Written(WrittenAnswer),
    Refused(RefusedAnswer),
    Aborted {},
}

/// `{status: "open", uploadId, maxBytes, received, maxFileBytes?, maxEntries?}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OpenAnswer {
    pub upload_id: String,
    /// What the upload may hold (files: the file limit or what is left of a total).
    pub max_bytes: u64,
    /// Bytes received: of the upload, or of the folder's file in progress.
    pub received: u64,
    /// Folders: the per-file limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_file_bytes: Option<u64>,
    /// Folders: the most files (`limits.folderEntries`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<u64>,
}

/// An open upload core answered without an id to send its chunks under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("an open upload with an empty uploadId")]
pub struct NoUploadId;

impl OpenAnswer {
    /// An upload needs an id to send its chunks under.
    pub fn check(&self) -> Result<(), NoUploadId> {
        if self.upload_id.is_empty() {
            return Err(NoUploadId);
        }
        Ok(())
    }
}

/// `{status: "written", artifact, created, unchanged?}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WrittenAnswer {
    pub artifact: ArtifactMeta,
    /// False when the key was already written, or the folder version was unchanged.
    pub created: bool,
    /// A folder version equal to the folder's latest: that version, nothing added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchanged: Option<bool>,
}

/// `{status: "refused", reason, message, limit}`: a commit past the Tenant's or the Agent's
/// total; nothing is stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusedAnswer {
    /// `tenant_total` or `environment_total`.
    pub reason: String,
    pub message: String,
    /// The limit in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// `definition.file` params.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DefinitionFileParams {
    pub run_id: String,
    /// `sha256:<hex>`, as the manifest names the file.
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// At most `limits.chunkBytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
}

/// `definition.file` answer, read leniently (see the module docs): `base64`, and `eof` when
/// core says it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DefinitionFileAnswer {
    pub base64: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eof: Option<bool>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;
    use serde_json::json;

    #[test]
    fn write_params_carry_their_op_and_omit_what_is_absent() {
        let p = WriteParams::Begin(Begin {
            run_id: "r".into(),
            key: "k".into(),
            name: Some("a.txt".into()),
            size: Some(3),
            ..Begin::default()
        });
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!({"op": "begin", "runId": "r", "key": "k", "name": "a.txt", "size": 3})
        );
        let c = WriteParams::Commit(UploadRef {
            run_id: "r".into(),
            upload_id: "u".into(),
        });
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"op": "commit", "runId": "r", "uploadId": "u"})
        );
    }

    #[test]
    fn answers_ignore_unknown_fields() {
        let open: WriteAnswer = serde_json::from_value(
            json!({"status": "open", "uploadId": "u", "maxBytes": 10, "received": 0}),
        )
        .unwrap();
        assert!(matches!(
            open,
            WriteAnswer::Open(OpenAnswer { received: 0, .. })
        ));
        let aborted: WriteAnswer = serde_json::from_value(json!({"status": "aborted"})).unwrap();
        assert_eq!(aborted, WriteAnswer::Aborted {});
        assert_eq!(
            serde_json::from_value::<WriteAnswer>(
                json!({"status": "open", "uploadId": "u", "maxBytes": 10, "received": 0, "x": 1})
            )
            .unwrap(),
            open
        );
        let meta: ArtifactMeta = serde_json::from_value(json!({
            "artifactId": "a", "kind": "file", "name": "n", "version": 1, "size": 2,
            "tenantWide": false, "labels": ["x"]}))
        .unwrap();
        assert_eq!(meta.version, 1);
        // What podhost uses is still required.
        assert!(
            serde_json::from_value::<WriteAnswer>(json!({"status": "open", "uploadId": "u"}))
                .is_err()
        );
        assert!(serde_json::from_value::<WriteAnswer>(json!({"status": "later"})).is_err());
        let lenient: DefinitionFileAnswer =
            serde_json::from_value(json!({"base64": "", "size": 0, "eof": true})).unwrap();
        assert_eq!(lenient.eof, Some(true));
    }
}
