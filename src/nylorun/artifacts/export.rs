//! The outputs folder: at the end of every completed turn, `/workspace/outputs` becomes a version
//! of the session's folder artifact `outputs` (v5 §3 "Outputs", §4b "Folders").
//!
//! Owns: the walk of the outputs directory, the folder upload (`begin {kind: "folder", key:
//! "outputs:<turnId>", name: "outputs", sameName: true}`, one `file` per regular file — inline
//! when it fits a chunk, else `chunk`s —, `commit`), and the [`ExportReport`] of what was stored,
//! skipped and failed, with reasons.
//!
//! Decisions:
//! * **Nothing to export.** No outputs directory, or one without any regular file (empty, or only
//!   empty directories): no request is sent. An empty version would make an `outputs` folder in
//!   every session whose agent made the directory, and podhost cannot ask whether one exists
//!   without making one; the folder's last version keeps the files it had.
//! * **Symlinks are never followed**, the outputs directory itself included; each is reported
//!   skipped. A file is opened without following its last component and must be the very file
//!   the walk saw (same device and inode), so a directory swapped for a link mid-export cannot
//!   send bytes from elsewhere. FIFOs, sockets and devices are skipped, never opened.
//! * **Limits.** Files go in path order. Past `maxEntries` (`limits.folderEntries`), past
//!   `maxFileBytes`, or past what is left of `maxBytes`, a file is skipped with the limit; the
//!   rest are stored. A file core refuses with `limit_exceeded` is skipped likewise.
//! * **Failures.** A file that ends the upload (its bytes changed between hashing and sending, so
//!   core found they do not match; or any other refusal) is reported failed, and the export runs
//!   once more without it. A connection that is gone ends the export.
//! * **Reporting.** Every skipped or failed file is logged and in the report. When the export
//!   stores nothing although there was something to store, [`ExportReport::claims`] gives the
//!   `artifact.export.skipped` / `artifact.export.failed` claims v5 §4b describes; v5 does not
//!   give the `event` request's params (v2's allowed only `sandbox.*` types), so sending them is
//!   left to the turn, which knows the session.
//!
//! Invariants: never fails the turn (every error is in the report); memory per file is bounded
//! by one chunk; the walk is bounded in depth and entries.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use walk::{WalkedFile, walk};

use crate::floor::workspace::{OpenError, open_regular};
use crate::nylorun::artifacts::wire::ArtifactMeta;
use crate::nylorun::artifacts::{
    ArtifactError, Artifacts, Committed, FolderFile, FolderStart, FolderTarget, FolderUpload,
};
use crate::tools::Toolbox;

mod walk;

/// The folder artifact's name.
pub const OUTPUTS_NAME: &str = "outputs";
/// Bytes read at a time while hashing.
const HASH_BUF: usize = 256 * 1024;

/// How an export ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExportOutcome {
    /// Nothing to export: no outputs directory, or no file in it.
    Nothing { reason: String },
    /// A new version, or (`created: false`) the version this turn's key already wrote.
    Written {
        artifact: ArtifactMeta,
        created: bool,
    },
    /// The files are the folder's latest version: nothing was added.
    Unchanged { artifact: ArtifactMeta },
    /// Nothing was stored: a refused commit, or no file could be.
    Skipped {
        reason: String,
        message: String,
        limit: Option<u64>,
    },
    /// Nothing was stored: the export failed.
    Failed { message: String },
}

/// A file (or the whole directory, with no `path`) that was not stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportProblem {
    /// Relative to the outputs directory.
    pub path: Option<String>,
    /// `too_many_files`, `file_too_large`, `too_large`, `symlink`, `not_a_file`, `bad_name`,
    /// `too_deep`, `changed`, `unreadable`, `refused` (core's `limit_exceeded` for the file),
    /// `rejected` (core ended the upload at the file: its bytes changed while it was sent).
    pub reason: String,
    pub message: String,
    pub limit: Option<u64>,
}

/// A file of the version sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportedFile {
    pub path: String,
    pub size: u64,
    /// Lowercase hex SHA-256.
    pub sha256: String,
}

/// What an export did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportReport {
    pub outcome: ExportOutcome,
    /// The files of the version committed: empty when nothing was (or, for a replayed key,
    /// nothing needed to be) sent.
    pub stored: Vec<ExportedFile>,
    pub skipped: Vec<ExportProblem>,
    pub failed: Vec<ExportProblem>,
}

