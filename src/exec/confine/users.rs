//! The uids commands run as on a BYOH host where podhost runs as root: one per session, from a
//! configured pool, so that sessions cannot touch each other's files even through metadata,
//! signals or `/proc`.
//!
//! Owns: giving a session's directories to the uid its session holds ([`UidPool::give`]), and
//! putting an idle session's directories out of every pool uid's reach ([`park`]) before its
//! uid serves another session.
//!
//! Which session holds which uid is the store's (`byoh::store`): a free list and a counter, so
//! that handing one out costs the same for the first session and the ten-thousandth. This file
//! never scans the workspaces.
//!
//! Invariants:
//! * A workspace and its temporary directory belong to their uid (the gid is the same number)
//!   before any command or file tool of the session runs.
//! * A parked workspace's directories belong to podhost's own user, mode 0700: no pool uid can
//!   enter them, whoever owns the files inside; the next [`UidPool::give`] gives everything
//!   beneath them to the session's new uid.
//!
//! Non-goals: names for the uids (they have none in `/etc/passwd`), pods (one session each:
//! they use one command user).

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::exec::protocol::CommandUser;

/// A range of uids, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl UidRange {
    pub fn contains(&self, uid: u32) -> bool {
        (self.first..=self.last).contains(&uid)
    }

    /// How many uids the range holds (never none: both ends are in it).
    pub fn count(&self) -> u64 {
        u64::from(self.last) - u64::from(self.first) + 1
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// The pool sessions' uids come from.
#[derive(Debug)]
pub struct UidPool {
    range: UidRange,
}

impl UidPool {
    pub fn new(range: UidRange) -> Self {
        UidPool { range }
    }

    pub fn range(&self) -> UidRange {
        self.range
    }

    /// Gives the workspace `root` (and its `extra` directories) to `uid`, which the store handed
    /// to the session: everything beneath them when they belonged to someone else (a parked
    /// session, or one whose uid changed).
    pub fn give(&self, root: &Path, extra: &[&Path], uid: u32) -> io::Result<CommandUser> {
        if !self.range.contains(uid) {
            return Err(io::Error::other(format!(
                "uid {uid} is not in PODHOST_UID_POOL ({})",
                self.range
            )));
        }
        for dir in std::iter::once(root).chain(extra.iter().copied()) {
            give(dir, uid)?;
        }
        Ok(CommandUser { uid, gid: uid })
    }
}

/// Puts an idle session's directories out of reach of every pool uid before the uid that owns
/// its files serves another session: each directory that exists is given to podhost's own user,
/// mode 0700 (the files inside keep their owner, behind a directory no pool uid can enter).
/// Costs one `chown` and one `chmod` a directory, whatever they hold.
pub fn park(dirs: &[&Path]) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    for dir in dirs {
        match std::fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "{} is not a directory",
                    dir.display()
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
        }
        // Mode first: from here on, not even the old owner enters.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .and_then(|()| nix::unistd::chown(*dir, Some(uid), Some(gid)).map_err(io::Error::from))
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    }
    Ok(())
}

/// Gives the workspace `root` (and everything in it) to `user` when it belongs to another: the
/// one command user of a root pod.
pub fn give_to(root: &Path, user: CommandUser) -> io::Result<()> {
    if std::fs::symlink_metadata(root)?.uid() != user.uid {
        chown_tree(root, user.uid, user.gid)?;
    }
    Ok(())
}

/// Gives `dir` (and, when it belonged to someone else, everything beneath it) to `uid`, mode
/// 0700 for the directory itself.
fn give(dir: &Path, uid: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.uid() != uid || meta.gid() != uid {
        chown_tree(dir, uid, uid)?;
    }
    if meta.mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// `lchown` of `dir` and everything beneath it (symlinks themselves, never their targets).
fn chown_tree(dir: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path)? {
                stack.push(entry?.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// A session's directories go to its uid with everything in them; parked, they belong to
    /// podhost alone (mode 0700) while the files inside keep their owner; given again to a new
    /// uid, everything beneath follows.
    #[test]
    fn a_parked_workspace_is_out_of_reach_until_given_to_its_new_uid() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("not root: uid pool ownership (chown) not exercised");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let (ws, tmp) = (t.path().join("ws"), t.path().join("tmp"));
        for d in [&ws, &tmp] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::create_dir(ws.join("sub")).unwrap();
        std::fs::write(ws.join("sub/f"), "x").unwrap();
        let pool = UidPool::new(UidRange {
            first: 410_000,
            last: 410_009,
        });
        let owner = |p: &Path| {
            let m = std::fs::symlink_metadata(p).unwrap();
            (m.uid(), m.gid(), m.mode() & 0o777)
        };
        assert_eq!(
            pool.give(&ws, &[&tmp], 410_003).unwrap(),
            CommandUser {
                uid: 410_003,
                gid: 410_003
            }
        );
        assert_eq!(owner(&ws), (410_003, 410_003, 0o700));
        assert_eq!(owner(&tmp), (410_003, 410_003, 0o700));
        assert_eq!(owner(&ws.join("sub/f")).0, 410_003);

        park(&[&ws, &tmp, &t.path().join("gone")]).unwrap();
        assert_eq!(owner(&ws), (0, 0, 0o700));
        assert_eq!(owner(&tmp), (0, 0, 0o700));
        assert_eq!(owner(&ws.join("sub/f")).0, 410_003, "the files keep theirs");

        pool.give(&ws, &[&tmp], 410_007).unwrap();
        for p in [ws.clone(), tmp.clone(), ws.join("sub"), ws.join("sub/f")] {
            assert_eq!(owner(&p).0, 410_007, "{}", p.display());
        }
        assert_eq!(
            pool.give(&ws, &[], 5).unwrap_err().to_string(),
            "uid 5 is not in PODHOST_UID_POOL (410000-410009)"
        );
    }
}
