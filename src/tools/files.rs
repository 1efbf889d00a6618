//! Direct file operations of the fronts — core's byte reads and listings (`workspace.read`),
//! the setup's files, emptying the workspace (`workspace.remove`) — outside a model's tool
//! call, with the file tools' path rules and confinement.
//!
//! Invariants:
//! * Every path goes through [`Workspace::resolve`] and every operation runs on a thread
//!   confined like a file tool's ([`Toolbox::confined`]); a listing never follows a symlink.
//! * Byte reads and listings never wait for a command: core may read while a 600 s `bash`
//!   runs. Emptying the workspace waits for the running command and holds commands off.
//! * A replaced file is written atomically under the file's lock, with the directory synced,
//!   like the `write` tool's.
//!
//! Non-goals: the wire shapes (the pod's `workspace` module maps these results onto them).

use std::io::Read;
use std::path::Path;

use tokio_util::sync::CancellationToken;

use super::{ToolError, ToolOutcome, Toolbox, codes, write};
use crate::floor::workspace::{Access, OpenError, Workspace, open_regular};

/// What a byte read found.
#[derive(Clone, Debug, PartialEq)]
pub enum FileRead {
    /// The whole file.
    Bytes(Vec<u8>),
    /// Nothing is at the path.
    Missing,
    /// The path was refused or the file could not be read: an outcome for the caller.
    Failed(ToolOutcome),
}

/// One regular file of a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedFile {
    /// Relative to the listed directory, `/`-separated.
    pub path: String,
    pub size: u64,
}

/// What a listing found.
#[derive(Clone, Debug, PartialEq)]
pub enum Listing {
    /// The regular files under the directory in path order, and whether there were more.
    Listed {
        entries: Vec<ListedFile>,
        truncated: bool,
    },
    /// The path is missing, or not a directory.
    Missing,
    Failed(ToolOutcome),
}

impl Toolbox {
    /// Reads the whole file at `path` if it holds at most `max_bytes`.
    pub async fn read_bytes(&self, path: &str, max_bytes: u64) -> Result<FileRead, ToolError> {
        let ws = self.workspace().clone();
        let path = path.to_owned();
        self.confined("read-bytes", &[], move || read_bytes(&ws, &path, max_bytes))
            .await
    }

    /// Lists the regular files under `dir` (symlinks skipped, not followed), at most
    /// `max_entries`.
    pub async fn list_files(
        &self,
        dir: &str,
        max_entries: u64,
        cancel: &CancellationToken,
    ) -> Result<Listing, ToolError> {
        let ws = self.workspace().clone();
        let dir = dir.to_owned();
        let cancel = cancel.clone();
        self.confined("list", &[], move || {
            list_files(&ws, &dir, max_entries, &cancel)
        })
        .await
    }

    /// Replaces the file at `path` with `bytes` (creating its directories), with permission
    /// bits `mode` (0644 when `None`); `Err(message)` when the path is refused or the write
    /// failed.
    pub async fn replace_file(
        &self,
        path: &str,
        bytes: Vec<u8>,
        mode: Option<u32>,
    ) -> Result<Result<(), String>, ToolError> {
        let this = self.clone();
        let path = path.to_owned();
        self.confined("replace", &[], move || {
            let resolved = this
                .workspace()
                .resolve(&path, Access::Write)
                .map_err(|e| e.to_string())?;
            let on_err = |e: std::io::Error| format!("{}: {e}", resolved.display);
            let parent = resolved
                .host
                .parent()
                .ok_or_else(|| format!("{} has no directory", resolved.display))?;
            std::fs::create_dir_all(parent).map_err(on_err)?;
            this.locks()
                .lock(&resolved.host)
                .with(|| write::replace_file(&resolved.host, &bytes, mode.unwrap_or(0o644)))
                .map_err(on_err)
        })
        .await
    }

    /// Deletes everything inside the workspace root (not the root: in a pod it is a mount),
    /// with no command running; symlinks are removed, never followed. `Ok(None)` when `cancel`
    /// fired before the running command ended.
    pub async fn empty_workspace(
        &self,
        cancel: &CancellationToken,
    ) -> Result<Option<std::io::Result<()>>, ToolError> {
        let root = self.workspace().root().to_path_buf();
        let emptied = self
            .without_commands(
                cancel,
                self.confined("empty", &[], move || empty_dir(&root)),
            )
            .await;
        emptied.transpose()
    }
}

fn failed(code: &str, message: String) -> FileRead {
    FileRead::Failed(ToolOutcome::failed(code, message))
}

