//! An idle session's disk of its own, read in user space: the image file parsed read-only
//! (`ext4-view`), never mounted.
//!
//! Owns: listing the workspace of an image ([`list`]) and reading one file of it ([`read`]).
//!
//! Invariants: nothing is mounted and nothing is written: a turn another replica starts while
//! the page reads mounts the disk alone (a second mount beside it would corrupt it). The
//! workspace's rules hold inside the image as on the host: a listing never follows a symbolic
//! link and names regular files only (an overlay's whiteouts, devices, fifos and sockets are
//! left out); a read refuses a path any component of which is a symbolic link, or that is not
//! a regular file; at most `max` entries are listed and `max` bytes read. The walk goes at most
//! [`MAX_DEPTH`] directories deep. What the image holds is data to podhost, parsed by a reader
//! that answers a damaged structure with an error (an image written while it is read can look
//! damaged): the page says the disk could not be read.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path};

use ext4_view::{Ext4, Ext4Error, FileType};

use crate::tools::files::ListedFile;

/// Where the workspace lies in a session's image (see `exec::disk`).
const WORKSPACE: &str = "/ws";
/// Directories a listing descends at most.
pub const MAX_DEPTH: usize = 64;

/// The file system of the image at `image`, opened read-only.
pub fn open(image: &Path) -> Result<Ext4, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(image)
        .map_err(|e| e.to_string())?;
    Ext4::load(Box::new(file)).map_err(|e| e.to_string())
}

/// The regular files of the image's workspace in path order, at most `max`, and whether there
/// were more.
pub fn list(fs: &Ext4, max: u64) -> Result<(Vec<ListedFile>, bool), String> {
    let mut found = Walk {
        fs,
        max,
        files: Vec::new(),
        truncated: false,
    };
    found.dir(WORKSPACE, "", 0)?;
    let Walk {
        mut files,
        truncated,
        ..
    } = found;
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((files, truncated))
}

struct Walk<'a> {
    fs: &'a Ext4,
    max: u64,
    files: Vec<ListedFile>,
    truncated: bool,
}

impl Walk<'_> {
    fn dir(&mut self, at: &str, rel: &str, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            self.truncated = true;
            return Ok(());
        }
        let mut entries: Vec<(String, FileType, u64)> = Vec::new();
        for entry in self.fs.read_dir(at).map_err(|e| e.to_string())? {
            let entry = entry.map_err(|e| e.to_string())?;
            // A name that is not UTF-8 has no path the page can link to.
            let Ok(name) = entry.file_name().as_str().map(str::to_owned) else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let kind = entry.file_type().map_err(|e| e.to_string())?;
            let size = if kind.is_regular_file() {
                entry.metadata().map_err(|e| e.to_string())?.len()
            } else {
                0
            };
            entries.push((name, kind, size));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, kind, size) in entries {
            if self.files.len() as u64 >= self.max {
                self.truncated = true;
                return Ok(());
            }
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            if kind.is_dir() {
                self.dir(&format!("{at}/{name}"), &path, depth + 1)?;
            } else if kind.is_regular_file() {
                self.files.push(ListedFile { path, size });
            }
        }
        Ok(())
    }
}

/// What a read of one file found.
#[derive(Debug, PartialEq)]
pub enum ImageRead {
    Bytes(Vec<u8>),
    Missing,
    /// Why the file is not shown.
    Refused(String),
}

/// The file at `rel` (relative to the workspace, already through its path rules), at most
/// `max` bytes.
pub fn read(fs: &Ext4, rel: &Path, max: u64) -> Result<ImageRead, String> {
    let mut at = String::from(WORKSPACE);
    for part in rel.components() {
        let Component::Normal(part) = part else {
            return Ok(ImageRead::Refused("the path is not a plain path".into()));
        };
        let Some(part) = part.to_str() else {
            return Ok(ImageRead::Refused("the path is not UTF-8".into()));
        };
        at.push('/');
        at.push_str(part);
        // Each component, before the next is looked up under it: none may be a link.
        match fs.symlink_metadata(at.as_str()) {
            Ok(m) if m.is_symlink() => {
                return Ok(ImageRead::Refused("it is a symbolic link".into()));
            }
            Ok(_) => {}
            Err(Ext4Error::NotFound | Ext4Error::NotADirectory) => return Ok(ImageRead::Missing),
            Err(e) => return Err(e.to_string()),
        }
    }
    let meta = fs
        .symlink_metadata(at.as_str())
        .map_err(|e| e.to_string())?;
    if !meta.file_type().is_regular_file() {
        return Ok(ImageRead::Refused("it is not a file".into()));
    }
    if meta.len() > max {
        return Ok(ImageRead::Refused(format!(
            "it is {} bytes, past the {max} shown",
            meta.len()
        )));
    }
    let file = fs.open(at.as_str()).map_err(|e| e.to_string())?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    Ok(ImageRead::Bytes(bytes))
}
