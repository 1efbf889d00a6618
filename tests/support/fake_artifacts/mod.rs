//! The fake core's artifact store (v5 §4b, and §3 for `definition.file`; v2 notes §1.3, §7.4,
//! §7.5), as strict as v5 says core is, written from the spec independently of podhost's types.
//! The fake core's session hands it `artifact.read`, `artifact.write` and `definition.file`.
//!
//! * [`read`]: `artifact.read`, and what the test reads of the store.
//! * [`write`]: `artifact.write` — uploads, file artifacts, chunks, commits, aborts.
//! * [`folder`]: folder versions (`kind: "folder"`), file by file, and their checks.
//! * [`definition`]: `definition.file`, the bytes of the run's skills.
//!
//! Scope is per session: a run reads and writes its session's artifacts only, and anything else
//! is `not_found`; every request names a run the connection holds, else `run_not_held`. What
//! each request refuses is in its file's doc. This file: the store's state, the run limits it
//! learns from each grant, uploads ending with their run, and answers the test scripts lost.
//!
//! Assumptions where v5 is silent (podhost makes the same ones): `sha256` in `artifact.write`
//! and in an artifact's metadata is lowercase hex; a repeat of the last `file` op of a folder
//! upload (its answer lost) is acknowledged like a repeated chunk; `definition.file` answers
//! `{base64}` as v2 did (with `eof` when [`FakeArtifacts::set_definition_eof`] is on).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

mod definition;
mod folder;
mod read;
mod write;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use write::Upload;

type Answer = Option<Result<Value, (String, String)>>;

