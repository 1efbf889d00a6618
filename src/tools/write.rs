//! `write`: create or replace a whole file.
//!
//! Owns: the atomic replacement of a file that `write` and `edit` share (`replace_file`). The
//! result names the file relative to the workspace, as every tool result does.
//!
//! Invariants:
//! * A reader sees the old file or the new one, never a mix: the bytes go to a temporary file in
//!   the same directory, are flushed to disk, and the temporary file is renamed over the target.
//!   On any failure the temporary file is removed.
//! * An existing file keeps its permission bits; a new one gets 0644.
//! * A symlink inside the workspace is written through: resolution gives its target, which is
//!   replaced while the link stays. A symlink leaving the workspace was refused by resolution.
//! * Writes and edits of one file hold its lock ([`crate::floor::locks`]), so they land one after the
//!   other.
//!
//! Non-goals: keeping the owner of a file another user owns (only root could), hard links (the
//! rename gives the path a new inode), and refusing to overwrite a file the model has not read.

use std::fs::{File, OpenOptions, Permissions};
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{ToolOutcome, Toolbox, codes, read};
use crate::floor::workspace::{self as paths, Access, Resolved};

/// The permission bits of a file `write` creates.
pub const NEW_FILE_MODE: u32 = 0o644;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WriteInput {
    pub path: String,
    pub content: String,
}

pub fn write(tb: &Toolbox, input: WriteInput, cancel: &CancellationToken) -> ToolOutcome {
    let resolved = match tb.workspace().resolve(&input.path, Access::Write) {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    let guard = tb.locks().lock(&resolved.host);
    guard.with(|| {
        if cancel.is_cancelled() {
            return ToolOutcome::failed(
                codes::CANCELLED,
                "The write was cancelled; nothing was written.",
            );
        }
        let shown = tb.workspace().relative(&resolved.display);
        write_locked(&resolved, &shown, input.content.as_bytes())
    })
}

/// Writes the file; `shown` is its path as the result names it (relative to the workspace).
fn write_locked(resolved: &Resolved, shown: &str, content: &[u8]) -> ToolOutcome {
    let display = &resolved.display;
    let mode = match std::fs::symlink_metadata(&resolved.host) {
        Ok(meta) if meta.is_file() => meta.permissions().mode() & 0o7777,
        Ok(meta) if meta.is_dir() => {
            return ToolOutcome::failed(
                codes::NOT_A_FILE,
                format!("{display} is a directory; write needs the path of a file."),
            );
        }
        Ok(meta) => return read::not_a_file(display, paths::file_kind(&meta.file_type())),
        // Missing, or under a component that is not a directory: creating the parents reports it.
        Err(_) => NEW_FILE_MODE,
    };
    if let Some(parent) = resolved.host.parent()
        && let Err(e) = std::fs::create_dir_all(parent)
    {
        let dir = Path::new(display)
            .parent()
            .map_or_else(|| display.clone(), paths::lossy);
        let hint = if e.kind() == io::ErrorKind::AlreadyExists {
            "; a file of that name is in the way"
        } else {
            ""
        };
        return ToolOutcome::failed(
            codes::WRITE_FAILED,
            format!("Could not create the directory {dir}: {e}{hint}."),
        );
    }
    match replace_file(&resolved.host, content, mode) {
        Ok(()) => ToolOutcome::completed(json!({"path": shown, "bytes": content.len()})),
        Err(e) => write_failed(display, &e),
    }
}

/// The failure of writing `display`, with the OS error.
pub(crate) fn write_failed(display: &str, e: &io::Error) -> ToolOutcome {
    // The session's own disk is full: the kernel holds its quota.
    if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) {
        return ToolOutcome::failed(
            codes::QUOTA_EXCEEDED,
            format!(
                "Could not write {display}: the session's disk is full (its quota). Delete \
                 files (with bash) before writing more."
            ),
        );
    }
    ToolOutcome::failed(
        codes::WRITE_FAILED,
        format!("Could not write {display}: {e}"),
    )
}

/// Replaces the file at `host` with `bytes` atomically, giving it permission bits `mode`. The
/// directory must exist. The caller holds the file's lock.
pub(crate) fn replace_file(host: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = host.parent().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path has no parent directory",
        )
    })?;
    let temp = TempFile::create(dir)?;
    let mut file = &temp.file;
    file.write_all(bytes)?;
    // fchmod, not the open mode: the umask must not change what an existing file had.
    file.set_permissions(Permissions::from_mode(mode))?;
    file.sync_all()?;
    std::fs::rename(&temp.path, host)?;
    temp.keep();
    // Make the rename itself durable. The new content is in place either way, so a directory
    // that cannot be synced is not a failed write.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// A temporary file next to its target, removed on drop unless kept.
struct TempFile {
    path: PathBuf,
    file: File,
    kept: bool,
}

impl TempFile {
    fn create(dir: &Path) -> io::Result<Self> {
        // A short name: the target's name may already be near the file system's limit.
        let path = dir.join(format!(".podhost-{:016x}.tmp", unguessable()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)?;
        Ok(TempFile {
            path,
            file,
            kept: false,
        })
    }

    fn keep(mut self) {
        self.kept = true;
    }
}

/// 64 bits nobody can predict, for a temporary file's name: from the keys std draws for its
/// hash tables (the `getrandom` system call, made directly), so that naming a file needs no
/// random-number crate, whose fallback to opening `/dev/urandom` the file tools' Landlock domain
/// refuses. `create_new` refuses a name that exists either way.
fn unguessable() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::process::id())
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn temporary_names_differ_call_to_call_and_thread_to_thread() {
        let here: Vec<u64> = (0..100).map(|_| unguessable()).collect();
        let there = std::thread::spawn(|| (0..100).map(|_| unguessable()).collect::<Vec<_>>())
            .join()
            .unwrap();
        let all: std::collections::HashSet<u64> = here.iter().chain(&there).copied().collect();
        assert_eq!(all.len(), 200);
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_failed_rename_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("target")).unwrap();
        std::fs::write(dir.path().join("target/inside"), "x").unwrap();
        // Renaming a file over a non-empty directory fails after the temporary file was written.
        let e = replace_file(&dir.path().join("target"), b"new", 0o644).unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::EISDIR) | Some(libc::ENOTEMPTY)),
            "{e}"
        );
        assert_eq!(names(dir.path()), vec!["target"]);
    }

    #[test]
    fn replace_sets_the_mode_exactly_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        replace_file(&path, b"one", 0o4755).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(
            (std::fs::read(&path).unwrap(), mode),
            (b"one".to_vec(), 0o4755)
        );
        assert_eq!(names(dir.path()), vec!["f"]);
    }
}
