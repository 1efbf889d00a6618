//! Workspace paths: how a path the model (or core) names becomes a file on this host.
//!
//! Owns: the allowed roots (the workspace, and in a pod `/tmp` and `/skills`), the mapping between
//! the *display* paths the model sees (`/workspace/src/main.rs`) and host paths (the directory
//! `PODHOST_WORKSPACE` names), and the resolution that refuses escapes.
//!
//! Invariants:
//! * Resolution follows symlinks the way the kernel does (`..` after a symlink climbs from its
//!   target), allows a missing tail (for writes), and refuses any result outside the allowed
//!   roots — a symlinked final component, a dangling symlink, a symlinked directory, `..`, an
//!   absolute path elsewhere.
//! * A root is compared by its canonical path, so a root that is itself a symlink still works.
//! * Files are opened with `O_NOFOLLOW | O_NONBLOCK`, so a symlink swapped in after resolution, or
//!   a FIFO, cannot make a tool read elsewhere or hang.
//!
//! Non-goals: stopping a racing process from swapping an *intermediate* directory for a symlink
//! between resolution and open; the confinement ruleset (`exec::confine`) closes that.

use std::ffi::OsStr;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};

/// How many symlinks one resolution may follow (Linux's own limit).
const MAX_SYMLINK_HOPS: usize = 40;

/// One allowed root: a host directory and the path the model knows it by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root {
    /// Canonical host path.
    pub host: PathBuf,
    /// The absolute path the model and core use for it (`/workspace`, `/skills`).
    pub display: PathBuf,
    pub writable: bool,
}

/// The workspace root and any further allowed roots.
#[derive(Clone, PartialEq, Eq)]
pub struct Workspace {
    /// `roots[0]` is the workspace itself.
    roots: Vec<Root>,
}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.roots.iter().map(|r| (&r.display, &r.host, r.writable)))
            .finish()
    }
}

/// What a caller wants to do with a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// A path that resolved inside an allowed root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The host path with every symlink resolved (its tail may not exist yet).
    pub host: PathBuf,
    /// The path as the model named it, made absolute and normalized, for messages and outputs.
    pub display: String,
    /// Whether the whole path exists.
    pub exists: bool,
}

/// Why a path was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("The path is empty.")]
    Empty,
    #[error("The path {0:?} holds a NUL byte.")]
    Nul(String),
    #[error("{display} is outside the allowed directories ({allowed}).")]
    Outside { display: String, allowed: String },
    #[error(
        "{display} resolves through a symlink to {target}, outside the allowed directories ({allowed})."
    )]
    SymlinkEscape {
        display: String,
        target: String,
        allowed: String,
    },
    #[error("{display} is in {root}, which is read-only.")]
    ReadOnly { display: String, root: String },
    #[error("{display} has too many levels of symbolic links.")]
    Loop { display: String },
    #[error("{display} could not be resolved: {message}")]
    Io { display: String, message: String },
}

impl Workspace {
    /// A workspace at host directory `host`, known to the model as `display` (its host path when
    /// `None`). The directory must exist.
    pub fn new(host: &Path, display: Option<&Path>) -> io::Result<Self> {
        let root = make_root(host, display, true)?;
        Ok(Workspace { roots: vec![root] })
    }

    /// Adds a further allowed root (in a pod: `/tmp` read-write, `/skills` read-only). A root
    /// whose directory does not exist is skipped: nothing can be under it.
    pub fn with_root(mut self, host: &Path, display: Option<&Path>, writable: bool) -> Self {
        if let Ok(root) = make_root(host, display, writable) {
            self.roots.push(root);
        }
        self
    }

    /// The workspace root's host directory (canonical).
    pub fn root(&self) -> &Path {
        &self.roots[0].host
    }

    /// The workspace root as the model knows it.
    pub fn display_root(&self) -> &Path {
        &self.roots[0].display
    }

    pub fn roots(&self) -> &[Root] {
        &self.roots
    }

