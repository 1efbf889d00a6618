//! A workspace template: a directory whose files every new session's workspace starts with:
//! seen through an overlay mount in the session's view (see `exec::overlay`), or copied in once
//! when the workspace is made.
//!
//! Owns: how a template reaches a workspace (its [`Level`]: an overlay where sessions have a
//! view and the kernel mounts one, else a copy-on-write clone of each file, `FICLONE`, where the
//! file system shares extents — btrfs, xfs —, else a plain copy), the clone level found once at
//! start by cloning one file of the template into the data directory; and the copy itself.
//!
//! Invariants:
//! * The template is only read: nothing is written, touched or followed in it.
//! * A copy holds the template's regular files, directories and symbolic links (copied as
//!   links, never followed), with their modes (less set-user-ID and set-group-ID) and
//!   modification times; other files (devices,
//!   sockets, fifos) are left out, each said in a debug log.
//! * A copy is whole or absent: it is made in a directory of its own that the caller renames
//!   into place.
//!
//! Non-goals: ownership (the copy belongs to podhost's user; the sandbox gives a workspace to
//! its session's user as it does any other), extended attributes, hard links (each link is a
//! file of its own in the copy).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::AT_FDCWD;
use nix::sys::stat::{UtimensatFlags, utimensat};
use nix::sys::time::TimeSpec;

/// The mode bits a copy keeps: permissions and the sticky bit; set-user-ID and set-group-ID
/// are dropped (a session's files never raise privileges).
const KEPT_MODE: u32 = 0o1777;

/// How a template reaches a new workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Nothing copied: the workspace is an overlay of the template in the session's view, the
    /// session's own directory its upper layer (see `exec::overlay`).
    Overlay,
    /// Each regular file cloned (`FICLONE`): its blocks shared until either side writes.
    Reflink,
    /// Each regular file copied byte by byte.
    Copy,
}

impl Level {
    /// The level's name, as `/healthz` and the logs say it.
    pub fn name(self) -> &'static str {
        match self {
            Level::Overlay => "overlay",
            Level::Reflink => "reflink",
            Level::Copy => "copy",
        }
    }

    /// The level named `name` (`overlay`, `reflink`, `copy`).
    pub fn parse(name: &str) -> Option<Level> {
        match name {
            "overlay" => Some(Level::Overlay),
            "reflink" => Some(Level::Reflink),
            "copy" => Some(Level::Copy),
            _ => None,
        }
    }
}

/// A template and how it is copied.
#[derive(Clone, Debug)]
pub struct Template {
    /// The template directory (absolute, links resolved).
    pub dir: PathBuf,
    /// How it is copied.
    pub level: Level,
}

/// The level this host gives `template` when copied into `dir`: [`Level::Reflink`] when a
/// clone of the template's first regular file into `dir` succeeds, else [`Level::Copy`] (a
/// template without a regular file has nothing to clone: `Copy`). The clone is removed.
pub fn detect(template: &Path, dir: &Path) -> Level {
    let Some(file) = first_file(template) else {
        return Level::Copy;
    };
    let trial = dir.join(format!(".template-clone-{}", std::process::id()));
    let cloned = File::open(&file).and_then(|src| {
        let dst = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&trial)?;
        clone(&src, &dst)
    });
    let _ = std::fs::remove_file(&trial);
    match cloned {
        Ok(()) => Level::Reflink,
        Err(e) => {
            tracing::debug!(error = %e, "the data directory cannot clone the template's files");
            Level::Copy
        }
    }
}

/// The first regular file under `dir`, depth first; `None` when it holds none.
fn first_file(dir: &Path) -> Option<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.filter_map(Result::ok) {
            match entry.file_type() {
                Ok(t) if t.is_file() => return Some(entry.path()),
                Ok(t) if t.is_dir() => stack.push(entry.path()),
                _ => {}
            }
        }
    }
    None
}

/// Copies `template` into `dst`, a directory that must not exist yet, at `level` (an overlay's
/// template is copied as [`Level::Copy`] would).
pub fn copy_tree(template: &Template, dst: &Path) -> io::Result<()> {
    copy_dir(&template.dir, dst, template.level)
}

/// Copies the directory `src` to `dst` (made here), then its mode and times: after its
/// entries, whose making changed its times.
fn copy_dir(src: &Path, dst: &Path, level: Level) -> io::Result<()> {
    let meta = std::fs::symlink_metadata(src)?;
    std::fs::create_dir(dst)?;
    // Writable by podhost while it fills it; the template's mode is put back afterwards.
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let (from, to) = (entry.path(), dst.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_dir(&from, &to, level)?;
        } else if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
            set_times(&to, &std::fs::symlink_metadata(&from)?)?;
        } else if kind.is_file() {
            copy_file(&from, &to, level)?;
        } else {
            tracing::debug!(path = %from.display(), "a template's special file is not copied");
        }
    }
    std::fs::set_permissions(
        dst,
        std::fs::Permissions::from_mode(meta.mode() & KEPT_MODE),
    )?;
    set_times(dst, &meta)
}