/// [`Toolbox::read_bytes`] on the calling thread: the path rules only, so a caller outside a
/// toolbox (the viewer) runs it on a confined thread of its own
/// ([`ToolboxBuilder::confined_reader`](super::ToolboxBuilder::confined_reader)): a path
/// swapped for a symlink between the check and the open is then refused by the thread's rules.
pub(crate) fn read_bytes(ws: &Workspace, path: &str, max_bytes: u64) -> FileRead {
    let resolved = match ws.resolve(path, Access::Read) {
        Ok(r) => r,
        Err(e) => return FileRead::Failed(e.into()),
    };
    let display = resolved.display.clone();
    let mut file = match open_regular(&resolved.host) {
        Ok(f) => f,
        Err(OpenError::NotFound) => return FileRead::Missing,
        Err(OpenError::NotAFile(what)) => {
            return failed(
                codes::NOT_A_FILE,
                format!("{display} is {what}, not a file."),
            );
        }
        Err(OpenError::Symlink) => {
            return failed(
                codes::PATH_DENIED,
                format!("{display} became a symbolic link while it was read."),
            );
        }
        Err(OpenError::Io(e)) => return failed(codes::ERROR, format!("{display}: {e}")),
    };
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let too_large = |n: u64| {
        failed(
            codes::TOO_LARGE,
            format!("{display} is {n} bytes, past maxBytes {max_bytes}."),
        )
    };
    if size > max_bytes {
        return too_large(size);
    }
    // The file may grow while it is read: read at most one byte past the limit to see it.
    let mut bytes = Vec::with_capacity(size as usize);
    if let Err(e) = (&mut file)
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
    {
        return failed(codes::ERROR, format!("{display}: {e}"));
    }
    if bytes.len() as u64 > max_bytes {
        return too_large(bytes.len() as u64);
    }
    FileRead::Bytes(bytes)
}

/// [`Toolbox::list_files`] on the calling thread (see [`read_bytes`]).
pub(crate) fn list_files(
    ws: &Workspace,
    dir: &str,
    max_entries: u64,
    cancel: &CancellationToken,
) -> Listing {
    let resolved = match ws.resolve(dir, Access::Read) {
        Ok(r) => r,
        Err(e) => return Listing::Failed(e.into()),
    };
    match std::fs::symlink_metadata(&resolved.host) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Listing::Missing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Listing::Missing,
        Err(e) => {
            return Listing::Failed(ToolOutcome::failed(
                codes::ERROR,
                format!("{}: {e}", resolved.display),
            ));
        }
    }
    let mut entries = Vec::new();
    let mut truncated = false;
    // Depth-first with each directory's names sorted (as JavaScript sorts them, by UTF-16 code
    // units), so the listing comes out in path order. An explicit stack: no recursion depth limit.
    let mut stack = vec![(
        String::new(),
        sorted_entries(&resolved.host),
        resolved.host.clone(),
    )];
    while let Some((rel, items, host)) = stack.last_mut() {
        if cancel.is_cancelled() {
            return Listing::Failed(ToolOutcome::failed(
                codes::CANCELLED,
                "The listing was cancelled.",
            ));
        }
        let Some((name, ft, size)) = items.next() else {
            stack.pop();
            continue;
        };
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        if ft.is_file() {
            if entries.len() as u64 >= max_entries {
                truncated = true;
                break;
            }
            entries.push(ListedFile { path, size });
        } else if ft.is_dir() {
            let sub = host.join(&name);
            let items = sorted_entries(&sub);
            stack.push((path, items, sub));
        }
        // Symlinks, FIFOs, sockets and devices are skipped.
    }
    Listing::Listed { entries, truncated }
}

/// A directory's entries (name, type without following symlinks, size of regular files),
/// sorted. A directory that vanished or cannot be read lists as empty, like a racing delete.
fn sorted_entries(dir: &Path) -> std::vec::IntoIter<(String, std::fs::FileType, u64)> {
    let mut names: Vec<(String, std::fs::FileType, u64)> = match std::fs::read_dir(dir) {
        Ok(read) => read
            .filter_map(Result::ok)
            .filter_map(|e| {
                let ft = e.file_type().ok()?;
                let size = if ft.is_file() {
                    e.metadata().map(|m| m.len()).unwrap_or(0)
                } else {
                    0
                };
                Some((e.file_name().to_string_lossy().into_owned(), ft, size))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    names.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    names.into_iter()
}

/// Deletes everything inside `root`. Symlinks are removed, never followed.
fn empty_dir(root: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}
