//! The modes of podhost's own state, checked at use and repaired.
//!
//! Landlock has no right for `chmod`, so where commands run as podhost's own uid and outside a
//! mount namespace (the Landlock-only level), a command can still change the mode of a file it
//! cannot open: `chmod 777` on the data directory opens every session to other local users,
//! `chmod 000` breaks the next turn. podhost therefore checks the modes of its state when it
//! uses it — at start-up, at each submission, after each command — and puts them back, with a
//! warning; where it cannot (the owner changed, a read-only file system), it fails with the
//! reason.
//!
//! Owns: [`Guard`] (a path and the mode bits it must and must not have) and [`check`].
//!
//! Non-goals: paths that are not podhost's own (`PODHOST_CONFINE_DENY` paths are left alone),
//! ownership repairs (commands never get the capability to `chown`).

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// One state path and its mode rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guard {
    pub path: PathBuf,
    /// Bits that must be set (the owner's access).
    pub want: u32,
    /// Bits that must be clear.
    pub deny: u32,
    /// Apply the file rule to the regular files directly in this directory too.
    pub files: Option<(u32, u32)>,
}

impl Guard {
    /// A private directory: `mode` exactly (0700, or 0711 where other uids must pass through to
    /// their own workspaces), its direct files 0600.
    pub fn private_dir(path: &Path, mode: u32) -> Self {
        Guard {
            path: path.to_path_buf(),
            want: mode,
            deny: 0o777 & !mode,
            files: Some((0o600, 0o177)),
        }
    }

    /// A private file: readable and writable by its owner, nothing for anyone else.
    pub fn private_file(path: &Path) -> Self {
        Guard {
            path: path.to_path_buf(),
            want: 0o600,
            deny: 0o077,
            files: None,
        }
    }

    /// A directory the owner must be able to use and no one else may write.
    pub fn owned_dir(path: &Path) -> Self {
        Guard {
            path: path.to_path_buf(),
            want: 0o700,
            deny: 0o022,
            files: None,
        }
    }
}

/// A mode put back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Repaired {
    pub path: PathBuf,
    pub was: u32,
    pub now: u32,
}

/// Why a guarded path could not be checked or put back; each names the path.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Its metadata could not be read.
    #[error("{}: {source}", .path.display())]
    Unreadable { path: PathBuf, source: io::Error },
    #[error(
        "{} has been replaced by a symbolic link; podhost's state is not safe",
        .path.display()
    )]
    Symlink { path: PathBuf },
    /// Owned by another uid than podhost's (`me`), which may not change its mode.
    #[error(
        "{} has mode {was:o} and belongs to uid {uid}, not to podhost's uid {me}: it cannot be \
         put back to {now:o}",
        .path.display()
    )]
    NotOurs {
        path: PathBuf,
        was: u32,
        now: u32,
        uid: u32,
        me: u32,
    },
    /// `chmod` failed.
    #[error(
        "{} has mode {was:o} and could not be put back to {now:o}: {source}",
        .path.display()
    )]
    NotPutBack {
        path: PathBuf,
        was: u32,
        now: u32,
        source: io::Error,
    },
}

/// Checks every guarded path (one that does not exist is skipped) and repairs what was
/// changed, with a warning for each. `Err` names the first path that could not be repaired.
pub fn check(guards: &[Guard]) -> Result<Vec<Repaired>, StateError> {
    let repaired = check_quietly(guards)?;
    for r in &repaired {
        tracing::warn!(
            path = %r.path.display(),
            was = format!("{:o}", r.was),
            now = format!("{:o}", r.now),
            "the mode of podhost's state had been changed; put back"
        );
    }
    Ok(repaired)
}

/// [`check`] without the warnings: for state podhost has just created.
pub fn check_quietly(guards: &[Guard]) -> Result<Vec<Repaired>, StateError> {
    let mut repaired = Vec::new();
    let me = nix::unistd::geteuid().as_raw();
    for g in guards {
        fix(&g.path, g.want, g.deny, me, &mut repaired)?;
        if let Some((want, deny)) = g.files
            && let Ok(entries) = std::fs::read_dir(&g.path)
        {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_file()) {
                    fix(&entry.path(), want, deny, me, &mut repaired)?;
                }
            }
        }
    }
    Ok(repaired)
}

fn fix(
    path: &Path,
    want: u32,
    deny: u32,
    me: u32,
    out: &mut Vec<Repaired>,
) -> Result<(), StateError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(StateError::Unreadable {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    if meta.file_type().is_symlink() {
        return Err(StateError::Symlink {
            path: path.to_path_buf(),
        });
    }
    let was = meta.mode() & 0o7777;
    let now = (was | want) & !deny & !0o7000;
    if now == was {
        return Ok(());
    }
    if meta.uid() != me && me != 0 {
        return Err(StateError::NotOurs {
            path: path.to_path_buf(),
            was,
            now,
            uid: meta.uid(),
            me,
        });
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(now)).map_err(|source| {
        StateError::NotPutBack {
            path: path.to_path_buf(),
            was,
            now,
            source,
        }
    })?;
    out.push(Repaired {
        path: path.to_path_buf(),
        was,
        now,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn changed_modes_are_put_back() {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("db"), "x").unwrap();
        let set = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
        };
        set(&data, 0o777);
        set(&data.join("db"), 0o000);
        let guards = [Guard::private_dir(&data, 0o700)];
        let repaired = check(&guards).unwrap();
        assert_eq!(
            repaired,
            vec![
                Repaired {
                    path: data.clone(),
                    was: 0o777,
                    now: 0o700
                },
                Repaired {
                    path: data.join("db"),
                    was: 0,
                    now: 0o600
                },
            ]
        );
        assert_eq!(check(&guards).unwrap(), vec![]);
        std::fs::remove_file(data.join("db")).unwrap();
        std::os::unix::fs::symlink("/etc", data.join("db")).unwrap();
        let link = [Guard::private_file(&data.join("db"))];
        assert_eq!(
            check(&link).unwrap_err().to_string(),
            format!(
                "{} has been replaced by a symbolic link; podhost's state is not safe",
                data.join("db").display()
            )
        );
    }
}
