//! The uids commands run as on a BYOH host where podhost runs as root: one per session, from a
//! configured pool, so that sessions cannot touch each other's files even through metadata,
//! signals or `/proc`.
//!
//! Owns: the assignment of pool uids to workspaces ([`UidPool::assign`]).
//!
//! The record of an assignment is the owner of the workspace directory itself: a restarted
//! podhost finds each session's uid again from it, with nothing else to store; a new session
//! never takes a uid that a workspace beside its own still owns, even one the restarted podhost
//! has not met yet. A uid is free again once its workspace is gone (removed with its session).
//!
//! Invariants:
//! * Two live workspaces never share a uid.
//! * A workspace and its temporary directory belong to their uid (the gid is the same number)
//!   before any command or file tool of the session runs.
//!
//! Non-goals: names for the uids (they have none in `/etc/passwd`), pods (one session each:
//! they use one command user).

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Pool uids by workspace.
#[derive(Debug)]
pub struct UidPool {
    range: UidRange,
    assigned: Mutex<BTreeMap<PathBuf, u32>>,
}

impl UidPool {
    pub fn new(range: UidRange) -> Self {
        UidPool {
            range,
            assigned: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn range(&self) -> UidRange {
        self.range
    }

    /// The user of the workspace `root` (and its `extra` directories): the pool uid the
    /// workspace already belongs to if no other workspace holds it, else the lowest free one,
    /// which the directories are then given to (with everything in them).
    pub fn assign(&self, root: &Path, extra: &[&Path]) -> io::Result<CommandUser> {
        let mut assigned = self
            .assigned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Workspaces removed since (their sessions were swept) free their uids.
        assigned.retain(|dir, _| dir.exists());
        let owner = std::fs::symlink_metadata(root)?.uid();
        let held_elsewhere = |uid: u32| assigned.iter().any(|(d, u)| *u == uid && d != root);
        let uid = match assigned.get(root) {
            Some(uid) => *uid,
            None if self.range.contains(owner) && !held_elsewhere(owner) => owner,
            None => {
                // Besides the uids of the workspaces met since start-up, those of the other
                // workspaces beside this one: a restarted podhost has not met them all yet, and
                // each keeps the uid it owns.
                let mut used: std::collections::BTreeSet<u32> =
                    assigned.values().copied().collect();
                used.extend(sibling_owners(root).filter(|u| self.range.contains(*u)));
                (self.range.first..=self.range.last)
                    .find(|u| !used.contains(u))
                    .ok_or_else(|| {
                        io::Error::other(format!(
                            "every uid of PODHOST_UID_POOL ({}) is held by a live session; \
                             widen the pool or lower the retention",
                            self.range
                        ))
                    })?
            }
        };
        for dir in std::iter::once(root).chain(extra.iter().copied()) {
            give(dir, uid)?;
        }
        assigned.insert(root.to_path_buf(), uid);
        Ok(CommandUser { uid, gid: uid })
    }
}

impl UidPool {
    /// Gives the workspace `root` (and its `extra` directories) to `uid`, which a store shared
    /// by several replicas allocated to the session (so that no uid serves two live sessions on
    /// any replica): the pool only checks it is its own and remembers it.
    pub fn assign_given(&self, root: &Path, extra: &[&Path], uid: u32) -> io::Result<CommandUser> {
        if !self.range.contains(uid) {
            return Err(io::Error::other(format!(
                "uid {uid} is not in PODHOST_UID_POOL ({})",
                self.range
            )));
        }
        let mut assigned = self
            .assigned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        assigned.retain(|dir, _| dir.exists());
        for dir in std::iter::once(root).chain(extra.iter().copied()) {
            give(dir, uid)?;
        }
        assigned.insert(root.to_path_buf(), uid);
        Ok(CommandUser { uid, gid: uid })
    }
}

/// The owners of the directories beside `root` (the other sessions' workspaces).
fn sibling_owners(root: &Path) -> impl Iterator<Item = u32> {
    root.parent()
        .and_then(|p| std::fs::read_dir(p).ok())
        .into_iter()
        .flatten()
        .flatten()
        .filter(move |e| e.path() != root)
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_dir())
        .map(|m| m.uid())
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

    #[test]
    fn sessions_get_distinct_uids_that_survive_a_restart_and_free_with_the_workspace() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("not root: uid pool assignment (chown) not exercised");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let a = t.path().join("a");
        let b = t.path().join("b");
        let tmp_a = t.path().join("tmp-a");
        for d in [&a, &b, &tmp_a] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(a.join("f"), "x").unwrap();
        let range = UidRange {
            first: 410_000,
            last: 410_001,
        };
        let pool = UidPool::new(range);
        let ua = pool.assign(&a, &[&tmp_a]).unwrap();
        let ub = pool.assign(&b, &[]).unwrap();
        assert_eq!((ua.uid, ub.uid), (410_000, 410_001));
        assert_eq!(std::fs::metadata(a.join("f")).unwrap().uid(), 410_000);
        assert_eq!(std::fs::metadata(&tmp_a).unwrap().uid(), 410_000);
        let c = t.path().join("c");
        std::fs::create_dir(&c).unwrap();
        assert!(
            pool.assign(&c, &[])
                .unwrap_err()
                .to_string()
                .starts_with("every uid of PODHOST_UID_POOL (410000-410001) is held")
        );
        // A new podhost finds the uids again from the owners.
        let again = UidPool::new(range);
        assert_eq!(again.assign(&b, &[]).unwrap().uid, 410_001);
        assert_eq!(again.assign(&a, &[]).unwrap().uid, 410_000);
        std::fs::remove_dir_all(&b).unwrap();
        assert_eq!(again.assign(&c, &[]).unwrap().uid, 410_001);
    }

    /// A restarted podhost meets a new session before the old ones: the new one must not take
    /// the uid an old workspace still owns (the two would then share their files).
    #[test]
    fn after_a_restart_a_new_session_never_takes_an_old_sessions_uid() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("not root: uid pool assignment (chown) not exercised");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let [a, b, c] = ["a", "b", "c"].map(|n| t.path().join(n));
        for d in [&a, &b] {
            std::fs::create_dir(d).unwrap();
        }
        let range = UidRange {
            first: 411_000,
            last: 411_002,
        };
        let before = UidPool::new(range);
        assert_eq!(before.assign(&a, &[]).unwrap().uid, 411_000);
        assert_eq!(before.assign(&b, &[]).unwrap().uid, 411_001);
        let after = UidPool::new(range);
        std::fs::create_dir(&c).unwrap();
        assert_eq!(after.assign(&c, &[]).unwrap().uid, 411_002);
        assert_eq!(after.assign(&a, &[]).unwrap().uid, 411_000);
        assert_eq!(after.assign(&b, &[]).unwrap().uid, 411_001);
        let d = t.path().join("d");
        std::fs::create_dir(&d).unwrap();
        assert!(
            after
                .assign(&d, &[])
                .unwrap_err()
                .to_string()
                .starts_with("every uid of PODHOST_UID_POOL (411000-411002) is held")
        );
    }
}
