//! The fake core's artifact store: `artifact.read`, `artifact.write` and `definition.file`, as
//! strict as v5 §4b says core is, written from the spec independently of podhost's types.
//!
//! Scope is per session: a run reads and writes its session's artifacts only, and anything else
//! is `not_found`. Chunks past the run's `limits.chunkBytes` are `limit_exceeded`; a chunk
//! whose offset is not `received` is `invalid`, except a repeat of the last chunk, which is
//! acknowledged without being taken twice; an unknown `uploadId` is `invalid` (`abort` answers
//! `aborted`); a file whose bytes do not match its sha256 is `invalid` and ends the upload;
//! `maxEntries`, `maxFileBytes` and `maxBytes` are `limit_exceeded`; a commit past the total is
//! `refused` (a folder) or `limit_exceeded` (a file); a written key answers `written` with
//! `created: false`; a folder version equal to the latest is `unchanged`; uploads left open end
//! with their run. `definition.file` serves the bytes of the run's manifest's skill files by
//! `sha256:<hex>` (an unknown one is `invalid`).
//!
//! Assumptions where v5 is silent (podhost makes the same ones): `sha256` in `artifact.write`
//! and in an artifact's metadata is lowercase hex; a repeat of the last `file` op of a folder
//! upload (its answer lost) is acknowledged like a repeated chunk; `definition.file` answers
//! `{base64}` as v2 did (with `eof` when [`FakeArtifacts::set_definition_eof`] is on).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

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

/// The last chunk taken, for acknowledging its repeat.
type LastChunk = Option<(u64, Vec<u8>)>;

#[derive(Debug)]
struct InProgress {
    path: String,
    size: u64,
    sha256: String,
    data: Vec<u8>,
    last: LastChunk,
}

#[derive(Debug)]
enum UploadKind {
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
struct Upload {
    run: String,
    key: String,
    max_bytes: u64,
    kind: UploadKind,
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
    // ---- the test's levers ----

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

    /// The answer to the `(skip + 1)`th next request `method` (with `op`) is lost.
    pub fn drop_answer(&self, method: &str, op: Option<&str>, skip: usize) {
        self.s.lock().unwrap().drops.push(Drop {
            method: method.to_owned(),
            op: op.map(str::to_owned),
            skip,
        });
    }

    // ---- what the test reads ----

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

    /// Uploads still open.
    pub fn open_uploads(&self) -> usize {
        self.s.lock().unwrap().uploads.len()
    }

    /// Upload ids that ended with their run.
    pub fn dropped_at_run_end(&self) -> Vec<String> {
        self.s.lock().unwrap().dropped_at_run_end.clone()
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

fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control())
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

fn media_type_ok(t: &str) -> bool {
    let mut parts = t.splitn(2, '/');
    matches!((parts.next(), parts.next()), (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() && !b.contains('/'))
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

    fn read(&mut self, p: Value, run_id: &str, held: &impl Fn(&str) -> bool) -> Answer {
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

    fn definition(&mut self, p: Value, run_id: &str, held: &impl Fn(&str) -> bool) -> Answer {
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

    fn write(&mut self, p: Value, run_id: &str, held: &impl Fn(&str) -> bool) -> Answer {
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
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, rename_all = "camelCase")]
        struct Begin {
            op: String,
            run_id: String,
            key: String,
            kind: Option<String>,
            name: Option<String>,
            artifact_id: Option<String>,
            same_name: Option<bool>,
            content_type: Option<String>,
            size: Option<u64>,
            effect_id: Option<String>,
            base64: Option<String>,
        }
        let b: Begin = match serde_json::from_value(p) {
            Ok(b) => b,
            Err(e) => return err("invalid", format!("Invalid artifact.write request: {e}")),
        };
        let _ = (b.op, b.run_id);
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
            return Some(Ok(json!({
                "status": "open", "uploadId": id, "maxBytes": max_bytes,
                "maxFileBytes": self.folder_file_limit, "maxEntries": run.folder_entries,
                "received": 0,
            })));
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
    fn take_chunk(
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
            UploadKind::Folder {
                current,
                files,
                max_file_bytes,
                max_entries,
                ..
            } => {
                let Some(cur) = current.as_mut() else {
                    return err("invalid", "No file is in progress");
                };
                if c.sha256.as_deref() != Some(cur.sha256.as_str()) {
                    return err("invalid", "sha256 does not name the file in progress");
                }
                if let Err(a) =
                    Self::take_chunk(&mut cur.data, &mut cur.last, c.offset, bytes, cur.size)
                {
                    return a;
                }
                let received = cur.data.len() as u64;
                let (mfb, me) = (*max_file_bytes, *max_entries);
                if received == cur.size {
                    if hex_sha(&cur.data) != cur.sha256 {
                        let path = cur.path.clone();
                        self.uploads.remove(&c.upload_id);
                        return err(
                            "invalid",
                            format!(
                                "The bytes of {path} do not match its sha256; the upload ended"
                            ),
                        );
                    }
                    let done = current.take().unwrap();
                    files.insert(done.path, (done.size, done.sha256, done.data));
                }
                Some(Ok(
                    json!({"status": "open", "uploadId": c.upload_id, "maxBytes": max_bytes,
                    "maxFileBytes": mfb, "maxEntries": me, "received": received}),
                ))
            }
        }
    }

    fn file(&mut self, p: Value, run: &RunInfo, run_id: &str) -> Answer {
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

    fn commit_folder(&mut self, up: Upload, run: &RunInfo) -> Answer {
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
