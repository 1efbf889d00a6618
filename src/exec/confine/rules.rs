//! Landlock rules from a policy: each grant split around the hidden paths beneath it
//! ([`expand`]), opened without following symlinks, and made into a ruleset ([`ruleset`]), for a
//! command (applied by [`Prepared`](super::Prepared)) or a file tool's thread
//! ([`restrict_thread`]).
//!
//! Invariants: see the parent module (a symlink never carries a grant onto a hidden path; a
//! ruleset that cannot be built or enforced is an error, never a weaker sandbox).

use std::collections::HashSet;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetStatus, Scope,
};

use super::{ConfineError, MAX_RULES, TARGET_ABI};
use crate::exec::protocol::Landlock;

/// What a rule allows beneath its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Grant {
    /// Open and list directories only (a split directory above names-visible hidden paths).
    List,
    /// Read, list, execute.
    Read,
    /// Everything.
    Write,
}

/// One Landlock rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub path: PathBuf,
    pub grant: Grant,
}

/// The rules of `spec`: each grant, split around the hidden paths beneath it.
pub fn expand(spec: &Landlock) -> Result<Vec<Rule>, ConfineError> {
    let mut x = Expander {
        hidden: &spec.hidden,
        names_visible: &spec.names_visible,
        out: Vec::new(),
        split: HashSet::new(),
    };
    for (paths, grant) in [(&spec.read, Grant::Read), (&spec.write, Grant::Write)] {
        for p in paths {
            x.grant(p, grant, true)?;
        }
    }
    Ok(x.out)
}

struct Expander<'a> {
    hidden: &'a [PathBuf],
    names_visible: &'a [PathBuf],
    out: Vec<Rule>,
    /// Directories already split (for each grant), so a symlink loop ends.
    split: HashSet<(PathBuf, Grant)>,
}

impl Expander<'_> {
    /// Grants `path`. An `explicit` grant (from the policy) beneath a hidden path is an
    /// exception and stays; a derived one (a symlink's target) is dropped.
    fn grant(&mut self, path: &Path, grant: Grant, explicit: bool) -> Result<(), ConfineError> {
        let hidden_at_or_above = |h: &PathBuf| h == path || (!explicit && path.starts_with(h));
        if self.hidden.iter().any(hidden_at_or_above) {
            return Ok(());
        }
        let below: Vec<&PathBuf> = self
            .hidden
            .iter()
            .filter(|h| h.starts_with(path) && h.as_path() != path)
            .collect();
        if below.is_empty() {
            return self.push(path, grant);
        }
        if !self.split.insert((path.to_path_buf(), grant)) {
            return Ok(());
        }
        if below.iter().all(|h| self.names_visible.contains(h)) {
            self.push(path, Grant::List)?;
        }
        // A directory that cannot be listed gets no rule: nothing beneath it is granted.
        let Ok(entries) = fs::read_dir(path) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let child = path.join(entry.file_name());
            if below.iter().any(|h| **h == child) {
                continue;
            }
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_symlink() {
                // A rule on a symlink lands on its target: grant the target, as itself.
                if let Ok(target) = fs::canonicalize(&child) {
                    self.grant(&target, grant, false)?;
                }
            } else if below.iter().any(|h| h.starts_with(&child)) {
                self.grant(&child, grant, false)?;
            } else {
                self.push(&child, grant)?;
            }
        }
        Ok(())
    }

    fn push(&mut self, path: &Path, grant: Grant) -> Result<(), ConfineError> {
        if self.out.len() >= MAX_RULES {
            return Err(ConfineError::TooManyRules(
                path.parent().unwrap_or(path).to_path_buf(),
            ));
        }
        self.out.push(Rule {
            path: path.to_path_buf(),
            grant,
        });
        Ok(())
    }
}

/// Builds the Landlock ruleset of `spec` (every right of its ABI handled, so anything not
/// granted is denied), with every TCP bind and connect denied when `deny_network` (ABI ≥ 4).
pub fn ruleset(spec: &Landlock, deny_network: bool) -> Result<RulesetCreated, ConfineError> {
    build_ruleset(spec, deny_network, expand(spec)?, |_, _| {})
}

