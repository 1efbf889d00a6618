//! A command's view of the file system, built once per session by its holder in a fresh mount
//! namespace (and PID namespace, for `/proc`).
//!
//! The host's root stays in place (no `pivot_root`): every mount of it is made read-only,
//! `nosuid` and `nodev` at once, then mounts are laid over it:
//!
//! 1. `/` and everything beneath it `MS_REC|MS_PRIVATE`: nothing mounted here propagates to
//!    the host, and nothing the host mounts later shows here.
//! 2. The re-binds are captured first (`open_tree(OPEN_TREE_CLONE)`): detached copies of the
//!    writable and read-only places, taken before anything covers them. The session's own
//!    files take the place of the host's among them: its disk's directories (`exec::disk`), and
//!    the workspace's overlay of a template (`exec::overlay`), both mounted detached.
//! 3. `mount_setattr("/", AT_RECURSIVE, RDONLY|NOSUID|NODEV)`: per-mount flags only, never the
//!    superblock — a plain `mount -o remount,ro /` would make the *host's* file system
//!    read-only. So `chmod`, `chown`, `utime` and every write outside the re-binds fail with
//!    `EROFS`, whatever the command's uid, and no setuid binary works.
//! 4. A minimal `/dev`: a small tmpfs with `null zero full random urandom tty` (made with `mknod`
//!    as real root, bound from the host's nodes in a user namespace, where `mknod` is refused),
//!    `pts` (a private devpts instance), `shm` (a tmpfs private to the session), the usual
//!    symlinks; then the tmpfs itself read-only. No disk, no loop device, no `/dev/mem`.
//! 5. Hidden paths and re-binds, shallowest first: a hidden directory becomes an empty tmpfs
//!    (read-only once the mount points of re-binds beneath it exist in it), a hidden file gets
//!    the view's `/dev/null` bound over it read-only; a re-bind is attached at its own path with
//!    `nosuid,nodev` (and read-only for the read-only ones).
//! 6. `/proc`: a fresh procfs of the session's PID namespace (so a session sees none of another's
//!    processes or command lines), with `sys`, `sysrq-trigger`, `irq` and `bus` read-only.
//!
//! Invariants:
//! * Nothing here changes the host: propagation is private before the first mount, and only
//!   per-mount flags are changed.
//! * A step that fails fails the whole view (the holder reports it and no command runs); the one
//!   exception is the recursive read-only step, which falls back to one mount at a time and
//!   skips mounts the kernel will not change (some FUSE or autofs mounts), as bubblewrap does.
//!
//! Non-goals: a root other than the host's (no image), a network namespace.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

pub use super::sockets::SocketWatch;
use crate::exec::protocol::{SessionDisk, SessionOverlay, View};
use crate::exec::sys::{
    self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, Res,
    StepError, cpath,
};

const RO: u64 = MOUNT_ATTR_RDONLY;
const NOSUID: u64 = MOUNT_ATTR_NOSUID;
const NODEV: u64 = MOUNT_ATTR_NODEV;
const NOEXEC: u64 = MOUNT_ATTR_NOEXEC;

