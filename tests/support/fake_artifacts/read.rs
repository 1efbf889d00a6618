//! The store's read side (v5 §4b, `artifact.read`), and what the test reads of the store.
//!
//! What it refuses, as core does: params other than `{runId, artifactId, version?, offset?,
//! length?}` (`invalid`); a run the connection does not hold (`run_not_held`); an artifact that
//! is not the session's, or a version it does not have (`not_found`, the same for all, so
//! nothing tells which exist); an `offset` past the end (`invalid`). `length` defaults to the
//! run's `chunkBytes` and is held to it; a folder answers its metadata with no bytes.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Answer, Artifact, FakeArtifacts, Store, Version, b64, content_type_of, err, hex_sha};

impl FakeArtifacts {
    /// The metadata of every artifact of `session`, latest versions, in creation order.
    pub fn list(&self, session: &str) -> Vec<Value> {
        let s = self.s.lock().unwrap();
        s.sessions
            .get(session)
            .map(|ses| {
                ses.artifacts
                    .iter()
                    .map(|a| a.meta(a.versions.len()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every version's metadata of an artifact.
    pub fn versions(&self, session: &str, artifact_id: &str) -> Vec<Value> {
        let s = self.s.lock().unwrap();
        let a = s.sessions[session]
            .artifacts
            .iter()
            .find(|a| a.id == artifact_id)
            .unwrap();
        (1..=a.versions.len()).map(|v| a.meta(v)).collect()
    }

    pub fn file_bytes(&self, session: &str, artifact_id: &str, version: usize) -> Vec<u8> {
        let s = self.s.lock().unwrap();
        let a = s.sessions[session]
            .artifacts
            .iter()
            .find(|a| a.id == artifact_id)
            .unwrap();
        a.versions[version - 1].bytes.clone()
    }

    /// A file version's `effectId`.
    pub fn effect_of(&self, session: &str, artifact_id: &str, version: usize) -> Option<String> {
        let s = self.s.lock().unwrap();
        let a = s.sessions[session]
            .artifacts
            .iter()
            .find(|a| a.id == artifact_id)
            .unwrap();
        a.versions[version - 1].effect_id.clone()
    }

    /// A folder version's files: (path, size, sha256).
    pub fn folder_files(
        &self,
        session: &str,
        artifact_id: &str,
        version: usize,
    ) -> Vec<(String, u64, String)> {
        let s = self.s.lock().unwrap();
        let a = s.sessions[session]
            .artifacts
            .iter()
            .find(|a| a.id == artifact_id)
            .unwrap();
        a.versions[version - 1]
            .files
            .iter()
            .map(|(p, (n, h))| (p.clone(), *n, h.clone()))
            .collect()
    }

    /// Puts an artifact straight into `session` (as if another run wrote it); returns its id.
    pub fn seed_file(&self, session: &str, name: &str, bytes: &[u8]) -> String {
        let mut s = self.s.lock().unwrap();
        let id = s.new_id("art");
        let v = Version {
            content_type: Some(content_type_of(name)),
            size: bytes.len() as u64,
            sha256: hex_sha(bytes),
            bytes: bytes.to_vec(),
            files: BTreeMap::new(),
            effect_id: None,
        };
        s.sessions
            .entry(session.to_owned())
            .or_default()
            .artifacts
            .push(Artifact {
                id: id.clone(),
                folder: false,
                name: name.to_owned(),
                versions: vec![v],
            });
        id
    }
}

impl Store {
    pub(super) fn read(&mut self, p: Value, run_id: &str, held: &impl Fn(&str) -> bool) -> Answer {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Read {
            run_id: String,
            artifact_id: String,
            version: Option<u64>,
            offset: Option<u64>,
            length: Option<u64>,
        }
        let r: Read = match serde_json::from_value(p) {
            Ok(r) => r,
            Err(e) => return err("invalid", format!("Invalid artifact.read request: {e}")),
        };
        let _ = r.run_id;
        let run = match self.run(run_id, held) {
            Ok(r) => r,
            Err(a) => return a,
        };
        let not_found = || {
            err(
                "not_found",
                format!("Artifact {} was not found", r.artifact_id),
            )
        };
        let Some(a) = self
            .sessions
            .get(&run.session)
            .and_then(|s| s.artifacts.iter().find(|a| a.id == r.artifact_id))
        else {
            return not_found();
        };
        let version = r.version.unwrap_or(a.versions.len() as u64) as usize;
        if version == 0 || version > a.versions.len() {
            return not_found();
        }
        let meta = a.meta(version);
        let v = &a.versions[version - 1];
        let offset = r.offset.unwrap_or(0);
        let length = r.length.unwrap_or(run.chunk_bytes).min(run.chunk_bytes);
        if a.folder {
            return Some(Ok(
                json!({"artifact": meta, "offset": offset, "base64": "", "eof": true}),
            ));
        }
        if offset > v.size {
            return err(
                "invalid",
                format!("Offset {offset} is past the end ({} bytes)", v.size),
            );
        }
        let end = (offset + length).min(v.size);
        let bytes = &v.bytes[offset as usize..end as usize];
        Some(Ok(json!({
            "artifact": meta,
            "offset": offset,
            "base64": b64(bytes),
            "eof": end == v.size,
        })))
    }
}