    /// Resolves `input` (absolute in display terms, or relative to the workspace).
    pub fn resolve(&self, input: &str, access: Access) -> Result<Resolved, PathError> {
        if input.is_empty() {
            return Err(PathError::Empty);
        }
        if input.contains('\0') {
            return Err(PathError::Nul(input.to_owned()));
        }
        let display_path = normalize_display(&self.roots[0].display, input);
        let display = display_path.to_string_lossy().into_owned();

        // Map the display path onto the host: the longest display root that prefixes it.
        let Some((root, rest)) = self
            .roots
            .iter()
            .filter_map(|r| {
                display_path
                    .strip_prefix(&r.display)
                    .ok()
                    .map(|rest| (r, rest))
            })
            .max_by_key(|(r, _)| r.display.components().count())
        else {
            return Err(PathError::Outside {
                display,
                allowed: self.allowed(),
            });
        };
        let lexical_host = root.host.join(rest);

        let (host, exists) =
            realpath_allow_missing(&lexical_host).map_err(|e| resolve_error(&display, e))?;

        let Some(found) = self.root_of(&host) else {
            let followed_symlink = host != lexical_host;
            return Err(if followed_symlink {
                PathError::SymlinkEscape {
                    display,
                    target: host.to_string_lossy().into_owned(),
                    allowed: self.allowed(),
                }
            } else {
                PathError::Outside {
                    display,
                    allowed: self.allowed(),
                }
            });
        };
        if access == Access::Write && !found.writable {
            return Err(PathError::ReadOnly {
                display,
                root: found.display.to_string_lossy().into_owned(),
            });
        }
        Ok(Resolved {
            host,
            display,
            exists,
        })
    }

    /// The root (most specific) that contains host path `host`, if any.
    pub fn root_of(&self, host: &Path) -> Option<&Root> {
        self.roots
            .iter()
            .filter(|r| host.starts_with(&r.host))
            .max_by_key(|r| r.host.components().count())
    }

    /// The display path of a host path inside a root (e.g. a file found by grep).
    pub fn display_of(&self, host: &Path) -> String {
        match self.root_of(host) {
            Some(r) => match host.strip_prefix(&r.host) {
                Ok(rest) if rest.as_os_str().is_empty() => r.display.to_string_lossy().into_owned(),
                Ok(rest) => r.display.join(rest).to_string_lossy().into_owned(),
                Err(_) => host.to_string_lossy().into_owned(),
            },
            None => host.to_string_lossy().into_owned(),
        }
    }

    /// A display path (as [`Resolved::display`] holds it) relative to the workspace root: the
    /// one path style of tool results. The root itself is `.`; a path in another root (a pod's
    /// `/tmp`, `/skills`) keeps its display path.
    pub fn relative(&self, display: &str) -> String {
        match Path::new(display).strip_prefix(self.display_root()) {
            Ok(rest) if rest.as_os_str().is_empty() => ".".to_owned(),
            Ok(rest) => rest.to_string_lossy().into_owned(),
            Err(_) => display.to_owned(),
        }
    }

    /// The path of `host` relative to the workspace root, or its display path when outside it.
    pub fn relative_display_of(&self, host: &Path) -> String {
        match host.strip_prefix(self.root()) {
            Ok(rest) if !rest.as_os_str().is_empty() => rest.to_string_lossy().into_owned(),
            _ => self.display_of(host),
        }
    }

    fn allowed(&self) -> String {
        self.roots
            .iter()
            .map(|r| {
                let mode = if r.writable { "" } else { " read-only" };
                format!("{}{mode}", r.display.display())
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

fn make_root(host: &Path, display: Option<&Path>, writable: bool) -> io::Result<Root> {
    let canonical = std::fs::canonicalize(host)?;
    if !canonical.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotADirectory,
            "a root must be a directory",
        ));
    }
    let display = match display {
        Some(d) if d.is_absolute() => normalize_lexically(d),
        Some(d) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("display root {} must be absolute", d.display()),
            ));
        }
        None => canonical.clone(),
    };
    Ok(Root {
        host: canonical,
        display,
        writable,
    })
}

/// `input` made absolute against the workspace's display root, with `.` and `..` folded.
/// Lexical folding is only for display and for choosing a root; the host path is resolved for
/// real afterwards.
fn normalize_display(display_root: &Path, input: &str) -> PathBuf {
    let p = Path::new(input);
    if p.is_absolute() {
        normalize_lexically(p)
    } else {
        normalize_lexically(&display_root.join(p))
    }
}