/// [`ruleset`] with `rules`, telling `opened` each rule's path and its descriptor (`None`:
/// nothing could be opened there).
fn build_ruleset(
    spec: &Landlock,
    deny_network: bool,
    rules: Vec<Rule>,
    mut opened: impl FnMut(&Path, Option<&OwnedFd>),
) -> Result<RulesetCreated, ConfineError> {
    let abi = ABI::from(i32::from(spec.abi.min(TARGET_ABI)));
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let file_rights = AccessFs::from_file(abi);
    // The ABI is already at most the kernel's: anything not enforced is an error, not a
    // silent downgrade.
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(all)?;
    if deny_network && spec.abi >= 4 {
        rs = rs.handle_access(AccessNet::from_all(abi))?;
    }
    if spec.scoped && spec.abi >= 6 {
        rs = rs.scope(Scope::from_all(abi))?;
    }
    let mut created = rs.create()?;
    for rule in rules {
        // Gone since it was listed, or swapped for a symlink: no rule, so no access.
        let Ok(fd) = open_path(&rule.path) else {
            opened(&rule.path, None);
            continue;
        };
        opened(&rule.path, Some(&fd));
        let mut access = match rule.grant {
            Grant::List => AccessFs::ReadDir.into(),
            Grant::Read => read,
            Grant::Write => all,
        };
        if !is_dir(&fd) {
            access &= file_rights;
        }
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    Ok(created)
}

/// A session's ruleset, built once by its holder inside the session's view, for each command
/// whose rules are the session's: its supervisor (a fork of the holder) checks that every
/// rule's path is still the file it was ([`Prebuilt::for_command`], one `statx` a rule) instead
/// of building the ruleset again (an `openat2`, two `fstat`s, a `landlock_add_rule` and a
/// `close` a rule). Only rules that need no directory listing are built ahead: a grant split
/// around a hidden path depends on what the directory holds when the command starts.
#[derive(Debug)]
pub struct Prebuilt {
    spec: Landlock,
    deny_network: bool,
    ruleset: OwnedFd,
    /// Each rule's path and the file it named when the ruleset was built (`None`: nothing).
    paths: Vec<(PathBuf, Option<FileId>)>,
}

/// A file's device and inode.
type FileId = (u64, u64);

/// The session's ruleset, in the holder and the supervisors it forks.
static PREBUILT: std::sync::OnceLock<Prebuilt> = std::sync::OnceLock::new();

impl Prebuilt {
    /// Builds `spec`'s ruleset for the commands of this process's session; `None` when its
    /// grants need splitting (see above).
    pub fn build(spec: &Landlock, deny_network: bool) -> Result<Option<Prebuilt>, ConfineError> {
        let explicit: Vec<Rule> = spec
            .read
            .iter()
            .map(|p| (p, Grant::Read))
            .chain(spec.write.iter().map(|p| (p, Grant::Write)))
            .map(|(path, grant)| Rule {
                path: path.clone(),
                grant,
            })
            .collect();
        if expand(spec)? != explicit {
            return Ok(None);
        }
        let mut paths = Vec::with_capacity(explicit.len());
        let created = build_ruleset(spec, deny_network, explicit, |path, fd| {
            paths.push((path.to_path_buf(), fd.and_then(|fd| id_of_fd(fd).ok())));
        })?;
        let Some(ruleset) = Option::<OwnedFd>::from(created) else {
            return Ok(None);
        };
        Ok(Some(Prebuilt {
            spec: spec.clone(),
            deny_network,
            ruleset,
            paths,
        }))
    }

    /// Keeps `self` as this process's session ruleset (the first kept stays).
    pub fn keep(self) {
        let _ = PREBUILT.set(self);
    }

    /// This process's session ruleset, if one was kept.
    pub fn kept() -> Option<&'static Prebuilt> {
        PREBUILT.get()
    }

    /// The ruleset's descriptor (which a forked supervisor must keep open).
    pub fn fd(&self) -> i32 {
        self.ruleset.as_raw_fd()
    }

    /// A descriptor of the ruleset for a command whose rules are `spec` and `deny_network`:
    /// when they are the session's and every rule's path still names the file it named when
    /// the ruleset was built; `None` otherwise (the command builds its own).
    pub fn for_command(&self, spec: &Landlock, deny_network: bool) -> Option<OwnedFd> {
        if *spec != self.spec || deny_network != self.deny_network {
            return None;
        }
        let same = self
            .paths
            .iter()
            .all(|(path, id)| matches!(id_of_path(path), Ok(now) if now == *id));
        if !same {
            return None;
        }
        self.ruleset.try_clone().ok()
    }
}