impl ExportReport {
    fn new(outcome: ExportOutcome) -> Self {
        ExportReport {
            outcome,
            stored: Vec::new(),
            skipped: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// The claims v5 §4b describes for an export that stored nothing: `(type, payload)`.
    pub fn claims(&self) -> Vec<(&'static str, Value)> {
        match &self.outcome {
            ExportOutcome::Skipped {
                reason,
                message,
                limit,
            } => {
                let mut p = json!({"name": OUTPUTS_NAME, "reason": reason, "message": message});
                if let Some(l) = limit {
                    p["limit"] = json!(l);
                }
                if let [only] = self.skipped.as_slice()
                    && let Some(path) = &only.path
                {
                    p["path"] = json!(path);
                }
                vec![("artifact.export.skipped", p)]
            }
            ExportOutcome::Failed { message } => vec![(
                "artifact.export.failed",
                json!({"name": OUTPUTS_NAME, "message": message}),
            )],
            _ => Vec::new(),
        }
    }

    /// One paragraph for a log line or the model.
    pub fn summary(&self) -> String {
        let mut s = match &self.outcome {
            ExportOutcome::Nothing { reason } => format!("No outputs saved: {reason}."),
            ExportOutcome::Written { artifact, .. } => format!(
                "Saved {} file(s) of the outputs directory as the outputs folder, version {}.",
                self.stored.len(),
                artifact.version
            ),
            ExportOutcome::Unchanged { artifact } => format!(
                "The outputs folder is unchanged (version {}).",
                artifact.version
            ),
            ExportOutcome::Skipped { message, .. } => format!("No outputs saved: {message}"),
            ExportOutcome::Failed { message } => format!("Saving the outputs failed: {message}"),
        };
        for p in self.skipped.iter().chain(&self.failed) {
            s.push_str(&format!(
                " {}: {} ({}).",
                p.path.as_deref().unwrap_or("outputs"),
                p.message,
                p.reason
            ));
        }
        s
    }
}

/// Saves `outputs_dir` (a host directory in `toolbox`'s workspace) as a version of the session's
/// `outputs` folder, keyed by the turn. Every file is listed and opened confined by `toolbox`.
pub async fn export_outputs(
    artifacts: &Artifacts,
    toolbox: &Toolbox,
    outputs_dir: &Path,
    turn_id: &str,
) -> ExportReport {
    let max_files = usize::try_from(artifacts.limits().folder_entries).unwrap_or(usize::MAX);
    let dir = outputs_dir.to_path_buf();
    let walked = toolbox
        .confined("export", &[], move || walk(&dir, max_files))
        .await;
    let walked = match walked {
        Ok(w) => w,
        Err(e) => {
            return finish(ExportReport::new(ExportOutcome::Failed {
                message: format!("the outputs directory could not be listed: {e}"),
            }));
        }
    };
    let Some(mut walked) = walked else {
        return finish(ExportReport::new(ExportOutcome::Nothing {
            reason: "there is no outputs directory".to_owned(),
        }));
    };
    let mut report = ExportReport::new(ExportOutcome::Nothing {
        reason: "the outputs directory holds no files".to_owned(),
    });
    report.skipped.append(&mut walked.skipped);
    report.failed.append(&mut walked.failed);
    if walked.files.is_empty() {
        if let Some(first) = report.skipped.first().or(report.failed.first()) {
            report.outcome = nothing_stored(first);
        }
        return finish(report);
    }
    let target = FolderTarget {
        key: format!("outputs:{turn_id}"),
        name: OUTPUTS_NAME.to_owned(),
        artifact_id: None,
        same_name: true,
    };
    let mut excluded: Vec<String> = Vec::new();
    for attempt in 1..=2 {
        let files: Vec<&WalkedFile> = walked
            .files
            .iter()
            .filter(|f| !excluded.contains(&f.rel))
            .collect();
        let mut tried = Attempt::default();
        let end = upload(
            artifacts,
            toolbox,
            &target,
            &files,
            walked.extra_files,
            &mut tried,
        )
        .await;
        match end {
            Err(Fatal { path, error }) if attempt == 1 && retryable(&error) && path.is_some() => {
                let path = path.unwrap_or_default();
                tracing::warn!(run_id = %artifacts.run_id(), %path, error = %error, "a file ended the outputs upload; exporting again without it");
                report.failed.push(left_out(&path, &error));
                excluded.push(path);
            }
            Err(Fatal { error, .. }) => {
                report.outcome = ExportOutcome::Failed {
                    message: error.to_string(),
                };
                return finish(report);
            }
            Ok(outcome) => {
                report.settle(tried, outcome);
                return finish(report);
            }
        }
    }
    finish(report)
}

/// The problem of a file core ended an upload at, left out of the next attempt.
fn left_out(path: &str, error: &ArtifactError) -> ExportProblem {
    ExportProblem {
        path: Some(path.to_owned()),
        reason: "rejected".to_owned(),
        message: format!("core ended the upload at this file, which was left out: {error}"),
        limit: None,
    }
}

impl ExportReport {
    /// Takes in the upload attempt that ended with `outcome`.
    fn settle(&mut self, mut tried: Attempt, outcome: ExportOutcome) {
        self.skipped.append(&mut tried.skipped);
        self.failed.append(&mut tried.failed);
        if matches!(
            outcome,
            ExportOutcome::Written { .. } | ExportOutcome::Unchanged { .. }
        ) {
            self.stored = tried.stored;
        }
        self.outcome = match outcome {
            ExportOutcome::Nothing { .. } => match self.skipped.first() {
                Some(first) => nothing_stored(first),
                None => outcome,
            },
            other => other,
        };
    }
}

/// The outcome of an export that stored nothing because of `first`.
fn nothing_stored(first: &ExportProblem) -> ExportOutcome {
    ExportOutcome::Skipped {
        reason: first.reason.clone(),
        message: format!(
            "no file of the outputs directory could be stored: {}",
            first.message
        ),
        limit: first.limit,
    }
}

/// Logs the report and returns it.
fn finish(report: ExportReport) -> ExportReport {
    for p in &report.skipped {
        tracing::warn!(path = p.path.as_deref().unwrap_or(""), reason = %p.reason, message = %p.message, "an output was not saved");
    }
    for p in &report.failed {
        tracing::warn!(path = p.path.as_deref().unwrap_or(""), reason = %p.reason, message = %p.message, "an output could not be saved");
    }
    match &report.outcome {
        ExportOutcome::Failed { .. } | ExportOutcome::Skipped { .. } => {
            tracing::warn!(summary = %report.summary(), "outputs export stored nothing")
        }
        _ => tracing::info!(summary = %report.summary(), "outputs export"),
    }
    report
}

fn retryable(e: &ArtifactError) -> bool {
    !matches!(e, ArtifactError::Call(_))
}

/// What one upload attempt stored and left out.
#[derive(Default)]
struct Attempt {
    stored: Vec<ExportedFile>,
    skipped: Vec<ExportProblem>,
    failed: Vec<ExportProblem>,
}

/// An error that ended the upload, and the file in progress.
struct Fatal {
    path: Option<String>,
    error: ArtifactError,
}

impl Fatal {
    fn whole(error: ArtifactError) -> Self {
        Fatal { path: None, error }
    }
}

/// One upload of `files`: begin, each file, commit (or abort when none could be added).
async fn upload(
    artifacts: &Artifacts,
    toolbox: &Toolbox,
    target: &FolderTarget,
    files: &[&WalkedFile],
    extra_files: u64,
    tried: &mut Attempt,
) -> Result<ExportOutcome, Fatal> {
    let mut up = match artifacts.begin_folder(target).await.map_err(Fatal::whole)? {
        FolderStart::Written(w) => {
            return Ok(ExportOutcome::Written {
                artifact: w.artifact,
                created: false,
            });
        }
        FolderStart::Open(up) => up,
    };
    let mut total = 0u64;
    let mut too_many = extra_files;
    for f in files {
        if tried.stored.len() as u64 >= up.max_entries {
            too_many += 1;
            continue;
        }
        if let Some(p) = over_limits(&up, &f.rel, f.size, total) {
            tried.skipped.push(p);
            continue;
        }
        match send_file(artifacts, toolbox, &mut up, f, total).await {
            Ok(sent) => {
                total += sent.size;
                tried.stored.push(sent);
            }
            Err(FileEnd::Skip(p)) => tried.skipped.push(p),
            Err(FileEnd::Failed(p)) => tried.failed.push(p),
            Err(FileEnd::Fatal(error)) => {
                up.abort().await;
                return Err(Fatal {
                    path: Some(f.rel.clone()),
                    error,
                });
            }
        }
    }
    if too_many > 0 {
        tried.skipped.push(ExportProblem {
            path: None,
            reason: "too_many_files".to_owned(),
            message: format!(
                "{too_many} more file(s) past the limit of {} files in one folder version",
                up.max_entries
            ),
            limit: Some(up.max_entries),
        });
    }
    if tried.stored.is_empty() {
        up.abort().await;
        return Ok(ExportOutcome::Nothing {
            reason: "no file could be stored".to_owned(),
        });
    }
    match up.commit().await {
        Ok(Committed::Written(w)) if w.unchanged => Ok(ExportOutcome::Unchanged {
            artifact: w.artifact,
        }),
        Ok(Committed::Written(w)) => Ok(ExportOutcome::Written {
            artifact: w.artifact,
            created: w.created,
        }),
        Ok(Committed::Refused(r)) => Ok(ExportOutcome::Skipped {
            reason: r.reason,
            message: r.message,
            limit: r.limit,
        }),
        Err(e) => Err(Fatal::whole(e)),
    }
}

/// Why a file of `size` bytes cannot join a folder that holds `total` bytes so far, if it cannot.
fn over_limits(up: &FolderUpload<'_>, rel: &str, size: u64, total: u64) -> Option<ExportProblem> {
    if size > up.max_file_bytes {
        return Some(problem(
            rel,
            "file_too_large",
            format!(
                "{size} bytes is past the {}-byte limit of one file",
                up.max_file_bytes
            ),
            Some(up.max_file_bytes),
        ));
    }
    if total + size > up.max_bytes {
        return Some(problem(
            rel,
            "too_large",
            format!(
                "{size} bytes is past what is left of the folder's {}-byte limit",
                up.max_bytes
            ),
            Some(up.max_bytes),
        ));
    }
    None
}

fn problem(path: &str, reason: &str, message: String, limit: Option<u64>) -> ExportProblem {
    ExportProblem {
        path: Some(path.to_owned()),
        reason: reason.to_owned(),
        message,
        limit,
    }
}

/// Why one file was not stored.
enum FileEnd {
    /// Left out for a limit or its kind; the upload goes on.
    Skip(ExportProblem),
    /// Could not be read; the upload goes on.
    Failed(ExportProblem),
    /// The upload cannot go on.
    Fatal(ArtifactError),
}

/// Sends one file: opened safely, hashed, then inline or in chunks.
async fn send_file(
    artifacts: &Artifacts,
    toolbox: &Toolbox,
    up: &mut FolderUpload<'_>,
    f: &WalkedFile,
    total: u64,
) -> Result<ExportedFile, FileEnd> {
    let chunk = artifacts.chunk_bytes() as u64;
    let (host, dev, ino) = (f.host.clone(), f.dev, f.ino);
    let inline_max = chunk;
    let read = toolbox
        .confined("export", &[], move || {
            open_and_hash(&host, dev, ino, inline_max)
        })
        .await
        .map_err(|e| FileEnd::Failed(problem(&f.rel, "unreadable", e.to_string(), None)))?;
    let opened =
        read.map_err(|(reason, message)| FileEnd::Failed(problem(&f.rel, reason, message, None)))?;
    // The file may have grown since the walk: the limits again, on what was read.
    if let Some(p) = over_limits(up, &f.rel, opened.size, total) {
        return Err(FileEnd::Skip(p));
    }
    let entry = FolderFile {
        path: f.rel.clone(),
        size: opened.size,
        sha256: opened.sha256.clone(),
        content_type: None,
    };
    let on_err = |e: ArtifactError| match e {
        ArtifactError::LimitExceeded { message, .. } => {
            FileEnd::Skip(problem(&f.rel, "refused", message, None))
        }
        other => FileEnd::Fatal(other),
    };
    let mut received = up
        .file(&entry, opened.inline.as_deref())
        .await
        .map_err(on_err)?;
    let mut stalls = 0u32;
    while received < opened.size {
        let len = chunk.min(opened.size - received) as usize;
        let (file, at) = (opened.file.clone(), received);
        let bytes = tokio::task::spawn_blocking(move || read_exact_at(&file, at, len))
            .await
            .map_err(|e| {
                FileEnd::Fatal(ArtifactError::BadAnswer {
                    op: "chunk",
                    message: e.to_string(),
                })
            })?
            .map_err(|e| {
                FileEnd::Fatal(ArtifactError::Invalid {
                    op: "chunk",
                    message: format!("the file could not be read again: {e}"),
                })
            })?;
        let next = up.chunk(&entry, received, &bytes).await.map_err(on_err)?;
        if next <= received {
            stalls += 1;
            if stalls >= crate::nylorun::artifacts::ATTEMPTS {
                return Err(FileEnd::Fatal(ArtifactError::BadAnswer {
                    op: "chunk",
                    message: format!("received stays at {next} bytes of {}", opened.size),
                }));
            }
        } else {
            stalls = 0;
        }
        received = next;
    }
    Ok(ExportedFile {
        path: f.rel.clone(),
        size: opened.size,
        sha256: opened.sha256,
    })
}

/// A file opened for export.
struct Opened {
    file: Arc<File>,
    size: u64,
    sha256: String,
    /// The bytes, when they fit one chunk.
    inline: Option<Vec<u8>>,
}

/// Opens the walked file (no symlink, no FIFO, the same inode) and hashes it; a file of at most
/// `inline_max` bytes is read into memory once, so its hash and its bytes agree.
fn open_and_hash(
    host: &Path,
    dev: u64,
    ino: u64,
    inline_max: u64,
) -> Result<Opened, (&'static str, String)> {
    let file = open_regular(host).map_err(|e| match e {
        OpenError::NotFound => ("changed", "it was removed during the export".to_owned()),
        OpenError::NotAFile(kind) => ("not_a_file", format!("it is now {kind}")),
        OpenError::Symlink => (
            "symlink",
            "it is now a symbolic link; links are not followed".to_owned(),
        ),
        OpenError::Io(e) => ("unreadable", e.to_string()),
    })?;
    let meta = file.metadata().map_err(|e| ("unreadable", e.to_string()))?;
    if meta.dev() != dev || meta.ino() != ino {
        return Err((
            "changed",
            "it was replaced during the export (a different file is at its path)".to_owned(),
        ));
    }
    let size = meta.len();
    let mut hasher = Sha256::new();
    if size <= inline_max {
        let mut bytes = Vec::with_capacity(size as usize);
        use std::io::Read;
        (&file)
            .take(inline_max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| ("unreadable", e.to_string()))?;
        if bytes.len() as u64 != size {
            return Err(("changed", "its size changed during the export".to_owned()));
        }
        hasher.update(&bytes);
        return Ok(Opened {
            file: Arc::new(file),
            size,
            sha256: hex::encode(hasher.finalize()),
            inline: Some(bytes),
        });
    }
    let mut buf = vec![0u8; HASH_BUF];
    let mut at = 0u64;
    loop {
        let n = file
            .read_at(&mut buf, at)
            .map_err(|e| ("unreadable", e.to_string()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        at += n as u64;
        if at > size {
            return Err(("changed", "it grew during the export".to_owned()));
        }
    }
    if at != size {
        return Err(("changed", "its size changed during the export".to_owned()));
    }
    Ok(Opened {
        file: Arc::new(file),
        size,
        sha256: hex::encode(hasher.finalize()),
        inline: None,
    })
}

fn read_exact_at(file: &File, at: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, at)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn a_swapped_file_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, "one").unwrap();
        let m = std::fs::metadata(&p).unwrap();
        let ok = open_and_hash(&p, m.dev(), m.ino(), 1024).unwrap();
        assert_eq!(ok.sha256, hex::encode(Sha256::digest(b"one")));
        assert_eq!(ok.inline.as_deref(), Some(&b"one"[..]));
        let big = open_and_hash(&p, m.dev(), m.ino(), 2).unwrap();
        assert_eq!((big.size, big.inline.is_none()), (3, true));
        // Another file (alive at once, so another inode) renamed over it.
        std::fs::write(d.path().join("g"), "two").unwrap();
        std::fs::rename(d.path().join("g"), &p).unwrap();
        let err = open_and_hash(&p, m.dev(), m.ino(), 1024).err().unwrap();
        assert_eq!(err.0, "changed");
    }
}
