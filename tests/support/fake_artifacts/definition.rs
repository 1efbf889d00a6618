//! `definition.file {runId, sha256, offset?, length?}` (v5 §3; v2 notes §1.3): the bytes of a
//! file the run's definition names — the skill files of its TurnStart's manifest, which podhost
//! mounts under `/skills`.
//!
//! What it refuses, as core does: params other than those (`invalid`); a `sha256` that is not
//! `sha256:<64 lowercase hex>` (`invalid`); a run the connection does not hold
//! (`run_not_held`); a digest that is not one of the run's skill files (`invalid`); a `length`
//! past the run's `chunkBytes` (`limit_exceeded`); an `offset` past the end (`invalid`). A
//! digest the test did not add is `unavailable`. The test can corrupt one range once, to see
//! podhost check what it mounts, and count the ranges served.

use serde::Deserialize;
use serde_json::{Value, json};

use super::{Answer, FakeArtifacts, Store, b64, err, hex_sha, is_hex64};

impl FakeArtifacts {
    /// Serves `bytes` to `definition.file` as `sha256:<hex>`; returns that digest.
    pub fn add_definition_file(&self, bytes: &[u8]) -> String {
        let digest = format!("sha256:{}", hex_sha(bytes));
        self.s
            .lock()
            .unwrap()
            .definition_files
            .insert(digest.clone(), bytes.to_vec());
        digest
    }

    /// `definition.file` answers carry `eof` too.
    pub fn set_definition_eof(&self, on: bool) {
        self.s.lock().unwrap().definition_eof = on;
    }

    /// The `index`th range served of `digest` has its first byte flipped (once).
    pub fn corrupt_definition_chunk(&self, digest: &str, index: usize) {
        self.s
            .lock()
            .unwrap()
            .corrupt
            .insert(digest.to_owned(), index);
    }

    /// How many ranges of `digest` were served.
    pub fn definition_ranges_served(&self, digest: &str) -> usize {
        self.s
            .lock()
            .unwrap()
            .served
            .get(digest)
            .copied()
            .unwrap_or(0)
    }
}

impl Store {
    pub(super) fn definition(
        &mut self,
        p: Value,
        run_id: &str,
        held: &impl Fn(&str) -> bool,
    ) -> Answer {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Def {
            run_id: String,
            sha256: String,
            offset: Option<u64>,
            length: Option<u64>,
        }
        let d: Def = match serde_json::from_value(p) {
            Ok(d) => d,
            Err(e) => return err("invalid", format!("Invalid definition.file request: {e}")),
        };
        let _ = d.run_id;
        if !d.sha256.strip_prefix("sha256:").is_some_and(is_hex64) {
            return err(
                "invalid",
                "Invalid definition.file request: sha256 must be sha256:<hex>",
            );
        }
        let run = match self.run(run_id, held) {
            Ok(r) => r,
            Err(a) => return a,
        };
        if !run.skill_files.contains(&d.sha256) {
            return err(
                "invalid",
                format!("{} is not a file of the run's definition", d.sha256),
            );
        }
        let Some(bytes) = self.definition_files.get(&d.sha256).cloned() else {
            return err(
                "unavailable",
                format!("The bytes of {} are missing", d.sha256),
            );
        };
        let length = d.length.unwrap_or(run.chunk_bytes);
        if length > run.chunk_bytes {
            return err(
                "limit_exceeded",
                format!(
                    "A range of {length} bytes is past chunkBytes {}",
                    run.chunk_bytes
                ),
            );
        }
        let offset = d.offset.unwrap_or(0);
        if offset > bytes.len() as u64 {
            return err("invalid", format!("Offset {offset} is past the end"));
        }
        let end = (offset + length).min(bytes.len() as u64) as usize;
        let mut range = bytes[offset as usize..end].to_vec();
        let index = *self.served.get(&d.sha256).unwrap_or(&0);
        self.served.insert(d.sha256.clone(), index + 1);
        if self.corrupt.get(&d.sha256) == Some(&index) && !range.is_empty() {
            self.corrupt.remove(&d.sha256);
            range[0] ^= 0xff;
        }
        let mut answer = json!({"base64": b64(&range)});
        if self.definition_eof {
            answer["eof"] = json!(end == bytes.len());
        }
        Some(Ok(answer))
    }
}