fn normalize_lexically(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[derive(Debug)]
enum RealpathError {
    Loop,
    Io(io::Error),
}

fn resolve_error(display: &str, e: RealpathError) -> PathError {
    match e {
        RealpathError::Loop => PathError::Loop {
            display: display.to_owned(),
        },
        RealpathError::Io(e) => PathError::Io {
            display: display.to_owned(),
            message: e.to_string(),
        },
    }
}

/// `realpath(3)` that tolerates a missing tail: existing components are resolved (following
/// symlinks, `..` applied to the resolved prefix); from the first missing component on, the rest
/// is appended lexically. Returns the path and whether all of it exists.
fn realpath_allow_missing(path: &Path) -> Result<(PathBuf, bool), RealpathError> {
    // Components still to walk, in reverse so that pushing a symlink target's is cheap.
    let mut pending: Vec<PathBuf> = Vec::new();
    push_components(&mut pending, path);
    let mut resolved = PathBuf::from("/");
    let mut hops = 0usize;
    let mut missing = false;

    while let Some(comp) = pending.pop() {
        let name = comp.as_os_str();
        if name == OsStr::new("/") {
            resolved = PathBuf::from("/");
            continue;
        }
        if name == OsStr::new(".") {
            continue;
        }
        if name == OsStr::new("..") {
            resolved.pop();
            continue;
        }
        let candidate = resolved.join(name);
        if missing {
            resolved = candidate;
            continue;
        }
        match std::fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_SYMLINK_HOPS {
                    return Err(RealpathError::Loop);
                }
                let target = std::fs::read_link(&candidate).map_err(RealpathError::Io)?;
                push_components(&mut pending, &target);
            }
            Ok(_) => resolved = candidate,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing = true;
                resolved = candidate;
            }
            // A component that is not a directory ("a/file/x") or unreadable: treat the rest as
            // missing; opening it later reports the real error.
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                missing = true;
                resolved = candidate;
            }
            Err(e) => return Err(RealpathError::Io(e)),
        }
    }
    Ok((resolved, !missing))
}

/// Pushes `p`'s components onto the reversed stack `pending` (an absolute `p` starts with `/`).
fn push_components(pending: &mut Vec<PathBuf>, p: &Path) {
    let comps: Vec<PathBuf> = p
        .components()
        .map(|c| match c {
            Component::RootDir => PathBuf::from("/"),
            Component::CurDir => PathBuf::from("."),
            Component::ParentDir => PathBuf::from(".."),
            Component::Normal(s) => PathBuf::from(s),
            Component::Prefix(p) => PathBuf::from(p.as_os_str()),
        })
        .collect();
    pending.extend(comps.into_iter().rev());
}

/// Why a file could not be opened as a regular file.
#[derive(Debug)]
pub enum OpenError {
    NotFound,
    /// A directory, FIFO, socket or device.
    NotAFile(&'static str),
    /// The final component became a symlink after resolution.
    Symlink,
    Io(io::Error),
}

/// Opens a resolved path for reading: no symlink following on the final component, no blocking
/// on a FIFO, and only regular files.
pub fn open_regular(path: &Path) -> Result<File, OpenError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => OpenError::NotFound,
            Some(libc::ELOOP) => OpenError::Symlink,
            _ => OpenError::Io(e),
        })?;
    let ft = file.metadata().map_err(OpenError::Io)?.file_type();
    if ft.is_file() {
        Ok(file)
    } else {
        Err(OpenError::NotAFile(file_kind(&ft)))
    }
}