fn err(code: &str, message: impl Into<String>) -> Answer {
    Some(Err((code.to_owned(), message.into())))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn hex_sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A run the store knows from its grant.
#[derive(Clone, Debug)]
struct RunInfo {
    session: String,
    turn: String,
    chunk_bytes: u64,
    folder_entries: u64,
    skill_files: HashSet<String>,
}

#[derive(Clone, Debug)]
struct Version {
    content_type: Option<String>,
    size: u64,
    sha256: String,
    /// A file's bytes.
    bytes: Vec<u8>,
    /// A folder's files: path → (size, sha256).
    files: BTreeMap<String, (u64, String)>,
    effect_id: Option<String>,
}

#[derive(Clone, Debug)]
struct Artifact {
    id: String,
    folder: bool,
    name: String,
    versions: Vec<Version>,
}

impl Artifact {
    fn meta(&self, version: usize) -> Value {
        let v = &self.versions[version - 1];
        json!({
            "artifactId": self.id,
            "kind": if self.folder { "folder" } else { "file" },
            "name": self.name,
            "version": version,
            "contentType": v.content_type,
            "size": v.size,
            "sha256": v.sha256,
            "tenantWide": false,
        })
    }
}

#[derive(Default, Debug)]
struct Session {
    artifacts: Vec<Artifact>,
    /// key → (artifact id, version).
    keys: HashMap<String, (String, usize)>,
}

/// An answer to drop (the request is taken, its answer lost).
#[derive(Clone, Debug)]
struct Drop {
    method: String,
    op: Option<String>,
    skip: usize,
}

struct Store {
    runs: HashMap<String, RunInfo>,
    sessions: HashMap<String, Session>,
    uploads: HashMap<String, Upload>,
    next_id: u64,
    definition_files: HashMap<String, Vec<u8>>,
    definition_eof: bool,
    /// sha256:<hex> → index of the chunk served corrupted (once).
    corrupt: HashMap<String, usize>,
    served: HashMap<String, usize>,
    file_limit: u64,
    folder_file_limit: u64,
    folder_max_bytes: u64,
    /// The Tenant's total; contents stored count once (dedupe by sha256).
    total_limit: Option<u64>,
    stored_contents: HashMap<String, u64>,
    drops: Vec<Drop>,
    /// Set as the total just before the next folder commit (other writes landed meanwhile).
    total_at_commit: Option<u64>,
    /// The next folder chunks taken have their first byte flipped (a file changed mid-send).
    corrupt_folder_chunks: usize,
    /// Uploads that ended with their run.
    dropped_at_run_end: Vec<String>,
}

/// The store; [`FakeArtifacts::answer`] is called by the fake core for the three methods.
pub struct FakeArtifacts {
    s: Mutex<Store>,
}

impl Default for FakeArtifacts {
    fn default() -> Self {
        FakeArtifacts {
            s: Mutex::new(Store {
                runs: HashMap::new(),
                sessions: HashMap::new(),
                uploads: HashMap::new(),
                next_id: 1,
                definition_files: HashMap::new(),
                definition_eof: false,
                corrupt: HashMap::new(),
                served: HashMap::new(),
                file_limit: 64 << 20,
                folder_file_limit: 64 << 20,
                folder_max_bytes: 256 << 20,
                total_limit: None,
                stored_contents: HashMap::new(),
                drops: Vec::new(),
                total_at_commit: None,
                corrupt_folder_chunks: 0,
                dropped_at_run_end: Vec::new(),
            }),
        }
    }
}

impl FakeArtifacts {
    /// The answer to the `(skip + 1)`th next request `method` (with `op`) is lost.
    pub fn drop_answer(&self, method: &str, op: Option<&str>, skip: usize) {
        self.s.lock().unwrap().drops.push(Drop {
            method: method.to_owned(),
            op: op.map(str::to_owned),
            skip,
        });
    }

    // ---- hooks the fake core calls ----

    /// A grant was handed out: the run's session, turn, limits and skill files.
    pub fn on_grant(&self, grant: &Value) {
        let run = &grant["run"];
        let input = &grant["input"];
        let Some(run_id) = run["runId"].as_str() else {
            return;
        };
        let limits = &input["limits"];
        let skill_files = input["manifest"]["skills"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["files"].as_object())
            .flat_map(|f| f.values().filter_map(Value::as_str).map(str::to_owned))
            .collect();
        self.s.lock().unwrap().runs.insert(
            run_id.to_owned(),
            RunInfo {
                session: run["sessionId"].as_str().unwrap_or("").to_owned(),
                turn: run["turnId"].as_str().unwrap_or("").to_owned(),
                chunk_bytes: limits["chunkBytes"].as_u64().unwrap_or(16 << 20),
                folder_entries: limits["folderEntries"].as_u64().unwrap_or(10_000),
                skill_files,
            },
        );
    }

    /// The run ended (an output, a release, the connection): its open uploads end, unstored.
    pub fn on_run_end(&self, run_id: &str) {
        let mut s = self.s.lock().unwrap();
        let ids: Vec<String> = s
            .uploads
            .iter()
            .filter(|(_, u)| u.run == run_id)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            s.uploads.remove(&id);
            s.dropped_at_run_end.push(id);
        }
    }

    /// Answers one of the three methods; `held` says whether this connection holds a run.
    /// `None`: the answer is lost (scripted).
    pub fn answer(&self, m: &str, p: Value, held: impl Fn(&str) -> bool) -> Answer {
        let invalid = |e: String| err("invalid", format!("Invalid {m} request: {e}"));
        let run_id = match p.get("runId").and_then(Value::as_str) {
            Some(r) if !r.is_empty() => r.to_owned(),
            _ => return invalid("runId is required".to_owned()),
        };
        let op = p.get("op").and_then(Value::as_str).map(str::to_owned);
        let mut s = self.s.lock().unwrap();
        let answer = match m {
            "artifact.read" => s.read(p, &run_id, &held),
            "artifact.write" => s.write(p, &run_id, &held),
            "definition.file" => s.definition(p, &run_id, &held),
            _ => err("invalid", format!("Unknown request {m}")),
        };
        if let Some(i) = s
            .drops
            .iter()
            .position(|d| d.method == m && (d.op.is_none() || d.op == op))
        {
            if s.drops[i].skip == 0 {
                s.drops.remove(i);
                return None;
            }
            s.drops[i].skip -= 1;
        }
        answer
    }
}

fn content_type_of(name: &str) -> String {
    let ext = name.rsplit_once('.').map(|(_, e)| e).unwrap_or("");
    match ext {
        "txt" => "text/plain",
        "json" => "application/json",
        "md" => "text/markdown",
        _ => "application/octet-stream",
    }
    .to_owned()
}

impl Store {
    fn new_id(&mut self, prefix: &str) -> String {
        let id = format!("{prefix}_{:04}", self.next_id);
        self.next_id += 1;
        id
    }

    fn run(&self, run_id: &str, held: &impl Fn(&str) -> bool) -> Result<RunInfo, Answer> {
        if !held(run_id) {
            return Err(err(
                "run_not_held",
                format!("Run {run_id} is not held by this harness"),
            ));
        }
        self.runs
            .get(run_id)
            .cloned()
            .ok_or_else(|| err("run_not_held", format!("Run {run_id} is not held")))
    }

    fn remaining_total(&self) -> u64 {
        match self.total_limit {
            Some(l) => l.saturating_sub(self.stored_contents.values().sum()),
            None => u64::MAX,
        }
    }

    /// New bytes a set of contents adds to the total, after dedupe.
    fn new_content(&self, contents: &[(String, u64)]) -> u64 {
        let mut seen = HashSet::new();
        contents
            .iter()
            .filter(|(h, _)| !self.stored_contents.contains_key(h) && seen.insert(h.clone()))
            .map(|(_, n)| n)
            .sum()
    }
}