/// The device nodes of the minimal `/dev`: name, major, minor.
pub const DEVICES: [(&str, u32, u32); 6] = [
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

/// One step of laying mounts over the read-only root.
#[derive(Debug)]
enum Op {
    /// An empty tmpfs over a directory (made read-only at the end).
    HideDir(CString),
    /// The view's `/dev/null`, read-only, over a file.
    HideFile(CString),
    /// Captured tree `tree` attached at `target`, after creating the mount points `mkpoints`
    /// (each a directory, or a file when `false`) that lie in an empty tmpfs.
    Bind {
        tree: usize,
        target: CString,
        writable: bool,
        mkpoints: Vec<(CString, bool)>,
    },
}

/// A view ready to build: paths as C strings, operations in order.
#[derive(Debug)]
pub struct Prepared {
    sources: Vec<CString>,
    ops: Vec<Op>,
    hidden_dirs: Vec<CString>,
    shm_data: CString,
    proc: bool,
    bind_devices: bool,
    /// Keep the host's `/dev` (see [`View::host_dev`]).
    host_dev: bool,
    /// The host's sockets, watched for those bound after the view was built.
    pub sockets: SocketWatch,
    /// The session's disk and its image, opened and locked (see `exec::disk`): its directories
    /// are bound instead of the host's.
    pub disk: Option<(SessionDisk, OwnedFd)>,
    /// The workspace as an overlay of a template (see `exec::overlay`), with the user namespace
    /// of its idmapped lower layer (made by the holder's outer process) when it has one, and
    /// whether the view is built in a user namespace.
    pub overlay: Option<(SessionOverlay, Option<OwnedFd>, bool)>,
}

fn depth(p: &Path) -> usize {
    p.components().count()
}

/// Prepares `view` for building. `proc`: mount a fresh `/proc` (the builder is pid 1 of a new
/// PID namespace); `bind_devices`: device nodes by bind mount (a user namespace).
/// Long: one pass that orders the hidden paths, sockets and binds against each other; its
/// steps share the sets they build.
pub fn prepare(view: &View, proc: bool, bind_devices: bool) -> Res<Prepared> {
    // Hidden paths that exist, as directories or files; the rest have nothing to cover.
    let mut hidden: Vec<(PathBuf, bool)> = Vec::new();
    // Every socket bound on the host now, wherever it lies: a read-only mount does not stop a
    // `connect`. Those bound later are covered before each command (see `sockets`).
    let mut sockets = SocketWatch::open(view.writable.clone(), !view.host_sockets);
    for socket in sockets.scan() {
        hidden.push((socket, false));
    }
    for h in &view.hidden {
        match std::fs::symlink_metadata(h) {
            Ok(m) if m.is_dir() => hidden.push((h.clone(), true)),
            Ok(m) if m.file_type().is_symlink() => {}
            Ok(_) => hidden.push((h.clone(), false)),
            Err(_) => {}
        }
    }
    hidden.sort();
    hidden.dedup();
    // Beneath a covered directory there is nothing left to cover.
    let dirs: Vec<PathBuf> = hidden
        .iter()
        .filter(|(_, d)| *d)
        .map(|(h, _)| h.clone())
        .collect();
    hidden.retain(|(h, _)| !dirs.iter().any(|d| h.starts_with(d) && h != d));
    let mut entries: Vec<(PathBuf, Option<(bool, usize)>)> = Vec::new();
    let mut sources = Vec::new();
    for (list, writable) in [(&view.writable, true), (&view.readonly, false)] {
        for p in list {
            if std::fs::symlink_metadata(p).is_err() {
                continue;
            }
            entries.push((p.clone(), Some((writable, sources.len()))));
            sources.push(cpath(p)?);
        }
    }
    for (h, _) in &hidden {
        entries.push((h.clone(), None));
    }
    // Shallowest first; at equal depth, cover before binding (a re-bind exactly at a hidden
    // path exposes it again, on purpose).
    entries.sort_by_key(|(p, b)| (depth(p), b.is_some()));
    let mut ops = Vec::new();
    let mut hidden_dirs = Vec::new();
    for (p, bind) in &entries {
        match bind {
            None => {
                let is_dir = hidden.iter().any(|(h, d)| h == p && *d);
                if is_dir {
                    ops.push(Op::HideDir(cpath(p)?));
                    hidden_dirs.push(cpath(p)?);
                } else {
                    ops.push(Op::HideFile(cpath(p)?));
                }
            }
            Some((writable, tree)) => {
                // The deepest hidden directory strictly above: the mount points from there
                // down must be made in its (empty) tmpfs.
                let cover = hidden
                    .iter()
                    .filter(|(h, d)| *d && p.starts_with(h) && p != h)
                    .max_by_key(|(h, _)| depth(h));
                let mut mkpoints = Vec::new();
                if let Some((h, _)) = cover
                    && let Ok(rel) = p.strip_prefix(h)
                {
                    let mut cur = h.clone();
                    let n = rel.components().count();
                    for (k, c) in rel.components().enumerate() {
                        cur.push(c);
                        let is_dir = k + 1 < n || std::fs::metadata(p).is_ok_and(|m| m.is_dir());
                        mkpoints.push((cpath(&cur)?, is_dir));
                    }
                }
                ops.push(Op::Bind {
                    tree: *tree,
                    target: cpath(p)?,
                    writable: *writable,
                    mkpoints,
                });
            }
        }
    }
    let shm = format!(
        "mode=1777,size={},nr_inodes=65536",
        view.shm_bytes.max(1 << 20)
    );
    Ok(Prepared {
        sources,
        ops,
        hidden_dirs,
        shm_data: CString::new(shm).map_err(|_| StepError::new("shm options", libc::EINVAL))?,
        proc,
        bind_devices,
        host_dev: view.host_dev,
        sockets,
        disk: None,
        overlay: None,
    })
}

impl Prepared {
    /// Builds the view. Call in a process that has just entered a new mount namespace (and, for
    /// `/proc`, is in a new PID namespace).
    /// Long: the mount steps in the one order that works (capture, root read-only, `/dev`, the
    /// view's operations, `/proc`); kept in one place so that order reads top to bottom.
    pub fn build(&self) -> Res<()> {
        sys::mount(
            "make / private",
            None,
            c"/",
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        )?;
        let mut trees: Vec<OwnedFd> = Vec::with_capacity(self.sources.len());
        for s in &self.sources {
            trees.push(sys::open_tree(
                &format!("capture {}", s.to_string_lossy()),
                s,
                true,
            )?);
        }
        // While the host's /dev is still there to make a loop device from.
        self.own_files(&mut trees)?;
        // The host's /dev, kept: taken before the root's `nodev` reaches it.
        let host_dev = match self.host_dev {
            true => Some(sys::open_tree("capture /dev", c"/dev", true)?),
            false => None,
        };
        let mut dev_trees = Vec::new();
        if self.bind_devices && !self.host_dev {
            for (name, _, _) in DEVICES {
                let p = dev_path(name)?;
                dev_trees.push(sys::open_tree(&format!("capture /dev/{name}"), &p, false)?);
            }
        }
        read_only_root()?;
        match &host_dev {
            // Read-only and `nosuid`, its devices still usable.
            Some(tree) => {
                sys::move_mount("put /dev back", tree, c"/dev")?;
                sys::mount_setattr("/dev read-only", c"/dev", true, RO | NOSUID)?;
            }
            None => self.build_dev(&dev_trees)?,
        }
        for op in &self.ops {
            match op {
                Op::HideDir(p) => sys::mount(
                    &format!("cover {}", p.to_string_lossy()),
                    Some(c"tmpfs"),
                    p,
                    Some(c"tmpfs"),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    Some(c"mode=0755,size=64k,nr_inodes=1024"),
                )?,
                Op::HideFile(p) => cover_file(p)?,
                Op::Bind {
                    tree,
                    target,
                    writable,
                    mkpoints,
                } => {
                    let step = format!("bind {}", target.to_string_lossy());
                    for (p, is_dir) in mkpoints {
                        if *is_dir {
                            sys::mkdir(&step, p, 0o755)?;
                        } else {
                            sys::mkfile(&step, p)?;
                        }
                    }
                    let Some(tree) = trees.get(*tree) else {
                        return Err(StepError::new(step, libc::EINVAL));
                    };
                    sys::move_mount(&step, tree, target)?;
                    let flags = if *writable {
                        NOSUID | NODEV
                    } else {
                        RO | NOSUID | NODEV
                    };
                    sys::mount_setattr(&step, target, true, flags)?;
                }
            }
        }
        for p in &self.hidden_dirs {
            sys::mount_setattr(
                &format!("cover {} read-only", p.to_string_lossy()),
                p,
                false,
                RO,
            )?;
        }
        if self.proc {
            sys::mount(
                "mount /proc",
                Some(c"proc"),
                c"/proc",
                Some(c"proc"),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                None,
            )?;
            for p in [
                c"/proc/sys",
                c"/proc/sysrq-trigger",
                c"/proc/irq",
                c"/proc/bus",
            ] {
                let step = format!("{} read-only", p.to_string_lossy());
                // Some kernels lack some of them: nothing to protect then.
                if sys::mount(&step, Some(p), p, None, libc::MS_BIND | libc::MS_REC, None).is_ok() {
                    sys::mount_setattr(&step, p, true, RO | NOSUID | NODEV | NOEXEC)?;
                }
            }
        }
        sys::chdir("chdir /", c"/")
    }

    /// Puts the session's own files in place of the host's directories among the captured
    /// `trees`: its disk's directories (see `exec::disk`), then the workspace's overlay (see
    /// `exec::overlay`), whose upper layer is the disk's workspace when there is a disk.
    fn own_files(&self, trees: &mut [OwnedFd]) -> Res<()> {
        let mut replace = |target: &Path, tree: OwnedFd| {
            let target = cpath(target)?;
            match self.sources.iter().position(|s| *s == target) {
                Some(k) => {
                    trees[k] = tree;
                    Ok(())
                }
                None => Err(StepError::new(
                    format!("bind the session's files at {}", target.to_string_lossy()),
                    libc::ENOENT,
                )),
            }
        };
        let mut disk_fs = None;
        if let Some((disk, image)) = &self.disk {
            let (fs, mounted) = crate::exec::disk::mount(disk, image)?;
            for (target, tree) in mounted {
                replace(&target, tree)?;
            }
            disk_fs = Some(fs);
        }
        let Some((overlay, idmap, userns)) = &self.overlay else {
            return Ok(());
        };
        let (upper, work) = match &disk_fs {
            Some(fs) => crate::exec::disk::overlay_dirs(fs)?,
            None => (
                crate::exec::overlay::open_dir("open the upper layer", &cpath(&overlay.target)?)?,
                crate::exec::overlay::open_dir("open the work directory", &cpath(&overlay.work)?)?,
            ),
        };
        let lower = crate::exec::overlay::lower_tree(&cpath(&overlay.lower)?, idmap.as_ref())?;
        let merged = crate::exec::overlay::mount(&lower, &upper, &work, *userns)?;
        replace(&overlay.target, merged)
    }

    fn build_dev(&self, dev_trees: &[OwnedFd]) -> Res<()> {
        sys::mount(
            "mount /dev",
            Some(c"tmpfs"),
            c"/dev",
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(c"mode=0755,size=64k,nr_inodes=64"),
        )?;
        for (k, (name, major, minor)) in DEVICES.iter().enumerate() {
            let p = dev_path(name)?;
            let step = format!("/dev/{name}");
            match dev_trees.get(k) {
                Some(tree) => {
                    sys::mkfile(&step, &p)?;
                    sys::move_mount(&step, tree, &p)?;
                }
                None => sys::mknod_char(&step, &p, *major, *minor)?,
            }
        }
        for (target, link) in [
            (c"/proc/self/fd", c"/dev/fd"),
            (c"/proc/self/fd/0", c"/dev/stdin"),
            (c"/proc/self/fd/1", c"/dev/stdout"),
            (c"/proc/self/fd/2", c"/dev/stderr"),
            (c"pts/ptmx", c"/dev/ptmx"),
        ] {
            sys::symlink(&format!("{}", link.to_string_lossy()), target, link)?;
        }
        sys::mkdir("/dev/pts", c"/dev/pts", 0o755)?;
        sys::mkdir("/dev/shm", c"/dev/shm", 0o1777)?;
        sys::mount(
            "mount /dev/pts",
            Some(c"devpts"),
            c"/dev/pts",
            Some(c"devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(c"newinstance,ptmxmode=0666,mode=620"),
        )?;
        sys::mount(
            "mount /dev/shm",
            Some(c"tmpfs"),
            c"/dev/shm",
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&self.shm_data),
        )?;
        sys::mount_setattr("/dev read-only", c"/dev", false, RO)
    }
}

/// Lays the view's `/dev/null`, read-only, over the file `p`.
pub fn cover_file(p: &CString) -> Res<()> {
    let step = format!("cover {}", p.to_string_lossy());
    sys::mount(&step, Some(c"/dev/null"), p, None, libc::MS_BIND, None)?;
    sys::mount_setattr(&step, p, false, RO | NOSUID | NODEV | NOEXEC)
}

fn dev_path(name: &str) -> Res<CString> {
    CString::new(format!("/dev/{name}")).map_err(|_| StepError::new("device name", libc::EINVAL))
}

/// Makes every mount read-only, `nosuid` and `nodev`: in one call, or, when one mount refuses
/// (the call is all or nothing), one mount at a time, skipping those that refuse.
fn read_only_root() -> Res<()> {
    let all = RO | NOSUID | NODEV;
    let Err(first) = sys::mount_setattr("make / read-only", c"/", true, all) else {
        return Ok(());
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Err(first);
    };
    // Field 5 is the mount point, with spaces and the like escaped as octal.
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(unescape))
        .collect();
    points.sort_by_key(|p| p.matches('/').count());
    let mut root_done = false;
    for point in points {
        let Ok(c) = CString::new(point.as_bytes()) else {
            continue;
        };
        match sys::mount_setattr("make a mount read-only", &c, false, all) {
            Ok(()) => root_done |= point == "/",
            Err(e) if matches!(e.errno, libc::EACCES | libc::EPERM | libc::EINVAL) => {}
            // Gone since it was listed.
            Err(e) if e.errno == libc::ENOENT => {}
            Err(e) => return Err(e),
        }
    }
    if root_done { Ok(()) } else { Err(first) }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        if let Some(d) = octal {
            let v = d.iter().fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
            out.push(v as u8);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/x\"), r"/x\");
    }

    #[test]
    fn re_binds_beneath_a_hidden_directory_get_their_mount_points_in_order() {
        let t = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(t.path()).unwrap();
        let data = root.join("data");
        let ws = data.join("sessions/a/ws");
        std::fs::create_dir_all(&ws).unwrap();
        std::fs::write(root.join("join"), "x").unwrap();
        let view = View {
            writable: vec![ws.clone()],
            readonly: vec![],
            hidden: vec![data.clone(), root.join("join"), root.join("missing")],
            shm_bytes: 1 << 20,
            ..View::default()
        };
        let p = prepare(&view, true, false).unwrap();
        let c = |p: &Path| CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        let shown: Vec<String> = p
            .ops
            .iter()
            .map(|op| match op {
                Op::HideDir(p) => format!("dir {}", p.to_string_lossy()),
                Op::HideFile(p) => format!("file {}", p.to_string_lossy()),
                Op::Bind {
                    target, mkpoints, ..
                } => format!(
                    "bind {} after {:?}",
                    target.to_string_lossy(),
                    mkpoints
                        .iter()
                        .map(|(p, d)| (p.to_string_lossy().into_owned(), *d))
                        .collect::<Vec<_>>()
                ),
            })
            // The host's own sockets are covered too: not this test's concern.
            .filter(|op| op.contains(root.to_str().unwrap()))
            .collect();
        let s = |p: &Path| p.to_string_lossy().into_owned();
        assert_eq!(
            shown,
            vec![
                format!("dir {}", s(&data)),
                format!("file {}", s(&root.join("join"))),
                format!(
                    "bind {} after {:?}",
                    s(&ws),
                    vec![
                        (s(&data.join("sessions")), true),
                        (s(&data.join("sessions/a")), true),
                        (s(&ws), true)
                    ]
                ),
            ]
        );
        assert_eq!(p.hidden_dirs, vec![c(&data)]);
    }
}