/// The device and inode of an open file.
fn id_of_fd(fd: &OwnedFd) -> io::Result<FileId> {
    let st = nix::sys::stat::fstat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// The device and inode of what `path` names now, its last component not followed (`None`:
/// nothing there).
fn id_of_path(path: &Path) -> io::Result<Option<FileId>> {
    use std::os::unix::fs::MetadataExt;
    match fs::symlink_metadata(path) {
        // A symlink there now: the ruleset opened no symlink, so it is not what it named.
        Ok(m) if m.file_type().is_symlink() => Ok(Some((u64::MAX, u64::MAX))),
        Ok(m) => Ok(Some((m.dev(), m.ino()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Confines the calling thread (a fresh one: see `Toolbox`) to `spec`. Threads it spawns
/// afterwards inherit the restriction; the rest of the process is untouched.
pub fn restrict_thread(spec: &Landlock) -> Result<(), ConfineError> {
    let status = ruleset(spec, false)?.restrict_self()?;
    match status.ruleset {
        RulesetStatus::FullyEnforced => Ok(()),
        other => Err(ConfineError::NotEnforced(other)),
    }
}

/// Opens `path` as an `O_PATH` descriptor without following any symlink on the way.
#[allow(unsafe_code)]
fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(io::Error::other)?;
    // SAFETY: open_how is plain integers, for which all zeros is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: `c` is NUL-terminated and `how` is a valid open_how of the size passed; both
    // outlive the call, which writes no memory.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = if fd < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(e);
        }
        // Before Linux 5.6: at least the last component is not followed.
        // SAFETY: as above; open with these flags takes no mode argument.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        i64::from(fd)
    } else {
        fd
    };
    // SAFETY: the descriptor was just opened here and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[allow(unsafe_code)]
fn is_dir(fd: &OwnedFd) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a stat into the live buffer; it is read only when the call succeeded.
    let rc = unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return false;
    }
    // SAFETY: fstat succeeded, so `st` is initialized.
    let st = unsafe { st.assume_init() };
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn spec(read: &[&Path], write: &[&Path], hidden: &[&Path]) -> Landlock {
        let v = |ps: &[&Path]| ps.iter().map(|p| p.to_path_buf()).collect();
        Landlock {
            abi: TARGET_ABI,
            read: v(read),
            write: v(write),
            hidden: v(hidden),
            names_visible: Vec::new(),
            scoped: false,
        }
    }

    fn sorted(rules: Vec<Rule>) -> Vec<(String, Grant)> {
        let mut v: Vec<_> = rules
            .into_iter()
            .map(|r| (r.path.to_string_lossy().into_owned(), r.grant))
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_grant_above_a_hidden_path_is_split_around_it_and_exceptions_stay() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        for d in ["a", "data/sessions/mine", "data/sessions/other", "data/x"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        fs::write(root.join("data/db.sqlite"), "").unwrap();
        fs::write(root.join("f"), "").unwrap();
        let data = root.join("data");
        let mine = root.join("data/sessions/mine");
        let rules = expand(&spec(&[&root], &[&mine], &[&data])).unwrap();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        assert_eq!(
            sorted(rules),
            vec![
                (s(&root.join("a")), Grant::Read),
                (s(&mine), Grant::Write),
                (s(&root.join("f")), Grant::Read),
            ]
        );
    }

    #[test]
    fn a_symlink_next_to_a_hidden_path_does_not_carry_a_grant_onto_it() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        fs::create_dir_all(root.join("secret/inner")).unwrap();
        fs::create_dir_all(root.join("ok")).unwrap();
        std::os::unix::fs::symlink(root.join("secret/inner"), root.join("link-in")).unwrap();
        std::os::unix::fs::symlink(root.join("secret"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(&root, root.join("loop")).unwrap();
        std::os::unix::fs::symlink(root.join("ok"), root.join("link-ok")).unwrap();
        let secret = root.join("secret");
        let rules = expand(&spec(&[&root], &[], &[&secret])).unwrap();
        // `link-ok` is granted by its target (`ok`, already there); `loop` re-enters the split
        // root once and stops.
        assert_eq!(
            sorted(rules),
            vec![
                (root.join("ok").to_string_lossy().into_owned(), Grant::Read),
                (root.join("ok").to_string_lossy().into_owned(), Grant::Read),
            ]
        );
    }

    #[test]
    fn directories_above_names_visible_hidden_paths_stay_listable() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        for d in ["harness", "data", "etc"] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        let harness = root.join("harness");
        let data = root.join("data");
        let s = |p: &Path| p.to_string_lossy().into_owned();
        let mut visible = spec(&[&root], &[], &[&harness]);
        visible.names_visible = vec![harness.clone()];
        assert_eq!(
            sorted(expand(&visible).unwrap()),
            vec![
                (s(&root), Grant::List),
                (s(&root.join("data")), Grant::Read),
                (s(&root.join("etc")), Grant::Read),
            ]
        );
        // One strictly hidden directory beneath makes the parent unlistable.
        visible.hidden.push(data.clone());
        assert_eq!(
            sorted(expand(&visible).unwrap()),
            vec![(s(&root.join("etc")), Grant::Read)]
        );
    }

    /// The ruleset built ahead serves a command with the same rules while every rule's path
    /// names the same file; rules that differ, a path replaced (or gone, or come) since, and
    /// grants that need splitting around a hidden path each get a ruleset of their own.
    #[test]
    fn a_ruleset_built_ahead_serves_the_same_rules_over_the_same_files_only() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        let (ws, tmp, later) = (root.join("ws"), root.join("tmp"), root.join("later"));
        fs::create_dir(&ws).unwrap();
        fs::create_dir(&tmp).unwrap();
        let mut rules = spec(&[Path::new("/")], &[&ws, &tmp, &later], &[]);
        rules.abi = rules.abi.min(super::super::kernel_abi());
        if rules.abi == 0 {
            eprintln!("no Landlock here: a ruleset cannot be built ahead");
            return;
        }
        let built = Prebuilt::build(&rules, false).unwrap().unwrap();
        assert!(built.for_command(&rules, false).is_some());
        // Other rules, or the network denied too: not this ruleset.
        assert!(built.for_command(&rules, true).is_none());
        let mut other = rules.clone();
        other.write.pop();
        assert!(built.for_command(&other, false).is_none());
        // A rule's directory replaced by another at the same path.
        fs::remove_dir(&tmp).unwrap();
        fs::create_dir(&tmp).unwrap();
        assert!(built.for_command(&rules, false).is_none());
        let built = Prebuilt::build(&rules, false).unwrap().unwrap();
        assert!(built.for_command(&rules, false).is_some());
        // A path that named nothing now names a directory; one replaced by a symlink to itself.
        fs::create_dir(&later).unwrap();
        assert!(built.for_command(&rules, false).is_none());
        let built = Prebuilt::build(&rules, false).unwrap().unwrap();
        fs::rename(&ws, root.join("ws-moved")).unwrap();
        std::os::unix::fs::symlink(root.join("ws-moved"), &ws).unwrap();
        assert!(built.for_command(&rules, false).is_none());
        // A grant above a hidden path is split by listing its directory: never built ahead.
        let split = spec(&[&root], &[], &[&tmp]);
        assert!(Prebuilt::build(&split, false).unwrap().is_none());
    }

    #[test]
    fn nothing_hidden_means_one_rule_per_grant() {
        let rules = expand(&spec(&[Path::new("/")], &[Path::new("/tmp")], &[])).unwrap();
        assert_eq!(
            sorted(rules),
            vec![
                ("/".to_owned(), Grant::Read),
                ("/tmp".to_owned(), Grant::Write)
            ]
        );
    }

    #[test]
    fn a_hidden_path_that_does_not_exist_yet_is_hidden_when_it_appears() {
        let t = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(t.path()).unwrap();
        fs::create_dir(root.join("a")).unwrap();
        let later = super::super::canonical_lenient(&root.join("later/../later/join"));
        assert_eq!(later, root.join("later/join"));
        let rules = expand(&spec(&[&root], &[], &[&later])).unwrap();
        // `root` is split (`later` does not exist, so it gets no rule); when it appears, nothing
        // grants it.
        assert_eq!(
            sorted(rules),
            vec![(root.join("a").to_string_lossy().into_owned(), Grant::Read)]
        );
    }
}