/// Copies the regular file `src` to `dst` (cloned at [`Level::Reflink`]), with its mode and
/// times.
fn copy_file(src: &Path, dst: &Path, level: Level) -> io::Result<()> {
    let from = File::open(src)?;
    let meta = from.metadata()?;
    let to = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dst)?;
    match level {
        Level::Reflink => clone(&from, &to)?,
        Level::Copy | Level::Overlay => {
            io::copy(&mut &from, &mut &to)?;
        }
    }
    to.set_permissions(std::fs::Permissions::from_mode(meta.mode() & KEPT_MODE))?;
    drop(to);
    set_times(dst, &meta)
}

/// Sets the access and modification times of `path` (a link itself, never its target) to
/// those of `meta`.
fn set_times(path: &Path, meta: &std::fs::Metadata) -> io::Result<()> {
    let atime = TimeSpec::new(meta.atime(), meta.atime_nsec());
    let mtime = TimeSpec::new(meta.mtime(), meta.mtime_nsec());
    utimensat(
        AT_FDCWD,
        path,
        &atime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(io::Error::from)
}

/// Makes `dst` share the blocks of `src` (`FICLONE`); fails where the file system cannot.
#[allow(unsafe_code)]
fn clone(src: &File, dst: &File) -> io::Result<()> {
    // SAFETY: both descriptors are open for the duration of the call (borrowed `File`s); the
    // ioctl takes the source descriptor by value and writes no memory of ours.
    let rc = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// Every entry under `dir`: its relative path, kind, mode, mtime and contents (a link's
    /// target).
    fn tree(dir: &Path) -> Vec<(String, String, u32, i64, i64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                let m = std::fs::symlink_metadata(&p).unwrap();
                let (kind, body) = if m.is_symlink() {
                    (
                        "link",
                        std::fs::read_link(&p)
                            .unwrap()
                            .into_os_string()
                            .into_encoded_bytes(),
                    )
                } else if m.is_dir() {
                    stack.push(p.clone());
                    ("dir", Vec::new())
                } else if m.is_file() {
                    ("file", std::fs::read(&p).unwrap())
                } else {
                    ("special", Vec::new())
                };
                let rel = p.strip_prefix(dir).unwrap().display().to_string();
                out.push((rel, kind.into(), m.mode(), m.mtime(), m.mtime_nsec(), body));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn a_copy_holds_files_dirs_and_links_with_modes_and_times_and_leaves_out_fifos() {
        let t = tempfile::tempdir().unwrap();
        let src = t.path().join("tmpl");
        std::fs::create_dir_all(src.join("sub/deep")).unwrap();
        std::fs::write(src.join("a.txt"), "a").unwrap();
        std::fs::write(src.join("sub/run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(src.join("sub/run.sh"), PermissionsExt::from_mode(0o751)).unwrap();
        std::fs::set_permissions(src.join("sub/deep"), PermissionsExt::from_mode(0o750)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.join("out")).unwrap();
        std::os::unix::fs::symlink("a.txt", src.join("sub/in")).unwrap();
        nix::unistd::mkfifo(&src.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let old = TimeSpec::new(1_000_000_000, 5);
        utimensat(
            AT_FDCWD,
            &src.join("a.txt"),
            &old,
            &old,
            UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
        utimensat(
            AT_FDCWD,
            &src.join("sub"),
            &old,
            &old,
            UtimensatFlags::NoFollowSymlink,
        )
        .unwrap();
        let before = tree(&src);
        for (i, level) in [Level::Copy, detect(&src, t.path())]
            .into_iter()
            .enumerate()
        {
            let dst = t.path().join(format!("ws-{i}"));
            copy_tree(
                &Template {
                    dir: src.clone(),
                    level,
                },
                &dst,
            )
            .unwrap();
            let mut want = before.clone();
            want.retain(|e| e.0 != "fifo");
            assert_eq!(tree(&dst), want, "{level:?}");
            assert_eq!(
                std::fs::metadata(&dst).unwrap().mode(),
                std::fs::metadata(&src).unwrap().mode()
            );
        }
        assert_eq!(tree(&src), before, "the template is unchanged");
    }

    #[test]
    fn a_copy_into_a_directory_that_exists_fails() {
        let t = tempfile::tempdir().unwrap();
        let template = Template {
            dir: t.path().to_path_buf(),
            level: Level::Copy,
        };
        let err = copy_tree(&template, t.path()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn levels_parse_their_names() {
        for l in [Level::Copy, Level::Reflink, Level::Overlay] {
            assert_eq!(Level::parse(l.name()), Some(l));
        }
        assert_eq!(Level::parse("union"), None);
    }
}