/// A word for what a non-regular file is.
pub fn file_kind(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

/// A path as text, with bytes that are not UTF-8 replaced.
pub fn lossy(p: &Path) -> String {
    String::from_utf8_lossy(p.as_os_str().as_bytes()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn ws() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("ws")).unwrap();
        let w = Workspace::new(&dir.path().join("ws"), Some(Path::new("/workspace"))).unwrap();
        (dir, w)
    }

    #[test]
    fn relative_and_display_absolute_paths_map_onto_the_root() {
        let (_d, w) = ws();
        std::fs::write(w.root().join("a.txt"), "x").unwrap();
        let r = w.resolve("a.txt", Access::Read).unwrap();
        assert_eq!(
            r,
            Resolved {
                host: w.root().join("a.txt"),
                display: "/workspace/a.txt".into(),
                exists: true
            }
        );
        let r = w
            .resolve("/workspace/./sub/../a.txt", Access::Read)
            .unwrap();
        assert_eq!(r.host, w.root().join("a.txt"));
        let r = w.resolve("new/dir/file", Access::Write).unwrap();
        assert_eq!((r.host, r.exists), (w.root().join("new/dir/file"), false));
    }

    #[test]
    fn results_name_paths_relative_to_the_workspace() {
        let (d, w) = ws();
        std::fs::create_dir(d.path().join("tmp")).unwrap();
        let w = w.with_root(&d.path().join("tmp"), Some(Path::new("/tmp")), true);
        assert_eq!(
            [
                "/workspace/src/a.rs",
                "/workspace",
                "/tmp/x",
                "/workspaces/b"
            ]
            .map(|p| w.relative(p)),
            ["src/a.rs", ".", "/tmp/x", "/workspaces/b"]
        );
    }

    #[test]
    fn dotdot_and_absolute_paths_outside_are_refused() {
        let (_d, w) = ws();
        assert!(matches!(
            w.resolve("../x", Access::Read),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            w.resolve("/etc/passwd", Access::Read),
            Err(PathError::Outside { .. })
        ));
        assert!(matches!(
            w.resolve("/workspacex/a", Access::Read),
            Err(PathError::Outside { .. })
        ));
    }

    #[test]
    fn symlink_escapes_are_refused() {
        let (d, w) = ws();
        let outside = d.path().join("secret");
        std::fs::write(&outside, "s").unwrap();
        symlink(&outside, w.root().join("final")).unwrap();
        symlink(d.path().join("nowhere"), w.root().join("dangling")).unwrap();
        symlink(d.path(), w.root().join("dir")).unwrap();
        symlink("/", w.root().join("root")).unwrap();
        for p in [
            "final",
            "dangling",
            "dir/secret",
            "root/etc/passwd",
            "dir/ws/../secret",
        ] {
            let e = w.resolve(p, Access::Read).unwrap_err();
            assert!(matches!(e, PathError::SymlinkEscape { .. }), "{p}: {e:?}");
            assert!(w.resolve(p, Access::Write).is_err(), "{p}");
        }
    }

    #[test]
    fn symlinks_that_stay_inside_are_followed() {
        let (_d, w) = ws();
        std::fs::create_dir(w.root().join("real")).unwrap();
        std::fs::write(w.root().join("real/f"), "x").unwrap();
        symlink("real", w.root().join("link")).unwrap();
        symlink("/workspace/real", w.root().join("abs")).unwrap();
        let r = w.resolve("link/f", Access::Read).unwrap();
        assert_eq!(r.host, w.root().join("real/f"));
        assert_eq!(r.display, "/workspace/link/f");
        // An absolute symlink is a host path: /workspace does not exist on this host.
        assert!(w.resolve("abs/f", Access::Read).is_err());
    }

    #[test]
    fn a_symlinked_root_and_read_only_roots() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("real")).unwrap();
        std::fs::create_dir(d.path().join("skills")).unwrap();
        symlink(d.path().join("real"), d.path().join("alias")).unwrap();
        let w = Workspace::new(&d.path().join("alias"), None)
            .unwrap()
            .with_root(&d.path().join("skills"), Some(Path::new("/skills")), false);
        let r = w.resolve("x", Access::Write).unwrap();
        assert_eq!(
            r.host,
            d.path()
                .join("real/x")
                .canonicalize()
                .unwrap_or(r.host.clone())
        );
        assert!(matches!(
            w.resolve("/skills/a", Access::Write),
            Err(PathError::ReadOnly { .. })
        ));
        assert!(w.resolve("/skills/a", Access::Read).is_ok());
    }

    #[test]
    fn symlink_loops_are_reported() {
        let (_d, w) = ws();
        symlink("b", w.root().join("a")).unwrap();
        symlink("a", w.root().join("b")).unwrap();
        assert!(matches!(
            w.resolve("a", Access::Read),
            Err(PathError::Loop { .. })
        ));
    }

    #[test]
    fn open_regular_refuses_fifos_directories_and_swapped_symlinks() {
        let (_d, w) = ws();
        let fifo = w.root().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert!(matches!(
            open_regular(&fifo),
            Err(OpenError::NotAFile("a FIFO"))
        ));
        assert!(matches!(
            open_regular(w.root()),
            Err(OpenError::NotAFile("a directory"))
        ));
        symlink("/etc/passwd", w.root().join("l")).unwrap();
        assert!(matches!(
            open_regular(&w.root().join("l")),
            Err(OpenError::Symlink)
        ));
        assert!(matches!(
            open_regular(&w.root().join("missing")),
            Err(OpenError::NotFound)
        ));
    }
}
